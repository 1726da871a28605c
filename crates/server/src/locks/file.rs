//! The locks of one file of one kind (`flock` or POSIX): who holds which bytes, and who
//! waits for which, in arrival order. Pure bookkeeping, no I/O: the door (`mod.rs`)
//! decides what to do with the answers it hands back.
//!
//! Rules, as the kernel keeps them for local files:
//! - Two owners' locks conflict when they share a byte and one of them is exclusive; an
//!   owner never conflicts with itself.
//! - A request replaces what its owner held on its bytes: an exclusive lock inside a
//!   shared one splits it in three, an unlock in the middle splits it in two, and an
//!   owner's adjacent or overlapping locks of one type merge. A `flock` covers the whole
//!   file, so the same rules make it a replacement (shared ↔ exclusive conversion).
//! - Fair hand-off: an owner that holds nothing on the file also yields to earlier
//!   waiters its request conflicts with, so a stream of non-blocking takers cannot
//!   starve a waiter. An owner that already holds a lock does not (it could otherwise
//!   wait for a waiter that waits for it).

use std::collections::{HashMap, VecDeque};

use hoardfs_proto::{LockHolder, LockRange, LockType};

/// Who a lock belongs to: a client-chosen owner on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct OwnerKey {
    /// The connection the owner asked on.
    pub(crate) conn: u64,
    /// The client's owner number.
    pub(crate) owner: u64,
}

/// A granted lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) owner: OwnerKey,
    /// Shared or exclusive (never `Unlock`), and its bytes.
    pub(crate) range: LockRange,
    pub(crate) pid: u32,
}

/// A request waiting for its lock, with what answers it.
pub(crate) struct Waiter<A> {
    pub(crate) owner: OwnerKey,
    pub(crate) range: LockRange,
    pub(crate) pid: u32,
    /// Id of the `Lock` request, for a `CancelLock`.
    pub(crate) request: u64,
    pub(crate) answer: A,
}

/// Held locks and waiters of one file and kind.
pub(crate) struct FileLocks<A> {
    held: Vec<Held>,
    waiting: VecDeque<Waiter<A>>,
    /// Locks plus waits of each connection here, kept as they change.
    counts: HashMap<u64, usize>,
}

impl<A> Default for FileLocks<A> {
    fn default() -> Self {
        FileLocks {
            held: Vec::new(),
            waiting: VecDeque::new(),
            counts: HashMap::new(),
        }
    }
}

impl<A> FileLocks<A> {
    /// Locks plus waits of each connection on this file.
    pub(crate) fn per_conn(&self) -> &HashMap<u64, usize> {
        &self.counts
    }

    fn count(&mut self, conn: u64, added: usize, removed: usize) {
        let n = self.counts.entry(conn).or_default();
        *n = (*n + added).saturating_sub(removed);
        if *n == 0 {
            self.counts.remove(&conn);
        }
    }

