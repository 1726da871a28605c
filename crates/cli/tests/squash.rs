//! Identity mapping through a real mount, as the client's root, checked on the server's
//! disk. The server (root) performs every request as the caller's mapped identity: by
//! default the client's root is the anonymous user, refused what that user is refused on
//! the server and owning what it creates, without set-id bits or device nodes; `--squash
//! all` makes everyone the anonymous ids; `--squash none --allow-setid --allow-devices`
//! makes the client's root the server's.

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

const NOBODY: (u32, u32) = (65534, 65534);

/// What a server's files look like to a test: content (none for a directory), owner,
/// group and permission bits.
fn snapshot(p: &Path) -> (Option<Vec<u8>>, u32, u32, u32) {
    let (uid, gid, perm) = ids_and_perm(p);
    let data = (!p.is_dir()).then(|| std::fs::read(p).unwrap());
    (data, uid, gid, perm)
}

/// The export of the four actions of issue 34: a root-owned private file, a root-owned
/// script, another user's private file in their private directory, and a root-owned file.
fn four_actions_export(exp: &Path) {
    std::fs::set_permissions(exp, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(exp.join("secret"), b"root only\n").unwrap();
    std::fs::set_permissions(exp.join("secret"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::write(exp.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(
        exp.join("script.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let home = exp.join("home/alice");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("diary"), b"dear diary\n").unwrap();
    std::fs::set_permissions(home.join("diary"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(home.join("diary"), Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(&home, Some(1000), Some(1000)).unwrap();
    std::fs::write(exp.join("owned"), b"mine\n").unwrap();
}

/// `cat secret`, `echo >> script.sh`, `cat home/alice/diary`, `chown 1000 owned` through
/// the mount, as the client's root.
fn four_actions(m: &Mount) -> [std::io::Result<()>; 4] {
    let append = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("script.sh"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"rm -rf /\n"));
    [
        std::fs::read(m.p("secret")).map(drop),
        append,
        std::fs::read(m.p("home/alice/diary")).map(drop),
        std::os::unix::fs::chown(m.p("owned"), Some(1000), None),
    ]
}

#[test]
fn a_root_client_is_refused_what_the_anonymous_user_is_refused_on_the_server() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    four_actions_export(&exp);
    let names = ["secret", "script.sh", "home/alice/diary", "owned"];
    let before: Vec<_> = names.iter().map(|n| snapshot(&exp.join(n))).collect();
    // The server as deployed: no --squash given.
    let srv = Server::start_deployed(&exp, &state_dir(), &[]);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    let [cat, append, diary, chown] = four_actions(&m);
    assert_errno("cat secret", cat, libc::EACCES);
    assert_errno("echo >> script.sh", append, libc::EACCES);
    assert_errno("cat home/alice/diary", diary, libc::EACCES);
    assert_errno("chown 1000 owned", chown, libc::EPERM);
    let after: Vec<_> = names.iter().map(|n| snapshot(&exp.join(n))).collect();
    assert_eq!(before, after, "the server's files changed");
    drop(m);
    drop(srv);

    // With --squash none the client's root is the server's: all four work.
    let srv = Server::start_args(&exp, &["--squash", "none"]);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt2"),
        &t.path().join("cache2"),
        &[],
    );
    for (name, r) in names.iter().zip(four_actions(&m)) {
        r.unwrap_or_else(|e| panic!("{name} with --squash none: {e}"));
    }
    assert!(read(&exp.join("script.sh")).ends_with(b"rm -rf /\n"));
    assert_eq!(ids_and_perm(&exp.join("script.sh")), (0, 0, 0o755));
    assert_eq!(ids_and_perm(&exp.join("owned")).0, 1000);
}

#[test]
fn a_root_clients_objects_are_the_anonymous_users_without_set_id_bits_or_devices() {
    let r = rig_with(
        |exp| {
            std::fs::set_permissions(exp, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::fs::write(exp.join("theirs"), b"x").unwrap();
            std::os::unix::fs::chown(exp.join("theirs"), Some(1000), Some(1000)).unwrap();
        },
        &["--squash", "root"],
        &[],
    );
    put(&r.m.p("f"), b"#!/bin/sh\n");
    assert_eq!(ids_and_perm(&r.srv("f")).0, NOBODY.0);
    assert_eq!(
        (ids_and_perm(&r.srv("f")).0, ids_and_perm(&r.srv("f")).1),
        NOBODY
    );
    // The anonymous user may not give its file away, nor take someone else's.
    let give = std::os::unix::fs::chown(r.m.p("f"), Some(0), Some(0));
    assert_errno("chown 0:0 f", give, libc::EPERM);
    let take = std::os::unix::fs::chown(r.m.p("theirs"), Some(65534), None);
    assert_errno("chown theirs", take, libc::EPERM);
    assert_eq!(ids_and_perm(&r.srv("theirs")).0, 1000);
    // Its mode may change, without set-id bits.
    std::fs::set_permissions(r.m.p("f"), std::fs::Permissions::from_mode(0o4755)).unwrap();
    assert_eq!(ids_and_perm(&r.srv("f")), (NOBODY.0, NOBODY.1, 0o755));
    assert_eq!(ids_and_perm(&r.m.p("f")), (NOBODY.0, NOBODY.1, 0o755));

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
fn all_squash_makes_everyone_the_anonymous_ids() {
    let r = rig_with(
        |exp| std::fs::set_permissions(exp, std::fs::Permissions::from_mode(0o777)).unwrap(),
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
    std::fs::create_dir(r.m.p("d")).unwrap();
    assert_eq!(ids("d"), (4321, 5432));
    // The anonymous user may not give its objects away.
    let give = std::os::unix::fs::chown(r.m.p("f"), Some(1000), Some(1000));
    assert_errno("chown f", give, libc::EPERM);
    assert_eq!(ids("f"), (4321, 5432));
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
