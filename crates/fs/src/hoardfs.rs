//! The kernel-facing file system: [`HoardFs`] answers each operation by ordering the
//! work of the operation families over the shared superblock, the way mountpoint-s3's
//! `S3Filesystem` orders its superblock, prefetcher and uploader:
//!
//! - [`Superblock`](crate::superblock::Superblock): what this client knows of the export
//!   (nodes, names, attributes, listings, callbacks, the offline log) and the origin;
//! - [`Reads`](crate::read::Reads): open files, passthrough, fetches and readahead;
//! - [`Writes`](crate::write::Writes): writes (queued behind the writer, or through),
//!   attribute changes, durability;
//! - [`Names`](crate::namespace::Names): creations, removals, renames, hidden names.
//!
//! A family never calls another; where an operation needs two (a release publishes
//! through `Writes` before `Reads` lets go of the file, a create opens what `Names`
//! made), this type calls them in order.

use std::sync::Arc;

use hoardfs_cache::{CacheDir, Usage, VerifyReport};
use hoardfs_origin::{Attr, Origin, Owner, SetAttrs, StatFs};

use crate::callbacks::KernelNotifier;
use crate::error::retried;
use crate::manage::{CachedEntry, Prefetched};
use crate::namespace::NewFile;
use crate::nodes::Listing;
use crate::offline::names::Created;
use crate::offline::{log_view, reintegrate};
use crate::opens::MakeBacking;
use crate::read::{Access, FileHandle, Opened, ReadData};
use crate::{
    FsConfig, FsResult, ListedNode, NamespaceSnapshot, NodeAttr, NodeEntry, Reintegrated,
    StatsSnapshot, namespace, read, superblock, unlinked, write,
};
use crate::{Ino, ROOT_INO};

/// The file system: the kernel-facing operations, each ordering the work of the
/// operation families over the shared superblock (module docs).
pub struct HoardFs {
    /// What this client knows of the export, and the origin it asks.
    pub(crate) sb: Arc<superblock::Superblock>,
    /// Open files and reads.
    pub(crate) reads: read::Reads,
    /// Writes, attribute changes and syncs.
    writes: write::Writes,
    /// Changes to names.
    names: namespace::Names,
    /// File locks kept by the origin.
    locks: crate::locks::Locks,
    /// One reintegration pass at a time (taken before any change's lock).
    reintegrating: parking_lot::Mutex<()>,
}

impl HoardFs {
    /// A file system over `origin`, caching in `cache` (`None`: read through, no disk cache).
    pub fn new(
        origin: Arc<dyn Origin>,
        cache: Option<CacheDir>,
        config: FsConfig,
    ) -> FsResult<Arc<HoardFs>> {
        let info = origin.info()?;
        let unlinked =
            unlinked::Unlinked::new(config.client_id.clone(), config.unlinked_journal.clone());
        let sb = superblock::Superblock::new(origin, &info, cache, config)?;
        let fs = Arc::new(HoardFs {
            reads: read::Reads::new(),
            writes: write::Writes::new(&sb),
            names: namespace::Names::new(unlinked),
            locks: crate::locks::Locks::default(),
            reintegrating: parking_lot::Mutex::new(()),
            sb,
        });
        if fs.sb.callbacks().held() {
            // The root's attributes came with the handshake, before breaks were subscribed
            // to, so they are trusted for the attribute timeout only; fetched once more
            // now, they are held under a callback like every other node's. (A mount that
            // starts unreachable keeps the handshake's.)
            if let Ok(root) = fs.sb.node(ROOT_INO) {
                fs.sb.expire_attr(&root);
            }
            let _ = fs.getattr(ROOT_INO);
        }
        if !fs.sb.read_only() {
            fs.names.remove_leftover_hidden_names(&fs.sb);
        }
        Ok(fs)
    }

