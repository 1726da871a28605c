//! Requests, replies and the typed error set carried over the wire.
//!
//! Files are named by [`Handle`]s, never by paths: a handle is issued by the server on
//! lookup and stays valid while the file exists and the server runs (its `epoch` changes when
//! the server restarts, after which clients re-resolve by name). Every attribute set carries a
//! `version`, a change attribute that differs whenever the content or size changes; clients
//! use it to validate cached data.

use serde::{Deserialize, Serialize};

/// Server-issued, opaque reference to one file system object.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Handle {
    /// Random value chosen when the server started; a mismatch means the handle is stale.
    pub epoch: u64,
    /// Slot in the server's handle table.
    pub id: u64,
}

/// Kind of a file system object.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Timestamp {
    /// Whole seconds (may be negative).
    pub secs: i64,
    /// Nanoseconds, 0..1e9.
    pub nanos: u32,
}

/// Attributes of an object as the origin sees them.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
    /// The object has an access ACL beyond its mode bits (reported by servers that act as
    /// their callers; a client then asks the server, `Op::Access`, instead of deciding an
    /// open by the mode bits).
    pub acl: bool,
}

/// A named object: its handle and attributes.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Handle for further requests.
    pub handle: Handle,
    /// Attributes at the time of the reply.
    pub attr: Attr,
}

/// One directory entry with its attributes (readdirplus).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Name within the directory (raw bytes; never contains `/` or NUL).
    pub name: Vec<u8>,
    /// The entry's handle and attributes.
    pub entry: Entry,
}

/// File system statistics (statvfs).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
    /// Write requests handled.
    pub writes: u64,
    /// Bytes written by clients.
    pub bytes_written: u64,
    /// Callback breaks sent to clients.
    pub breaks_sent: u64,
}

/// One request. `id` is echoed in the matching [`Response`].
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Client-chosen id, unique among the client's requests in flight.
    pub id: u64,
    /// The operation.
    pub op: Op,
    /// Who the request is made for (the calling process on the client); the server maps
    /// it ([`crate::IdMap`]) and performs the request as the result.
    pub caller: crate::Caller,
}

