//! Limits of a cache and how much room it has: the configured size limit, free-space and
//! free-inode thresholds in the style of cachefilesd, the probe that reads the cache file
//! system's free space, and the counters and usage report shown by `hoardfs stats`.
//!
//! Thresholds are percentages of the cache file system (blocks for `b*`, inodes for `f*`):
//! below `cull`, a background culler evicts until `run` is free again; below `stop`, new
//! data is not cached at all (it is still served, uncached) unless eviction makes room.

use std::path::Path;

pub use crate::space_alarm::Room;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Size limit and free-space thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Upper bound of the bytes the cache occupies (allocated blocks plus records).
    pub max_bytes: Option<u64>,
    /// Culling stops once this percentage of blocks is free.
    pub brun: u8,
    /// Culling starts when less than this percentage of blocks is free.
    pub bcull: u8,
    /// Nothing new is cached while less than this percentage of blocks is free.
    pub bstop: u8,
    /// As `brun`, for inodes.
    pub frun: u8,
    /// As `bcull`, for inodes.
    pub fcull: u8,
    /// As `bstop`, for inodes.
    pub fstop: u8,
}

impl Default for Limits {
    /// No size limit; cachefilesd's default thresholds (10/7/3 %).
    fn default() -> Self {
        Limits {
            max_bytes: None,
            brun: 10,
            bcull: 7,
            bstop: 3,
            frun: 10,
            fcull: 7,
            fstop: 3,
        }
    }
}

impl Limits {
    /// Checks `stop < cull < run < 100` for blocks and inodes.
    pub fn validate(&self) -> Result<(), String> {
        for (what, run, cull, stop) in [
            ("brun/bcull/bstop", self.brun, self.bcull, self.bstop),
            ("frun/fcull/fstop", self.frun, self.fcull, self.fstop),
        ] {
            if !(stop < cull && cull < run && run < 100) {
                return Err(format!(
                    "{what} must satisfy stop < cull < run < 100 (got {run}/{cull}/{stop})"
                ));
            }
        }
        Ok(())
    }
}

/// Free space of the cache file system.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Space {
    /// Size in bytes.
    pub bytes_total: u64,
    /// Bytes available to the cache's user.
    pub bytes_avail: u64,
    /// Inodes in total.
    pub files_total: u64,
    /// Inodes available.
    pub files_avail: u64,
}

/// Reads the free space (`None` if it cannot be known).
pub type SpaceProbe = Box<dyn Fn() -> Option<Space> + Send + Sync>;

/// A probe calling `statvfs` on `path`.
pub fn statvfs_probe(path: &Path) -> SpaceProbe {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).ok();
    Box::new(move || {
        let p = path.as_ref()?;
        // SAFETY: valid C string and a zeroed out-struct.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(p.as_ptr(), &mut s) } != 0 {
            return None;
        }
        let f = s.f_frsize as u64;
        Some(Space {
            bytes_total: s.f_blocks as u64 * f,
            bytes_avail: s.f_bavail as u64 * f,
            files_total: s.f_files as u64,
            files_avail: s.f_favail as u64,
        })
    })
}

/// A probe that never knows the free space: only a size limit bounds the cache (tests,
/// whose results must not depend on how full the machine's disk is).
pub fn unwatched_probe() -> SpaceProbe {
    Box::new(|| None)
}

/// Bytes and files (inodes) of the cache file system: what must be freed, or what an
/// eviction freed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Amount {
    pub(crate) bytes: u64,
    pub(crate) files: u64,
}

impl Amount {
    /// Nothing.
    pub(crate) const ZERO: Amount = Amount { bytes: 0, files: 0 };

    pub(crate) fn new(bytes: u64, files: u64) -> Amount {
        Amount { bytes, files }
    }

    pub(crate) fn is_zero(self) -> bool {
        self == Amount::ZERO
    }

    /// What is left to free of `self` once `freed` is.
    pub(crate) fn less(self, freed: Amount) -> Amount {
        Amount::new(
            self.bytes.saturating_sub(freed.bytes),
            self.files.saturating_sub(freed.files),
        )
    }

    /// `self` and `more` together.
    pub(crate) fn plus(self, more: Amount) -> Amount {
        Amount::new(self.bytes + more.bytes, self.files + more.files)
    }

    /// Whether `self` is at least `need`, in bytes and in files.
    pub(crate) fn covers(self, need: Amount) -> bool {
        self.bytes >= need.bytes && self.files >= need.files
    }
}

