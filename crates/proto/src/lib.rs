//! The hoardfs wire format, shared by the server and every client.
//!
//! A connection carries length-delimited [`frame`]s in both directions. Each frame holds a
//! small postcard-encoded *body* (a [`msg::Request`] from a client, a [`msg::ServerMessage`] —
//! a reply or unsolicited callback breaks — from a server) and an optional raw
//! *data* section, so that file contents travel without re-encoding and can be written
//! straight from or into buffers. Requests carry a client-chosen id; replies carry the same id
//! and may come back in any order, so many requests can be in flight on one connection.
//!
//! The first request on a connection must be [`msg::Op::Hello`] (protocol version + token).
//! Unless both sides chose plaintext, the connection is a TLS 1.3 session first (crate
//! `hoardfs-tls`), so frames, tokens and file data never cross the network in clear.

pub mod buffers;
pub mod check;
pub mod frame;
pub mod ids;
pub mod lock;
pub mod msg;

pub use check::{check_name, check_target, check_xattr_list};
pub use frame::{FrameError, FrameHeader, Limits};
pub use ids::{
    ANON_ID, Caller, IdMap, IdRange, Identities, MAY_EXEC, MAY_READ, MAY_WRITE, Restrict, Squash,
    may,
};
pub use lock::{LOCK_TO_EOF, LockHolder, LockKind, LockRange, LockType};
pub use msg::*;

/// Protocol version spoken by this build. Bumped on any incompatible change.
/// Version 5 added [`msg::Op::ReadTree`]; version 6 a [`Caller`] on every request,
/// [`msg::Op::Access`], `Attr::acl` and the server's [`Identities`] in `Hello`; version 7
/// file locks ([`msg::Op::Lock`], [`msg::Op::TestLock`], [`msg::Op::UnlockAll`],
/// [`msg::Op::CancelLock`]); version 8 [`msg::Op::Fallocate`].
pub const PROTOCOL_VERSION: u32 = 8;

/// Oldest protocol version a server still accepts from clients (a connection speaks the
/// client's version; requests it does not know are never sent on it). Clients need a
/// server at least as new as they are: upgrade servers first. Version 6 is the first
/// whose requests say who they are made for, which a server that acts as its callers
/// cannot do without: older clients are refused with a protocol error.
pub const MIN_PROTOCOL_VERSION: u32 = 6;

/// An idle client sends [`msg::Op::Ping`] this often, so that the server can close
/// connections that say nothing for longer (its idle timeout) without closing idle mounts.
pub const PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(30);

/// Default TCP port of `hoardfs serve`.
pub const DEFAULT_PORT: u16 = 7070;

/// Largest read a client may ask for in one request.
pub const MAX_READ_LEN: u32 = 8 << 20;

/// Largest write (and extended attribute value) a request may carry.
pub const MAX_WRITE_LEN: u32 = 8 << 20;
