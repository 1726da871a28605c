//! Origins: the authoritative source of files that a hoardfs client caches.
//!
//! [`Origin`] is the one interface the file-system layer uses to reach data it does not
//! have. Four implementations exist: [`local::LocalOrigin`], a directory on this machine
//! (also what `hoardfs serve` exports), [`remote::RemoteOrigin`], a `hoardfs serve`
//! process reached over TCP, [`s3::S3Origin`], a bucket, and the cache tier's caching
//! origin (`hoardfs_server::tier`, an origin in front of another). All name objects by
//! [`Handle`] and report a change attribute (`Attr::version`) with every attribute set.
//!
//! Transport tricks are capabilities an origin may offer, not methods every one carries:
//! [`DirectReads`] (a remote origin writes a read's reply straight into its reader's
//! destination, a FUSE io_uring entry) through [`Origin::direct_reads`] and [`read_into`],
//! and [`FileRanges`] (a local directory offers ranges of open files for the server to
//! `sendfile`) through [`Origin::file_ranges`].

use std::fs::File;
use std::sync::Arc;
use std::time::Duration;

pub use hoardfs_proto::{
    Attr, Break, Caller, DirEntry, Entry, FALLOC_COLLAPSE_RANGE, FALLOC_INSERT_RANGE,
    FALLOC_KEEP_SIZE, FALLOC_MODES, FALLOC_PUNCH_HOLE, FALLOC_ZERO_RANGE, FileKind, Handle,
    Identities, LockHolder, LockKind, LockRange, LockType, Owner, RENAME_EXCHANGE,
    RENAME_NOREPLACE, ServerCounters, SetAttrs, StatFs, TimeSet, Timestamp, TreeDir, WireError,
};

pub mod caller;
pub mod handle_table;
pub mod held;
pub mod local;
pub mod remote;
pub mod s3;
pub mod tree;

/// Result of origin operations.
pub type Result<T> = std::result::Result<T, OriginError>;

/// Why an origin operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OriginError {
    /// The origin answered with a file-system error.
    #[error(transparent)]
    Fs(#[from] WireError),
    /// The origin could not be reached (connection refused, reset, not yet reconnected).
    #[error("origin unreachable: {0}")]
    Unreachable(String),
    /// The connection was lost after the request was sent, before its answer came: the
    /// origin may have carried it out.
    #[error("origin unreachable: {0} (the request may have been carried out)")]
    Lost(String),
    /// The origin did not answer in time (the request may have been carried out).
    #[error("origin did not answer within {0:?}")]
    Timeout(Duration),
    /// The origin sent something that violates the protocol.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server could not prove the expected identity (or refused to talk without TLS):
    /// nothing is sent to it and nothing it sends is believed.
    #[error("{0}")]
    Security(String),
}

impl OriginError {
    /// True when the failure means "cannot talk to the origin right now" (so cached state
    /// may be served instead), as opposed to a definite answer from it.
    pub fn is_offline(&self) -> bool {
        matches!(
            self,
            OriginError::Unreachable(_)
                | OriginError::Lost(_)
                | OriginError::Timeout(_)
                | OriginError::Security(_)
        )
    }

    /// True when the request was sent and no answer came (the connection was lost, or
    /// the answer was late): the origin may have carried it out.
    pub fn maybe_carried_out(&self) -> bool {
        matches!(self, OriginError::Lost(_) | OriginError::Timeout(_))
    }
}

/// What the origin says about itself at connection time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginInfo {
    /// Stable identity of the exported tree; caches are keyed by it.
    pub export_id: u128,
    /// Root directory.
    pub root: Entry,
    /// Whether the origin refuses modifications.
    pub read_only: bool,
    /// Write verifier of the server instance (0 for origins that write straight to a local
    /// file system): see `hoardfs_proto::Reply::Hello`.
    pub verifier: u64,
    /// Whose credentials the origin performs calls with ([`Identities::Server`]: its own,
    /// so only the client's kernel checks permissions).
    pub identities: Identities,
}

/// Bytes returned by [`Origin::read`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadReply {
    /// The bytes; shorter than requested only at end of file.
    pub data: Vec<u8>,
    /// The file's change attribute observed with the read.
    pub version: u64,
}

