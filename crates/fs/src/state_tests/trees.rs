//! Listings read ahead of a walk (`crate::trees`): a walk over a tree costs a few subtree
//! requests instead of one listing per directory, and what is read ahead is never served
//! once it may be out of date (a break, a change made through this client, the TTL).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hoardfs_origin::{Break, FileKind, Owner};

use super::{Rig, config};
use crate::{FsConfig, Ino, ROOT_INO};

/// An export of `fanout` directories of `fanout` directories, each with two files.
fn tree(fanout: usize) -> Vec<(String, Vec<u8>)> {
    let mut files = Vec::new();
    for i in 0..fanout {
        for j in 0..fanout {
            for f in ["x", "y"] {
                files.push((format!("d{i}/e{j}/{f}"), f.as_bytes().to_vec()));
            }
        }
    }
    files
}

fn rig(fanout: usize, callbacks: bool, config: FsConfig) -> Rig {
    let r = Rig::new(&[], callbacks, false, config);
    for (path, bytes) in tree(fanout) {
        let p = r.export.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }
    r.origin.trees.store(true, Ordering::SeqCst);
    r
}

/// Names in directory `path` of the export.
fn on_disk(path: &Path) -> BTreeSet<Vec<u8>> {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_encoded_bytes())
        .collect()
}

/// Lists `ino` (at `path` in the export) and everything below it as `ls -R` does, each
/// listing handed to the "kernel" with its attributes; checks every listing against the
/// export. Returns the directories listed.
fn walk(r: &Rig, ino: Ino, path: &Path) -> usize {
    let l = r.fs.listing(ino).unwrap();
    let names: BTreeSet<Vec<u8>> = l.entries.iter().map(|e| e.name.clone()).collect();
    assert_eq!(names, on_disk(path), "listing of {}", path.display());
    let mut dirs = 1;
    for e in &l.entries {
        let n = r.fs.remember_entry(ino, &l, e);
        if e.entry.attr.kind == FileKind::Dir {
            let name = String::from_utf8(e.name.clone()).unwrap();
            dirs += walk(r, n.ino, &path.join(name));
        }
    }
    dirs
}

fn counts(r: &Rig) -> (usize, usize) {
    (
        r.origin.readdirs.load(Ordering::SeqCst),
        r.origin.tree_requests.load(Ordering::SeqCst),
    )
}

#[test]
fn a_walk_costs_a_few_subtree_requests_instead_of_one_listing_per_directory() {
    let r = rig(8, true, config(Duration::ZERO));
    r.fs.getattr(ROOT_INO).unwrap();
    let dirs = walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(dirs, 1 + 8 + 64);
    let (readdirs, trees) = counts(&r);
    // The first listing is one on its own; the second makes a walk, whose first request
    // (1,024 entries) covers this whole tree of 73 directories and 200 entries.
    assert_eq!((readdirs, trees), (1, 1), "listings, subtree requests");
    // All but the root's and the second directory's (the reply to its own request).
    assert_eq!(r.fs.stats().listings_read_ahead, 71);
    // Listed once, the listings stay under their callbacks.
    walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(counts(&r), (1, 1));

    // The same walk over an origin without subtree requests: one listing per directory.
    let plain = rig(8, true, config(Duration::ZERO));
    plain.origin.trees.store(false, Ordering::SeqCst);
    walk(&plain, ROOT_INO, &plain.export.clone());
    assert_eq!(counts(&plain), (73, 0));
}

#[test]
fn a_large_walk_asks_for_growing_subtrees_and_lists_everything_right() {
    // 1 + 40 + 1,600 directories and 4,840 entries: more than the first request's 1,024.
    let _heavy = super::many_descriptors();
    let r = rig(40, true, config(Duration::ZERO));
    let dirs = walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(dirs, 1 + 40 + 1600);
    let (readdirs, trees) = counts(&r);
    // A request asks from the parent of the directory that missed: at most one per
    // top-level directory here, where one per directory was 1,641.
    assert!(
        trees <= 41 && readdirs <= 2,
        "{readdirs} listings and {trees} subtree requests for {dirs} directories"
    );
}

#[test]
fn a_listing_read_ahead_is_not_served_after_a_break_of_its_directory() {
    let r = rig(3, true, config(Duration::ZERO));
    let root = r.fs.listing(ROOT_INO).unwrap();
    let inos: Vec<(Ino, u64)> = root
        .entries
        .iter()
        .map(|e| {
            (
                r.fs.remember_entry(ROOT_INO, &root, e).ino,
                e.entry.attr.file_id,
            )
        })
        .collect();
    let d0 = root.entries.iter().position(|e| e.name == b"d0").unwrap();
    let d1 = root.entries.iter().position(|e| e.name == b"d1").unwrap();
    // Listing d0 makes a walk: d1's listing is read ahead.
    r.fs.listing(inos[d0].0).unwrap();
    assert_eq!(counts(&r).1, 1);
    // Another client adds a name to d1; the server breaks d1's callback.
    std::fs::write(r.export.join("d1/new"), b"n").unwrap();
    r.break_and_wait(
        Break::Attr {
            file_id: inos[d1].1,
            change_id: 0,
        },
        inos[d1].0,
    );
    let l = r.fs.listing(inos[d1].0).unwrap();
    assert!(l.entries.iter().any(|e| e.name == b"new"), "fetched again");
    assert_eq!(r.fs.stats().listings_read_ahead, 0);
}

