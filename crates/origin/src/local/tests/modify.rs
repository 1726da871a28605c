//! Tests of data and attribute changes: write (versions, append, counters), setattr, fsync,
//! handles of unlinked files, and extended attributes.

use std::os::unix::fs::MetadataExt;

use super::super::*;
use super::writable;
use crate::OriginError;
use hoardfs_proto::{Owner, SetAttrs, TimeSet, Timestamp};

const ME: Owner = Owner { uid: 0, gid: 0 };

fn err<T: std::fmt::Debug>(r: Result<T>) -> WireError {
    match r {
        Err(OriginError::Fs(e)) => e,
        other => panic!("expected a file-system error, got {other:?}"),
    }
}

#[test]
fn writes_chain_versions_and_append_goes_to_the_end() {
    let (_d, o, root, path) = writable();
    let f = o.create(root, b"f", 0o644, true, ME).unwrap();
    let w1 = o.write(f.handle, 0, b"hello", false).unwrap();
    assert_eq!((w1.written, w1.offset), (5, 0));
    assert_eq!(w1.pre_version, f.attr.version);
    assert_eq!(w1.attr.size, 5);
    assert_eq!(w1.attr.version, o.getattr(f.handle).unwrap().version);
    let w2 = o.write(f.handle, 0, b", world", true).unwrap();
    assert_eq!((w2.written, w2.offset), (7, 5));
    assert_eq!(w2.pre_version, w1.attr.version);
    assert_ne!(w2.attr.version, w1.attr.version);
    let w3 = o.write(f.handle, 20, b"!", false).unwrap();
    assert_eq!((w3.offset, w3.attr.size), (20, 21));
    let r = o.read(f.handle, 0, 100).unwrap();
    assert_eq!(&r.data[..12], b"hello, world");
    assert_eq!(r.data[12..20], [0u8; 8]);
    assert_eq!(r.version, w3.attr.version);
    assert_eq!(std::fs::read(path.join("f")).unwrap().len(), 21);
    let c = o.counters();
    assert_eq!((c.writes, c.bytes_written), (3, 13));
    // Existing files are reopened for writing once.
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    o.write(a, 5, b"!", false).unwrap();
    o.write(a, 6, b"!", false).unwrap();
    assert_eq!(std::fs::read(path.join("a.txt")).unwrap(), b"hello!!");
}

#[test]
fn write_refuses_non_files() {
    let (_d, o, root, _path) = writable();
    let sub = o.lookup(root, b"sub").unwrap().handle;
    assert_eq!(err(o.write(sub, 0, b"x", false)), WireError::IsDir);
    let l = o.symlink(root, b"l", b"a.txt", ME).unwrap().handle;
    assert_eq!(err(o.write(l, 0, b"x", false)), WireError::Invalid);
    let p = o
        .mknod(root, b"p", libc::S_IFIFO | 0o644, 0, ME)
        .unwrap()
        .handle;
    assert_eq!(err(o.write(p, 0, b"x", false)), WireError::Invalid);
}

#[test]
fn unlink_through_the_origin_releases_the_file() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    assert_eq!(o.read(a, 0, 10).unwrap().data, b"hello");
    o.unlink(root, b"a.txt").unwrap();
    assert!(!path.join("a.txt").exists());
    // Its descriptors were closed (so its space is freed): the handle is stale.
    assert_eq!(err(o.read(a, 0, 10)), WireError::Stale);
}

#[test]
fn files_deleted_behind_the_origins_back_keep_working_while_held() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    std::fs::remove_file(path.join("a.txt")).unwrap();
    assert_eq!(o.read(a, 0, 10).unwrap().data, b"hello");
    let w = o.write(a, 5, b" again", false).unwrap();
    assert_eq!(w.attr.nlink, 0);
    let at = o.getattr(a).unwrap();
    assert_eq!((at.nlink, at.size, at.version), (0, 11, w.attr.version));
    assert_eq!(o.read(a, 0, 20).unwrap().data, b"hello again");
    o.fsync(a, true).unwrap();
}

