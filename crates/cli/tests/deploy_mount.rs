//! Deploying like any Linux file system: `mount -t fuse.hoardfs` and fstab lines (through
//! mount(8) and mount.fuse3), `--daemon` behind a pipe, an immediate mount after `umount`,
//! and systemd's readiness notification from `hoardfs serve`.

mod common;

use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `cmd`, failing if it has not exited within `limit` (its output is collected by
/// threads: a process that leaves the pipes open behind it cannot block the test).
fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let collect = |mut r: Box<dyn Read + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            let _ = tx.send(v);
        });
        rx
    };
    let out = collect(Box::new(child.stdout.take().unwrap()));
    let err = collect(Box::new(child.stderr.take().unwrap()));
    let deadline = Instant::now() + limit;
    if !wait_until(limit, || child.try_wait().unwrap().is_some()) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{cmd:?} did not return within {limit:?}");
    }
    let status = child.wait().unwrap();
    // Whoever still holds the pipes (a daemon that did not detach) gets a bounded wait.
    let rest = deadline.saturating_duration_since(Instant::now()) + Duration::from_secs(1);
    let stdout = out
        .recv_timeout(rest)
        .unwrap_or_else(|_| panic!("{cmd:?} returned, but left its stdout open"));
    let stderr = err
        .recv_timeout(Duration::from_secs(1))
        .unwrap_or_else(|_| panic!("{cmd:?} returned, but left its stderr open"));
    Output {
        status,
        stdout,
        stderr,
    }
}

/// The /proc/mounts line of the mount on `mnt`, if any.
fn proc_mounts_line(mnt: &Path) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let want = format!(" {} ", mnt.display());
    mounts
        .lines()
        .find(|l| l.contains(&want))
        .map(str::to_string)
}

/// A directory `name` created in `t`.
fn new_dir(t: &tempfile::TempDir, name: &str) -> PathBuf {
    let p = t.path().join(name);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// An export directory in `t` holding one file, `name` with `data`.
fn export_one(t: &tempfile::TempDir, name: &str, data: &[u8]) -> PathBuf {
    let exp = new_dir(t, "export");
    std::fs::write(exp.join(name), data).unwrap();
    exp
}

/// The pid of the `hoardfs mount --daemon` process serving `mnt`.
fn daemon_pid(mnt: &Path) -> Option<libc::pid_t> {
    let want = mnt.to_str().unwrap();
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: libc::pid_t = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let ours = args.contains(&want.as_bytes()) && args.contains(&&b"--daemon"[..]);
        ours.then_some(pid)
    })
}

/// Lazily unmounts a mount point on drop (a test that fails leaves no mount behind).
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        if proc_mounts_line(self.0).is_some() {
            let _ = Command::new("umount").arg("-l").arg(self.0).status();
        }
    }
}

