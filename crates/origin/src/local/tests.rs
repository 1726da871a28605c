//! Unit tests of the local export: resolution, confinement, paging, versions (here), and
//! in submodules the namespace changes, data/attribute/xattr changes and callbacks.

mod modify;
mod namespace;
mod outside;
mod watch;

use super::*;
use crate::FileRanges;
use std::os::unix::fs::symlink;

/// A writable export of a fresh directory holding `sub/` and `a.txt` ("hello"); returns the
/// directory guard, the origin, the root handle and the root path.
pub(super) fn writable() -> (tempfile::TempDir, LocalOrigin, Handle, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("sub")).unwrap();
    std::fs::write(d.path().join("a.txt"), b"hello").unwrap();
    let opts = LocalOptions {
        read_only: false,
        ..Default::default()
    };
    let o = LocalOrigin::new(d.path(), opts).unwrap();
    let root = o.info().unwrap().root.handle;
    let path = d.path().canonicalize().unwrap();
    (d, o, root, path)
}

fn export() -> (tempfile::TempDir, LocalOrigin) {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("export");
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::write(root.join("a.txt"), b"hello").unwrap();
    std::fs::write(root.join("sub/deeper/b.bin"), vec![7u8; 100_000]).unwrap();
    std::fs::write(outer.path().join("secret"), b"outside").unwrap();
    symlink("/etc/passwd", root.join("abs-link")).unwrap();
    symlink("../secret", root.join("rel-escape")).unwrap();
    let o = LocalOrigin::new(&root, LocalOptions::default()).unwrap();
    (outer, o)
}

fn walk(o: &LocalOrigin, path: &str) -> Result<Entry> {
    let mut cur = o.info()?.root;
    for c in path.split('/') {
        cur = o.lookup(cur.handle, c.as_bytes())?;
    }
    Ok(cur)
}

#[test]
fn lookup_read_and_attrs() {
    let (_d, o) = export();
    let e = walk(&o, "sub/deeper/b.bin").unwrap();
    assert_eq!(e.attr.kind, FileKind::File);
    assert_eq!(e.attr.size, 100_000);
    let r = o.read(e.handle, 99_990, 100).unwrap();
    assert_eq!(r.data, vec![7u8; 10]);
    assert_eq!(r.version, e.attr.version);
    // The file stays open between reads.
    o.read(e.handle, 0, 10).unwrap();
    assert_eq!(o.counters().opens, 1);
    assert_eq!(o.counters().reads, 2);
}

#[test]
fn ranges_for_zero_copy_only_of_files_unchanged_long_enough() {
    let (_d, o) = export();
    let e = walk(&o, "sub/deeper/b.bin").unwrap();
    // Just written: not quiet for a second, so the caller must `read` (and its check).
    assert!(
        o.read_range(e.handle, 0, 10, Duration::from_secs(1))
            .unwrap()
            .is_none()
    );
    let r = o.read_range(e.handle, 99_990, 100, Duration::ZERO).unwrap();
    let r = r.expect("a range of a quiet file");
    // Clamped at end of file, labelled with the version, from the open-file cache.
    assert_eq!((r.offset, r.len, r.version), (99_990, 10, e.attr.version));
    let mut got = vec![0u8; 10];
    std::os::unix::fs::FileExt::read_exact_at(&*r.file, &mut got, r.offset).unwrap();
    assert_eq!(got, vec![7u8; 10]);
    let past = o
        .read_range(e.handle, 200_000, 100, Duration::ZERO)
        .unwrap();
    assert_eq!(past.map(|r| r.len), Some(0));
    assert_eq!(o.counters().opens, 1);
    // Not a regular file: no range.
    let dir = walk(&o, "sub").unwrap();
    assert!(
        o.read_range(dir.handle, 0, 10, Duration::ZERO)
            .unwrap()
            .is_none()
    );
}

#[test]
fn ranges_not_yet_sent_hold_at_most_max_open_files() {
    let d = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        std::fs::write(d.path().join(name), name.repeat(100)).unwrap();
    }
    let opts = LocalOptions {
        max_open_files: 2,
        ..Default::default()
    };
    let o = LocalOrigin::new(d.path(), opts).unwrap();
    let root = o.info().unwrap().root.handle;
    let h = |name: &str| o.lookup(root, name.as_bytes()).unwrap().handle;
    let range = |name: &str| o.read_range(h(name), 0, 100, Duration::ZERO).unwrap();
    // Two ranges in flight (their files may leave the open-file cache while they wait).
    let a = range("a").expect("a range of a quiet file");
    let b = range("b").expect("a second range");
    // A third would hold a third file: the caller copies with `read` instead.
    assert!(range("c").is_none());
    assert_eq!(o.read(h("c"), 0, 100).unwrap().data, b"c".repeat(100));
    // A range sent (dropped) gives its share back.
    drop(a);
    let c = range("c").expect("a range once one was sent");
    assert_eq!(c.len, 100);
    drop((b, c));
    assert_eq!(o.held.in_flight(), 0);
}

