//! Benchmark: cache startup time and per-access cost versus the number of cached objects.
//!
//! `startup fill DIR N` creates N real objects (one 100-byte chunk each) through the store
//! and closes it in order; `startup measure DIR N` opens the cache (timed: that is the
//! startup a mount pays), then times random accesses (load an object, hold it, read its
//! chunk) and inserts that must evict (the cache is at its limit). Prints one JSON line.
//! Driven by bench/startup.py, which drops the page cache between the two steps.

use std::time::Instant;

use hoardfs_cache::{CacheDir, Limits, ObjectKey, unwatched_probe};
use rand::{Rng, SeedableRng};

fn key(i: u64) -> ObjectKey {
    ObjectKey {
        export_id: 0xbe7c4,
        file_id: i,
    }
}

const SIZE: u64 = 100;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (mode, dir, n) = match args.as_slice() {
        [_, m, d, n] => (
            m.as_str(),
            std::path::PathBuf::from(d),
            n.parse::<u64>().unwrap(),
        ),
        _ => {
            eprintln!("usage: startup fill|measure DIR N");
            std::process::exit(2);
        }
    };
    let data = vec![7u8; SIZE as usize];
    match mode {
        "fill" => {
            let c = CacheDir::open_unwatched(&dir).unwrap();
            let start = Instant::now();
            for i in 0..n {
                let o = c.object(key(i), 1, SIZE).unwrap();
                assert!(o.write_chunk(0, &data, 1).unwrap());
                if i % 100_000 == 0 && i > 0 {
                    eprintln!("  {i} objects, {:.0} s", start.elapsed().as_secs_f64());
                }
            }
            c.close().unwrap();
        }
        "measure" => {
            let t = Instant::now();
            let c = CacheDir::open_with(&dir, Limits::default(), Some(unwatched_probe())).unwrap();
            let open_s = t.elapsed().as_secs_f64();
            let u = c.usage();
            assert_eq!(u.objects, n, "the index lost objects");
            // Random accesses: load, hold like an open, read the chunk. The first pass finds
            // the files' metadata on disk (cold), the second in the page cache (warm).
            let accesses = 20_000u64;
            let mut buf = vec![0u8; SIZE as usize];
            let mut pass = || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(1);
                let t = Instant::now();
                for _ in 0..accesses {
                    let o = c.object(key(rng.random_range(0..n)), 1, SIZE).unwrap();
                    let _h = o.hold_open();
                    assert!(o.read_chunk_at(0, &mut buf, 0).unwrap());
                }
                t.elapsed().as_secs_f64() * 1e6 / accesses as f64
            };
            let access_us = pass();
            let warm_us = pass();
            drop(c);
            // Inserts into a full cache: each one evicts.
            let limits = Limits {
                max_bytes: Some(u.bytes),
                ..Limits::default()
            };
            let c = CacheDir::open_with(&dir, limits, Some(unwatched_probe())).unwrap();
            let inserts = 5_000u64;
            let t = Instant::now();
            for i in 0..inserts {
                let o = c.object(key(n + i), 1, SIZE).unwrap();
                assert!(o.write_chunk(0, &data, 1).unwrap());
            }
            let insert_us = t.elapsed().as_secs_f64() * 1e6 / inserts as f64;
            let ev = c.usage().evictions;
            println!(
                "{{\"objects\": {n}, \"open_s\": {open_s:.4}, \"access_us\": {access_us:.1}, \"access_warm_us\": {warm_us:.1}, \
                 \"insert_evict_us\": {insert_us:.1}, \"evictions\": {ev}, \
                 \"index_bytes\": {}}}",
                std::fs::metadata(dir.join("index")).unwrap().len()
            );
        }
        _ => panic!("unknown mode {mode}"),
    }
}
