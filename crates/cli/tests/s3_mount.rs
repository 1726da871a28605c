//! `hoardfs mount s3://…` and `hoardfs serve --origin s3://…` against a real 3-node Garage
//! cluster (replication factor 3) on 127.0.0.1, with rclone as the independent S3 client
//! that puts and checks objects.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::garage::Garage;
use common::*;

/// Reads a whole file, or the error's errno.
/// Whether `p` reads as `want` within `secs` seconds; else what it read last.
fn reads_within(p: &Path, want: &[u8], secs: u64) -> Result<(), Result<Vec<u8>, i32>> {
    if wait_until(Duration::from_secs(secs), || {
        read(p).is_ok_and(|d| d == want)
    }) {
        Ok(())
    } else {
        Err(read(p))
    }
}

fn read(p: &std::path::Path) -> Result<Vec<u8>, i32> {
    std::fs::read(p).map_err(|e| e.raw_os_error().unwrap_or(-1))
}

#[test]
fn objects_read_and_list_as_the_store_has_them_and_survive_the_store_going_away() {
    require_fuse();
    let Some(mut g) = Garage::start_or_skip(3) else {
        return;
    };
    let big = bytes(1, 5 << 20);
    g.put("data/big.bin", &big);
    g.put("data/sub/a.txt", b"alpha");
    g.put("top.txt", b"top");
    g.put("prefetched/p.bin", &bytes(8, 3 << 20));
    // A directory marker, as `mkdir` in other tools makes (rclone cannot put one).
    let marker = g
        .curl()
        .args(["-X", "PUT", "--data-binary", "", "-w", "%{http_code}"])
        .arg(g.url(0, "empty-dir/"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&marker.stdout).trim(),
        "200",
        "{marker:?}"
    );
    let t = scratch();
    let (mnt, cache) = (t.path().join("m"), t.path().join("c"));
    let m = g.mount(0, "", &mnt, &cache, &[]).unwrap();
    assert_bytes_eq("cold read", &read(&m.p("data/big.bin")).unwrap(), &big);
    assert_eq!(read(&m.p("data/sub/a.txt")).unwrap(), b"alpha");
    let mut top = list(&m.path).unwrap();
    top.sort();
    assert_eq!(
        top,
        [
            b"data".to_vec(),
            b"empty-dir".to_vec(),
            b"prefetched".to_vec(),
            b"top.txt".to_vec()
        ]
    );
    assert!(m.p("empty-dir").is_dir(), "a marker object is a directory");
    assert!(list(&m.p("empty-dir")).unwrap().is_empty());
    assert_eq!(
        std::fs::metadata(m.p("data/big.bin")).unwrap().len(),
        5 << 20
    );
    assert_errno(
        "a missing key",
        std::fs::metadata(m.p("nope")),
        libc::ENOENT,
    );
    // Re-reads never reach the store.
    let gets = g.s3_requests("GetObject");
    drop_page_cache();
    assert_bytes_eq("hot read", &read(&m.p("data/big.bin")).unwrap(), &big);
    assert_eq!(
        g.s3_requests("GetObject"),
        gets,
        "a cached file was fetched again"
    );
    // `hoardfs prefetch` works on S3 mounts as on any other.
    let (ok, _, err) = tool(&["prefetch", m.p("prefetched").to_str().unwrap(), "-q"]);
    assert!(ok, "prefetch: {err}");
    m.unmount();

    // Every node down: a remount still lists what was listed and reads what was read.
    g.stop_all();
    let m = g
        .mount(0, "", &mnt, &cache, &["--timeout", "2"])
        .expect("mounts with the store down");
    let mut top = list(&m.path).unwrap();
    top.sort();
    assert_eq!(
        top,
        [
            b"data".to_vec(),
            b"empty-dir".to_vec(),
            b"prefetched".to_vec(),
            b"top.txt".to_vec()
        ]
    );
    assert_bytes_eq("offline read", &read(&m.p("data/big.bin")).unwrap(), &big);
    assert_eq!(read(&m.p("data/sub/a.txt")).unwrap(), b"alpha");
    assert_bytes_eq(
        "prefetched, never read",
        &read(&m.p("prefetched/p.bin")).unwrap(),
        &bytes(8, 3 << 20),
    );
    assert_eq!(
        read(&m.p("top.txt")),
        Err(libc::EIO),
        "never read, so not cached: an error, not wrong bytes"
    );
    m.unmount();
}

