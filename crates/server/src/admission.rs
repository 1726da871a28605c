//! Who gets in and how much they may hold: the server's resource bounds.
//!
//! - **Handshakes**: at most `max_handshakes` connections may be between accept and an
//!   accepted `Hello` (TLS handshake included), `max_handshakes_per_source` of them from
//!   one source, with random early drop past half full (module `handshakes`), so a flood
//!   of idle sockets delays nobody for long (as sshd's MaxStartups drops).
//! - **Connections**: at most `max_connections` authenticated at once; one more is told
//!   `Busy` and closed.
//! - **Memory**: a quarter of the server's budget is set aside for callback sets (charged
//!   as they grow) and the recent change reports take theirs at start; every request's
//!   data (write
//!   payloads, read lengths) is charged, in
//!   [`UNIT`]s, to its connection's budget and to the server's; the charge is released
//!   when the reply has been *written* to the socket. A client that stops reading replies
//!   therefore stops being served once its budget is spent: it costs bounded memory, and
//!   others keep working.
//! - **Sessions**: every authenticated connection is registered under its credential
//!   ([`Principal`]), so that revoking the credential ends it ([`Sessions::revoke`]).
//! - **Failed credentials**: counted per source address ([`Failures`]); past a few, each
//!   further attempt waits longer before it is answered, and log lines are thinned.
//!
//! Locks: each mutex here is a leaf, held for a few map operations and never across an
//! await.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::credentials::{Check, Credentials, Gone};
pub(crate) use crate::handshakes::HandshakeTicket;
use crate::handshakes::{Handshakes, network_of};
use crate::units::UNIT;

/// The admission state of one server.
pub(crate) struct Admission {
    handshakes: Arc<Handshakes>,
    connections: Arc<Semaphore>,
    /// Budget units of the whole server's requests.
    memory: Arc<Semaphore>,
    /// Budget units of its callback sets (a quarter of the whole, set aside).
    callback_memory: Arc<Semaphore>,
    /// Budget units of one connection.
    pub(crate) per_conn_units: usize,
    pub(crate) failures: Failures,
    pub(crate) sessions: Sessions,
}

impl Admission {
    pub(crate) fn new(cfg: &crate::ServerConfig) -> Admission {
        let units = |bytes: usize| bytes.div_ceil(UNIT).max(1);
        // One request must always fit (a read of up to MAX_READ_LEN).
        let min = units(hoardfs_proto::MAX_READ_LEN.max(hoardfs_proto::MAX_WRITE_LEN) as usize);
        let per_conn = units(cfg.memory_per_conn).max(min);
        Admission {
            handshakes: Arc::new(Handshakes::new(
                cfg.max_handshakes,
                cfg.max_handshakes_per_source,
            )),
            connections: Arc::new(Semaphore::new(cfg.max_connections.max(1))),
            // The change reports kept for settling listings and a quarter for callback
            // sets are set aside first (module `callbacks`): requests never wait for
            // memory callback sets hold, nor callbacks for requests'.
            memory: Arc::new(Semaphore::new(
                units(cfg.memory_total)
                    .saturating_sub(units(crate::callbacks::RECENT_BYTES))
                    .saturating_sub(units(cfg.memory_total) / 4)
                    .max(per_conn),
            )),
            callback_memory: Arc::new(Semaphore::new((units(cfg.memory_total) / 4).max(1))),
            per_conn_units: per_conn,
            failures: Failures::default(),
            sessions: Sessions::default(),
        }
    }

    /// Registers a connection from `peer` in its handshake (module `handshakes`);
    /// `None`: dropped at once to keep room for others.
    pub(crate) fn begin_handshake(&self, peer: IpAddr) -> Option<HandshakeTicket> {
        let deadline = tokio::time::Instant::now() + crate::handshakes::HELLO_TIMEOUT;
        self.handshakes.begin(peer, deadline, rand::random::<f64>())
    }

