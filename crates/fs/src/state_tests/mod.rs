//! The per-node state machines driven through [`HoardFs`] without FUSE (no root needed):
//! freshness and callbacks (breaks, and breaks that overtake replies), listings, the choice
//! of open mode, object replacement on a new version and eviction while open. The origin
//! is a local directory behind [`Scripted`], which counts round trips, delivers the breaks
//! a test sends (the directory's own change reports are not subscribed: no test waits on
//! inotify) and can play unreachable. The tests of what a mount keeps across
//! disconnections (saved namespace, offline writes) and of the descriptor bound are in
//! [`offline`].

mod async_mode;
mod durability;
mod offline;
mod offline_names;
mod read_into;
mod trees;
mod walk_ahead;
mod write_behind;

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hoardfs_cache::CacheDir;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::{
    Attr, Break, BreakSink, DirPage, Entry, Handle, Origin, OriginError, OriginInfo, ReadReply,
    Result, StatFs, WriteReply,
};
use parking_lot::Mutex;

use crate::{
    Access, Backing, BackingError, FsConfig, FsError, HoardFs, Ino, KernelNotifier, NodeAttr,
    OpenMode, Opened, ROOT_INO,
};

/// A local directory as origin, with round trips counted, breaks sent by the test, and a
/// switch that makes it unreachable.
struct Scripted {
    inner: LocalOrigin,
    /// Whether it offers callbacks.
    callbacks: bool,
    sink: Mutex<Option<BreakSink>>,
    offline: AtomicBool,
    getattrs: AtomicUsize,
    readdirs: AtomicUsize,
    /// Whether it lists subtrees in one request (as a remote server does).
    trees: AtomicBool,
    tree_requests: AtomicUsize,
    /// The directories subtree requests started from.
    tree_tops: Mutex<Vec<u64>>,
    /// A directory whose subtree requests fail with `Access`.
    tree_refused: Mutex<Option<u64>>,
    /// Run after a getattr is answered and before the reply is returned (to make a break
    /// overtake it).
    after_getattr: Mutex<Option<Box<dyn Fn() + Send>>>,
    /// Writes left until one is applied and its reply lost (the origin then goes away);
    /// 0: none.
    lose_write_reply: AtomicUsize,
    /// The next create or mkdir is applied and its reply lost (the origin then goes away).
    lose_create_reply: AtomicBool,
    /// The next write fails before it is sent (the origin then goes away).
    unsent_write: AtomicBool,
    /// The write verifier announced (a remote server's changes after a crash).
    verifier: std::sync::atomic::AtomicU64,
    /// Run (once) inside the next write, before it is applied.
    during_write: Mutex<Option<Box<dyn FnOnce() + Send>>>,
    /// Run (once) after the next listing page is read and before it is returned.
    after_readdir: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

impl Scripted {
    fn new(export: &Path, callbacks: bool) -> Scripted {
        let options = LocalOptions {
            read_only: false,
            ..LocalOptions::default()
        };
        Scripted {
            inner: LocalOrigin::new(export, options).unwrap(),
            callbacks,
            sink: Mutex::new(None),
            offline: AtomicBool::new(false),
            getattrs: AtomicUsize::new(0),
            readdirs: AtomicUsize::new(0),
            trees: AtomicBool::new(false),
            tree_requests: AtomicUsize::new(0),
            tree_tops: Mutex::new(Vec::new()),
            tree_refused: Mutex::new(None),
            after_getattr: Mutex::new(None),
            lose_write_reply: AtomicUsize::new(0),
            lose_create_reply: AtomicBool::new(false),
            unsent_write: AtomicBool::new(false),
            verifier: std::sync::atomic::AtomicU64::new(1),
            during_write: Mutex::new(None),
            after_readdir: Mutex::new(None),
        }
    }

    fn reachable(&self) -> Result<()> {
        if self.offline.load(Ordering::SeqCst) {
            return Err(OriginError::Unreachable("switched off by the test".into()));
        }
        Ok(())
    }

