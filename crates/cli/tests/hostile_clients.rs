//! Clients that misbehave on purpose, against a real `hoardfs serve` (over TLS, and one
//! plaintext for zero-copy replies): one that never reads its replies, a crowd of idle connections, a credential guesser, and a
//! client whose credential is revoked. Each costs the server bounded resources and none
//! keeps an honest client out.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use hoardfs_origin::Origin;
use hoardfs_origin::remote::{ClientTls, RemoteOptions, RemoteOrigin, Security, Trust};
use hoardfs_proto::frame;
use hoardfs_proto::{Op, PROTOCOL_VERSION, Request, Response, ServerMessage, WireError};
use hoardfs_tls::rustls;

/// A TLS session to `srv` as a raw protocol client.
fn raw_session(srv: &Server) -> rustls::StreamOwned<rustls::ClientConnection, TcpStream> {
    let tls = ClientTls::new(Trust::Pinned(srv.fingerprint.unwrap())).unwrap();
    let conn =
        rustls::ClientConnection::new(tls.config(), ClientTls::server_name(&srv.addr)).unwrap();
    let sock = TcpStream::connect(&srv.addr).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

fn send(s: &mut impl Write, id: u64, op: Op) -> std::io::Result<()> {
    frame::write_frame(
        s,
        &frame::encode_body(&Request {
            id,
            op,
            caller: Default::default(),
        }),
        &[],
    )
}

/// The handshake of a client without a credential.
fn send_hello(s: &mut impl Write) -> std::io::Result<()> {
    let op = Op::Hello {
        version: PROTOCOL_VERSION,
        token: Vec::new(),
    };
    send(s, 0, op)
}

/// The highest value of `f` until it stopped changing for 500 ms (sampled every 20 ms,
/// for `at_most`), and whether it did stop.
fn peak_until_settled(at_most: Duration, mut f: impl FnMut() -> u64) -> (u64, bool) {
    let mut peak = 0;
    let (_, calm) = hoardfs_testutil::settled(
        Duration::from_millis(20),
        Duration::from_millis(500),
        at_most,
        || {
            let v = f();
            peak = peak.max(v);
            v
        },
    );
    (peak, calm)
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

fn open_fds(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// A plaintext server sends reads of files unchanged for 2 s with `sendfile`, and such a
/// reply keeps its file open until it is sent. A client that asks for one range of each of
/// many files and never reads its replies must not make the server hold more files open
/// than `--max-open-files` allows (as many cached, as many held by replies): beyond, the
/// server copies. Once read, every reply carries its file's bytes.
#[test]
fn a_client_that_never_reads_zero_copy_replies_holds_bounded_files() {
    const FILES: u64 = 40;
    const LEN: usize = 1 << 20;
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    for i in 0..FILES {
        std::fs::write(exp.join(format!("f{i}")), bytes(100 + i, LEN)).unwrap();
    }
    // Zero-copy is for files unchanged for 2 s (their bytes stay in the page cache).
    std::thread::sleep(Duration::from_millis(2100));
    let srv = Server::start_args(
        &exp,
        &[
            "--insecure-plaintext",
            "--max-open-files",
            "4",
            "--conn-memory-mib",
            "32",
        ],
    );
    let honest = srv.client();
    let root = honest.info().unwrap().root.handle;
    let handles: Vec<_> = (0..FILES)
        .map(|i| {
            honest
                .lookup(root, format!("f{i}").as_bytes())
                .unwrap()
                .handle
        })
        .collect();

    let mut s = TcpStream::connect(&srv.addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    send_hello(&mut s).unwrap();
    let mut data = Vec::new();
    frame::read_frame(&mut s, frame::Limits::RESPONSE, &mut data).unwrap();
    let base = open_fds(srv.pid());
    for (i, h) in handles.iter().enumerate() {
        let op = Op::Read {
            handle: *h,
            offset: 0,
            len: LEN as u32,
        };
        send(&mut s, 1 + i as u64, op).unwrap();
    }
    // The replies the socket cannot take wait in the server (32 MiB of reads per
    // connection): watch its descriptors until they settle (reads being copied hold their
    // file only while they copy; a waiting reply holds its range's until it is sent).
    let (waiting, calm) = hoardfs_testutil::settled(
        Duration::from_millis(20),
        Duration::from_millis(500),
        Duration::from_secs(3),
        || open_fds(srv.pid()),
    );
    eprintln!("server descriptors: {base} before the reads, {waiting} while they wait");
    assert!(calm, "the server's descriptors kept changing");
    // Four cached for reading, four held by replies, and a little slack. Without the
    // bound every waiting reply held its own file: 32 more (the connection's 32 MiB of
    // reads in flight).
    assert!(
        waiting <= base + 4 + 4 + 2,
        "the server held {} more descriptors for replies nobody collected",
        waiting - base
    );

    let mut got = 0;
    while got < FILES {
        let body = frame::read_frame(&mut s, frame::Limits::RESPONSE, &mut data).unwrap();
        match frame::decode_body::<ServerMessage>(&body).unwrap() {
            ServerMessage::Response(Response { id, result }) => {
                result.unwrap();
                assert!(
                    data == bytes(100 + id - 1, LEN),
                    "reply {id} has wrong bytes"
                );
                got += 1;
            }
            ServerMessage::Breaks(_) => {}
        }
    }
}

/// A client pipelines thousands of 8 MiB reads and never reads a reply: the server stops
/// serving it once its 32 MiB budget is spent, its memory stays bounded, a mounted client
/// keeps reading, and the stalled connection is closed after the idle timeout.
#[test]
fn a_client_that_never_reads_replies_costs_bounded_memory() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("big"), bytes(5, 64 << 20)).unwrap();
    std::fs::write(exp.join("other"), bytes(6, 4 << 20)).unwrap();
    let srv = Server::start_args(&exp, &["--idle-timeout", "4", "--conn-memory-mib", "32"]);
    let base = rss_kib(srv.pid());
    let honest = srv.client();
    let reads_before = srv.counters().reads;
    let root = honest.info().unwrap().root.handle;
    let big = honest.lookup(root, b"big").unwrap().handle;

    let mut s = raw_session(&srv);
    s.sock
        .set_write_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    send_hello(&mut s).unwrap();
    let mut sent = 0u64;
    for i in 1..=10_000u64 {
        let op = Op::Read {
            handle: big,
            offset: (i % 8) << 23,
            len: 8 << 20,
        };
        if send(&mut s, i, op).is_err() {
            break; // the server stopped reading: back-pressure reached us
        }
        sent += 1;
    }
    // The server takes in what it will of the pipelined reads (there is no event that says
    // "all taken"): its highest RSS until that stopped changing for 500 ms is the point,
    // watched for 2 s at most (well before the 4 s stall timeout frees the replies).
    let (peak, calm) = peak_until_settled(Duration::from_secs(2), || rss_kib(srv.pid()));
    eprintln!("pipelined {sent} reads; server RSS {base} KiB -> {peak} KiB (settled: {calm})");
    // The requests are small enough to sit in socket buffers; what matters is that the
    // server answers only as many as its budget allows (32 MiB = 4 reads of 8 MiB) plus
    // what the socket can hold.
    let served = srv.counters().reads - reads_before;
    eprintln!("the server answered {served} of them");
    assert!(
        served < 20,
        "the server answered {served} reads nobody collected"
    );
    // The bound (doc/SECURITY.md): the 32 MiB given above of reply data per connection, plus
    // buffers; allow generous slack for the allocator.
    assert!(
        peak < base + 96 * 1024,
        "server RSS grew by {} KiB",
        peak - base
    );

    // An honest client is served meanwhile, through a real mount.
    let m = Mount::start(&srv.addr, &t.path().join("mnt"), &["--no-cache"]).unwrap();
    assert_eq!(hash_file(&m.p("other")), hash_file(&exp.join("other")));
    m.unmount();

    // The stalled connection is dropped once its replies made no progress for 4 s: after
    // that, reading yields what was already in flight and then the end, not the
    // thousands of replies still asked for.
    // (Letting the 4 s stall timeout expire is the point of this wait.)
    std::thread::sleep(Duration::from_secs(6));
    s.sock
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let mut drained = 0usize;
    let closed = loop {
        match s.sock.read(&mut sink) {
            Ok(0) => break true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
            Ok(n) => drained += n,
        }
        if drained > 200 << 20 {
            break false;
        }
    };
    eprintln!("drained {drained} bytes after the stall");
    assert!(closed, "the stalled connection was not closed");
}

/// 2,000 connections that never say anything do not keep a new client from mounting and
/// reading within 10 s: the oldest pending handshakes make room for newer ones.
#[test]
fn idle_connections_do_not_lock_out_a_new_client() {
    require_fuse();
    raise_nofile();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"still here").unwrap();
    let srv = Server::start(&exp);
    let idle: Vec<TcpStream> = (0..2000)
        .map(|_| TcpStream::connect(&srv.addr).expect("connect"))
        .collect();
    let started = Instant::now();
    let m = Mount::start(&srv.addr, &t.path().join("mnt"), &["--no-cache"]).unwrap();
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"still here");
    let took = started.elapsed();
    eprintln!("mounted and read behind 2000 idle connections in {took:?}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    m.unmount();
    drop(idle);
}

/// A TCP connection to `addr` from source address `from` (another loopback address).
fn connect_from(from: std::net::Ipv4Addr, addr: &str) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let to: std::net::SocketAddrV4 = addr.parse().expect("an IPv4 address");
    let sa = |a: std::net::SocketAddrV4| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, bound and connected with valid sockaddr_in values; on
    // success its descriptor is owned by the returned stream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = TcpStream::from_raw_fd(fd);
        let local = sa(std::net::SocketAddrV4::new(from, 0));
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sa(to);
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// A stream of idle connections from one address (127.0.0.2, never sending a byte; the
/// 2,000 most recent kept open, older ones reset) does not keep an honest client from
/// another address out: a source holds only its share of the pending handshakes. (When
/// the oldest handshake of all was evicted instead, each new idle connection pushed the
/// honest one closer to the door, and the stream pushed it out before its TLS handshake
/// was done.)
#[test]
fn a_stream_of_idle_connections_from_one_address_does_not_lock_out_another() {
    require_fuse();
    raise_nofile();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"still here").unwrap();
    let srv = Server::start(&exp);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let made = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood = {
        let (stop, made, addr) = (stop.clone(), made.clone(), srv.addr.clone());
        std::thread::spawn(move || {
            let flooder = std::net::Ipv4Addr::new(127, 0, 0, 2);
            let mut open = std::collections::VecDeque::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(s) = connect_from(flooder, &addr) else {
                    continue;
                };
                made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                open.push_back(s);
                if open.len() > 2000 {
                    reset(open.pop_front().unwrap());
                }
            }
            open.into_iter().for_each(reset);
        })
    };
    let flooding = hoardfs_testutil::wait_until(Duration::from_secs(30), || {
        made.load(std::sync::atomic::Ordering::Relaxed) >= 2000
    });
    assert!(flooding, "the flood did not get under way");
    let started = Instant::now();
    let m = Mount::start(&srv.addr, &t.path().join("mnt"), &["--no-cache"]);
    let took = started.elapsed();
    let during = made.load(std::sync::atomic::Ordering::Relaxed);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flood.join().unwrap();
    let m = m.expect("mount behind the flood");
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"still here");
    eprintln!(
        "mounted from 127.0.0.1 in {took:?} while 127.0.0.2 had made {during} idle connections"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    m.unmount();
}

