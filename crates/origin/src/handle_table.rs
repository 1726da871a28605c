//! The epoch-checked handle table both server-side origins keep: wire [`Handle`]s ↔ the
//! objects they name, bounded, with the root never forgotten.
//!
//! A handle carries the table's epoch, so handles issued before a restart answer `Stale`
//! instead of naming whatever took their id. Ids are random, not sequential: a handle names
//! its object directly, without the search permission of the directories above it, so one
//! must not be guessable (only a lookup the caller was allowed to make hands it out).
//! Beyond `cap` entries the least recently used handles are forgotten, and clients holding
//! them get `Stale` and resolve the name again. Use, not issue, decides: a directory being
//! listed page by page stays known while its listing hands out more handles than the table
//! holds (with the oldest-issued order, a listing longer than the table evicted its own
//! directory and failed with `Stale` on every retry).
//!
//! Each object has a key ([`Keyed`]): the local origin's is the inode (device, number),
//! the S3 origin's the path and whether it is a directory. One key has one handle.
//!
//! Lock: one mutex, never held across a system call or a request.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use hoardfs_proto::{Handle, WireError};
use parking_lot::Mutex;

/// Id of the root in every epoch.
pub const ROOT_ID: u64 = 1;

/// An object a [`HandleTable`] holds: one handle per key.
pub trait Keyed {
    /// What identifies the object (two values with one key share a handle).
    type Key: Hash + Eq + Clone;
    /// This object's key.
    fn key(&self) -> Self::Key;
}

/// Bounded map between handles and objects.
pub struct HandleTable<V: Keyed> {
    epoch: u64,
    cap: usize,
    inner: Mutex<Inner<V>>,
}

struct Inner<V: Keyed> {
    by_id: HashMap<u64, Slot<V>>,
    by_key: HashMap<V::Key, u64>,
    /// (id, stamp) in the order of use: a use queues the id again with a new stamp, and
    /// only the entry carrying its current stamp counts (the root is never queued, so
    /// never evicted). Older entries, and those of ids removed since, stay queued until
    /// popped or compacted away.
    order: VecDeque<(u64, u64)>,
    /// The next stamp.
    clock: u64,
}

/// A registered object and the stamp of its last use.
struct Slot<V> {
    value: Arc<V>,
    stamp: u64,
}

impl<V: Keyed> Inner<V> {
    /// A fresh id: random, above the root's, not in use.
    fn new_id(&self) -> u64 {
        loop {
            let id = rand::random::<u64>();
            if id > ROOT_ID && !self.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    /// Queues `id` as used now.
    fn used(&mut self, id: u64) {
        if id == ROOT_ID {
            return;
        }
        let Some(slot) = self.by_id.get_mut(&id) else {
            return;
        };
        self.clock += 1;
        slot.stamp = self.clock;
        self.order.push_back((id, self.clock));
        // Uses and create/remove loops would otherwise grow the queue for ever.
        if self.order.len() > 2 * self.by_id.len() + 64 {
            let Inner { order, by_id, .. } = self;
            order.retain(|(id, stamp)| by_id.get(id).is_some_and(|s| s.stamp == *stamp));
        }
    }

    /// Registers `value` under a new id, then evicts the least recently used beyond `cap`.
    fn add(&mut self, key: V::Key, value: Arc<V>, cap: usize) -> u64 {
        let id = self.new_id();
        self.by_key.insert(key, id);
        self.by_id.insert(id, Slot { value, stamp: 0 });
        self.used(id);
        while self.by_id.len() > cap {
            let Some((old, stamp)) = self.order.pop_front() else {
                break;
            };
            if self.by_id.get(&old).is_some_and(|s| s.stamp == stamp)
                && let Some(s) = self.by_id.remove(&old)
            {
                self.by_key.remove(&s.value.key());
            }
        }
        id
    }
}

impl<V: Keyed> std::fmt::Debug for HandleTable<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleTable")
            .field("epoch", &self.epoch)
            .field("cap", &self.cap)
            .field("len", &self.inner.lock().by_id.len())
            .finish()
    }
}

impl<V: Keyed> HandleTable<V> {
    /// A table of at most `cap` objects (at least 16) whose root handle names `root`.
    pub fn new(epoch: u64, cap: usize, root: V) -> Self {
        let mut by_id = HashMap::new();
        let mut by_key = HashMap::new();
        by_key.insert(root.key(), ROOT_ID);
        by_id.insert(
            ROOT_ID,
            Slot {
                value: Arc::new(root),
                stamp: 0,
            },
        );
        HandleTable {
            epoch,
            cap: cap.max(16),
            inner: Mutex::new(Inner {
                by_id,
                by_key,
                order: VecDeque::new(),
                clock: 0,
            }),
        }
    }

    /// Epoch of handles issued by this table.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Most objects the table holds.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The root's handle.
    pub fn root(&self) -> Handle {
        self.handle(ROOT_ID)
    }

    fn handle(&self, id: u64) -> Handle {
        Handle {
            epoch: self.epoch,
            id,
        }
    }

    /// The object a handle names (now its most recently used), or `Stale`.
    pub fn get(&self, h: Handle) -> Result<Arc<V>, WireError> {
        if h.epoch != self.epoch {
            return Err(WireError::Stale);
        }
        let mut inner = self.inner.lock();
        let value = inner
            .by_id
            .get(&h.id)
            .ok_or(WireError::Stale)?
            .value
            .clone();
        inner.used(h.id);
        Ok(value)
    }

