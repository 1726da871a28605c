//! Writes, attribute changes, fsync and extended attributes.
//!
//! Writes go through: each one reaches the origin before it returns, so nothing is lost at
//! `close()` and every error (`ENOSPC`, `EDQUOT`, `EACCES`...) reaches the writer at the
//! `write()` it belongs to. The written bytes also land in the cached object when the
//! origin says nobody else changed the file in between (the object then moves to the new
//! version in place), so reading them back is a cache hit; otherwise the object is replaced
//! by an empty one for the new version.
//!
//! Lock ordering: as in `read`, a node's `state` lock is held across disk I/O only to
//! replace or update that node's cached object (never across origin round trips).

use hoardfs_origin::{Attr, SetAttrs, WireError};

use crate::nodes::{Ino, Node};
use crate::read::FileHandle;
use crate::staged::Staged;
use crate::stats::Stats;
use crate::{FsError, FsResult, HoardFs, NodeAttr};

/// Largest size a file held whole is fetched again at after a truncation, or after writes
/// its cached copy could not follow.
const REFETCH_AFTER_TRUNCATE: u64 = 64 << 20;

impl HoardFs {
    /// Process `pid` writes `data` at `offset` through open file `fh`; returns the bytes
    /// written. (The writer's pid decides which close publishes the file: see
    /// [`HoardFs::flush`].)
    pub fn write(&self, fh: FileHandle, offset: u64, data: &[u8], pid: u32) -> FsResult<u32> {
        self.sb.check_writable()?;
        let of = self.reads.open_file(fh)?;
        if !of.access.write {
            return Err(FsError::BadHandle);
        }
        of.wrote_from(pid);
        let node = &of.node;
        // A file changed offline stays local until reintegration sent it back.
        if let Some(p) = self.sb.staged_of(node)
            && let Some(n) = p.write(&of, offset, data)?
        {
            return Ok(n);
        }
        let since = self.sb.callbacks.seq();
        let append = of.access.append;
        let verifier = self.sb.verifier();
        // A file removed elsewhere while open here answers `Stale` (ESTALE, as on NFS):
        // this client cannot tell it from one renamed elsewhere and then forgotten by a
        // restarted server, so it must not accept bytes that would go nowhere.
        let w = match self
            .sb
            .with_handle(node, |h| self.sb.origin.write(h, offset, data, append))
        {
            Err(FsError::Offline(why)) => {
                let p = Staged::start(&self.sb, node, why)?;
                return match p.write(&of, offset, data)? {
                    Some(n) => Ok(n),
                    None => Err(FsError::SentMeanwhile),
                };
            }
            r => r?,
        };
        // An origin cannot have written more than it was given (a remote one's replies
        // are checked for that, this guards any other).
        let Some(written) = data.get(..w.written as usize) else {
            return Err(FsError::Protocol(format!(
                "origin wrote {} bytes of {}",
                w.written,
                data.len()
            )));
        };
        self.durability
            .wrote(node.ino, verifier, self.sb.verifier());
        Stats::add(&self.sb.stats.writes, 1);
        Stats::add(&self.sb.stats.bytes_written, w.written as u64);
        self.follow_write(node, &w, written);
        self.sb.install_attr(node, w.attr, since);
        if append && let Some(n) = self.sb.notifier.get() {
            // The kernel guessed the offset from a size that may be stale.
            n.inval_attr(node.ino);
        }
        Ok(w.written)
    }

