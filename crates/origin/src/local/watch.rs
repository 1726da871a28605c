//! Callback breaks of the local export, from inotify.
//!
//! After [`crate::Origin::subscribe`], every directory the origin has handed out (those in
//! the handle table at that moment and every one registered later) gets an inotify watch.
//! A dedicated thread reads the inotify descriptor and turns each batch of events (one
//! `read`) into one call of the sink: a changed child gives `Break::Attr` for it; a created,
//! removed or renamed name also gives `Break::Entry` and `Break::Attr` for the directory; a
//! change of the directory itself gives `Break::Attr` for it. Attributes are taken when the
//! batch is processed, so a break always describes the current state. A queue overflow or a
//! watch that could not be added (watch limit) is reported as `Break::All`, at most once a
//! second. Changes reaching a file only through a hard link in a directory nobody looked
//! at, or made on another machine sharing the exported file system, are not seen.
//!
//! The thread keeps each watched directory's handle-table node (and so its descriptor)
//! alive until the directory is deleted; so at most `LocalOptions::max_watches`
//! directories are watched (beyond, as when the kernel's watch limit is reached, every
//! client is told to revalidate everything). It exits when the [`Subscription`] is dropped
//! (with its `LocalOrigin`), woken through an eventfd. Locks: `state` and `sink` are
//! leaves, never held across `inotify_add_watch`, `fstatat` or a sink call; `reading` is
//! held across a read of the descriptor, its translation and its sink call (taken before
//! `state` and `sink`).

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hoardfs_proto::{Break, FileKind};
use parking_lot::Mutex;

use super::handles::Node;
use super::outside::OutsideWrites;
use super::{LocalOrigin, file_id_of, sys};
use crate::BreakSink;

const MASK: u32 = libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_CLOSE_WRITE
    | libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_EXCL_UNLINK;

/// Events that change which object a name refers to.
const NAME_EVENTS: u32 =
    libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;

/// Shortest time between two `Break::All`.
const ALL_INTERVAL: Duration = Duration::from_secs(1);

/// A running inotify subscription: the shared watcher state and its reader thread, stopped
/// and joined on drop.
pub struct Subscription {
    watcher: Arc<Watcher>,
    thread: Option<JoinHandle<()>>,
}

struct Watcher {
    inotify: OwnedFd,
    /// Most directories watched at once (`LocalOptions::max_watches`).
    max_watches: usize,
    wake: OwnedFd,
    root_dev: u64,
    sink: Mutex<BreakSink>,
    state: Mutex<State>,
    /// Held while events are read from the descriptor and reported, by the reader thread
    /// or by [`Subscription::settle`]: batches are reported in the order they were read.
    reading: Mutex<()>,
    stop: AtomicBool,
    all_pending: AtomicBool,
    warned: AtomicBool,
}

#[derive(Default)]
struct State {
    by_wd: HashMap<i32, Watched>,
    by_inode: HashMap<(u64, u64), i32>,
}