    /// Where kernel invalidations go (set once by the FUSE bridge when the session exists).
    pub fn set_notifier(&self, n: Arc<dyn KernelNotifier>) {
        self.sb.set_notifier(n);
    }

    /// The namespace this mount knows now (see [`NamespaceSnapshot`]), for a later mount
    /// to start from while the server is unreachable.
    pub fn namespace_snapshot(&self, source: &str) -> FsResult<NamespaceSnapshot> {
        let info = self.sb.origin().info()?;
        let publishes = self.sb.origin().publishes_on_close();
        Ok(NamespaceSnapshot::capture(
            self.sb.nodes(),
            source,
            info,
            publishes,
        ))
    }

    /// Adds the nodes of `snap` (taken from this export) to this file system, expired and
    /// without callbacks; returns how many were added. Meant for a mount that starts
    /// disconnected, before the kernel looks anything up.
    pub fn restore_namespace(&self, snap: &NamespaceSnapshot) -> usize {
        self.sb.callbacks().presume_all_broken();
        let added = snap.restore_into(self.sb.nodes());
        // The snapshot may be older than the offline changes (a client killed before
        // its next save): they are what this client's view must show.
        if let Some(off) = self.sb.offline_writes() {
            log_view::log_into_view(self.sb.nodes(), &off.log);
        }
        added
    }

    /// Tries to reach the origin now if it is not connected (for commands a person
    /// waits on: `hoardfs sync`, `prefetch`).
    pub fn reconnect_now(&self) {
        self.sb.origin().reconnect_now();
    }

    /// Whether the mount refuses modifications.
    pub fn is_read_only(&self) -> bool {
        self.sb.read_only()
    }

    /// Mount configuration.
    pub fn config(&self) -> &FsConfig {
        self.sb.config()
    }

    /// Counters of this mount.
    pub fn stats(&self) -> StatsSnapshot {
        self.sb.stats().snapshot(self.sb.origin().is_connected())
    }

    /// How the origin revalidates listings in the background (an S3 origin), if it does.
    pub fn listing_refresh(&self) -> Option<hoardfs_origin::s3::refresher::RefreshStats> {
        self.sb.origin().listing_refresh()
    }

    /// Bytes written through the mount and not yet on the origin (queued behind their
    /// writers).
    pub fn unsent_write_bytes(&self) -> u64 {
        self.writes.unsent()
    }

    /// Occupancy, limits and counters of the disk cache (`None` without one).
    pub fn cache_usage(&self) -> Option<Usage> {
        self.sb.manager().usage()
    }

    /// Every object in the disk cache of this mount's export.
    pub fn cache_entries(&self) -> FsResult<Vec<CachedEntry>> {
        self.sb.manager().entries()
    }

    /// Pins (keeps from eviction) or unpins file `ino`.
    pub fn pin(&self, ino: Ino, pinned: bool, priority: u16) -> FsResult<()> {
        // A mount without a cache says so before anything about `ino`.
        self.sb.objects().dir()?;
        let node = self.sb.file_node(ino)?;
        self.sb.manager().pin(&node, pinned, priority)
    }

    /// Drops file `ino` from the disk cache; returns the bytes freed (0 if nothing of it
    /// was cached). Pinned and open files are refused.
    pub fn evict(&self, ino: Ino) -> FsResult<u64> {
        self.sb.objects().dir()?;
        let node = self.sb.file_node(ino)?;
        self.sb.manager().evict(&node)
    }

    /// Checks every cached chunk against its checksum; bad chunks are dropped (and fetched
    /// again when next read).
    pub fn verify_cache(&self, progress: &dyn Fn(u64, u64)) -> FsResult<VerifyReport> {
        self.sb.manager().verify(progress)
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        if self.sb.nodes().forget(ino, n) {
            // No descriptor of it is left to fsync or close.
            self.writes.forget(ino);
        }
    }

