//! The FUSE bridge: translates kernel requests (via upstream `fuser`) into calls on
//! [`HoardFs`] and its typed results into replies and errno values. No file-system logic
//! lives here; this is the only place errno numbers appear. Modifying operations are
//! translated in module `modify`.

mod callers;
mod convert;
mod locks;
mod modify;
mod ring_dst;

use convert::file_type;
pub use convert::{errno, fuse_attr};

use modify::{access, open_flags};
use ring_dst::RingDst;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, Notifier, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLock, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use hoardfs_fs::{
    Backing, BackingError, HoardFs, Ino, KernelNotifier, ListedNode, Listing, NodeAttr,
};
use parking_lot::Mutex;

/// Kernel invalidations through a fuser [`Notifier`] (for [`HoardFs::set_notifier`]).
pub struct FuseNotifier(pub Notifier);

impl KernelNotifier for FuseNotifier {
    fn inval_inode(&self, ino: Ino) {
        // Offset 0, length 0: attributes and every cached page.
        if let Err(e) = self.0.inval_inode(INodeNo(ino), 0, 0) {
            tracing::debug!("inval_inode({ino}) failed: {e}");
        }
    }
    fn inval_attr(&self, ino: Ino) {
        // Negative offset: attributes only.
        if let Err(e) = self.0.inval_inode(INodeNo(ino), -1, 0) {
            tracing::debug!("inval_inode({ino}, attrs) failed: {e}");
        }
    }
    fn inval_entry(&self, parent: Ino, name: &[u8]) {
        if let Err(e) = self.0.inval_entry(INodeNo(parent), OsStr::from_bytes(name)) {
            tracing::debug!(
                "inval_entry({parent}, {:?}) failed: {e}",
                OsStr::from_bytes(name)
            );
        }
    }
}

/// How long a directory pass's snapshot is kept for the pass's next READDIR requests.
const SNAPSHOT_LIFETIME: Duration = Duration::from_secs(60);

/// The `fuser::Filesystem` implementation.
pub struct FuseBridge {
    fs: Arc<HoardFs>,
    /// The identity behind each request (entered as the ambient caller for its duration).
    callers: callers::Callers,
    /// Listings being read, by directory inode: a pass that needs several READDIR
    /// requests continues in the snapshot it started with (and when), so offsets stay
    /// meaningful.
    dirs: Mutex<HashMap<u64, DirPass>>,
    /// Lock requests waiting on the server.
    lock_waits: locks::LockWaits,
}

/// The snapshot a directory pass reads, and when the pass started.
struct DirPass {
    started: Instant,
    listing: Arc<Listing>,
}

impl FuseBridge {
    /// A bridge over `fs`. Kernel invalidations go through `fs`'s notifier
    /// ([`HoardFs::set_notifier`], a [`FuseNotifier`] once the session exists).
    pub fn new(fs: Arc<HoardFs>) -> Self {
        FuseBridge {
            fs,
            callers: callers::Callers::default(),
            dirs: Mutex::new(HashMap::new()),
            lock_waits: locks::LockWaits::default(),
        }
    }

    /// Enters the identity of the process behind `req` as the ambient caller until the
    /// returned scope ends: whatever the request makes the file system ask the origin is
    /// asked for that process (and judged by the server as that process's mapped user).
    fn enter(&self, req: &Request) -> hoardfs_origin::caller::Scope {
        let with_groups = self.fs.acts_as_callers();
        let caller = self
            .callers
            .of(req.pid(), req.uid(), req.gid(), with_groups);
        hoardfs_origin::caller::enter(caller)
    }

    /// The listing a READDIR at `offset` reads: a fresh (or still valid) one at offset 0,
    /// otherwise the snapshot the pass started with.
    fn listing_at(&self, ino: INodeNo, offset: u64) -> Result<Arc<Listing>, Errno> {
        if offset > 0
            && let Some(pass) = self.dirs.lock().get(&ino.0)
        {
            return Ok(pass.listing.clone());
        }
        let l = self.fs.listing(ino.0).map_err(|e| errno(&e))?;
        let mut dirs = self.dirs.lock();
        // Passes abandoned before their end (`ls | head`) leave their snapshot behind;
        // a pass that outlives this continues in a fresh listing.
        dirs.retain(|_, pass| pass.started.elapsed() < SNAPSHOT_LIFETIME);
        let pass = DirPass {
            started: Instant::now(),
            listing: l.clone(),
        };
        dirs.insert(ino.0, pass);
        Ok(l)
    }