/// Where a read's bytes can go straight from the network, answering the reader: a FUSE
/// io_uring entry's payload buffer (the bridge's type), written by the connection's
/// receive thread instead of through a buffer that another copy then moves
/// ([`DirectReads`]). Dropped unanswered, a destination answers its reader `EIO`: a
/// reader is never left waiting.
pub trait ReadDst: Send {
    /// The most bytes it holds.
    fn capacity(&self) -> usize;
    /// Answers with `len` bytes written by `fill` (called at most once, and not at all
    /// if `len` exceeds [`ReadDst::capacity`] or the reader was answered already, which
    /// then fails). A failure answers the reader with an I/O error.
    fn fill(
        self: Box<Self>,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()>;
    /// Answers with error number `errno`.
    fn fail(self: Box<Self>, errno: i32);
}

/// A read's destination on its way down the layers: each borrows the slot, and whoever
/// answers the reader takes the destination out of it. Ownership never comes back up
/// through a result: a read that fails returns its error, and the slot's owner (the FUSE
/// bridge) answers what is still in it with that error's number ([`ReadSlot::fail`]).
pub struct ReadSlot(Option<Box<dyn ReadDst>>);

impl ReadSlot {
    /// A slot holding `dst`, unanswered.
    pub fn new(dst: Box<dyn ReadDst>) -> ReadSlot {
        ReadSlot(Some(dst))
    }

    /// Takes the destination to answer it (`None`: answered already).
    pub fn take(&mut self) -> Option<Box<dyn ReadDst>> {
        self.0.take()
    }

    /// Puts back a destination taken and not answered.
    pub fn put_back(&mut self, dst: Box<dyn ReadDst>) {
        self.0 = Some(dst);
    }

    /// Whether the reader was answered (the destination was taken).
    pub fn answered(&self) -> bool {
        self.0.is_none()
    }

    /// The most bytes the destination holds (0 once answered).
    pub fn capacity(&self) -> usize {
        self.0.as_ref().map_or(0, |d| d.capacity())
    }

    /// Answers the reader with a copy of `data` (bytes that came some other way). A
    /// failure means the reader was answered with an I/O error.
    pub fn answer_with(&mut self, data: &[u8]) -> Result<()> {
        let Some(dst) = self.take() else {
            return Err(OriginError::Protocol(
                "the reader was answered already".into(),
            ));
        };
        let copied = dst.fill(data.len(), &mut |buf| {
            buf.copy_from_slice(data);
            Ok(())
        });
        copied.map_err(|e| OriginError::Protocol(format!("answering the reader: {e}")))
    }

    /// Answers the reader with error number `errno`, unless it was answered already.
    pub fn fail(&mut self, errno: i32) {
        if let Some(dst) = self.take() {
            dst.fail(errno);
        }
    }
}

impl std::fmt::Debug for ReadSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadSlot")
            .field("answered", &self.answered())
            .finish()
    }
}

/// The capability of an origin whose replies can be written straight into their reader's
/// destination (a remote origin: its connection's receive thread does it), offered by
/// [`Origin::direct_reads`]. Reads of any origin go through [`read_into`].
pub trait DirectReads: Send + Sync {
    /// Like [`Origin::read`], the bytes written into the destination in `dst` (which is
    /// answered, and whose length is returned). On failure the destination is left in
    /// `dst` unless it was answered already (the connection failed while the bytes were
    /// being written into it: answered `EIO`).
    fn read_direct(&self, handle: Handle, offset: u64, len: u32, dst: &mut ReadSlot)
    -> Result<u32>;
}

/// Reads up to `len` bytes at `offset` of `handle` on `origin` into the destination in
/// `dst`, answering it: written straight in where the origin can ([`DirectReads`]),
/// otherwise read and copied in. Returns the bytes answered; see [`DirectReads`] for
/// what a failure leaves in `dst`.
pub fn read_into(
    origin: &dyn Origin,
    handle: Handle,
    offset: u64,
    len: u32,
    dst: &mut ReadSlot,
) -> Result<u32> {
    if let Some(direct) = origin.direct_reads() {
        return direct.read_direct(handle, offset, len, dst);
    }
    let r = origin.read(handle, offset, len)?;
    let n = r.data.len().min(len as usize);
    dst.answer_with(&r.data[..n]).map(|()| n as u32)
}