#[test]
fn ranges_for_zero_copy_only_of_bytes_in_memory() {
    let (d, o) = export();
    let e = walk(&o, "sub/deeper/b.bin").unwrap();
    let path = d.path().join("export/sub/deeper/b.bin");
    let f = std::fs::File::open(&path).unwrap();
    f.sync_all().unwrap();
    // SAFETY: plain advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if super::sys::all_cached(f.as_raw_fd(), 0, 100_000).unwrap_or(true) {
        eprintln!("skipped: this file system keeps the file in memory (tmpfs) or lacks cachestat");
        return;
    }
    // Not in memory: `sendfile` would wait for the disk, so the caller must `read`.
    assert!(
        o.read_range(e.handle, 0, 100_000, Duration::ZERO)
            .unwrap()
            .is_none()
    );
    assert_eq!(
        o.read(e.handle, 0, 100_000).unwrap().data,
        vec![7u8; 100_000]
    );
    // Read once, it is in memory: now it is offered.
    let r = o.read_range(e.handle, 0, 100_000, Duration::ZERO).unwrap();
    assert_eq!(r.map(|r| r.len), Some(100_000));
}

#[test]
fn dot_dot_and_slashes_are_refused() {
    let (_d, o) = export();
    let root = o.info().unwrap().root.handle;
    for bad in [&b".."[..], b".", b"", b"a/b", b"../secret", b"x\0y"] {
        assert!(o.lookup(root, bad).is_err(), "{bad:?} must be refused");
    }
    assert_eq!(
        o.lookup(root, &[b'x'; 256]),
        Err(WireError::NameTooLong.into())
    );
}

#[test]
fn symlinks_are_objects_not_followed() {
    let (_d, o) = export();
    let root = o.info().unwrap().root.handle;
    for name in ["abs-link", "rel-escape"] {
        let e = o.lookup(root, name.as_bytes()).unwrap();
        assert_eq!(e.attr.kind, FileKind::Symlink);
        // Reading through a symlink handle never reaches its target.
        assert!(o.read(e.handle, 0, 100).is_err());
    }
    let e = o.lookup(root, b"rel-escape").unwrap();
    assert_eq!(o.readlink(e.handle).unwrap(), b"../secret");
}

#[test]
fn version_changes_with_content_and_deleted_stays_readable() {
    let (d, o) = export();
    let e = walk(&o, "a.txt").unwrap();
    std::fs::write(d.path().join("export/a.txt"), b"hello, world").unwrap();
    let a = o.getattr(e.handle).unwrap();
    assert_ne!(a.version, e.attr.version);
    assert_eq!(a.size, 12);
    std::fs::remove_file(d.path().join("export/a.txt")).unwrap();
    // Like a local open file: the held handle still reads, and reports no links.
    let a = o.getattr(e.handle).unwrap();
    assert_eq!(a.nlink, 0);
    assert_eq!(o.read(e.handle, 0, 100).unwrap().data, b"hello, world");
    let bogus = Handle {
        epoch: e.handle.epoch ^ 2,
        id: e.handle.id,
    };
    assert_eq!(o.getattr(bogus), Err(WireError::Stale.into()));
}

#[test]
fn readdir_pages_cover_every_entry_once() {
    let d = tempfile::tempdir().unwrap();
    for i in 0..250 {
        std::fs::write(d.path().join(format!("f{i:03}")), b"x").unwrap();
    }
    let o = LocalOrigin::new(d.path(), LocalOptions::default()).unwrap();
    let root = o.info().unwrap().root.handle;
    let (mut names, mut cookie, mut pages) = (Vec::new(), 0, 0);
    loop {
        let p = o.readdir(root, cookie, 64).unwrap();
        pages += 1;
        names.extend(
            p.entries
                .into_iter()
                .map(|e| String::from_utf8(e.name).unwrap()),
        );
        match p.next {
            Some(c) => cookie = c,
            None => break,
        }
    }
    names.sort();
    let want: Vec<String> = (0..250).map(|i| format!("f{i:03}")).collect();
    assert_eq!(names, want);
    assert!(pages >= 4);
}
