//! One multiplexed connection to a `hoardfs serve` process.
//!
//! A [`Conn`] owns a TCP stream, TLS-protected unless the caller chose plaintext (module
//! `tls`). Callers write whole request frames under a mutex and then
//! wait on a private channel; a single reader thread reads reply frames and hands each one to
//! the caller registered under its request id. When the stream breaks (read or write error,
//! malformed reply, or a reply timeout with no sign of life), the connection is marked dead
//! and every waiting caller is woken with [`OriginError::Unreachable`] at once.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
use std::thread;
use std::time::Duration;

use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{Break, Op, PING_INTERVAL, Reply, Request, ServerMessage};
use parking_lot::Mutex;

use super::tls::{self, TlsRead, TlsWrite};
use crate::{BreakSink, OriginError, ReadDst, ReadSlot, Result};
use hoardfs_tls::ClientTls;

/// Where callback breaks go; shared by every connection of one origin, set by `subscribe`.
pub(crate) type SinkSlot = Arc<Mutex<Option<BreakSink>>>;

/// A decoded reply together with the frame's data section.
pub(crate) type Answer = (Reply, Vec<u8>);

/// A waiting caller: where it is woken, and where the data of a read's reply goes if it
/// gave a destination ([`Conn::call_direct`]).
struct Waiter {
    tx: Wake,
    direct: Option<Direct>,
}

/// How a waiter is woken: a caller blocked in `call`, or a callback (`call_later`), run on
/// the reader thread, that must not block.
enum Wake {
    Caller(SyncSender<Result<Answer>>),
    Later(Box<dyn FnOnce(Result<Answer>) + Send>),
}

impl Wake {
    fn try_send(self, r: Result<Answer>) {
        match self {
            // A caller that timed out and left is not waiting any more.
            Wake::Caller(tx) => {
                let _ = tx.try_send(r);
            }
            Wake::Later(answer) => answer(r),
        }
    }
}

/// A read's destination, shared by its caller and the reader thread: whichever takes it
/// out answers it (the reader, filling it from the stream; the caller, after a timeout or
/// a reply without data). A destination the reader took and filled is answered.
#[derive(Clone)]
struct Direct {
    dst: Arc<Mutex<Option<Box<dyn ReadDst>>>>,
    /// The most bytes the read asked for.
    asked: u32,
}

/// Capacity of the reader's buffer; larger data sections bypass it.
const READ_BUF: usize = 64 << 10;

/// State shared between callers and the reader thread.
struct Shared {
    /// Callers waiting for a reply, by request id. `None` once the connection is dead, so
    /// that nobody can register after the final wake-up.
    pending: Mutex<Option<HashMap<u64, Waiter>>>,
    /// False once the connection is dead.
    alive: AtomicBool,
    /// Reply frames received so far (a sign of life).
    frames_rx: AtomicU64,
    /// Request frames sent so far (the pinger stays quiet while this moves).
    frames_tx: AtomicU64,
    /// Peer address, for messages.
    peer: SocketAddr,
    /// Receiver of callback breaks (and of `Break::All` when this connection dies).
    sink: SinkSlot,
}

impl Shared {
    /// Marks the connection dead and wakes every waiting caller with `Lost` (their
    /// requests were sent, or their sending fails and says so).
    fn kill(&self, reason: &str) {
        let was_alive = self.alive.swap(false, Ordering::SeqCst);
        let waiters = self.pending.lock().take();
        if was_alive {
            tracing::debug!(peer = %self.peer, "hoardfs connection lost: {reason}");
            // Callbacks were promised on this connection only: presume them all broken.
            self.deliver(vec![Break::All]);
        }
        for (_, w) in waiters.into_iter().flatten() {
            w.tx.try_send(Err(OriginError::Lost(format!(
                "connection to {} lost: {reason}",
                self.peer
            ))));
        }
    }
}