/// One watched directory.
#[derive(Clone)]
struct Watched {
    dir_id: u64,
    node: Arc<Node>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("watches", &self.watcher.state.lock().by_wd.len())
            .finish()
    }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl Subscription {
    /// Creates the inotify instance and starts the reader thread.
    fn start(root_dev: u64, max_watches: usize, sink: BreakSink) -> io::Result<Subscription> {
        // SAFETY: plain system calls; results checked by `owned`.
        let inotify = owned(unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) })?;
        // SAFETY: as above.
        let wake = owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        let watcher = Arc::new(Watcher {
            inotify,
            max_watches,
            wake,
            root_dev,
            sink: Mutex::new(sink),
            state: Mutex::new(State::default()),
            reading: Mutex::new(()),
            stop: AtomicBool::new(false),
            all_pending: AtomicBool::new(false),
            warned: AtomicBool::new(false),
        });
        let w = watcher.clone();
        let thread = std::thread::Builder::new()
            .name("hoardfs-inotify".into())
            .spawn(move || w.run())?;
        Ok(Subscription {
            watcher,
            thread: Some(thread),
        })
    }

    /// Watches directory `node` unless its inode is watched already. On failure (the
    /// kernel's watch limit, or `max_watches`: each watch keeps its directory open, so
    /// they are bounded like the handles) callbacks can no longer be promised: warns once
    /// and breaks everything.
    pub fn watch_dir(&self, node: &Arc<Node>) {
        let w = &self.watcher;
        let key = (node.dev, node.ino);
        {
            let state = w.state.lock();
            if state.by_inode.contains_key(&key) {
                node.set_watched();
                return;
            }
            if state.by_wd.len() >= w.max_watches {
                drop(state);
                w.cannot_watch(|| {
                    format!(
                        "{} directories are watched already (each holds a descriptor: the \
                         bound is half of what the open-file limit leaves after connections \
                         and open files)",
                        w.max_watches
                    )
                });
                return;
            }
        }
        let path = sys::fd_path(node.fd.as_raw_fd());
        // SAFETY: valid C string; the kernel validates the descriptor.
        let wd = unsafe { libc::inotify_add_watch(w.inotify.as_raw_fd(), path.as_ptr(), MASK) };
        if wd < 0 {
            let e = io::Error::last_os_error();
            w.cannot_watch(|| format!("{e} (raise fs.inotify.max_user_watches?)"));
            return;
        }
        let watched = Watched {
            dir_id: file_id_of(w.root_dev, node.dev, node.ino),
            node: node.clone(),
        };
        node.set_watched();
        let mut state = w.state.lock();
        state.by_wd.insert(wd, watched);
        state.by_inode.insert(key, wd);
    }

    /// Directories watched now.
    #[cfg(test)]
    pub(crate) fn watched(&self) -> usize {
        self.watcher.state.lock().by_wd.len()
    }

    /// Reports, from the calling thread, every event queued on the descriptor now (the
    /// changes made before this call): the server calls it after each request and before
    /// its reply, so that a client whose request succeeded only after another client's
    /// change (its `O_EXCL` create after the other's unlink of a lock file) has the breaks
    /// of the changes made before that change ahead of the reply, not after it. A read
    /// that finds nothing costs one system call.
    pub fn settle(&self) {
        let w = &self.watcher;
        let _one = w.reading.lock();
        let mut buf = [0u8; 8192];
        loop {
            let mut batch = Batch::default();
            if !w.read_events(&mut buf, &mut batch) {
                return;
            }
            w.report(batch);
        }
    }

    /// Replaces the sink.
    fn set_sink(&self, sink: BreakSink) {
        *self.watcher.sink.lock() = sink;
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watcher.stop.store(true, Ordering::Release);
        self.watcher.wake();
        if let Some(t) = self.thread.take() {
            // The sink may have dropped the last reference to the origin on the thread itself.
            if t.thread().id() != std::thread::current().id() {
                let _ = t.join();
            }
        }
    }
}

/// One event read from the inotify descriptor.
struct Event {
    wd: i32,
    mask: u32,
    name: Vec<u8>,
}

/// Splits a buffer filled by `read` into events.
fn parse(buf: &[u8]) -> Vec<Event> {
    let header = std::mem::size_of::<libc::inotify_event>();
    let mut events = Vec::new();
    let mut at = 0;
    while at + header <= buf.len() {
        // SAFETY: at least `header` bytes remain; read_unaligned copes with any alignment.
        let ev: libc::inotify_event =
            unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let start = at + header;
        let end = (start + ev.len as usize).min(buf.len());
        let raw = &buf[start..end];
        let name = raw.split(|&b| b == 0).next().unwrap_or(&[]).to_vec();
        events.push(Event {
            wd: ev.wd,
            mask: ev.mask,
            name,
        });
        at = end;
    }
    events
}

/// Breaks built from one batch, without duplicates, in first-seen order.
#[derive(Default)]
struct Batch {
    breaks: Vec<Break>,
    seen: HashSet<Break>,
}

