//! Tests of the file-system layer over a local-directory origin and a real cache directory,
//! without FUSE: the passthrough registrations are stand-ins supplied by each test.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use hoardfs_cache::CacheDir;
use std::sync::atomic::{AtomicUsize, Ordering};

use hoardfs_origin::local::{LocalOptions, LocalOrigin};

use super::*;

const MIB: usize = 1 << 20;
const READ: Access = Access {
    read: true,
    write: false,
    append: false,
    sync: false,
};

fn fs_over(export: &Path, cache: &Path) -> Arc<HoardFs> {
    let origin = Arc::new(LocalOrigin::new(export, LocalOptions::default()).unwrap());
    let cache = CacheDir::open_unwatched(cache).unwrap();
    HoardFs::new(origin, Some(cache), FsConfig::default()).unwrap()
}

fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// Opens `ino` read-only with `make_backing`, reads it whole through the daemon if the open
/// is not passthrough, releases it; returns whether it was passthrough and the bytes.
fn open_and_read(fs: &HoardFs, ino: Ino, make_backing: &MakeBacking) -> (bool, Vec<u8>) {
    let Opened { fh, mode, .. } = fs.open(ino, READ, make_backing).unwrap();
    let passthrough = matches!(mode, OpenMode::Passthrough(_));
    let mut bytes = Vec::new();
    if !passthrough {
        loop {
            let got = fs.read(fh, bytes.len() as u64, MIB as u32).unwrap();
            if got.is_empty() {
                break;
            }
            bytes.extend_from_slice(&got);
        }
    }
    fs.release(fh);
    (passthrough, bytes)
}

#[test]
fn a_passing_registration_failure_costs_one_open_and_a_refusal_the_mount() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), content(1, 3 * MIB)).unwrap();
    std::fs::write(export.join("g"), content(2, MIB + 7)).unwrap();
    let fs = fs_over(&export, &t.path().join("cache"));
    let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    let g = fs.lookup(ROOT_INO, b"g").unwrap().ino;
    let calls = AtomicUsize::new(0);
    let registered = |_: &File| -> Result<Backing, BackingError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(()) as Backing)
    };
    let out_of_descriptors = |_: &File| -> Result<Backing, BackingError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(BackingError::Failed(io::Error::from_raw_os_error(24)))
    };
    let not_permitted = |_: &File| -> Result<Backing, BackingError> {
        calls.fetch_add(1, Ordering::SeqCst);
        Err(BackingError::Refused(io::Error::from_raw_os_error(1)))
    };
    // First reads fill the cache (nothing complete yet: no registration asked for).
    assert_eq!(
        open_and_read(&fs, f, &registered),
        (false, content(1, 3 * MIB))
    );
    assert_eq!(
        open_and_read(&fs, g, &registered),
        (false, content(2, MIB + 7))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    // A passing failure: this open reads through the daemon, the next one registers.
    assert_eq!(
        open_and_read(&fs, f, &out_of_descriptors),
        (false, content(1, 3 * MIB))
    );
    assert!(open_and_read(&fs, f, &registered).0, "passthrough again");
    assert!(open_and_read(&fs, f, &registered).0, "passthrough again");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "one failed, one kept registration"
    );
    // A refusal: daemon reads from then on, for every file, without asking again.
    assert_eq!(
        open_and_read(&fs, g, &not_permitted),
        (false, content(2, MIB + 7))
    );
    assert_eq!(
        open_and_read(&fs, g, &registered),
        (false, content(2, MIB + 7))
    );
    assert_eq!(
        open_and_read(&fs, f, &registered),
        (false, content(1, 3 * MIB))
    );
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[test]
fn uncached_reads_fetch_the_bytes_asked_for_and_no_more() {
    let t = tempfile::tempdir().unwrap();
    let all = content(3, 3 * MIB);
    std::fs::write(t.path().join("f"), &all).unwrap();
    let origin = Arc::new(LocalOrigin::new(t.path(), LocalOptions::default()).unwrap());
    let fs = HoardFs::new(origin, None, FsConfig::default()).unwrap();
    let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    let no_backing = |_: &File| -> Result<Backing, BackingError> { unreachable!() };
    let fh = fs.open(f, READ, &no_backing).unwrap().fh;
    let fetched = || fs.stats().bytes_from_network;
    // Across a chunk boundary: no whole chunks fetched, nothing read ahead.
    let got = fs.read(fh, MIB as u64 - 100, 200).unwrap();
    assert_eq!(&got[..], &all[MIB - 100..MIB + 100]);
    assert_eq!(fetched(), 200);
    // Up to the end of the file: short.
    let got = fs.read(fh, 3 * MIB as u64 - 10, 4096).unwrap();
    assert_eq!(&got[..], &all[3 * MIB - 10..]);
    assert_eq!(fetched(), 210);
    // Sequential reads from the start: nothing is fetched ahead either (there is nothing
    // to fetch ahead with: no readahead threads without a cache).
    assert!(!fs.sb.fetcher().reads_ahead());
    for at in [0, 4096] {
        let got = fs.read(fh, at, 4096).unwrap();
        assert_eq!(&got[..], &all[at as usize..at as usize + 4096]);
    }
    assert_eq!(fetched(), 210 + 8192);
    fs.release(fh);
}

/// Reads `ino` whole without an open, as the kernel does under `--kernel-opens`.
fn read_unopened_all(fs: &HoardFs, ino: Ino) -> Vec<u8> {
    let mut bytes = Vec::new();
    loop {
        let got = fs
            .read_unopened(ino, bytes.len() as u64, MIB as u32)
            .unwrap();
        if got.is_empty() {
            return bytes;
        }
        bytes.extend_from_slice(&got);
    }
}

#[test]
fn reads_without_opens_share_one_open_per_version_and_see_changes() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), content(1, 3 * MIB + 5)).unwrap();
    let origin = Arc::new(LocalOrigin::new(&export, LocalOptions::default()).unwrap());
    let cache = CacheDir::open_unwatched(&t.path().join("cache")).unwrap();
    let config = FsConfig {
        kernel_opens: true,
        read_only: true,
        attr_ttl: std::time::Duration::ZERO,
        ..FsConfig::default()
    };
    let fs = HoardFs::new(origin, Some(cache), config).unwrap();
    let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    for _ in 0..3 {
        assert_eq!(read_unopened_all(&fs, f), content(1, 3 * MIB + 5));
    }
    assert_eq!(
        fs.stats().daemon_opens,
        1,
        "one implicit open for one version"
    );
    assert_eq!(fs.implicit_opens(), 1);
    // A new version (other length and bytes) is read as such, through a new open, once
    // the origin's callback (inotify) reported the change: that takes a moment.
    std::fs::write(export.join("f"), content(2, MIB + 1)).unwrap();
    crate::state_tests::wait_until("the change was seen", || {
        fs.getattr(f).unwrap().attr.size == MIB as u64 + 1
    });
    assert_eq!(read_unopened_all(&fs, f), content(2, MIB + 1));
    assert_eq!(fs.stats().daemon_opens, 2);
    assert_eq!(
        fs.implicit_opens(),
        1,
        "the old version's open was released"
    );
    // Fully cached, yet never passthrough: the kernel never saw an open.
    assert_eq!(fs.stats().passthrough_opens, 0);
    fs.release_implicit_opens();
    assert_eq!(fs.implicit_opens(), 0);
}