    /// Attributes of `ino` and how long the kernel may cache them: from memory while under
    /// a callback or younger than the TTL, otherwise from the origin.
    pub fn getattr(&self, ino: Ino) -> FsResult<NodeAttr> {
        // (Size and times are the server's once the writes made here reached it.)
        self.writes.settle(ino);
        let node = self.sb.node(ino)?;
        self.sb.attr_of(&node)
    }

    /// Opens `ino`. `make_backing` registers a cache file with the kernel for passthrough
    /// (called once per cached object: the registration outlives the opens and is
    /// released when the node lets go of the object). `Opened::changed` says the file
    /// changed since the kernel last saw its attributes (which are then invalidated).
    pub fn open(&self, ino: Ino, access: Access, make_backing: &MakeBacking) -> FsResult<Opened> {
        // (What it opens holds every write made here before.)
        self.writes.settle(ino);
        self.reads.open(&self.sb, ino, access, make_backing)
    }

    /// Reads up to `size` bytes at `offset` through open file `fh`.
    pub fn read(&self, fh: FileHandle, offset: u64, size: u32) -> FsResult<ReadData> {
        self.settle_open(fh);
        self.reads.read(&self.sb, fh, offset, size)
    }

    /// Like [`HoardFs::read`], answering the destination in `dst` (the FUSE io_uring
    /// entry's payload): bytes fetched for this read alone go straight from the network
    /// into it. On failure the destination is left in `dst` for the caller to answer
    /// with the error, unless it was answered already.
    pub fn read_into(
        &self,
        fh: FileHandle,
        offset: u64,
        size: u32,
        dst: &mut hoardfs_origin::ReadSlot,
    ) -> FsResult<()> {
        self.settle_open(fh);
        self.reads.read_into(&self.sb, fh, offset, size, dst)
    }

    /// Settles the writes queued for the file open as `fh`: a read the daemon serves
    /// finds them in the cache or on the origin.
    fn settle_open(&self, fh: FileHandle) {
        if self.writes.unsent() == 0 {
            return;
        }
        if let Ok(of) = self.reads.open_file(fh) {
            self.writes.settle(of.node.ino);
        }
    }

    /// Closes open file `fh`.
    pub fn release(&self, fh: FileHandle) {
        if let Ok(of) = self.reads.open_file(fh)
            && of.access.write
        {
            // (Writes of a shared mapping may come after the last close; and they reach
            // the server before the locks taken through this open go.)
            self.writes.settle(of.node.ino);
        }
        self.locks.released(&self.sb, fh);
        let Some(of) = self.reads.files.remove(fh) else {
            return;
        };
        if of.access.write {
            write::seal(&of.node);
        }
        if of.access.write
            && let Err(e) = self.writes.publish(&self.sb, &of.node)
        {
            // Published at the writer's close normally; this is the last chance (the
            // writer's descriptor was closed by another process), with nobody to tell.
            tracing::error!(
                ino = of.node.ino,
                "publishing a written file at release failed: {e}"
            );
        }
        if of.access.write && !self.reads.files.writing(of.node.ino) {
            self.writes.released(&self.sb, of.node.ino);
        }
        let closed = self.reads.close(of);
        if closed.last() {
            self.names.last_closed(&self.sb, closed.ino());
        }
        self.reads.let_go(&self.sb, closed);
    }

    /// Stops the readahead threads and closes the disk cache in order (at unmount).
    pub fn shutdown(&self) {
        self.writes.stop();
        self.sb.stop_background();
        self.reads.release_implicit_opens(&self.sb);
        self.sb.objects().close();
    }

    /// Whether the kernel opens files itself (see `crate::kernel_opens`): asked for, and
    /// the mount is read-only and has a disk cache (the mode is made for warm reads of
    /// cached trees; `hoardfs mount` refuses it with `--no-cache`).
    pub fn kernel_opens(&self) -> bool {
        self.sb.kernel_opens()
    }

