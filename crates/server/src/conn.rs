//! One client connection: handshake, concurrent request handling, ordered-by-completion
//! replies.
//!
//! A TLS server first completes the TLS handshake (a plaintext `Hello` gets a plaintext
//! `TlsRequired` answer). The connection task then reads frames. The first must be `Hello`
//! (small, no data, within [`HELLO_TIMEOUT`] of accept) with a valid credential; the
//! connection is then admitted if a `--max-connections` slot is free. Afterwards each
//! request takes a slot of a per-connection semaphore and a memory charge (module
//! `admission`) and runs on the blocking pool, so a slow request never holds up the
//! others. Replies go through a channel to a writer task that batches whatever is queued
//! before flushing; a reply releases its slot and charge only once written, so a client
//! that stops reading replies stops being served, at bounded cost. A connection that sends
//! nothing for the idle timeout, whose replies stall that long, or whose credential is
//! revoked is closed. A frame with a bad magic, an oversized length or an undecodable body
//! closes the connection (logged with the peer address, counted in `bad_frames`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hoardfs_origin::FileRange;
use hoardfs_proto::buffers;
use hoardfs_proto::frame::{self, FrameError, FrameHeader, HEADER_LEN, Limits};
use hoardfs_proto::{
    IdMap, Identities, MIN_PROTOCOL_VERSION, Op, PROTOCOL_VERSION, Reply, Request, WireError,
};
use tokio::io::{
    AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, BufWriter, Interest,
};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::admission::{HandshakeTicket, Principal, SessionGuard};
use crate::callbacks::ConnId;
use crate::credentials::{self, Check};
use crate::decode::{Decoded, Phase, decode_request};
use crate::handshakes::HELLO_TIMEOUT;
use crate::outgoing::{Held, Outgoing};
use crate::{Shared, Stats};

/// What is accepted before authentication: a `Hello` body and nothing else.
const HELLO_LIMITS: Limits = Phase::Hello.limits();
/// Socket buffer sizes of the reader and writer.
const IO_BUF: usize = 64 << 10;
/// Plaintext a TLS session encrypts ahead of the socket (rustls's default: 64 KiB).
const TLS_SEND_BUFFER: usize = 256 << 10;
/// How long a refused peer gets to receive the error reply before the socket closes.
const REFUSAL_LINGER: Duration = Duration::from_secs(5);

/// Aborts the wrapped task when dropped.
struct AbortOnDrop<T>(JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Why the read side stopped.
enum End {
    /// Clean EOF at a frame boundary, or an I/O error (peer went away).
    Closed(Option<io::Error>),
    /// The server ended it (idle, revoked, evicted): close at once, log why.
    Ended(String),
    /// Protocol violation: close at once, no reply.
    Bad(String),
    /// Handshake refused: send this reply, then close. `bad` says whether it counts as a
    /// bad frame.
    Refuse {
        reason: String,
        reply: Box<Outgoing>,
        bad: bool,
    },
}

/// Serves one accepted connection until it closes: TLS handshake first when the server
/// has TLS, then the hoardfs protocol.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    Stats::bump(&shared.stats.connections);
    let _ = stream.set_nodelay(true);
    hoardfs_tls::enable_keepalive(&stream);
    let Some(ticket) = shared.admission.begin_handshake(peer.ip()) else {
        tracing::debug!(%peer, "dropping a connection: too many handshakes pending from its source");
        return;
    };
    let evicted = Arc::clone(&ticket.evicted);
    // Until the client is authenticated, a newer connection may push this one out.
    let setup = async {
        // The first byte tells a TLS ClientHello (0x16, a handshake record) from a
        // plaintext hoardfs frame (`H` of the magic), so a mismatch gets a clear answer.
        let mut first = [0u8; 1];
        match tokio::time::timeout_at(ticket.deadline, stream.peek(&mut first)).await {
            Ok(Ok(1)) => ticket.talking(),
            _ => return None,
        }
        let Some(tls) = shared.cfg.tls.clone() else {
            if first[0] == TLS_HANDSHAKE {
                tracing::warn!(%peer, "client speaks TLS, but this server runs with --insecure-plaintext");
                Stats::bump(&shared.stats.bad_frames);
                return None;
            }
            return Some(Transport::Plain(stream));
        };
        if first[0] == frame::MAGIC[0] {
            tracing::warn!(%peer, "refusing a plaintext client: this server requires TLS");
            Stats::bump(&shared.stats.bad_frames);
            refuse_plaintext(stream).await;
            return None;
        }
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        match tokio::time::timeout_at(ticket.deadline, acceptor.accept(stream)).await {
            Ok(Ok(s)) => Some(Transport::Tls(Box::new(s))),
            Ok(Err(e)) => {
                tracing::warn!(%peer, "TLS handshake failed: {e}");
                Stats::bump(&shared.stats.bad_frames);
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "no TLS handshake within {HELLO_TIMEOUT:?}");
                None
            }
        }
    };
    let transport = tokio::select! {
        t = setup => t,
        () = evicted.notified() => {
            tracing::debug!(%peer, "dropping a pending handshake to make room for a newer one");
            None
        }
    };
    match transport {
        None => {}
        Some(Transport::Plain(stream)) => {
            let (rd, wr) = stream.into_split();
            serve_on(rd, wr, peer, shared, ticket).await
        }
        Some(Transport::Tls(mut session)) => {
            // rustls encrypts at most this much per write before it must be sent: 256 KiB
            // (16 records) per socket write rather than 64 KiB (measured in BENCHMARKS.md).
            session.get_mut().1.set_buffer_limit(Some(TLS_SEND_BUFFER));
            let (rd, wr) = tokio::io::split(*session);
            serve_on(rd, wr, peer, shared, ticket).await
        }
    }
}

