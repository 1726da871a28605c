//! Unit tests of [`RemoteOrigin`] against a tiny in-test fake server (std threads only).

use super::*;
use crate::ReadDst;
use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{
    Attr, FileKind, PROTOCOL_VERSION, Request, Response, ServerMessage, Timestamp,
};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::AtomicBool;
use std::thread;

type Writer = Arc<Mutex<TcpStream>>;
/// Handles one non-Hello request; returns false to close the connection.
type Handler = Arc<dyn Fn(Request, &Writer) -> bool + Send + Sync>;

const EPOCH: u64 = 42;

fn attr(file_id: u64, kind: FileKind) -> Attr {
    Attr {
        file_id,
        version: 7,
        kind,
        perm: 0o755,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        blocks: 0,
        rdev: 0,
        blksize: 4096,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        acl: false,
    }
}

fn root() -> Entry {
    Entry {
        handle: Handle {
            epoch: EPOCH,
            id: 1,
        },
        attr: attr(1, FileKind::Dir),
    }
}

fn reply(w: &Writer, id: u64, result: std::result::Result<Reply, WireError>, data: &[u8]) {
    let body = frame::encode_body(&ServerMessage::Response(Response { id, result }));
    let _ = frame::write_frame(&mut *w.lock(), &body, data);
}

/// A fake server: answers Hello (checking `token`), passes everything else to `handler`.
struct Fake {
    addr: String,
    stop: Arc<AtomicBool>,
}

