//! A client's writes cannot use what the server's file system keeps for root: the server
//! performs them as the (mapped) caller without `CAP_SYS_RESOURCE`, so the ext4 root
//! reserve applies (`ENOSPC` through the mount once only the reserve is left), as it does
//! for a local process of that user. The same capability governs disk quotas (`EDQUOT`);
//! this machine's kernel has no quota format (CONFIG_QFMT_V2 is not set), so the reserve
//! is what the tests can check.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

/// A loop-mounted ext4 image, unmounted when dropped.
struct Image {
    dir: PathBuf,
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A 64 MiB ext4 image with half its blocks reserved for root, mounted at `t/fs`.
fn half_reserved_image(t: &Path) -> Image {
    let img = t.join("reserve.img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(64 << 20).unwrap();
    drop(f);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "50"])
        .arg(&img));
    let dir = t.join("fs");
    std::fs::create_dir(&dir).unwrap();
    run(Command::new("mount")
        .args(["-o", "loop"])
        .arg(&img)
        .arg(&dir));
    Image { dir }
}

/// (free bytes, bytes available to unprivileged users) of the file system at `p`.
fn space(p: &Path) -> (u64, u64) {
    let c = cpath(p);
    // SAFETY: a valid path and a zeroed statvfs for the kernel to fill.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut s) }, 0);
    (s.f_bfree * s.f_frsize, s.f_bavail * s.f_frsize)
}

#[test]
fn a_clients_writes_cannot_use_the_root_reserve_of_the_servers_disk() {
    require_fuse();
    let t = scratch();
    let image = half_reserved_image(t.path());
    let exp = image.dir.join("export");
    std::fs::create_dir(&exp).unwrap();
    std::fs::set_permissions(&exp, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (free, available) = space(&image.dir);
    assert!(
        available < free / 2 + (4 << 20),
        "{available} of {free} available"
    );
    // The client's root is the anonymous user on a server as deployed.
    let srv = Server::start_deployed(&exp, &state_dir(), &[]);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    let out = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=48", "conv=fsync"])
        .arg(format!("of={}", m.p("big").display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "48 MiB fitted in {available} available bytes"
    );
    assert!(
        err.contains("No space left on device"),
        "dd failed otherwise: {err}"
    );
    let written = std::fs::metadata(exp.join("big")).unwrap().len();
    assert!(
        written <= available,
        "{written} bytes written where {available} were available to unprivileged users"
    );
    let (free_after, _) = space(&image.dir);
    assert!(
        free_after + (1 << 20) >= free - available,
        "the reserve was used: {free_after} bytes free, {} reserved",
        free - available
    );
    drop(m);
    drop(srv);
}