    /// The share of the server's memory budget callback sets are charged to.
    pub(crate) fn callback_memory(&self) -> Arc<Semaphore> {
        Arc::clone(&self.callback_memory)
    }

    /// A slot for one authenticated connection, if any is free.
    pub(crate) fn admit(&self) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.connections).try_acquire_owned().ok()
    }

    /// Charges `units` to the server's budget, waiting until they are free.
    pub(crate) async fn charge(&self, units: u32) -> Option<OwnedSemaphorePermit> {
        Arc::clone(&self.memory)
            .acquire_many_owned(units)
            .await
            .ok()
    }
}

/// Who a session authenticated as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Principal {
    /// Let in while no credential was required; ended as soon as one is.
    Open,
    /// A credential: its name and its token's digest (a name added again with a new
    /// token is another credential).
    Named { name: String, digest: [u8; 32] },
}

/// Authenticated connections by credential, so that revoking one closes them.
#[derive(Default)]
pub(crate) struct Sessions {
    live: Mutex<HashMap<u64, (Principal, Arc<Notify>)>>,
    next: AtomicU64,
}

impl Admission {
    /// Registers the session of a connection whose token the handshake's check let in
    /// as `principal`, then judges the token again. A revocation read in between was
    /// revoked before this session could be found; it shows in that second judgement
    /// (`None`: refuse). One read after it finds the session ([`Sessions::revoke`]).
    /// The notify fires on revocation; the session is forgotten when the guard drops.
    pub(crate) fn open_session(
        self: &Arc<Self>,
        principal: Principal,
        credentials: &Credentials,
        token: &[u8],
        rights: &crate::credentials::Rights,
    ) -> Option<(Arc<Notify>, SessionGuard)> {
        let named = matches!(principal, Principal::Named { .. });
        let id = self.sessions.next.fetch_add(1, Ordering::Relaxed);
        let n = Arc::new(Notify::new());
        self.sessions
            .live
            .lock()
            .insert(id, (principal, Arc::clone(&n)));
        let guard = SessionGuard {
            id,
            admission: Arc::clone(self),
        };
        // Still valid, and with the rights the session was let in with (rights changed
        // meanwhile end it as a revocation does).
        let still = match credentials.judge(token) {
            Check::Accepted(_, now) => now == *rights,
            _ => false,
        };
        if named && !still {
            return None;
        }
        Some((n, guard))
    }
}

impl Sessions {
    /// Ends the sessions of credentials that went away; returns how many.
    pub(crate) fn revoke(&self, gone: &[Gone]) -> usize {
        self.end(|p| {
            matches!(p, Principal::Named { name, digest }
                if gone.iter().any(|g| g.name == *name && g.digest == *digest))
        })
    }

    /// Ends the sessions let in while no credential was required; returns how many.
    pub(crate) fn revoke_open(&self) -> usize {
        self.end(|p| *p == Principal::Open)
    }

    fn end(&self, which: impl Fn(&Principal) -> bool) -> usize {
        let live = self.live.lock();
        let mut n = 0;
        for (principal, notify) in live.values() {
            if which(principal) {
                notify.notify_one();
                n += 1;
            }
        }
        n
    }
}

/// A registered session; forgotten when dropped (its connection ended).
pub(crate) struct SessionGuard {
    id: u64,
    admission: Arc<Admission>,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.admission.sessions.live.lock().remove(&self.id);
    }
}

/// Failed credential attempts by source address.
#[derive(Default)]
pub(crate) struct Failures {
    by_addr: Mutex<HashMap<IpAddr, Record>>,
}

#[derive(Clone, Copy)]
struct Record {
    count: u32,
    since: Instant,
}

/// Failures of one address forgotten after this long without another.
const FAILURE_WINDOW: Duration = Duration::from_secs(600);
/// Failures answered at once; beyond them each waits longer.
const FREE_FAILURES: u32 = 5;
/// Longest wait before a refusal is sent.
const MAX_DELAY: Duration = Duration::from_secs(10);
/// Addresses remembered at most (the oldest are forgotten first).
const MAX_ADDRS: usize = 65_536;

