//! Lock requests at the FUSE boundary: `GETLK`, `SETLK`, `SETLKW` (POSIX and, with
//! `FUSE_LK_FLOCK`, `flock`) translated for [`HoardFs`], and the waits of `SETLKW`.
//!
//! A waiting lock never holds a FUSE worker thread: its reply is handed to the origin's
//! answer and sent from there when the server grants the lock. An `INTERRUPT` for it (its
//! process got a signal) cancels the wait on the server, whose answer replies `EINTR`
//! (the kernel restarts the call if the signal's handler asks for it).
//!
//! Lock order: `waits` is a leaf, never held across a call into the file system.

use std::collections::HashMap;
use std::sync::Arc;

use fuser::{Errno, ReplyEmpty, ReplyLock, RequestId};
use hoardfs_fs::{FsError, HoardFs, Ino};
use hoardfs_origin::{LockKind, LockRange, LockTicket, LockType};
use parking_lot::Mutex;

use crate::errno;

/// Where a waiting lock request stands, by the kernel's request id.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// Sent, no ticket yet.
    Starting,
    /// Waiting on the server.
    Waiting(LockTicket),
    /// Interrupted before its ticket was known: cancel it as soon as it is.
    Interrupted,
}

/// The lock waits in progress.
#[derive(Default)]
pub(crate) struct LockWaits {
    waits: Arc<Mutex<HashMap<u64, Wait>>>,
}

/// The type of a `struct flock` as a wire type.
fn lock_type(typ: i32) -> Option<LockType> {
    match typ {
        libc::F_RDLCK => Some(LockType::Read),
        libc::F_WRLCK => Some(LockType::Write),
        libc::F_UNLCK => Some(LockType::Unlock),
        _ => None,
    }
}

/// The kernel's number for a lock type.
fn kernel_type(typ: LockType) -> i32 {
    match typ {
        LockType::Read => libc::F_RDLCK,
        LockType::Write => libc::F_WRLCK,
        LockType::Unlock => libc::F_UNLCK,
    }
}

impl LockWaits {
    /// `GETLK`: the lock in the way, or the asked range as unlocked.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn getlk(
        fs: &HoardFs,
        ino: Ino,
        owner: u64,
        start: u64,
        end: u64,
        typ: i32,
        reply: ReplyLock,
    ) {
        let Some(typ) = lock_type(typ) else {
            return reply.error(Errno::EINVAL);
        };
        let range = LockRange { typ, start, end };
        match fs.test_lock(ino, LockKind::Posix, owner, range) {
            Ok(Some(h)) => {
                reply.locked(h.range.start, h.range.end, kernel_type(h.range.typ), h.pid)
            }
            Ok(None) => reply.locked(start, end, libc::F_UNLCK, 0),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// `SETLK`/`SETLKW`: takes, changes or releases the lock; a `SETLKW` that must wait is
    /// answered when the server grants it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn setlk(
        &self,
        fs: &HoardFs,
        unique: RequestId,
        ino: Ino,
        fh: u64,
        owner: u64,
        range: (u64, u64, i32),
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let (start, end, typ) = range;
        let Some(typ) = lock_type(typ) else {
            return reply.error(Errno::EINVAL);
        };
        // A flock is owned by the open file description: its handle names it for good,
        // where the kernel's owner number (the description's address) is reused as soon
        // as the description is freed, before its RELEASE may have been seen.
        let (kind, owner) = if flock {
            (LockKind::Flock, fh)
        } else {
            (LockKind::Posix, owner)
        };
        let range = LockRange { typ, start, end };
        if !sleep || typ == LockType::Unlock {
            return match fs.lock(ino, fh, kind, owner, range, pid) {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            };
        }
        let id = unique.0;
        self.waits.lock().insert(id, Wait::Starting);
        let waits = Arc::clone(&self.waits);
        let done = Box::new(move |r: Result<(), FsError>| {
            waits.lock().remove(&id);
            match r {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(errno(&e)),
            }
        });
        let Some(ticket) = fs.lock_waiting(ino, fh, kind, owner, range, pid, done) else {
            return;
        };
        let cancel = {
            let mut waits = self.waits.lock();
            match waits.get(&id).copied() {
                // Answered meanwhile.
                None => false,
                Some(Wait::Interrupted) => true,
                Some(_) => {
                    waits.insert(id, Wait::Waiting(ticket));
                    false
                }
            }
        };
        if cancel {
            fs.cancel_lock(ticket);
        }
    }

    /// `INTERRUPT` of request `unique`: a lock wait is cancelled (answered `EINTR`).
    pub(crate) fn interrupt(&self, fs: &HoardFs, unique: RequestId) {
        let ticket = {
            let mut waits = self.waits.lock();
            match waits.get(&unique.0).copied() {
                Some(Wait::Waiting(t)) => Some(t),
                Some(Wait::Starting) => {
                    waits.insert(unique.0, Wait::Interrupted);
                    None
                }
                Some(Wait::Interrupted) | None => None,
            }
        };
        if let Some(t) = ticket {
            fs.cancel_lock(t);
        }
    }
}
