//! `--fuse-transport`: the same file system served over FUSE over io_uring (one kernel queue
//! per CPU, requests and replies in ring entries) and over /dev/fuse. Each test drives every
//! kind of request a mount sees (lookups, listings, cached and uncached reads, passthrough
//! opens, 1 MiB writes, creates, renames, removals, links, attributes) and checks the bytes
//! and names on the server, and that the requests went through the transport asked for.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::rig::*;
use common::*;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Held by the tests that read or set the parameter, which is global to the machine.
static PARAM_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the fuse module's `enable_uring` for the test and puts the old value back on drop
/// (the kernel reads it at each mount's INIT, so only this test's mounts depend on it).
struct UringParam(Option<String>);

impl UringParam {
    /// `None` when this kernel has no FUSE over io_uring (older than 6.14, or built
    /// without it) or the parameter cannot be set.
    fn enable() -> Option<UringParam> {
        let old = std::fs::read_to_string(PARAM).ok()?;
        if old.trim() == "Y" {
            return Some(UringParam(None));
        }
        std::fs::write(PARAM, "Y").ok()?;
        Some(UringParam(Some(old)))
    }
}

/// The parameter set for the test, and the lock on it (dropped in that order: the old value
/// is back before another test may look); `None` (reported as skipped) where the kernel has
/// no FUSE over io_uring.
fn uring_on() -> Option<(UringParam, std::sync::MutexGuard<'static, ()>)> {
    require_fuse();
    let lock = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    match UringParam::enable() {
        Some(param) => Some((param, lock)),
        None => {
            eprintln!("SKIPPED: this kernel has no FUSE over io_uring ({PARAM})");
            None
        }
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        if let Some(old) = &self.0 {
            let _ = std::fs::write(PARAM, old.trim());
        }
    }
}

fn fuse(m: &Mount) -> (String, u64) {
    let v = stats(m);
    (
        v["fuse"]["transport"].as_str().unwrap().to_string(),
        v["fuse"]["ring_requests"].as_u64().unwrap(),
    )
}

