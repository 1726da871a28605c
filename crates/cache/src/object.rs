//! One cached file: its data file, its record, and the rules that keep them consistent.
//!
//! Ordering rules that make a crash (or `kill -9`) safe: a record is only ever *extended*
//! after the chunk's bytes were written to the data file; a new version starts by writing an
//! empty record, then replacing the data file. A damaged record reads as "nothing present".
//! Power-loss durability (fsync batching) is a later layer; see doc/DESIGN.md.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::meta::{ObjectKey, ObjectMeta};
use crate::ranges::RangeSet;
use crate::{CacheError, io_at};

/// An open cached object. Shared by all readers of the file; chunk writes are serialised
/// on the record lock (held only for the in-memory update and one small `pwrite`).
#[derive(Debug)]
pub struct CachedObject {
    pub(crate) data_path: PathBuf,
    pub(crate) meta_path: PathBuf,
    pub(crate) data: File,
    pub(crate) meta_file: File,
    pub(crate) state: Mutex<State>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) meta: ObjectMeta,
    /// Set when a newer version replaced this object: its writes are then ignored.
    pub(crate) retired: bool,
    /// Byte ranges of absent chunks whose bytes in the data file are known to be right for
    /// `meta.version` (written through this client); in memory only, so a crash forgets
    /// them and the chunks are fetched again.
    pub(crate) known: RangeSet,
}

impl CachedObject {
    pub(crate) fn open(
        data_path: PathBuf,
        meta_path: PathBuf,
        key: ObjectKey,
        version: u64,
        size: u64,
    ) -> Result<CachedObject, CacheError> {
        if let Some(dir) = data_path.parent() {
            fs::create_dir_all(dir).map_err(io_at(dir))?;
        }
        if let Some(obj) = Self::load(&data_path, &meta_path, key, version, size) {
            return Ok(obj);
        }
        // Start over: empty record first, then a fresh data file (old one unlinked, so any
        // passthrough reader still holding it keeps reading consistent old bytes).
        let meta = ObjectMeta::empty(key, version, size);
        let tmp = meta_path.with_extension("meta.tmp");
        fs::write(&tmp, meta.encode()).map_err(io_at(&tmp))?;
        fs::rename(&tmp, &meta_path).map_err(io_at(&meta_path))?;
        match fs::remove_file(&data_path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&data_path)(e)),
        }
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&data_path)
            .map_err(io_at(&data_path))?;
        data.set_len(size).map_err(io_at(&data_path))?;
        let meta_file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&meta_path)
            .map_err(io_at(&meta_path))?;
        Ok(CachedObject {
            data_path,
            meta_path,
            data,
            meta_file,
            state: Mutex::new(State {
                meta,
                retired: false,
                known: RangeSet::default(),
            }),
        })
    }

    /// Opens an existing object if its record is intact and matches version and size.
    fn load(
        data_path: &Path,
        meta_path: &Path,
        key: ObjectKey,
        version: u64,
        size: u64,
    ) -> Option<CachedObject> {
        let meta_file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(meta_path)
            .ok()?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut &meta_file, &mut bytes).ok()?;
        let meta = ObjectMeta::decode(&bytes).ok()?;
        if meta.key != key || meta.version != version || meta.size != size {
            return None;
        }
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .open(data_path)
            .ok()?;
        if data.metadata().ok()?.len() != size {
            return None;
        }
        Some(CachedObject {
            data_path: data_path.to_path_buf(),
            meta_path: meta_path.to_path_buf(),
            data,
            meta_file,
            state: Mutex::new(State {
                meta,
                retired: false,
                known: RangeSet::default(),
            }),
        })
    }

    /// A snapshot of the record.
    pub fn meta(&self) -> ObjectMeta {
        self.state.lock().meta.clone()
    }

    /// Origin version this object holds.
    pub fn version(&self) -> u64 {
        self.state.lock().meta.version
    }

    /// File size at that version.
    pub fn size(&self) -> u64 {
        self.state.lock().meta.size
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        self.state.lock().meta.chunk_size()
    }

    /// Whether chunk `i` is present.
    pub fn has_chunk(&self, i: u64) -> bool {
        self.state.lock().meta.is_present(i)
    }

    /// True when every byte of the file is cached.
    pub fn is_complete(&self) -> bool {
        self.state.lock().meta.is_complete()
    }

    /// Bytes present (sum of present chunk lengths).
    pub fn bytes_present(&self) -> u64 {
        let st = self.state.lock();
        (0..st.meta.chunks())
            .filter(|&i| st.meta.is_present(i))
            .map(|i| {
                let (a, b) = st.meta.chunk_range(i);
                b - a
            })
            .sum()
    }

    /// Stores chunk `i` (exactly the chunk's length) fetched at origin `version`, and
    /// records it as present. Ignored when the object no longer holds that version.
    pub fn write_chunk(&self, i: u64, bytes: &[u8], version: u64) -> Result<(), CacheError> {
        // The lock is held across the data write: a write through this client
        // (`apply_write`) must never be overwritten by bytes fetched for an older version.
        let mut st = self.state.lock();
        // Present chunks are only changed by writes through this client, and a retired
        // object's file belongs to an older version.
        if st.retired || st.meta.is_present(i) || st.meta.version != version {
            return Ok(());
        }
        if i >= st.meta.chunks() {
            return Err(CacheError::ChunkLength {
                chunk: i,
                got: bytes.len(),
                want: 0,
            });
        }
        let (start, end) = st.meta.chunk_range(i);
        if bytes.len() as u64 != end - start {
            return Err(CacheError::ChunkLength {
                chunk: i,
                got: bytes.len(),
                want: end - start,
            });
        }
        self.data
            .write_all_at(bytes, start)
            .map_err(io_at(&self.data_path))?;
        st.known.remove(start, end);
        st.meta.set_present(i, crc32c::crc32c(bytes));
        let record = st.meta.encode();
        if let Err(e) = self.meta_file.write_all_at(&record, 0) {
            st.meta.clear(i);
            return Err(io_at(&self.meta_path)(e));
        }
        Ok(())
    }

    /// Reads cached bytes at `offset` into `buf`; the caller has checked presence.
    /// Returns the count read (short only at end of file).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize, CacheError> {
        let mut done = 0;
        while done < buf.len() {
            match self.data.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_at(&self.data_path)(e)),
            }
        }
        Ok(done)
    }

    /// A read-only descriptor of the data file, for FUSE passthrough. Only meaningful when
    /// [`CachedObject::is_complete`].
    pub fn open_backing(&self) -> Result<File, CacheError> {
        let proc_path = format!("/proc/self/fd/{}", self.data.as_raw_fd());
        OpenOptions::new()
            .read(true)
            .open(&proc_path)
            .map_err(io_at(&self.data_path))
    }

    /// Marks this object as replaced by a newer version: later writes through it are
    /// ignored, so they can never touch the newer record.
    pub fn retire(&self) {
        self.state.lock().retired = true;
    }

    /// Path of the data file.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }
}
