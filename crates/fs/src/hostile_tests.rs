//! The file-system layer over an origin that returns extreme values (an origin wrapper that
//! rewrites every attribute set and write reply): nothing may panic or overflow. A remote
//! origin checks replies before they get here; these values are what a local directory or
//! any other `Origin` could still produce.

use std::fs::File;
use std::sync::Arc;

use hoardfs_cache::CacheDir;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::{
    Attr, BreakSink, DirPage, Entry, Handle, Origin, OriginInfo, Owner, ReadReply, Result,
    SetAttrs, StatFs, Timestamp, WriteReply,
};

use crate::{Access, Backing, BackingError, FsConfig, FsError, HoardFs, ROOT_INO};

/// Rewrites what `inner` returns: extreme times and permission bits always, the size of
/// regular files and where and how much a write says it wrote when asked to.
struct Odd {
    inner: LocalOrigin,
    size: Option<u64>,
    write_offset: Option<u64>,
    write_extra: u32,
    /// Directory pages never end: each is empty and names the next cookie.
    endless: bool,
    /// Directory pages never end: each holds 1024 entries with 255-byte names.
    endless_long_names: bool,
    /// Reads return this many bytes more than asked.
    read_extra: usize,
}

impl Odd {
    fn attr(&self, mut a: Attr) -> Attr {
        a.atime = Timestamp {
            secs: i64::MAX,
            nanos: u32::MAX,
        };
        a.mtime = Timestamp {
            secs: i64::MIN,
            nanos: 1_000_000_000,
        };
        a.ctime = Timestamp {
            secs: i64::MAX - 1,
            nanos: 2_000_000_000,
        };
        a.perm |= 0o170_000;
        a.blocks = u64::MAX;
        if a.kind == hoardfs_origin::FileKind::File
            && let Some(s) = self.size
        {
            a.size = s;
        }
        a
    }
    fn entry(&self, mut e: Entry) -> Entry {
        e.attr = self.attr(e.attr);
        e
    }
}

impl Origin for Odd {
    fn info(&self) -> Result<OriginInfo> {
        let mut i = self.inner.info()?;
        i.root = self.entry(i.root);
        Ok(i)
    }
    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.inner.lookup(parent, name).map(|e| self.entry(e))
    }
    fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.inner.getattr(handle).map(|a| self.attr(a))
    }
    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        if self.endless {
            return Ok(DirPage {
                entries: Vec::new(),
                next: Some(cookie + 1),
            });
        }
        if self.endless_long_names {
            let root = self.inner.getattr(dir)?;
            let entry = hoardfs_origin::Entry {
                handle: dir,
                attr: root,
            };
            let entries = (0..1024u64)
                .map(|i| {
                    let mut name = format!("{cookie}-{i}-").into_bytes();
                    name.resize(255, b'x');
                    hoardfs_origin::DirEntry {
                        name,
                        entry: entry.clone(),
                    }
                })
                .collect();
            return Ok(DirPage {
                entries,
                next: Some(cookie + 1),
            });
        }
        let mut p = self.inner.readdir(dir, cookie, max_entries)?;
        for e in &mut p.entries {
            e.entry = self.entry(e.entry.clone());
        }
        Ok(p)
    }
    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        let mut r = self.inner.read(handle, offset, len)?;
        r.data.resize(r.data.len() + self.read_extra, b'!');
        Ok(r)
    }
    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.inner.readlink(handle)
    }
    fn statfs(&self) -> Result<StatFs> {
        self.inner.statfs()
    }
    fn subscribe(&self, sink: BreakSink) -> bool {
        self.inner.subscribe(sink)
    }
    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> Result<Entry> {
        let e = self.inner.create(parent, name, mode, exclusive, owner)?;
        Ok(self.entry(e))
    }
    fn setattr(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        self.inner.setattr(handle, set).map(|a| self.attr(a))
    }
    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        let mut w = self.inner.write(handle, offset, data, append)?;
        w.attr = self.attr(w.attr);
        w.written += self.write_extra;
        if let Some(o) = self.write_offset {
            w.offset = o;
        }
        Ok(w)
    }
}

fn refused(_: &File) -> std::result::Result<Backing, BackingError> {
    Err(BackingError::Refused(std::io::Error::from_raw_os_error(1)))
}

fn fs_over(odd: Odd, cache: Option<CacheDir>) -> Arc<HoardFs> {
    HoardFs::new(Arc::new(odd), cache, FsConfig::default()).unwrap()
}

fn odd(export: &std::path::Path, size: Option<u64>) -> Odd {
    Odd {
        inner: LocalOrigin::new(
            export,
            LocalOptions {
                read_only: false,
                ..LocalOptions::default()
            },
        )
        .unwrap(),
        size,
        write_offset: None,
        write_extra: 0,
        endless: false,
        endless_long_names: false,
        read_extra: 0,
    }
}

