//! Misses: fetching chunks from the origin, one fetch per chunk however many readers
//! want it (`inflight`), readahead for sequential readers on a small pool of threads, and
//! the chunks a `--no-cache` open keeps in memory (within [`NO_CACHE_BUDGET`]).
//!
//! Lock ordering: `inflight` and an open's `mem` are leaves (never held while taking
//! another lock or doing I/O).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use hoardfs_proto::buffers::Recycled;
use parking_lot::{Condvar, Mutex};

use crate::nodes::{Ino, Node};
use crate::read::{ModeKind, OpenFile, View};
use crate::stats::Stats;
use crate::{FsResult, HoardFs};

/// Memory all opens of a `--no-cache` mount may hold in fetched chunks, readahead
/// included (each open keeps at least two chunks, so with many opens it is exceeded).
pub(crate) const NO_CACHE_BUDGET: u64 = 64 << 20;
pub(crate) type ChunkKey = (Ino, u64, u64);
/// A readahead job: fetch this chunk of this open file.
pub(crate) type PrefetchJob = (Arc<OpenFile>, u64);
/// A chunk a `--no-cache` open keeps for its next reads.
pub(crate) struct HeldChunk {
    key: ChunkKey,
    bytes: Arc<Recycled>,
    /// Bytes of it handed to the kernel so far.
    served: usize,
}

type FetchResult = FsResult<Arc<Recycled>>;

#[derive(Default)]
pub(crate) struct Flight {
    done: Mutex<Option<FetchResult>>,
    cv: Condvar,
}

impl Flight {
    fn wait(&self) -> FetchResult {
        let mut g = self.done.lock();
        while g.is_none() {
            self.cv.wait(&mut g);
        }
        g.clone().expect("set before notify")
    }
    fn complete(&self, r: FetchResult) {
        *self.done.lock() = Some(r);
        self.cv.notify_all();
    }
}
/// Counts `n` bytes of chunk `key` as handed to the kernel through `of`. A chunk handed
/// out whole is dropped at once: the kernel keeps what it read in its page cache, so a
/// sequential reader never asks for it again, and its memory goes back to the pool while
/// it is still warm (instead of waiting to be pushed out by later fetches).
pub(crate) fn served(of: &OpenFile, key: ChunkKey, n: usize) {
    let mut mem = of.mem.lock();
    if let Some(i) = mem.iter().position(|h| h.key == key) {
        mem[i].served += n;
        if mem[i].served >= mem[i].bytes.len() {
            mem.remove(i);
        }
    }
}
impl HoardFs {
    pub(crate) fn schedule_readahead(
        &self,
        of: &Arc<OpenFile>,
        view: &View,
        offset: u64,
        end: u64,
        last: u64,
    ) {
        let window = self.readahead_window(view);
        if window == 0 || of.mode == ModeKind::Passthrough {
            return;
        }
        let (from, to) = {
            let mut seq = of.seq.lock();
            let sequential = offset == seq.0 || offset == 0;
            seq.0 = end;
            if !sequential {
                return;
            }
            let from = seq.1.map_or(last + 1, |a| a.max(last) + 1);
            let to = (last + window).min(view.chunks().saturating_sub(1));
            if from > to {
                return;
            }
            seq.1 = Some(to);
            (from, to)
        };
        // Chunks already in the disk cache need no fetch: queueing them would only wake a
        // fetch thread (a cross-CPU wake-up) to find them there.
        let missing: Vec<u64> = (from..=to)
            .filter(|&c| !view.object.as_ref().is_some_and(|o| o.has_chunk(c)))
            .collect();
        if let Some(tx) = &*self.reads.prefetch.lock() {
            for c in missing {
                let _ = tx.send((of.clone(), c));
            }
        }
    }

    /// A queued readahead job: fetches chunk `c` for `of` unless the open was released,
    /// the file shrank below it, or the reader already asked for all of it.
    pub(crate) fn read_ahead(&self, of: &Arc<OpenFile>, c: u64) {
        if of.closed.load(Ordering::Relaxed) {
            return;
        }
        let view = View::of(&of.node);
        if c >= view.chunks() || view.chunk_range(c).1 <= of.read_to.load(Ordering::Relaxed) {
            return;
        }
        if let Err(e) = self.ensure_chunk(&of.node, &view, c, Some(of)) {
            tracing::debug!("readahead of chunk {c} failed: {e}");
        }
    }

    /// Chunks fetched ahead of a sequential reader of `view`. With a disk cache, the
    /// configured window; without one, as many as fit the memory budget next to every
    /// open's current chunk.
    fn readahead_window(&self, view: &View) -> u64 {
        let configured = self.reads.readahead;
        if view.object.is_some() {
            return configured;
        }
        configured.min(self.mem_slots(view) - 2)
    }