/// The operations a client may request.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
    /// Creates a regular file (`O_CREAT`, plus `O_EXCL` when `exclusive`).
    Create {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Vec<u8>,
        /// Permission bits (after the client's umask).
        mode: u32,
        /// Fail with `Exists` if the name exists.
        exclusive: bool,
        /// Owner of the new file.
        owner: Owner,
    },
    /// Creates a special file (fifo, socket, device) or regular file; `mode` includes the
    /// type bits.
    MkNod {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Vec<u8>,
        /// Type and permission bits.
        mode: u32,
        /// Device number for devices.
        rdev: u64,
        /// Owner of the new object.
        owner: Owner,
    },
    /// Creates a directory.
    MkDir {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Vec<u8>,
        /// Permission bits.
        mode: u32,
        /// Owner of the new directory.
        owner: Owner,
    },
    /// Creates a symbolic link `name` → `target`.
    Symlink {
        /// Directory.
        parent: Handle,
        /// New name.
        name: Vec<u8>,
        /// Link target (stored, never resolved by the server).
        target: Vec<u8>,
        /// Owner of the link.
        owner: Owner,
    },
    /// Creates a hard link to `handle` named `name` in `parent`.
    Link {
        /// Existing non-directory.
        handle: Handle,
        /// Directory of the new name.
        parent: Handle,
        /// New name.
        name: Vec<u8>,
    },
    /// Removes a non-directory name.
    Unlink {
        /// Directory.
        parent: Handle,
        /// Name to remove.
        name: Vec<u8>,
    },
    /// Removes an empty directory.
    RmDir {
        /// Directory.
        parent: Handle,
        /// Name to remove.
        name: Vec<u8>,
    },
    /// Renames `parent/name` to `new_parent/new_name` (`renameat2` semantics).
    Rename {
        /// Source directory.
        parent: Handle,
        /// Source name.
        name: Vec<u8>,
        /// Target directory.
        new_parent: Handle,
        /// Target name.
        new_name: Vec<u8>,
        /// [`RENAME_NOREPLACE`] and/or [`RENAME_EXCHANGE`], or 0.
        flags: u32,
    },
    /// Changes attributes; the reply carries the new ones.
    SetAttr {
        /// Object.
        handle: Handle,
        /// What to change.
        set: SetAttrs,
    },
    /// Writes the frame's data section at `offset` (or at end of file when `append`).
    Write {
        /// Regular file.
        handle: Handle,
        /// Byte offset (ignored when `append`).
        offset: u64,
        /// Append atomically at the server's end of file.
        append: bool,
    },
    /// Makes written data durable on the server's disk.
    Fsync {
        /// Object.
        handle: Handle,
        /// Data only (`fdatasync`).
        datasync: bool,
    },
    /// Value of one extended attribute.
    GetXattr {
        /// Object.
        handle: Handle,
        /// Attribute name (e.g. `user.foo`).
        name: Vec<u8>,
    },
    /// Names of the object's extended attributes, each NUL-terminated.
    ListXattr {
        /// Object.
        handle: Handle,
    },
    /// Sets an extended attribute to the frame's data section.
    SetXattr {
        /// Object.
        handle: Handle,
        /// Attribute name.
        name: Vec<u8>,
        /// `XATTR_CREATE` (1) / `XATTR_REPLACE` (2) or 0.
        flags: u32,
    },
    /// Removes an extended attribute.
    RemoveXattr {
        /// Object.
        handle: Handle,
        /// Attribute name.
        name: Vec<u8>,
    },
    /// Keeps an idle connection open (answered with `Done`).
    Ping,
    /// A descriptor of the file was closed: a server whose origin publishes whole files
    /// (`publishes_on_close` in `Hello`) publishes it now. Answered with `Done`, or with
    /// `Written` (`len` 0, `offset` the size) carrying the version before and the
    /// attributes after, when publishing changed them.
    Flush {
        /// Regular file.
        handle: Handle,
    },
    /// The listings of directory `dir` and of directories below it, breadth first, whole
    /// directories only, at most `max_entries` entries in all (protocol 5). Answered with
    /// [`Reply::Tree`]; the server may stop early (it also bounds the time it spends), and
    /// always includes `dir` itself unless `dir` alone exceeds the bound.
    ReadTree {
        /// Top directory.
        dir: Handle,
        /// Upper bound on the entries of all listings together.
        max_entries: u32,
    },
    /// Whether the caller may access the object for `mask` ([`crate::MAY_READ`] |
    /// [`crate::MAY_WRITE`] | [`crate::MAY_EXEC`]), as `access(2)` answers on the server
    /// for the identity the request is performed as: `Done`, or the refusal
    /// (`Access`, `NotPermitted`, `ReadOnly`). Clients ask it for an open they would
    /// otherwise answer from memory, of an object with an access ACL.
    Access {
        /// Object.
        handle: Handle,
        /// Access bits asked for.
        mask: u32,
    },
    /// Takes, changes or releases a lock of `owner` on a regular file (protocol 7; see
    /// [`crate::lock`]). Answered, once held, with the file's `Attr` as of the grant (so
    /// the client need not ask again to see what the previous holder wrote), or `Done`
    /// (released, or the attributes could not be read); `WouldBlock` when another owner's
    /// lock (or an earlier waiter) is in the way and `wait` is false.
    /// With `wait` the answer comes when the lock is granted, possibly much later (the
    /// connection's other requests go on meanwhile), or `Interrupted` once a
    /// [`Op::CancelLock`] names this request.
    Lock {
        /// Regular file.
        handle: Handle,
        /// `flock` or POSIX.
        kind: crate::LockKind,
        /// Client-chosen owner (scoped to the connection).
        owner: u64,
        /// What to lock or release.
        range: crate::LockRange,
        /// Process id of the locker on the client (reported by `F_GETLK` on that client).
        pid: u32,
        /// Wait for the lock rather than answer `WouldBlock`.
        wait: bool,
    },
    /// Whether `owner` could take `range` now: [`Reply::LockTest`] with the lock in the
    /// way, if any (`F_GETLK`).
    TestLock {
        /// Regular file.
        handle: Handle,
        /// `flock` or POSIX.
        kind: crate::LockKind,
        /// Client-chosen owner.
        owner: u64,
        /// The lock that would be asked for.
        range: crate::LockRange,
    },
    /// Releases every lock of `kind` `owner` holds on the file (the file was closed; its
    /// waits go on, ended only by [`Op::CancelLock`]). Answered with `Done`.
    UnlockAll {
        /// Regular file.
        handle: Handle,
        /// `flock` or POSIX.
        kind: crate::LockKind,
        /// Client-chosen owner.
        owner: u64,
    },
    /// Ends the wait of the waiting [`Op::Lock`] sent as request `request` on this
    /// connection (which is then answered `Interrupted`, unless granted first). Answered
    /// with `Done`.
    CancelLock {
        /// Id of the waiting request.
        request: u64,
    },
    /// Allocates or deallocates space of a file as `fallocate(2)` with `mode` (0, or
    /// [`FALLOC_KEEP_SIZE`], [`FALLOC_PUNCH_HOLE`], [`FALLOC_ZERO_RANGE`],
    /// [`FALLOC_COLLAPSE_RANGE`], [`FALLOC_INSERT_RANGE`] as the server's file system
    /// takes them). Answered with the attributes afterwards.
    Fallocate {
        /// Regular file.
        handle: Handle,
        /// Start of the range.
        offset: u64,
        /// Length of the range (not zero).
        length: u64,
        /// `fallocate(2)` mode bits.
        mode: u32,
    },
}

