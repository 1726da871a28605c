//! A TCP proxy on 127.0.0.1 that stands between a client and a server: it records every
//! byte in both directions (what a packet capture of the link would show) and can tamper
//! with what the server sends, as a man in the middle would.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// What the proxy does to the server's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tamper {
    /// Forward unchanged.
    None,
    /// Flip one bit of the server's byte at this offset of each of the first `n`
    /// connections' server-to-client streams.
    FlipAt { offset: usize, connections: usize },
}

/// A running proxy; stops accepting when dropped.
pub struct Proxy {
    /// Where clients connect.
    pub addr: String,
    /// Client-to-server bytes of every connection, concatenated.
    pub upstream: Arc<Mutex<Vec<u8>>>,
    /// Server-to-client bytes as the server sent them.
    pub downstream: Arc<Mutex<Vec<u8>>>,
    /// Bytes the proxy altered.
    pub tampered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Proxy {
    /// Proxies to `target` (`HOST:PORT`).
    pub fn start(target: &str, tamper: Tamper) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let upstream = Arc::new(Mutex::new(Vec::new()));
        let downstream = Arc::new(Mutex::new(Vec::new()));
        let tampered = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (up, down, t, st) = (
            upstream.clone(),
            downstream.clone(),
            tampered.clone(),
            stop.clone(),
        );
        let target = target.to_string();
        thread::spawn(move || {
            let mut n = 0usize;
            for c in l.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = c else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                let flip = match tamper {
                    Tamper::FlipAt {
                        offset,
                        connections,
                    } if n < connections => Some(offset),
                    _ => None,
                };
                n += 1;
                pump(
                    client.try_clone().unwrap(),
                    server.try_clone().unwrap(),
                    up.clone(),
                    None,
                    t.clone(),
                );
                pump(server, client, down.clone(), flip, t.clone());
            }
        });
        Proxy {
            addr,
            upstream,
            downstream,
            tampered,
            stop,
        }
    }

    /// Whether `needle` crossed the link in either direction.
    pub fn saw(&self, needle: &[u8]) -> bool {
        let has = |v: &[u8]| v.windows(needle.len()).any(|w| w == needle);
        has(&self.upstream.lock().unwrap()) || has(&self.downstream.lock().unwrap())
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(&self.addr);
    }
}

/// Copies `from` to `to` on a thread, recording and optionally flipping one bit.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    log: Arc<Mutex<Vec<u8>>>,
    flip_at: Option<usize>,
    tampered: Arc<AtomicUsize>,
) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        let mut seen = 0usize;
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            log.lock().unwrap().extend_from_slice(&buf[..n]);
            if let Some(at) = flip_at
                && at >= seen
                && at < seen + n
            {
                buf[at - seen] ^= 0x01;
                tampered.fetch_add(1, Ordering::SeqCst);
            }
            seen += n;
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
