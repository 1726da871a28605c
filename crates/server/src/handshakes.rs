//! Connections between accept and an accepted `Hello` (the TLS handshake included): at
//! most `max` at once, and at most `per_source` from one source (an IPv4 address or an
//! IPv6 /64), so that a flood of idle connections from a few sources keeps nobody else
//! out (OpenSSH's `MaxStartups` and `PerSourceMaxStartups`):
//!
//! - a source at its share makes room by losing its own oldest pending connection that
//!   is only waiting to be told its credential was refused (it loses nothing), else its
//!   oldest that has sent nothing yet (an honest client starts its TLS handshake at once,
//!   so behind the same address as a flood of silent connections or of wrong guesses it
//!   is not the one to go), else its oldest;
//! - a full table makes room the same way in the source that holds the most;
//! - past half full, a new connection from a source that already has connections pending
//!   is dropped at once with a probability that grows to 1 as the table fills (random
//!   early drop); a source with none pending is never dropped so.
//!
//! Lock: one mutex, a leaf, held for a few map operations and never across an await.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How long a new connection may take to finish its TLS handshake and send its `Hello`.
pub(crate) const HELLO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The source a peer counts as (for pending handshakes and failed credentials): an
/// IPv4 address, or an IPv6 /64.
pub(crate) fn network_of(addr: IpAddr) -> IpAddr {
    // An IPv4 peer of a dual-stack listener arrives as ::ffff:a.b.c.d: its own address.
    match addr.to_canonical() {
        v4 @ IpAddr::V4(_) => v4,
        IpAddr::V6(v6) => {
            let mut o = v6.octets();
            o[8..].fill(0);
            IpAddr::from(o)
        }
    }
}

/// The pending handshakes of one server.
pub(crate) struct Handshakes {
    inner: Mutex<Inner>,
    max: usize,
    per_source: usize,
    next: AtomicU64,
}

/// How far a pending handshake has come, in the order they are evicted.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Stage {
    /// Its credential was refused; it waits out the delay that slows guessing.
    Refused,
    /// It has sent nothing yet.
    Silent,
    /// It has sent its first bytes.
    Talking,
}

#[derive(Default)]
struct Inner {
    /// Oldest first: ticket id, source, what tells the connection to give up, and how far
    /// it has come.
    queue: VecDeque<(u64, IpAddr, Arc<Notify>, Stage)>,
    by_source: HashMap<IpAddr, usize>,
}

impl Inner {
    /// Evicts the oldest pending handshake of `source` among those at the earliest stage
    /// (refused, then silent, then talking).
    fn evict_oldest_of(&mut self, source: IpAddr) {
        let i = self
            .queue
            .iter()
            .enumerate()
            .filter(|(_, (_, s, ..))| *s == source)
            .min_by_key(|(i, (.., stage))| (*stage, *i))
            .map(|(i, _)| i);
        if let Some(i) = i {
            let (_, s, n, _) = self.queue.remove(i).expect("found above");
            n.notify_one();
            self.forget(s);
        }
    }

    fn forget(&mut self, source: IpAddr) {
        if let Some(c) = self.by_source.get_mut(&source) {
            *c -= 1;
            if *c == 0 {
                self.by_source.remove(&source);
            }
        }
    }
}

/// A connection's place among the handshakes; leaves the table when dropped.
pub(crate) struct HandshakeTicket {
    id: u64,
    source: IpAddr,
    /// Fires when this handshake was evicted to make room.
    pub(crate) evicted: Arc<Notify>,
    /// When the TLS handshake and `Hello` must be done by.
    pub(crate) deadline: tokio::time::Instant,
    table: Arc<Handshakes>,
}

impl HandshakeTicket {
    /// The connection sent its first bytes: among its source's, it is evicted after the
    /// silent ones.
    pub(crate) fn talking(&self) {
        self.reach(Stage::Talking);
    }

    /// The connection's credential was refused and it waits to be told so: among its
    /// source's, it is evicted first.
    pub(crate) fn refused(&self) {
        self.reach(Stage::Refused);
    }

    fn reach(&self, stage: Stage) {
        let mut inner = self.table.inner.lock();
        if let Some(e) = inner.queue.iter_mut().find(|(id, ..)| *id == self.id) {
            e.3 = stage;
        }
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        let mut inner = self.table.inner.lock();
        if let Some(i) = inner.queue.iter().position(|(id, ..)| *id == self.id) {
            inner.queue.remove(i);
            inner.forget(self.source);
        }
    }
}

impl Handshakes {
    /// At most `max` pending handshakes, `per_source` of them from one source.
    pub(crate) fn new(max: usize, per_source: usize) -> Handshakes {
        Handshakes {
            inner: Mutex::default(),
            max: max.max(1),
            per_source: per_source.max(1),
            next: AtomicU64::new(0),
        }
    }

