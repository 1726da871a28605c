//! Misses into the disk cache: fetching chunks from the origin, one fetch per chunk
//! however many readers want it, and readahead for sequential readers on a small pool of
//! threads. The [`Fetcher`] owns that machinery (the in-flight table, the readahead
//! window and queue, the threads) and the fetch itself (origin I/O over a borrowed
//! superblock, and the write into the cached object); it also prefetches whole files.
//! Its threads reach the superblock through the file system they belong to
//! (`Fetcher::read_ahead`, through a `Weak` of the superblock that owns the fetcher).
//!
//! Lock ordering: the in-flight table is a leaf (never held while taking another lock or
//! doing I/O), as is the readahead queue.

use std::sync::mpsc;
use std::sync::{Arc, Weak};

use hoardfs_cache::flight::Flights;
use hoardfs_cache::{CachedObject, ObjectShape, meta::chunk_shift_for};
use hoardfs_proto::buffers::Recycled;
use parking_lot::Mutex;

use crate::Ino;
use crate::manage::Prefetched;
use crate::nodes::Node;
use crate::open_files::OpenFile;
use crate::opens::ModeKind;
use crate::stats::Stats;
use crate::superblock::Superblock;
use crate::{CacheFault, FsConfig, FsResult};

/// A chunk of a version of a file: what one fetch is shared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct ChunkKey {
    ino: Ino,
    version: u64,
    chunk: u64,
}

/// A readahead job: fetch chunk `chunk` for open file `open`.
struct PrefetchJob {
    open: Arc<OpenFile>,
    chunk: u64,
}

/// The current state of a file as reads see it: its cached object (which writes through
/// this client move forward in place) or, without one, its last known version and size.
pub(crate) struct View {
    pub(crate) object: Option<Arc<CachedObject>>,
    pub(crate) version: u64,
    pub(crate) size: u64,
    pub(crate) chunk_shift: u32,
}

impl View {
    pub(crate) fn of(node: &Node) -> View {
        let st = node.state.lock();
        match st.opens.object() {
            Some(o) => {
                let ObjectShape {
                    version,
                    size,
                    chunk_size,
                } = o.shape();
                View {
                    object: Some(o.clone()),
                    version,
                    size,
                    chunk_shift: chunk_size.trailing_zeros(),
                }
            }
            None => View {
                object: None,
                version: st.attr().version,
                size: st.attr().size,
                chunk_shift: chunk_shift_for(st.attr().size),
            },
        }
    }
    pub(crate) fn chunks(&self) -> u64 {
        self.size.div_ceil(1 << self.chunk_shift)
    }
    pub(crate) fn chunk_range(&self, c: u64) -> (u64, u64) {
        let start = c << self.chunk_shift;
        let end = start.saturating_add(1 << self.chunk_shift);
        (start, end.min(self.size))
    }
}

type FetchResult = FsResult<Arc<Recycled>>;

/// Shared fetches and readahead: one fetch per chunk however many readers want it, and
/// readahead jobs for sequential readers, run by a small pool of threads.
pub(crate) struct Fetcher {
    /// Fetches in progress, by chunk (one per chunk however many readers want it).
    inflight: Flights<ChunkKey, FetchResult>,
    /// Chunks fetched ahead of a sequential reader.
    window: u64,
    /// Where readahead jobs go (`None` without threads, or once stopped).
    queue: Mutex<Option<mpsc::Sender<PrefetchJob>>>,
}

