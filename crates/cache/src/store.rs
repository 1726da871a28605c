//! The store behind a [`crate::CacheDir`]: the object index, the eviction queues, space
//! reservations, and the objects currently in memory. Objects keep an `Arc` to it.
//!
//! Lock ordering: `shards[k]` (one object's files) → `quota` → an object's `state`.
//! The quota lock is held while an evicted object's files are removed or emptied, so
//! accounting and files never disagree; it is never taken while holding an object's state
//! lock, and the evictor only `try_lock`s a shard (so it cannot wait on a shard holder that
//! waits for the quota lock). Dropping an object takes no lock (its entry in `live` is a
//! `Weak` that dies with it, pruned later), so objects may be dropped anywhere, under the
//! quota lock too.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::index::{IndexFile, SlotRecord};
use crate::meta::ObjectKey;
use crate::object::CachedObject;
use crate::policy::{Policy, Tracked};
use crate::quota::{Amount, Counters, Limits, SpaceProbe, Usage, cull_target, shortfall};
use crate::space_alarm::SpaceAlarm;
use crate::warm::Warmer;
use crate::{CacheError, EntryInfo, object_paths};

const SHARDS: usize = 64;

/// The quota lock's contents.
#[derive(Default)]
pub(crate) struct Quota {
    pub(crate) policy: Policy,
    free_slots: Vec<u32>,
    next_slot: u32,
    pub(crate) reserved: u64,
    /// Objects in memory (not necessarily open), and entries of objects since dropped
    /// (dead `Weak`s: a dropped object takes no lock to remove itself), pruned when the
    /// map outgrows `prune_live_at`.
    pub(crate) live: HashMap<ObjectKey, Weak<CachedObject>>,
    /// Size of `live` beyond which dead entries are pruned (at a registration).
    prune_live_at: usize,
    /// Pinned objects (kept apart so usage reports need not scan every object).
    pinned: HashSet<ObjectKey>,
    /// Objects with at least one open.
    open_objects: u64,
}

/// The quota lock held.
type QuotaGuard<'a> = parking_lot::MutexGuard<'a, Quota>;

/// Dead entries of `Quota::live` are pruned once it holds more than this many entries
/// (and more than twice as many as after the last pruning).
const PRUNE_LIVE_AT_LEAST: usize = 1024;

impl Quota {
    /// Starts tracking `key` in a free slot unless it is tracked; true if it was new.
    fn track(&mut self, key: ObjectKey, bytes: u64, crash_epoch: u32, warm: bool) -> bool {
        if self.policy.get(&key).is_some() {
            return false;
        }
        let slot = self.free_slots.pop().unwrap_or_else(|| {
            self.next_slot += 1;
            self.next_slot - 1
        });
        let info = Tracked {
            slot,
            crash_epoch,
            ..Tracked::default()
        };
        self.policy.insert(key, bytes, info, warm);
        true
    }
}

/// Shared state of one open cache directory.
pub(crate) struct Store {
    pub(crate) root: PathBuf,
    pub(crate) _lock: File,
    index: IndexFile,
    pub(crate) quota: Mutex<Quota>,
    pub(crate) limits: Limits,
    probe: SpaceProbe,
    /// Crash epoch of this run: objects last verified in an older epoch are verified on load.
    pub(crate) crash_epoch: u32,
    pub(crate) recovered: bool,
    shards: Vec<Mutex<()>>,
    pub(crate) counters: Counters,
    pub(crate) closed: AtomicBool,
    /// False while orphans are still being adopted: the index is then not marked clean.
    pub(crate) adopted: AtomicBool,
    /// Wakes the culler early (a reservation saw the free space fall below `cull`).
    cull_wake: Arc<(Mutex<bool>, Condvar)>,
    /// Reads records of objects about to be opened into the page cache.
    warmer: Warmer,
    /// Logs when the free space falls below the thresholds, and when it is back.
    alarm: SpaceAlarm,
    /// When a reservation was last refused, in ms since `born` (0: never).
    last_refusal_ms: AtomicU64,
    born: Instant,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("root", &self.root).finish()
    }
}