    /// Delivers `b` as the origin's reader thread would.
    fn send(&self, b: Break) {
        let sink = self.sink.lock().clone().expect("subscribed");
        sink(vec![b]);
    }
}

impl Origin for Scripted {
    fn info(&self) -> Result<OriginInfo> {
        let mut info = self.inner.info()?;
        info.verifier = self.verifier.load(Ordering::SeqCst);
        Ok(info)
    }
    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.reachable()?;
        self.inner.lookup(parent, name)
    }
    fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.reachable()?;
        self.getattrs.fetch_add(1, Ordering::SeqCst);
        let a = self.inner.getattr(handle)?;
        if let Some(hook) = &*self.after_getattr.lock() {
            hook();
        }
        Ok(a)
    }
    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        self.reachable()?;
        self.readdirs.fetch_add(1, Ordering::SeqCst);
        let page = self.inner.readdir(dir, cookie, max_entries)?;
        let hook = self.after_readdir.lock().take();
        if let Some(hook) = hook {
            hook();
        }
        Ok(page)
    }
    fn read_tree(
        &self,
        dir: Handle,
        dir_id: u64,
        max_entries: u32,
    ) -> Result<Vec<hoardfs_origin::TreeDir>> {
        self.reachable()?;
        self.tree_requests.fetch_add(1, Ordering::SeqCst);
        self.tree_tops.lock().push(dir_id);
        if *self.tree_refused.lock() == Some(dir_id) {
            return Err(hoardfs_origin::WireError::Access.into());
        }
        hoardfs_origin::tree::walk(&self.inner, dir, dir_id, max_entries)
    }
    fn lists_trees(&self) -> bool {
        self.trees.load(Ordering::SeqCst)
    }
    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        self.reachable()?;
        self.inner.read(handle, offset, len)
    }
    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.reachable()?;
        self.inner.readlink(handle)
    }
    fn mkdir(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        owner: hoardfs_origin::Owner,
    ) -> Result<Entry> {
        self.reachable()?;
        let reply = self.inner.mkdir(parent, name, mode, owner);
        if self.lose_create_reply.swap(false, Ordering::SeqCst) {
            self.offline.store(true, Ordering::SeqCst);
            return Err(OriginError::Lost("the reply was lost".into()));
        }
        reply
    }
    fn symlink(
        &self,
        parent: Handle,
        name: &[u8],
        target: &[u8],
        owner: hoardfs_origin::Owner,
    ) -> Result<Entry> {
        self.reachable()?;
        self.inner.symlink(parent, name, target, owner)
    }
    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.reachable()?;
        self.inner.unlink(parent, name)
    }
    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.reachable()?;
        self.inner.rmdir(parent, name)
    }
    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.reachable()?;
        self.inner.rename(parent, name, new_parent, new_name, flags)
    }
    fn statfs(&self) -> Result<StatFs> {
        self.inner.statfs()
    }
    fn subscribe(&self, sink: BreakSink) -> bool {
        *self.sink.lock() = Some(sink);
        self.callbacks
    }
    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        self.reachable()?;
        if self.unsent_write.swap(false, Ordering::SeqCst) {
            // The connection is gone before the request leaves.
            self.offline.store(true, Ordering::SeqCst);
            return Err(OriginError::Unreachable("not sent".into()));
        }
        let during = self.during_write.lock().take();
        if let Some(f) = during {
            f();
        }
        let reply = self.inner.write(handle, offset, data, append);
        let left = self.lose_write_reply.load(Ordering::SeqCst);
        if left > 0 {
            self.lose_write_reply.store(left - 1, Ordering::SeqCst);
            if left == 1 {
                self.offline.store(true, Ordering::SeqCst);
                return Err(OriginError::Lost("the reply was lost".into()));
            }
        }
        reply
    }
    fn setattr(&self, handle: Handle, set: &hoardfs_origin::SetAttrs) -> Result<Attr> {
        self.reachable()?;
        self.inner.setattr(handle, set)
    }
    fn fallocate(&self, handle: Handle, offset: u64, length: u64, mode: u32) -> Result<Attr> {
        self.reachable()?;
        self.inner.fallocate(handle, offset, length, mode)
    }
    fn fsync(&self, handle: Handle, datasync: bool) -> Result<()> {
        self.reachable()?;
        self.inner.fsync(handle, datasync)
    }
    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: hoardfs_origin::Owner,
    ) -> Result<Entry> {
        self.reachable()?;
        let reply = self.inner.create(parent, name, mode, exclusive, owner);
        if self.lose_create_reply.swap(false, Ordering::SeqCst) {
            self.offline.store(true, Ordering::SeqCst);
            return Err(OriginError::Lost("the reply was lost".into()));
        }
        reply
    }
}

