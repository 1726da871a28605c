//! Writes while the origin is unreachable (`--offline-writes`).
//!
//! When a write or truncation of a regular file fails because the origin is unreachable,
//! and the file's cached copy is complete, the change is kept in the client modify log
//! ([`crate::cml`]) instead: the file is staged (a copy of its cached bytes) and the change
//! applies to the staging file. From then on, until the change is sent back
//! (`crate::reintegrate`), every write, truncation, read, open and `stat` of that file is
//! served from the staging file, whether or not the origin is back, so the file's changes
//! reach the origin in order and whole. `fsync` and the writer's close make the staged
//! bytes durable on this disk. A file not completely cached cannot be changed offline
//! (`EIO`, with a warning naming the file): the client does not have its bytes.
//!
//! Changes to names offline are `crate::offline_names`.
//!
//! The [`OfflineWrites`] value owns the log; the `HoardFs` methods here route the
//! operations of files with a pending change to it, and are the entry points of the
//! offline changes to names (`names_logged`, `logged`, `offline_names`, `names_offline`),
//! of reintegration (`reintegrate`, `settle_names`, `pending_changes`; `find` walks a
//! path on the origin for it) and of the log's counters and conflicts.

use std::sync::Arc;

use hoardfs_proto::buffers::Recycled;

use crate::cml::{ChangeLog, Pending};
use crate::nodes::Node;
use crate::offline_names::OfflineNames;
use crate::open_files::OpenFile;
use crate::read::{ModeKind, OpenMode, Opened};
use crate::reintegrate::{Reintegrated, Reintegration};
use crate::stats::Stats;
use crate::{Access, FsError, FsResult, HoardFs, NodeAttr, Shared};

/// The offline-writes state of a mount: the log and the name conflicts are kept under.
pub(crate) struct OfflineWrites {
    pub(crate) log: ChangeLog,
    /// This client's host name, in conflict copies' names.
    pub(crate) host: String,
    /// Whether new changes are kept (`--offline-writes`), or only an earlier mount's are
    /// sent back.
    keep_new: bool,
    /// Name breaks that came while names waited to be sent back (this client's view of
    /// names was its own), applied once they stop waiting ([`HoardFs::settle_names`]).
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
    fn take_skipped(&self) -> Vec<hoardfs_origin::Break> {
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
        if !config.offline_writes && !left {
            return Ok(None);
        }
        let log = ChangeLog::open(&dir).map_err(kept)?;
        if !config.offline_writes {
            tracing::warn!(
                "{} change(s) made offline by an earlier mount are sent back to the server; \
                 new ones are not kept (mount with --offline-writes for that)",
                log.stats().files
            );
        }
        Ok(Some(OfflineWrites {
            log,
            host: config.host.clone(),
            keep_new: config.offline_writes,
            skipped: Default::default(),
        }))
    }
}

/// A local I/O error of the offline change log as the fs reports it.
pub(crate) fn kept(e: std::io::Error) -> FsError {
    FsError::OfflineChange(Shared::new(e))
}

impl HoardFs {
    /// Once names no longer wait to be sent back (sent, or their changes cancelled), the
    /// name breaks put off meanwhile are applied (they only take away: applied late, a
    /// break of a name since sent back finds this client agreeing, and changes nothing).
    /// Called after reintegration and by the mount's keeper every second.
    pub fn settle_names(&self) {
        let Some(off) = &self.sb.offline else { return };
        if off.log.names_pending() {
            return;
        }
        let breaks = off.take_skipped();
        if !breaks.is_empty() {
            self.apply_breaks(breaks);
        }
    }

    /// Sends pending offline changes back, in an order that respects their dependencies
    /// (see `replay_order::ready`), until none is left or none can be sent now (the origin
    /// is unreachable, or refuses). Safe to call at any time and from any thread (one pass
    /// at a time).
    pub fn reintegrate(&self) -> Reintegrated {
        let Some(off) = &self.sb.offline else {
            return Reintegrated::default();
        };
        let _one_pass = self.reintegrating.lock();
        let r = Reintegration::new(self, off).run();
        self.settle_names();
        r
    }

    /// Number of changes waiting to be sent back.
    pub fn pending_changes(&self) -> u64 {
        self.sb.offline.as_ref().map_or(0, |o| o.log.count() as u64)
    }

    /// The offline change log's counters; `None` without `--offline-writes`.
    pub fn offline_stats(&self) -> Option<crate::LogStats> {
        self.sb.offline.as_ref().map(|o| o.log.stats())
    }

    /// The conflicts recorded in this cache directory, oldest first.
    pub fn conflicts(&self) -> Vec<crate::Conflict> {
        self.sb
            .offline
            .as_ref()
            .map(|o| o.log.conflicts())
            .unwrap_or_default()
    }

