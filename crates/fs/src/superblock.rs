//! The superblock: what this client knows of the export's objects, and the rules that
//! keep it true. It owns the origin, the node table (names, attributes, listings and
//! their freshness), the disk cache's objects, the callbacks and their breaks, the
//! kernel notifier, the listings read ahead of a walk and the offline change log; it
//! answers lookups, attributes, symbolic links and listings, finds fresh handles when the
//! origin calls one stale, and records what the origin answers (`remember`,
//! `install_attr`). Two of its parts have files of their own: [`listings`] and what lookups
//! and listings need of the offline log ([`offline_view`]). The operation families ([`crate::read::Reads`],
//! [`crate::write::Writes`], [`crate::namespace::Names`]) own their own state and work
//! over a borrowed `Superblock`; [`crate::HoardFs`] orders them.
//!
//! Lock ordering: a node's `state` lock is never held across origin I/O; the node table's
//! lock is not taken while a node's lock is held (`crate::nodes`).

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hoardfs_origin::{
    Attr, DirEntry, FileKind, Handle, Identities, Origin, OriginError, WireError, caller,
};

use crate::callbacks::{Callbacks, KernelNotifier};
use crate::fetch::fetcher::Fetcher;
use crate::manage::CacheManager;
use crate::nodes::{Node, NodeTable};
use crate::offline::lister::Lister;
use crate::offline::state::OfflineWrites;
use crate::stats::Stats;
use crate::trees::TreeAhead;
use crate::{
    FsConfig, FsError, FsResult, ListedNode, Listing, NodeAttr, NodeEntry, objects::Objects,
};
use crate::{Ino, ROOT_INO};

mod listings;
mod offline_view;

/// A node's attributes before and after an open's check with the origin
/// (`Superblock::validated_attr`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Revalidated {
    /// What the node (and so the kernel) had.
    pub(crate) before: hoardfs_origin::Attr,
    /// What the origin has now (the same, under a valid callback).
    pub(crate) now: hoardfs_origin::Attr,
}

impl Revalidated {
    /// Whether the kernel's copy is out of date: another version or size.
    pub(crate) fn changed(&self) -> bool {
        self.before.version != self.now.version || self.before.size != self.now.size
    }
}

/// Shared state of a mount, borrowed by every operation family.
pub(crate) struct Superblock {
    origin: Arc<dyn Origin>,
    /// The disk cache (if any) and which object belongs to which file.
    objects: Objects,
    config: FsConfig,
    nodes: NodeTable,
    stats: Arc<Stats>,
    /// The origin's change reports (callbacks) and the breaks received.
    callbacks: Callbacks,
    /// Where kernel invalidations go (set once the FUSE session exists).
    notifier: OnceLock<Arc<dyn KernelNotifier>>,
    /// The mount refuses modifications.
    read_only: bool,
    /// The client modify log of `--offline-writes`.
    offline: Option<OfflineWrites>,
    /// Listings read ahead of a walk.
    trees: TreeAhead,
    /// Shared chunk fetches and readahead (its threads hold a `Weak` of this superblock).
    fetcher: Fetcher,
    /// With `--offline-writes`: lists directories resolved by path in the background (its
    /// thread holds a `Weak` of this superblock).
    lister: Option<Lister>,
}

