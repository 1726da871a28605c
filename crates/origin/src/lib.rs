//! Origins: the authoritative source of files that a hoardfs client caches.
//!
//! [`Origin`] is the one interface the file-system layer uses to reach data it does not
//! have. Two implementations exist: [`local::LocalOrigin`], a directory on this machine
//! (also what `hoardfs serve` exports), and [`remote::RemoteOrigin`], a `hoardfs serve`
//! process reached over TCP. Both name objects by [`Handle`] and report a change attribute
//! (`Attr::version`) with every attribute set.

use std::time::Duration;

pub use hoardfs_proto::{
    Attr, DirEntry, Entry, FileKind, Handle, ServerCounters, StatFs, Timestamp, WireError,
};

pub mod local;
pub mod remote;

/// Result of origin operations.
pub type Result<T> = std::result::Result<T, OriginError>;

/// Why an origin operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// The origin answered with a file-system error.
    #[error(transparent)]
    Fs(#[from] WireError),
    /// The origin could not be reached (connection refused, reset, not yet reconnected).
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    /// The origin did not answer in time.
    #[error("origin did not answer within {0:?}")]
    Timeout(Duration),
    /// The origin sent something that violates the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
}

impl OriginError {
    /// True when the failure means "cannot talk to the origin right now" (so cached state
    /// may be served instead), as opposed to a definite answer from it.
    pub fn is_offline(&self) -> bool {
        matches!(self, OriginError::Unreachable(_) | OriginError::Timeout(_))
    }
}

/// What the origin says about itself at connection time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginInfo {
    /// Stable identity of the exported tree; caches are keyed by it.
    pub export_id: u128,
    /// Root directory.
    pub root: Entry,
    /// Whether the origin refuses modifications.
    pub read_only: bool,
}

/// Bytes returned by [`Origin::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReply {
    /// The bytes; shorter than requested only at end of file.
    pub data: Vec<u8>,
    /// The file's change attribute observed with the read.
    pub version: u64,
}

/// A page of directory entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// Entries (without `.` and `..`).
    pub entries: Vec<DirEntry>,
    /// Cookie to continue with, `None` at the end.
    pub next: Option<u64>,
}

/// The authoritative source of files. Implementations are shared by many threads.
pub trait Origin: Send + Sync + 'static {
    /// Identity and root of the export. May contact the origin.
    fn info(&self) -> Result<OriginInfo>;
    /// Resolves one name in a directory.
    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry>;
    /// Fresh attributes of an object.
    fn getattr(&self, handle: Handle) -> Result<Attr>;
    /// One page of a directory, with attributes, starting at `cookie` (0 = start).
    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage>;
    /// Reads up to `len` bytes at `offset`.
    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply>;
    /// Target of a symlink.
    fn readlink(&self, handle: Handle) -> Result<Vec<u8>>;
    /// File-system statistics of the export.
    fn statfs(&self) -> Result<StatFs>;
    /// Whether the origin is currently believed reachable (no network traffic).
    fn is_connected(&self) -> bool {
        true
    }
}
