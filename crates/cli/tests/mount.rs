//! End-to-end tests: a real `hoardfs serve` on 127.0.0.1 and real FUSE mounts.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

#[test]
fn content_listing_and_symlinks_match_the_server() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let files = make_tree(&exp);
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let m = Mount::start(
        &srv.addr,
        &t.path().join("mnt"),
        &["--cache-dir", cache.to_str().unwrap(), "-o", "ro"],
    )
    .unwrap();
    for f in &files {
        assert_eq!(hash_file(&m.p(f)), hash_file(&exp.join(f)), "{f} differs");
    }
    let mut names: Vec<_> = std::fs::read_dir(m.p("dir1/sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 5);
    assert_eq!(
        std::fs::read_link(m.p("link-rel")).unwrap().to_str(),
        Some("dir0/sub/f1.txt")
    );
    assert_eq!(
        std::fs::read(m.p("link-rel")).unwrap(),
        std::fs::read(exp.join("dir0/sub/f1.txt")).unwrap()
    );
    let md = std::fs::metadata(m.p("odd.bin")).unwrap();
    assert_eq!(md.len(), (3 << 20) + 12345);
    // Random-offset reads of a partially cached file return the right bytes.
    let want = std::fs::read(exp.join("big.bin")).unwrap();
    let f = std::fs::File::open(m.p("big.bin")).unwrap();
    for &off in &[20_000_000u64, 5, 7 << 20, (24 << 20) - 10] {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; 4096];
        let n = f.read_at(&mut buf, off).unwrap();
        assert_eq!(&buf[..n], &want[off as usize..(off as usize + n)]);
    }
    drop(f);
    // Writes are refused on this read-only (`-o ro`) mount.
    let err = std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("big.bin"))
        .unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));
    m.unmount();
}

#[test]
fn cache_survives_remount_and_kill9_without_refetching() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let files = make_tree(&exp);
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let args = ["--cache-dir", cache.to_str().unwrap()];
    let mnt = t.path().join("mnt");
    let m = Mount::start(&srv.addr, &mnt, &args).unwrap();
    for f in &files {
        hash_file(&m.p(f));
    }
    m.unmount();
    let after_fill = srv.counters().bytes_read;
    assert!(
        after_fill >= 27 << 20,
        "first pass fetched only {after_fill} bytes"
    );

    // Clean remount, page cache dropped: everything is served from the disk cache.
    let m = Mount::start(&srv.addr, &mnt, &args).unwrap();
    drop_caches();
    assert_tree_matches(&m, &exp, &files, "after remount");
    assert_eq!(
        srv.counters().bytes_read,
        after_fill,
        "remount refetched file data"
    );

    // kill -9 of the client mid-way: the cache is still valid and complete.
    m.kill9();
    let m = Mount::start(&srv.addr, &mnt, &args).unwrap();
    drop_caches();
    assert_tree_matches(&m, &exp, &files, "after kill -9");
    assert_eq!(
        srv.counters().bytes_read,
        after_fill,
        "kill -9 + remount refetched file data"
    );
    m.unmount();
}

#[test]
fn kill9_during_a_cold_fill_leaves_a_consistent_cache() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), bytes(77, 40 << 20)).unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let args = ["--cache-dir", cache.to_str().unwrap()];
    let mnt = t.path().join("mnt");
    let m = Mount::start(&srv.addr, &mnt, &args).unwrap();
    let mut f = std::fs::File::open(m.p("f")).unwrap();
    let mut buf = vec![0u8; 9 << 20];
    f.read_exact(&mut buf).unwrap();
    m.kill9();
    drop(f);
    let m = Mount::start(&srv.addr, &mnt, &args).unwrap();
    assert_eq!(hash_file(&m.p("f")), hash_file(&exp.join("f")));
    m.unmount();
}