impl Fetcher {
    /// The fetcher of the superblock `sb` (which owns it); readahead threads (running its
    /// `read_ahead`) only with a disk cache (`with_cache`): without one there is no
    /// readahead (see `read_uncached`).
    pub(crate) fn new(sb: Weak<Superblock>, config: &FsConfig, with_cache: bool) -> Fetcher {
        let (tx, rx) = mpsc::channel::<PrefetchJob>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = if with_cache {
            config.fetch_threads.max(1)
        } else {
            0
        };
        for i in 0..threads {
            let (rx, sb) = (rx.clone(), sb.clone());
            std::thread::Builder::new()
                .name(format!("hoardfs-fetch-{i}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().recv();
                        let Ok(job) = job else { return };
                        let Some(sb) = sb.upgrade() else { return };
                        sb.fetcher.read_ahead(&sb, &job.open, job.chunk);
                    }
                })
                .expect("spawn fetch thread");
        }
        Fetcher {
            inflight: Flights::default(),
            window: config.readahead_chunks,
            queue: Mutex::new((threads > 0).then_some(tx)),
        }
    }

    /// Stops the readahead threads (queued jobs are dropped once they see the queue gone).
    pub(crate) fn stop(&self) {
        self.queue.lock().take();
    }

    /// Whether readahead jobs can be queued (there are threads, and they were not stopped).
    #[cfg(test)]
    pub(crate) fn reads_ahead(&self) -> bool {
        self.queue.lock().is_some()
    }

    /// A read of `of` asked for `offset..end` (whose last chunk is `last`): for a sequential
    /// reader, queues the chunks of the readahead window not scheduled yet and not cached
    /// (none while the cache is `refusing` room).
    pub(crate) fn schedule(
        &self,
        of: &Arc<OpenFile>,
        view: &View,
        offset: u64,
        end: u64,
        last: u64,
        refusing: bool,
    ) {
        let window = self.window;
        // (A cache refusing room would drop what is fetched ahead: fetch nothing, and
        // leave the window where it is for when there is room again.)
        if window == 0 || of.mode == ModeKind::Passthrough || refusing {
            return;
        }
        let Some((from, to)) = of
            .seq
            .lock()
            .advance(offset, end, last, window, view.chunks())
        else {
            return;
        };
        // Chunks already in the disk cache need no fetch: queueing them would only wake a
        // fetch thread (a cross-CPU wake-up) to find them there.
        let missing: Vec<u64> = (from..=to)
            .filter(|&c| !view.object.as_ref().is_some_and(|o| o.has_chunk(c)))
            .collect();
        if let Some(tx) = &*self.queue.lock() {
            for c in missing {
                let _ = tx.send(PrefetchJob {
                    open: of.clone(),
                    chunk: c,
                });
            }
        }
    }

    /// The bytes of chunk `c` of inode `ino` at `version`: fetched by `fetch` now, or by a
    /// concurrent fetch of the same chunk that we wait for.
    pub(crate) fn shared(
        &self,
        ino: Ino,
        version: u64,
        c: u64,
        fetch: impl FnOnce() -> FsResult<Vec<u8>>,
    ) -> FetchResult {
        let key = ChunkKey {
            ino,
            version,
            chunk: c,
        };
        self.inflight
            .run(key, || fetch().map(|d| Arc::new(Recycled::from(d))))
            .0
    }
}

impl Fetcher {
    /// Fetches every missing chunk of file `ino` (current version) into the disk cache.
    pub(crate) fn prefetch(&self, sb: &Superblock, ino: Ino) -> FsResult<Prefetched> {
        sb.objects.dir()?;
        let node = sb.file_node(ino)?;
        let attr = sb.validated_attr(&node)?.now;
        let object = sb
            .objects
            .object_for(&node, attr.file_id, attr.version, attr.size);
        let Some(object) = object else {
            return Err(CacheFault::CannotHold.into());
        };
        // Held like an open file, so the chunks fetched first are not evicted meanwhile.
        let _hold = object.hold_open();
        // It may have been emptied between its creation and the hold: fetch what is missing.
        let view = View::of(&node);
        let mut done = Prefetched {
            size: attr.size,
            ..Prefetched::default()
        };
        for c in 0..view.chunks() {
            // A cache without room would drop the rest: stop (the file is reported as
            // not fully cached) rather than download it for nothing. Below the stop
            // threshold nothing is tried; otherwise a chunk the cache did not keep (a size
            // limit of pinned and open files, or a new version meanwhile) ends this file.
            if object.has_chunk(c) {
                continue;
            }
            if object.cache_below_stop() {
                break;
            }
            if let Some(bytes) = self.ensure_chunk(sb, &node, &view, c)? {
                done.fetched += bytes.len() as u64;
                if !object.has_chunk(c) {
                    break;
                }
            }
        }
        done.complete = object.is_complete();
        drop(_hold);
        drop(object);
        // Not an open: a file nobody has open lets go of its object (its descriptors), so
        // that prefetching a tree of any size does not hold two descriptors per file; the
        // next open finds the object in the cache again.
        let mut st = node.state.lock();
        if !st.is_open() {
            st.opens.set_object(None);
        }
        Ok(done)
    }

    /// A queued readahead job: fetches chunk `c` for `of` into the disk cache unless the
    /// open was released, the file has no cached object any more, shrank below the chunk,
    /// or the reader already asked for all of it.
    pub(crate) fn read_ahead(&self, sb: &Superblock, of: &Arc<OpenFile>, c: u64) {
        if of.is_closed() {
            return;
        }
        let view = View::of(&of.node);
        // No object any more (replaced by an uncacheable version), or one whose cache has
        // no room: nothing to fill.
        if view.object.as_ref().is_none_or(|o| o.cache_refusing())
            || c >= view.chunks()
            || view.chunk_range(c).1 <= of.read_to()
        {
            return;
        }
        // Fetched on the opener's behalf: the server reads as the opener.
        let _opener = hoardfs_origin::caller::enter(Arc::clone(&of.caller));
        if let Err(e) = self.ensure_chunk(sb, &of.node, &view, c) {
            tracing::debug!("readahead of chunk {c} failed: {e}");
        }
    }

    /// Makes chunk `c` available: `None` if it is in the disk cache, otherwise its bytes
    /// (fetched now, or by a concurrent fetch of the same chunk that we wait for).
    pub(crate) fn ensure_chunk(
        &self,
        sb: &Superblock,
        node: &Node,
        view: &View,
        c: u64,
    ) -> FsResult<Option<Arc<Recycled>>> {
        if view.object.as_ref().is_some_and(|o| o.has_chunk(c)) {
            return Ok(None);
        }
        let result = self.shared(node.ino, view.version, c, || {
            self.fetch_chunk(sb, node, view, c)
        });
        result.map(Some)
    }

