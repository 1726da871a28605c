//! Size limits, free-space thresholds, pinning and eviction of a real cache directory.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use hoardfs_cache::{CacheDir, CachedObject, Limits, ObjectKey, Space, unwatched_probe};

const MIB: u64 = 1 << 20;

fn key(id: u64) -> ObjectKey {
    ObjectKey {
        export_id: 9,
        file_id: id,
    }
}

fn chunk(id: u64, c: u64, len: u64) -> Vec<u8> {
    (0..len).map(|j| (id * 131 + c * 7 + j) as u8).collect()
}

/// Bytes the files under `dir` occupy on disk (allocated blocks), like `du`.
fn du(dir: &Path) -> u64 {
    files(dir).iter().map(|m| m.blocks() * 512).sum()
}

/// Metadata of every file (not directory) under `dir`.
fn files(dir: &Path) -> Vec<std::fs::Metadata> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let md = e.metadata().unwrap();
        if md.is_dir() {
            out.extend(files(&e.path()));
        } else {
            out.push(md);
        }
    }
    out
}

/// Fills object `id` (`size` bytes) chunk by chunk; returns how many chunks were stored.
fn fill(c: &CacheDir, id: u64, size: u64) -> u64 {
    fill_held(c, id, size).0
}

/// Like [`fill`], also returning the object, which stays in memory while held.
fn fill_held(c: &CacheDir, id: u64, size: u64) -> (u64, Arc<CachedObject>) {
    let o = c.object(key(id), 1, size).unwrap();
    let mut stored = 0;
    for i in 0..size.div_ceil(MIB) {
        let len = MIB.min(size - i * MIB);
        stored += u64::from(o.write_chunk(i, &chunk(id, i, len), 1).unwrap());
    }
    (stored, o)
}

#[test]
fn reading_three_times_the_limit_never_exceeds_it_and_pinned_and_open_objects_survive() {
    let d = tempfile::tempdir().unwrap();
    let limit = 8 * MIB;
    let limits = Limits {
        max_bytes: Some(limit),
        ..Limits::default()
    };
    let c = CacheDir::open_with(d.path(), limits, Some(unwatched_probe())).unwrap();
    c.pin(key(1), true, 5);
    assert_eq!(fill(&c, 1, 2 * MIB), 2);
    let open = c.object(key(2), 1, MIB).unwrap();
    let hold = open.hold_open();
    assert_eq!(fill(&c, 2, MIB), 1);
    // 24 MiB of other files, each read once (3x the limit).
    for id in 100..124 {
        fill(&c, id, MIB);
        let u = c.usage();
        assert!(u.bytes <= limit, "usage {} over the limit", u.bytes);
        let on_disk = du(&d.path().join("objects"));
        assert!(on_disk <= limit, "{on_disk} bytes on disk over the limit");
    }
    let u = c.usage();
    assert!(u.evictions >= 16, "{u:?}");
    assert_eq!(u.pinned_objects, 1);
    assert_eq!(u.open_objects, 1);
    let pinned = c.object(key(1), 1, 2 * MIB).unwrap();
    assert!(pinned.is_complete(), "the pinned object was evicted");
    assert!(open.is_complete(), "the open object was evicted");
    drop(hold);
    assert!(!pinned.cache_refusing(), "nothing was refused yet");
    // Pinned and open data alone over the limit: new data is refused, not an error, and
    // readers are told (so that they do not fetch whole chunks only to drop them).
    let big = c.object(key(3), 1, 7 * MIB).unwrap();
    let _h = big.hold_open();
    let stored = fill(&c, 3, 7 * MIB);
    assert!(stored < 7, "stored {stored} chunks");
    assert!(c.usage().refused_chunks > 0);
    assert!(c.usage().bytes <= limit);
    assert!(big.cache_refusing() && pinned.cache_refusing());
    // A second later the next miss tries again.
    hoardfs_testutil::assert_eventually("refusals are forgotten after a second", || {
        !big.cache_refusing()
    });
}

#[test]
fn a_scan_of_cold_files_keeps_the_hot_set() {
    let d = tempfile::tempdir().unwrap();
    let limits = Limits {
        max_bytes: Some(40 * MIB),
        ..Limits::default()
    };
    let c = CacheDir::open_with(d.path(), limits, Some(unwatched_probe())).unwrap();
    // Ten hot files, each opened three times.
    for id in 0..10 {
        fill(&c, id, MIB);
        let o = c.object(key(id), 1, MIB).unwrap();
        for _ in 0..3 {
            drop(o.hold_open());
        }
    }
    // A scan of 100 files opened once each.
    for id in 1000..1100 {
        let o = c.object(key(id), 1, MIB).unwrap();
        let _h = o.hold_open();
        o.write_chunk(0, &chunk(id, 0, MIB), 1).unwrap();
    }
    for id in 0..10 {
        assert!(
            c.object(key(id), 1, MIB).unwrap().is_complete(),
            "hot file {id} was flushed by the scan"
        );
    }
}

