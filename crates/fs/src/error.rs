//! Typed errors of the file-system layer; the FUSE bridge maps them to errno. Errors of
//! the layers below keep their value (and so their `source()` chain) inside a
//! [`Shared`], which makes them cloneable: one chunk fetch's result goes to every reader
//! waiting for it.

use std::sync::Arc;

use hoardfs_cache::{CacheError, EvictError};
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
    /// The local cache failed or refused; the request is not served from it.
    #[error("cache error: {0}")]
    Cache(#[source] CacheFault),
    /// A thread the file system needs could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        source: Shared<std::io::Error>,
    },
    /// Modification of a read-only mount.
    #[error("read-only file system")]
    ReadOnly,
    /// An inode or handle number the kernel gave us is unknown.
    #[error("unknown inode or file handle")]
    BadHandle,
    /// A change made while the origin was unreachable could not be kept locally (the
    /// staging file of `--offline-writes`: out of space, I/O error).
    #[error("cannot keep the offline change: {0}")]
    OfflineChange(#[source] Shared<std::io::Error>),
    /// A change of `--offline-writes` was sent back to the origin while this operation
    /// was adding to it; the operation, tried again, goes to the origin.
    #[error("the file's offline change was sent back meanwhile: try again")]
    SentMeanwhile,
    /// Writes the server acknowledged may have been lost before they became durable.
    #[error(transparent)]
    WritesLost(#[from] crate::durability::WritesMayBeLost),
}

impl From<OriginError> for FsError {
    fn from(e: OriginError) -> Self {
        match e {
            OriginError::Fs(w) => FsError::Origin(w),
            OriginError::Unreachable(m) | OriginError::Lost(m) => FsError::Offline(m),
            OriginError::Timeout(d) => FsError::Offline(format!("no answer within {d:?}")),
            OriginError::Protocol(m) => FsError::Protocol(m),
            OriginError::Security(m) => FsError::Offline(m),
        }
    }
}

/// What went wrong with the disk cache.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheFault {
    /// The store failed (a disk error).
    #[error(transparent)]
    Store(Shared<CacheError>),
    /// The mount has no disk cache.
    #[error("this mount has no disk cache")]
    NoCache,
    /// The cache cannot hold this file (out of room or inodes).
    #[error("the cache cannot hold this file")]
    CannotHold,
    /// An explicit eviction was refused.
    #[error("cannot evict: {0}")]
    Evict(#[source] EvictError),
    /// A cached chunk disappeared (eviction, scrub) each time it was fetched and read.
    #[error("cached chunk kept disappearing")]
    ChunkVanishing,
}

impl From<CacheError> for FsError {
    fn from(e: CacheError) -> Self {
        FsError::Cache(CacheFault::Store(Shared::new(e)))
    }
}

impl From<CacheFault> for FsError {
    fn from(f: CacheFault) -> Self {
        FsError::Cache(f)
    }
}

/// An error of another layer, shared (cloning an `FsError` does not copy it) and equal
/// only to itself.
#[derive(Debug)]
pub struct Shared<E>(Arc<E>);

impl<E> Shared<E> {
    /// Wraps `e`.
    pub fn new(e: E) -> Self {
        Shared(Arc::new(e))
    }

    /// The error itself.
    pub fn get(&self) -> &E {
        &self.0
    }
}

impl<E> Clone for Shared<E> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<E> PartialEq for Shared<E> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<E> Eq for Shared<E> {}

impl<E: std::fmt::Display> std::fmt::Display for Shared<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl<E: std::error::Error> std::error::Error for Shared<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Result of file-system operations.
pub type FsResult<T> = Result<T, FsError>;

/// Runs `op` again (twice at most) while it finds that the offline change it was adding
/// to was sent back meanwhile ([`FsError::SentMeanwhile`]): tried again, it goes to the
/// origin, or starts a change of its own.
pub(crate) fn retried<T>(mut op: impl FnMut() -> FsResult<T>) -> FsResult<T> {
    for _ in 0..2 {
        match op() {
            Err(FsError::SentMeanwhile) => continue,
            r => return r,
        }
    }
    op()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn a_cache_error_keeps_its_value_and_its_source() {
        const EIO: i32 = 5;
        let io = std::io::Error::from_raw_os_error(EIO);
        let e = FsError::from(CacheError::Io {
            path: "/cache/x".into(),
            source: io,
        });
        assert_eq!(
            e.to_string(),
            format!("cache error: {}", e.source().unwrap())
        );
        let FsError::Cache(CacheFault::Store(store)) = &e else {
            panic!("{e:?}")
        };
        assert!(matches!(store.get(), CacheError::Io { .. }));
        let os = e.source().and_then(|s| s.source()).unwrap();
        assert_eq!(
            os.downcast_ref::<std::io::Error>().unwrap().raw_os_error(),
            Some(EIO)
        );
        assert_eq!(e.clone(), e, "a clone is the same error");
        assert_ne!(e, FsError::from(CacheError::Locked("/cache".into())));
    }
}
