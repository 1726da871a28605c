//! Recovery and scrubbing: adopting objects that are on disk but missing from the index
//! (after an unclean stop or from an older cache), and verifying every cached chunk
//! against its checksum (`hoardfs cache verify`).

use std::fs;
use std::path::Path;
use std::sync::{Arc, Weak};

use crate::meta::ObjectKey;
use crate::object::CachedObject;
use crate::object_paths;
use crate::quota::Counters;
use crate::store::Store;

/// Result of a scrub.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Objects examined.
    pub objects: u64,
    /// Chunks whose checksum was checked.
    pub chunks: u64,
    /// Chunks that failed and were dropped.
    pub bad_chunks: u64,
    /// Objects whose files were missing or damaged (dropped from the index).
    pub damaged_objects: u64,
}

/// Adopts orphans in a background thread. It holds the store only while adopting one
/// object, so dropping the cache directory stops it (leaving the index unclean).
pub(crate) fn start_adoption(store: &Arc<Store>) {
    let weak = Arc::downgrade(store);
    let root = store.root.clone();
    let _ = std::thread::Builder::new()
        .name("hoardfs-recover".into())
        .spawn(move || {
            let Some(n) = adopt_orphans(&root, &weak) else {
                return;
            };
            if let Some(store) = weak.upgrade() {
                store
                    .adopted
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                Counters::add(&store.counters.orphans_adopted, n);
            }
            if n > 0 {
                tracing::info!("adopted {n} cache objects missing from the index");
            }
        });
}

/// Parses `objects/<export>/<xx>/<file>.meta` (given the export's directory and `<file>`)
/// back into a key.
fn key_of(export_dir: &Path, file_stem: &str) -> Option<ObjectKey> {
    let export_id = u128::from_str_radix(export_dir.file_name()?.to_str()?, 16).ok()?;
    let file_id = u64::from_str_radix(file_stem, 16).ok()?;
    Some(ObjectKey { export_id, file_id })
}

/// Walks the object tree; every object the index lacks is adopted (marked unverified, so
/// its chunks are checked on first use) or, if unreadable, removed. Leftover temporary
/// records are removed. Returns the number adopted, `None` if the cache was closed or dropped meanwhile.
pub(crate) fn adopt_orphans(root: &Path, store: &Weak<Store>) -> Option<u64> {
    let mut adopted = 0;
    let Ok(exports) = fs::read_dir(root.join("objects")) else {
        return Some(0);
    };
    for export in exports.flatten() {
        let Ok(fans) = fs::read_dir(export.path()) else {
            continue;
        };
        for fan in fans.flatten() {
            let Ok(files) = fs::read_dir(fan.path()) else {
                continue;
            };
            for f in files.flatten() {
                let path = f.path();
                let name = f.file_name();
                let name = name.to_string_lossy();
                let (stem, leftover) = if let Some(s) = name.strip_suffix(".meta.tmp") {
                    (s, true)
                } else if let Some(s) = name.strip_suffix(".meta") {
                    (s, false)
                } else {
                    continue;
                };
                let Some(key) = key_of(&export.path(), stem) else {
                    continue;
                };
                let store = store.upgrade()?;
                if store.closed.load(std::sync::atomic::Ordering::SeqCst) {
                    return None;
                }
                if leftover {
                    // Under the object's lock: `CachedObject::open` writes and renames its
                    // temporary record while holding it, so one seen here is a leftover.
                    let _files = store.shard(&key).lock();
                    let _ = fs::remove_file(&path);
                } else if adopt(&store, key) {
                    adopted += 1;
                }
            }
        }
    }
    Some(adopted)
}

fn adopt(store: &Arc<Store>, key: ObjectKey) -> bool {
    let _files = store.shard(&key).lock();
    if store.quota.lock().policy.get(&key).is_some() {
        return false;
    }
    let (data, meta) = object_paths(&store.root, &key);
    match CachedObject::load(store, &data, &meta, key) {
        Some(obj) => {
            store.adopt(key, obj.allocated());
            true
        }
        None => {
            let _ = fs::remove_file(&data);
            let _ = fs::remove_file(&meta);
            false
        }
    }
}

/// Verifies every object in the index.
pub(crate) fn scrub(store: &Arc<Store>, progress: &dyn Fn(u64, u64)) -> VerifyReport {
    let keys: Vec<ObjectKey> = store.entries().into_iter().map(|e| e.key).collect();
    let total = keys.len() as u64;
    let mut r = VerifyReport::default();
    for (i, key) in keys.iter().enumerate() {
        progress(i as u64, total);
        r.objects += 1;
        let result = match store.live(key) {
            Some(obj) => obj.verify().ok(),
            None => {
                let _files = store.shard(key).lock();
                let (data, meta) = object_paths(&store.root, key);
                if !meta.exists() {
                    // Tracked with nothing on disk (a pin of an uncached file): fine.
                    Some((0, 0))
                } else {
                    CachedObject::load(store, &data, &meta, *key).and_then(|o| o.verify().ok())
                }
            }
        };
        match result {
            Some((checked, bad)) => {
                r.chunks += checked;
                r.bad_chunks += bad;
                store.mark_verified(key);
            }
            None => {
                r.damaged_objects += 1;
                let _ = store.evict(key);
            }
        }
    }
    progress(total, total);
    r
}
