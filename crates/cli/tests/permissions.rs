//! The server performs every request as its caller: a user on a client can do through a
//! mount exactly what the same uid can do on the server (modes, POSIX ACLs, sticky
//! directories), including for files another user brought into the client's cache; and a
//! credential restricted to users acts only as them, whatever its requests claim.
//!
//! Processes run as other users on the client with `Command::uid`/`gid` (real programs:
//! `cat`, `sh`), against a server (root) as deployed (root squash).

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::rig::{put, read};
use common::*;
use hoardfs_origin::{Caller, Origin, caller};

const ALICE: u32 = 2001;
const BOB: u32 = 2002;
const CAROL: u32 = 2003;

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

fn chown(p: &Path, uid: u32) {
    std::os::unix::fs::chown(p, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
}

/// Runs `sh -c script` as `uid` (group `uid`, no supplementary groups) and returns
/// whether it succeeded, and its standard error.
fn sh_as(uid: u32, script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", script])
        .uid(uid)
        .gid(uid)
        .output()
        .expect("run sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `sh_as` that must succeed.
#[track_caller]
fn ok_as(uid: u32, script: &str) {
    let (ok, err) = sh_as(uid, script);
    assert!(ok, "as {uid}: `{script}` failed: {err}");
}

/// `sh_as` that must fail with "Permission denied" or "Operation not permitted".
#[track_caller]
fn refused_as(uid: u32, script: &str) {
    let (ok, err) = sh_as(uid, script);
    assert!(!ok, "as {uid}: `{script}` succeeded");
    assert!(
        err.contains("Permission denied") || err.contains("Operation not permitted"),
        "as {uid}: `{script}` failed otherwise: {err}"
    );
}

/// A scratch directory other users can reach (the mount point lies inside it).
fn open_scratch() -> tempfile::TempDir {
    let t = scratch();
    chmod(t.path(), 0o755);
    t
}

/// Serves `exp` as deployed and mounts it (as root, so every user may use the mount).
fn serve_and_mount(t: &Path, exp: &Path, server_args: &[&str]) -> (Server, Mount) {
    let srv = Server::start_deployed(exp, &state_dir(), server_args);
    let m = Mount::with_cache(&srv.addr, &t.join("mnt"), &t.join("cache"), &[]);
    (srv, m)
}

#[test]
fn a_user_on_a_client_can_do_what_the_same_uid_can_do_on_the_server() {
    require_fuse();
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    chmod(&exp, 0o755);
    for (who, uid) in [("alice", ALICE), ("bob", BOB)] {
        let home = exp.join(who);
        std::fs::create_dir(&home).unwrap();
        std::fs::write(home.join("private"), format!("{who}'s\n")).unwrap();
        chmod(&home.join("private"), 0o600);
        chown(&home.join("private"), uid);
        chown(&home, uid);
        chmod(&home, 0o755);
    }
    let (_srv, m) = serve_and_mount(t.path(), &exp, &[]);
    let p = |rel: &str| m.p(rel).display().to_string();

    ok_as(ALICE, &format!("cat {} >/dev/null", p("alice/private")));
    refused_as(ALICE, &format!("cat {}", p("bob/private")));
    refused_as(ALICE, &format!("echo x > {}", p("bob/new")));
    refused_as(ALICE, &format!("echo x >> {}", p("bob/private")));
    ok_as(ALICE, &format!("echo x > {}", p("alice/new")));
    let md = std::fs::metadata(exp.join("alice/new")).unwrap();
    assert_eq!((md.uid(), md.gid()), (ALICE, ALICE));
    assert!(!exp.join("bob/new").exists());

    // Bob brings his file into the client's cache; Alice still cannot read it.
    ok_as(BOB, &format!("cat {} >/dev/null", p("bob/private")));
    ok_as(BOB, &format!("cat {} >/dev/null", p("bob/private")));
    refused_as(ALICE, &format!("cat {}", p("bob/private")));
    // Nor can the client's root, the anonymous user on the server.
    assert_errno(
        "root reads bob's file",
        std::fs::read(m.p("bob/private")),
        libc::EACCES,
    );
}

#[test]
fn a_posix_acl_set_on_the_server_is_honoured_for_cached_files_too() {
    require_fuse();
    if Command::new("setfacl").arg("--version").output().is_err() {
        panic!("this test needs setfacl (Debian package acl; .ci/run installs it)");
    }
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    chmod(&exp, 0o755);
    std::fs::write(exp.join("report"), b"quarterly\n").unwrap();
    chmod(&exp.join("report"), 0o644);
    chown(&exp.join("report"), CAROL);
    // Everyone may read it by its mode, but Alice is denied by name.
    let set = Command::new("setfacl")
        .args(["-m", &format!("u:{ALICE}:---")])
        .arg(exp.join("report"))
        .status()
        .unwrap();
    assert!(set.success(), "setfacl failed");
    let (_srv, m) = serve_and_mount(t.path(), &exp, &[]);
    let report = m.p("report").display().to_string();
    // Bob reads it (and the client caches it), then Alice is refused, twice (the
    // second answer comes from what the client keeps).
    ok_as(BOB, &format!("cat {report} >/dev/null"));
    refused_as(ALICE, &format!("cat {report}"));
    refused_as(ALICE, &format!("cat {report}"));
    ok_as(BOB, &format!("cat {report} >/dev/null"));
    // The owner lifts the ACL on the server: Alice may read it now.
    let unset = Command::new("setfacl")
        .arg("-b")
        .arg(exp.join("report"))
        .status()
        .unwrap();
    assert!(unset.success());
    assert_eventually("Alice reads once the ACL is gone", || {
        sh_as(ALICE, &format!("cat {report} >/dev/null")).0
    });
}

#[test]
fn a_sticky_directory_protects_each_users_files() {
    require_fuse();
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("tmp")).unwrap();
    chmod(&exp, 0o755);
    chmod(&exp.join("tmp"), 0o1777);
    let (_srv, m) = serve_and_mount(t.path(), &exp, &[]);
    let p = |rel: &str| m.p(rel).display().to_string();
    ok_as(ALICE, &format!("echo a > {}", p("tmp/a")));
    ok_as(BOB, &format!("echo b > {}", p("tmp/b")));
    refused_as(BOB, &format!("rm -f {}", p("tmp/a")));
    refused_as(BOB, &format!("mv {} {}", p("tmp/a"), p("tmp/c")));
    assert_eq!(std::fs::read(exp.join("tmp/a")).unwrap(), b"a\n");
    ok_as(ALICE, &format!("rm {}", p("tmp/a")));
    assert!(!exp.join("tmp/a").exists());
    ok_as(BOB, &format!("rm {}", p("tmp/b")));
}

/// A protocol client with credential `token` (no mount): requests claim what the test
/// enters as the ambient caller.
fn client(srv: &Server, token: &str) -> hoardfs_origin::remote::RemoteOrigin {
    use hoardfs_origin::remote::{ClientTls, RemoteOptions, RemoteOrigin, Security, Trust};
    let tls = ClientTls::new(Trust::Pinned(srv.fingerprint.expect("TLS"))).unwrap();
    RemoteOrigin::connect(
        &srv.addr,
        Security::tls(token.as_bytes().to_vec(), tls),
        RemoteOptions::default(),
    )
    .expect("connect")
}

fn token_add(state: &Path, name: &str, args: &[&str]) -> String {
    let out = Command::new(bin())
        .args(["token", "add", name, "--state-dir"])
        .arg(state)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "token add: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn a_restricted_credential_acts_only_as_its_users_whatever_it_claims() {
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("alice")).unwrap();
    chmod(&exp, 0o777);
    std::fs::write(exp.join("alice/private"), b"alice's\n").unwrap();
    chmod(&exp.join("alice/private"), 0o600);
    chown(&exp.join("alice/private"), ALICE);
    chown(&exp.join("alice"), ALICE);
    let state = t.path().join("state");
    let ranged = token_add(&state, "lab", &["--uids", "3000-3999"]);
    let user = token_add(&state, "laptop", &["--user", &format!("{BOB}:{BOB}")]);
    let listed = Command::new(bin())
        .args(["token", "list", "--state-dir"])
        .arg(&state)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("uids=3000-3999"), "{listed}");
    assert!(listed.contains(&format!("user={BOB}:{BOB}")), "{listed}");
    let srv = Server::start_deployed(&exp, &state, &[]);

    let read_as = |o: &dyn Origin, claim: Caller| {
        caller::with(Arc::new(claim), || {
            let root = o.info().unwrap().root.handle;
            let dir = o.lookup(root, b"alice")?.handle;
            let f = o.lookup(dir, b"private")?.handle;
            o.read(f, 0, 100).map(|r| r.data)
        })
    };
    let lab = client(&srv, &ranged);
    // Claiming root or Alice herself, outside the credential's range: the anonymous
    // user, who may not read her file.
    for claim in [Caller::new(0, 0), Caller::new(ALICE, ALICE)] {
        let got = read_as(&lab, claim.clone());
        assert_eq!(
            got,
            Err(hoardfs_origin::OriginError::Fs(
                hoardfs_origin::WireError::Access
            )),
            "claiming {claim:?}"
        );
    }
    // A machine credential's claim is taken as it comes (the deployed default).
    // The user credential: whatever it claims, its requests are Bob's.
    let laptop = client(&srv, &user);
    caller::with(Arc::new(Caller::new(0, 0)), || {
        let root = laptop.info().unwrap().root.handle;
        laptop.create(root, b"made", 0o644, true, Default::default())
    })
    .expect("create as the credential's user");
    let md = std::fs::metadata(exp.join("made")).unwrap();
    assert_eq!((md.uid(), md.gid()), (BOB, BOB));
    let got = read_as(&laptop, Caller::new(ALICE, ALICE));
    assert!(got.is_err(), "Bob's credential read Alice's file: {got:?}");
}

