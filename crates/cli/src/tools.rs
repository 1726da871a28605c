//! `hoardfs stats`, `cache`, `prefetch`, `pin` and `unpin`: clients of a mount's control
//! socket (found from the mount point through /proc/self/mountinfo), and of a cache
//! directory directly when no client is using it.

use crate::error::{CliError, CliResult};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use crate::control::checked_socket_path;

/// A connection to a mount's control socket.
pub struct Control {
    out: UnixStream,
    input: BufReader<UnixStream>,
}

impl Control {
    /// Connects to the mount at `mountpoint`.
    pub fn connect(mountpoint: &Path) -> CliResult<Control> {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if let Some(owner) = hoardfs_mounts()?
            .into_iter()
            .find(|m| m.path == mountpoint)
            .and_then(|m| m.owner)
            && owner != me
        {
            return Err(format!(
                "{} was mounted by uid {owner}, and only that user can query its hoardfs \
                 client (its control socket is private to that user): run this command as \
                 uid {owner}",
                mountpoint.display()
            )
            .into());
        }
        let path = checked_socket_path(mountpoint)?;
        let s = UnixStream::connect(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => format!(
                "the hoardfs client of {} is not running (killed?): unmount it (`umount -l \
                 {}`) and mount it again",
                mountpoint.display(),
                mountpoint.display()
            ),
            _ => format!(
                "cannot reach the hoardfs client of {} ({}): {e}",
                mountpoint.display(),
                path.display()
            ),
        })?;
        let input = BufReader::new(s.try_clone().map_err(|e| e.to_string())?);
        Ok(Control { out: s, input })
    }

    /// Sends one request; returns the reply or its error message.
    pub fn call(&mut self, req: Value) -> CliResult<Value> {
        writeln!(self.out, "{req}").map_err(|e| format!("control socket: {e}"))?;
        let mut line = String::new();
        self.input
            .read_line(&mut line)
            .map_err(|e| format!("control socket: {e}"))?;
        if line.is_empty() {
            return Err("the hoardfs client closed the control socket".into());
        }
        let v: Value = serde_json::from_str(&line).map_err(|e| format!("bad reply: {e}"))?;
        if v["ok"] == json!(true) {
            Ok(v)
        } else {
            Err(v["error"]
                .as_str()
                .unwrap_or("request failed")
                .to_string()
                .into())
        }
    }
}

/// A hoardfs mount, from /proc/self/mountinfo.
struct HoardfsMount {
    path: PathBuf,
    /// The mounting user (`user_id=` of the FUSE mount).
    owner: Option<u32>,
}

/// Every hoardfs mount this process can see.
fn hoardfs_mounts() -> CliResult<Vec<HoardfsMount>> {
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
    let mut out = Vec::new();
    for line in info.lines() {
        // id parent major:minor root mountpoint options ... - fstype source superopts
        let f: Vec<&str> = line.split(' ').collect();
        let Some(dash) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        // Our mounts are "fuse.hoardfs", or "fuse" with source "hoardfs:SOURCE".
        let fstype = f.get(dash + 1).copied().unwrap_or("");
        let source = f.get(dash + 2).copied().unwrap_or("");
        let ours = fstype == "fuse.hoardfs" || (fstype == "fuse" && source.starts_with("hoardfs:"));
        if !ours || f.len() < 5 {
            continue;
        }
        let owner = f
            .get(dash + 3)
            .and_then(|o| o.split(',').find_map(|kv| kv.strip_prefix("user_id=")))
            .and_then(|u| u.parse().ok());
        out.push(HoardfsMount {
            path: PathBuf::from(unescape(f[4])),
            owner,
        });
    }
    Ok(out)
}

