//! Tests of namespace changes: create, mknod, mkdir, symlink, link, unlink, rmdir, rename,
//! ownership of new objects, name checks and the read-only switch.

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use super::super::*;
use super::writable;
use crate::OriginError;
use hoardfs_proto::{Owner, RENAME_EXCHANGE, RENAME_NOREPLACE, SetAttrs};

const ME: Owner = Owner { uid: 0, gid: 0 };

fn err<T: std::fmt::Debug>(r: Result<T>) -> WireError {
    match r {
        Err(OriginError::Fs(e)) => e,
        other => panic!("expected a file-system error, got {other:?}"),
    }
}

#[test]
fn create_exclusive_and_not() {
    let (_d, o, root, path) = writable();
    let e = o.create(root, b"f", 0o666, true, ME).unwrap();
    assert_eq!(e.attr.kind, FileKind::File);
    // Exactly the requested bits: the server's umask does not apply.
    assert_eq!(e.attr.perm, 0o666);
    assert_eq!(
        std::fs::metadata(path.join("f")).unwrap().mode() & 0o7777,
        0o666
    );
    assert_eq!(
        err(o.create(root, b"f", 0o600, true, ME)),
        WireError::Exists
    );
    let again = o.create(root, b"f", 0o600, false, ME).unwrap();
    assert_eq!(again.attr.file_id, e.attr.file_id);
    assert_eq!(again.attr.perm, 0o666, "an existing file keeps its mode");
    assert_eq!(
        err(o.create(root, b"sub", 0o600, false, ME)),
        WireError::IsDir
    );
    let file = o.lookup(root, b"a.txt").unwrap().handle;
    assert_eq!(
        err(o.create(file, b"x", 0o600, true, ME)),
        WireError::NotDir
    );
}

#[test]
fn bad_names_are_refused_by_every_op() {
    let (_d, o, root, _path) = writable();
    let file = o.lookup(root, b"a.txt").unwrap().handle;
    let long = vec![b'x'; 256];
    for (name, want) in [
        (&b"a/b"[..], WireError::Invalid),
        (b"..", WireError::Invalid),
        (b".", WireError::Invalid),
        (b"", WireError::Invalid),
        (b"a\0b", WireError::Invalid),
        (&long[..], WireError::NameTooLong),
    ] {
        assert_eq!(err(o.create(root, name, 0o644, true, ME)), want);
        assert_eq!(err(o.mknod(root, name, libc::S_IFIFO | 0o644, 0, ME)), want);
        assert_eq!(err(o.mkdir(root, name, 0o755, ME)), want);
        assert_eq!(err(o.symlink(root, name, b"t", ME)), want);
        assert_eq!(err(o.link(file, root, name)), want);
        assert_eq!(err(o.unlink(root, name)), want);
        assert_eq!(err(o.rmdir(root, name)), want);
        assert_eq!(err(o.rename(root, name, root, b"ok", 0)), want);
        assert_eq!(err(o.rename(root, b"a.txt", root, name, 0)), want);
    }
    // 255 bytes is fine.
    o.create(root, &[b'y'; 255], 0o644, true, ME).unwrap();
}

#[test]
fn mkdir_mknod_symlink_unlink_rmdir() {
    let (_d, o, root, path) = writable();
    let dir = o.mkdir(root, b"d", 0o750, ME).unwrap();
    assert_eq!((dir.attr.kind, dir.attr.perm), (FileKind::Dir, 0o750));
    let fifo = o
        .mknod(dir.handle, b"p", libc::S_IFIFO | 0o640, 0, ME)
        .unwrap();
    assert_eq!((fifo.attr.kind, fifo.attr.perm), (FileKind::Fifo, 0o640));
    assert_eq!(
        err(o.mknod(root, b"q", libc::S_IFDIR | 0o755, 0, ME)),
        WireError::Invalid
    );
    let reg = o.mknod(root, b"r", 0o600, 0, ME).unwrap();
    assert_eq!(reg.attr.kind, FileKind::File);
    let l = o.symlink(root, b"l", b"../../etc/passwd", ME).unwrap();
    assert_eq!(l.attr.kind, FileKind::Symlink);
    assert_eq!(o.readlink(l.handle).unwrap(), b"../../etc/passwd");
    assert_eq!(err(o.symlink(root, b"l", b"x", ME)), WireError::Exists);
    assert_eq!(err(o.mkdir(root, b"d", 0o755, ME)), WireError::Exists);

    assert_eq!(err(o.rmdir(root, b"d")), WireError::NotEmpty);
    assert_eq!(err(o.unlink(root, b"d")), WireError::IsDir);
    assert_eq!(err(o.rmdir(root, b"r")), WireError::NotDir);
    assert_eq!(err(o.unlink(root, b"nope")), WireError::NotFound);
    o.unlink(dir.handle, b"p").unwrap();
    o.rmdir(root, b"d").unwrap();
    o.unlink(root, b"l").unwrap();
    assert!(!path.join("d").exists());
    assert!(std::fs::symlink_metadata(path.join("l")).is_err());
    assert_eq!(err(o.lookup(root, b"d")), WireError::NotFound);
}