    /// Registers `value`, or finds the object already registered under its key (which is
    /// kept); returns the handle and the registered object.
    pub fn insert(&self, value: V) -> (Handle, Arc<V>) {
        let key = value.key();
        let mut inner = self.inner.lock();
        if let Some(&id) = inner.by_key.get(&key)
            && let Some(existing) = inner.by_id.get(&id)
        {
            let existing = existing.value.clone();
            inner.used(id);
            return (self.handle(id), existing);
        }
        let value = Arc::new(value);
        let id = inner.add(key, value.clone(), self.cap);
        (self.handle(id), value)
    }

    /// The handle of `value`'s key (the same one as before, if it had one), with what is
    /// known of it replaced by `value`.
    pub fn put(&self, value: V) -> Handle {
        let key = value.key();
        let value = Arc::new(value);
        let mut inner = self.inner.lock();
        if let Some(&id) = inner.by_key.get(&key)
            && let Some(slot) = inner.by_id.get_mut(&id)
        {
            slot.value = value;
            inner.used(id);
            return self.handle(id);
        }
        let id = inner.add(key, value, self.cap);
        self.handle(id)
    }

    /// Replaces what is known of `value`'s key, if a handle names it (no new handle).
    pub fn refresh(&self, value: V) {
        let key = value.key();
        let mut inner = self.inner.lock();
        if let Some(&id) = inner.by_key.get(&key)
            && let Some(slot) = inner.by_id.get_mut(&id)
        {
            slot.value = Arc::new(value);
        }
    }

    /// The object registered under `key`, if any.
    pub fn find(&self, key: &V::Key) -> Option<Arc<V>> {
        let inner = self.inner.lock();
        let id = inner.by_key.get(key)?;
        inner.by_id.get(id).map(|s| s.value.clone())
    }

    /// Forgets the handle of `key` (the object was deleted or moved away); returns its id
    /// if it had one. The root's handle is never forgotten.
    pub fn remove(&self, key: &V::Key) -> Option<u64> {
        let mut inner = self.inner.lock();
        let &id = inner.by_key.get(key)?;
        if id == ROOT_ID {
            return None;
        }
        inner.by_key.remove(key);
        inner.by_id.remove(&id);
        Some(id)
    }

    /// Every registered object `keep` accepts (a snapshot; the lock is released on return).
    pub fn select(&self, keep: impl Fn(&V) -> bool) -> Vec<Arc<V>> {
        self.inner
            .lock()
            .by_id
            .values()
            .filter(|s| keep(&s.value))
            .map(|s| s.value.clone())
            .collect()
    }

    /// How many objects are registered, and how many ids wait in the eviction queue.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize) {
        let inner = self.inner.lock();
        (inner.by_id.len(), inner.order.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Obj(u64, &'static str);

    impl Keyed for Obj {
        type Key = u64;
        fn key(&self) -> u64 {
            self.0
        }
    }

    #[test]
    fn one_key_has_one_handle_and_insert_keeps_what_put_replaces() {
        let t = HandleTable::new(7, 100, Obj(0, "root"));
        let (a, first) = t.insert(Obj(5, "a"));
        let (again, kept) = t.insert(Obj(5, "b"));
        assert_eq!((a, &*first), (again, &*kept));
        assert_eq!(t.put(Obj(5, "c")), a);
        assert_eq!(t.get(a).unwrap().1, "c");
        t.refresh(Obj(6, "unknown"));
        assert!(t.find(&6).is_none());
        assert_eq!(t.get(Handle { epoch: 8, id: a.id }), Err(WireError::Stale));
        assert_eq!(t.remove(&5), Some(a.id));
        assert_eq!(t.get(a), Err(WireError::Stale));
        assert_eq!(t.remove(&0), None, "the root stays");
        assert_eq!(t.get(t.root()).unwrap().1, "root");
    }

    #[test]
    fn the_table_is_bounded_and_never_forgets_the_root() {
        let t = HandleTable::new(1, 16, Obj(0, "root"));
        let first = t.put(Obj(1, "f"));
        for i in 2..100 {
            t.put(Obj(i, "f"));
        }
        assert_eq!(t.get(first), Err(WireError::Stale));
        assert!(t.get(t.root()).is_ok());
        assert!(t.sizes().0 <= 16);
    }

    #[test]
    fn a_handle_in_use_outlives_more_new_handles_than_the_table_holds() {
        // A directory listed page by page: each page uses its handle and hands out handles
        // for the page's entries, far more of them than the table holds.
        let t = HandleTable::new(1, 100, Obj(0, "root"));
        let dir = t.put(Obj(1, "dir"));
        let first_entry = t.put(Obj(2, "f"));
        for page in 0..50u64 {
            assert!(t.get(dir).is_ok(), "page {page}");
            for i in 0..20 {
                t.put(Obj(10 + page * 20 + i, "f"));
            }
        }
        assert!(t.get(dir).is_ok());
        assert_eq!(
            t.get(first_entry),
            Err(WireError::Stale),
            "unused: forgotten"
        );
        let (live, queued) = t.sizes();
        assert!(live <= 100 && queued <= 2 * live + 65, "{live} {queued}");
    }

    #[test]
    fn handles_removed_after_use_do_not_pile_up_in_the_eviction_queue() {
        let t = HandleTable::new(7, 1000, Obj(0, "root"));
        for key in 2..20_000u64 {
            t.insert(Obj(key, "f"));
            assert!(t.remove(&key).is_some());
        }
        let (live, queued) = t.sizes();
        assert!(queued <= 2 * live + 65, "{queued}");
    }
}