#[test]
fn extreme_attributes_and_sizes_pass_through_without_panic() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"0123456789").unwrap();
    let sizes = [None, Some(1 << 43), Some(i64::MAX as u64), Some(u64::MAX)];
    for (i, size) in sizes.into_iter().enumerate() {
        for cached in [false, true] {
            let cache =
                cached.then(|| CacheDir::open_unwatched(&t.path().join(format!("c{i}"))).unwrap());
            let fs = fs_over(odd(&export, size), cache);
            let crate::NodeEntry {
                ino: f, attr: a, ..
            } = fs.lookup(ROOT_INO, b"f").unwrap();
            assert_eq!(a.atime.nanos, u32::MAX, "the fs layer keeps what it gets");
            fs.getattr(f).unwrap();
            let listing = fs.listing(ROOT_INO).unwrap();
            for e in &listing.entries {
                fs.remember_entry(ROOT_INO, &listing, e);
            }
            fs.cached_attr(ROOT_INO).unwrap();
            let fh = fs.open(f, Access::default(), &refused).unwrap().fh;
            let len = size.unwrap_or(10);
            for offset in [0, 5, len / 2, len.saturating_sub(3), u64::MAX - 5, u64::MAX] {
                // Past the real end the origin has nothing (or refuses the offset).
                match fs.read(fh, offset, 4096) {
                    Ok(d) => assert!(d.len() <= 4096),
                    Err(FsError::Origin(_)) => {}
                    Err(e) => panic!("size {size:?} offset {offset}: {e}"),
                }
            }
            fs.release(fh);
        }
    }
}

#[test]
fn write_replies_beyond_what_was_written_are_errors_not_panics() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"0123456789").unwrap();
    let rw = Access {
        read: true,
        write: true,
        append: false,
        sync: false,
    };
    // More bytes written than given.
    let mut o = odd(&export, None);
    o.write_extra = 1;
    let fs = fs_over(
        o,
        Some(CacheDir::open_unwatched(&t.path().join("c1")).unwrap()),
    );
    let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    let fh = fs.open(f, rw, &refused).unwrap().fh;
    // Queued behind the writer: the reply is checked when it is sent, and the writer's
    // close is told.
    fs.write(fh, 0, b"abc", 1).unwrap();
    assert!(matches!(fs.flush(f, fh, 1), Err(FsError::Protocol(_))));
    fs.release(fh);
    // Written at an offset where the end overflows: the cache cannot follow, the write
    // still succeeds.
    let mut o = odd(&export, None);
    o.write_offset = Some(u64::MAX - 1);
    let fs = fs_over(
        o,
        Some(CacheDir::open_unwatched(&t.path().join("c2")).unwrap()),
    );
    let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
    let fh = fs.open(f, rw, &refused).unwrap().fh;
    assert_eq!(fs.write(fh, 0, b"abc", 1).unwrap(), 3);
    fs.release(fh);
}

#[test]
fn a_listing_that_never_ends_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    let mut o = odd(t.path(), None);
    o.endless = true;
    let fs = fs_over(o, None);
    assert!(matches!(fs.listing(ROOT_INO), Err(FsError::Protocol(_))));
}

#[test]
fn a_listing_of_endless_long_names_is_an_error_before_its_entry_bound() {
    let t = tempfile::tempdir().unwrap();
    let mut o = odd(t.path(), None);
    o.endless_long_names = true;
    let fs = fs_over(o, None);
    let err = fs.listing(ROOT_INO).unwrap_err();
    assert!(
        matches!(&err, FsError::Protocol(m) if m.contains("MiB of names")),
        "{err:?}"
    );
}

#[test]
fn reads_never_return_more_than_asked() {
    let t = tempfile::tempdir().unwrap();
    let export = t.path().join("export");
    std::fs::create_dir(&export).unwrap();
    std::fs::write(export.join("f"), b"0123456789").unwrap();
    for cached in [false, true] {
        let mut o = odd(&export, None);
        o.read_extra = 100;
        let cache = cached.then(|| CacheDir::open_unwatched(&t.path().join("c")).unwrap());
        let fs = fs_over(o, cache);
        let f = fs.lookup(ROOT_INO, b"f").unwrap().ino;
        let fh = fs.open(f, Access::default(), &refused).unwrap().fh;
        assert_eq!(&fs.read(fh, 2, 4).unwrap()[..], b"2345");
        assert_eq!(&fs.read(fh, 0, 4096).unwrap()[..], b"0123456789");
        fs.release(fh);
    }
}
