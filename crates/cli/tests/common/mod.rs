//! Test harness: real `hoardfs serve` processes on 127.0.0.1 (ephemeral ports) and real
//! FUSE mounts by `hoardfs mount`, in temp dirs, torn down on drop; [`garage`] runs a real
//! Garage (S3) cluster the same way.

#![allow(dead_code)]

pub mod garage;
pub mod link;
pub mod offline;
pub mod proxy;
pub mod rig;
pub mod rng;
pub mod tree;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hoardfs_origin::ServerCounters;
use hoardfs_origin::remote::{
    ClientTls, Fingerprint, RemoteOptions, RemoteOrigin, Security, Trust,
};

/// Free-space thresholds for test mounts: cull below 1 % free, stop caching at 0 %. The
/// defaults (7/10/3 %) would make a test's result depend on how full the machine's disk is.
pub const HOST_INDEPENDENT_THRESHOLDS: [&str; 12] = [
    "--bstop", "0", "--bcull", "1", "--brun", "2", "--fstop", "0", "--fcull", "1", "--frun", "2",
];

/// [`HOST_INDEPENDENT_THRESHOLDS`], or nothing if `args` names a threshold itself (clap
/// refuses a flag given twice).
pub fn thresholds_unless_named(args: &[&str]) -> &'static [&'static str] {
    let named = args.iter().any(|a| {
        [
            "--brun", "--bcull", "--bstop", "--frun", "--fcull", "--fstop",
        ]
        .iter()
        .any(|t| a.starts_with(t))
    });
    if named {
        &[]
    } else {
        &HOST_INDEPENDENT_THRESHOLDS
    }
}

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_hoardfs")
}

/// Fails loudly (never skips) when the machine cannot run FUSE tests.
pub fn require_fuse() {
    assert!(
        Path::new("/dev/fuse").exists(),
        "these tests mount FUSE file systems: /dev/fuse is missing (install fuse3, run as root)"
    );
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests must run as root (FUSE passthrough)"
    );
}

/// Spawns `cmd` and waits (bounded) for a stdout line starting with `prefix`.
fn spawn_until_line(cmd: Command, prefix: &str) -> Result<(Child, String), String> {
    spawn_logged(cmd, prefix, None)
}

/// As [`spawn_until_line`], with the child's stderr going to `log` if given.
fn spawn_logged(
    mut cmd: Command,
    prefix: &str,
    log: Option<std::fs::File>,
) -> Result<(Child, String), String> {
    cmd.stdout(Stdio::piped());
    match log {
        Some(f) => cmd.stderr(f),
        None => cmd.stderr(Stdio::piped()),
    };
    let mut child = cmd.spawn().map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().expect("piped");
    let stderr: Box<dyn std::io::Read + Send> = match child.stderr.take() {
        Some(e) => Box::new(e),
        None => Box::new(std::io::empty()),
    };

    let (tx, rx) = mpsc::channel();
    let p = prefix.to_string();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with(&p) {
                let _ = tx.send(line);
            }
        }
    });
    let (etx, erx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("[child] {line}");
            all.push_str(&line);
            all.push('\n');
        }
        let _ = etx.send(all);
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(50)) {
            return Ok((child, line));
        }
        if let Ok(Some(status)) = child.try_wait() {
            let err = erx.recv_timeout(Duration::from_secs(2)).unwrap_or_default();
            return Err(format!("exited with {status} before ready: {err}"));
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err("not ready within 20 s".into());
        }
    }
}

/// A running `hoardfs serve`.
pub struct Server {
    child: Option<Child>,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// The exported directory.
    pub dir: PathBuf,
    /// Token, if any.
    pub token: Vec<u8>,
    /// The server's TLS identity (`None`: it runs with --insecure-plaintext).
    pub fingerprint: Option<Fingerprint>,
}

/// The state directory every test server uses, so that a server restarted on the same
/// address keeps its identity (clients pinned it) and no test writes /var/lib/hoardfs.
pub fn state_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("server-state")
}

/// Reads `hoardfs: serving DIR on ADDR (TLS, identity SHA256:…)`.
pub fn parse_ready(line: &str) -> (String, Option<Fingerprint>) {
    let after = line
        .rsplit_once(" on ")
        .expect("ready line names the address")
        .1;
    let (addr, how) = after
        .split_once(' ')
        .expect("ready line says how it serves");
    let fingerprint = how
        .split_once("identity ")
        .map(|(_, f)| f.trim_end_matches(')').parse().expect("fingerprint"));
    (addr.to_string(), fingerprint)
}

