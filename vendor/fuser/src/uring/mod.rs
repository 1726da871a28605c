//! FUSE over io_uring (Linux 6.14+, FUSE ABI 7.42): the kernel's per-CPU request queues.
//!
//! Once INIT has negotiated `FUSE_OVER_IO_URING` (the kernel offers it only while the `fuse`
//! module's `enable_uring` parameter is set), the daemon registers ring entries on every
//! queue, one queue per possible CPU. When every queue has one, the kernel sends each request
//! (all but FORGET, INTERRUPT and notifications, which stay on `/dev/fuse`) to the queue of
//! the CPU its caller runs on, as the completion of the entry's last command: the request's
//! header, its opcode's fixed arguments and its payload land in the entry's buffers. The
//! daemon answers by writing the reply into the same buffers and submitting
//! `COMMIT_AND_FETCH`, which hands the entry back for the next request in the same system
//! call. Compared with `read`/`writev` on `/dev/fuse` this saves a system call per request
//! and, because a queue's threads are pinned to its CPU, the cross-CPU wake-up of the daemon.
//!
//! Each [`RingThread`] owns one io_uring instance with one entry, so it blocks in exactly one
//! request at a time like a `/dev/fuse` thread does: a slow request (a network fetch) holds
//! one entry and the queue's other threads take the next requests. The request is copied
//! into the contiguous layout this crate parses (`fuse_in_header`, arguments, payload) and
//! dispatched as usual; its reply goes through [`RingReply`] into the entry, and the thread
//! commits once the reply is there (it may come from another thread).
//!
//! The thread ends when the kernel completes its command with an error, which it does for
//! every registered entry when the connection ends (unmount or abort).

use parking_lot::Condvar;
use parking_lot::Mutex;
use std::io;
use std::io::IoSlice;
use std::os::fd::AsFd;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use io_uring::IoUring;
use io_uring::cqueue;
use io_uring::opcode;
use io_uring::squeue;
use io_uring::types;
use log::debug;
use log::error;
use log::warn;

use crate::Filesystem;
use crate::channel::Channel;
use crate::ll::Operation;
use crate::ll::fuse_abi::fuse_in_header;
use crate::reply::ReplyEmpty;
use crate::reply::ReplySender;
use crate::request::RequestWithSender;
use crate::session::SessionEventLoop;

mod slot;

use slot::EntInOut;
use slot::EntryBufs;
use slot::ReqHeader;
pub(crate) use slot::RingReply;
pub(crate) use slot::RingSlot;

/// `enum fuse_uring_cmd` (include/uapi/linux/fuse.h, 7.42).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `FUSE_URING_IN_OUT_HEADER_SZ`, `FUSE_URING_OP_IN_OUT_SZ`.
const IN_OUT_HEADER_SZ: usize = 128;
const OP_IN_OUT_SZ: usize = 128;
const IN_HEADER_SZ: usize = size_of::<fuse_in_header>();
/// `sizeof(struct fuse_out_header)`.
const OUT_HEADER_SZ: usize = 16;

/// Ring threads serving a registered entry now, and requests ring threads answered in this
/// process (for a daemon's statistics: whether its mount is served over io_uring, and how
/// much).
static RING_THREADS: AtomicUsize = AtomicUsize::new(0);
static RING_REQUESTS: AtomicU64 = AtomicU64::new(0);

/// Ring threads serving a registered entry now (0: requests go through `/dev/fuse`).
pub fn ring_threads() -> usize {
    RING_THREADS.load(Relaxed)
}

/// Requests answered over io_uring in this process.
pub fn ring_requests() -> u64 {
    RING_REQUESTS.load(Relaxed)
}

/// How the transport is configured, in [`crate::Config::io_uring`].
#[derive(Debug, Clone, Copy, Eq, PartialEq)]
pub struct RingConfig {
    /// Threads (each with one ring entry) per CPU queue: how many requests from callers on
    /// one CPU can be in the daemon at once.
    pub threads_per_queue: usize,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            threads_per_queue: 4,
        }
    }
}