impl Shared {
    fn deliver(&self, breaks: Vec<Break>) {
        let sink = self.sink.lock().clone();
        if let Some(sink) = sink {
            sink(breaks);
        }
    }
}

/// The write side of a connection.
enum Writer {
    Plain(TcpStream),
    Tls(TlsWrite),
}

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Writer::Plain(s) => s.write(buf),
            Writer::Tls(t) => t.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Writer::Plain(s) => s.write_vectored(bufs),
            Writer::Tls(t) => t.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Writer::Plain(s) => s.flush(),
            Writer::Tls(t) => t.flush(),
        }
    }
}

/// The read side of a connection.
enum Reader {
    Plain(TcpStream),
    Tls(TlsRead),
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Reader::Plain(s) => s.read(buf),
            Reader::Tls(t) => t.read(buf),
        }
    }
}

/// A live (or dead) connection; see the module docs.
pub(crate) struct Conn {
    writer: Arc<Mutex<Writer>>,
    /// Dropped with the connection, which stops its pinger thread.
    _stop_pinger: mpsc::SyncSender<()>,
    /// Another handle on the socket, to shut it down without waiting for the writer lock.
    ctl: TcpStream,
    shared: Arc<Shared>,
    /// Tells this connection from the ones before and after it (lock waits live on one).
    serial: u64,
}

/// The next connection's serial.
static SERIALS: AtomicU64 = AtomicU64::new(1);

