//! Listings read ahead of a walk ([`TreeAhead`]): when directories are listed one after
//! another (`ls -lR`, `find`, a build scanning a toolchain), a listing that misses asks
//! the origin for the listings of a whole subtree in one request
//! ([`hoardfs_origin::Origin::read_tree`]), and keeps those of the other directories here
//! until they are listed. A walk over a tree the client has never seen, or has not seen
//! since it was mounted, then costs a few round trips instead of one per directory.
//!
//! A kept listing is used only while it is as good as a fresh one: with callbacks, while
//! no break touched its directory since the request was sent (and within the callback
//! TTL); without, within the directory TTL. Each is used once (it then lives in its
//! directory's node like any fetched listing); what is not used ages out, and the whole
//! is bounded by [`MAX_KEPT_ENTRIES`]. A change of names through this client (which the
//! origin does not report back to it) drops the directory's kept listing, and the
//! listings of any subtree request in flight at the time. Lock: a leaf.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::nodes::Listing;

/// Two listings that miss within this interval make a walk.
pub(crate) const WALK_WINDOW: Duration = Duration::from_secs(1);

/// Entries asked for by the first subtree request of a walk; each further request of the
/// same walk asks for twice as many, up to [`MAX_TREE_REQUEST`]. A walk that turns out to
/// be two unrelated `ls` costs little; a long one soon moves large batches.
pub(crate) const FIRST_TREE_REQUEST: u32 = 1024;

/// Entries asked for by one subtree request at most.
pub(crate) const MAX_TREE_REQUEST: u32 = 16 * 1024;

/// Entries of listings kept at most, each directory counting one more (beyond, the
/// oldest are dropped).
pub(crate) const MAX_KEPT_ENTRIES: usize = 128 * 1024;

/// A directory's version and size, as a reply showed them: a listing read ahead is used
/// only while its directory's node still shows the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DirStamp {
    pub(crate) version: u64,
    pub(crate) size: u64,
}

impl DirStamp {
    /// The stamp of `attr`.
    pub(crate) fn of(attr: &hoardfs_origin::Attr) -> DirStamp {
        DirStamp {
            version: attr.version,
            size: attr.size,
        }
    }
}

/// A listing read ahead, with what its directory's attributes were in the reply: it is
/// used only while the directory's node still shows them (the rule every listing keeps:
/// `NodeState::set_attr`).
pub(crate) struct Kept {
    /// The listing.
    pub(crate) listing: Arc<Listing>,
    /// The directory's version and size as the reply saw them (`None`: not in it).
    pub(crate) seen: Option<DirStamp>,
    /// Which `keep` stored it (to tell it from a later listing of the same directory).
    seq: u64,
}

impl Kept {
    /// A listing read ahead whose directory had version and size `seen`.
    pub(crate) fn new(listing: Arc<Listing>, seen: Option<DirStamp>) -> Kept {
        Kept {
            listing,
            seen,
            seq: 0,
        }
    }

    fn weight(&self) -> usize {
        self.listing.entries.len() + 1
    }
}

/// Listings read ahead, by directory file id, and the state of the current walk.
#[derive(Default)]
pub(crate) struct TreeAhead {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    kept: HashMap<u64, Kept>,
    /// Directory file ids and keep sequence numbers in the order kept (a pair whose listing was
    /// taken or replaced is skipped when it comes up).
    order: VecDeque<(u64, u64)>,
    /// Entries plus directories kept.
    weight: usize,
    seq: u64,
    /// How old a kept listing may grow (the latest `keep`'s).
    max_age: Duration,
    /// When a listing last missed.
    last_miss: Option<Instant>,
    /// Entries the next subtree request of this walk asks for.
    next_request: u32,
    /// Changes of names through this client so far (see [`TreeAhead::name_changes`]).
    changes: u64,
}

impl Inner {
    fn remove(&mut self, dir_id: u64) -> Option<Kept> {
        let k = self.kept.remove(&dir_id)?;
        self.weight -= k.weight();
        Some(k)
    }

    /// Drops the oldest listings while over the bound or older than `max_age`.
    fn prune(&mut self, now: Instant) {
        while let Some(&(dir_id, seq)) = self.order.front() {
            let current = self.kept.get(&dir_id).filter(|k| k.seq == seq);
            let drop = current.is_none_or(|k| {
                self.weight > MAX_KEPT_ENTRIES
                    || now.saturating_duration_since(k.listing.fetched) > self.max_age
            });
            if !drop {
                break;
            }
            self.order.pop_front();
            if current.is_some() {
                self.remove(dir_id);
            }
        }
    }
}

impl TreeAhead {
    /// The listing kept for directory `dir_id`, if any (taken: a listing is used once).
    pub(crate) fn take(&self, dir_id: u64) -> Option<Kept> {
        let mut g = self.inner.lock();
        let k = g.remove(dir_id);
        g.prune(Instant::now());
        k
    }

    /// A listing of a directory missed now: how many entries a subtree request should
    /// ask for, or `None` if this does not look like a walk (no other miss within
    /// [`WALK_WINDOW`]).
    pub(crate) fn missed(&self, now: Instant) -> Option<u32> {
        let mut g = self.inner.lock();
        let walking = g
            .last_miss
            .is_some_and(|t| now.saturating_duration_since(t) < WALK_WINDOW);
        g.last_miss = Some(now);
        if !walking {
            g.next_request = FIRST_TREE_REQUEST;
            return None;
        }
        let ask = g.next_request.max(FIRST_TREE_REQUEST);
        g.next_request = ask.saturating_mul(2).min(MAX_TREE_REQUEST);
        Some(ask)
    }