impl Superblock {
    /// The superblock of a mount of `origin` (whose `info` was just asked), caching in
    /// `cache`: subscribed to the origin's breaks, with the offline log opened and its
    /// changes marked on their nodes. Its background threads (breaks, readahead) hold a
    /// `Weak` of it and end when it goes.
    pub(crate) fn new(
        origin: Arc<dyn Origin>,
        info: &hoardfs_origin::OriginInfo,
        cache: Option<hoardfs_cache::CacheDir>,
        config: FsConfig,
    ) -> FsResult<Arc<Superblock>> {
        let stats = Arc::new(Stats::default());
        let (callbacks, breaks) = Callbacks::subscribe(&*origin);
        let offline = OfflineWrites::open(&config, info.export_id)?;
        let with_cache = cache.is_some();
        let sb = Arc::new_cyclic(|weak: &std::sync::Weak<Superblock>| {
            let lister = offline
                .as_ref()
                .filter(|o| o.keeps_new())
                .and_then(|_| start_lister(weak.clone()));
            let weak_ahead = weak.clone();
            let weak = weak.clone();
            let read_ahead = move |open: &Arc<crate::open_files::OpenFile>, chunk| {
                let Some(sb) = weak.upgrade() else {
                    return false;
                };
                sb.fetcher.read_ahead(&sb, open, chunk);
                true
            };
            let fetch_file = move |job| {
                let Some(sb) = weak_ahead.upgrade() else {
                    return false;
                };
                sb.fetcher.fetch_file_ahead(&sb, job);
                true
            };
            Superblock {
                nodes: NodeTable::new(info.root.handle, info.root.attr),
                origin,
                objects: Objects::new(cache, info.export_id, stats.clone()),
                read_only: config.read_only || info.read_only,
                fetcher: Fetcher::new(&config, with_cache, read_ahead, fetch_file),
                config,
                stats,
                callbacks,
                notifier: OnceLock::new(),
                offline,
                trees: TreeAhead::default(),
                lister,
            }
        });
        if let Some(off) = &sb.offline {
            for (file_id, change) in off.log.local_changes() {
                sb.nodes.set_local(file_id, Some(change));
            }
        }
        let weak = Arc::downgrade(&sb);
        breaks.spawn(move |b| {
            let Some(sb) = weak.upgrade() else {
                return false;
            };
            sb.apply_breaks(b);
            true
        })?;
        Ok(sb)
    }

    // What the superblock holds, lent to the operation families for one call.

    /// Stops the background threads that fetch ahead and list directories (at unmount).
    pub(crate) fn stop_background(&self) {
        self.fetcher.stop();
        if let Some(l) = &self.lister {
            l.stop();
        }
    }

    /// The origin this mount serves (asked through `with_handle` where a node's handle
    /// may have gone stale).
    pub(crate) fn origin(&self) -> &dyn Origin {
        &*self.origin
    }

    /// The node table: FUSE inodes and what is known of their objects.
    pub(crate) fn nodes(&self) -> &NodeTable {
        &self.nodes
    }

    /// The disk cache and which of its objects belongs to which file.
    pub(crate) fn objects(&self) -> &Objects {
        &self.objects
    }

    /// The mount's configuration.
    pub(crate) fn config(&self) -> &FsConfig {
        &self.config
    }

    /// The mount's counters.
    pub(crate) fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The origin's callbacks: break numbers to note before a request, and grants.
    pub(crate) fn callbacks(&self) -> &Callbacks {
        &self.callbacks
    }

    /// The listings read ahead of a walk.
    pub(crate) fn trees(&self) -> &TreeAhead {
        &self.trees
    }

    /// Shared chunk fetches and readahead.
    pub(crate) fn fetcher(&self) -> &Fetcher {
        &self.fetcher
    }

    /// The offline change log of this mount, if one is open.
    pub(crate) fn offline_writes(&self) -> Option<&OfflineWrites> {
        self.offline.as_ref()
    }

    /// Where kernel invalidations go, once the FUSE session exists.
    pub(crate) fn notifier(&self) -> Option<&dyn KernelNotifier> {
        self.notifier.get().map(|n| &**n)
    }

    /// Sets where kernel invalidations go (once; later calls are ignored).
    pub(crate) fn set_notifier(&self, n: Arc<dyn KernelNotifier>) {
        let _ = self.notifier.set(n);
    }

    /// Whether the mount refuses modifications.
    pub(crate) fn read_only(&self) -> bool {
        self.read_only
    }

    // The mount as a whole.

    /// The origin's current write verifier (see `durability`).
    pub(crate) fn verifier(&self) -> u64 {
        self.origin.info().map(|i| i.verifier).unwrap_or(0)
    }

