//! Many readers at once through one client: every byte right, and fetched from the server
//! once (with a disk cache: a reader's chunks are not pushed out by the others' fetches;
//! without one: no read is fetched twice or rounded up to whole chunks).

mod common;

use common::rig::{Rig, rig_with};
use common::*;

/// An export prepared by `setup`, served and mounted without a disk cache (`--no-cache`
/// wins over the rig's `--cache-dir`).
fn uncached(setup: impl FnOnce(&std::path::Path)) -> Rig {
    rig_with(setup, &[], &["--no-cache"])
}

/// A whole file, read 4 KiB at a time (like the seed 003 readers).
fn read_in_4k_blocks(p: &std::path::Path) -> Vec<u8> {
    use std::io::Read;
    let mut f = std::fs::File::open(p).unwrap();
    let (mut got, mut buf) = (Vec::new(), vec![0u8; 4096]);
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            return got;
        }
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn sixty_four_parallel_readers_without_a_cache_fetch_each_byte_once() {
    const READERS: usize = 64;
    const SIZE: usize = 2 << 20;
    let r = uncached(|exp| {
        for i in 0..READERS {
            std::fs::write(exp.join(format!("r{i:02}")), bytes(100 + i as u64, SIZE)).unwrap();
        }
    });
    let (m, srv) = (&r.m, &r.srv);
    let before = srv.counters();
    std::thread::scope(|s| {
        for i in 0..READERS {
            let p = m.p(&format!("r{i:02}"));
            s.spawn(move || {
                // Small reads, like the seed 003 readers.
                let got = read_in_4k_blocks(&p);
                assert_bytes_eq(&format!("reader {i}"), &got, &bytes(100 + i as u64, SIZE));
            });
        }
    });
    let after = srv.counters();
    let total = (READERS * SIZE) as u64;
    let fetched = after.bytes_read - before.bytes_read;
    assert!(
        fetched <= total + total / 20,
        "{fetched} bytes fetched for {total} bytes read"
    );
    // The open-file cache: each file opened once, however many requests raced for it.
    assert_eq!(
        after.opens - before.opens,
        READERS as u64,
        "server file opens"
    );
}

#[test]
fn one_sequential_reader_without_a_cache_fetches_each_byte_once() {
    const SIZE: usize = 48 << 20;
    let want = bytes(7, SIZE);
    let r = uncached(|exp| std::fs::write(exp.join("big"), &want).unwrap());
    let (m, srv) = (&r.m, &r.srv);
    let before = srv.counters().bytes_read;
    // The kernel's readahead sends several reads at once, out of order: each must fetch
    // its own bytes, none twice.
    assert_bytes_eq("big", &std::fs::read(m.p("big")).unwrap(), &want);
    let fetched = srv.counters().bytes_read - before;
    assert!(
        fetched <= (SIZE + SIZE / 20) as u64,
        "{fetched} bytes fetched for {SIZE} bytes read"
    );
}

#[test]
fn sequential_small_reads_reach_the_daemon_as_large_requests() {
    const SIZE: usize = 16 << 20;
    let r = uncached(|exp| std::fs::write(exp.join("f"), bytes(8, SIZE)).unwrap());
    let m = &r.m;
    let reads = || counter(m, "reads");
    let before = reads();
    assert_bytes_eq("f", &read_in_4k_blocks(&m.p("f")), &bytes(8, SIZE));
    // The mount raised the kernel's readahead (128 KiB by default: 131 requests here) to
    // 1 MiB, so 4 KiB reads arrive as requests of up to 1 MiB.
    let n = reads() - before;
    assert!(n <= 40, "{n} FUSE reads for 16 MiB");
}
