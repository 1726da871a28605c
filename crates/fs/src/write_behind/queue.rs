//! [`FileQueue`]: the writes of one file acknowledged to the kernel but not yet sent to the
//! origin, in the order they were made, coalesced into batches; what is being sent; and the
//! first failure, kept until the file's next write, close or fsync reports it.
//!
//! Pure bookkeeping (no lock, no I/O): the door (`super::WriteBehind`) holds it under its
//! mutex, and its sender threads send the batches it hands out.

use std::collections::VecDeque;
use std::sync::Arc;

use hoardfs_origin::caller::Caller;

use crate::FsError;
use crate::open_files::OpenFile;

/// Largest batch sent in one origin write (the kernel's writes are at most 1 MiB each).
pub(crate) const BATCH: usize = 2 << 20;

/// Writes made through one open, by one caller, contiguous (or all appends): sent as one
/// origin write.
pub(crate) struct Batch {
    /// The open they were made through (its handle, offline staging and append flag).
    pub(crate) of: Arc<OpenFile>,
    /// Who made them (the origin performs the write as this user).
    pub(crate) caller: Arc<Caller>,
    /// Where the first byte goes (for appends: the kernel's guess; the origin appends).
    pub(crate) offset: u64,
    /// The bytes.
    pub(crate) data: Vec<u8>,
    /// The queue's count of writes when the last of them was added.
    seq: u64,
}

impl Batch {
    /// Whether a write of `len` bytes at `offset` through `of` by `caller` extends this
    /// batch.
    fn takes(&self, of: &Arc<OpenFile>, caller: &Arc<Caller>, offset: u64, len: usize) -> bool {
        Arc::ptr_eq(&self.of, of)
            && (Arc::ptr_eq(&self.caller, caller) || self.caller == *caller)
            && self.data.len() + len <= BATCH
            && (of.access.append || self.offset + self.data.len() as u64 == offset)
    }
}

/// Whether a batch is being sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flight {
    /// No: whatever is queued waits for a sender to be handed the file.
    Idle,
    /// The file is on the senders' list (handed out once).
    Ready,
    /// A sender is sending a batch (at most one per file, so that writes reach the origin
    /// in the order they were made).
    Sending,
}

/// One file's unsent writes; see the module docs.
pub(crate) struct FileQueue {
    queued: VecDeque<Batch>,
    flight: Flight,
    /// The number of the latest write added (writes are numbered for the whole mount, so
    /// that a barrier waits only for the writes made before it, also when the file's queue
    /// was dropped and made again meanwhile).
    added: u64,
    /// The number up to which this file's writes were sent (or given up on).
    done: u64,
    /// The first failure not yet reported.
    failed: Option<FsError>,
}

impl FileQueue {
    /// An empty queue made when the mount's writes had reached number `seq` (every earlier
    /// write of the file is sent: its queue was spent).
    pub(crate) fn after(seq: u64) -> Self {
        FileQueue {
            queued: VecDeque::new(),
            flight: Flight::Idle,
            added: seq,
            done: seq,
            failed: None,
        }
    }
}

/// What adding a write asks of the door.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Added {
    /// Queued; the file must be put on the senders' list.
    Schedule,
    /// Queued behind writes a sender will get to.
    Queued,
}

impl FileQueue {
    /// Queues `data` written at `offset` through `of` by `caller` as write number `seq` (the
    /// mount's, larger than any before); returns whether the file must be handed to a
    /// sender.
    pub(crate) fn add(
        &mut self,
        of: &Arc<OpenFile>,
        caller: &Arc<Caller>,
        offset: u64,
        data: &[u8],
        seq: u64,
    ) -> Added {
        debug_assert!(seq > self.added);
        self.added = seq;
        match self.queued.back_mut() {
            Some(last) if last.takes(of, caller, offset, data.len()) => {
                last.data.extend_from_slice(data);
                last.seq = seq;
            }
            _ => self.queued.push_back(Batch {
                of: of.clone(),
                caller: caller.clone(),
                offset,
                data: data.to_vec(),
                seq,
            }),
        }
        if self.flight == Flight::Idle {
            self.flight = Flight::Ready;
            return Added::Schedule;
        }
        Added::Queued
    }

    /// A sender takes the next batch (`None`: nothing left; the file leaves the senders).
    pub(crate) fn take(&mut self) -> Option<Batch> {
        match self.queued.pop_front() {
            Some(b) => {
                self.flight = Flight::Sending;
                Some(b)
            }
            None => {
                self.flight = Flight::Idle;
                None
            }
        }
    }

    /// The batch taken last was sent (`Ok`) or failed; a failure is kept for the next
    /// report and drops what was queued after it (returned: its bytes), as a writeback
    /// error does in a local file system. The sender then [`take`](Self::take)s again,
    /// under the same lock: the file stays its own until nothing is left.
    pub(crate) fn sent(&mut self, batch: &Batch, result: Result<(), FsError>) -> usize {
        self.done = batch.seq;
        let Err(e) = result else {
            return 0;
        };
        if self.failed.is_none() {
            self.failed = Some(e);
        }
        self.queued.drain(..).fold(0, |n, b| {
            self.done = b.seq;
            n + b.data.len()
        })
    }

    /// Whether every write up to number `seq` was sent or given up on.
    pub(crate) fn reached(&self, seq: u64) -> bool {
        self.done >= seq
    }