impl Fake {
    fn start(token: &'static [u8], handler: Handler) -> Fake {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        thread::spawn(move || {
            for s in l.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(s) = s else { continue };
                let h = Arc::clone(&handler);
                thread::spawn(move || serve_conn(s, token, h));
            }
        });
        Fake { addr, stop }
    }

    /// Stops accepting (the listener closes after one more connection attempt).
    fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve_conn(s: TcpStream, token: &[u8], h: Handler) {
    let w: Writer = Arc::new(Mutex::new(s.try_clone().unwrap()));
    let mut r = s;
    let mut data = Vec::new();
    while let Ok(body) = frame::read_frame(&mut r, Limits::REQUEST, &mut data) {
        let req: Request = frame::decode_body(&body).unwrap();
        match req.op {
            Op::Hello { token: t, .. } => {
                if t != token {
                    reply(&w, req.id, Err(WireError::AuthFailed), &[]);
                    return;
                }
                let hello = Reply::Hello {
                    version: PROTOCOL_VERSION,
                    export_id: 9,
                    root: root(),
                    read_only: true,
                    verifier: 7,
                    publishes_on_close: false,
                    identities: hoardfs_proto::Identities::Server,
                };
                reply(&w, req.id, Ok(hello), &[]);
            }
            _ => {
                if !h(req, &w) {
                    let _ = w.lock().shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
        }
    }
}

fn opts() -> RemoteOptions {
    RemoteOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        reconnect_backoff: Duration::from_millis(300),
    }
}

/// Answers GetAttr and Read (data = `len` bytes of `b'x'`, replies after `offset` ms, so
/// replies can overtake each other).
fn echo_handler() -> Handler {
    Arc::new(|req: Request, w: &Writer| {
        match req.op {
            Op::GetAttr { handle } => reply(
                w,
                req.id,
                Ok(Reply::Attr(attr(handle.id, FileKind::File))),
                &[],
            ),
            Op::Read { offset, len, .. } => {
                let w = Arc::clone(w);
                thread::spawn(move || {
                    thread::sleep(Duration::from_millis(offset));
                    let data = vec![b'x'; len as usize];
                    reply(
                        &w,
                        req.id,
                        Ok(Reply::Data {
                            len,
                            version: offset,
                        }),
                        &data,
                    );
                });
            }
            Op::StatFs => reply(w, req.id, Err(WireError::Io), &[]),
            _ => reply(w, req.id, Ok(Reply::Link(b"short".to_vec())), b"stray"),
        }
        true
    })
}

#[test]
fn hello_and_simple_calls() {
    let fake = Fake::start(b"secret", echo_handler());
    let o =
        RemoteOrigin::connect(&fake.addr, Security::plaintext(b"secret".to_vec()), opts()).unwrap();
    let info = o.info().unwrap();
    assert_eq!(info.export_id, 9);
    assert_eq!(info.root, root());
    assert!(o.is_connected());
    assert_eq!(
        o.getattr(Handle {
            epoch: EPOCH,
            id: 5
        })
        .unwrap()
        .file_id,
        5
    );
    let r = o.read(root().handle, 0, 10).unwrap();
    assert_eq!(r.data, vec![b'x'; 10]);
    assert_eq!(o.statfs(), Err(OriginError::Fs(WireError::Io)));
    // Wrong reply kind and a stray data section are protocol errors.
    assert!(matches!(
        o.readlink(root().handle),
        Err(OriginError::Protocol(_))
    ));
    fake.stop();
}

#[test]
fn wrong_token_is_auth_failed() {
    let fake = Fake::start(b"secret", echo_handler());
    let e = RemoteOrigin::connect(&fake.addr, Security::plaintext(b"nope".to_vec()), opts())
        .unwrap_err();
    assert_eq!(e, OriginError::Fs(WireError::AuthFailed));
    assert_eq!(e.to_string(), "authentication failed");
    fake.stop();
}

#[test]
fn out_of_order_replies_reach_the_right_callers() {
    let fake = Fake::start(b"", echo_handler());
    let o = Arc::new(RemoteOrigin::connect(&fake.addr, Security::default(), opts()).unwrap());
    let threads: Vec<_> = (0..16u64)
        .map(|i| {
            let o = Arc::clone(&o);
            // Earlier threads get later replies.
            thread::spawn(move || {
                let r = o.read(root().handle, (16 - i) * 10, i as u32 + 1).unwrap();
                assert_eq!(r.data.len(), i as usize + 1);
                assert_eq!(r.version, (16 - i) * 10);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    fake.stop();
}

#[test]
fn broken_connection_wakes_callers_and_next_call_reconnects() {
    // Read never answers (it says it arrived); ReadLink closes the connection.
    let (arrived, read_arrived) = std::sync::mpsc::channel::<()>();
    let h: Handler = Arc::new(move |req: Request, w: &Writer| match req.op {
        Op::Read { .. } => {
            let _ = arrived.send(());
            true
        }
        Op::ReadLink { .. } => false,
        _ => {
            reply(w, req.id, Ok(Reply::Attr(attr(3, FileKind::File))), &[]);
            true
        }
    });
    let fake = Fake::start(b"", h);
    let mut o = opts();
    o.request_timeout = Duration::from_secs(30);
    let o = Arc::new(RemoteOrigin::connect(&fake.addr, Security::default(), o).unwrap());
    let waiter = {
        let o = Arc::clone(&o);
        thread::spawn(move || {
            let t = Instant::now();
            (o.read(root().handle, 0, 1), t.elapsed())
        })
    };
    // The read is in flight (the server has it) when the connection breaks.
    read_arrived
        .recv_timeout(Duration::from_secs(10))
        .expect("the read never reached the server");
    // Sent, and the connection closed instead of an answer.
    assert!(matches!(
        o.readlink(root().handle),
        Err(OriginError::Lost(_))
    ));
    let (res, waited) = waiter.join().unwrap();
    assert!(matches!(res, Err(OriginError::Lost(_))), "{res:?}");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(!o.is_connected());
    assert_eq!(o.handshakes(), 1);
    // The next call reconnects by itself.
    assert_eq!(o.getattr(root().handle).unwrap().file_id, 3);
    assert!(o.is_connected());
    assert_eq!(o.handshakes(), 2);
    fake.stop();
}

#[test]
fn unreachable_server_fails_fast_within_backoff() {
    let fake = Fake::start(b"", echo_handler());
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), opts()).unwrap();
    fake.stop();
    // Drop the established connection by making the server side go away: stop() only
    // stops accepting, so kill ours from the client side.
    o.state.lock().conn.as_ref().unwrap().kill("test");
    hoardfs_testutil::assert_eventually("the killed connection is seen", || !o.is_connected());
    let t = Instant::now();
    assert!(matches!(
        o.getattr(root().handle),
        Err(OriginError::Unreachable(_))
    ));
    // Within the backoff: fails without trying.
    let e = o.getattr(root().handle).unwrap_err();
    assert!(e.to_string().contains("last connection attempt"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1));
    assert!(!o.is_connected());
}

#[test]
fn silent_server_times_out_and_drops_connection() {
    let h: Handler = Arc::new(|_req: Request, _w: &Writer| true);
    let fake = Fake::start(b"", h);
    let mut op = opts();
    op.request_timeout = Duration::from_millis(200);
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), op).unwrap();
    let e = o.getattr(root().handle).unwrap_err();
    assert_eq!(e, OriginError::Timeout(Duration::from_millis(200)));
    assert!(e.is_offline());
    assert!(!o.is_connected());
    fake.stop();
}

#[test]
fn read_length_mismatch_is_protocol_error() {
    let h: Handler = Arc::new(|req: Request, w: &Writer| {
        reply(w, req.id, Ok(Reply::Data { len: 5, version: 1 }), b"abc");
        true
    });
    let fake = Fake::start(b"", h);
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), opts()).unwrap();
    assert!(matches!(
        o.read(root().handle, 0, 5),
        Err(OriginError::Protocol(_))
    ));
    fake.stop();
}