/// An accepted connection, after the TLS handshake if there is one.
enum Transport {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// Tells a plaintext client, in plaintext, that TLS is required (it sent `Hello` as
/// request 0), then closes.
async fn refuse_plaintext(mut stream: TcpStream) {
    let out = Outgoing::new(0, Err(WireError::TlsRequired), Vec::new());
    let send = async {
        stream
            .write_all(&FrameHeader::encode(out.body.len(), 0))
            .await?;
        stream.write_all(&out.body).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, send).await;
}

/// Where replies go: a plaintext socket half (which can also send file data with
/// `sendfile`) or a TLS session half (which must copy it through the cipher).
pub(crate) trait ReplySink: AsyncWrite + Unpin + Send + 'static {
    /// The socket, when file data may be sent from the page cache directly.
    fn socket(&self) -> Option<&TcpStream>;
}

impl ReplySink for OwnedWriteHalf {
    fn socket(&self) -> Option<&TcpStream> {
        Some(self.as_ref())
    }
}

impl ReplySink for tokio::io::WriteHalf<tokio_rustls::server::TlsStream<TcpStream>> {
    fn socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// The hoardfs protocol over an established transport.
async fn serve_on<R, W>(
    rd: R,
    wr: W,
    peer: SocketAddr,
    shared: Arc<Shared>,
    ticket: HandshakeTicket,
) where
    R: AsyncRead + Unpin,
    W: ReplySink,
{
    let mut rd = BufReader::with_capacity(IO_BUF, rd);
    // Unbounded, but every reply holds its request's slot (and memory charge) until it
    // is written, and break frames are bounded by the callback registry's per-connection
    // limits (see `callbacks`).
    let (tx, rx) = mpsc::unbounded_channel();
    let pending_breaks = Arc::new(AtomicUsize::new(0));
    // Aborted if this task is (server shutdown), so the socket closes with it.
    let stall = shared.cfg.idle_timeout;
    let mut writer = AbortOnDrop(tokio::spawn(write_loop(
        wr,
        rx,
        pending_breaks.clone(),
        stall,
    )));
    let mut conn_id = None;
    let end = read_loop(&mut rd, &tx, peer, &shared, ticket, || {
        let id = shared
            .callbacks
            .add_conn(tx.clone(), pending_breaks.clone());
        conn_id = Some(id);
        id
    })
    .await;
    if let Some(id) = conn_id {
        shared.callbacks.remove_conn(id);
        // Granting the next waiters reads their files' attributes: not on this task.
        let s = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || s.locks.drop_conn(id));
    }
    match end {
        End::Closed(err) => {
            match err {
                Some(e) => tracing::debug!(%peer, "connection closed: {e}"),
                None => tracing::debug!(%peer, "connection closed by peer"),
            }
            // Let in-flight requests finish and their replies go out (bounded by the
            // writer's stall timeout).
            drop(tx);
            let _ = (&mut writer.0).await;
        }
        End::Ended(reason) => {
            tracing::info!(%peer, "closing connection: {reason}");
        }
        End::Bad(reason) => {
            tracing::warn!(%peer, "closing connection: {reason}");
            Stats::bump(&shared.stats.bad_frames);
        }
        End::Refuse { reason, reply, bad } => {
            if !reason.is_empty() {
                tracing::warn!(%peer, "refusing connection: {reason}");
            }
            if bad {
                Stats::bump(&shared.stats.bad_frames);
            }
            let _ = tx.send(*reply);
            drop(tx);
            let _ = tokio::time::timeout(REFUSAL_LINGER, &mut writer.0).await;
        }
    }
}