/// mount(8) runs `mount.fuse3`, which runs the program the type names (`hoardfs`) through
/// `sh -c` with the default search path: mount(8) drops the caller's PATH. So the test runs
/// the mounts in a private mount namespace where a directory holding a `hoardfs` link to
/// the binary under test is bound over /usr/local/sbin, first on that path.
#[test]
fn mount_8_and_fstab_mount_hoardfs() {
    require_fuse();
    let t = scratch();
    let exp = export_one(&t, "hello.txt", b"hello from the server\n");
    let token = t.path().join("token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let srv = Server::start_with(&exp, Some(&token));
    let fp = srv.fingerprint.expect("TLS").to_string();
    let bin_dir = new_dir(&t, "bin");
    std::os::unix::fs::symlink(bin(), bin_dir.join("hoardfs")).unwrap();
    let mnt = new_dir(&t, "mnt");
    let opts = |cache: &str| {
        format!(
            "cache_dir={},token_file={},server_fingerprint={fp},_netdev,nofail,noexec,\
             x-systemd.automount,comment=hoardfs-test",
            t.path().join(cache).display(),
            token.display()
        )
    };
    let fstab = t.path().join("fstab");
    std::fs::write(
        &fstab,
        format!(
            "# a test fstab\n{} {} fuse.hoardfs {} 0 0\n",
            srv.addr,
            mnt.display(),
            opts("cache-fstab")
        ),
    )
    .unwrap();
    let script = r#"
        set -e
        trap 'umount -l "$MNT" 2>/dev/null || true' EXIT
        mount --bind "$BIN_DIR" /usr/local/sbin
        mount -t fuse.hoardfs "$SRC" "$MNT" -o "$OPTS"
        echo "mount-t: $(grep " $MNT " /proc/mounts)"
        echo "read-t: $(cat "$MNT/hello.txt")"
        umount "$MNT"
        mount -T "$FSTAB" "$MNT"
        echo "fstab: $(grep " $MNT " /proc/mounts)"
        echo "read-fstab: $(cat "$MNT/hello.txt")"
        umount "$MNT"
        echo done
    "#;
    let _guard = Unmount(&mnt);
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", script])
        .env("BIN_DIR", &bin_dir)
        .env("SRC", &srv.addr)
        .env("MNT", &mnt)
        .env("OPTS", opts("cache-t"))
        .env("FSTAB", &fstab);
    let out = output_within(cmd, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("\ndone"),
        "mounting through mount(8) failed: {}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    for how in ["mount-t", "fstab"] {
        let line = stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{how}: ")))
            .unwrap_or_else(|| panic!("no /proc/mounts line for {how}: {stdout}"));
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], srv.addr, "{how}: the source: {line}");
        assert_eq!(f[2], "fuse.hoardfs", "{how}: the type: {line}");
        let flags: Vec<&str> = f[3].split(',').collect();
        for flag in ["noexec", "nosuid", "nodev"] {
            assert!(flags.contains(&flag), "{how}: {flag} missing: {line}");
        }
    }
    for how in ["read-t", "read-fstab"] {
        assert!(
            stdout.contains(&format!("{how}: hello from the server")),
            "{how}: {stdout}"
        );
    }
    assert!(
        proc_mounts_line(&mnt).is_none(),
        "the namespace's mount leaked"
    );
}

/// `--daemon` returns once the mount is ready even when its output is a pipe, and an
/// error before that is printed once.
#[test]
fn daemon_returns_through_a_pipe_and_says_errors_once() {
    require_fuse();
    let t = scratch();
    let exp = export_one(&t, "f", b"data");
    let srv = Server::start(&exp);
    let mnt = new_dir(&t, "mnt");
    let cache = t.path().join("cache");
    let _guard = Unmount(&mnt);
    // Silent on success, as mount(8), NFS and sshfs are, unless asked with -v (the
    // first use of a server's identity is announced either way: it is a trust decision).
    for verbose in [false, true] {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(r#""$HOARDFS" mount $V "$SRC" "$MNT" --cache-dir "$CACHE" --daemon 2>&1 | cat"#)
            .env("HOARDFS", bin())
            .env("SRC", &srv.addr)
            .env("MNT", &mnt)
            .env("CACHE", &cache)
            .env("V", if verbose { "-v" } else { "" });
        let out = output_within(cmd, Duration::from_secs(30));
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{said}");
        assert_eq!(said.contains("hoardfs: mounted"), verbose, "{said}");
        let line = proc_mounts_line(&mnt).expect("mounted");
        assert!(line.contains(" fuse.hoardfs "), "{line}");
        // Access times are not kept: the mount says so.
        assert!(line.contains("noatime"), "{line}");
        assert_eq!(std::fs::read(mnt.join("f")).unwrap(), b"data");
        let st = Command::new("umount").arg(&mnt).status().unwrap();
        assert!(st.success());
    }

    // A daemon whose stderr is a file (a log) keeps writing to it.
    let log = t.path().join("mount.log");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#""$HOARDFS" mount "$SRC" "$MNT" --cache-dir "$CACHE" --daemon 2>>"$LOG""#)
        .env("HOARDFS", bin())
        .env("HOARDFS_LOG", "info")
        .env("SRC", &srv.addr)
        .env("MNT", &mnt)
        .env("CACHE", &cache)
        .env("LOG", &log);
    assert!(output_within(cmd, Duration::from_secs(30)).status.success());
    let pid = daemon_pid(&mnt).expect("the daemon's process");
    // SAFETY: kill(2); SIGTERM makes the daemon unmount and exit.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_soon("the daemon logs its unmount to the file", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        match text.contains("signal received, unmounting") {
            true => Ok(()),
            false => Err(text),
        }
    });
    assert_soon("unmounted", || match proc_mounts_line(&mnt) {
        None => Ok(()),
        Some(l) => Err(l),
    });

    // Nothing listens on port 1: the error comes from the daemonised child.
    let mut cmd = Command::new(bin());
    cmd.args(["mount", "127.0.0.1:1"])
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(t.path().join("cache2"))
        .args(["--daemon", "--timeout", "2"]);
    let out = output_within(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("hoardfs: ")).collect();
    assert_eq!(lines.len(), 1, "the error once: {err}");
    assert!(proc_mounts_line(&mnt).is_none());

    // The mount.fuse3 form refuses an unknown option once, before forking.
    let mut cmd = Command::new(bin());
    cmd.arg(&srv.addr)
        .arg(&mnt)
        .args(["-o", "cache_dir=/nonexistent,bogus"]);
    let out = output_within(cmd, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(
        err.lines().filter(|l| l.contains("bogus")).count(),
        1,
        "{err}"
    );
}

