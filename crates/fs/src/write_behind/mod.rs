//! Write-behind ([`WriteBehind`]): a write is acknowledged once it is queued here, and
//! sender threads send each file's queued writes to the origin in the order they were
//! made, coalesced into batches of up to [`queue::BATCH`] bytes, one batch of a file in
//! flight at a time (while it is, the file's next writes gather into the next batch: a
//! writer making 4 KiB writes costs one origin round trip per batch, not one per write).
//!
//! The barriers: [`WriteBehind::settle`] waits until every write made to a file before the
//! call reached the origin (or failed); [`WriteBehind::report`] does that and then reports
//! the first failure, once. The file system settles a file before anything that must see
//! its writes on the origin (a getattr, a truncate, an open, a daemon read, a lock) and
//! reports at `close` and `fsync`, so close-to-open holds: `close()` returns once every
//! byte written is on the server, and fails if any of them did not get there. A failure
//! (`ENOSPC`, `EDQUOT`, the file removed elsewhere...) drops the file's writes queued after
//! it and fails its next write, close or fsync, as a writeback error does on a local disk.
//!
//! Queued bytes are bounded for the whole mount ([`WriteBehind::new`]'s `limit`): a writer
//! past it waits for the senders.
//!
//! Lock: one mutex over every file's queue, a leaf, never held across a send. Senders
//! enter the writer's identity ([`hoardfs_origin::caller`]) for each batch.

mod queue;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;

use hoardfs_origin::caller::{self, Caller};
use parking_lot::{Condvar, Mutex, MutexGuard};

use crate::open_files::OpenFile;
use crate::{FsError, FsResult, Ino, Shared};
pub(crate) use queue::Batch;
use queue::{Added, FileQueue};

/// Sender threads at most (each sends one file's batches at a time).
const SENDERS: usize = 4;

/// Sends one batch to the origin as the ambient caller (all of it, or fails).
pub(crate) type Send = Arc<dyn Fn(&Batch) -> FsResult<()> + std::marker::Send + Sync>;

/// The queues and what the senders and waiters share.
struct Queues {
    files: HashMap<Ino, FileQueue>,
    /// Files with writes queued and no sender yet, in the order they became so.
    ready: VecDeque<Ino>,
    /// Bytes queued or being sent.
    bytes: usize,
    /// Writes queued so far (the number of the latest: see `FileQueue`).
    written: u64,
    /// Sender threads started, and how many wait for work.
    senders: usize,
    idle: usize,
    /// Set at shutdown: senders leave once nothing is ready.
    stopping: bool,
}

struct Inner {
    queues: Mutex<Queues>,
    /// A file became ready, or shutdown began (senders wait on it).
    work: Condvar,
    /// A batch was sent (barriers and writers past the bound wait on it).
    sent: Condvar,
    /// Bytes queued or being sent (read without the lock: most calls find nothing queued).
    unsent: AtomicU64,
    send: Send,
    limit: usize,
}