/// What an authenticated connection holds while it is served.
struct Session {
    conn: ConnId,
    /// What its credential may do, and how its claims map.
    rights: Arc<crate::handle::SessionRights>,
    /// Its place among the `--max-connections`.
    _slot: OwnedSemaphorePermit,
    /// Fires when its credential is revoked.
    _guard: SessionGuard,
    revoked: Arc<Notify>,
}

/// The handshake: reads `Hello` (`read_hello`), decides on it (`judge`: version and
/// credential, no socket I/O), and admits the connection and answers (`welcome`). `Err`
/// says how the connection ends instead.
async fn handshake<R: AsyncRead + Unpin>(
    rd: &mut R,
    tx: &mpsc::UnboundedSender<Outgoing>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    ticket: HandshakeTicket,
    register: impl FnOnce() -> ConnId,
) -> Result<Session, End> {
    let hello = read_hello(rd, &ticket, shared).await?;
    match judge(shared, peer, &hello) {
        Verdict::Admit { name, rights } => {
            drop(ticket);
            welcome(tx, peer, shared, hello, (name, rights), register).await
        }
        Verdict::Refuse {
            err,
            reason,
            bad,
            delay,
        } => {
            if let Some(delay) = delay {
                // Past a few failures, answering slowly makes guessing slow. The wait
                // still counts as a pending handshake, the first of its source's to make
                // room for a newer one (module `handshakes`); the deadline ends it too.
                ticket.refused();
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = ticket.evicted.notified() => {
                        return Err(End::Ended("dropped a delayed refusal to make room".into()));
                    }
                    () = tokio::time::sleep_until(ticket.deadline) => {
                        return Err(End::Closed(Some(io::ErrorKind::TimedOut.into())));
                    }
                }
            }
            drop(ticket);
            Err(hello.refuse(err, reason, bad))
        }
    }
}

/// A client's `Hello`: its request id, protocol version and credential.
struct Hello {
    id: u64,
    version: u32,
    token: Vec<u8>,
}

impl Hello {
    /// Ends the connection with `err` as the reply to this `Hello` (`reason` logged;
    /// `bad`: the client misbehaved).
    fn refuse(&self, err: WireError, reason: String, bad: bool) -> End {
        End::Refuse {
            reason,
            reply: Box::new(Outgoing::new(self.id, Err(err), Vec::new())),
            bad,
        }
    }
}

/// Reads the connection's first frame, which must be a `Hello`, by the ticket's deadline
/// (or until the ticket is evicted to make room).
async fn read_hello<R: AsyncRead + Unpin>(
    rd: &mut R,
    ticket: &HandshakeTicket,
    shared: &Shared,
) -> Result<Hello, End> {
    let hello = tokio::select! {
        r = tokio::time::timeout_at(ticket.deadline, read_frame(rd, HELLO_LIMITS)) => r,
        () = ticket.evicted.notified() => {
            return Err(End::Ended("dropped a pending handshake to make room".into()));
        }
    };
    let first = match hello {
        Err(_) => return Err(End::Closed(Some(io::ErrorKind::TimedOut.into()))),
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return Err(End::Closed(None)),
        Ok(Err(e)) => return Err(frame_end(e)),
    };
    let req = match decode_request(Phase::Hello, &first.0, first.1.len()) {
        Ok(Decoded::Run(r)) => r,
        Ok(Decoded::Refuse { .. }) => return Err(End::Bad("refused hello".into())),
        Err(e) => return Err(End::Bad(e.to_string())),
    };
    Stats::bump(&shared.stats.requests);
    let Op::Hello { version, token } = req.op else {
        return Err(End::Bad("request before hello".into()));
    };
    Ok(Hello {
        id: req.id,
        version,
        token,
    })
}

