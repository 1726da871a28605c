//! The control socket of a running mount: a Unix stream socket, readable and writable by
//! its owner only (peers must be root or the mount's user), speaking one JSON object per
//! line each way. `hoardfs stats`, `cache`, `prefetch`, `pin`, `unpin`, `sync` and
//! `conflicts` find it from the mount point (`socket_path`). The same counters feed the Prometheus exporter.

use crate::error::{CliError, CliResult};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use hoardfs_cache::Usage;
use hoardfs_fs::{FsError, HoardFs};
use serde_json::{Value, json};

/// Directory holding control sockets: `/run/hoardfs` for root, else the user's runtime
/// directory. Never a directory in a place others can write to (such as `/tmp`), where
/// another user could create it first and watch or fake the sockets.
fn runtime_dir() -> CliResult<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    runtime_dir_for(
        unsafe { libc::geteuid() },
        std::env::var_os("XDG_RUNTIME_DIR"),
    )
}

fn runtime_dir_for(uid: u32, xdg: Option<std::ffi::OsString>) -> CliResult<PathBuf> {
    if uid == 0 {
        return Ok(PathBuf::from("/run/hoardfs"));
    }
    match xdg.map(PathBuf::from) {
        Some(d) if d.is_absolute() => Ok(d.join("hoardfs")),
        _ => Err(
            "XDG_RUNTIME_DIR is not set (or not an absolute path): the control socket lives in \
             $XDG_RUNTIME_DIR/hoardfs. Set it to your runtime directory (usually /run/user/$(id -u), \
             which your login session creates) or run as root (/run/hoardfs)"
                .into(),
        ),
    }
}

/// Checks that `dir` is a directory (not a symlink) owned by `uid` that nobody else can
/// write to, in a parent that nobody else can rename it in (or one with the sticky bit).
fn check_dir(dir: &Path, uid: u32) -> CliResult<()> {
    let md = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !md.file_type().is_dir() {
        return Err(format!(
            "{} is not a directory: refusing to use it for control sockets",
            dir.display()
        )
        .into());
    }
    if md.uid() != uid {
        return Err(format!(
            "{} belongs to uid {}, not to uid {uid}: refusing to use it for control sockets \
             (remove it, or point XDG_RUNTIME_DIR elsewhere)",
            dir.display(),
            md.uid()
        )
        .into());
    }
    if md.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {:o}): refusing to use it for control \
             sockets (chmod 700 it)",
            dir.display(),
            md.mode() & 0o7777
        )
        .into());
    }
    if let Some(parent) = dir.parent()
        && let Ok(p) = std::fs::metadata(parent)
        && p.mode() & 0o022 != 0
        && p.mode() & 0o1000 == 0
    {
        return Err(format!(
            "{} is writable by others without the sticky bit: refusing to keep control \
             sockets in it",
            parent.display()
        )
        .into());
    }
    Ok(())
}

/// Creates `dir` (mode 0700) unless it exists, then checks it with [`check_dir`].
fn ensure_dir(dir: &Path, uid: u32) -> CliResult<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", dir.display()).into()),
    }
    check_dir(dir, uid)
}

/// The control socket of the mount at `mountpoint`, an absolute path without symlinks (as
/// /proc/self/mountinfo shows it; not canonicalised here, since a path on a mount that is
/// not served yet would hang).
pub fn socket_path(mountpoint: &Path) -> CliResult<PathBuf> {
    let h = xxhash_rust::xxh3::xxh3_64(mountpoint.as_os_str().as_bytes());
    Ok(runtime_dir()?.join(format!("{h:016x}.sock")))
}

/// [`socket_path`], for connecting: its directory must pass [`check_dir`] (a socket in a
/// directory someone else controls may be someone else's).
pub fn checked_socket_path(mountpoint: &Path) -> CliResult<PathBuf> {
    let path = socket_path(mountpoint)?;
    if let Some(dir) = path.parent() {
        // SAFETY: geteuid has no preconditions.
        check_dir(dir, unsafe { libc::geteuid() })
            .map_err(|e| format!("no usable hoardfs control socket directory: {e}"))?;
    }
    Ok(path)
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
    /// Paths of cached files by file id, as an earlier mount saw them
    /// ([`crate::names`]).
    pub known_names: Arc<std::collections::HashMap<u64, String>>,
}