/// A `hoardfs serve` command for `dir` on `addr` with the tests' state directory.
fn serve_cmd(dir: &Path, addr: &str) -> Command {
    serve_cmd_in(dir, addr, &state_dir())
}

/// The tests run as root on both ends and test file-system behaviour, not permissions: a
/// server they start performs root's requests as root (`--squash none`) unless a test
/// asks for a mapping itself (`squash.rs`, `permissions.rs` do).
fn squash_unless_given(cmd: &mut Command, args: &[&str]) {
    if !args.contains(&"--squash") {
        cmd.args(["--squash", "none"]);
    }
}

/// A `hoardfs serve` command for `dir` on `addr` keeping its identity in `state`.
fn serve_cmd_in(dir: &Path, addr: &str, state: &Path) -> Command {
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .arg(dir)
        .args(["--listen", addr])
        .arg("--state-dir")
        .arg(state);
    cmd
}

impl Server {
    /// Serves `dir` on an ephemeral loopback port.
    pub fn start(dir: &Path) -> Server {
        Self::start_with(dir, None)
    }

    /// Serves `dir`, requiring `token` if given.
    pub fn start_with(dir: &Path, token_file: Option<&Path>) -> Server {
        let mut cmd = serve_cmd(dir, "127.0.0.1:0");
        squash_unless_given(&mut cmd, &[]);
        if let Some(t) = token_file {
            cmd.arg("--token-file").arg(t);
        }
        let (child, line) = spawn_until_line(cmd, "hoardfs: serving").expect("server starts");
        let (addr, fingerprint) = parse_ready(&line);
        let token = token_file
            .map(|t| std::fs::read(t).unwrap())
            .unwrap_or_default();
        let token = String::from_utf8(token).unwrap().trim().as_bytes().to_vec();
        Server {
            child: Some(child),
            addr,
            dir: dir.to_path_buf(),
            token,
            fingerprint,
        }
    }

    /// How a test client talks to this server: TLS pinned to its identity, with its token.
    pub fn security(&self) -> Security {
        match self.fingerprint {
            Some(f) => Security::tls(
                self.token.clone(),
                ClientTls::new(Trust::Pinned(f)).expect("client TLS"),
            ),
            None => Security::plaintext(self.token.clone()),
        }
    }

    /// A protocol client of this server (not a mount).
    pub fn client(&self) -> RemoteOrigin {
        RemoteOrigin::connect(&self.addr, self.security(), RemoteOptions::default())
            .expect("connect to the server")
    }

    /// The server's counters (over a fresh protocol connection).
    pub fn counters(&self) -> ServerCounters {
        RemoteOrigin::connect(&self.addr, self.security(), RemoteOptions::default())
            .expect("connect for counters")
            .counters()
            .expect("counters")
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Stops the server cleanly (SIGTERM) and waits for it to exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill(2) on our own child's pid.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            let status = c.wait().expect("wait for the server");
            assert!(
                status.success(),
                "the server did not stop cleanly: {status}"
            );
        }
    }

    /// `kill -9` the server.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A running `hoardfs mount` (foreground child process).
pub struct Mount {
    child: Option<Child>,
    /// The mount point.
    pub path: PathBuf,
}

impl Mount {
    /// Mounts `source` at `mnt` with `args` (e.g. `--cache-dir X`).
    ///
    /// The free-space thresholds are set low ([`HOST_INDEPENDENT_THRESHOLDS`]) unless `args`
    /// names one: the defaults are percentages of the file system the temp dirs are on, and
    /// a test machine's disk that is 93 % full would cull every test's cache.
    pub fn start(source: &str, mnt: &Path, args: &[&str]) -> Result<Mount, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("mount").arg(source).arg(mnt).arg("-v").args(args);
        cmd.args(thresholds_unless_named(args));
        let (child, _) = spawn_until_line(cmd, "hoardfs: mounted")?;
        Ok(Mount {
            child: Some(child),
            path: mnt.to_path_buf(),
        })
    }

    /// Whether the client process is still running.
    pub fn alive(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Clean unmount; waits for the client to exit.
    /// (Retried while busy: a child another test forks while this one holds a file open
    /// keeps a copy of that descriptor until its exec.)
    pub fn unmount(mut self) {
        let unmounted = || {
            let out = Command::new("umount").arg(&self.path).output().unwrap();
            let busy = String::from_utf8_lossy(&out.stderr).contains("busy");
            assert!(
                out.status.success() || busy,
                "umount {} failed: {out:?}",
                self.path.display()
            );
            out.status.success()
        };
        assert!(
            wait_until(Duration::from_secs(10), unmounted),
            "umount {}: still busy after 10 s",
            self.path.display()
        );
        if let Some(mut c) = self.child.take() {
            assert!(
                wait_until(Duration::from_secs(30), || c.try_wait().unwrap().is_some()),
                "client did not exit after umount"
            );
        }
    }

    /// `kill -9` the client and detach the dead mount.
    pub fn kill9(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Deterministic pseudo-random bytes.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Hash of a file's content.
pub fn hash_file(p: &Path) -> u64 {
    xxhash_rust::xxh3::xxh3_64(
        &std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display())),
    )
}

