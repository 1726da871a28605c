//! `hoardfs mount s3://…` and `hoardfs serve --origin s3://…` against a real 3-node Garage
//! cluster (replication factor 3) on 127.0.0.1, with rclone as the independent S3 client
//! that puts and checks objects.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::garage::Garage;
use common::*;

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
    assert_bytes_eq(
        "cold read",
        &read_errno(&m.p("data/big.bin")).unwrap(),
        &big,
    );
    assert_eq!(read_errno(&m.p("data/sub/a.txt")).unwrap(), b"alpha");
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
    assert_bytes_eq("hot read", &read_errno(&m.p("data/big.bin")).unwrap(), &big);
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
    assert_bytes_eq(
        "offline read",
        &read_errno(&m.p("data/big.bin")).unwrap(),
        &big,
    );
    assert_eq!(read_errno(&m.p("data/sub/a.txt")).unwrap(), b"alpha");
    assert_bytes_eq(
        "prefetched, never read",
        &read_errno(&m.p("prefetched/p.bin")).unwrap(),
        &bytes(8, 3 << 20),
    );
    assert_eq!(
        read_errno(&m.p("top.txt")),
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
        &read_errno(&m.p("q/read.bin")).unwrap(),
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
    assert_bytes_eq("cached", &read_errno(&m.p("q/read.bin")).unwrap(), &want);
    let asked = Instant::now();
    assert_eq!(
        read_errno(&m.p("q/unread.bin")),
        Err(libc::EIO),
        "never read"
    );
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
    assert_eq!(read_errno(&m.p("q/unread.bin")).unwrap(), b"never read");
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
        &read_errno(&m.p("f.bin")).unwrap(),
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
    assert_eq!(read_errno(&m.p("doc.txt")).unwrap(), b"version one");
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
    assert_bytes_eq(
        "read back",
        &read_errno(&m.p("existing.bin")).unwrap(),
        &want,
    );
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
        &read_errno(&m.p("default-cache/f")).unwrap(),
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
    assert_bytes_eq(
        "client a",
        &read_errno(&a.p("shared/model.bin")).unwrap(),
        &want,
    );
    let one = g.s3_requests("GetObject") - before;
    assert!(one >= 1, "the tier did not read the store");
    assert_bytes_eq(
        "client b",
        &read_errno(&b.p("shared/model.bin")).unwrap(),
        &want,
    );
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
