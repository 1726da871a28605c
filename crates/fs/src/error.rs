//! Typed errors of the file-system layer; the FUSE bridge maps them to errno.

use hoardfs_origin::{OriginError, WireError};

/// Why a file-system operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FsError {
    /// The origin answered with an error.
    #[error(transparent)]
    Origin(#[from] WireError),
    /// The origin is unreachable (or did not answer in time) and the cache cannot answer.
    #[error("origin unavailable: {0}")]
    Offline(String),
    /// The origin broke the protocol.
    #[error("origin protocol error: {0}")]
    Protocol(String),
    /// The local cache failed (disk error); the read is not served from it.
    #[error("cache error: {0}")]
    Cache(String),
    /// Modification of a read-only mount.
    #[error("read-only file system")]
    ReadOnly,
    /// An inode or handle number the kernel gave us is unknown.
    #[error("unknown inode or file handle")]
    BadHandle,
    /// Writes the server acknowledged may have been lost before they became durable.
    #[error(transparent)]
    WritesLost(#[from] crate::durability::WritesMayBeLost),
}

impl From<OriginError> for FsError {
    fn from(e: OriginError) -> Self {
        match e {
            OriginError::Fs(w) => FsError::Origin(w),
            OriginError::Unreachable(m) => FsError::Offline(m),
            OriginError::Timeout(d) => FsError::Offline(format!("no answer within {d:?}")),
            OriginError::Protocol(m) => FsError::Protocol(m),
            OriginError::Security(m) => FsError::Offline(m),
        }
    }
}

impl From<hoardfs_cache::CacheError> for FsError {
    fn from(e: hoardfs_cache::CacheError) -> Self {
        FsError::Cache(e.to_string())
    }
}

/// Result of file-system operations.
pub type FsResult<T> = Result<T, FsError>;
