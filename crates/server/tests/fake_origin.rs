//! Server + `RemoteOrigin` end to end over loopback, against an in-memory fake origin:
//! protocol behaviour, hostile peers, concurrency and reconnects.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use hoardfs_origin::{FileKind, Origin, OriginError, WireError};
use hoardfs_proto::frame::{self, FrameHeader, Limits};
use hoardfs_proto::{MAX_READ_LEN, Op, PROTOCOL_VERSION, Reply, Request, Response, ServerMessage};

fn fake() -> Arc<FakeOrigin> {
    Arc::new(FakeOrigin::new())
}

#[test]
fn basic_operations() {
    let srv = Running::start(config(Some(b"tok")), fake(), None);
    let o = srv.client(b"tok").unwrap();
    let info = o.info().unwrap();
    assert_eq!(info.export_id, 5);
    assert!(info.read_only);
    assert_eq!(info.root.handle, ROOT);

    let f = o.lookup(ROOT, b"file").unwrap();
    assert_eq!(f.handle, FILE);
    assert_eq!(f.attr.size, 1 << 20);
    assert_eq!(o.getattr(FILE).unwrap(), f.attr);
    assert_eq!(
        o.lookup(ROOT, b"nope"),
        Err(OriginError::Fs(WireError::NotFound))
    );
    assert_eq!(
        o.lookup(FILE, b"x"),
        Err(OriginError::Fs(WireError::NotDir))
    );

    // Paged readdir.
    let mut names = Vec::new();
    let mut cookie = 0;
    loop {
        let page = o.readdir(ROOT, cookie, 2).unwrap();
        names.extend(page.entries.into_iter().map(|e| e.name));
        match page.next {
            Some(c) => cookie = c,
            None => break,
        }
    }
    assert_eq!(
        names,
        [b"file".to_vec(), b"link".to_vec(), b"slow".to_vec()]
    );

    let content = file_content();
    let r = o.read(FILE, 1000, 5000).unwrap();
    assert_eq!(r.data, &content[1000..6000]);
    let tail = o.read(FILE, (1 << 20) - 10, 100).unwrap();
    assert_eq!(tail.data.len(), 10);
    assert!(o.read(FILE, 1 << 30, 100).unwrap().data.is_empty());
    let whole = o.read(FILE, 0, 1 << 20).unwrap();
    assert_eq!(whole.data, content);
    assert_eq!(o.read(ROOT, 0, 1), Err(OriginError::Fs(WireError::IsDir)));

    let link = o.lookup(ROOT, b"link").unwrap();
    assert_eq!(link.attr.kind, FileKind::Symlink);
    assert_eq!(o.readlink(LINK).unwrap(), b"file");
    assert_eq!(o.statfs().unwrap().bsize, 4096);

    // Handles from another epoch are stale.
    let old = hoardfs_origin::Handle { epoch: 1, id: 2 };
    assert_eq!(o.getattr(old), Err(OriginError::Fs(WireError::Stale)));
}

#[test]
fn oversized_read_is_invalid() {
    let srv = Running::start(config(None), fake(), None);
    let o = srv.client(b"anything").unwrap();
    assert_eq!(
        o.read(FILE, 0, MAX_READ_LEN + 1),
        Err(OriginError::Fs(WireError::Invalid))
    );
    assert_eq!(o.read(FILE, 0, MAX_READ_LEN).unwrap().data.len(), 1 << 20);
}

#[test]
fn counters_merge_server_and_origin() {
    let origin = fake();
    let o2 = Arc::clone(&origin);
    let srv = Running::start(config(None), origin, Some(Arc::new(move || o2.counters())));
    let o = srv.client(b"").unwrap();
    for _ in 0..3 {
        o.read(FILE, 0, 10).unwrap();
    }
    let c = o.counters().unwrap();
    assert_eq!(c.connections, 1);
    // hello + 3 reads + counters
    assert_eq!(c.requests, 5);
    assert_eq!(c.reads, 3);
    assert_eq!(c.bad_frames, 0);
}

#[test]
fn wrong_token_is_refused() {
    let srv = Running::start(config(Some(b"right")), fake(), None);
    let e = srv.client(b"wrong").unwrap_err();
    assert_eq!(e, OriginError::Fs(WireError::AuthFailed));
    assert_eq!(
        srv.client(b"").unwrap_err(),
        OriginError::Fs(WireError::AuthFailed)
    );
    assert!(eventually(|| srv.stats.snapshot().bad_frames == 2));
    srv.client(b"right").unwrap();
}

