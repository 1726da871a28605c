//! File locks on the wire (protocol 7): `flock` and POSIX byte-range locks the server
//! keeps for its clients, so that processes on different clients exclude each other.
//!
//! A lock is owned by a client-chosen `owner` number, scoped to the connection it is
//! asked on: the kernel's lock owner for POSIX locks (one per process and file table),
//! the open file description for `flock`. The two kinds never conflict with each other,
//! as on Linux.

use serde::{Deserialize, Serialize};

/// Which family a lock belongs to.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockKind {
    /// `flock(2)`: the whole file, owned by an open file description.
    Flock,
    /// `fcntl(2)` record locks (`F_SETLK`, `lockf`, OFD locks): byte ranges.
    Posix,
}

/// What a lock request asks for.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LockType {
    /// Shared (`F_RDLCK`, `LOCK_SH`).
    Read,
    /// Exclusive (`F_WRLCK`, `LOCK_EX`).
    Write,
    /// Release (`F_UNLCK`, `LOCK_UN`).
    Unlock,
}

/// A lock as asked for or as held: its type and the bytes it covers.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LockRange {
    /// Shared, exclusive or release.
    pub typ: LockType,
    /// First byte.
    pub start: u64,
    /// Last byte, inclusive ([`LOCK_TO_EOF`]: to the end of the file, however long).
    pub end: u64,
}

/// [`LockRange::end`] of a lock that reaches past any end of file (the kernel's
/// `OFFSET_MAX` as FUSE passes it).
pub const LOCK_TO_EOF: u64 = i64::MAX as u64;

/// A lock held by someone else, as `F_GETLK` reports it.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockHolder {
    /// The conflicting lock.
    pub range: LockRange,
    /// Process id the holder gave, on its own host (0 when the holder is another client,
    /// whose process ids mean nothing here).
    pub pid: u32,
}

impl LockRange {
    /// Whether the two ranges share a byte.
    pub fn overlaps(&self, other: &LockRange) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    /// Whether the two can be held together by different owners (both shared, or apart).
    pub fn compatible(&self, other: &LockRange) -> bool {
        !self.overlaps(other) || (self.typ == LockType::Read && other.typ == LockType::Read)
    }

    /// Whether the range is well formed (`start <= end`).
    pub fn is_valid(&self) -> bool {
        self.start <= self.end
    }
}
