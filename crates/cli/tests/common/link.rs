//! A network link between a client and a server that a test can cut and restore: a TCP
//! forwarder on 127.0.0.1. Cutting it resets every connection through it and refuses new
//! ones (as a dropped link whose far end answers with resets does); restoring it accepts
//! again on the same address. The server keeps running throughout.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

/// A running link; cut on drop.
pub struct Link {
    /// Where clients connect.
    pub addr: String,
    target: String,
    up: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Link {
    /// A link to `target` (`HOST:PORT`), up.
    pub fn start(target: &str) -> Link {
        let l = Self::bind_outside_the_ephemeral_range();
        let mut link = Link {
            addr: l.local_addr().unwrap().to_string(),
            target: target.to_string(),
            up: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
            accept: None,
        };
        link.serve(l);
        link
    }

    /// A listener on a port below the kernel's ephemeral range (32768 and up): the
    /// address is given up while the link is cut, and no other test's socket bound to
    /// port 0 can take it meanwhile.
    fn bind_outside_the_ephemeral_range() -> TcpListener {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            ^ std::process::id().rotate_left(16);
        for i in 0..1000u32 {
            let port = 20_000 + (seed.wrapping_add(i.wrapping_mul(7919)) % 12_000) as u16;
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
                return l;
            }
        }
        panic!("no free port for a test link");
    }

    fn serve(&mut self, l: TcpListener) {
        self.up.store(true, Ordering::SeqCst);
        let (up, conns, target) = (self.up.clone(), self.conns.clone(), self.target.clone());
        self.accept = Some(thread::spawn(move || {
            for c in l.incoming() {
                if !up.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = c else { continue };
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                {
                    let mut all = conns.lock().unwrap();
                    all.push(client.try_clone().unwrap());
                    all.push(server.try_clone().unwrap());
                }
                forward(client.try_clone().unwrap(), server.try_clone().unwrap());
                forward(server, client);
            }
        }));
    }

    /// Whether the link is up.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::SeqCst)
    }

    /// Cuts the link: closes the listening socket and resets every connection.
    pub fn cut(&mut self) {
        if !self.is_up() {
            return;
        }
        self.up.store(false, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// Restores the link on the same address.
    pub fn restore(&mut self) {
        if self.is_up() {
            return;
        }
        let l = TcpListener::bind(&self.addr).expect("rebind the link's address");
        self.serve(l);
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut();
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
