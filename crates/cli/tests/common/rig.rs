//! A read-write test rig (one server, one client) and small file helpers shared by the
//! write and namespace test suites.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::*;

/// One server and one read-write client. Fields drop in order: mount, server, directory.
pub struct Rig {
    pub m: Mount,
    pub srv: Server,
    pub exp: PathBuf,
    pub t: tempfile::TempDir,
}

impl Rig {
    /// A second client of the same server, with its own cache directory.
    pub fn second_client(&self, extra: &[&str]) -> Mount {
        let t = self.t.path();
        Mount::with_cache(&self.srv.addr, &t.join("mnt2"), &t.join("cache2"), extra)
    }

    /// Unmounts the client (cleanly) and mounts it again on the same cache with `extra`.
    pub fn remount(&mut self, extra: &[&str]) {
        let t = self.t.path();
        let gone = Mount {
            child: None,
            path: self.m.path.clone(),
        };
        std::mem::replace(&mut self.m, gone).unmount();
        self.m = Mount::with_cache(&self.srv.addr, &t.join("mnt"), &t.join("cache"), extra);
    }

    /// Path in the exported directory (the server's disk).
    pub fn srv(&self, rel: &str) -> PathBuf {
        self.exp.join(rel)
    }
}

/// An export prepared by `setup`, served with `server_args`, mounted with `mount_args`.
pub fn rig_with(setup: impl FnOnce(&Path), server_args: &[&str], mount_args: &[&str]) -> Rig {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    setup(&exp);
    let srv = Server::start_args(&exp, server_args);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        mount_args,
    );
    Rig { m, srv, exp, t }
}

pub fn rig() -> Rig {
    rig_with(|_| {}, &[], &[])
}

/// Creates `p` with `data` through `File`, checking the result of `close` too.
pub fn put(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    close_checked(f).unwrap_or_else(|e| panic!("close {}: {e}", p.display()));
}

pub fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[track_caller]
pub fn assert_content(what: &str, p: &Path, want: &[u8]) {
    if let Err(e) = has_content(p, want) {
        panic!("{what}: {e}");
    }
}

#[track_caller]
pub fn assert_gone(p: &Path) {
    if let Err(e) = gone(p) {
        panic!("{e}");
    }
}
