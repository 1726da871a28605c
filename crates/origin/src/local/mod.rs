//! [`LocalOrigin`]: a directory on this machine exported as an [`Origin`].
//!
//! Used directly by `hoardfs mount /abs/path` (caching an NFS/SMB/sshfs mount or any local
//! tree) and, behind the network front in `hoardfs-server`, by `hoardfs serve`.
//!
//! Confinement is enforced by the kernel, not by string checks: every name is resolved with
//! `openat2(RESOLVE_BENEATH)` relative to its parent's descriptor and never follows symlinks
//! (symlinks are returned as objects; their targets are only read, never resolved here).
//! Modifications use the `*at` system calls relative to the parent's descriptor
//! (`namespace`), attribute and data changes go through the object's own descriptor
//! (`write`, `xattr`), and callbacks come from inotify (`watch`).
//!
//! This module owns the [`LocalOrigin`] value, the read side and the [`Origin`] impl, which
//! delegates modifications to those modules.

pub mod creds;
mod files;
mod handles;
mod namespace;
mod outside;
pub mod sys;
mod sys_write;
mod watch;
mod write;
mod xattr;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hoardfs_proto::{
    Attr, DirEntry, Entry, FileKind, Handle, Owner, ServerCounters, SetAttrs, StatFs, WireError,
};

use crate::held::HeldFiles;
use crate::{BreakSink, DirPage, FileRange, Origin, OriginInfo, ReadReply, Result, WriteReply};
use files::OpenFiles;
use handles::{HandleTable, Node};

/// Tunables of a local export.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Refuse modifications.
    pub read_only: bool,
    /// Most handles remembered at once.
    pub max_handles: usize,
    /// Most directories watched for callbacks at once (each watch keeps its directory
    /// open); beyond, clients are told to revalidate everything (`Break::All`).
    pub max_watches: usize,
    /// Most files kept open for reading (and, separately, as many for writing, and as
    /// many again by zero-copy ranges not yet sent: see [`crate::held`]).
    pub max_open_files: usize,
    /// Close a cached open file after this long without reads or writes.
    pub open_file_idle: Duration,
    /// Perform every call as the ambient caller ([`crate::caller`]) with that identity's
    /// credentials (module [`creds`]; needs `CAP_SETUID` and `CAP_SETGID`), so that the
    /// kernel checks each one as it would a local process of that user's; and report
    /// which objects have an access ACL (`Attr::acl`). Off: every call runs with the
    /// process's credentials (an in-process mount, or a server that cannot switch).
    pub act_as_callers: bool,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            read_only: true,
            max_handles: 500_000,
            max_watches: 100_000,
            max_open_files: 4096,
            open_file_idle: Duration::from_secs(60),
            act_as_callers: false,
        }
    }
}

/// A local directory exported as an origin.
#[derive(Debug)]
pub struct LocalOrigin {
    root_path: PathBuf,
    root_dev: u64,
    export_id: u128,
    opts: LocalOptions,
    handles: Arc<HandleTable>,
    files: OpenFiles,
    /// Serialise the misses of `files` per stripe of file ids, so that the concurrent
    /// first reads of one file (a client's read and its readahead) open it once.
    open_misses: [parking_lot::Mutex<()>; 16],
    wfiles: OpenFiles,
    /// Files held open by the ranges of [`crate::FileRanges::read_range`] not yet sent.
    held: HeldFiles,
    /// Files (device, inode) whose writable descriptor failed its fsync when it left
    /// `wfiles`: the next fsync of the file, through any handle, reports the failure.
    write_errors: parking_lot::Mutex<std::collections::HashSet<(u64, u64)>>,
    locks: Arc<write::WriteLocks>,
    proc_fd: OwnedFd,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    opens: AtomicU64,
    writes: AtomicU64,
    bytes_written: AtomicU64,
    watch: OnceLock<watch::Subscription>,
    /// Started with `watch` when it has the privilege (see `outside`).
    outside: OnceLock<Option<outside::OutsideWrites>>,
    /// Whose credentials calls are performed with (`LocalOptions::act_as_callers`).
    identities: Arc<hoardfs_proto::Identities>,
}