/// What to do about one failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Failures of this address within the window, this one included.
    pub(crate) count: u32,
    /// Wait this long before answering.
    pub(crate) delay: Duration,
    /// Whether to log this one (the first few, then every 100th).
    pub(crate) log: bool,
}

impl Failures {
    /// Records a failure from `addr` and says how to answer it. IPv6 addresses count by
    /// their /64, which one host can rotate through freely.
    pub(crate) fn record(&self, addr: IpAddr, now: Instant) -> Verdict {
        let addr = network_of(addr);
        let mut map = self.by_addr.lock();
        if map.len() >= MAX_ADDRS && !map.contains_key(&addr) {
            map.retain(|_, r| now.duration_since(r.since) < FAILURE_WINDOW);
            if map.len() >= MAX_ADDRS
                && let Some(oldest) = map.iter().min_by_key(|(_, r)| r.since).map(|(a, _)| *a)
            {
                map.remove(&oldest);
            }
        }
        let r = map.entry(addr).or_insert(Record {
            count: 0,
            since: now,
        });
        if now.duration_since(r.since) >= FAILURE_WINDOW {
            *r = Record {
                count: 0,
                since: now,
            };
        }
        r.count = r.count.saturating_add(1);
        r.since = now;
        let over = r.count.saturating_sub(FREE_FAILURES);
        let delay = if over == 0 {
            Duration::ZERO
        } else {
            (Duration::from_millis(100) * 2u32.saturating_pow(over.min(10) - 1)).min(MAX_DELAY)
        };
        Verdict {
            count: r.count,
            delay,
            log: r.count <= FREE_FAILURES || r.count.is_multiple_of(100),
        }
    }