/// What must be freed before `incoming` more bytes (and `new_files` inodes) may be cached:
/// zero when there is room. `used` counts reservations.
pub(crate) fn shortfall(
    limits: &Limits,
    used: u64,
    incoming: u64,
    new_files: u64,
    space: Option<Space>,
) -> Amount {
    let mut bytes = limits
        .max_bytes
        .map_or(0, |m| used.saturating_add(incoming).saturating_sub(m));
    let mut files = 0;
    if let Some(s) = space {
        let stop = pct(s.bytes_total, limits.bstop);
        bytes = bytes.max(stop.saturating_add(incoming).saturating_sub(s.bytes_avail));
        if s.files_total > 0 {
            let fstop = pct(s.files_total, limits.fstop);
            files = (fstop + new_files).saturating_sub(s.files_avail);
        }
    }
    Amount::new(bytes, files)
}

/// `p` % of `total`, as every threshold is computed (rounded down).
pub(crate) fn pct(total: u64, p: u8) -> u64 {
    total / 100 * p as u64
}

/// What the background culler must free now: below `cull`, enough to get back to `run`.
pub(crate) fn cull_target(limits: &Limits, space: Option<Space>) -> Amount {
    let Some(s) = space else {
        return Amount::ZERO;
    };
    let bytes = if s.bytes_avail < pct(s.bytes_total, limits.bcull) {
        pct(s.bytes_total, limits.brun) - s.bytes_avail
    } else {
        0
    };
    let files = if s.files_total > 0 && s.files_avail < pct(s.files_total, limits.fcull) {
        pct(s.files_total, limits.frun) - s.files_avail
    } else {
        0
    };
    Amount::new(bytes, files)
}

/// Event counters of the store.
#[derive(Debug, Default)]
pub struct Counters {
    pub(crate) evictions: AtomicU64,
    pub(crate) evicted_bytes: AtomicU64,
    pub(crate) checksum_failures: AtomicU64,
    pub(crate) chunks_verified: AtomicU64,
    pub(crate) refused_chunks: AtomicU64,
    pub(crate) refused_bytes: AtomicU64,
    pub(crate) orphans_adopted: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }
}

/// A snapshot of the cache's occupancy, limits and counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    /// Objects in the index.
    pub objects: u64,
    /// Bytes they occupy (allocated blocks plus records).
    pub bytes: u64,
    /// Bytes reserved by writes in flight.
    pub reserved: u64,
    /// Pinned objects.
    pub pinned_objects: u64,
    /// Bytes of pinned objects.
    pub pinned_bytes: u64,
    /// Objects held by open files.
    pub open_objects: u64,
    /// The configured limits.
    pub limits: Limits,
    /// Free space of the cache file system, if known.
    pub space: Option<Space>,
    /// What the free space means for caching, as the culler last saw it.
    pub room: Room,
    /// Objects evicted since start.
    pub evictions: u64,
    /// Bytes freed by eviction since start.
    pub evicted_bytes: u64,
    /// Cached chunks found corrupt (dropped and refetched, never served).
    pub checksum_failures: u64,
    /// Cached chunks whose checksum was verified.
    pub chunks_verified: u64,
    /// Fetched chunks served uncached because no room could be made.
    pub refused_chunks: u64,
    /// Their bytes.
    pub refused_bytes: u64,
    /// Objects found on disk but missing from the index, adopted after an unclean stop.
    pub orphans_adopted: u64,
    /// Records read ahead into the page cache because their files were listed.
    pub records_warmed: u64,
    /// The previous client did not shut down in order (objects are verified on first use).
    pub recovered: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 1 << 30;

    fn space(avail_pct: u64, files_avail_pct: u64) -> Option<Space> {
        Some(Space {
            bytes_total: 100 * G,
            bytes_avail: avail_pct * G,
            files_total: 1000,
            files_avail: files_avail_pct * 10,
        })
    }

    #[test]
    fn size_limit_and_stop_threshold_decide_the_shortfall() {
        let l = Limits {
            max_bytes: Some(10 * G),
            ..Limits::default()
        };
        assert_eq!(shortfall(&l, 9 * G, G, 2, space(50, 50)), Amount::new(0, 0));
        assert_eq!(
            shortfall(&l, 10 * G, G, 2, space(50, 50)),
            Amount::new(G, 0)
        );
        // 3% stop line: 3 GiB must stay free.
        assert_eq!(shortfall(&l, 0, G, 2, space(3, 50)), Amount::new(G, 0));
        assert_eq!(shortfall(&l, 0, 0, 2, space(50, 3)), Amount::new(0, 2));
        assert_eq!(
            shortfall(&Limits::default(), 500 * G, G, 2, None),
            Amount::new(0, 0)
        );
    }

    #[test]
    fn culling_starts_below_cull_and_runs_to_run() {
        let l = Limits::default();
        assert_eq!(cull_target(&l, space(8, 50)), Amount::new(0, 0));
        assert_eq!(cull_target(&l, space(6, 50)), Amount::new(4 * G, 0));
        assert_eq!(cull_target(&l, space(50, 5)), Amount::new(0, 50));
        assert!(l.validate().is_ok());
        let bad = Limits { bcull: 11, ..l };
        assert!(bad.validate().is_err());
    }
}
