//! Cache management on real mounts: the size limit under a read of 3x the cache, pinning,
//! `hoardfs stats`/`cache`/`prefetch`/`pin`, Prometheus metrics, hoard files, the scrub on
//! a corrupted cache directory, and offline use with reconnection.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use common::rig::*;
use common::*;

const MIB: usize = 1 << 20;

/// Allocated bytes of the cache's objects on disk.
fn du(dir: &Path) -> u64 {
    walk_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().blocks() * 512)
        .sum()
}

#[test]
fn reading_three_times_the_cache_size_stays_under_the_limit_and_pinned_files_survive() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("keep"), bytes(1, 2 * MIB)).unwrap();
    for i in 0..12 {
        std::fs::write(exp.join(format!("f{i:02}")), bytes(100 + i, 2 * MIB)).unwrap();
    }
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &cache,
        &["--cache-size", "8M"],
    );
    let (ok, out, err) = tool(&["pin", m.p("keep").to_str().unwrap(), "--quiet"]);
    assert!(ok, "pin failed: {err}");
    assert!(out.contains("pinned 1 file,"), "{out}");
    let limit = 8 * MIB as u64;
    for round in 0..2 {
        for i in 0..12 {
            let got = std::fs::read(m.p(&format!("f{i:02}"))).unwrap();
            assert_bytes_eq("file through a full cache", &got, &bytes(100 + i, 2 * MIB));
            let on_disk = du(&cache.join("objects"));
            assert!(
                on_disk <= limit,
                "round {round}: {on_disk} bytes cached, limit {limit}"
            );
        }
    }
    let s = stats(&m);
    assert!(s["cache"]["evictions"].as_u64().unwrap() >= 6, "{s}");
    assert!(s["cache"]["bytes"].as_u64().unwrap() <= limit);
    // The pinned file is still cached: reading it costs nothing from the network.
    let before = s["counters"]["bytes_from_network"].as_u64().unwrap();
    drop_caches();
    assert_eq!(std::fs::read(m.p("keep")).unwrap(), bytes(1, 2 * MIB));
    let after = stats(&m)["counters"]["bytes_from_network"]
        .as_u64()
        .unwrap();
    assert_eq!(before, after, "the pinned file was evicted");
    m.unmount();
}

