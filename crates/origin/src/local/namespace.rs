//! Namespace changes of the local export: create, mknod, mkdir, symlink, link, unlink,
//! rmdir and rename.
//!
//! Every name is checked with [`check_name`] and used with an `*at` system call relative to
//! the parent's `O_PATH` descriptor, so nothing outside the export can be reached. New
//! objects get exactly the requested permission bits (the client already applied its umask;
//! the server's umask is undone) and, when the server runs as root, the requesting owner
//! (the group of a set-group-id parent directory wins, as the kernel would choose it).
//!
//! A server that acts as its callers (`LocalOptions::act_as_callers`) creates as the
//! caller, so the kernel makes the caller the owner and gives nothing away.
//!
//! Creation and ownership are separate steps, so every object is made with no permission
//! bits at all ([`CREATE_PERM`]), then given to its owner, and only then given its mode: in
//! between it belongs to the server's user (root) but nobody else can open, execute or
//! write it, and it never carries set-id bits for the wrong owner.

use std::os::fd::{AsRawFd, OwnedFd};

use hoardfs_proto::{Entry, FileKind, Handle, Owner, RENAME_EXCHANGE, RENAME_NOREPLACE, WireError};

use super::handles::Node;
use super::{LocalOrigin, check_name, sys, sys_write, werr, wire_error};
use crate::{OriginError, Result};

/// Permission bits every new object is created with, before [`LocalOrigin::adopt`] gives
/// it its owner and then its mode: none.
const CREATE_PERM: u32 = 0;

/// Maps an error of `rename`/`link`, where `EXDEV` means "different file systems".
fn werr_xdev(e: std::io::Error) -> OriginError {
    if e.raw_os_error() == Some(libc::EXDEV) {
        WireError::CrossDevice.into()
    } else {
        OriginError::Fs(wire_error(&e))
    }
}

/// `O_PATH | O_NOFOLLOW` descriptor of `dir/name`.
fn open_path(dir: &Node, name: &std::ffi::CStr) -> std::io::Result<OwnedFd> {
    sys::openat_beneath(dir.fd.as_raw_fd(), name, libc::O_PATH | libc::O_NOFOLLOW)
}