/// A server run by an ordinary user exports what that user may: everything is done with
/// that user's rights, files are made as that user, and what the user may not read is
/// refused to everyone.
#[test]
fn a_server_run_by_an_ordinary_user_exports_what_that_user_may() {
    require_fuse();
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    chown(&exp, ALICE);
    std::fs::write(exp.join("root-only"), b"no").unwrap();
    chmod(&exp.join("root-only"), 0o600);
    std::fs::write(exp.join("shared"), b"yes").unwrap();
    chmod(&exp.join("shared"), 0o644);
    let state = t.path().join("state");
    std::fs::create_dir(&state).unwrap();
    chown(&state, ALICE);
    chmod(&state, 0o700);
    let srv = Server::start_as_user(&exp, &state, ALICE);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    assert_eq!(read(&m.p("shared")), b"yes");
    assert_errno(
        "read of a file the server's user may not read",
        std::fs::read(m.p("root-only")),
        libc::EACCES,
    );
    put(&m.p("made"), b"by a client");
    let md = std::fs::metadata(exp.join("made")).unwrap();
    assert_eq!((md.uid(), md.gid()), (ALICE, ALICE));
}

/// With `--offline-writes`, a directory used by path is listed in the background as the
/// user whose lookup asked for it, never as the mount: one that user may search but not
/// read (0711) is not listed, so nothing of it is learned that the user could not list.
#[test]
fn a_directory_used_by_path_is_listed_in_the_background_as_the_user_who_used_it() {
    require_fuse();
    let t = open_scratch();
    let exp = t.path().join("export");
    std::fs::create_dir(&exp).unwrap();
    chmod(&exp, 0o755);
    let (search_only, readable) = (exp.join("drop"), exp.join("open"));
    for (d, mode) in [(&search_only, 0o711), (&readable, 0o755)] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("known"), b"by path\n").unwrap();
        chmod(&d.join("known"), 0o644);
        chmod(d, mode);
    }
    // Requests as their callers, root not squashed: a listing made as the mount (root)
    // would succeed where alice's fails.
    let mut srv = Server::start_deployed(&exp, &state_dir(), &["--squash", "none"]);
    let addr = srv.addr.clone();
    let m = Mount::with_cache(
        &addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &["--offline-writes", "--timeout", "2"],
    );
    ok_as(
        ALICE,
        &format!(
            "cat {} {}",
            m.p("drop/known").display(),
            m.p("open/known").display()
        ),
    );
    assert_soon("the background listings", || {
        let c = &stats(&m)["counters"];
        let n =
            c["listing_fetches"].as_u64().unwrap_or(0) + c["tree_requests"].as_u64().unwrap_or(0);
        if n >= 1 { Ok(()) } else { Err(format!("{c}")) }
    });
    std::thread::sleep(std::time::Duration::from_millis(500));
    srv.kill();
    // Offline, as root on the client: what alice's listing could see is there, the
    // directory she may not read was never listed.
    assert_eq!(list(&m.p("open")).unwrap(), vec![b"known".to_vec()]);
    assert_errno(
        "a directory alice may not read",
        list(&m.p("drop")),
        libc::EIO,
    );
    m.unmount();
}