/// What the file system told the kernel to drop.
#[derive(Default)]
struct Notes {
    inodes: Mutex<Vec<Ino>>,
    entries: Mutex<Vec<(Ino, Vec<u8>)>>,
}

impl KernelNotifier for Notes {
    fn inval_inode(&self, ino: Ino) {
        self.inodes.lock().push(ino);
    }
    fn inval_attr(&self, ino: Ino) {
        self.inodes.lock().push(ino);
    }
    fn inval_entry(&self, parent: Ino, name: &[u8]) {
        self.entries.lock().push((parent, name.to_vec()));
    }
}

/// Waits until `cond` holds (breaks are applied on their own thread, an origin's change
/// reports arrive when they do).
#[track_caller]
/// Held by the tests that need thousands of descriptors (the origin keeps one per handle
/// and per watched directory, the client two per cached object it keeps), so that they
/// never run side by side and together pass the process's limit (20000 here).
pub(super) fn many_descriptors() -> parking_lot::MutexGuard<'static, ()> {
    static HEAVY: Mutex<()> = Mutex::new(());
    HEAVY.lock()
}

pub(crate) fn wait_until(what: &str, cond: impl FnMut() -> bool) {
    hoardfs_testutil::assert_eventually(what, cond);
}

struct Rig {
    _dir: tempfile::TempDir,
    export: std::path::PathBuf,
    origin: Arc<Scripted>,
    fs: Arc<HoardFs>,
    notes: Arc<Notes>,
}

impl Rig {
    /// A mount of a fresh export holding `files`, with a disk cache unless `cache` is off.
    fn new(files: &[(&str, &[u8])], callbacks: bool, cache: bool, config: FsConfig) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let export = dir.path().join("export");
        std::fs::create_dir(&export).unwrap();
        for (name, bytes) in files {
            std::fs::write(export.join(name), bytes).unwrap();
        }
        let origin = Arc::new(Scripted::new(&export, callbacks));
        let cache = cache.then(|| CacheDir::open_unwatched(&dir.path().join("cache")).unwrap());
        let fs = HoardFs::new(origin.clone(), cache, config).unwrap();
        let notes = Arc::new(Notes::default());
        fs.set_notifier(notes.clone());
        Rig {
            _dir: dir,
            export,
            origin,
            fs,
            notes,
        }
    }

    /// Getattr round trips that `n` getattrs of `ino` cost.
    fn getattr_trips(&self, ino: Ino, n: usize) -> usize {
        let trips = || self.origin.getattrs.load(Ordering::SeqCst);
        let before = trips();
        for _ in 0..n {
            self.fs.getattr(ino).unwrap();
        }
        trips() - before
    }

    fn lookup(&self, name: &str) -> (Ino, Attr) {
        let e = self.fs.lookup(ROOT_INO, name.as_bytes()).unwrap();
        (e.ino, e.attr)
    }

    /// Sends `b` and waits until the break thread told the kernel about `ino`.
    fn break_and_wait(&self, b: Break, ino: Ino) {
        let seen = self.notes.inodes.lock().len();
        self.origin.send(b);
        wait_until("the break was applied", || {
            self.notes.inodes.lock()[seen..].contains(&ino)
        });
    }
}

fn config(attr_ttl: Duration) -> FsConfig {
    FsConfig {
        attr_ttl,
        dir_ttl: attr_ttl,
        callback_ttl: Duration::from_secs(600),
        ..FsConfig::default()
    }
}

