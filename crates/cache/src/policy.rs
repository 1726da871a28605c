//! Which object to evict next: S3-FIFO (Yang et al., SOSP 2023) over whole objects.
//!
//! New objects enter a small FIFO queue (`small`, ~10% of the bytes); an object opened
//! again while there is promoted to the main FIFO when it reaches the small queue's head,
//! otherwise it is evicted and remembered in a ghost queue (keys only). An object coming back
//! while its key is a ghost goes straight to `main`. The main queue is a CLOCK: an object
//! with a non-zero frequency at the head is reinserted with its frequency decremented.
//! One large sequential read or a scan of a tree therefore passes through `small` without
//! flushing the working set in `main`. Every operation is O(1) amortised: queues hold
//! `(key, stamp)` pairs and stale pairs (removed or moved objects) are skipped when popped.
//!
//! Objects the caller may not evict (pinned, open) are rotated to the main queue's tail;
//! the search gives up after a bounded number of pops (twice both queues' length, plus
//! two), so it never loops forever.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::meta::ObjectKey;

/// Share of the bytes the small queue may hold before it is evicted from first.
const SMALL_PERCENT: u64 = 10;
/// Frequency is capped, as in the paper (2 bits).
const MAX_FREQ: u8 = 3;
/// Opens while in the small queue needed for promotion (the creating open counts as one).
const PROMOTE_AT: u8 = 2;

/// What the store keeps about one object besides its place in the queues.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tracked {
    /// Its index slot.
    pub slot: u32,
    /// Kept from eviction.
    pub pinned: bool,
    /// Opens holding it (not evictable while non-zero).
    pub opens: u32,
    /// Crash epoch at which its chunks were last written or verified.
    pub crash_epoch: u32,
    /// Hoard priority.
    pub priority: u16,
}

/// Policy state of one object.
#[derive(Debug, Clone)]
pub struct PolicyEntry {
    /// Bytes charged for it.
    pub bytes: u64,
    /// The store's data.
    pub info: Tracked,
    freq: u8,
    in_main: bool,
    stamp: u32,
}

/// The S3-FIFO queues.
#[derive(Debug, Default)]
pub struct Policy {
    entries: HashMap<ObjectKey, PolicyEntry>,
    small: VecDeque<(ObjectKey, u32)>,
    main: VecDeque<(ObjectKey, u32)>,
    ghost: VecDeque<ObjectKey>,
    ghost_set: HashSet<ObjectKey>,
    small_bytes: u64,
    total_bytes: u64,
    next_stamp: u32,
}

impl Policy {
    /// Number of objects.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when no object is tracked.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes charged to all objects.
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The entry of `key`.
    pub fn get(&self, key: &ObjectKey) -> Option<&PolicyEntry> {
        self.entries.get(key)
    }

    /// The entry of `key`, to change its [`Tracked`] data.
    pub fn info_mut(&mut self, key: &ObjectKey) -> Option<&mut Tracked> {
        self.entries.get_mut(key).map(|e| &mut e.info)
    }

    /// All tracked objects (unordered).
    pub fn iter(&self) -> impl Iterator<Item = (&ObjectKey, &PolicyEntry)> {
        self.entries.iter()
    }

    /// Keys of all tracked objects (unordered).
    pub fn keys(&self) -> impl Iterator<Item = &ObjectKey> {
        self.entries.keys()
    }

    fn stamp(&mut self) -> u32 {
        self.next_stamp = self.next_stamp.wrapping_add(1);
        self.next_stamp
    }

    /// Starts tracking `key` (no-op if tracked). `warm` objects (loaded from the index at
    /// startup) go to the main queue; new ones to the small queue unless their key is a ghost.
    pub fn insert(&mut self, key: ObjectKey, bytes: u64, info: Tracked, warm: bool) {
        if self.entries.contains_key(&key) {
            return;
        }
        let in_main = warm || self.ghost_set.remove(&key);
        let stamp = self.stamp();
        if in_main {
            self.main.push_back((key, stamp));
        } else {
            self.small.push_back((key, stamp));
            self.small_bytes += bytes;
        }
        self.total_bytes += bytes;
        let e = PolicyEntry {
            bytes,
            info,
            freq: 0,
            in_main,
            stamp,
        };
        self.entries.insert(key, e);
    }

    /// Records an access (an open).
    pub fn touch(&mut self, key: &ObjectKey) {
        if let Some(e) = self.entries.get_mut(key) {
            e.freq = (e.freq + 1).min(MAX_FREQ);
        }
    }

    /// Changes the bytes charged to `key`.
    pub fn resize(&mut self, key: &ObjectKey, bytes: u64) {
        if let Some(e) = self.entries.get_mut(key) {
            self.total_bytes = self.total_bytes - e.bytes + bytes;
            if !e.in_main {
                self.small_bytes = self.small_bytes - e.bytes + bytes;
            }
            e.bytes = bytes;
        }
    }

    /// Stops tracking `key`; with `ghost`, remembers it so a quick return goes to `main`.
    pub fn remove(&mut self, key: &ObjectKey, ghost: bool) -> Option<PolicyEntry> {
        let e = self.entries.remove(key)?;
        self.total_bytes -= e.bytes;
        if !e.in_main {
            self.small_bytes -= e.bytes;
        }
        if ghost && self.ghost_set.insert(*key) {
            self.ghost.push_back(*key);
            while self.ghost.len() > self.entries.len().max(1024) {
                if let Some(k) = self.ghost.pop_front() {
                    self.ghost_set.remove(&k);
                }
            }
        }
        Some(e)
    }

