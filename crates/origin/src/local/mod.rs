//! [`LocalOrigin`]: a directory on this machine exported as an [`Origin`].
//!
//! Used directly by `hoardfs mount /abs/path` (caching an NFS/SMB/sshfs mount or any local
//! tree) and, behind the network front in `hoardfs-server`, by `hoardfs serve`.
//!
//! Confinement is enforced by the kernel, not by string checks: every name is resolved with
//! `openat2(RESOLVE_BENEATH)` relative to its parent's descriptor and never follows symlinks
//! (symlinks are returned as objects; their targets are only read, never resolved here).

mod files;
mod handles;
pub mod sys;

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hoardfs_proto::{Attr, DirEntry, Entry, FileKind, Handle, ServerCounters, StatFs, WireError};

use crate::{DirPage, Origin, OriginInfo, ReadReply, Result};
use files::OpenFiles;
use handles::{HandleTable, Node, ROOT_ID};

/// Tunables of a local export.
#[derive(Debug, Clone)]
pub struct LocalOptions {
    /// Refuse modifications.
    pub read_only: bool,
    /// Most handles remembered at once.
    pub max_handles: usize,
    /// Most files kept open for reading.
    pub max_open_files: usize,
    /// Close a cached open file after this long without reads.
    pub open_file_idle: Duration,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            read_only: true,
            max_handles: 500_000,
            max_open_files: 4096,
            open_file_idle: Duration::from_secs(60),
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
    handles: HandleTable,
    files: OpenFiles,
    proc_fd: OwnedFd,
    reads: AtomicU64,
    bytes_read: AtomicU64,
    opens: AtomicU64,
}

/// Maps an OS error to the wire's typed error set.
pub fn wire_error(e: &io::Error) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => WireError::NotFound,
        Some(libc::EACCES | libc::EPERM) => WireError::Access,
        Some(libc::ENOTDIR) => WireError::NotDir,
        Some(libc::EISDIR) => WireError::IsDir,
        Some(libc::ENAMETOOLONG) => WireError::NameTooLong,
        Some(libc::ELOOP) => WireError::Loop,
        // openat2 answers EXDEV when a resolution would escape the export.
        Some(libc::EXDEV) => WireError::Access,
        Some(libc::EROFS) => WireError::ReadOnly,
        Some(libc::ENOSPC | libc::EDQUOT) => WireError::NoSpace,
        Some(libc::ESTALE) => WireError::Stale,
        Some(libc::EINVAL) => WireError::Invalid,
        Some(libc::EOPNOTSUPP | libc::ENOSYS) => WireError::Unsupported,
        _ => WireError::Io,
    }
}