/// The CPU queues the kernel has for a connection: one per possible CPU
/// (`/sys/devices/system/cpu/possible`, e.g. `0-1` or `0,2-3`).
pub(crate) fn possible_cpus() -> io::Result<Vec<u16>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim())
        .ok_or_else(|| io::Error::other(format!("cannot parse the possible CPUs {text:?}")))
}

fn parse_cpu_list(text: &str) -> Option<Vec<u16>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u16>().ok()?, b.parse::<u16>().ok()?),
            None => {
                let a = part.parse::<u16>().ok()?;
                (a, a)
            }
        };
        if b < a || b - a > 4096 {
            return None;
        }
        cpus.extend(a..=b);
    }
    Some(cpus)
}

/// One ring entry: its own io_uring instance and its buffers, not yet or no longer known to
/// the kernel until `register`.
struct Entry {
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    slot: Arc<RingSlot>,
    /// The two iovecs of `CMD_REGISTER` (`struct iovec` is a pointer and a length), boxed so
    /// that they stay put until the kernel has read them, whenever it issues the command.
    iov: Box<[u64; 4]>,
}

/// Why an entry stopped serving.
enum Ended {
    /// The kernel completed it because the connection ended: it is done with the buffers.
    Connection,
    /// Anything else: the kernel may still own the entry.
    Error(io::Error),
}

impl Entry {
    /// The ring and the buffers, before INIT: a failure here (io_uring disabled by
    /// `kernel.io_uring_disabled` or a seccomp profile, no memory) keeps the session on
    /// `/dev/fuse` rather than leaving the kernel waiting for queues that never come.
    fn new(max_payload: usize) -> io::Result<Entry> {
        let ring: IoUring<squeue::Entry128, cqueue::Entry> =
            IoUring::builder().setup_cqsize(4).build(2)?;
        let slot = Arc::new(RingSlot {
            bufs: Mutex::new(EntryBufs {
                header: Box::new(ReqHeader {
                    in_out: [0; IN_OUT_HEADER_SZ],
                    op_in: [0; OP_IN_OUT_SZ],
                    ent: EntInOut::default(),
                }),
                payload: vec![0u8; max_payload].into_boxed_slice(),
                replied: false,
                seq: 0,
            }),
            replied: Condvar::new(),
        });
        let iov = {
            let mut bufs = slot.bufs.lock();
            Box::new([
                (&mut *bufs.header as *mut ReqHeader) as u64,
                size_of::<ReqHeader>() as u64,
                bufs.payload.as_mut_ptr() as u64,
                bufs.payload.len() as u64,
            ])
        };
        Ok(Entry { ring, slot, iov })
    }

    /// Registers the entry on queue `qid`. The command stays pending until a request comes;
    /// errors the kernel finds at once (a queue id it does not have, a buffer too small,
    /// io_uring not enabled on the connection) complete it during the submission. So can a
    /// request that was waiting for the queues (the last registration releases them):
    /// `Ok(Some(result))` hands that completion on, to be served first.
    fn register(&mut self, fd: i32, qid: u16) -> io::Result<Option<i32>> {
        let sqe = command(fd, CMD_REGISTER, qid, 0, Some(self.iov.as_ptr() as u64));
        // SAFETY: the iovecs and the buffers they point to live in `self` (`iov`, `slot`),
        // which is dropped only once the kernel is done with the entry (`Ended::Connection`)
        // and otherwise leaks its buffers (`abandon`).
        unsafe { self.ring.submission_shared().push(&sqe) }
            .map_err(|_| io::Error::other("ring submission queue full"))?;
        self.ring.submit()?;
        match self.ring.completion().next().map(|cqe| cqe.result()) {
            Some(res) if res < 0 => Err(io::Error::from_raw_os_error(-res)),
            first => Ok(first),
        }
    }

    /// Gives up an entry the kernel may still own: its buffers are leaked, as the kernel
    /// could write a request into them until it has cancelled the command (which it does
    /// once the ring's descriptor, closed here, is gone).
    fn abandon(self) {
        std::mem::forget(self.slot);
        std::mem::forget(self.iov);
        drop(self.ring);
    }
}

