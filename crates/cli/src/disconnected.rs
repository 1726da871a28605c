//! Disconnected operation of a mount of a hoardfs server: the saved namespace and the
//! background reconnect.
//!
//! A mount with a cache directory saves the namespace it knows (names, attributes,
//! listings: `hoardfs_fs::NamespaceSnapshot`) in `CACHE_DIR/namespace-<hash of the
//! source>` as soon as the mount is up, within about a second of each change after that
//! (checked every [`TICK`], less often for a namespace so large that checking would cost
//! more than a [`SAVE_SHARE`]th of one core), when the connection is lost, and at
//! unmount: a client killed at any moment after mounting can start disconnected with
//! what it had seen. When a later mount finds the server unreachable (refused, timed out, no route: not a refused identity or
//! credential), it starts from that file instead of failing: cached files and the names
//! seen before are served, everything else is `EIO`, and a background thread reconnects.
//! The same thread reconnects any mount whose connection attempts failed, so callbacks
//! come back without waiting for the next use, and then sends back the changes kept by
//! `--offline-writes` (`HoardFs::reintegrate`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hoardfs_fs::{HoardFs, NamespaceSnapshot};
use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin, Security};
use hoardfs_origin::{Origin, OriginError};

/// How often the keeper looks at the connection.
const TICK: Duration = Duration::from_secs(1);
/// The checks for a changed namespace (a snapshot and its digest, and a save when it
/// differs) take at most this share of the time: one in `SAVE_SHARE` at most.
const SAVE_SHARE: u32 = 20;

/// The namespace file of `source` in cache directory `dir`.
pub fn namespace_file(dir: &Path, source: &str) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(source.as_bytes());
    dir.join(format!("namespace-{h:016x}"))
}

/// A disconnected origin for `source` from the namespace saved in `dir`, if the failure
/// `e` of connecting is one to start offline from and a namespace of this source is
/// there.
pub fn start_offline(
    dir: &Path,
    source: &str,
    security: Security,
    opts: RemoteOptions,
    e: &OriginError,
) -> Option<(RemoteOrigin, NamespaceSnapshot)> {
    if !matches!(e, OriginError::Unreachable(_)) {
        return None;
    }
    let path = namespace_file(dir, source);
    let snap = match NamespaceSnapshot::load(&path) {
        Ok(Some(s)) if s.source == source => s,
        Ok(_) => return None,
        Err(err) => {
            tracing::warn!("cannot start disconnected: {err}");
            return None;
        }
    };
    let info = snap.info();
    let origin = RemoteOrigin::disconnected(
        source,
        security,
        opts,
        info,
        snap.publishes_on_close(),
        e.clone(),
    );
    Some((origin, snap))
}

/// Saves the namespace of `fs` to `path` unless it is the one last saved (`saved`: its
/// digest, updated on success) and not `always`; logs a failure.
pub fn save(fs: &HoardFs, path: &Path, source: &str, saved: &mut Option<u64>, always: bool) {
    let snap = match fs.namespace_snapshot(source) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot take the namespace snapshot: {e}");
            return;
        }
    };
    let digest = snap.digest();
    if *saved == Some(digest) && !always {
        return;
    }
    match snap.save(path) {
        Ok(()) => {
            tracing::debug!(names = snap.len(), "namespace saved");
            *saved = Some(digest);
        }
        Err(e) => tracing::warn!("cannot save the namespace to {}: {e}", path.display()),
    }
}

/// Starts the thread that reconnects `remote` (if any) in the background while its
/// connection attempts fail, and saves the namespace to `path` (if any) at once and then
/// each [`TICK`] when it changed (less often if checking took long: see [`SAVE_SHARE`]).
/// It ends when `fs` is gone.
pub fn start_keeper(
    fs: &Arc<HoardFs>,
    remote: Option<Arc<RemoteOrigin>>,
    path: Option<PathBuf>,
    source: String,
) {
    if let Some(r) = &remote {
        r.reconnect_in_background();
    }
    let weak = Arc::downgrade(fs);
    let spawned = std::thread::Builder::new()
        .name("hoardfs-keeper".into())
        .spawn(move || {
            let mut saved: Option<u64> = None;
            // When the namespace was last checked for changes, and what checking cost.
            let (mut last_check, mut check_cost) = (Instant::now(), Duration::ZERO);
            if let (Some(p), Some(fs)) = (&path, weak.upgrade()) {
                save(&fs, p, &source, &mut saved, false);
                check_cost = last_check.elapsed();
            }
            // The connection (by handshake number) whose loss was saved at. Compared
            // with the current one rather than sampling "connected" each tick: a
            // connection made by a request and lost again between two ticks must not
            // go unsaved (its changes would be missing from a restart offline).
            let mut loss_saved = 0;
            loop {
                std::thread::sleep(TICK);
                let Some(fs) = weak.upgrade() else { return };
                // Lost the server since the last save at a loss: save what we know now,
                // for a restart while it stays away.
                if let Some(r) = remote.as_ref() {
                    // (Read before the connection is looked at: a reconnect in between
                    // then makes the connection live, not the save skip its loss.)
                    let lost = r.handshakes();
                    if lost != loss_saved && !r.is_connected() {
                        if let Some(p) = &path {
                            // (Written even if unchanged: the file's time then tells
                            // that it holds everything up to this loss.)
                            save(&fs, p, &source, &mut saved, true);
                        }
                        loss_saved = lost;
                    }
                }
                // (A live connection is kept up by pings: one that is gone means the
                // server or the link went away, not idleness.)
                if let Some(r) = remote.as_ref().filter(|r| !r.is_connected())
                    && r.reconnect().is_ok()
                {
                    tracing::info!(server = %r.addr(), "reconnected");
                }
                // Name breaks put off while names waited, once they no longer wait (also
                // when their changes were cancelled rather than sent).
                fs.settle_names();
                if fs.pending_changes() > 0 && remote.as_ref().is_none_or(|r| !r.is_offline()) {
                    let r = fs.trickle();
                    if r.sent + r.conflicts > 0 {
                        tracing::info!(
                            "offline changes sent back: {} written, {} as conflict copies, {} left",
                            r.sent,
                            r.conflicts,
                            r.left
                        );
                    }
                }
                if let Some(p) = &path
                    && last_check.elapsed() >= (check_cost * SAVE_SHARE).max(TICK)
                {
                    last_check = Instant::now();
                    save(&fs, p, &source, &mut saved, false);
                    check_cost = last_check.elapsed();
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the reconnect thread: {e}");
    }
}
