//! The disk cache as the file system uses it: which cached object belongs to a file node
//! (one per file, for the version the node's opens read), and the keys of this export's
//! files. The rule "a node's object is of the version it was asked for, or there is none"
//! lives here: an object of another version is replaced, and retired so that writes
//! through it can never touch the newer record.
//!
//! A node keeps its object after its last close (a reopen, the hot path, then costs no
//! disk I/O and reuses the passthrough registration), but only the [`IDLE_OBJECTS`]
//! most recently closed nodes do: each object holds two descriptors, and a tree of tens of
//! thousands of files read once must not run the process out of them.
//!
//! Lock ordering: a node's `state` lock is held across the creation of its object (disk
//! I/O), so that two opens of a changed file cannot both replace its data file; the cache
//! store's locks are taken under it (see `hoardfs_cache`), never the reverse. The idle
//! queue's lock is a leaf (nodes are locked after it is released).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use hoardfs_cache::{CacheDir, CachedObject, ObjectKey, ObjectShape};
use hoardfs_origin::{DirEntry, FileKind};

use crate::nodes::{Listing, Node, NodeState};

use crate::Ino;
use crate::stats::Stats;
use crate::{CacheFault, FsResult, WARM_PER_LISTING};

/// Closed nodes that may keep their object: at most this many (two descriptors each).
pub(crate) const IDLE_OBJECTS: usize = 4096;

/// The mount's disk cache (if it has one) and its export's keys.
pub(crate) struct Objects {
    cache: Option<CacheDir>,
    export_id: u128,
    stats: Arc<Stats>,
    /// Nodes closed with their object kept.
    idle: Mutex<Idle>,
}

/// The nodes closed with their object kept, in the order of their latest close. A node
/// closed again moves to the back (its earlier place in the queue is skipped when it comes
/// up), so a file opened and closed over and over keeps its object (and its passthrough
/// registration) however many closes there are; one opened again since it was closed is
/// re-checked when it leaves.
#[derive(Default)]
struct Idle {
    /// Closes, oldest first.
    queue: VecDeque<Close>,
    /// The number of each idle node's latest close (one per node: the bound counts these).
    latest: HashMap<Ino, u64>,
    closes: u64,
}

/// One close of a node that kept its object.
struct Close {
    ino: Ino,
    node: Weak<Node>,
    /// The number of the close (`Idle::closes` then).
    seq: u64,
}

impl Idle {
    /// Records that `node` was closed; returns the node that must let go of its object,
    /// if more than [`IDLE_OBJECTS`] nodes are idle.
    fn closed(&mut self, node: &Arc<Node>) -> Option<Arc<Node>> {
        self.closes += 1;
        self.latest.insert(node.ino, self.closes);
        self.queue.push_back(Close {
            ino: node.ino,
            node: Arc::downgrade(node),
            seq: self.closes,
        });
        let mut victim = None;
        while self.latest.len() > IDLE_OBJECTS {
            let Some(close) = self.queue.pop_front() else {
                break;
            };
            if self.latest.get(&close.ino) != Some(&close.seq) {
                continue; // closed again later: its later place counts
            }
            self.latest.remove(&close.ino);
            if let Some(n) = close.node.upgrade() {
                victim = Some(n);
                break;
            }
        }
        if self.queue.len() > 2 * self.latest.len() + 1024 {
            let latest = &self.latest;
            self.queue.retain(|c| latest.get(&c.ino) == Some(&c.seq));
        }
        victim
    }
}

impl Objects {
    /// Objects of export `export_id` in `cache` (`None`: no disk cache).
    pub(crate) fn new(cache: Option<CacheDir>, export_id: u128, stats: Arc<Stats>) -> Objects {
        Objects {
            cache,
            export_id,
            stats,
            idle: Mutex::new(Idle::default()),
        }
    }