#[test]
fn stats_metrics_ls_evict_and_prefetch_on_a_mount() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("dir/sub")).unwrap();
    for i in 0..6 {
        std::fs::write(exp.join(format!("dir/sub/f{i}")), bytes(i, 300_000)).unwrap();
    }
    std::fs::write(exp.join("dir/big"), bytes(9, 5 * MIB)).unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let metrics = format!("127.0.0.1:{port}");
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &cache,
        &["--metrics-listen", &metrics],
    );
    let (ok, out, err) = tool(&["prefetch", m.p("dir").to_str().unwrap(), "--quiet"]);
    assert!(ok, "prefetch failed: {err}");
    assert!(out.contains("prefetched 7 files"), "{out}");
    let s = stats(&m);
    let net = s["counters"]["bytes_from_network"].as_u64().unwrap();
    assert_eq!(net, 6 * 300_000 + 5 * MIB as u64, "{s}");
    assert_eq!(s["connected"], serde_json::json!(true));
    // Prefetched files read from the cache (passthrough), nothing more from the network.
    drop_caches();
    assert_eq!(std::fs::read(m.p("dir/big")).unwrap(), bytes(9, 5 * MIB));
    let s = stats(&m);
    assert_eq!(s["counters"]["bytes_from_network"].as_u64().unwrap(), net);
    assert!(s["counters"]["passthrough_opens"].as_u64().unwrap() >= 1);
    // ls names the files; evict drops one; status agrees.
    let (ok, out, _) = tool(&["cache", "ls", m.path.to_str().unwrap(), "--json"]);
    assert!(ok);
    let ls: serde_json::Value = serde_json::from_str(&out).unwrap();
    let paths: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert!(
        paths.contains(&"/dir/big") && paths.contains(&"/dir/sub/f3"),
        "{paths:?}"
    );
    let status = || {
        let (ok, out, _) = tool(&["cache", "status", m.path.to_str().unwrap(), "--json"]);
        assert!(ok);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let before = status()["bytes"].as_u64().unwrap();
    let (ok, out, err) = tool(&["cache", "evict", m.p("dir/big").to_str().unwrap()]);
    assert!(ok, "evict: {err}");
    assert!(out.contains("freed 5.0 MiB"), "{out}");
    let st = status();
    // Disk usage (allocated blocks): a fragmented file also frees its extent tree blocks.
    let freed = before - st["bytes"].as_u64().unwrap();
    assert_eq!(freed, st["evicted_bytes"].as_u64().unwrap(), "{st}");
    assert!(
        (5 * MIB as u64..5 * MIB as u64 + 64 * 1024).contains(&freed),
        "{st}"
    );
    assert_eq!(st["evictions"].as_u64().unwrap(), 1);
    // Reading it again fetches it again.
    assert_eq!(std::fs::read(m.p("dir/big")).unwrap(), bytes(9, 5 * MIB));
    let s = stats(&m);
    assert_eq!(
        s["counters"]["bytes_from_network"].as_u64().unwrap(),
        net + 5 * MIB as u64
    );
    // Prometheus metrics carry the same counters.
    let mut c = std::net::TcpStream::connect(&metrics).unwrap();
    c.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut body = String::new();
    c.read_to_string(&mut body).unwrap();
    assert!(body.starts_with("HTTP/1.0 200 OK"), "{body}");
    let line = body
        .lines()
        .find(|l| l.starts_with("hoardfs_bytes_from_network_total "))
        .unwrap_or_else(|| panic!("no counter in {body}"));
    assert_eq!(
        line,
        format!("hoardfs_bytes_from_network_total {}", net + 5 * MIB as u64)
    );
    assert!(body.contains("hoardfs_cache_evictions_total 1"), "{body}");
    assert!(body.contains("hoardfs_connected 1"));
    // The tools refuse paths that are not on a hoardfs mount.
    let (ok, _, err) = tool(&["stats", t.path().to_str().unwrap()]);
    assert!(!ok && err.contains("not on a hoardfs mount"), "{err}");
    m.unmount();
}

#[test]
fn verify_drops_a_corrupted_chunk_and_the_right_bytes_are_served() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("a"), bytes(5, 3 * MIB)).unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let mnt = t.path().join("mnt");
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    assert_eq!(std::fs::read(m.p("a")).unwrap(), bytes(5, 3 * MIB));
    // While mounted, the cache directory is refused (the client owns it).
    let (ok, _, err) = tool(&["cache", "status", cache.to_str().unwrap()]);
    assert!(
        !ok && err.contains("in use by a running hoardfs client"),
        "{err}"
    );
    m.unmount();
    // Flip one byte of the cached data (bit rot, a bad disk, a stray write).
    let data = walk_files(&cache.join("objects"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "data"))
        .unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&data).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, b"\xff", MIB as u64 + 17).unwrap();
    drop(f);
    let (ok, out, _) = tool(&["cache", "verify", cache.to_str().unwrap()]);
    assert!(!ok, "verify must report corruption");
    assert!(out.contains("3 chunks: 1 bad chunks dropped"), "{out}");
    let (ok, out, _) = tool(&["cache", "verify", cache.to_str().unwrap()]);
    assert!(ok && out.contains("0 bad chunks"), "{out}");
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    drop_caches();
    assert_bytes_eq(
        "after scrub",
        &std::fs::read(m.p("a")).unwrap(),
        &bytes(5, 3 * MIB),
    );
    let s = stats(&m);
    assert_eq!(
        s["counters"]["bytes_from_network"].as_u64().unwrap(),
        MIB as u64
    );
    m.unmount();
}

