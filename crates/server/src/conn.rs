//! One client connection: handshake, concurrent request handling, ordered-by-completion
//! replies.
//!
//! The connection task reads frames. The first must be `Hello` (small, no data, within
//! [`HELLO_TIMEOUT`]); afterwards each request takes a permit of a per-connection
//! semaphore and runs on the blocking pool, so a slow request never holds up the others.
//! Replies go through a channel to a writer task that batches whatever is queued before
//! flushing. A frame with a bad magic, an oversized length or an undecodable body closes the
//! connection (logged with the peer address, counted in `bad_frames`).

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hoardfs_origin::FileRange;
use hoardfs_proto::buffers;
use hoardfs_proto::frame::{self, FrameError, FrameHeader, HEADER_LEN, Limits};
use hoardfs_proto::{Op, PROTOCOL_VERSION, Reply, Request, Response, ServerMessage, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter, Interest};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::callbacks::ConnId;
use crate::decode::{Decoded, Phase, decode_request};
use crate::{Shared, Stats};

/// How long a new connection may take to send its `Hello`.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// What is accepted before authentication: a `Hello` body and nothing else.
const HELLO_LIMITS: Limits = Phase::Hello.limits();
/// Socket buffer sizes of the reader and writer.
const IO_BUF: usize = 64 << 10;
/// How long a refused peer gets to receive the error reply before the socket closes.
const REFUSAL_LINGER: Duration = Duration::from_secs(5);

/// An encoded frame waiting for the writer.
pub(crate) struct Outgoing {
    body: Vec<u8>,
    data: Vec<u8>,
    /// A data section sent from a file with `sendfile` instead of `data`.
    file: Option<FileRange>,
    /// A callback-break frame (counted in the connection's pending breaks until written).
    is_break: bool,
}

impl Outgoing {
    /// Encodes a reply; a body the client would reject as too large becomes `Io`.
    pub(crate) fn new(id: u64, result: Result<Reply, WireError>, data: Vec<u8>) -> Outgoing {
        let msg = ServerMessage::Response(Response { id, result });
        let out = Outgoing {
            data,
            ..Outgoing::message(&msg, false)
        };
        if out.body.len() > Limits::RESPONSE.max_body as usize {
            tracing::warn!(id, len = out.body.len(), "reply too large for the wire");
            return Outgoing::new(id, Err(WireError::Io), Vec::new());
        }
        out
    }

    /// Encodes a read reply whose bytes the writer sends from `range` without copying them.
    pub(crate) fn file(id: u64, range: FileRange) -> Outgoing {
        let reply = Reply::Data {
            len: range.len,
            version: range.version,
        };
        Outgoing {
            file: Some(range),
            ..Outgoing::new(id, Ok(reply), Vec::new())
        }
    }

    /// Encodes any server message without a data section.
    pub(crate) fn message(msg: &ServerMessage, is_break: bool) -> Outgoing {
        Outgoing {
            body: frame::encode_body(msg),
            data: Vec::new(),
            file: None,
            is_break,
        }
    }
}

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
    /// Protocol violation: close at once, no reply.
    Bad(String),
    /// Handshake refused: send this reply, then close. `bad` says whether it counts as a
    /// bad frame.
    Refuse {
        reason: String,
        reply: Outgoing,
        bad: bool,
    },
}

/// Serves one accepted connection until it closes.
pub(crate) async fn serve(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    Stats::bump(&shared.stats.connections);
    let _ = stream.set_nodelay(true);
    let (rd, wr) = stream.into_split();
    let mut rd = BufReader::with_capacity(IO_BUF, rd);
    let max_in_flight = shared.cfg.max_in_flight_per_conn.max(1);
    // Unbounded, but replies are bounded by the in-flight permits and break frames by the
    // callback registry's per-connection limit.
    let (tx, rx) = mpsc::unbounded_channel();
    let pending_breaks = Arc::new(AtomicUsize::new(0));
    // Aborted if this task is (server shutdown), so the socket closes with it.
    let mut writer = AbortOnDrop(tokio::spawn(write_loop(wr, rx, pending_breaks.clone())));
    let mut conn_id = None;
    let end = read_loop(&mut rd, &tx, peer, &shared, max_in_flight, || {
        let id = shared
            .callbacks
            .add_conn(tx.clone(), pending_breaks.clone());
        conn_id = Some(id);
        id
    })
    .await;
    if let Some(id) = conn_id {
        shared.callbacks.remove_conn(id);
    }
    match end {
        End::Closed(err) => {
            match err {
                Some(e) => tracing::debug!(%peer, "connection closed: {e}"),
                None => tracing::debug!(%peer, "connection closed by peer"),
            }
            // Let in-flight requests finish and their replies go out.
            drop(tx);
            let _ = (&mut writer.0).await;
        }
        End::Bad(reason) => {
            tracing::warn!(%peer, "closing connection: {reason}");
            Stats::bump(&shared.stats.bad_frames);
        }
        End::Refuse { reason, reply, bad } => {
            tracing::warn!(%peer, "refusing connection: {reason}");
            if bad {
                Stats::bump(&shared.stats.bad_frames);
            }
            let _ = tx.send(reply);
            drop(tx);
            let _ = tokio::time::timeout(REFUSAL_LINGER, &mut writer.0).await;
        }
    }
}

