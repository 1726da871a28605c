//! Conversions at the FUSE boundary: typed errors to errno values (the only place errno
//! numbers are chosen), origin timestamps, kinds and attributes to fuser's types.

use std::time::{Duration, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo};
use hoardfs_fs::{FsError, Ino};
use hoardfs_origin::{Attr, FileKind, Timestamp, WireError};

/// Maps a typed error to the errno the kernel reports (an `EIO`, which says little, is
/// logged with its cause at debug level).
pub fn errno(e: &FsError) -> Errno {
    let n = errno_of(e);
    if n == Errno::EIO || n == Errno::ESTALE {
        tracing::debug!("answering {n:?}: {e}");
    }
    n
}

fn errno_of(e: &FsError) -> Errno {
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
            WireError::Protocol | WireError::Io | WireError::TlsRequired => Errno::EIO,
            WireError::Exists => Errno::EEXIST,
            WireError::NotEmpty => Errno::ENOTEMPTY,
            WireError::NoData => Errno::ENODATA,
            WireError::Range => Errno::ERANGE,
            WireError::QuotaExceeded => Errno::EDQUOT,
            WireError::NotPermitted => Errno::EPERM,
            WireError::CrossDevice => Errno::EXDEV,
            WireError::TooBig => Errno::EFBIG,
            WireError::InUse => Errno::EBUSY,
            WireError::TooManyLinks => Errno::EMLINK,
            WireError::WouldBlock => Errno::EAGAIN,
            WireError::Interrupted => Errno::EINTR,
            WireError::NoLocks => Errno::ENOLCK,
        },
        FsError::Offline(_) | FsError::SentMeanwhile => Errno::EIO,
        FsError::Protocol(_) | FsError::Cache(_) => Errno::EIO,
        FsError::ReadOnly => Errno::EROFS,
        FsError::BadHandle => Errno::EBADF,
        FsError::WritesLost(_) | FsError::Thread { .. } => Errno::EIO,
        FsError::OfflineChange(e) => match e.get().raw_os_error() {
            Some(libc::ENOSPC) => Errno::ENOSPC,
            Some(libc::EDQUOT) => Errno::EDQUOT,
            _ => Errno::EIO,
        },
    }
}

/// A wire time as the kernel's. Never panics: nanoseconds out of range are clamped, and a
/// time the platform cannot represent saturates (on Linux every `i64` second is fine).
pub(crate) fn time(t: Timestamp) -> std::time::SystemTime {
    let t = t.clamped();
    let nanos = Duration::from_nanos(u64::from(t.nanos));
    let st = if t.secs >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.secs as u64) + nanos)
    } else {
        UNIX_EPOCH
            .checked_sub(Duration::from_secs(t.secs.unsigned_abs()))
            .and_then(|s| s.checked_add(nanos))
    };
    st.unwrap_or(UNIX_EPOCH)
}

pub(crate) fn file_type(k: FileKind) -> FileType {
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
        // Only permission bits: higher ones would change the type the kernel sees.
        perm: a.perm & 0o7777,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize.max(4096),
        flags: 0,
    }
}