#[test]
fn reopening_a_cached_file_reuses_its_passthrough_registration_until_it_changes() {
    let r = rig_with(
        |exp| std::fs::write(exp.join("f"), bytes(1, 3 * MIB)).unwrap(),
        &[],
        &[],
    );
    let (m, exp) = (&r.m, &r.exp);
    // An O_PATH descriptor (no FUSE open) keeps the kernel from forgetting the inode when
    // tests running beside this one drop every cache: the mount keeps its node and object.
    let inode_pin = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(m.p("f"))
        .unwrap();
    // Each read goes to the file itself, not to the kernel's page cache of an earlier one.
    let read = |want: &[u8]| {
        drop_page_cache();
        assert_content("f", &m.p("f"), want);
    };
    read(&bytes(1, 3 * MIB)); // fetched
    for _ in 0..4 {
        read(&bytes(1, 3 * MIB));
    }
    assert_eq!(counter(m, "passthrough_opens"), 4);
    assert_eq!(
        counter(m, "passthrough_registrations"),
        1,
        "one per cached object"
    );
    // Evicted while registered: the data file is emptied and refilled in place, and the
    // registration (of that same file) then serves the refetched bytes.
    let (ok, _, err) = tool(&["cache", "evict", m.p("f").to_str().unwrap()]);
    assert!(ok, "evict: {err}");
    read(&bytes(1, 3 * MIB));
    read(&bytes(1, 3 * MIB));
    assert_eq!(counter(m, "bytes_from_network"), 6 * MIB as u64);
    assert_eq!(counter(m, "passthrough_opens"), 5);
    assert_eq!(counter(m, "passthrough_registrations"), 1);
    // A new version is a new cache file: registered anew, never the old one's bytes.
    std::fs::write(exp.join("f"), bytes(2, 2 * MIB)).unwrap();
    assert_soon("the new version", || {
        has_content(&m.p("f"), &bytes(2, 2 * MIB))
    });
    read(&bytes(2, 2 * MIB));
    read(&bytes(2, 2 * MIB));
    assert_eq!(counter(m, "passthrough_registrations"), 2);
    // Dropping the kernel's inodes too (a forgotten node lets go of its object and
    // registration) still reads the right bytes.
    drop(inode_pin);
    drop_caches();
    read(&bytes(2, 2 * MIB));
}

#[test]
fn listing_a_directory_after_a_remount_reads_its_cached_records_ahead() {
    let mut r = rig_with(
        |exp| {
            std::fs::create_dir_all(exp.join("d/sub")).unwrap();
            for i in 0..5u64 {
                std::fs::write(exp.join(format!("d/f{i}")), bytes(i, 100_000)).unwrap();
            }
        },
        &[],
        &[],
    );
    for i in 0..3u64 {
        std::fs::read(r.m.p(&format!("d/f{i}"))).unwrap();
    }
    r.remount(&[]);
    let m = &r.m;
    let warmed = || stats(m)["cache"]["records_warmed"].as_u64().unwrap();
    assert_eq!(warmed(), 0);
    assert_eq!(std::fs::read_dir(m.p("d")).unwrap().count(), 6);
    // The three cached files, not the two never read nor the directory.
    assert_soon("three records warmed", || match warmed() {
        3 => Ok(()),
        n => Err(format!("{n} warmed")),
    });
    // And no more: watched for a while, in which a wrongly warmed record would show.
    hoardfs_testutil::assert_stays(
        "no other record warmed",
        std::time::Duration::from_millis(200),
        || warmed() == 3,
    );
    for i in 0..5u64 {
        let got = std::fs::read(m.p(&format!("d/f{i}"))).unwrap();
        assert_bytes_eq(&format!("d/f{i}"), &got, &bytes(i, 100_000));
    }
    assert_eq!(
        counter(m, "bytes_from_network"),
        200_000,
        "only the two files never read before"
    );
}

