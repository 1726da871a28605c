//! Identity mapping through a real mount, as the client's root, checked on the server's
//! disk: by default a root client cannot leave root-owned objects, set-id bits or device
//! nodes on the server; `--squash all` records every id as the anonymous ids; `--squash
//! none --allow-setid --allow-devices` passes everything through as before.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use common::rig::*;
use common::*;

/// `(uid, gid, mode & 0o7777)` of `p` itself (a symlink is not followed).
fn ids_and_perm(p: &Path) -> (u32, u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (md.uid(), md.gid(), md.mode() & 0o7777)
}

/// `open(p, O_CREAT | O_EXCL | O_WRONLY, mode)` and close.
fn create_with_mode(p: &Path, mode: libc::mode_t) {
    let c = cpath(p);
    // SAFETY: a valid NUL-terminated path; the descriptor is closed right away.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY,
            mode,
        )
    };
    assert!(
        fd >= 0,
        "create {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
    // SAFETY: fd is ours.
    assert_eq!(unsafe { libc::close(fd) }, 0);
}

/// `mknod(p, mode, rdev)`.
fn mknod(p: &Path, mode: libc::mode_t, rdev: libc::dev_t) -> std::io::Result<()> {
    let c = cpath(p);
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::mknod(c.as_ptr(), mode, rdev) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A file `f` created through the mount, then `chown 0:0` and `chmod 4755`.
fn chown_root_and_chmod_setuid(r: &Rig) {
    put(&r.m.p("f"), b"#!/bin/sh\n");
    std::os::unix::fs::chown(r.m.p("f"), Some(0), Some(0)).unwrap();
    std::fs::set_permissions(r.m.p("f"), std::fs::Permissions::from_mode(0o4755)).unwrap();
}

#[test]
fn root_is_squashed_set_id_bits_dropped_and_devices_refused_by_default() {
    let r = rig_with(
        |exp| {
            std::fs::write(exp.join("theirs"), b"x").unwrap();
            std::os::unix::fs::chown(exp.join("theirs"), Some(1000), Some(1000)).unwrap();
        },
        &[],
        &[],
    );
    const NOBODY: (u32, u32) = (65534, 65534);
    chown_root_and_chmod_setuid(&r);
    assert_eq!(ids_and_perm(&r.srv("f")), (NOBODY.0, NOBODY.1, 0o755));
    // The client is told what the server recorded.
    assert_eq!(ids_and_perm(&r.m.p("f")), (NOBODY.0, NOBODY.1, 0o755));
    // A file that was someone else's: chown to root gives it to nobody instead.
    std::os::unix::fs::chown(r.m.p("theirs"), Some(0), Some(0)).unwrap();
    assert_eq!(ids_and_perm(&r.srv("theirs")).0, NOBODY.0);
    // Ordinary ids are trusted (like NFS AUTH_SYS).
    std::os::unix::fs::chown(r.m.p("theirs"), Some(1234), Some(2345)).unwrap();
    let (uid, gid, _) = ids_and_perm(&r.srv("theirs"));
    assert_eq!((uid, gid), (1234, 2345));

    // New objects of every kind belong to nobody, and a set-id mode loses its bits.
    create_with_mode(&r.m.p("created"), 0o4755);
    let (uid, gid, perm) = ids_and_perm(&r.srv("created"));
    assert_eq!((uid, gid, perm & 0o6000), (NOBODY.0, NOBODY.1, 0));
    std::fs::create_dir(r.m.p("d")).unwrap();
    assert_eq!(ids_and_perm(&r.srv("d")).0, NOBODY.0);
    std::os::unix::fs::symlink("f", r.m.p("l")).unwrap();
    assert_eq!(ids_and_perm(&r.srv("l")).0, NOBODY.0);
    mknod(&r.m.p("fifo"), libc::S_IFIFO | 0o600, 0).unwrap();
    let md = std::fs::symlink_metadata(r.srv("fifo")).unwrap();
    assert_eq!(
        (md.mode() & libc::S_IFMT, md.uid()),
        (libc::S_IFIFO, NOBODY.0)
    );

    // Devices are refused, and nothing is left behind.
    for (name, kind) in [("null", libc::S_IFCHR), ("blk", libc::S_IFBLK)] {
        let p = r.m.p(name);
        assert_errno(
            name,
            mknod(&p, kind | 0o666, libc::makedev(1, 3)),
            libc::EPERM,
        );
        assert_gone(&r.srv(name));
    }
}

#[test]
fn all_squash_records_every_id_as_the_anonymous_ids() {
    let r = rig_with(
        |_| {},
        &[
            "--squash",
            "all",
            "--anon-uid",
            "4321",
            "--anon-gid",
            "5432",
        ],
        &[],
    );
    put(&r.m.p("f"), b"x");
    let ids = |rel: &str| {
        let (uid, gid, _) = ids_and_perm(&r.srv(rel));
        (uid, gid)
    };
    assert_eq!(ids("f"), (4321, 5432));
    std::os::unix::fs::chown(r.m.p("f"), Some(1000), Some(1000)).unwrap();
    assert_eq!(ids("f"), (4321, 5432));
    std::fs::create_dir(r.m.p("d")).unwrap();
    assert_eq!(ids("d"), (4321, 5432));
}

#[test]
fn no_squash_with_set_id_and_devices_allowed_passes_everything_through() {
    let r = rig_with(
        |_| {},
        &["--squash", "none", "--allow-setid", "--allow-devices"],
        &[],
    );
    chown_root_and_chmod_setuid(&r);
    assert_eq!(ids_and_perm(&r.srv("f")), (0, 0, 0o4755));
    create_with_mode(&r.m.p("created"), 0o4755);
    let (uid, _, perm) = ids_and_perm(&r.srv("created"));
    assert_eq!((uid, perm & 0o6000), (0, 0o4000));
    std::fs::create_dir(r.m.p("d")).unwrap();
    assert_eq!(ids_and_perm(&r.srv("d")).0, 0);
    mknod(&r.m.p("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3)).unwrap();
    let md = std::fs::symlink_metadata(r.srv("null")).unwrap();
    assert_eq!(md.mode() & libc::S_IFMT, libc::S_IFCHR);
    assert_eq!((md.rdev(), md.uid()), (libc::makedev(1, 3), 0));
}