fn attr_break(file_id: u64) -> Break {
    Break::Attr {
        file_id,
        change_id: u64::MAX,
    }
}

/// A mount without disk cache of an export holding one small file `f`, and its inode and
/// attributes.
fn one_file(callbacks: bool, config: FsConfig) -> (Rig, Ino, Attr) {
    let r = Rig::new(&[("f", b"x")], callbacks, false, config);
    let (f, a) = r.lookup("f");
    (r, f, a)
}

const MIB: usize = 1 << 20;
const READ: Access = Access {
    read: true,
    write: false,
    append: false,
    sync: false,
};
const WRITE: Access = Access {
    read: true,
    write: true,
    append: false,
    sync: false,
};

#[test]
fn under_a_callback_attributes_come_from_memory_until_a_break() {
    let (r, f, a) = one_file(true, config(Duration::ZERO));
    assert_eq!(r.fs.getattr(f).unwrap().ttl, Duration::from_secs(600));
    assert_eq!(r.getattr_trips(f, 3), 0, "no round trip under a callback");
    r.break_and_wait(attr_break(a.file_id), f);
    assert_eq!(r.getattr_trips(f, 1), 1, "a break expires the attributes");
    assert_eq!(r.getattr_trips(f, 1), 0, "and the answer brings a callback");
}

#[test]
fn our_own_change_coming_back_is_no_break() {
    let (r, f, a) = one_file(true, config(Duration::ZERO));
    let known = Break::Attr {
        file_id: a.file_id,
        change_id: hoardfs_proto::change_id(&a),
    };
    r.origin.send(known);
    // A later break is applied after it: once that one is seen, the first was handled.
    let root_id = r.fs.cached_attr(ROOT_INO).unwrap().file_id;
    r.break_and_wait(attr_break(root_id), ROOT_INO);
    assert!(!r.notes.inodes.lock().contains(&f));
    assert_eq!(r.getattr_trips(f, 1), 0, "the callback still holds");
}

#[test]
fn without_callbacks_attributes_last_the_ttl() {
    let (r, f, _) = one_file(false, config(Duration::ZERO));
    assert_eq!(r.fs.getattr(f).unwrap().ttl, Duration::ZERO);
    assert_eq!(r.getattr_trips(f, 2), 2, "every getattr asks past the TTL");
    let (r, f, _) = one_file(false, config(Duration::from_secs(600)));
    assert_eq!(r.getattr_trips(f, 2), 0, "none within it");
}

#[test]
fn a_break_that_overtakes_a_reply_withholds_its_callback() {
    let (r, f, a) = one_file(true, config(Duration::ZERO));
    r.break_and_wait(attr_break(a.file_id), f);
    // The next getattr's reply is overtaken by a break, applied before the reply is.
    let rig = Arc::new(r);
    let hook = {
        let rig = Arc::downgrade(&rig);
        move || {
            if let Some(r) = rig.upgrade() {
                r.break_and_wait(attr_break(a.file_id), f);
            }
        }
    };
    *rig.origin.after_getattr.lock() = Some(Box::new(hook));
    let ttl = rig.fs.getattr(f).unwrap().ttl;
    *rig.origin.after_getattr.lock() = None;
    assert_eq!(ttl, Duration::ZERO, "no callback granted");
    assert_eq!(rig.getattr_trips(f, 1), 1, "so the next getattr asks again");
}

