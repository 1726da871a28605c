//! hoardfs file-system logic: names, attributes, listings, opens and reads, answered from
//! the persistent cache where it can and from the origin where it must. Nothing here knows
//! FUSE; the `hoardfs-fuse` crate is a thin bridge over [`HoardFs`], and tests can drive it
//! directly.
//!
//! Consistency (doc/SEMANTICS.md): close-to-open, with callbacks. An open validates the
//! file's version (a round trip, unless the origin holds a callback for it) and drops cached
//! data of other versions; writes go through to the origin before they return. With an
//! origin that reports changes (module `callbacks`), attributes, names and listings are
//! trusted until a break; otherwise for short TTLs. When the origin is unreachable, cached
//! attributes, names and data are served and everything else fails fast.

mod callbacks;
mod cml;
mod conflict_names;
mod dirs;
mod durability;
mod error;
mod fetch;
mod freshness;
mod kernel_opens;
mod log_view;
mod made;
mod manage;
mod namespace;
pub mod nodes;
mod objects;
mod offline;
mod offline_names;
mod open_files;
mod opens;
mod read;
mod record;
mod reintegrate;
mod replay_order;
mod sealed;
mod send_back;
mod snapshot;
mod stats;
mod trees;
mod unlinked;
mod upload;
mod write;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hoardfs_cache::{CacheDir, Usage, VerifyReport};
use hoardfs_origin::{Attr, Break, FileKind, Handle, Origin, OriginError, StatFs, WireError};

pub use callbacks::KernelNotifier;
pub use cml::{Conflict, LogStats};
pub use error::{CacheFault, FsError, FsResult, Shared};
pub use manage::{CachedEntry, Prefetched};
pub use namespace::NodeEntry;
pub use nodes::{Backing, BackingError, Ino, Listing, MakeBacking, Node, ROOT_INO};
pub use read::{Access, FileHandle, OpenMode, Opened, ReadData};
pub use reintegrate::Reintegrated;
pub use sealed::Unsealed;
pub use snapshot::{NamespaceSnapshot, SnapshotError};
pub use stats::{Stats, StatsSnapshot};

use callbacks::{BreakApplier, Callbacks};
use manage::CacheManager;
use nodes::NodeTable;

/// Files of one listing whose cached records are read ahead at most (the first ones by
/// name; the disk cache's queue bounds it further).
pub(crate) const WARM_PER_LISTING: usize = 1024;

/// Entries plus pages of one directory listing at most: a server that keeps answering
/// with further pages (each with a new cookie) cannot make a listing grow without bound.
pub(crate) const MAX_LISTING: usize = 1 << 22;

/// Bytes of names in one directory listing at most (a server answering with long names
/// would otherwise make the entry bound hold about a gibibyte).
pub(crate) const MAX_LISTING_NAME_BYTES: usize = 128 << 20;

/// Tunables of a mount.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted without asking the origin (when the
    /// origin holds no callback for them).
    pub attr_ttl: Duration,
    /// How long attributes and names under a valid callback are trusted at most.
    pub callback_ttl: Duration,
    /// Refuse every modification.
    pub read_only: bool,
    /// How long a directory listing is reused.
    pub dir_ttl: Duration,
    /// Hand fully cached files to the kernel (FUSE passthrough).
    pub passthrough: bool,
    /// Chunks fetched ahead of a sequential reader.
    pub readahead_chunks: u64,
    /// Threads fetching readahead chunks.
    pub fetch_threads: usize,
    /// Serve extended attributes (each call a round trip to the origin). Off, the FUSE
    /// bridge tells the kernel they are unsupported, once for the whole mount.
    pub xattrs: bool,
    /// Let the kernel open files without asking the daemon (read-only mounts with a disk
    /// cache; ignored otherwise): no per-open round trip, no passthrough, no open-time
    /// version check (`crate::kernel_opens`).
    pub kernel_opens: bool,
    /// This client's id, stable across its runs (one per cache directory): part of the
    /// hidden names of files unlinked while open (`crate::unlinked`).
    pub client_id: Option<String>,
    /// Where hidden names are journaled until removed, so that the next run removes
    /// those a crash left behind (`crate::unlinked`).
    pub unlinked_journal: Option<std::path::PathBuf>,
    /// Where client modify logs live (`crate::cml`; one subdirectory per export). A log
    /// left by an earlier mount is sent back whenever this is set.
    pub offline_log: Option<std::path::PathBuf>,
    /// `--offline-writes`: keep changes made while the origin is unreachable in the log
    /// (needs `offline_log`); off, they fail.
    pub offline_writes: bool,
    /// This client's host name, in the names of conflict copies.
    pub host: String,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            attr_ttl: Duration::from_secs(1),
            callback_ttl: Duration::from_secs(600),
            read_only: false,
            dir_ttl: Duration::from_secs(1),
            passthrough: true,
            readahead_chunks: 8,
            fetch_threads: 4,
            xattrs: false,
            kernel_opens: false,
            client_id: None,
            unlinked_journal: None,
            offline_log: None,
            offline_writes: false,
            host: "client".into(),
        }
    }
}