/// Two of three nodes down: the store answers 503 ("Could not reach quorum") through every
/// retry. A mount starts from its cache anyway, serves what it read, fails what it never
/// read promptly with EIO, and sees a new object once the nodes are back.
#[test]
fn a_mount_starts_from_its_cache_while_the_store_answers_503() {
    require_fuse();
    let Some(mut g) = Garage::start_or_skip(3) else {
        return;
    };
    let want = bytes(4, 200_000);
    g.put("q/read.bin", &want);
    g.put("q/unread.bin", b"never read");
    let t = scratch();
    let (mnt, cache) = (t.path().join("m"), t.path().join("c"));
    let args = ["--timeout", "5", "--metadata-ttl", "1"];
    let m = g.mount(0, "", &mnt, &cache, &args).unwrap();
    assert_bytes_eq(
        "read while healthy",
        &read(&m.p("q/read.bin")).unwrap(),
        &want,
    );
    m.unmount();
    g.kill(1);
    g.kill(2);
    let started = Instant::now();
    let m = g
        .mount(0, "", &mnt, &cache, &args)
        .expect("mounts while the store has no quorum");
    eprintln!("mounted without quorum in {:?}", started.elapsed());
    assert_bytes_eq("cached", &read(&m.p("q/read.bin")).unwrap(), &want);
    let asked = Instant::now();
    assert_eq!(read(&m.p("q/unread.bin")), Err(libc::EIO), "never read");
    assert!(
        asked.elapsed() < Duration::from_secs(60),
        "an uncached read waited {:?}",
        asked.elapsed()
    );
    g.start_again(1);
    g.start_again(2);
    g.wait_healthy();
    g.put("q/new.bin", b"after the outage");
    if let Err(last) = reads_within(&m.p("q/new.bin"), b"after the outage", 30) {
        panic!("the new object: {last:?}");
    }
    assert_eq!(read(&m.p("q/unread.bin")).unwrap(), b"never read");
    m.unmount();
}

#[test]
fn with_one_node_killed_uncached_reads_still_work() {
    require_fuse();
    let Some(mut g) = Garage::start_or_skip(3) else {
        return;
    };
    let want = bytes(2, 3 << 20);
    g.put("f.bin", &want);
    g.kill(2);
    let t = scratch();
    let m = g
        .mount(0, "", &t.path().join("m"), &t.path().join("c"), &[])
        .unwrap();
    assert_bytes_eq(
        "read with a node down",
        &read(&m.p("f.bin")).unwrap(),
        &want,
    );
    std::fs::write(m.p("new.txt"), b"written with a node down").unwrap();
    assert_eq!(g.get("new.txt"), b"written with a node down");
}

#[test]
fn an_overwrite_by_another_client_is_seen_within_the_ttl() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    g.put("doc.txt", b"version one");
    let t = scratch();
    let m = g
        .mount(
            0,
            "",
            &t.path().join("m"),
            &t.path().join("c"),
            &["--metadata-ttl", "0.5"],
        )
        .unwrap();
    assert_eq!(read(&m.p("doc.txt")).unwrap(), b"version one");
    g.put("doc.txt", b"version two, longer");
    g.put("added.txt", b"new");
    if let Err(last) = reads_within(&m.p("doc.txt"), b"version two, longer", 3) {
        panic!("the new object was not seen within 3 s (TTL 0.5 s): {last:?}");
    }
    assert!(
        wait_until(Duration::from_secs(3), || m.p("added.txt").exists()),
        "a new key was not listed within 3 s"
    );
    g.delete("doc.txt");
    assert!(
        wait_until(Duration::from_secs(3), || !m.p("doc.txt").exists()),
        "a deleted key still shows after 3 s"
    );
}

