//! Writes made by other processes on the server to files clients are using.
//!
//! A file's version is a hash of its `stat` (see [`super::sys::version_of`]), and the
//! kernel updates a file's mtime *before* it copies a write's bytes, with one timestamp for
//! writes that land in the same instant. So a version taken while another process writes
//! can cover bytes the reader never saw: the `stat`s bracketing a client's write (or read)
//! report a version that includes another process's bytes, the client adopts it for what
//! it cached, and the later callback break for that other write carries the same version
//! and is ignored. The client would serve those stale bytes for good.
//!
//! This watcher closes that gap. A fanotify group (it needs `CAP_SYS_ADMIN`; without it the
//! server warns once and [`doc/SEMANTICS.md`] says what is lost) reports `FAN_MODIFY` for
//! the children of every directory the export has handed out, with the writer's pid. A
//! modification by any process other than this one, of a file whose data this origin read
//! or wrote for a client within [`RACE_WINDOW`], makes the watcher move the file's mtime
//! forward by one nanosecond, under the file's write lock (so it cannot fall between the
//! `stat`s of a client's write). The file then has a version nobody can have adopted, the
//! inotify watcher sends the break for it, and every client drops its copy. fanotify queues
//! the event only after the write's bytes are in place, so the new version covers them.
//!
//! Locks: the thread takes a file's shard of [`super::write::WriteLocks`] around the
//! `futimens` only, and the handle table's lock (a leaf) to find the file.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::handles::{HandleTable, Node};
use super::sys;
use super::write::WriteLocks;

/// How long after a client's read or write of a file another process's write to it still
/// gets the file's mtime moved. A write racing a client's I/O ends after that I/O began;
/// this bounds how long such a write may take.
pub const RACE_WINDOW: Duration = Duration::from_secs(60);

const MASK: u64 = libc::FAN_MODIFY | libc::FAN_EVENT_ON_CHILD;

/// The running fanotify watcher; stopped and joined on drop.
pub struct OutsideWrites {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

struct Inner {
    fan: OwnedFd,
    wake: OwnedFd,
    stop: AtomicBool,
    handles: Arc<HandleTable>,
    locks: Arc<WriteLocks>,
    warned: AtomicBool,
    bumps: AtomicU64,
}

impl std::fmt::Debug for OutsideWrites {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutsideWrites").finish_non_exhaustive()
    }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl OutsideWrites {
    /// Creates the fanotify group and starts its reader thread. Fails without
    /// `CAP_SYS_ADMIN` (or on a kernel without fanotify).
    pub fn start(handles: Arc<HandleTable>, locks: Arc<WriteLocks>) -> io::Result<OutsideWrites> {
        // SAFETY: plain system calls; results checked by `owned`.
        let fan = owned(unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as u32,
            )
        })?;
        // SAFETY: as above.
        let wake = owned(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        let inner = Arc::new(Inner {
            fan,
            wake,
            stop: AtomicBool::new(false),
            handles,
            locks,
            warned: AtomicBool::new(false),
            bumps: AtomicU64::new(0),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("hoardfs-fanotify".into())
            .spawn(move || i.run())?;
        Ok(OutsideWrites {
            inner,
            thread: Some(thread),
        })
    }

    /// Reports modifications of the files in directory `node`.
    pub fn watch_dir(&self, node: &Node) {
        let path = sys::fd_path(node.fd.as_raw_fd());
        // SAFETY: valid C string; the kernel validates the descriptor.
        let r = unsafe {
            libc::fanotify_mark(
                self.inner.fan.as_raw_fd(),
                libc::FAN_MARK_ADD,
                MASK,
                libc::AT_FDCWD,
                path.as_ptr(),
            )
        };
        if r < 0 && !self.inner.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                error = %io::Error::last_os_error(),
                "cannot watch a directory for writes by other processes on this machine"
            );
        }
    }

    /// How many files had their mtime moved so far.
    pub fn bumps(&self) -> u64 {
        self.inner.bumps.load(Ordering::Relaxed)
    }
}