/// Reads and dispatches frames until the connection ends.
async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    tx: &mpsc::UnboundedSender<Outgoing>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    max_in_flight: usize,
    register: impl FnOnce() -> ConnId,
) -> End {
    // Handshake.
    let first = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(rd, HELLO_LIMITS)).await {
        Err(_) => return End::Closed(Some(io::ErrorKind::TimedOut.into())),
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return End::Closed(None),
        Ok(Err(e)) => return frame_end(e),
    };
    let req = match decode_request(Phase::Hello, &first.0, first.1.len()) {
        Ok(Decoded::Run(r)) => r,
        Ok(Decoded::Refuse { .. }) => return End::Bad("refused hello".into()),
        Err(e) => return End::Bad(e.to_string()),
    };
    Stats::bump(&shared.stats.requests);
    let Op::Hello { version, token } = req.op else {
        return End::Bad("request before hello".into());
    };
    if version != PROTOCOL_VERSION {
        let reply = Outgoing::new(req.id, Err(WireError::Protocol), Vec::new());
        let reason = format!("client speaks protocol {version}, we speak {PROTOCOL_VERSION}");
        return End::Refuse {
            reason,
            reply,
            bad: true,
        };
    }
    if let Some(expected) = &shared.cfg.token
        && !constant_time_eq(expected, &token)
    {
        let reply = Outgoing::new(req.id, Err(WireError::AuthFailed), Vec::new());
        return End::Refuse {
            reason: "wrong token".into(),
            reply,
            bad: true,
        };
    }
    let conn = register();
    let seq_before = shared.callbacks.seq();
    let origin = Arc::clone(&shared.origin);
    let info = match tokio::task::spawn_blocking(move || origin.info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            let reply = Outgoing::new(
                req.id,
                Err(crate::handle::wire_error(e.clone())),
                Vec::new(),
            );
            return End::Refuse {
                reason: format!("origin unavailable: {e}"),
                reply,
                bad: false,
            };
        }
        Err(e) => {
            let reply = Outgoing::new(req.id, Err(WireError::Io), Vec::new());
            return End::Refuse {
                reason: format!("origin panicked: {e}"),
                reply,
                bad: false,
            };
        }
    };
    let root_id = info.root.attr.file_id;
    let hello = Reply::Hello {
        version: PROTOCOL_VERSION,
        export_id: info.export_id,
        root: info.root,
        read_only: shared.cfg.read_only || info.read_only,
    };
    let raced = shared.callbacks.register(conn, &[root_id], seq_before);
    if tx
        .send(Outgoing::new(req.id, Ok(hello), Vec::new()))
        .is_err()
    {
        return End::Closed(None);
    }
    if raced {
        shared.callbacks.send_to(
            conn,
            vec![hoardfs_proto::Break::Attr {
                file_id: root_id,
                version: 0,
            }],
        );
    }
    tracing::debug!(%peer, "client authenticated");

    // Requests.
    let permits = Arc::new(Semaphore::new(max_in_flight));
    loop {
        // Waiting for a permit before reading applies back-pressure to this client only.
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return End::Closed(None);
        };
        let (body, data) = match read_frame(rd, Limits::REQUEST).await {
            Ok(Some(f)) => f,
            Ok(None) => return End::Closed(None),
            Err(e) => return frame_end(e),
        };
        let decoded = match decode_request(Phase::Requests, &body, data.len()) {
            Ok(d) => d,
            Err(e) => return End::Bad(e.to_string()),
        };
        Stats::bump(&shared.stats.requests);
        let Request { id, op } = match decoded {
            Decoded::Run(req) => req,
            // A second hello, data on a request that takes none, a bad name...
            Decoded::Refuse { id, error } => {
                if tx.send(Outgoing::new(id, Err(error), Vec::new())).is_err() {
                    return End::Closed(None);
                }
                continue;
            }
        };
        let shared = Arc::clone(shared);
        let tx = tx.clone();
        tokio::spawn(async move {
            let req = crate::handle::Req { conn, id, op, data };
            let out = tokio::task::spawn_blocking(move || crate::handle::handle(&shared, req));
            match out.await {
                // Fails only when the writer is gone (connection closing): nothing to do.
                Ok(reply) => {
                    let _ = tx.send(reply);
                }
                Err(e) => {
                    tracing::error!(id, "request handler panicked: {e}");
                    let _ = tx.send(Outgoing::new(id, Err(WireError::Io), Vec::new()));
                }
            }
            drop(permit);
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

/// Compares secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Writes queued replies, flushing whenever the queue runs dry.
async fn write_loop(
    wr: OwnedWriteHalf,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    pending_breaks: Arc<AtomicUsize>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(IO_BUF, wr);
    while let Some(first) = rx.recv().await {
        write_one(&mut w, &first, &pending_breaks).await?;
        buffers::give(first.data);
        while let Ok(next) = rx.try_recv() {
            write_one(&mut w, &next, &pending_breaks).await?;
            buffers::give(next.data);
        }
        w.flush().await?;
    }
    w.shutdown().await
}

async fn write_one(
    w: &mut BufWriter<OwnedWriteHalf>,
    out: &Outgoing,
    pending_breaks: &AtomicUsize,
) -> io::Result<()> {
    if out.is_break {
        pending_breaks.fetch_sub(1, Ordering::Relaxed);
    }
    let data_len = out.file.as_ref().map_or(out.data.len(), |f| f.len as usize);
    w.write_all(&FrameHeader::encode(out.body.len(), data_len))
        .await?;
    w.write_all(&out.body).await?;
    match &out.file {
        Some(range) => {
            w.flush().await?;
            send_range(w.get_ref().as_ref(), range).await
        }
        // Large data sections bypass the buffer (BufWriter writes them straight through).
        None => w.write_all(&out.data).await,
    }
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

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
