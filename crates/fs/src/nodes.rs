//! The inode table: FUSE inode numbers ↔ origin objects, with cached attributes, the
//! kernel's lookup counts, the names they were found under (to re-resolve a handle after a
//! server restart) and per-file open state. How far attributes and listings are trusted is
//! `crate::freshness`; a directory's listing and names seen are `crate::dirs`; a file's
//! object, opens and passthrough registration are `crate::opens`; all change only through
//! [`NodeState`]'s methods.
//!
//! Lock ordering: the table lock (`NodeTable::inner`) may be taken before a node's `state`
//! lock, never the other way round. Neither is held across origin round trips.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hoardfs_origin::{Attr, FileKind, Handle};
use parking_lot::{Condvar, Mutex, MutexGuard, RwLock};

use crate::FsConfig;
use crate::dirs::DirState;
pub use crate::dirs::Listing;
use crate::freshness::Freshness;
use crate::offline::cml::LocalChange;
use crate::opens::OpenState;

use crate::{Ino, ROOT_INO};

/// Mutable state of one node.
pub struct NodeState {
    /// Current origin handle.
    handle: Handle,
    /// Last attributes seen.
    attr: Attr,
    /// When `attr` was installed (a listing fetched before that has older ones).
    attr_at: std::time::Instant,
    /// How far `attr` (and `listing`) can be trusted; under a callback the origin also
    /// reports changes to a directory's names.
    freshness: Freshness,
    /// Parent inode and the name this node was last found under.
    parent: Ino,
    /// Name within `parent`.
    name: Vec<u8>,
    /// Kernel lookup count.
    lookups: u64,
    /// Listing and names seen (directories only: made at the first use, so that a file's
    /// node does not carry one).
    dir: Option<Box<DirState>>,
    /// Cached object, opens and passthrough registration (regular files).
    pub(crate) opens: OpenState,
    /// The origin no longer has the object (its last name was removed elsewhere while it
    /// was open here): see [`NodeState::mark_deleted`].
    deleted: bool,
    /// Its last name was removed here while it was open, and it lives on under a hidden
    /// name (`crate::unlinked`): the link count reported leaves that name out, so `fstat`
    /// says 0 as it would on a local file system.
    unlinked_here: bool,
    /// Changed here while the origin was unreachable and not yet sent back
    /// (`--offline-writes`): its content, name or attributes (what it sets overrides the
    /// origin's).
    local: Option<Box<LocalChange>>,
    /// The cached copy was whole before writes it could not follow: fetched again when
    /// the writer closes the file.
    refetch: bool,
    /// A symlink's target as last read or made (served while the origin is unreachable;
    /// a symlink's target never changes: a new one is a new object).
    target: Option<Vec<u8>>,
    /// The server's access answers for this object, by identity (`crate::access`);
    /// forgotten when its permissions may have changed.
    pub(crate) access: crate::access::Answers,
}

impl NodeState {
    /// Last attributes seen, with the local size and mtime of a file changed offline, and
    /// without the hidden name of a file unlinked here while open.
    pub fn attr(&self) -> Attr {
        self.as_shown(self.attr_with_change())
    }

    /// `a`, attributes of this node's object, as this client shows them: a hidden name
    /// it keeps an unlinked open file under is not a link.
    pub(crate) fn as_shown(&self, mut a: Attr) -> Attr {
        if self.unlinked_here {
            a.nlink = a.nlink.saturating_sub(1);
        }
        a
    }

    /// Last attributes seen, with the local size and mtime of a file changed offline.
    fn attr_with_change(&self) -> Attr {
        let Some(l) = self.local.as_deref().copied() else {
            return self.attr;
        };
        let mut a = self.attr;
        if let Some(perm) = l.perm {
            a.perm = perm;
        }
        if let Some(t) = l.atime {
            a.atime = t;
        }
        if let Some(m) = l.mtime {
            let t = m.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            a.mtime = hoardfs_proto::Timestamp {
                secs: t.as_secs() as i64,
                nanos: t.subsec_nanos(),
            };
            a.ctime = a.mtime;
        }
        if let Some(size) = l.size {
            a.size = size;
            a.blocks = size.div_ceil(512);
            let t = l
                .mtime
                .and_then(|m| m.duration_since(std::time::UNIX_EPOCH).ok())
                .unwrap_or_default();
            // Not the origin's version, and a new one with every local change of the
            // content.
            a.version = xxhash_rust::xxh3::xxh3_64(
                &[
                    self.attr.version.to_le_bytes(),
                    size.to_le_bytes(),
                    (t.as_nanos() as u64).to_le_bytes(),
                ]
                .concat(),
            );
        }
        a
    }

