//! Listings of `hoardfs mount s3://…` and `hoardfs serve --origin s3://…` at scale, against
//! a real 3-node Garage cluster: walks of many prefixes cost a listing per 1,000 keys, not
//! one per directory (also under a parent of thousands of prefixes); listings past their
//! TTL are answered while they are listed again in the background; a tier watches the
//! directories its clients use a subtree at a time.

mod common;

use std::path::Path;
use std::time::Duration;

use common::garage::Garage;
use common::*;

/// Every path under `root` (relative, sorted) with a file's bytes, walked as `ls -R`
/// walks: each directory listed, then its subdirectories.
fn walk_tree(root: &std::path::Path) -> Vec<(String, Option<Vec<u8>>)> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        let mut names: Vec<_> = std::fs::read_dir(&d)
            .unwrap_or_else(|e| panic!("{}: {e}", d.display()))
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for p in names {
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                out.push((rel, None));
                dirs.push(p);
            } else {
                out.push((rel, Some(std::fs::read(&p).unwrap())));
            }
        }
    }
    out.sort();
    out
}

/// `n` prefixes `p0000/` … under `src`, each with `files` files `f0` … holding "I.J".
fn write_prefixes(src: &Path, n: usize, files: usize) {
    for i in 0..n {
        let d = src.join(format!("p{i:04}"));
        std::fs::create_dir_all(&d).unwrap();
        for j in 0..files {
            std::fs::write(d.join(format!("f{j}")), format!("{i}.{j}")).unwrap();
        }
    }
}

/// Puts the tree at `src` under `prefix` with rclone (another S3 client).
fn copy_up(g: &Garage, src: &Path, prefix: &str) {
    let out = g
        .rclone(0)
        .arg("copy")
        .arg(src)
        .arg(g.remote(prefix))
        .output()
        .unwrap();
    assert!(out.status.success(), "rclone copy: {out:?}");
}

