//! The files the kernel holds open: one [`OpenFile`] per kernel file handle, in the
//! [`OpenFiles`] table. An open file records its node, how it is served, what it was opened
//! for and what the read path learns about its reader (sequential detection, the farthest
//! read); it holds its cached object against eviction until released.
//!
//! Lock ordering: the table's lock is a leaf (never held while taking another lock or
//! doing I/O); an open file's `seq` mutex is taken alone.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use hoardfs_cache::OpenHold;
use parking_lot::{Mutex, RwLock};

use crate::nodes::Node;
use crate::opens::ModeKind;

/// Kernel-visible file handle number.
pub type FileHandle = u64;

/// What an open asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// Opened for reading (`O_RDONLY` or `O_RDWR`).
    pub read: bool,
    /// Opened for writing.
    pub write: bool,
    /// Writes append at the origin's end of file (`O_APPEND`).
    pub append: bool,
    /// Each write must be on the server when it returns (`O_SYNC`, `O_DSYNC`, `O_DIRECT`):
    /// never queued behind the writer.
    pub sync: bool,
}

/// A read-only open.
pub(crate) const READ_ONLY: Access = Access {
    read: true,
    write: false,
    append: false,
    sync: false,
};

impl Access {
    /// The access bits the open asks for (`MAY_READ` | `MAY_WRITE`).
    pub fn mask(&self) -> u32 {
        let mut m = 0;
        if self.read {
            m |= hoardfs_proto::MAY_READ;
        }
        if self.write {
            m |= hoardfs_proto::MAY_WRITE;
        }
        m
    }
}

/// Sequential-read detection of one open file, and its readahead window: it starts at
/// the configured number of chunks and doubles (up to [`WINDOW_GROWTH`] times that) each
/// time the reader keeps reading in order, so a long sequential read keeps more requests
/// queued (what a store with a long first-byte latency needs), and drops back when the
/// reader seeks.
#[derive(Debug, Default)]
pub(crate) struct Sequence {
    /// Where the next read starts if the reader is sequential.
    next: u64,
    /// The highest chunk already scheduled for readahead.
    scheduled_to: Option<u64>,
    /// Current window in chunks (0: not started).
    window: u64,
}

/// How far a readahead window grows, as a multiple of the configured one.
pub(crate) const WINDOW_GROWTH: u64 = 4;

impl Sequence {
    /// A read of `offset..end` (last chunk `last`) of a file of `chunks` chunks: the chunks
    /// to schedule now (`from..=to`), if the reader is sequential and any are left.
    pub(crate) fn advance(
        &mut self,
        offset: u64,
        end: u64,
        last: u64,
        base: u64,
        chunks: u64,
    ) -> Option<(u64, u64)> {
        let sequential = offset == self.next || offset == 0;
        self.next = end;
        if !sequential {
            self.window = 0;
            return None;
        }
        self.window = if self.window == 0 {
            base
        } else {
            (self.window * 2).min(base * WINDOW_GROWTH)
        };
        let from = self.scheduled_to.map_or(last + 1, |a| a.max(last) + 1);
        let to = (last + self.window).min(chunks.saturating_sub(1));
        if from > to {
            return None;
        }
        self.scheduled_to = Some(to);
        Some((from, to))
    }
}

/// One file the kernel holds open.
pub(crate) struct OpenFile {
    pub(crate) node: Arc<Node>,
    pub(crate) mode: ModeKind,
    pub(crate) access: Access,
    /// Who opened it: its readahead fetches on the opener's behalf.
    pub(crate) caller: Arc<hoardfs_origin::Caller>,
    /// Keeps the object this open started with from eviction until release.
    _hold: Option<OpenHold>,
    /// Sequential detection: where the next read would start, and the highest chunk already
    /// scheduled for readahead.
    pub(crate) seq: Mutex<Sequence>,
    /// Released: queued readahead for it is skipped.
    closed: AtomicBool,
    /// The end of the farthest read asked for through this open: queued readahead of a
    /// chunk wholly before it is skipped (the reader fetched that chunk itself).
    read_to: AtomicU64,
    /// Thread id (FUSE's `pid`) of the latest write through this open that had one (0:
    /// none yet).
    writer: AtomicU32,
    /// Whether anything was written through this open (also by the kernel's writeback of
    /// a shared mapping, which carries no pid).
    wrote: AtomicBool,
    /// A descriptor of it may have been closed: the kernel flushed it, or it is
    /// read-only (no flush tells of its closes).
    flushed: AtomicBool,
}