    /// The attributes as the origin last reported them (without a local change).
    pub fn origin_attr(&self) -> Attr {
        self.attr
    }

    /// Whether the file's content is a change not yet sent back to the origin (staged
    /// here).
    pub fn is_local(&self) -> bool {
        self.local.as_ref().is_some_and(|l| l.size.is_some())
    }

    /// Whether the object has any change not yet sent back (content, name or attributes).
    pub fn has_change(&self) -> bool {
        self.local.is_some()
    }

    /// The file is to be fetched again when its writer closes it.
    pub(crate) fn refetch_at_close(&mut self) {
        self.refetch = true;
    }

    /// Whether the file is to be fetched again now (and no longer).
    pub(crate) fn take_refetch(&mut self) -> bool {
        std::mem::take(&mut self.refetch)
    }

    /// Keeps symlink target `t`.
    pub(crate) fn keep_target(&mut self, t: &[u8]) {
        self.target = Some(t.to_vec());
    }

    /// The symlink target kept, if any.
    pub(crate) fn kept_target(&self) -> Option<Vec<u8>> {
        self.target.clone()
    }

    /// Whether the origin holds a callback for the attributes.
    pub(crate) fn has_callback(&self) -> bool {
        self.freshness.has_callback()
    }

    /// Whether the attributes can be used without asking the origin.
    pub(crate) fn attr_fresh(&self, config: &FsConfig) -> bool {
        self.freshness.attr_fresh(config)
    }

    /// How long the kernel may keep the attributes and names.
    pub(crate) fn kernel_ttl(&self, config: &FsConfig) -> Duration {
        self.freshness.kernel_ttl(config)
    }

    /// Replaces the attributes. The one rule for listings: a listing is kept only while
    /// the directory's version and size stay those it was seen with.
    fn set_attr(&mut self, attr: Attr) {
        if (self.attr.version != attr.version || self.attr.size != attr.size)
            && let Some(d) = &mut self.dir
        {
            d.drop_listing();
        }
        // An ACL change moves the ctime, as does any change of mode or owner.
        let a = &self.attr;
        if (a.ctime, a.perm, a.uid, a.gid, a.acl)
            != (attr.ctime, attr.perm, attr.uid, attr.gid, attr.acl)
        {
            self.access.clear();
        }
        self.attr = attr;
        self.attr_at = std::time::Instant::now();
    }

    /// Attributes just fetched from the origin, under a callback if `callback`.
    pub(crate) fn install_attr(&mut self, attr: Attr, callback: bool) {
        self.set_attr(attr);
        self.freshness = Freshness::fetched(callback);
    }

    /// The node's object was found (by a lookup or listing, or as what a change sent back
    /// became) with `handle` and `attr`, under a callback if `callback`.
    fn found(&mut self, handle: Handle, attr: Attr, callback: bool) {
        self.handle = handle;
        self.install_attr(attr, callback);
    }

    /// The object's name was found leading to a link with attributes `attr`. A link's
    /// content never changes, and its mtime only when it is made or set (a set through
    /// this client is in the node already): a link with another mtime may be another one
    /// given the same inode number, whose target the kept one is not.
    fn drop_target_unless_same_link(&mut self, attr: &Attr) {
        if attr.kind == FileKind::Symlink && attr.mtime != self.attr.mtime {
            self.target = None;
        }
    }

    /// The change made here that overrides the origin's attributes (`None`: none).
    fn set_local(&mut self, change: Option<LocalChange>) {
        self.local = change.map(Box::new);
    }

    /// A new handle (and the attributes that came with it) found by re-resolving the
    /// node's name: see [`Freshness::renew_without_callback`].
    pub(crate) fn resolved(&mut self, handle: Handle, attr: Attr) {
        self.handle = handle;
        self.set_attr(attr);
        self.freshness.renew_without_callback();
    }

    /// The attributes are out of date (the callback is gone); a listing is kept, to be
    /// served while the origin is unreachable.
    pub(crate) fn expire(&mut self) {
        self.freshness.expire();
    }

    /// The object changed in a way that makes both attributes and listing out of date.
    pub(crate) fn contents_changed(&mut self) {
        self.freshness.expire();
        if let Some(d) = &mut self.dir {
            d.drop_listing();
        }
    }