#[test]
fn connect_refused_is_unreachable() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    let e = RemoteOrigin::connect(&addr, Security::default(), opts()).unwrap_err();
    assert!(matches!(e, OriginError::Unreachable(_)), "{e:?}");
}

#[test]
fn callers_of_reconnect_during_an_attempt_share_its_outcome() {
    // A server that accepts connections and never says Hello: each attempt waits out
    // the connect timeout.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = Arc::clone(&accepted);
    thread::spawn(move || {
        let mut held = Vec::new();
        for s in l.incoming() {
            counted.fetch_add(1, Ordering::SeqCst);
            held.push(s);
        }
    });
    let info = OriginInfo {
        verifier: 1,
        export_id: 1,
        root: root(),
        read_only: false,
        identities: hoardfs_proto::Identities::Server,
    };
    let opts = RemoteOptions {
        connect_timeout: Duration::from_millis(500),
        ..opts()
    };
    let why = OriginError::Unreachable("not yet".into());
    let o = Arc::new(RemoteOrigin::disconnected(
        &addr,
        Security::default(),
        opts,
        info,
        false,
        why,
    ));
    let callers = 4;
    let start = Arc::new(std::sync::Barrier::new(callers));
    let threads: Vec<_> = (0..callers)
        .map(|_| {
            let (o, start) = (Arc::clone(&o), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                o.reconnect()
            })
        })
        .collect();
    for t in threads {
        assert!(t.join().unwrap().is_err());
    }
    // One attempt (two if a caller only arrived once the first had failed), not four.
    let n = accepted.load(Ordering::SeqCst);
    assert!((1..=2).contains(&n), "{n} connection attempts");
    // A caller arriving afterwards tries again.
    assert!(o.reconnect().is_err());
    assert_eq!(accepted.load(Ordering::SeqCst), n + 1);
}

/// The thread that last filled a [`VecDst`].
static FILLED_ON: Mutex<Option<String>> = Mutex::new(None);

/// What a destination was answered with: bytes, or an error number.
type Answered = Arc<Mutex<Option<std::result::Result<Vec<u8>, i32>>>>;

/// A destination of `cap` bytes recording what it was answered with.
struct VecDst {
    cap: usize,
    got: Answered,
}

impl ReadDst for VecDst {
    fn capacity(&self) -> usize {
        self.cap
    }
    fn fill(
        self: Box<Self>,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        if len > self.cap {
            *self.got.lock() = Some(Err(libc::EIO));
            return Err(std::io::Error::other("too long"));
        }
        let mut buf = vec![0u8; len];
        let r = fill(&mut buf);
        *FILLED_ON.lock() = thread::current().name().map(str::to_owned);
        *self.got.lock() = Some(r.as_ref().map(|()| buf).map_err(|_| libc::EIO));
        r
    }
    fn fail(self: Box<Self>, errno: i32) {
        *self.got.lock() = Some(Err(errno));
    }
}

