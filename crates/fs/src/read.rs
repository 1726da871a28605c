//! Opens, reads and releases: the hit path, and how an open is served.
//!
//! An open checks the file's version with the origin (close-to-open) and picks a mode:
//! *passthrough* when the cached object is complete (the kernel reads the cache file
//! itself), *cached* daemon reads otherwise (the kernel page cache is kept across opens
//! while the version is unchanged), or *direct* daemon reads for appends and when
//! passthrough opens of the inode outlast a short wait for them (the kernel refuses to
//! mix modes on one inode). Under `--kernel-opens` opens are implicit
//! ([`crate::kernel_opens`]).
//!
//! Misses are fetched a whole chunk at a time through the `Fetcher` ([`crate::fetch`]):
//! one fetch per chunk however many readers want it, and readahead for sequential
//! readers. Mount-wide passthrough admission (refused by the kernel, opens waiting for
//! passthrough opens to end) is a `PassthroughGate` (`crate::passthrough`). A file without a
//! cached object (`--no-cache`, or one the cache could not take) is read through: a read
//! fetches just the bytes it asks for (see `read_uncached`).
//!
//! Lock ordering: the open-file table (`crate::open_files`) is a leaf, as are the
//! `Fetcher`'s in-flight table and queue and the implicit-open table of
//! `crate::kernel_opens` (never held while taking another lock or doing I/O); a node's
//! `state` lock is never held across origin I/O, and across disk I/O only to create that
//! node's cached object or passthrough backing registration (and to drop a registration,
//! whose release is an ioctl on `/dev/fuse`).

use std::sync::Arc;

use hoardfs_cache::CachedObject;
use hoardfs_origin::ReadSlot;
use hoardfs_proto::buffers::{self, Recycled};
use parking_lot::MutexGuard;

use crate::nodes::{Node, NodeState};
pub use crate::opens::OpenMode;
use crate::opens::{BackingError, MakeBacking};

use crate::Ino;
pub(crate) use crate::fetch::View;
use crate::offline::Offline;
pub(crate) use crate::open_files::OpenFile;
use crate::open_files::READ_ONLY;
pub use crate::open_files::{Access, FileHandle};
pub(crate) use crate::opens::ModeKind;
use crate::passthrough::PassthroughGate;
use crate::stats::Stats;
use crate::superblock::Superblock;
use crate::{FsError, FsResult};

/// The bytes of one read, in a pooled buffer (back to the pool when dropped, once the
/// FUSE reply is written).
pub type ReadData = Recycled;

/// What an open returns.
pub struct Opened {
    /// The kernel's handle of the open file.
    pub fh: FileHandle,
    /// How it is served.
    pub mode: OpenMode,
    /// The file changed since the kernel last saw its attributes (`open` has invalidated
    /// the kernel's copy of them, the size included, through the notifier).
    pub changed: bool,
}

/// Counts a fetch of `n` bytes made for one read alone (`Reads::read_uncached`).
fn fetched_alone(sb: &Superblock, n: usize) {
    Stats::add(&sb.stats().chunk_fetches, 1);
    Stats::add(&sb.stats().bytes_from_network, n as u64);
}

/// Which way a read goes (`Reads::route`).
enum Route {
    /// Answered without the origin or the cache's chunks: these bytes.
    Done(ReadData),
    /// Fetched for this read alone, up to this end (`Reads::read_uncached`).
    Uncached(u64),
    /// Through the cache, up to this end.
    Cached(View, u64),
}

/// The reading side of a mount: its open files, passthrough admission and the implicit
/// opens of `--kernel-opens` (chunks are fetched and read ahead by the superblock's
/// `Fetcher`).
pub(crate) struct Reads {
    /// The open files, by kernel handle.
    pub(crate) files: crate::open_files::OpenFiles,
    /// Mount-wide passthrough admission.
    passthrough: PassthroughGate,
    /// Opens of reads that came without one (`crate::kernel_opens`).
    implicit: crate::kernel_opens::ImplicitOpens,
}