/// What the server decides about a `Hello`.
enum Verdict {
    /// Let in as `name` (`None`: no credential is required) with `rights`.
    Admit {
        name: Option<String>,
        rights: credentials::Rights,
    },
    /// Answered `err` (after `delay`, for a refused credential); `reason` is logged,
    /// `bad` counts the client as misbehaving.
    Refuse {
        err: WireError,
        reason: String,
        bad: bool,
        delay: Option<Duration>,
    },
}

/// Decides on `hello` from `peer`: its protocol version, then its credential (a refusal
/// is counted against the peer's address, and past a few answered slowly; an acceptance
/// clears the count). No socket I/O.
fn judge(shared: &Shared, peer: SocketAddr, hello: &Hello) -> Verdict {
    let version = hello.version;
    if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
        return Verdict::Refuse {
            err: WireError::Protocol,
            reason: format!(
                "client speaks protocol {version}, we speak {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"
            ),
            bad: true,
            delay: None,
        };
    }
    match shared.credentials.check(&hello.token) {
        Check::Open => Verdict::Admit {
            name: None,
            rights: credentials::Rights::default(),
        },
        Check::Accepted(name, rights) => {
            shared.admission.failures.clear(peer.ip());
            Verdict::Admit {
                name: Some(name),
                rights,
            }
        }
        Check::Refused(claimed) => {
            let v = shared.admission.failures.record(peer.ip(), Instant::now());
            let claimed = claimed.as_deref().unwrap_or("(none)");
            if v.log {
                tracing::warn!(
                    %peer,
                    credential = claimed,
                    failures = v.count,
                    "refused a credential"
                );
            }
            Verdict::Refuse {
                err: WireError::AuthFailed,
                reason: String::new(),
                bad: true,
                delay: Some(v.delay),
            }
        }
    }
}

/// Admits a connection whose `hello` was accepted (as `name`, with `rights`): takes its
/// place among the `--max-connections`, opens its session, and answers with the export's
/// root, holding a callback on it.
async fn welcome(
    tx: &mpsc::UnboundedSender<Outgoing>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    hello: Hello,
    (name, rights): (Option<String>, credentials::Rights),
    register: impl FnOnce() -> ConnId,
) -> Result<Session, End> {
    let Some(slot) = shared.admission.admit() else {
        let reason = format!(
            "connection limit reached ({} authenticated connections)",
            shared.cfg.max_connections
        );
        return Err(hello.refuse(WireError::Busy, reason, false));
    };
    let principal = match &name {
        Some(n) => Principal::Named {
            name: n.clone(),
            digest: credentials::sha256(&hello.token),
        },
        // Sessions let in while no credential was required are ended once one is.
        None => Principal::Open,
    };
    let Some((revoked, guard)) =
        shared
            .admission
            .open_session(principal, &shared.credentials, &hello.token, &rights)
    else {
        tracing::warn!(%peer, credential = name.as_deref(), "credential revoked during the handshake");
        return Err(hello.refuse(WireError::AuthFailed, String::new(), true));
    };
    let conn = register();
    let seq_before = shared.callbacks.seq();
    let origin = Arc::clone(&shared.origin);
    let info = match tokio::task::spawn_blocking(move || origin.info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            let reason = format!("origin unavailable: {e}");
            return Err(hello.refuse(crate::outgoing::wire_error(e), reason, false));
        }
        Err(e) => {
            return Err(hello.refuse(WireError::Io, format!("origin panicked: {e}"), false));
        }
    };
    let root_id = info.root.attr.file_id;
    let rights = Arc::new(crate::handle::SessionRights {
        ids: IdMap {
            squash: shared.cfg.id_map.squash,
            anon_uid: shared.cfg.id_map.anon_uid,
            anon_gid: shared.cfg.id_map.anon_gid,
            restrict: rights.restrict,
        },
        read_only: rights.read_only,
    });
    // The connection speaks the client's version (an older client never sends what it
    // does not know).
    let reply = Reply::Hello {
        version: hello.version,
        export_id: info.export_id,
        root: info.root,
        read_only: shared.cfg.read_only || info.read_only || rights.read_only,
        verifier: shared.cfg.verifier,
        publishes_on_close: shared.origin.publishes_on_close(),
        identities: match info.identities {
            Identities::Server => Identities::Server,
            Identities::Callers(_) => Identities::Callers(rights.ids.clone()),
        },
    };
    let raced = shared.callbacks.register(conn, &[root_id], seq_before);
    if tx
        .send(Outgoing::new(hello.id, Ok(reply), Vec::new()))
        .is_err()
    {
        return Err(End::Closed(None));
    }
    if raced {
        shared.callbacks.send_to(
            conn,
            vec![hoardfs_proto::Break::Attr {
                file_id: root_id,
                change_id: 0,
            }],
        );
    }
    match &name {
        Some(n) => tracing::info!(%peer, credential = %n, "client authenticated"),
        None => tracing::debug!(%peer, "client connected"),
    }
    Ok(Session {
        conn,
        rights,
        _slot: slot,
        _guard: guard,
        revoked,
    })
}