    /// The cached listing, if it can be reused without asking the origin.
    pub(crate) fn fresh_listing(&self, config: &FsConfig) -> Option<Arc<Listing>> {
        self.dir
            .as_ref()?
            .listing()
            .filter(|l| self.freshness.listing_fresh(l.fetched, config))
            .cloned()
    }

    /// The cached listing whatever its age, even out of date (served while the origin is
    /// unreachable).
    pub(crate) fn last_listing(&self) -> Option<Arc<Listing>> {
        self.dir.as_ref()?.last().cloned()
    }

    /// Keeps a freshly fetched listing.
    pub(crate) fn keep_listing(&mut self, listing: Arc<Listing>) {
        self.dir_mut().keep_listing(listing);
    }

    /// How many names were made or removed through this client so far, and how many
    /// listings were kept (a listing fetched across either is not kept:
    /// `Superblock::listing`).
    pub(crate) fn local_edits(&self) -> (u64, u64) {
        self.dir.as_ref().map_or((0, 0), |d| (d.edits(), d.kept()))
    }

    /// A name made here (through the origin, or while it is unreachable): listed and
    /// looked up from now on (the kept listing, if any, gains the entry).
    pub(crate) fn add_local_entry(&mut self, entry: hoardfs_origin::DirEntry, ino: Ino) {
        let d = self.dir_mut();
        d.edited();
        d.add_child(&entry.name, ino);
        d.patch_listing(|entries| {
            entries.retain(|e| e.name != entry.name);
            entries.push(entry);
        });
    }

    /// A name removed here (through the origin, or while it is unreachable): gone from
    /// the names seen and from the kept listing.
    pub(crate) fn remove_local_entry(&mut self, name: &[u8]) {
        let d = self.dir_mut();
        d.edited();
        d.remove_child(name);
        d.patch_listing(|entries| entries.retain(|e| e.name != name));
    }

    /// Its last name was removed here while it was open: it is kept under a hidden name
    /// until closed (`crate::unlinked`), which the link count no longer counts.
    pub(crate) fn mark_unlinked_here(&mut self) {
        self.unlinked_here = true;
    }

    /// Whether the origin no longer has the object (set by `mark_deleted`).
    pub fn is_deleted(&self) -> bool {
        self.deleted
    }

    /// The origin released the object while it is open here: from now on its attributes
    /// are the last ones seen with a link count of zero, and nothing is asked of the
    /// origin about it.
    pub(crate) fn mark_deleted(&mut self) {
        self.deleted = true;
        self.attr.nlink = 0;
    }

    /// Whether any open file refers to this node.
    pub fn is_open(&self) -> bool {
        self.opens.is_open()
    }

    /// Current origin handle.
    pub fn handle(&self) -> Handle {
        self.handle
    }

    /// A new origin handle for the same object (the root's after a server restart).
    pub(crate) fn set_handle(&mut self, handle: Handle) {
        self.handle = handle;
    }

    /// The parent inode this node was last found in.
    pub fn parent(&self) -> Ino {
        self.parent
    }

    /// The name this node was last found under.
    pub fn name(&self) -> &[u8] {
        &self.name
    }

    /// The node now has name `name` in `parent` (a rename through this client).
    pub(crate) fn moved(&mut self, parent: Ino, name: &[u8]) {
        self.parent = parent;
        self.name = name.to_vec();
    }

    /// The kernel learned of the node once more (a lookup, or an entry with attributes).
    pub(crate) fn count_lookup(&mut self) {
        self.lookups += 1;
    }

    /// The kernel forgot `n` of its lookups.
    fn forget_lookups(&mut self, n: u64) {
        self.lookups = self.lookups.saturating_sub(n);
    }

    /// Whether neither the kernel nor an open file references the node.
    pub(crate) fn is_idle(&self) -> bool {
        self.lookups == 0 && !self.is_open()
    }

    /// The node of `name` in this directory, as last seen.
    pub(crate) fn child(&self, name: &[u8]) -> Option<Ino> {
        self.dir.as_ref()?.child(name)
    }

    /// This directory's `name` refers to node `ino`.
    pub(crate) fn add_child(&mut self, name: &[u8], ino: Ino) {
        self.dir_mut().add_child(name, ino);
    }

    /// This directory no longer has `name`.
    pub(crate) fn remove_child(&mut self, name: &[u8]) {
        if let Some(d) = &mut self.dir {
            d.remove_child(name);
        }
    }

