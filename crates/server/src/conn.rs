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
use std::sync::Arc;
use std::time::Duration;

use hoardfs_origin::OriginError;
use hoardfs_proto::frame::{self, FrameError, FrameHeader, HEADER_LEN, Limits};
use hoardfs_proto::{MAX_READ_LEN, Op, PROTOCOL_VERSION, Reply, Request, Response, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader, BufWriter};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;

use crate::{Shared, Stats};

/// How long a new connection may take to send its `Hello`.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// What is accepted before authentication: a `Hello` body and nothing else.
const HELLO_LIMITS: Limits = Limits {
    max_body: 4096,
    max_data: 0,
};
/// Upper bound on entries in one directory page, so replies stay well under the client's
/// body limit whatever the client asks for.
const MAX_DIR_PAGE: u32 = 8192;
/// Socket buffer sizes of the reader and writer.
const IO_BUF: usize = 64 << 10;
/// How long a refused peer gets to receive the error reply before the socket closes.
const REFUSAL_LINGER: Duration = Duration::from_secs(5);

/// An encoded reply frame waiting for the writer.
struct Outgoing {
    body: Vec<u8>,
    data: Vec<u8>,
}

impl Outgoing {
    /// Encodes a reply; a body the client would reject as too large becomes `Io`.
    fn new(id: u64, result: Result<Reply, WireError>, data: Vec<u8>) -> Outgoing {
        let body = frame::encode_body(&Response { id, result });
        if body.len() > Limits::RESPONSE.max_body as usize {
            tracing::warn!(id, len = body.len(), "reply too large for the wire");
            let body = frame::encode_body(&Response {
                id,
                result: Err(WireError::Io),
            });
            return Outgoing {
                body,
                data: Vec::new(),
            };
        }
        Outgoing { body, data }
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
    // Room for every in-flight reply plus inline ones, so senders never wait on the writer
    // for long.
    let (tx, rx) = mpsc::channel(max_in_flight + 4);
    // Aborted if this task is (server shutdown), so the socket closes with it.
    let mut writer = AbortOnDrop(tokio::spawn(write_loop(wr, rx)));
    let end = read_loop(&mut rd, &tx, peer, &shared, max_in_flight).await;
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
            let _ = tx.send(reply).await;
            drop(tx);
            let _ = tokio::time::timeout(REFUSAL_LINGER, &mut writer.0).await;
        }
    }
}