    /// Registers a connection from `peer` that must finish its handshake by `deadline`;
    /// `None`: dropped at once (random early drop, with `roll` a uniform draw in [0, 1)).
    pub(crate) fn begin(
        self: &Arc<Self>,
        peer: IpAddr,
        deadline: tokio::time::Instant,
        roll: f64,
    ) -> Option<HandshakeTicket> {
        let source = network_of(peer);
        let mut inner = self.inner.lock();
        let pending = inner.queue.len();
        let mine = inner.by_source.get(&source).copied().unwrap_or(0);
        let start = self.max / 2;
        if mine > 0 && pending >= start {
            let p = (pending - start + 1) as f64 / (self.max - start + 1) as f64;
            if roll < p {
                return None;
            }
        }
        if mine >= self.per_source {
            inner.evict_oldest_of(source);
        }
        while inner.queue.len() >= self.max {
            let largest = inner
                .by_source
                .iter()
                .max_by_key(|(_, c)| **c)
                .map(|(s, _)| *s);
            match largest {
                Some(s) => inner.evict_oldest_of(s),
                None => break,
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let evicted = Arc::new(Notify::new());
        inner
            .queue
            .push_back((id, source, Arc::clone(&evicted), Stage::Silent));
        *inner.by_source.entry(source).or_default() += 1;
        Some(HandshakeTicket {
            id,
            source,
            evicted,
            deadline,
            table: Arc::clone(self),
        })
    }

    /// Pending handshakes (for tests).
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.inner.lock().queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn soon() -> tokio::time::Instant {
        tokio::time::Instant::now() + std::time::Duration::from_secs(10)
    }

    /// Whether `t`'s eviction was signalled (without a runtime: a stored permit).
    fn was_evicted(t: &HandshakeTicket) -> bool {
        let n = Arc::clone(&t.evicted);
        let fut = n.notified();
        let mut fut = std::pin::pin!(fut);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        fut.as_mut().poll(&mut cx).is_ready()
    }

    use std::future::Future;

    #[test]
    fn a_flood_from_one_source_evicts_only_its_own() {
        let h = Arc::new(Handshakes::new(256, 8));
        let honest = h.begin(ip(2), soon(), 0.99).unwrap();
        let flood: Vec<_> = (0..2000)
            .filter_map(|_| h.begin(ip(1), soon(), 0.99))
            .collect();
        assert!(!was_evicted(&honest));
        assert_eq!(h.pending(), 9, "8 of the flood and the honest one");
        let evicted = flood.iter().filter(|t| was_evicted(t)).count();
        assert_eq!(evicted, 2000 - 8);
        // A newcomer behind the flooding address gets in too (the flood's oldest goes).
        let same = h.begin(ip(1), soon(), 0.99).unwrap();
        assert!(!was_evicted(&same));
        drop(flood);
        assert_eq!(h.pending(), 2, "the honest one and the newcomer remain");
    }

    #[test]
    fn behind_a_flooding_address_a_client_that_talks_is_not_evicted() {
        let h = Arc::new(Handshakes::new(256, 8));
        let early: Vec<_> = (0..4)
            .filter_map(|_| h.begin(ip(1), soon(), 0.99))
            .collect();
        let honest = h.begin(ip(1), soon(), 0.99).unwrap();
        honest.talking();
        // Silent connections from the same address keep coming, far past its share.
        let flood: Vec<_> = (0..2000)
            .filter_map(|_| h.begin(ip(1), soon(), 0.99))
            .collect();
        assert!(!was_evicted(&honest));
        assert!(early.iter().all(was_evicted));
        assert_eq!(flood.iter().filter(|t| !was_evicted(t)).count(), 7);
    }

    #[test]
    fn behind_a_flood_of_wrong_guesses_a_client_that_talks_is_not_evicted() {
        let h = Arc::new(Handshakes::new(256, 8));
        let guesses: Vec<_> = (0..7)
            .map(|_| h.begin(ip(1), soon(), 0.99).unwrap())
            .collect();
        let honest = h.begin(ip(1), soon(), 0.99).unwrap();
        honest.talking();
        for g in &guesses {
            g.talking();
            g.refused();
        }
        // More guesses, each talking and refused in turn: refused ones make the room.
        let more: Vec<_> = (0..2000)
            .filter_map(|_| {
                let t = h.begin(ip(1), soon(), 0.99)?;
                t.talking();
                t.refused();
                Some(t)
            })
            .collect();
        assert!(!was_evicted(&honest));
        assert!(guesses.iter().all(was_evicted));
        assert_eq!(more.iter().filter(|t| !was_evicted(t)).count(), 7);
    }

    #[test]
    fn a_full_table_evicts_from_the_largest_source() {
        let h = Arc::new(Handshakes::new(8, 8));
        let few: Vec<_> = (0..2)
            .map(|_| h.begin(ip(1), soon(), 0.99).unwrap())
            .collect();
        let many: Vec<_> = (0..6)
            .map(|_| h.begin(ip(2), soon(), 0.99).unwrap())
            .collect();
        let third = h.begin(ip(3), soon(), 0.99).unwrap();
        assert!(!was_evicted(&third));
        assert!(few.iter().all(|t| !was_evicted(t)));
        assert!(
            was_evicted(&many[0]),
            "the largest source's oldest made room"
        );
        assert_eq!(h.pending(), 8);
    }

    #[test]
    fn random_early_drop_spares_sources_with_nothing_pending() {
        let h = Arc::new(Handshakes::new(100, 1000));
        let kept: Vec<_> = (0..80)
            .filter_map(|_| h.begin(ip(1), soon(), 0.99))
            .collect();
        // At 80 of 100 pending, a roll below (80-50+1)/51 drops a second connection...
        assert!(h.begin(ip(1), soon(), 0.1).is_none());
        // ...but never a source's first.
        assert!(h.begin(ip(9), soon(), 0.0).is_some());
        // Below half full, nothing is dropped.
        let h2 = Arc::new(Handshakes::new(100, 1000));
        let _few: Vec<_> = (0..10)
            .map(|_| h2.begin(ip(1), soon(), 0.0).unwrap())
            .collect();
        drop(kept);
    }
}
