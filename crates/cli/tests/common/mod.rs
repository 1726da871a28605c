//! Test harness: real `hoardfs serve` processes on 127.0.0.1 (ephemeral ports) and real
//! FUSE mounts by `hoardfs mount`, in temp dirs, torn down on drop.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hoardfs_origin::ServerCounters;
use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin};

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
fn spawn_until_line(mut cmd: Command, prefix: &str) -> Result<(Child, String), String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
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
}

impl Server {
    /// Serves `dir` on an ephemeral loopback port.
    pub fn start(dir: &Path) -> Server {
        Self::start_with(dir, None)
    }

    /// Serves `dir`, requiring `token` if given.
    pub fn start_with(dir: &Path, token_file: Option<&Path>) -> Server {
        let mut cmd = Command::new(bin());
        cmd.arg("serve").arg(dir).args(["--listen", "127.0.0.1:0"]);
        if let Some(t) = token_file {
            cmd.arg("--token-file").arg(t);
        }
        let (child, line) = spawn_until_line(cmd, "hoardfs: serving").expect("server starts");
        let addr = line.rsplit(' ').next().expect("address").to_string();
        let token = token_file
            .map(|t| std::fs::read(t).unwrap())
            .unwrap_or_default();
        let token = String::from_utf8(token).unwrap().trim().as_bytes().to_vec();
        Server {
            child: Some(child),
            addr,
            dir: dir.to_path_buf(),
            token,
        }
    }

    /// The server's counters (over a fresh protocol connection).
    pub fn counters(&self) -> ServerCounters {
        RemoteOrigin::connect(&self.addr, self.token.clone(), RemoteOptions::default())
            .expect("connect for counters")
            .counters()
            .expect("counters")
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
    pub fn start(source: &str, mnt: &Path, args: &[&str]) -> Result<Mount, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let mut cmd = Command::new(bin());
        cmd.arg("mount").arg(source).arg(mnt).args(args);
        let (child, _) = spawn_until_line(cmd, "hoardfs: mounted")?;
        Ok(Mount {
            child: Some(child),
            path: mnt.to_path_buf(),
        })
    }

    /// Path inside the mount.
    pub fn p(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }

    /// Clean unmount; waits for the client to exit.
    pub fn unmount(mut self) {
        let st = Command::new("umount").arg(&self.path).status().unwrap();
        assert!(st.success(), "umount {} failed", self.path.display());
        if let Some(mut c) = self.child.take() {
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.try_wait().unwrap().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "client did not exit after umount"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
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