impl Store {
    /// Builds the store from the index; `clean` says the previous run ended in order.
    pub(crate) fn new(
        root: PathBuf,
        lock: File,
        index: IndexFile,
        loaded: crate::index::Loaded,
        clean: bool,
        limits: Limits,
        probe: SpaceProbe,
    ) -> Result<Arc<Store>, CacheError> {
        let crash_epoch = if clean {
            loaded.crash_epoch
        } else {
            loaded.crash_epoch + 1
        };
        // From here on a crash is an unclean stop.
        index.write_header(false, crash_epoch)?;
        index.sync()?;
        let mut q = Quota {
            free_slots: loaded.free,
            next_slot: loaded.slots,
            ..Quota::default()
        };
        for (slot, r) in loaded.records {
            let info = Tracked {
                slot,
                pinned: r.pinned,
                opens: 0,
                crash_epoch: r.crash_epoch,
                priority: r.priority,
            };
            if q.policy.get(&r.key).is_some() {
                // A duplicate (possible only after a torn write): keep the first.
                q.free_slots.push(slot);
                continue;
            }
            if r.pinned {
                q.pinned.insert(r.key);
            }
            q.policy.insert(r.key, r.bytes, info, true);
        }
        Ok(Arc::new(Store {
            root,
            _lock: lock,
            index,
            quota: Mutex::new(q),
            limits,
            probe,
            crash_epoch,
            recovered: !clean,
            shards: (0..SHARDS).map(|_| Mutex::new(())).collect(),
            counters: Counters::default(),
            closed: AtomicBool::new(false),
            adopted: AtomicBool::new(clean),
            cull_wake: Arc::new((Mutex::new(false), Condvar::new())),
            warmer: Warmer::default(),
            alarm: SpaceAlarm::default(),
            last_refusal_ms: AtomicU64::new(0),
            born: Instant::now(),
        }))
    }

    /// The lock serialising creation and removal of one object's files.
    pub(crate) fn shard(&self, key: &ObjectKey) -> &Mutex<()> {
        let h = xxhash_rust::xxh3::xxh3_64(&key.file_id.to_le_bytes()) as usize;
        &self.shards[h % SHARDS]
    }

    fn persist(&self, q: &Quota, key: &ObjectKey) {
        let Some(e) = q.policy.get(key) else { return };
        let r = SlotRecord {
            key: *key,
            bytes: e.bytes,
            pinned: e.info.pinned,
            crash_epoch: e.info.crash_epoch,
            priority: e.info.priority,
        };
        if let Err(e) = self.index.write_slot(e.info.slot, &r) {
            tracing::warn!("cannot update the cache index: {e}");
        }
    }

    /// Whether an object must be verified when loaded (unknown, or last checked before a crash).
    pub(crate) fn needs_verify(&self, key: &ObjectKey) -> bool {
        self.quota
            .lock()
            .policy
            .get(key)
            .is_none_or(|e| e.info.crash_epoch < self.crash_epoch)
    }

    /// Records a freshly opened object as in memory, tracked at its size and verified in
    /// this epoch. The index slot is written only when that changes something.
    pub(crate) fn register(&self, obj: &Arc<CachedObject>) {
        let (key, bytes) = (obj.key, obj.allocated());
        let mut q = self.quota.lock();
        q.live.insert(key, Arc::downgrade(obj));
        if q.live.len() > q.prune_live_at.max(PRUNE_LIVE_AT_LEAST) {
            q.live.retain(|_, w| w.strong_count() > 0);
            q.prune_live_at = 2 * q.live.len();
        }
        let changed = q.track(key, bytes, self.crash_epoch, false) || {
            let e = q.policy.get(&key).expect("tracked");
            let stale = e.bytes != bytes || e.info.crash_epoch != self.crash_epoch;
            q.policy.resize(&key, bytes);
            q.policy.info_mut(&key).expect("tracked").crash_epoch = self.crash_epoch;
            stale
        };
        if changed {
            self.persist(&q, &key);
        }
    }

    /// Tracks an orphan found on disk: epoch 0, so it is verified on first use.
    pub(crate) fn adopt(&self, key: ObjectKey, bytes: u64) {
        let mut q = self.quota.lock();
        if q.track(key, bytes, 0, true) {
            self.persist(&q, &key);
        }
    }

    /// Records that `key`'s chunks were verified in this epoch.
    pub(crate) fn mark_verified(&self, key: &ObjectKey) {
        let mut q = self.quota.lock();
        if let Some(t) = q.policy.info_mut(key) {
            t.crash_epoch = self.crash_epoch;
            self.persist(&q, key);
        }
    }

    /// Runs `f` under the quota lock (tests).
    #[cfg(test)]
    pub(crate) fn with_quota_locked<T>(&self, f: impl FnOnce(&Quota) -> T) -> T {
        f(&self.quota.lock())
    }