/// `fallocate` mode: do not change the file's size.
pub const FALLOC_KEEP_SIZE: u32 = 0x01;
/// `fallocate` mode: deallocate the range (with [`FALLOC_KEEP_SIZE`]): it reads as zeros.
pub const FALLOC_PUNCH_HOLE: u32 = 0x02;
/// `fallocate` mode: remove the range, the rest of the file moving down.
pub const FALLOC_COLLAPSE_RANGE: u32 = 0x08;
/// `fallocate` mode: the range reads as zeros (allocated).
pub const FALLOC_ZERO_RANGE: u32 = 0x10;
/// `fallocate` mode: insert a hole of the range's length, the rest moving up.
pub const FALLOC_INSERT_RANGE: u32 = 0x20;
/// Every `fallocate` mode bit a request may carry.
pub const FALLOC_MODES: u32 = FALLOC_KEEP_SIZE
    | FALLOC_PUNCH_HOLE
    | FALLOC_COLLAPSE_RANGE
    | FALLOC_ZERO_RANGE
    | FALLOC_INSERT_RANGE;

/// `renameat2` flag: fail with `Exists` instead of replacing the target.
pub const RENAME_NOREPLACE: u32 = 1;
/// `renameat2` flag: atomically swap source and target.
pub const RENAME_EXCHANGE: u32 = 2;

/// Identity a new object is created with.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Owner {
    /// User id of the creating process.
    pub uid: u32,
    /// Group id of the creating process.
    pub gid: u32,
}

/// A new access or modification time.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TimeSet {
    /// The server's current time.
    Now,
    /// This time.
    At(Timestamp),
}

/// Attribute changes of a [`Op::SetAttr`]; `None` fields are left alone.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct SetAttrs {
    /// New permission bits.
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New size (truncate or extend with zeros).
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
}

/// Identifies one state of all of an object's attributes (content version, size, times,
/// mode, owner, link count): a [`Break::Attr`] carries it so that a client already holding
/// exactly these attributes (typically after its own change) can ignore the break.
pub fn change_id(a: &Attr) -> u64 {
    let fields = [
        a.file_id,
        a.version,
        a.size,
        a.mtime.secs as u64,
        a.mtime.nanos as u64,
        a.ctime.secs as u64,
        a.ctime.nanos as u64,
        ((a.perm as u64) << 32) | a.nlink as u64,
        ((a.uid as u64) << 32) | a.gid as u64,
    ];
    // FNV-1a over the little-endian bytes: stable, dependency-free, not cryptographic.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in fields {
        for b in f.to_le_bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h | 1
}

/// A callback break: the server tells a client that something it may cache has changed.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Break {
    /// Attributes (and possibly content) of `file_id` changed; `change_id` is the
    /// [`change_id`] of its attributes after the change (0: unknown), so a client that
    /// already has them can ignore the break.
    Attr {
        /// Object.
        file_id: u64,
        /// [`change_id`] after the change, or 0.
        change_id: u64,
    },
    /// Name `name` in directory `dir_id` was created, removed or replaced; `file_id` is
    /// what it names now (`None`: nothing).
    Entry {
        /// Directory.
        dir_id: u64,
        /// Name within it.
        name: Vec<u8>,
        /// Object the name refers to now.
        file_id: Option<u64>,
    },
    /// Every callback is broken (the server lost track, e.g. its change queue overflowed).
    All,
}

