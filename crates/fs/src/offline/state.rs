//! Writes while the origin is unreachable (`--offline-writes`).
//!
//! The [`OfflineWrites`] value owns the client modify log ([`crate::offline::cml`]) of a mount, and
//! the name breaks put off while this client's changes to names wait to be sent back.
//! Changes to file contents go through `crate::offline::staged`, changes to names through
//! `crate::offline::names`; reintegration (`crate::offline::reintegrate`) sends them back. The
//! superblock answers whether an object has a change (`pending_of`, `staged_change_of`);
//! the operation families route each change through `crate::offline::Offline`.

use crate::nodes::Node;
use crate::offline::cml::{ChangeLog, LogSync};
use crate::{FsError, FsResult, Shared};

/// The offline-writes state of a mount: the log and the name conflicts are kept under.
pub(crate) struct OfflineWrites {
    pub(crate) log: ChangeLog,
    /// This client's host name, in conflict copies' names.
    pub(crate) host: String,
    /// Whether new changes are kept (`--offline-writes`), or only an earlier mount's are
    /// sent back.
    keep_new: bool,
    /// Name breaks that came while names waited to be sent back (this client's view of
    /// names was its own), applied once they stop waiting (`HoardFs::settle_names`).
    skipped: parking_lot::Mutex<SkippedBreaks>,
}

/// Name breaks put off while names wait, at most [`MAX_SKIPPED`] (beyond: everything is
/// revalidated instead).
#[derive(Default)]
struct SkippedBreaks {
    breaks: Vec<hoardfs_origin::Break>,
    overflowed: bool,
}

/// Why a change is logged although the origin may be reachable.
pub(crate) const NAMES_WAIT: &str = "earlier changes to names are not on the server yet";

/// Why a change is logged although the origin is reachable (`--write-back=async`).
pub(crate) const SENT_BEHIND: &str = "changes are sent in the background (--write-back=async)";

/// Name breaks kept while names wait, at most.
const MAX_SKIPPED: usize = 4096;

impl OfflineWrites {
    /// A name break put off while names wait to be sent back.
    pub(crate) fn skip(&self, b: hoardfs_origin::Break) {
        let mut s = self.skipped.lock();
        if s.breaks.len() < MAX_SKIPPED {
            s.breaks.push(b);
        } else {
            s.overflowed = true;
        }
    }

    /// The breaks put off (`Break::All` if more came than were kept); none left.
    pub(crate) fn take_skipped(&self) -> Vec<hoardfs_origin::Break> {
        let mut s = self.skipped.lock();
        let overflowed = std::mem::take(&mut s.overflowed);
        let breaks = std::mem::take(&mut s.breaks);
        if overflowed {
            vec![hoardfs_origin::Break::All]
        } else {
            breaks
        }
    }

    /// Whether new changes are kept (`--offline-writes`).
    pub(crate) fn keeps_new(&self) -> bool {
        self.keep_new
    }

    /// The log of export `export_id` under `config.offline_log`: opened when offline
    /// writes are on, or when an earlier mount left changes in it (they are sent back
    /// whatever this mount's options; new ones are then not kept).
    pub(crate) fn open(config: &crate::FsConfig, export_id: u128) -> FsResult<Option<Self>> {
        let Some(base) = &config.offline_log else {
            return Ok(None);
        };
        let dir = base.join(format!("{export_id:032x}"));
        let left = std::fs::read_dir(&dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".rec")))
        });
        let keep_new = config.offline_writes || config.write_back == crate::WriteBack::Async;
        if !keep_new && !left {
            return Ok(None);
        }
        // Changes that leave within a second are made durable at `fsync` only.
        let sync = match config.write_back {
            crate::WriteBack::Async => LogSync::OnSync,
            _ => LogSync::Each,
        };
        let log = ChangeLog::open(&dir, sync).map_err(kept)?;
        if !keep_new {
            tracing::warn!(
                "{} change(s) made offline by an earlier mount are sent back to the server; \
                 new ones are not kept (mount with --offline-writes for that)",
                log.stats().files
            );
        }
        Ok(Some(OfflineWrites {
            log,
            host: config.host.clone(),
            keep_new,
            skipped: Default::default(),
        }))
    }
}

/// A local I/O error of the offline change log as the fs reports it.
pub(crate) fn kept(e: std::io::Error) -> FsError {
    FsError::OfflineChange(Shared::new(e))
}

/// Offline removals waiting for a release on its way: at most two at once (the others
/// do not wait, so that waiting FUSE threads cannot starve the releases), each 0.2 s.
static CLOSING: crate::nodes::ReleaseWaits =
    crate::nodes::ReleaseWaits::new(2, std::time::Duration::from_millis(200));

/// Whether nothing has `node` open, waiting a little (on the node's releases) for that:
/// the kernel sends the RELEASE of a closed descriptor without waiting for it, so a file
/// closed just before may still count as open for a moment.
pub(crate) fn closed(node: &Node) -> bool {
    let mut st = node.state.lock();
    CLOSING.wait(node, &mut st, |st| st.is_open());
    !st.is_open()
}

/// Offline removals waiting for a release now (tests).
#[cfg(test)]
pub(crate) fn removals_waiting() -> usize {
    CLOSING.waiting()
}