#[cfg(test)]
thread_local! {
    /// `stat` of each object this thread created, taken as [`LocalOrigin::adopt`] starts:
    /// what others could see of it before it has its owner and mode.
    pub(super) static BEFORE_ADOPT: std::cell::RefCell<Vec<libc::stat>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

impl LocalOrigin {
    /// [`crate::Origin::create`]: `O_CREAT | O_EXCL` first, so the origin knows whether it
    /// created the file (only then are owner and mode applied); a non-exclusive create of an
    /// existing name returns the existing object.
    pub(super) fn create_file(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> Result<Entry> {
        self.check_writable()?;
        let name = check_name(name)?;
        let dir = self.dir_node(parent)?;
        let perm = mode & 0o7777;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_NOFOLLOW;
        loop {
            match sys::openat_beneath_mode(dir.fd.as_raw_fd(), &name, flags, CREATE_PERM) {
                Ok(rw) => {
                    let path = sys::reopen(self.proc_fd.as_raw_fd(), rw.as_raw_fd(), libc::O_PATH)
                        .map_err(werr)?;
                    let entry = self.adopt(&dir, &name, path.into(), owner, Some(perm))?;
                    // The first write will not need to reopen the file.
                    let by = super::creds::acting();
                    let (_, evicted) = self.wfiles.insert_evicting(entry.handle.id, rw.into(), by);
                    self.sync_evicted(evicted);
                    return Ok(entry);
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) && !exclusive => {
                    match open_path(&dir, &name) {
                        Ok(fd) => {
                            let st = sys::fstat(fd.as_raw_fd()).map_err(werr)?;
                            return match sys::kind_of(st.st_mode) {
                                FileKind::Dir => Err(WireError::IsDir.into()),
                                FileKind::Symlink => Err(WireError::Loop.into()),
                                _ => self.register(fd, &st),
                            };
                        }
                        // Removed in between: try to create it again.
                        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                        Err(e) => return Err(werr(e)),
                    }
                }
                Err(e) => return Err(werr(e)),
            }
        }
    }

    /// [`crate::Origin::mknod`]: fifos, sockets, devices and regular files.
    pub(super) fn make_node(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> Result<Entry> {
        self.check_writable()?;
        let name = check_name(name)?;
        let dir = self.dir_node(parent)?;
        let kind = match mode & libc::S_IFMT {
            0 => libc::S_IFREG,
            k
            @ (libc::S_IFREG | libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK) => k,
            _ => return Err(WireError::Invalid.into()),
        };
        let perm = mode & 0o7777;
        sys_write::mknodat(dir.fd.as_raw_fd(), &name, kind | CREATE_PERM, rdev).map_err(werr)?;
        let fd = open_path(&dir, &name).map_err(werr)?;
        self.adopt(&dir, &name, fd, owner, Some(perm))
    }

    /// [`crate::Origin::mkdir`].
    pub(super) fn make_dir(
        &self,
        parent: Handle,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> Result<Entry> {
        self.check_writable()?;
        let name = check_name(name)?;
        let dir = self.dir_node(parent)?;
        let perm = mode & 0o7777;
        sys_write::mkdirat(dir.fd.as_raw_fd(), &name, CREATE_PERM).map_err(werr)?;
        let fd = sys::openat_beneath(
            dir.fd.as_raw_fd(),
            &name,
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_DIRECTORY,
        )
        .map_err(werr)?;
        self.adopt(&dir, &name, fd, owner, Some(perm))
    }

    /// [`crate::Origin::symlink`]: the target is stored as given, never resolved.
    pub(super) fn make_symlink(
        &self,
        parent: Handle,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> Result<Entry> {
        self.check_writable()?;
        let name = check_name(name)?;
        let target = std::ffi::CString::new(target).map_err(|_| WireError::Invalid)?;
        let dir = self.dir_node(parent)?;
        sys_write::symlinkat(&target, dir.fd.as_raw_fd(), &name).map_err(werr)?;
        let fd = open_path(&dir, &name).map_err(werr)?;
        self.adopt(&dir, &name, fd, owner, None)
    }

    /// [`crate::Origin::link`]: links the object the handle pins (not whatever its old name
    /// names now); directories cannot be linked.
    pub(super) fn make_link(&self, handle: Handle, parent: Handle, name: &[u8]) -> Result<Entry> {
        self.check_writable()?;
        let name = check_name(name)?;
        let node = self.handles.get(handle)?;
        if node.kind == FileKind::Dir {
            return Err(WireError::NotPermitted.into());
        }
        let dir = self.dir_node(parent)?;
        sys_write::link_fd(node.fd.as_raw_fd(), dir.fd.as_raw_fd(), &name).map_err(werr_xdev)?;
        let fd = open_path(&dir, &name).map_err(werr)?;
        let st = sys::fstat(fd.as_raw_fd()).map_err(werr)?;
        self.register(fd, &st)
    }

    /// [`crate::Origin::unlink`] (`dir` false) and [`crate::Origin::rmdir`] (`dir` true).
    /// Handles of the removed object stay usable while the table holds them.
    pub(super) fn remove(&self, parent: Handle, name: &[u8], dir: bool) -> Result<()> {
        self.check_writable()?;
        let name = check_name(name)?;
        let parent = self.dir_node(parent)?;
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        let victim = sys::fstatat(parent.fd.as_raw_fd(), &name).ok();
        sys_write::unlinkat(parent.fd.as_raw_fd(), &name, flags).map_err(werr)?;
        if let Some(v) = victim {
            self.release_if_deleted(&v);
        }
        Ok(())
    }

    /// After a name of `victim` went away: if that was its last link, closes every
    /// descriptor the export holds on it (handle, cached open files), so that its disk
    /// space is freed now rather than when the caches expire. Later requests naming it get
    /// `Stale`.
    fn release_if_deleted(&self, victim: &libc::stat) {
        if victim.st_nlink > 1 && victim.st_mode & libc::S_IFMT != libc::S_IFDIR {
            return;
        }
        if let Some(id) = self.handles.remove(&(victim.st_dev, victim.st_ino)) {
            self.files.remove(id);
            self.wfiles.remove(id);
        }
    }

    /// [`crate::Origin::rename`] with `renameat2` semantics.
    pub(super) fn rename_entry(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.check_writable()?;
        let name = check_name(name)?;
        let new_name = check_name(new_name)?;
        let both = RENAME_NOREPLACE | RENAME_EXCHANGE;
        if flags & !both != 0 || flags == both {
            return Err(WireError::Invalid.into());
        }
        let from = self.dir_node(parent)?;
        let to = self.dir_node(new_parent)?;
        let replaced = if flags & RENAME_EXCHANGE == 0 {
            sys::fstatat(to.fd.as_raw_fd(), &new_name).ok()
        } else {
            None
        };
        sys_write::renameat2(
            from.fd.as_raw_fd(),
            &name,
            to.fd.as_raw_fd(),
            &new_name,
            flags,
        )
        .map_err(werr_xdev)?;
        if let Some(v) = replaced
            && let Ok(moved) = sys::fstatat(to.fd.as_raw_fd(), &new_name)
            && (moved.st_dev, moved.st_ino) != (v.st_dev, v.st_ino)
        {
            self.release_if_deleted(&v);
        }
        Ok(())
    }

    /// Finishes a new object `dir/name` open (`O_PATH`) at `fd`, made with [`CREATE_PERM`]:
    /// gives it to `owner` when running as root, then sets the exact permission bits `perm`
    /// (none for symlinks) and registers it. If that fails, the object is removed again and
    /// the error returned.
    fn adopt(
        &self,
        dir: &Node,
        name: &std::ffi::CStr,
        fd: OwnedFd,
        owner: Owner,
        perm: Option<u32>,
    ) -> Result<Entry> {
        #[cfg(test)]
        if let Ok(st) = sys::fstat(fd.as_raw_fd()) {
            BEFORE_ADOPT.with(|v| v.borrow_mut().push(st));
        }
        match self.apply_owner_and_mode(dir, &fd, owner, perm) {
            Ok(st) => self.register(fd, &st),
            Err(e) => {
                // Remove the half-made object, unless its name was taken over meanwhile.
                if let (Ok(st), Ok(now)) = (
                    sys::fstat(fd.as_raw_fd()),
                    sys::fstatat(dir.fd.as_raw_fd(), name),
                ) && (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)
                {
                    let flags = if sys::kind_of(st.st_mode) == FileKind::Dir {
                        libc::AT_REMOVEDIR
                    } else {
                        0
                    };
                    let _ = sys_write::unlinkat(dir.fd.as_raw_fd(), name, flags);
                }
                tracing::warn!(error = %e, "could not set owner or mode of a new object");
                Err(werr(e))
            }
        }
    }

    /// The ownership and mode part of [`LocalOrigin::adopt`], in that order (the mode may
    /// hold set-id bits meant for the new owner only); returns the final `stat`.
    fn apply_owner_and_mode(
        &self,
        dir: &Node,
        fd: &OwnedFd,
        owner: Owner,
        perm: Option<u32>,
    ) -> std::io::Result<libc::stat> {
        let mut st = sys::fstat(fd.as_raw_fd())?;
        let parent = sys::fstat(dir.fd.as_raw_fd())?;
        let parent_sgid = parent.st_mode & libc::S_ISGID != 0;
        let mut changed = false;
        // A server acting as its callers made the object as the caller already (with the
        // group a set-group-id parent gives): the kernel chose its owner.
        if sys_write::is_root() && !self.opts.act_as_callers {
            let gid = if parent_sgid {
                parent.st_gid
            } else {
                owner.gid
            };
            if st.st_uid != owner.uid || st.st_gid != gid {
                sys_write::fchown(fd.as_raw_fd(), Some(owner.uid), Some(gid))?;
                changed = true;
            }
        }
        if let Some(perm) = perm {
            // A new directory in a set-group-id directory keeps the bit the kernel gave it
            // (chown leaves it on directories).
            if changed {
                st = sys::fstat(fd.as_raw_fd())?;
            }
            let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
            let want = if is_dir && parent_sgid {
                perm | libc::S_ISGID
            } else {
                perm
            };
            if st.st_mode & 0o7777 != want {
                sys_write::fchmod(self.proc_fd.as_raw_fd(), fd.as_raw_fd(), want)?;
                changed = true;
            }
        }
        if changed {
            st = sys::fstat(fd.as_raw_fd())?;
        }
        Ok(st)
    }
}
