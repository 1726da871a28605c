//! Reintegration: sending the changes of `--offline-writes` back to the origin once it is
//! reachable.
//!
//! Each pass sends, [`SENDERS`] at a time, the changes that wait for no other ([`ready`]:
//! a change waits for the removals and moves that free its name, for the directory it
//! lies in to be in place and for a directory above it to move; a directory's removal
//! for the changes that leave it); passes repeat while they make progress, and moves that
//! wait for each other are broken by parking one object under a temporary name in the
//! root (`CycleBreaker`). A change whose names changed here after its pass was planned
//! (a directory above it renamed meanwhile, with `--write-back=async`) is not sent by that
//! pass but planned again. Each change goes back in its own steps (`crate::offline::reintegrate::send_back`).
//! Conflicts are logged and listed by `hoardfs conflicts`. A file sent back is fetched
//! again into the cache at its new version, so that it can be changed offline again.
//! Nothing is dropped: a change that cannot be sent for any other reason (permissions, a
//! full disk on the server) stays pending and is tried again later.
//!
//! A reintegration borrows the superblock, its log and one question about the open files
//! ([`Writing`]: is this file being written here?), never the operation families; the
//! files sent back are fetched again with `Superblock::prefetch`.
//!
//! Lock order (the log's own rules are `crate::offline::cml`'s):
//! `HoardFs::reintegrating` (one pass at a time) → a change's lock (held across its
//! staging file's I/O and the origin round trips of its upload: writes to that file wait)
//! → `ChangeLog::moves` (a sender making a move) → the locks of the changes inside the
//! moved directory (`ChangeLog::moved_under`, skipping the changes of this pass, so two
//! senders never wait for each other); the log's table is a leaf; and a change's lock →
//! `NodeTable::inner` → a node's `state` (the node moved back to the origin's file before
//! the change is marked done). Nothing takes a change's lock while holding a node's
//! `state`, `NodeTable::inner` or the log's `next_seq` (debug builds check the last). The
//! kernel is notified only after a change's lock is released: an operation the kernel
//! holds a directory locked for may be waiting for that lock.

pub(crate) mod conflict_names;
pub(crate) mod found;
pub(crate) mod order;
pub(crate) mod send_back;
pub(crate) mod upload;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::offline::cml::{Conflict, Pending, Record, now_secs};
use crate::offline::reintegrate::order::{CycleBreaker, ready};
use crate::offline::reintegrate::send_back::{ChangeSender, Outcome, Sending};

use crate::FsError;
use crate::Ino;
use crate::offline::state::OfflineWrites;
use crate::superblock::Superblock;

/// What one pass of [`crate::HoardFs::reintegrate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reintegrated {
    /// Changes written over their file.
    pub sent: u64,
    /// Changes written to a conflict copy.
    pub conflicts: u64,
    /// Changes still pending.
    pub left: u64,
}

/// Changes sent at once.
const SENDERS: usize = 8;

/// What one pass did.
struct Pass {
    /// Changes sent, conflicts written.
    done: Reintegrated,
    /// The nodes of the files sent (fetched again afterwards).
    sent: Vec<Ino>,
    /// The origin went away during the pass.
    stopped: bool,
    /// A change was moved here while the pass went (a directory above it renamed): it
    /// is planned again.
    replanned: bool,
}

/// Whether a file (by node) is open for writing here: the one thing reintegration asks
/// of the open files (a change whose file is being written waits for its writer).
pub(crate) type Writing<'a> = &'a (dyn Fn(Ino) -> bool + Sync);

/// One reintegration: the superblock and its change log, for the passes that send the
/// changes back (each by a `ChangeSender`).
pub(crate) struct Reintegration<'a> {
    sb: &'a Superblock,
    off: &'a OfflineWrites,
    writing: Writing<'a>,
    /// Changes of content whose file is open for writing wait for the writer's close,
    /// for up to [`HOLD_WRITTEN`] (the keeper's passes with `--write-back=async`: a file
    /// being written is sent once, whole, and one made and removed again meanwhile is
    /// never sent; a file kept open for longer, a log, is not kept from the server).
    hold_written: bool,
}

/// How long a change of a file open for writing waits for its writer's close, at most,
/// in the keeper's passes with `--write-back=async` (while it waits, this client's view
/// of names stays its own).
const HOLD_WRITTEN: u64 = 30;

impl<'a> Reintegration<'a> {
    /// A reintegration of `off`'s changes to the origin of `sb`.
    pub(crate) fn new(sb: &'a Superblock, off: &'a OfflineWrites, writing: Writing<'a>) -> Self {
        Reintegration {
            sb,
            off,
            writing,
            hold_written: false,
        }
    }

    /// The same, leaving the changes of content whose file is open for writing for later.
    pub(crate) fn holding_written(self) -> Self {
        Reintegration {
            hold_written: true,
            ..self
        }
    }

    /// Whether change `p` waits for its writer (see `hold_written`).
    fn held(&self, p: &Pending) -> bool {
        if !self.hold_written || now_secs().saturating_sub(p.since()) >= HOLD_WRITTEN {
            return false;
        }
        let file_id = {
            let g = p.lock();
            if !g.record().has_content() {
                return false;
            }
            g.record().file_id
        };
        self.sb
            .nodes()
            .by_file_id(file_id)
            .is_some_and(|node| (self.writing)(node.ino))
    }