    /// Chunks one `--no-cache` open may keep: its share of [`NO_CACHE_BUDGET`], but at
    /// least two (the kernel's parallel reads straddle chunk boundaries: keeping only the
    /// newest chunk would refetch the one before it).
    fn mem_slots(&self, view: &View) -> u64 {
        let opens = (self.reads.files.read().len() as u64).max(1);
        ((NO_CACHE_BUDGET >> view.chunk_shift) / opens).max(2)
    }

    /// Makes chunk `c` available: `None` if it is in the disk cache, otherwise its bytes
    /// (fetched now, or by a concurrent fetch of the same chunk that we wait for). Without
    /// a disk cache the bytes are kept in `of`'s memory for its next reads.
    pub(crate) fn ensure_chunk(
        &self,
        node: &Node,
        view: &View,
        c: u64,
        of: Option<&OpenFile>,
    ) -> FsResult<Option<Arc<Recycled>>> {
        if view.object.as_ref().is_some_and(|o| o.has_chunk(c)) {
            return Ok(None);
        }
        let key = (node.ino, view.version, c);
        let mem = of.filter(|_| view.object.is_none()).map(|of| &of.mem);
        if let Some(mem) = mem
            && let Some(h) = mem.lock().iter().find(|h| h.key == key)
        {
            return Ok(Some(h.bytes.clone()));
        }
        let (flight, leader) = {
            let mut m = self.reads.inflight.lock();
            match m.get(&key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight::default());
                    m.insert(key, f.clone());
                    (f, true)
                }
            }
        };
        let result = if leader {
            let r = self
                .fetch_chunk(node, view, c)
                .map(|d| Arc::new(Recycled::from(d)));
            // Kept before the flight ends: a reader of this open arriving in between
            // finds the chunk in one place or the other, never fetching it again.
            if let (Ok(bytes), Some(mem)) = (&r, mem) {
                self.keep_chunk(view, mem, key, bytes);
            }
            self.reads.inflight.lock().remove(&key);
            flight.complete(r.clone());
            r
        } else {
            let r = flight.wait();
            if let (Ok(bytes), Some(mem)) = (&r, mem) {
                self.keep_chunk(view, mem, key, bytes);
            }
            r
        };
        result.map(Some)
    }

    /// Keeps a fetched chunk in a `--no-cache` open's memory: the chunks being read plus
    /// the readahead window (not the whole share of the budget: a lone reader would
    /// otherwise hold 64 MiB). Fetches complete out of order, so the chunk farthest behind
    /// goes first, not the oldest fetched.
    fn keep_chunk(
        &self,
        view: &View,
        mem: &Mutex<VecDeque<HeldChunk>>,
        key: ChunkKey,
        bytes: &Arc<Recycled>,
    ) {
        let keep = self.readahead_window(view) as usize + 2;
        let mut mem = mem.lock();
        if !mem.iter().any(|h| h.key == key) {
            mem.push_back(HeldChunk {
                key,
                bytes: bytes.clone(),
                served: 0,
            });
        }
        while mem.len() > keep {
            let behind = (0..mem.len())
                .min_by_key(|&i| mem[i].key.2)
                .expect("not empty");
            mem.remove(behind);
        }
    }

    /// Fetches chunk `c` from the origin and stores it in the cache if it is exactly the
    /// version this open is for.
    fn fetch_chunk(&self, node: &Node, view: &View, c: u64) -> FsResult<Vec<u8>> {
        const PIECE: u64 = 4 << 20;
        let (start, end) = view.chunk_range(c);
        let mut data = Vec::new();
        let mut cacheable = true;
        while (data.len() as u64) < end - start {
            let pos = start + data.len() as u64;
            let len = (end - pos).min(PIECE) as u32;
            let r = self.with_handle(node, |h| self.origin.read(h, pos, len))?;
            cacheable &= r.version == view.version;
            let short = (r.data.len() as u32) < len;
            if data.is_empty() {
                // Usually the whole chunk: keep the received buffer rather than copy it.
                data = r.data;
                data.reserve_exact((end - start) as usize - data.len());
            } else {
                data.extend_from_slice(&r.data);
            }
            if short {
                cacheable = false;
                break;
            }
        }
        Stats::add(&self.stats.chunk_fetches, 1);
        Stats::add(&self.stats.bytes_from_network, data.len() as u64);
        match &view.object {
            Some(obj) if cacheable => {
                if let Err(e) = obj.write_chunk(c, &data, view.version) {
                    tracing::warn!("cache write failed, serving uncached: {e}");
                    Stats::add(&self.stats.cache_errors, 1);
                }
            }
            Some(_) => Stats::add(&self.stats.uncacheable_fetches, 1),
            None => {}
        }
        Ok(data)
    }
}