    pub(crate) fn check_writable(&self) -> FsResult<()> {
        if self.read_only {
            Err(FsError::ReadOnly)
        } else {
            Ok(())
        }
    }

    /// Whether the kernel opens files itself (`crate::kernel_opens`): asked for, and the
    /// mount is read-only and has a disk cache (the mode is made for warm reads of cached
    /// trees; `hoardfs mount` refuses it with `--no-cache`).
    pub(crate) fn kernel_opens(&self) -> bool {
        self.config.kernel_opens && self.read_only && self.objects.enabled()
    }

    /// Cache management (`crate::manage`) over this mount's nodes and objects.
    pub(crate) fn manager(&self) -> CacheManager<'_> {
        CacheManager::new(&self.nodes, &self.objects)
    }

    // Nodes and the handles the origin knows them by.

    pub(crate) fn node(&self, ino: Ino) -> FsResult<Arc<Node>> {
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

    /// The directory node `parent` (`ENOTDIR` if it is not one).
    pub(crate) fn dir(&self, parent: Ino) -> FsResult<Arc<Node>> {
        let dir = self.node(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        Ok(dir)
    }

    /// The names leading from the root to directory `ino`, as this client last saw them.
    pub(crate) fn components_of(&self, ino: Ino) -> Option<Vec<Vec<u8>>> {
        let mut parts = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                parts.reverse();
                return Some(parts);
            }
            let n = self.nodes.get(cur)?;
            let st = n.state.lock();
            parts.push(st.name().to_vec());
            cur = st.parent();
        }
        None
    }

    /// Runs `op` with the node's handle; if the origin says the handle is stale (server
    /// restarted or handle forgotten), resolves the node's name again and retries once.
    pub(crate) fn with_handle<T>(
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

    // Names and attributes: answered from what is known while it is fresh, from the
    // origin otherwise; what the origin answers is recorded here.

    /// Resolves `name` in directory `parent`; counts one kernel lookup on success. Returns
    /// the node, its attributes and how long the kernel may cache them.
    pub(crate) fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<NodeEntry> {
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
            return self
                .listed_child(&dir, name)
                .ok_or_else(|| WireError::NotFound.into());
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
            Ok(e) if self.moved_elsewhere(&e, parent, name) => Err(WireError::NotFound.into()),
            Ok(e) => {
                let ListedNode { ino, ttl, attr } =
                    self.remember(parent, name, &e, dir_id, since, None);
                // Used by path: listed in the background, so that it can take offline
                // names (`crate::offline::lister`).
                if let Some(l) = &self.lister
                    && dir.state.lock().last_listing().is_none()
                {
                    l.want(parent);
                }
                Ok(NodeEntry { ino, attr, ttl })
            }
            Err(FsError::Offline(why)) => {
                // Serve the name from what we saw while connected.
                let (child, listed) = {
                    let st = dir.state.lock();
                    (st.child(name), st.last_listing().is_some())
                };
                // A name the kept listing holds, never looked up: known from the listing.
                // With offline writes, one missing from it is absent (as the listing
                // shows), so that it can be created.
                if child.is_none()
                    && listed
                    && let Some(e) = self.listed_child(&dir, name)
                {
                    return Ok(e);
                }
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

    /// Records (`parent`, `name`) → `e` learned after break number `since`; the callback
    /// needs both the entry's object and the directory (`dir_id`) unbroken since then.
    pub(crate) fn remember(
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

    /// `name` in directory `dir` as its kept listing has it (a name listed but never
    /// looked up, e.g. by the background lister), recorded as a lookup would record it
    /// (one kernel lookup counted); `None` if the listing does not hold it.
    fn listed_child(&self, dir: &Node, name: &[u8]) -> Option<NodeEntry> {
        let listing = dir.state.lock().last_listing()?;
        let e = listing.entries.iter().find(|e| e.name == name)?;
        let ListedNode { ino, ttl, attr } = self.remember_entry(dir.ino, &listing, e);
        Some(NodeEntry { ino, attr, ttl })
    }

    /// Records that a listing entry was handed to the kernel with its attributes
    /// (readdirplus), counting one kernel lookup; returns its node and kernel TTL.
    pub(crate) fn remember_entry(&self, dir: Ino, listing: &Listing, e: &DirEntry) -> ListedNode {
        let dir_id = self
            .nodes
            .get(dir)
            .map_or(0, |d| d.state.lock().attr().file_id);
        self.remember(
            dir,
            &e.name,
            &e.entry,
            dir_id,
            listing.since,
            Some(listing.fetched),
        )
    }

    /// Target of symlink `ino`.
    pub(crate) fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let node = self.node(ino)?;
        if let Some(t) = self.offline_target(&node) {
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

    /// `HoardFs::getattr` of a node already looked up.
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

    /// Close-to-open: the attributes the node had, and its current ones, checked with the
    /// origin unless it holds a callback for them. The breaks that arrived before are
    /// applied first (`Callbacks::caught_up`, before the node's lock is taken): one that
    /// ended the callback must not be overtaken by this open.
    pub(crate) fn validated_attr(&self, node: &Node) -> FsResult<Revalidated> {
        let caught_up = self.callbacks.caught_up();
        let (before, valid) = {
            let st = node.state.lock();
            let trusted = caught_up && st.has_callback() && st.attr_fresh(&self.config);
            (st.attr(), trusted)
        };
        let now = if valid {
            before
        } else {
            self.refresh_attr(node)?.attr
        };
        Ok(Revalidated { before, now })
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

    /// Stores fresh attributes of `node` (fetched after break number `since`).
    pub(crate) fn install_attr(&self, node: &Node, attr: Attr, since: u64) -> NodeAttr {
        let mut st = node.state.lock();
        st.install_attr(attr, self.grant(attr.file_id, since));
        NodeAttr {
            // As this client shows them (a hidden name is not a link).
            attr: st.as_shown(attr),
            ttl: st.kernel_ttl(&self.config),
        }
    }

    /// Whether attributes fetched after break number `since` come with a callback.
    fn grant(&self, file_id: u64, since: u64) -> bool {
        self.callbacks.grants(file_id, since)
    }

    /// A lock on `node` was just granted: what other clients wrote before releasing it
    /// must be seen, whatever callback breaks are still on their way (as NFS does at lock
    /// time). Its attributes are fetched again, and reads through the files already open
    /// go to the cached object of that version (the object is compared, not the node's
    /// attributes: an open racing a write of another process may have installed the
    /// object of an older version after the write's reply moved the attributes on). The
    /// kernel drops the file's pages either way: a page read in whole for a partial write
    /// of another process may hold bytes another client changed since, under a version
    /// this client has caught up with through its own write's reply. (A read-only open in
    /// passthrough mode keeps reading its version: see SEMANTICS.md.)
    /// `granted` is what the origin answered the grant with, read after it (breaks from
    /// number `since` on count against a callback); without it the attributes are asked
    /// for.
    pub(crate) fn revalidate_locked(&self, node: &Node, granted: Option<Attr>, since: u64) {
        let before = node.state.lock().attr().version;
        let fresh = match granted {
            Some(a) => Ok(self.install_attr(node, a, since)),
            None => self.refresh_attr(node),
        };
        match fresh {
            Ok(now) => {
                let a = now.attr;
                let mut st = node.state.lock();
                if a.version != before {
                    st.contents_changed();
                }
                let stale = st
                    .opens
                    .object()
                    .is_some_and(|o| (o.shape().version, o.shape().size) != (a.version, a.size));
                if stale {
                    self.objects
                        .replace_object(&mut st, a.file_id, a.version, a.size);
                }
            }
            Err(e) => tracing::debug!(ino = node.ino, "revalidating a locked file: {e}"),
        }
        if let Some(n) = self.notifier() {
            n.inval_inode(node.ino);
        }
    }

    /// Forgets a node's attributes (the next getattr asks the origin).
    pub(crate) fn expire_attr(&self, node: &Node) {
        node.state.lock().expire();
    }

    /// A directory's content changed through this client (its kept listing has the
    /// change, but is out of date: asked for again while the origin is reachable).
    pub(crate) fn dir_changed(&self, dir: &Node) {
        let dir_id = {
            let mut st = dir.state.lock();
            st.contents_changed();
            st.attr().file_id
        };
        self.trees.forget(dir_id);
    }
}

// Work of the mount's background threads, which hold a `Weak` of the superblock.
impl Superblock {
    /// Handles breaks (on the callback thread): clears callbacks and tells the kernel.
    pub(crate) fn apply_breaks(&self, breaks: Vec<hoardfs_origin::Break>) {
        let notifier = self.notifier.get().map(|n| &**n);
        crate::callbacks::BreakApplier::new(
            &self.nodes,
            &self.trees,
            self.offline.as_ref(),
            notifier,
        )
        .apply(breaks);
    }

    /// Once names no longer wait to be sent back, the name breaks put off meanwhile are
    /// applied (see `HoardFs::settle_names`).
    pub(crate) fn settle_names(&self) {
        let Some(off) = &self.offline else { return };
        if off.log.names_pending() {
            return;
        }
        let breaks = off.take_skipped();
        if !breaks.is_empty() {
            self.apply_breaks(breaks);
        }
    }

    /// Fetches every missing chunk of file `ino` (current version) into the disk cache.
    pub(crate) fn prefetch(&self, ino: Ino) -> FsResult<crate::Prefetched> {
        self.fetcher.prefetch(self, ino)
    }
}

// Who may open what (`crate::access`: the rule and the answers kept).
impl Superblock {
    /// Whether the ambient caller may access `node` (attributes `attr`) for `mask`
    /// (`MAY_READ` | `MAY_WRITE` | `MAY_EXEC`) as the server would decide; `Access` if not.
    pub(crate) fn may_access(&self, node: &Node, attr: &Attr, mask: u32) -> FsResult<()> {
        let identities = self.origin.identities();
        let Identities::Callers(map) = &*identities else {
            return Ok(());
        };
        let claim = caller::current();
        if !attr.acl {
            // (Asked at every open: decided without building the mapped identity.)
            let allowed = map.may_for(&claim, attr.kind, attr.perm, attr.uid, attr.gid, mask);
            return refused_unless(allowed);
        }
        let key = map.map(&claim).key();
        if let Some(allowed) = node.state.lock().access.get(key, mask) {
            return refused_unless(allowed);
        }
        let handle = node.handle();
        let answer = self.origin.access(handle, mask & 7);
        let allowed = match answer {
            Ok(()) => true,
            Err(hoardfs_origin::OriginError::Fs(
                WireError::Access | WireError::NotPermitted | WireError::ReadOnly,
            )) => false,
            Err(e) if e.is_offline() => {
                tracing::debug!(
                    ino = node.ino,
                    "cannot ask the server about an object with an ACL: refused"
                );
                return Err(WireError::Access.into());
            }
            Err(e) => return Err(e.into()),
        };
        node.state.lock().access.record(key, mask, allowed);
        refused_unless(allowed)
    }
}

/// `Ok`, or the refusal of an access.
fn refused_unless(allowed: bool) -> FsResult<()> {
    if allowed {
        Ok(())
    } else {
        Err(FsError::Origin(WireError::Access))
    }
}

/// The lister of a mount with offline writes: its thread lists each queued directory as a
/// `readdir` would, until the superblock is gone.
fn start_lister(weak: std::sync::Weak<Superblock>) -> Option<Lister> {
    let list = move |ino| {
        let Some(sb) = weak.upgrade() else {
            return false;
        };
        if let Err(e) = sb.listing(ino) {
            tracing::debug!(ino, "background listing failed: {e}");
        }
        true
    };
    Lister::new(list)
        .map_err(|e| tracing::warn!("cannot start the directory lister: {e}"))
        .ok()
}
