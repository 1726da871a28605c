//! The callback registry: which connection has been told about which object, and the
//! fan-out of breaks when objects change.
//!
//! Every reply that carries attributes (lookups, getattr, listings, creates, writes)
//! registers a callback for its objects on the requesting connection. The origin reports
//! changes (for a local export: inotify on every directory handed out, which also sees
//! changes made by processes on the server) and each change is sent, as a
//! [`Break`], to every connection holding a callback on the object — for a name change, on
//! its directory. Registrations last until the connection closes: a client may keep names
//! in the kernel's dentry cache as long as it likes, so it must keep hearing about them.
//!
//! Race rule: a reply computed while a change was being reported may reflect the state
//! before the change while its registration came too late to receive the break. Each
//! request therefore notes the change sequence number before asking the origin and, if it
//! moved by the time the registration is in place, follows its reply with a conservative
//! break for the objects in it (see `handle::handle`). A subtree listing, which takes up
//! to 200 ms and names thousands of objects, is settled precisely instead: the changes
//! of the last [`RECENT_CHANGES`] reports are kept, and the ones about its objects since
//! its sequence number are sent again (see [`Callbacks::changes_since`]).
//!
//! Bounds: a connection holds at most [`MAX_CALLBACKS_PER_CONN`] callbacks and at most
//! [`MAX_PENDING_BREAK_BYTES`] of unsent break frames; beyond either it gets one [`Break::All`] and its
//! registrations are dropped (the client then revalidates everything it caches). The
//! memory of each connection's callback set is charged, as it grows, to the quarter of
//! the server's memory budget (`--max-memory-mib`) set aside for callback sets (the
//! semaphore [`Callbacks::charge_to`] is given; requests never wait for it); a set that
//! cannot be charged is dropped the same way. The recent change reports are
//! bounded by [`RECENT_BYTES`] as well as by count, and those bytes are set aside from the
//! budget when the server starts (see `admission`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use hoardfs_proto::{Break, ServerMessage};
use parking_lot::Mutex;
use tokio::sync::mpsc::UnboundedSender;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::outgoing::Outgoing;

/// Most objects one connection may hold callbacks on.
pub(crate) const MAX_CALLBACKS_PER_CONN: usize = 1 << 20;
/// Most bytes of break frames queued for one connection before it is told to revalidate
/// everything (a frame carries the breaks of one change report: up to about 70 KB).
pub(crate) const MAX_PENDING_BREAK_BYTES: usize = 1 << 20;

/// Change reports kept for settling subtree listings precisely (a listing that started
/// before the oldest gets the conservative break).
pub(crate) const RECENT_CHANGES: usize = 4096;
/// Most bytes of change reports kept for that (a report of long names is large).
pub(crate) const RECENT_BYTES: usize = 8 << 20;

/// Bytes a callback set of `capacity` slots takes (a `HashSet<u64>`: the id and a control
/// byte per slot).
fn set_bytes(capacity: usize) -> usize {
    capacity * (std::mem::size_of::<u64>() + 1)
}

/// Bytes a change report takes while kept.
fn report_bytes(breaks: &[Break]) -> usize {
    breaks
        .iter()
        .map(|b| {
            std::mem::size_of::<Break>()
                + match b {
                    Break::Entry { name, .. } => name.len(),
                    _ => 0,
                }
        })
        .sum::<usize>()
        + 64
}

/// Identifies one connection in the registry.
pub(crate) type ConnId = u64;

struct ConnCallbacks {
    tx: UnboundedSender<Outgoing>,
    files: HashSet<u64>,
    /// What `files` is charged to the server's memory budget.
    charged: Option<OwnedSemaphorePermit>,
    /// Bytes of break frames queued but not yet written (decremented by the writer).
    pending: Arc<AtomicUsize>,
}

