//! Lock requests (`Lock`, `TestLock`, `UnlockAll`, `CancelLock`): the file a handle names,
//! as the caller sees it, handed to the lock table (`locks`), and a waiting request's
//! answer sent on its connection when the table grants or ends the wait.
//!
//! The handle is checked with a `getattr` made as the caller (a handle the caller could
//! not reach answers as any other request would); locks are kept by the object's
//! `file_id`, so every handle of one file shares its locks. A granted lock is answered
//! with the file's attributes read after the grant, so the client sees what the previous
//! holder wrote without asking again.

use std::sync::Arc;

use hoardfs_origin::Origin;
use hoardfs_proto::{Handle, LockType, Op, Reply, WireError};
use tokio::sync::mpsc::UnboundedSender;

use crate::Shared;
use crate::callbacks::ConnId;
use crate::locks::{Answer, OwnerKey, Taken};
use crate::outgoing::Outgoing;

/// Answers lock request `id` of connection `conn` now, or (a queued wait) returns `None`
/// and answers it later through `later`.
pub(crate) fn handle(
    shared: &Shared,
    conn: ConnId,
    id: u64,
    op: Op,
    later: UnboundedSender<Outgoing>,
) -> Option<Outgoing> {
    let reply = |r: Result<Reply, WireError>| Some(Outgoing::new(id, r, Vec::new()));
    let locks = &shared.locks;
    match op {
        Op::Lock {
            handle,
            kind,
            owner,
            range,
            pid,
            wait,
        } => {
            let file = match file_of(shared, handle) {
                Ok(f) => f,
                Err(e) => return reply(Err(e)),
            };
            let owner = OwnerKey { conn, owner };
            let origin = Arc::clone(&shared.origin);
            let waiter = wait.then(|| (id, answer_later(id, later, origin, handle)));
            match locks.lock(file, kind, owner, range, pid, waiter) {
                Ok(Taken::Done) if range.typ != LockType::Unlock => {
                    reply(Ok(granted(&*shared.origin, handle)))
                }
                Ok(Taken::Done) => reply(Ok(Reply::Done)),
                Ok(Taken::Queued) => None,
                Err(e) => reply(Err(e)),
            }
        }
        Op::TestLock {
            handle,
            kind,
            owner,
            range,
        } => {
            let file = match file_of(shared, handle) {
                Ok(f) => f,
                Err(e) => return reply(Err(e)),
            };
            let holder = locks.test(file, kind, OwnerKey { conn, owner }, range);
            reply(Ok(Reply::LockTest(holder)))
        }
        Op::UnlockAll {
            handle,
            kind,
            owner,
        } => {
            let file = match file_of(shared, handle) {
                Ok(f) => f,
                Err(e) => return reply(Err(e)),
            };
            locks.unlock_all(file, kind, OwnerKey { conn, owner });
            reply(Ok(Reply::Done))
        }
        Op::CancelLock { request } => {
            locks.cancel(conn, request);
            reply(Ok(Reply::Done))
        }
        _ => reply(Err(WireError::Protocol)),
    }
}

/// The lock table's key for the object `handle` names, looked up as the caller.
fn file_of(shared: &Shared, handle: Handle) -> Result<u64, WireError> {
    shared
        .origin
        .getattr(handle)
        .map(|a| a.file_id)
        .map_err(crate::outgoing::wire_error)
}

/// The answer to a granted lock: the file's attributes now (the previous holder's writes
/// are in them), or `Done` if they cannot be read (the client then asks itself; the lock
/// is held either way).
fn granted(origin: &dyn Origin, handle: Handle) -> Reply {
    match origin.getattr(handle) {
        Ok(a) => Reply::Attr(a),
        Err(e) => {
            tracing::debug!("attributes of a file just locked: {e}");
            Reply::Done
        }
    }
}

/// Sends the answer of waiting request `id` on its connection (the attributes of the file
/// `handle` names once granted). Called by whichever request freed the lock, on its
/// thread: reading the attributes there needs no permission (the handle's descriptor is
/// `fstat`ed), and the waiter was allowed to look the file up when it asked.
fn answer_later(
    id: u64,
    later: UnboundedSender<Outgoing>,
    origin: Arc<dyn Origin>,
    handle: Handle,
) -> Answer {
    Box::new(move |r: Result<(), WireError>| {
        let r = r.map(|()| granted(&*origin, handle));
        // Fails only when the connection is closing: nobody to tell.
        let _ = later.send(Outgoing::new(id, r, Vec::new()));
    })
}