/// Every frame a server sends: a reply to a request, or callback breaks nobody asked for.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServerMessage {
    /// Reply to one request.
    Response(Response),
    /// Callback breaks.
    Breaks(#[serde(deserialize_with = "bounded::breaks")] Vec<Break>),
}

/// Reply to one [`Request`].
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Response {
    /// Id of the request this answers.
    pub id: u64,
    /// Outcome.
    pub result: Result<Reply, WireError>,
}

/// Successful outcomes.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
        /// Write verifier: changes only when the server may have lost writes it
        /// acknowledged but had not made durable (it did not stop cleanly). A client whose
        /// unsynced writes were acknowledged under another verifier must not report a
        /// later fsync or close as successful.
        verifier: u64,
        /// Whether writes become visible to others only when the file is closed (the
        /// origin stores whole objects, as S3 does): clients then send `Flush` at every
        /// close of a file they wrote.
        publishes_on_close: bool,
        /// Whose credentials the server performs requests with, and how it maps the
        /// identities requests claim (this connection's credential included).
        identities: crate::Identities,
    },
    /// Lookup result.
    Entry(Entry),
    /// Attributes.
    Attr(Attr),
    /// A directory page. `next` is the cookie to continue with, `None` at the end.
    DirPage {
        /// Entries (without `.` and `..`).
        #[serde(deserialize_with = "bounded::dir_entries")]
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
    /// Success without a value.
    Done,
    /// Result of a write: bytes written, the version just before it and the attributes
    /// just after it (taken together under the server's per-file write lock, so a client
    /// whose cache held `pre_version` knows its cache plus this write equals `attr.version`).
    Written {
        /// Bytes written.
        len: u32,
        /// Offset the bytes went to (differs from the request's for appends).
        offset: u64,
        /// Change attribute just before the write.
        pre_version: u64,
        /// Attributes just after the write.
        attr: Attr,
    },
    /// Extended attribute value or name list (in the data section).
    Xattr {
        /// Bytes in the data section.
        len: u32,
    },
    /// Complete listings of directories of a subtree, the requested directory first
    /// (reply to [`Op::ReadTree`]).
    Tree {
        /// One listing per directory.
        #[serde(deserialize_with = "bounded::tree")]
        dirs: Vec<TreeDir>,
    },
    /// The lock in the way of an [`Op::TestLock`], if any.
    LockTest(Option<crate::LockHolder>),
}

/// The complete listing of one directory in a [`Reply::Tree`].
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeDir {
    /// The directory's file id (the requested one's, or an entry's of an earlier listing).
    pub file_id: u64,
    /// Its entries (without `.` and `..`).
    #[serde(deserialize_with = "bounded::dir_entries")]
    pub entries: Vec<DirEntry>,
}

/// Typed failure reasons. Mapped to errno only at the FUSE boundary.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
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
    /// The name already exists.
    #[error("file exists")]
    Exists,
    /// Directory not empty.
    #[error("directory not empty")]
    NotEmpty,
    /// No such extended attribute.
    #[error("no data available")]
    NoData,
    /// A value does not fit (extended attribute size).
    #[error("result out of range")]
    Range,
    /// Disk quota exceeded on the server.
    #[error("disk quota exceeded")]
    QuotaExceeded,
    /// Operation not permitted (as opposed to permission denied).
    #[error("operation not permitted")]
    NotPermitted,
    /// Rename or link across file systems inside the export.
    #[error("invalid cross-device link")]
    CrossDevice,
    /// File too large.
    #[error("file too large")]
    TooBig,
    /// Object busy (e.g. a mount point).
    #[error("device or resource busy")]
    InUse,
    /// Too many hard links.
    #[error("too many links")]
    TooManyLinks,
    /// The server accepts only TLS connections and this one is plaintext.
    #[error("the server requires TLS")]
    TlsRequired,
    /// A lock is held by another owner and the request would not wait (`EAGAIN`).
    #[error("the file is locked by another owner")]
    WouldBlock,
    /// The request was cancelled before it was granted (`EINTR`).
    #[error("interrupted")]
    Interrupted,
    /// The server cannot keep this lock (`ENOLCK`).
    #[error("no locks available")]
    NoLocks,
}