fn werr(e: io::Error) -> crate::OriginError {
    crate::OriginError::Fs(wire_error(&e))
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
        let node = Node {
            fd,
            kind: FileKind::Dir,
            dev: st.st_dev,
            ino: st.st_ino,
        };
        let epoch = rand::random::<u64>() | 1;
        Ok(LocalOrigin {
            root_path,
            root_dev: st.st_dev,
            export_id,
            handles: HandleTable::new(epoch, opts.max_handles, node),
            files: OpenFiles::new(opts.max_open_files, opts.open_file_idle),
            proc_fd: sys::open_proc_self_fd()?,
            opts,
            reads: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            opens: AtomicU64::new(0),
        })
    }

    /// The exported directory.
    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    /// Read-side counters (reads, bytes_read, opens); connection counters stay zero.
    pub fn counters(&self) -> ServerCounters {
        ServerCounters {
            reads: self.reads.load(Ordering::Relaxed),
            bytes_read: self.bytes_read.load(Ordering::Relaxed),
            opens: self.opens.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// A stable file id: the inode number, mixed with the device for objects on other file
    /// systems mounted inside the export.
    fn file_id(&self, st: &libc::stat) -> u64 {
        if st.st_dev == self.root_dev {
            st.st_ino
        } else {
            st.st_ino ^ st.st_dev.rotate_left(40)
        }
    }

    fn live_stat(&self, node: &Node) -> Result<libc::stat> {
        let st = sys::fstat(node.fd.as_raw_fd()).map_err(werr)?;
        if st.st_nlink == 0 {
            return Err(WireError::Stale.into());
        }
        Ok(st)
    }

    fn root_handle(&self) -> Handle {
        Handle {
            epoch: self.handles.epoch(),
            id: ROOT_ID,
        }
    }

    /// Opens `name` under directory descriptor `dir` and registers it.
    fn open_child(&self, dir: i32, name: &CString) -> Result<Entry> {
        let fd = sys::openat_beneath(dir, name, libc::O_PATH | libc::O_NOFOLLOW).map_err(werr)?;
        let st = sys::fstat(fd.as_raw_fd()).map_err(werr)?;
        let attr = sys::attr_of(&st, self.file_id(&st));
        let handle = self.handles.insert(Node {
            fd,
            kind: attr.kind,
            dev: st.st_dev,
            ino: st.st_ino,
        });
        Ok(Entry { handle, attr })
    }

    fn open_file(&self, id: u64, node: &Node) -> Result<Arc<File>> {
        if let Some(f) = self.files.get(id) {
            return Ok(f);
        }
        let f = sys::reopen_read(self.proc_fd.as_raw_fd(), node.fd.as_raw_fd()).map_err(werr)?;
        self.opens.fetch_add(1, Ordering::Relaxed);
        Ok(self.files.insert(id, f))
    }
}

impl Origin for LocalOrigin {
    fn info(&self) -> Result<OriginInfo> {
        Ok(OriginInfo {
            export_id: self.export_id,
            root: Entry {
                handle: self.root_handle(),
                attr: self.getattr(self.root_handle())?,
            },
            read_only: self.opts.read_only,
        })
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        let name = check_name(name)?;
        let dir = self.handles.get(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        self.open_child(dir.fd.as_raw_fd(), &name)
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        let node = self.handles.get(handle)?;
        let st = self.live_stat(&node)?;
        Ok(sys::attr_of(&st, self.file_id(&st)))
    }

    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        let node = self.handles.get(dir)?;
        if node.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        self.live_stat(&node)?;
        let mut stream = sys::DirStream::open(node.fd.as_raw_fd()).map_err(werr)?;
        if cookie != 0 {
            stream.seek(cookie);
        }
        let max = max_entries.clamp(1, 4096) as usize;
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
        let node = self.handles.get(handle)?;
        match node.kind {
            FileKind::File => {}
            FileKind::Dir => return Err(WireError::IsDir.into()),
            _ => return Err(WireError::Invalid.into()),
        }
        let file = self.open_file(handle.id, &node)?;
        self.reads.fetch_add(1, Ordering::Relaxed);
        let mut data = vec![0u8; len as usize];
        // A read is labelled with the version seen before and after it; if the file changed
        // meanwhile, try again, and after three tries label it 0 ("unstable, do not cache").
        for attempt in 0..3 {
            let before = sys::fstat(file.as_raw_fd()).map_err(werr)?;
            if before.st_nlink == 0 {
                return Err(WireError::Stale.into());
            }
            let n = read_full(&file, &mut data, offset).map_err(werr)?;
            let after = sys::fstat(file.as_raw_fd()).map_err(werr)?;
            let (v0, v1) = (sys::version_of(&before), sys::version_of(&after));
            if v0 == v1 || attempt == 2 {
                data.truncate(n);
                self.bytes_read.fetch_add(n as u64, Ordering::Relaxed);
                return Ok(ReadReply {
                    data,
                    version: if v0 == v1 { v0 } else { 0 },
                });
            }
        }
        unreachable!("loop returns on its last attempt")
    }

    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        let node = self.handles.get(handle)?;
        if node.kind != FileKind::Symlink {
            return Err(WireError::Invalid.into());
        }
        sys::readlink(node.fd.as_raw_fd()).map_err(werr)
    }

    fn statfs(&self) -> Result<StatFs> {
        let root = self.handles.get(self.root_handle())?;
        sys::statvfs(root.fd.as_raw_fd()).map_err(werr)
    }
}

/// `pread` until `buf` is full or end of file; returns bytes read.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests;
