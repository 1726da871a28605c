//! Files fetched ahead of a reader walking a directory in listing order (a dataset's first
//! epoch, `cp -r`, `tar c`): each file is a round trip of its own (a GET of 40 ms on an S3
//! store whatever the size), so reading them one after the other leaves the link idle.
//! When a read-only open misses the cache on the first entry of a directory's listing, or
//! opens the entry after the one opened before in the same directory, the next files of
//! the listing are fetched whole into the disk cache by a pool of threads, many at once:
//! the window doubles while the reader stays in order (up to [`MAX_WINDOW`] files) and
//! starts again when it jumps. A reader that then opens a file being fetched waits for
//! that fetch (the fetcher's in-flight table), never a second one.
//!
//! [`Streams`] is the per-directory state (pure, tested alone); [`Siblings`] adds the
//! queue and the threads. Lock order: `streams` and `queue` are leaves.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;
use std::sync::mpsc;

use hoardfs_origin::Caller;
use parking_lot::Mutex;

use crate::Ino;

/// Files fetched ahead at first.
const FIRST_WINDOW: usize = 4;
/// Most files fetched ahead of one reader.
pub(crate) const MAX_WINDOW: usize = 32;
/// Directories followed at once (the least recently opened in is forgotten).
const MAX_STREAMS: usize = 64;

/// A reader's walk through one directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stream {
    /// Index of the entry opened last.
    last: usize,
    /// Entries before this one were queued (or opened).
    queued_to: usize,
    /// Files to keep queued ahead of the reader.
    window: usize,
    /// When it was last used (a counter).
    used: u64,
}

impl Stream {
    /// A walk whose last open was entry `index`.
    fn start(index: usize, used: u64) -> Stream {
        Stream {
            last: index,
            queued_to: index + 1,
            window: FIRST_WINDOW,
            used,
        }
    }
}

/// The walks followed, by directory.
#[derive(Debug, Default)]
pub(crate) struct Streams {
    by_dir: HashMap<Ino, Stream>,
    clock: u64,
}

impl Streams {
    /// Whether opens in `dir` are followed (an open there that hits the cache still moves
    /// the window along).
    pub(crate) fn follows(&self, dir: Ino) -> bool {
        self.by_dir.contains_key(&dir)
    }

    /// The entry opened last in `dir`, if followed.
    pub(crate) fn last(&self, dir: Ino) -> Option<usize> {
        self.by_dir.get(&dir).map(|s| s.last)
    }

    /// Entry `index` of `dir`'s listing (of `len` entries) was opened, `missed` the cache:
    /// the entries to fetch ahead now (empty: none).
    pub(crate) fn opened(
        &mut self,
        dir: Ino,
        index: usize,
        len: usize,
        missed: bool,
    ) -> Range<usize> {
        self.clock += 1;
        let used = self.clock;
        let s = match self.by_dir.get_mut(&dir) {
            Some(s) if index == s.last + 1 => {
                s.window = (s.window * 2).min(MAX_WINDOW);
                s
            }
            Some(s) => {
                // A jump: follow from here, fetching only if it is a directory's start.
                *s = Stream::start(index, used);
                if index != 0 {
                    return 0..0;
                }
                s
            }
            None if missed => {
                if self.by_dir.len() >= MAX_STREAMS
                    && let Some((&old, _)) = self.by_dir.iter().min_by_key(|(_, s)| s.used)
                {
                    self.by_dir.remove(&old);
                }
                let s = self.by_dir.entry(dir).or_insert(Stream::start(index, used));
                if index != 0 {
                    return 0..0;
                }
                s
            }
            None => return 0..0,
        };
        s.last = index;
        s.used = used;
        let from = s.queued_to.max(index + 1);
        let to = (index + 1 + s.window).min(len);
        if from >= to {
            return 0..0;
        }
        s.queued_to = to;
        from..to
    }
}

/// A file to fetch whole, on behalf of the reader that walked to it.
pub(crate) struct FileJob {
    pub(crate) ino: Ino,
    pub(crate) caller: Arc<Caller>,
}

/// Streams, the queue of files and the threads that fetch them.
pub(crate) struct Siblings {
    pub(crate) streams: Mutex<Streams>,
    queue: Mutex<Option<mpsc::Sender<FileJob>>>,
}

impl Siblings {
    /// `threads` threads running each job with `run` (`false`: the owner is gone and the
    /// thread ends); none without a disk cache.
    pub(crate) fn new(
        threads: usize,
        run: impl Fn(FileJob) -> bool + Send + Sync + 'static,
    ) -> Siblings {
        let run = Arc::new(run);
        let (tx, rx) = mpsc::channel::<FileJob>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let (rx, run) = (rx.clone(), run.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("hoardfs-ahead-{i}"))
                .spawn(move || {
                    loop {
                        let job = rx.lock().recv();
                        let Ok(job) = job else { return };
                        if !run(job) {
                            return;
                        }
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!("cannot start a thread fetching files ahead: {e}");
            }
        }
        Siblings {
            streams: Mutex::default(),
            queue: Mutex::new((threads > 0).then_some(tx)),
        }
    }

    /// Whether files can be fetched ahead at all.
    pub(crate) fn enabled(&self) -> bool {
        self.queue.lock().is_some()
    }

    /// Queues `job`.
    pub(crate) fn queue(&self, job: FileJob) {
        if let Some(tx) = &*self.queue.lock() {
            let _ = tx.send(job);
        }
    }

    /// Stops the threads (queued jobs are dropped once they see the queue gone).
    pub(crate) fn stop(&self) {
        self.queue.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_in_listing_order_gets_a_growing_window_of_files_ahead() {
        let mut s = Streams::default();
        // Not followed until a miss; the first entry starts a window at once.
        assert_eq!(s.opened(7, 0, 100, false), 0..0);
        assert!(!s.follows(7));
        assert_eq!(s.opened(7, 0, 100, true), 1..5);
        assert_eq!(s.opened(7, 1, 100, false), 5..10, "window 8 past entry 1");
        assert_eq!(s.opened(7, 2, 100, false), 10..19, "window 16");
        assert_eq!(s.opened(7, 3, 100, false), 19..36, "window 32, the most");
        assert_eq!(s.opened(7, 4, 100, false), 36..37);
        // The end of the listing bounds it.
        for i in 5..97 {
            s.opened(7, i, 100, false);
        }
        assert_eq!(s.opened(7, 97, 100, false), 0..0);
        assert_eq!(s.last(7), Some(97));
    }

    #[test]
    fn a_reader_out_of_order_gets_nothing_until_it_walks_in_order() {
        let mut s = Streams::default();
        // A miss in the middle: followed, nothing fetched.
        assert_eq!(s.opened(1, 10, 100, true), 0..0);
        assert_eq!(s.opened(1, 40, 100, true), 0..0, "a jump");
        // In order from there: the window starts.
        assert_eq!(s.opened(1, 41, 100, false), 42..50);
        // Back to the start of the directory: a new walk.
        assert_eq!(s.opened(1, 0, 100, false), 1..5);
        // Directories beyond the most followed push out the least recently used.
        for d in 100..100 + MAX_STREAMS as u64 {
            s.opened(d, 3, 10, true);
        }
        assert!(!s.follows(1));
        assert!(s.follows(100 + MAX_STREAMS as u64 - 1));
    }
}