#[test]
fn files_written_through_the_mount_are_the_objects_in_the_bucket_after_close() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    g.put("existing.bin", &bytes(3, 1 << 20));
    let t = scratch();
    let m = g
        .mount(0, "", &t.path().join("m"), &t.path().join("c"), &[])
        .unwrap();
    // A new small file: one PUT at close.
    std::fs::write(m.p("small.txt"), b"hello s3").unwrap();
    assert_eq!(g.get("small.txt"), b"hello s3");
    // A process started while a file is being written closes its inherited copy of the
    // descriptor (a FLUSH from another pid): that must not publish half a file.
    {
        let mut f = std::fs::File::create(m.p("half.txt")).unwrap();
        f.write_all(b"first half, ").unwrap();
        assert!(
            std::process::Command::new("true")
                .status()
                .unwrap()
                .success()
        );
        assert!(
            !g.exists("half.txt"),
            "a forked child's close published the file"
        );
        f.write_all(b"second half").unwrap();
    }
    assert_eq!(g.get("half.txt"), b"first half, second half");
    // A large one: parts uploaded in parallel, completed at close.
    let large = bytes(4, 20 << 20);
    let parts = g.s3_requests("UploadPart");
    assert_errno(
        "a file in a directory that does not exist",
        std::fs::write(m.p("dir/x"), b""),
        libc::ENOENT,
    );
    std::fs::create_dir(m.p("dir")).unwrap();
    std::fs::write(m.p("dir/large.bin"), &large).unwrap();
    assert!(
        g.s3_requests("UploadPart") >= parts + 2,
        "not a multipart upload"
    );
    assert_bytes_eq("multipart object", &g.get("dir/large.bin"), &large);
    // A random write into an existing object replaces it whole, at close.
    let mut want = bytes(3, 1 << 20);
    want[1000..1005].copy_from_slice(b"XXXXX");
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .open(m.p("existing.bin"))
            .unwrap();
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"XXXXX", 1000).unwrap();
        f.flush().unwrap();
    }
    assert_bytes_eq("patched object", &g.get("existing.bin"), &want);
    assert_bytes_eq("read back", &read(&m.p("existing.bin")).unwrap(), &want);
    // Appends, renames (copy + delete), unlink, mkdir/rmdir.
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(m.p("small.txt"))
        .unwrap();
    f.write_all(b", again").unwrap();
    drop(f);
    assert_eq!(g.get("small.txt"), b"hello s3, again");
    std::fs::rename(m.p("small.txt"), m.p("dir/moved.txt")).unwrap();
    assert_eq!(g.get("dir/moved.txt"), b"hello s3, again");
    assert_errno(
        "renamed away",
        std::fs::metadata(m.p("small.txt")),
        libc::ENOENT,
    );
    std::fs::remove_file(m.p("dir/moved.txt")).unwrap();
    assert!(
        !String::from_utf8_lossy(
            &g.rclone(0)
                .args(["lsf", "-R", &g.remote("")])
                .output()
                .unwrap()
                .stdout
        )
        .contains("moved.txt"),
        "unlink deletes the object"
    );
    std::fs::create_dir(m.p("d2")).unwrap();
    assert!(m.p("d2").is_dir());
    std::fs::remove_dir(m.p("d2")).unwrap();
    assert!(!m.p("d2").exists());
    // `rm -r` of a directory with a marker, and of one that exists only through its keys.
    g.put("implicit/a/x", b"x");
    g.put("implicit/y", b"y");
    // Keys put elsewhere show within the metadata TTL.
    assert_soon("the keys put elsewhere show", || {
        (m.p("implicit/y").exists() && m.p("implicit/a/x").exists())
            .then_some(())
            .ok_or_else(|| "not yet".to_string())
    });
    std::fs::remove_dir_all(m.p("implicit")).unwrap();
    assert!(!m.p("implicit").exists());
    assert!(!g.exists("implicit/y"), "rm -r left objects behind");
    // What S3 cannot do is refused clearly.
    assert_errno(
        "directory rename",
        std::fs::rename(m.p("dir"), m.p("dir3")),
        libc::EXDEV,
    );
    assert_errno(
        "hard link",
        std::fs::hard_link(m.p("existing.bin"), m.p("hl")),
        libc::EPERM,
    );
}