/// The entries of every CPU queue, made before INIT (see [`Entry::new`]).
#[derive(Debug)]
pub(crate) struct Prepared {
    entries: Vec<(u16, Entry)>,
    max_payload: usize,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ring entry")
    }
}

/// Makes the entries of every CPU queue: `threads_per_queue` for each online CPU, one for
/// each possible CPU that is not online (the kernel needs every queue to have one before
/// it uses any; requests come from online CPUs only).
pub(crate) fn prepare(config: RingConfig, max_payload: usize) -> io::Result<Prepared> {
    let possible = possible_cpus()?;
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| parse_cpu_list(t.trim()))
        .unwrap_or_else(|| possible.clone());
    let mut entries = Vec::new();
    for &qid in &possible {
        let n = if online.contains(&qid) {
            config.threads_per_queue.max(1)
        } else {
            1
        };
        for _ in 0..n {
            entries.push((qid, Entry::new(max_payload)?));
        }
    }
    Ok(Prepared {
        entries,
        max_payload,
    })
}

/// Starts a thread per prepared entry, once INIT has enabled io_uring: each registers its
/// entry and serves it. Returns once every entry is registered, or with the first error
/// (the caller must then end the session: the kernel holds requests until every queue has
/// an entry).
pub(crate) fn start<FS: Filesystem>(
    prepared: Prepared,
    event_loop: impl Fn(String, Channel) -> SessionEventLoop<FS>,
    ch: &Channel,
) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    let mut threads = Vec::new();
    let count = prepared.entries.len();
    let max_payload = prepared.max_payload;
    for (i, (qid, entry)) in prepared.entries.into_iter().enumerate() {
        let name = format!("fuser-ring-{qid}-{i}");
        let se = event_loop(name.clone(), ch.clone());
        let tx = tx.clone();
        let spawned = std::thread::Builder::new()
            .name(name)
            .spawn(move || serve(qid, entry, max_payload, &se, tx));
        match spawned {
            Ok(t) => threads.push(t),
            // The entry went with the closure, unregistered: nothing of it is the kernel's.
            Err(e) => return Err(io::Error::new(e.kind(), format!("ring thread: {e}"))),
        }
    }
    drop(tx);
    for _ in 0..count {
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(io::Error::other("a ring thread ended before registering")),
        }
    }
    Ok(threads)
}

/// One ring thread: registers `entry` on queue `qid` (reporting the outcome on `registered`)
/// and serves it until the connection ends. An entry that fails otherwise is abandoned and
/// replaced by a new one (retried until it works), so that a queue keeps its capacity.
fn serve<FS: Filesystem>(
    qid: u16,
    entry: Entry,
    max_payload: usize,
    se: &SessionEventLoop<FS>,
    registered: std::sync::mpsc::Sender<io::Result<()>>,
) -> io::Result<()> {
    pin_to_cpu(qid);
    let fd = se.ch.as_fd().as_raw_fd();
    let mut request = AlignedBuf::new(IN_HEADER_SZ + OP_IN_OUT_SZ + max_payload);
    let mut report = Some(registered);
    let mut entry = Some(entry);
    loop {
        // A new entry after a failure; making one can fail too (no memory): try again.
        let mut current = match entry.take() {
            Some(e) => e,
            None => match Entry::new(max_payload) {
                Ok(e) => e,
                Err(e) => {
                    error!("FUSE ring queue {qid}: a new entry: {e}; trying again");
                    std::thread::sleep(RETRY);
                    continue;
                }
            },
        };
        let first = match current.register(fd, qid) {
            Ok(first) => first,
            Err(e) => {
                let ended = connection_ended(&e);
                let e = io::Error::new(e.kind(), format!("FUSE ring queue {qid}: register: {e}"));
                current.abandon();
                if let Some(r) = report.take() {
                    // Before the session runs: it fails with this error.
                    let _ = r.send(Err(io::Error::new(e.kind(), e.to_string())));
                    return Err(e);
                }
                if ended {
                    return Ok(());
                }
                // Later, the queue would stay an entry short (and a queue whose every
                // entry is gone leaves its CPU's callers waiting): keep trying.
                error!("{e}; trying again");
                std::thread::sleep(RETRY);
                continue;
            }
        };
        RING_THREADS.fetch_add(1, Relaxed);
        if let Some(r) = report.take() {
            let _ = r.send(Ok(()));
        }
        let ended = serve_entry(&mut current, first, qid, fd, se, &mut request);
        RING_THREADS.fetch_sub(1, Relaxed);
        match ended {
            Ended::Connection => return Ok(()),
            Ended::Error(e) => {
                error!("FUSE ring queue {qid}: {e}; replacing the entry");
                current.abandon();
            }
        }
    }
}