/// Binds the control socket of `info.mountpoint` (canonical) and serves it on a thread.
pub fn start(fs: Arc<HoardFs>, info: MountInfo) -> CliResult<ControlServer> {
    let path = socket_path(&info.mountpoint)?;
    let dir = path
        .parent()
        .ok_or("the control socket path has no directory")?;
    // SAFETY: geteuid has no preconditions.
    ensure_dir(dir, unsafe { libc::geteuid() })?;
    remove_stale_sockets(dir, Duration::from_secs(10));
    // A client just unmounted still answers until it has exited (umount does not wait
    // for it): a mount right after waits for it, bounded.
    let deadline = std::time::Instant::now() + crate::mount::CLIENT_EXIT_WAIT;
    while UnixStream::connect(&path).is_ok() {
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "{} is already mounted by a running hoardfs client",
                info.mountpoint.display()
            )
            .into());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
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

/// Removes control sockets in `dir` that nobody listens on any more (their client was
/// killed or crashed), unless younger than `min_age` (a client may be starting).
fn remove_stale_sockets(dir: &Path, min_age: Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let stale = p.extension().is_some_and(|x| x == "sock")
            && std::fs::symlink_metadata(&p).is_ok_and(|md| {
                md.file_type().is_socket()
                    && md
                        .modified()
                        .ok()
                        .and_then(|m| m.elapsed().ok())
                        .is_some_and(|age| age >= min_age)
            })
            && UnixStream::connect(&p)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
        if stale && std::fs::remove_file(&p).is_ok() {
            tracing::info!("removed stale control socket {}", p.display());
        }
    }
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
            Err(e) => Err(CliError::Failed(format!("malformed request: {e}"))),
        };
        let v = match reply {
            Ok(mut v) => {
                v["ok"] = json!(true);
                v
            }
            Err(e) => json!({"ok": false, "error": e.to_string()}),
        };
        if writeln!(out, "{v}").is_err() {
            return;
        }
    }
}

fn fs_err(e: FsError) -> String {
    e.to_string()
}