/// Most callback breaks one message may carry (a server sends a batch of changes, or the
/// objects of one reply and their names: far fewer).
pub const MAX_BREAKS: usize = 1 << 20;
/// Most entries one directory page may carry (a server clamps pages to 8192 entries).
pub const MAX_DIR_PAGE_ENTRIES: usize = 1 << 16;
/// Most entries plus directories one [`Reply::Tree`] may carry (counted while it is
/// decoded), and most a server puts in one (it clamps `max_entries` to this): at most
/// 384 encoded bytes an entry, 12 MiB, within the 16 MiB a reply may have.
pub const MAX_TREE_ENTRIES: usize = 1 << 15;

// Bounded decoding of the long lists (`deserialize_with = "bounded::..."`).
#[path = "bounded.rs"]
mod bounded;

/// The supplementary groups of a [`crate::Caller`], at most [`crate::ids::MAX_GROUPS`].
pub(crate) fn bounded_groups<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u32>, D::Error> {
    bounded::groups(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{decode_body, encode_body};

    /// A directory entry with a one-byte name and small values (few bytes encoded).
    fn small_entry() -> DirEntry {
        DirEntry {
            name: b"a".to_vec(),
            entry: Entry {
                handle: Handle { epoch: 1, id: 1 },
                attr: Attr {
                    file_id: 1,
                    version: 1,
                    kind: FileKind::File,
                    perm: 0,
                    nlink: 1,
                    uid: 0,
                    gid: 0,
                    size: 0,
                    blocks: 0,
                    rdev: 0,
                    blksize: 0,
                    atime: Timestamp::default(),
                    mtime: Timestamp::default(),
                    ctime: Timestamp::default(),
                    acl: false,
                },
            },
        }
    }

    #[test]
    fn a_tree_is_bounded_by_its_entries_and_directories_together() {
        let entry = small_entry();
        let tree = |dirs: usize, each: usize| {
            ServerMessage::Response(Response {
                id: 1,
                result: Ok(Reply::Tree {
                    dirs: (0..dirs)
                        .map(|i| TreeDir {
                            file_id: i as u64,
                            entries: vec![entry.clone(); each],
                        })
                        .collect(),
                }),
            })
        };
        // 4 directories of 8,191 entries: exactly the bound.
        let at_most = tree(4, MAX_TREE_ENTRIES / 4 - 1);
        assert_eq!(
            decode_body::<ServerMessage>(&encode_body(&at_most)).unwrap(),
            at_most
        );
        // One entry more, or one directory more (each list alone is far below its bound).
        assert!(
            decode_body::<ServerMessage>(&encode_body(&tree(4, MAX_TREE_ENTRIES / 4))).is_err()
        );
        assert!(
            decode_body::<ServerMessage>(&encode_body(&tree(MAX_TREE_ENTRIES + 1, 0))).is_err()
        );
    }

    #[test]
    fn long_lists_are_bounded_when_decoded() {
        let at_most = ServerMessage::Breaks(vec![Break::All; MAX_BREAKS]);
        let body = encode_body(&at_most);
        assert_eq!(decode_body::<ServerMessage>(&body).unwrap(), at_most);
        let over = encode_body(&ServerMessage::Breaks(vec![Break::All; MAX_BREAKS + 1]));
        assert!(decode_body::<ServerMessage>(&over).is_err());
        // A length claiming more than the bound fails before any element is read.
        let mut claim = vec![1u8]; // ServerMessage::Breaks
        claim.extend_from_slice(&[0xff, 0xff, 0xff, 0x0f]); // 2^32 - 1 elements
        claim.extend_from_slice(&[2u8; 64]);
        assert!(decode_body::<ServerMessage>(&claim).is_err());
    }

    #[test]
    fn directory_pages_are_bounded_when_decoded() {
        let entry = small_entry();
        let page = |n| {
            ServerMessage::Response(Response {
                id: 1,
                result: Ok(Reply::DirPage {
                    entries: vec![entry.clone(); n],
                    next: None,
                }),
            })
        };
        let ok = page(MAX_DIR_PAGE_ENTRIES);
        assert_eq!(decode_body::<ServerMessage>(&encode_body(&ok)).unwrap(), ok);
        let over = encode_body(&page(MAX_DIR_PAGE_ENTRIES + 1));
        assert!(decode_body::<ServerMessage>(&over).is_err());
    }
}