#[test]
fn a_walk_of_many_prefixes_costs_a_listing_per_thousand_keys_not_one_per_directory() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let t = scratch();
    let src = t.path().join("src");
    for i in 0..5 {
        for j in 0..6 {
            let d = src.join(format!("d{i}/s{j}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("f"), format!("{i}.{j}")).unwrap();
        }
    }
    std::fs::write(src.join("top"), b"top").unwrap();
    copy_up(&g, &src, "walk");
    let (mnt, cache) = (t.path().join("m"), t.path().join("c"));
    let m = g.mount(0, "", &mnt, &cache, &[]).unwrap();
    let lists = g.s3_requests("ListObjectsV2");
    assert_eq!(walk_tree(&m.p("walk")), walk_tree(&src));
    // 36 directories: the lookups and the first listing one by one, then one listing of
    // every key under the walk's top serves the rest.
    let spent = g.s3_requests("ListObjectsV2") - lists;
    assert!(spent <= 8, "{spent} listings for a walk of 36 directories");
    // Repeated once the listings have expired (the metadata TTL is 1 s: only time passing
    // expires them), the walk revalidates the names a subtree at a time.
    std::thread::sleep(Duration::from_millis(1500));
    let lists = g.s3_requests("ListObjectsV2");
    assert_eq!(walk_tree(&m.p("walk")), walk_tree(&src));
    let again = g.s3_requests("ListObjectsV2") - lists;
    assert!(
        again <= 8,
        "{again} listings for the walk repeated after the TTL"
    );
    // A key put by another client shows within the TTL (1 s), read ahead or not.
    g.put("walk/d4/s5/new", b"new");
    assert_soon("the new key is listed", || {
        let names = list(&m.p("walk/d4/s5")).map_err(|e| e.to_string())?;
        if names.iter().any(|n| n == b"new") {
            Ok(())
        } else {
            Err(format!("{} names", names.len()))
        }
    });
    m.unmount();
}

#[test]
fn a_tier_watches_many_directories_at_a_listing_per_thousand_keys_a_round() {
    // 40 prefixes used by a client of a tier: every period the tier lists them again to
    // turn outside changes into callbacks, in one listing of their subtree, not 40.
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let t = scratch();
    let src = t.path().join("src");
    write_prefixes(&src, 40, 1);
    copy_up(&g, &src, "w");
    let tier = g.serve_tier(0, &t.path().join("tier"), &["--metadata-ttl", "0.5"]);
    let a = Mount::with_cache(
        &tier.addr,
        &t.path().join("a"),
        &t.path().join("ca"),
        &["--insecure-plaintext"],
    );
    for i in 0..40 {
        assert_eq!(list(&a.p(&format!("w/p{i:04}"))).unwrap().len(), 1);
        let f = a.p(&format!("w/p{i:04}/f0"));
        assert_eq!(read_errno(&f).unwrap(), format!("{i}.0").as_bytes());
    }
    let lists = g.s3_requests("ListObjectsV2");
    std::thread::sleep(Duration::from_secs(3));
    let spent = g.s3_requests("ListObjectsV2") - lists;
    // About six rounds of 42 watched directories: a listing or two each (one per
    // directory would be about 250).
    assert!(
        spent <= 20,
        "{spent} listings in 3 s to watch 42 directories"
    );
    // And the watch still sees another client's change.
    g.put("w/p0033/f0", b"changed");
    assert_soon("the client sees the outside change", || {
        has_content(&a.p("w/p0033/f0"), b"changed")
    });
}

#[test]
fn a_walk_under_a_parent_of_thousands_of_prefixes_lists_them_a_page_at_a_time() {
    // A dataset laid out as 4,200 prefixes of one object: too many for the client to
    // ask for the parent's subtree with each request, so it asks directory by directory;
    // each directory is listed with the siblings after it.
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let t = scratch();
    let src = t.path().join("src");
    const N: usize = 4200;
    write_prefixes(&src, N, 1);
    let out = g
        .rclone(0)
        .args(["copy", "--transfers", "32"])
        .arg(&src)
        .arg(g.remote("wide"))
        .output()
        .unwrap();
    assert!(out.status.success(), "rclone copy: {out:?}");
    let (mnt, cache) = (t.path().join("m"), t.path().join("c"));
    let m = g
        .mount(0, "", &mnt, &cache, &["--metadata-ttl", "60"])
        .unwrap();
    let lists = g.s3_requests("ListObjectsV2");
    let ls = std::process::Command::new("ls")
        .arg("-lR")
        .arg(m.p("wide"))
        .output()
        .unwrap();
    assert!(ls.status.success(), "ls -lR: {ls:?}");
    let text = String::from_utf8_lossy(&ls.stdout);
    let files = text.lines().filter(|l| l.ends_with(" f0")).count();
    assert_eq!(files, N, "every prefix's object listed");
    let spent = g.s3_requests("ListObjectsV2") - lists;
    // The parent (5 pages) and about one page per 1,000 keys after: one listing per
    // directory would be 4,200.
    assert!(
        spent <= 40,
        "{spent} listings for a walk of {N} directories"
    );
    m.unmount();
}

#[test]
fn listings_past_their_ttl_are_answered_while_revalidated_in_the_background() {
    // 40 prefixes of 3 objects, read, then read again past the TTL: no reader waits for
    // a listing, the revalidation costs far fewer listings than there are directories,
    // and a change made by another client shows within the staleness bound.
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let t = scratch();
    let src = t.path().join("src");
    write_prefixes(&src, 40, 3);
    copy_up(&g, &src, "ds");
    let (mnt, cache) = (t.path().join("m"), t.path().join("c"));
    let args = ["--metadata-ttl", "0.5", "--metadata-max-stale", "30"];
    let m = g.mount(0, "", &mnt, &cache, &args).unwrap();
    let read_all = |m: &Mount| {
        for i in 0..40 {
            for j in 0..3 {
                let p = m.p(&format!("ds/p{i:04}/f{j}"));
                assert_eq!(read_errno(&p).unwrap(), format!("{i}.{j}").as_bytes());
            }
        }
    };
    read_all(&m);
    std::thread::sleep(Duration::from_millis(1200));
    let lists = g.s3_requests("ListObjectsV2");
    read_all(&m);
    let st = stats(&m)["listings"].clone();
    assert_eq!(st["waited"], 0, "a reader waited for a listing: {st}");
    assert!(st["stale_served"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["max_stale_secs"], 30.0, "{st}");
    // The background revalidation settles: one listing of the subtree (120 keys), give
    // or take the first directories listed before the others were queued.
    assert!(
        wait_until(Duration::from_secs(5), || stats(&m)["listings"]["queued"]
            == 0),
        "the revalidation did not settle: {}",
        stats(&m)["listings"]
    );
    let spent = g.s3_requests("ListObjectsV2") - lists;
    assert!(spent <= 10, "{spent} listings to revalidate 40 directories");
    // Another client's overwrite is seen by a reader within the bound (here it is seen
    // within the TTL and a listing, as the directory is in use).
    g.put("ds/p0007/f1", b"changed");
    if let Err(last) = reads_within(&m.p("ds/p0007/f1"), b"changed", 5) {
        panic!("the overwrite was not seen within 5 s: {last:?}");
    }
    g.put("ds/p0007/f1", b"7.1");
    if let Err(last) = reads_within(&m.p("ds/p0007/f1"), b"7.1", 5) {
        panic!("the second overwrite was not seen within 5 s: {last:?}");
    }
    // Directories in use are kept younger than the bound while nobody reads them: a
    // reader coming back after a pause longer than the bound waits for nothing.
    m.unmount();
    let args = ["--metadata-ttl", "0.3", "--metadata-max-stale", "1.5"];
    let m = g.mount(0, "", &mnt, &cache, &args).unwrap();
    read_all(&m);
    // (That first pass waited for listings older than the bound, kept by the last mount.)
    let waited = stats(&m)["listings"]["waited"].clone();
    let lists = g.s3_requests("ListObjectsV2");
    std::thread::sleep(Duration::from_secs(3));
    let idle = g.s3_requests("ListObjectsV2") - lists;
    read_all(&m);
    let st = stats(&m)["listings"].clone();
    assert_eq!(st["waited"], waited, "a reader waited after a pause: {st}");
    assert!(
        st["max_age_served_secs"].as_f64().unwrap() < 1.5,
        "answered from a listing past the bound: {st}"
    );
    // A listing of the 120 keys every 0.75 s or so, not one per directory.
    assert!(
        idle <= 12,
        "{idle} listings in 3 s to keep 41 directories fresh"
    );
    m.unmount();
    // With no window past the TTL, a reader past it waits for the store.
    let args = ["--metadata-ttl", "0.2", "--metadata-max-stale", "0.2"];
    let m = g.mount(0, "", &mnt, &cache, &args).unwrap();
    assert_eq!(read_errno(&m.p("ds/p0003/f0")).unwrap(), b"3.0");
    std::thread::sleep(Duration::from_millis(500));
    g.put("ds/p0003/f0", b"past the bound");
    assert_eq!(read_errno(&m.p("ds/p0003/f0")).unwrap(), b"past the bound");
    assert!(stats(&m)["listings"]["waited"].as_u64().unwrap() > 0);
    m.unmount();
}