/// How long a ring thread waits before trying again to make or register an entry.
const RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// Whether an error from a ring command means the connection is gone.
fn connection_ended(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN | libc::ENODEV | libc::ECONNABORTED)
    )
}

/// Serves one registered entry: waits for a request (or takes `first`, a completion
/// already reaped), dispatches it, commits the reply and fetches the next, until the entry's
/// command fails.
fn serve_entry<FS: Filesystem>(
    entry: &mut Entry,
    mut first: Option<i32>,
    qid: u16,
    fd: i32,
    se: &SessionEventLoop<FS>,
    request: &mut AlignedBuf,
) -> Ended {
    loop {
        let res = match first.take().map_or_else(|| wait(&mut entry.ring), Ok) {
            Ok(res) => res,
            Err(e) => return Ended::Error(e),
        };
        if res < 0 {
            let err = io::Error::from_raw_os_error(-res);
            // The connection ended (unmount, abort): every entry completes so.
            if connection_ended(&err) {
                debug!("ring queue {qid}: connection ended ({err})");
                return Ended::Connection;
            }
            return Ended::Error(err);
        }
        RING_REQUESTS.fetch_add(1, Relaxed);
        let slot = &entry.slot;
        let Taken {
            commit_id,
            seq,
            len,
        } = take_request(slot, request);
        match len {
            Some(len) => {
                let sender = ReplySender::Ring(RingReply {
                    slot: slot.clone(),
                    seq,
                    ch: se.ch.sender(),
                });
                match RequestWithSender::new(sender, &request.as_slice()[..len]) {
                    // DESTROY (sent at unmount of fuseblk mounts) needs no work here: the
                    // session destroys the file system once every thread has ended, and
                    // this one goes on until the kernel completes the entry.
                    Some(req) if matches!(req.request.operation(), Ok(Operation::Destroy(_))) => {
                        req.reply::<ReplyEmpty>().ok();
                    }
                    Some(req) => {
                        let done = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            req.dispatch(se);
                        }));
                        if done.is_err() {
                            // The reply's drop answers EIO when the handler had it; if it
                            // never got that far, answer here, so that the entry goes back.
                            error!("FUSE ring queue {qid}: a request handler panicked");
                            if !is_replied(slot) {
                                reply_errno(slot, se, libc::EIO);
                            }
                        }
                    }
                    None => reply_errno(slot, se, libc::EIO),
                }
            }
            None => reply_errno(slot, se, libc::EIO),
        }
        // A reply may be sent from another thread; the entry is committed once it is in.
        slot.wait_for_reply();
        let sqe = command(fd, CMD_COMMIT_AND_FETCH, qid, commit_id, None);
        // SAFETY: the command carries no buffer of its own; the entry's buffers were
        // registered and live in `entry`.
        if unsafe { entry.ring.submission_shared().push(&sqe) }.is_err() {
            return Ended::Error(io::Error::other("ring submission queue full"));
        }
    }
}

/// Submits what is queued and waits for the entry's completion; returns its result. A
/// submission the kernel cannot take now (`EAGAIN`, `EBUSY`, `ENOMEM`: the command stays
/// queued) is tried again, as giving up would leave a committed reply unsent and its
/// caller waiting.
fn wait(ring: &mut IoUring<squeue::Entry128, cqueue::Entry>) -> io::Result<i32> {
    loop {
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EAGAIN | libc::EBUSY | libc::ENOMEM)
                ) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e),
        }
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe.result());
        }
    }
}