#[test]
fn new_objects_belong_to_the_owner() {
    assert!(sys_write::is_root(), "these tests run as root");
    let (_d, o, root, path) = writable();
    let owner = Owner {
        uid: 1234,
        gid: 5678,
    };
    let f = o.create(root, b"f", 0o644, true, owner).unwrap();
    assert_eq!((f.attr.uid, f.attr.gid), (1234, 5678));
    let md = std::fs::metadata(path.join("f")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    let l = o.symlink(root, b"l", b"f", owner).unwrap();
    assert_eq!((l.attr.uid, l.attr.gid), (1234, 5678));
    // A set-group-id directory gives its group to new objects, and its bit to new
    // subdirectories.
    let g = o.mkdir(root, b"g", 0o2775, owner).unwrap();
    assert_eq!(g.attr.perm, 0o2775);
    let set = SetAttrs {
        gid: Some(4321),
        ..Default::default()
    };
    o.setattr(g.handle, &set).unwrap();
    let md = std::fs::metadata(path.join("g")).unwrap();
    assert_eq!(md.permissions().mode() & 0o7777, 0o2775);
    let inner = o.create(g.handle, b"x", 0o640, true, owner).unwrap();
    assert_eq!((inner.attr.uid, inner.attr.gid), (1234, 4321));
    let sub = o.mkdir(g.handle, b"s", 0o755, owner).unwrap();
    assert_eq!(sub.attr.gid, 4321);
    assert_eq!(sub.attr.perm, 0o2755);
}

#[test]
fn new_objects_grant_nothing_until_they_have_their_owner() {
    assert!(sys_write::is_root(), "these tests run as root");
    let (_d, o, root, path) = writable();
    let owner = Owner {
        uid: 1234,
        gid: 5678,
    };
    namespace::BEFORE_ADOPT.with(|v| v.borrow_mut().clear());
    let f = o.create(root, b"f", 0o6755, true, owner).unwrap();
    let d = o.mkdir(root, b"d", 0o6777, owner).unwrap();
    let p = o
        .mknod(root, b"p", libc::S_IFIFO | 0o6666, 0, owner)
        .unwrap();
    let made = namespace::BEFORE_ADOPT.with(|v| std::mem::take(&mut *v.borrow_mut()));
    assert_eq!(made.len(), 3);
    for st in &made {
        // Still the server's, so it must grant nothing: no permission, no set-id bit.
        assert_eq!(st.st_uid, 0);
        assert_eq!(st.st_mode & 0o7777, 0, "mode {:o} before chown", st.st_mode);
    }
    // Afterwards: the owner's, with exactly the requested bits.
    for (e, name, want) in [(f, "f", 0o6755), (d, "d", 0o6777), (p, "p", 0o6666)] {
        assert_eq!((e.attr.uid, e.attr.gid, e.attr.perm), (1234, 5678, want));
        let md = std::fs::symlink_metadata(path.join(name)).unwrap();
        let perm = md.mode() & 0o7777;
        assert_eq!((md.uid(), md.gid(), perm), (1234, 5678, u32::from(want)));
    }
}

#[test]
fn link_shares_the_inode() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap();
    let sub = o.lookup(root, b"sub").unwrap();
    let b = o.link(a.handle, sub.handle, b"b").unwrap();
    assert_eq!(b.attr.file_id, a.attr.file_id);
    assert_eq!(b.handle, a.handle, "one inode, one handle");
    assert_eq!(b.attr.nlink, 2);
    assert_eq!(std::fs::read(path.join("sub/b")).unwrap(), b"hello");
    assert_eq!(
        err(o.link(sub.handle, root, b"dirlink")),
        WireError::NotPermitted
    );
    assert_eq!(err(o.link(a.handle, root, b"a.txt")), WireError::Exists);
    assert_eq!(err(o.link(a.handle, a.handle, b"x")), WireError::NotDir);
    // A symlink is linked itself, not its target.
    let l = o.symlink(root, b"l", b"a.txt", ME).unwrap();
    let l2 = o.link(l.handle, root, b"l2").unwrap();
    assert_eq!(l2.attr.kind, FileKind::Symlink);
    assert_eq!(l2.attr.file_id, l.attr.file_id);
}

