//! Transport security through real mounts: what crosses the link, a man in the middle who
//! alters bytes, and a server whose identity changed.

mod common;

use common::proxy::{Proxy, Tamper};
use common::*;

/// Writes through the mount and reads back: the captured link shows neither the file
/// bytes nor the credential with TLS, and shows both without it (so the check can fail).
#[test]
fn the_link_carries_no_file_bytes_and_no_credential() {
    require_fuse();
    for plaintext in [false, true] {
        let t = scratch();
        let exp = t.path().join("export");
        std::fs::create_dir_all(&exp).unwrap();
        let marker = b"FILE-CONTENT-MARKER-0123456789".repeat(1000);
        std::fs::write(exp.join("read-me"), &marker).unwrap();
        let token = b"tok-SECRET-CREDENTIAL-42";
        let token_file = t.path().join("token");
        std::fs::write(&token_file, token).unwrap();
        let tf = token_file.to_str().unwrap();
        let flags: &[&str] = if plaintext {
            &["--insecure-plaintext"]
        } else {
            &[]
        };
        let mut srv_args = vec!["--token-file", tf];
        srv_args.extend_from_slice(flags);
        let srv = Server::start_args(&exp, &srv_args);
        let proxy = Proxy::start(&srv.addr, Tamper::None);
        let cache = t.path().join("cache");
        let mut mount_args = vec!["--cache-dir", cache.to_str().unwrap(), "--token-file", tf];
        mount_args.extend_from_slice(flags);
        let m = Mount::start(&proxy.addr, &t.path().join("mnt"), &mount_args).unwrap();
        assert_eq!(std::fs::read(m.p("read-me")).unwrap(), marker);
        let written = b"WRITTEN-BY-CLIENT-MARKER-987654".repeat(1000);
        std::fs::write(m.p("written"), &written).unwrap();
        assert_eq!(std::fs::read(exp.join("written")).unwrap(), written);
        m.unmount();
        let leaked = [
            ("file content", proxy.saw(b"FILE-CONTENT-MARKER")),
            ("written content", proxy.saw(b"WRITTEN-BY-CLIENT-MARKER")),
            ("credential", proxy.saw(token)),
            ("file name", proxy.saw(b"read-me")),
        ];
        for (what, seen) in leaked {
            if plaintext {
                assert!(
                    seen,
                    "plaintext control: {what} should be visible on the link"
                );
            } else {
                assert!(!seen, "TLS: {what} crossed the link readable");
            }
        }
    }
}

/// A proxy that flips one bit of what the server sends: the client notices (the TLS
/// record fails authentication), never caches the altered bytes, and a later mount reads
/// the true file. Without TLS the same flip is served (the control: the check can fail).
#[test]
fn tampered_server_bytes_are_detected_and_never_cached() {
    require_fuse();
    for plaintext in [false, true] {
        let t = scratch();
        let exp = t.path().join("export");
        std::fs::create_dir_all(&exp).unwrap();
        let truth = bytes(77, 8 << 20);
        std::fs::write(exp.join("data"), &truth).unwrap();
        let flags: &[&str] = if plaintext {
            &["--insecure-plaintext"]
        } else {
            &[]
        };
        let srv = Server::start_args(&exp, flags);
        // Past the handshake, inside the file data of the first connection only.
        let proxy = Proxy::start(
            &srv.addr,
            Tamper::FlipAt {
                offset: 3 << 20,
                connections: 1,
            },
        );
        let cache = t.path().join("cache");
        let c = cache.to_str().unwrap();
        let mnt = t.path().join("mnt");
        let mut args = vec!["--cache-dir", c, "--timeout", "5"];
        args.extend_from_slice(flags);
        let m = Mount::start(&proxy.addr, &mnt, &args).unwrap();
        let first = std::fs::read(m.p("data"));
        assert_eq!(proxy.tampered.load(std::sync::atomic::Ordering::SeqCst), 1);
        m.unmount();
        if plaintext {
            assert!(
                first.is_ok_and(|got| got != truth),
                "plaintext control: the flipped bit should reach the reader"
            );
            continue;
        }
        match first {
            Ok(got) => assert!(got == truth, "a read returned altered bytes"),
            Err(e) => eprintln!("read failed as it may: {e}"),
        }
        drop_caches();
        // Straight to the server, from the same cache: whatever was kept is true.
        let m = Mount::start(&srv.addr, &mnt, &["--cache-dir", c]).unwrap();
        assert!(
            std::fs::read(m.p("data")).unwrap() == truth,
            "the cache kept altered bytes"
        );
        m.unmount();
    }
}

/// After a client trusted a server on first use, another server (another key) on the same
/// address is refused with a message that says what changed and how to accept it.
#[test]
fn a_server_with_another_identity_on_the_same_address_is_refused() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"hello").unwrap();
    let mut first = Server::start_in(&exp, "127.0.0.1:0", &t.path().join("state-a"), &[]);
    let cache = t.path().join("cache");
    let c = cache.to_str().unwrap();
    let mnt = t.path().join("mnt");
    let m = Mount::start(&first.addr, &mnt, &["--cache-dir", c]).unwrap();
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"hello");
    m.unmount();
    let recorded = std::fs::read_to_string(cache.join("server-identity")).unwrap();
    let old = first.fingerprint.unwrap().to_string();
    assert!(recorded.starts_with(&old), "{recorded}");
    first.kill();
    let addr = first.addr.clone();
    let second = Server::start_in(&exp, &addr, &t.path().join("state-b"), &[]);
    let new = second.fingerprint.unwrap().to_string();
    assert_ne!(old, new);
    let err = Mount::start(&second.addr, &mnt, &["--cache-dir", c])
        .err()
        .expect("a server with another identity must be refused");
    assert!(err.contains(&old) && err.contains(&new), "{err}");
    assert!(
        err.contains("--server-fingerprint"),
        "no way out offered: {err}"
    );
    // Accepting the new identity explicitly works and replaces the record. (The refused
    // client has exited: `Mount::start` saw it, so its cache lock is free.)
    let m = Mount::start(
        &second.addr,
        &mnt,
        &["--cache-dir", c, "--server-fingerprint", &new],
    )
    .unwrap();
    assert_eq!(std::fs::read(m.p("f")).unwrap(), b"hello");
    m.unmount();
    let recorded = std::fs::read_to_string(cache.join("server-identity")).unwrap();
    assert!(recorded.starts_with(&new), "{recorded}");
}
