//! The handle table: maps wire [`Handle`]s to `O_PATH` descriptors of exported objects.
//!
//! Holding an `O_PATH` descriptor pins the object's identity, so a handle keeps naming the
//! same file across renames, and a deleted file stays readable and writable through it (it
//! reports a link count of zero), as a local open file would. The table is bounded: beyond
//! `cap` entries the oldest handles are forgotten, and clients holding them get `Stale` and
//! resolve the name again.

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use hoardfs_proto::{FileKind, Handle, WireError};
use parking_lot::Mutex;

/// One exported object known to the server.
#[derive(Debug)]
pub struct Node {
    /// `O_PATH | O_NOFOLLOW` descriptor of the object.
    pub fd: OwnedFd,
    /// Kind at the time it was opened (kinds never change for a live inode).
    pub kind: FileKind,
    /// Device and inode numbers.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// When data of this object was last read or written for a client: milliseconds since
    /// [`CLOCK`], plus one (0: never).
    last_io: AtomicU64,
    /// The mtime (nanoseconds since the epoch) this server last moved the file to
    /// (`outside`); 0: never.
    bumped_to: AtomicI64,
    /// A directory known to have an inotify watch (see `watch`), so that using it again
    /// costs no look at the watcher's table.
    watched: std::sync::atomic::AtomicBool,
}

/// The origin of [`Node`]'s I/O times.
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

impl Node {
    /// A node for the object open at `fd`.
    pub fn new(fd: OwnedFd, kind: FileKind, dev: u64, ino: u64) -> Node {
        Node {
            fd,
            kind,
            dev,
            ino,
            last_io: AtomicU64::new(0),
            bumped_to: AtomicI64::new(0),
            watched: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this directory is known to be watched.
    pub fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Relaxed)
    }

    /// Records that this directory is watched.
    pub fn set_watched(&self) {
        self.watched.store(true, Ordering::Relaxed);
    }

    /// The mtime this server last moved the file to (nanoseconds since the epoch; 0:
    /// never). Only changed under the file's write lock.
    pub fn bumped_to(&self) -> i64 {
        self.bumped_to.load(Ordering::Relaxed)
    }

    /// Records that the file's mtime was moved to `ns`.
    pub fn set_bumped_to(&self, ns: i64) {
        self.bumped_to.store(ns, Ordering::Relaxed);
    }

    /// Records that data of this object is being read or written for a client now.
    pub fn note_io(&self) {
        let ms = CLOCK.elapsed().as_millis() as u64 + 1;
        self.last_io.store(ms, Ordering::Relaxed);
    }

    /// Whether data of this object was read or written for a client less than `window`
    /// ago.
    pub fn io_within(&self, window: Duration) -> bool {
        match self.last_io.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let now = CLOCK.elapsed().as_millis() as u64 + 1;
                now.saturating_sub(at) < window.as_millis() as u64
            }
        }
    }
}

/// Id of the export root in every epoch.
pub const ROOT_ID: u64 = 1;

/// Bounded map from handle ids to nodes. Lock: one mutex, never held across system calls.
#[derive(Debug)]
pub struct HandleTable {
    epoch: u64,
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    by_id: HashMap<u64, Arc<Node>>,
    by_inode: HashMap<(u64, u64), u64>,
    order: VecDeque<u64>,
}

impl HandleTable {
    /// A table whose root handle refers to `root`.
    pub fn new(epoch: u64, cap: usize, root: Node) -> Self {
        let mut by_id = HashMap::new();
        let mut by_inode = HashMap::new();
        by_inode.insert((root.dev, root.ino), ROOT_ID);
        by_id.insert(ROOT_ID, Arc::new(root));
        HandleTable {
            epoch,
            cap: cap.max(16),
            inner: Mutex::new(Inner {
                by_id,
                by_inode,
                order: VecDeque::new(),
            }),
        }
    }

    /// Epoch of handles issued by this table.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The node a handle names, or `Stale`.
    pub fn get(&self, h: Handle) -> Result<Arc<Node>, WireError> {
        if h.epoch != self.epoch {
            return Err(WireError::Stale);
        }
        self.inner
            .lock()
            .by_id
            .get(&h.id)
            .cloned()
            .ok_or(WireError::Stale)
    }

    /// Registers a node (or finds the one already registered for the same inode) and
    /// returns its handle and the registered node.
    pub fn insert(&self, node: Node) -> (Handle, Arc<Node>) {
        let mut inner = self.inner.lock();
        if let Some(&id) = inner.by_inode.get(&(node.dev, node.ino))
            && let Some(existing) = inner.by_id.get(&id)
        {
            let h = Handle {
                epoch: self.epoch,
                id,
            };
            return (h, existing.clone());
        }
        // Random, not sequential: a handle names its object directly, without the search
        // permission of the directories above it, so one must not be guessable (only a
        // lookup the caller was allowed to make hands it out).
        let id = loop {
            let id = rand::random::<u64>();
            if id > ROOT_ID && !inner.by_id.contains_key(&id) {
                break id;
            }
        };
        let node = Arc::new(node);
        inner.by_inode.insert((node.dev, node.ino), id);
        inner.by_id.insert(id, node.clone());
        inner.order.push_back(id);
        // Ids whose handles were removed (`remove_inode`) stay queued until popped: a
        // create/unlink loop that never fills the table would grow the queue for ever.
        if inner.order.len() > 2 * inner.by_id.len() + 64 {
            let Inner { order, by_id, .. } = &mut *inner;
            order.retain(|id| by_id.contains_key(id));
        }
        while inner.by_id.len() > self.cap {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some(n) = inner.by_id.remove(&old) {
                inner.by_inode.remove(&(n.dev, n.ino));
            }
        }
        let h = Handle {
            epoch: self.epoch,
            id,
        };
        (h, node)
    }

    /// The node registered for inode (`dev`, `ino`), if any.
    pub fn by_inode(&self, dev: u64, ino: u64) -> Option<Arc<Node>> {
        let inner = self.inner.lock();
        let id = inner.by_inode.get(&(dev, ino))?;
        inner.by_id.get(id).cloned()
    }

    /// Every node whose data was read or written less than `window` ago (a snapshot).
    pub fn used_within(&self, window: Duration) -> Vec<Arc<Node>> {
        let inner = self.inner.lock();
        inner
            .by_id
            .values()
            .filter(|n| n.io_within(window))
            .cloned()
            .collect()
    }

    /// Forgets the handle of inode (`dev`, `ino`); returns its id if it had one.
    pub fn remove_inode(&self, dev: u64, ino: u64) -> Option<u64> {
        let mut inner = self.inner.lock();
        let id = inner.by_inode.remove(&(dev, ino))?;
        inner.by_id.remove(&id);
        Some(id)
    }

    /// Every directory currently registered (a snapshot; the lock is released on return).
    pub fn dirs(&self) -> Vec<Arc<Node>> {
        self.inner
            .lock()
            .by_id
            .values()
            .filter(|n| n.kind == FileKind::Dir)
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node_for(ino: u64) -> Node {
        let fd = OwnedFd::from(std::fs::File::open("/").unwrap());
        Node::new(fd, FileKind::File, 1, ino)
    }

    #[test]
    fn handles_removed_after_use_do_not_pile_up_in_the_eviction_queue() {
        let t = HandleTable::new(7, 1000, node_for(1));
        for ino in 2..20_000u64 {
            t.insert(node_for(ino));
            assert!(t.remove_inode(1, ino).is_some());
        }
        let inner = t.inner.lock();
        assert!(
            inner.order.len() <= 2 * inner.by_id.len() + 65,
            "{}",
            inner.order.len()
        );
    }
}