/// Waits for `fut` unless the connection is closing (writer gone) or revoked.
async fn unless_ending<T>(
    fut: impl std::future::Future<Output = T>,
    tx: &mpsc::UnboundedSender<Outgoing>,
    revoked: &Notify,
) -> Result<T, End> {
    tokio::select! {
        v = fut => Ok(v),
        () = tx.closed() => Err(End::Closed(Some(io::Error::other("replies could not be written")))),
        () = revoked.notified() => Err(End::Ended("its credential was revoked".into())),
    }
}

/// Reads and dispatches frames until the connection ends.
async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    tx: &mpsc::UnboundedSender<Outgoing>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    ticket: HandshakeTicket,
    register: impl FnOnce() -> ConnId,
) -> End {
    let session = match handshake(rd, tx, peer, shared, ticket, register).await {
        Ok(s) => s,
        Err(end) => return end,
    };
    let conn = session.conn;
    let slots = Arc::new(Semaphore::new(shared.cfg.max_in_flight_per_conn.max(1)));
    let budget = Arc::new(Semaphore::new(shared.admission.per_conn_units));
    let idle = shared.cfg.idle_timeout;
    let revoked = &*session.revoked;
    loop {
        // Waiting for a slot before reading applies back-pressure to this client only.
        let slot = match unless_ending(Arc::clone(&slots).acquire_owned(), tx, revoked).await {
            Ok(Ok(p)) => p,
            Ok(Err(_)) => return End::Closed(None),
            Err(end) => return end,
        };
        let frame = match unless_ending(
            tokio::time::timeout(idle, read_frame(rd, Limits::REQUEST)),
            tx,
            revoked,
        )
        .await
        {
            Err(end) => return end,
            Ok(Err(_)) => return End::Ended(format!("idle for {idle:?}")),
            Ok(Ok(Ok(Some(f)))) => f,
            Ok(Ok(Ok(None))) => return End::Closed(None),
            Ok(Ok(Err(e))) => return frame_end(e),
        };
        let (body, data) = frame;
        let decoded = match decode_request(Phase::Requests, &body, data.len()) {
            Ok(d) => d,
            Err(e) => return End::Bad(e.to_string()),
        };
        Stats::bump(&shared.stats.requests);
        // Memory this request may hold until its reply is written: its payload, the
        // bytes it asks to read, or the listing of a directory page or a subtree.
        let cost = match &decoded {
            Decoded::Run(Request {
                op: Op::Read { len, .. },
                ..
            }) => data.len() + *len as usize,
            Decoded::Run(Request {
                op: Op::ReadTree { max_entries, .. },
                ..
            }) => crate::handle::tree_reply_bound(*max_entries),
            Decoded::Run(Request {
                op: Op::ReadDir { max_entries, .. },
                ..
            }) => crate::handle::dir_page_bound(*max_entries),
            _ => data.len(),
        };
        let units =
            crate::units::units_for(cost.min(shared.admission.per_conn_units * crate::units::UNIT));
        let conn_units =
            match unless_ending(Arc::clone(&budget).acquire_many_owned(units), tx, revoked).await {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => return End::Closed(None),
                Err(end) => return end,
            };
        let server_units = match unless_ending(shared.admission.charge(units), tx, revoked).await {
            Ok(Some(p)) => p,
            Ok(None) => return End::Closed(None),
            Err(end) => return end,
        };
        let held = Held {
            _slot: slot,
            _conn: conn_units,
            _server: server_units,
        };
        let Request { id, op, caller } = match decoded {
            Decoded::Run(req) => req,
            // A second hello, data on a request that takes none, a bad name...
            Decoded::Refuse { id, error } => {
                let out = Outgoing::new(id, Err(error), Vec::new()).holding(held);
                if tx.send(out).is_err() {
                    return End::Closed(None);
                }
                continue;
            }
        };
        let shared = Arc::clone(shared);
        let tx = tx.clone();
        let rights = Arc::clone(&session.rights);
        tokio::spawn(async move {
            let req = crate::handle::Req {
                conn,
                id,
                op,
                data,
                caller,
                rights,
                later: tx.clone(),
            };
            let out = tokio::task::spawn_blocking(move || crate::handle::handle(&shared, req));
            let reply = match out.await {
                Ok(Some(reply)) => reply,
                // A lock wait: answered later, without holding this request's slot.
                Ok(None) => return,
                Err(e) => {
                    tracing::error!(id, "request handler panicked: {e}");
                    Outgoing::new(id, Err(WireError::Io), Vec::new())
                }
            };
            // Fails only when the writer is gone (connection closing): nothing to do.
            let _ = tx.send(reply.holding(held));
        });
    }
}

