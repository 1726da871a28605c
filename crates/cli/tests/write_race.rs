//! Versions that cannot miss a change: a client writing a cached file while a process on
//! the server writes the same file at the same moment must end up serving the server's
//! bytes. The client moves its cached object to the version the server reports after its
//! write; if another write slipped in between the server's `stat`s around that write, the
//! reported version also covers bytes this client never saw, and (before the server bumped
//! such files) the client served its own stale copy of them for good, across remounts.
//!
//! Each trial starts two writers on a barrier: the client writes 8 × 64 KiB at 3 MiB through
//! the mount, and a server-local process (or, in every fourth trial, a second client)
//! writes 4 KiB at offset 0. Afterwards the client must promptly read exactly the server's
//! bytes; at the end the same holds after a page-cache drop and after a remount.

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use common::*;

const SIZE: usize = 4 << 20;

fn trials() -> usize {
    std::env::var("HOARDFS_RACE_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600)
}

#[test]
fn client_writes_racing_server_local_writes_end_with_the_servers_bytes() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), bytes(1, SIZE)).unwrap();
    let srv = Server::start(&exp);
    let cache_a = t.path().join("cache-a");
    let mnt_a = t.path().join("mnt-a");
    let a = Mount::with_cache(&srv.addr, &mnt_a, &cache_a, &["--attr-timeout", "60"]);
    let b = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt-b"),
        &t.path().join("cache-b"),
        &["--attr-timeout", "60"],
    );
    now(has_content(
        &a.p("f"),
        &std::fs::read(exp.join("f")).unwrap(),
    ));

    let n = trials();
    for trial in 0..n {
        let barrier = Arc::new(Barrier::new(2));
        let client_path = a.p("f");
        let other_path = if trial % 4 == 3 {
            b.p("f")
        } else {
            exp.join("f")
        };
        let seed = 1000 + trial as u64;
        let bar = barrier.clone();
        let client = std::thread::spawn(move || {
            let f = OpenOptions::new().write(true).open(&client_path).unwrap();
            let chunk = bytes(seed, 64 << 10);
            bar.wait();
            for i in 0..8u64 {
                f.write_all_at(&chunk, (3 << 20) + i * (64 << 10)).unwrap();
            }
            close_checked(f).unwrap();
        });
        let small = bytes(seed ^ 0xffff, 4096);
        let delay = Duration::from_micros((trial as u64 * 397) % 3000);
        let f = OpenOptions::new().write(true).open(&other_path).unwrap();
        barrier.wait();
        std::thread::sleep(delay);
        f.write_all_at(&small, 0).unwrap();
        close_checked(f).unwrap();
        client.join().unwrap();
        let want = std::fs::read(exp.join("f")).unwrap();
        assert_eq!(
            &want[..4096],
            &small[..],
            "trial {trial}: the server lost a write"
        );
        assert_soon(
            &format!("trial {trial}: the client serves the server's bytes"),
            || has_content(&a.p("f"), &want),
        );
    }

    let want = std::fs::read(exp.join("f")).unwrap();
    drop_page_cache();
    now(has_content(&a.p("f"), &want));
    a.unmount();
    let a = Mount::with_cache(&srv.addr, &mnt_a, &cache_a, &["--attr-timeout", "60"]);
    now(has_content(&a.p("f"), &want));
}

fn now(r: Result<(), String>) {
    if let Err(e) = r {
        panic!("{e}");
    }
}