/// What a release leaves to do once the open file is out of the table and its node's
/// open state (`Reads::close`, then `Reads::let_go`).
pub(crate) struct Closed {
    of: Arc<OpenFile>,
    /// Nothing refers to the node any more (no open, no kernel lookup).
    idle: bool,
    /// Other opens of the node remain.
    still_open: bool,
    /// The file was deleted on the origin (its id).
    deleted: Option<u64>,
}

impl Closed {
    /// The node of the file closed.
    pub(crate) fn ino(&self) -> Ino {
        self.of.node.ino
    }

    /// Whether that was its last open.
    pub(crate) fn last(&self) -> bool {
        !self.still_open
    }
}

impl Reads {
    /// No open file yet.
    pub(crate) fn new() -> Self {
        Reads {
            files: Default::default(),
            passthrough: PassthroughGate::default(),
            implicit: Default::default(),
        }
    }

    /// Opens `ino`. `make_backing` registers a cache file with the kernel for passthrough
    /// (called once per cached object: the registration outlives the opens and is
    /// released when the node lets go of the object). `Opened::changed` says the file
    /// changed since the kernel last saw its attributes (which are then invalidated).
    pub(crate) fn open(
        &self,
        sb: &Superblock,
        ino: Ino,
        access: Access,
        make_backing: &MakeBacking,
    ) -> FsResult<Opened> {
        if access.write {
            sb.check_writable()?;
        }
        let node = sb.file_node(ino)?;
        if sb.staged_change_of(&node).is_some() {
            let attr = node.state.lock().attr();
            sb.may_access(&node, &attr, access.mask())?;
            return Ok(self.open_pending(node, access));
        }
        let attrs = sb.validated_attr(&node)?;
        // Answered without asking the server whether the caller may: decided here as the
        // server would (`crate::access`).
        sb.may_access(&node, &attrs.now, access.mask())?;
        // The kernel may still hold the old size (close-to-open: a file that changed must
        // show its new size to the reader that just opened it), so its copy of the
        // attributes is invalidated before the open is answered. Attributes only: what
        // happens to the page cache is the open reply's to say.
        let (attr, changed) = (attrs.now, attrs.changed());
        if changed && let Some(n) = sb.notifier() {
            n.inval_attr(ino);
        }
        Ok(self.open_node(sb, node, attr, access, changed, make_backing))
    }

