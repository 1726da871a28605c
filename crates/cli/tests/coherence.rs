//! Cache coherence between two clients of one server (server callbacks): a change made on
//! client A (once A's `close` returned) or directly in the server's directory becomes
//! visible on client B — in `stat`, in listings, by name and in content — promptly, although
//! both clients trust cached attributes, names and listings for 60 s (`--attr-timeout 60`),
//! so without callback breaks they would show stale state for a minute. Conversely, while
//! nothing changes, B's cache stays valid: re-opening and re-reading a cached file fetches no
//! data and sends no per-open request to the server.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use common::*;

/// One server, clients A and B with their own caches. Fields drop in order: mounts,
/// server, directory.
struct Pair {
    a: Mount,
    b: Mount,
    srv: Server,
    exp: PathBuf,
    _t: tempfile::TempDir,
}

/// An export prepared by `setup`, served, and mounted twice with a 60 s attribute timeout.
fn pair(setup: impl FnOnce(&Path)) -> Pair {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    setup(&exp);
    let srv = Server::start(&exp);
    let client = |name: &str| {
        Mount::with_cache(
            &srv.addr,
            &t.path().join(format!("mnt-{name}")),
            &t.path().join(format!("cache-{name}")),
            &["--attr-timeout", "60"],
        )
    };
    let (a, b) = (client("a"), client("b"));
    Pair {
        a,
        b,
        srv,
        exp,
        _t: t,
    }
}

/// Creates or truncates `p` and writes `data`; returns once `close` succeeded.
fn put(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    close_checked(f).unwrap_or_else(|e| panic!("close {}: {e}", p.display()));
}

/// `Ok(())` if the listing of `dir` is exactly `want`.
fn lists(dir: &Path, want: &[&str]) -> Result<(), String> {
    let got = list(dir).map_err(|e| format!("readdir {}: {e}", dir.display()))?;
    let want: Vec<Vec<u8>> = want.iter().map(|n| n.as_bytes().to_vec()).collect();
    if got == want {
        Ok(())
    } else {
        let show = |v: &[Vec<u8>]| {
            v.iter()
                .map(|n| String::from_utf8_lossy(n).into_owned())
                .collect::<Vec<_>>()
        };
        Err(format!(
            "{} lists {:?}, want {:?}",
            dir.display(),
            show(&got),
            show(&want)
        ))
    }
}

#[track_caller]
fn now(r: Result<(), String>) {
    if let Err(e) = r {
        panic!("{e}");
    }
}

#[test]
fn a_file_created_on_a_is_seen_by_b() {
    let p = pair(|exp| {
        std::fs::create_dir(exp.join("d")).unwrap();
        std::fs::write(exp.join("d/old"), b"old").unwrap();
    });
    // B looks first, so its listing, attributes and names are cached.
    now(lists(&p.b.p("d"), &["old"]));
    now(gone(&p.b.p("d/new")));
    let data = bytes(1, 70_000);
    put(&p.a.p("d/new"), &data);
    std::fs::create_dir(p.a.p("d/sub")).unwrap();
    assert_soon("B sees the file A created", || {
        has_content(&p.b.p("d/new"), &data)
    });
    assert_soon("B's listing shows what A created", || {
        lists(&p.b.p("d"), &["new", "old", "sub"])
    });
    assert!(std::fs::metadata(p.b.p("d/sub")).unwrap().is_dir());
}