#[test]
fn free_space_thresholds_stop_caching_and_cull_back_to_run() {
    let d = tempfile::tempdir().unwrap();
    // A fake 100 MiB file system: what the cache occupies plus `foreign` bytes are used.
    let foreign = Arc::new(AtomicU64::new(0));
    let (f, root) = (foreign.clone(), d.path().to_path_buf());
    let probe = Box::new(move || {
        let used = du(&root.join("objects")) + f.load(Ordering::SeqCst);
        Some(Space {
            bytes_total: 100 * MIB,
            bytes_avail: (100 * MIB).saturating_sub(used),
            files_total: 1 << 20,
            files_avail: 1 << 19,
        })
    });
    let c = CacheDir::open_with(d.path(), Limits::default(), Some(probe)).unwrap();
    for id in 0..20 {
        assert_eq!(fill(&c, id, MIB), 1);
    }
    // Someone else fills the disk to 95%: below bcull (7%), culling frees up to brun (10%).
    foreign.store(75 * MIB, Ordering::SeqCst);
    assert!(c.cull_now() > 0);
    let avail = 100 * MIB - du(&d.path().join("objects")) - 75 * MIB;
    assert!(avail >= 10 * MIB, "only {avail} bytes free after culling");
    // Nearly full (above bstop only through our own data): caching evicts old objects.
    foreign.store(96 * MIB, Ordering::SeqCst);
    c.pin(key(500), true, 0);
    let stored = fill(&c, 500, 4 * MIB);
    assert!(stored < 4);
    assert!(c.usage().refused_chunks > 0);
    let avail = (100 * MIB).saturating_sub(du(&d.path().join("objects")) + 96 * MIB);
    assert!(
        avail >= 3 * MIB - MIB,
        "cache ate into the stop reserve: {avail}"
    );
}

#[test]
fn a_reservation_looks_at_the_free_space_again_before_refusing() {
    // The disk was nearly full when the write first looked, and room was made (by the
    // culler, or by someone else) before it found nothing of its own to evict.
    let d = tempfile::tempdir().unwrap();
    let tight = Arc::new(AtomicBool::new(false));
    let t = tight.clone();
    let probe = Box::new(move || {
        let avail = if t.swap(false, Ordering::SeqCst) {
            MIB
        } else {
            50 * MIB
        };
        Some(Space {
            bytes_total: 100 * MIB,
            bytes_avail: avail,
            files_total: 1 << 20,
            files_avail: 1 << 19,
        })
    });
    let c = CacheDir::open_without_culler(d.path(), Limits::default(), Some(probe)).unwrap();
    tight.store(true, Ordering::SeqCst);
    assert_eq!(fill(&c, 1, MIB), 1, "refused though the room was there");
    assert_eq!(c.usage().refused_chunks, 0);
}

#[test]
fn explicit_evict_respects_pins_and_opens() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    fill(&c, 1, MIB);
    fill(&c, 2, MIB);
    c.pin(key(2), true, 0);
    assert!(c.evict(&key(2)).is_err());
    let o = c.object(key(1), 1, MIB).unwrap();
    let h = o.hold_open();
    assert!(c.evict(&key(1)).is_err());
    drop(h);
    assert!(c.evict(&key(1)).unwrap() >= MIB);
    // The object in memory was emptied in place, and daemon reads notice.
    assert!(!o.has_chunk(0));
    let mut buf = vec![0u8; 10];
    assert!(!o.read_chunk_at(0, &mut buf, 0).unwrap());
    c.pin(key(2), false, 0);
    drop(o);
    assert!(c.evict(&key(2)).is_ok());
    assert_eq!(c.usage().objects, 1);
    assert!(c.entries().iter().all(|e| e.key == key(1)));
}

#[test]
fn scrub_drops_corrupt_chunks_and_they_are_refetched_not_served() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    fill(&c, 1, 3 * MIB);
    fill(&c, 2, MIB);
    let live = c.object(key(2), 1, MIB).unwrap();
    // Flip a byte of object 1 (not in memory) and of object 2 (in memory).
    for id in [1, 2] {
        let (data, _) = c.object_paths(&key(id));
        let f = std::fs::OpenOptions::new().write(true).open(data).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, b"X", MIB / 2).unwrap();
    }
    let r = c.verify(&|_, _| {});
    assert_eq!((r.objects, r.chunks, r.bad_chunks), (2, 4, 2));
    assert!(!live.has_chunk(0));
    let o = c.object(key(1), 1, 3 * MIB).unwrap();
    assert!(!o.has_chunk(0) && o.has_chunk(1) && o.has_chunk(2));
    assert_eq!(c.usage().checksum_failures, 2);
    assert!(o.write_chunk(0, &chunk(1, 0, MIB), 1).unwrap());
    let mut buf = vec![0u8; MIB as usize];
    assert!(o.read_chunk_at(0, &mut buf, 0).unwrap());
    assert_eq!(buf, chunk(1, 0, MIB));
}