/// Drops the page cache so reads hit the disk (or the daemon) again.
pub fn drop_caches() {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (root)");
}

/// Drops only the page cache: the kernel keeps its inodes (and so the mount's nodes).
pub fn drop_page_cache() {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "1").expect("drop caches (root)");
}

/// A sample tree: big and small files, nested dirs, symlinks.
pub fn make_tree(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    let mut put = |rel: &str, data: Vec<u8>| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, data).unwrap();
        files.push(rel.to_string());
    };
    put("big.bin", bytes(1, 24 << 20));
    put("odd.bin", bytes(2, (3 << 20) + 12345));
    put("empty", Vec::new());
    for d in 0..3 {
        for f in 0..5 {
            put(
                &format!("dir{d}/sub/f{f}.txt"),
                bytes(10 + d * 5 + f, 100 + 977 * f as usize),
            );
        }
    }
    std::os::unix::fs::symlink("dir0/sub/f1.txt", root.join("link-rel")).unwrap();
    files
}

// ------------------------------------------------------------------ helpers for writes

/// A scratch directory on a real disk file system (not /tmp, which may be tmpfs; caches and
/// exports must behave like the disks they will live on).
pub fn scratch() -> tempfile::TempDir {
    std::fs::create_dir_all("/var/tmp/hoardfs-tests").unwrap();
    tempfile::tempdir_in("/var/tmp/hoardfs-tests").unwrap()
}

#[allow(unused_imports)]
pub use hoardfs_testutil::{PROMPTLY, assert_eventually, assert_soon, wait_until};

impl Server {
    /// Serves `dir` on an ephemeral loopback port with extra `args` (e.g. `--read-only`).
    pub fn start_args(dir: &Path, args: &[&str]) -> Server {
        Self::start_at(dir, "127.0.0.1:0", args)
    }

    /// Serves `dir` on `addr` (e.g. the address of a server that was killed).
    pub fn start_at(dir: &Path, addr: &str, args: &[&str]) -> Server {
        Self::start_in(dir, addr, &state_dir(), args)
    }

    /// Serves `dir` on `addr` with its identity (and tokens) in `state`.
    pub fn start_in(dir: &Path, addr: &str, state: &Path, args: &[&str]) -> Server {
        Self::start_full(dir, addr, state, args, None, false)
    }

    /// Serves `dir` as user and group `uid` (not root), keeping its identity in `state`
    /// (which that user must own).
    pub fn start_as_user(dir: &Path, state: &Path, uid: u32) -> Server {
        use std::os::unix::process::CommandExt;
        let mut cmd = serve_cmd_in(dir, "127.0.0.1:0", state);
        cmd.uid(uid).gid(uid).env("HOARDFS_LOG", "info");
        Self::ready(dir, spawn_until_line(cmd, "hoardfs: serving"))
    }

    /// The server a spawned `serve` is, from its ready line.
    fn ready(dir: &Path, spawned: Result<(Child, String), String>) -> Server {
        let (child, line) = spawned.expect("server starts");
        let (addr, fingerprint) = parse_ready(&line);
        Server {
            child: Some(child),
            addr,
            dir: dir.to_path_buf(),
            token: Vec::new(),
            fingerprint,
        }
    }

    /// Serves `dir` with `args` only, as a deployment would (the default identity
    /// mapping: root squashed), keeping its identity in `state`.
    pub fn start_deployed(dir: &Path, state: &Path, args: &[&str]) -> Server {
        Self::start_full(dir, "127.0.0.1:0", state, args, None, true)
    }