    /// Passes until no change is left or none can be sent now.
    pub(crate) fn run(&self) -> Reintegrated {
        let off = self.off;
        let had_names = off.log.names_pending();
        let mut total = Reintegrated::default();
        let mut sent = Vec::new();
        let mut breaks = 0;
        loop {
            let records = off.log.records();
            if records.is_empty() {
                break;
            }
            let ready_now = ready(&records);
            let now: Vec<_> = ready_now
                .iter()
                .filter(|(p, _)| !self.held(p))
                .cloned()
                .collect();
            if now.is_empty() && !ready_now.is_empty() {
                // Every change ready now waits for its writer.
                break;
            }
            if now.is_empty() {
                breaks += 1;
                if breaks <= records.len()
                    && CycleBreaker::new(self.sb, self.off).break_cycle(&records)
                {
                    continue;
                }
                tracing::warn!(
                    "{} offline change(s) wait for each other and cannot be sent",
                    records.len()
                );
                break;
            }
            let Pass {
                done: r,
                sent: inos,
                stopped,
                replanned,
            } = self.send_pass(&now);
            total.sent += r.sent;
            total.conflicts += r.conflicts;
            sent.extend(inos);
            if stopped || (r.sent + r.conflicts == 0 && !replanned) {
                break;
            }
        }
        total.left = off.log.count() as u64;
        // (With `--write-back=async` the log is sent every second while the link is up:
        // this client's names are the origin's unless a conflict was kept.)
        let trickling = self.sb.config().write_back == crate::WriteBack::Async;
        if had_names && !off.log.names_pending() && (!trickling || total.conflicts > 0) {
            self.names_sent_back();
        }
        // Cached again (fetched at the origin's new version), so that the files can be
        // changed offline at the next disconnection; after the log is empty, not before.
        for ino in sent {
            if let Err(e) = self.sb.prefetch(ino) {
                tracing::debug!(ino, "refetching a file sent back failed: {e}");
            }
        }
        total
    }

    /// Sends the changes `now` (independent of each other), [`SENDERS`] at a time; returns
    /// what was done, the nodes of files sent, and whether the origin went away.
    fn send_pass(&self, now: &[(Arc<Pending>, Record)]) -> Pass {
        let off = self.off;
        let sending: HashSet<u64> = now.iter().map(|(p, _)| p.seq).collect();
        let replanned = std::sync::atomic::AtomicBool::new(false);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stopped = std::sync::atomic::AtomicBool::new(false);
        let totals = parking_lot::Mutex::new((Reintegrated::default(), Vec::new()));
        let record = |c: &Conflict| off.log.record_conflict(c);
        // Changes of different objects are independent: a few are sent at once (each
        // costs round trips and a server fsync), oldest first.
        std::thread::scope(|scope| {
            for _ in 0..SENDERS.min(now.len()) {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some((p, planned)) = now.get(i) else {
                            return;
                        };
                        if stopped.load(Ordering::SeqCst) {
                            continue;
                        }
                        // Sent as whoever made it: the server judges the change as it
                        // would have judged it made online.
                        let by = std::sync::Arc::new(p.lock().record().sender());
                        let _by = hoardfs_origin::caller::enter(by);
                        let outcome = ChangeSender::new(self.sb, self.off, self.writing)
                            .send_back(p, planned, &sending);
                        let mut t = totals.lock();
                        match outcome {
                            Ok(Sending::Went(went)) => {
                                let (outcome, noted) = *went;
                                if let Some(c) = &noted {
                                    record(c);
                                    t.0.conflicts += 1;
                                }
                                match outcome {
                                    Outcome::Sent(_, ino) | Outcome::Created(_, ino) => {
                                        t.0.sent += 1;
                                        t.1.extend(ino);
                                    }
                                    Outcome::Removed => t.0.sent += 1,
                                    Outcome::Conflict(c) => {
                                        record(&c);
                                        t.0.conflicts += 1;
                                    }
                                }
                            }
                            Ok(Sending::Waits) => {}
                            Ok(Sending::Replanned) => replanned.store(true, Ordering::SeqCst),
                            Err(FsError::Offline(why)) => {
                                tracing::debug!("reintegration paused: {why}");
                                stopped.store(true, Ordering::SeqCst);
                            }
                            Err(e) => {
                                tracing::error!(
                                    file_id = p.file_id,
                                    "an offline change cannot be sent back now (kept, tried \
                                     again later): {e}"
                                );
                            }
                        }
                    }
                });
            }
        });
        let (done, sent) = totals.into_inner();
        Pass {
            done,
            sent,
            stopped: stopped.load(Ordering::SeqCst),
            replanned: replanned.load(Ordering::SeqCst),
        }
    }

    /// Every name of this client's view was sent back: directories are asked again
    /// (their names on the origin may differ where conflicts were kept).
    fn names_sent_back(&self) {
        for node in self.sb.nodes().all() {
            if node.kind != hoardfs_origin::FileKind::Dir {
                continue;
            }
            node.state.lock().expire();
            if let Some(n) = self.sb.notifier() {
                n.inval_inode(node.ino);
            }
        }
    }
}
