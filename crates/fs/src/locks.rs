//! File locks (`flock` and POSIX byte ranges) kept by the origin for every client, when
//! the origin can ([`hoardfs_origin::Locks`]: a hoardfs server). The kernel asks for each
//! lock (the mount negotiates remote locks only then, see [`Locks::supported`]); this
//! family forwards it, and remembers which owners hold something on which file so that
//! a close sends an `UnlockAll` only where there is something to release (every close
//! of every file would otherwise cost a round trip).
//!
//! A POSIX lock is released when its owner (a process) closes the file: the kernel's
//! `FLUSH` carries the owner, and is answered before `close` returns. Read-only opens get
//! no `FLUSH` (`FOPEN_NOFLUSH`), so an owner is also released once every open file it
//! locked through is released (`RELEASE`, sent after the close, in the background; an
//! owner's later locks through another open file keep it). A `flock` belongs to an open
//! file description: the bridge passes the open file's handle as its owner, so a late
//! `RELEASE` of one description cannot release the flock of a newer one (the kernel's
//! own owner number for it is the address of the description, reused at once).
//!
//! While the origin is unreachable, locking fails with `NoLocks` (`ENOLCK`), logged: a
//! disconnected client cannot know what others hold. Locks live on the origin's
//! connection; when it is lost the server releases them.
//!
//! Lock order: `held` is a leaf (never held across an origin call).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, mpsc};

use hoardfs_origin::{LockAnswer, LockHolder, LockKind, LockRange, LockTicket, LockType};
use hoardfs_origin::{OriginError, WireError};
use parking_lot::Mutex;

use crate::superblock::Superblock;
use crate::{FileHandle, FsError, FsResult, Ino};

/// How a waiting lock request is answered (exactly once).
pub type LockDone = Box<dyn FnOnce(FsResult<()>) + Send>;

/// The locks of this mount's processes.
#[derive(Default)]
pub(crate) struct Locks {
    held: Mutex<Held>,
    /// The thread that finishes granted waits (revalidates the file, answers the
    /// kernel), started at the first wait.
    granter: std::sync::OnceLock<Option<mpsc::Sender<Job>>>,
}

/// The end of a granted wait, run by the granter thread.
type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Held {
    /// (file, kind, owner) that took a lock and has not released everything since.
    owners: HashSet<(Ino, LockKind, u64)>,
    /// The open files each POSIX owner locked through since it last released everything.
    through: HashMap<(Ino, u64), HashSet<FileHandle>>,
    /// The POSIX owners that locked through each open file (the reverse of `through`).
    owners_of: HashMap<FileHandle, HashSet<(Ino, u64)>>,
}

/// A failure to lock: the origin's refusal, or `NoLocks` when it cannot be asked.
fn lock_error(e: OriginError) -> FsError {
    match e {
        OriginError::Fs(w) => FsError::Origin(w),
        other => {
            tracing::warn!("cannot lock: {other}");
            FsError::Origin(WireError::NoLocks)
        }
    }
}

/// An unreachable origin cannot lock: `NoLocks`.
fn offline_is_no_locks(e: FsError) -> FsError {
    match e {
        FsError::Offline(m) => lock_error(OriginError::Unreachable(m)),
        other => other,
    }
}

impl Locks {
    /// Whether the origin keeps locks for all its clients (else the kernel keeps them,
    /// local to this host).
    pub(crate) fn supported(sb: &Superblock) -> bool {
        sb.origin().locks().is_some() && !sb.kernel_opens()
    }

