//! Identity mapping end to end over the wire (server over a real `LocalOrigin`, as root),
//! with requests a kernel client would not send: owner `u32::MAX`, a chown and a set-id
//! mode in one setattr, a chown of a file whose set-id bit Linux's chown keeps.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use common::*;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::{Handle, Origin, OriginError, Owner, SetAttrs, WireError};
use hoardfs_server::{IdMapping, ServerConfig};

const ROOT: Owner = Owner { uid: 0, gid: 0 };

/// A writable export of a fresh directory served with `id_map`; the client and the root.
fn serve(dir: &Path, id_map: IdMapping) -> (Running, hoardfs_origin::remote::RemoteOrigin, Handle) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "these tests run as root");
    let opts = LocalOptions {
        read_only: false,
        ..Default::default()
    };
    let local = Arc::new(LocalOrigin::new(dir, opts).unwrap());
    let cfg = ServerConfig {
        id_map,
        ..config(None)
    };
    let srv = Running::start(cfg, local as Arc<dyn Origin>, None);
    let o = srv.client(b"").unwrap();
    let root = o.info().unwrap().root.handle;
    (srv, o, root)
}

fn ids_and_perm(p: &Path) -> (u32, u32, u32) {
    let md = std::fs::symlink_metadata(p).unwrap();
    (md.uid(), md.gid(), md.mode() & 0o7777)
}

#[test]
fn no_request_makes_a_root_owned_or_set_id_object_under_root_squash() {
    let d = tempfile::tempdir().unwrap();
    let (_srv, o, root) = serve(d.path(), IdMapping::default());
    let p = |n: &str| d.path().join(n);
    // "-1" is what chown(2) reads as "no change": it must not leave root as the owner.
    let minus_one = Owner {
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let e = o.create(root, b"m1", 0o644, true, minus_one).unwrap();
    assert_eq!((e.attr.uid, e.attr.gid), (65534, 65534));
    assert_eq!(ids_and_perm(&p("m1")), (65534, 65534, 0o644));
    o.create(root, b"f", 0o4755, true, ROOT).unwrap();
    assert_eq!(ids_and_perm(&p("f")), (65534, 65534, 0o755));
    o.mkdir(root, b"d", 0o2775, ROOT).unwrap();
    assert_eq!(ids_and_perm(&p("d")), (65534, 65534, 0o775));
    o.symlink(root, b"l", b"f", ROOT).unwrap();
    assert_eq!(ids_and_perm(&p("l")).0, 65534);
    let dev = o.mknod(
        root,
        b"null",
        libc::S_IFCHR | 0o666,
        libc::makedev(1, 3),
        ROOT,
    );
    assert_eq!(dev, Err(OriginError::Fs(WireError::NotPermitted)));
    assert!(
        std::fs::symlink_metadata(p("null")).is_err(),
        "nothing made"
    );
    // A chown to root and a set-uid mode in one request.
    let h = o.lookup(root, b"m1").unwrap().handle;
    let both = SetAttrs {
        mode: Some(0o4755),
        uid: Some(0),
        gid: Some(0),
        ..Default::default()
    };
    let a = o.setattr(h, &both).unwrap();
    assert_eq!((a.uid, a.gid, a.perm), (65534, 65534, 0o755));
    assert_eq!(ids_and_perm(&p("m1")), (65534, 65534, 0o755));
}

#[test]
fn no_set_id_bit_survives_a_chown() {
    let d = tempfile::tempdir().unwrap();
    // Set-group-id without group execute: Linux's chown keeps that bit, even for root.
    let kept = d.path().join("kept");
    std::fs::write(&kept, b"x").unwrap();
    std::os::unix::fs::chown(&kept, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&kept, std::fs::Permissions::from_mode(0o2644)).unwrap();
    let (_srv, o, root) = serve(d.path(), IdMapping::default());
    let h = o.lookup(root, b"kept").unwrap().handle;
    let chgrp = SetAttrs {
        gid: Some(100),
        ..Default::default()
    };
    let a = o.setattr(h, &chgrp).unwrap();
    assert_eq!((a.gid, a.perm), (100, 0o644));
    assert_eq!(ids_and_perm(&kept), (1000, 100, 0o644));

    // The kernel's own behaviour, which the server relies on being overridden above: with
    // set-id bits allowed, the bit stays.
    let d2 = tempfile::tempdir().unwrap();
    let kept2 = d2.path().join("kept");
    std::fs::write(&kept2, b"x").unwrap();
    std::fs::set_permissions(&kept2, std::fs::Permissions::from_mode(0o2644)).unwrap();
    let (_srv2, o2, root2) = serve(d2.path(), IdMapping::trusting());
    let h2 = o2.lookup(root2, b"kept").unwrap().handle;
    assert_eq!(o2.setattr(h2, &chgrp).unwrap().perm, 0o2644);
}

#[test]
fn the_trusting_mapping_passes_everything_through() {
    let d = tempfile::tempdir().unwrap();
    let (_srv, o, root) = serve(d.path(), IdMapping::trusting());
    let p = |n: &str| d.path().join(n);
    o.create(root, b"f", 0o4755, true, ROOT).unwrap();
    assert_eq!(ids_and_perm(&p("f")), (0, 0, 0o4755));
    let null = o
        .mknod(
            root,
            b"null",
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
            ROOT,
        )
        .unwrap();
    assert_eq!(null.attr.rdev, libc::makedev(1, 3));
    let md = std::fs::symlink_metadata(p("null")).unwrap();
    assert_eq!(
        (md.mode() & libc::S_IFMT, md.rdev()),
        (libc::S_IFCHR, libc::makedev(1, 3))
    );
}

#[test]
fn a_write_into_a_set_id_file_clears_its_set_id_bits() {
    // A set-uid root program already in the export (put there by the administrator).
    let d = tempfile::tempdir().unwrap();
    let prog = d.path().join("prog");
    std::fs::write(&prog, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o6755)).unwrap();
    let (_srv, o, root) = serve(d.path(), IdMapping::default());
    let h = o.lookup(root, b"prog").unwrap().handle;
    let w = o.write(h, 0, b"#!/bin/sh\nid\n", false).unwrap();
    // The server writes with CAP_FSETID, which keeps the bits; the mapping clears them as
    // the kernel does for an unprivileged writer.
    assert_eq!(w.attr.perm, 0o755);
    assert_eq!(ids_and_perm(&prog), (0, 0, 0o755));

    // With set-id bits allowed, the kernel's privileged behaviour shows: they stay.
    let d2 = tempfile::tempdir().unwrap();
    let prog2 = d2.path().join("prog");
    std::fs::write(&prog2, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&prog2, std::fs::Permissions::from_mode(0o6755)).unwrap();
    let (_srv2, o2, root2) = serve(d2.path(), IdMapping::trusting());
    let h2 = o2.lookup(root2, b"prog").unwrap().handle;
    assert_eq!(o2.write(h2, 0, b"x", false).unwrap().attr.perm, 0o6755);
}