    /// After a READDIR from `offset`: the pass is over once a request starts past the
    /// end (the kernel's final, empty one), and its snapshot is dropped.
    fn listing_done(&self, ino: INodeNo, listing: &Arc<Listing>, offset: u64) {
        if offset as usize >= 2 + listing.entries.len() {
            let mut dirs = self.dirs.lock();
            if dirs
                .get(&ino.0)
                .is_some_and(|pass| Arc::ptr_eq(&pass.listing, listing))
            {
                dirs.remove(&ino.0);
            }
        }
    }
}

/// Types the outcome of a backing registration (`FUSE_DEV_IOC_BACKING_OPEN`): errors that
/// mean the kernel takes no backing files on this mount, and passing ones.
pub(crate) fn backing(r: std::io::Result<fuser::BackingId>) -> Result<Backing, BackingError> {
    match r {
        Ok(id) => Ok(Arc::new(id) as Backing),
        Err(e) => match e.raw_os_error() {
            Some(
                libc::EPERM
                | libc::EACCES
                | libc::ENOTTY
                | libc::EINVAL
                | libc::ENOSYS
                | libc::EOPNOTSUPP,
            ) => Err(BackingError::Refused(e)),
            _ => Err(BackingError::Failed(e)),
        },
    }
}

impl Filesystem for FuseBridge {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Always READDIRPLUS, never the "auto" heuristic: listings carry every entry's
        // attributes anyway, and with plain READDIR after the first page each later open
        // of a listed name would cost a LOOKUP round trip to the server.
        let want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS;
        let _ = config.add_capabilities(want & config.capabilities());
        if self.fs.remote_locks() {
            // Every flock and POSIX lock comes here and goes to the server, so processes
            // on other clients (and the server's) are excluded too.
            let locks = InitFlags::FUSE_POSIX_LOCKS | InitFlags::FUSE_FLOCK_LOCKS;
            let _ = config.add_capabilities(locks & config.capabilities());
        }
        if self.fs.kernel_opens() {
            // No open-time check under kernel opens: a read first refreshes expired
            // attributes, and a changed mtime or size drops the file's page cache.
            let _ =
                config.add_capabilities(InitFlags::FUSE_AUTO_INVAL_DATA & config.capabilities());
        }
        // Passthrough needs a stacking depth of at least 1 (the kernel refuses backing
        // files otherwise); 2 lets the cache directory itself live on a stacked file
        // system such as overlayfs.
        if self.fs.config().passthrough
            && config.capabilities().contains(InitFlags::FUSE_PASSTHROUGH)
            && config.add_capabilities(InitFlags::FUSE_PASSTHROUGH).is_ok()
        {
            let _ = config.set_max_stack_depth(2);
        }
        // No `set_max_readahead` here: INIT can only lower the kernel's 128 KiB; the mount
        // raises its readahead afterwards through sysfs (`--readahead-kb`).
        // Readahead requests are "background" requests; past the congestion threshold
        // (default 9 of 12) the kernel skips readahead and falls back to single-page
        // reads, so hundreds of parallel readers would each send 4 KiB requests.
        let _ = config.set_max_background(256);
        let _ = config.set_congestion_threshold(192);
        // Writes reach the daemon (and the origin) in pieces of up to 1 MiB.
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    fn destroy(&mut self) {
        self.fs.shutdown();
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _caller = self.enter(req);
        match self.fs.lookup(parent.0, name.as_bytes()) {
            Ok(e) => reply.entry(&e.ttl, &fuse_attr(e.ino, &e.attr), Generation(0)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(ino.0, nlookup);
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _caller = self.enter(req);
        match self.fs.getattr(ino.0) {
            Ok(NodeAttr { attr, ttl }) => reply.attr(&ttl, &fuse_attr(ino.0, &attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _caller = self.enter(req);
        match self.fs.readlink(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _caller = self.enter(req);
        if self.fs.kernel_opens() {
            // The kernel remembers ENOSYS for the whole mount: it then opens files itself
            // (keeping their page cache) and reads come with handle 0 (`read` below).
            // The mount is read-only, so no write open can get here.
            return reply.error(Errno::ENOSYS);
        }
        let make_backing = |f: &std::fs::File| backing(reply.open_backing(f));
        let access = access(flags.0);
        let hoardfs_fs::Opened { fh, mode, .. } = match self.fs.open(ino.0, access, &make_backing) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!("open of inode {} failed: {e}", ino.0);
                return reply.error(errno(&e));
            }
        };
        match open_flags(&mode, access.write) {
            (f, Some(id)) => reply.opened_passthrough(FileHandle(fh), f, id),
            (f, None) => reply.opened(FileHandle(fh), f),
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let _caller = self.enter(req);
        let kernel_opened = fh.0 == 0 && self.fs.kernel_opens();
        let reply = if kernel_opened {
            reply
        } else {
            match reply.into_direct() {
                // Over io_uring: the bytes go into the ring entry's buffer, straight from
                // the network when they are fetched for this read alone.
                Ok(direct) => {
                    // (Dropped unanswered, the entry answers EIO.)
                    let mut dst = hoardfs_origin::ReadSlot::new(Box::new(RingDst(direct)));
                    if let Err(e) = self.fs.read_into(fh.0, offset, size, &mut dst) {
                        dst.fail(errno(&e).code());
                    }
                    return;
                }
                Err(reply) => reply,
            }
        };
        let data = if kernel_opened {
            self.fs.read_unopened(ino.0, offset, size)
        } else {
            self.fs.read(fh.0, offset, size)
        };
        match data {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        if self.fs.kernel_opens() {
            // Opens by the kernel carry no FOPEN_NOFLUSH: ENOSYS stops FLUSH for the mount.
            return reply.error(Errno::ENOSYS);
        }
        let flushed = self.fs.flush(ino.0, fh.0, req.pid());
        // A close releases the POSIX locks its process holds on the file, once what it
        // wrote is where the next holder will read it.
        self.fs
            .unlock_all(ino.0, hoardfs_origin::LockKind::Posix, lock_owner.0);
        modify::reply_empty(flushed, reply);
    }

    fn release(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        // The last close of an open file description releases its flock (owned by the
        // open file: see `setlk`; nothing is sent if it took none).
        self.fs
            .unlock_all(ino.0, hoardfs_origin::LockKind::Flock, fh.0);
        self.fs.release(fh.0);
        reply.ok();
    }

    fn getlk(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        _pid: u32,
        reply: ReplyLock,
    ) {
        let _caller = self.enter(req);
        locks::LockWaits::getlk(&self.fs, ino.0, lock_owner.0, start, end, typ, reply);
    }

    fn setlk(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        lock_owner: LockOwner,
        start: u64,
        end: u64,
        typ: i32,
        pid: u32,
        sleep: bool,
        flock: bool,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        self.lock_waits.setlk(
            &self.fs,
            req.unique(),
            ino.0,
            fh.0,
            lock_owner.0,
            (start, end, typ),
            pid,
            sleep,
            flock,
            reply,
        );
    }

    fn interrupt(&self, _req: &Request, unique: fuser::RequestId) {
        self.lock_waits.interrupt(&self.fs, unique);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if !self.fs.acts_as_callers() {
            // ENOSYS makes the kernel stop sending OPENDIR/RELEASEDIR for the whole mount
            // and cache directory contents itself (FOPEN_CACHE_DIR | FOPEN_KEEP_CACHE): a
            // warm `ls` never reaches the daemon. Reads then come with handle 0 and are
            // served by inode; the kernel drops its copy when the directory's mtime
            // changes or a callback break invalidates the inode (doc/SEMANTICS.md).
            return reply.error(Errno::ENOSYS);
        }
        // A server that acts as its callers decides who may list what; the kernel's copy
        // of a listing is shared by every user of the mount, so each open of a directory
        // is judged here first (then the kernel keeps and reuses its copy as above).
        let _caller = self.enter(req);
        match self.fs.may_list(ino.0) {
            Ok(()) => reply.opened(
                FileHandle(0),
                fuser::FopenFlags::FOPEN_CACHE_DIR | fuser::FopenFlags::FOPEN_KEEP_CACHE,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let _caller = self.enter(req);
        let listing = match self.listing_at(ino, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
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
        self.listing_done(ino, &listing, offset);
        reply.ok();
    }

    fn readdirplus(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let _caller = self.enter(req);
        let listing = match self.listing_at(ino, offset) {
            Ok(l) => l,
            Err(e) => return reply.error(e),
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
                        &Duration::ZERO,
                        &fuse_attr(dino, &a),
                        Generation(0),
                    ),
                    Err(_) => false,
                }
            } else {
                let e = &listing.entries[i - 2];
                let ListedNode {
                    ino: child,
                    ttl,
                    attr,
                } = self.fs.remember_entry(ino.0, &listing, e);
                let full = reply.add(
                    INodeNo(child),
                    i as u64 + 1,
                    OsStr::from_bytes(&e.name),
                    &ttl,
                    &fuse_attr(child, &attr),
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
        self.listing_done(ino, &listing, offset);
        reply.ok();
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _caller = self.enter(req);
        match self.fs.statfs() {
            Ok(s) => reply.statfs(
                s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.frsize,
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _caller = self.enter(req);
        self.do_getxattr(ino, name, size, reply);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _caller = self.enter(req);
        self.do_listxattr(ino, size, reply);
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        self.do_setxattr(ino, name, value, flags, reply);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = self.enter(req);
        self.do_removexattr(ino, name, reply);
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<std::time::SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<std::time::SystemTime>,
        _chgtime: Option<std::time::SystemTime>,
        _bkuptime: Option<std::time::SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let _caller = self.enter(req);
        let set = hoardfs_origin::SetAttrs {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(modify::time_set),
            mtime: mtime.map(modify::time_set),
        };
        self.do_setattr(ino, &set, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _caller = self.enter(req);
        self.do_create(req, parent, name, mode, flags, reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let _caller = self.enter(req);
        let r = self.fs.mknod(
            parent.0,
            name.as_bytes(),
            mode,
            rdev as u64,
            modify::owner(req),
        );
        modify::reply_entry(r, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let _caller = self.enter(req);
        let r = self
            .fs
            .mkdir(parent.0, name.as_bytes(), mode, modify::owner(req));
        modify::reply_entry(r, reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &std::path::Path,
        reply: ReplyEntry,
    ) {
        let _caller = self.enter(req);
        let target = target.as_os_str().as_bytes();
        let r = self
            .fs
            .symlink(parent.0, link_name.as_bytes(), target, modify::owner(req));
        modify::reply_entry(r, reply);
    }

    fn link(
        &self,
        req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let _caller = self.enter(req);
        modify::reply_entry(self.fs.link(ino.0, newparent.0, newname.as_bytes()), reply);
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = self.enter(req);
        modify::reply_empty(self.fs.unlink(parent.0, name.as_bytes()), reply);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _caller = self.enter(req);
        modify::reply_empty(self.fs.rmdir(parent.0, name.as_bytes()), reply);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        let r = self.fs.rename(
            parent.0,
            name.as_bytes(),
            newparent.0,
            newname.as_bytes(),
            flags.bits(),
        );
        modify::reply_empty(r, reply);
    }

    fn write(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let _caller = self.enter(req);
        match self.fs.write(fh.0, offset, data, req.pid()) {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn fsync(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        modify::reply_empty(self.fs.fsync(ino.0, datasync), reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        // (Never ENOSYS: the kernel would stop asking for the whole mount.)
        let r = match u32::try_from(mode) {
            Ok(mode) => self.fs.fallocate(fh.0, offset, length, mode),
            Err(_) => Err(hoardfs_fs::FsError::Origin(
                hoardfs_origin::WireError::Unsupported,
            )),
        };
        modify::reply_empty(r, reply);
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let _caller = self.enter(req);
        modify::reply_empty(self.fs.fsync(ino.0, datasync), reply);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Permissions are enforced by the kernel (default_permissions) from origin attributes.
        reply.ok();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    use crate::convert::time;
    use hoardfs_origin::{Attr, FileKind, TimeSet, Timestamp, WireError};

    fn attr(t: Timestamp) -> Attr {
        Attr {
            file_id: 1,
            version: 1,
            kind: FileKind::File,
            perm: 0o170_644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: u64::MAX,
            blocks: u64::MAX,
            rdev: u64::MAX,
            blksize: 0,
            atime: t,
            mtime: t,
            ctime: t,
            acl: false,
        }
    }

    #[test]
    fn extreme_attributes_convert_without_panic() {
        for secs in [i64::MAX, i64::MAX - 1, i64::MIN, i64::MIN + 1, -1, 0, 1] {
            for nanos in [0, 1, 999_999_999, 1_000_000_000, u32::MAX] {
                let a = fuse_attr(2, &attr(Timestamp { secs, nanos }));
                assert_eq!(a.perm, 0o644);
                let _ = time(Timestamp { secs, nanos });
            }
        }
        let far = time(Timestamp {
            secs: i64::MAX,
            nanos: u32::MAX,
        });
        assert!(far > UNIX_EPOCH);
        let before = time(Timestamp {
            secs: -1,
            nanos: 500_000_000,
        });
        assert_eq!(
            UNIX_EPOCH.duration_since(before).unwrap(),
            Duration::from_millis(500)
        );
    }

    /// An origin of one directory holding one file, both with extreme attributes.
    struct Extreme;

    impl Extreme {
        fn entry(id: u64, kind: FileKind) -> hoardfs_origin::Entry {
            let mut a = attr(Timestamp {
                secs: i64::MAX,
                nanos: u32::MAX,
            });
            a.file_id = id;
            a.kind = kind;
            a.mtime = Timestamp {
                secs: i64::MIN,
                nanos: 1_000_000_000,
            };
            hoardfs_origin::Entry {
                handle: hoardfs_origin::Handle { epoch: 1, id },
                attr: a,
            }
        }
    }

    impl hoardfs_origin::Origin for Extreme {
        fn info(&self) -> hoardfs_origin::Result<hoardfs_origin::OriginInfo> {
            Ok(hoardfs_origin::OriginInfo {
                verifier: 0,
                export_id: 1,
                root: Extreme::entry(1, FileKind::Dir),
                read_only: true,
                identities: hoardfs_origin::Identities::Server,
            })
        }
        fn lookup(
            &self,
            _: hoardfs_origin::Handle,
            _: &[u8],
        ) -> hoardfs_origin::Result<hoardfs_origin::Entry> {
            Ok(Extreme::entry(2, FileKind::File))
        }
        fn getattr(&self, h: hoardfs_origin::Handle) -> hoardfs_origin::Result<Attr> {
            let kind = if h.id == 1 {
                FileKind::Dir
            } else {
                FileKind::File
            };
            Ok(Extreme::entry(h.id, kind).attr)
        }
        fn readdir(
            &self,
            _: hoardfs_origin::Handle,
            _: u64,
            _: u32,
        ) -> hoardfs_origin::Result<hoardfs_origin::DirPage> {
            Ok(hoardfs_origin::DirPage {
                entries: vec![hoardfs_origin::DirEntry {
                    name: b"f".to_vec(),
                    entry: Extreme::entry(2, FileKind::File),
                }],
                next: None,
            })
        }
        fn read(
            &self,
            _: hoardfs_origin::Handle,
            _: u64,
            _: u32,
        ) -> hoardfs_origin::Result<hoardfs_origin::ReadReply> {
            Ok(hoardfs_origin::ReadReply {
                data: Vec::new(),
                version: 1,
            })
        }
        fn readlink(&self, _: hoardfs_origin::Handle) -> hoardfs_origin::Result<Vec<u8>> {
            Err(WireError::Invalid.into())
        }
        fn statfs(&self) -> hoardfs_origin::Result<hoardfs_origin::StatFs> {
            Ok(hoardfs_origin::StatFs::default())
        }
    }

    #[test]
    fn extreme_attributes_convert_through_the_fs_layer() {
        let fs = HoardFs::new(Arc::new(Extreme), None, hoardfs_fs::FsConfig::default()).unwrap();
        let root = fs.getattr(hoardfs_fs::ROOT_INO).unwrap().attr;
        let hoardfs_fs::NodeEntry { ino, attr: a, .. } =
            fs.lookup(hoardfs_fs::ROOT_INO, b"f").unwrap();
        let listing = fs.listing(hoardfs_fs::ROOT_INO).unwrap();
        let attrs = [
            root,
            a,
            fs.getattr(ino).unwrap().attr,
            listing.entries[0].entry.attr,
        ];
        for a in attrs {
            let k = fuse_attr(ino, &a);
            assert!(k.atime > UNIX_EPOCH && k.mtime < UNIX_EPOCH);
            assert_eq!(k.perm, 0o644);
        }
    }

    #[test]
    fn kernel_times_before_the_epoch_convert_without_panic() {
        let early = UNIX_EPOCH
            .checked_sub(Duration::new(i64::MAX as u64, 999_999_999))
            .unwrap();
        for t in [
            early,
            UNIX_EPOCH - Duration::from_nanos(1),
            UNIX_EPOCH - Duration::from_millis(1500),
        ] {
            let TimeSet::At(ts) = modify::time_set(TimeOrNow::SpecificTime(t)) else {
                panic!()
            };
            assert!(ts.nanos < 1_000_000_000);
            assert_eq!(time(ts), t, "{ts:?}");
        }
    }
}
