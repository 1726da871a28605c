//! Hostile paths against a real `hoardfs serve`: nothing outside the export is reachable,
//! whatever names, symlinks or renames a client tries.

mod common;

use common::Server;
use hoardfs_origin::{FileKind, Origin, OriginError, WireError};

#[test]
fn traversal_and_symlink_escapes_fail() {
    std::fs::create_dir_all("/var/tmp/hoardfs-tests").unwrap();
    let t = tempfile::tempdir_in("/var/tmp/hoardfs-tests").unwrap();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("dir")).unwrap();
    std::fs::write(t.path().join("secret"), b"outside").unwrap();
    std::os::unix::fs::symlink("/", exp.join("root-link")).unwrap();
    std::os::unix::fs::symlink("..", exp.join("up-link")).unwrap();
    let srv = Server::start(&exp);
    let o = srv.client();
    let root = o.info().unwrap().root.handle;

    for name in [
        &b".."[..],
        b"../secret",
        b"/etc/passwd",
        b"dir/../../secret",
        b".",
        b"",
    ] {
        let r = o.lookup(root, name);
        assert!(
            r.is_err(),
            "lookup of {:?} must fail, got {r:?}",
            String::from_utf8_lossy(name)
        );
    }
    // Symlinks are objects; the server never resolves through them.
    for link in ["root-link", "up-link"] {
        let e = o.lookup(root, link.as_bytes()).unwrap();
        assert_eq!(e.attr.kind, FileKind::Symlink);
        assert_eq!(
            o.lookup(e.handle, b"secret"),
            Err(OriginError::Fs(WireError::NotDir))
        );
        assert_eq!(
            o.lookup(e.handle, b"etc"),
            Err(OriginError::Fs(WireError::NotDir))
        );
        assert!(o.read(e.handle, 0, 10).is_err());
        assert!(o.readdir(e.handle, 0, 10).is_err());
    }
    // Race: a directory swapped for a symlink to "/" after the client looked it up. The old
    // handle keeps naming the real directory; the new name is only a symlink object.
    let dir = o.lookup(root, b"dir").unwrap();
    std::fs::rename(exp.join("dir"), exp.join("moved")).unwrap();
    std::os::unix::fs::symlink("/etc", exp.join("dir")).unwrap();
    assert!(o.lookup(dir.handle, b"passwd").is_err());
    let swapped = o.lookup(root, b"dir").unwrap();
    assert_eq!(swapped.attr.kind, FileKind::Symlink);
    assert_eq!(
        o.lookup(swapped.handle, b"passwd"),
        Err(OriginError::Fs(WireError::NotDir))
    );
    // Forged handles are refused.
    let forged = hoardfs_origin::Handle {
        epoch: root.epoch,
        id: 1 << 40,
    };
    assert_eq!(o.getattr(forged), Err(OriginError::Fs(WireError::Stale)));
    let names: Vec<_> = o
        .readdir(root, 0, 100)
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert!(!names.iter().any(|n| n == b"secret"));
}
