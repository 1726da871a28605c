//! TLS for the blocking client connection: one rustls session shared by the reader thread
//! ([`TlsRead`]) and the callers that write requests ([`TlsWrite`]).
//!
//! Neither side holds the session lock while blocked on the socket: the reader reads
//! ciphertext without it and then decrypts under it; a writer encrypts under it and then
//! writes the ciphertext without it. Writers are serialised by `Conn`'s writer mutex, so
//! records reach the socket in the order they were sealed.
//!
//! Lock order: `Conn::writer` → the session lock (the reader thread takes only the latter).

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use hoardfs_tls::rustls::ClientConnection;
use hoardfs_tls::{ALPN, ClientTls};
use parking_lot::Mutex;

use crate::OriginError;

/// Ciphertext read from the socket per system call.
const CIPHER_BUF: usize = 128 << 10;

type Session = Arc<Mutex<ClientConnection>>;

/// Runs the TLS handshake on `sock` within `timeout` and returns the two halves.
pub(crate) fn handshake(
    mut sock: TcpStream,
    tls: &ClientTls,
    addr: &str,
    timeout: Duration,
) -> Result<(TlsRead, TlsWrite), OriginError> {
    let fail = |what: String| {
        let hint = if what.contains("identity changed") {
            ""
        } else {
            " (if the server runs with --insecure-plaintext, pass it here too)"
        };
        OriginError::Security(format!("TLS handshake with {addr} failed: {what}{hint}"))
    };
    let name = tls.checked_server_name(addr).map_err(fail)?;
    let mut conn = ClientConnection::new(tls.config(), name).map_err(|e| fail(e.to_string()))?;
    sock.set_read_timeout(Some(timeout.max(Duration::from_millis(1))))
        .map_err(|e| OriginError::Unreachable(e.to_string()))?;
    while conn.is_handshaking() {
        match conn.complete_io(&mut sock) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(OriginError::Unreachable(format!(
                    "{addr}: no TLS handshake within {timeout:?}"
                )));
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Err(fail(e.to_string())),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                return Err(fail("the server closed the connection".into()));
            }
            Err(e) => return Err(OriginError::Unreachable(format!("{addr}: {e}"))),
        }
    }
    // Flush our Finished (complete_io writes it, but be sure nothing is left behind).
    while conn.wants_write() {
        conn.write_tls(&mut sock)
            .map_err(|e| OriginError::Unreachable(format!("{addr}: {e}")))?;
    }
    if conn.alpn_protocol() != Some(ALPN) {
        return Err(fail(
            "the peer is not a hoardfs server (no hoardfs ALPN)".into(),
        ));
    }
    sock.set_read_timeout(None)
        .map_err(|e| OriginError::Unreachable(e.to_string()))?;
    let reader = sock
        .try_clone()
        .map_err(|e| OriginError::Unreachable(e.to_string()))?;
    let session = Arc::new(Mutex::new(conn));
    Ok((
        TlsRead {
            sock: reader,
            session: Arc::clone(&session),
            cipher: vec![0u8; CIPHER_BUF].into_boxed_slice(),
            start: 0,
            end: 0,
        },
        TlsWrite {
            sock,
            session,
            out: Vec::with_capacity(CIPHER_BUF),
        },
    ))
}

/// The read half: plaintext out of the session, ciphertext in from the socket.
pub(crate) struct TlsRead {
    sock: TcpStream,
    session: Session,
    /// Ciphertext read but not yet handed to the session: `cipher[start..end]`.
    cipher: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Read for TlsRead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        loop {
            {
                let mut s = self.session.lock();
                // Feed what we hold while the session has room for it.
                while self.start < self.end && s.wants_read() {
                    let mut rest = &self.cipher[self.start..self.end];
                    let n = s.read_tls(&mut rest)?;
                    self.start += n;
                    s.process_new_packets()
                        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                }
                match s.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
            if self.start < self.end {
                // The session wants no more yet but has no plaintext: cannot happen with
                // a well-formed stream; avoid spinning.
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "TLS session stalled",
                ));
            }
            let n = self.sock.read(&mut self.cipher)?;
            if n == 0 {
                return Ok(0);
            }
            self.start = 0;
            self.end = n;
        }
    }
}

/// The write half: plaintext sealed under the session lock, ciphertext written after.
pub(crate) struct TlsWrite {
    sock: TcpStream,
    session: Session,
    out: Vec<u8>,
}

impl TlsWrite {
    /// Seals as much of `bufs` as the session takes and writes the records out.
    fn seal_and_send(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let n = {
            let mut s = self.session.lock();
            let n = s.writer().write_vectored(bufs)?;
            while s.wants_write() {
                s.write_tls(&mut self.out)?;
            }
            n
        };
        let sent = self.sock.write_all(&self.out);
        self.out.clear();
        sent.map(|()| n)
    }
}

impl Write for TlsWrite {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.seal_and_send(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.seal_and_send(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
