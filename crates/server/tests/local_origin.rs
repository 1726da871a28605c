//! Server over a real `LocalOrigin` on a temporary directory, reached with `RemoteOrigin`.

mod common;

use std::os::unix::fs::symlink;
use std::sync::Arc;
use std::thread;

use common::*;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::{FileKind, Origin, OriginError, WireError};

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::write(p.join("hello.txt"), b"hello, world\n").unwrap();
    std::fs::create_dir(p.join("sub")).unwrap();
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 256) as u8).collect();
    std::fs::write(p.join("sub/big.bin"), &big).unwrap();
    symlink("../hello.txt", p.join("sub/link")).unwrap();
    for i in 0..50 {
        std::fs::write(p.join(format!("sub/f{i:02}")), i.to_string()).unwrap();
    }
    dir
}

fn start(dir: &tempfile::TempDir) -> (Running, Arc<LocalOrigin>) {
    let local = Arc::new(LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap());
    let l2 = Arc::clone(&local);
    let srv = Running::start(
        config(Some(b"t0k3n")),
        Arc::clone(&local) as Arc<dyn Origin>,
        Some(Arc::new(move || l2.counters())),
    );
    (srv, local)
}

#[test]
fn browse_and_read_a_local_tree() {
    let dir = tree();
    let (srv, local) = start(&dir);
    let o = srv.client(b"t0k3n").unwrap();
    let info = o.info().unwrap();
    // The same export, as the server announces it (with the server's write verifier).
    let direct = local.info().unwrap();
    assert_ne!(info.verifier, 0);
    assert_eq!(
        hoardfs_origin::OriginInfo {
            verifier: 0,
            ..info.clone()
        },
        direct
    );
    let root = info.root.handle;

    let hello = o.lookup(root, b"hello.txt").unwrap();
    assert_eq!(hello.attr.kind, FileKind::File);
    assert_eq!(hello.attr.size, 13);
    assert_eq!(o.getattr(hello.handle).unwrap().file_id, hello.attr.file_id);
    assert_eq!(
        o.read(hello.handle, 0, 100).unwrap().data,
        b"hello, world\n"
    );
    assert_eq!(
        o.lookup(root, b"missing"),
        Err(OriginError::Fs(WireError::NotFound))
    );
    assert_eq!(
        o.lookup(root, b".."),
        Err(OriginError::Fs(WireError::Invalid))
    );

    let sub = o.lookup(root, b"sub").unwrap();
    assert_eq!(sub.attr.kind, FileKind::Dir);
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let page = o.readdir(sub.handle, cookie, 7).unwrap();
        for e in &page.entries {
            assert_eq!(
                o.getattr(e.entry.handle).unwrap().file_id,
                e.entry.attr.file_id
            );
        }
        names.extend(page.entries.into_iter().map(|e| e.name));
        match page.next {
            Some(c) => cookie = c,
            None => break,
        }
    }
    names.sort();
    assert_eq!(names.len(), 52);
    assert!(names.contains(&b"big.bin".to_vec()) && names.contains(&b"link".to_vec()));

    let link = o.lookup(sub.handle, b"link").unwrap();
    assert_eq!(link.attr.kind, FileKind::Symlink);
    assert_eq!(o.readlink(link.handle).unwrap(), b"../hello.txt");

    // A large file in 1 MiB pieces, from several threads at once.
    let big = o.lookup(sub.handle, b"big.bin").unwrap();
    let expect = std::fs::read(dir.path().join("sub/big.bin")).unwrap();
    let o = Arc::new(o);
    let parts: Vec<_> = (0..3u64)
        .map(|i| {
            let o = Arc::clone(&o);
            thread::spawn(move || o.read(big.handle, i << 20, 1 << 20).unwrap().data)
        })
        .collect();
    let got: Vec<u8> = parts.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert_eq!(got, expect);

    let sfs = o.statfs().unwrap();
    assert!(sfs.bsize > 0);

    let c = o.counters().unwrap();
    assert_eq!(c.connections, 1);
    assert!(c.reads >= 4, "{c:?}");
    assert_eq!(c.bytes_read, 13 + expect.len() as u64);
    assert_eq!(c.bad_frames, 0);
}

