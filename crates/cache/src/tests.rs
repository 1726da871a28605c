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
        let c = CacheDir::open(d.path()).unwrap();
        let o = c.object(key(1), 5, size).unwrap();
        o.write_chunk(0, &chunk(0, MIB)).unwrap();
        o.write_chunk(2, &chunk(2, 100)).unwrap();
        assert!(!o.is_complete());
    }
    let c = CacheDir::open(d.path()).unwrap();
    let o = c.object(key(1), 5, size).unwrap();
    assert!(o.has_chunk(0) && !o.has_chunk(1) && o.has_chunk(2));
    let mut buf = vec![0u8; 100];
    o.read_at(&mut buf, 2 * MIB).unwrap();
    assert_eq!(buf, chunk(2, 100));
    o.write_chunk(1, &chunk(1, MIB)).unwrap();
    assert!(o.is_complete());
    assert_eq!(o.bytes_present(), size);
    assert_eq!(c.peek(&key(1)).unwrap().version, 5);
}

#[test]
fn new_version_discards_old_chunks() {
    let d = tempfile::tempdir().unwrap();
    let c = CacheDir::open(d.path()).unwrap();
    let old = c.object(key(1), 5, MIB).unwrap();
    old.write_chunk(0, &chunk(0, MIB)).unwrap();
    let backing = old.open_backing().unwrap();
    old.retire();
    let new = c.object(key(1), 6, MIB).unwrap();
    assert!(!new.has_chunk(0));
    // A write through the retired object must not mark the new one present.
    old.write_chunk(0, &chunk(9, MIB)).unwrap();
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
    let c = CacheDir::open(d.path()).unwrap();
    let o = c.object(key(3), 1, MIB).unwrap();
    o.write_chunk(0, &chunk(0, MIB)).unwrap();
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
    let c = CacheDir::open(d.path()).unwrap();
    let o = c.object(key(4), 1, MIB + 10).unwrap();
    assert!(matches!(
        o.write_chunk(1, &[0u8; 9]),
        Err(CacheError::ChunkLength { .. })
    ));
    assert!(o.write_chunk(5, &[0u8; 9]).is_err());
    assert!(!o.has_chunk(1));
}

#[test]
fn second_client_is_locked_out_and_foreign_dirs_refused() {
    let d = tempfile::tempdir().unwrap();
    let _c = CacheDir::open(d.path()).unwrap();
    assert!(matches!(
        CacheDir::open(d.path()),
        Err(CacheError::Locked(_))
    ));
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("precious.txt"), b"x").unwrap();
    assert!(matches!(
        CacheDir::open(other.path()),
        Err(CacheError::Incompatible { .. })
    ));
    assert!(other.path().join("precious.txt").exists());
}