fn is_replied(slot: &RingSlot) -> bool {
    slot.bufs.lock().replied
}

/// The request an entry received, as [`take_request`] took it.
struct Taken {
    /// What `COMMIT_AND_FETCH` names the entry by.
    commit_id: u64,
    /// The request's number on the entry (`EntryBufs::seq`), which its reply carries.
    seq: u64,
    /// Its length in the copy, `None` if the kernel's sizes do not add up (the request is
    /// then answered EIO).
    len: Option<usize>,
}

/// Takes the request now in the entry (a new `seq`, not replied) and copies it into `out`
/// as `fuse_in_header`, the opcode's fixed arguments and the payload.
fn take_request(slot: &RingSlot, out: &mut AlignedBuf) -> Taken {
    let mut bufs = slot.bufs.lock();
    bufs.replied = false;
    bufs.seq += 1;
    Taken {
        commit_id: bufs.header.ent.commit_id,
        seq: bufs.seq,
        len: copy_request(&bufs, out),
    }
}

fn copy_request(bufs: &EntryBufs, out: &mut AlignedBuf) -> Option<usize> {
    let header = &bufs.header;
    let len = u32::from_ne_bytes(header.in_out[0..4].try_into().ok()?) as usize;
    let payload_sz = header.ent.payload_sz as usize;
    // The header's `len` counts all arguments: what the payload does not hold is the
    // opcode's fixed arguments, in `op_in`.
    let op_sz = len.checked_sub(IN_HEADER_SZ)?.checked_sub(payload_sz)?;
    if op_sz > OP_IN_OUT_SZ || payload_sz > bufs.payload.len() {
        warn!("ring request with len {len}, payload {payload_sz}: sizes do not add up");
        return None;
    }
    let dst = out.as_mut_slice().get_mut(..len)?;
    dst[..IN_HEADER_SZ].copy_from_slice(&header.in_out[..IN_HEADER_SZ]);
    dst[IN_HEADER_SZ..IN_HEADER_SZ + op_sz].copy_from_slice(&header.op_in[..op_sz]);
    dst[IN_HEADER_SZ + op_sz..].copy_from_slice(&bufs.payload[..payload_sz]);
    Some(len)
}