/// Maps an OS error to the wire's typed error set. `EXDEV` becomes `Access` (what `openat2`
/// answers when a resolution would escape the export); rename and link map it to
/// `CrossDevice` themselves.
pub fn wire_error(e: &io::Error) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => WireError::NotFound,
        Some(libc::EACCES) => WireError::Access,
        Some(libc::EPERM) => WireError::NotPermitted,
        Some(libc::ENOTDIR) => WireError::NotDir,
        Some(libc::EISDIR) => WireError::IsDir,
        Some(libc::ENAMETOOLONG) => WireError::NameTooLong,
        Some(libc::ELOOP) => WireError::Loop,
        Some(libc::EXDEV) => WireError::Access,
        Some(libc::EROFS) => WireError::ReadOnly,
        Some(libc::ENOSPC) => WireError::NoSpace,
        Some(libc::EDQUOT) => WireError::QuotaExceeded,
        Some(libc::ESTALE) => WireError::Stale,
        Some(libc::EINVAL) => WireError::Invalid,
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => WireError::Unsupported,
        Some(libc::EEXIST) => WireError::Exists,
        Some(libc::ENOTEMPTY) => WireError::NotEmpty,
        Some(libc::ENODATA) => WireError::NoData,
        // E2BIG: an extended attribute value or name list larger than the kernel allows.
        Some(libc::ERANGE | libc::E2BIG) => WireError::Range,
        Some(libc::EFBIG) => WireError::TooBig,
        Some(libc::EBUSY | libc::ETXTBSY) => WireError::InUse,
        Some(libc::EMLINK) => WireError::TooManyLinks,
        _ => WireError::Io,
    }
}

fn werr(e: io::Error) -> crate::OriginError {
    crate::OriginError::Fs(wire_error(&e))
}

/// A stable file id: the inode number, mixed with the device for objects on other file
/// systems mounted inside the export (`root_dev` is the export root's device).
fn file_id_of(root_dev: u64, dev: u64, ino: u64) -> u64 {
    if dev == root_dev {
        ino
    } else {
        ino ^ dev.rotate_left(40)
    }
}

/// Checks that `name` is one plain path component and returns it as a C string.
pub fn check_name(name: &[u8]) -> std::result::Result<CString, WireError> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(WireError::Invalid);
    }
    if name.len() > 255 {
        return Err(WireError::NameTooLong);
    }
    CString::new(name).map_err(|_| WireError::Invalid)
}

impl LocalOrigin {
    /// Exports the directory at `root`.
    pub fn new(root: &Path, opts: LocalOptions) -> io::Result<LocalOrigin> {
        let root_path = root.canonicalize()?;
        let fd = sys::open_root(&root_path)?;
        let st = sys::fstat(fd.as_raw_fd())?;
        let mut id_bytes = root_path.as_os_str().as_encoded_bytes().to_vec();
        id_bytes.extend_from_slice(&st.st_ino.to_le_bytes());
        let export_id = xxhash_rust::xxh3::xxh3_128(&id_bytes);
        let node = Node::new(fd, FileKind::Dir, st.st_dev, st.st_ino);
        let epoch = rand::random::<u64>() | 1;
        let opts_act_as_callers = opts.act_as_callers;
        Ok(LocalOrigin {
            root_path,
            root_dev: st.st_dev,
            export_id,
            handles: Arc::new(HandleTable::new(epoch, opts.max_handles, node)),
            files: OpenFiles::new(opts.max_open_files, opts.open_file_idle),
            open_misses: Default::default(),
            wfiles: OpenFiles::new(opts.max_open_files, opts.open_file_idle),
            held: HeldFiles::new(opts.max_open_files),
            write_errors: Default::default(),
            locks: Arc::new(write::WriteLocks::new()),
            proc_fd: sys::open_proc_self_fd()?,
            opts,
            reads: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            opens: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            watch: OnceLock::new(),
            outside: OnceLock::new(),
            identities: Arc::new(if opts_act_as_callers {
                hoardfs_proto::Identities::Callers(hoardfs_proto::IdMap::default())
            } else {
                hoardfs_proto::Identities::Server
            }),
        })
    }