/// Closes `s` with a reset (no TIME_WAIT left behind: the flood makes tens of thousands).
fn reset(s: TcpStream) {
    use std::os::fd::AsRawFd;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and a linger struct of the size given.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Runs `hoardfs token ARGS --state-dir STATE`, which must succeed; returns its stdout.
fn token(state: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new(bin())
        .arg("token")
        .args(args)
        .arg("--state-dir")
        .arg(state)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
    }
}

/// Wrong credentials: the first few are answered at once, then each waits longer; every
/// one is refused; the log names the address and the claimed credential but does not
/// grow by a line per attempt; an honest client still gets in at once.
#[test]
fn wrong_credentials_are_slowed_and_logged() {
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let state = t.path().join("state");
    let good = token(&state, &["add", "honest"]).trim().to_string();
    let log = t.path().join("server.log");
    let srv = Server::start_logged(&exp, &state, &[], &log);
    let tls = ClientTls::new(Trust::Pinned(srv.fingerprint.unwrap())).unwrap();
    let opts = RemoteOptions {
        connect_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let attempt = |token: &str| {
        let started = Instant::now();
        let r = RemoteOrigin::connect(
            &srv.addr,
            Security::tls(token.as_bytes().to_vec(), tls.clone()),
            opts,
        );
        (r.map(|_| ()), started.elapsed())
    };
    let mut times = Vec::new();
    for i in 0..9 {
        let (r, took) = attempt(&format!("hoardfs1.mallory.guess{i}"));
        assert!(
            matches!(
                r,
                Err(hoardfs_origin::OriginError::Fs(
                    hoardfs_origin::WireError::AuthFailed
                ))
            ),
            "attempt {i}: {r:?}"
        );
        times.push(took);
    }
    eprintln!("refusal times: {times:?}");
    assert!(
        times[..5].iter().all(|t| *t < Duration::from_millis(500)),
        "{times:?}"
    );
    // 6th: 100 ms, 7th: 200 ms, 8th: 400 ms, 9th: 800 ms.
    assert!(times[8] >= Duration::from_millis(800), "{times:?}");
    // A thousand more, at once: none gets in, and the log stays short.
    let threads: Vec<_> = (0..1000)
        .map(|i| {
            let mut s = raw_session(&srv);
            std::thread::Builder::new()
                .stack_size(64 << 10)
                .spawn(move || {
                    let token = format!("hoardfs1.mallory.guess-{i}").into_bytes();
                    let hello = Op::Hello {
                        version: PROTOCOL_VERSION,
                        token,
                    };
                    if send(&mut s, 0, hello).and_then(|()| s.flush()).is_err() {
                        return true; // dropped before it could even ask
                    }
                    let mut data = Vec::new();
                    match frame::read_frame(&mut s, frame::Limits::RESPONSE, &mut data) {
                        // Dropped (to make room, or at shutdown): not let in either.
                        Err(_) => true,
                        Ok(body) => matches!(
                            frame::decode_body::<ServerMessage>(&body),
                            Ok(ServerMessage::Response(Response {
                                result: Err(WireError::AuthFailed),
                                ..
                            }))
                        ),
                    }
                })
                .unwrap()
        })
        .collect();
    // The honest client is not slowed by someone else's failures (nor by its address's).
    let (r, took) = attempt(&good);
    assert!(r.is_ok(), "{r:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let refused = threads.into_iter().map(|h| h.join().unwrap());
    assert_eq!(refused.filter(|r| !r).count(), 0, "a wrong token got in");
    let text = std::fs::read_to_string(&log).unwrap();
    let refusals = text.matches("refused a credential").count();
    assert!(text.contains("mallory"), "the claimed name is not logged");
    assert!(text.contains("127.0.0.1"), "the address is not logged");
    assert!(
        (5..30).contains(&refusals),
        "{refusals} log lines for 1009 refusals"
    );
    assert!(
        text.contains("credential=honest") || text.contains("honest"),
        "{text}"
    );
}

/// Revoking a name closes its clients' connections at once and keeps them out.
#[test]
fn a_revoked_token_loses_its_connection_and_cannot_reconnect() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"data").unwrap();
    let state = t.path().join("state");
    let token_file = t.path().join("laptop.token");
    token(
        &state,
        &["add", "laptop", "--output", token_file.to_str().unwrap()],
    );
    assert!(token(&state, &["list"]).contains("laptop"));
    let srv = Server::start_in(&exp, "127.0.0.1:0", &state, &[]);
    let tf = token_file.to_str().unwrap();
    let mnt = t.path().join("mnt");
    let m = Mount::start(&srv.addr, &mnt, &["--no-cache", "--token-file", tf]).unwrap();
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"data");
    let client = RemoteOrigin::connect(
        &srv.addr,
        Security::tls(
            std::fs::read_to_string(&token_file)
                .unwrap()
                .trim()
                .as_bytes()
                .to_vec(),
            ClientTls::new(Trust::Pinned(srv.fingerprint.unwrap())).unwrap(),
        ),
        RemoteOptions::default(),
    )
    .unwrap();
    let client = Arc::new(client);
    assert!(client.is_connected());
    token(&state, &["revoke", "laptop"]);
    assert_soon("the revoked connection closes", || {
        if client.is_connected() {
            Err("still connected".into())
        } else {
            Ok(())
        }
    });
    // The mount's next request must reconnect, and is refused.
    std::fs::write(exp.join("g"), b"new").unwrap();
    assert!(
        std::fs::read(m.p("g")).is_err(),
        "a revoked client read a new file"
    );
    m.unmount();
    let err = Mount::start(&srv.addr, &mnt, &["--no-cache", "--token-file", tf])
        .err()
        .expect("a revoked token must not mount");
    assert!(err.contains("refused our credential"), "{err}");
}

/// A server started without credentials that gets its first `token add` closes the
/// connections it let in without one.
#[test]
fn connections_let_in_without_a_credential_close_once_one_is_required() {
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let state = t.path().join("state");
    let srv = Server::start_in(&exp, "127.0.0.1:0", &state, &[]);
    let open = srv.client();
    assert!(open.is_connected());
    token(&state, &["add", "first"]);
    assert_soon("the credential-less connection closes", || {
        if open.is_connected() {
            Err("still connected".into())
        } else {
            Ok(())
        }
    });
}