/// The registry; see the module docs. Lock: one mutex, a leaf (nothing else is locked or
/// awaited while it is held; sends are unbounded and never block).
#[derive(Default)]
pub struct Callbacks {
    seq: AtomicU64,
    conns: Mutex<HashMap<ConnId, ConnCallbacks>>,
    /// The latest change reports with the sequence number each made (a leaf lock of its
    /// own, taken before `seq` moves).
    recent: Mutex<std::collections::VecDeque<(u64, Arc<Vec<Break>>)>>,
    /// Bytes of the reports in `recent`.
    recent_bytes: AtomicUsize,
    /// The server's memory budget (units of `units::UNIT`), once the server runs.
    memory: std::sync::OnceLock<Arc<Semaphore>>,
    next_conn: AtomicU64,
    sent: AtomicU64,
}

impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callbacks")
            .field("seq", &self.seq)
            .field("sent", &self.sent)
            .finish_non_exhaustive()
    }
}

impl Callbacks {
    /// Adds a connection whose frames go to `tx`; `pending` counts the bytes of its queued
    /// break frames.
    pub(crate) fn add_conn(
        &self,
        tx: UnboundedSender<Outgoing>,
        pending: Arc<AtomicUsize>,
    ) -> ConnId {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(
            id,
            ConnCallbacks {
                tx,
                files: HashSet::new(),
                charged: None,
                pending,
            },
        );
        id
    }

    /// Forgets a closed connection.
    pub(crate) fn remove_conn(&self, id: ConnId) {
        self.conns.lock().remove(&id);
    }

    /// Charges callback sets to `memory` (the server's budget, in `units::UNIT`s).
    pub(crate) fn charge_to(&self, memory: Arc<Semaphore>) {
        let _ = self.memory.set(memory);
    }

    /// The current change sequence number (read before asking the origin).
    pub(crate) fn seq(&self) -> u64 {
        self.seq.load(Ordering::SeqCst)
    }

    /// Breaks sent so far.
    pub(crate) fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Registers callbacks on `files` for `conn`. Returns true when a change was reported
    /// since `seq_before` (the caller must then follow its reply with a conservative break).
    pub(crate) fn register(&self, conn: ConnId, files: &[u64], seq_before: u64) -> bool {
        if !files.is_empty() {
            let mut conns = self.conns.lock();
            if let Some(c) = conns.get_mut(&conn) {
                c.files.extend(files.iter().copied());
                if c.files.len() > MAX_CALLBACKS_PER_CONN {
                    tracing::warn!(conn, "too many callbacks on one connection: breaking all");
                    self.break_all(c);
                } else if !self.charge(c) {
                    tracing::warn!(
                        conn,
                        callbacks = c.files.len(),
                        "the server's memory budget cannot hold this connection's callbacks: \
                         breaking all"
                    );
                    self.break_all(c);
                }
            }
        }
        self.seq.load(Ordering::SeqCst) != seq_before
    }

    /// Sends `breaks` to `conn` only (the conservative follow-up of a racing reply).
    pub(crate) fn send_to(&self, conn: ConnId, breaks: Vec<Break>) {
        if breaks.is_empty() {
            return;
        }
        if let Some(c) = self.conns.lock().get_mut(&conn) {
            self.send(c, breaks);
        }
    }

    /// The changes reported after sequence number `seq_before`, or `None` if some of them
    /// are no longer kept.
    pub(crate) fn changes_since(&self, seq_before: u64) -> Option<Vec<Arc<Vec<Break>>>> {
        let recent = self.recent.lock();
        let now = self.seq.load(Ordering::SeqCst);
        let oldest = recent.front().map_or(now + 1, |(s, _)| *s);
        if now > seq_before && oldest > seq_before + 1 {
            return None;
        }
        Some(
            recent
                .iter()
                .filter(|(s, _)| *s > seq_before)
                .map(|(_, b)| Arc::clone(b))
                .collect(),
        )
    }