#[test]
fn index_survives_restart_and_a_damaged_index_is_rebuilt() {
    let d = tempfile::tempdir().unwrap();
    {
        let c = CacheDir::open_unwatched(d.path()).unwrap();
        fill(&c, 1, 2 * MIB);
        fill(&c, 2, MIB);
        c.pin(key(2), true, 3);
    }
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    assert!(!c.recovered());
    let u = c.usage();
    assert_eq!((u.objects, u.pinned_objects), (2, 1));
    assert!(u.bytes >= 3 * MIB);
    drop(c);
    // Destroy the index: the objects are adopted back (and verified before use).
    std::fs::write(d.path().join("index"), b"garbage").unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    assert!(c.recovered());
    hoardfs_testutil::assert_eventually("the objects adopted back", || c.usage().objects >= 2);
    assert_eq!(c.usage().objects, 2);
    assert_eq!(c.usage().orphans_adopted, 2);
    assert!(c.object(key(1), 1, 2 * MIB).unwrap().is_complete());
    assert!(c.usage().chunks_verified >= 2);
}

/// A cache in `d` on a fake file system with plenty of bytes but 1000 inodes, `foreign`
/// of them used by others and the rest by the cache's own files.
fn short_of_inodes(d: &tempfile::TempDir, foreign: u64) -> CacheDir {
    let root = d.path().to_path_buf();
    let count = |p: &Path| files(&p.join("objects")).len() as u64;
    let probe = Box::new(move || {
        Some(Space {
            bytes_total: 1 << 40,
            bytes_avail: 1 << 39,
            files_total: 1000,
            files_avail: 1000u64.saturating_sub(foreign + count(&root)),
        })
    });
    // No background culler: it would run throughout (these caches start below the cull
    // threshold) and race with the reservations and explicit culls under test.
    CacheDir::open_without_culler(d.path(), Limits::default(), Some(probe)).unwrap()
}

#[test]
fn the_inode_stop_threshold_evicts_or_refuses() {
    let d = tempfile::tempdir().unwrap();
    // 1000 inodes, 965 used by others: 3% (30) must stay free.
    let c = short_of_inodes(&d, 965);
    for id in 0..3 {
        assert_eq!(fill(&c, id, 4096), 1);
    }
    // 6 cache files + 2 for the next object leave 27 free: two old objects must go.
    assert_eq!(fill(&c, 10, 4096), 1);
    assert_eq!(c.usage().evictions, 2);
    // With everything pinned nothing can go: the data is refused, not an error.
    c.pin(key(2), true, 0);
    c.pin(key(10), true, 0);
    assert_eq!(fill(&c, 11, 4096), 0);
    assert!(c.usage().refused_chunks > 0);
}

#[test]
fn short_of_inodes_only_objects_with_files_to_remove_are_evicted() {
    let d = tempfile::tempdir().unwrap();
    // 1000 inodes, 30 must stay free; others use all but 36.
    let c = short_of_inodes(&d, 964);
    // Object 1 stays in memory (not open) from its creation on: emptying it in place would
    // free no inode.
    let (stored, in_memory) = fill_held(&c, 1, 4096);
    assert_eq!(stored, 1);
    assert_eq!(fill(&c, 2, 4096), 1);
    assert_eq!(fill(&c, 3, 4096), 1);
    assert_eq!(fill(&c, 4, 4096), 1);
    assert!(
        in_memory.has_chunk(0),
        "an object in memory was emptied for inodes"
    );
    assert!(c.usage().evictions >= 1);
}

#[test]
fn culling_for_inodes_ends_when_every_object_is_in_memory() {
    let d = tempfile::tempdir().unwrap();
    // 1000 inodes, others use 964: below the cull threshold (7 %) from the start.
    let c = std::sync::Arc::new(short_of_inodes(&d, 964));
    // Both stay in memory from their creation on: emptying them in place would free no
    // inode, so nothing can go.
    let held = [1, 2].map(|id| {
        let (stored, o) = fill_held(&c, id, 4096);
        assert_eq!(stored, 1);
        o
    });
    let (tx, rx) = std::sync::mpsc::channel();
    let culler = c.clone();
    std::thread::spawn(move || tx.send(culler.cull_now()).unwrap());
    let Ok(evicted) = rx.recv_timeout(std::time::Duration::from_secs(20)) else {
        // The culler holds the quota lock forever: dropping the cache would wait for it.
        std::mem::forget((held, c));
        panic!("culling for inodes did not end");
    };
    assert_eq!(evicted, 0);
    assert!(held.iter().all(|o| o.has_chunk(0)));
}
