//! A disk cache in front of another origin, for a server that is a shared cache tier
//! (`hoardfs serve --origin s3://…`): file data read by any client is kept in the
//! server's own cache directory (the `hoardfs-cache` store: chunks, CRCs, limits,
//! eviction), and concurrent misses of one chunk, by any number of clients, are one read
//! from the origin. Everything else passes through.
//!
//! The data cached for a file is keyed by its `file_id` and held for one `version`: the
//! version is the one the origin reported for the handle (in the replies that pass
//! through, or a `getattr`), and every fetched piece must come back with that version to
//! be stored, so the cache never mixes two versions of a file.
//!
//! Lock order: `known` is a leaf, never held across origin calls or disk I/O; a chunk's
//! fetch runs with no lock held (`Flights`), its followers wait for its result.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use hoardfs_cache::flight::Flights;
use hoardfs_cache::{CacheDir, CachedObject, ObjectKey};
use hoardfs_origin::{
    Attr, BreakSink, DirPage, Entry, FileKind, Handle, Origin, OriginError, OriginInfo, Owner,
    ReadReply, Result, SetAttrs, StatFs, TreeDir, WriteReply,
};
use parking_lot::Mutex;

/// Largest piece asked of the origin in one call.
const PIECE: u64 = 8 << 20;
/// Handles whose attributes are remembered.
const KNOWN_MAX: usize = 1 << 20;

/// A chunk of a version of a file: what one fetch is shared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ChunkId {
    file_id: u64,
    version: u64,
    chunk: u64,
}

/// What the tier knows of a file behind a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Known {
    file_id: u64,
    version: u64,
    size: u64,
}

/// Counters of the tier's cache.
#[derive(Debug, Default)]
pub struct TierStats {
    /// Bytes served from the tier's disk cache.
    pub bytes_from_cache: AtomicU64,
    /// Bytes fetched from the origin.
    pub bytes_from_origin: AtomicU64,
    /// Reads that waited for another client's fetch of the same chunk.
    pub shared_fetches: AtomicU64,
}

/// An origin with a disk cache in front.
pub struct CachingOrigin {
    inner: Arc<dyn Origin>,
    cache: CacheDir,
    export_id: u128,
    known: Mutex<(HashMap<Handle, Known>, VecDeque<Handle>)>,
    inflight: Flights<ChunkId, Result<Arc<Vec<u8>>>>,
    /// Counters.
    pub stats: Arc<TierStats>,
}

impl CachingOrigin {
    /// `inner` with `cache` in front; `export_id` keys the cached objects.
    pub fn new(inner: Arc<dyn Origin>, cache: CacheDir, export_id: u128) -> CachingOrigin {
        CachingOrigin {
            inner,
            cache,
            export_id,
            known: Mutex::new((HashMap::new(), VecDeque::new())),
            inflight: Flights::default(),
            stats: Arc::default(),
        }
    }

    fn remember(&self, h: Handle, a: &Attr) {
        if a.kind != FileKind::File {
            return;
        }
        let k = Known {
            file_id: a.file_id,
            version: a.version,
            size: a.size,
        };
        let mut g = self.known.lock();
        let (m, order) = &mut *g;
        if m.insert(h, k).is_none() {
            order.push_back(h);
            while order.len() > KNOWN_MAX {
                if let Some(old) = order.pop_front() {
                    m.remove(&old);
                }
            }
        }
    }

    fn forget(&self, h: Handle) {
        self.known.lock().0.remove(&h);
    }

    fn known(&self, h: Handle) -> Result<Known> {
        if let Some(k) = self.known.lock().0.get(&h) {
            return Ok(*k);
        }
        let a = self.inner.getattr(h)?;
        self.remember(h, &a);
        Ok(Known {
            file_id: a.file_id,
            version: a.version,
            size: a.size,
        })
    }