    /// The origin reported `breaks`: send each to the connections holding a callback on it.
    pub(crate) fn changed(&self, breaks: Vec<Break>) {
        // Kept before the number moves, so that whoever sees the new number finds them.
        {
            let mut recent = self.recent.lock();
            let seq = self.seq.load(Ordering::SeqCst) + 1;
            let mut bytes = self.recent_bytes.load(Ordering::Relaxed) + report_bytes(&breaks);
            recent.push_back((seq, Arc::new(breaks.clone())));
            while recent.len() > RECENT_CHANGES || bytes > RECENT_BYTES {
                match recent.pop_front() {
                    Some((_, old)) => bytes -= report_bytes(&old),
                    None => break,
                }
            }
            self.recent_bytes.store(bytes, Ordering::Relaxed);
            // Bumped before the scan: a request that read the old number and registers
            // after the scan sees the new number and settles its reply.
            self.seq.fetch_add(1, Ordering::SeqCst);
        }
        let mut conns = self.conns.lock();
        for c in conns.values_mut() {
            let mine: Vec<Break> = breaks
                .iter()
                .filter(|b| match b {
                    Break::Attr { file_id, .. } => c.files.contains(file_id),
                    Break::Entry { dir_id, .. } => c.files.contains(dir_id),
                    Break::All => true,
                })
                .cloned()
                .collect();
            if !mine.is_empty() {
                self.send(c, mine);
            }
        }
    }