/// Mount point of the hoardfs mount holding `path` (which must exist).
pub fn mount_of(path: &Path) -> CliResult<PathBuf> {
    let canon = path
        .canonicalize()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    hoardfs_mounts()?
        .into_iter()
        .map(|m| m.path)
        .filter(|mp| canon.starts_with(mp))
        .max_by_key(|mp| mp.as_os_str().len())
        .ok_or_else(|| CliError::Failed(format!("{} is not on a hoardfs mount", path.display())))
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = u8::from_str_radix(std::str::from_utf8(&b[i + 1..i + 4]).unwrap_or("0"), 8);
            if let Ok(v) = v {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Human-readable byte count.
pub fn human(n: u64) -> String {
    const U: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = n as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", U[i])
    }
}

/// `n word`, with an `s` unless `n` is 1: "1 file", "0 files", "2 files".
pub fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "in 1.25 s (80.0 MiB/s)" for `bytes` moved in `elapsed`; no rate when nothing moved or
/// it took under 10 ms (too short to measure), and milliseconds below a second.
pub fn took(bytes: u64, elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let time = if secs < 1.0 {
        format!("in {} ms", elapsed.as_millis())
    } else {
        format!("in {secs:.2} s")
    };
    if bytes == 0 || secs < 0.01 {
        time
    } else {
        format!("{time} ({}/s)", human((bytes as f64 / secs) as u64))
    }
}

/// Options of `hoardfs stats`.
#[derive(Args, Debug)]
pub struct StatsArgs {
    /// The mount point (or any path on the mount).
    pub mountpoint: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `hoardfs stats`.
pub fn stats(a: StatsArgs) -> CliResult<()> {
    let mp = mount_of(&a.mountpoint)?;
    let v = Control::connect(&mp)?.call(json!({"op": "stats"}))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&strip_ok(v)).expect("json")
        );
        return Ok(());
    }
    let state = if v["connected"] == json!(true) {
        "connected"
    } else {
        "DISCONNECTED (serving from cache)"
    };
    println!(
        "{} on {}: {state}",
        v["source"].as_str().unwrap_or("?"),
        mp.display()
    );
    let c = &v["counters"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    println!(
        "  chunks: {} hits, {} misses (fetched)",
        n("chunk_hits"),
        n("chunk_fetches")
    );
    println!(
        "  bytes: {} from cache (daemon reads), {} from the network",
        human(n("bytes_from_cache")),
        human(n("bytes_from_network"))
    );
    println!(
        "  opens: {} passthrough ({} cache files registered), {} daemon; {} version-check \
         round trips",
        n("passthrough_opens"),
        n("passthrough_registrations"),
        n("daemon_opens"),
        n("version_checks")
    );
    println!(
        "  listings: {} fetched, {} read ahead by {} subtree requests",
        n("listing_fetches"),
        n("listings_read_ahead"),
        n("tree_requests")
    );
    if n("files_fetched_ahead") > 0 {
        println!(
            "  files fetched ahead of readers walking a directory: {}",
            n("files_fetched_ahead")
        );
    }
    let l = &v["listings"];
    if l.is_object() {
        let f = |k: &str| l[k].as_f64().unwrap_or(0.0);
        let u = |k: &str| l[k].as_u64().unwrap_or(0);
        println!(
            "  S3 listings: trusted {} s, answered from up to {} s old while relisted              (oldest lately {:.1} s); {} LIST requests ({:.1}/s lately, limit {}/s); {}              reader(s) waited for one",
            f("ttl_secs"),
            f("max_stale_secs"),
            f("max_age_served_secs"),
            u("list_requests"),
            f("list_rate"),
            f("list_rate_limit"),
            u("waited")
        );
    }
    println!(
        "  writes: {} sent ({}), {} queued not yet on the server",
        n("writes"),
        human(n("bytes_written")),
        human(v["unsent_write_bytes"].as_u64().unwrap_or(0))
    );
    match v["fuse"]["transport"].as_str() {
        Some("io_uring") => println!(
            "  FUSE requests: over io_uring ({} so far)",
            v["fuse"]["ring_requests"].as_u64().unwrap_or(0)
        ),
        Some(_) => {
            println!("  FUSE requests: over /dev/fuse");
            if let Some(hint) = crate::mount::uring_off_hint() {
                println!("    ({hint})");
            }
        }
        None => {}
    }
    if v["cache"].is_object() {
        print_usage(&v["cache"]);
    } else {
        println!("  no disk cache");
    }
    let o = &v["offline_writes"];
    if o.is_object() {
        let n = |k: &str| o[k].as_u64().unwrap_or(0);
        let oldest = o["oldest_pending_secs"]
            .as_u64()
            .map_or(String::new(), |s| format!(", oldest {s} s old"));
        println!(
            "  offline changes: {} file(s) not yet on the server ({}{oldest}); {} conflict(s) \
             recorded (hoardfs conflicts)",
            n("pending_files"),
            human(n("pending_bytes")),
            n("conflicts")
        );
    }
    Ok(())
}