    /// The exported directory.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Data counters (reads, bytes_read, opens, writes, bytes_written); connection and
    /// break counters stay zero.
    pub fn counters(&self) -> ServerCounters {
        ServerCounters {
            reads: self.reads.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            opens: self.opens.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            bytes_written: self.bytes_written.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// How many files had their mtime moved because another process on this machine wrote
    /// them while clients used them (see `outside`); `None` before [`Origin::subscribe`]
    /// or without the privilege to watch.
    pub fn outside_write_bumps(&self) -> Option<u64> {
        self.outside.get()?.as_ref().map(|o| o.bumps())
    }

    /// A stable file id: the inode number, mixed with the device for objects on other file
    /// systems mounted inside the export.
    fn file_id(&self, st: &libc::stat) -> u64 {
        file_id_of(self.root_dev, st.st_dev, st.st_ino)
    }

    /// `ReadOnly` when the export refuses modifications.
    fn check_writable(&self) -> Result<()> {
        if self.opts.read_only {
            return Err(WireError::ReadOnly.into());
        }
        Ok(())
    }

    /// The directory node `h` names (`NotDir` for anything else).
    fn dir_node(&self, h: Handle) -> Result<Arc<Node>> {
        let dir = self.handles.get(h)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        Ok(dir)
    }

    /// A directory with no links left (removed) lists as `Stale`.
    fn live_stat(&self, node: &Node) -> Result<libc::stat> {
        let st = sys::fstat(node.fd.as_raw_fd()).map_err(werr)?;
        if st.st_nlink == 0 {
            return Err(WireError::Stale.into());
        }
        Ok(st)
    }

    fn root_handle(&self) -> Handle {
        self.handles.root()
    }

    /// Sets this thread's credentials to the ambient caller's (or the process's own, where
    /// none was entered) when the export acts as its callers: the first step of every
    /// call. A failed switch fails the call (nothing runs with credentials it should not).
    fn act(&self) -> Result<()> {
        if !self.opts.act_as_callers {
            return Ok(());
        }
        creds::act_as(crate::caller::entered().as_ref()).map_err(|e| {
            tracing::error!("cannot act as the caller: {e}");
            crate::OriginError::Fs(WireError::Io)
        })
    }

    /// Runs `f`, work for the export rather than for the caller (a watch, a repair), with
    /// the process's credentials. A failed switch (either way) fails the call: the thread's
    /// credentials are then unknown, and nothing more runs with them.
    fn for_export<T>(&self, f: impl FnOnce() -> T) -> Result<T> {
        creds::as_process(f).map_err(|e| {
            tracing::error!("cannot switch between the caller's and the server's credentials: {e}");
            crate::OriginError::Fs(WireError::Io)
        })
    }

    /// The attributes of the object open at `fd` whose `stat` is `st`: with whether it
    /// has an access ACL, when the export acts as its callers (clients then ask before
    /// they open it).
    fn attr(&self, st: &libc::stat, fd: i32) -> Attr {
        let mut attr = sys::attr_of(st, self.file_id(st));
        if self.opts.act_as_callers && matches!(attr.kind, FileKind::File | FileKind::Dir) {
            attr.acl = sys::has_acl(fd);
        }
        attr
    }

    /// A descriptor cached for `id` (opened by identity `by`) used by the acting
    /// identity: allowed if that identity opened it, or if the kernel says it may access
    /// the file for `mask` too.
    fn may_use(&self, node: &Node, by: &creds::Acting, mask: u32) -> Result<()> {
        if !self.opts.act_as_callers {
            return Ok(());
        }
        match (creds::acting(), by) {
            (creds::Acting::Process, _) => Ok(()),
            (me @ creds::Acting::Caller(_), by) if me == *by => Ok(()),
            _ => sys::access(node.fd.as_raw_fd(), mask).map_err(werr),
        }
    }

    /// Opens `name` under directory descriptor `dir` and registers it.
    fn open_child(&self, dir: i32, name: &CString) -> Result<Entry> {
        let fd = sys::openat_beneath(dir, name, libc::O_PATH | libc::O_NOFOLLOW).map_err(werr)?;
        let st = sys::fstat(fd.as_raw_fd()).map_err(werr)?;
        self.register(fd, &st)
    }

    /// A directory used again: watched if it is not (a directory refused a watch, over
    /// the bound, is refused again at each use, so that clients keep being told to
    /// revalidate while they use it, rather than trust a callback nobody keeps).
    fn keep_watching(&self, node: &Arc<Node>) -> Result<()> {
        if node.kind == FileKind::Dir
            && !node.is_watched()
            && let Some(sub) = self.watch.get()
        {
            self.for_export(|| sub.watch_dir(node))?;
        }
        Ok(())
    }

    /// Registers the object open (`O_PATH`) at `fd`, whose `stat` is `st`, in the handle
    /// table; a directory also gets an inotify watch once [`Origin::subscribe`] was called.
    fn register(&self, fd: OwnedFd, st: &libc::stat) -> Result<Entry> {
        let attr = self.attr(st, fd.as_raw_fd());
        let (handle, node) = self
            .handles
            .insert(Node::new(fd, attr.kind, st.st_dev, st.st_ino));
        if attr.kind == FileKind::Dir
            && let Some(sub) = self.watch.get()
        {
            // The server watches for everyone: with its own credentials (a caller may
            // search a directory it may not read, which a watch needs).
            self.for_export(|| {
                sub.watch_dir(&node);
                if let Some(Some(o)) = self.outside.get() {
                    o.watch_dir(&node);
                }
            })?;
        }
        Ok(Entry { handle, attr })
    }

    /// The cached read-only descriptor of regular file `node` (handle `id`), opening one
    /// (as the acting identity) if needed.
    fn open_file(&self, id: u64, node: &Node) -> Result<Arc<File>> {
        if let Some((f, by)) = self.files.get(id) {
            self.may_use(node, &by, libc::R_OK as u32)?;
            return Ok(f);
        }
        let _miss = self.open_misses[id as usize % 16].lock();
        if let Some((f, by)) = self.files.get(id) {
            self.may_use(node, &by, libc::R_OK as u32)?;
            return Ok(f);
        }
        let f = sys::reopen_read(self.proc_fd.as_raw_fd(), node.fd.as_raw_fd()).map_err(werr)?;
        self.opens.fetch_add(1, Ordering::Relaxed);
        Ok(self.files.insert(id, f, creds::acting()))
    }
}

impl Origin for LocalOrigin {
    fn info(&self) -> Result<OriginInfo> {
        self.act()?;
        Ok(OriginInfo {
            verifier: 0,
            export_id: self.export_id,
            root: Entry {
                handle: self.root_handle(),
                attr: self.getattr(self.root_handle())?,
            },
            read_only: self.opts.read_only,
            identities: (*self.identities).clone(),
        })
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.act()?;
        let name = check_name(name)?;
        let dir = self.handles.get(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        self.open_child(dir.fd.as_raw_fd(), &name)
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.act()?;
        let node = self.handles.get(handle)?;
        self.keep_watching(&node)?;
        let st = sys::fstat(node.fd.as_raw_fd()).map_err(werr)?;
        Ok(self.attr(&st, node.fd.as_raw_fd()))
    }

    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        self.act()?;
        let node = self.handles.get(dir)?;
        if node.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        self.keep_watching(&node)?;
        self.live_stat(&node)?;
        let mut stream = sys::DirStream::open(node.fd.as_raw_fd()).map_err(werr)?;
        if cookie != 0 {
            stream.seek(cookie);
        }
        // Each entry takes a handle: a page is kept to a quarter of the table, so that
        // the directory, used as the page began, is still known for the next page and
        // the page's own handles outlive their reply.
        let max = (max_entries.clamp(1, 4096) as usize).min(self.handles.cap() / 4);
        let mut entries = Vec::new();
        // `resume` is the position after the last entry consumed (returned or skipped).
        let mut resume = cookie;
        while let Some((name, off)) = stream.next_entry().map_err(werr)? {
            if entries.len() >= max {
                return Ok(DirPage {
                    entries,
                    next: Some(resume),
                });
            }
            let bytes = name.as_bytes();
            if bytes != b"." && bytes != b".." {
                match self.open_child(stream.fd(), &name) {
                    Ok(entry) => entries.push(DirEntry {
                        name: bytes.to_vec(),
                        entry,
                    }),
                    // Removed between listing and opening: skip it, as a local `ls` would.
                    Err(crate::OriginError::Fs(WireError::NotFound)) => {}
                    Err(e) => return Err(e),
                }
            }
            resume = off;
        }
        Ok(DirPage {
            entries,
            next: None,
        })
    }

    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        self.act()?;
        let node = self.handles.get(handle)?;
        match node.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(WireError::IsDir.into()),
            _ => return Err(WireError::Invalid.into()),
        }
        let file = self.open_file(handle.id, &node)?;
        node.note_io();
        self.reads.fetch_add(1, Ordering::Relaxed);
        let mut data = hoardfs_proto::buffers::take(len as usize);
        // A read is labelled with the version seen before and after it; if the file changed
        // meanwhile, try again, and after three tries label it 0 ("unstable, do not cache").
        for attempt in 0..3 {
            let before = sys::fstat(file.as_raw_fd()).map_err(werr)?;
            let n =
                sys::pread_full(file.as_raw_fd(), &mut data, len as usize, offset).map_err(werr)?;
            let after = sys::fstat(file.as_raw_fd()).map_err(werr)?;
            let (v0, v1) = (sys::version_of(&before), sys::version_of(&after));
            if v0 == v1 || attempt == 2 {
                self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                return Ok(ReadReply {
                    data,
                    version: if v0 == v1 { v0 } else { 0 },
                });
            }
        }
        unreachable!("loop returns on its last attempt")
    }