    /// Serves `dir` with an open-file limit of `nofile` (soft and hard), so that its
    /// table of handles holds few (one descriptor each).
    pub fn start_with_nofile(dir: &Path, nofile: u64) -> Server {
        use std::os::unix::process::CommandExt;
        let mut cmd = serve_cmd_in(dir, "127.0.0.1:0", &state_dir());
        squash_unless_given(&mut cmd, &[]);
        // SAFETY: setrlimit in the child between fork and exec (async-signal-safe).
        unsafe {
            cmd.pre_exec(move || {
                let r = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Self::ready(dir, spawn_until_line(cmd, "hoardfs: serving"))
    }

    /// Serves `dir` on a fresh port, logging at `info` to the file `log`.
    pub fn start_logged(dir: &Path, state: &Path, args: &[&str], log: &Path) -> Server {
        let f = std::fs::File::create(log).unwrap();
        Self::start_full(dir, "127.0.0.1:0", state, args, Some(f), false)
    }

    fn start_full(
        dir: &Path,
        addr: &str,
        state: &Path,
        args: &[&str],
        log: Option<std::fs::File>,
        as_deployed: bool,
    ) -> Server {
        let mut cmd = serve_cmd_in(dir, addr, state);
        if !as_deployed {
            squash_unless_given(&mut cmd, args);
        }
        cmd.args(args);
        if log.is_some() {
            cmd.env("HOARDFS_LOG", "info");
        }
        Self::ready(dir, spawn_logged(cmd, "hoardfs: serving", log))
    }
}

impl Mount {
    /// Mounts `addr` at `mnt` with the persistent cache `cache` and `extra` flags.
    pub fn with_cache(addr: &str, mnt: &Path, cache: &Path, extra: &[&str]) -> Mount {
        let mut args = vec!["--cache-dir", cache.to_str().expect("utf-8 cache path")];
        args.extend_from_slice(extra);
        Mount::start(addr, mnt, &args)
            .unwrap_or_else(|e| panic!("mount {addr} on {}: {e}", mnt.display()))
    }
}

/// The errno of a failed result; panics (naming `what`) if it succeeded.
#[track_caller]
pub fn errno<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e
            .raw_os_error()
            .unwrap_or_else(|| panic!("{what}: error without errno: {e}")),
    }
}

/// Asserts that `r` failed with `want` (an errno such as `libc::EEXIST`).
#[track_caller]
pub fn assert_errno<T: std::fmt::Debug>(what: &str, r: std::io::Result<T>, want: i32) {
    let got = errno(what, r);
    assert_eq!(
        got,
        want,
        "{what}: expected {}, got {}",
        std::io::Error::from_raw_os_error(want),
        std::io::Error::from_raw_os_error(got)
    );
}

/// `Ok(())` if `p` does not exist (`lstat` says `ENOENT`), else a description.
pub fn gone(p: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(p) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        Err(e) => Err(format!("{}: {e} (want ENOENT)", p.display())),
        Ok(md) => Err(format!("{} still exists ({} bytes)", p.display(), md.len())),
    }
}

/// `Ok(())` if stat of `p` gives size `want.len()` and reading it gives `want`.
/// Reads a whole file, or the error's errno.
pub fn read_errno(p: &Path) -> Result<Vec<u8>, i32> {
    std::fs::read(p).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

/// Whether `p` reads as `want` within `secs` seconds; else what it read last.
pub fn reads_within(p: &Path, want: &[u8], secs: u64) -> Result<(), Result<Vec<u8>, i32>> {
    if wait_until(std::time::Duration::from_secs(secs), || {
        read_errno(p).is_ok_and(|d| d == want)
    }) {
        Ok(())
    } else {
        Err(read_errno(p))
    }
}

pub fn has_content(p: &Path, want: &[u8]) -> Result<(), String> {
    let md = std::fs::metadata(p).map_err(|e| format!("stat {}: {e}", p.display()))?;
    if md.len() != want.len() as u64 {
        return Err(format!(
            "stat {} says {} bytes, want {}",
            p.display(),
            md.len(),
            want.len()
        ));
    }
    let got = std::fs::read(p).map_err(|e| format!("read {}: {e}", p.display()))?;
    match first_diff(&got, want) {
        None => Ok(()),
        Some(off) => Err(format!(
            "{}: content differs at byte {off} (read {} bytes, want {})",
            p.display(),
            got.len(),
            want.len()
        )),
    }
}

/// Sorted names in directory `p` (as raw bytes).
pub fn list(p: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let mut v = std::fs::read_dir(p)?
        .map(|e| e.map(|e| e.file_name().as_bytes().to_vec()))
        .collect::<std::io::Result<Vec<_>>>()?;
    v.sort();
    Ok(v)
}

/// The first offset where `a` and `b` differ (the shorter length if one is a prefix).
pub fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None; // memcmp: fast even in debug builds
    }
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or((a.len() != b.len()).then_some(a.len().min(b.len())))
}

