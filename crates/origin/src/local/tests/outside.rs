//! Tests of the outside-writes watcher: a write by another process to a file whose data the
//! origin served moves the file's mtime (so its version changes); writes by the origin
//! itself, and to files nobody used, leave it alone. Needs `CAP_SYS_ADMIN` (fanotify):
//! skipped, saying so, without it.

use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::time::Duration;

use super::super::*;
use super::writable;

fn subscribed(o: &LocalOrigin) -> bool {
    assert!(o.subscribe(std::sync::Arc::new(|_| {})));
    if o.outside_write_bumps().is_none() {
        eprintln!("skipped: fanotify needs CAP_SYS_ADMIN");
        return false;
    }
    true
}

/// Writes `data` at offset 0 of `p` from another process (`dd conv=notrunc`).
fn write_from_another_process(p: &std::path::Path, data: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf %s '{data}' | dd of='{}' conv=notrunc status=none",
            p.display()
        ))
        .status()
        .unwrap();
    assert!(st.success());
}

fn mtime(p: &std::path::Path) -> (i64, i64) {
    let m = std::fs::metadata(p).unwrap();
    (m.mtime(), m.mtime_nsec())
}

#[test]
fn another_process_writing_a_served_file_moves_its_mtime_by_a_nanosecond() {
    let (_d, o, root, path) = writable();
    if !subscribed(&o) {
        return;
    }
    let a = o.lookup(root, b"a.txt").unwrap();
    o.read(a.handle, 0, 5).unwrap();
    let p = path.join("a.txt");
    // Holding the file's write lock keeps the bump out until the written mtime is read.
    let m = std::fs::metadata(&p).unwrap();
    let node = o
        .handles
        .find(&(m.dev(), m.ino()))
        .expect("a.txt is registered");
    let guard = o.locks.lock(&node);
    write_from_another_process(&p, "HE");
    let written = mtime(&p);
    drop(guard);
    let moved = hoardfs_testutil::wait_until(Duration::from_secs(5), || {
        o.outside_write_bumps() == Some(1)
    });
    assert!(
        moved,
        "no bump after another process wrote a file the origin read"
    );
    let after = mtime(&p);
    let ns = |(s, n): (i64, i64)| s as i128 * 1_000_000_000 + n as i128;
    assert_eq!(ns(after) - ns(written), 1, "mtime moved by exactly 1 ns");
    assert_eq!(std::fs::read(&p).unwrap(), b"HEllo");
}

#[test]
fn own_writes_and_files_nobody_used_keep_their_mtime() {
    let (_d, o, root, path) = writable();
    if !subscribed(&o) {
        return;
    }
    // The origin's own write: never bumped.
    let a = o.lookup(root, b"a.txt").unwrap();
    o.write(a.handle, 0, b"HE", false).unwrap();
    // A file registered (looked up) but whose data nobody used: left alone.
    std::fs::write(path.join("c.txt"), b"c").unwrap();
    o.lookup(root, b"c.txt").unwrap();
    write_from_another_process(&path.join("c.txt"), "d");
    let (a_before, c_before) = (mtime(&path.join("a.txt")), mtime(&path.join("c.txt")));
    // A bumped file we can wait for, written after the two above: once its bump is seen,
    // the events before it were handled.
    std::fs::write(path.join("b.txt"), b"b").unwrap();
    let b = o.lookup(root, b"b.txt").unwrap();
    o.read(b.handle, 0, 1).unwrap();
    write_from_another_process(&path.join("b.txt"), "c");
    assert!(hoardfs_testutil::wait_until(Duration::from_secs(5), || {
        o.outside_write_bumps() == Some(1)
    }));
    hoardfs_testutil::assert_stays("only b.txt was bumped", Duration::from_millis(50), || {
        o.outside_write_bumps() == Some(1)
    });
    assert_eq!(mtime(&path.join("a.txt")), a_before);
    assert_eq!(mtime(&path.join("c.txt")), c_before);
}