impl Conn {
    /// Connects to `addr` within `connect_timeout`, runs the TLS handshake when `tls` is
    /// given (`name` is the address as the user wrote it, for the server name and
    /// messages), and starts the reader thread. Writes that block longer than
    /// `write_timeout` fail (and kill the connection).
    pub(crate) fn open(
        addr: SocketAddr,
        name: &str,
        tls: Option<&ClientTls>,
        connect_timeout: Duration,
        write_timeout: Duration,
        sink: SinkSlot,
    ) -> Result<Conn> {
        let io = |e: std::io::Error| OriginError::Unreachable(format!("{name} ({addr}): {e}"));
        let stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        stream
            .set_write_timeout(Some(write_timeout.max(Duration::from_millis(1))))
            .map_err(io)?;
        hoardfs_tls::enable_keepalive(&stream);
        set_user_timeout(&stream, write_timeout);
        let ctl = stream.try_clone().map_err(io)?;
        let (reader, writer) = match tls {
            Some(tls) => {
                let (r, w) = tls::handshake(stream, tls, name, connect_timeout)?;
                (Reader::Tls(r), Writer::Tls(w))
            }
            None => (
                Reader::Plain(stream.try_clone().map_err(io)?),
                Writer::Plain(stream),
            ),
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Some(HashMap::new())),
            alive: AtomicBool::new(true),
            frames_rx: AtomicU64::new(0),
            frames_tx: AtomicU64::new(0),
            peer: addr,
            sink,
        });
        let s = Arc::clone(&shared);
        thread::Builder::new()
            .name(format!("hoardfs-rx-{addr}"))
            .spawn(move || reader_loop(reader, s))
            .map_err(io)?;
        let writer = Arc::new(Mutex::new(writer));
        let (stop_pinger, stopped) = mpsc::sync_channel(0);
        let (w, s) = (Arc::downgrade(&writer), Arc::clone(&shared));
        thread::Builder::new()
            .name(format!("hoardfs-ping-{addr}"))
            .spawn(move || pinger(w, s, stopped))
            .map_err(io)?;
        Ok(Conn {
            serial: SERIALS.fetch_add(1, Ordering::Relaxed),
            writer,
            _stop_pinger: stop_pinger,
            ctl,
            shared,
        })
    }

    /// Whether the connection is still believed usable.
    pub(crate) fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::SeqCst)
    }

    /// Marks the connection dead, waking all waiters, and shuts the socket down.
    pub(crate) fn kill(&self, reason: &str) {
        self.shared.kill(reason);
        let _ = self.ctl.shutdown(Shutdown::Both);
    }

    /// Sends `op` as request `id` and waits up to `timeout` for the reply.
    pub(crate) fn call(&self, id: u64, op: Op, timeout: Duration) -> Result<Answer> {
        self.call_with_data(id, op, &[], timeout)
    }

    /// Like [`Conn::call`], with a data section (write payloads, xattr values).
    pub(crate) fn call_with_data(
        &self,
        id: u64,
        op: Op,
        data: &[u8],
        timeout: Duration,
    ) -> Result<Answer> {
        self.call_to(id, op, data, None, timeout)
    }

    /// Sends read `op` (of at most `asked` bytes) as request `id`; the reader thread
    /// writes the reply's data straight into the destination in `dst` and answers it
    /// (taking it out of the slot). Returns the reply, with an empty data section when
    /// the destination was filled; a destination the reader did not take is left in `dst`
    /// (the reply carried its data in the ordinary way: an error, or nothing).
    pub(crate) fn call_direct(
        &self,
        id: u64,
        op: Op,
        asked: u32,
        dst: &mut ReadSlot,
        timeout: Duration,
    ) -> Result<Answer> {
        let direct = Direct {
            dst: Arc::new(Mutex::new(dst.take())),
            asked,
        };
        let answer = self.call_to(id, op, &[], Some(direct.clone()), timeout);
        // (The reader no longer holds the request: what it did not take is ours.)
        if let Some(d) = direct.dst.lock().take() {
            dst.put_back(d);
        }
        if let Err(error) = &answer
            && dst.answered()
        {
            // The reader thread took the destination and is still writing into it (a
            // reply stalled partway through its data, which a timeout alone would not end
            // if other frames came first): only ending the connection ends that read,
            // and answers the reader EIO.
            self.kill(&format!("a read's reply stalled: {error}"));
        }
        answer
    }

    fn call_to(
        &self,
        id: u64,
        op: Op,
        data: &[u8],
        direct: Option<Direct>,
        timeout: Duration,
    ) -> Result<Answer> {
        let (tx, rx) = mpsc::sync_channel(1);
        let waiter = Waiter {
            tx: Wake::Caller(tx),
            direct,
        };
        if self.register(id, waiter).is_err() {
            return Err(self.dead_error());
        }
        let rx_before = self.shared.frames_rx.load(Ordering::SeqCst);
        if let Err(e) = self.send_request(id, op, data) {
            self.forget(id);
            self.kill(&format!("write failed: {e}"));
            return Err(OriginError::Unreachable(format!(
                "sending to {} failed: {e}",
                self.shared.peer
            )));
        }
        match rx.recv_timeout(timeout) {
            Ok(answer) => answer,
            Err(RecvTimeoutError::Timeout) => {
                self.forget(id);
                // Nothing at all arrived since we sent: the peer (or the path to it) is
                // probably gone without a reset. Drop the connection so the next call
                // reconnects instead of waiting out another timeout.
                if self.shared.frames_rx.load(Ordering::SeqCst) == rx_before {
                    self.kill(&format!("no reply within {timeout:?}"));
                }
                Err(OriginError::Timeout(timeout))
            }
            // Sent, and the connection died before the answer.
            Err(RecvTimeoutError::Disconnected) => Err(OriginError::Lost(format!(
                "connection to {} lost",
                self.shared.peer
            ))),
        }
    }

    /// Which connection this is, among all this process opened.
    pub(crate) fn serial(&self) -> u64 {
        self.serial
    }

    fn forget(&self, id: u64) -> Option<Waiter> {
        self.shared.pending.lock().as_mut()?.remove(&id)
    }

    /// Sends `op` as request `id` and returns at once: `answer` is called exactly once,
    /// on the reader thread, with the reply (however long it takes: no timeout, a lock
    /// granted after minutes) or with why none will come (the connection died).
    pub(crate) fn call_later(
        &self,
        id: u64,
        op: Op,
        answer: Box<dyn FnOnce(Result<Answer>) + Send>,
    ) {
        let waiter = Waiter {
            tx: Wake::Later(answer),
            direct: None,
        };
        if let Err(w) = self.register(id, waiter) {
            return w.tx.try_send(Err(self.dead_error()));
        }
        if let Err(e) = self.send_request(id, op, &[]) {
            // Answered here unless the connection's death already took the waiter.
            if let Some(w) = self.forget(id) {
                w.tx.try_send(Err(OriginError::Unreachable(format!(
                    "sending to {} failed: {e}",
                    self.shared.peer
                ))));
            }
            self.kill(&format!("write failed: {e}"));
        }
    }

    /// Adds a waiter for request `id`; gives it back if the connection is dead.
    fn register(&self, id: u64, waiter: Waiter) -> std::result::Result<(), Waiter> {
        match self.shared.pending.lock().as_mut() {
            Some(map) => {
                map.insert(id, waiter);
                Ok(())
            }
            None => Err(waiter),
        }
    }

    /// Writes request `id` with its data section. Every request says whom it is made
    /// for: the ambient caller of this thread.
    fn send_request(&self, id: u64, op: Op, data: &[u8]) -> std::io::Result<()> {
        let caller = crate::caller::current();
        let body = frame::encode_body(&Request {
            id,
            op,
            caller: (*caller).clone(),
        });
        let written = {
            let mut w = self.writer.lock();
            frame::write_frame(&mut *w, &body, data).and_then(|()| w.flush())
        };
        self.shared.frames_tx.fetch_add(1, Ordering::SeqCst);
        written
    }

    fn dead_error(&self) -> OriginError {
        OriginError::Unreachable(format!("connection to {} lost", self.shared.peer))
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        // Unblocks the reader thread, which then exits.
        let _ = self.ctl.shutdown(Shutdown::Both);
        self.shared.kill("connection closed");
    }
}