    /// Keeps only the names `listed` holds.
    pub(crate) fn retain_children(&mut self, listed: &std::collections::HashSet<&[u8]>) {
        if let Some(d) = &mut self.dir {
            d.retain_children(listed);
        }
    }

    /// The directory's state, made at its first use.
    fn dir_mut(&mut self) -> &mut DirState {
        self.dir.get_or_insert_with(Default::default)
    }
}

/// One node.
pub struct Node {
    /// Inode number.
    pub ino: Ino,
    /// Kind (never changes).
    pub kind: FileKind,
    /// Mutable state.
    pub state: Mutex<NodeState>,
    /// Signalled (with `state`) when an open of the node is released.
    pub(crate) released: Condvar,
}

impl Node {
    /// Current handle.
    pub fn handle(&self) -> Handle {
        self.state.lock().handle()
    }
}

/// Nodes the kernel has forgotten are kept (their names and attributes answer lookups while
/// the origin is unreachable) until the table holds more than this many nodes.
const MAX_NODES: usize = 250_000;

#[derive(Default)]
struct Inner {
    /// Files changed offline, by file id: their nodes (now or when made) carry it.
    local: HashMap<u64, LocalChange>,
    nodes: HashMap<Ino, Arc<Node>>,
    by_file_id: HashMap<u64, Ino>,
    /// Forgotten nodes, oldest first (entries may be stale: re-checked before removal).
    idle: std::collections::VecDeque<Ino>,
    next_ino: Ino,
}

/// Threads waiting on nodes' `released` condition for something their releases end: at
/// most `max` at once (each holds a FUSE thread, and the releases need one; beyond, a
/// caller does not wait at all), each for at most `limit`.
#[derive(Debug)]
pub(crate) struct ReleaseWaits {
    waiting: AtomicUsize,
    max: usize,
    limit: Duration,
}

impl ReleaseWaits {
    /// At most `max` waiters, each for at most `limit`.
    pub(crate) const fn new(max: usize, limit: Duration) -> ReleaseWaits {
        ReleaseWaits {
            waiting: AtomicUsize::new(0),
            max,
            limit,
        }
    }

    /// Waits on `node`'s releases while `must_wait` holds (`st`: its state, locked; let
    /// go while waiting).
    pub(crate) fn wait(
        &self,
        node: &Node,
        st: &mut MutexGuard<'_, NodeState>,
        must_wait: impl Fn(&NodeState) -> bool,
    ) {
        if self.waiting.fetch_add(1, Ordering::SeqCst) < self.max {
            let deadline = std::time::Instant::now() + self.limit;
            while must_wait(st) {
                if node.released.wait_until(st, deadline).timed_out() {
                    break;
                }
            }
        }
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Threads waiting now (for tests).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Counts `n` more waiters (for tests).
    #[cfg(test)]
    pub(crate) fn occupy(&self, n: usize) {
        self.waiting.fetch_add(n, Ordering::SeqCst);
    }
}

/// All nodes the kernel knows.
pub struct NodeTable {
    inner: RwLock<Inner>,
}

impl NodeTable {
    /// A table holding only the root.
    pub fn new(root_handle: Handle, root_attr: Attr) -> Self {
        let table = NodeTable {
            inner: RwLock::new(Inner {
                next_ino: ROOT_INO + 1,
                ..Default::default()
            }),
        };
        let root = Self::make(ROOT_INO, root_handle, root_attr, ROOT_INO, Vec::new());
        // The kernel knows the root without a lookup.
        root.state.lock().count_lookup();
        let mut inner = table.inner.write();
        inner.by_file_id.insert(root_attr.file_id, ROOT_INO);
        inner.nodes.insert(ROOT_INO, root);
        drop(inner);
        table
    }

    /// A node numbered `ino`, in no table (for unit tests of the layers above nodes).
    #[cfg(test)]
    pub(crate) fn detached(ino: Ino, handle: Handle, attr: Attr) -> Arc<Node> {
        Self::make(ino, handle, attr, crate::ROOT_INO, Vec::new())
    }

    fn make(ino: Ino, handle: Handle, attr: Attr, parent: Ino, name: Vec<u8>) -> Arc<Node> {
        Arc::new(Node {
            ino,
            kind: attr.kind,
            state: Mutex::new(NodeState {
                handle,
                attr,
                attr_at: std::time::Instant::now(),
                freshness: Freshness::fetched(false),
                parent,
                name,
                lookups: 0,
                dir: None,
                opens: OpenState::default(),
                deleted: false,
                unlinked_here: false,
                local: None,
                refetch: false,
                target: None,
                access: Default::default(),
            }),
            released: Condvar::new(),
        })
    }

