//! One cached file: its data file, its record, and the rules that keep them consistent.
//!
//! Ordering rules that make a crash (or `kill -9`) safe: a record is only ever *extended*
//! after the chunk's bytes were written to the data file; a new version starts by writing an
//! empty record, then replacing the data file. A damaged record reads as "nothing present".
//! Power loss can still leave a record whose data never reached the disk; such objects are
//! verified against their checksums when first loaded after the unclean stop (the store's
//! crash epoch says which), and bad chunks are dropped (see doc/DESIGN.md).
//!
//! Eviction may empty an object that is in memory but not open (`empty_in_place`); daemon
//! reads detect that through the object's generation and refetch.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

use parking_lot::Mutex;

use crate::meta::{ObjectKey, ObjectMeta};
use crate::quota::Counters;
use crate::ranges::RangeSet;
use crate::store::Store;
use crate::{CacheError, io_at};

/// Rounds a record length up to the file system block it occupies.
fn record_bytes(len: usize) -> u64 {
    (len as u64).div_ceil(4096) * 4096
}

/// What a cached object holds: which version of the file, its size and chunk size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectShape {
    /// The file's version.
    pub version: u64,
    /// Its size at that version.
    pub size: u64,
    /// Chunk size in bytes.
    pub chunk_size: u64,
}

/// An open cached object. Shared by all readers of the file; chunk writes are serialised
/// on the record lock, which is held across the chunk's data write and the record update
/// (so bytes fetched for an older version never overwrite a write through this client).
#[derive(Debug)]
pub struct CachedObject {
    pub(crate) store: Arc<Store>,
    pub(crate) key: ObjectKey,
    /// Bumped before eviction or verification drops chunks, so daemon reads that raced
    /// with it can tell.
    pub(crate) generation: AtomicU64,
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
    /// Bytes the object occupies on disk, as last charged to the store.
    pub(crate) allocated: u64,
}