/// Ids of pings: no caller waits for their replies, which the reader drops.
const PING_ID_BASE: u64 = 1 << 63;

/// Sends a `Ping` whenever the connection was quiet for [`PING_INTERVAL`], so the server
/// (which closes connections silent for its idle timeout) keeps an idle mount's
/// connection, and its callbacks. Stops when the connection is dropped or dies.
fn pinger(writer: std::sync::Weak<Mutex<Writer>>, shared: Arc<Shared>, stop: mpsc::Receiver<()>) {
    let mut seen = shared.frames_tx.load(Ordering::SeqCst);
    let mut active = std::time::Instant::now();
    let mut n = 0u64;
    // Checked three times per interval, so the connection is never silent for much longer
    // than PING_INTERVAL.
    while let Err(RecvTimeoutError::Timeout) = stop.recv_timeout(PING_INTERVAL / 3) {
        if !shared.alive.load(Ordering::SeqCst) {
            return;
        }
        let now = shared.frames_tx.load(Ordering::SeqCst);
        if now != seen {
            seen = now;
            active = std::time::Instant::now();
            continue;
        }
        if active.elapsed() < PING_INTERVAL {
            continue;
        }
        active = std::time::Instant::now();
        let Some(w) = writer.upgrade() else { return };
        n += 1;
        let body = frame::encode_body(&Request {
            id: PING_ID_BASE + n,
            op: Op::Ping,
            caller: (**crate::caller::process()).clone(),
        });
        let sent = {
            let mut w = w.lock();
            frame::write_frame(&mut *w, &body, &[]).and_then(|()| w.flush())
        };
        if let Err(e) = sent {
            shared.kill(&format!("ping failed: {e}"));
            return;
        }
    }
}