    fn file_ranges(&self) -> Option<&dyn crate::FileRanges> {
        Some(self)
    }

    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        self.act()?;
        let node = self.handles.get(handle)?;
        if node.kind != FileKind::Symlink {
            return Err(WireError::Invalid.into());
        }
        sys::readlink(node.fd.as_raw_fd()).map_err(werr)
    }

    fn identities(&self) -> Arc<hoardfs_proto::Identities> {
        // The mapping is the server's to announce; an export acting as its callers says
        // only that it does.
        Arc::clone(&self.identities)
    }

    fn access(&self, handle: Handle, mask: u32) -> Result<()> {
        self.act()?;
        let node = self.handles.get(handle)?;
        if mask & libc::W_OK as u32 != 0 {
            self.check_writable()?;
        }
        sys::access(node.fd.as_raw_fd(), mask & 7).map_err(werr)
    }

    fn statfs(&self) -> Result<StatFs> {
        self.act()?;
        let root = self.handles.get(self.root_handle())?;
        sys::statvfs(root.fd.as_raw_fd()).map_err(werr)
    }

    fn subscribe(&self, sink: BreakSink) -> bool {
        self.subscribe_inotify(sink)
    }

    fn settle_changes(&self) {
        if let Some(sub) = self.watch.get() {
            sub.settle();
        }
    }

    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> Result<Entry> {
        self.act()?;
        self.create_file(parent, name, mode, exclusive, owner)
    }

    fn mknod(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<Entry> {
        self.act()?;
        self.make_node(parent, name, mode, rdev, owner)
    }

    fn mkdir(&self, parent: Handle, name: &[u8], mode: u32, owner: Owner) -> Result<Entry> {
        self.act()?;
        self.make_dir(parent, name, mode, owner)
    }

    fn symlink(&self, parent: Handle, name: &[u8], target: &[u8], owner: Owner) -> Result<Entry> {
        self.act()?;
        self.make_symlink(parent, name, target, owner)
    }

    fn link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.act()?;
        self.make_link(handle, parent, name)
    }

    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.act()?;
        self.remove(parent, name, false)
    }

    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.act()?;
        self.remove(parent, name, true)
    }

    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.act()?;
        self.rename_entry(parent, name, new_parent, new_name, flags)
    }

    fn setattr(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        self.act()?;
        self.set_attrs(handle, set)
    }

    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        self.act()?;
        self.write_data(handle, offset, data, append)
    }

    fn fallocate(&self, handle: Handle, offset: u64, length: u64, mode: u32) -> Result<Attr> {
        self.act()?;
        self.allocate(handle, offset, length, mode)
    }

    fn fsync(&self, handle: Handle, datasync: bool) -> Result<()> {
        self.act()?;
        self.sync(handle, datasync)
    }

    fn getxattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        self.act()?;
        self.get_xattr(handle, name)
    }

    fn listxattr(&self, handle: Handle) -> Result<Vec<u8>> {
        self.act()?;
        self.list_xattr(handle)
    }

    fn setxattr(&self, handle: Handle, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.act()?;
        self.set_xattr(handle, name, value, flags)
    }

    fn removexattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        self.act()?;
        self.remove_xattr(handle, name)
    }
}