    /// Nothing held, nobody waiting: the entry can go.
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty() && self.waiting.is_empty()
    }

    /// The lock or earlier waiter in the way of `owner` taking `range`, if any (the first
    /// `ahead` waiters count).
    fn in_the_way(&self, owner: OwnerKey, range: &LockRange, ahead: usize) -> Option<Held> {
        if range.typ == LockType::Unlock {
            return None;
        }
        if let Some(h) = self
            .held
            .iter()
            .find(|h| h.owner != owner && !h.range.compatible(range))
        {
            return Some(*h);
        }
        if self.held.iter().any(|h| h.owner == owner) {
            return None;
        }
        self.waiting
            .iter()
            .take(ahead)
            .find(|w| w.owner != owner && !w.range.compatible(range))
            .map(|w| Held {
                owner: w.owner,
                range: w.range,
                pid: w.pid,
            })
    }

    /// What `F_GETLK` reports for `owner` asking for `range`: the lock in the way, if any
    /// (the pid only when it is held on the same connection).
    pub(crate) fn test(&self, owner: OwnerKey, range: &LockRange) -> Option<LockHolder> {
        self.in_the_way(owner, range, self.waiting.len())
            .map(|h| LockHolder {
                range: h.range,
                pid: if h.owner.conn == owner.conn { h.pid } else { 0 },
            })
    }

    /// Takes (or releases) `range` for `owner` if nothing is in the way; true if done.
    pub(crate) fn try_take(&mut self, owner: OwnerKey, range: LockRange, pid: u32) -> bool {
        if self.in_the_way(owner, &range, self.waiting.len()).is_some() {
            return false;
        }
        self.apply(owner, range, pid);
        true
    }

    /// Queues a waiter (its request was in the way of something).
    pub(crate) fn wait(&mut self, w: Waiter<A>) {
        self.count(w.owner.conn, 1, 0);
        self.waiting.push_back(w);
    }

    /// Grants, in order, every waiter nothing is in the way of any more; returns them.
    pub(crate) fn grant(&mut self) -> Vec<Waiter<A>> {
        let mut granted = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            if self.in_the_way(w.owner, &w.range, i).is_some() {
                i += 1;
                continue;
            }
            let w = self.waiting.remove(i).expect("index in range");
            self.count(w.owner.conn, 0, 1);
            self.apply(w.owner, w.range, w.pid);
            granted.push(w);
        }
        granted
    }

    /// Releases everything `owner` holds. Its waits go on: another thread of the same
    /// process may be waiting while one closes the file, and a client's owner numbers
    /// can be reused before an old release arrives (a wait ends by a cancel).
    pub(crate) fn release(&mut self, owner: OwnerKey) {
        let before = self.held.len();
        self.held.retain(|h| h.owner != owner);
        self.count(owner.conn, 0, before - self.held.len());
    }

    /// Releases everything held through connection `conn`; returns its waiters.
    pub(crate) fn release_conn(&mut self, conn: u64) -> Vec<Waiter<A>> {
        self.held.retain(|h| h.owner.conn != conn);
        let gone = self.take_waiters(|w| w.owner.conn == conn);
        self.counts.remove(&conn);
        gone
    }

    /// Removes the waiter of request `request` on `conn`, if it still waits.
    pub(crate) fn cancel(&mut self, conn: u64, request: u64) -> Option<Waiter<A>> {
        self.take_waiters(|w| w.owner.conn == conn && w.request == request)
            .pop()
    }

    fn take_waiters(&mut self, which: impl Fn(&Waiter<A>) -> bool) -> Vec<Waiter<A>> {
        let (gone, kept): (VecDeque<_>, VecDeque<_>) = self.waiting.drain(..).partition(which);
        self.waiting = kept;
        let gone: Vec<_> = gone.into();
        for w in &gone {
            self.count(w.owner.conn, 0, 1);
        }
        gone
    }

    /// Makes `owner` hold `range` (or not hold it, for an unlock): its locks on those
    /// bytes are cut away, the new one added, and its neighbours of one type merged.
    fn apply(&mut self, owner: OwnerKey, range: LockRange, pid: u32) {
        let mut mine = Vec::new();
        self.held.retain(|h| {
            if h.owner == owner {
                mine.push(*h);
                false
            } else {
                true
            }
        });
        let removed = mine.len();
        let mut kept = Vec::with_capacity(mine.len() + 2);
        for h in mine {
            if !h.range.overlaps(&range) {
                kept.push(h);
                continue;
            }
            if h.range.start < range.start {
                kept.push(Held {
                    range: LockRange {
                        end: range.start - 1,
                        ..h.range
                    },
                    ..h
                });
            }
            if h.range.end > range.end {
                kept.push(Held {
                    range: LockRange {
                        start: range.end + 1,
                        ..h.range
                    },
                    ..h
                });
            }
        }
        if range.typ != LockType::Unlock {
            kept.push(Held { owner, range, pid });
        }
        kept.sort_by_key(|h| h.range.start);
        let mut merged: Vec<Held> = Vec::with_capacity(kept.len());
        for h in kept {
            if let Some(last) = merged.last_mut()
                && last.range.typ == h.range.typ
                && last
                    .range
                    .end
                    .checked_add(1)
                    .is_none_or(|next| next >= h.range.start)
            {
                last.range.end = last.range.end.max(h.range.end);
                continue;
            }
            merged.push(h);
        }
        self.count(owner.conn, merged.len(), removed);
        self.held.extend(merged);
    }

    /// The locks held, for tests.
    #[cfg(test)]
    pub(crate) fn held(&self) -> &[Held] {
        &self.held
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_proto::LOCK_TO_EOF;

    const A: OwnerKey = OwnerKey { conn: 1, owner: 10 };
    const B: OwnerKey = OwnerKey { conn: 2, owner: 10 };
    const C: OwnerKey = OwnerKey { conn: 2, owner: 11 };

    fn r(typ: LockType, start: u64, end: u64) -> LockRange {
        LockRange { typ, start, end }
    }
    fn wr(start: u64, end: u64) -> LockRange {
        r(LockType::Write, start, end)
    }
    fn rd(start: u64, end: u64) -> LockRange {
        r(LockType::Read, start, end)
    }
    fn un(start: u64, end: u64) -> LockRange {
        r(LockType::Unlock, start, end)
    }
    fn ranges(f: &FileLocks<()>, o: OwnerKey) -> Vec<(LockType, u64, u64)> {
        let mut v: Vec<_> = f
            .held()
            .iter()
            .filter(|h| h.owner == o)
            .map(|h| (h.range.typ, h.range.start, h.range.end))
            .collect();
        v.sort_by_key(|x| x.1);
        v
    }
    fn waiter(owner: OwnerKey, range: LockRange, request: u64) -> Waiter<()> {
        Waiter {
            owner,
            range,
            pid: 7,
            request,
            answer: (),
        }
    }

    #[test]
    fn exclusive_conflicts_shared_coexists_and_an_owner_never_blocks_itself() {
        let mut f = FileLocks::<()>::default();
        assert!(f.try_take(A, rd(0, 99), 1));
        assert!(f.try_take(B, rd(50, 150), 2), "shared locks coexist");
        assert!(!f.try_take(C, wr(90, 95), 3), "exclusive against shared");
        assert!(f.try_take(C, wr(151, 200), 3), "disjoint bytes");
        assert!(
            f.try_take(A, wr(0, 10), 1),
            "A's own shared bytes below B's"
        );
        let t = f.test(C, &wr(60, 60)).expect("held");
        assert_eq!(t.range.typ, LockType::Read);
        assert!(
            f.test(A, &un(0, LOCK_TO_EOF)).is_none(),
            "unlock is never in the way"
        );
    }

    #[test]
    fn a_lock_inside_another_splits_it_and_neighbours_of_one_type_merge() {
        let mut f = FileLocks::<()>::default();
        assert!(f.try_take(A, rd(0, 99), 1));
        assert!(f.try_take(A, wr(40, 59), 1));
        assert_eq!(
            ranges(&f, A),
            vec![
                (LockType::Read, 0, 39),
                (LockType::Write, 40, 59),
                (LockType::Read, 60, 99)
            ]
        );
        assert!(f.try_take(A, un(50, 54), 1));
        assert_eq!(ranges(&f, A).len(), 4);
        assert!(f.try_take(A, rd(40, 59), 1));
        assert_eq!(ranges(&f, A), vec![(LockType::Read, 0, 99)], "merged back");
        assert!(f.try_take(A, rd(100, LOCK_TO_EOF), 1));
        assert_eq!(ranges(&f, A), vec![(LockType::Read, 0, LOCK_TO_EOF)]);
        assert!(f.try_take(A, un(0, LOCK_TO_EOF), 1));
        assert!(f.is_empty());
    }

    #[test]
    fn waiters_are_granted_in_order_and_not_overtaken_by_newcomers() {
        let mut f = FileLocks::<()>::default();
        assert!(f.try_take(A, rd(0, 9), 1));
        assert!(!f.try_take(B, wr(0, 9), 2));
        f.wait(waiter(B, wr(0, 9), 1));
        // C holds nothing: its shared lock would not conflict with A's, but it yields to
        // B's earlier wait for those bytes.
        assert!(!f.try_take(C, rd(5, 5), 3));
        assert!(f.test(C, &rd(5, 5)).is_some());
        f.wait(waiter(C, rd(5, 5), 2));
        assert!(f.grant().is_empty(), "A still holds");
        f.release(A);
        let g = f.grant();
        assert_eq!(g.iter().map(|w| w.request).collect::<Vec<_>>(), vec![1]);
        assert!(f.grant().is_empty(), "C waits for B");
        f.release(B);
        assert_eq!(f.grant().len(), 1);
        assert_eq!(ranges(&f, C), vec![(LockType::Read, 5, 5)]);
    }

    #[test]
    fn a_closed_connection_and_a_cancel_end_holds_and_waits() {
        let mut f = FileLocks::<()>::default();
        assert!(f.try_take(B, wr(0, 0), 1));
        assert!(f.try_take(C, rd(1, 1), 1));
        f.wait(waiter(A, wr(0, 1), 5));
        f.wait(waiter(A, wr(0, 1), 6));
        assert_eq!(f.cancel(1, 6).map(|w| w.request), Some(6));
        assert!(f.cancel(1, 6).is_none());
        assert!(f.release_conn(2).is_empty());
        assert_eq!(f.grant().len(), 1);
        assert_eq!(f.release_conn(1).len(), 0);
        assert!(f.is_empty());
    }
}