    /// The number of the latest write queued.
    pub(crate) fn latest(&self) -> u64 {
        self.added
    }

    /// Whether nothing is queued or being sent.
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.is_empty() && self.flight != Flight::Sending
    }

    /// Whether it holds nothing at all (no writes, no failure to report): it can go.
    pub(crate) fn is_spent(&self) -> bool {
        self.is_empty() && self.flight == Flight::Idle && self.failed.is_none()
    }

    /// The failure to report, if any, left for the next report.
    pub(crate) fn failure(&self) -> Option<FsError> {
        self.failed.clone()
    }

    /// Takes the failure to report, if any.
    pub(crate) fn take_failure(&mut self) -> Option<FsError> {
        self.failed.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeTable;
    use crate::open_files::Access;
    use crate::opens::ModeKind;
    use hoardfs_origin::Origin;
    use hoardfs_origin::local::{LocalOptions, LocalOrigin};

    fn open(append: bool) -> Arc<OpenFile> {
        let dir = tempfile::tempdir().unwrap();
        let origin = LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap();
        let root = origin.info().unwrap().root;
        let node = NodeTable::new(root.handle, root.attr)
            .get(crate::ROOT_INO)
            .unwrap();
        let access = Access {
            read: false,
            write: true,
            append,
            sync: false,
        };
        Arc::new(OpenFile::new(node, ModeKind::Cached, access, None))
    }

    /// The next write number.
    fn next(n: &mut u64) -> u64 {
        *n += 1;
        *n
    }

    #[test]
    fn a_queue_made_again_has_reached_every_earlier_write() {
        // A barrier that took its number from a queue since spent and dropped must not
        // wait for the new queue's writes to count up to it.
        let (of, me) = (open(false), user(0));
        let mut q = FileQueue::after(57);
        assert!(q.reached(57));
        assert_eq!(q.add(&of, &me, 0, b"x", 58), Added::Schedule);
        assert!(q.reached(57) && !q.reached(58));
    }

    fn user(uid: u32) -> Arc<Caller> {
        Arc::new(Caller {
            uid,
            gid: uid,
            groups: vec![],
        })
    }

    #[test]
    fn contiguous_writes_of_one_open_and_caller_make_one_batch() {
        let (of, other, me) = (open(false), open(false), user(1000));
        let (mut q, mut n) = (FileQueue::after(0), 0);
        assert_eq!(q.add(&of, &me, 0, b"ab", next(&mut n)), Added::Schedule);
        assert_eq!(q.add(&of, &me, 2, b"cd", next(&mut n)), Added::Queued);
        // A gap, another open and another user each start a batch of their own.
        q.add(&of, &me, 10, b"x", next(&mut n));
        q.add(&other, &me, 11, b"y", next(&mut n));
        q.add(&other, &user(1001), 12, b"z", next(&mut n));
        let b = q.take().unwrap();
        assert_eq!((b.offset, &b.data[..]), (0, &b"abcd"[..]));
        q.sent(&b, Ok(()));
        assert!(q.reached(2) && !q.reached(3));
        let offsets: Vec<u64> = std::iter::from_fn(|| {
            let b = q.take()?;
            q.sent(&b, Ok(()));
            Some(b.offset)
        })
        .collect();
        assert_eq!(offsets, [10, 11, 12]);
        assert!(q.reached(q.latest()) && q.is_spent());
    }

    #[test]
    fn appends_coalesce_whatever_offset_the_kernel_guessed() {
        let (of, me) = (open(true), user(0));
        let (mut q, mut n) = (FileQueue::after(0), 0);
        q.add(&of, &me, 5, b"one\n", next(&mut n));
        q.add(&of, &me, 5, b"two\n", next(&mut n));
        let b = q.take().unwrap();
        assert_eq!(&b.data[..], b"one\ntwo\n");
    }

    #[test]
    fn a_batch_never_grows_past_the_bound() {
        let (of, me) = (open(false), user(0));
        let (mut q, mut n) = (FileQueue::after(0), 0);
        let chunk = vec![7u8; BATCH / 2 + 1];
        q.add(&of, &me, 0, &chunk, next(&mut n));
        q.add(&of, &me, chunk.len() as u64, &chunk, next(&mut n));
        assert_eq!(q.take().unwrap().data.len(), chunk.len());
        assert_eq!(q.take().unwrap().offset, chunk.len() as u64);
    }

    #[test]
    fn a_failure_drops_the_rest_and_is_reported_once() {
        let (of, me) = (open(false), user(0));
        let (mut q, mut n) = (FileQueue::after(0), 0);
        q.add(&of, &me, 0, b"a", next(&mut n));
        q.add(&of, &me, 9, b"bc", next(&mut n));
        let b = q.take().unwrap();
        let dropped = q.sent(&b, Err(FsError::Offline("gone".into())));
        assert_eq!(dropped, 2);
        // (The sender then finds nothing left.)
        assert!(q.take().is_none());
        // Every write is accounted for: a barrier does not wait for the dropped ones.
        assert!(q.reached(2) && q.is_empty() && !q.is_spent());
        assert!(matches!(q.take_failure(), Some(FsError::Offline(_))));
        assert!(q.take_failure().is_none() && q.is_spent());
        // Writes after the report are queued again.
        assert_eq!(q.add(&of, &me, 0, b"d", next(&mut n)), Added::Schedule);
    }
}