impl crate::FileRanges for LocalOrigin {
    fn read_range(
        &self,
        handle: Handle,
        offset: u64,
        len: u32,
        unchanged_for: Duration,
    ) -> Result<Option<FileRange>> {
        self.act()?;
        let node = self.handles.get(handle)?;
        if node.kind != FileKind::File {
            return Ok(None);
        }
        let file = self.open_file(handle.id, &node)?;
        node.note_io();
        let st = sys::fstat(file.as_raw_fd()).map_err(werr)?;
        // A file written recently may be written again while the kernel copies the range
        // (after its version was taken): those get `read`, which checks the version after.
        let changed = std::time::UNIX_EPOCH
            + Duration::new(st.st_ctime.max(0) as u64, st.st_ctime_nsec as u32);
        let quiet = std::time::SystemTime::now()
            .duration_since(changed)
            .is_ok_and(|d| d >= unchanged_for);
        if !quiet {
            return Ok(None);
        }
        let size = st.st_size.max(0) as u64;
        let len = size.saturating_sub(offset).min(len as u64) as u32;
        // The caller sends the range from its async writer, where `sendfile` must not wait
        // for the disk: a range not wholly in the page cache gets `read` (on a blocking
        // thread, which also brings it into the cache), as does every range on a kernel
        // without `cachestat(2)`.
        // (Asked as the server, not the caller: the kernel tells only a file's owner what
        // of it is cached, and the caller may read the file but not own it.)
        let fd = file.as_raw_fd();
        let cached = match creds::with_fowner(|| sys::all_cached(fd, offset, len as u64)) {
            Some(c) => c.unwrap_or(false),
            None => return Err(WireError::Io.into()),
        };
        if !cached {
            return Ok(None);
        }
        // A range keeps its file open until it is sent (for a client that does not read,
        // until its connection ends): beyond the bound, `read` copies instead.
        let Some(held) = self.held.take() else {
            return Ok(None);
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes_read.fetch_add(len as u64, Ordering::Relaxed);
        Ok(Some(FileRange {
            file,
            offset,
            len,
            version: sys::version_of(&st),
            held: Some(held),
        }))
    }
}

#[cfg(test)]
mod tests;
