//! Metadata at scale through a real mount: what `ls -lR` costs in server round trips cold,
//! warm and after a remount (a walk lists subtrees in one request each), and that large
//! directories list completely.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::rig::{Rig, rig_with};
use common::*;

/// Requests one `Server::counters` query costs the server itself (hello + counters).
const QUERY_COST: u64 = 2;

/// Server requests made while `f` ran (the counter queries themselves not counted).
fn requests_during(srv: &Server, f: impl FnOnce()) -> u64 {
    let before = srv.counters().requests;
    f();
    srv.counters().requests - before - QUERY_COST
}

/// `dirs` directories (a root holding `dirs - 1` subdirectories, every directory with
/// three files) under `root`.
fn make_source_tree(root: &Path, dirs: usize) {
    let mut all = vec![root.to_path_buf()];
    for i in 0..dirs - 1 {
        all.push(root.join(format!("d{:02}", i % 7)).join(format!("s{i:03}")));
    }
    for (n, d) in all.iter().enumerate() {
        std::fs::create_dir_all(d).unwrap();
        for f in 0..3 {
            let len = 100 + 37 * (n * 3 + f);
            std::fs::write(
                d.join(format!("f{f}.c")),
                bytes(n as u64 * 3 + f as u64, len),
            )
            .unwrap();
        }
    }
}

/// `ls -lR` in Rust: every directory's names, each entry's type, size, mode and mtime,
/// in a canonical order (relative paths), so a mount and its export can be compared.
fn ls_lr(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                stack.push(p.clone());
            }
            out.push(format!(
                "{} {:o} {} {} {}",
                p.strip_prefix(root).unwrap().display(),
                m.mode(),
                if m.is_dir() { 0 } else { m.size() },
                m.mtime(),
                m.mtime_nsec()
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn ls_lr_costs_a_few_round_trips_cold_and_after_a_remount_and_none_warm() {
    const DIRS: u64 = 60;
    let mut r = rig_with(
        |exp| make_source_tree(&exp.join("src"), DIRS as usize),
        &[],
        &[],
    );
    let exp = r.exp.clone();
    let want = ls_lr(&exp.join("src"));
    assert_eq!(want.len() as u64, DIRS - 1 + DIRS * 3 + 7);

    let spent = |r: &Rig, f: &dyn Fn(&Mount)| requests_during(&r.srv, || f(&r.m));
    // Cold: a lookup of "src", its listing, then one subtree request (the second listing
    // makes a walk) that brings the other 66 directories' listings with their attributes.
    // (One READDIRPLUS per directory would be 67.)
    let cold = spent(&r, &|m| {
        assert_eq!(ls_lr(&m.p("src")), want, "cold listing")
    });
    assert!(cold <= 5, "cold ls -lR: {cold} requests for 67 dirs");
    // Warm, under callbacks: the kernel answers from its own caches.
    let warm = spent(&r, &|m| {
        assert_eq!(ls_lr(&m.p("src")), want, "warm listing")
    });
    assert_eq!(warm, 0, "warm ls -lR reached the server");

    // After a remount: the same few round trips.
    r.remount(&[]);
    let again = spent(&r, &|m| {
        assert_eq!(ls_lr(&m.p("src")), want, "listing after remount")
    });
    let m = &r.m;
    assert!(again <= 5, "ls -lR after remount: {again} requests");

    // A change on the server shows in the next listing, also in a directory whose listing
    // came in a subtree reply (the server holds callbacks for everything in it; the
    // kernel's cached copy of the directory is dropped by the break).
    for new in ["src/d03/new.c", "src/d03/s003/new.c"] {
        std::fs::write(exp.join(new), b"new").unwrap();
        let rel = new.strip_prefix("src/").unwrap();
        assert_soon("new file listed", || {
            let l = ls_lr(&m.p("src"));
            if l.iter().any(|x| x.starts_with(&format!("{rel} "))) {
                Ok(())
            } else {
                Err(format!("{rel} missing"))
            }
        });
    }
    assert_eq!(ls_lr(&m.p("src")), ls_lr(&exp.join("src")));
}

#[test]
fn a_directory_larger_than_one_readdir_reply_lists_completely() {
    let r = rig_with(
        |exp| {
            let big = exp.join("big");
            std::fs::create_dir_all(&big).unwrap();
            // Long names: the kernel fetches this in many 4 KiB READDIRPLUS replies.
            for i in 0..3000 {
                std::fs::write(big.join(format!("{i:05}-{}", "n".repeat(100))), b"").unwrap();
            }
        },
        &[],
        &[],
    );
    let (m, srv) = (&r.m, &r.srv);
    // Both sorted by name.
    let want = list(&r.srv("big")).unwrap();
    for pass in 0..2 {
        let got = list(&m.p("big")).unwrap();
        assert_eq!(got.len(), want.len(), "pass {pass}: entry count");
        assert_eq!(got, want, "pass {pass}");
    }
    // Every page of the listing came with attributes (READDIRPLUS, not the kernel's
    // "auto" choice of plain READDIR after the first page): opening each listed file
    // needs no LOOKUP round trip.
    let spent = requests_during(srv, || {
        for name in &want {
            let name = std::str::from_utf8(name).unwrap();
            std::fs::File::open(m.p(&format!("big/{name}"))).unwrap();
        }
    });
    assert_eq!(
        spent,
        0,
        "server requests to open {} listed files",
        want.len()
    );
}

/// A server's table of handles is bounded by its open-file limit (one descriptor per
/// handle). A directory with more entries than the table holds still lists completely,
/// and every listed file can be read: the directory being listed stays known while its
/// listing hands out handles, and entries whose handles were forgotten are looked up again.
#[test]
fn a_directory_longer_than_the_servers_handle_table_lists_completely() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let big = exp.join("big");
    std::fs::create_dir_all(&big).unwrap();
    for i in 0..2000 {
        std::fs::write(big.join(format!("f{i:05}")), format!("{i}")).unwrap();
    }
    // 1024 descriptors leave about 160 handles.
    let srv = Server::start_with_nofile(&exp, 1024);
    let m = Mount::start(&srv.addr, &t.path().join("mnt"), &["--no-cache"]).unwrap();
    let want = list(&big).unwrap();
    let got = list(&m.p("big")).unwrap();
    assert_eq!(got.len(), 2000, "entry count");
    assert_eq!(got, want);
    for i in (0..2000).step_by(97) {
        let body = std::fs::read(m.p(&format!("big/f{i:05}"))).unwrap();
        assert_eq!(body, format!("{i}").as_bytes(), "f{i:05}");
    }
}