    /// Forgets an address's failures (after it authenticated).
    pub(crate) fn clear(&self, addr: IpAddr) {
        self.by_addr.lock().remove(&network_of(addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::credentials::{Credentials, admin, sha256};

    fn named(name: &str, token: &str) -> Principal {
        Principal::Named {
            name: name.into(),
            digest: sha256(token.as_bytes()),
        }
    }

    /// Whether `n` has been notified (a permit is stored when nobody waited).
    async fn fired(n: &Notify) -> bool {
        tokio::time::timeout(Duration::from_millis(20), n.notified())
            .await
            .is_ok()
    }

    #[test]
    fn a_revocation_read_during_a_handshake_refuses_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let t = admin::add(dir.path(), "a", &Default::default()).unwrap();
        let creds = Credentials::new(None, Some(dir.path())).unwrap();
        let adm = Arc::new(Admission::new(&Default::default()));
        // The handshake's check passes ...
        assert_eq!(
            creds.check(t.as_bytes()),
            Check::Accepted("a".into(), Default::default())
        );
        // ... the periodic check reads the revocation before the session is registered,
        // so it finds nothing to close ...
        admin::revoke(dir.path(), "a").unwrap();
        let gone = creds.take_revoked();
        assert_eq!(adm.sessions.revoke(&gone), 0);
        // ... and registering the session refuses it, leaving nothing registered.
        assert!(
            adm.open_session(named("a", &t), &creds, t.as_bytes(), &Default::default())
                .is_none()
        );
        assert!(adm.sessions.live.lock().is_empty());
    }

    #[tokio::test]
    async fn revoking_a_credential_ends_its_sessions_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let old = admin::add(dir.path(), "a", &Default::default()).unwrap();
        let b = admin::add(dir.path(), "b", &Default::default()).unwrap();
        let creds = Credentials::new(None, Some(dir.path())).unwrap();
        let adm = Arc::new(Admission::new(&Default::default()));
        let open = |t: &str, name: &str| {
            assert_eq!(
                creds.check(t.as_bytes()),
                Check::Accepted(name.into(), Default::default())
            );
            adm.open_session(named(name, t), &creds, t.as_bytes(), &Default::default())
                .expect("a valid credential opens a session")
        };
        let (a_old, _g1) = open(&old, "a");
        let (b_n, _g2) = open(&b, "b");
        // "a" is rotated: revoked and added again with a new token, and a client
        // reconnects with the new one before the periodic check runs.
        admin::revoke(dir.path(), "a").unwrap();
        let new = admin::add(dir.path(), "a", &Default::default()).unwrap();
        let (a_new, _g3) = open(&new, "a");
        let gone = creds.take_revoked();
        assert_eq!(adm.sessions.revoke(&gone), 1);
        assert!(fired(&a_old).await, "the old token's session is ended");
        assert!(!fired(&a_new).await, "the new token's session stays");
        assert!(!fired(&b_n).await, "another credential's session stays");
    }

    #[test]
    fn failures_slow_down_past_the_free_ones_and_reset_after_the_window() {
        let f = Failures::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let t0 = Instant::now();
        for i in 1..=FREE_FAILURES {
            let v = f.record(a, t0);
            assert_eq!((v.count, v.delay, v.log), (i, Duration::ZERO, true));
        }
        let v = f.record(a, t0);
        assert_eq!(v.delay, Duration::from_millis(100));
        assert!(!v.log);
        let v = f.record(a, t0);
        assert_eq!(v.delay, Duration::from_millis(200));
        for _ in 0..50 {
            f.record(a, t0);
        }
        assert_eq!(f.record(a, t0).delay, MAX_DELAY);
        // Another address is not slowed by the first one's failures.
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(f.record(b, t0).delay, Duration::ZERO);
        // After a quiet window, the count starts over.
        let later = t0 + FAILURE_WINDOW + Duration::from_secs(1);
        assert_eq!(f.record(a, later).count, 1);
        f.clear(b);
        assert_eq!(f.record(b, later).count, 1);
        // One IPv6 host rotating through its /64 counts as one.
        let v6 = |s: &str| s.parse::<IpAddr>().unwrap();
        // An IPv4 peer of a dual-stack listener is its IPv4 address, not the /64 of ::ffff:0:0.
        let mapped = |a: &str| IpAddr::V6(a.parse().unwrap());
        assert_eq!(
            network_of(mapped("::ffff:10.0.0.1")),
            IpAddr::from([10, 0, 0, 1])
        );
        assert_ne!(
            network_of(mapped("::ffff:10.0.0.1")),
            network_of(mapped("::ffff:10.0.0.2"))
        );
        assert_eq!(f.record(v6("2001:db8::1"), t0).count, 1);
        assert_eq!(f.record(v6("2001:db8::2:3"), t0).count, 2);
        assert_eq!(f.record(v6("2001:db8:0:1::1"), t0).count, 1);
    }

    #[tokio::test]
    async fn a_source_over_its_share_of_handshakes_loses_its_oldest() {
        let cfg = crate::ServerConfig {
            max_handshakes_per_source: 1,
            ..Default::default()
        };
        let adm = Arc::new(Admission::new(&cfg));
        let peer: IpAddr = "10.1.2.3".parse().unwrap();
        let a = adm.begin_handshake(peer).expect("room");
        let evicted = a.evicted.notified();
        let _b = adm.begin_handshake(peer).expect("room");
        tokio::time::timeout(Duration::from_secs(1), evicted)
            .await
            .expect("the older handshake is told to go");
    }

    #[test]
    fn connections_beyond_the_limit_are_not_admitted() {
        let cfg = crate::ServerConfig {
            max_connections: 2,
            ..Default::default()
        };
        let adm = Admission::new(&cfg);
        let x = adm.admit().unwrap();
        let _y = adm.admit().unwrap();
        assert!(adm.admit().is_none());
        drop(x);
        assert!(adm.admit().is_some());
    }
}
