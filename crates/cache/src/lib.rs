//! The hoardfs on-disk cache store. No FUSE, no network: it stores bytes it is given and
//! answers what it has.
//!
//! Layout of a cache directory (see doc/DESIGN.md):
//! ```text
//! CACHE-DIR/
//!   HOARDFS-CACHE                 superblock: layout version; refused if unknown
//!   lock                          flock()ed by the client using the directory
//!   index                         one slot per object: size, pin, epoch (index.rs)
//!   objects/<export-id>/<xx>/<file-id>.data   the file's bytes at their own offsets
//!   objects/<export-id>/<xx>/<file-id>.meta   presence bitmap, CRCs, version (meta.rs)
//! ```
//! The data file has the origin file's exact size (sparse where absent), so a complete one
//! can be handed to the kernel for FUSE passthrough. Presence is never inferred from holes:
//! only the record says what is there, and the record is written after the data.
//!
//! Module map: `store` (index, eviction, reservations, lock order), `policy` (S3-FIFO),
//! `quota` (limits and free-space thresholds), `object` (one object's files), `write`
//! (writes through this client), `recover` (orphan adoption and the scrub), `warm`
//! (reading records ahead of the opens that need them), `flight` (one fetch per chunk
//! however many callers want it).

pub mod flight;
pub mod index;
pub mod meta;
mod object;
pub mod policy;
pub mod private;
pub mod quota;
pub mod ranges;
mod recover;
mod space_alarm;
mod store;
mod warm;
mod write;

use std::fs;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use meta::{ObjectKey, ObjectMeta};
pub use object::{CachedObject, ObjectShape, OpenHold};
pub use policy::Tracked;
pub use quota::{Limits, Space, SpaceProbe, Usage, statvfs_probe, unwatched_probe};
pub use recover::VerifyReport;
pub use store::EvictError;

use store::Store;

/// Superblock contents written by this build.
const SUPERBLOCK: &str = "hoardfs cache directory\nlayout 1\n";
const SUPERBLOCK_NAME: &str = "HOARDFS-CACHE";