/// Options of `hoardfs sync`.
#[derive(Args, Debug)]
pub struct SyncArgs {
    /// The mount point (or any path on the mount).
    pub mountpoint: PathBuf,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60.0)]
    pub timeout: f64,
}

/// `hoardfs sync`: waits until the changes kept offline are on the server; fails if some
/// are still pending at the timeout.
pub fn sync(a: SyncArgs) -> CliResult<()> {
    let mp = mount_of(&a.mountpoint)?;
    if !(a.timeout >= 0.0 && a.timeout < 86_400.0) {
        return Err("--timeout is a number of seconds below 86400".into());
    }
    let v = Control::connect(&mp)?.call(json!({"op": "sync", "timeout": a.timeout}))?;
    match v["pending"].as_u64() {
        Some(0) => Ok(()),
        Some(n) => Err(format!(
            "{n} file(s) changed offline are not on the server yet after {} s (is it \
             reachable? or is one that conflicts there still open for writing here? \
             see `hoardfs stats {}`)",
            a.timeout,
            mp.display()
        )
        .into()),
        None => Err("unexpected reply from the mount".into()),
    }
}

/// Options of `hoardfs conflicts`.
#[derive(Args, Debug)]
pub struct ConflictsArgs {
    /// The mount point (or any path on the mount).
    pub mountpoint: PathBuf,
    /// Print JSON instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// `hoardfs conflicts`: the changes kept offline that met a change on the server, and
/// where this client's version went.
pub fn conflicts(a: ConflictsArgs) -> CliResult<()> {
    let mp = mount_of(&a.mountpoint)?;
    let v = Control::connect(&mp)?.call(json!({"op": "conflicts"}))?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&strip_ok(v)).expect("json")
        );
        return Ok(());
    }
    for c in v["conflicts"].as_array().into_iter().flatten() {
        println!(
            "{}: {} -> this client's version is {}",
            c["path"].as_str().unwrap_or("?"),
            c["reason"].as_str().unwrap_or("?"),
            c["copy"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// Options of `hoardfs server-stats`.
#[derive(Args, Debug)]
pub struct ServerStatsArgs {
    /// `HOST:PORT` of the server (`HOST` alone: port 7070).
    pub server: String,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
    /// Check the server against the identity recorded in this mount's cache directory.
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `hoardfs server-stats`. The query itself costs the server one connection and a few
/// requests, which the counters include.
pub fn server_stats(a: ServerStatsArgs) -> CliResult<()> {
    use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin};
    let server = crate::source::server_addr(&a.server).map_err(CliError::into_usage)?;
    let a = ServerStatsArgs { server, ..a };
    let sec = a.security.build(a.cache_dir.as_deref())?;
    let o = RemoteOrigin::connect(&a.server, sec.security.clone(), RemoteOptions::default())
        .map_err(|e| sec.explain(&a.server, &e))?;
    if a.cache_dir.is_none() {
        sec.connected(&a.server)?;
    }
    let c = o
        .counters()
        .map_err(|e| format!("cannot query hoardfs server {}: {e}", a.server))?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&c).expect("json"));
        return Ok(());
    }
    println!("{}:", a.server);
    println!("  connections: {}", c.connections);
    println!(
        "  requests: {} ({} reads, {} writes)",
        c.requests, c.reads, c.writes
    );
    println!("  file opens: {} (misses of the open-file cache)", c.opens);
    println!(
        "  bytes: {} read, {} written",
        human(c.bytes_read),
        human(c.bytes_written)
    );
    println!(
        "  callback breaks sent: {}; bad frames: {}",
        c.breaks_sent, c.bad_frames
    );
    Ok(())
}

fn strip_ok(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("ok");
    }
    v
}