impl CachedObject {
    /// Opens the object at `version`/`size` (the caller holds the key's shard lock):
    /// loads it if its record matches (verifying every present chunk when `verify`),
    /// otherwise starts it empty.
    pub(crate) fn open(
        store: &Arc<Store>,
        key: ObjectKey,
        version: u64,
        size: u64,
        verify: bool,
    ) -> Result<CachedObject, CacheError> {
        let (data_path, meta_path) = crate::object_paths(&store.root, &key);
        if let Some(obj) = Self::load(store, &data_path, &meta_path, key) {
            let st = obj.state.lock();
            let matches = st.meta.version == version && st.meta.size == size;
            drop(st);
            if matches {
                if verify {
                    obj.verify()?;
                }
                return Ok(obj);
            }
        }
        // Start over: empty record first, then a fresh data file (old one unlinked, so any
        // passthrough reader still holding it keeps reading consistent old bytes). The
        // directory is created only here: loading an existing object needs no syscall for it.
        if let Some(dir) = data_path.parent() {
            crate::private::create_dir_all(dir).map_err(io_at(dir))?;
        }
        let meta = ObjectMeta::empty(key, version, size);
        let tmp = meta_path.with_extension("meta.tmp");
        crate::private::write(&tmp, &meta.encode()).map_err(io_at(&tmp))?;
        fs::rename(&tmp, &meta_path).map_err(io_at(&meta_path))?;
        match fs::remove_file(&data_path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_at(&data_path)(e)),
        }
        let data = crate::private::file_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&data_path)
            .map_err(io_at(&data_path))?;
        data.set_len(size).map_err(io_at(&data_path))?;
        let meta_file = crate::private::file_options()
            .read(true)
            .write(true)
            .open(&meta_path)
            .map_err(io_at(&meta_path))?;
        let allocated = record_bytes(meta.encoded_len());
        Ok(CachedObject {
            store: store.clone(),
            key,
            generation: AtomicU64::new(0),
            data_path,
            meta_path,
            data,
            meta_file,
            state: Mutex::new(State {
                meta,
                retired: false,
                known: RangeSet::default(),
                allocated,
            }),
        })
    }

    /// Opens an existing object if its record is intact, names `key`, and its data file
    /// has the recorded size.
    pub(crate) fn load(
        store: &Arc<Store>,
        data_path: &Path,
        meta_path: &Path,
        key: ObjectKey,
    ) -> Option<CachedObject> {
        let meta_file = crate::private::file_options()
            .read(true)
            .write(true)
            .open(meta_path)
            .ok()?;
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut &meta_file, &mut bytes).ok()?;
        let meta = ObjectMeta::decode(&bytes).ok()?;
        if meta.key != key {
            return None;
        }
        let data = crate::private::file_options()
            .read(true)
            .write(true)
            .open(data_path)
            .ok()?;
        let md = data.metadata().ok()?;
        if md.len() != meta.size {
            return None;
        }
        let allocated = md.blocks() * 512 + record_bytes(bytes.len());
        Some(CachedObject {
            store: store.clone(),
            key,
            generation: AtomicU64::new(0),
            data_path: data_path.to_path_buf(),
            meta_path: meta_path.to_path_buf(),
            data,
            meta_file,
            state: Mutex::new(State {
                meta,
                retired: false,
                known: RangeSet::default(),
                allocated,
            }),
        })
    }

    /// Re-reads the space the object occupies; returns the change since last charged.
    pub(crate) fn recharge(&self, st: &mut State) -> i64 {
        let blocks = self.data.metadata().map(|m| m.blocks() * 512).unwrap_or(0);
        let now = blocks + record_bytes(st.meta.encoded_len());
        let delta = now as i64 - st.allocated as i64;
        st.allocated = now;
        delta
    }

    /// Bytes the object occupies on disk (as last measured).
    pub fn allocated(&self) -> u64 {
        self.state.lock().allocated
    }

    /// Which object this is.
    pub fn key(&self) -> ObjectKey {
        self.key
    }

    /// Checks every present chunk against its checksum; bad ones are dropped (and counted).
    /// Returns `(chunks checked, chunks dropped)`.
    pub fn verify(&self) -> Result<(u64, u64), CacheError> {
        let mut st = self.state.lock();
        let mut buf = Vec::new();
        let (mut checked, mut bad) = (0, 0);
        for c in 0..st.meta.chunks() {
            if !st.meta.is_present(c) {
                continue;
            }
            let (a, b) = st.meta.chunk_range(c);
            buf.resize((b - a) as usize, 0);
            checked += 1;
            let ok = self.data.read_exact_at(&mut buf, a).is_ok()
                && crc32c::crc32c(&buf) == st.meta.crcs[c as usize];
            if !ok {
                self.generation.fetch_add(1, SeqCst);
                st.meta.clear(c);
                bad += 1;
            }
        }
        if bad > 0 {
            tracing::warn!(
                "cache object {:x}: {bad} of {checked} chunks failed their checksum and were \
                 dropped",
                self.key.file_id
            );
            self.meta_file
                .write_all_at(&st.meta.encode(), 0)
                .map_err(io_at(&self.meta_path))?;
        }
        let c = &self.store.counters;
        Counters::add(&c.chunks_verified, checked);
        Counters::add(&c.checksum_failures, bad);
        Ok((checked, bad))
    }

    /// Drops every chunk and frees the data file's blocks, keeping the object usable (it
    /// is in memory but no file has it open). Returns the bytes freed.
    pub(crate) fn empty_in_place(&self) -> u64 {
        let mut st = self.state.lock();
        self.generation.fetch_add(1, SeqCst);
        st.meta = ObjectMeta::empty(st.meta.key, st.meta.version, st.meta.size);
        st.known = RangeSet::default();
        let ok = self.meta_file.write_all_at(&st.meta.encode(), 0).is_ok()
            && self.data.set_len(0).is_ok()
            && self.data.set_len(st.meta.size).is_ok();
        if !ok {
            // The record could not be rewritten: no later write may trust this object.
            st.retired = true;
        }
        let delta = self.recharge(&mut st);
        (-delta).max(0) as u64
    }

    /// Counts an open file holding this object: it is not evicted until the guard drops.
    pub fn hold_open(self: &Arc<Self>) -> OpenHold {
        self.store.hold(&self.key, true);
        OpenHold(self.clone())
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

    /// Version, size and chunk size together (one lock, for per-request use).
    pub fn shape(&self) -> ObjectShape {
        let st = self.state.lock();
        ObjectShape {
            version: st.meta.version,
            size: st.meta.size,
            chunk_size: st.meta.chunk_size(),
        }
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        self.state.lock().meta.chunk_size()
    }

    /// Whether the cache refused room for a chunk within the last second (full, with
    /// nothing it may evict): misses are then better served without whole-chunk fetches.
    pub fn cache_refusing(&self) -> bool {
        self.store.refusing()
    }

    /// Whether free space was below a stop threshold at the culler's last look (nothing
    /// new is cached until there is room again).
    pub fn cache_below_stop(&self) -> bool {
        self.store.below_stop()
    }

    /// Whether chunk `i` is cached.
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
    /// records it as present. Returns false when it was not stored: the object no longer
    /// holds that version, or no room could be made (the caller serves the bytes uncached).
    pub fn write_chunk(&self, i: u64, bytes: &[u8], version: u64) -> Result<bool, CacheError> {
        let want = (bytes.len() as u64).div_ceil(4096) * 4096;
        if !self.store.reserve(want) {
            return Ok(false);
        }
        let r = self.write_chunk_reserved(i, bytes, version);
        let delta = r.as_ref().map_or(0, |(_, d)| *d);
        self.store.settle(&self.key, want, delta);
        r.map(|(stored, _)| stored)
    }

    fn write_chunk_reserved(
        &self,
        i: u64,
        bytes: &[u8],
        version: u64,
    ) -> Result<(bool, i64), CacheError> {
        // The lock is held across the data write: a write through this client
        // (`apply_write`) must never be overwritten by bytes fetched for an older version.
        let mut st = self.state.lock();
        // Present chunks are only changed by writes through this client, and a retired
        // object's file belongs to an older version.
        if st.retired || st.meta.is_present(i) || st.meta.version != version {
            return Ok((false, 0));
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
        let delta = self.recharge(&mut st);
        Ok((true, delta))
    }

    /// Copies chunk `c`'s cached bytes at `offset` into `buf` if the chunk is present and
    /// stays present throughout (an eviction racing with the read makes this return false).
    pub fn read_chunk_at(&self, c: u64, buf: &mut [u8], offset: u64) -> Result<bool, CacheError> {
        let generation = self.generation.load(SeqCst);
        if !self.has_chunk(c) {
            return Ok(false);
        }
        let n = self.read_at(buf, offset)?;
        Ok(n == buf.len() && self.generation.load(SeqCst) == generation)
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

    /// Whether a newer version replaced this object.
    pub fn is_retired(&self) -> bool {
        self.state.lock().retired
    }

    /// Path of the data file.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }
}

/// An open file's hold on a cached object (see [`CachedObject::hold_open`]).
#[derive(Debug)]
pub struct OpenHold(Arc<CachedObject>);

impl OpenHold {
    /// The held object.
    pub fn object(&self) -> &Arc<CachedObject> {
        &self.0
    }
}

impl Drop for OpenHold {
    fn drop(&mut self) {
        self.0.store.hold(&self.0.key, false);
    }
}