/// Attributes of a node and how long the kernel may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAttr {
    /// The attributes.
    pub attr: Attr,
    /// How long the kernel may keep them.
    pub ttl: Duration,
}

/// A listing entry handed to the kernel with its attributes (readdirplus): its node and
/// how long the kernel may cache its name and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedNode {
    /// The entry's node.
    pub ino: Ino,
    /// How long the kernel may keep the name and attributes.
    pub ttl: Duration,
    /// The attributes to hand out (the entry's, or a file's local ones while it has a
    /// change not yet sent back).
    pub attr: Attr,
}

/// The file system: an origin, an optional disk cache, and the inode table.
pub struct HoardFs {
    origin: Arc<dyn Origin>,
    /// The disk cache (if any) and which object belongs to which file.
    objects: objects::Objects,
    config: FsConfig,
    nodes: NodeTable,
    /// The open files, by kernel handle.
    files: open_files::OpenFiles,
    /// Mount-wide passthrough admission.
    passthrough: read::PassthroughGate,
    /// Chunk fetches shared between readers, and readahead.
    fetcher: fetch::Fetcher,
    /// Opens of reads that came without one (`crate::kernel_opens`).
    implicit: kernel_opens::ImplicitOpens,
    stats: Arc<Stats>,
    /// The origin's change reports (callbacks) and the breaks received.
    callbacks: Callbacks,
    notifier: OnceLock<Arc<dyn KernelNotifier>>,
    read_only: bool,
    /// Writes acknowledged but not yet durable on the server.
    durability: durability::Durability,
    /// Open files whose last name was replaced by a hidden one.
    unlinked: unlinked::Unlinked,
    /// The client modify log of `--offline-writes`.
    offline: Option<offline::OfflineWrites>,
    /// One reintegration pass at a time (taken before any change's lock).
    reintegrating: parking_lot::Mutex<()>,
    /// Listings read ahead of a walk.
    trees: trees::TreeAhead,
}

impl HoardFs {
    /// A file system over `origin`, caching in `cache` (`None`: read through, no disk cache).
    pub fn new(
        origin: Arc<dyn Origin>,
        cache: Option<CacheDir>,
        config: FsConfig,
    ) -> FsResult<Arc<HoardFs>> {
        let info = origin.info()?;
        let stats = Arc::new(Stats::default());
        let (callbacks, breaks) = Callbacks::subscribe(&*origin);
        let unlinked =
            unlinked::Unlinked::new(config.client_id.clone(), config.unlinked_journal.clone());
        let offline = offline::OfflineWrites::open(&config, info.export_id)?;
        let fs = Arc::new_cyclic(|weak| HoardFs {
            nodes: NodeTable::new(info.root.handle, info.root.attr),
            files: open_files::OpenFiles::default(),
            passthrough: read::PassthroughGate::default(),
            fetcher: fetch::Fetcher::new(weak.clone(), &config, cache.is_some()),
            implicit: kernel_opens::ImplicitOpens::default(),
            origin,
            objects: objects::Objects::new(cache, info.export_id, stats.clone()),
            read_only: config.read_only || info.read_only,
            config,
            stats,
            callbacks,
            notifier: OnceLock::new(),
            durability: durability::Durability::default(),
            unlinked,
            offline,
            reintegrating: parking_lot::Mutex::new(()),
            trees: trees::TreeAhead::default(),
        });
        if let Some(off) = &fs.offline {
            for (file_id, change) in off.log.local_changes() {
                fs.nodes.set_local(file_id, Some(change));
            }
        }
        breaks.spawn(Arc::downgrade(&fs))?;
        if fs.callbacks.held() {
            // The root's attributes came with the handshake, before breaks were subscribed
            // to, so they are trusted for the attribute timeout only; fetched once more
            // now, they are held under a callback like every other node's. (A mount that
            // starts unreachable keeps the handshake's.)
            if let Ok(root) = fs.node(ROOT_INO) {
                fs.expire_attr(&root);
            }
            let _ = fs.getattr(ROOT_INO);
        }
        if !fs.read_only {
            fs.remove_leftover_hidden_names();
        }
        Ok(fs)
    }