    /// A new node for origin object `attr.file_id` known as (`parent`, `name`), with the
    /// object's local change if it has one, in the table (whose lock the caller holds).
    fn add(inner: &mut Inner, handle: Handle, attr: Attr, parent: Ino, name: &[u8]) -> Arc<Node> {
        let ino = inner.next_ino;
        inner.next_ino += 1;
        let n = Self::make(ino, handle, attr, parent, name.to_vec());
        n.state
            .lock()
            .set_local(inner.local.get(&attr.file_id).copied());
        inner.by_file_id.insert(attr.file_id, ino);
        inner.nodes.insert(ino, n.clone());
        n
    }

    /// The node for `ino`.
    pub fn get(&self, ino: Ino) -> Option<Arc<Node>> {
        self.inner.read().nodes.get(&ino).cloned()
    }

    /// The node of origin object `file_id`, if known.
    pub fn by_file_id(&self, file_id: u64) -> Option<Arc<Node>> {
        let inner = self.inner.read();
        inner
            .by_file_id
            .get(&file_id)
            .and_then(|i| inner.nodes.get(i))
            .cloned()
    }

    /// Every node.
    pub fn all(&self) -> Vec<Arc<Node>> {
        self.inner.read().nodes.values().cloned().collect()
    }

    /// Records that the kernel learned of (`parent`, `name`) → object, creating the node if
    /// new, refreshing its handle and attributes, and counting one kernel lookup. `grant`
    /// decides, under the node's lock, whether the attributes come with a callback.
    /// `as_of`: when the attributes were seen, if not just now (a listing's entry): a
    /// known node with attributes installed since keeps those.
    pub fn remember(
        &self,
        parent: Ino,
        name: &[u8],
        handle: Handle,
        attr: Attr,
        as_of: Option<std::time::Instant>,
        grant: impl FnOnce(&Attr) -> bool,
    ) -> Arc<Node> {
        let (node, known) = {
            let mut inner = self.inner.write();
            let existing = inner
                .by_file_id
                .get(&attr.file_id)
                .and_then(|i| inner.nodes.get(i))
                .cloned();
            match existing {
                // (A deleted node's id may have gone to a new object: never reused.)
                Some(n) if n.kind == attr.kind && !n.state.lock().is_deleted() => (n, true),
                _ => (Self::add(&mut inner, handle, attr, parent, name), false),
            }
        };
        {
            let mut st = node.state.lock();
            if known {
                st.drop_target_unless_same_link(&attr);
            }
            if !known || as_of.is_none_or(|t| st.attr_at <= t) {
                st.found(handle, attr, grant(&attr));
            }
            // (A node moved here and not yet on the origin keeps this client's name.)
            if !known || !st.has_change() {
                st.moved(parent, name);
            }
            st.count_lookup();
        }
        if let Some(p) = self.get(parent) {
            p.state.lock().add_child(name, node.ino);
        }
        node
    }

    /// Adds a node saved by an earlier session (`crate::snapshot`): known under
    /// (`parent`, `name`), not referenced by the kernel (idle, so the table may drop it),
    /// its attributes expired. Returns `None` if `parent` is unknown or the object already
    /// has a node.
    pub fn restore(
        &self,
        parent: Ino,
        name: &[u8],
        handle: Handle,
        attr: Attr,
    ) -> Option<Arc<Node>> {
        let p = self.get(parent)?;
        let node = {
            let mut inner = self.inner.write();
            if inner.by_file_id.contains_key(&attr.file_id) {
                return None;
            }
            let n = Self::add(&mut inner, handle, attr, parent, name);
            inner.idle.push_back(n.ino);
            n
        };
        node.state.lock().expire();
        p.state.lock().add_child(name, node.ino);
        Some(node)
    }

    /// Records the local attributes of file `file_id` (changed offline), or forgets them
    /// (`None`: sent back); its node, if any, follows.
    pub fn set_local(&self, file_id: u64, change: Option<LocalChange>) {
        let node = {
            let mut inner = self.inner.write();
            match change {
                Some(c) => inner.local.insert(file_id, c),
                None => inner.local.remove(&file_id),
            };
            inner
                .by_file_id
                .get(&file_id)
                .and_then(|i| inner.nodes.get(i))
                .cloned()
        };
        if let Some(n) = node {
            n.state.lock().set_local(change);
        }
    }

