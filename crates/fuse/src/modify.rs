//! Translation of the modifying requests (create, setattr, extended attributes, ...) and
//! the small conversions they share; the `Filesystem` methods in the crate root delegate
//! here.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, UNIX_EPOCH};

use fuser::{
    BackingId, Errno, FileHandle, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate,
    ReplyEmpty, ReplyEntry, ReplyXattr, Request, TimeOrNow,
};
use hoardfs_fs::{Access, FsResult, NodeAttr, NodeEntry, OpenMode};
use hoardfs_origin::{Owner, SetAttrs, TimeSet, Timestamp};

use crate::{FuseBridge, errno, fuse_attr};

/// What an open's flags ask for.
pub(crate) fn access(flags: i32) -> Access {
    Access {
        read: flags & libc::O_ACCMODE != libc::O_WRONLY,
        write: flags & libc::O_ACCMODE != libc::O_RDONLY,
        append: flags & libc::O_APPEND != 0,
        sync: flags & (libc::O_SYNC | libc::O_DSYNC | libc::O_DIRECT) != 0,
    }
}

/// Open reply flags for a mode, and the backing for passthrough. Opens for writing get
/// FLUSH requests: before sending one, the kernel writes back dirty mmap pages, so they
/// reach the origin before `close()` returns.
pub(crate) fn open_flags(mode: &OpenMode, write: bool) -> (FopenFlags, Option<&BackingId>) {
    let noflush = if write {
        FopenFlags::empty()
    } else {
        FopenFlags::FOPEN_NOFLUSH
    };
    match mode {
        OpenMode::Passthrough(b) => {
            let id = b
                .downcast_ref::<BackingId>()
                .expect("backings are fuser BackingIds");
            (noflush, Some(id))
        }
        OpenMode::Cached { keep_cache } => {
            let mut f = noflush;
            if *keep_cache {
                f |= FopenFlags::FOPEN_KEEP_CACHE;
            }
            (f, None)
        }
        OpenMode::Direct => (noflush | FopenFlags::FOPEN_DIRECT_IO, None),
    }
}

/// The identity new objects are created with: the calling process's.
pub(crate) fn owner(req: &Request) -> Owner {
    Owner {
        uid: req.uid(),
        gid: req.gid(),
    }
}

/// A kernel time change as the wire's.
pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(st) => TimeSet::At(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => Timestamp {
                secs: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                nanos: d.subsec_nanos(),
            },
            Err(e) => {
                // Saturating: `SystemTime` may reach further back than `i64` seconds.
                let d = e.duration();
                let secs = i64::try_from(d.as_secs()).map_or(i64::MIN, |s| -s);
                match (d.subsec_nanos(), secs.checked_sub(1)) {
                    (0, _) => Timestamp { secs, nanos: 0 },
                    (n, Some(s)) => Timestamp {
                        secs: s,
                        nanos: 1_000_000_000 - n,
                    },
                    (_, None) => Timestamp {
                        secs: i64::MIN,
                        nanos: 0,
                    },
                }
            }
        }),
    }
}

/// Replies to a request that created a name.
pub(crate) fn reply_entry(r: FsResult<NodeEntry>, reply: ReplyEntry) {
    match r {
        Ok(NodeEntry { ino, attr, ttl }) => {
            reply.entry(&ttl, &fuse_attr(ino, &attr), Generation(0))
        }
        Err(e) => reply.error(errno(&e)),
    }
}

/// Replies to a request with no result value.
pub(crate) fn reply_empty(r: FsResult<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(&e)),
    }
}

/// Answers an xattr request: its size when the caller asked with size 0, the bytes when
/// they fit, `ERANGE` when they do not.
fn reply_xattr(r: FsResult<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() <= size as usize => reply.data(&v),
        Ok(_) => reply.error(Errno::ERANGE),
        Err(e) => reply.error(errno(&e)),
    }
}

impl FuseBridge {
    /// Whether extended attributes are served. Without them every xattr request is
    /// answered ENOSYS, which the kernel remembers for the whole mount: it then fails
    /// them itself (EOPNOTSUPP) instead of asking the daemon. `ls -l` asks up to three
    /// per file (SELinux label, two ACLs), each otherwise a round trip.
    fn xattrs(&self) -> bool {
        self.fs.config().xattrs
    }

    pub(crate) fn do_getxattr(&self, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        if !self.xattrs() {
            return reply.error(Errno::ENOSYS);
        }
        reply_xattr(self.fs.getxattr(ino.0, name.as_bytes()), size, reply);
    }

    pub(crate) fn do_listxattr(&self, ino: INodeNo, size: u32, reply: ReplyXattr) {
        if !self.xattrs() {
            return reply.error(Errno::ENOSYS);
        }
        reply_xattr(self.fs.listxattr(ino.0), size, reply);
    }

    pub(crate) fn do_setxattr(
        &self,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        reply: ReplyEmpty,
    ) {
        if !self.xattrs() {
            return reply.error(Errno::ENOSYS);
        }
        let r = self
            .fs
            .setxattr(ino.0, name.as_bytes(), value, flags as u32);
        reply_empty(r, reply);
    }

    pub(crate) fn do_removexattr(&self, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if !self.xattrs() {
            return reply.error(Errno::ENOSYS);
        }
        reply_empty(self.fs.removexattr(ino.0, name.as_bytes()), reply);
    }

    pub(crate) fn do_setattr(&self, ino: INodeNo, set: &SetAttrs, reply: ReplyAttr) {
        match self.fs.setattr(ino.0, set) {
            Ok(NodeAttr { attr, ttl }) => reply.attr(&ttl, &fuse_attr(ino.0, &attr)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    pub(crate) fn do_create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let make_backing = |f: &std::fs::File| crate::backing(reply.open_backing(f));
        let r = self.fs.create(
            parent.0,
            name.as_bytes(),
            mode & 0o7777,
            flags & libc::O_EXCL != 0,
            flags & libc::O_TRUNC != 0,
            access(flags),
            owner(req),
            &make_backing,
        );
        let (NodeEntry { ino, attr, ttl }, hoardfs_fs::Opened { fh, mode, .. }) = match r {
            Ok(r) => r,
            Err(e) => return reply.error(errno(&e)),
        };
        let attr = fuse_attr(ino, &attr);
        let ttl: Duration = ttl;
        match open_flags(&mode, access(flags).write) {
            (f, Some(id)) => {
                reply.created_passthrough(&ttl, &attr, Generation(0), FileHandle(fh), f, id)
            }
            (f, None) => reply.created(&ttl, &attr, Generation(0), FileHandle(fh), f),
        }
    }
}
