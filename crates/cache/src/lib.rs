//! The hoardfs on-disk cache store. No FUSE, no network: it stores bytes it is given and
//! answers what it has.
//!
//! Layout of a cache directory (see doc/DESIGN.md):
//! ```text
//! CACHE-DIR/
//!   HOARDFS-CACHE                 superblock: layout version; refused if unknown
//!   lock                          flock()ed by the client using the directory
//!   objects/<export-id>/<xx>/<file-id>.data   the file's bytes at their own offsets
//!   objects/<export-id>/<xx>/<file-id>.meta   presence bitmap, CRCs, version (meta.rs)
//! ```
//! The data file has the origin file's exact size (sparse where absent), so a complete one
//! can be handed to the kernel for FUSE passthrough. Presence is never inferred from holes:
//! only the record says what is there, and the record is written after the data.

pub mod meta;
mod object;
pub mod ranges;
mod write;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

pub use meta::{ObjectKey, ObjectMeta};
pub use object::CachedObject;

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

/// An opened, locked cache directory.
#[derive(Debug)]
pub struct CacheDir {
    root: PathBuf,
    _lock: File,
}

impl CacheDir {
    /// Opens (creating if needed) the cache at `root` and locks it for this process.
    pub fn open(root: &Path) -> Result<CacheDir, CacheError> {
        fs::create_dir_all(root).map_err(io_at(root))?;
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
                let mut f = File::create(&tmp).map_err(io_at(&tmp))?;
                f.write_all(SUPERBLOCK.as_bytes()).map_err(io_at(&tmp))?;
                f.sync_all().map_err(io_at(&tmp))?;
                fs::rename(&tmp, &sb).map_err(io_at(&sb))?;
            }
            Err(e) => return Err(io_at(&sb)(e)),
        }
        let lock_path = root.join("lock");
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_at(&lock_path))?;
        // SAFETY: valid fd; flock has no memory effects.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(CacheError::Locked(root));
        }
        Ok(CacheDir { root, _lock: lock })
    }

    /// The cache directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Paths of an object's data file and record.
    pub fn object_paths(&self, key: &ObjectKey) -> (PathBuf, PathBuf) {
        let fan = xxhash_rust::xxh3::xxh3_64(&key.file_id.to_le_bytes()) & 0xff;
        let dir = self
            .root
            .join("objects")
            .join(format!("{:032x}", key.export_id))
            .join(format!("{fan:02x}"));
        let base = format!("{:016x}", key.file_id);
        (
            dir.join(format!("{base}.data")),
            dir.join(format!("{base}.meta")),
        )
    }

    /// Opens the cached object for `key` at origin `version` and `size`. Chunks cached for
    /// that same version are kept; anything else (other version, damaged record, missing or
    /// wrongly sized data file) is discarded and the object starts empty.
    pub fn object(
        &self,
        key: ObjectKey,
        version: u64,
        size: u64,
    ) -> Result<CachedObject, CacheError> {
        let (data, meta) = self.object_paths(&key);
        CachedObject::open(data, meta, key, version, size)
    }

    /// Reads an object's record without opening it, e.g. to serve it while the origin is
    /// unreachable. `None` if absent or damaged.
    pub fn peek(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        let (_, meta) = self.object_paths(key);
        let m = ObjectMeta::decode(&fs::read(meta).ok()?).ok()?;
        (m.key == *key).then_some(m)
    }
}

#[cfg(test)]
mod tests;
