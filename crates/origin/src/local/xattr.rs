//! Extended attributes of the local export. Only the `user.` namespace is exported: other
//! names read as absent (`NoData`), cannot be set or removed (`NotPermitted`) and are left
//! out of listings, so `security.`, `trusted.` and `system.` attributes of the server's
//! files (SELinux labels, ACLs, capabilities) never cross the wire.
//!
//! The calls go through the `/proc/self/fd/N` path of the handle's `O_PATH` descriptor,
//! which the kernel follows to the object itself. Symlinks have no user attributes.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::AsRawFd;

use hoardfs_proto::{FileKind, Handle, WireError};

use super::{LocalOrigin, sys, werr};
use crate::Result;

const PREFIX: &[u8] = b"user.";

/// Whether `name` is in the exported (`user.`) namespace.
fn exported(name: &[u8]) -> bool {
    name.starts_with(PREFIX)
}

/// Converts a wire attribute name (no NUL) to a C string.
fn c_name(name: &[u8]) -> Result<CString> {
    CString::new(name).map_err(|_| WireError::Invalid.into())
}

/// Calls `f(buf)` (a `getxattr`/`listxattr`-style call returning a length or -1) first with
/// an empty buffer to learn the size, then with a buffer of that size; retries if the value
/// grew in between.
fn sized_call(mut f: impl FnMut(&mut [u8]) -> isize) -> io::Result<Vec<u8>> {
    for _ in 0..8 {
        let n = f(&mut []);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; n as usize];
        if buf.is_empty() {
            return Ok(buf);
        }
        let m = f(&mut buf);
        if m >= 0 {
            buf.truncate(m as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::ERANGE))
}

fn getxattr(path: &CStr, name: &CStr) -> io::Result<Vec<u8>> {
    sized_call(|buf| {
        // SAFETY: valid C strings; the buffer is valid for its length (0 asks for the size).
        unsafe {
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
            )
        }
    })
}

fn listxattr(path: &CStr) -> io::Result<Vec<u8>> {
    sized_call(|buf| {
        // SAFETY: valid C string; the buffer is valid for its length.
        unsafe { libc::listxattr(path.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }
    })
}

impl LocalOrigin {
    /// `/proc/self/fd/N` of the node `h` names, and its kind.
    fn xattr_target(&self, h: Handle) -> Result<(CString, FileKind, std::sync::Arc<super::Node>)> {
        let node = self.handles.get(h)?;
        Ok((sys::fd_path(node.fd.as_raw_fd()), node.kind, node))
    }

    /// [`crate::Origin::getxattr`].
    pub(super) fn get_xattr(&self, handle: Handle, name: &[u8]) -> Result<Vec<u8>> {
        let (path, kind, _node) = self.xattr_target(handle)?;
        let name = c_name(name)?;
        if !exported(name.as_bytes()) || kind == FileKind::Symlink {
            return Err(WireError::NoData.into());
        }
        getxattr(&path, &name).map_err(werr)
    }

    /// [`crate::Origin::listxattr`]: the `user.` names, each followed by a NUL.
    pub(super) fn list_xattr(&self, handle: Handle) -> Result<Vec<u8>> {
        let (path, kind, _node) = self.xattr_target(handle)?;
        if kind == FileKind::Symlink {
            return Ok(Vec::new());
        }
        let all = listxattr(&path).map_err(werr)?;
        let mut out = Vec::with_capacity(all.len());
        for name in all.split(|&b| b == 0).filter(|n| exported(n)) {
            out.extend_from_slice(name);
            out.push(0);
        }
        Ok(out)
    }

    /// [`crate::Origin::setxattr`] (`flags`: 1 = `XATTR_CREATE`, 2 = `XATTR_REPLACE`).
    pub(super) fn set_xattr(
        &self,
        handle: Handle,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.check_writable()?;
        let (path, kind, _node) = self.xattr_target(handle)?;
        let name = c_name(name)?;
        if !exported(name.as_bytes()) || kind == FileKind::Symlink {
            return Err(WireError::NotPermitted.into());
        }
        let flags = match flags {
            0 => 0,
            1 => libc::XATTR_CREATE,
            2 => libc::XATTR_REPLACE,
            _ => return Err(WireError::Invalid.into()),
        };
        // SAFETY: valid C strings; the value is valid for its length.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        };
        if rc < 0 {
            return Err(werr(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// [`crate::Origin::removexattr`].
    pub(super) fn remove_xattr(&self, handle: Handle, name: &[u8]) -> Result<()> {
        self.check_writable()?;
        let (path, kind, _node) = self.xattr_target(handle)?;
        let name = c_name(name)?;
        if !exported(name.as_bytes()) || kind == FileKind::Symlink {
            return Err(WireError::NotPermitted.into());
        }
        // SAFETY: valid C strings.
        if unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) } < 0 {
            return Err(werr(io::Error::last_os_error()));
        }
        Ok(())
    }
}
