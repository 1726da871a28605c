//! Counters of one mount (what `hoardfs stats` will show).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Live counters, updated lock-free on the hot paths.
#[derive(Debug, Default)]
pub struct Stats {
    pub(crate) reads: AtomicU64,
    pub(crate) bytes_from_cache: AtomicU64,
    pub(crate) bytes_from_network: AtomicU64,
    pub(crate) chunk_hits: AtomicU64,
    pub(crate) chunk_fetches: AtomicU64,
    pub(crate) passthrough_opens: AtomicU64,
    pub(crate) passthrough_registrations: AtomicU64,
    pub(crate) daemon_opens: AtomicU64,
    pub(crate) version_checks: AtomicU64,
    pub(crate) cache_errors: AtomicU64,
    pub(crate) uncacheable_fetches: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) listing_fetches: AtomicU64,
    pub(crate) tree_requests: AtomicU64,
    pub(crate) listings_read_ahead: AtomicU64,
    pub(crate) files_fetched_ahead: AtomicU64,
}

/// A copy of the counters at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Daemon read requests served.
    pub reads: u64,
    /// Bytes served by the daemon from the disk cache (passthrough reads are not seen).
    pub bytes_from_cache: u64,
    /// File bytes fetched from the origin.
    pub bytes_from_network: u64,
    /// Chunks found in the cache by daemon reads.
    pub chunk_hits: u64,
    /// Chunks fetched from the origin (for files without a cached object: reads passed
    /// on to it).
    pub chunk_fetches: u64,
    /// Opens handed to the kernel in passthrough mode.
    pub passthrough_opens: u64,
    /// Cache files registered with the kernel for passthrough (once per cached object,
    /// reused by its later opens).
    pub passthrough_registrations: u64,
    /// Opens served by daemon reads.
    pub daemon_opens: u64,
    /// Attribute/version round trips to the origin.
    pub version_checks: u64,
    /// Failures writing the disk cache (data was still served).
    pub cache_errors: u64,
    /// Fetched chunks not cached because the file changed during the fetch.
    pub uncacheable_fetches: u64,
    /// Write requests sent to the origin.
    pub writes: u64,
    /// Bytes written through to the origin.
    pub bytes_written: u64,
    /// Directory listings fetched from the origin on their own (one request per page).
    pub listing_fetches: u64,
    /// Subtree listing requests (`crate::trees`, one request each).
    pub tree_requests: u64,
    /// Directory listings served from what a subtree request read ahead.
    pub listings_read_ahead: u64,
    /// Files fetched whole ahead of a reader walking their directory in listing order.
    pub files_fetched_ahead: u64,
    /// Whether the origin is reachable.
    pub connected: bool,
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    pub(crate) fn count_version_check(&self) {
        Self::add(&self.version_checks, 1);
    }

    pub(crate) fn count_listing_fetch(&self) {
        Self::add(&self.listing_fetches, 1);
    }

    pub(crate) fn count_tree_request(&self) {
        Self::add(&self.tree_requests, 1);
    }

    pub(crate) fn count_listing_read_ahead(&self) {
        Self::add(&self.listings_read_ahead, 1);
    }

    /// Copies the counters.
    pub fn snapshot(&self, connected: bool) -> StatsSnapshot {
        StatsSnapshot {
            reads: self.reads.load(Relaxed),
            bytes_from_cache: self.bytes_from_cache.load(Relaxed),
            bytes_from_network: self.bytes_from_network.load(Relaxed),
            chunk_hits: self.chunk_hits.load(Relaxed),
            chunk_fetches: self.chunk_fetches.load(Relaxed),
            passthrough_opens: self.passthrough_opens.load(Relaxed),
            passthrough_registrations: self.passthrough_registrations.load(Relaxed),
            daemon_opens: self.daemon_opens.load(Relaxed),
            version_checks: self.version_checks.load(Relaxed),
            cache_errors: self.cache_errors.load(Relaxed),
            uncacheable_fetches: self.uncacheable_fetches.load(Relaxed),
            listing_fetches: self.listing_fetches.load(Relaxed),
            tree_requests: self.tree_requests.load(Relaxed),
            listings_read_ahead: self.listings_read_ahead.load(Relaxed),
            files_fetched_ahead: self.files_fetched_ahead.load(Relaxed),
            writes: self.writes.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
            connected,
        }
    }
}