    /// Where kernel invalidations go (set once by the FUSE bridge when the session exists).
    pub fn set_notifier(&self, n: Arc<dyn KernelNotifier>) {
        let _ = self.notifier.set(n);
    }

    /// The namespace this mount knows now (see [`NamespaceSnapshot`]), for a later mount
    /// to start from while the server is unreachable.
    pub fn namespace_snapshot(&self, source: &str) -> FsResult<NamespaceSnapshot> {
        let info = self.origin.info()?;
        let publishes = self.origin.publishes_on_close();
        Ok(NamespaceSnapshot::capture(
            &self.nodes,
            source,
            info,
            publishes,
        ))
    }

    /// Adds the nodes of `snap` (taken from this export) to this file system, expired and
    /// without callbacks; returns how many were added. Meant for a mount that starts
    /// disconnected, before the kernel looks anything up.
    pub fn restore_namespace(&self, snap: &NamespaceSnapshot) -> usize {
        self.callbacks.presume_all_broken();
        let added = snap.restore_into(&self.nodes);
        // The snapshot may be older than the offline changes (a client killed before
        // its next save): they are what this client's view must show.
        if let Some(off) = &self.offline {
            log_view::log_into_view(&self.nodes, &off.log);
        }
        added
    }

    /// The origin's current write verifier (see `durability`).
    fn verifier(&self) -> u64 {
        self.origin.info().map(|i| i.verifier).unwrap_or(0)
    }

    /// Tries to reach the origin now if it is not connected (for commands a person
    /// waits on: `hoardfs sync`, `prefetch`).
    pub fn reconnect_now(&self) {
        self.origin.reconnect_now();
    }

    /// Whether the mount refuses modifications.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether attributes fetched after break number `since` come with a callback.
    fn grant(&self, file_id: u64, since: u64) -> bool {
        self.callbacks.grants(file_id, since)
    }

    /// Stores fresh attributes of `node` (fetched after break number `since`).
    fn install_attr(&self, node: &Node, attr: Attr, since: u64) -> NodeAttr {
        let mut st = node.state.lock();
        st.install_attr(attr, self.grant(attr.file_id, since));
        NodeAttr {
            attr,
            ttl: st.kernel_ttl(&self.config),
        }
    }

    fn check_writable(&self) -> FsResult<()> {
        if self.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Mount configuration.
    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// Counters of this mount.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot(self.origin.is_connected())
    }

    fn node(&self, ino: Ino) -> FsResult<Arc<Node>> {
        self.nodes.get(ino).ok_or(FsError::BadHandle)
    }

    /// The node of regular file `ino` (anything else is an error).
    pub(crate) fn file_node(&self, ino: Ino) -> FsResult<Arc<Node>> {
        let node = self.node(ino)?;
        match node.kind {
            FileKind::File => Ok(node),
            FileKind::Dir => Err(WireError::IsDir.into()),
            _ => Err(WireError::Invalid.into()),
        }
    }

    /// Handles breaks (on the callback thread): clears callbacks and tells the kernel.
    pub(crate) fn apply_breaks(&self, breaks: Vec<Break>) {
        let notifier = self.notifier.get().map(|n| &**n);
        BreakApplier::new(&self.nodes, &self.trees, self.offline.as_ref(), notifier).apply(breaks);
    }

