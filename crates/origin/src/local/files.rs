//! The open-file cache: regular files stay open between reads (no reopen per request, the
//! lesson of seed 003), bounded in count and closed after an idle period.
//!
//! Each entry remembers the identity that opened it (`local::creds::acting`): a
//! descriptor opened for one caller is used for another only after the kernel said that
//! caller may access the file too (the origin checks, as nfsd's file cache does), so a
//! cached descriptor never lends one user's access to another.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::creds::Acting;

/// Bounded, idle-expiring map from handle id to an open file. Lock: one mutex, never held
/// across an `open` system call.
#[derive(Debug)]
pub struct OpenFiles {
    cap: usize,
    idle: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// File, last use, and the identity that opened it.
    files: HashMap<u64, (Arc<File>, Instant, Acting)>,
    last_sweep: Instant,
}

impl OpenFiles {
    /// A cache of at most `cap` files, each closed after `idle` without use.
    pub fn new(cap: usize, idle: Duration) -> Self {
        OpenFiles {
            cap: cap.max(1),
            idle,
            inner: Mutex::new(Inner {
                files: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    /// The cached file for `id` and the identity that opened it, refreshing its idle
    /// timer.
    pub fn get(&self, id: u64) -> Option<(Arc<File>, Acting)> {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        inner.files.get_mut(&id).map(|(f, t, by)| {
            *t = now;
            (f.clone(), by.clone())
        })
    }

    /// Closes the cached file of `id`, if any (its object was deleted: keeping it open
    /// would keep its disk space allocated).
    pub fn remove(&self, id: u64) {
        self.inner.lock().files.remove(&id);
    }

    /// Caches `file`, opened by identity `by`, for `id` (keeping an existing entry if
    /// another thread won the race) and returns the cached file.
    pub fn insert(&self, id: u64, file: File, by: Acting) -> Arc<File> {
        self.insert_evicting(id, file, by).0
    }

    /// As [`OpenFiles::insert`], also returning the files closed to make room or for being
    /// idle (with their ids), for a caller that must do something before they close.
    pub fn insert_evicting(
        &self,
        id: u64,
        file: File,
        by: Acting,
    ) -> (Arc<File>, Vec<(u64, Arc<File>)>) {
        let mut evicted = Vec::new();
        let mut inner = self.inner.lock();
        let now = Instant::now();
        if now.duration_since(inner.last_sweep) > self.idle / 4 || inner.files.len() >= self.cap {
            let idle = self.idle;
            let expired: Vec<u64> = inner
                .files
                .iter()
                .filter(|(_, (_, t, _))| now.duration_since(*t) >= idle)
                .map(|(k, _)| *k)
                .collect();
            for k in expired {
                if let Some((f, _, _)) = inner.files.remove(&k) {
                    evicted.push((k, f));
                }
            }
            inner.last_sweep = now;
            while inner.files.len() >= self.cap {
                let oldest = inner
                    .files
                    .iter()
                    .min_by_key(|(_, (_, t, _))| *t)
                    .map(|(k, _)| *k);
                match oldest.and_then(|k| inner.files.remove(&k).map(|(f, _, _)| (k, f))) {
                    Some(e) => evicted.push(e),
                    None => break,
                }
            }
        }
        let f = inner
            .files
            .entry(id)
            .or_insert_with(|| (Arc::new(file), now, by))
            .0
            .clone();
        (f, evicted)
    }
}