/// Reads and dispatches frames until the connection ends.
async fn read_loop<R: AsyncRead + Unpin>(
    rd: &mut R,
    tx: &mpsc::Sender<Outgoing>,
    peer: SocketAddr,
    shared: &Arc<Shared>,
    max_in_flight: usize,
) -> End {
    // Handshake.
    let first = match tokio::time::timeout(HELLO_TIMEOUT, read_frame(rd, HELLO_LIMITS)).await {
        Err(_) => return End::Closed(Some(io::ErrorKind::TimedOut.into())),
        Ok(Ok(Some(f))) => f,
        Ok(Ok(None)) => return End::Closed(None),
        Ok(Err(e)) => return frame_end(e),
    };
    let req: Request = match frame::decode_body(&first.0) {
        Ok(r) => r,
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
    let origin = Arc::clone(&shared.origin);
    let info = match tokio::task::spawn_blocking(move || origin.info()).await {
        Ok(Ok(info)) => info,
        Ok(Err(e)) => {
            let reply = Outgoing::new(req.id, Err(wire_error(e.clone())), Vec::new());
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
    let hello = Reply::Hello {
        version: PROTOCOL_VERSION,
        export_id: info.export_id,
        root: info.root,
        read_only: shared.cfg.read_only || info.read_only,
    };
    if tx
        .send(Outgoing::new(req.id, Ok(hello), Vec::new()))
        .await
        .is_err()
    {
        return End::Closed(None);
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
        let req: Request = match frame::decode_body(&body) {
            Ok(r) => r,
            Err(e) => return End::Bad(e.to_string()),
        };
        Stats::bump(&shared.stats.requests);
        let Request { id, op } = req;
        if matches!(op, Op::Hello { .. }) || !data.is_empty() {
            // A second hello, or data on a request that takes none (no write ops yet).
            let err = if data.is_empty() {
                WireError::Protocol
            } else {
                WireError::Invalid
            };
            if tx
                .send(Outgoing::new(id, Err(err), Vec::new()))
                .await
                .is_err()
            {
                return End::Closed(None);
            }
            continue;
        }
        let shared = Arc::clone(shared);
        let tx = tx.clone();
        tokio::spawn(async move {
            let out = match tokio::task::spawn_blocking(move || handle(&shared, id, op)).await {
                Ok(out) => out,
                Err(e) => {
                    tracing::error!(id, "request handler panicked: {e}");
                    Outgoing::new(id, Err(WireError::Io), Vec::new())
                }
            };
            // Fails only when the writer is gone (connection closing): nothing to do.
            let _ = tx.send(out).await;
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
    let mut data = vec![0u8; h.data_len as usize];
    r.read_exact(&mut data).await?;
    Ok(Some((body, data)))
}

/// Runs one request against the origin (on the blocking pool) and encodes the reply.
fn handle(shared: &Shared, id: u64, op: Op) -> Outgoing {
    let origin = &*shared.origin;
    let result = match op {
        Op::Lookup { parent, name } => origin.lookup(parent, &name).map(Reply::Entry),
        Op::GetAttr { handle } => origin.getattr(handle).map(Reply::Attr),
        Op::ReadDir {
            dir,
            cookie,
            max_entries,
        } => origin
            .readdir(dir, cookie, max_entries.clamp(1, MAX_DIR_PAGE))
            .map(|p| Reply::DirPage {
                entries: p.entries,
                next: p.next,
            }),
        Op::Read {
            handle,
            offset,
            len,
        } => {
            if len > MAX_READ_LEN {
                return Outgoing::new(id, Err(WireError::Invalid), Vec::new());
            }
            // Zero-copy would go here: instead of reading into a buffer, hand the writer an
            // (open file, offset, len) and let it sendfile(2)/splice(2) straight from the
            // page cache into the socket after the header and body.
            return match origin.read(handle, offset, len) {
                Ok(mut r) => {
                    r.data.truncate(len as usize);
                    let reply = Reply::Data {
                        len: r.data.len() as u32,
                        version: r.version,
                    };
                    Outgoing::new(id, Ok(reply), r.data)
                }
                Err(e) => Outgoing::new(id, Err(wire_error(e)), Vec::new()),
            };
        }
        Op::ReadLink { handle } => origin.readlink(handle).map(Reply::Link),
        Op::StatFs => origin.statfs().map(Reply::StatFs),
        Op::Counters => Ok(Reply::Counters(shared.counters())),
        Op::Hello { .. } => Err(OriginError::Fs(WireError::Protocol)),
    };
    Outgoing::new(id, result.map_err(wire_error), Vec::new())
}

/// What to tell a client when the origin failed.
fn wire_error(e: OriginError) -> WireError {
    match e {
        OriginError::Fs(w) => w,
        other => {
            tracing::warn!("origin failure: {other}");
            WireError::Io
        }
    }
}

/// Compares secrets without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Writes queued replies, flushing whenever the queue runs dry.
async fn write_loop(wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Outgoing>) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(IO_BUF, wr);
    while let Some(first) = rx.recv().await {
        write_one(&mut w, &first).await?;
        while let Ok(next) = rx.try_recv() {
            write_one(&mut w, &next).await?;
        }
        w.flush().await?;
    }
    w.shutdown().await
}

async fn write_one(w: &mut BufWriter<OwnedWriteHalf>, out: &Outgoing) -> io::Result<()> {
    w.write_all(&FrameHeader::encode(out.body.len(), out.data.len()))
        .await?;
    w.write_all(&out.body).await?;
    // Large data sections bypass the buffer (BufWriter writes them straight through).
    w.write_all(&out.data).await
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn token_compare() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