/// Reads reply frames until the stream fails, dispatching each to its waiter.
fn reader_loop(stream: Reader, shared: Arc<Shared>) {
    let mut r = BufReader::with_capacity(READ_BUF, stream);
    let reason = loop {
        let mut data = Vec::new();
        let (body, data_len) = match frame::read_head(&mut r, Limits::RESPONSE) {
            Ok(b) => b,
            Err(e) => break e.to_string(),
        };
        let msg: ServerMessage = match frame::decode_body(&body) {
            Ok(r) => r,
            Err(e) => break format!("undecodable reply: {e}"),
        };
        let resp = match msg {
            ServerMessage::Response(r) => r,
            ServerMessage::Breaks(b) => {
                if let Err(e) = frame::read_data(&mut r, data_len, &mut data) {
                    break e.to_string();
                }
                shared.frames_rx.fetch_add(1, Ordering::SeqCst);
                // Delivered here, in order with replies, so a caller can tell whether a
                // break arrived before the reply it is about to act on.
                shared.deliver(b);
                continue;
            }
        };
        let waiter = shared
            .pending
            .lock()
            .as_mut()
            .and_then(|m| m.remove(&resp.id));
        // A read whose caller gave a destination: its data goes there, not into `data`.
        let direct = match (&waiter, &resp.result) {
            (
                Some(Waiter {
                    direct: Some(d), ..
                }),
                Ok(Reply::Data { len, .. }),
            ) if *len as usize == data_len && *len <= d.asked => d.dst.lock().take(),
            _ => None,
        };
        let read = match direct {
            Some(dst) => fill_direct(&mut r, data_len, dst),
            None => frame::read_data(&mut r, data_len, &mut data).map_err(|e| e.to_string()),
        };
        if let Err(e) = read {
            break e;
        }
        shared.frames_rx.fetch_add(1, Ordering::SeqCst);
        // No waiter: the caller timed out and left; the reply is dropped.
        if let Some(w) = waiter {
            w.tx.try_send(
                resp.result
                    .map(|reply| (reply, data))
                    .map_err(OriginError::Fs),
            );
        }
    };
    shared.kill(&reason);
}

/// Reads a data section of `len` bytes from `r` into `dst`, answering it. The section is
/// consumed whatever `dst` does (a reader already answered, after a panic, takes nothing:
/// the bytes are read and dropped); only a failure of the stream is an error.
fn fill_direct<R: Read>(
    r: &mut R,
    len: usize,
    dst: Box<dyn ReadDst>,
) -> std::result::Result<(), String> {
    let mut stream_failed = None;
    let mut consumed = false;
    let _ = dst.fill(len, &mut |buf| {
        // (A destination that asks twice, or for another length, would leave the stream
        // out of step: the connection ends instead.)
        if consumed || buf.len() != len {
            stream_failed = Some(format!(
                "a read's destination took {} of {len} bytes",
                buf.len()
            ));
            return Err(std::io::Error::other("refused"));
        }
        consumed = true;
        r.read_exact(buf)
            .inspect_err(|e| stream_failed = Some(e.to_string()))
    });
    if let Some(e) = stream_failed {
        return Err(e);
    }
    if !consumed {
        let skipped = std::io::copy(&mut r.take(len as u64), &mut std::io::sink());
        if skipped.map_err(|e| e.to_string())? != len as u64 {
            return Err("the stream ended within a data section".into());
        }
    }
    Ok(())
}

/// Bounds how long sent data may stay unacknowledged before the kernel aborts the
/// connection (`TCP_USER_TIMEOUT`): a request that timed out on a dead link is then
/// discarded with the connection, instead of being delivered (and applied by the server)
/// when the link comes back, after this client gave up on it. Best effort.
fn set_user_timeout(stream: &TcpStream, timeout: Duration) {
    use std::os::fd::AsRawFd;
    let ms = timeout.as_millis().clamp(1, u32::MAX as u128) as libc::c_uint;
    // SAFETY: a valid socket and a c_uint option value of the right size.
    let r = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const libc::c_uint).cast(),
            std::mem::size_of::<libc::c_uint>() as libc::socklen_t,
        )
    };
    if r != 0 {
        tracing::debug!("TCP_USER_TIMEOUT: {}", std::io::Error::last_os_error());
    }
}
