//! Filling the disk cache from the origin, over a borrowed superblock: a missing chunk
//! fetched (shared through the [`Fetcher`]'s in-flight table) and written into the cached
//! object if it is of the version the reader is for, a readahead job, and a whole file
//! prefetched.

use std::sync::Arc;

use hoardfs_proto::buffers::Recycled;

use super::fetcher::{Fetcher, View};
use super::siblings::FileJob;
use crate::manage::Prefetched;
use crate::nodes::Node;
use crate::open_files::OpenFile;
use crate::stats::Stats;
use crate::superblock::Superblock;
use crate::{CacheFault, FsResult, Ino};

impl Fetcher {
    /// Fetches every missing chunk of file `ino` (current version) into the disk cache.
    pub(crate) fn prefetch(&self, sb: &Superblock, ino: Ino) -> FsResult<Prefetched> {
        sb.objects().dir()?;
        let node = sb.file_node(ino)?;
        let attr = sb.validated_attr(&node)?.now;
        let object = sb
            .objects()
            .object_for(&node, attr.file_id, attr.version, attr.size);
        let Some(object) = object else {
            return Err(CacheFault::CannotHold.into());
        };
        // Held like an open file, so the chunks fetched first are not evicted meanwhile.
        let _hold = object.hold_open();
        // It may have been emptied between its creation and the hold: fetch what is missing.
        let view = View::of(&node);
        let mut done = Prefetched {
            size: attr.size,
            ..Prefetched::default()
        };
        for c in 0..view.chunks() {
            // A cache without room would drop the rest: stop (the file is reported as
            // not fully cached) rather than download it for nothing. Below the stop
            // threshold nothing is tried; otherwise a chunk the cache did not keep (a size
            // limit of pinned and open files, or a new version meanwhile) ends this file.
            if object.has_chunk(c) {
                continue;
            }
            if object.cache_below_stop() {
                break;
            }
            if let Some(bytes) = self.ensure_chunk(sb, &node, &view, c)? {
                done.fetched += bytes.len() as u64;
                if !object.has_chunk(c) {
                    break;
                }
            }
        }
        done.complete = object.is_complete();
        drop(_hold);
        drop(object);
        // Not an open: a file nobody has open lets go of its object (its descriptors), so
        // that prefetching a tree of any size does not hold two descriptors per file; the
        // next open finds the object in the cache again.
        let mut st = node.state.lock();
        if !st.is_open() {
            st.opens.set_object(None);
        }
        Ok(done)
    }

    /// A read-only open of `node` (`missed`: its data is not all in the disk cache): if it
    /// is the next entry of its directory's listing for a reader walking it in order, the
    /// next files of the listing are queued to be fetched whole (module `siblings`).
    pub(crate) fn walk_ahead(&self, sb: &Superblock, node: &Node, missed: bool) {
        /// Files larger than this are left to sequential readahead.
        const MAX_FILE: u64 = 16 << 20;
        if !self.siblings.enabled() {
            return;
        }
        let (dir, name) = {
            let st = node.state.lock();
            (st.parent(), st.name().to_vec())
        };
        if !missed && !self.siblings.streams.lock().follows(dir) {
            return;
        }
        let Some(listing) = sb
            .nodes()
            .get(dir)
            .and_then(|d| d.state.lock().last_listing())
        else {
            return;
        };
        let entries = &listing.entries;
        // Usually the entry after the last one opened: no search.
        let hint = self.siblings.streams.lock().last(dir).map(|i| i + 1);
        let index = match hint.filter(|&i| entries.get(i).is_some_and(|e| e.name == name)) {
            Some(i) => i,
            None => match entries.iter().position(|e| e.name == name) {
                Some(i) => i,
                None => return,
            },
        };
        let ahead = self
            .siblings
            .streams
            .lock()
            .opened(dir, index, entries.len(), missed);
        let caller = hoardfs_origin::caller::current();
        for e in &entries[ahead] {
            let a = &e.entry.attr;
            if a.kind != hoardfs_origin::FileKind::File || a.size == 0 || a.size > MAX_FILE {
                continue;
            }
            if let Some(n) = sb.nodes().by_file_id(a.file_id) {
                self.siblings.queue(FileJob {
                    ino: n.ino,
                    caller: caller.clone(),
                });
            }
        }
    }

