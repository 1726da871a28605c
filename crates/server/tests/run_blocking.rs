//! `run_blocking` (what the CLI calls): reports the bound address, serves, and returns
//! cleanly on SIGTERM. In its own test binary because it signals the whole process.

mod common;

use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use hoardfs_origin::Origin;

#[test]
fn serves_until_sigterm() {
    let (tx, rx) = mpsc::channel();
    let server = thread::spawn(move || {
        hoardfs_server::run_blocking(config(None), Arc::new(FakeOrigin::new()), None, |addr| {
            tx.send(addr).unwrap()
        })
    });
    let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_ne!(addr.port(), 0);
    let o = hoardfs_origin::remote::RemoteOrigin::connect(
        &addr.to_string(),
        hoardfs_origin::remote::Security::default(),
        opts(),
    )
    .unwrap();
    assert_eq!(o.getattr(FILE).unwrap().size, 1 << 20);

    let status = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    server.join().unwrap().unwrap();
    assert!(eventually(|| !o.is_connected()));
}