    /// The in-memory object of `key`, if any.
    pub(crate) fn live(&self, key: &ObjectKey) -> Option<Arc<CachedObject>> {
        let w = self.quota.lock().live.get(key).cloned();
        w.and_then(|w| w.upgrade())
    }

    /// Reserves room for `bytes` more, evicting as needed. False: no room can be made (the
    /// caller serves the data uncached).
    pub(crate) fn reserve(&self, bytes: u64) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            return false;
        }
        // One look at the free space per reservation, outside the lock (a second one under
        // it only before refusing); evictions then count down the shortfall by what they
        // free.
        let space = (self.probe)();
        if !cull_target(&self.limits, space).is_zero() {
            self.wake_culler();
        }
        let mut q = self.quota.lock();
        let used = q.policy.total_bytes() + q.reserved;
        let mut need = shortfall(&self.limits, used, bytes, 0, space);
        let mut tries = q.policy.len() + 16;
        let mut looked_again = false;
        let ok = loop {
            if need.is_zero() {
                q.reserved += bytes;
                break true;
            }
            let freed = if tries == 0 {
                None
            } else {
                tries -= 1;
                self.evict_one(&mut q, need.bytes == 0)
            };
            match freed {
                Some(freed) => need = need.less(freed),
                // Nothing left to evict. The look at the free space may predate what the
                // culler freed meanwhile: before refusing, look again (under the lock).
                None if !looked_again => {
                    looked_again = true;
                    let used = q.policy.total_bytes() + q.reserved;
                    need = shortfall(&self.limits, used, bytes, 0, (self.probe)());
                }
                None => break false,
            }
        };
        drop(q);
        if !ok {
            Counters::add(&self.counters.refused_chunks, 1);
            Counters::add(&self.counters.refused_bytes, bytes);
            let ms = self.born.elapsed().as_millis() as u64;
            self.last_refusal_ms.store(ms.max(1), Ordering::Relaxed);
        }
        ok
    }

    /// Whether free space was below a stop threshold at the culler's last look.
    pub(crate) fn below_stop(&self) -> bool {
        self.alarm.below_stop()
    }

    /// Whether new data would be refused now: the culler last saw free space below a stop
    /// threshold, or a reservation was refused within the last second (a size limit with
    /// nothing evictable). Fetching whole chunks ahead of readers, to be dropped, would
    /// only waste the network. (A second after a refusal the next miss tries again, so
    /// room made meanwhile is used.)
    pub(crate) fn refusing(&self) -> bool {
        if self.alarm.below_stop() {
            return true;
        }
        let last = self.last_refusal_ms.load(Ordering::Relaxed);
        last != 0 && (self.born.elapsed().as_millis() as u64).saturating_sub(last) < 1000
    }

    /// Ends a reservation of `reserved` bytes; the object `key` grew by `delta` bytes.
    pub(crate) fn settle(&self, key: &ObjectKey, reserved: u64, delta: i64) {
        let mut q = self.quota.lock();
        q.reserved -= reserved;
        if let Some(e) = q.policy.get(key) {
            let bytes = e.bytes.saturating_add_signed(delta);
            q.policy.resize(key, bytes);
            self.persist(&q, key);
        }
    }

    /// Evicts the policy's next victim. Returns bytes and inodes freed; `None` if nothing
    /// can be evicted. With `files_only`, only inodes are wanted: an object in memory
    /// (emptied in place, which frees no inode) is passed over.
    fn evict_one(&self, q: &mut QuotaGuard<'_>, files_only: bool) -> Option<Amount> {
        let key = q.policy.victim(|t| !t.pinned && t.opens == 0)?;
        if files_only && q.live.get(&key).is_some_and(|w| w.strong_count() > 0) {
            q.policy.restart(&key);
            return Some(Amount::ZERO);
        }
        match self.evict_key(q, &key) {
            Some(freed) => Some(freed),
            None => {
                // Being opened right now: not a victim this time.
                q.policy.restart(&key);
                Some(Amount::ZERO)
            }
        }
    }

    /// Evicts `key`: an object in memory (not open: the caller checked) is emptied in
    /// place, any other has its files removed. `None` if its files are busy (being opened).
    fn evict_key(&self, q: &mut QuotaGuard<'_>, key: &ObjectKey) -> Option<Amount> {
        let live = q.live.get(key).and_then(Weak::upgrade);
        if let Some(obj) = live {
            let freed = obj.empty_in_place();
            let e = q.policy.get(key).expect("victim is tracked");
            let left = e.bytes.saturating_sub(freed);
            q.policy.resize(key, left);
            q.policy.restart(key);
            self.persist(q, key);
            Counters::add(&self.counters.evictions, 1);
            Counters::add(&self.counters.evicted_bytes, freed);
            return Some(Amount::new(freed, 0));
        }
        let _files = self.shard(key).try_lock()?;
        let (data, meta) = object_paths(&self.root, key);
        for p in [&data, &meta] {
            if let Err(e) = std::fs::remove_file(p)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("cannot evict {}: {e}", p.display());
            }
        }
        let e = q.policy.remove(key, true).expect("victim is tracked");
        q.pinned.remove(key);
        q.free_slots.push(e.info.slot);
        if let Err(err) = self.index.clear_slot(e.info.slot) {
            tracing::warn!("cannot update the cache index: {err}");
        }
        Counters::add(&self.counters.evictions, 1);
        Counters::add(&self.counters.evicted_bytes, e.bytes);
        Some(Amount::new(e.bytes, 2))
    }

    /// Evicts `key` now (`hoardfs cache evict`). Returns the bytes freed.
    pub(crate) fn evict(&self, key: &ObjectKey) -> Result<u64, EvictError> {
        let mut q = self.quota.lock();
        let Some(e) = q.policy.get(key) else {
            return Err(EvictError::NotCached);
        };
        if e.info.pinned {
            return Err(EvictError::Pinned);
        }
        if e.info.opens > 0 {
            return Err(EvictError::Open);
        }
        let r = self.evict_key(&mut q, key);
        drop(q);
        r.map(|freed| freed.bytes).ok_or(EvictError::Busy)
    }

    /// An open file starts (`delta` 1) or stops (-1) holding `key`; opening counts as an
    /// access for the eviction policy.
    pub(crate) fn hold(&self, key: &ObjectKey, open: bool) {
        let mut q = self.quota.lock();
        if open {
            q.policy.touch(key);
        }
        if let Some(t) = q.policy.info_mut(key) {
            let was_open = t.opens > 0;
            t.opens = if open {
                t.opens + 1
            } else {
                t.opens.saturating_sub(1)
            };
            let now_open = t.opens > 0;
            if was_open != now_open {
                q.open_objects = if now_open {
                    q.open_objects + 1
                } else {
                    q.open_objects - 1
                };
            }
        }
    }

    /// Pins or unpins `key` (tracking it, with nothing cached yet, if needed).
    pub(crate) fn pin(&self, key: ObjectKey, pinned: bool, priority: u16) {
        let mut q = self.quota.lock();
        if !pinned && q.policy.get(&key).is_none() {
            return;
        }
        q.track(key, 0, self.crash_epoch, false);
        let t = q.policy.info_mut(&key).expect("tracked");
        t.pinned = pinned;
        t.priority = if pinned { priority } else { 0 };
        if pinned {
            q.pinned.insert(key);
        } else {
            q.pinned.remove(&key);
        }
        self.persist(&q, &key);
    }

    /// Occupancy, limits and counters.
    pub(crate) fn usage(&self) -> Usage {
        let q = self.quota.lock();
        let mut u = Usage {
            objects: q.policy.len() as u64,
            bytes: q.policy.total_bytes(),
            reserved: q.reserved,
            pinned_objects: q.pinned.len() as u64,
            pinned_bytes: q
                .pinned
                .iter()
                .filter_map(|k| q.policy.get(k))
                .map(|e| e.bytes)
                .sum(),
            open_objects: q.open_objects,
            limits: self.limits,
            recovered: self.recovered,
            ..Usage::default()
        };
        drop(q);
        u.space = (self.probe)();
        u.room = self.alarm.room();
        let c = &self.counters;
        let get = |a: &std::sync::atomic::AtomicU64| a.load(Ordering::Relaxed);
        u.evictions = get(&c.evictions);
        u.evicted_bytes = get(&c.evicted_bytes);
        u.checksum_failures = get(&c.checksum_failures);
        u.chunks_verified = get(&c.chunks_verified);
        u.refused_chunks = get(&c.refused_chunks);
        u.refused_bytes = get(&c.refused_bytes);
        u.orphans_adopted = get(&c.orphans_adopted);
        u.records_warmed = get(&self.warmer.warmed);
        u
    }

    /// Queues the records of those of `keys` that are cached but not in memory for
    /// warming (see [`crate::warm`]); returns how many were queued.
    pub(crate) fn warm(&self, keys: impl IntoIterator<Item = ObjectKey>) -> usize {
        let cold: Vec<ObjectKey> = {
            let q = self.quota.lock();
            keys.into_iter()
                .filter(|k| {
                    q.policy.get(k).is_some() && q.live.get(k).is_none_or(|w| w.strong_count() == 0)
                })
                .collect()
        };
        if cold.is_empty() || self.closed.load(Ordering::Relaxed) {
            return 0;
        }
        self.warmer.warm(&self.root, cold)
    }

    /// Every tracked object.
    pub(crate) fn entries(&self) -> Vec<EntryInfo> {
        let q = self.quota.lock();
        q.policy
            .iter()
            .map(|(k, e)| EntryInfo {
                key: *k,
                bytes: e.bytes,
                tracked: e.info,
            })
            .collect()
    }

    fn wake_culler(&self) {
        let (m, cv) = &*self.cull_wake;
        *m.lock() = true;
        cv.notify_one();
    }

    /// One round of background culling: below the `cull` thresholds, evict until the `run`
    /// thresholds are free again (at most `batch` objects per lock hold). Then tells the
    /// alarm how much room there is and whether the culler fell short.
    pub(crate) fn cull(&self, batch: usize) -> u64 {
        let (evicted, exhausted) = self.cull_round(batch);
        self.alarm.observe(&self.limits, (self.probe)(), exhausted);
        evicted
    }

    /// The objects evicted, and whether the round ran out of objects it may evict before
    /// reaching its target.
    fn cull_round(&self, batch: usize) -> (u64, bool) {
        let mut evicted = 0;
        loop {
            let target = cull_target(&self.limits, (self.probe)());
            if target.is_zero() {
                return (evicted, false);
            }
            let mut q = self.quota.lock();
            let mut freed = Amount::ZERO;
            let mut n = 0;
            // Victims that freed nothing in a row (objects in memory while only inodes are
            // wanted, objects being opened): once every tracked object was one, stop, or
            // an unbounded batch (`cull_now`) would cycle through them forever.
            let mut idle = 0;
            while !freed.covers(target) && n < batch && idle <= q.policy.len() {
                match self.evict_one(&mut q, freed.bytes >= target.bytes) {
                    Some(Amount::ZERO) => idle += 1,
                    Some(f) => {
                        freed = freed.plus(f);
                        n += 1;
                        idle = 0;
                    }
                    None => break,
                }
            }
            drop(q);
            evicted += n as u64;
            // A short batch: nothing more could be freed (or nothing more is needed).
            if n < batch {
                return (evicted, !freed.covers(target));
            }
        }
    }

    /// Runs the culler until the store is dropped.
    pub(crate) fn start_culler(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        let wake = self.cull_wake.clone();
        let _ = std::thread::Builder::new()
            .name("hoardfs-culler".into())
            .spawn(move || {
                loop {
                    // The store is only borrowed while culling, so it can be dropped
                    // (and closed in order) while this thread sleeps.
                    match weak.upgrade() {
                        Some(s) => s.cull(256),
                        None => return,
                    };
                    let (m, cv) = &*wake;
                    let mut woken = m.lock();
                    if !*woken {
                        cv.wait_for(&mut woken, Duration::from_secs(1));
                    }
                    *woken = false;
                }
            });
    }

    /// Orderly shutdown: syncs the cache file system and marks the index clean.
    pub(crate) fn close(&self) -> Result<(), CacheError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        // Chunk writes that reserved room before the close finish first (bounded wait).
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.quota.lock().reserved > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let dir = File::open(&self.root).map_err(crate::io_at(&self.root))?;
        // SAFETY: valid fd.
        if unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&dir)) } != 0 {
            return Err(crate::io_at(&self.root)(std::io::Error::last_os_error()));
        }
        // An unfinished adoption leaves orphans the index does not know: stay unclean, so
        // the next start adopts (and verifies) them.
        let clean = self.adopted.load(Ordering::SeqCst);
        self.index.write_header(clean, self.crash_epoch)?;
        self.index.sync()
    }

    /// The cache directory.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if let Err(e) = self.close() {
            tracing::warn!("cache not closed in order (it will be verified on next use): {e}");
        }
    }
}

/// Why an explicit eviction was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EvictError {
    /// Nothing of it is cached.
    #[error("not cached")]
    NotCached,
    /// It is pinned (unpin it first).
    #[error("pinned (unpin it first)")]
    Pinned,
    /// A file is open on it.
    #[error("in use by an open file")]
    Open,
    /// Its files are being opened right now.
    #[error("busy, try again")]
    Busy,
}
