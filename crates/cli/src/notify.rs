//! systemd readiness notification (`Type=notify` units): `READY=1` on the datagram socket
//! named by `$NOTIFY_SOCKET` (a path, or an abstract socket written `@name`), as
//! sd_notify(3) does, without linking libsystemd. Nothing happens outside systemd.

use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Tells the service manager that start-up is complete, with a human-readable `status`.
/// A failure is logged: the service manager then times the start out, which says more.
pub fn ready(status: &str) {
    let Some(socket) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let msg = format!("READY=1\nSTATUS={}", status.replace('\n', " "));
    if let Err(e) = send(&socket.to_string_lossy(), msg.as_bytes()) {
        tracing::warn!(
            "cannot notify the service manager on {}: {e}",
            socket.to_string_lossy()
        );
    }
}

/// Sends one datagram to `socket` (`/path` or `@abstract`).
pub fn send(socket: &str, msg: &[u8]) -> std::io::Result<()> {
    let addr = match socket.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes())?
        }
        None if socket.starts_with('/') => SocketAddr::from_pathname(socket)?,
        None => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not an absolute path or @abstract name",
            ));
        }
    };
    let sock = UnixDatagram::unbound()?;
    sock.send_to_addr(msg, &addr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reaches_path_and_abstract_sockets() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send(path.to_str().unwrap(), b"READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("hoardfs-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send(&format!("@{name}"), b"READY=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        assert!(send("relative", b"x").is_err());
    }
}