    /// Fetches chunk `c` from the origin and stores it in the cache if it is exactly the
    /// version this open is for.
    fn fetch_chunk(&self, sb: &Superblock, node: &Node, view: &View, c: u64) -> FsResult<Vec<u8>> {
        const PIECE: u64 = 4 << 20;
        const MAX_RESERVE: u64 = 64 << 20;
        let (start, end) = view.chunk_range(c);
        let mut data = Vec::new();
        let mut cacheable = true;
        while (data.len() as u64) < end - start {
            let pos = start + data.len() as u64;
            let len = (end - pos).min(PIECE) as u32;
            let mut r = sb.with_handle(node, |h| sb.origin.read(h, pos, len))?;
            r.data.truncate(len as usize);
            cacheable &= r.version == view.version;
            let short = (r.data.len() as u32) < len;
            if data.is_empty() {
                // Usually the whole chunk: keep the received buffer rather than copy it.
                // Room for the rest is reserved up front only up to a bound, so that the
                // size a server claims cannot by itself make us allocate (chunks of
                // huge files are large): beyond it the buffer grows as bytes arrive.
                data = r.data;
                let rest = (end - start).saturating_sub(data.len() as u64);
                data.reserve_exact(rest.min(MAX_RESERVE) as usize);
            } else {
                data.extend_from_slice(&r.data);
            }
            if short {
                cacheable = false;
                break;
            }
        }
        Stats::add(&sb.stats.chunk_fetches, 1);
        Stats::add(&sb.stats.bytes_from_network, data.len() as u64);
        match &view.object {
            Some(obj) if cacheable => {
                if let Err(e) = obj.write_chunk(c, &data, view.version) {
                    tracing::warn!("cache write failed, serving uncached: {e}");
                    Stats::add(&sb.stats.cache_errors, 1);
                }
            }
            Some(_) => Stats::add(&sb.stats.uncacheable_fetches, 1),
            None => {}
        }
        Ok(data)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Weak};
    use std::time::Duration;

    use super::Fetcher;
    use crate::{FsConfig, FsError};

    #[test]
    fn the_readahead_window_grows_while_reading_in_order_and_restarts_on_a_seek() {
        let mut s = crate::open_files::Sequence::default();
        let mb = 1 << 20;
        // 1 MiB reads of a 1000-chunk file with a base window of 8 chunks.
        assert_eq!(s.advance(0, mb, 0, 8, 1000), Some((1, 8)));
        assert_eq!(s.advance(mb, 2 * mb, 1, 8, 1000), Some((9, 17)));
        assert_eq!(s.advance(2 * mb, 3 * mb, 2, 8, 1000), Some((18, 34)));
        assert_eq!(s.advance(3 * mb, 4 * mb, 3, 8, 1000), Some((35, 35)));
        assert_eq!(
            s.advance(4 * mb, 5 * mb, 4, 8, 1000),
            Some((36, 36)),
            "capped at 4x"
        );
        // A seek: nothing scheduled, and the window starts over.
        assert_eq!(s.advance(500 * mb, 501 * mb, 500, 8, 1000), None);
        assert_eq!(
            s.advance(501 * mb, 502 * mb, 501, 8, 1000),
            Some((502, 509))
        );
        // Never past the end of the file.
        assert_eq!(s.advance(502 * mb, 503 * mb, 502, 8, 505), None);
    }

    #[test]
    fn concurrent_misses_of_one_chunk_share_one_fetch() {
        let f = Arc::new(Fetcher::new(Weak::new(), &FsConfig::default(), false));
        let mut follower = None;
        let led = f.shared(1, 7, 0, || {
            let g = f.clone();
            follower = Some(std::thread::spawn(move || {
                g.shared(1, 7, 0, || panic!("a second fetch of the chunk"))
            }));
            // The follower found this flight: its clone is the third reference.
            let joined = || f.inflight.waiting() > 0;
            assert!(
                hoardfs_testutil::wait_until(Duration::from_secs(10), joined),
                "the follower never joined"
            );
            Ok(vec![1, 2, 3])
        });
        let followed = follower.unwrap().join().unwrap();
        assert_eq!(**led.unwrap(), [1, 2, 3]);
        assert_eq!(**followed.unwrap(), [1, 2, 3]);
        assert_eq!(f.inflight.in_progress(), 0);
    }

    #[test]
    fn a_failed_fetch_is_not_kept() {
        let f = Fetcher::new(Weak::new(), &FsConfig::default(), false);
        assert!(!f.reads_ahead());
        let failed = f.shared(1, 7, 0, || Err(FsError::BadHandle));
        assert_eq!(failed.unwrap_err(), FsError::BadHandle);
        // Another version of the same chunk, then the same one again: each is fetched.
        assert_eq!(**f.shared(1, 8, 0, || Ok(vec![8])).unwrap(), [8]);
        assert_eq!(**f.shared(1, 7, 0, || Ok(vec![7])).unwrap(), [7]);
    }
}
