//! Thin, safe wrappers over the modifying system calls of the local export: the `*at`
//! namespace calls (`mknodat`, `mkdirat`, `symlinkat`, `linkat`, `unlinkat`, `renameat2`)
//! relative to directory descriptors, and attribute changes (`fchownat`, `fchmodat`,
//! `utimensat`, `ftruncate`) and `fsync` on descriptors. Nothing here resolves more than one
//! path component, so every call stays inside the directory it is given.

use std::ffi::CStr;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use hoardfs_proto::TimeSet;

use super::sys;

/// Turns a `-1`-on-error return code into an `io::Result`.
fn cvt(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `mknodat(dir, name, mode, rdev)`; `mode` includes the type bits.
pub fn mknodat(dir: RawFd, name: &CStr, mode: u32, rdev: u64) -> io::Result<()> {
    // SAFETY: valid C string; the kernel validates the rest.
    cvt(unsafe { libc::mknodat(dir, name.as_ptr(), mode as libc::mode_t, rdev) })
}

/// `mkdirat(dir, name, mode)`.
pub fn mkdirat(dir: RawFd, name: &CStr, mode: u32) -> io::Result<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::mkdirat(dir, name.as_ptr(), mode as libc::mode_t) })
}

/// `symlinkat(target, dir, name)`: the target is stored, never resolved.
pub fn symlinkat(target: &CStr, dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    cvt(unsafe { libc::symlinkat(target.as_ptr(), dir, name.as_ptr()) })
}

/// Hard-links the object open at `fd` (any descriptor, `O_PATH` included) as `dir/name`.
///
/// Tries `linkat(fd, "", AT_EMPTY_PATH)` first (needs `CAP_DAC_READ_SEARCH` on older
/// kernels) and falls back to following the `/proc/self/fd/N` magic link, which names the
/// object itself (a symlink is linked, not its target).
pub fn link_fd(fd: RawFd, dir: RawFd, name: &CStr) -> io::Result<()> {
    // SAFETY: valid C strings.
    let rc = unsafe { libc::linkat(fd, c"".as_ptr(), dir, name.as_ptr(), libc::AT_EMPTY_PATH) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if !matches!(
        e.raw_os_error(),
        Some(libc::ENOENT | libc::EPERM | libc::EINVAL)
    ) {
        return Err(e);
    }
    let path = sys::fd_path(fd);
    // SAFETY: valid C strings.
    cvt(unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            path.as_ptr(),
            dir,
            name.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    })
}

/// `unlinkat(dir, name, flags)` (`AT_REMOVEDIR` for directories).
pub fn unlinkat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<()> {
    // SAFETY: valid C string.
    cvt(unsafe { libc::unlinkat(dir, name.as_ptr(), flags) })
}

/// `renameat2(old_dir, old, new_dir, new, flags)`; flags are the kernel's
/// (`RENAME_NOREPLACE` = 1, `RENAME_EXCHANGE` = 2).
pub fn renameat2(
    old_dir: RawFd,
    old: &CStr,
    new_dir: RawFd,
    new: &CStr,
    flags: u32,
) -> io::Result<()> {
    // SAFETY: valid C strings; the kernel validates descriptors and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            old_dir,
            old.as_ptr(),
            new_dir,
            new.as_ptr(),
            flags,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Changes the owner and/or group of the object at `fd` itself (a symlink is not followed);
/// `None` leaves that id alone.
pub fn fchown(fd: RawFd, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
    let uid = uid.unwrap_or(u32::MAX) as libc::uid_t;
    let gid = gid.unwrap_or(u32::MAX) as libc::gid_t;
    // SAFETY: empty path with AT_EMPTY_PATH names `fd` itself.
    cvt(unsafe {
        libc::fchownat(
            fd,
            c"".as_ptr(),
            uid,
            gid,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    })
}

/// `chmod` of the object at `fd` through `/proc/self/fd` (`proc_fd`), which works for
/// `O_PATH` descriptors; never use it on a symlink (it would reach the target).
pub fn fchmod(proc_fd: RawFd, fd: RawFd, mode: u32) -> io::Result<()> {
    let name = sys::fd_name(fd);
    // SAFETY: valid C string.
    cvt(unsafe { libc::fchmodat(proc_fd, name.as_ptr(), mode as libc::mode_t, 0) })
}

fn timespec(t: Option<TimeSet>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(TimeSet::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(TimeSet::At(ts)) => libc::timespec {
            tv_sec: ts.secs as libc::time_t,
            tv_nsec: ts.nanos.min(999_999_999) as libc::c_long,
        },
    }
}

/// Sets access and/or modification time of the object at `fd` through `/proc/self/fd`
/// (`None` leaves a time alone); never use it on a symlink.
pub fn utimens(
    proc_fd: RawFd,
    fd: RawFd,
    atime: Option<TimeSet>,
    mtime: Option<TimeSet>,
) -> io::Result<()> {
    let name = sys::fd_name(fd);
    let times = [timespec(atime), timespec(mtime)];
    // SAFETY: valid C string and a two-element timespec array.
    cvt(unsafe { libc::utimensat(proc_fd, name.as_ptr(), times.as_ptr(), 0) })
}

/// Sets access and/or modification time of the symbolic link `fd` (an `O_PATH |
/// O_NOFOLLOW` descriptor of the link itself) without following it: `utimensat` on the
/// descriptor with an empty path (`AT_EMPTY_PATH`, Linux 5.8 and later).
pub fn utimens_link(fd: RawFd, atime: Option<TimeSet>, mtime: Option<TimeSet>) -> io::Result<()> {
    let times = [timespec(atime), timespec(mtime)];
    let flags = libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: an empty C string and a two-element timespec array.
    cvt(unsafe { libc::utimensat(fd, c"".as_ptr(), times.as_ptr(), flags) })
}

/// `ftruncate` of a descriptor open for writing.
pub fn ftruncate(fd: RawFd, size: u64) -> io::Result<()> {
    let size =
        libc::off_t::try_from(size).map_err(|_| io::Error::from_raw_os_error(libc::EFBIG))?;
    // SAFETY: plain system call on a descriptor.
    cvt(unsafe { libc::ftruncate(fd, size) })
}

/// `fsync` (or `fdatasync` when `datasync`) of an open (non-`O_PATH`) descriptor.
pub fn fsync(fd: RawFd, datasync: bool) -> io::Result<()> {
    loop {
        // SAFETY: plain system calls on a descriptor.
        let rc = unsafe {
            if datasync {
                libc::fdatasync(fd)
            } else {
                libc::fsync(fd)
            }
        };
        match cvt(rc) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            r => return r,
        }
    }
}

/// Opens directory `fd` (an `O_PATH` descriptor) read-only, e.g. to `fsync` it.
pub fn open_dir(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: "." relative to a directory descriptor; result checked.
    let dfd = unsafe {
        libc::openat(
            fd,
            c".".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(dfd) })
}

/// Whether this process runs with effective uid 0 (and so may give new objects away).
pub fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}