/// Maps a frame-reading failure to how the connection ends.
fn frame_end(e: FrameError) -> End {
    match e {
        FrameError::Io(e) => End::Closed(Some(e)),
        other => End::Bad(other.to_string()),
    }
}

/// Reads one frame: `None` on a clean EOF before its first byte.
async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    limits: Limits,
) -> Result<Option<(Vec<u8>, Vec<u8>)>, FrameError> {
    let mut hdr = [0u8; HEADER_LEN];
    let n = r.read(&mut hdr).await?;
    if n == 0 {
        return Ok(None);
    }
    r.read_exact(&mut hdr[n..]).await?;
    // Lengths are checked against `limits` before anything is allocated.
    let h = FrameHeader::parse(&hdr, limits)?;
    let mut body = vec![0u8; h.body_len as usize];
    r.read_exact(&mut body).await?;
    // Write data comes from the buffer pool (and goes back after the write): no fresh,
    // zeroed allocation of up to a megabyte per request.
    let len = h.data_len as usize;
    let mut data = buffers::take(len);
    // Most requests carry no data (tokio's `read_to_end` would allocate even for none).
    if len > 0 && (&mut *r).take(len as u64).read_to_end(&mut data).await? < len {
        return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into());
    }
    Ok(Some((body, data)))
}

/// Writes queued replies, flushing whenever the queue runs dry. A write that makes no
/// progress for `stall` (the peer stopped reading) ends the connection, which releases
/// what its queued replies hold.
async fn write_loop<W: ReplySink>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pending_breaks: Arc<AtomicUsize>,
    stall: Duration,
) -> io::Result<()> {
    let stalled = || {
        io::Error::new(
            io::ErrorKind::TimedOut,
            "the client stopped reading replies",
        )
    };
    let mut w = BufWriter::with_capacity(IO_BUF, wr);
    while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(out) = next {
            tokio::time::timeout(stall, write_one(&mut w, &out, &pending_breaks))
                .await
                .map_err(|_| stalled())??;
            buffers::give(out.data);
            // `out.held` is released here: the reply is on its way.
            next = rx.try_recv().ok();
        }
        tokio::time::timeout(stall, w.flush())
            .await
            .map_err(|_| stalled())??;
    }
    w.shutdown().await
}

