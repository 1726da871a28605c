//! Tests of the cache directory and objects against a real temp directory.

use super::*;

const MIB: u64 = 1 << 20;

fn key(id: u64) -> ObjectKey {
    ObjectKey {
        export_id: 7,
        file_id: id,
    }
}

fn chunk(i: u64, len: u64) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

#[test]
fn chunks_persist_across_reopen_of_same_version() {
    let d = tempfile::tempdir().unwrap();
    let size = 2 * MIB + 100;
    {
        let c = CacheDir::open_unwatched(d.path()).unwrap();
        let o = c.object(key(1), 5, size).unwrap();
        o.write_chunk(0, &chunk(0, MIB), 5).unwrap();
        o.write_chunk(2, &chunk(2, 100), 5).unwrap();
        assert!(!o.is_complete());
    }
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let o = c.object(key(1), 5, size).unwrap();
    assert!(o.has_chunk(0) && !o.has_chunk(1) && o.has_chunk(2));
    let mut buf = vec![0u8; 100];
    o.read_at(&mut buf, 2 * MIB).unwrap();
    assert_eq!(buf, chunk(2, 100));
    o.write_chunk(1, &chunk(1, MIB), 5).unwrap();
    assert!(o.is_complete());
    assert_eq!(o.bytes_present(), size);
    assert_eq!(c.peek(&key(1)).unwrap().version, 5);
}

#[test]
fn new_version_discards_old_chunks() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let old = c.object(key(1), 5, MIB).unwrap();
    old.write_chunk(0, &chunk(0, MIB), 5).unwrap();
    let backing = old.open_backing().unwrap();
    old.retire();
    let new = c.object(key(1), 6, MIB).unwrap();
    assert!(!new.has_chunk(0));
    // A write through the retired object must not mark the new one present.
    old.write_chunk(0, &chunk(9, MIB), 5).unwrap();
    drop(new);
    assert!(!c.object(key(1), 6, MIB).unwrap().has_chunk(0));
    // A reader of the old data file (passthrough) still sees the old bytes.
    let mut buf = vec![0u8; 16];
    std::os::unix::fs::FileExt::read_at(&backing, &mut buf, 0).unwrap();
    assert_eq!(buf, chunk(0, 16));
}

#[test]
fn damaged_record_means_nothing_cached() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let o = c.object(key(3), 1, MIB).unwrap();
    o.write_chunk(0, &chunk(0, MIB), 1).unwrap();
    // Records are read when an object is loaded: drop the one in memory.
    drop(o);
    let (_, meta) = c.object_paths(&key(3));
    let mut b = std::fs::read(&meta).unwrap();
    let n = b.len();
    b[n - 9] ^= 1;
    std::fs::write(&meta, b).unwrap();
    assert!(!c.object(key(3), 1, MIB).unwrap().has_chunk(0));
    assert!(c.peek(&key(3)).unwrap().present_count() == 0);
}

#[test]
fn wrong_chunk_length_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let o = c.object(key(4), 1, MIB + 10).unwrap();
    assert!(matches!(
        o.write_chunk(1, &[0u8; 9], 1),
        Err(CacheError::ChunkLength { .. })
    ));
    assert!(o.write_chunk(5, &[0u8; 9], 1).is_err());
    assert!(!o.has_chunk(1));
}

#[test]
fn second_client_is_locked_out_and_foreign_dirs_refused() {
    let d = tempfile::tempdir().unwrap();
    let _c = CacheDir::open_unwatched(d.path()).unwrap();
    assert!(matches!(
        CacheDir::open_unwatched(d.path()),
        Err(CacheError::Locked(_))
    ));
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("precious.txt"), b"x").unwrap();
    assert!(matches!(
        CacheDir::open_unwatched(other.path()),
        Err(CacheError::Incompatible { .. })
    ));
    assert!(other.path().join("precious.txt").exists());
}

/// Reads the whole data of an object through `read_at`.
fn contents(o: &CachedObject) -> Vec<u8> {
    let mut buf = vec![0u8; o.size() as usize];
    o.read_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn writes_through_the_client_keep_the_object_in_step() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let mut model = chunk(0, MIB);
    model.extend(chunk(1, 500));
    let o = c.object(key(5), 10, MIB + 500).unwrap();
    o.write_chunk(0, &model[..MIB as usize], 10).unwrap();
    o.write_chunk(1, &model[MIB as usize..], 10).unwrap();
    assert!(o.is_complete());
    // A small write into a present chunk: still complete, right bytes, new version.
    assert!(o.apply_write(10, 100, b"hello", 11, MIB + 500).unwrap());
    model[100..105].copy_from_slice(b"hello");
    assert!(o.is_complete());
    assert_eq!(o.version(), 11);
    assert_eq!(contents(&o), model);
    // An appending write that grows the file past a chunk boundary.
    let tail = chunk(7, MIB as usize as u64);
    assert!(
        o.apply_write(11, MIB + 500, &tail, 12, 2 * MIB + 500)
            .unwrap()
    );
    model.extend_from_slice(&tail);
    // The new last, partial chunk waits for the writer's close to be checksummed.
    assert!(!o.is_complete());
    o.seal().unwrap();
    assert!(o.is_complete());
    assert_eq!(contents(&o), model);
    // A write that leaves a gap: the gap reads as zeros, as on the origin.
    assert!(o.apply_write(12, 3 * MIB, b"z", 13, 3 * MIB + 1).unwrap());
    model.resize(3 * MIB as usize, 0);
    model.push(b'z');
    o.seal().unwrap();
    assert!(o.is_complete());
    assert_eq!(contents(&o), model);
    // Checksums were recomputed: the record survives a reopen with every chunk present.
    drop(o);
    let o = c.object(key(5), 13, 3 * MIB + 1).unwrap();
    assert!(o.is_complete());
    assert_eq!(contents(&o), model);
    let meta = c.peek(&key(5)).unwrap();
    for i in 0..meta.chunks() {
        let (a, b) = meta.chunk_range(i);
        assert_eq!(
            meta.crcs[i as usize],
            crc32c::crc32c(&model[a as usize..b as usize])
        );
    }
}