#[test]
fn a_direct_read_is_written_into_its_destination_by_the_reader_thread() {
    let fake = Fake::start(b"", echo_handler());
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), opts()).unwrap();
    let h = o.info().unwrap().root.handle;
    let got = Arc::new(Mutex::new(None));
    let mut dst = ReadSlot::new(Box::new(VecDst {
        cap: 1 << 20,
        got: Arc::clone(&got),
    }));
    assert_eq!(o.read_direct(h, 3, 100_000, &mut dst).unwrap(), 100_000);
    assert!(dst.answered());
    assert_eq!(got.lock().take(), Some(Ok(vec![b'x'; 100_000])));
    let on = FILLED_ON.lock().take().unwrap_or_default();
    assert!(
        on.starts_with("hoardfs-rx"),
        "filled on {on:?}, not the reader thread"
    );
    // The connection is in step afterwards (the data section was consumed).
    assert_eq!(o.read(h, 1, 10).unwrap().data, vec![b'x'; 10]);

    // A reply larger than the destination holds is refused whole, not written past it:
    // the reader is answered EIO (the data came the ordinary way and did not fit).
    let mut small = ReadSlot::new(Box::new(VecDst {
        cap: 10,
        got: Arc::clone(&got),
    }));
    o.read_direct(h, 1, 20, &mut small).unwrap_err();
    assert!(small.answered());
    assert_eq!(got.lock().take(), Some(Err(libc::EIO)));
    assert_eq!(o.read(h, 1, 10).unwrap().data, vec![b'x'; 10]);
}

#[test]
fn a_direct_read_that_fails_leaves_its_destination_unanswered() {
    let h = Arc::new(|req: Request, w: &Writer| {
        reply(w, req.id, Err(WireError::Io), &[]);
        true
    });
    let fake = Fake::start(b"", h);
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), opts()).unwrap();
    let handle = o.info().unwrap().root.handle;
    let got = Arc::new(Mutex::new(None));
    let mut dst = ReadSlot::new(Box::new(VecDst {
        cap: 1 << 20,
        got: Arc::clone(&got),
    }));
    let e = o.read_direct(handle, 0, 10, &mut dst).unwrap_err();
    assert!(matches!(e, OriginError::Fs(WireError::Io)), "{e:?}");
    assert!(!dst.answered(), "still to be answered");
    assert!(got.lock().is_none());
    dst.fail(libc::ENOENT);
    assert_eq!(got.lock().take(), Some(Err(libc::ENOENT)));
}

#[test]
fn a_direct_read_whose_reply_stalls_partway_is_answered_when_its_caller_gives_up() {
    // The server answers a read with a break first (so the connection shows a sign of life
    // after the request), then the reply's header and half its data, and no more.
    let h = Arc::new(|req: Request, w: &Writer| {
        if let Op::Read { len, .. } = req.op {
            use std::io::Write as _;
            let mut w = w.lock();
            let breaks = frame::encode_body(&ServerMessage::Breaks(Vec::new()));
            let _ = frame::write_frame(&mut *w, &breaks, &[]);
            let body = frame::encode_body(&ServerMessage::Response(Response {
                id: req.id,
                result: Ok(Reply::Data { len, version: 1 }),
            }));
            let header = frame::FrameHeader::encode(body.len(), len as usize);
            let _ = w.write_all(&header);
            let _ = w.write_all(&body);
            let _ = w.write_all(&vec![b'x'; len as usize / 2]);
            let _ = w.flush();
        }
        true
    });
    let fake = Fake::start(b"", h);
    let mut o = opts();
    o.request_timeout = Duration::from_millis(300);
    let o = RemoteOrigin::connect(&fake.addr, Security::default(), o).unwrap();
    let handle = o.info().unwrap().root.handle;
    let got = Arc::new(Mutex::new(None));
    let mut dst = ReadSlot::new(Box::new(VecDst {
        cap: 1 << 20,
        got: Arc::clone(&got),
    }));
    o.read_direct(handle, 0, 100_000, &mut dst).unwrap_err();
    assert!(dst.answered(), "the reader thread held it");
    // The connection ends, and with it the read: answered EIO, not left waiting.
    hoardfs_testutil::assert_eventually("the stalled read is answered", || got.lock().is_some());
    assert_eq!(got.lock().take(), Some(Err(libc::EIO)));
}
