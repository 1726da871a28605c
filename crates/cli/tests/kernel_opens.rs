//! `--kernel-opens` on a real mount: the kernel opens files without asking the daemon, so
//! re-reading cached files costs no FUSE open at all; the bytes stay right, changes made on
//! the server still show, and the mount refuses what the mode cannot do (writes).

mod common;

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;

use common::rig::*;
use common::*;

#[test]
fn files_reopened_without_the_daemon_keep_right_bytes_and_follow_the_server() {
    let v1 = bytes(1, (3 << 20) + 5);
    let small = bytes(2, 20_000);
    let r = rig_with(
        |exp| {
            std::fs::write(exp.join("f"), &v1).unwrap();
            std::fs::write(exp.join("small"), &small).unwrap();
        },
        &[],
        &["--read-only", "--kernel-opens"],
    );
    const ROUNDS: u64 = 20;
    for _ in 0..ROUNDS {
        assert_content("f", &r.m.p("f"), &v1);
        assert_content("small", &r.m.p("small"), &small);
    }
    // Without the mode every one of these opens reaches the daemon (passthrough opens
    // once the files are cached); with it, one implicit open per file serves the reads.
    let opens = counter(&r.m, "daemon_opens") + counter(&r.m, "passthrough_opens");
    assert_eq!(
        opens,
        2,
        "{} opens of 2 files reached the daemon",
        2 * ROUNDS
    );

    // Reads after the page cache is dropped come from the disk cache, not the server.
    let before = r.srv.counters();
    drop_page_cache();
    assert_content("f from the disk cache", &r.m.p("f"), &v1);
    assert_eq!(
        r.srv.counters().bytes_read,
        before.bytes_read,
        "re-fetched f"
    );

    // A rewrite on the server (new size), then an in-place write (same size: only the
    // mtime tells), both show although no open checks the version.
    let v2 = bytes(3, 70_000);
    std::fs::write(r.srv("f"), &v2).unwrap();
    assert_soon("the rewrite shows", || has_content(&r.m.p("f"), &v2));
    let f = OpenOptions::new().write(true).open(r.srv("f")).unwrap();
    f.write_all_at(b"in place", 100).unwrap();
    drop(f);
    let mut v3 = v2.clone();
    v3[100..108].copy_from_slice(b"in place");
    assert_soon("the in-place write shows", || has_content(&r.m.p("f"), &v3));

    assert_errno(
        "open for writing",
        OpenOptions::new().write(true).open(r.m.p("small")),
        libc::EROFS,
    );
}

#[test]
fn kernel_opens_need_a_read_only_mount_with_a_disk_cache() {
    require_fuse();
    let t = scratch();
    let srv = Server::start(t.path());
    let cache = t.path().join("cache");
    let err = Mount::start(
        &srv.addr,
        &t.path().join("mnt"),
        &["--cache-dir", cache.to_str().unwrap(), "--kernel-opens"],
    )
    .err()
    .expect("a writable mount with --kernel-opens must be refused");
    assert!(err.contains("--read-only"), "unclear error: {err}");
    let err = Mount::start(
        &srv.addr,
        &t.path().join("mnt"),
        &["--no-cache", "--read-only", "--kernel-opens"],
    )
    .err()
    .expect("--kernel-opens without a disk cache must be refused");
    assert!(err.contains("disk cache"), "unclear error: {err}");
}