    /// A queued file: fetched whole into the disk cache as its reader would fetch it.
    pub(crate) fn fetch_file_ahead(&self, sb: &Superblock, job: FileJob) {
        let _reader = hoardfs_origin::caller::enter(job.caller);
        match self.prefetch(sb, job.ino) {
            Ok(p) if p.fetched > 0 => Stats::add(&sb.stats().files_fetched_ahead, 1),
            Ok(_) => {}
            Err(e) => tracing::debug!("fetching file {} ahead failed: {e}", job.ino),
        }
    }

    /// A queued readahead job: fetches chunk `c` for `of` into the disk cache unless the
    /// open was released, the file has no cached object any more, shrank below the chunk,
    /// or the reader already asked for all of it.
    pub(crate) fn read_ahead(&self, sb: &Superblock, of: &Arc<OpenFile>, c: u64) {
        if of.is_closed() {
            return;
        }
        let view = View::of(&of.node);
        // No object any more (replaced by an uncacheable version), or one whose cache has
        // no room: nothing to fill.
        if view.object.as_ref().is_none_or(|o| o.cache_refusing())
            || c >= view.chunks()
            || view.chunk_range(c).1 <= of.read_to()
        {
            return;
        }
        // Fetched on the opener's behalf: the server reads as the opener.
        let _opener = hoardfs_origin::caller::enter(Arc::clone(&of.caller));
        if let Err(e) = self.ensure_chunk(sb, &of.node, &view, c) {
            tracing::debug!("readahead of chunk {c} failed: {e}");
        }
    }

    /// Makes chunk `c` available: `None` if it is in the disk cache, otherwise its bytes
    /// (fetched now, or by a concurrent fetch of the same chunk that we wait for).
    pub(crate) fn ensure_chunk(
        &self,
        sb: &Superblock,
        node: &Node,
        view: &View,
        c: u64,
    ) -> FsResult<Option<Arc<Recycled>>> {
        if view.object.as_ref().is_some_and(|o| o.has_chunk(c)) {
            return Ok(None);
        }
        let result = self.shared(node.ino, view.version, c, || {
            self.fetch_chunk(sb, node, view, c)
        });
        result.map(Some)
    }

    /// Fetches chunk `c` from the origin and stores it in the cache if it is exactly the
    /// version this open is for.
    fn fetch_chunk(&self, sb: &Superblock, node: &Node, view: &View, c: u64) -> FsResult<Vec<u8>> {
        const PIECE: u64 = 4 << 20;
        const MAX_RESERVE: u64 = 64 << 20;
        let (start, end) = view.chunk_range(c);
        let mut data = Vec::new();
        let mut cacheable = true;
        while (data.len() as u64) < end - start {
            let pos = start + data.len() as u64;
            let len = (end - pos).min(PIECE) as u32;
            let mut r = sb.with_handle(node, |h| sb.origin().read(h, pos, len))?;
            r.data.truncate(len as usize);
            cacheable &= r.version == view.version;
            let short = (r.data.len() as u32) < len;
            if data.is_empty() {
                // Usually the whole chunk: keep the received buffer rather than copy it.
                // Room for the rest is reserved up front only up to a bound, so that the
                // size a server claims cannot by itself make us allocate (chunks of
                // huge files are large): beyond it the buffer grows as bytes arrive.
                data = r.data;
                let rest = (end - start).saturating_sub(data.len() as u64);
                data.reserve_exact(rest.min(MAX_RESERVE) as usize);
            } else {
                data.extend_from_slice(&r.data);
            }
            if short {
                cacheable = false;
                break;
            }
        }
        Stats::add(&sb.stats().chunk_fetches, 1);
        Stats::add(&sb.stats().bytes_from_network, data.len() as u64);
        match &view.object {
            Some(obj) if cacheable => {
                if let Err(e) = obj.write_chunk(c, &data, view.version) {
                    tracing::warn!("cache write failed, serving uncached: {e}");
                    Stats::add(&sb.stats().cache_errors, 1);
                }
            }
            Some(_) => Stats::add(&sb.stats().uncacheable_fetches, 1),
            None => {}
        }
        Ok(data)
    }
}