#[test]
fn a_listing_read_ahead_is_not_served_after_a_change_made_here() {
    let r = rig(3, true, config(Duration::ZERO));
    let root = r.fs.listing(ROOT_INO).unwrap();
    let ino = |name: &[u8]| {
        let e = root.entries.iter().find(|e| e.name == name).unwrap();
        r.fs.remember_entry(ROOT_INO, &root, e).ino
    };
    let (d0, d1) = (ino(b"d0"), ino(b"d1"));
    r.fs.listing(d0).unwrap();
    assert_eq!(counts(&r).1, 1);
    // This client's own change: the origin sends it no break.
    r.fs.mkdir(d1, b"made-here", 0o755, Owner::default())
        .unwrap();
    let l = r.fs.listing(d1).unwrap();
    assert!(l.entries.iter().any(|e| e.name == b"made-here"));
    assert_eq!(on_disk(&r.export.join("d1")).len(), l.entries.len());
}

#[test]
fn without_callbacks_a_listing_read_ahead_lasts_the_directory_ttl() {
    let long = config(Duration::from_secs(600));
    let r = rig(4, false, long);
    walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(counts(&r), (1, 1), "read ahead within the TTL");

    // With a TTL of zero nothing read ahead could be used: no subtree request is made.
    let r = rig(4, false, config(Duration::ZERO));
    walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(counts(&r), (21, 0));
}

#[test]
fn a_walk_starts_from_the_parent_unless_the_parent_is_large() {
    let r = rig(2, true, config(Duration::ZERO));
    let root_id = r.fs.cached_attr(ROOT_INO).unwrap().file_id;
    walk(&r, ROOT_INO, &r.export.clone());
    assert_eq!(*r.origin.tree_tops.lock(), [root_id], "from the small root");

    let r = rig(2, true, config(Duration::ZERO));
    for i in 0..300 {
        std::fs::write(r.export.join(format!("file{i}")), b"").unwrap();
    }
    let root = r.fs.listing(ROOT_INO).unwrap();
    let d0 = root.entries.iter().find(|e| e.name == b"d0").unwrap();
    let d0_id = d0.entry.attr.file_id;
    let d0 = r.fs.remember_entry(ROOT_INO, &root, d0).ino;
    r.fs.listing(d0).unwrap();
    // The root's 302 entries would be more than a quarter of the 1,024 asked for.
    assert_eq!(
        *r.origin.tree_tops.lock(),
        [d0_id],
        "from the directory itself"
    );
}

/// The root listed, then `d0`: a walk whose subtree request (from the root) kept the
/// listings of the other directories. Returns the inodes and file ids of `d0`..`dN`.
fn walk_started(r: &Rig) -> Vec<(Ino, u64)> {
    let root = r.fs.listing(ROOT_INO).unwrap();
    let mut dirs: Vec<(Vec<u8>, Ino, u64)> = root
        .entries
        .iter()
        .filter(|e| e.entry.attr.kind == FileKind::Dir)
        .map(|e| {
            let n = r.fs.remember_entry(ROOT_INO, &root, e);
            (e.name.clone(), n.ino, e.entry.attr.file_id)
        })
        .collect();
    dirs.sort();
    r.fs.listing(dirs[0].1).unwrap();
    assert_eq!(counts(r).1, 1, "one subtree request");
    dirs.into_iter().map(|(_, i, f)| (i, f)).collect()
}

#[test]
fn a_lost_connection_voids_every_listing_read_ahead() {
    let r = rig(3, true, config(Duration::ZERO));
    let dirs = walk_started(&r);
    std::fs::write(r.export.join("d2/new"), b"n").unwrap();
    // What a client hears when its connection drops (its callbacks are gone with it).
    r.break_and_wait(Break::All, dirs[2].0);
    let l = r.fs.listing(dirs[2].0).unwrap();
    assert!(l.entries.iter().any(|e| e.name == b"new"));
    assert_eq!(r.fs.stats().listings_read_ahead, 0);
}

#[test]
fn without_callbacks_a_listing_read_ahead_needs_its_directory_unchanged() {
    let r = rig(3, false, config(Duration::from_secs(600)));
    let dirs = walk_started(&r);
    // d1 is listed from what was read ahead; d2 changed since, and its node says so.
    r.fs.listing(dirs[1].0).unwrap();
    assert_eq!(r.fs.stats().listings_read_ahead, 1);
    std::fs::write(r.export.join("d2/new"), b"n").unwrap();
    r.fs.sb.expire_attr(&r.fs.sb.node(dirs[2].0).unwrap());
    r.fs.getattr(dirs[2].0).unwrap();
    let l = r.fs.listing(dirs[2].0).unwrap();
    assert!(l.entries.iter().any(|e| e.name == b"new"), "fetched again");
    assert_eq!(r.fs.stats().listings_read_ahead, 1);
}

#[test]
fn a_parent_that_cannot_be_walked_leaves_its_directories_listable() {
    let r = rig(3, true, config(Duration::ZERO));
    let root_id = r.fs.cached_attr(ROOT_INO).unwrap().file_id;
    *r.origin.tree_refused.lock() = Some(root_id);
    let root = r.fs.listing(ROOT_INO).unwrap();
    let d0 = root.entries.iter().find(|e| e.name == b"d0").unwrap();
    let d0 = r.fs.remember_entry(ROOT_INO, &root, d0).ino;
    let l = r.fs.listing(d0).unwrap();
    assert_eq!(l.entries.len(), 3, "e0, e1, e2");
    assert_eq!(
        *r.origin.tree_tops.lock(),
        [root_id],
        "tried from the root first"
    );
}