impl Drop for OutsideWrites {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.inner.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One event: its mask, writer pid and (owned) descriptor of the modified object.
struct Event {
    mask: u64,
    pid: i32,
    fd: Option<OwnedFd>,
}

/// Splits a `read` of the fanotify descriptor into events, taking ownership of their
/// descriptors. Stops at anything malformed (a kernel with another metadata version).
fn parse(buf: &[u8]) -> Vec<Event> {
    const META: usize = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut out = Vec::new();
    let mut at = 0;
    while at + META <= buf.len() {
        // SAFETY: `META` bytes are in bounds; the struct is plain data, read unaligned.
        let md: libc::fanotify_event_metadata =
            unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
        let len = md.event_len as usize;
        if md.vers != libc::FANOTIFY_METADATA_VERSION || len < META || at + len > buf.len() {
            break;
        }
        let fd = (md.fd >= 0).then(|| {
            // SAFETY: the kernel opened this descriptor for us; we own it from here.
            unsafe { OwnedFd::from_raw_fd(md.fd) }
        });
        out.push(Event {
            mask: md.mask,
            pid: md.pid,
            fd,
        });
        at += len;
    }
    out
}

fn poll_fd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Moves the mtime of regular file `node` (open at `fd`, any mode, `O_PATH` included) to
/// one nanosecond after both its current mtime and the last one it was moved to: a time
/// no version of the file had. The caller holds the file's write lock.
pub(super) fn move_mtime(node: &Node, fd: RawFd) -> io::Result<()> {
    let st = sys::fstat(fd)?;
    let now = (st.st_mtime as i64)
        .saturating_mul(1_000_000_000)
        .saturating_add(st.st_mtime_nsec as i64);
    let to = now.max(node.bumped_to()).saturating_add(1);
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: to.div_euclid(1_000_000_000),
            tv_nsec: to.rem_euclid(1_000_000_000),
        },
    ];
    // Through `/proc/self/fd`, which also works for an `O_PATH` descriptor.
    let path = sys::fd_path(fd);
    // SAFETY: valid C string and a two-element timespec array.
    if unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    node.set_bumped_to(to);
    Ok(())
}

impl Inner {
    fn run(self: Arc<Self>) {
        let me = std::process::id() as i32;
        // Small: the kernel opens a descriptor for every event a read returns.
        let mut buf = vec![0u8; 4096];
        while !self.stop.load(Ordering::Acquire) {
            let mut fds = [
                poll_fd(self.fan.as_raw_fd()),
                poll_fd(self.wake.as_raw_fd()),
            ];
            // SAFETY: `fds` is a valid array of two pollfd.
            let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if r < 0 {
                if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::warn!("fanotify poll failed: {}", io::Error::last_os_error());
                return;
            }
            if fds[1].revents != 0 {
                continue;
            }
            // SAFETY: reads into our buffer, at most its length.
            let n = unsafe { libc::read(self.fan.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                ) {
                    continue;
                }
                // (EMFILE: the kernel could not open an event's descriptor, and dropped
                // the event.) Whatever was lost, treat it as an overflow.
                tracing::warn!("fanotify read failed: {e}");
                self.bump_all_in_use();
                continue;
            }
            if n == 0 {
                continue;
            }
            for ev in parse(&buf[..n as usize]) {
                if ev.mask & libc::FAN_Q_OVERFLOW != 0 {
                    tracing::warn!("fanotify queue overflowed");
                    self.bump_all_in_use();
                    continue;
                }
                let Some(fd) = ev.fd else { continue };
                if ev.pid == me || ev.mask & libc::FAN_MODIFY == 0 {
                    continue;
                }
                let Ok(st) = sys::fstat(fd.as_raw_fd()) else {
                    continue;
                };
                if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    continue;
                }
                if let Some(node) = self.handles.find(&(st.st_dev, st.st_ino))
                    && node.io_within(RACE_WINDOW)
                {
                    self.bump(&node, fd.as_raw_fd());
                }
            }
        }
    }

    /// Events were lost: moves the mtime of every file served within the window.
    fn bump_all_in_use(&self) {
        tracing::warn!("moving the mtime of every file in use, since writes may have been missed");
        for node in self.handles.select(|n| n.io_within(RACE_WINDOW)) {
            self.bump(&node, node.fd.as_raw_fd());
        }
    }

    /// Moves the mtime of `node` (open at `fd`) forward, under its write lock, so that
    /// its version changes.
    fn bump(&self, node: &Node, fd: RawFd) {
        if node.kind != hoardfs_proto::FileKind::File {
            return;
        }
        let _guard = self.locks.lock(node);
        match move_mtime(node, fd) {
            Ok(()) => {
                self.bumps.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    dev = node.dev,
                    ino = node.ino,
                    "a process on the server wrote a file clients use: its mtime moved"
                );
            }
            Err(e) => tracing::warn!(
                error = %e,
                "cannot move the mtime of a file another process wrote while clients used \
                 it (needs ownership or CAP_FOWNER); clients may keep a stale copy of it"
            ),
        }
    }
}