    /// Puts `key` back at the small queue's tail with no history (its data was dropped but
    /// the object lives on, e.g. an evicted object still referenced in memory).
    pub fn restart(&mut self, key: &ObjectKey) {
        let stamp = self.stamp();
        if let Some(e) = self.entries.get_mut(key) {
            if e.in_main {
                self.small_bytes += e.bytes;
            }
            e.in_main = false;
            e.freq = 0;
            e.stamp = stamp;
            self.small.push_back((*key, stamp));
        }
    }

    fn move_to(&mut self, key: ObjectKey, main: bool) {
        let stamp = self.stamp();
        let e = self.entries.get_mut(&key).expect("live key");
        if e.in_main != main {
            if main {
                self.small_bytes -= e.bytes;
            } else {
                self.small_bytes += e.bytes;
            }
        }
        e.in_main = main;
        e.stamp = stamp;
        if main {
            self.main.push_back((key, stamp));
        } else {
            self.small.push_back((key, stamp));
        }
    }

    /// Chooses the next object to evict, among those `evictable` allows. The chosen key is
    /// still tracked: the caller either [`Policy::remove`]s it or [`Policy::restart`]s it.
    pub fn victim(&mut self, evictable: impl Fn(&Tracked) -> bool) -> Option<ObjectKey> {
        let mut budget = 2 * (self.small.len() + self.main.len()) + 2;
        while budget > 0 {
            budget -= 1;
            let from_small = !self.small.is_empty()
                && (self.small_bytes * 100 > self.total_bytes * SMALL_PERCENT
                    || self.main.is_empty());
            let popped = if from_small {
                self.small.pop_front()
            } else {
                self.main.pop_front()
            };
            let (key, stamp) = popped?;
            let Some(e) = self.entries.get_mut(&key) else {
                continue;
            };
            if e.stamp != stamp {
                continue;
            }
            if !e.in_main {
                if e.freq >= PROMOTE_AT || !evictable(&e.info) {
                    e.freq = 0;
                    self.move_to(key, true);
                    continue;
                }
                return Some(key);
            }
            if !evictable(&e.info) {
                self.move_to(key, true);
                continue;
            }
            if e.freq > 0 {
                e.freq -= 1;
                self.move_to(key, true);
                continue;
            }
            return Some(key);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> ObjectKey {
        ObjectKey {
            export_id: 1,
            file_id: i,
        }
    }

    /// Tracked data whose slot is the object's id (so predicates can name objects).
    fn t(i: u64) -> Tracked {
        Tracked {
            slot: i as u32,
            ..Tracked::default()
        }
    }

    /// Evicts until `bytes` are freed; returns the victims.
    fn evict(p: &mut Policy, bytes: u64, keep: &[u64]) -> Vec<u64> {
        let mut freed = 0;
        let mut out = Vec::new();
        while freed < bytes {
            let Some(v) = p.victim(|t| !keep.contains(&(t.slot as u64))) else {
                break;
            };
            freed += p.remove(&v, true).unwrap().bytes;
            out.push(v.file_id);
        }
        out
    }

    #[test]
    fn a_scan_does_not_flush_the_hot_set() {
        let mut p = Policy::default();
        // A hot set of 50 objects, each opened several times.
        for i in 0..50 {
            p.insert(k(i), 10, t(i), false);
            p.touch(&k(i));
            p.touch(&k(i));
            p.touch(&k(i));
        }
        // Capacity 1000 bytes: a scan of 500 objects opened once each.
        for i in 1000..1500 {
            p.insert(k(i), 10, t(i), false);
            p.touch(&k(i));
            let over = p.total_bytes().saturating_sub(1000);
            let gone = evict(&mut p, over, &[]);
            assert!(
                gone.iter().all(|&g| g >= 1000),
                "hot object evicted: {gone:?}"
            );
        }
        assert!((0..50).all(|i| p.get(&k(i)).is_some()));
        assert!(p.total_bytes() <= 1000);
    }

    #[test]
    fn a_returning_ghost_goes_to_main_and_protected_objects_survive() {
        let mut p = Policy::default();
        for i in 0..10 {
            p.insert(k(i), 10, t(i), false);
        }
        // Object 3 is pinned: everything else can go, it cannot.
        let gone = evict(&mut p, 1000, &[3]);
        assert_eq!(gone.len(), 9);
        assert!(p.get(&k(3)).is_some());
        assert_eq!(p.victim(|t| t.slot != 3), None);
        // 0 comes back: it was a ghost, so it enters main.
        p.insert(k(0), 10, t(0), false);
        assert!(p.get(&k(0)).unwrap().in_main);
        p.insert(k(20), 10, t(20), false);
        assert!(!p.get(&k(20)).unwrap().in_main);
    }

    #[test]
    fn accounting_follows_resize_restart_and_remove() {
        let mut p = Policy::default();
        p.insert(k(1), 100, t(1), false);
        p.insert(k(2), 50, t(2), true);
        p.resize(&k(1), 300);
        assert_eq!(p.total_bytes(), 350);
        p.restart(&k(2));
        p.resize(&k(2), 10);
        assert_eq!(p.total_bytes(), 310);
        p.remove(&k(1), false);
        p.remove(&k(2), false);
        assert_eq!((p.total_bytes(), p.small_bytes), (0, 0));
        assert!(p.is_empty());
        // Stale queue pairs are skipped.
        assert_eq!(p.victim(|_| true), None);
    }
}