#[test]
fn a_change_on_the_server_is_seen_after_its_callback_break() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("doc"), b"version one").unwrap();
    std::fs::write(exp.join("big"), bytes(5, 3 << 20)).unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    // A long attribute TTL: only the server's callback break can make the change visible
    // (within milliseconds, so the reads below poll for a bounded time).
    let m = Mount::start(
        &srv.addr,
        &t.path().join("mnt"),
        &[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--attr-timeout",
            "60",
        ],
    )
    .unwrap();
    assert_eq!(std::fs::read(m.p("doc")).unwrap(), b"version one");
    assert_eq!(std::fs::read(m.p("doc")).unwrap(), b"version one");
    std::fs::write(exp.join("doc"), b"version two is longer").unwrap();
    eventually(|| std::fs::read(m.p("doc")).unwrap() == b"version two is longer");
    std::fs::write(exp.join("doc"), b"v3").unwrap();
    eventually(|| std::fs::read(m.p("doc")).unwrap() == b"v3");
    // Same size, new content (a big file, cached and served by passthrough before).
    assert_eq!(hash_file(&m.p("big")), hash_file(&exp.join("big")));
    assert_eq!(hash_file(&m.p("big")), hash_file(&exp.join("big")));
    std::fs::write(exp.join("big"), bytes(6, 3 << 20)).unwrap();
    eventually(|| hash_file(&m.p("big")) == hash_file(&exp.join("big")));
    m.unmount();
}

/// A change on the server reaches clients as a callback break, within milliseconds;
/// without one it would take the 60 s attribute timeout.
#[track_caller]
fn eventually(cond: impl FnMut() -> bool) {
    assert_eventually("change seen", cond);
}

#[test]
fn wrong_token_is_refused_and_right_token_works() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("x"), b"secret data").unwrap();
    let (good, bad) = (t.path().join("good"), t.path().join("bad"));
    std::fs::write(&good, "correct horse\n").unwrap();
    std::fs::write(&bad, "battery staple\n").unwrap();
    let srv = Server::start_with(&exp, Some(&good));
    let cache = t.path().join("cache");
    let mnt = t.path().join("mnt");
    let c = cache.to_str().unwrap();
    let err = Mount::start(
        &srv.addr,
        &mnt,
        &["--cache-dir", c, "--token-file", bad.to_str().unwrap()],
    )
    .err()
    .expect("a wrong token must not mount");
    assert!(
        err.contains("refused our credential"),
        "unclear error: {err}"
    );
    assert!(err.contains("--token-file"), "no hint: {err}");
    let err = Mount::start(&srv.addr, &mnt, &["--cache-dir", c])
        .err()
        .expect("no token must not mount");
    assert!(
        err.contains("refused our credential"),
        "unclear error: {err}"
    );
    let m = Mount::start(
        &srv.addr,
        &mnt,
        &["--cache-dir", c, "--token-file", good.to_str().unwrap()],
    )
    .unwrap();
    assert_eq!(std::fs::read(m.p("x")).unwrap(), b"secret data");
    m.unmount();
}

