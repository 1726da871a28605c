//! The server's lock table: `flock` and POSIX byte-range locks its clients hold, so that
//! processes on different clients exclude each other (protocol 7).
//!
//! One door, [`Locks`]: `lock` takes, changes or releases a lock (granting it, refusing
//! it with `WouldBlock`, or queueing the request when it may wait), `test` answers
//! `F_GETLK`, `unlock_all` ends an owner's locks on a file (its client closed the file;
//! its waits go on), `cancel` ends one wait (its process was interrupted) and `drop_conn` ends
//! everything a connection held (it closed or died). The rules of one file live in
//! `file.rs`. A waiting request is answered later, by whichever call frees its bytes,
//! through the [`Answer`] it was queued with; its request slot on the connection is not
//! kept meanwhile, so waiters never hold up a client's other requests.
//!
//! Locks are scoped to the connection: a client that reconnects holds none (it is told
//! by its own bookkeeping). Cross-client deadlocks are not detected (a lock wait ends
//! when the lock is granted, cancelled, or its connection closes).
//!
//! Bounds: a connection holds at most [`MAX_PER_CONN`] locks and waits together (beyond,
//! `NoLocks`), so a hostile client cannot grow the table without limit.
//!
//! Lock order: one mutex, a leaf; answers are sent after it is released.

mod file;

use std::collections::HashMap;

use hoardfs_proto::{LockHolder, LockKind, LockRange, WireError};
use parking_lot::Mutex;

pub(crate) use file::OwnerKey;
use file::{FileLocks, Waiter};

/// Answers a waiting lock request: `Ok` once granted, or why the wait ended.
pub(crate) type Answer = Box<dyn FnOnce(Result<(), WireError>) + Send>;

/// Most locks and waits one connection may have at once (each costs about 64 bytes; a
/// request's work grows with the locks of its file).
pub(crate) const MAX_PER_CONN: usize = 1 << 14;

/// What became of a lock request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Held (or released) now.
    Done,
    /// Queued: its answer comes later.
    Queued,
}

/// Every lock the server's clients hold.
pub(crate) struct Locks {
    /// Most locks plus waits of one connection.
    cap: usize,
    inner: Mutex<Inner>,
}

impl Default for Locks {
    fn default() -> Self {
        Locks::with_cap(MAX_PER_CONN)
    }
}

#[derive(Default)]
struct Inner {
    files: HashMap<(u64, LockKind), FileLocks<Answer>>,
    /// Locks plus waits of each connection.
    per_conn: HashMap<u64, usize>,
}

/// Answers to send once the table's lock is released.
type Answers = Vec<(Answer, Result<(), WireError>)>;

impl Inner {
    /// Runs `change` on the locks of (`file`, `kind`), keeping the per-connection counts
    /// and dropping the entry once empty.
    fn change<T>(
        &mut self,
        key: (u64, LockKind),
        change: impl FnOnce(&mut FileLocks<Answer>) -> T,
    ) -> T {
        let f = self.files.entry(key).or_default();
        let before = f.per_conn().clone();
        let out = change(f);
        let after = f.per_conn().clone();
        if f.is_empty() {
            self.files.remove(&key);
        }
        for (conn, n) in before {
            if let Some(c) = self.per_conn.get_mut(&conn) {
                *c = c.saturating_sub(n);
            }
        }
        for (conn, n) in after {
            *self.per_conn.entry(conn).or_default() += n;
        }
        self.per_conn.retain(|_, n| *n > 0);
        out
    }
}

impl Locks {
    /// A table allowing `cap` locks plus waits per connection.
    pub(crate) fn with_cap(cap: usize) -> Locks {
        Locks {
            cap,
            inner: Mutex::default(),
        }
    }