    /// Taken before a subtree request is sent, and given back to [`TreeAhead::keep`]: a
    /// change of names through this client meanwhile voids the reply's listings.
    pub(crate) fn name_changes(&self) -> u64 {
        self.inner.lock().changes
    }

    /// The names of directory `dir_id` changed through this client.
    pub(crate) fn forget(&self, dir_id: u64) {
        let mut g = self.inner.lock();
        g.changes += 1;
        g.remove(dir_id);
    }

    /// Names changed through this client in directories not told apart (reintegration),
    /// or every callback is gone: nothing kept is used.
    pub(crate) fn forget_all(&self) {
        let mut g = self.inner.lock();
        g.changes += 1;
        g.kept.clear();
        g.order.clear();
        g.weight = 0;
    }

    /// Keeps listings read ahead by a request sent when [`TreeAhead::name_changes`] was `sent_at` (replacing older ones of the
    /// same directories), unless names changed through this client since; then drops the
    /// oldest beyond [`MAX_KEPT_ENTRIES`] and any older than `max_age`.
    pub(crate) fn keep(&self, listings: Vec<(u64, Kept)>, max_age: Duration, sent_at: u64) {
        let mut g = self.inner.lock();
        if g.changes != sent_at {
            return;
        }
        g.max_age = max_age;
        for (dir_id, mut k) in listings {
            g.seq += 1;
            k.seq = g.seq;
            g.weight += k.weight();
            g.order.push_back((dir_id, k.seq));
            if let Some(old) = g.kept.insert(dir_id, k) {
                g.weight -= old.weight();
            }
        }
        g.prune(Instant::now());
    }

    /// Directories with a listing kept (for tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().kept.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(n: usize, fetched: Instant) -> Kept {
        let e = hoardfs_origin::DirEntry {
            name: b"x".to_vec(),
            entry: hoardfs_origin::Entry {
                handle: hoardfs_origin::Handle { epoch: 1, id: 1 },
                attr: hoardfs_origin::Attr {
                    file_id: 1,
                    version: 1,
                    kind: hoardfs_origin::FileKind::File,
                    perm: 0o644,
                    nlink: 1,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    blocks: 0,
                    rdev: 0,
                    blksize: 4096,
                    atime: Default::default(),
                    mtime: Default::default(),
                    ctime: Default::default(),
                    acl: false,
                },
            },
        };
        let l = Arc::new(Listing {
            entries: vec![e; n],
            fetched,
            since: 0,
        });
        Kept::new(l, None)
    }

    #[test]
    fn a_walk_is_two_misses_within_the_window_and_its_requests_grow() {
        let t = TreeAhead::default();
        let t0 = Instant::now();
        assert_eq!(t.missed(t0), None);
        assert_eq!(
            t.missed(t0 + Duration::from_millis(10)),
            Some(FIRST_TREE_REQUEST)
        );
        assert_eq!(
            t.missed(t0 + Duration::from_millis(20)),
            Some(2 * FIRST_TREE_REQUEST)
        );
        let mut last = 0;
        for i in 3..20 {
            last = t.missed(t0 + Duration::from_millis(10 * i)).unwrap();
        }
        assert_eq!(last, MAX_TREE_REQUEST);
        // A pause ends the walk; the next one starts small again.
        let later = t0 + Duration::from_secs(5);
        assert_eq!(t.missed(later), None);
        assert_eq!(
            t.missed(later + Duration::from_millis(1)),
            Some(FIRST_TREE_REQUEST)
        );
    }

    #[test]
    fn kept_listings_are_used_once_bounded_and_age_out() {
        let t = TreeAhead::default();
        let now = Instant::now();
        let day = Duration::from_secs(86400);
        t.keep(
            vec![(1, listing(3, now)), (2, listing(4, now))],
            day,
            t.name_changes(),
        );
        assert_eq!(t.take(1).unwrap().listing.entries.len(), 3);
        assert!(t.take(1).is_none(), "used once");
        // Past the bound, the oldest go first.
        let big = MAX_KEPT_ENTRIES / 2;
        t.keep(vec![(3, listing(big, now))], day, t.name_changes());
        t.keep(vec![(4, listing(big, now))], day, t.name_changes());
        assert!(t.take(2).is_none() && t.take(3).is_none());
        assert!(t.take(4).is_some());
        // Too old to be useful.
        let old = now - Duration::from_secs(10);
        t.keep(
            vec![(5, listing(1, old))],
            Duration::from_secs(1),
            t.name_changes(),
        );
        assert!(t.take(5).is_none());
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn a_change_of_names_here_drops_the_listing_and_those_of_requests_in_flight() {
        let t = TreeAhead::default();
        let now = Instant::now();
        let day = Duration::from_secs(86400);
        t.keep(
            vec![(1, listing(1, now)), (2, listing(1, now))],
            day,
            t.name_changes(),
        );
        let in_flight = t.name_changes();
        t.forget(1);
        assert!(t.take(1).is_none());
        t.keep(vec![(3, listing(1, now))], day, in_flight);
        assert!(t.take(3).is_none(), "sent before the change: may miss it");
        assert!(t.take(2).is_some());
        t.keep(vec![(4, listing(1, now))], day, t.name_changes());
        t.forget_all();
        assert_eq!(t.len(), 0);
    }
}