#[test]
fn setattr_size_mode_owner_and_times() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    let size = |n| SetAttrs {
        size: Some(n),
        ..Default::default()
    };
    assert_eq!(o.setattr(a, &size(2)).unwrap().size, 2);
    assert_eq!(std::fs::read(path.join("a.txt")).unwrap(), b"he");
    assert_eq!(o.setattr(a, &size(4)).unwrap().size, 4);
    assert_eq!(std::fs::read(path.join("a.txt")).unwrap(), b"he\0\0");
    let mode = SetAttrs {
        mode: Some(0o4710),
        ..Default::default()
    };
    assert_eq!(o.setattr(a, &mode).unwrap().perm, 0o4710);
    let t = Timestamp {
        secs: 1_000_000_000,
        nanos: 123_456_789,
    };
    let times = SetAttrs {
        atime: Some(TimeSet::At(t)),
        mtime: Some(TimeSet::At(t)),
        ..Default::default()
    };
    let at = o.setattr(a, &times).unwrap();
    assert_eq!((at.atime, at.mtime), (t, t));
    let md = std::fs::metadata(path.join("a.txt")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));
    let now = SetAttrs {
        mtime: Some(TimeSet::Now),
        ..Default::default()
    };
    let at2 = o.setattr(a, &now).unwrap();
    assert!(at2.mtime.secs > t.secs);
    assert_eq!(at2.atime, t, "atime was left alone");
    assert_eq!(at2.version, o.getattr(a).unwrap().version);
    let chown = SetAttrs {
        uid: Some(1234),
        ..Default::default()
    };
    let at3 = o.setattr(a, &chown).unwrap();
    assert_eq!((at3.uid, at3.gid), (1234, at2.gid));
    // Directories: mode and times, but no size.
    let sub = o.lookup(root, b"sub").unwrap().handle;
    assert_eq!(o.setattr(sub, &mode).unwrap().perm, 0o4710);
    assert_eq!(err(o.setattr(sub, &size(0))), WireError::IsDir);
    // Symlinks: owner and times (the link's own, not its target's), no mode.
    let l = o.symlink(root, b"l", b"a.txt", ME).unwrap().handle;
    assert_eq!(err(o.setattr(l, &mode)), WireError::Unsupported);
    let target_before = std::fs::metadata(path.join("a.txt")).unwrap().mtime();
    let old = SetAttrs {
        atime: Some(TimeSet::At(Timestamp {
            secs: 500_000_000,
            nanos: 7,
        })),
        mtime: Some(TimeSet::At(Timestamp {
            secs: 600_000_000,
            nanos: 9,
        })),
        ..Default::default()
    };
    let la = o.setattr(l, &old).unwrap();
    assert_eq!((la.atime.secs, la.mtime.secs), (500_000_000, 600_000_000));
    let lmd = std::fs::symlink_metadata(path.join("l")).unwrap();
    assert_eq!((lmd.mtime(), lmd.mtime_nsec()), (600_000_000, 9));
    assert_eq!(
        std::fs::metadata(path.join("a.txt")).unwrap().mtime(),
        target_before,
        "the target's times were left alone"
    );
    assert_eq!(o.setattr(l, &chown).unwrap().uid, 1234);
    assert_eq!(std::fs::metadata(path.join("a.txt")).unwrap().uid(), 1234);
}

#[test]
fn fsync_files_and_directories() {
    let (_d, o, root, _path) = writable();
    let f = o.create(root, b"f", 0o644, true, ME).unwrap().handle;
    o.write(f, 0, b"data", false).unwrap();
    o.fsync(f, false).unwrap();
    o.fsync(f, true).unwrap();
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    o.fsync(a, false).unwrap();
    o.fsync(root, false).unwrap();
    let l = o.symlink(root, b"l", b"f", ME).unwrap().handle;
    o.fsync(l, false).unwrap();
}

fn set_raw_xattr(path: &std::path::Path, name: &str, value: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    // SAFETY: valid C strings and value.
    let rc = unsafe {
        libc::setxattr(
            p.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
}

#[test]
fn xattrs_in_the_user_namespace_only() {
    let (_d, o, root, path) = writable();
    let a = o.lookup(root, b"a.txt").unwrap().handle;
    assert_eq!(err(o.getxattr(a, b"user.k")), WireError::NoData);
    o.setxattr(a, b"user.k", b"v1", 0).unwrap();
    assert_eq!(o.getxattr(a, b"user.k").unwrap(), b"v1");
    assert_eq!(err(o.setxattr(a, b"user.k", b"v2", 1)), WireError::Exists);
    assert_eq!(err(o.setxattr(a, b"user.new", b"v", 2)), WireError::NoData);
    assert_eq!(err(o.setxattr(a, b"user.k", b"v", 3)), WireError::Invalid);
    o.setxattr(a, b"user.k", b"v2", 2).unwrap();
    let big = vec![7u8; 4000];
    o.setxattr(a, b"user.big", &big, 1).unwrap();
    assert_eq!(o.getxattr(a, b"user.big").unwrap(), big);
    o.setxattr(a, b"user.empty", b"", 0).unwrap();
    assert_eq!(o.getxattr(a, b"user.empty").unwrap(), b"");
    // Other namespaces are invisible and untouchable.
    set_raw_xattr(&path.join("a.txt"), "trusted.secret", b"s");
    assert_eq!(err(o.getxattr(a, b"trusted.secret")), WireError::NoData);
    assert_eq!(
        err(o.setxattr(a, b"trusted.x", b"1", 0)),
        WireError::NotPermitted
    );
    assert_eq!(
        err(o.removexattr(a, b"trusted.secret")),
        WireError::NotPermitted
    );
    let mut names: Vec<&[u8]> = Vec::new();
    let list = o.listxattr(a).unwrap();
    assert_eq!(list.last(), Some(&0));
    names.extend(list.split(|&b| b == 0).filter(|n| !n.is_empty()));
    names.sort();
    assert_eq!(names, [&b"user.big"[..], b"user.empty", b"user.k"]);
    o.removexattr(a, b"user.k").unwrap();
    assert_eq!(err(o.removexattr(a, b"user.k")), WireError::NoData);
    assert_eq!(err(o.getxattr(a, b"user.k")), WireError::NoData);
    // Directories have them too; symlinks do not.
    o.setxattr(root, b"user.d", b"dir", 0).unwrap();
    assert_eq!(o.getxattr(root, b"user.d").unwrap(), b"dir");
    let l = o.symlink(root, b"l", b"a.txt", ME).unwrap().handle;
    assert_eq!(err(o.getxattr(l, b"user.k")), WireError::NoData);
    assert_eq!(o.listxattr(l).unwrap(), b"");
    assert_eq!(
        err(o.setxattr(l, b"user.k", b"v", 0)),
        WireError::NotPermitted
    );
    assert_eq!(err(o.setxattr(a, b"user.\0x", b"v", 0)), WireError::Invalid);
}