async fn write_one<W: ReplySink>(
    w: &mut BufWriter<W>,
    out: &Outgoing,
    pending_breaks: &AtomicUsize,
) -> io::Result<()> {
    if out.is_break {
        pending_breaks.fetch_sub(out.body.len(), Ordering::Relaxed);
    }
    let data_len = out.file.as_ref().map_or(out.data.len(), |f| f.len as usize);
    let header = FrameHeader::encode(out.body.len(), data_len);
    if out.file.is_none() && out.data.len() >= IO_BUF {
        // A large data section goes with its header and body in one vectored write: one
        // system call (and through TLS no record of its own for the few bytes before it).
        w.flush().await?;
        let mut parts = [
            io::IoSlice::new(&header),
            io::IoSlice::new(&out.body),
            io::IoSlice::new(&out.data),
        ];
        return write_all_vectored(w.get_mut(), &mut parts).await;
    }
    w.write_all(&header).await?;
    w.write_all(&out.body).await?;
    let zero_copy = w.get_ref().socket().is_some();
    match (&out.file, zero_copy) {
        (Some(range), true) => {
            w.flush().await?;
            let sock = w.get_ref().socket().expect("checked above");
            send_range(sock, range).await
        }
        // Through TLS the bytes must pass the cipher. (A TLS server does not offer
        // zero-copy ranges; this keeps a range correct should one arrive.)
        (Some(range), false) => {
            let mut buf = buffers::take(range.len as usize);
            buf.resize(range.len as usize, 0);
            std::os::unix::fs::FileExt::read_exact_at(&*range.file, &mut buf, range.offset)?;
            let sent = w.write_all(&buf).await;
            buffers::give(buf);
            sent
        }
        // Large data sections bypass the buffer (BufWriter writes them straight through).
        (None, _) => w.write_all(&out.data).await,
    }
}

/// Writes all of `parts` with vectored writes.
async fn write_all_vectored<W: AsyncWrite + Unpin>(
    w: &mut W,
    mut parts: &mut [io::IoSlice<'_>],
) -> io::Result<()> {
    while !parts.is_empty() {
        let n = w.write_vectored(parts).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut parts, n);
    }
    Ok(())
}

/// Sends `range` with `sendfile(2)`: the kernel hands the file's page-cache pages to the
/// socket, so the bytes are neither read into nor copied out of this process.
///
/// If the file has shrunk since the range was taken, the frame (whose header promised
/// `range.len` bytes) cannot be completed with true bytes: the error closes the connection
/// (the client fails the request and reconnects) rather than send bytes the file never held.
async fn send_range(sock: &TcpStream, range: &FileRange) -> io::Result<()> {
    let mut offset = range.offset as libc::off_t;
    let mut left = range.len as usize;
    while left > 0 {
        sock.writable().await?;
        let sent = sock.try_io(Interest::WRITABLE, || {
            // SAFETY: both descriptors stay open for the call (`range` holds the file, `sock`
            // the socket) and `offset` is a local the kernel may update.
            let n = unsafe {
                libc::sendfile(sock.as_raw_fd(), range.file.as_raw_fd(), &mut offset, left)
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match sent {
            Ok(0) => {
                tracing::warn!(
                    offset,
                    missing = left,
                    "file shrank while being sent: closing the connection"
                );
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            Ok(n) => left -= n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A connected socket pair on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (a, l.accept().await.unwrap().0)
    }

    fn range_of(bytes: &[u8], offset: u64, len: u32) -> FileRange {
        let mut f = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut f, bytes).unwrap();
        FileRange {
            file: Arc::new(f),
            offset,
            len,
            version: 1,
            held: None,
        }
    }

    #[tokio::test]
    async fn a_range_is_sent_whole_even_through_a_full_socket() {
        let content: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
        let (tx, mut rx) = pair().await;
        let range = range_of(&content, 3, (content.len() - 3) as u32);
        // 8 MiB is far more than the socket buffers: sendfile must wait for room.
        let (sent, got) = tokio::join!(send_range(&tx, &range), async {
            let mut got = vec![0u8; content.len() - 3];
            rx.read_exact(&mut got).await.map(|_| got)
        });
        sent.unwrap();
        assert!(got.unwrap() == content[3..], "bytes differ");
    }

    #[tokio::test]
    async fn a_file_shorter_than_its_range_ends_the_frame_with_an_error() {
        let (tx, mut rx) = pair().await;
        // The file shrank to 10 bytes after the range (and the frame header) promised 100.
        let range = range_of(b"0123456789", 0, 100);
        let err = send_range(&tx, &range).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        drop(tx);
        let mut got = Vec::new();
        rx.read_to_end(&mut got).await.unwrap();
        // What was sent is the file's true bytes; nothing made up fills the rest.
        assert_eq!(got, b"0123456789");
    }
}