    /// Takes, changes or releases `range` for `owner` on `file`. Without `wait`, a lock in
    /// the way answers `WouldBlock`; with it (the request's id and how to answer it) the
    /// request is queued.
    pub(crate) fn lock(
        &self,
        file: u64,
        kind: LockKind,
        owner: OwnerKey,
        range: LockRange,
        pid: u32,
        wait: Option<(u64, Answer)>,
    ) -> Result<Taken, WireError> {
        if !range.is_valid() {
            return Err(WireError::Invalid);
        }
        let mut answers = Answers::new();
        let taken = {
            let mut inner = self.inner.lock();
            if inner.per_conn.get(&owner.conn).copied().unwrap_or(0) >= self.cap {
                return Err(WireError::NoLocks);
            }
            inner.change((file, kind), |f| {
                if f.try_take(owner, range, pid) {
                    granted(f, &mut answers);
                    return Ok(Taken::Done);
                }
                match wait {
                    None => Err(WireError::WouldBlock),
                    Some((request, answer)) => {
                        f.wait(Waiter {
                            owner,
                            range,
                            pid,
                            request,
                            answer,
                        });
                        Ok(Taken::Queued)
                    }
                }
            })
        };
        send(answers);
        taken
    }

    /// The lock in the way of `owner` taking `range` on `file`, if any.
    pub(crate) fn test(
        &self,
        file: u64,
        kind: LockKind,
        owner: OwnerKey,
        range: LockRange,
    ) -> Option<LockHolder> {
        let inner = self.inner.lock();
        inner.files.get(&(file, kind))?.test(owner, &range)
    }

    /// Releases what `owner` holds on `file` (its waits go on; see `FileLocks::release`).
    pub(crate) fn unlock_all(&self, file: u64, kind: LockKind, owner: OwnerKey) {
        let mut answers = Answers::new();
        {
            let mut inner = self.inner.lock();
            if inner.files.contains_key(&(file, kind)) {
                inner.change((file, kind), |f| {
                    f.release(owner);
                    granted(f, &mut answers);
                });
            }
        }
        send(answers);
    }

    /// Ends the wait of request `request` on `conn` (`Interrupted`); false if it was not
    /// waiting (granted already, or unknown).
    pub(crate) fn cancel(&self, conn: u64, request: u64) -> bool {
        let mut answers = Answers::new();
        {
            let mut inner = self.inner.lock();
            let keys: Vec<_> = inner.files.keys().copied().collect();
            for key in keys {
                let found = inner.change(key, |f| {
                    let w = f.cancel(conn, request)?;
                    answers.push((w.answer, Err(WireError::Interrupted)));
                    granted(f, &mut answers);
                    Some(())
                });
                if found.is_some() {
                    break;
                }
            }
        }
        let found = !answers.is_empty();
        send(answers);
        found
    }

    /// Ends everything connection `conn` held or waited for (it closed).
    pub(crate) fn drop_conn(&self, conn: u64) {
        let mut answers = Answers::new();
        {
            let mut inner = self.inner.lock();
            if !inner.per_conn.contains_key(&conn) {
                return;
            }
            let keys: Vec<_> = inner.files.keys().copied().collect();
            for key in keys {
                inner.change(key, |f| {
                    // Nobody reads this connection's answers any more.
                    drop(f.release_conn(conn));
                    granted(f, &mut answers);
                });
            }
        }
        send(answers);
    }

    /// Locks plus waits of `conn` (for tests and counters).
    #[cfg(test)]
    pub(crate) fn count(&self, conn: u64) -> usize {
        self.inner.lock().per_conn.get(&conn).copied().unwrap_or(0)
    }
}

/// Grants what can be granted on `f`, queueing the answers.
fn granted(f: &mut FileLocks<Answer>, answers: &mut Answers) {
    for w in f.grant() {
        answers.push((w.answer, Ok(())));
    }
}

