//! A file whose content is staged in the client modify log (`--offline-writes`): when a
//! write or truncation fails because the origin is unreachable and the file's cached copy
//! is complete, [`Staged::start`] copies its cached bytes into a staging file and records
//! the change ([`crate::offline::cml`]). From then on, until the change is sent back
//! (`crate::offline::reintegrate`), every write, truncation, read, open and `stat` of that file is
//! served from the staging file, whether or not the origin is back, so the file's changes
//! reach the origin in order and whole. `fsync` and the writer's close make the staged
//! bytes durable on this disk. A file not completely cached cannot be changed offline
//! (`EIO`, with a warning naming the file): the client does not have its bytes.
//!
//! Each operation finds the change already sent back (`None`) when reintegration finished
//! it meanwhile; its caller then goes to the origin.

use std::sync::Arc;

use hoardfs_proto::buffers::Recycled;

use crate::nodes::Node;
use crate::offline::cml::Pending;
use crate::offline::names::OfflineNames;
use crate::offline::state::kept;
use crate::open_files::OpenFile;
use crate::stats::Stats;
use crate::superblock::Superblock;
use crate::{FsError, FsResult, NodeAttr};

/// A file's pending change whose content is staged here, with the superblock it belongs to
/// (`Offline::staged`, or a change started with [`Staged::start`]).
pub(crate) struct Staged<'a> {
    sb: &'a Superblock,
    p: Arc<Pending>,
}

impl<'a> Staged<'a> {
    /// The staged change `p` of this mount.
    pub(crate) fn new(sb: &'a Superblock, p: Arc<Pending>) -> Self {
        Staged { sb, p }
    }

    /// Starts a pending change of `node`'s file (the origin just failed with `why`):
    /// the file's complete cached copy becomes its staging file. Without offline writes,
    /// or without a complete copy, the change fails as the origin did.
    pub(crate) fn start(sb: &'a Superblock, node: &Node, why: String) -> FsResult<Staged<'a>> {
        let Some(off) = sb.offline_writes().filter(|o| o.keeps_new()) else {
            return Err(FsError::Offline(why));
        };
        let (attr, object) = {
            let st = node.state.lock();
            (st.attr(), st.opens.object().cloned())
        };
        let complete = object
            .as_ref()
            .filter(|o| o.is_complete() && o.shape().version == attr.version);
        let (Some(object), Some(path)) = (complete, sb.components_of(node.ino)) else {
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
                    || OfflineNames::new(sb, off).origin_components_of(node.ino),
                    |origin| off.log.stage_if_new(path.clone(), origin, &attr, object),
                )
                .and_then(|p| {
                    let meta = p.lock().record().kind == crate::offline::cml::Kind::Meta;
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
                sb.nodes().set_local(attr.file_id, Some(g.local()));
            }
        }
        // Pages cached from the origin's version are the staged content's too, but its
        // size and times change from here on.
        if let Some(n) = sb.notifier() {
            n.inval_attr(node.ino);
        }
        tracing::info!(
            ino = node.ino,
            "this file's changes are kept locally until they can be sent: {why}"
        );
        Ok(Staged { sb, p })
    }

    /// Writes `data` at `offset` (or at the end, for `O_APPEND` opens) of the staged
    /// content of `of`'s file. `None`: the change was sent back meanwhile (the caller
    /// writes through the origin instead).
    pub(crate) fn write(&self, of: &OpenFile, offset: u64, data: &[u8]) -> FsResult<Option<u32>> {
        let p = &self.p;
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let offset = if of.access.append { g.size() } else { offset };
        g.write(offset, data).map_err(kept)?;
        p.note_size(&g);
        self.sb.nodes().set_local(p.file_id, Some(g.local()));
        drop(g);
        Stats::add(&self.sb.stats().writes, 1);
        Stats::add(&self.sb.stats().bytes_written, data.len() as u64);
        if of.access.append
            && let Some(n) = self.sb.notifier()
        {
            n.inval_attr(of.node.ino);
        }
        Ok(Some(data.len() as u32))
    }

    /// Sets the size of the staged content of `node`'s file; `None` if it was sent back
    /// meanwhile.
    pub(crate) fn truncate(&self, node: &Node, size: u64) -> FsResult<Option<NodeAttr>> {
        let p = &self.p;
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        g.truncate(size).map_err(kept)?;
        p.note_size(&g);
        self.sb.nodes().set_local(p.file_id, Some(g.local()));
        drop(g);
        let st = node.state.lock();
        Ok(Some(NodeAttr {
            attr: st.attr(),
            ttl: st.kernel_ttl(self.sb.config()),
        }))
    }

    /// Makes the staged content of a pending file durable (`fsync`, and the writer's
    /// close).
    pub(crate) fn sync(&self) -> FsResult<()> {
        let g = self.p.lock();
        if g.is_gone() {
            return Ok(());
        }
        g.sync().map_err(kept)
    }

    /// Reads up to `size` bytes at `offset` of a pending file's staged content; `None`
    /// if it was sent back meanwhile.
    pub(crate) fn read(&self, offset: u64, size: u32) -> FsResult<Option<Recycled>> {
        let g = self.p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let data = g.read(offset, size as usize).map_err(kept)?;
        Stats::add(&self.sb.stats().bytes_from_cache, data.len() as u64);
        Ok(Some(Recycled::from(data)))
    }
}
