//! Data and attribute changes of the local export: `write`, `fallocate`, `setattr` and
//! `fsync`.
//!
//! Writable descriptors are kept in a second bounded [`super::files::OpenFiles`] cache,
//! opened by re-opening the handle's `O_PATH` descriptor through `/proc/self/fd`. Writes and
//! attribute changes of one file are serialised by a sharded lock ([`WriteLocks`]) so the
//! `stat` before and after a write bracket exactly that write: a client holding the data at
//! `pre_version` plus the written bytes holds the data at the reply's `attr.version`.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::OriginError;
use hoardfs_proto::{Attr, FileKind, Handle, SetAttrs, WireError};
use parking_lot::{Mutex, MutexGuard};

use super::handles::Node;
use super::{LocalOrigin, sys, sys_write, werr};
use crate::{Result, WriteReply};

const SHARDS: usize = 64;

/// Per-file write locks: 64 mutexes, a file's chosen by its device and inode numbers (so
/// two handles of one inode share it).
#[derive(Debug)]
pub struct WriteLocks {
    shards: Box<[Mutex<()>]>,
}

impl WriteLocks {
    /// A fresh set of unlocked shards.
    pub fn new() -> Self {
        WriteLocks {
            shards: (0..SHARDS).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Locks the shard of `node`'s inode.
    pub fn lock(&self, node: &Node) -> MutexGuard<'_, ()> {
        let h = (node.ino ^ node.dev.rotate_left(32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.shards[(h >> 58) as usize % SHARDS].lock()
    }
}

/// `pwrite` all of `data` at `offset`; returns the bytes written and, if it stopped early,
/// the error that stopped it.
fn write_all_at(file: &File, data: &[u8], offset: u64) -> (usize, Option<io::Error>) {
    let mut done = 0;
    while done < data.len() {
        match file.write_at(&data[done..], offset + done as u64) {
            Ok(0) => return (done, Some(io::Error::from_raw_os_error(libc::ENOSPC))),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Some(e)),
        }
    }
    (done, None)
}

impl LocalOrigin {
    /// The cached writable descriptor of regular file `node` (handle `id`), opening one if
    /// needed (`O_RDWR`, or `O_WRONLY` when the file is not readable by the server).
    fn open_writable(&self, id: u64, node: &Node) -> Result<Arc<File>> {
        if let Some((f, by)) = self.wfiles.get(id) {
            self.may_use(node, &by, libc::W_OK as u32)?;
            return Ok(f);
        }
        let proc_fd = self.proc_fd.as_raw_fd();
        let f = match sys::reopen(proc_fd, node.fd.as_raw_fd(), libc::O_RDWR) {
            Err(e) if e.raw_os_error() == Some(libc::EACCES) => {
                sys::reopen(proc_fd, node.fd.as_raw_fd(), libc::O_WRONLY)
            }
            r => r,
        }
        .map_err(werr)?;
        let (f, evicted) = self.wfiles.insert_evicting(id, f, super::creds::acting());
        self.sync_evicted(evicted);
        Ok(f)
    }

    /// Writable descriptors leave the cache only after an fsync, so that an fsync later
    /// asked for on a fresh descriptor cannot miss a write error only the old one would have
    /// seen: a failure is kept, by file, and reported by the next fsync of that file
    /// (whatever handle names it by then).
    pub(super) fn sync_evicted(&self, evicted: Vec<(u64, Arc<File>)>) {
        for (id, f) in evicted {
            if let Err(e) = sys_write::fsync(f.as_raw_fd(), true) {
                tracing::warn!(handle = id, "writeback of a closing file failed: {e}");
                match sys::fstat(f.as_raw_fd()) {
                    Ok(st) => {
                        self.write_errors.lock().insert((st.st_dev, st.st_ino));
                    }
                    Err(e) => tracing::warn!("cannot identify the failed file: {e}"),
                }
            }
        }
    }

    /// The regular file `handle` names, in a writable export (`IsDir` for a directory,
    /// `Invalid` for anything else).
    fn writable_file(&self, handle: Handle) -> Result<Arc<Node>> {
        self.check_writable()?;
        let node = self.handles.get(handle)?;
        match node.kind {
            FileKind::File => Ok(node),
            FileKind::Dir => Err(WireError::IsDir.into()),
            _ => Err(WireError::Invalid.into()),
        }
    }

    /// [`crate::Origin::write`]: regular files only, under the file's write lock.
    pub(super) fn write_data(
        &self,
        handle: Handle,
        offset: u64,
        data: &[u8],
        append: bool,
    ) -> Result<WriteReply> {
        let node = self.writable_file(handle)?;
        let len = u32::try_from(data.len()).map_err(|_| WireError::Invalid)?;
        let file = self.open_writable(handle.id, &node)?;
        node.note_io();
        let _guard = self.locks.lock(&node);
        let pre = sys::fstat(file.as_raw_fd()).map_err(werr)?;
        let offset = if append { pre.st_size as u64 } else { offset };
        if offset
            .checked_add(u64::from(len))
            .is_none_or(|end| end > i64::MAX as u64)
        {
            return Err(WireError::TooBig.into());
        }
        let (written, err) = write_all_at(&file, data, offset);
        if let Some(e) = err
            && written == 0
        {
            return Err(werr(e));
        }
        let post = self.stat_after_change(&node, &file)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(written as u64, Ordering::Relaxed);
        Ok(WriteReply {
            written: written as u32,
            offset,
            pre_version: sys::version_of(&pre),
            attr: self.attr(&post, file.as_raw_fd()),
        })
    }

    /// The file's status after a change of its content through `file`. A change stamped
    /// with a coarse time can move the mtime back to before one this server set
    /// (`outside`), to a version a client may hold for other bytes: forward again.
    fn stat_after_change(&self, node: &Node, file: &File) -> Result<libc::stat> {
        let post = sys::fstat(file.as_raw_fd()).map_err(werr)?;
        let post_ns = (post.st_mtime as i64)
            .saturating_mul(1_000_000_000)
            .saturating_add(post.st_mtime_nsec as i64);
        if node.bumped_to() == 0 || post_ns > node.bumped_to() {
            return Ok(post);
        }
        // A repair for the export (setting an explicit mtime needs the owner's or the
        // server's privilege, which the writer may not have).
        self.for_export(|| super::outside::move_mtime(node, file.as_raw_fd()))?
            .map_err(werr)?;
        sys::fstat(file.as_raw_fd()).map_err(werr)
    }

    /// [`crate::Origin::fallocate`]: `fallocate(2)` on a writable descriptor opened as the
    /// caller, under the file's write lock; returns the attributes afterwards.
    pub(super) fn allocate(
        &self,
        handle: Handle,
        offset: u64,
        length: u64,
        mode: u32,
    ) -> Result<Attr> {
        let node = self.writable_file(handle)?;
        if mode & !hoardfs_proto::FALLOC_MODES != 0 {
            return Err(WireError::Unsupported.into());
        }
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(length)) else {
            return Err(WireError::TooBig.into());
        };
        if len == 0 {
            return Err(WireError::Invalid.into());
        }
        if off.checked_add(len).is_none() {
            return Err(WireError::TooBig.into());
        }
        let file = self.open_writable(handle.id, &node)?;
        node.note_io();
        let _guard = self.locks.lock(&node);
        // SAFETY: fallocate on a descriptor we own; no memory is passed.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), mode as i32, off, len) };
        if r != 0 {
            return Err(werr(io::Error::last_os_error()));
        }
        let post = self.stat_after_change(&node, &file)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(self.attr(&post, file.as_raw_fd()))
    }

    /// [`crate::Origin::setattr`]: size, then mode, then owner, then times; returns the
    /// attributes afterwards. The mode of a symlink is `Unsupported` (Linux has none to
    /// set); its times are its own, not its target's.
    pub(super) fn set_attrs(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        self.check_writable()?;
        let node = self.handles.get(handle)?;
        let symlink = node.kind == FileKind::Symlink;
        if symlink && set.mode.is_some() {
            return Err(WireError::Unsupported.into());
        }
        let fd = node.fd.as_raw_fd();
        let proc_fd = self.proc_fd.as_raw_fd();
        let _guard = self.locks.lock(&node);
        if set.size.is_some() {
            node.note_io();
        }
        if let Some(size) = set.size {
            match node.kind {
                FileKind::File => {}
                FileKind::Dir => return Err(WireError::IsDir.into()),
                _ => return Err(WireError::Invalid.into()),
            }
            let file = self.open_writable(handle.id, &node)?;
            sys_write::ftruncate(file.as_raw_fd(), size).map_err(werr)?;
        }
        if let Some(mode) = set.mode {
            sys_write::fchmod(proc_fd, fd, mode & 0o7777).map_err(werr)?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            sys_write::fchown(fd, set.uid, set.gid).map_err(werr)?;
        }
        if (set.atime.is_some() || set.mtime.is_some()) && symlink {
            sys_write::utimens_link(fd, set.atime, set.mtime).map_err(werr)?;
        } else if set.atime.is_some() || set.mtime.is_some() {
            sys_write::utimens(proc_fd, fd, set.atime, set.mtime).map_err(werr)?;
        }
        let st = sys::fstat(fd).map_err(werr)?;
        Ok(self.attr(&st, fd))
    }

    /// [`crate::Origin::fsync`]: `fsync`/`fdatasync` of a real descriptor of the object
    /// (the cached writable or readable one, else a fresh read-only one). Symlinks and
    /// special files have nothing of their own to sync and succeed at once.
    pub(super) fn sync(&self, handle: Handle, datasync: bool) -> Result<()> {
        let node = self.handles.get(handle)?;
        if self.write_errors.lock().remove(&(node.dev, node.ino)) {
            return Err(OriginError::Fs(WireError::Io));
        }
        match node.kind {
            FileKind::File => {
                let file = match self.wfiles.get(handle.id) {
                    Some((f, _)) => f,
                    None => self.open_file(handle.id, &node)?,
                };
                sys_write::fsync(file.as_raw_fd(), datasync).map_err(werr)
            }
            FileKind::Dir => {
                let dir = sys_write::open_dir(node.fd.as_raw_fd()).map_err(werr)?;
                sys_write::fsync(dir.as_raw_fd(), datasync).map_err(werr)
            }
            _ => Ok(()),
        }
    }
}
