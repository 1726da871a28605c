//! Requests, replies and the typed error set carried over the wire.
//!
//! Files are named by [`Handle`]s, never by paths: a handle is issued by the server on
//! lookup and stays valid while the file exists and the server runs (its `epoch` changes when
//! the server restarts, after which clients re-resolve by name). Every attribute set carries a
//! `version`, a change attribute that differs whenever the content or size changes; clients
//! use it to validate cached data.

use serde::{Deserialize, Serialize};

/// Server-issued, opaque reference to one file system object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Handle {
    /// Random value chosen when the server started; a mismatch means the handle is stale.
    pub epoch: u64,
    /// Slot in the server's handle table.
    pub id: u64,
}

/// Kind of a file system object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link.
    Symlink,
    /// Named pipe.
    Fifo,
    /// Socket.
    Socket,
    /// Character device.
    CharDev,
    /// Block device.
    BlockDev,
}

/// A point in time as seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub secs: i64,
    /// Nanoseconds, 0..1e9.
    pub nanos: u32,
}

/// Attributes of an object as the origin sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attr {
    /// Stable identity of the object on the origin (inode number); the same across
    /// server restarts, so client caches can be keyed by it.
    pub file_id: u64,
    /// Change attribute: differs whenever content or size changes.
    pub version: u64,
    /// Object kind.
    pub kind: FileKind,
    /// Permission bits (the low 12 bits of st_mode).
    pub perm: u16,
    /// Hard link count.
    pub nlink: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Size in bytes.
    pub size: u64,
    /// Allocated 512-byte blocks on the origin.
    pub blocks: u64,
    /// Device number for device nodes.
    pub rdev: u64,
    /// Preferred I/O size.
    pub blksize: u32,
    /// Last access.
    pub atime: Timestamp,
    /// Last modification.
    pub mtime: Timestamp,
    /// Last status change.
    pub ctime: Timestamp,
}

/// A named object: its handle and attributes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Handle for further requests.
    pub handle: Handle,
    /// Attributes at the time of the reply.
    pub attr: Attr,
}

/// One directory entry with its attributes (readdirplus).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Name within the directory (raw bytes; never contains `/` or NUL).
    pub name: Vec<u8>,
    /// The entry's handle and attributes.
    pub entry: Entry,
}

/// File system statistics (statvfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct StatFs {
    /// Total blocks.
    pub blocks: u64,
    /// Free blocks.
    pub bfree: u64,
    /// Blocks available to unprivileged users.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Block size.
    pub bsize: u32,
    /// Maximum name length.
    pub namelen: u32,
    /// Fragment size.
    pub frsize: u32,
}

/// Counters a server keeps; used by tests, `stats` and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ServerCounters {
    /// Connections accepted since start.
    pub connections: u64,
    /// Requests handled.
    pub requests: u64,
    /// Read requests handled.
    pub reads: u64,
    /// File bytes sent in read replies.
    pub bytes_read: u64,
    /// Files opened for reading (misses of the open-file cache).
    pub opens: u64,
    /// Connections closed because of a malformed, oversized or unauthenticated frame.
    pub bad_frames: u64,
}

/// One request. `id` is echoed in the matching [`Response`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen id, unique among the client's requests in flight.
    pub id: u64,
    /// The operation.
    pub op: Op,
}

/// The operations a client may request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Must come first: protocol version and the shared token (empty if none).
    Hello {
        /// [`crate::PROTOCOL_VERSION`] of the client.
        version: u32,
        /// Shared secret from `--token-file`.
        token: Vec<u8>,
    },
    /// Resolve `name` in directory `parent`.
    Lookup {
        /// Directory to search.
        parent: Handle,
        /// One path component.
        name: Vec<u8>,
    },
    /// Fetch fresh attributes.
    GetAttr {
        /// Object.
        handle: Handle,
    },
    /// One page of a directory with attributes. `cookie` 0 starts; the reply says where to
    /// continue.
    ReadDir {
        /// Directory.
        dir: Handle,
        /// Resume point from the previous page.
        cookie: u64,
        /// Upper bound on entries in this page.
        max_entries: u32,
    },
    /// Read up to `len` bytes at `offset`; bytes come in the frame's data section.
    Read {
        /// Regular file.
        handle: Handle,
        /// Byte offset.
        offset: u64,
        /// Byte count (at most [`crate::MAX_READ_LEN`]).
        len: u32,
    },
    /// Target of a symlink.
    ReadLink {
        /// Symlink.
        handle: Handle,
    },
    /// Statistics of the exported file system.
    StatFs,
    /// The server's counters.
    Counters,
}

/// Reply to one [`Request`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Id of the request this answers.
    pub id: u64,
    /// Outcome.
    pub result: Result<Reply, WireError>,
}

/// Successful outcomes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// Handshake accepted.
    Hello {
        /// Server's protocol version.
        version: u32,
        /// Identifies the exported tree (stable across server restarts); clients key their
        /// caches by it.
        export_id: u128,
        /// Root directory.
        root: Entry,
        /// Whether the export refuses modifications.
        read_only: bool,
    },
    /// Lookup result.
    Entry(Entry),
    /// Attributes.
    Attr(Attr),
    /// A directory page. `next` is the cookie to continue with, `None` at the end.
    DirPage {
        /// Entries (without `.` and `..`).
        entries: Vec<DirEntry>,
        /// Continue from here, or end.
        next: Option<u64>,
    },
    /// Read result: `len` bytes follow in the data section; fewer than asked means EOF.
    /// `version` is the file's change attribute when the bytes were read.
    Data {
        /// Bytes in the data section.
        len: u32,
        /// Change attribute observed with the read.
        version: u64,
    },
    /// Symlink target.
    Link(Vec<u8>),
    /// File system statistics.
    StatFs(StatFs),
    /// Server counters.
    Counters(ServerCounters),
}

/// Typed failure reasons. Mapped to errno only at the FUSE boundary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, thiserror::Error)]
pub enum WireError {
    /// No such file or directory.
    #[error("no such file or directory")]
    NotFound,
    /// The handle no longer names a live object (deleted, or server restarted).
    #[error("stale file handle")]
    Stale,
    /// Permission denied.
    #[error("permission denied")]
    Access,
    /// A directory was required.
    #[error("not a directory")]
    NotDir,
    /// A non-directory was required.
    #[error("is a directory")]
    IsDir,
    /// Invalid argument or name (e.g. contains `/`, is `..`).
    #[error("invalid argument")]
    Invalid,
    /// Name longer than NAME_MAX.
    #[error("file name too long")]
    NameTooLong,
    /// Too many symlinks / symlink where none is allowed.
    #[error("too many levels of symbolic links")]
    Loop,
    /// The export is read-only.
    #[error("read-only file system")]
    ReadOnly,
    /// Out of space on the server.
    #[error("no space left on device")]
    NoSpace,
    /// Operation not supported.
    #[error("operation not supported")]
    Unsupported,
    /// The server is overloaded; retry later.
    #[error("server busy")]
    Busy,
    /// Token missing or wrong.
    #[error("authentication failed")]
    AuthFailed,
    /// The peer violated the protocol (wrong version, request before hello, ...).
    #[error("protocol error")]
    Protocol,
    /// I/O error on the server's disk.
    #[error("input/output error")]
    Io,
}