fn handle(fs: &HoardFs, info: &MountInfo, req: &Value) -> CliResult<Value> {
    let ino = || {
        req["ino"]
            .as_u64()
            .ok_or_else(|| "request needs an \"ino\"".to_string())
    };
    match req["op"].as_str().unwrap_or("") {
        // Never waits for the server: the background reconnect notices within a second.
        "stats" => Ok(stats_json(fs, info)),
        "status" => Ok(json!({"usage": fs.cache_usage().map(|u| usage_json(&u))})),
        "ls" => {
            let entries: Vec<Value> = fs
                .cache_entries()
                .map_err(fs_err)?
                .into_iter()
                .map(|e| {
                    let earlier = info
                        .known_names
                        .get(&e.file_id)
                        .filter(|_| e.path.is_none());
                    json!({"file_id": e.file_id, "path": e.path.as_ref().or(earlier),
                           "path_from_earlier_mount": earlier.is_some(), "bytes": e.bytes,
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
            fs.reconnect_now();
            let p = fs.prefetch(ino()?).map_err(fs_err)?;
            Ok(json!({"size": p.size, "fetched": p.fetched, "complete": p.complete}))
        }
        "sync" => {
            // Sends the offline changes back, waiting at most `timeout` seconds.
            let timeout = req["timeout"].as_f64().unwrap_or(60.0).clamp(0.0, 86_400.0);
            let deadline = std::time::Instant::now() + Duration::from_secs_f64(timeout);
            loop {
                fs.reconnect_now();
                fs.reintegrate();
                let left = fs.pending_changes();
                if left == 0 || std::time::Instant::now() >= deadline {
                    return Ok(json!({"pending": left}));
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        "conflicts" => {
            let list: Vec<Value> = fs
                .conflicts()
                .into_iter()
                .map(|c| json!({"at": c.at, "path": c.path, "copy": c.copy, "reason": c.reason}))
                .collect();
            Ok(json!({"conflicts": list}))
        }
        "verify" => {
            let r = fs.verify_cache(&|_, _| {}).map_err(fs_err)?;
            Ok(
                json!({"objects": r.objects, "chunks": r.chunks, "bad_chunks": r.bad_chunks,
                      "damaged_objects": r.damaged_objects}),
            )
        }
        other => Err(format!("unknown request {other:?}").into()),
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
        "room": u.room.as_str(),
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
        // Written through the mount, queued, not yet on the server (`--write-back close`).
        "unsent_write_bytes": fs.unsent_write_bytes(),
        "counters": {
            "reads": s.reads, "chunk_hits": s.chunk_hits, "chunk_fetches": s.chunk_fetches,
            "bytes_from_cache": s.bytes_from_cache, "bytes_from_network": s.bytes_from_network,
            "passthrough_opens": s.passthrough_opens, "daemon_opens": s.daemon_opens,
            "passthrough_registrations": s.passthrough_registrations,
            "version_checks": s.version_checks, "cache_errors": s.cache_errors,
            "uncacheable_fetches": s.uncacheable_fetches, "writes": s.writes,
            "bytes_written": s.bytes_written,
            "listing_fetches": s.listing_fetches, "tree_requests": s.tree_requests,
            "listings_read_ahead": s.listings_read_ahead,
            "files_fetched_ahead": s.files_fetched_ahead,
        },
        // How the kernel's requests reach this daemon (`--fuse-transport`).
        "fuse": {
            "transport": if fuser::ring_threads() > 0 { "io_uring" } else { "dev_fuse" },
            "ring_requests": fuser::ring_requests(),
        },
        "cache": fs.cache_usage().map(|u| usage_json(&u)),
        // An S3 source: how stale the listings served were, and the requests it cost.
        "listings": fs.listing_refresh().map(|r| json!({
            "ttl_secs": r.ttl.as_secs_f64(), "max_stale_secs": r.max_stale.as_secs_f64(),
            "list_rate_limit": r.rate_limit, "list_requests": r.list_requests,
            "list_rate": r.list_rate, "stale_served": r.stale_served,
            "max_age_served_secs": r.max_age_served.as_secs_f64(), "waited": r.waited,
            "refreshed": r.refreshed, "refresh_failures": r.failures, "queued": r.queued,
        })),
        "offline_writes": fs.offline_stats().map(|o| json!({
            "pending_files": o.files, "pending_bytes": o.bytes,
            "oldest_pending_secs": o.oldest.map(|d| d.as_secs()),
            "conflicts": o.conflicts,
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_dir_never_falls_back_to_a_shared_directory() {
        assert_eq!(
            runtime_dir_for(0, None).unwrap(),
            PathBuf::from("/run/hoardfs")
        );
        assert_eq!(
            runtime_dir_for(1000, Some("/run/user/1000".into())).unwrap(),
            PathBuf::from("/run/user/1000/hoardfs")
        );
        let e = runtime_dir_for(1000, None).unwrap_err().to_string();
        assert!(e.contains("XDG_RUNTIME_DIR") && e.contains("root"), "{e}");
        assert!(runtime_dir_for(1000, Some("relative".into())).is_err());
        assert!(runtime_dir_for(1000, Some("".into())).is_err());
    }

    #[test]
    fn only_old_sockets_nobody_listens_on_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let live = t.path().join("live.sock");
        let _listener = UnixListener::bind(&live).unwrap();
        let dead = t.path().join("dead.sock");
        drop(UnixListener::bind(&dead).unwrap());
        let other = t.path().join("notes.txt");
        std::fs::write(&other, b"").unwrap();
        remove_stale_sockets(t.path(), Duration::from_secs(3600));
        assert!(
            dead.exists(),
            "a young socket may belong to a client starting up"
        );
        remove_stale_sockets(t.path(), Duration::ZERO);
        assert!(!dead.exists(), "stale socket kept");
        assert!(live.exists() && other.exists());
    }

    #[test]
    fn socket_directories_are_created_private_and_checked() {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("hoardfs");
        ensure_dir(&dir, me).unwrap();
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        // Existing and private: fine, again and again.
        ensure_dir(&dir, me).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_dir(&dir, me).unwrap();
        // Writable by others: refused.
        for m in [0o777, 0o770, 0o702, 0o1777] {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m)).unwrap();
            let e = ensure_dir(&dir, me).unwrap_err().to_string();
            assert!(e.contains("writable"), "{m:o}: {e}");
        }
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        // Someone else's: refused.
        let e = check_dir(&dir, me + 1).unwrap_err().to_string();
        assert!(e.contains("belongs to uid"), "{e}");
        // A symlink to a good directory, or a file: refused.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(
            check_dir(&link, me)
                .unwrap_err()
                .to_string()
                .contains("not a directory")
        );
        let file = t.path().join("file");
        std::fs::write(&file, b"").unwrap();
        assert!(ensure_dir(&file, me).is_err());
        // In a parent anyone can write to (without the sticky bit): refused.
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_dir(&open.join("hoardfs"), me)
            .unwrap_err()
            .to_string();
        assert!(e.contains("sticky"), "{e}");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        ensure_dir(&open.join("hoardfs"), me).unwrap();
    }
}