    /// Moves the node's cached object along with a write made through this client.
    fn follow_write(&self, node: &Node, w: &hoardfs_origin::WriteReply, data: &[u8]) {
        if !self.sb.objects.enabled() {
            return;
        }
        let mut st = node.state.lock();
        if st.opens.object().is_none() {
            // Not held now (the file's object is let go of between opens): the cache's
            // object of the version written over, if it has one, follows the write, so
            // that a complete copy stays complete.
            let before = st.origin_attr();
            if before.version == w.pre_version && before.file_id == w.attr.file_id {
                self.sb.objects.replace_object(
                    &mut st,
                    before.file_id,
                    before.version,
                    before.size,
                );
            }
        }
        let was_whole = st.opens.object().is_some_and(|o| o.is_complete());
        let followed = match st.opens.object() {
            Some(o) => o.apply_write(w.pre_version, w.offset, data, w.attr.version, w.attr.size),
            None => Ok(false),
        };
        if !matches!(followed, Ok(true))
            && was_whole
            && w.attr.size <= REFETCH_AFTER_TRUNCATE
            && !self.sb.origin.publishes_on_close()
        {
            // A copy held whole could not follow (the file grew past a chunk size, or
            // somebody else changed it too): fetched again when the writer closes it, so
            // that it stays readable offline.
            st.refetch_at_close();
        }
        match followed {
            Ok(true) => return,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("cache update after a write failed: {e}");
                Stats::add(&self.sb.stats.cache_errors, 1);
            }
        }
        // Somebody else changed the file too (or there was no object): start an empty
        // object for the new version, holding at least what we just wrote.
        let (file_id, v, size) = (w.attr.file_id, w.attr.version, w.attr.size);
        if let Some(fresh) = self.sb.objects.replace_object(&mut st, file_id, v, size)
            && let Err(e) = fresh.apply_write(v, w.offset, data, v, size)
        {
            tracing::warn!("cache update after a write failed: {e}");
        }
    }

    /// Has an origin that publishes whole files (S3) publish `node`'s writes.
    pub(crate) fn publish(&self, node: &Node) -> FsResult<()> {
        if !self.sb.origin.publishes_on_close()
            || self.sb.read_only
            || self.sb.staged_of(node).is_some()
        {
            return Ok(());
        }
        let since = self.sb.callbacks.seq();
        if let Some((pre, attr)) = self.sb.with_handle(node, |h| self.sb.origin.flush(h))? {
            self.follow_publish(node, pre, &attr);
            self.sb.install_attr(node, attr, since);
        }
        Ok(())
    }

    /// Moves the node's cached object from `pre` to `attr`'s version after the origin
    /// published the content it holds under a new version (no bytes changed).
    fn follow_publish(&self, node: &Node, pre: u64, attr: &Attr) {
        let st = node.state.lock();
        if let Some(o) = st.opens.object()
            && let Err(e) = o.apply_write(pre, attr.size, &[], attr.version, attr.size)
        {
            tracing::warn!("cache update after an upload failed: {e}");
        }
    }

    /// Moves the node's cached object (if it has one) to `attr`'s version, after a change
    /// whose effect on the content this client cannot reproduce (e.g. a truncate).
    fn reset_object(&self, node: &Node, attr: &Attr) {
        if node.state.lock().opens.object().is_some() {
            self.sb
                .objects
                .object_for(node, attr.file_id, attr.version, attr.size);
        }
    }

    /// Changes attributes of `ino` (chmod, chown, truncate, utimens); returns the new ones
    /// and how long the kernel may cache them.
    pub fn setattr(&self, ino: Ino, set: &SetAttrs) -> FsResult<NodeAttr> {
        self.sb.check_writable()?;
        let node = self.sb.node(ino)?;
        // A truncation (times, which the kernel may send along, follow from it).
        let truncation = set.mode.is_none() && set.uid.is_none() && set.gid.is_none();
        // An object with a change not yet sent back is the log's until then.
        if self.sb.pending_of(&node).is_some() {
            if let Some(size) = set.size.filter(|_| truncation)
                && node.kind == hoardfs_origin::FileKind::File
            {
                let p = match self.sb.staged_of(&node) {
                    Some(p) => p,
                    None => Staged::start(
                        &self.sb,
                        &node,
                        "its change is not on the server yet".into(),
                    )?,
                };
                if let Some(a) = p.truncate(&node, size)? {
                    return Ok(a);
                }
            }
            // Permission bits and times are kept with the change (set on the origin's
            // file before the staged content reaches it, they would change its version
            // and turn this client's change into a conflict).
            if set.size.is_none() && set.uid.is_none() && set.gid.is_none() {
                return self
                    .sb
                    .names_offline("not on the server yet".into(), |n, why| {
                        n.setattr(&node, set, why)
                    });
            }
            // Owners need the origin, and the change first (sent by the mount's keeper,
            // not from here: see `names_sent`).
            return Err(FsError::Offline(
                "the file's offline change is not on the server yet".into(),
            ));
        }
        // A file this client holds whole stays whole across a truncation (fetched again at
        // its new version: the origin does not say whether anybody else changed it in
        // between), so that it can still be read and changed offline; up to a bound.
        let keep_whole = set.size.is_some_and(|s| s <= REFETCH_AFTER_TRUNCATE)
            && node.kind == hoardfs_origin::FileKind::File
            && !self.sb.origin.publishes_on_close()
            && self.cached_whole(&node);
        let since = self.sb.callbacks.seq();
        let attr = match self
            .sb
            .with_handle(&node, |h| self.sb.origin.setattr(h, set))
        {
            // A truncation while the origin is unreachable is an offline change too.
            Err(FsError::Offline(why))
                if truncation
                    && set.size.is_some()
                    && node.kind == hoardfs_origin::FileKind::File =>
            {
                let p = Staged::start(&self.sb, &node, why)?;
                return p
                    .truncate(&node, set.size.unwrap_or(0))?
                    .ok_or(FsError::SentMeanwhile);
            }
            Err(FsError::Offline(why)) if set.size.is_none() => {
                return self
                    .sb
                    .names_offline(why, |n, why| n.setattr(&node, set, why));
            }
            r => r?,
        };
        if node.kind == hoardfs_origin::FileKind::File {
            self.reset_object(&node, &attr);
        }
        let installed = self.sb.install_attr(&node, attr, since);
        if keep_whole && let Err(e) = self.prefetch(node.ino) {
            tracing::debug!(ino, "refetching a truncated file failed: {e}");
        }
        Ok(installed)
    }

    /// Whether the cache holds all of `node`'s file at its current version.
    fn cached_whole(&self, node: &Node) -> bool {
        let (attr, object) = {
            let st = node.state.lock();
            (st.origin_attr(), st.opens.object().cloned())
        };
        if let Some(o) = object {
            return o.is_complete() && o.shape().version == attr.version;
        }
        self.sb
            .objects
            .dir_if_any()
            .and_then(|c| c.peek(&self.sb.objects.key(attr.file_id)))
            .is_some_and(|m| m.version == attr.version && m.is_complete())
    }

    /// Makes `ino`'s data (and with `!datasync` its metadata) durable on the origin. Fails
    /// (once) if writes to it were acknowledged by a server instance that may have lost
    /// them (module `durability`).
    pub fn fsync(&self, ino: Ino, datasync: bool) -> FsResult<()> {
        let node = self.sb.node(ino)?;
        if let Some(p) = self.sb.staged_of(&node) {
            // Durable on this client's disk; it reaches the origin at reintegration.
            return p.sync();
        }
        let verifier = self.sb.verifier();
        match self
            .sb
            .with_handle(&node, |h| self.sb.origin.fsync(h, datasync))
        {
            // Deleted on the origin: nothing of it can ever be read back after a crash, as
            // with a local file without a name, so there is nothing to make durable.
            Err(FsError::Origin(WireError::Stale)) if node.state.lock().is_deleted() => {
                return Ok(());
            }
            r => r?,
        }
        self.durability
            .synced(ino, verifier, self.sb.verifier())
            .inspect_err(|e| tracing::error!(ino, "fsync fails: {e}"))?;
        Ok(())
    }

    /// A file descriptor of `ino` is closed: fails if writes to it may have been lost
    /// (they are not synced here; close-to-open needs only that they reached the server).
    /// Origins that publish whole files (S3) upload here when process `pid` is the one
    /// that wrote through `fh` (not a child that inherited the descriptor), and a failed
    /// upload fails the `close()`.
    pub fn flush(&self, ino: Ino, fh: FileHandle, pid: u32) -> FsResult<()> {
        let of = self.reads.open_file(fh).ok();
        if let Some(of) = &of {
            // (Marked under the node's lock, as the release reads it.)
            let mut st = of.node.state.lock();
            if of.flushed_first() {
                st.opens.closing();
            }
        }
        if let Some(of) = of.filter(|of| of.access.write) {
            if let Some(p) = self.sb.staged_of(&of.node) {
                // As a local file system would not, but as close-to-open promises:
                // what was written is durable (here) once close returns.
                return p.sync();
            }
            if of.closed_by_writer(pid) {
                self.publish(&of.node)?;
                let refetch = of.node.state.lock().take_refetch();
                if refetch && let Err(e) = self.prefetch(ino) {
                    tracing::debug!(ino, "refetching a written file failed: {e}");
                }
            }
        }
        self.durability
            .closed(ino, self.sb.verifier())
            .inspect_err(|e| tracing::error!(ino, "close fails: {e}"))?;
        Ok(())
    }

    /// Value of extended attribute `name`.
    pub fn getxattr(&self, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        let node = self.sb.node(ino)?;
        self.sb
            .with_handle(&node, |h| self.sb.origin.getxattr(h, name))
    }

    /// Extended attribute names, each NUL-terminated.
    pub fn listxattr(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let node = self.sb.node(ino)?;
        self.sb.with_handle(&node, |h| self.sb.origin.listxattr(h))
    }

    /// Sets extended attribute `name` (`flags`: 1 create only, 2 replace only).
    pub fn setxattr(&self, ino: Ino, name: &[u8], value: &[u8], flags: u32) -> FsResult<()> {
        self.sb.check_writable()?;
        let node = self.sb.node(ino)?;
        self.sb
            .with_handle(&node, |h| self.sb.origin.setxattr(h, name, value, flags))?;
        self.sb.expire_attr(&node);
        Ok(())
    }

    /// Removes extended attribute `name`.
    pub fn removexattr(&self, ino: Ino, name: &[u8]) -> FsResult<()> {
        self.sb.check_writable()?;
        let node = self.sb.node(ino)?;
        self.sb
            .with_handle(&node, |h| self.sb.origin.removexattr(h, name))?;
        self.sb.expire_attr(&node);
        Ok(())
    }
}