    /// Opens `node` at `attr`'s version (the second half of `open`, shared with `create`).
    pub(crate) fn open_node(
        &self,
        sb: &Superblock,
        node: Arc<Node>,
        attr: hoardfs_origin::Attr,
        access: Access,
        changed: bool,
        make_backing: &MakeBacking,
    ) -> Opened {
        let object = sb
            .objects()
            .object_for(&node, attr.file_id, attr.version, attr.size);
        // Held before anything looks at its chunks: from here on it cannot be evicted, so
        // a passthrough open never sees its data file emptied under it.
        let hold = object.as_ref().map(|o| o.hold_open());
        // Files open for writing are never handed to the kernel: the daemon must see writes.
        let passthrough_object = object.as_ref().filter(|o| !access.write && o.is_complete());
        let mut st = node.state.lock();
        self.drain_passthrough(&node, &mut st, passthrough_object);
        let mode = passthrough_object
            .and_then(|o| self.admit_passthrough(sb, &mut st, o, make_backing))
            .unwrap_or_else(|| self.admit_daemon(sb, &mut st, &attr, access));
        if !access.write {
            st.opens.closing();
        }
        drop(st);
        if !access.write {
            // A reader walking the directory in listing order: fetch the next files.
            let missed = object.as_ref().is_none_or(|o| !o.is_complete());
            sb.fetcher().walk_ahead(sb, &node, missed);
        }
        let fh = self
            .files
            .insert(OpenFile::new(node, mode.kind(), access, hold));
        Opened { fh, mode, changed }
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

    /// While the inode is open in passthrough, the kernel fails every open that is not a
    /// passthrough open of the same cache file with EIO (a write open, a newer version).
    /// Such overlaps are often momentary (a descriptor inherited by a child until it
    /// execs, a reader about to close): wait a little for them to end. Only a few opens
    /// wait at once, so that FUSE threads remain for the RELEASE that ends it.
    /// `passthrough_object` is the complete object a read-only open could share.
    pub(crate) fn drain_passthrough(
        &self,
        node: &Node,
        st: &mut MutexGuard<'_, NodeState>,
        passthrough_object: Option<&Arc<CachedObject>>,
    ) {
        let must_wait = |st: &NodeState| {
            st.opens.passthrough_opens() > 0
                && passthrough_object
                    .and_then(|o| st.opens.shareable(o))
                    .is_none()
        };
        if must_wait(st) {
            self.passthrough.drain(node, st, must_wait);
        }
    }

    /// A passthrough open of complete `object`, if the mount and the node's other opens
    /// allow one: sharing the node's registration, or registering the cache file (a
    /// refusal turns passthrough off for the mount; a passing failure costs this open).
    fn admit_passthrough(
        &self,
        sb: &Superblock,
        st: &mut NodeState,
        object: &Arc<CachedObject>,
        make_backing: &MakeBacking,
    ) -> Option<OpenMode> {
        if !sb.config().passthrough
            || sb.kernel_opens()
            || self.passthrough.refused()
            || st.opens.has_daemon_opens()
        {
            return None;
        }
        let id = match st.opens.shareable(object) {
            Some(id) => {
                st.opens.admit_shared_passthrough(object);
                id
            }
            // (Otherwise an older version is still open in passthrough: its opens hold the
            // registration.)
            None if st.opens.may_register() => {
                match object.open_backing().map(|f| make_backing(&f)) {
                    Ok(Ok(id)) => {
                        Stats::add(&sb.stats().passthrough_registrations, 1);
                        st.opens
                            .admit_registered_passthrough(object.clone(), id.clone());
                        id
                    }
                    Ok(Err(e @ BackingError::Refused(_))) => {
                        tracing::warn!("{e}; using daemon reads for this mount");
                        self.passthrough.refuse();
                        return None;
                    }
                    // A passing failure, or a cache file that cannot be reopened: this open
                    // uses daemon reads, the next one tries passthrough again.
                    Ok(Err(e)) => {
                        tracing::warn!("{e}; daemon reads for this open");
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!("cannot reopen a cache file ({e}); daemon reads");
                        return None;
                    }
                }
            }
            None => return None,
        };
        Stats::add(&sb.stats().passthrough_opens, 1);
        Some(OpenMode::Passthrough(id))
    }

    /// An open served by daemon reads: `Direct` for appends (they go to the origin's end
    /// of file, which the kernel's page cache cannot know) and while passthrough opens
    /// remain (the kernel then refuses it), `Cached` otherwise.
    fn admit_daemon(
        &self,
        sb: &Superblock,
        st: &mut NodeState,
        attr: &hoardfs_origin::Attr,
        access: Access,
    ) -> OpenMode {
        Stats::add(&sb.stats().daemon_opens, 1);
        if st.opens.passthrough_opens() > 0 {
            // The kernel refuses any non-passthrough open of an inode open in passthrough
            // (EIO): neither a write open nor one of a newer version can succeed on this
            // client until those close (doc/SEMANTICS.md).
            tracing::warn!(
                "file {:#x} is open in passthrough (read-only, fully cached) on this \
                 client; opens for writing or of a newer version fail (EIO) until \
                 those descriptors close",
                attr.file_id
            );
        }
        st.opens.admit_daemon(access.append, attr.version)
    }

    /// The open file behind kernel handle `fh`.
    pub(crate) fn open_file(&self, fh: FileHandle) -> FsResult<Arc<OpenFile>> {
        self.files.get(fh).ok_or(FsError::BadHandle)
    }

    /// Reads up to `size` bytes at `offset` through open file `fh`.
    pub(crate) fn read(
        &self,
        sb: &Superblock,
        fh: FileHandle,
        offset: u64,
        size: u32,
    ) -> FsResult<ReadData> {
        self.read_open(sb, &self.open_file(fh)?, offset, size)
    }

    /// Reads up to `size` bytes at `offset` through open file `of`.
    pub(crate) fn read_open(
        &self,
        sb: &Superblock,
        of: &Arc<OpenFile>,
        offset: u64,
        size: u32,
    ) -> FsResult<ReadData> {
        match self.route(sb, of, offset, size)? {
            Route::Done(data) => Ok(data),
            Route::Uncached(end) => self.read_uncached(sb, &of.node, offset, end),
            Route::Cached(view, end) => self.read_cached(sb, of, &view, offset, end),
        }
    }

    /// Reads up to `size` bytes at `offset` through open file `fh` into the destination in
    /// `dst`, answering it: bytes fetched for this read alone (`read_uncached`) go
    /// straight from the network into it, others are copied in. On failure the
    /// destination is left in `dst` unless it was answered already (`ReadSlot`).
    pub(crate) fn read_into(
        &self,
        sb: &Superblock,
        fh: FileHandle,
        offset: u64,
        size: u32,
        dst: &mut ReadSlot,
    ) -> FsResult<()> {
        let of = self.open_file(fh)?;
        let data = match self.route(sb, &of, offset, size)? {
            Route::Done(data) => data,
            Route::Uncached(end) => {
                return self.read_uncached_into(sb, &of.node, offset, end, dst);
            }
            Route::Cached(view, end) => self.read_cached(sb, &of, &view, offset, end)?,
        };
        Ok(dst.answer_with(&data)?)
    }

    /// Which way a read goes: answered already (a staged file, or nothing to read), bytes
    /// fetched for it alone, or through the cache.
    fn route(
        &self,
        sb: &Superblock,
        of: &Arc<OpenFile>,
        offset: u64,
        size: u32,
    ) -> FsResult<Route> {
        Stats::add(&sb.stats().reads, 1);
        if let Some(p) = Offline::of(sb).staged(&of.node)
            && let Some(data) = p.read(offset, size)?
        {
            return Ok(Route::Done(data));
        }
        let view = View::of(&of.node);
        if offset >= view.size || size == 0 {
            return Ok(Route::Done(Recycled::default()));
        }
        let end = offset.saturating_add(size as u64).min(view.size);
        let first = offset >> view.chunk_shift;
        let last = (end - 1) >> view.chunk_shift;
        // No object, or a cache with no room for what this read misses: fetch the bytes
        // asked for, not whole chunks that would be dropped after this read.
        let refusing = view.object.as_ref().is_some_and(|o| o.cache_refusing());
        let uncached = match &view.object {
            None => true,
            Some(o) => refusing && (first..=last).all(|c| !o.has_chunk(c)),
        };
        of.read_up_to(end);
        if uncached {
            return Ok(Route::Uncached(end));
        }
        sb.fetcher()
            .schedule(of, &view, offset, end, last, refusing);
        Ok(Route::Cached(view, end))
    }

    /// The bytes from `offset` to `end` through the cache (fetching the chunks it lacks).
    fn read_cached(
        &self,
        sb: &Superblock,
        of: &Arc<OpenFile>,
        view: &View,
        offset: u64,
        end: u64,
    ) -> FsResult<ReadData> {
        let (first, last) = (offset >> view.chunk_shift, (end - 1) >> view.chunk_shift);
        // A pooled buffer (no freshly faulted pages per read): fetched bytes are appended,
        // cache-file reads go into zeroed room.
        let mut out = buffers::take((end - offset) as usize);
        for c in first..=last {
            let (cs, ce) = view.chunk_range(c);
            let (from, to) = (offset.max(cs), end.min(ce));
            let (at, want) = (out.len(), (to - from) as usize);
            out.resize(at + want, 0);
            let Some(bytes) = self.cached_or_fetched(sb, of, view, c, &mut out[at..], from)? else {
                continue;
            };
            // (The chunk may have come back shorter than the read's start in it: the file
            // shrank, or is shorter than its attributes said.)
            let lo = ((from - cs) as usize).min(bytes.len());
            let avail = (bytes.len() - lo).min(want);
            out.truncate(at);
            out.extend_from_slice(&bytes[lo..lo + avail]);
            if avail < want {
                // The file shrank while we read it: end the read there.
                break;
            }
        }
        Ok(Recycled::from(out))
    }

    /// A read of a file without a cached object (`--no-cache`, or a file the cache could
    /// not take: out of room or inodes), or of chunks a cache without room would not keep:
    /// the bytes asked for, fetched into a pooled buffer that goes back to the pool once the
    /// reply is written. Nothing is kept between reads (the
    /// kernel's page cache and readahead do that), so the memory in use is that of the
    /// requests in progress however many files are open, and stays in the CPU caches.
    /// (Fetching whole chunks and keeping them for the next reads cost a cold chunk per
    /// open at 256 readers, and a copy for every reply that spanned two chunks.)
    fn read_uncached(
        &self,
        sb: &Superblock,
        node: &Node,
        offset: u64,
        end: u64,
    ) -> FsResult<ReadData> {
        let len = (end - offset) as u32;
        let mut r = sb.with_handle(node, |h| sb.origin().read(h, offset, len))?;
        // Never more than asked (a remote origin's replies are checked for that already).
        r.data.truncate(len as usize);
        fetched_alone(sb, r.data.len());
        Ok(Recycled::from(r.data))
    }

    /// `read_uncached`, the bytes written by the origin straight into the destination in
    /// `dst`.
    fn read_uncached_into(
        &self,
        sb: &Superblock,
        node: &Node,
        offset: u64,
        end: u64,
        dst: &mut ReadSlot,
    ) -> FsResult<()> {
        let len = (end - offset) as u32;
        // (Tried again with a fresh handle only after a `Stale` answer, which leaves the
        // destination unanswered in `dst`.)
        let n = sb.with_handle(node, |h| {
            hoardfs_origin::read_into(sb.origin(), h, offset, len, dst)
        })?;
        fetched_alone(sb, n as usize);
        Ok(())
    }

    /// Fills `dst` (chunk `c`'s bytes from offset `from`) from the disk cache and returns
    /// `None`, or returns the whole chunk as fetched from the origin (or by a concurrent
    /// fetch). A chunk dropped by an eviction or a scrub during the read is fetched; one
    /// that keeps disappearing between fetch and read is an error, not a loop.
    fn cached_or_fetched(
        &self,
        sb: &Superblock,
        of: &OpenFile,
        view: &View,
        c: u64,
        dst: &mut [u8],
        from: u64,
    ) -> FsResult<Option<Arc<Recycled>>> {
        for _ in 0..3 {
            if let Some(obj) = &view.object
                && obj.read_chunk_at(c, dst, from)?
            {
                Stats::add(&sb.stats().chunk_hits, 1);
                Stats::add(&sb.stats().bytes_from_cache, dst.len() as u64);
                return Ok(None);
            }
            if let Some(bytes) = sb.fetcher().ensure_chunk(sb, &of.node, view, c)? {
                return Ok(Some(bytes));
            }
        }
        Err(crate::CacheFault::ChunkVanishing.into())
    }

    /// Ends open file `of`, taken from the table, in its node's open state (the origin
    /// has what it wrote: see `HoardFs::release`).
    pub(crate) fn close(&self, of: Arc<OpenFile>) -> Closed {
        let mut st = of.node.state.lock();
        st.opens.release(of.mode, of.was_flushed());
        // (Waiting opens and removals check what they wait for.)
        of.node.released.notify_all();
        let idle = st.is_idle();
        let still_open = st.is_open();
        let deleted = st.is_deleted().then(|| st.attr().file_id);
        drop(st);
        Closed {
            of,
            idle,
            still_open,
            deleted,
        }
    }

    /// Lets go of what a closed file held: a node nobody knows any more is forgotten, the
    /// cached object of a file nobody has open is let go of, and that of a file deleted on
    /// the origin and now closed for good is evicted.
    pub(crate) fn let_go(&self, sb: &Superblock, closed: Closed) {
        let Closed {
            of,
            idle,
            still_open,
            deleted,
        } = closed;
        if idle {
            sb.nodes().forget(of.node.ino, 0);
        } else if !still_open {
            sb.objects().closed(&of.node);
        }
        drop(of);
        if !still_open
            && let Some(file_id) = deleted
            && let Some(cache) = sb.objects().dir_if_any()
        {
            // A file deleted on the origin, closed for good (its open file's hold on the
            // object is dropped): its cached bytes, with this client's writes that the
            // origin never saw, must not outlive it.
            match cache.evict(&sb.objects().key(file_id)) {
                Ok(b) => tracing::debug!(file_id, b, "cached object of a deleted file evicted"),
                Err(e) => tracing::debug!(file_id, "cached object of a deleted file kept: {e}"),
            }
        }
    }

    /// Closes `fh`, an open that wrote nothing and whose file was not unlinked through
    /// this client (an implicit open: kernel opens are for read-only mounts).
    fn release_unwritten(&self, sb: &Superblock, fh: FileHandle) {
        if let Some(of) = self.files.remove(fh) {
            let closed = self.close(of);
            self.let_go(sb, closed);
        }
    }

    /// Reads up to `size` bytes at `offset` of file `ino`, which the kernel opened without
    /// the daemon. The file's version is checked with the origin as `getattr` would (not
    /// while a callback holds or within the attribute TTL).
    pub(crate) fn read_unopened(
        &self,
        sb: &Superblock,
        ino: Ino,
        offset: u64,
        size: u32,
    ) -> FsResult<ReadData> {
        let of = self.implicit_open(sb, ino)?;
        // Each read of a file the kernel opened is the reader's: decided as an open would
        // be (the kernel's page cache serves later reads without asking; see SECURITY.md).
        let attr = of.node.state.lock().attr();
        sb.may_access(&of.node, &attr, hoardfs_proto::MAY_READ)?;
        if offset == 0 {
            // Most likely a new open by the kernel, which the daemon does not see: start
            // sequential detection (and readahead) over, as a fresh open would.
            of.restart();
        }
        self.read_open(sb, &of, offset, size)
    }

    /// The implicit open of `ino` at its current version, opened if needed.
    fn implicit_open(&self, sb: &Superblock, ino: Ino) -> FsResult<Arc<OpenFile>> {
        let node = sb.file_node(ino)?;
        let attr = sb.attr_of(&node)?.attr;
        let known = self.implicit.current(ino);
        if let Some(open) = known
            && open.version == attr.version
            && let Ok(of) = self.open_file(open.fh)
        {
            return Ok(of);
        }
        // Never called: `open_node` offers no passthrough under kernel opens (the kernel
        // never sees this open).
        let no_backing =
            |_: &std::fs::File| Err(BackingError::Failed(std::io::Error::other("kernel opens")));
        let fh = self
            .open_node(sb, node, attr, READ_ONLY, false, &no_backing)
            .fh;
        // The kernel sends several reads of a file at once, so another thread may have
        // opened the same version meanwhile: one open is kept, the other released.
        match self.implicit.record(ino, fh, attr.version) {
            Ok(gone) => {
                for old in gone {
                    self.release_unwritten(sb, old);
                }
                self.open_file(fh)
            }
            Err(first) => {
                self.release_unwritten(sb, fh);
                self.open_file(first)
            }
        }
    }

    /// Releases every implicit open (at unmount, and in tests).
    pub(crate) fn release_implicit_opens(&self, sb: &Superblock) {
        for fh in self.implicit.take_all() {
            self.release_unwritten(sb, fh);
        }
    }

    /// Implicit opens currently held.
    #[cfg(test)]
    pub(crate) fn implicit_opens(&self) -> usize {
        self.implicit.len()
    }
}
