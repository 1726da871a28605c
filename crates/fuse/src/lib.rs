//! The FUSE bridge: translates kernel requests (via upstream `fuser`) into calls on
//! [`HoardFs`] and its typed results into replies and errno values. No file-system logic
//! lives here; this is the only place errno numbers appear.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    InitFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, Request,
};
use hoardfs_fs::{Backing, FsError, HoardFs, Ino, Listing, OpenMode};
use hoardfs_origin::{Attr, FileKind, Timestamp, WireError};
use parking_lot::Mutex;

/// The `fuser::Filesystem` implementation.
pub struct FuseBridge {
    fs: Arc<HoardFs>,
    ttl: Duration,
    dirs: Mutex<HashMap<u64, Arc<Listing>>>,
    next_dir: AtomicU64,
    notifier: Arc<OnceLock<Notifier>>,
}

impl FuseBridge {
    /// A bridge over `fs`; kernel entry/attribute timeouts are the fs attribute TTL.
    /// `notifier` is filled in once the session exists; until then no invalidations are sent.
    pub fn new(fs: Arc<HoardFs>, notifier: Arc<OnceLock<Notifier>>) -> Self {
        let ttl = fs.config().attr_ttl;
        FuseBridge {
            fs,
            ttl,
            dirs: Mutex::new(HashMap::new()),
            next_dir: AtomicU64::new(1),
            notifier,
        }
    }

    /// Tells the kernel its cached attributes of `ino` are out of date (close-to-open: a
    /// file that changed must show its new size to the reader that just opened it).
    fn invalidate_attrs(&self, ino: INodeNo) {
        if let Some(n) = self.notifier.get() {
            // Negative offset: attributes only; page-cache handling is decided by the open.
            if let Err(e) = n.inval_inode(ino, -1, 0) {
                tracing::debug!("inval_inode({}) failed: {e}", ino.0);
            }
        }
    }
}

/// Maps a typed error to the errno the kernel reports.
pub fn errno(e: &FsError) -> Errno {
    match e {
        FsError::Origin(w) => match w {
            WireError::NotFound => Errno::ENOENT,
            WireError::Stale => Errno::ESTALE,
            WireError::Access | WireError::AuthFailed => Errno::EACCES,
            WireError::NotDir => Errno::ENOTDIR,
            WireError::IsDir => Errno::EISDIR,
            WireError::Invalid => Errno::EINVAL,
            WireError::NameTooLong => Errno::ENAMETOOLONG,
            WireError::Loop => Errno::ELOOP,
            WireError::ReadOnly => Errno::EROFS,
            WireError::NoSpace => Errno::ENOSPC,
            WireError::Unsupported => Errno::EOPNOTSUPP,
            WireError::Busy => Errno::EAGAIN,
            WireError::Protocol | WireError::Io => Errno::EIO,
        },
        FsError::Offline(_) => Errno::EIO,
        FsError::Protocol(_) | FsError::Cache(_) => Errno::EIO,
        FsError::ReadOnly => Errno::EROFS,
        FsError::BadHandle => Errno::EBADF,
    }
}

fn time(t: Timestamp) -> std::time::SystemTime {
    if t.secs >= 0 {
        UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
    } else {
        UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
            + Duration::from_nanos(t.nanos as u64)
    }
}

fn file_type(k: FileKind) -> FileType {
    match k {
        FileKind::File => FileType::RegularFile,
        FileKind::Dir => FileType::Directory,
        FileKind::Symlink => FileType::Symlink,
        FileKind::Fifo => FileType::NamedPipe,
        FileKind::Socket => FileType::Socket,
        FileKind::CharDev => FileType::CharDevice,
        FileKind::BlockDev => FileType::BlockDevice,
    }
}

/// Converts origin attributes to the kernel's, under inode number `ino`.
pub fn fuse_attr(ino: Ino, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize.max(4096),
        flags: 0,
    }
}

