//! The control socket of a running mount: a Unix stream socket, readable and writable by
//! its owner only (peers must be root or the mount's user), speaking one JSON object per
//! line each way. `hoardfs stats`, `cache`, `prefetch`, `pin` and `unpin` find it from the
//! mount point (`socket_path`). The same counters feed the Prometheus exporter.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hoardfs_cache::Usage;
use hoardfs_fs::{FsError, HoardFs};
use serde_json::{Value, json};

/// Directory holding control sockets: `/run/hoardfs` for root, else the user's runtime dir.
fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/hoardfs");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("hoardfs"),
        None => PathBuf::from(format!("/tmp/hoardfs-{uid}")),
    }
}

/// The control socket of the mount at `mountpoint`, an absolute path without symlinks (as
/// /proc/self/mountinfo shows it; not canonicalised here, since a path on a mount that is
/// not served yet would hang).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_bytes());
    runtime_dir().join(format!("{h:016x}.sock"))
}

/// A listening control socket; removed when dropped.
pub struct ControlServer {
    path: PathBuf,
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the control socket reports besides the file system's own counters.
#[derive(Clone)]
pub struct MountInfo {
    /// `HOST:PORT` or directory served.
    pub source: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
}

/// Binds the control socket of `info.mountpoint` (canonical) and serves it on a thread.
pub fn start(fs: Arc<HoardFs>, info: MountInfo) -> Result<ControlServer, String> {
    let path = socket_path(&info.mountpoint);
    let dir = path.parent().expect("socket has a directory");
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if UnixStream::connect(&path).is_ok() {
        return Err(format!(
            "{} is already mounted by a running hoardfs client",
            info.mountpoint.display()
        ));
    }
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path)
        .map_err(|e| format!("cannot create control socket {}: {e}", path.display()))?;
    let _ = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600));
    std::thread::Builder::new()
        .name("hoardfs-control".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                let (fs, info) = (fs.clone(), info.clone());
                let _ = std::thread::Builder::new()
                    .name("hoardfs-control-conn".into())
                    .spawn(move || serve_conn(&fs, &info, stream));
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(ControlServer { path })
}

/// Uid of the peer process.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd, out-struct of the advertised length.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(s),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

fn serve_conn(fs: &HoardFs, info: &MountInfo, stream: UnixStream) {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let mut out = match stream.try_clone() {
        Ok(s) => s,
        Err(_) => return,
    };
    if !peer_uid(&stream).is_some_and(|u| u == 0 || u == me) {
        let _ = writeln!(
            out,
            "{}",
            json!({"ok": false, "error": "permission denied"})
        );
        return;
    }
    for line in BufReader::new(stream).lines() {
        let Ok(line) = line else { return };
        let reply = match serde_json::from_str::<Value>(&line) {
            Ok(req) => handle(fs, info, &req),
            Err(e) => Err(format!("malformed request: {e}")),
        };
        let v = match reply {
            Ok(mut v) => {
                v["ok"] = json!(true);
                v
            }
            Err(e) => json!({"ok": false, "error": e}),
        };
        if writeln!(out, "{v}").is_err() {
            return;
        }
    }
}

fn fs_err(e: FsError) -> String {
    e.to_string()
}

fn handle(fs: &HoardFs, info: &MountInfo, req: &Value) -> Result<Value, String> {
    let ino = || {
        req["ino"]
            .as_u64()
            .ok_or_else(|| "request needs an \"ino\"".to_string())
    };
    match req["op"].as_str().unwrap_or("") {
        "stats" => Ok(stats_json(fs, info)),
        "status" => Ok(json!({"usage": fs.cache_usage().map(|u| usage_json(&u))})),
        "ls" => {
            let entries: Vec<Value> = fs
                .cache_entries()
                .map_err(fs_err)?
                .into_iter()
                .map(|e| {
                    json!({"file_id": e.file_id, "path": e.path, "bytes": e.bytes,
                           "pinned": e.pinned, "open": e.open, "priority": e.priority})
                })
                .collect();
            Ok(json!({"entries": entries}))
        }
        "evict" => Ok(json!({"freed": fs.evict(ino()?).map_err(fs_err)?})),
        "pin" => {
            let prio = req["priority"].as_u64().unwrap_or(0).min(u16::MAX as u64) as u16;
            fs.pin(ino()?, true, prio).map_err(fs_err)?;
            Ok(json!({}))
        }
        "unpin" => {
            fs.pin(ino()?, false, 0).map_err(fs_err)?;
            Ok(json!({}))
        }
        "prefetch" => {
            let p = fs.prefetch(ino()?).map_err(fs_err)?;
            Ok(json!({"size": p.size, "fetched": p.fetched, "complete": p.complete}))
        }
        "verify" => {
            let r = fs.verify_cache(&|_, _| {}).map_err(fs_err)?;
            Ok(
                json!({"objects": r.objects, "chunks": r.chunks, "bad_chunks": r.bad_chunks,
                      "damaged_objects": r.damaged_objects}),
            )
        }
        other => Err(format!("unknown request {other:?}")),
    }
}

/// Cache occupancy as JSON (shared with `hoardfs cache status` on a cache directory).
pub fn usage_json(u: &Usage) -> Value {
    let l = &u.limits;
    json!({
        "objects": u.objects, "bytes": u.bytes, "reserved_bytes": u.reserved,
        "pinned_objects": u.pinned_objects, "pinned_bytes": u.pinned_bytes,
        "open_objects": u.open_objects, "limit_bytes": l.max_bytes,
        "thresholds": {"brun": l.brun, "bcull": l.bcull, "bstop": l.bstop,
                       "frun": l.frun, "fcull": l.fcull, "fstop": l.fstop},
        "fs_bytes_total": u.space.map(|s| s.bytes_total),
        "fs_bytes_avail": u.space.map(|s| s.bytes_avail),
        "fs_files_total": u.space.map(|s| s.files_total),
        "fs_files_avail": u.space.map(|s| s.files_avail),
        "evictions": u.evictions, "evicted_bytes": u.evicted_bytes,
        "checksum_failures": u.checksum_failures, "chunks_verified": u.chunks_verified,
        "refused_chunks": u.refused_chunks, "refused_bytes": u.refused_bytes,
        "orphans_adopted": u.orphans_adopted, "recovered_from_crash": u.recovered,
        "records_warmed": u.records_warmed,
    })
}

/// Everything `hoardfs stats` shows.
pub fn stats_json(fs: &HoardFs, info: &MountInfo) -> Value {
    let s = fs.stats();
    json!({
        "source": info.source,
        "mountpoint": info.mountpoint,
        "connected": s.connected,
        "counters": {
            "reads": s.reads, "chunk_hits": s.chunk_hits, "chunk_fetches": s.chunk_fetches,
            "bytes_from_cache": s.bytes_from_cache, "bytes_from_network": s.bytes_from_network,
            "passthrough_opens": s.passthrough_opens, "daemon_opens": s.daemon_opens,
            "passthrough_registrations": s.passthrough_registrations,
            "version_checks": s.version_checks, "cache_errors": s.cache_errors,
            "uncacheable_fetches": s.uncacheable_fetches, "writes": s.writes,
            "bytes_written": s.bytes_written,
        },
        "cache": fs.cache_usage().map(|u| usage_json(&u)),
    })
}