#[test]
fn renames_plain_noreplace_and_exchange() {
    let (_d, o, root, path) = writable();
    let sub = o.lookup(root, b"sub").unwrap().handle;
    std::fs::write(path.join("b.txt"), b"bee").unwrap();
    let a = o.lookup(root, b"a.txt").unwrap();
    o.rename(root, b"a.txt", sub, b"moved", 0).unwrap();
    assert_eq!(std::fs::read(path.join("sub/moved")).unwrap(), b"hello");
    // The handle follows the object.
    assert_eq!(o.read(a.handle, 0, 10).unwrap().data, b"hello");
    assert_eq!(
        err(o.rename(root, b"b.txt", sub, b"moved", RENAME_NOREPLACE)),
        WireError::Exists
    );
    o.rename(root, b"b.txt", sub, b"moved", RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(std::fs::read(path.join("sub/moved")).unwrap(), b"bee");
    assert_eq!(std::fs::read(path.join("b.txt")).unwrap(), b"hello");
    assert_eq!(
        err(o.rename(root, b"b.txt", sub, b"missing", RENAME_EXCHANGE)),
        WireError::NotFound
    );
    assert_eq!(
        err(o.rename(
            root,
            b"b.txt",
            sub,
            b"x",
            RENAME_NOREPLACE | RENAME_EXCHANGE
        )),
        WireError::Invalid
    );
    assert_eq!(
        err(o.rename(root, b"b.txt", sub, b"x", 4)),
        WireError::Invalid
    );
    // Replacing an existing name without flags.
    o.rename(sub, b"moved", root, b"b.txt", 0).unwrap();
    assert_eq!(std::fs::read(path.join("b.txt")).unwrap(), b"bee");
    assert_eq!(
        err(o.rename(root, b"sub", sub, b"loop", 0)),
        WireError::Invalid
    );
}

#[test]
fn read_only_refuses_every_modification() {
    let d = tempfile::tempdir().unwrap();
    std::fs::write(d.path().join("f"), b"x").unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    let o = LocalOrigin::new(d.path(), LocalOptions::default()).unwrap();
    assert!(o.info().unwrap().read_only);
    let root = o.info().unwrap().root.handle;
    let f = o.lookup(root, b"f").unwrap().handle;
    let ro = WireError::ReadOnly;
    assert_eq!(err(o.create(root, b"n", 0o644, false, ME)), ro);
    assert_eq!(err(o.mknod(root, b"n", libc::S_IFIFO | 0o644, 0, ME)), ro);
    assert_eq!(err(o.mkdir(root, b"n", 0o755, ME)), ro);
    assert_eq!(err(o.symlink(root, b"n", b"f", ME)), ro);
    assert_eq!(err(o.link(f, root, b"n")), ro);
    assert_eq!(err(o.unlink(root, b"f")), ro);
    assert_eq!(err(o.rmdir(root, b"sub")), ro);
    assert_eq!(err(o.rename(root, b"f", root, b"g", 0)), ro);
    let set = SetAttrs {
        mode: Some(0o600),
        ..Default::default()
    };
    assert_eq!(err(o.setattr(f, &set)), ro);
    assert_eq!(err(o.write(f, 0, b"y", false)), ro);
    assert_eq!(err(o.setxattr(f, b"user.a", b"1", 0)), ro);
    assert_eq!(err(o.removexattr(f, b"user.a")), ro);
    // Reading sides still work.
    o.fsync(f, false).unwrap();
    o.fsync(root, true).unwrap();
    assert_eq!(err(o.getxattr(f, b"user.a")), WireError::NoData);
    assert_eq!(o.listxattr(f).unwrap(), b"");
    assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"x");
}