impl Filesystem for FuseBridge {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS;
        let _ = config.add_capabilities(want & config.capabilities());
        // Passthrough needs a stacking depth of at least 1 (FUSE-FACTS.md); 2 lets the
        // cache directory itself live on a stacked file system such as overlayfs.
        if self.fs.config().passthrough
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            let _ = config.set_max_stack_depth(2);
        }
        let _ = config.set_max_readahead(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Ok((ino, a)) => reply.entry(&self.ttl, &fuse_attr(ino, &a), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.getattr(ino.0) {
            Ok(a) => reply.attr(&self.ttl, &fuse_attr(ino.0, &a)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let write = flags.acc_mode() != OpenAccMode::O_RDONLY || flags.0 & libc::O_TRUNC != 0;
        let make_backing = |f: &std::fs::File| -> std::io::Result<Backing> {
            Ok(Arc::new(reply.open_backing(f)?) as Backing)
        };
        let (fh, mode, changed) = match self.fs.open(ino.0, write, &make_backing) {
            Ok(r) => r,
            Err(e) => return reply.error(errno(&e)),
        };
        if changed {
            self.invalidate_attrs(ino);
        }
        let fh = FileHandle(fh);
        match mode {
            OpenMode::Passthrough(b) => {
                let id = b
                    .downcast_ref::<BackingId>()
                    .expect("backings are fuser BackingIds");
                reply.opened_passthrough(fh, FopenFlags::FOPEN_NOFLUSH, id);
            }
            OpenMode::Cached { keep_cache } => {
                let mut f = FopenFlags::FOPEN_NOFLUSH;
                if keep_cache {
                    f |= FopenFlags::FOPEN_KEEP_CACHE;
                }
                reply.opened(fh, f);
            }
            OpenMode::Direct => {
                reply.opened(fh, FopenFlags::FOPEN_NOFLUSH | FopenFlags::FOPEN_DIRECT_IO)
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match self.fs.read(fh.0, offset, size) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(fh.0);
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.listing(ino.0) {
            Ok(l) => {
                let fh = self.next_dir.fetch_add(1, Ordering::Relaxed);
                self.dirs.lock().insert(fh, l);
                reply.opened(FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let Some(listing) = self.dirs.lock().get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let parent = self.fs.parent_of(ino.0).unwrap_or(ino.0);
        let dots = [(ino.0, "."), (parent, "..")];
        let mut i = offset as usize;
        while i < 2 + listing.entries.len() {
            let full = if i < 2 {
                reply.add(
                    INodeNo(dots[i].0),
                    i as u64 + 1,
                    FileType::Directory,
                    dots[i].1,
                )
            } else {
                let e = &listing.entries[i - 2];
                // Plain readdir needs an inode number only; the kernel looks names up later.
                let ino = e.entry.attr.file_id | (1 << 63);
                reply.add(
                    INodeNo(ino),
                    i as u64 + 1,
                    file_type(e.entry.attr.kind),
                    OsStr::from_bytes(&e.name),
                )
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let Some(listing) = self.dirs.lock().get(&fh.0).cloned() else {
            return reply.error(Errno::EBADF);
        };
        let mut i = offset as usize;
        while i < 2 + listing.entries.len() {
            let full = if i < 2 {
                // The kernel takes no lookup reference for "." and "..".
                let dino = if i == 0 {
                    ino.0
                } else {
                    self.fs.parent_of(ino.0).unwrap_or(ino.0)
                };
                match self.fs.cached_attr(dino) {
                    Ok(a) => reply.add(
                        INodeNo(dino),
                        i as u64 + 1,
                        if i == 0 { "." } else { ".." },
                        &self.ttl,
                        &fuse_attr(dino, &a),
                        Generation(0),
                    ),
                    Err(_) => false,
                }
            } else {
                let e = &listing.entries[i - 2];
                let child = self.fs.remember_entry(ino.0, e);
                let full = reply.add(
                    INodeNo(child),
                    i as u64 + 1,
                    OsStr::from_bytes(&e.name),
                    &self.ttl,
                    &fuse_attr(child, &e.entry.attr),
                    Generation(0),
                );
                if full {
                    self.fs.forget(child, 1);
                }
                full
            };
            if full {
                break;
            }
            i += 1;
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        // Extended attributes are not exported yet: "no such attribute" for every name.
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0)
        } else {
            reply.data(&[])
        }
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permissions are enforced by the kernel (default_permissions) from origin attributes.
        reply.ok();
    }
}
