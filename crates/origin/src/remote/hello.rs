//! The `Hello` handshake of a new connection ([`handshake`]): connecting to the first
//! reachable address of a name, the protocol version, the server's write verifier and
//! export, and clear errors for the usual misconfigurations (TLS against plaintext, a
//! server at its connection limit).

use std::net::{SocketAddr, ToSocketAddrs};

use hoardfs_proto::{MIN_PROTOCOL_VERSION, Op, PROTOCOL_VERSION, Reply, WireError};

use super::conn::{Conn, SinkSlot};
use super::{RemoteOptions, Security, unexpected, validate};
use crate::{OriginError, OriginInfo, Result};

/// What a successful handshake established.
pub(super) struct Greeting {
    pub(super) conn: Conn,
    pub(super) info: OriginInfo,
    /// The server publishes written files only at `Flush`.
    pub(super) publishes_on_close: bool,
    /// The protocol version the connection speaks (the server's, within what we speak).
    pub(super) version: u32,
}

/// Connects to the first reachable address of `addr` and performs the `Hello` handshake.
pub(super) fn handshake(
    addr: &str,
    security: &Security,
    opts: &RemoteOptions,
    sink: &SinkSlot,
) -> Result<Greeting> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| OriginError::Unreachable(format!("cannot resolve {addr}: {e}")))?
        .collect();
    let mut last_err = None;
    let mut conn = None;
    for a in addrs {
        let opened = Conn::open(
            a,
            addr,
            security.tls.as_ref(),
            opts.connect_timeout,
            opts.request_timeout,
            sink.clone(),
        );
        match opened {
            Ok(c) => {
                conn = Some(c);
                break;
            }
            // Another address of the same name would be the same (wrong) server.
            Err(e @ OriginError::Security(_)) => return Err(e),
            Err(e) => last_err = Some(e),
        }
    }
    let conn = conn.ok_or_else(|| match last_err {
        Some(OriginError::Unreachable(e)) => {
            OriginError::Unreachable(format!("cannot connect to {e}"))
        }
        Some(e) => e,
        None => OriginError::Unreachable(format!("{addr} resolves to no address")),
    })?;
    let hello = Op::Hello {
        version: PROTOCOL_VERSION,
        token: security.token.clone(),
    };
    let answer = conn
        .call(0, hello, opts.connect_timeout)
        .map_err(|e| match e {
            OriginError::Fs(WireError::TlsRequired) => OriginError::Security(format!(
                "{addr} accepts only TLS connections: drop --insecure-plaintext"
            )),
            OriginError::Fs(WireError::Busy) => OriginError::Unreachable(format!(
                "{addr} is serving as many clients as it allows (its --max-connections); \
                 try again later"
            )),
            OriginError::Unreachable(_) | OriginError::Lost(_) if security.tls.is_none() => {
                OriginError::Unreachable(format!(
                    "{addr} closed the connection at the handshake (a TLS server? drop \
                     --insecure-plaintext)"
                ))
            }
            // (A hello changes nothing on the server: one lost on the way is no more than
            // a connection that could not be made.)
            OriginError::Lost(m) => OriginError::Unreachable(m),
            e => e,
        })?;
    match validate::answer(&validate::Expect::Hello, answer)? {
        (
            Reply::Hello {
                version,
                export_id,
                root,
                read_only,
                verifier,
                publishes_on_close,
                identities,
            },
            d,
        ) if d.is_empty() => {
            if !(MIN_PROTOCOL_VERSION..=PROTOCOL_VERSION).contains(&version) {
                return Err(OriginError::Protocol(format!(
                    "server at {addr} speaks protocol {version}, we speak \
                     {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"
                )));
            }
            Ok(Greeting {
                conn,
                info: OriginInfo {
                    verifier,
                    export_id,
                    root,
                    read_only,
                    identities,
                },
                publishes_on_close,
                version,
            })
        }
        other => Err(unexpected(&other)),
    }
}