#[test]
fn local_export_refuses_wrong_token() {
    let dir = tree();
    let (srv, _local) = start(&dir);
    assert_eq!(
        srv.client(b"guess").unwrap_err(),
        OriginError::Fs(WireError::AuthFailed)
    );
    assert!(srv.client(b"t0k3n").is_ok());
}

#[test]
fn zero_copy_reads_match_copied_reads_byte_for_byte() {
    let dir = tree();
    let local = Arc::new(LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap());
    let serve = |zero_copy| {
        let l2 = Arc::clone(&local);
        let cfg = hoardfs_server::ServerConfig {
            zero_copy,
            ..config(None)
        };
        let srv = Running::start(
            cfg,
            Arc::clone(&local) as Arc<dyn Origin>,
            Some(Arc::new(move || l2.counters())),
        );
        let o = srv.client(b"").unwrap();
        let root = o.info().unwrap().root.handle;
        let sub = o.lookup(root, b"sub").unwrap().handle;
        let big = o.lookup(sub, b"big.bin").unwrap();
        // Pieces that straddle nothing, end past the end, start past the end; several
        // requests in flight at once on one connection.
        let reads = [
            (0u64, 1u32 << 20),
            (1 << 20, 1 << 20),
            (2_999_000, 8192),
            (5 << 20, 10),
        ];
        let o = Arc::new(o);
        let got: Vec<_> = reads
            .iter()
            .map(|&(off, len)| {
                let o = Arc::clone(&o);
                thread::spawn(move || o.read(big.handle, off, len).unwrap())
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|t| t.join().unwrap())
            .collect();
        (got, big.attr.version)
    };
    // Every file is older than zero: all sent with sendfile; `None`: all copied.
    let (sent, version) = serve(Some(std::time::Duration::ZERO));
    let (copied, _) = serve(None);
    let expect = std::fs::read(dir.path().join("sub/big.bin")).unwrap();
    assert_eq!(sent[0].data, expect[..1 << 20]);
    assert_eq!(sent[1].data, expect[1 << 20..2 << 20]);
    assert_eq!(sent[2].data, expect[2_999_000..]);
    assert!(sent[3].data.is_empty());
    assert!(sent.iter().all(|r| r.version == version));
    assert_eq!(sent, copied);
}

#[test]
fn a_subtree_comes_in_one_request_as_the_server_walks_it() {
    let dir = tree();
    std::fs::create_dir_all(dir.path().join("sub/deeper/deepest")).unwrap();
    std::fs::write(dir.path().join("sub/deeper/deepest/leaf"), b"leaf").unwrap();
    let (srv, local) = start(&dir);
    let o = srv.client(b"t0k3n").unwrap();
    assert!(o.lists_trees(), "a server of this build lists subtrees");
    let root = o.info().unwrap().root;
    let before = srv.stats.snapshot().requests;
    let got = o.read_tree(root.handle, root.attr.file_id, 10_000).unwrap();
    assert_eq!(srv.stats.snapshot().requests - before, 1, "one request");
    let direct = local.info().unwrap().root;
    let want = local
        .read_tree(direct.handle, direct.attr.file_id, 10_000)
        .unwrap();
    let shape = |dirs: &[hoardfs_proto::TreeDir]| {
        let mut v: Vec<(u64, Vec<Vec<u8>>)> = dirs
            .iter()
            .map(|d| {
                let mut names: Vec<Vec<u8>> = d.entries.iter().map(|e| e.name.clone()).collect();
                names.sort();
                (d.file_id, names)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(got.len(), 4, "root, sub, sub/deeper, sub/deeper/deepest");
    assert_eq!(shape(&got), shape(&want));
    // A bound the tree exceeds: whole directories only, within it.
    let some = o.read_tree(root.handle, root.attr.file_id, 10).unwrap();
    assert_eq!(some.len(), 1, "the root's 2 entries, not sub's 53");
    // A file is no tree.
    let f = o.lookup(root.handle, b"hello.txt").unwrap();
    assert_eq!(
        o.read_tree(f.handle, f.attr.file_id, 100),
        Err(OriginError::Fs(WireError::NotDir))
    );
}