/// Sends a `Hello` of protocol `version` on a new connection; the server's answer.
fn hello(srv: &Running, version: u32) -> ServerMessage {
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let hello = Request {
        id: 9,
        op: Op::Hello {
            version,
            token: vec![],
        },
        caller: Default::default(),
    };
    frame::write_frame(&mut s, &frame::encode_body(&hello), &[]).unwrap();
    let mut data = Vec::new();
    let body = frame::read_frame(&mut s, Limits::RESPONSE, &mut data).unwrap();
    frame::decode_body(&body).unwrap()
}

#[test]
fn older_clients_are_answered_in_their_version() {
    let srv = Running::start(config(None), fake(), None);
    for v in hoardfs_proto::MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION {
        match hello(&srv, v) {
            ServerMessage::Response(Response {
                result: Ok(Reply::Hello { version, .. }),
                ..
            }) => assert_eq!(version, v),
            other => panic!("protocol {v}: {other:?}"),
        }
    }
    assert!(matches!(
        hello(&srv, hoardfs_proto::MIN_PROTOCOL_VERSION - 1),
        ServerMessage::Response(Response {
            result: Err(WireError::Protocol),
            ..
        })
    ));
}

#[test]
fn wrong_version_is_refused() {
    let srv = Running::start(config(None), fake(), None);
    let mut s = TcpStream::connect(srv.addr).unwrap();
    let hello = Request {
        id: 9,
        op: Op::Hello {
            version: PROTOCOL_VERSION + 1,
            token: vec![],
        },
        caller: Default::default(),
    };
    frame::write_frame(&mut s, &frame::encode_body(&hello), &[]).unwrap();
    let mut data = Vec::new();
    let body = frame::read_frame(&mut s, Limits::RESPONSE, &mut data).unwrap();
    let resp: ServerMessage = frame::decode_body(&body).unwrap();
    assert_eq!(
        resp,
        ServerMessage::Response(Response {
            id: 9,
            result: Err(WireError::Protocol)
        })
    );
    assert!(closed(&mut s));
}