#[test]
fn writes_after_a_foreign_change_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let o = c.object(key(6), 10, MIB).unwrap();
    o.write_chunk(0, &chunk(0, MIB), 10).unwrap();
    // The origin was at version 20 before our write: somebody else changed it.
    assert!(!o.apply_write(20, 0, b"x", 21, MIB).unwrap());
    assert_eq!(o.version(), 10);
    assert_eq!(contents(&o), chunk(0, MIB));
    // A partial write into an absent chunk leaves it absent until fetched whole, and a
    // fetch made for the older version is not stored over the newer bytes.
    let p = c.object(key(7), 1, 2 * MIB).unwrap();
    assert!(p.apply_write(1, 10, b"abc", 2, 2 * MIB).unwrap());
    assert!(!p.has_chunk(0));
    p.write_chunk(0, &chunk(0, MIB), 1).unwrap();
    assert!(!p.has_chunk(0));
    let mut fresh = chunk(0, MIB);
    fresh[10..13].copy_from_slice(b"abc");
    p.write_chunk(0, &fresh, 2).unwrap();
    assert!(p.has_chunk(0));
}

#[test]
fn warming_reads_only_records_of_cached_objects_not_in_memory() {
    let d = tempfile::tempdir().unwrap();
    {
        let c = CacheDir::open_unwatched(d.path()).unwrap();
        for id in 1..=3 {
            let o = c.object(key(id), 5, MIB).unwrap();
            o.write_chunk(0, &chunk(id, MIB), 5).unwrap();
        }
    }
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    let loaded = c.object(key(3), 5, MIB).unwrap();
    // 4 was never cached, 3 is in memory already: only 1 and 2 are read from disk.
    assert_eq!(c.warm([key(1), key(4), key(2), key(3)]), 2);
    hoardfs_testutil::assert_eventually("records warmed", || c.usage().records_warmed >= 2);
    // Warming loads nothing: 1 is still not in memory (so warming it again reads it), and
    // the objects open (and check their records) as before.
    assert_eq!(c.warm([key(1)]), 1, "warming left the object out of memory");
    assert!(c.object(key(1), 5, MIB).unwrap().is_complete());
    assert!(loaded.is_complete());
    drop(loaded);
    assert_eq!(c.warm([key(3)]), 1, "no longer in memory");
}

#[test]
fn dropping_an_object_takes_no_lock_and_dropped_ones_do_not_pile_up() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open_unwatched(d.path()).unwrap();
    // The last reference to an object may go while the quota lock is held (an eviction
    // emptying it, a registration replacing it): nothing to wait for.
    let o = c.object(key(1), 5, MIB).unwrap();
    c.store.with_quota_locked(|_| drop(o));
    // Objects opened and dropped one after another leave a bounded registry behind.
    for id in 2..2200 {
        drop(c.object(key(id), 5, 10).unwrap());
    }
    let entries = c.store.with_quota_locked(|q| q.live.len());
    assert!(
        entries <= 1025,
        "{entries} registry entries for one object in memory"
    );
    // A dropped object is not in memory any more, whether or not its entry was pruned.
    assert_eq!(c.warm([key(2), key(2199)]), 2);
}

/// A cache (no culler) with a temporary record (`<file>.meta.tmp`) of `key(3)` left in
/// its object's directory; also what an adoption walk of it is given.
fn cache_with_temporary_record(d: &Path) -> (CacheDir, PathBuf, PathBuf, std::sync::Weak<Store>) {
    let c = CacheDir::open_without_culler(d, Limits::default(), Some(crate::unwatched_probe()))
        .unwrap();
    let (_, meta) = c.object_paths(&key(3));
    fs::create_dir_all(meta.parent().unwrap()).unwrap();
    let tmp = meta.with_extension("meta.tmp");
    fs::write(&tmp, b"half written").unwrap();
    let (root, store) = (c.store.root().to_path_buf(), Arc::downgrade(&c.store));
    (c, tmp, root, store)
}

#[test]
fn adoption_removes_a_temporary_record_only_under_its_objects_lock() {
    let d = tempfile::tempdir().unwrap();
    let (c, tmp, root, store) = cache_with_temporary_record(d.path());
    // As `CachedObject::open` holds it between writing and renaming the record.
    let opening = c.store.shard(&key(3)).lock();
    let walk = std::thread::spawn(move || recover::adopt_orphans(&root, &store));
    hoardfs_testutil::assert_stays(
        "the temporary record stays while its object is being opened",
        std::time::Duration::from_millis(100),
        || tmp.exists(),
    );
    drop(opening);
    assert_eq!(walk.join().unwrap(), Some(0));
    assert!(!tmp.exists(), "a leftover outlived the walk");
}

#[test]
fn adoption_after_the_cache_is_closed_touches_nothing() {
    // Another process may own the directory by then.
    let d = tempfile::tempdir().unwrap();
    let (c, tmp, root, store) = cache_with_temporary_record(d.path());
    c.close().unwrap();
    assert_eq!(recover::adopt_orphans(&root, &store), None);
    assert!(tmp.exists());
    drop(c);
    assert_eq!(recover::adopt_orphans(&root, &store), None);
    assert!(tmp.exists());
}