#[test]
fn listings_are_reused_until_the_directory_changes_and_served_offline() {
    let r = Rig::new(
        &[("a", b"1"), ("b", b"2")],
        true,
        false,
        config(Duration::ZERO),
    );
    let readdirs = || r.origin.readdirs.load(Ordering::SeqCst);
    let root_id = r.fs.cached_attr(ROOT_INO).unwrap().file_id;
    r.fs.getattr(ROOT_INO).unwrap(); // a callback on the root
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 2);
    let once = readdirs();
    r.fs.listing(ROOT_INO).unwrap();
    assert_eq!(readdirs(), once, "reused under the callback");
    // A name goes: the break drops the listing (a name this client never looked up,
    // with no object, would be nothing it holds).
    r.lookup("a");
    std::fs::remove_file(r.export.join("a")).unwrap();
    r.break_and_wait(
        Break::Entry {
            dir_id: root_id,
            name: b"a".to_vec(),
            file_id: None,
        },
        ROOT_INO,
    );
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 1);
    assert!(readdirs() > once, "fetched again after the break");
    // Unreachable: the last listing and the names seen are served, expired or not.
    r.break_and_wait(Break::All, ROOT_INO);
    r.origin.offline.store(true, Ordering::SeqCst);
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 1);
    r.origin.offline.store(false, Ordering::SeqCst);
    r.lookup("b");
    r.origin.offline.store(true, Ordering::SeqCst);
    assert!(r.fs.lookup(ROOT_INO, b"b").is_ok());
    assert!(matches!(
        r.fs.lookup(ROOT_INO, b"never-seen"),
        Err(FsError::Offline(_))
    ));
}

fn content(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed)
        .collect()
}

/// Counts passthrough registrations.
struct Registrar(AtomicUsize);

impl Registrar {
    fn register(&self, _: &File) -> std::result::Result<Backing, BackingError> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(()) as Backing)
    }
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// A mount with a disk cache of an export holding file `f` (`data`), its passthrough
/// registrar and `f`'s inode.
fn cached_file(data: &[u8], callbacks: bool, config: FsConfig) -> (Rig, Registrar, Ino) {
    let r = Rig::new(&[("f", data)], callbacks, true, config);
    let (f, _) = r.lookup("f");
    (r, Registrar(AtomicUsize::new(0)), f)
}

/// Opens `ino`, reads it whole through the daemon unless passthrough; keeps it open.
fn open_read(r: &Rig, ino: Ino, access: Access, reg: &Registrar) -> (Opened, Vec<u8>) {
    let opened = r.fs.open(ino, access, &|f| reg.register(f)).unwrap();
    let mut bytes = Vec::new();
    if !matches!(opened.mode, OpenMode::Passthrough(_)) {
        loop {
            let got =
                r.fs.read(opened.fh, bytes.len() as u64, MIB as u32)
                    .unwrap();
            if got.is_empty() {
                break;
            }
            bytes.extend_from_slice(&got);
        }
    }
    (opened, bytes)
}

fn kind(o: &Opened) -> &'static str {
    match o.mode {
        OpenMode::Passthrough(_) => "passthrough",
        OpenMode::Cached { keep_cache: true } => "cached+keep",
        OpenMode::Cached { keep_cache: false } => "cached",
        OpenMode::Direct => "direct",
    }
}

#[test]
fn open_modes_follow_the_cache_and_the_other_opens() {
    let data = content(1, 2 * MIB + 3);
    let (r, reg, f) = cached_file(&data, true, config(Duration::from_secs(600)));
    // Not cached yet: daemon reads through the page cache.
    let (first, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&first), bytes == data), ("cached", true));
    // Complete now, but a page-cached open exists: no passthrough beside it.
    let (second, _) = open_read(&r, f, READ, &reg);
    assert_eq!(kind(&second), "cached+keep", "same version keeps the pages");
    r.fs.release(first.fh);
    r.fs.release(second.fh);
    // Alone and complete: passthrough, two opens sharing one registration.
    let (p1, _) = open_read(&r, f, READ, &reg);
    let (p2, _) = open_read(&r, f, READ, &reg);
    assert_eq!(
        (kind(&p1), kind(&p2), reg.count()),
        ("passthrough", "passthrough", 1)
    );
    // A write open beside them waits for them to close, then gets direct I/O (which the
    // kernel would refuse).
    let t = Instant::now();
    let (w, _) = open_read(&r, f, WRITE, &reg);
    assert_eq!(kind(&w), "direct");
    assert!(t.elapsed() >= crate::passthrough::PASSTHROUGH_DRAIN);
    r.fs.release(w.fh);
    r.fs.release(p1.fh);
    r.fs.release(p2.fh);
    // The registration outlives the opens: the next passthrough open makes none.
    let (p3, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&p3), reg.count()), ("passthrough", 1));
    r.fs.release(p3.fh);
    // Writes and appends are never passthrough; appends never page-cached.
    let (w, _) = open_read(&r, f, WRITE, &reg);
    let append = Access {
        read: true,
        write: true,
        append: true,
        sync: false,
    };
    let (a, _) = open_read(&r, f, append, &reg);
    assert_eq!((kind(&w), kind(&a)), ("cached+keep", "direct"));
    // A read-only open beside daemon opens: no passthrough either.
    let (ro, _) = open_read(&r, f, READ, &reg);
    assert_eq!(kind(&ro), "cached+keep");
    for o in [w, a, ro] {
        r.fs.release(o.fh);
    }
}