fn walk_files(d: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
        if e.file_type().unwrap().is_dir() {
            out.extend(walk_files(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

#[test]
fn a_hoard_file_pins_and_fetches_at_mount_time() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("tools/bin")).unwrap();
    std::fs::create_dir_all(exp.join("tex")).unwrap();
    std::fs::write(exp.join("tools/bin/cc"), bytes(1, MIB)).unwrap();
    std::fs::write(exp.join("tex/a.png"), bytes(2, 100_000)).unwrap();
    std::fs::write(exp.join("tex/b.jpg"), bytes(3, 100_000)).unwrap();
    let hoard = t.path().join("hoard");
    std::fs::write(&hoard, "# test\n/tools 100\ntex/*.png 5\n").unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &cache,
        &["--hoard-file", hoard.to_str().unwrap()],
    );
    let want = (MIB + 100_000) as u64;
    assert!(
        wait_until(Duration::from_secs(20), || {
            stats(&m)["counters"]["bytes_from_network"].as_u64() == Some(want)
        }),
        "hoard did not fetch: {}",
        stats(&m)
    );
    let s = stats(&m);
    assert_eq!(s["cache"]["pinned_objects"].as_u64().unwrap(), 2, "{s}");
    m.unmount();
}

#[test]
fn offline_serves_the_cache_fails_fast_and_reconnects_by_itself() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::write(exp.join("d/cached"), bytes(1, 2 * MIB)).unwrap();
    std::fs::write(exp.join("d/uncached"), bytes(2, 2 * MIB)).unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let cache = t.path().join("cache");
    let m = Mount::with_cache(
        &addr,
        &t.path().join("mnt"),
        &cache,
        &["--timeout", "2", "--attr-timeout", "0.2"],
    );
    let (ok, _, err) = tool(&["prefetch", m.p("d/cached").to_str().unwrap(), "-q"]);
    assert!(ok, "{err}");
    let names = list(&m.p("d")).unwrap();
    srv.kill();
    // The 0.2 s attribute TTL expires: what follows is served offline, not from fresh
    // attributes (the wait is the point).
    std::thread::sleep(Duration::from_millis(400));
    drop_caches();
    // Cached data, attributes and listings stay available.
    assert_eq!(std::fs::read(m.p("d/cached")).unwrap(), bytes(1, 2 * MIB));
    assert_eq!(
        std::fs::metadata(m.p("d/cached")).unwrap().len(),
        2 * MIB as u64
    );
    assert_eq!(list(&m.p("d")).unwrap(), names);
    // Uncached data fails fast with an error.
    let started = Instant::now();
    assert!(std::fs::read(m.p("d/uncached")).is_err());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(stats(&m)["connected"], serde_json::json!(false));
    // A change made while the client was away, then the server comes back on its address.
    std::fs::write(exp.join("d/cached"), bytes(7, MIB)).unwrap();
    let _srv = Server::start_at(&exp, &addr, &[]);
    assert_soon("reconnect and revalidate", || {
        has_content(&m.p("d/cached"), &bytes(7, MIB))
    });
    assert_eq!(std::fs::read(m.p("d/uncached")).unwrap(), bytes(2, 2 * MIB));
    assert_eq!(stats(&m)["connected"], serde_json::json!(true));
    m.unmount();
}

/// A client killed (a crash, a power cut) in its first seconds, right after the server
/// went away and before it noticed: the namespace was saved within about a second of
/// what it saw, so the next mount starts disconnected and serves it.
#[test]
fn a_client_killed_early_right_after_the_server_went_away_starts_disconnected() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::write(exp.join("d/f"), bytes(3, 100_000)).unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let args = ["--timeout", "2"];
    let m = Mount::with_cache(&addr, &mnt, &cache, &args);
    assert_eq!(std::fs::read(m.p("d/f")).unwrap(), bytes(3, 100_000));
    assert_eq!(list(&m.p("d")).unwrap(), vec![b"f".to_vec()]);
    // "About a second": the keeper looks each second.
    std::thread::sleep(Duration::from_secs(3));
    srv.kill();
    m.kill9();

    let m = Mount::with_cache(&addr, &mnt, &cache, &args);
    assert_eq!(stats(&m)["connected"], serde_json::json!(false));
    assert_eq!(std::fs::read(m.p("d/f")).unwrap(), bytes(3, 100_000));
    assert_eq!(list(&m.p("d")).unwrap(), vec![b"f".to_vec()]);
    m.unmount();
}