    /// Cache management (`crate::manage`) over this mount's nodes and objects.
    fn manager(&self) -> CacheManager<'_> {
        CacheManager::new(&self.nodes, &self.objects)
    }

    /// Occupancy, limits and counters of the disk cache (`None` without one).
    pub fn cache_usage(&self) -> Option<Usage> {
        self.manager().usage()
    }

    /// Every object in the disk cache of this mount's export.
    pub fn cache_entries(&self) -> FsResult<Vec<CachedEntry>> {
        self.manager().entries()
    }

    /// Pins (keeps from eviction) or unpins file `ino`.
    pub fn pin(&self, ino: Ino, pinned: bool, priority: u16) -> FsResult<()> {
        // A mount without a cache says so before anything about `ino`.
        self.objects.dir()?;
        let node = self.file_node(ino)?;
        self.manager().pin(&node, pinned, priority)
    }

    /// Drops file `ino` from the disk cache; returns the bytes freed (0 if nothing of it
    /// was cached). Pinned and open files are refused.
    pub fn evict(&self, ino: Ino) -> FsResult<u64> {
        self.objects.dir()?;
        let node = self.file_node(ino)?;
        self.manager().evict(&node)
    }

    /// Checks every cached chunk against its checksum; bad chunks are dropped (and fetched
    /// again when next read).
    pub fn verify_cache(&self, progress: &dyn Fn(u64, u64)) -> FsResult<VerifyReport> {
        self.manager().verify(progress)
    }

    /// Runs `op` with the node's handle; if the origin says the handle is stale (server
    /// restarted or handle forgotten), resolves the node's name again and retries once.
    fn with_handle<T>(
        &self,
        node: &Node,
        mut op: impl FnMut(Handle) -> Result<T, OriginError>,
    ) -> FsResult<T> {
        if node.state.lock().is_deleted() {
            return Err(WireError::Stale.into());
        }
        match op(node.handle()) {
            Err(OriginError::Fs(WireError::Stale)) => {
                let h = match self.resolve(node.ino, 0) {
                    Ok(h) => h,
                    Err(e) => return Err(self.lost(node, e)),
                };
                Ok(op(h)?)
            }
            r => Ok(r?),
        }
    }

    /// `node`'s handle is stale and resolving its name failed with `e`. A regular file
    /// open here whose name is gone (or names another object) was deleted on the origin
    /// while open: it becomes a deleted node (`NodeState::mark_deleted`), which keeps
    /// serving `fstat`, cached reads and local writes to its descriptors, as a local file
    /// system would; what needs the origin fails with `ESTALE`.
    fn lost(&self, node: &Node, e: FsError) -> FsError {
        let gone = matches!(e, FsError::Origin(WireError::NotFound | WireError::Stale));
        if !gone || node.kind != FileKind::File {
            return e;
        }
        let file_id = {
            let mut st = node.state.lock();
            if !st.is_open() {
                return e;
            }
            st.mark_deleted();
            st.attr().file_id
        };
        self.nodes.unbind_file_id(node.ino, file_id);
        tracing::debug!(ino = node.ino, "an open file was deleted on the origin");
        if let Some(n) = self.notifier.get() {
            n.inval_attr(node.ino);
        }
        FsError::Origin(WireError::Stale)
    }

    /// Finds a fresh handle for `ino` by walking its names from the root.
    fn resolve(&self, ino: Ino, depth: u32) -> FsResult<Handle> {
        if depth > 256 {
            return Err(FsError::Origin(WireError::Stale));
        }
        let node = self.node(ino)?;
        if ino == ROOT_INO {
            let root = self.origin.info()?.root;
            node.state.lock().set_handle(root.handle);
            return Ok(root.handle);
        }
        let (parent, name, file_id) = {
            let st = node.state.lock();
            (st.parent(), st.name().to_vec(), st.attr().file_id)
        };
        let ph = self.resolve(parent, depth + 1)?;
        let e = self.origin.lookup(ph, &name)?;
        if e.attr.file_id != file_id {
            // The name now refers to another object: ours is gone.
            return Err(FsError::Origin(WireError::Stale));
        }
        node.state.lock().resolved(e.handle, e.attr);
        Ok(e.handle)
    }

    /// Resolves `name` in directory `parent`; counts one kernel lookup on success. Returns
    /// the node, its attributes and how long the kernel may cache them.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<NodeEntry> {
        let dir = self.node(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        // A file with a change not yet sent back (perhaps not even created on the origin)
        // is the log's: answered here.
        let (child, listed) = {
            let st = dir.state.lock();
            (st.child(name), st.last_listing().is_some())
        };
        let child = child.and_then(|c| self.nodes.get(c));
        // So are all names while the log holds changes to names (this client's view of
        // them is its own until they are sent back).
        if self.names_pending() && child.is_none() && listed {
            return Err(WireError::NotFound.into());
        }
        if let Some(node) = child
            && (self.names_pending() || self.pending_of(&node).is_some())
        {
            let mut st = node.state.lock();
            if !st.is_deleted() {
                st.count_lookup();
                return Ok(NodeEntry {
                    ino: node.ino,
                    attr: st.attr(),
                    ttl: self.config.attr_ttl,
                });
            }
        }
        let since = self.callbacks.seq();
        let dir_id = dir.state.lock().attr().file_id;
        match self.with_handle(&dir, |h| self.origin.lookup(h, name)) {
            // An object moved here and not yet on the origin has this client's name only.
            Ok(e)
                if self
                    .offline_names()
                    .is_some_and(|n| n.moved_elsewhere(&e, parent, name)) =>
            {
                Err(WireError::NotFound.into())
            }
            Ok(e) => {
                let ListedNode { ino, ttl, attr } =
                    self.remember(parent, name, &e, dir_id, since, None);
                Ok(NodeEntry { ino, attr, ttl })
            }
            Err(FsError::Offline(why)) => {
                // Serve the name from what we saw while connected.
                let (child, listed) = {
                    let st = dir.state.lock();
                    (st.child(name), st.last_listing().is_some())
                };
                // With offline writes, a name missing from the directory's kept listing
                // is absent (as the listing shows), so that it can be created.
                if child.is_none() && listed && self.offline.as_ref().is_some_and(|o| o.keeps_new())
                {
                    return Err(WireError::NotFound.into());
                }
                let node = child
                    .and_then(|c| self.nodes.get(c))
                    .ok_or(FsError::Offline(why))?;
                let mut st = node.state.lock();
                st.count_lookup();
                Ok(NodeEntry {
                    ino: node.ino,
                    attr: st.attr(),
                    ttl: self.config.attr_ttl,
                })
            }
            Err(e) => {
                if e == FsError::Origin(WireError::NotFound) {
                    dir.state.lock().remove_child(name);
                }
                Err(e)
            }
        }
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        if self.nodes.forget(ino, n) {
            // No descriptor of it is left to fsync or close.
            self.durability.forget(ino);
        }
    }

    /// Records (`parent`, `name`) → `e` learned after break number `since`; the callback
    /// needs both the entry's object and the directory (`dir_id`) unbroken since then.
    fn remember(
        &self,
        parent: Ino,
        name: &[u8],
        e: &hoardfs_origin::Entry,
        dir_id: u64,
        since: u64,
        as_of: Option<std::time::Instant>,
    ) -> ListedNode {
        let grant = |a: &Attr| self.grant(a.file_id, since) && self.grant(dir_id, since);
        let n = self
            .nodes
            .remember(parent, name, e.handle, e.attr, as_of, grant);
        let st = n.state.lock();
        ListedNode {
            ino: n.ino,
            ttl: st.kernel_ttl(&self.config),
            attr: st.attr(),
        }
    }

    /// Attributes of `ino` and how long the kernel may cache them: from memory while under
    /// a callback or younger than the TTL, otherwise from the origin.
    pub fn getattr(&self, ino: Ino) -> FsResult<NodeAttr> {
        let node = self.node(ino)?;
        self.attr_of(&node)
    }

    /// [`HoardFs::getattr`] of a node already looked up.
    pub(crate) fn attr_of(&self, node: &Node) -> FsResult<NodeAttr> {
        {
            let st = node.state.lock();
            if st.is_deleted() {
                // Nothing to ask the origin: only this client changes it now.
                return Ok(NodeAttr {
                    attr: st.attr(),
                    ttl: Duration::ZERO,
                });
            }
            if st.attr_fresh(&self.config) {
                return Ok(NodeAttr {
                    attr: st.attr(),
                    ttl: st.kernel_ttl(&self.config),
                });
            }
            if st.has_change() {
                // The log's until sent back (a node made offline has no origin object).
                return Ok(NodeAttr {
                    attr: st.attr(),
                    ttl: self.config.attr_ttl,
                });
            }
        }
        self.refresh_attr(node)
    }

    /// Fresh attributes from the origin (cached ones if it is unreachable).
    fn refresh_attr(&self, node: &Node) -> FsResult<NodeAttr> {
        self.stats.count_version_check();
        let since = self.callbacks.seq();
        match self.with_handle(node, |h| self.origin.getattr(h)) {
            Ok(a) => Ok(self.install_attr(node, a, since)),
            Err(FsError::Origin(WireError::Stale)) if node.state.lock().is_deleted() => {
                Ok(NodeAttr {
                    attr: node.state.lock().attr(),
                    ttl: Duration::ZERO,
                })
            }
            Err(FsError::Offline(_)) => Ok(NodeAttr {
                attr: node.state.lock().attr(),
                ttl: self.config.attr_ttl,
            }),
            Err(e) => Err(e),
        }
    }

    /// Attributes of `ino` as last seen, without any round trip (for `.` and `..`).
    pub fn cached_attr(&self, ino: Ino) -> FsResult<Attr> {
        Ok(self.node(ino)?.state.lock().attr())
    }

    /// Parent of `ino` (the root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> FsResult<Ino> {
        Ok(self.node(ino)?.state.lock().parent())
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let node = self.node(ino)?;
        if let Some(t) = self.offline_names().and_then(|n| n.local_target(&node)) {
            return Ok(t);
        }
        match self.with_handle(&node, |h| self.origin.readlink(h)) {
            Ok(t) => {
                node.state.lock().keep_target(&t);
                Ok(t)
            }
            // Served from what was read while connected.
            Err(FsError::Offline(why)) => {
                node.state.lock().kept_target().ok_or(FsError::Offline(why))
            }
            Err(e) => Err(e),
        }
    }

    /// Statistics of the exported file system.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.origin.statfs()?)
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;