#[test]
fn a_direct_open_outliving_the_passthrough_ones_keeps_the_registration_for_later() {
    let data = content(4, MIB + 1);
    let (r, reg, f) = cached_file(&data, true, config(Duration::from_secs(600)));
    let (warm, _) = open_read(&r, f, READ, &reg);
    r.fs.release(warm.fh);
    let (p, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&p), reg.count()), ("passthrough", 1));
    // A write open beside it: direct (after the wait for the passthrough open), which the
    // kernel refuses; a read-only open meanwhile still shares the registration.
    let (w, _) = open_read(&r, f, WRITE, &reg);
    assert_eq!(kind(&w), "direct");
    let (p2, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&p2), reg.count()), ("passthrough", 1));
    r.fs.release(p2.fh);
    // The passthrough open ends first: the write open is the only one, and a read-only
    // open beside it is a daemon open too (no passthrough beside daemon opens).
    r.fs.release(p.fh);
    let (ro, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&ro), bytes == data), ("cached+keep", true));
    r.fs.release(ro.fh);
    r.fs.release(w.fh);
    // Nobody has it open: passthrough again, through the registration kept meanwhile.
    let (p, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&p), reg.count()), ("passthrough", 1));
    // Released in any order, the counts come back to nothing open.
    let (d, _) = open_read(&r, f, WRITE, &reg);
    r.fs.release(d.fh);
    r.fs.release(p.fh);
    assert!(!r.fs.sb.node(f).unwrap().state.lock().is_open());
}

#[test]
fn a_new_version_replaces_the_object_and_its_registration() {
    let old = content(1, MIB + 5);
    let new = content(2, 3 * MIB);
    let (r, reg, f) = cached_file(&old, false, config(Duration::ZERO));
    let (o, bytes) = open_read(&r, f, READ, &reg);
    assert!(!o.changed && bytes == old);
    r.fs.release(o.fh);
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&o), reg.count()), ("passthrough", 1));
    r.fs.release(o.fh);
    std::fs::write(r.export.join("f"), &new).unwrap();
    // Close-to-open sees the change: the old object (and registration) go, the new
    // version is read from the origin, then cached and registered anew.
    let told = r.notes.inodes.lock().len();
    let (o, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!((o.changed, kind(&o), bytes == new), (true, "cached", true));
    // ...and the kernel is told its copy of the attributes (the old size) is stale.
    assert!(
        r.notes.inodes.lock()[told..].contains(&f),
        "attributes not invalidated"
    );
    r.fs.release(o.fh);
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&o), reg.count()), ("passthrough", 2));
    r.fs.release(o.fh);
}

#[test]
fn an_open_file_is_not_evicted_and_a_closed_one_is() {
    let data = content(3, 2 * MIB);
    let (r, reg, f) = cached_file(&data, false, config(Duration::from_secs(600)));
    let (o, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!(bytes, data);
    assert!(matches!(r.fs.evict(f), Err(FsError::Cache(_))));
    // Still served from the cache.
    let from_network = r.fs.stats().bytes_from_network;
    assert_eq!(r.fs.read(o.fh, 0, 4096).unwrap()[..], data[..4096]);
    assert_eq!(r.fs.stats().bytes_from_network, from_network);
    r.fs.release(o.fh);
    assert!(r.fs.evict(f).unwrap() > 0);
    // Read again from the origin.
    let (o, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&o), bytes == data), ("cached+keep", true));
    assert!(r.fs.stats().bytes_from_network > from_network);
    r.fs.release(o.fh);
}