#[test]
fn serve_refuses_open_network_without_token() {
    let t = scratch();
    let out = Command::new(bin())
        .arg("serve")
        .arg(t.path())
        .args(["--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let msg = String::from_utf8_lossy(&out.stderr);
    assert!(
        msg.contains("--token-file"),
        "message should say how to fix it: {msg}"
    );
}

#[test]
fn malformed_frames_do_not_disturb_a_concurrent_client() {
    malformed_frames_with(&[]);
}

#[test]
fn malformed_frames_do_not_disturb_a_concurrent_plaintext_client() {
    malformed_frames_with(&["--insecure-plaintext"]);
}

/// Garbage on fresh connections (before a TLS handshake, or as hoardfs frames to a
/// plaintext server) closes them; a mounted client reading meanwhile sees only true bytes.
fn malformed_frames_with(flags: &[&str]) {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("data"), bytes(9, 16 << 20)).unwrap();
    let srv = Server::start_args(&exp, flags);
    let mut mount_flags = vec!["--no-cache"];
    mount_flags.extend_from_slice(flags);
    let m = Mount::start(&srv.addr, &t.path().join("mnt"), &mount_flags).unwrap();
    let path = m.p("data");
    let reader = std::thread::spawn(move || (0..3).map(|_| hash_file(&path)).collect::<Vec<_>>());
    for garbage in [
        &b"GET / HTTP/1.1\r\n\r\n"[..],
        b"HFS1\xff\xff\xff\xff\0\0\0\0",
        b"HFS1\x05\0\0\0\0\0\0\0zzzzz",
    ] {
        let mut s = TcpStream::connect(&srv.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(garbage).unwrap();
        let mut buf = [0u8; 64];
        // The server closes the connection (EOF or reset), it does not hang or crash. A
        // TLS server answers what looks like a plaintext hoardfs frame with one frame
        // saying that TLS is required, then closes.
        match s.read(&mut buf) {
            Ok(0) | Err(_) => {}
            Ok(n) if srv.fingerprint.is_some() && buf.starts_with(b"HFS1") => {
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                assert!(
                    n + rest.len() < 64,
                    "more than a refusal: {} bytes",
                    n + rest.len()
                );
            }
            // ... and garbage that is not TLS with a TLS alert record (0x15).
            Ok(7) if srv.fingerprint.is_some() && buf[0] == 0x15 => {}
            Ok(n) => panic!("server answered garbage with {n} bytes"),
        }
    }
    let want = hash_file(&exp.join("data"));
    assert!(reader.join().unwrap().iter().all(|h| *h == want));
    assert!(srv.counters().bad_frames >= 3);
    m.unmount();
}

#[test]
fn server_death_keeps_cached_files_readable_and_fails_others_fast() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::write(exp.join("d/cached"), bytes(3, 5 << 20)).unwrap();
    std::fs::write(exp.join("d/uncached"), bytes(4, 5 << 20)).unwrap();
    let mut srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let m = Mount::start(
        &srv.addr,
        &t.path().join("mnt"),
        &[
            "--cache-dir",
            cache.to_str().unwrap(),
            "--timeout",
            "3",
            "--attr-timeout",
            "0.2",
        ],
    )
    .unwrap();
    let want = hash_file(&exp.join("d/cached"));
    assert_eq!(hash_file(&m.p("d/cached")), want);
    std::fs::metadata(m.p("d/uncached")).unwrap();
    srv.kill();
    std::thread::sleep(Duration::from_millis(500)); // attribute TTL expires
    drop_caches();
    assert_eq!(
        hash_file(&m.p("d/cached")),
        want,
        "cached file unreadable with the server down"
    );
    let started = Instant::now();
    let r = std::fs::read(m.p("d/uncached"));
    assert!(
        r.is_err(),
        "uncached data cannot be served without the server"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?} to fail",
        started.elapsed()
    );
    m.unmount();
}

#[test]
fn local_directory_source_is_cached_the_same_way() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let files = make_tree(&exp);
    let cache = t.path().join("cache");
    let args = ["--cache-dir", cache.to_str().unwrap()];
    let m = Mount::start(exp.to_str().unwrap(), &t.path().join("mnt"), &args).unwrap();
    for f in &files {
        assert_eq!(hash_file(&m.p(f)), hash_file(&exp.join(f)), "{f} differs");
    }
    std::fs::write(exp.join("dir0/sub/f0.txt"), b"changed locally").unwrap();
    eventually(|| std::fs::read(m.p("dir0/sub/f0.txt")).unwrap() == b"changed locally");
    m.unmount();
    // The big file's data sits in the cache directory after unmount.
    let cached: u64 = walk_sizes(&cache.join("objects"));
    assert!(cached >= 24 << 20, "cache holds only {cached} bytes");
}

fn walk_sizes(p: &std::path::Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk_sizes(&e.path())
                } else if e.path().extension().is_some_and(|x| x == "data") {
                    e.metadata().unwrap().len()
                } else {
                    0
                }
            })
            .sum()
        })
        .unwrap_or(0)
}

/// Every file of `files` reads the same through the mount as on the server.
fn assert_tree_matches(m: &Mount, exp: &std::path::Path, files: &[String], when: &str) {
    for f in files {
        assert_eq!(
            hash_file(&m.p(f)),
            hash_file(&exp.join(f)),
            "{f} differs {when}"
        );
    }
}