    /// `node` was closed for good (nothing has it open) and keeps its object: past
    /// [`IDLE_OBJECTS`] such nodes, the one closed longest ago lets go of its object,
    /// unless it was opened again.
    pub(crate) fn closed(&self, node: &Arc<Node>) {
        let oldest = self.idle.lock().closed(node);
        if let Some(n) = oldest {
            let mut st = n.state.lock();
            if !st.is_open() {
                st.opens.set_object(None);
            }
        }
    }

    /// Whether the mount has a disk cache.
    pub(crate) fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// The disk cache, or an error if the mount has none.
    pub(crate) fn dir(&self) -> FsResult<&CacheDir> {
        self.cache.as_ref().ok_or(CacheFault::NoCache.into())
    }

    /// The disk cache, if any.
    pub(crate) fn dir_if_any(&self) -> Option<&CacheDir> {
        self.cache.as_ref()
    }

    /// The key of file `file_id` in the disk cache.
    pub(crate) fn key(&self, file_id: u64) -> ObjectKey {
        ObjectKey {
            export_id: self.export_id,
            file_id,
        }
    }

    /// Whether `key` is one of this export's.
    pub(crate) fn is_ours(&self, key: &ObjectKey) -> bool {
        key.export_id == self.export_id
    }

    /// The cached object for this version of the file, replacing (retiring) an object of
    /// another version. `None` without a cache, or if the cache cannot hold it.
    pub(crate) fn object_for(
        &self,
        node: &Node,
        file_id: u64,
        version: u64,
        size: u64,
    ) -> Option<Arc<CachedObject>> {
        self.cache.as_ref()?;
        // Held across the object's creation so that two opens of a changed file cannot
        // both replace its data file (one would then write into a file the other deleted).
        let mut st = node.state.lock();
        if let Some(o) = st.opens.object()
            && let ObjectShape {
                version: v,
                size: s,
                ..
            } = o.shape()
            && (v, s) == (version, size)
        {
            return Some(o.clone());
        }
        self.replace_object(&mut st, file_id, version, size)
    }

    /// Makes the cache's object for this version the node's (the caller holds the node's
    /// state lock across it), retiring the one it replaces: writes through that one are
    /// then ignored, so they can never touch the newer record. If the cache cannot hold
    /// it, the node keeps no object (one of another version must not be read).
    pub(crate) fn replace_object(
        &self,
        st: &mut NodeState,
        file_id: u64,
        version: u64,
        size: u64,
    ) -> Option<Arc<CachedObject>> {
        let cache = self.cache.as_ref()?;
        let fresh = match cache.object(self.key(file_id), version, size) {
            Ok(o) => Some(o),
            Err(e) => {
                tracing::warn!("cannot cache file {file_id:#x}: {e}");
                Stats::add(&self.stats.cache_errors, 1);
                None
            }
        };
        if let Some(old) = st.opens.set_object(fresh.clone())
            && !fresh.as_ref().is_some_and(|f| Arc::ptr_eq(&old, f))
        {
            old.retire();
        }
        fresh
    }

    /// Has the disk cache read ahead the records of the listed files it holds, in name
    /// order (the order most programs open a directory's files in), at most
    /// [`WARM_PER_LISTING`] of them.
    pub(crate) fn warm_listed(&self, listing: &Listing) {
        let Some(cache) = &self.cache else {
            return;
        };
        let mut files: Vec<&DirEntry> = listing
            .entries
            .iter()
            .filter(|e| e.entry.attr.kind == FileKind::File)
            .collect();
        files.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        cache.warm(
            files
                .iter()
                .take(WARM_PER_LISTING)
                .map(|e| self.key(e.entry.attr.file_id)),
        );
    }

    /// Closes the disk cache in order (at unmount).
    pub(crate) fn close(&self) {
        if let Some(c) = &self.cache
            && let Err(e) = c.close()
        {
            tracing::warn!("{e}; the cache will be verified on next use");
        }
    }
}