    /// Takes, changes or releases `range` for `owner` now (`WouldBlock` if another
    /// owner's lock is in the way).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lock(
        &self,
        sb: &Superblock,
        ino: Ino,
        fh: FileHandle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
    ) -> FsResult<()> {
        let locks = sb
            .origin()
            .locks()
            .ok_or(FsError::Origin(WireError::NoLocks))?;
        let node = sb.node(ino)?;
        if range.typ != LockType::Unlock {
            self.note(ino, fh, kind, owner);
        }
        let since = sb.callbacks().seq();
        let attr = sb
            .with_handle(&node, |h| locks.lock(h, kind, owner, range, pid))
            .map_err(offline_is_no_locks)?;
        if range.typ != LockType::Unlock {
            sb.revalidate_locked(&node, attr, since);
        }
        Ok(())
    }

    /// Asks for `range` and answers `done` when it is held or the wait ends; the ticket
    /// cancels the wait (`None`: answered already).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lock_waiting(
        &self,
        sb: &Arc<Superblock>,
        ino: Ino,
        fh: FileHandle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
        done: LockDone,
    ) -> Option<LockTicket> {
        let (Some(locks), Ok(node)) = (sb.origin().locks(), sb.node(ino)) else {
            done(Err(FsError::Origin(WireError::NoLocks)));
            return None;
        };
        self.note(ino, fh, kind, owner);
        let since = sb.callbacks().seq();
        let weak = Arc::downgrade(sb);
        let granted = Arc::clone(&node);
        let granter = self.granter();
        // Called on the connection's receive thread, which must not wait for a reply nor
        // for the kernel (dropping pages may wait for a read that waits for this thread):
        // the revalidation runs on the granter thread.
        let answer: LockAnswer = Box::new(move |r| match r {
            Ok(attr) => {
                let job: Job = Box::new(move || {
                    if let Some(sb) = weak.upgrade() {
                        sb.revalidate_locked(&granted, attr, since);
                    }
                    done(Ok(()));
                });
                let job = match &granter {
                    Some(tx) => match tx.send(job) {
                        Ok(()) => return,
                        Err(mpsc::SendError(job)) => job,
                    },
                    None => job,
                };
                // No granter thread: answered here rather than never.
                job();
            }
            Err(e) => done(Err(lock_error(e))),
        });
        locks.lock_waiting(node.handle(), kind, owner, range, pid, answer)
    }

    /// Where granted waits are finished (`None` if the thread could not be started).
    fn granter(&self) -> Option<mpsc::Sender<Job>> {
        self.granter
            .get_or_init(|| {
                let (tx, rx) = mpsc::channel::<Job>();
                let started = std::thread::Builder::new()
                    .name("hoardfs-locks".into())
                    .spawn(move || {
                        for job in rx {
                            job();
                        }
                    });
                match started {
                    Ok(_) => Some(tx),
                    Err(e) => {
                        tracing::warn!("cannot start the lock granter thread: {e}");
                        None
                    }
                }
            })
            .clone()
    }

    /// Ends a wait.
    pub(crate) fn cancel(&self, sb: &Superblock, ticket: LockTicket) {
        if let Some(locks) = sb.origin().locks() {
            locks.cancel(ticket);
        }
    }

    /// The lock in the way of `owner` taking `range`, if any.
    pub(crate) fn test(
        &self,
        sb: &Superblock,
        ino: Ino,
        kind: LockKind,
        owner: u64,
        range: LockRange,
    ) -> FsResult<Option<LockHolder>> {
        let locks = sb
            .origin()
            .locks()
            .ok_or(FsError::Origin(WireError::NoLocks))?;
        let node = sb.node(ino)?;
        sb.with_handle(&node, |h| locks.test(h, kind, owner, range))
            .map_err(offline_is_no_locks)
    }

    /// Releases what `owner` holds on `ino` and ends its waits, if it ever locked it
    /// (a close: nothing is sent otherwise); `before` runs first then (the file's queued
    /// writes go to the server before its locks).
    pub(crate) fn unlock_all(
        &self,
        sb: &Superblock,
        ino: Ino,
        kind: LockKind,
        owner: u64,
        before: impl FnOnce(),
    ) {
        {
            let mut held = self.held.lock();
            if kind == LockKind::Posix {
                held.through.remove(&(ino, owner));
            }
            if !held.owners.remove(&(ino, kind, owner)) {
                return;
            }
        }
        let (Some(locks), Ok(node)) = (sb.origin().locks(), sb.node(ino)) else {
            return;
        };
        before();
        if let Err(e) = sb.with_handle(&node, |h| locks.unlock_all(h, kind, owner)) {
            // The server releases them with the connection; nothing else to do here.
            tracing::debug!(ino, "releasing the locks of a closed file: {e}");
        }
    }

    /// Open file `fh` is released: POSIX owners that locked through no other open file
    /// since they last released everything are released. (The caller settled the file's
    /// queued writes first.)
    pub(crate) fn released(&self, sb: &Superblock, fh: FileHandle) {
        let done: Vec<(Ino, u64)> = {
            let mut held = self.held.lock();
            let owners = held.owners_of.remove(&fh).unwrap_or_default();
            owners
                .into_iter()
                .filter(|key| match held.through.get_mut(key) {
                    Some(fhs) => {
                        fhs.remove(&fh);
                        fhs.is_empty()
                    }
                    None => false,
                })
                .collect()
        };
        for (ino, owner) in done {
            self.unlock_all(sb, ino, LockKind::Posix, owner, || {});
        }
    }

    fn note(&self, ino: Ino, fh: FileHandle, kind: LockKind, owner: u64) {
        let mut held = self.held.lock();
        held.owners.insert((ino, kind, owner));
        if kind == LockKind::Posix {
            held.through.entry((ino, owner)).or_default().insert(fh);
            held.owners_of.entry(fh).or_default().insert((ino, owner));
        }
    }
}