/// Errors of the cache store.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// A file-system operation on the cache failed.
    #[error("cache i/o error on {path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Another hoardfs client is using this cache directory.
    #[error("cache directory {0} is in use by another hoardfs client")]
    Locked(PathBuf),
    /// The directory holds something that is not a hoardfs cache of a known layout.
    #[error("{path} is not a hoardfs cache of a layout this build understands: {why}")]
    Incompatible {
        /// The cache directory.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// The cache directory is not private to the user who mounts.
    #[error(transparent)]
    NotPrivate(#[from] private::NotPrivate),
    /// Data handed to the store does not fit the object (wrong chunk length).
    #[error("chunk {chunk} has {got} bytes, expected {want}")]
    ChunkLength {
        /// Chunk index.
        chunk: u64,
        /// Length given.
        got: usize,
        /// Length required.
        want: u64,
    },
}

/// Attaches the path to an I/O error.
pub(crate) fn io_at(path: &Path) -> impl FnOnce(io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Paths of an object's data file and record under cache root `root`.
pub(crate) fn object_paths(root: &Path, key: &ObjectKey) -> (PathBuf, PathBuf) {
    let fan = xxhash_rust::xxh3::xxh3_64(&key.file_id.to_le_bytes()) & 0xff;
    let dir = root
        .join("objects")
        .join(format!("{:032x}", key.export_id))
        .join(format!("{fan:02x}"));
    let base = format!("{:016x}", key.file_id);
    (
        dir.join(format!("{base}.data")),
        dir.join(format!("{base}.meta")),
    )
}

/// One object as listed by [`CacheDir::entries`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Which object.
    pub key: ObjectKey,
    /// Bytes it occupies.
    pub bytes: u64,
    /// Pinned, open count, priority.
    pub tracked: Tracked,
}

/// An opened, locked cache directory.
#[derive(Debug, Clone)]
pub struct CacheDir {
    store: Arc<Store>,
}

impl CacheDir {
    /// Opens (creating if needed) the cache at `root` with default limits and without
    /// watching the free space of its file system: only a size limit could make room. For
    /// tests and examples, whose results must not depend on how full the machine's disk is;
    /// a mount uses [`Self::open_with`], which watches it.
    pub fn open_unwatched(root: &Path) -> Result<CacheDir, CacheError> {
        Self::open_with(root, Limits::default(), Some(quota::unwatched_probe()))
    }

    /// Opens the cache at `root` for a tool (status, listing, scrub): like [`Self::open_with`]
    /// but without the background culler, so looking at a cache never evicts from it.
    pub fn open_for_inspection(root: &Path) -> Result<CacheDir, CacheError> {
        Self::open_without_culler(root, Limits::default(), None)
    }

    /// Like [`Self::open_with`], but without the background culler: room is made only by
    /// reservations and [`Self::cull_now`] (for tools, and for tests of either alone).
    pub fn open_without_culler(
        root: &Path,
        limits: Limits,
        probe: Option<SpaceProbe>,
    ) -> Result<CacheDir, CacheError> {
        Self::open_inner(root, limits, probe, false)
    }

    /// Opens (creating if needed) the cache at `root` and locks it for this process.
    /// `probe` reads the cache file system's free space (default: `statvfs`). Startup reads
    /// the index only; after an unclean stop, objects are verified on first use and files
    /// missing from the index are adopted in the background.
    pub fn open_with(
        root: &Path,
        limits: Limits,
        probe: Option<SpaceProbe>,
    ) -> Result<CacheDir, CacheError> {
        Self::open_inner(root, limits, probe, true)
    }

    fn open_inner(
        root: &Path,
        limits: Limits,
        probe: Option<SpaceProbe>,
        culler: bool,
    ) -> Result<CacheDir, CacheError> {
        limits.validate().map_err(|why| CacheError::Incompatible {
            path: root.to_path_buf(),
            why,
        })?;
        private::create_dir_all(root).map_err(io_at(root))?;
        let root = root.canonicalize().map_err(io_at(root))?;
        let sb = root.join(SUPERBLOCK_NAME);
        match fs::read_to_string(&sb) {
            Ok(s) if s == SUPERBLOCK => {}
            Ok(s) => {
                return Err(CacheError::Incompatible {
                    path: root,
                    why: format!("superblock says {:?}", s.lines().nth(1).unwrap_or("?")),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let nonempty = fs::read_dir(&root).map_err(io_at(&root))?.next().is_some();
                if nonempty {
                    return Err(CacheError::Incompatible {
                        path: root,
                        why: "directory is not empty and has no superblock".into(),
                    });
                }
                // A new cache: cached bytes keep no per-file permissions, so only the
                // cache's owner may read them.
                {
                    use std::os::unix::fs::PermissionsExt;
                    fs::set_permissions(&root, fs::Permissions::from_mode(0o700))
                        .map_err(io_at(&root))?;
                }
                let tmp = root.join(".HOARDFS-CACHE.tmp");
                let mut f = private::file_options()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&tmp)
                    .map_err(io_at(&tmp))?;
                f.write_all(SUPERBLOCK.as_bytes()).map_err(io_at(&tmp))?;
                f.sync_all().map_err(io_at(&tmp))?;
                fs::rename(&tmp, &sb).map_err(io_at(&sb))?;
            }
            Err(e) => return Err(io_at(&sb)(e)),
        }
        // Every cache is checked at every open, not only a new one: a mode loosened since
        // would show cached copies of other users' files, or let them choose the server.
        private::check_dir(&root)?;
        let lock_path = root.join("lock");
        let lock = private::file_options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        // SAFETY: valid fd; flock has no memory effects.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(CacheError::Locked(root));
        }
        let root: PathBuf = root;
        let index_path = root.join("index");
        let had_index = index_path.exists();
        let (index, loaded) = match index::IndexFile::open(&index_path) {
            Ok(x) => x,
            Err(e) => {
                // The index is an aid, not the authority: start a new one and let recovery
                // adopt what is on disk (verified before use).
                tracing::warn!("{e}; rebuilding the cache index");
                fs::remove_file(&index_path).map_err(io_at(&index_path))?;
                let (i, mut l) = index::IndexFile::open(&index_path)?;
                l.clean = false;
                (i, l)
            }
        };
        // Objects without an index (a cache from before the index existed) are orphans.
        let clean = loaded.clean && (had_index || !root.join("objects").exists());
        let probe = probe.unwrap_or_else(|| statvfs_probe(&root));
        let store = Store::new(root, lock, index, loaded, clean, limits, probe)?;
        if culler {
            store.start_culler();
        }
        if !clean {
            recover::start_adoption(&store);
        }
        Ok(CacheDir { store })
    }

    /// The cache directory.
    pub fn path(&self) -> &Path {
        self.store.root()
    }

    /// Paths of an object's data file and record.
    pub fn object_paths(&self, key: &ObjectKey) -> (PathBuf, PathBuf) {
        object_paths(self.store.root(), key)
    }

    /// Opens the cached object for `key` at origin `version` and `size`. Chunks cached for
    /// that same version are kept (verified first if the object was last checked before an
    /// unclean stop); anything else (other version, damaged record, missing or wrongly
    /// sized data file) is discarded and the object starts empty. One object per key is in
    /// memory at a time: a second call for the same version returns the same object.
    pub fn object(
        &self,
        key: ObjectKey,
        version: u64,
        size: u64,
    ) -> Result<Arc<CachedObject>, CacheError> {
        let store = &self.store;
        let _files = store.shard(&key).lock();
        if let Some(o) = store.live(&key)
            && o.version() == version
            && o.size() == size
            && !o.is_retired()
        {
            return Ok(o);
        }
        let verify = store.needs_verify(&key);
        let obj = Arc::new(CachedObject::open(store, key, version, size, verify)?);
        store.register(&obj);
        Ok(obj)
    }

    /// Reads an object's record without opening it. `None` if absent or damaged.
    pub fn peek(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        let (_, meta) = self.object_paths(key);
        let m = ObjectMeta::decode(&fs::read(meta).ok()?).ok()?;
        (m.key == *key).then_some(m)
    }

    /// Reads the records of those of `keys` that are cached (and not in memory) into the
    /// page cache in the background, in the order given, so that opening them soon after
    /// does not wait for the disk. Best effort: returns how many were queued.
    pub fn warm(&self, keys: impl IntoIterator<Item = ObjectKey>) -> usize {
        self.store.warm(keys)
    }

    /// Occupancy, limits and counters.
    pub fn usage(&self) -> Usage {
        self.store.usage()
    }

    /// Every object in the index.
    pub fn entries(&self) -> Vec<EntryInfo> {
        self.store.entries()
    }

    /// Pins (keeps from eviction, with a hoard priority) or unpins an object.
    pub fn pin(&self, key: ObjectKey, pinned: bool, priority: u16) {
        self.store.pin(key, pinned, priority)
    }

    /// Evicts an object now; returns the bytes freed.
    pub fn evict(&self, key: &ObjectKey) -> Result<u64, EvictError> {
        self.store.evict(key)
    }

    /// Checks every cached chunk against its checksum, dropping bad ones. `progress` is
    /// called with (objects done, objects total).
    pub fn verify(&self, progress: &dyn Fn(u64, u64)) -> VerifyReport {
        recover::scrub(&self.store, progress)
    }

    /// Runs one round of free-space culling now (it also runs in the background).
    pub fn cull_now(&self) -> u64 {
        self.store.cull(usize::MAX)
    }

    /// Whether the previous client stopped without closing the cache in order.
    pub fn recovered(&self) -> bool {
        self.store.recovered
    }

    /// Orderly shutdown: syncs the cache and marks its index clean. Nothing new is cached
    /// afterwards. Also done when the last reference is dropped.
    pub fn close(&self) -> Result<(), CacheError> {
        self.store.close()
    }
}

#[cfg(test)]
mod tests;
