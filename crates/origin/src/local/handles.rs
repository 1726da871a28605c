//! What a local origin's handle names: an `O_PATH` descriptor of an exported object, in the
//! shared [`crate::handle_table::HandleTable`] keyed by inode.
//!
//! Holding an `O_PATH` descriptor pins the object's identity, so a handle keeps naming the
//! same file across renames, and a deleted file stays readable and writable through it (it
//! reports a link count of zero), as a local open file would.

use std::os::fd::OwnedFd;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hoardfs_proto::FileKind;

use crate::handle_table::Keyed;

/// One exported object known to the server.
#[derive(Debug)]
pub struct Node {
    /// `O_PATH | O_NOFOLLOW` descriptor of the object.
    pub fd: OwnedFd,
    /// Kind at the time it was opened (kinds never change for a live inode).
    pub kind: FileKind,
    /// Device and inode numbers.
    pub dev: u64,
    /// Inode number.
    pub ino: u64,
    /// When data of this object was last read or written for a client: milliseconds since
    /// [`CLOCK`], plus one (0: never).
    last_io: AtomicU64,
    /// The mtime (nanoseconds since the epoch) this server last moved the file to
    /// (`outside`); 0: never.
    bumped_to: AtomicI64,
    /// A directory known to have an inotify watch (see `watch`), so that using it again
    /// costs no look at the watcher's table.
    watched: std::sync::atomic::AtomicBool,
}

/// The origin of [`Node`]'s I/O times.
static CLOCK: LazyLock<Instant> = LazyLock::new(Instant::now);

impl Node {
    /// A node for the object open at `fd`.
    pub fn new(fd: OwnedFd, kind: FileKind, dev: u64, ino: u64) -> Node {
        Node {
            fd,
            kind,
            dev,
            ino,
            last_io: AtomicU64::new(0),
            bumped_to: AtomicI64::new(0),
            watched: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this directory is known to be watched.
    pub fn is_watched(&self) -> bool {
        self.watched.load(Ordering::Relaxed)
    }

    /// Records that this directory is watched.
    pub fn set_watched(&self) {
        self.watched.store(true, Ordering::Relaxed);
    }

    /// The mtime this server last moved the file to (nanoseconds since the epoch; 0:
    /// never). Only changed under the file's write lock.
    pub fn bumped_to(&self) -> i64 {
        self.bumped_to.load(Ordering::Relaxed)
    }

    /// Records that the file's mtime was moved to `ns`.
    pub fn set_bumped_to(&self, ns: i64) {
        self.bumped_to.store(ns, Ordering::Relaxed);
    }

    /// Records that data of this object is being read or written for a client now.
    pub fn note_io(&self) {
        let ms = CLOCK.elapsed().as_millis() as u64 + 1;
        self.last_io.store(ms, Ordering::Relaxed);
    }

    /// Whether data of this object was read or written for a client less than `window`
    /// ago.
    pub fn io_within(&self, window: Duration) -> bool {
        match self.last_io.load(Ordering::Relaxed) {
            0 => false,
            at => {
                let now = CLOCK.elapsed().as_millis() as u64 + 1;
                now.saturating_sub(at) < window.as_millis() as u64
            }
        }
    }
}

impl Keyed for Node {
    /// An inode: device and inode numbers.
    type Key = (u64, u64);
    fn key(&self) -> (u64, u64) {
        (self.dev, self.ino)
    }
}

/// Handles of the exported objects, keyed by inode.
pub type HandleTable = crate::handle_table::HandleTable<Node>;