fn send(answers: Answers) {
    for (answer, result) in answers {
        answer(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_proto::LockType;
    use std::sync::mpsc;

    fn owner(conn: u64) -> OwnerKey {
        OwnerKey { conn, owner: 1 }
    }
    fn whole(typ: LockType) -> LockRange {
        LockRange {
            typ,
            start: 0,
            end: hoardfs_proto::LOCK_TO_EOF,
        }
    }
    fn answer() -> (Answer, mpsc::Receiver<Result<(), WireError>>) {
        let (tx, rx) = mpsc::channel();
        (Box::new(move |r| tx.send(r).unwrap()), rx)
    }

    #[test]
    fn a_waiter_is_answered_when_the_holder_releases_and_kinds_do_not_mix() {
        let l = Locks::default();
        let ex = whole(LockType::Write);
        assert_eq!(
            l.lock(7, LockKind::Flock, owner(1), ex, 1, None),
            Ok(Taken::Done)
        );
        assert_eq!(
            l.lock(7, LockKind::Posix, owner(2), ex, 2, None),
            Ok(Taken::Done),
            "flock and POSIX locks are independent"
        );
        assert_eq!(
            l.lock(7, LockKind::Flock, owner(2), ex, 2, None),
            Err(WireError::WouldBlock)
        );
        let (a, rx) = answer();
        assert_eq!(
            l.lock(7, LockKind::Flock, owner(2), ex, 2, Some((99, a))),
            Ok(Taken::Queued)
        );
        assert!(rx.try_recv().is_err());
        l.lock(
            7,
            LockKind::Flock,
            owner(1),
            whole(LockType::Unlock),
            1,
            None,
        )
        .unwrap();
        assert_eq!(rx.try_recv(), Ok(Ok(())));
        assert!(l.test(7, LockKind::Flock, owner(1), ex).is_some());
    }

    #[test]
    fn cancel_unlock_all_and_a_closed_connection_end_waits_and_free_their_counts() {
        let l = Locks::default();
        let ex = whole(LockType::Write);
        l.lock(1, LockKind::Posix, owner(1), ex, 1, None).unwrap();
        let (a, rx_a) = answer();
        let (b, rx_b) = answer();
        l.lock(1, LockKind::Posix, owner(2), ex, 2, Some((5, a)))
            .unwrap();
        l.lock(1, LockKind::Posix, owner(3), ex, 3, Some((6, b)))
            .unwrap();
        assert!(l.cancel(2, 5));
        assert_eq!(rx_a.try_recv(), Ok(Err(WireError::Interrupted)));
        assert!(!l.cancel(2, 5));
        assert_eq!(l.count(2), 0);
        l.drop_conn(1);
        assert_eq!(rx_b.try_recv(), Ok(Ok(())), "the next waiter gets it");
        assert_eq!(l.count(1), 0);
        // A close releases an owner's locks but not its waits.
        let (c, rx_c) = answer();
        l.lock(1, LockKind::Posix, owner(4), ex, 4, Some((7, c)))
            .unwrap();
        l.unlock_all(1, LockKind::Posix, owner(4));
        assert!(rx_c.try_recv().is_err(), "still waiting");
        l.unlock_all(1, LockKind::Posix, owner(3));
        assert_eq!(rx_c.try_recv(), Ok(Ok(())));
        l.unlock_all(1, LockKind::Posix, owner(4));
        assert_eq!(l.count(3), 0);
        assert_eq!(l.count(4), 0);
        assert!(l.inner.lock().files.is_empty());
    }

    #[test]
    fn a_connection_cannot_grow_the_table_without_bound() {
        let l = Locks::with_cap(100);
        for i in 0..100 {
            let r = LockRange {
                typ: LockType::Read,
                start: 2 * i,
                end: 2 * i,
            };
            l.lock(1, LockKind::Posix, owner(1), r, 1, None).unwrap();
        }
        let r = LockRange {
            typ: LockType::Read,
            start: u64::MAX - 1,
            end: u64::MAX - 1,
        };
        assert_eq!(
            l.lock(1, LockKind::Posix, owner(1), r, 1, None),
            Err(WireError::NoLocks)
        );
        assert_eq!(
            l.lock(2, LockKind::Posix, owner(2), r, 1, None),
            Ok(Taken::Done),
            "other connections are not affected"
        );
        let bad = LockRange {
            typ: LockType::Read,
            start: 5,
            end: 4,
        };
        assert_eq!(
            l.lock(3, LockKind::Posix, owner(2), bad, 1, None),
            Err(WireError::Invalid)
        );
    }
}