#[test]
fn a_mount_starts_disconnected_from_its_cache_and_reconnects_in_the_background() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d/deep")).unwrap();
    std::fs::write(exp.join("d/cached"), bytes(1, 2 * MIB)).unwrap();
    std::fs::write(exp.join("d/uncached"), bytes(2, 2 * MIB)).unwrap();
    std::fs::write(exp.join("d/deep/small"), b"small and deep").unwrap();
    std::fs::write(exp.join("top"), b"top").unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let args = ["--timeout", "2"];
    let m = Mount::with_cache(&addr, &mnt, &cache, &args);
    let (ok, _, err) = tool(&["prefetch", m.p("d/cached").to_str().unwrap(), "-q"]);
    assert!(ok, "{err}");
    assert_eq!(
        std::fs::read(m.p("d/deep/small")).unwrap(),
        b"small and deep"
    );
    let names = list(&m.p("d")).unwrap();
    let top = list(&m.p("")).unwrap();
    m.unmount();
    srv.kill();

    // The server is down: the mount starts anyway, from the cache directory.
    let started = Instant::now();
    let m = Mount::with_cache(&addr, &mnt, &cache, &args);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(stats(&m)["connected"], serde_json::json!(false));
    assert_eq!(list(&m.p("")).unwrap(), top);
    assert_eq!(list(&m.p("d")).unwrap(), names);
    assert_eq!(std::fs::read(m.p("d/cached")).unwrap(), bytes(1, 2 * MIB));
    assert_eq!(
        std::fs::read(m.p("d/deep/small")).unwrap(),
        b"small and deep"
    );
    assert_eq!(
        std::fs::metadata(m.p("d/uncached")).unwrap().len(),
        2 * MIB as u64,
        "a name listed before"
    );
    assert_errno("uncached data", std::fs::read(m.p("d/uncached")), libc::EIO);
    assert_errno(
        "a name never seen",
        std::fs::metadata(m.p("d/new")),
        libc::EIO,
    );
    assert_errno(
        "a change while disconnected",
        std::fs::write(m.p("d/new"), b"x"),
        libc::EIO,
    );

    // Changes on the server meanwhile; then it comes back on its address. Nothing uses
    // the mount: the reconnect happens in the background.
    std::fs::write(exp.join("d/cached"), bytes(7, MIB)).unwrap();
    std::fs::write(exp.join("d/new"), b"new").unwrap();
    let _srv = Server::start_at(&exp, &addr, &[]);
    assert_soon(
        "the mount reconnects by itself",
        || match stats(&m)["connected"].as_bool() {
            Some(true) => Ok(()),
            other => Err(format!("connected: {other:?}")),
        },
    );
    assert_soon("changes made meanwhile are seen", || {
        has_content(&m.p("d/cached"), &bytes(7, MIB))?;
        has_content(&m.p("d/new"), b"new")
    });
    assert_eq!(std::fs::read(m.p("d/uncached")).unwrap(), bytes(2, 2 * MIB));
    m.unmount();
}