    /// Reads up to `size` bytes at `offset` of file `ino`, which the kernel opened without
    /// the daemon. The file's version is checked with the origin as `getattr` would (not
    /// while a callback holds or within the attribute TTL).
    pub fn read_unopened(&self, ino: Ino, offset: u64, size: u32) -> FsResult<ReadData> {
        self.reads.read_unopened(&self.sb, ino, offset, size)
    }

    /// Fetches every missing chunk of file `ino` (current version) into the disk cache.
    pub fn prefetch(&self, ino: Ino) -> FsResult<Prefetched> {
        self.sb.prefetch(ino)
    }

    /// Releases every implicit open (at unmount, and in tests).
    #[cfg(test)]
    pub(crate) fn release_implicit_opens(&self) {
        self.reads.release_implicit_opens(&self.sb);
    }

    /// Implicit opens currently held.
    #[cfg(test)]
    pub(crate) fn implicit_opens(&self) -> usize {
        self.reads.implicit_opens()
    }

    /// Process `pid` writes `data` at `offset` through open file `fh`; returns the bytes
    /// written. (The writer's pid decides which close publishes the file: see
    /// [`HoardFs::flush`].)
    pub fn write(&self, fh: FileHandle, offset: u64, data: &[u8], pid: u32) -> FsResult<u32> {
        self.sb.check_writable()?;
        let of = self.reads.open_file(fh)?;
        let write = || self.writes.write(&self.sb, &of, offset, data, pid);
        if of.access.append {
            // (Not tried twice: a write whose reply was lost may have been appended.)
            return write();
        }
        retried(write)
    }

    /// Changes attributes of `ino` (chmod, chown, truncate, utimens); returns the new ones
    /// and how long the kernel may cache them.
    pub fn setattr(&self, ino: Ino, set: &SetAttrs) -> FsResult<NodeAttr> {
        // (A truncate or chmod comes after the writes made before it.)
        self.writes.settle(ino);
        retried(|| self.writes.setattr(&self.sb, ino, set))
    }

    /// Allocates or deallocates space of the file open as `fh` (`fallocate(2)` with
    /// `mode`, bits of [`hoardfs_origin::FALLOC_MODES`]), after the writes made before it.
    pub fn fallocate(&self, fh: FileHandle, offset: u64, length: u64, mode: u32) -> FsResult<()> {
        self.sb.check_writable()?;
        let of = self.reads.open_file(fh)?;
        self.writes.settle(of.node.ino);
        self.writes.fallocate(&self.sb, &of, (offset, length), mode)
    }