#[test]
fn a_crash_during_an_upload_leaves_the_old_object_or_the_new_never_a_mix() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let old = bytes(5, 24 << 20);
    let new = bytes(6, 24 << 20);
    g.put("victim.bin", &old);
    let t = scratch();
    let m = g
        .mount(0, "", &t.path().join("m"), &t.path().join("c"), &[])
        .unwrap();
    let path = m.p("victim.bin");
    let writer = std::thread::spawn(move || {
        // The close uploads; the client dies during it (the close then fails).
        let _ = std::fs::write(path, &new);
    });
    let parts = g.s3_requests("UploadPart");
    assert!(
        wait_until(Duration::from_secs(30), || g.s3_requests("UploadPart")
            > parts),
        "the upload never started"
    );
    m.kill9();
    writer.join().unwrap();
    let now = g.get("victim.bin");
    assert!(
        now == old || now == bytes(6, 24 << 20),
        "the object is a mix: {} bytes, first difference from the old at {:?}, from the new at {:?}",
        now.len(),
        first_diff(&now, &old),
        first_diff(&now, &bytes(6, 24 << 20))
    );
}

/// Without --cache-dir, a tier keeps its cache in its state directory, one per origin.
#[test]
fn a_tier_keeps_its_cache_in_the_state_directory_by_default() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let want = bytes(9, 300_000);
    g.put("default-cache/f", &want);
    let t = scratch();
    let state = t.path().join("state");
    let tier = g.serve_tier_in(0, &state, &[]);
    let m = Mount::start(
        &tier.addr,
        &t.path().join("m"),
        &["--no-cache", "--insecure-plaintext"],
    )
    .unwrap();
    assert_bytes_eq(
        "through the tier",
        &read(&m.p("default-cache/f")).unwrap(),
        &want,
    );
    let caches: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tier-cache-"))
        .collect();
    assert_eq!(caches.len(), 1, "{caches:?}");
    let cache = state.join(&caches[0]);
    let held: u64 = walk_sizes(&cache);
    assert!(
        held >= want.len() as u64,
        "{held} bytes in {}",
        cache.display()
    );
}

/// Bytes of the regular files under `dir`.
fn walk_sizes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => walk_sizes(&e.path()),
                    Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Locks taken through two clients of one tier exclude each other: the tier keeps the
/// lock table, as a server of a directory does (issue 36).
#[test]
fn locks_hold_across_clients_of_one_tier() {
    use std::os::fd::AsRawFd;
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    g.put("locked/db", b"0");
    let t = scratch();
    let tier = g.serve_tier(0, &t.path().join("tier"), &[]);
    let client = |name: &str| {
        Mount::with_cache(
            &tier.addr,
            &t.path().join(name),
            &t.path().join(format!("c{name}")),
            &["--insecure-plaintext"],
        )
    };
    let (a, b) = (client("a"), client("b"));
    let open = |m: &Mount| std::fs::File::open(m.p("locked/db")).unwrap();
    let flock = |f: &std::fs::File, op: i32| {
        // SAFETY: flock(2) on a descriptor we own.
        match unsafe { libc::flock(f.as_raw_fd(), op) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error().raw_os_error()),
        }
    };
    let (fa, fb) = (open(&a), open(&b));
    flock(&fa, libc::LOCK_EX).unwrap();
    assert_eq!(
        flock(&fb, libc::LOCK_EX | libc::LOCK_NB),
        Err(Some(libc::EWOULDBLOCK)),
        "held through the other client"
    );
    flock(&fa, libc::LOCK_UN).unwrap();
    flock(&fb, libc::LOCK_EX | libc::LOCK_NB).expect("free once released");
    assert_eq!(
        flock(&fa, libc::LOCK_SH | libc::LOCK_NB),
        Err(Some(libc::EWOULDBLOCK))
    );
}