#[test]
fn a_forgotten_node_lets_go_of_its_object_once_closed() {
    let data = content(4, MIB);
    let (r, reg, f) = cached_file(&data, false, config(Duration::from_secs(600)));
    let object = || {
        r.fs.sb
            .nodes()
            .get(f)
            .unwrap()
            .state
            .lock()
            .opens
            .object()
            .cloned()
    };
    let (o, _) = open_read(&r, f, READ, &reg);
    assert!(
        !r.fs.sb.nodes().forget(f, 1),
        "still open: still referenced"
    );
    assert!(object().is_some());
    r.fs.release(o.fh);
    assert!(object().is_none(), "the last release lets go of it");
    // Loaded again (complete) and registered; let go again with its registration.
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&o), reg.count()), ("passthrough", 1));
    r.fs.release(o.fh);
    assert!(object().is_none());
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!((kind(&o), reg.count()), ("passthrough", 2));
    r.fs.release(o.fh);
}

#[test]
fn writes_move_the_object_along_and_read_back_from_the_cache() {
    let data = content(5, MIB + 100);
    let (r, reg, f) = cached_file(&data, false, config(Duration::ZERO));
    let (o, bytes) = open_read(&r, f, WRITE, &reg);
    assert_eq!(bytes, data);
    assert_eq!(r.fs.write(o.fh, 10, b"hello", 1).unwrap(), 5);
    let from_network = r.fs.stats().bytes_from_network;
    let mut want = data.clone();
    want[10..15].copy_from_slice(b"hello");
    let got = r.fs.read(o.fh, 0, want.len() as u32).unwrap();
    assert!(got[..] == want[..]);
    assert_eq!(r.fs.stats().bytes_from_network, from_network, "a cache hit");
    r.fs.release(o.fh);
    // The object is at the written version: a new open finds it complete.
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!((o.changed, kind(&o)), (false, "passthrough"));
    r.fs.release(o.fh);
}

#[test]
fn a_directory_whose_version_changed_is_listed_again() {
    let config = FsConfig {
        attr_ttl: Duration::ZERO,
        dir_ttl: Duration::from_secs(600),
        ..FsConfig::default()
    };
    let r = Rig::new(&[("a", b"1")], false, false, config);
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 1);
    std::fs::write(r.export.join("b"), b"2").unwrap();
    assert_eq!(
        r.fs.listing(ROOT_INO).unwrap().entries.len(),
        1,
        "reused within the directory TTL"
    );
    r.fs.getattr(ROOT_INO).unwrap();
    assert_eq!(r.fs.listing(ROOT_INO).unwrap().entries.len(), 2);
}

#[test]
fn an_unreachable_origin_leaves_cached_data_readable_and_the_rest_failing_fast() {
    let data = content(6, 2 * MIB);
    let (r, reg, f) = cached_file(&data, false, config(Duration::ZERO));
    let (o, bytes) = open_read(&r, f, READ, &reg);
    assert_eq!(bytes, data);
    r.origin.offline.store(true, Ordering::SeqCst);
    // Cached bytes are served; the attributes as last seen.
    assert_eq!(
        r.fs.read(o.fh, MIB as u64, 4096).unwrap()[..],
        data[MIB..MIB + 4096]
    );
    let NodeAttr { attr, ttl } = r.fs.getattr(f).unwrap();
    assert_eq!((attr.size, ttl), (data.len() as u64, Duration::ZERO));
    r.fs.release(o.fh);
    // A file never read has nothing cached: its reads fail at once.
    r.origin.offline.store(false, Ordering::SeqCst);
    std::fs::write(r.export.join("g"), b"never read").unwrap();
    let (g, _) = r.lookup("g");
    let o = r.fs.open(g, READ, &|f| reg.register(f)).unwrap();
    r.origin.offline.store(true, Ordering::SeqCst);
    assert!(matches!(r.fs.read(o.fh, 0, 10), Err(FsError::Offline(_))));
    r.fs.release(o.fh);
}