    /// Chunk `c`'s bytes from the origin, fetched once however many ask at the same time.
    fn fetch_shared(
        &self,
        h: Handle,
        k: Known,
        obj: &CachedObject,
        c: u64,
    ) -> Result<Arc<Vec<u8>>> {
        let id = ChunkId {
            file_id: k.file_id,
            version: k.version,
            chunk: c,
        };
        let (r, led) = self.inflight.run(id, || self.fetch_chunk(h, k, obj, c));
        if !led {
            self.stats.shared_fetches.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn fetch_chunk(&self, h: Handle, k: Known, obj: &CachedObject, c: u64) -> Result<Arc<Vec<u8>>> {
        let shift = obj.chunk_size();
        let start = c * shift;
        let end = (start + shift).min(k.size);
        let mut data = Vec::with_capacity((end - start) as usize);
        let mut same = true;
        while (data.len() as u64) < end - start {
            let pos = start + data.len() as u64;
            let len = (end - pos).min(PIECE) as u32;
            let r = self.inner.read(h, pos, len)?;
            same &= r.version == k.version;
            let short = r.data.len() < len as usize;
            data.extend_from_slice(&r.data[..r.data.len().min(len as usize)]);
            if !same || short {
                break;
            }
        }
        self.stats
            .bytes_from_origin
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        if same && data.len() as u64 == end - start {
            if let Err(e) = obj.write_chunk(c, &data, k.version) {
                tracing::warn!("tier cache write failed, serving uncached: {e}");
            }
        } else {
            // The file changed under us: learn its new attributes at the next read.
            self.forget(h);
            return Err(OriginError::Fs(hoardfs_origin::WireError::Stale));
        }
        Ok(Arc::new(data))
    }
}

impl Origin for CachingOrigin {
    fn info(&self) -> Result<OriginInfo> {
        self.inner.info()
    }
    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        let e = self.inner.lookup(parent, name)?;
        self.remember(e.handle, &e.attr);
        Ok(e)
    }
    fn getattr(&self, handle: Handle) -> Result<Attr> {
        let a = self.inner.getattr(handle)?;
        self.forget(handle);
        self.remember(handle, &a);
        Ok(a)
    }
    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        let p = self.inner.readdir(dir, cookie, max_entries)?;
        for e in &p.entries {
            self.remember(e.entry.handle, &e.entry.attr);
        }
        Ok(p)
    }
    fn lists_trees(&self) -> bool {
        self.inner.lists_trees()
    }
    fn read_tree(&self, dir: Handle, dir_id: u64, max_entries: u32) -> Result<Vec<TreeDir>> {
        let dirs = self.inner.read_tree(dir, dir_id, max_entries)?;
        for e in dirs.iter().flat_map(|d| &d.entries) {
            self.remember(e.entry.handle, &e.entry.attr);
        }
        Ok(dirs)
    }
    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        let k = self.known(handle)?;
        let end = k.size.min(offset.saturating_add(u64::from(len)));
        if offset >= end {
            return Ok(ReadReply {
                data: Vec::new(),
                version: k.version,
            });
        }
        let key = ObjectKey {
            export_id: self.export_id,
            file_id: k.file_id,
        };
        let obj = match self.cache.object(key, k.version, k.size) {
            Ok(o) => o,
            Err(e) => {
                tracing::warn!("tier cache unusable for a read, passing it through: {e}");
                return self.inner.read(handle, offset, len);
            }
        };
        let cs = obj.chunk_size();
        // A cache with no room for what this read misses: pass it through, rather than
        // fetch a whole chunk for every part of it a client asks for, to drop it.
        if obj.cache_refusing() && (offset / cs..=(end - 1) / cs).all(|c| !obj.has_chunk(c)) {
            let r = self.inner.read(handle, offset, len)?;
            self.stats
                .bytes_from_origin
                .fetch_add(r.data.len() as u64, Ordering::Relaxed);
            return Ok(r);
        }
        let mut out = vec![0u8; (end - offset) as usize];
        let mut pos = offset;
        while pos < end {
            let c = pos / cs;
            let chunk_end = ((c + 1) * cs).min(end);
            let buf = &mut out[(pos - offset) as usize..(chunk_end - offset) as usize];
            let cached = obj.read_chunk_at(c, buf, pos).unwrap_or(false);
            if cached {
                self.stats
                    .bytes_from_cache
                    .fetch_add(buf.len() as u64, Ordering::Relaxed);
            } else {
                let data = self.fetch_shared(handle, k, &obj, c)?;
                let from = (pos - c * cs) as usize;
                buf.copy_from_slice(&data[from..from + buf.len()]);
            }
            pos = chunk_end;
        }
        Ok(ReadReply {
            data: out,
            version: k.version,
        })
    }
    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.inner.readlink(handle)
    }
    fn statfs(&self) -> Result<StatFs> {
        self.inner.statfs()
    }
    fn is_connected(&self) -> bool {
        self.inner.is_connected()
    }
    fn subscribe(&self, sink: BreakSink) -> bool {
        self.inner.subscribe(sink)
    }
    fn create(&self, p: Handle, n: &[u8], m: u32, x: bool, o: Owner) -> Result<Entry> {
        let e = self.inner.create(p, n, m, x, o)?;
        self.forget(e.handle);
        self.remember(e.handle, &e.attr);
        Ok(e)
    }
    fn mknod(&self, p: Handle, n: &[u8], m: u32, r: u64, o: Owner) -> Result<Entry> {
        self.inner.mknod(p, n, m, r, o)
    }
    fn mkdir(&self, p: Handle, n: &[u8], m: u32, o: Owner) -> Result<Entry> {
        self.inner.mkdir(p, n, m, o)
    }
    fn symlink(&self, p: Handle, n: &[u8], t: &[u8], o: Owner) -> Result<Entry> {
        self.inner.symlink(p, n, t, o)
    }
    fn link(&self, h: Handle, p: Handle, n: &[u8]) -> Result<Entry> {
        self.inner.link(h, p, n)
    }
    fn unlink(&self, p: Handle, n: &[u8]) -> Result<()> {
        self.inner.unlink(p, n)
    }
    fn rmdir(&self, p: Handle, n: &[u8]) -> Result<()> {
        self.inner.rmdir(p, n)
    }
    fn rename(&self, p: Handle, n: &[u8], np: Handle, nn: &[u8], f: u32) -> Result<()> {
        self.inner.rename(p, n, np, nn, f)
    }
    fn setattr(&self, h: Handle, set: &SetAttrs) -> Result<Attr> {
        self.forget(h);
        let a = self.inner.setattr(h, set)?;
        self.remember(h, &a);
        Ok(a)
    }
    fn write(&self, h: Handle, o: u64, d: &[u8], append: bool) -> Result<WriteReply> {
        self.forget(h);
        // Reads of a file being written go to the origin (it holds the staged copy).
        self.inner.write(h, o, d, append)
    }
    fn publishes_on_close(&self) -> bool {
        self.inner.publishes_on_close()
    }
    fn flush(&self, h: Handle) -> Result<Option<(u64, Attr)>> {
        self.forget(h);
        let r = self.inner.flush(h)?;
        if let Some((_, a)) = &r {
            self.remember(h, a);
        }
        Ok(r)
    }
    fn fsync(&self, h: Handle, datasync: bool) -> Result<()> {
        self.forget(h);
        self.inner.fsync(h, datasync)
    }
    fn getxattr(&self, h: Handle, n: &[u8]) -> Result<Vec<u8>> {
        self.inner.getxattr(h, n)
    }
    fn listxattr(&self, h: Handle) -> Result<Vec<u8>> {
        self.inner.listxattr(h)
    }
    fn setxattr(&self, h: Handle, n: &[u8], v: &[u8], f: u32) -> Result<()> {
        self.inner.setxattr(h, n, v, f)
    }
    fn removexattr(&self, h: Handle, n: &[u8]) -> Result<()> {
        self.inner.removexattr(h, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_cache::quota::Limits;
    use hoardfs_origin::local::{LocalOptions, LocalOrigin};

    #[test]
    fn a_tier_cache_without_room_reads_just_the_bytes_asked_for() {
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("f"), &data).unwrap();
        let local = Arc::new(LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap());
        // A disk 1 % free, below the stop threshold (3 %): nothing the tier fetches can be
        // kept, for as long as the test runs.
        let full: hoardfs_cache::SpaceProbe = Box::new(|| {
            Some(hoardfs_cache::Space {
                bytes_total: 100 << 30,
                bytes_avail: 1 << 30,
                files_total: 1 << 20,
                files_avail: 1 << 19,
            })
        });
        let cache =
            CacheDir::open_with(&dir.path().join("cache"), Limits::default(), Some(full)).unwrap();
        let tier = CachingOrigin::new(local.clone(), cache, 7);
        let root = tier.info().unwrap().root.handle;
        let f = tier.lookup(root, b"f").unwrap().handle;
        let piece = 128 << 10;
        for off in (0..data.len()).step_by(piece) {
            let r = tier.read(f, off as u64, piece as u32).unwrap();
            assert_eq!(r.data, &data[off..off + piece], "bytes at {off}");
        }
        // At most the first miss fetched its whole chunk (if it came before the culler's
        // first look); the others only what they asked for, not a chunk per 128 KiB read
        // (32 MiB).
        let from_origin = tier.stats.bytes_from_origin.load(Ordering::Relaxed);
        assert!(
            from_origin <= data.len() as u64 + (1 << 20),
            "{from_origin} bytes from the origin for {} read",
            data.len()
        );
    }
}