    /// Makes `ino`'s data (and with `!datasync` its metadata) durable on the origin. Fails
    /// (once) if writes to it were acknowledged by a server instance that may have lost
    /// them (module `durability`).
    pub fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        self.writes.fsync(&self.sb, ino, datasync)
    }

    /// A file descriptor of `ino` is closed by thread `pid`: fails if writes made through
    /// `fh` may have been lost (they are not synced here; close-to-open needs only that
    /// they reached the server); only the last writer's close clears that (module
    /// `durability`). Origins that publish whole files (S3) upload here when `pid` is the
    /// one that wrote through `fh` (not a child that inherited the descriptor), and a
    /// failed upload fails the `close()`.
    pub fn flush(&self, ino: Ino, fh: FileHandle, pid: u32) -> FsResult<()> {
        let of = self.reads.open_file(fh).ok();
        self.writes.flush(&self.sb, ino, of, pid)
    }

    /// Whether the origin keeps file locks for all its clients (then the mount asks the
    /// kernel to send every lock here; otherwise locks are local to this host).
    pub fn remote_locks(&self) -> bool {
        crate::locks::Locks::supported(&self.sb)
    }

    /// Takes, changes or releases lock `range` of `owner` on `ino` now (`WouldBlock` if
    /// another owner's lock is in the way; `NoLocks` while the origin is unreachable).
    pub fn lock(
        &self,
        ino: Ino,
        fh: FileHandle,
        kind: hoardfs_origin::LockKind,
        owner: u64,
        range: hoardfs_origin::LockRange,
        pid: u32,
    ) -> FsResult<()> {
        // Writes made under a lock reach the server before it is released, and taking
        // one comes after the writes made before (as on NFS).
        self.writes.settle(ino);
        self.locks.lock(&self.sb, ino, fh, kind, owner, range, pid)
    }

    /// Asks for lock `range` and answers `done` once it is held or the wait ends,
    /// without blocking the calling thread; the ticket cancels the wait.
    #[allow(clippy::too_many_arguments)]
    pub fn lock_waiting(
        &self,
        ino: Ino,
        fh: FileHandle,
        kind: hoardfs_origin::LockKind,
        owner: u64,
        range: hoardfs_origin::LockRange,
        pid: u32,
        done: crate::LockDone,
    ) -> Option<hoardfs_origin::LockTicket> {
        self.writes.settle(ino);
        self.locks
            .lock_waiting(&self.sb, ino, fh, kind, owner, range, pid, done)
    }

    /// Ends a lock wait (its answer: `Interrupted`, unless granted first).
    pub fn cancel_lock(&self, ticket: hoardfs_origin::LockTicket) {
        self.locks.cancel(&self.sb, ticket);
    }

    /// The lock in the way of `owner` taking `range` on `ino`, if any (`F_GETLK`).
    pub fn test_lock(
        &self,
        ino: Ino,
        kind: hoardfs_origin::LockKind,
        owner: u64,
        range: hoardfs_origin::LockRange,
    ) -> FsResult<Option<hoardfs_origin::LockHolder>> {
        self.locks.test(&self.sb, ino, kind, owner, range)
    }

    /// Releases the locks of `kind` `owner` holds on `ino` and ends its waits (the file
    /// was closed); sends nothing if it never locked it.
    pub fn unlock_all(&self, ino: Ino, kind: hoardfs_origin::LockKind, owner: u64) {
        // What was written under the locks reaches the server before they go (only where
        // the owner may hold one: every close comes here, a child's at exec too).
        self.locks.unlock_all(&self.sb, ino, kind, owner, || {
            self.writes.settle(ino);
        });
    }

    /// Value of extended attribute `name`.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        self.writes.getxattr(&self.sb, ino, name)
    }

    /// Extended attribute names, each NUL-terminated.
    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.writes.listxattr(&self.sb, ino)
    }

    /// Sets extended attribute `name` (`flags`: 1 create only, 2 replace only).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        self.writes.setxattr(&self.sb, ino, name, value, flags)
    }

    /// Removes extended attribute `name`.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.writes.removexattr(&self.sb, ino, name)
    }

    /// Creates (or with `!exclusive` opens an existing) regular file and opens it.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        truncate: bool,
        access: Access,
        owner: Owner,
        make_backing: &MakeBacking,
    ) -> FsResult<(NodeEntry, Opened)> {
        let made = self
            .names
            .create(&self.sb, parent, name, mode, exclusive, owner)?;
        let entry = match made {
            // (Opened first: an existing file's attributes come with its open.)
            NewFile::Offline(created) => {
                let (entry, opened) = self.open_created(created, access, make_backing)?;
                return Ok((self.truncated(entry, truncate)?, opened));
            }
            NewFile::Origin(entry) => self.truncated(entry, truncate)?,
        };
        let NodeEntry { ino, attr, ttl } = entry;
        let node = self.sb.node(ino)?;
        let opened = self
            .reads
            .open_node(&self.sb, node, attr, access, false, make_backing);
        Ok((NodeEntry { ino, attr, ttl }, opened))
    }

    /// Opens what an offline create found or made.
    fn open_created(
        &self,
        created: Created,
        access: Access,
        make_backing: &crate::MakeBacking,
    ) -> FsResult<(NodeEntry, Opened)> {
        let ttl = self.sb.config().attr_ttl;
        match created {
            // (Its attributes as the open left them: checked with the origin, or staged.)
            Created::Existing(ino) => {
                let opened = self.open(ino, access, make_backing)?;
                let attr = self.sb.node(ino)?.state.lock().attr();
                Ok((NodeEntry { ino, attr, ttl }, opened))
            }
            // (An empty file of this client's: its attributes as made.)
            Created::Made(node) => {
                let (ino, attr) = (node.ino, node.state.lock().attr());
                let opened = self.reads.open_pending(node, access);
                Ok((NodeEntry { ino, attr, ttl }, opened))
            }
        }
    }

    /// `entry` emptied if `truncate` (a create with `O_TRUNC` of an existing file) and it
    /// holds anything, with its new attributes.
    fn truncated(&self, entry: NodeEntry, truncate: bool) -> FsResult<NodeEntry> {
        if !truncate || entry.attr.size == 0 {
            return Ok(entry);
        }
        let set = SetAttrs {
            size: Some(0),
            ..Default::default()
        };
        let NodeAttr { attr, ttl } = self.setattr(entry.ino, &set)?;
        Ok(NodeEntry {
            ino: entry.ino,
            attr,
            ttl,
        })
    }

    /// Creates a special file (fifo, socket, device; `mode` includes the type bits).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        self.names.mknod(&self.sb, parent, name, mode, rdev, owner)
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, owner: Owner) -> FsResult<NodeEntry> {
        self.names.mkdir(&self.sb, parent, name, mode, owner)
    }

    /// Creates a symbolic link `name` → `target`.
    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        self.names.symlink(&self.sb, parent, name, target, owner)
    }

    /// Creates hard link `parent/name` to `ino`.
    pub fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<NodeEntry> {
        // (The reply carries the file's size: the server's once its writes reached it.)
        self.writes.settle(ino);
        self.names.link(&self.sb, ino, parent, name)
    }

    /// Removes a non-directory name.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.names.unlink(&self.sb, parent, name)
    }

    /// Removes an empty directory.
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.names.rmdir(&self.sb, parent, name)
    }

    /// Renames `parent/name` to `new_parent/new_name` (`flags`: NOREPLACE, EXCHANGE).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.names
            .rename(&self.sb, parent, name, new_parent, new_name, flags)
    }

    /// Resolves `name` in directory `parent`; counts one kernel lookup on success. Returns
    /// the node, its attributes and how long the kernel may cache them.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<NodeEntry> {
        let e = self.sb.lookup(parent, name)?;
        // A file with writes queued here: its size is the server's once they reached it
        // (the kernel would otherwise shrink the file it knows to an older size).
        if !self.writes.settle(e.ino) {
            return Ok(e);
        }
        self.sb.lookup(parent, name)
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        self.sb.readlink(ino)
    }

    /// The full listing of directory `ino` (reused within the directory TTL). When it is
    /// fetched, the disk cache reads the records of the listed files it holds ahead of
    /// their opens.
    /// The caller must be allowed to read the directory as the server decides
    /// (`crate::access`): a listing kept here is not shown to anyone it would not be shown
    /// to there.
    pub fn listing(&self, ino: Ino) -> FsResult<Arc<Listing>> {
        self.may_list(ino)?;
        self.sb.listing(ino)
    }

    /// Whether the ambient caller may list directory `ino`, as the server would decide
    /// (`crate::access`): read it, and search it (a listing carries every entry's
    /// attributes, which the server gives only to who may search).
    pub fn may_list(&self, ino: Ino) -> FsResult<()> {
        let node = self.sb.node(ino)?;
        let attr = node.state.lock().attr();
        let mask = hoardfs_proto::MAY_READ | hoardfs_proto::MAY_EXEC;
        self.sb.may_access(&node, &attr, mask)
    }

    /// Whether the origin performs requests as their callers (so the identity of each
    /// caller, groups included, matters to it).
    pub fn acts_as_callers(&self) -> bool {
        crate::access::checks_callers(&self.sb.origin().identities())
    }

    /// Records that a listing entry was handed to the kernel with its attributes
    /// (readdirplus), counting one kernel lookup; returns its node and kernel TTL.
    pub fn remember_entry(
        &self,
        dir: Ino,
        listing: &Listing,
        e: &hoardfs_origin::DirEntry,
    ) -> ListedNode {
        let n = self.sb.remember_entry(dir, listing, e);
        // A file with writes queued here: the kernel takes a listing's attributes as the
        // file's, so they are the server's once the writes reached it.
        if !self.writes.settle(n.ino) {
            return n;
        }
        match self.sb.node(n.ino) {
            Ok(node) => ListedNode {
                attr: node.state.lock().attr(),
                ..n
            },
            Err(_) => n,
        }
    }

    /// Attributes of `ino` as last seen, without any round trip (for `.` and `..`).
    pub fn cached_attr(&self, ino: Ino) -> FsResult<Attr> {
        Ok(self.sb.node(ino)?.state.lock().attr())
    }

    /// Parent of `ino` (the root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> FsResult<Ino> {
        Ok(self.sb.node(ino)?.state.lock().parent())
    }

    /// Statistics of the exported file system.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.sb.origin().statfs()?)
    }

    /// Once names no longer wait to be sent back (sent, or their changes cancelled), the
    /// name breaks put off meanwhile are applied (they only take away: applied late, a
    /// break of a name since sent back finds this client agreeing, and changes nothing).
    /// Called after reintegration and by the mount's keeper every second.
    pub fn settle_names(&self) {
        self.sb.settle_names();
    }

    /// Sends pending offline changes back, in an order that respects their dependencies
    /// (see `replay_order::ready`), until none is left or none can be sent now (the origin
    /// is unreachable, or refuses). Safe to call at any time and from any thread (one pass
    /// at a time).
    pub fn reintegrate(&self) -> Reintegrated {
        // (`hoardfs sync`: writes queued behind writers go first.)
        self.writes.settle_all();
        self.send_log(false)
    }

    /// What the mount's keeper calls every second: [`HoardFs::reintegrate`], except that
    /// with `--write-back=async` a file open for writing is sent after its writer closes
    /// it (once, whole), not while it is being written.
    pub fn trickle(&self) -> Reintegrated {
        if self.sb.config().write_back != crate::WriteBack::Async {
            return self.reintegrate();
        }
        self.send_log(true)
    }

    /// One reintegration of the log, if any (`hold_written`: see
    /// `Reintegration::holding_written`), then the name breaks put off meanwhile.
    fn send_log(&self, hold_written: bool) -> Reintegrated {
        let Some(off) = self.sb.offline_writes() else {
            return Reintegrated::default();
        };
        let _one_pass = self.reintegrating.lock();
        let writing = |ino| self.reads.files.writing(ino);
        let mut r = reintegrate::Reintegration::new(&self.sb, off, &writing);
        if hold_written {
            r = r.holding_written();
        }
        let r = r.run();
        self.settle_names();
        r
    }

    /// Number of changes waiting to be sent back.
    pub fn pending_changes(&self) -> u64 {
        self.sb.offline_writes().map_or(0, |o| o.log.count() as u64)
    }

    /// The offline change log's counters; `None` without `--offline-writes`.
    pub fn offline_stats(&self) -> Option<crate::LogStats> {
        self.sb.offline_writes().map(|o| o.log.stats())
    }

    /// The conflicts recorded in this cache directory, oldest first.
    pub fn conflicts(&self) -> Vec<crate::Conflict> {
        self.sb
            .offline_writes()
            .map(|o| o.log.conflicts())
            .unwrap_or_default()
    }
}