/// Every kind of request, checked against the export.
fn workout(r: &Rig, big: &[u8]) {
    let m = &r.m;
    // Listings and lookups of what the server holds.
    let mut names = list(&m.p("")).unwrap();
    names.sort();
    assert_eq!(
        names,
        vec![b"big".to_vec(), b"d".to_vec(), b"small".to_vec()]
    );
    // Uncached reads (daemon), then passthrough reads of the now cached files.
    assert_content("big, first read", &m.p("big"), big);
    assert_content("small, first read", &m.p("d/small2"), b"two");
    for _ in 0..20 {
        assert_content("big, cached", &m.p("big"), big);
        assert_content("small, cached", &m.p("small"), b"one");
    }
    // Writes of 1 MiB requests (a ring entry's whole payload) and a create.
    let written = bytes(7, (3 << 20) + 123);
    put(&m.p("new"), &written);
    assert_content("new on the server", &r.srv("new"), &written);
    assert_content("new through the mount", &m.p("new"), &written);
    // Names: mkdir, rename, symlink, hard link, unlink, rmdir.
    std::fs::create_dir(m.p("d2")).unwrap();
    std::fs::rename(m.p("new"), m.p("d2/renamed")).unwrap();
    std::os::unix::fs::symlink("d2/renamed", m.p("link")).unwrap();
    assert_eq!(
        std::fs::read_link(m.p("link")).unwrap(),
        Path::new("d2/renamed")
    );
    std::fs::hard_link(m.p("small"), m.p("d2/hard")).unwrap();
    std::fs::remove_file(m.p("d/small2")).unwrap();
    std::fs::remove_dir(m.p("d")).unwrap();
    assert_content("renamed on the server", &r.srv("d2/renamed"), &written);
    assert_content("hard link on the server", &r.srv("d2/hard"), b"one");
    assert!(!r.srv("d").exists(), "d still on the server");
    // Attributes: chmod, truncate, statfs.
    std::fs::set_permissions(m.p("small"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(
        std::fs::metadata(r.srv("small"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o600
    );
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("d2/renamed"))
        .unwrap()
        .set_len(10)
        .unwrap();
    assert_content("truncated", &r.srv("d2/renamed"), &written[..10]);
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    let p = cpath(&m.path);
    // SAFETY: a valid path and a zeroed statvfs to fill.
    assert_eq!(unsafe { libc::statvfs(p.as_ptr(), &mut st) }, 0, "statfs");
    // Errors travel too.
    assert_errno(
        "open of a missing name",
        std::fs::File::open(m.p("nope")),
        libc::ENOENT,
    );
}

/// `--fuse-transport io-uring` mount of `addr` at `dir/mnt` with its cache in `dir/cache`.
fn mount_over_io_uring(addr: &str, dir: &Path) -> Result<(), String> {
    let cache = dir.join("cache");
    Mount::start(
        addr,
        &dir.join("mnt"),
        &[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--fuse-transport",
            "io-uring",
        ],
    )
    .map(|_| ())
}

fn export(big: &[u8]) -> impl FnOnce(&Path) + '_ {
    move |exp: &Path| {
        std::fs::write(exp.join("big"), big).unwrap();
        std::fs::write(exp.join("small"), b"one").unwrap();
        std::fs::create_dir(exp.join("d")).unwrap();
        std::fs::write(exp.join("d/small2"), b"two").unwrap();
    }
}

#[test]
fn io_uring_serves_every_kind_of_request() {
    let Some(_uring) = uring_on() else {
        return;
    };
    let big = bytes(1, (5 << 20) + 7);
    let r = rig_with(export(&big), &[], &["--fuse-transport", "io-uring"]);
    let (transport, before) = fuse(&r.m);
    assert_eq!(transport, "io_uring");
    workout(&r, &big);
    let (_, after) = fuse(&r.m);
    // The workout sends well over 100 requests (20 rounds of two opens and releases alone).
    assert!(
        after - before >= 100,
        "only {} requests went over the rings",
        after - before
    );
    r.m.unmount();
}

#[test]
fn dev_fuse_serves_every_kind_of_request() {
    let big = bytes(2, (5 << 20) + 7);
    let r = rig_with(export(&big), &[], &["--fuse-transport", "dev-fuse"]);
    workout(&r, &big);
    assert_eq!(fuse(&r.m), ("dev_fuse".to_string(), 0));
    r.m.unmount();
}

/// Sets `kernel.io_uring_disabled` for the test, restoring it on drop.
struct UringDisabled(String);

impl UringDisabled {
    const SYSCTL: &str = "/proc/sys/kernel/io_uring_disabled";

    fn set(v: &str) -> Option<UringDisabled> {
        let old = std::fs::read_to_string(Self::SYSCTL).ok()?;
        std::fs::write(Self::SYSCTL, v).ok()?;
        Some(UringDisabled(old.trim().to_string()))
    }
}

impl Drop for UringDisabled {
    fn drop(&mut self) {
        let _ = std::fs::write(Self::SYSCTL, &self.0);
    }
}

#[test]
fn a_mount_whose_rings_cannot_be_made_serves_dev_fuse() {
    let Some(_uring) = uring_on() else {
        return;
    };
    // FUSE offers io_uring, but io_uring_setup is refused to every process (as a
    // container's seccomp profile or this sysctl would): the session must stay on
    // /dev/fuse instead of leaving the kernel waiting for rings.
    let Some(_disabled) = UringDisabled::set("2") else {
        eprintln!("SKIPPED: cannot set {}", UringDisabled::SYSCTL);
        return;
    };
    let big = bytes(3, (1 << 20) + 3);
    let r = rig_with(export(&big), &[], &[]);
    workout(&r, &big);
    assert_eq!(fuse(&r.m), ("dev_fuse".to_string(), 0));
    let err = mount_over_io_uring(&r.srv.addr, &r.t.path().join("second"))
        .expect_err("a mount that must use io_uring must fail when it cannot");
    assert!(err.contains("did not enable FUSE over io_uring"), "{err}");
    r.m.unmount();
}

#[test]
fn io_uring_asked_of_a_kernel_without_it_fails_the_mount_clearly() {
    require_fuse();
    let _lock = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    // Only where the parameter exists and is off: then the mount must say how to turn it on.
    match std::fs::read_to_string(PARAM) {
        Ok(v) if v.trim() == "N" => {}
        _ => {
            eprintln!("SKIPPED: {PARAM} is not N here");
            return;
        }
    }
    let t = scratch();
    let srv = Server::start(t.path());
    let err = mount_over_io_uring(&srv.addr, t.path()).expect_err("the mount must fail");
    assert!(err.contains("enable_uring"), "{err}");
}

/// While the kernel has FUSE over io_uring but it is off, `hoardfs stats` says what
/// /dev/fuse costs and how to turn io_uring on (a default mount uses it when it is on).
#[test]
fn stats_say_how_to_turn_io_uring_on_while_it_is_off() {
    require_fuse();
    let _lock = PARAM_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let Ok(old) = std::fs::read_to_string(PARAM) else {
        eprintln!("SKIPPED: this kernel has no FUSE over io_uring ({PARAM})");
        return;
    };
    std::fs::write(PARAM, "N").unwrap();
    let _restore = UringParam(Some(old));
    let r = rig();
    let (ok, out, err) = tool(&["stats", r.m.path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("FUSE requests: over /dev/fuse"), "{out}");
    assert!(
        out.contains(&format!("echo Y > {PARAM}")),
        "no word on turning io_uring on: {out}"
    );
}
