//! `hoardfs demo`: the README's first command. Generates a sample tree, serves it on
//! loopback, mounts it with a temporary cache and prints the seed-000 style table
//! (Server / None / COLD / PGCACHE / HOT) with the bytes each read pulled from the server.
//! Everything it creates is removed at the end.

use crate::error::{CliError, CliResult};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use clap::Args;
use hoardfs_origin::remote::{ClientTls, RemoteOptions, RemoteOrigin, Security, Trust};

/// Options of `hoardfs demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Size of the big sample file in MiB.
    #[arg(long, default_value_t = 200)]
    pub size_mib: u64,
    /// Where to create the temporary tree and cache (a real disk, not tmpfs).
    #[arg(long, default_value = "/var/tmp")]
    pub work_dir: PathBuf,
}

struct Proc(Child);

impl Proc {
    /// Waits (up to 60 s) for the process to exit by itself, e.g. a client after `umount`,
    /// which syncs and closes its cache in order; a killed client leaves the cache to be
    /// verified on the next mount.
    fn finish(mut self) {
        let deadline = Instant::now() + std::time::Duration::from_secs(60);
        while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hoardfs ARGS`, waits for its ready line on stdout and returns the line.
fn start(args: &[&str], ready: &str) -> CliResult<(Proc, String)> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    out.read_line(&mut line).map_err(|e| e.to_string())?;
    if !line.starts_with(ready) {
        let _ = child.kill();
        return Err(format!("hoardfs {} did not start", args[0]).into());
    }
    // Keep draining stdout so the child never blocks on it.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok((Proc(child), line.trim().to_owned()))
}

fn drop_caches() -> CliResult<()> {
    let _ = Command::new("sync").status();
    std::fs::write("/proc/sys/vm/drop_caches", "3").map_err(|e| {
        CliError::io(
            "cannot drop the page cache: writing",
            Path::new("/proc/sys/vm/drop_caches"),
            e,
        )
    })
}

fn timed_read(p: &Path) -> CliResult<f64> {
    let t = Instant::now();
    let mut f = std::fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    while f
        .read(&mut buf)
        .map_err(|e| format!("{}: {e}", p.display()))?
        > 0
    {}
    Ok(t.elapsed().as_secs_f64())
}

fn umount(p: &Path) {
    let _ = Command::new("umount").arg(p).status();
}

/// The demo's export: a `size_mib` MiB file of pseudo-random bytes and 100 small files.
fn generate(exp: &Path, size_mib: u64) -> CliResult<()> {
    eprintln!(
        "generating a {} MiB file and 100 small files in {}",
        size_mib,
        exp.display()
    );
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut chunk = vec![0u8; 1 << 20];
    let mut big = std::fs::File::create(exp.join("big.bin")).map_err(|e| e.to_string())?;
    for _ in 0..size_mib {
        for b in chunk.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        std::io::Write::write_all(&mut big, &chunk).map_err(|e| e.to_string())?;
    }
    drop(big);
    for i in 0..100 {
        std::fs::write(
            exp.join(format!("src/file{i:03}.txt")),
            format!("sample {i}\n").repeat(200),
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Prints the table of the demo's reads: per row its name, seconds and bytes the server
/// sent.
fn print_table(size_mib: u64, rows: &[(&str, f64, u64)]) {
    let mib = size_mib as f64;
    println!(
        "\nhoardfs demo: reading a {} MiB file over loopback (no link shaping; see bench/ for the 100 Mbit/s table)\n",
        size_mib
    );
    println!(
        "{:<36} {:>10} {:>12} {:>16}",
        "Cache (state)", "seconds", "MiB/s", "bytes from server"
    );
    for (name, secs, bytes) in rows {
        println!("{name:<36} {secs:>10.3} {:>12.0} {bytes:>16}", mib / secs);
    }
    println!(
        "\nHOT and PGCACHE rows pull no file data from the server: the persistent cache answers."
    );
}

/// Runs the demo.
pub fn run(a: DemoArgs) -> CliResult<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/dev/fuse").exists() {
        return Err("the demo mounts FUSE file systems with passthrough: run it as root on a machine with /dev/fuse (apt-get install fuse3)".into());
    }
    let tmp = tempfile::Builder::new()
        .prefix("hoardfs-demo-")
        .tempdir_in(&a.work_dir)
        .map_err(|e| e.to_string())?;
    let (exp, mnt, cache) = (
        tmp.path().join("export"),
        tmp.path().join("mnt"),
        tmp.path().join("cache"),
    );
    std::fs::create_dir_all(&mnt).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(exp.join("src")).map_err(|e| e.to_string())?;
    generate(&exp, a.size_mib)?;
    let state = tmp.path().join("state");
    let (server, line) = start(
        &[
            "serve",
            exp.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            state.to_str().unwrap(),
        ],
        "hoardfs: serving",
    )?;
    let (addr, fingerprint) = crate::serve::parse_ready_line(&line)
        .ok_or_else(|| format!("unexpected ready line {line:?}"))?;
    let fingerprint = fingerprint.ok_or("the demo server runs without TLS")?;
    let tls = ClientTls::new(Trust::Pinned(fingerprint)).map_err(|e| e.to_string())?;
    let counter = RemoteOrigin::connect(
        &addr,
        Security::tls(Vec::new(), tls),
        RemoteOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    let pin = fingerprint.to_string();
    let fetched = || counter.counters().map(|c| c.bytes_read).unwrap_or(0);
    let file = exp.join("big.bin");
    let target = mnt.join("big.bin");
    let mut rows: Vec<(&str, f64, u64)> = Vec::new();
    let mut measure = |name: &'static str, path: &Path, drop_first: bool| -> CliResult<()> {
        if drop_first {
            drop_caches()?;
        }
        let before = fetched();
        let secs = timed_read(path)?;
        rows.push((name, secs, fetched() - before));
        Ok(())
    };
    timed_read(&file)?;
    measure("Server (local, page cache)", &file, false)?;
    let (m, _) = start(
        &[
            "mount",
            "-v",
            &addr,
            mnt.to_str().unwrap(),
            "--no-cache",
            "--server-fingerprint",
            &pin,
        ],
        "hoardfs: mounted",
    )?;
    measure("None (--no-cache)", &target, true)?;
    umount(&mnt);
    m.finish();
    let c = cache.to_str().unwrap();
    // Low free-space thresholds: the default ones are percentages of the whole disk, and
    // on a disk over 93 % full they would evict the demo's temporary 200 MiB cache (the
    // mount says so in its log) instead of showing what a cache does.
    let cached_mount = [
        "mount",
        "-v",
        &addr,
        mnt.to_str().unwrap(),
        "--cache-dir",
        c,
        "--server-fingerprint",
        &pin,
        "--bstop",
        "0",
        "--bcull",
        "1",
        "--brun",
        "2",
    ];
    let (m, _) = start(&cached_mount, "hoardfs: mounted")?;
    measure("COLD (empty cache)", &target, true)?;
    measure("PGCACHE (read again)", &target, false)?;
    umount(&mnt);
    m.finish();
    let (m, _) = start(&cached_mount, "hoardfs: mounted")?;
    measure("HOT (remount, page cache dropped)", &target, true)?;
    measure("PGCACHE (after HOT)", &target, false)?;
    umount(&mnt);
    m.finish();
    drop(server);
    print_table(a.size_mib, &rows);
    Ok(())
}
