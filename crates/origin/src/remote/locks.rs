//! File locks through the server (protocol 7): [`crate::Locks`] for [`RemoteOrigin`].
//! A waiting lock is one request whose reply comes when the server grants it
//! ([`Conn::call_later`]); cancelling it sends `CancelLock` on the same connection. Locks
//! live on the connection: when it dies, the server releases them, and its waits are
//! answered `Lost`.

use hoardfs_proto::{Attr, Handle, LockHolder, LockKind, LockRange, Op, Reply};

use super::{RemoteOrigin, unexpected, validate};
use crate::{LockAnswer, LockTicket, Locks, Result};

impl Locks for RemoteOrigin {
    fn lock(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
    ) -> Result<Option<Attr>> {
        granted(self.request(Op::Lock {
            handle,
            kind,
            owner,
            range,
            pid,
            wait: false,
        })?)
    }

    fn lock_waiting(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
        answer: LockAnswer,
    ) -> Option<LockTicket> {
        let conn = match self.conn() {
            Ok(c) => c,
            Err(e) => {
                answer(Err(e));
                return None;
            }
        };
        let request = self.next_request_id();
        let op = Op::Lock {
            handle,
            kind,
            owner,
            range,
            pid,
            wait: true,
        };
        let expect = validate::Expect::of(&op, 0);
        conn.call_later(
            request,
            op,
            Box::new(move |r| {
                answer(
                    r.and_then(|a| validate::answer(&expect, a))
                        .and_then(granted),
                )
            }),
        );
        Some(LockTicket {
            conn: conn.serial(),
            request,
        })
    }

    fn cancel(&self, ticket: LockTicket) {
        // On another connection the wait has been answered already (`Lost`).
        let Some(conn) = self.live_conn().filter(|c| c.serial() == ticket.conn) else {
            return;
        };
        let id = self.next_request_id();
        let op = Op::CancelLock {
            request: ticket.request,
        };
        if let Err(e) = conn.call(id, op, self.opts.request_timeout) {
            tracing::debug!("cancelling lock request {}: {e}", ticket.request);
        }
    }

    fn test(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
    ) -> Result<Option<LockHolder>> {
        match self.request(Op::TestLock {
            handle,
            kind,
            owner,
            range,
        })? {
            (Reply::LockTest(holder), _) => Ok(holder),
            other => Err(unexpected(&other)),
        }
    }

    fn unlock_all(&self, handle: Handle, kind: LockKind, owner: u64) -> Result<()> {
        self.done(
            Op::UnlockAll {
                handle,
                kind,
                owner,
            },
            &[],
        )
    }
}

/// What a granted `Lock` answered: the file's attributes, or `Done`.
fn granted(answer: super::Answer) -> Result<Option<Attr>> {
    match answer {
        (Reply::Attr(a), _) => Ok(Some(a)),
        (Reply::Done, _) => Ok(None),
        other => Err(unexpected(&other)),
    }
}
