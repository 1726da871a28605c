//! Record warming: reads the records of objects that are likely to be opened soon into the
//! page cache, in the background, so that opening them does not wait for the disk.
//!
//! Loading an object from a cold page cache costs two disk reads before any data is read:
//! the record's inode and its contents (about 220 µs on the benchmark machine, more than a
//! whole local read of a small file). A program that lists a directory usually opens some
//! of its files next (`cat dir/*`, builds, indexers), so the file system asks for the
//! records of a listing's cached files to be warmed as soon as it lists it. Two threads
//! read them in the order given, keeping two disk reads in flight alongside the reader's
//! own. Nothing is kept open or decoded here: an object is still loaded, and its record
//! checked, by the open that needs it; warming only changes how long that takes.
//!
//! The queue is bounded: keys that do not fit are skipped (warming is an optimisation, and
//! a huge listing must not start a huge backlog of disk reads).

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError, sync_channel};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::ObjectKey;

/// Records queued at most (about 4 MiB of page cache if all were read).
const QUEUE: usize = 1024;
/// Threads reading records.
const THREADS: usize = 2;

/// The warming threads of one store, started on first use.
#[derive(Default)]
pub(crate) struct Warmer {
    tx: OnceLock<SyncSender<PathBuf>>,
    /// Records read so far.
    pub(crate) warmed: Arc<AtomicU64>,
}

impl Warmer {
    /// Queues the records of `keys` (objects under `root`), in order, skipping what does not
    /// fit the queue; returns how many were queued.
    pub(crate) fn warm(&self, root: &Path, keys: impl IntoIterator<Item = ObjectKey>) -> usize {
        let tx = self.tx.get_or_init(|| self.start());
        let mut queued = 0;
        for key in keys {
            let (_, meta) = crate::object_paths(root, &key);
            match tx.try_send(meta) {
                Ok(()) => queued += 1,
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => break,
            }
        }
        queued
    }

    fn start(&self) -> SyncSender<PathBuf> {
        let (tx, rx) = sync_channel::<PathBuf>(QUEUE);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..THREADS {
            let (rx, warmed) = (rx.clone(), self.warmed.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("hoardfs-warm-{i}"))
                .spawn(move || run(&rx, &warmed));
            if let Err(e) = spawned {
                tracing::debug!("no record warming thread: {e}");
            }
        }
        tx
    }
}

/// Reads records until every sender is gone (the store was dropped).
fn run(rx: &Mutex<Receiver<PathBuf>>, warmed: &AtomicU64) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let Ok(path) = rx.lock().recv() else {
            return;
        };
        // A record that is gone (evicted since) or unreadable is simply not warmed; the
        // open that needs it reports the problem.
        if let Ok(mut f) = File::open(&path) {
            buf.clear();
            if f.read_to_end(&mut buf).is_ok() {
                warmed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}