    /// Starts a pending change of `node`'s file (the origin just failed with `why`):
    /// the file's complete cached copy becomes its staging file. Without offline writes,
    /// or without a complete copy, the change fails as the origin did.
    pub(crate) fn stage(&self, node: &Node, why: String) -> FsResult<Arc<Pending>> {
        let Some(off) = self.sb.offline.as_ref().filter(|o| o.keep_new) else {
            return Err(FsError::Offline(why));
        };
        let (attr, object) = {
            let st = node.state.lock();
            (st.attr(), st.opens.object().cloned())
        };
        let complete = object
            .as_ref()
            .filter(|o| o.is_complete() && o.shape().version == attr.version);
        let (Some(object), Some(path)) = (complete, self.sb.components_of(node.ino)) else {
            tracing::warn!(
                ino = node.ino,
                object = object.is_some(),
                complete = object.as_ref().is_some_and(|o| o.is_complete()),
                version = object
                    .as_ref()
                    .is_some_and(|o| o.shape().version == attr.version),
                "cannot change a file offline that is not completely cached \
                 (hoardfs prefetch or pin it while connected)"
            );
            return Err(FsError::Offline(why));
        };
        // (Where the origin has it matters only for a new change: one is recorded with
        // no move in between, see `ChangeLog::at_origin`; an existing change is not
        // locked under that, nor is one that appeared meanwhile, a move or attributes,
        // given the content there.)
        let p = if off.log.get(attr.file_id).is_some() {
            off.log.stage(path, None, &attr, object)
        } else {
            off.log
                .at_origin(
                    || OfflineNames::new(&self.sb, off).origin_components_of(node.ino),
                    |origin| off.log.stage_if_new(path.clone(), origin, &attr, object),
                )
                .and_then(|p| {
                    let meta = p.lock().record().kind == crate::cml::Kind::Meta;
                    if meta {
                        off.log.stage(path, None, &attr, object)
                    } else {
                        Ok(p)
                    }
                })
        }
        .map_err(kept)?;
        {
            // (Under the change's lock: a sender finishing it meanwhile clears it after.)
            let g = p.lock();
            if !g.is_gone() {
                self.sb.nodes.set_local(attr.file_id, Some(g.local()));
            }
        }
        // Pages cached from the origin's version are the staged content's too, but its
        // size and times change from here on.
        if let Some(n) = self.sb.notifier.get() {
            n.inval_attr(node.ino);
        }
        tracing::info!(
            ino = node.ino,
            "the server is unreachable: this file's changes are kept locally until it is back"
        );
        Ok(p)
    }

    /// Writes `data` at `offset` (or at the end, for `O_APPEND` opens) of the staged
    /// content of `of`'s file. `None`: the change was sent back meanwhile (the caller
    /// writes through the origin instead).
    pub(crate) fn write_pending(
        &self,
        of: &OpenFile,
        p: &Pending,
        offset: u64,
        data: &[u8],
    ) -> FsResult<Option<u32>> {
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let offset = if of.access.append { g.size() } else { offset };
        g.write(offset, data).map_err(kept)?;
        p.note_size(&g);
        self.sb.nodes.set_local(p.file_id, Some(g.local()));
        drop(g);
        Stats::add(&self.sb.stats.writes, 1);
        Stats::add(&self.sb.stats.bytes_written, data.len() as u64);
        if of.access.append
            && let Some(n) = self.sb.notifier.get()
        {
            n.inval_attr(of.node.ino);
        }
        Ok(Some(data.len() as u32))
    }

    /// Sets the size of the staged content of `node`'s file; `None` if it was sent back
    /// meanwhile.
    pub(crate) fn truncate_pending(
        &self,
        node: &Node,
        p: &Pending,
        size: u64,
    ) -> FsResult<Option<NodeAttr>> {
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        g.truncate(size).map_err(kept)?;
        p.note_size(&g);
        self.sb.nodes.set_local(p.file_id, Some(g.local()));
        drop(g);
        let st = node.state.lock();
        Ok(Some(NodeAttr {
            attr: st.attr(),
            ttl: st.kernel_ttl(&self.sb.config),
        }))
    }

    /// Makes the staged content of a pending file durable (`fsync`, and the writer's
    /// close).
    pub(crate) fn sync_pending(&self, p: &Pending) -> FsResult<()> {
        let g = p.lock();
        if g.is_gone() {
            return Ok(());
        }
        g.sync().map_err(kept)
    }

    /// Opens a file with a pending change: daemon reads without the page cache, served
    /// from the staging file (no cached object is involved).
    pub(crate) fn open_pending(&self, node: Arc<Node>, access: Access) -> Opened {
        {
            // The kernel refuses a non-passthrough open of an inode open in passthrough:
            // wait a little for those opens to end, as any other daemon open does.
            let mut st = node.state.lock();
            self.drain_passthrough(&node, &mut st, None);
            st.opens.admit_direct();
            if !access.write {
                st.opens.closing();
            }
        }
        let fh = self
            .files
            .insert(OpenFile::new(node, ModeKind::Direct, access, None));
        Opened {
            fh,
            mode: OpenMode::Direct,
            changed: true,
        }
    }

    /// Reads up to `size` bytes at `offset` of a pending file's staged content; `None`
    /// if it was sent back meanwhile.
    pub(crate) fn read_pending(
        &self,
        p: &Pending,
        offset: u64,
        size: u32,
    ) -> FsResult<Option<Recycled>> {
        let g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let data = g.read(offset, size as usize).map_err(kept)?;
        Stats::add(&self.sb.stats.bytes_from_cache, data.len() as u64);
        Ok(Some(Recycled::from(data)))
    }
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