/// The mount's write-behind queues and their senders; see the module docs.
pub(crate) struct WriteBehind {
    inner: Arc<Inner>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl WriteBehind {
    /// Queues sent by `send`, holding at most `limit` bytes for the whole mount.
    pub(crate) fn new(send: Send, limit: usize) -> WriteBehind {
        WriteBehind {
            inner: Arc::new(Inner {
                queues: Mutex::new(Queues {
                    files: HashMap::new(),
                    ready: VecDeque::new(),
                    bytes: 0,
                    written: 0,
                    senders: 0,
                    idle: 0,
                    stopping: false,
                }),
                work: Condvar::new(),
                sent: Condvar::new(),
                unsent: AtomicU64::new(0),
                send,
                limit: limit.max(queue::BATCH),
            }),
            threads: Mutex::new(Vec::new()),
        }
    }

    /// Queues `data`, written at `offset` through `of` by the ambient caller. Fails with
    /// the file's unreported failure instead (the write is then not made), or if no
    /// sender thread can be started.
    pub(crate) fn queue(&self, of: &Arc<OpenFile>, offset: u64, data: &[u8]) -> FsResult<()> {
        let ino = of.node.ino;
        let by: Arc<Caller> = caller::current();
        let mut q = self.inner.queues.lock();
        if let Some(e) = q.files.get_mut(&ino).and_then(FileQueue::take_failure) {
            return Err(e);
        }
        // Past the bound, wait for the senders (they never wait on writers).
        while q.bytes + data.len() > self.inner.limit && q.bytes > 0 {
            self.inner.sent.wait(&mut q);
        }
        q.written += 1;
        let seq = q.written;
        let added = q
            .files
            .entry(ino)
            .or_insert_with(|| FileQueue::after(seq - 1))
            .add(of, &by, offset, data, seq);
        q.bytes += data.len();
        self.inner
            .unsent
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        if added == Added::Schedule {
            q.ready.push_back(ino);
            if q.idle == 0
                && q.senders < SENDERS
                && let Err(e) = self.start_sender(&mut q)
            {
                // Nobody would ever send it: taken back (the file was idle, so this write
                // is all it holds), and the write fails.
                q.ready.retain(|&i| i != ino);
                q.files.remove(&ino);
                q.bytes -= data.len();
                self.inner
                    .unsent
                    .fetch_sub(data.len() as u64, Ordering::Relaxed);
                return Err(e);
            }
            self.inner.work.notify_one();
        }
        Ok(())
    }

    /// Starts one more sender thread; fails only if none is running at all (the running
    /// ones get to the file in time otherwise).
    fn start_sender(&self, q: &mut MutexGuard<'_, Queues>) -> FsResult<()> {
        let inner = self.inner.clone();
        let started = std::thread::Builder::new()
            .name("hoardfs-send".into())
            .spawn(move || inner.run());
        match started {
            Ok(t) => {
                q.senders += 1;
                self.threads.lock().push(t);
                Ok(())
            }
            Err(_) if q.senders > 0 => Ok(()),
            Err(e) => Err(FsError::Thread {
                what: "write sender",
                source: Shared::new(e),
            }),
        }
    }

    /// Whether nothing is queued anywhere (no lock taken).
    fn idle(&self) -> bool {
        self.inner.unsent.load(Ordering::Relaxed) == 0
    }

    /// Waits until every write made to `ino` before the call reached the origin or failed
    /// (a failure stays for [`WriteBehind::report`]).
    /// Returns whether the file had a queue (writes queued lately: what was read of it
    /// before the call may be older than the origin now).
    pub(crate) fn settle(&self, ino: Ino) -> bool {
        if self.idle() {
            return false;
        }
        let mut q = self.inner.queues.lock();
        let Some(target) = q.files.get(&ino).map(FileQueue::latest) else {
            return false;
        };
        while q.files.get(&ino).is_some_and(|f| !f.reached(target)) {
            self.inner.sent.wait(&mut q);
        }
        if q.files.get(&ino).is_some_and(FileQueue::is_spent) {
            q.files.remove(&ino);
        }
        true
    }

    /// Settles `ino` and reports its first failure not yet reported (close, fsync).
    /// `!take`: neither waits nor takes, but reports a failure already known (the close
    /// of a copy of the writer's descriptor, a child's at exec: it must not take the
    /// report from the writer, nor hold up the exec while the writes are on their way).
    pub(crate) fn report(&self, ino: Ino, take: bool) -> FsResult<()> {
        if take {
            self.settle(ino);
        }
        let mut q = self.inner.queues.lock();
        let failed = match q.files.get_mut(&ino) {
            Some(f) if take => f.take_failure(),
            Some(f) => f.failure(),
            None => None,
        };
        if q.files.get(&ino).is_some_and(FileQueue::is_spent) {
            q.files.remove(&ino);
        }
        failed.map_or(Ok(()), Err)
    }

    /// Waits until every write made before the call reached the origin or failed.
    pub(crate) fn settle_all(&self) {
        let inos: Vec<Ino> = self.inner.queues.lock().files.keys().copied().collect();
        for ino in inos {
            self.settle(ino);
        }
    }

    /// Nothing can write to `ino` any more (the kernel forgot it): a failure nobody can be
    /// told of any more is logged and dropped.
    pub(crate) fn forget(&self, ino: Ino) {
        self.settle(ino);
        let mut q = self.inner.queues.lock();
        if let Some(e) = q.files.get_mut(&ino).and_then(FileQueue::take_failure) {
            tracing::error!(
                ino,
                "writes to a closed file failed, nobody left to tell: {e}"
            );
        }
        if q.files.get(&ino).is_some_and(FileQueue::is_spent) {
            q.files.remove(&ino);
        }
    }

    /// Bytes written and not yet on the origin.
    pub(crate) fn unsent(&self) -> u64 {
        self.inner.unsent.load(Ordering::Relaxed)
    }

    /// Sends everything queued and stops the senders (at unmount).
    pub(crate) fn stop(&self) {
        self.settle_all();
        self.inner.queues.lock().stopping = true;
        self.inner.work.notify_all();
        for t in self.threads.lock().drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Inner {
    /// A sender: takes ready files in turn and sends each one's batches until none is
    /// left, until shutdown.
    fn run(&self) {
        let mut q = self.queues.lock();
        loop {
            let Some(ino) = q.ready.pop_front() else {
                if q.stopping {
                    q.senders -= 1;
                    return;
                }
                q.idle += 1;
                self.work.wait(&mut q);
                q.idle -= 1;
                continue;
            };
            let mut next = q.files.get_mut(&ino).and_then(FileQueue::take);
            while let Some(batch) = next {
                let result = MutexGuard::unlocked(&mut q, || {
                    caller::with(batch.caller.clone(), || (self.send)(&batch))
                });
                if let Err(e) = &result {
                    tracing::warn!(ino, "a queued write failed: {e}");
                }
                let Some(f) = q.files.get_mut(&ino) else {
                    break;
                };
                let gone = batch.data.len() + f.sent(&batch, result);
                next = f.take();
                q.bytes -= gone;
                self.unsent.fetch_sub(gone as u64, Ordering::Relaxed);
                self.sent.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests;