/// A cache file system short of room (here: thresholds above the disk's free space) still
/// serves every byte, caches nothing, and says so in the mount's log with what to do.
#[test]
fn a_cache_file_system_short_of_room_serves_uncached_and_says_so() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), bytes(4, 2 * MIB)).unwrap();
    let srv = Server::start(&exp);
    let log = t.path().join("mount.log");
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[
            "--bstop",
            "97",
            "--bcull",
            "98",
            "--brun",
            "99",
            "--log-file",
            log.to_str().unwrap(),
        ],
    );
    let free = stats(&m)["cache"]["fs_bytes_avail"].as_u64().unwrap() as f64 * 100.0
        / stats(&m)["cache"]["fs_bytes_total"].as_u64().unwrap() as f64;
    if free >= 97.0 {
        eprintln!("SKIPPED: the test file system is {free:.1}% free, above the thresholds");
        return;
    }
    for _ in 0..2 {
        drop_caches();
        assert_eq!(std::fs::read(m.p("f")).unwrap(), bytes(4, 2 * MIB));
    }
    // Both reads went to the server, each byte once (no chunk fetched ahead or whole, to be
    // dropped); no data was cached (a record alone may be).
    let s = stats(&m);
    assert_eq!(
        s["counters"]["bytes_from_network"].as_u64().unwrap(),
        4 * MIB as u64,
        "{s}"
    );
    assert_eq!(
        s["counters"]["bytes_from_cache"].as_u64().unwrap(),
        0,
        "{s}"
    );
    // `stats` says so too, in words and as a metric.
    assert_eq!(s["cache"]["room"], "stopped", "{s}");
    let (ok, out, _) = tool(&["stats", m.path.to_str().unwrap()]);
    assert!(ok && out.contains("NOT CACHING"), "{out}");
    // A prefetch says the file is not cached, and downloads nothing to drop.
    let (_, _, err) = tool(&["prefetch", m.p("f").to_str().unwrap()]);
    assert!(err.contains("not fully cached (no room)"), "{err}");
    let after = stats(&m)["counters"]["bytes_from_network"]
        .as_u64()
        .unwrap();
    assert_eq!(
        after,
        4 * MIB as u64,
        "the prefetch fetched what it could not keep"
    );
    assert!(s["cache"]["bytes"].as_u64().unwrap() < MIB as u64, "{s}");
    assert_soon("the log says why nothing is cached", || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        (text.contains("WARN") && text.contains("below bstop 97%: nothing new is cached"))
            .then_some(())
            .ok_or(text)
    });
    m.unmount();
}

/// A cache directory others could read, write or replace is refused at every mount, with
/// an error saying how to fix it (cached files keep no per-file permissions, and the
/// directory holds the server identity the mount trusts); what a mount makes inside is
/// private.
#[test]
fn a_cache_directory_others_can_use_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"secret stuff").unwrap();
    let srv = Server::start(&exp);
    let cache = t.path().join("cache");
    let m = Mount::with_cache(&srv.addr, &t.path().join("mnt"), &cache, &[]);
    assert_eq!(read(&m.p("f")), b"secret stuff");
    m.unmount();
    // Everything the mount made inside is the mounting user's alone.
    for p in walk_files(&cache) {
        let mode = std::fs::symlink_metadata(&p).unwrap().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", p.display());
    }
    let mount_err = |what: &str| {
        Mount::start(
            &srv.addr,
            &t.path().join("mnt"),
            &["--cache-dir", cache.to_str().unwrap()],
        )
        .err()
        .unwrap_or_else(|| panic!("a cache directory {what} was used"))
    };
    // Loosened later (chmod 755, 777): refused, the fix named.
    for mode in [0o755, 0o777] {
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(mode)).unwrap();
        let e = mount_err(&format!("of mode {mode:o}"));
        assert!(e.contains("chmod 700"), "{e}");
    }
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    // Another user's: refused.
    std::os::unix::fs::chown(&cache, Some(4321), None).unwrap();
    let e = mount_err("of another user");
    assert!(e.contains("uid 4321"), "{e}");
    std::os::unix::fs::chown(&cache, Some(0), None).unwrap();
    // Back to private: it mounts and serves what it cached.
    let m = Mount::with_cache(&srv.addr, &t.path().join("mnt"), &cache, &[]);
    assert_eq!(read(&m.p("f")), b"secret stuff");
}