impl Batch {
    fn push(&mut self, b: Break) {
        if self.seen.insert(b.clone()) {
            self.breaks.push(b);
        }
    }
}

impl Watcher {
    /// A directory cannot be watched (`why`): callbacks can no longer be promised, so
    /// clients are told to revalidate everything (at most once a second); warns once.
    fn cannot_watch(&self, why: impl FnOnce() -> String) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "cannot watch a directory: {}; clients are told to revalidate everything",
                why()
            );
        }
        if !self.all_pending.swap(true, Ordering::AcqRel) {
            self.wake();
        }
    }

    fn wake(&self) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a valid u64 to our eventfd; failure (counter full)
        // still leaves the eventfd readable, which is all a wake-up needs.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn attr_break(&self, st: &libc::stat) -> Break {
        let file_id = file_id_of(self.root_dev, st.st_dev, st.st_ino);
        Break::Attr {
            file_id,
            change_id: hoardfs_proto::change_id(&sys::attr_of(st, file_id)),
        }
    }

    /// The reader thread's loop.
    fn run(self: Arc<Self>) {
        let mut buf = vec![0u8; 64 * 1024];
        let mut last_all: Option<Instant> = None;
        loop {
            let mut timeout = -1;
            if self.all_pending.load(Ordering::Acquire)
                && let Some(t) = last_all
            {
                let left = ALL_INTERVAL.saturating_sub(t.elapsed());
                timeout = left.as_millis() as i32 + 1;
            }
            let mut fds = [
                poll_fd(self.inotify.as_raw_fd()),
                poll_fd(self.wake.as_raw_fd()),
            ];
            // SAFETY: two valid pollfd entries.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout) };
            if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                tracing::error!(error = %io::Error::last_os_error(), "inotify poll failed");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            if fds[1].revents != 0 {
                let mut v = 0u64;
                // SAFETY: reads 8 bytes into a valid u64 (drains the eventfd).
                unsafe { libc::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            let mut batch = Batch::default();
            // (Held until the batch is reported: a `settle` meanwhile reports after it.)
            let reading = self.reading.lock();
            if fds[0].revents != 0 {
                // (A `settle` may have read the events first.)
                self.read_events(&mut buf, &mut batch);
            }
            if self.all_pending.load(Ordering::Acquire)
                && last_all.is_none_or(|t| t.elapsed() >= ALL_INTERVAL)
            {
                self.all_pending.store(false, Ordering::Release);
                last_all = Some(Instant::now());
                // Everything else in the batch is implied.
                batch.breaks = vec![Break::All];
            }
            self.report(batch);
            drop(reading);
        }
    }

    /// Reads the events queued on the (non-blocking) descriptor, as many as `buf` holds,
    /// into `batch`; false if there were none. Called under `reading`.
    fn read_events(&self, buf: &mut [u8], batch: &mut Batch) -> bool {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::read(self.inotify.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            return false;
        }
        self.translate(parse(&buf[..n as usize]), batch);
        true
    }

    /// Hands `batch`'s breaks, if any, to the sink. Called under `reading`.
    fn report(&self, batch: Batch) {
        if !batch.breaks.is_empty() {
            let sink = self.sink.lock().clone();
            sink(batch.breaks);
        }
    }

    /// Turns events into breaks (see the module documentation).
    fn translate(&self, events: Vec<Event>, batch: &mut Batch) {
        // Resolve watch descriptors in order, so events before an IN_IGNORED still count.
        let mut resolved = Vec::with_capacity(events.len());
        {
            let mut state = self.state.lock();
            for ev in events {
                if ev.mask & libc::IN_Q_OVERFLOW != 0 {
                    self.all_pending.store(true, Ordering::Release);
                } else if ev.mask & libc::IN_IGNORED != 0 {
                    if let Some(w) = state.by_wd.remove(&ev.wd) {
                        let key = (w.node.dev, w.node.ino);
                        if state.by_inode.get(&key) == Some(&ev.wd) {
                            state.by_inode.remove(&key);
                        }
                    }
                } else if let Some(w) = state.by_wd.get(&ev.wd) {
                    resolved.push((w.clone(), ev));
                }
            }
        }
        let mut stats: HashMap<(u64, Vec<u8>), Option<libc::stat>> = HashMap::new();
        for (w, ev) in resolved {
            let dir_fd = w.node.fd.as_raw_fd();
            if ev.name.is_empty() {
                self.dir_attr(dir_fd, &w, &mut stats, batch);
                continue;
            }
            let st = *stats
                .entry((w.dir_id, ev.name.clone()))
                .or_insert_with(|| stat_child(dir_fd, &ev.name));
            if let Some(st) = &st {
                batch.push(self.attr_break(st));
            }
            if ev.mask & NAME_EVENTS != 0 {
                batch.push(Break::Entry {
                    dir_id: w.dir_id,
                    name: ev.name,
                    file_id: st.map(|st| file_id_of(self.root_dev, st.st_dev, st.st_ino)),
                });
                self.dir_attr(dir_fd, &w, &mut stats, batch);
            }
        }
    }

    /// `Break::Attr` for a watched directory itself (nothing if it cannot be stat'ed).
    fn dir_attr(
        &self,
        dir_fd: RawFd,
        w: &Watched,
        stats: &mut HashMap<(u64, Vec<u8>), Option<libc::stat>>,
        batch: &mut Batch,
    ) {
        let st = *stats
            .entry((w.dir_id, Vec::new()))
            .or_insert_with(|| sys::fstat(dir_fd).ok());
        if let Some(st) = &st {
            batch.push(self.attr_break(st));
        }
    }
}

/// `stat` of `dir/name` without following it; `None` if it does not exist (or cannot be
/// named, e.g. a name with a NUL, which the kernel never reports).
fn stat_child(dir: RawFd, name: &[u8]) -> Option<libc::stat> {
    let name = std::ffi::CString::new(name).ok()?;
    sys::fstatat(dir, &name).ok()
}

fn poll_fd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

impl LocalOrigin {
    /// [`crate::Origin::subscribe`]: starts (or re-targets) the inotify subscription and
    /// watches every directory already handed out. False if inotify is unavailable.
    pub(super) fn subscribe_inotify(&self, sink: BreakSink) -> bool {
        if let Some(sub) = self.watch.get() {
            sub.set_sink(sink);
            return true;
        }
        let sub = match Subscription::start(self.root_dev, self.opts.max_watches, sink.clone()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "inotify unavailable: no callbacks from this export");
                return false;
            }
        };
        if let Err(ours) = self.watch.set(sub) {
            // Another subscribe won the race: keep its thread, use our sink.
            drop(ours);
        }
        let sub = self.watch.get().expect("set above");
        sub.set_sink(sink);
        let outside = self.outside.get_or_init(|| {
            match OutsideWrites::start(self.handles.clone(), self.locks.clone()) {
                Ok(o) => Some(o),
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        "cannot watch for writes by other processes on this machine \
                         (fanotify needs CAP_SYS_ADMIN): a client writing a file at the same \
                         moment as a local process may keep a stale copy of it \
                         (doc/SEMANTICS.md, \"Writes on the server\")"
                    );
                    None
                }
            }
        });
        // Directories registered from now on are watched by `register`; these are the
        // ones registered before, the root first (within the bound whatever happens).
        let root = self
            .handles
            .get(self.root_handle())
            .ok()
            .map(|n| (n.dev, n.ino));
        let mut dirs = self.handles.select(|n| n.kind == FileKind::Dir);
        dirs.sort_by_key(|n| Some((n.dev, n.ino)) != root);
        for node in dirs {
            sub.watch_dir(&node);
            if let Some(o) = outside {
                o.watch_dir(&node);
            }
        }
        true
    }
}
