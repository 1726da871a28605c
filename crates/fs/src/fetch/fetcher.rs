//! The [`Fetcher`]'s machinery: the in-flight table (one fetch per chunk however many
//! readers want it), the readahead window and queue, and the pool of threads that runs
//! the queued jobs (each through the closure it was started with). It knows nothing of
//! the superblock that owns it; the fetch itself is `super::fill`'s.
//!
//! Lock ordering: the in-flight table is a leaf (never held while taking another lock or
//! doing I/O), as is the readahead queue.

use std::sync::Arc;
use std::sync::mpsc;

use hoardfs_cache::flight::Flights;
use hoardfs_cache::{CachedObject, ObjectShape, meta::chunk_shift_for};
use hoardfs_proto::buffers::Recycled;
use parking_lot::Mutex;

use super::siblings::{FileJob, Siblings};
use crate::nodes::Node;
use crate::open_files::OpenFile;
use crate::opens::ModeKind;
use crate::{FsConfig, FsResult, Ino};

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

pub(super) type FetchResult = FsResult<Arc<Recycled>>;

/// Shared fetches and readahead: one fetch per chunk however many readers want it, and
/// readahead jobs for sequential readers, run by a small pool of threads.
pub(crate) struct Fetcher {
    /// Fetches in progress, by chunk (one per chunk however many readers want it).
    inflight: Flights<ChunkKey, FetchResult>,
    /// Chunks fetched ahead of a sequential reader.
    window: u64,
    /// Where readahead jobs go (`None` without threads, or once stopped).
    queue: Mutex<Option<mpsc::Sender<PrefetchJob>>>,
    /// Files fetched ahead of readers walking a directory in listing order.
    pub(super) siblings: Siblings,
}

impl Fetcher {
    /// A fetcher whose readahead threads run each queued job with `run` (the owner's
    /// `read_ahead`; `false`: the owner is gone and the thread ends), and whose threads
    /// fetching files ahead run `fetch_file` (the owner's `fetch_file_ahead`), only with a
    /// disk cache (`with_cache`): without one there is no readahead (see `read_uncached`).
    pub(crate) fn new(
        config: &FsConfig,
        with_cache: bool,
        run: impl Fn(&Arc<OpenFile>, u64) -> bool + Send + Sync + 'static,
        fetch_file: impl Fn(FileJob) -> bool + Send + Sync + 'static,
    ) -> Fetcher {
        let run = Arc::new(run);
        let (tx, rx) = mpsc::channel::<PrefetchJob>();
        let rx = Arc::new(Mutex::new(rx));
        let threads = if with_cache {
            config.fetch_threads.max(1)
        } else {
            0
        };
        for i in 0..threads {
            let (rx, run) = (rx.clone(), run.clone());
            std::thread::Builder::new()
                .name(format!("hoardfs-fetch-{i}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().recv();
                        let Ok(job) = job else { return };
                        if !run(&job.open, job.chunk) {
                            return;
                        }
                    }
                })
                .expect("spawn fetch thread");
        }
        let ahead = if with_cache { config.files_ahead } else { 0 };
        Fetcher {
            inflight: Flights::default(),
            window: config.readahead_chunks,
            queue: Mutex::new((threads > 0).then_some(tx)),
            siblings: Siblings::new(ahead, fetch_file),
        }
    }

    /// Stops the readahead threads (queued jobs are dropped once they see the queue gone).
    pub(crate) fn stop(&self) {
        self.queue.lock().take();
        self.siblings.stop();
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;
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
        let f = Arc::new(Fetcher::new(
            &FsConfig::default(),
            false,
            |_, _| false,
            |_| false,
        ));
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
        let f = Fetcher::new(&FsConfig::default(), false, |_, _| false, |_| false);
        assert!(!f.reads_ahead());
        let failed = f.shared(1, 7, 0, || Err(FsError::BadHandle));
        assert_eq!(failed.unwrap_err(), FsError::BadHandle);
        // Another version of the same chunk, then the same one again: each is fetched.
        assert_eq!(**f.shared(1, 8, 0, || Ok(vec![8])).unwrap(), [8]);
        assert_eq!(**f.shared(1, 7, 0, || Ok(vec![7])).unwrap(), [7]);
    }
}