/// `umount` returns before the client has let go of its cache: the next mount of the same
/// cache waits for it instead of failing with "in use".
#[test]
fn mount_right_after_umount_succeeds_every_time() {
    require_fuse();
    let t = scratch();
    let exp = export_one(&t, "f", &bytes(7, 300_000));
    let srv = Server::start(&exp);
    let mnt = new_dir(&t, "mnt");
    let cache = t.path().join("cache");
    let _guard = Unmount(&mnt);
    for round in 0..20 {
        let mut cmd = Command::new(bin());
        cmd.args(["mount", &srv.addr])
            .arg(&mnt)
            .arg("--cache-dir")
            .arg(&cache)
            .arg("--daemon");
        let out = output_within(cmd, Duration::from_secs(30));
        assert!(
            out.status.success(),
            "mount {round} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(hash_file(&mnt.join("f")), hash_file(&exp.join("f")));
        let st = Command::new("umount").arg(&mnt).status().unwrap();
        assert!(st.success(), "umount {round}");
    }
}

/// A `Type=notify` mount service learns that the mount is up.
#[test]
fn mount_notifies_systemd_once_mounted() {
    require_fuse();
    let t = scratch();
    let exp = export_one(&t, "f", b"data");
    let srv = Server::start(&exp);
    let mnt = new_dir(&t, "mnt");
    let path = t.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let _guard = Unmount(&mnt);
    let mut child = Command::new(bin())
        .args(["mount", &srv.addr])
        .arg(&mnt)
        .arg("--cache-dir")
        .arg(t.path().join("cache"))
        .env("NOTIFY_SOCKET", &path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    let got = sock.recv(&mut buf);
    let mounted = proc_mounts_line(&mnt);
    let _ = Command::new("umount").arg(&mnt).status();
    let _ = child.kill(); // in case it never mounted
    let _ = child.wait();
    let n = got.expect("a notification");
    let msg = String::from_utf8_lossy(&buf[..n]);
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg:?}");
    assert!(mounted.is_some(), "READY=1 before the mount was up");
}

/// A `Type=notify` unit learns that `hoardfs serve` is ready: `READY=1` on the datagram
/// socket in `$NOTIFY_SOCKET`, a path or an abstract name (`@…`).
#[test]
fn serve_notifies_systemd_once_serving() {
    let t = scratch();
    let exp = new_dir(&t, "export");
    let path = t.path().join("notify");
    let by_path = UnixDatagram::bind(&path).unwrap();
    let name = format!("hoardfs-test-notify-{}", std::process::id());
    let by_name = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixDatagram::bind_addr(&addr).unwrap()
    };
    for (sock, env) in [
        (&by_path, path.to_str().unwrap().to_string()),
        (&by_name, format!("@{name}")),
    ] {
        let mut child = Command::new(bin())
            .arg("serve")
            .arg(&exp)
            .args(["--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state_dir())
            .env("NOTIFY_SOCKET", &env)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = [0u8; 512];
        let got = sock.recv(&mut buf);
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let mut stdout = String::new();
        child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let _ = child.wait();
        let n = got.unwrap_or_else(|e| panic!("no notification on {env}: {e}"));
        let msg = String::from_utf8_lossy(&buf[..n]);
        assert!(msg.lines().any(|l| l == "READY=1"), "{env}: {msg:?}");
        // Ready means serving: the address it reports is the one it printed.
        let status = msg
            .lines()
            .find_map(|l| l.strip_prefix("STATUS="))
            .expect("a status");
        let printed = stdout.lines().next().unwrap_or_default();
        let addr = status.rsplit(' ').next().unwrap();
        assert!(
            printed.contains(&format!(" on {addr} ")),
            "{status:?} vs {printed:?}"
        );
    }
}