    /// Node `ino`, known by this client's own id `local_id` (a file created offline), is
    /// now origin object `entry` (sent back): it answers to the origin's id and handle.
    pub fn rebind(&self, ino: Ino, local_id: u64, entry: &hoardfs_origin::Entry) {
        let node = {
            let mut inner = self.inner.write();
            if inner.by_file_id.get(&local_id) == Some(&ino) {
                inner.by_file_id.remove(&local_id);
            }
            inner.by_file_id.entry(entry.attr.file_id).or_insert(ino);
            inner.nodes.get(&ino).cloned()
        };
        let Some(n) = node else { return };
        let (parent, name) = {
            let mut st = n.state.lock();
            st.found(entry.handle, entry.attr, false);
            (st.parent(), st.name().to_vec())
        };
        // The kept listing of its directory names the origin's object from now on (a
        // listing served later must not make a node of the id and handle it had here).
        if let Some(p) = self.get(parent)
            && let Some(d) = &mut p.state.lock().dir
        {
            d.patch_listing(|entries| {
                for e in entries.iter_mut() {
                    if e.name == name && e.entry.attr.file_id == local_id {
                        e.entry = entry.clone();
                    }
                }
            });
        }
    }

    /// Forgets that `ino` is the node of `file_id` (its object is gone from the origin), so
    /// that an object later given the same id gets a node of its own.
    pub fn unbind_file_id(&self, ino: Ino, file_id: u64) {
        let mut inner = self.inner.write();
        if inner.by_file_id.get(&file_id) == Some(&ino) {
            inner.by_file_id.remove(&file_id);
        }
    }

    /// Drops `n` kernel lookups; true if the kernel now references the node no more. A
    /// node nobody references any more is kept for offline use and removed only when the
    /// table grows past its bound (never the root).
    pub fn forget(&self, ino: Ino, n: u64) -> bool {
        if ino == ROOT_INO {
            return false;
        }
        let mut inner = self.inner.write();
        let Some(node) = inner.nodes.get(&ino).cloned() else {
            return true;
        };
        {
            let mut st = node.state.lock();
            st.forget_lookups(n);
            if !st.is_idle() {
                return false;
            }
            // Release the cache files' descriptors (and the passthrough registration); the
            // object reopens on the next open.
            st.opens.set_object(None);
        }
        inner.idle.push_back(ino);
        while inner.nodes.len() > MAX_NODES {
            let Some(old) = inner.idle.pop_front() else {
                break;
            };
            let Some(n) = inner.nodes.get(&old).cloned() else {
                continue;
            };
            let st = n.state.lock();
            if st.is_idle() {
                let file_id = st.attr().file_id;
                drop(st);
                inner.nodes.remove(&old);
                if inner.by_file_id.get(&file_id) == Some(&old) {
                    inner.by_file_id.remove(&file_id);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link_attr(mtime: i64, ctime: i64) -> Attr {
        let t = |secs| hoardfs_origin::Timestamp { secs, nanos: 0 };
        Attr {
            file_id: 7,
            version: (mtime * 1000 + ctime) as u64,
            kind: FileKind::Symlink,
            perm: 0o777,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 2,
            blocks: 0,
            rdev: 0,
            blksize: 4096,
            atime: t(mtime),
            mtime: t(mtime),
            ctime: t(ctime),
            acl: false,
        }
    }

    #[test]
    fn a_links_kept_target_goes_when_its_id_comes_back_as_another_link() {
        let dir = Attr {
            kind: FileKind::Dir,
            file_id: 1,
            ..link_attr(1, 1)
        };
        let handle = Handle { epoch: 1, id: 7 };
        let t = NodeTable::new(Handle { epoch: 1, id: 1 }, dir);
        let ino = t
            .remember(ROOT_INO, b"a", handle, link_attr(10, 10), None, |_| false)
            .ino;
        let node = t.get(ino).unwrap();
        node.state.lock().keep_target(b"t1");
        let target = || node.state.lock().kept_target();
        // Its mtime set through this client (`touch -h`, `cp -a`): the same link.
        node.state.lock().install_attr(link_attr(20, 20), false);
        assert_eq!(target(), Some(b"t1".to_vec()));
        // Renamed (its ctime moves): the same link.
        t.remember(ROOT_INO, b"b", handle, link_attr(20, 30), None, |_| false);
        assert_eq!(target(), Some(b"t1".to_vec()));
        // Another link made with the same inode number.
        t.remember(ROOT_INO, b"c", handle, link_attr(40, 40), None, |_| false);
        assert_eq!(target(), None);
    }
}