/// Prints the cache part of `stats`/`cache status`.
pub fn print_usage(u: &Value) {
    let n = |k: &str| u[k].as_u64().unwrap_or(0);
    let limit = u["limit_bytes"]
        .as_u64()
        .map_or("no size limit".to_string(), |l| {
            format!("limit {}", human(l))
        });
    println!(
        "  cache: {} in {} objects ({limit}); {} pinned in {} objects; {} open",
        human(n("bytes")),
        n("objects"),
        human(n("pinned_bytes")),
        n("pinned_objects"),
        n("open_objects")
    );
    if let (Some(t), Some(a)) = (u["fs_bytes_total"].as_u64(), u["fs_bytes_avail"].as_u64()) {
        let th = &u["thresholds"];
        println!(
            "  cache file system: {} free of {} ({:.1}%); cull below {}%, to {}%, stop below {}%",
            human(a),
            human(t),
            a as f64 * 100.0 / t.max(1) as f64,
            th["bcull"],
            th["brun"],
            th["bstop"]
        );
        match u["room"].as_str() {
            Some("stopped") => println!(
                "  NOT CACHING: free space is below the stop threshold; reads go to the server \
                 (free space there, or lower --bstop/--fstop)"
            ),
            Some("short") => println!(
                "  short of room: below the cull threshold with nothing left to evict; other \
                 data fills the cache file system"
            ),
            _ => {}
        }
    }
    println!(
        "  evictions: {} ({}); served uncached for lack of room: {} chunks",
        n("evictions"),
        human(n("evicted_bytes")),
        n("refused_chunks")
    );
    println!(
        "  checksums: {} chunks verified, {} failures{}",
        n("chunks_verified"),
        n("checksum_failures"),
        if u["recovered_from_crash"] == json!(true) {
            "; recovering from an unclean stop (objects verified on first use)"
        } else {
            ""
        }
    );
    println!(
        "  records read ahead of opens (listed files): {}",
        n("records_warmed")
    );
}

/// `hoardfs cache ...`.
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// Occupancy, limits and counters of a mount's cache or of a cache directory.
    Status {
        /// A hoardfs mount point or a cache directory.
        target: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List cached objects (with paths where the client knows them).
    Ls {
        /// A hoardfs mount point or a cache directory.
        target: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drop files (recursively for directories) from the cache of their mount.
    Evict {
        /// Paths on a hoardfs mount.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Check every cached chunk against its checksum; bad chunks are dropped.
    Verify {
        /// A hoardfs mount point or a cache directory.
        target: PathBuf,
    },
}

/// `hoardfs cache`.
pub fn cache(cmd: CacheCommand) -> CliResult<()> {
    crate::cachedir::cache(cmd)
}

/// A regular file found on a mount: path, inode (the client's node number), size.
pub type FoundFile = (PathBuf, u64, u64);

/// Files under `paths` (recursively, not following symlinks), on one hoardfs mount,
/// plus the mount point.
pub fn collect_files(paths: &[PathBuf]) -> CliResult<(PathBuf, Vec<FoundFile>)> {
    let mut mount = None;
    let mut files = Vec::new();
    for p in paths {
        let mp = mount_of(p)?;
        if mount.as_ref().is_some_and(|m| *m != mp) {
            return Err("all paths must be on the same hoardfs mount".into());
        }
        mount = Some(mp);
        walk(p, &mut files)?;
    }
    Ok((mount.expect("at least one path"), files))
}

fn walk(p: &Path, out: &mut Vec<FoundFile>) -> CliResult<()> {
    let md = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if md.is_dir() {
        // A listing that fails part way is an error, not a shorter list: a prefetch
        // that skipped files quietly would leave them out of the cache unannounced.
        let mut names = std::fs::read_dir(p)
            .and_then(|rd| {
                rd.map(|e| e.map(|e| e.path()))
                    .collect::<Result<Vec<_>, _>>()
            })
            .map_err(|e| format!("{}: {e}", p.display()))?;
        names.sort();
        for n in names {
            walk(&n, out)?;
        }
    } else if md.is_file() {
        out.push((p.to_path_buf(), md.ino(), md.size()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn summaries_use_plurals_and_give_no_rate_for_unmeasurable_times() {
        assert_eq!(plural(0, "file"), "0 files");
        assert_eq!(plural(1, "file"), "1 file");
        assert_eq!(plural(2, "file"), "2 files");
        assert_eq!(took(1 << 20, Duration::from_micros(300)), "in 0 ms");
        assert_eq!(took(1 << 20, Duration::from_millis(9)), "in 9 ms");
        assert_eq!(took(0, Duration::from_secs(3)), "in 3.00 s");
        assert_eq!(
            took(10 << 20, Duration::from_millis(500)),
            "in 500 ms (20.0 MiB/s)"
        );
        assert_eq!(
            took(100 << 20, Duration::from_secs(2)),
            "in 2.00 s (50.0 MiB/s)"
        );
    }
}