#[test]
fn a_write_closed_on_a_is_seen_by_b_in_size_and_content() {
    let v1 = bytes(2, 50_000);
    let p = pair(|exp| std::fs::write(exp.join("f"), &v1).unwrap());
    now(has_content(&p.b.p("f"), &v1));
    // New content of a new length.
    let v2 = bytes(3, 80_001);
    put(&p.a.p("f"), &v2);
    assert_soon("B sees A's rewrite", || has_content(&p.b.p("f"), &v2));
    // Same size, bytes changed in place.
    let f = OpenOptions::new().write(true).open(p.a.p("f")).unwrap();
    f.write_all_at(b"PATCHED", 1234).unwrap();
    close_checked(f).unwrap();
    let mut v3 = v2.clone();
    v3[1234..1241].copy_from_slice(b"PATCHED");
    assert_soon("B sees A's in-place change", || {
        has_content(&p.b.p("f"), &v3)
    });
    // Appended: B's stat alone (no open) shows the new size.
    let mut f = OpenOptions::new().append(true).open(p.a.p("f")).unwrap();
    f.write_all(b"0123456789").unwrap();
    close_checked(f).unwrap();
    let want = v3.len() as u64 + 10;
    assert_soon("B's stat shows A's append", || {
        match std::fs::metadata(p.b.p("f")) {
            Ok(md) if md.len() == want => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

#[test]
fn rename_and_unlink_on_a_are_seen_by_b() {
    let data = bytes(4, 30_000);
    let p = pair(|exp| {
        std::fs::create_dir(exp.join("d1")).unwrap();
        std::fs::create_dir(exp.join("d2")).unwrap();
        std::fs::write(exp.join("d1/f"), &data).unwrap();
        std::fs::write(exp.join("d1/t"), b"old target").unwrap();
    });
    now(has_content(&p.b.p("d1/f"), &data));
    now(has_content(&p.b.p("d1/t"), b"old target"));
    now(lists(&p.b.p("d1"), &["f", "t"]));
    now(lists(&p.b.p("d2"), &[]));

    std::fs::rename(p.a.p("d1/f"), p.a.p("d2/g")).unwrap();
    assert_soon("B: old name gone", || gone(&p.b.p("d1/f")));
    assert_soon("B: new name", || has_content(&p.b.p("d2/g"), &data));
    assert_soon("B: source listing", || lists(&p.b.p("d1"), &["t"]));
    assert_soon("B: target listing", || lists(&p.b.p("d2"), &["g"]));

    // Save by rename over an existing file (what editors do).
    put(&p.a.p("d1/t.tmp"), b"new target content");
    std::fs::rename(p.a.p("d1/t.tmp"), p.a.p("d1/t")).unwrap();
    assert_soon("B: replaced file", || {
        has_content(&p.b.p("d1/t"), b"new target content")
    });
    assert_soon("B: listing after replace", || lists(&p.b.p("d1"), &["t"]));

    std::fs::remove_file(p.a.p("d2/g")).unwrap();
    assert_soon("B: unlinked name gone", || gone(&p.b.p("d2/g")));
    assert_soon("B: listing after unlink", || lists(&p.b.p("d2"), &[]));
}

#[test]
fn changes_made_on_the_server_disk_are_seen_by_both_clients() {
    let v1 = bytes(5, 40_000);
    let p = pair(|exp| {
        std::fs::write(exp.join("f"), &v1).unwrap();
        std::fs::create_dir(exp.join("d")).unwrap();
        std::fs::write(exp.join("d/doomed"), b"doomed").unwrap();
    });
    for m in [&p.a, &p.b] {
        now(has_content(&m.p("f"), &v1));
        now(has_content(&m.p("d/doomed"), b"doomed"));
        now(lists(&m.p("d"), &["doomed"]));
    }
    let v2 = bytes(6, 65_432);
    std::fs::write(p.exp.join("f"), &v2).unwrap();
    for (c, m) in [("A", &p.a), ("B", &p.b)] {
        assert_soon(&format!("{c} sees the server-side rewrite"), || {
            has_content(&m.p("f"), &v2)
        });
    }
    let f = OpenOptions::new()
        .write(true)
        .open(p.exp.join("f"))
        .unwrap();
    f.write_all_at(b"in place", 100).unwrap();
    drop(f);
    let mut v3 = v2.clone();
    v3[100..108].copy_from_slice(b"in place");
    for (c, m) in [("A", &p.a), ("B", &p.b)] {
        assert_soon(&format!("{c} sees the server-side in-place write"), || {
            has_content(&m.p("f"), &v3)
        });
    }
    std::fs::write(p.exp.join("d/born"), b"born on the server").unwrap();
    std::fs::remove_file(p.exp.join("d/doomed")).unwrap();
    for (c, m) in [("A", &p.a), ("B", &p.b)] {
        assert_soon(&format!("{c} sees the server-side create"), || {
            has_content(&m.p("d/born"), b"born on the server")
        });
        assert_soon(&format!("{c} sees the server-side unlink"), || {
            gone(&m.p("d/doomed"))
        });
        assert_soon(&format!("{c}'s listing follows the server"), || {
            lists(&m.p("d"), &["born"])
        });
    }
}

#[test]
fn concurrent_writers_on_a_and_b_keep_both_files_intact() {
    let p = pair(|exp| std::fs::create_dir(exp.join("shared")).unwrap());
    let (da, db) = (bytes(7, 8 << 20), bytes(8, (8 << 20) + 333));
    let small = |c: &str, i: usize| {
        let b = usize::from(c == "b");
        bytes((1000 + 100 * b + i) as u64, 100 + i * 37 + b * 11)
    };
    std::thread::scope(|s| {
        for (c, m, data) in [("a", &p.a, &da), ("b", &p.b, &db)] {
            s.spawn(move || {
                let mut f = File::create(m.p(&format!("{c}.bin"))).unwrap();
                for piece in data.chunks(64 << 10) {
                    f.write_all(piece).unwrap();
                }
                close_checked(f).unwrap();
                for i in 0..50 {
                    put(&m.p(&format!("shared/{c}-{i:02}")), &small(c, i));
                }
            });
        }
    });
    let hash = |d: &[u8]| xxhash_rust::xxh3::xxh3_64(d);
    assert_eq!(hash_file(&p.exp.join("a.bin")), hash(&da), "server a.bin");
    assert_eq!(hash_file(&p.exp.join("b.bin")), hash(&db), "server b.bin");
    assert_soon("A sees B's file", || has_content(&p.a.p("b.bin"), &db));
    assert_soon("B sees A's file", || has_content(&p.b.p("a.bin"), &da));
    let names: Vec<String> = ["a", "b"]
        .iter()
        .flat_map(|c| (0..50).map(move |i| format!("{c}-{i:02}")))
        .collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for (c, m) in [("A", &p.a), ("B", &p.b)] {
        assert_soon(&format!("{c} lists all 100 files"), || {
            lists(&m.p("shared"), &names)
        });
        for n in &names {
            let (w, i) = n.split_once('-').unwrap();
            now(has_content(
                &m.p(&format!("shared/{n}")),
                &small(w, i.parse().unwrap()),
            ));
        }
    }
}

#[test]
fn truncate_then_extend_on_a_is_seen_on_b() {
    let orig = bytes(9, 3 << 20);
    let p = pair(|exp| std::fs::write(exp.join("f"), &orig).unwrap());
    now(has_content(&p.b.p("f"), &orig)); // B has every byte cached
    let f = OpenOptions::new().write(true).open(p.a.p("f")).unwrap();
    f.set_len(1000).unwrap();
    f.set_len(2_500_000).unwrap();
    close_checked(f).unwrap();
    let mut want = orig[..1000].to_vec();
    want.resize(2_500_000, 0);
    assert_soon("B sees the truncated and extended file", || {
        has_content(&p.b.p("f"), &want)
    });
    drop_caches();
    now(has_content(&p.b.p("f"), &want));
    assert_eq!(
        hash_file(&p.exp.join("f")),
        xxhash_rust::xxh3::xxh3_64(&want)
    );
}

#[test]
fn an_unchanged_file_rereads_on_b_without_contacting_the_server() {
    let data = bytes(10, (3 << 20) + 5);
    let p = pair(|exp| {
        std::fs::write(exp.join("f"), &data).unwrap();
        std::fs::write(exp.join("other"), b"other").unwrap();
    });
    now(has_content(&p.b.p("f"), &data));

    // Opens and stats under a valid callback are answered locally.
    const ROUNDS: u64 = 30;
    let before = p.srv.counters();
    for _ in 0..ROUNDS {
        now(has_content(&p.b.p("f"), &data)); // stat, open, read, close
    }
    let after = p.srv.counters();
    assert_eq!(after.reads, before.reads, "re-reads sent read requests");
    assert_eq!(after.bytes_read, before.bytes_read, "re-reads fetched data");
    let requests = after.requests - before.requests;
    assert!(
        requests < ROUNDS / 3,
        "{ROUNDS} stat+open+read rounds of an unchanged file sent {requests} requests \
         (opens under a valid callback must not ask the server)"
    );

    // Neither dropped page caches nor changes to other files invalidate it.
    let before = p.srv.counters();
    for i in 0..3 {
        put(&p.a.p("other"), &bytes(20 + i, 1000 + i as usize));
        drop_caches();
        now(has_content(&p.b.p("f"), &data));
    }
    let after = p.srv.counters();
    assert_eq!(
        after.bytes_read, before.bytes_read,
        "B fetched an unchanged file again"
    );
    assert_eq!(
        after.reads, before.reads,
        "B sent reads for an unchanged file"
    );
}