impl OpenFile {
    /// An open of `node` served as `mode`, holding its object by `hold`.
    pub(crate) fn new(
        node: Arc<Node>,
        mode: ModeKind,
        access: Access,
        hold: Option<OpenHold>,
    ) -> OpenFile {
        OpenFile {
            node,
            mode,
            access,
            caller: hoardfs_origin::caller::current(),
            _hold: hold,
            seq: Mutex::new(Sequence::default()),
            closed: AtomicBool::new(false),
            read_to: AtomicU64::new(0),
            writer: AtomicU32::new(0),
            wrote: AtomicBool::new(false),
            // (A read-only open gets no FLUSH: its close is never seen.)
            flushed: AtomicBool::new(!access.write),
        }
    }

    /// Thread `pid` (0: the kernel's writeback) wrote through this open.
    pub(crate) fn wrote_from(&self, pid: u32) {
        self.wrote.store(true, Ordering::Relaxed);
        if pid != 0 {
            self.writer.store(pid, Ordering::Relaxed);
        }
    }

    /// Whether anything was written through this open.
    pub(crate) fn has_written(&self) -> bool {
        self.wrote.load(Ordering::Relaxed)
    }

    /// Whether thread `pid` made the latest write through this open that had a pid.
    pub(crate) fn is_latest_writer(&self, pid: u32) -> bool {
        let w = self.writer.load(Ordering::Relaxed);
        w != 0 && w == pid
    }

    /// Whether a close by process `pid` ends the writing: it is the latest writer, or
    /// nobody wrote. A close by another process (typically a child forked while the
    /// writer was still writing, closing its inherited copy at exec) is not.
    pub(crate) fn closed_by_writer(&self, pid: u32) -> bool {
        let w = self.writer.load(Ordering::Relaxed);
        w == 0 || w == pid
    }

    /// Whether a close by thread `pid` is one of the writing process's (its latest
    /// writer's thread group; where either thread is gone, assumed so), as opposed to
    /// another process's closing a copy it inherited (a child at exec).
    pub(crate) fn closed_in_writer_process(&self, pid: u32) -> bool {
        let w = self.writer.load(Ordering::Relaxed);
        if w == 0 || w == pid {
            return true;
        }
        match (thread_group(w), thread_group(pid)) {
            (Some(a), Some(b)) => a == b,
            _ => true,
        }
    }

    /// A descriptor of it was closed; true the first time.
    pub(crate) fn flushed_first(&self) -> bool {
        !self.flushed.swap(true, Ordering::Relaxed)
    }

    /// Whether a descriptor of it was closed.
    pub(crate) fn was_flushed(&self) -> bool {
        self.flushed.load(Ordering::Relaxed)
    }

    /// Whether the open was released.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// A read asked for bytes up to `end`.
    pub(crate) fn read_up_to(&self, end: u64) {
        self.read_to.fetch_max(end, Ordering::Relaxed);
    }

    /// The end of the farthest read asked for.
    pub(crate) fn read_to(&self) -> u64 {
        self.read_to.load(Ordering::Relaxed)
    }

    /// The reader starts over from the beginning (what the read path learnt is reset).
    pub(crate) fn restart(&self) {
        *self.seq.lock() = Sequence::default();
        self.read_to.store(0, Ordering::Relaxed);
    }
}

/// The open files by kernel handle. Lock: a leaf.
pub(crate) struct OpenFiles {
    files: RwLock<HashMap<FileHandle, Arc<OpenFile>>>,
    next_fh: AtomicU64,
}

impl Default for OpenFiles {
    fn default() -> Self {
        OpenFiles {
            files: RwLock::new(HashMap::new()),
            // 0 is what reads of files the kernel opened itself carry.
            next_fh: AtomicU64::new(1),
        }
    }
}

impl OpenFiles {
    /// Records `of` under a new handle.
    pub(crate) fn insert(&self, of: OpenFile) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.write().insert(fh, Arc::new(of));
        fh
    }

    /// The open file of handle `fh`.
    pub(crate) fn get(&self, fh: FileHandle) -> Option<Arc<OpenFile>> {
        self.files.read().get(&fh).cloned()
    }

    /// Whether node `ino` is open for writing (until the open's release).
    pub(crate) fn writing(&self, ino: crate::Ino) -> bool {
        self.files
            .read()
            .values()
            .any(|of| of.node.ino == ino && of.access.write)
    }

    /// Removes handle `fh`, marking its open file closed.
    pub(crate) fn remove(&self, fh: FileHandle) -> Option<Arc<OpenFile>> {
        let of = self.files.write().remove(&fh)?;
        of.closed.store(true, Ordering::Relaxed);
        Some(of)
    }
}

/// The process (thread group id) of thread `tid`, from `/proc` (`None`: gone, or no
/// `/proc`).
fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