    /// Charges `c`'s callback set to the memory budget as far as it grew; false if the
    /// budget has no room for it.
    fn charge(&self, c: &mut ConnCallbacks) -> bool {
        let Some(memory) = self.memory.get() else {
            return true;
        };
        let unit = crate::units::UNIT;
        let want = set_bytes(c.files.capacity()).div_ceil(unit) as u32;
        let held = c.charged.as_ref().map_or(0, |p| p.num_permits() as u32);
        if want <= held {
            return true;
        }
        match Arc::clone(memory).try_acquire_many_owned(want - held) {
            Ok(more) => {
                match &mut c.charged {
                    Some(p) => p.merge(more),
                    None => c.charged = Some(more),
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Drops `c`'s callbacks (and their charge) and tells it to revalidate everything.
    fn break_all(&self, c: &mut ConnCallbacks) {
        c.files = HashSet::new();
        c.charged = None;
        self.send(c, vec![Break::All]);
    }

    fn send(&self, c: &mut ConnCallbacks, breaks: Vec<Break>) {
        let pending = c.pending.load(Ordering::Relaxed);
        let sent = breaks.len();
        // (Over the bound already, the frame is not even encoded.)
        let fits = (pending < MAX_PENDING_BREAK_BYTES)
            .then(|| Outgoing::message(&ServerMessage::Breaks(breaks), true))
            .filter(|o| pending + o.body_len() <= MAX_PENDING_BREAK_BYTES);
        let (out, sent) = match fits {
            Some(o) => (o, sent),
            None => {
                // The client does not keep up: make it revalidate everything instead.
                c.files = HashSet::new();
                c.charged = None;
                let all = Outgoing::message(&ServerMessage::Breaks(vec![Break::All]), true);
                (all, 1)
            }
        };
        c.pending.fetch_add(out.body_len(), Ordering::Relaxed);
        self.sent.fetch_add(sent as u64, Ordering::Relaxed);
        let _ = c.tx.send(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(file_id: u64) -> Break {
        Break::Attr {
            file_id,
            change_id: 0,
        }
    }

    #[test]
    fn the_changes_since_a_sequence_number_are_found_until_they_are_no_longer_kept() {
        let c = Callbacks::default();
        let before = c.seq();
        assert_eq!(c.changes_since(before).map(|v| v.len()), Some(0));
        c.changed(vec![attr(1)]);
        let middle = c.seq();
        c.changed(vec![attr(2), attr(3)]);
        let since = |s| -> Option<Vec<Break>> {
            c.changes_since(s)
                .map(|v| v.iter().flat_map(|b| b.iter().cloned()).collect())
        };
        assert_eq!(since(before), Some(vec![attr(1), attr(2), attr(3)]));
        assert_eq!(since(middle), Some(vec![attr(2), attr(3)]));
        assert_eq!(since(c.seq()), Some(vec![]));
        // Once the oldest change after `before` is dropped, nothing precise can be said.
        for i in 0..RECENT_CHANGES {
            c.changed(vec![attr(10 + i as u64)]);
        }
        assert_eq!(since(before), None);
        assert_eq!(since(c.seq() - 1).map(|v| v.len()), Some(1));
    }

    #[test]
    fn a_connection_that_does_not_read_its_breaks_holds_a_bounded_queue_then_breaks_all() {
        let c = Callbacks::default();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let conn = c.add_conn(tx, pending.clone());
        // Callbacks on many files, each change reporting a large batch of them.
        let files: Vec<u64> = (0..4096).collect();
        c.register(conn, &files, c.seq());
        let batch: Vec<Break> = files.iter().map(|&f| attr(f)).collect();
        for _ in 0..200 {
            c.changed(batch.clone());
        }
        let queued = pending.load(Ordering::Relaxed);
        assert!(
            queued <= MAX_PENDING_BREAK_BYTES + 16,
            "{queued} bytes queued"
        );
        let mut frames = Vec::new();
        while let Ok(out) = rx.try_recv() {
            frames.push(out);
        }
        let total: usize = frames.iter().map(|o| o.body_len()).sum();
        assert_eq!(total, queued, "the count is of the bytes queued");
        // The client was told to revalidate everything, and its callbacks were dropped.
        let all = Outgoing::message(&ServerMessage::Breaks(vec![Break::All]), true);
        assert_eq!(frames.last().unwrap().body_len(), all.body_len());
        assert!(c.conns.lock()[&conn].files.is_empty());
    }

    #[test]
    fn callback_sets_are_charged_to_the_memory_budget_and_dropped_when_it_is_spent() {
        let c = Callbacks::default();
        // Room for about 1 MiB of callback sets (16 units of 64 KiB).
        let memory = Arc::new(Semaphore::new(16));
        c.charge_to(memory.clone());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let conn = c.add_conn(tx, Arc::new(AtomicUsize::new(0)));
        let small: Vec<u64> = (0..10_000).collect();
        c.register(conn, &small, c.seq());
        let used = 16 - memory.available_permits();
        let want = set_bytes(c.conns.lock()[&conn].files.capacity()).div_ceil(crate::units::UNIT);
        assert_eq!(used, want, "charged as it grew");
        assert!(rx.try_recv().is_err(), "no break while it fits");
        // Growing beyond the budget: dropped, the client told, the charge given back.
        let big: Vec<u64> = (0..500_000).collect();
        c.register(conn, &big, c.seq());
        assert!(c.conns.lock()[&conn].files.is_empty());
        assert_eq!(memory.available_permits(), 16);
        let all = Outgoing::message(&ServerMessage::Breaks(vec![Break::All]), true);
        assert_eq!(rx.try_recv().unwrap().body_len(), all.body_len());
        // A closed connection gives its charge back too.
        c.register(conn, &small, c.seq());
        assert!(memory.available_permits() < 16);
        c.remove_conn(conn);
        assert_eq!(memory.available_permits(), 16);
    }

    #[test]
    fn the_recent_change_reports_are_bounded_in_bytes() {
        let c = Callbacks::default();
        let long = |i: u64| Break::Entry {
            dir_id: i,
            name: vec![b'x'; 255],
            file_id: None,
        };
        let report: Vec<Break> = (0..1000).map(long).collect();
        for _ in 0..200 {
            c.changed(report.clone());
        }
        let kept: usize = c.recent.lock().iter().map(|(_, b)| report_bytes(b)).sum();
        assert!(kept <= RECENT_BYTES, "{kept} bytes kept");
        assert_eq!(kept, c.recent_bytes.load(Ordering::Relaxed));
        assert!(c.recent.lock().len() < 200);
    }
}
