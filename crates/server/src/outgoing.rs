//! [`Outgoing`]: a frame encoded for a connection's writer (a reply, or a message such as
//! a batch of callback breaks), with what its request holds until it is written
//! ([`Held`]). Made by the request handlers and the callback registry, written by the
//! connection (`crate::conn`). Also what a client is told when the origin failed
//! ([`wire_error`]).

use hoardfs_origin::FileRange;
use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{Reply, Response, ServerMessage, WireError};
use tokio::sync::OwnedSemaphorePermit;

/// An encoded frame waiting for the writer.
pub(crate) struct Outgoing {
    pub(crate) body: Vec<u8>,
    pub(crate) data: Vec<u8>,
    /// A data section sent from a file with `sendfile` instead of `data`.
    pub(crate) file: Option<FileRange>,
    /// A callback-break frame (counted in the connection's pending breaks until written).
    pub(crate) is_break: bool,
    /// What its request holds until this is written.
    pub(crate) held: Option<Held>,
}

impl Outgoing {
    /// Encodes a reply; a body the client would reject as too large becomes `Io`.
    pub(crate) fn new(id: u64, result: Result<Reply, WireError>, data: Vec<u8>) -> Outgoing {
        let msg = ServerMessage::Response(Response { id, result });
        let out = Outgoing {
            data,
            ..Outgoing::message(&msg, false)
        };
        if out.body.len() > Limits::RESPONSE.max_body as usize {
            tracing::warn!(id, len = out.body.len(), "reply too large for the wire");
            return Outgoing::new(id, Err(WireError::Io), Vec::new());
        }
        out
    }

    /// Encodes a read reply whose bytes the writer sends from `range` without copying them.
    pub(crate) fn file(id: u64, range: FileRange) -> Outgoing {
        let reply = Reply::Data {
            len: range.len,
            version: range.version,
        };
        Outgoing {
            file: Some(range),
            ..Outgoing::new(id, Ok(reply), Vec::new())
        }
    }

    /// Encodes any server message without a data section.
    pub(crate) fn message(msg: &ServerMessage, is_break: bool) -> Outgoing {
        Outgoing {
            body: frame::encode_body(msg),
            data: Vec::new(),
            file: None,
            is_break,
            held: None,
        }
    }

    /// Bytes of the frame's body.
    pub(crate) fn body_len(&self) -> usize {
        self.body.len()
    }

    /// Keeps `held` until this reply has been written.
    pub(crate) fn holding(mut self, held: Held) -> Outgoing {
        self.held = Some(held);
        self
    }
}

/// What a request holds until its reply has been written: its slot among the
/// connection's requests in flight and its memory charges.
pub(crate) struct Held {
    pub(crate) _slot: OwnedSemaphorePermit,
    pub(crate) _conn: OwnedSemaphorePermit,
    pub(crate) _server: OwnedSemaphorePermit,
}

/// What to tell a client when the origin failed.
pub(crate) fn wire_error(e: hoardfs_origin::OriginError) -> WireError {
    match e {
        hoardfs_origin::OriginError::Fs(w) => w,
        other => {
            tracing::warn!("origin failure: {other}");
            WireError::Io
        }
    }
}