/// How a waiting lock request is answered: exactly once, `Ok` once the lock is held (with
/// the file's attributes as of the grant, if the origin gave them), or why the wait ended
/// (`Fs(Interrupted)` after a cancel, `Lost` with the connection).
pub type LockAnswer = Box<dyn FnOnce(Result<Option<Attr>>) + Send>;

/// Names a waiting lock request, to cancel it ([`Locks::cancel`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockTicket {
    /// Which connection it waits on (a new connection knows nothing of it).
    pub conn: u64,
    /// The request's id there.
    pub request: u64,
}

/// The capability of an origin that keeps file locks for all its clients (a hoardfs
/// server), offered by [`Origin::locks`]. An origin without it leaves locking to the
/// mount's kernel (local to the host).
pub trait Locks: Send + Sync {
    /// Takes, changes or releases `range` for `owner` now (with the file's attributes as
    /// of the grant, if the origin gives them), or fails with `Fs(WouldBlock)` if another
    /// owner's lock is in the way.
    fn lock(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
    ) -> Result<Option<Attr>>;
    /// Asks for `range` and waits without blocking the caller: `answer` is called when
    /// the lock is held or the wait ends. `None` if it was answered already.
    fn lock_waiting(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
        pid: u32,
        answer: LockAnswer,
    ) -> Option<LockTicket>;
    /// Ends a wait (its answer: `Fs(Interrupted)`, unless granted first).
    fn cancel(&self, ticket: LockTicket);
    /// The lock in the way of `owner` taking `range`, if any (`F_GETLK`).
    fn test(
        &self,
        handle: Handle,
        kind: LockKind,
        owner: u64,
        range: LockRange,
    ) -> Result<Option<LockHolder>>;
    /// Releases every lock of `kind` `owner` holds on the file (its waits go on).
    fn unlock_all(&self, handle: Handle, kind: LockKind, owner: u64) -> Result<()>;
}

/// The capability of an origin that can offer ranges of open files for the server to send
/// without copying (`sendfile`; a local directory), offered by [`Origin::file_ranges`].
pub trait FileRanges: Send + Sync {
    /// Offers up to `len` bytes at `offset` as a range of an open file for the caller to
    /// send without copying, if the file has not changed for at least `unchanged_for` and
    /// the range is in memory already (sending it must not wait for a disk); `None`
    /// means: call [`Origin::read`].
    fn read_range(
        &self,
        handle: Handle,
        offset: u64,
        len: u32,
        unchanged_for: Duration,
    ) -> Result<Option<FileRange>>;
}

/// Bytes of a file offered by [`FileRanges::read_range`] to be sent straight from the page
/// cache (`sendfile`), without passing through the caller's memory.
#[derive(Debug)]
pub struct FileRange {
    /// The open file (shared with the origin's open-file cache, which may close its own
    /// reference before this range is sent).
    pub file: Arc<File>,
    /// Where the bytes start.
    pub offset: u64,
    /// How many bytes the file held there when the range was taken (fewer than asked
    /// only at end of file).
    pub len: u32,
    /// The file's change attribute when the range was taken. Unlike [`ReadReply`]'s, it
    /// cannot be checked after the bytes are copied (that happens later, in the kernel):
    /// origins offer ranges only of files that had not changed for a while.
    pub version: u64,
    /// The range's share of the origin's bound on files held by ranges in flight
    /// ([`held::HeldFiles`]), given back when the range is dropped.
    pub held: Option<held::Held>,
}

/// A page of directory entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirPage {
    /// Entries (without `.` and `..`).
    pub entries: Vec<DirEntry>,
    /// Cookie to continue with, `None` at the end.
    pub next: Option<u64>,
}