/// True if the server closes `s` (EOF or reset) within 5 s.
fn closed(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn frame_bytes(req: &Request, data: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    frame::write_frame(&mut v, &frame::encode_body(req), data).unwrap();
    v
}

/// Opens a raw connection, optionally authenticates, then sends `bytes`.
fn raw(addr: std::net::SocketAddr, authenticate: bool, bytes: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    if authenticate {
        let hello = Request {
            id: 1,
            op: Op::Hello {
                version: PROTOCOL_VERSION,
                token: vec![],
            },
            caller: Default::default(),
        };
        s.write_all(&frame_bytes(&hello, &[])).unwrap();
        let mut data = Vec::new();
        let body = frame::read_frame(&mut s, Limits::RESPONSE, &mut data).unwrap();
        let resp: ServerMessage = frame::decode_body(&body).unwrap();
        assert!(
            matches!(
                &resp,
                ServerMessage::Response(Response {
                    result: Ok(Reply::Hello { .. }),
                    ..
                })
            ),
            "{resp:?}"
        );
    }
    // The server may close before reading everything; that is fine.
    let _ = s.write_all(bytes);
    s
}

#[test]
fn hostile_peers_are_dropped_while_others_keep_working() {
    let srv = Running::start(config(None), fake(), None);
    let good = Arc::new(srv.client(b"").unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let worker = {
        let (good, stop, done) = (Arc::clone(&good), Arc::clone(&stop), Arc::clone(&done));
        thread::spawn(move || {
            let content = file_content();
            while !stop.load(Ordering::SeqCst) {
                let off = (done.load(Ordering::SeqCst) * 4099) % (1 << 20);
                let r = good.read(FILE, off as u64, 4096).unwrap();
                assert_eq!(r.data, &content[off..(off + 4096).min(1 << 20)]);
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    assert!(eventually(|| done.load(Ordering::SeqCst) >= 5));

    let mut bad_magic = FrameHeader::encode(4, 0).to_vec();
    bad_magic[..4].copy_from_slice(b"GET ");
    bad_magic.extend_from_slice(b"/ HTTP/1.1\r\n\r\n");
    let huge = FrameHeader::encode(1 << 30, 0).to_vec();
    let mut garbage_body = FrameHeader::encode(8, 0).to_vec();
    garbage_body.extend_from_slice(&[0xff; 8]);
    let early = frame_bytes(
        &Request {
            id: 2,
            op: Op::StatFs,
            caller: Default::default(),
        },
        &[],
    );
    let hello_with_data = frame_bytes(
        &Request {
            id: 1,
            op: Op::Hello {
                version: PROTOCOL_VERSION,
                token: vec![],
            },
            caller: Default::default(),
        },
        b"data",
    );
    let huge_data = FrameHeader::encode(10, 1 << 30).to_vec();

    let cases: Vec<(&str, bool, Vec<u8>)> = vec![
        ("bad magic", false, bad_magic),
        ("huge body length", false, huge),
        ("garbage body", false, garbage_body.clone()),
        ("request before hello", false, early),
        ("hello with data", false, hello_with_data),
        ("garbage body after hello", true, garbage_body),
        ("huge data length after hello", true, huge_data),
    ];
    for (name, auth, bytes) in &cases {
        let mut s = raw(srv.addr, *auth, bytes);
        assert!(closed(&mut s), "{name}: connection not closed");
    }
    assert!(eventually(
        || srv.stats.snapshot().bad_frames == cases.len() as u64
    ));

    // A peer that connects and leaves without a word is not a bad frame.
    drop(TcpStream::connect(srv.addr).unwrap());

    // The good client kept (and keeps) being served.
    let before = done.load(Ordering::SeqCst);
    assert!(eventually(|| done.load(Ordering::SeqCst) >= before + 5));
    stop.store(true, Ordering::SeqCst);
    worker.join().unwrap();
    assert!(good.is_connected());
    assert_eq!(good.getattr(FILE).unwrap().size, 1 << 20);
    assert_eq!(srv.stats.snapshot().bad_frames, cases.len() as u64);
}

#[test]
fn many_concurrent_reads_in_flight() {
    let srv = Running::start(config(None), fake(), None);
    let o = Arc::new(srv.client(b"").unwrap());
    let content = Arc::new(file_content());
    let threads: Vec<_> = (0..32u64)
        .map(|t| {
            let (o, content) = (Arc::clone(&o), Arc::clone(&content));
            thread::spawn(move || {
                for i in 0..40u64 {
                    let off = ((t * 7919 + i * 104_729) % (1 << 20)) as usize;
                    let len = 1 + ((t + i) % 64) as usize * 1024;
                    let r = o.read(FILE, off as u64, len as u32).unwrap();
                    assert_eq!(r.data, &content[off..(off + len).min(1 << 20)]);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let c = o.counters().unwrap();
    assert_eq!(c.connections, 1, "all requests share one connection");
    assert_eq!(c.requests, 1 + 32 * 40 + 1);
}

#[test]
fn slow_request_does_not_block_fast_ones() {
    let origin = fake();
    let srv = Running::start(config(None), origin.clone(), None);
    let o = Arc::new(srv.client(b"").unwrap());
    let slow = {
        let o = Arc::clone(&o);
        thread::spawn(move || o.read(SLOW, 0, 3))
    };
    // The slow read is in the origin (its only read so far) before the fast ones start.
    assert!(eventually(|| origin.reads.load(Ordering::Relaxed) == 1));
    let t = Instant::now();
    for _ in 0..10 {
        o.getattr(FILE).unwrap();
        o.read(FILE, 0, 1000).unwrap();
    }
    assert!(
        t.elapsed() < SLOW_READ / 2,
        "fast requests waited {:?}",
        t.elapsed()
    );
    assert!(!slow.is_finished());
    assert_eq!(slow.join().unwrap().unwrap().data, b"zzz");
}

#[test]
fn restart_fails_pending_and_reconnects() {
    let origin = fake();
    let srv = Running::start(config(None), origin.clone(), None);
    let addr = srv.addr;
    let o = Arc::new(srv.client(b"").unwrap());
    let pending = {
        let o = Arc::clone(&o);
        thread::spawn(move || {
            let t = Instant::now();
            (o.read(SLOW, 0, 3), t.elapsed())
        })
    };
    // The read is pending in the server when it stops.
    assert!(eventually(|| origin.reads.load(Ordering::Relaxed) == 1));
    srv.stop();
    let (res, waited) = pending.join().unwrap();
    // Sent, and no answer came: it may have been carried out.
    assert!(matches!(res, Err(OriginError::Lost(_))), "{res:?}");
    assert!(waited < SLOW_READ * 2, "{waited:?}");
    assert!(eventually(|| !o.is_connected()));
    // Down: fails (fast), never hangs.
    let t = Instant::now();
    assert!(o.getattr(FILE).unwrap_err().is_offline());
    assert!(t.elapsed() < Duration::from_secs(1));

    // Same port again; the client reconnects on its own.
    let srv2 = Running::start(hoardfs_server::ServerConfig::new(addr), fake(), None);
    assert!(eventually(|| o.getattr(FILE).is_ok()));
    assert!(o.is_connected());
    assert_eq!(o.handshakes(), 2);
    assert_eq!(srv2.stats.snapshot().connections, 1);
}
