//! A network link between a client and a server that a test can cut and restore: a TCP
//! forwarder on 127.0.0.1. Cutting it resets every connection through it and closes new
//! ones at once (as a dropped link whose far end answers with resets does); restoring it
//! forwards again on the same address. The server keeps running throughout.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A running link; cut on drop.
pub struct Link {
    /// Where clients connect.
    pub addr: String,
    up: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Link {
    /// A link to `target` (`HOST:PORT`), up. Its address stays bound while it is cut (so
    /// that no other test's socket can take it meanwhile): connections then made are
    /// closed at once.
    pub fn start(target: &str) -> Link {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let up = Arc::new(AtomicBool::new(true));
        let stop = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let addr = l.local_addr().unwrap().to_string();
        let (up2, stop2, conns2, target) =
            (up.clone(), stop.clone(), conns.clone(), target.to_string());
        let accept = thread::spawn(move || {
            for c in l.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = c else { continue };
                if !up2.load(Ordering::SeqCst) {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                {
                    let mut all = conns2.lock().unwrap();
                    all.push(client.try_clone().unwrap());
                    all.push(server.try_clone().unwrap());
                }
                forward(client.try_clone().unwrap(), server.try_clone().unwrap());
                forward(server, client);
            }
        });
        Link {
            addr,
            up,
            stop,
            conns,
            accept: Some(accept),
        }
    }

    /// Whether the link is up.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// Cuts the link: resets every connection and closes new ones at once.
    pub fn cut(&mut self) {
        if !self.is_up() {
            return;
        }
        self.up.store(false, Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Restores the link.
    pub fn restore(&mut self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut();
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Copies `from` to `to` on a thread until either side closes.
fn forward(mut from: TcpStream, mut to: TcpStream) {
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    });
}