/// Asserts `got == want` byte for byte, reporting the first differing offset (not a dump).
#[track_caller]
pub fn assert_bytes_eq(what: &str, got: &[u8], want: &[u8]) {
    if let Some(off) = first_diff(got, want) {
        let show = |v: &[u8]| format!("{:02x?}", &v[off.min(v.len())..(off + 16).min(v.len())]);
        panic!(
            "{what}: differs at byte {off} (got {} bytes, want {}); got {} want {}",
            got.len(),
            want.len(),
            show(got),
            show(want)
        );
    }
}

/// A NUL-terminated copy of a path for libc calls.
pub fn cpath(p: &Path) -> std::ffi::CString {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn cvt(rc: libc::c_int) -> std::io::Result<()> {
    if rc == -1 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `renameat2(AT_FDCWD, from, AT_FDCWD, to, flags)` (`libc::RENAME_NOREPLACE`,
/// `libc::RENAME_EXCHANGE`).
pub fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> std::io::Result<()> {
    let (f, t) = (cpath(from), cpath(to));
    // SAFETY: both strings are valid and NUL-terminated for the duration of the call.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            flags,
        )
    };
    cvt(rc as libc::c_int)
}

/// `setxattr(path, name, value, 0)`.
pub fn set_xattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let (cp, cn) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings and a valid buffer of value.len() bytes.
    cvt(unsafe {
        libc::setxattr(
            cp.as_ptr(),
            cn.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    })
}

/// `getxattr(path, name)`: the value.
pub fn get_xattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let (cp, cn) = (cpath(p), std::ffi::CString::new(name).unwrap());
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid C strings; buf has buf.len() writable bytes.
    let n = unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `listxattr(path)`: the names, sorted.
pub fn list_xattr(p: &Path) -> std::io::Result<Vec<String>> {
    let cp = cpath(p);
    let mut buf = vec![0u8; 64 << 10];
    // SAFETY: valid C string; buf has buf.len() writable bytes.
    let n = unsafe { libc::listxattr(cp.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut names: Vec<String> = buf[..n as usize]
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect();
    names.sort();
    Ok(names)
}

/// `removexattr(path, name)`.
pub fn remove_xattr(p: &Path, name: &str) -> std::io::Result<()> {
    let (cp, cn) = (cpath(p), std::ffi::CString::new(name).unwrap());
    // SAFETY: valid C strings.
    cvt(unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) })
}

/// `close(fd)` with its result (std's `File` drop ignores errors of close, where a
/// write-through file system reports late write failures).
pub fn close_checked(f: std::fs::File) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let fd = f.into_raw_fd();
    // SAFETY: fd was owned by `f` and is closed exactly once here.
    cvt(unsafe { libc::close(fd) })
}

/// A size-limited tmpfs mounted over a directory (a small disk that fills up), lazily
/// unmounted on drop.
pub struct Tmpfs {
    /// The mount point.
    pub path: PathBuf,
}

impl Tmpfs {
    /// `mount -t tmpfs -o size=SIZE tmpfs DIR` (`size` as mount(8) takes it, e.g. `4m`).
    pub fn mount(dir: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(st.success(), "mount tmpfs on {} failed", dir.display());
        Tmpfs {
            path: dir.to_path_buf(),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Runs `hoardfs ARGS`; returns (success, stdout, stderr).
pub fn tool(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(bin())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Counter `key` of `hoardfs stats` of a mount.
pub fn counter(m: &Mount, key: &str) -> u64 {
    stats(m)["counters"][key].as_u64().unwrap()
}

/// `hoardfs stats --json` of a mount.
pub fn stats(m: &Mount) -> serde_json::Value {
    let (ok, out, err) = tool(&["stats", m.path.to_str().unwrap(), "--json"]);
    assert!(ok, "stats failed: {err}");
    serde_json::from_str(&out).unwrap()
}