#[test]
fn clients_behind_one_tier_cost_the_store_one_read_and_see_changes() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let want = bytes(7, 8 << 20);
    g.put("shared/model.bin", &want);
    let t = scratch();
    let tier = g.serve_tier(0, &t.path().join("tier"), &["--metadata-ttl", "0.5"]);
    let a = Mount::with_cache(
        &tier.addr,
        &t.path().join("a"),
        &t.path().join("ca"),
        &["--insecure-plaintext"],
    );
    let b = Mount::with_cache(
        &tier.addr,
        &t.path().join("b"),
        &t.path().join("cb"),
        &["--insecure-plaintext"],
    );
    let before = g.s3_requests("GetObject");
    assert_bytes_eq("client a", &read(&a.p("shared/model.bin")).unwrap(), &want);
    let one = g.s3_requests("GetObject") - before;
    assert!(one >= 1, "the tier did not read the store");
    assert_bytes_eq("client b", &read(&b.p("shared/model.bin")).unwrap(), &want);
    assert_eq!(
        g.s3_requests("GetObject") - before,
        one,
        "the second client's read reached the store"
    );
    // A write through the tier is in the bucket at close, and the other client sees it.
    std::fs::write(a.p("shared/note.txt"), b"from a").unwrap();
    assert_eq!(g.get("shared/note.txt"), b"from a");
    assert_soon("b sees a's new file", || {
        has_content(&b.p("shared/note.txt"), b"from a")
    });
    // A change made in the store by somebody else reaches both clients as a callback.
    g.put("shared/note.txt", b"from outside");
    for m in [&a, &b] {
        assert_soon("an outside overwrite is seen", || {
            has_content(&m.p("shared/note.txt"), b"from outside")
        });
    }
}

#[test]
fn wrong_credentials_and_missing_buckets_are_refused_with_clear_errors() {
    require_fuse();
    let Some(g) = Garage::start_or_skip(3) else {
        return;
    };
    let t = scratch();
    let mount = |bucket: &str, secret: &str| {
        let mut cmd = g.hoardfs();
        cmd.env("AWS_SECRET_ACCESS_KEY", secret)
            .arg("mount")
            .arg(format!("s3://{bucket}"))
            .arg(t.path().join("m"))
            .arg("--cache-dir")
            .arg(t.path().join("c"))
            .args(g.s3_flags(0));
        std::fs::create_dir_all(t.path().join("m")).unwrap();
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "mounted anyway");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = mount(g.bucket(), "not-the-secret-0123456789");
    assert!(e.contains("check the credentials"), "{e}");
    let e = mount("no-such-bucket", g.secret());
    assert!(
        e.contains("no-such-bucket") && e.contains("does not exist"),
        "{e}"
    );
}

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
        assert_eq!(read(&f).unwrap(), format!("{i}.0").as_bytes());
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
                assert_eq!(read(&p).unwrap(), format!("{i}.{j}").as_bytes());
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
    assert_eq!(read(&m.p("ds/p0003/f0")).unwrap(), b"3.0");
    std::thread::sleep(Duration::from_millis(500));
    g.put("ds/p0003/f0", b"past the bound");
    assert_eq!(read(&m.p("ds/p0003/f0")).unwrap(), b"past the bound");
    assert!(stats(&m)["listings"]["waited"].as_u64().unwrap() > 0);
    m.unmount();
}
