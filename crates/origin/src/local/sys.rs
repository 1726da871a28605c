//! Thin, safe wrappers over the read-side system calls the local export needs: `openat2`
//! with `RESOLVE_BENEATH`, `fstatat`, re-opening `O_PATH` descriptors, `getdents`-style
//! directory iteration, `readlinkat` and `fstatvfs`. Modifying calls live in `sys_write`.

use std::ffi::{CStr, CString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use hoardfs_proto::{Attr, FileKind, StatFs, Timestamp};

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_BENEATH: u64 = 0x08;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `name` relative to `dir` with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)`:
/// the kernel refuses any resolution that would leave `dir` (`..`, absolute symlinks,
/// races with renames), whatever the name contains.
pub fn openat_beneath(dir: RawFd, name: &CStr, flags: i32) -> io::Result<OwnedFd> {
    openat_beneath_mode(dir, name, flags, 0)
}

/// [`openat_beneath`] with a creation `mode` (used with `O_CREAT`; the process umask
/// applies).
pub fn openat_beneath_mode(dir: RawFd, name: &CStr, flags: i32, mode: u32) -> io::Result<OwnedFd> {
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: u64::from(mode),
        resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    loop {
        // SAFETY: valid pointers for the duration of the call; the kernel validates `dir`.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                dir,
                name.as_ptr(),
                &how as *const OpenHow,
                std::mem::size_of::<OpenHow>(),
            )
        };
        if fd >= 0 {
            // SAFETY: the kernel returned a fresh descriptor that we now own.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) });
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) && err.raw_os_error() != Some(libc::EAGAIN) {
            return Err(err);
        }
    }
}

/// Opens a directory path (the export root) as an `O_PATH` descriptor.
pub fn open_root(path: &std::path::Path) -> io::Result<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: valid C string.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `fstat` of any descriptor, `O_PATH` ones included, without following symlinks.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: empty path with AT_EMPTY_PATH stats `fd` itself.
    let rc = unsafe {
        libc::fstatat(
            fd,
            c"".as_ptr(),
            &mut st,
            libc::AT_EMPTY_PATH | libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// `cachestat(2)`'s system call number: the same on every architecture (Linux 6.5 and
/// later); libc 0.2 does not name it for x86-64 yet.
const SYS_CACHESTAT: libc::c_long = 451;

/// Whether every page of bytes `offset..offset + len` of `fd` is in the page cache
/// (`cachestat(2)`). An empty range is. Errors include `ENOSYS` from kernels before 6.5.
pub fn all_cached(fd: RawFd, offset: u64, len: u64) -> io::Result<bool> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    // Set once the kernel said it has no cachestat: no syscall per read after that.
    static MISSING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if len == 0 {
        return Ok(true); // (a zero length would mean "to the end of the file")
    }
    if MISSING.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(io::Error::from_raw_os_error(libc::ENOSYS));
    }
    let range = Range { off: offset, len };
    let mut st = Stat::default();
    // SAFETY: both pointers are valid for the call; flags must be 0.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const Range,
            &mut st as *mut Stat,
            0u32,
        )
    };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOSYS) {
            MISSING.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        return Err(e);
    }
    // SAFETY: sysconf has no preconditions.
    let page = *PAGE.get_or_init(|| (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(1) as u64);
    let pages = (offset + len - 1) / page - offset / page + 1;
    Ok(st.nr_cache >= pages)
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`: the object `name` names in `dir`, not followed.
pub fn fstatat(dir: RawFd, name: &CStr) -> io::Result<libc::stat> {
    // SAFETY: zeroed stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and out-pointer; the kernel validates `dir`.
    let rc = unsafe { libc::fstatat(dir, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Re-opens an `O_PATH` descriptor of a regular file for reading, through
/// `/proc/self/fd` (the method virtiofsd uses); `proc_fd` is an open `/proc/self/fd`.
pub fn reopen_read(proc_fd: RawFd, fd: RawFd) -> io::Result<File> {
    reopen(proc_fd, fd, libc::O_RDONLY)
}

/// Re-opens descriptor `fd` with `flags` (e.g. `O_RDWR`, `O_PATH`) through `/proc/self/fd`;
/// the result names the same inode even if its name changed meanwhile.
pub fn reopen(proc_fd: RawFd, fd: RawFd, flags: i32) -> io::Result<File> {
    let name = fd_name(fd);
    // SAFETY: valid C string; result checked.
    let rfd = unsafe { libc::openat(proc_fd, name.as_ptr(), flags | libc::O_CLOEXEC) };
    if rfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { File::from_raw_fd(rfd) })
}

/// The name of descriptor `fd` inside `/proc/self/fd` (its decimal number).
pub fn fd_name(fd: RawFd) -> CString {
    CString::new(fd.to_string()).expect("digits")
}

/// The absolute path `/proc/self/fd/N` of descriptor `fd`, for calls without an `*at` form.
pub fn fd_path(fd: RawFd) -> CString {
    CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL")
}

/// Opens `/proc/self/fd` for [`reopen_read`].
pub fn open_proc_self_fd() -> io::Result<OwnedFd> {
    // SAFETY: constant C string.
    let fd = unsafe {
        libc::open(
            c"/proc/self/fd".as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh descriptor.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Target of the symlink open as `O_PATH|O_NOFOLLOW` at `fd`.
pub fn readlink(fd: RawFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize + 1];
    // SAFETY: buffer is valid for its length; empty path reads the link `fd` refers to.
    let n = unsafe { libc::readlinkat(fd, c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `fstatvfs` of a descriptor.
pub fn statvfs(fd: RawFd) -> io::Result<StatFs> {
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid fd and out-pointer.
    if unsafe { libc::fstatvfs(fd, &mut s) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(StatFs {
        blocks: s.f_blocks,
        bfree: s.f_bfree,
        bavail: s.f_bavail,
        files: s.f_files,
        ffree: s.f_ffree,
        bsize: s.f_bsize as u32,
        namelen: s.f_namemax as u32,
        frsize: s.f_frsize as u32,
    })
}

/// The object kind encoded in `st_mode`.
pub fn kind_of(mode: libc::mode_t) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        libc::S_IFIFO => FileKind::Fifo,
        libc::S_IFSOCK => FileKind::Socket,
        libc::S_IFCHR => FileKind::CharDev,
        libc::S_IFBLK => FileKind::BlockDev,
        _ => FileKind::File,
    }
}

/// Content version of a file: a hash of the fields that change whenever its content or
/// size does (inode, size, mtime). Linux does not expose i_version to user space; mtime has
/// nanosecond (multigrain) resolution on the file systems this targets. ctime is left out
/// on purpose: renames, links, chmod and chown change it but not the content, and must not
/// throw cached data away (see doc/SEMANTICS.md for what this misses).
pub fn version_of(st: &libc::stat) -> u64 {
    let mut b = [0u8; 32];
    b[0..8].copy_from_slice(&st.st_ino.to_le_bytes());
    b[8..16].copy_from_slice(&(st.st_size as u64).to_le_bytes());
    b[16..24].copy_from_slice(&(st.st_mtime as u64).to_le_bytes());
    b[24..32].copy_from_slice(&(st.st_mtime_nsec as u64).to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&b)
}

/// Attributes for the wire from a `stat`; `file_id` is chosen by the caller.
pub fn attr_of(st: &libc::stat, file_id: u64) -> Attr {
    let ts = |s: i64, n: i64| Timestamp {
        secs: s,
        nanos: n as u32,
    };
    Attr {
        file_id,
        version: version_of(st),
        kind: kind_of(st.st_mode),
        perm: (st.st_mode & 0o7777) as u16,
        nlink: st.st_nlink as u32,
        uid: st.st_uid,
        gid: st.st_gid,
        size: st.st_size as u64,
        blocks: st.st_blocks as u64,
        rdev: st.st_rdev,
        blksize: st.st_blksize as u32,
        atime: ts(st.st_atime, st.st_atime_nsec),
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        acl: false,
    }
}

/// Whether the thread's credentials (its fsuid, fsgid, groups and capabilities) may
/// access the object open at `fd` for `mask` (`R_OK | W_OK | X_OK`), as the kernel decides
/// for an `open` or `exec`: modes, ACLs, read-only mounts and immutable files.
pub fn access(fd: RawFd, mask: u32) -> io::Result<()> {
    // SAFETY: empty path with AT_EMPTY_PATH names `fd` itself; result checked.
    let r = unsafe {
        libc::syscall(
            libc::SYS_faccessat2,
            fd,
            c"".as_ptr(),
            mask as libc::c_int,
            libc::AT_EMPTY_PATH | libc::AT_EACCESS,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether the object open at `fd` has a POSIX access ACL. Anything but "no such
/// attribute" or "not supported" counts as yes (a client then asks the server instead of
/// deciding by the mode bits).
pub fn has_acl(fd: RawFd) -> bool {
    let path = fd_path(fd);
    // SAFETY: valid C strings; a size query (no buffer).
    let r = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"system.posix_acl_access".as_ptr(),
            std::ptr::null_mut(),
            0,
        )
    };
    if r >= 0 {
        return true;
    }
    !matches!(
        io::Error::last_os_error().raw_os_error(),
        Some(libc::ENODATA | libc::EOPNOTSUPP)
    )
}

/// An open directory stream positioned by opaque cookies (`telldir` offsets).
pub struct DirStream {
    dir: *mut libc::DIR,
}

// SAFETY: the stream is used by one thread at a time (owned, not shared).
unsafe impl Send for DirStream {}

impl DirStream {
    /// Opens directory `fd` (any descriptor, `O_PATH` included) for listing.
    pub fn open(fd: RawFd) -> io::Result<DirStream> {
        // SAFETY: "." relative to a directory fd; result checked.
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
        // SAFETY: dfd is ours; fdopendir takes ownership on success.
        let dir = unsafe { libc::fdopendir(dfd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so we still own dfd.
            unsafe { libc::close(dfd) };
            return Err(e);
        }
        Ok(DirStream { dir })
    }

    /// Positions the stream at a cookie returned by [`DirStream::next_entry`].
    pub fn seek(&mut self, cookie: u64) {
        // SAFETY: valid DIR*.
        unsafe { libc::seekdir(self.dir, cookie as libc::c_long) }
    }

    /// Next entry name and the cookie of the position after it; `None` at the end.
    pub fn next_entry(&mut self) -> io::Result<Option<(CString, u64)>> {
        // SAFETY: errno is thread-local; reset so end-of-stream and error can be told apart.
        unsafe { *libc::__errno_location() = 0 };
        // SAFETY: valid DIR*.
        let ent = unsafe { libc::readdir64(self.dir) };
        if ent.is_null() {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(0) {
                Ok(None)
            } else {
                Err(e)
            };
        }
        // SAFETY: readdir returned a valid dirent whose d_name is NUL-terminated.
        let (name, off) = unsafe {
            (
                CStr::from_ptr((*ent).d_name.as_ptr()).to_owned(),
                (*ent).d_off,
            )
        };
        Ok(Some((name, off as u64)))
    }

    /// Descriptor of the stream, for `openat2` of its entries.
    pub fn fd(&self) -> RawFd {
        // SAFETY: valid DIR*.
        unsafe { libc::dirfd(self.dir) }
    }
}

impl Drop for DirStream {
    fn drop(&mut self) {
        // SAFETY: valid DIR*, closed once.
        unsafe { libc::closedir(self.dir) };
    }
}

impl AsRawFd for DirStream {
    fn as_raw_fd(&self) -> RawFd {
        self.fd()
    }
}

/// Reads up to `len` bytes at `offset` into `buf` (replacing its contents) until EOF or
/// `len`; returns how many. Reads into the vector's spare capacity: no zeroing of
/// buffers that are about to be overwritten (measurable at hundreds of MB/s).
pub(crate) fn pread_full(
    fd: RawFd,
    buf: &mut Vec<u8>,
    len: usize,
    offset: u64,
) -> io::Result<usize> {
    buf.clear();
    buf.reserve_exact(len);
    while buf.len() < len {
        let done = buf.len();
        let spare = &mut buf.spare_capacity_mut()[..len - done];
        // SAFETY: pread writes at most `spare.len()` bytes into memory we own exclusively;
        // `set_len` below covers only the bytes it reported written.
        let n = unsafe {
            libc::pread(
                fd,
                spare.as_mut_ptr().cast(),
                spare.len(),
                (offset + done as u64) as libc::off_t,
            )
        };
        match n {
            0 => break,
            // SAFETY: pread initialised these `n` bytes.
            n if n > 0 => unsafe { buf.set_len(done + n as usize) },
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf.len())
}