/// Outcome of [`Origin::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteReply {
    /// Bytes written.
    pub written: u32,
    /// Where they went (the end of file for appends).
    pub offset: u64,
    /// Change attribute just before the write (taken under the origin's per-file write
    /// lock, so "cache at `pre_version` + this write" is exactly `attr.version`).
    pub pre_version: u64,
    /// Attributes just after the write.
    pub attr: Attr,
}

/// Receives callback breaks. Called on the origin's own thread, in order with replies:
/// it must be quick and must not call back into the origin.
pub type BreakSink = std::sync::Arc<dyn Fn(Vec<Break>) + Send + Sync>;

fn read_only<T>() -> Result<T> {
    Err(OriginError::Fs(WireError::ReadOnly))
}

/// The authoritative source of files. Implementations are shared by many threads.
///
/// Modifying operations default to `ReadOnly`, so read-only origins implement only the
/// read side.
pub trait Origin: Send + Sync + 'static {
    /// Identity and root of the export. May contact the origin.
    fn info(&self) -> Result<OriginInfo>;
    /// Resolves one name in a directory.
    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry>;
    /// Fresh attributes of an object.
    fn getattr(&self, handle: Handle) -> Result<Attr>;
    /// One page of a directory, with attributes, starting at `cookie` (0 = start).
    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage>;
    /// Complete listings of directory `dir` (file id `dir_id`) and of directories below
    /// it, `dir` first, then breadth first, at most `max_entries` entries in all; see
    /// [`tree::walk`], the default. Empty when `dir` alone exceeds the bound.
    fn read_tree(&self, dir: Handle, dir_id: u64, max_entries: u32) -> Result<Vec<TreeDir>> {
        tree::walk(self, dir, dir_id, max_entries)
    }
    /// Whether [`Origin::read_tree`] costs one request where listing the directories one
    /// by one would cost one each (a remote server that speaks protocol 5); callers walk
    /// trees with it only then.
    fn lists_trees(&self) -> bool {
        false
    }
    /// Reads up to `len` bytes at `offset`.
    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply>;
    /// Writes reads straight into their readers' destinations, if this origin can
    /// ([`read_into`] asks; the default: it cannot, and reads are copied in).
    fn direct_reads(&self) -> Option<&dyn DirectReads> {
        None
    }
    /// Offers ranges of open files to send without copying, if this origin can (the
    /// server asks, for plaintext replies; the default: it cannot).
    fn file_ranges(&self) -> Option<&dyn FileRanges> {
        None
    }
    /// Keeps file locks for every client, if this origin can (the default: it cannot).
    fn locks(&self) -> Option<&dyn Locks> {
        None
    }
    /// Target of a symlink.
    fn readlink(&self, handle: Handle) -> Result<Vec<u8>>;
    /// Whose credentials the origin performs calls with now (without contacting it):
    /// [`Identities::Server`], its own (the default), or the callers' as mapped.
    fn identities(&self) -> Arc<Identities> {
        static SERVER: std::sync::OnceLock<Arc<Identities>> = std::sync::OnceLock::new();
        Arc::clone(SERVER.get_or_init(|| Arc::new(Identities::Server)))
    }
    /// Whether the ambient caller ([`caller::current`]) may access the object for `mask`
    /// (`MAY_READ` | `MAY_WRITE` | `MAY_EXEC`): `Ok`, or the refusal. Origins that perform
    /// calls with their own credentials ([`Identities::Server`]) allow everything: the
    /// client's kernel checks the mode bits they report.
    fn access(&self, handle: Handle, mask: u32) -> Result<()> {
        let _ = (handle, mask);
        Ok(())
    }
    /// File-system statistics of the export.
    fn statfs(&self) -> Result<StatFs>;
    /// Whether the origin is currently believed reachable (no network traffic).
    fn is_connected(&self) -> bool {
        true
    }

    /// Reports now, through the subscription's sink, every change this origin has
    /// noticed but not reported yet (a local export: the inotify events queued). The
    /// server calls it after each request and before its reply. Does nothing by default.
    fn settle_changes(&self) {}

    /// How this origin revalidates directory listings in the background, if it does (an
    /// S3 origin: module `s3::refresher`), for `hoardfs stats`.
    fn listing_refresh(&self) -> Option<s3::refresher::RefreshStats> {
        None
    }

    /// Tries to reach the origin now if it is not connected (an origin with a
    /// connection; others have nothing to do). For commands a person waits on, which
    /// should not fail just because the background reconnect has not come round yet.
    fn reconnect_now(&self) {}

    /// Starts delivering callback breaks to `sink`: afterwards, every change to an object
    /// whose attributes or names this origin has returned is reported (a lost connection
    /// is reported as [`Break::All`]). Returns false if the origin cannot promise that, in
    /// which case callers must revalidate by time.
    fn subscribe(&self, sink: BreakSink) -> bool {
        let _ = sink;
        false
    }

    /// Creates a regular file; `exclusive` fails with `Exists` if the name is taken.
    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> Result<Entry> {
        let _ = (parent, name, mode, exclusive, owner);
        read_only()
    }
    /// Creates a special file; `mode` includes the file type bits.
    fn mknod(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<Entry> {
        let _ = (parent, name, mode, rdev, owner);
        read_only()
    }
    /// Creates a directory.
    fn mkdir(&self, parent: Handle, name: &[u8], mode: u32, owner: Owner) -> Result<Entry> {
        let _ = (parent, name, mode, owner);
        read_only()
    }
    /// Creates a symbolic link.
    fn symlink(&self, parent: Handle, name: &[u8], target: &[u8], owner: Owner) -> Result<Entry> {
        let _ = (parent, name, target, owner);
        read_only()
    }
    /// Creates a hard link to `handle` as `parent/name`.
    fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Entry> {
        let _ = (handle, parent, name);
        read_only()
    }
    /// Removes a non-directory.
    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let _ = (parent, name);
        read_only()
    }
    /// Removes an empty directory.
    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        let _ = (parent, name);
        read_only()
    }
    /// Renames with `renameat2` semantics (`flags`: [`RENAME_NOREPLACE`], [`RENAME_EXCHANGE`]).
    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        let _ = (parent, name, new_parent, new_name, flags);
        read_only()
    }
    /// Changes attributes and returns the new ones.
    fn setattr(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        let _ = (handle, set);
        read_only()
    }
    /// Writes `data` at `offset`, or at the end of file when `append`.
    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        let _ = (handle, offset, data, append);
        read_only()
    }
    /// Allocates or deallocates space of a file as `fallocate(2)` with `mode` (bits of
    /// [`hoardfs_proto::FALLOC_MODES`]); returns the attributes afterwards. `Unsupported`
    /// where the origin cannot (an object store).
    fn fallocate(&self, handle: Handle, offset: u64, length: u64, mode: u32) -> Result<Attr> {
        let _ = (handle, offset, length, mode);
        Err(OriginError::Fs(WireError::Unsupported))
    }
    /// A file descriptor of the object was closed: origins that publish writes only as
    /// a whole (S3) do it now. Returns the version the object had before and its
    /// attributes after, if publishing changed them.
    fn flush(&self, handle: Handle) -> Result<Option<(u64, Attr)>> {
        let _ = handle;
        Ok(None)
    }
    /// Whether [`Origin::flush`] publishes writes (which are invisible to others until
    /// then): callers must then call it at every close of a file they wrote.
    fn publishes_on_close(&self) -> bool {
        false
    }
    /// Makes the object's written data (and with `!datasync` its metadata) durable.
    fn fsync(&self, handle: Handle, datasync: bool) -> Result<()> {
        let _ = (handle, datasync);
        Ok(())
    }
    /// Value of an extended attribute.
    fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        let _ = (handle, name);
        Err(OriginError::Fs(WireError::NoData))
    }
    /// Names of the extended attributes, each followed by a NUL.
    fn listxattr(&self, handle: Handle) -> Result<Vec<u8>> {
        let _ = handle;
        Ok(Vec::new())
    }
    /// Sets an extended attribute (`flags`: 1 = create only, 2 = replace only).
    fn setxattr(&self, handle: Handle, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        let _ = (handle, name, value, flags);
        read_only()
    }
    /// Removes an extended attribute.
    fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        let _ = (handle, name);
        read_only()
    }
}