/// Answers the request now in the entry with an error (requests that cannot be parsed, or
/// whose handler panicked before replying).
fn reply_errno<FS: Filesystem>(slot: &Arc<RingSlot>, se: &SessionEventLoop<FS>, errno: i32) {
    let (unique, seq) = {
        let bufs = slot.bufs.lock();
        let unique = u64::from_ne_bytes(bufs.header.in_out[8..16].try_into().unwrap_or([0; 8]));
        (unique, bufs.seq)
    };
    let mut header = [0u8; OUT_HEADER_SZ];
    header[0..4].copy_from_slice(&(OUT_HEADER_SZ as u32).to_ne_bytes());
    header[4..8].copy_from_slice(&(-errno).to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    let reply = RingReply {
        slot: slot.clone(),
        seq,
        ch: se.ch.sender(),
    };
    if let Err(e) = reply.send(&[IoSlice::new(&header)]) {
        error!("ring error reply: {e}");
    }
}

/// The SQE of a FUSE ring command: `struct fuse_uring_cmd_req` in the command area, and for
/// `CMD_REGISTER` the entry's two iovecs.
fn command(fd: i32, cmd: u32, qid: u16, commit_id: u64, iov: Option<u64>) -> squeue::Entry128 {
    let mut req = [0u8; 80];
    // flags (u64) = 0, commit_id (u64), qid (u16), padding.
    req[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    req[16..18].copy_from_slice(&qid.to_ne_bytes());
    let mut op = opcode::UringCmd80::new(types::Fd(fd), cmd).cmd(req);
    if let Some(iov) = iov {
        op = op.addr(Some(iov));
    }
    let sqe = op.build();
    match iov {
        Some(_) => set_len(sqe, 2),
        None => sqe,
    }
}

/// Sets an SQE's `len` (the iovec count of `CMD_REGISTER`), which `UringCmd80` has no
/// setter for.
fn set_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    // SAFETY: `Entry128` is `#[repr(C)]`: a `struct io_uring_sqe` (64 bytes) and 64 command
    // bytes, so it is 128 plain bytes; in `struct io_uring_sqe`, `len` is the `u32` at byte
    // offset 24 (after opcode, flags, ioprio, fd, off and addr), a fixed kernel ABI.
    unsafe {
        let mut bytes: [u8; 128] = std::mem::transmute(sqe);
        bytes[24..28].copy_from_slice(&len.to_ne_bytes());
        std::mem::transmute::<[u8; 128], squeue::Entry128>(bytes)
    }
}

fn pin_to_cpu(cpu: u16) {
    // SAFETY: plain libc calls on a local cpu_set_t.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(usize::from(cpu), &mut set);
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) != 0 {
            // An offline CPU: its queue is registered all the same (the kernel needs every
            // queue), the thread just runs anywhere.
            debug!(
                "ring queue {cpu}: not pinned: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// A request buffer aligned for `fuse_in_header` (this crate parses it in place).
struct AlignedBuf(Vec<u64>);

impl AlignedBuf {
    fn new(bytes: usize) -> Self {
        AlignedBuf(vec![0u64; bytes.div_ceil(8)])
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: a u64 slice viewed as its bytes.
        unsafe { std::slice::from_raw_parts(self.0.as_ptr().cast(), self.0.len() * 8) }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: a u64 slice viewed as its bytes.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_mut_ptr().cast(), self.0.len() * 8) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0,2-3"), Some(vec![0, 2, 3]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    fn slot(payload: usize, seq: u64) -> Arc<RingSlot> {
        Arc::new(RingSlot {
            bufs: Mutex::new(EntryBufs {
                header: Box::new(ReqHeader {
                    in_out: [0xee; IN_OUT_HEADER_SZ],
                    op_in: [0; OP_IN_OUT_SZ],
                    ent: EntInOut::default(),
                }),
                payload: vec![0u8; payload].into_boxed_slice(),
                replied: false,
                seq,
            }),
            replied: Condvar::new(),
        })
    }

    fn reply(slot: &Arc<RingSlot>, seq: u64) -> RingReply {
        let null = std::fs::File::open("/dev/null").unwrap();
        RingReply {
            slot: slot.clone(),
            seq,
            ch: Channel::new(Arc::new(crate::dev_fuse::DevFuse(null))).sender(),
        }
    }

    fn out_header(error: i32, unique: u64) -> [u8; OUT_HEADER_SZ] {
        let mut h = [0u8; OUT_HEADER_SZ];
        h[4..8].copy_from_slice(&error.to_ne_bytes());
        h[8..16].copy_from_slice(&unique.to_ne_bytes());
        h
    }

    #[test]
    fn a_reply_goes_to_the_header_area_and_the_payload() {
        let s = slot(64, 1);
        let h = out_header(0, 7);
        // The header split over two slices, the arguments over three.
        let parts = [&h[..10], &h[10..], b"abc", b"", b"defg"];
        let iov: Vec<IoSlice<'_>> = parts.iter().map(|p| IoSlice::new(p)).collect();
        reply(&s, 1).send(&iov).unwrap();
        let b = s.bufs.lock();
        assert!(b.replied);
        assert_eq!(b.header.ent.payload_sz, 7);
        assert_eq!(&b.payload[..7], b"abcdefg");
        assert_eq!(
            u32::from_ne_bytes(b.header.in_out[0..4].try_into().unwrap()),
            23
        );
        assert_eq!(&b.header.in_out[4..16], &h[4..16]);
        // The rest of the header area (the request's leftovers) is cleared.
        assert!(b.header.in_out[16..].iter().all(|&x| x == 0));
    }

    #[test]
    fn a_reply_larger_than_the_payload_buffer_is_answered_eio() {
        let s = slot(4, 1);
        let h = out_header(0, 9);
        reply(&s, 1)
            .send(&[IoSlice::new(&h), IoSlice::new(b"12345678")])
            .unwrap();
        let b = s.bufs.lock();
        assert_eq!(b.header.ent.payload_sz, 0);
        let err = i32::from_ne_bytes(b.header.in_out[4..8].try_into().unwrap());
        assert_eq!(err, -libc::EIO);
        assert_eq!(&b.header.in_out[8..16], &9u64.to_ne_bytes());
    }

    #[test]
    fn only_one_reply_is_taken_and_only_for_its_own_request() {
        let s = slot(16, 2);
        let h = out_header(0, 1);
        // A late reply to the entry's previous request is refused...
        assert!(reply(&s, 1).send(&[IoSlice::new(&h)]).is_err());
        assert!(!s.bufs.lock().replied);
        // ...its own is taken, once.
        reply(&s, 2)
            .send(&[IoSlice::new(&h), IoSlice::new(b"x")])
            .unwrap();
        assert!(reply(&s, 2).send(&[IoSlice::new(&h)]).is_err());
        assert_eq!(s.bufs.lock().header.ent.payload_sz, 1);
        // A reply shorter than its header is refused, and the request answered EIO (its
        // entry must be committed), under the request's own unique id.
        let s = slot(16, 1);
        assert!(reply(&s, 1).send(&[IoSlice::new(&h[..8])]).is_err());
        let b = s.bufs.lock();
        assert!(b.replied);
        let err = i32::from_ne_bytes(b.header.in_out[4..8].try_into().unwrap());
        assert_eq!(err, -libc::EIO);
        assert_eq!(&b.header.in_out[8..16], &[0xee; 8]);
    }

    #[test]
    fn a_direct_reply_is_written_into_the_payload_once_for_its_own_request() {
        let s = slot(16, 2);
        let header = |b: &EntryBufs| {
            (
                u32::from_ne_bytes(b.header.in_out[0..4].try_into().unwrap()),
                i32::from_ne_bytes(b.header.in_out[4..8].try_into().unwrap()),
                u64::from_ne_bytes(b.header.in_out[8..16].try_into().unwrap()),
            )
        };
        let mut calls = 0;
        // A late fill for the entry's previous request is refused without writing.
        let mut fill = |buf: &mut [u8]| {
            calls += 1;
            buf.copy_from_slice(b"hello");
            Ok(())
        };
        assert!(reply(&s, 1).fill(5, 5, &mut fill).is_err());
        assert!(!s.bufs.lock().replied);
        reply(&s, 2).fill(5, 5, &mut fill).unwrap();
        {
            let b = s.bufs.lock();
            assert!(b.replied);
            assert_eq!(&b.payload[..5], b"hello");
            assert_eq!(b.header.ent.payload_sz, 5);
            assert_eq!(header(&b), ((OUT_HEADER_SZ + 5) as u32, 0, 5));
            assert!(b.header.in_out[16..].iter().all(|&x| x == 0));
        }
        // Once.
        assert!(reply(&s, 2).fill(5, 5, &mut fill).is_err());
        assert_eq!(calls, 1);
        // Longer than the payload buffer: not called, answered EIO.
        let s = slot(4, 1);
        let mut never = |_: &mut [u8]| -> io::Result<()> { panic!("called") };
        assert!(reply(&s, 1).fill(9, 8, &mut never).is_err());
        assert_eq!(header(&s.bufs.lock()), (OUT_HEADER_SZ as u32, -libc::EIO, 9));
        // A failing fill answers EIO with no payload.
        let s = slot(16, 1);
        let mut failing = |_: &mut [u8]| Err(io::Error::other("stream gone"));
        assert!(reply(&s, 1).fill(3, 8, &mut failing).is_err());
        let b = s.bufs.lock();
        assert_eq!((b.replied, b.header.ent.payload_sz), (true, 0));
        assert_eq!(header(&b), (OUT_HEADER_SZ as u32, -libc::EIO, 3));
    }

    #[test]
    fn abi_sizes() {
        assert_eq!(size_of::<EntInOut>(), 32);
        assert_eq!(size_of::<ReqHeader>(), 288);
        assert_eq!(IN_HEADER_SZ, 40);
    }
}
