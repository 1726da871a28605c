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

use crate::nodes::Node;

use crate::Ino;
use crate::offline::Offline;
use crate::stats::Stats;
use std::sync::Arc;

use crate::durability::Durability;
use crate::open_files::OpenFile;
use crate::superblock::Superblock;
use crate::{FsError, FsResult, NodeAttr};

/// Largest size a file held whole is fetched again at after a truncation, or after writes
/// its cached copy could not follow.
const REFETCH_AFTER_TRUNCATE: u64 = 64 << 20;

/// The writing side of a mount: writes through to the origin, attribute changes, syncs
/// and extended attributes; it owns what must be known of writes after they returned
/// (their durability on the server).
#[derive(Default)]
pub(crate) struct Writes {
    /// Writes acknowledged but not yet durable on the server.
    durability: Durability,
}

/// Where a write went: to the origin (its reply, and the break number and write verifier
/// noted before it), or to the file's staged copy (the bytes written).
enum Written {
    Origin {
        w: hoardfs_origin::WriteReply,
        since: u64,
        verifier: u64,
    },
    Staged(u32),
}

impl Writes {
    /// The kernel forgot node `ino`: no descriptor of it is left to fsync or close.
    pub(crate) fn forget(&self, ino: Ino) {
        self.durability.forget(ino);
    }

    /// Process `pid` writes `data` at `offset` through open file `of`; returns the bytes
    /// written. (The writer's pid decides which close publishes the file: see
    /// [`Writes::flush`].)
    pub(crate) fn write(
        &self,
        sb: &Superblock,
        of: &OpenFile,
        offset: u64,
        data: &[u8],
        pid: u32,
    ) -> FsResult<u32> {
        if !of.access.write {
            return Err(FsError::BadHandle);
        }
        of.wrote_from(pid);
        let node = &of.node;
        // A file changed offline stays local until reintegration sent it back; one the
        // origin cannot take now is staged (what was written so far goes back whole).
        let append = of.access.append;
        // A file removed elsewhere while open here answers `Stale` (ESTALE, as on NFS):
        // this client cannot tell it from one renamed elsewhere and then forgotten by a
        // restarted server, so it must not accept bytes that would go nowhere.
        let online = || {
            let (since, verifier) = (sb.callbacks().seq(), sb.verifier());
            sb.with_handle(node, |h| sb.origin().write(h, offset, data, append))
                .map(|w| Written::Origin { w, since, verifier })
        };
        let (w, since, verifier) = match Offline::of(sb).online_or_staged(
            node,
            false,
            online,
            |p| Ok(p.write(of, offset, data)?.map(Written::Staged)),
            || self.durability.forget(node.ino),
        )? {
            Written::Staged(n) => return Ok(n),
            Written::Origin { w, since, verifier } => (w, since, verifier),
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
        self.durability.wrote(node.ino, verifier, sb.verifier());
        Stats::add(&sb.stats().writes, 1);
        Stats::add(&sb.stats().bytes_written, w.written as u64);
        self.follow_write(sb, node, &w, written);
        sb.install_attr(node, w.attr, since);
        if append && let Some(n) = sb.notifier() {
            // The kernel guessed the offset from a size that may be stale.
            n.inval_attr(node.ino);
        }
        Ok(w.written)
    }

    /// Moves the node's cached object along with a write made through this client.
    fn follow_write(
        &self,
        sb: &Superblock,
        node: &Node,
        w: &hoardfs_origin::WriteReply,
        data: &[u8],
    ) {
        if !sb.objects().enabled() {
            return;
        }
        let mut st = node.state.lock();
        if st.opens.object().is_none() {
            // Not held now (the file's object is let go of between opens): the cache's
            // object of the version written over, if it has one, follows the write, so
            // that a complete copy stays complete.
            let before = st.origin_attr();
            if before.version == w.pre_version && before.file_id == w.attr.file_id {
                sb.objects()
                    .replace_object(&mut st, before.file_id, before.version, before.size);
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
            && !sb.origin().publishes_on_close()
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
                Stats::add(&sb.stats().cache_errors, 1);
            }
        }
        // Somebody else changed the file too (or there was no object): start an empty
        // object for the new version, holding at least what we just wrote.
        let (file_id, v, size) = (w.attr.file_id, w.attr.version, w.attr.size);
        if let Some(fresh) = sb.objects().replace_object(&mut st, file_id, v, size)
            && let Err(e) = fresh.apply_write(v, w.offset, data, v, size)
        {
            tracing::warn!("cache update after a write failed: {e}");
        }
    }

    /// Has an origin that publishes whole files (S3) publish `node`'s writes.
    pub(crate) fn publish(&self, sb: &Superblock, node: &Node) -> FsResult<()> {
        if !sb.origin().publishes_on_close()
            || sb.read_only()
            || sb.staged_change_of(node).is_some()
        {
            return Ok(());
        }
        let since = sb.callbacks().seq();
        if let Some((pre, attr)) = sb.with_handle(node, |h| sb.origin().flush(h))? {
            self.follow_publish(node, pre, &attr);
            sb.install_attr(node, attr, since);
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
    fn reset_object(&self, sb: &Superblock, node: &Node, attr: &Attr) {
        if node.state.lock().opens.object().is_some() {
            sb.objects()
                .object_for(node, attr.file_id, attr.version, attr.size);
        }
    }

    /// Changes attributes of `ino` (chmod, chown, truncate, utimens); returns the new ones
    /// and how long the kernel may cache them.
    pub(crate) fn setattr(&self, sb: &Superblock, ino: Ino, set: &SetAttrs) -> FsResult<NodeAttr> {
        sb.check_writable()?;
        let node = sb.node(ino)?;
        // A truncation (times, which the kernel may send along, follow from it).
        let truncation = set.mode.is_none() && set.uid.is_none() && set.gid.is_none();
        // An object with a change not yet sent back is the log's until then.
        let off = Offline::of(sb);
        let owned = off.owns(&node);
        if let Some(size) = set.size.filter(|_| truncation)
            && node.kind == hoardfs_origin::FileKind::File
        {
            // A truncation while the origin is unreachable is an offline change too.
            return off.online_or_staged(
                &node,
                owned,
                || self.setattr_online(sb, &node, set),
                |p| p.truncate(&node, size),
                || self.durability.forget(node.ino),
            );
        }
        if owned {
            // Permission bits and times are kept with the change (set on the origin's
            // file before the staged content reaches it, they would change its version
            // and turn this client's change into a conflict). Owners need the origin,
            // and the change first (sent by the mount's keeper, not from here: see
            // `Offline::names_sent`): the log refuses them.
            return off.logged(
                "the file's offline change is not on the server yet".into(),
                |n, why| n.setattr(&node, set, why),
            );
        }
        off.or_logged(self.setattr_online(sb, &node, set), |n, why| {
            n.setattr(&node, set, why)
        })
    }

    /// Changes attributes of `node` on the origin (a file this client holds whole is
    /// fetched again after a truncation).
    fn setattr_online(&self, sb: &Superblock, node: &Node, set: &SetAttrs) -> FsResult<NodeAttr> {
        // A file this client holds whole stays whole across a truncation (fetched again at
        // its new version: the origin does not say whether anybody else changed it in
        // between), so that it can still be read and changed offline; up to a bound.
        let keep_whole = set.size.is_some_and(|s| s <= REFETCH_AFTER_TRUNCATE)
            && node.kind == hoardfs_origin::FileKind::File
            && !sb.origin().publishes_on_close()
            && self.cached_whole(sb, node);
        let since = sb.callbacks().seq();
        let attr = sb.with_handle(node, |h| sb.origin().setattr(h, set))?;
        if node.kind == hoardfs_origin::FileKind::File {
            self.reset_object(sb, node, &attr);
        }
        let installed = sb.install_attr(node, attr, since);
        if keep_whole && let Err(e) = sb.prefetch(node.ino) {
            tracing::debug!(ino = node.ino, "refetching a truncated file failed: {e}");
        }
        Ok(installed)
    }

    /// Whether the cache holds all of `node`'s file at its current version.
    fn cached_whole(&self, sb: &Superblock, node: &Node) -> bool {
        let (attr, object) = {
            let st = node.state.lock();
            (st.origin_attr(), st.opens.object().cloned())
        };
        if let Some(o) = object {
            return o.is_complete() && o.shape().version == attr.version;
        }
        sb.objects()
            .dir_if_any()
            .and_then(|c| c.peek(&sb.objects().key(attr.file_id)))
            .is_some_and(|m| m.version == attr.version && m.is_complete())
    }

    /// Makes `ino`'s data (and with `!datasync` its metadata) durable on the origin. Fails
    /// (once) if writes to it were acknowledged by a server instance that may have lost
    /// them (module `durability`).
    pub(crate) fn fsync(&self, sb: &Superblock, ino: Ino, datasync: bool) -> FsResult<()> {
        let node = sb.node(ino)?;
        if let Some(p) = Offline::of(sb).staged(&node) {
            // Durable on this client's disk; it reaches the origin at reintegration.
            return p.sync();
        }
        // Only the server can make the writes durable, and only its verifier tells whether
        // it lost them: a mount that believes it is offline asks it now rather than failing
        // until the background reconnect comes round (a server just back from a restart).
        if !sb.origin().is_connected() {
            sb.origin().reconnect_now();
        }
        let verifier = sb.verifier();
        match sb.with_handle(&node, |h| sb.origin().fsync(h, datasync)) {
            // Deleted on the origin: nothing of it can ever be read back after a crash, as
            // with a local file without a name, so there is nothing to make durable.
            Err(FsError::Origin(WireError::Stale)) if node.state.lock().is_deleted() => {
                return Ok(());
            }
            r => r?,
        }
        self.durability
            .synced(ino, verifier, sb.verifier())
            .inspect_err(|e| tracing::error!(ino, "fsync fails: {e}"))?;
        Ok(())
    }

    /// A file descriptor of `ino` is closed by thread `pid`: see `HoardFs::flush`.
    /// Origins that publish whole files (S3) upload here when process `pid` is the one
    /// that wrote through `fh` (not a child that inherited the descriptor), and a failed
    /// upload fails the `close()`.
    pub(crate) fn flush(
        &self,
        sb: &Superblock,
        ino: Ino,
        of: Option<Arc<OpenFile>>,
        pid: u32,
    ) -> FsResult<()> {
        if let Some(of) = &of {
            // (Marked under the node's lock, as the release reads it.)
            let mut st = of.node.state.lock();
            if of.flushed_first() {
                st.opens.closing();
            }
        }
        let Some(of) = of.filter(|of| of.access.write) else {
            return Ok(());
        };
        if let Some(p) = Offline::of(sb).staged(&of.node) {
            // As a local file system would not, but as close-to-open promises:
            // what was written is durable (here) once close returns.
            return p.sync();
        }
        if of.closed_by_writer(pid) {
            self.publish(sb, &of.node)?;
            let whole_before = of.node.state.lock().take_refetch();
            if whole_before && let Err(e) = sb.prefetch(ino) {
                tracing::debug!(ino, "refetching a written file failed: {e}");
            }
        }
        if !of.has_written() {
            return Ok(());
        }
        // (Judged by the verifier this client knows: a close does not wait for a server
        // it believes unreachable. It learns of a restart at its next contact, and the
        // mount's keeper tries once a second.)
        let now = sb.verifier();
        if of.is_latest_writer(pid) {
            self.durability
                .closed(ino, now)
                .inspect_err(|e| tracing::error!(ino, "close fails: {e}"))?;
        } else {
            // Another thread or process (a child closing an inherited copy): told too,
            // but the report stays for the writer.
            self.durability.checked(ino, now)?;
        }
        Ok(())
    }

    /// The last open of `ino` for writing was released (module `durability`).
    pub(crate) fn released(&self, sb: &Superblock, ino: Ino) {
        self.durability.released(ino, sb.verifier());
    }

    /// Value of extended attribute `name`.
    pub(crate) fn getxattr(&self, sb: &Superblock, ino: Ino, name: &[u8]) -> FsResult<Vec<u8>> {
        let node = sb.node(ino)?;
        sb.with_handle(&node, |h| sb.origin().getxattr(h, name))
    }

    /// Extended attribute names, each NUL-terminated.
    pub(crate) fn listxattr(&self, sb: &Superblock, ino: Ino) -> FsResult<Vec<u8>> {
        let node = sb.node(ino)?;
        sb.with_handle(&node, |h| sb.origin().listxattr(h))
    }

    /// Sets extended attribute `name` (`flags`: 1 create only, 2 replace only).
    pub(crate) fn setxattr(
        &self,
        sb: &Superblock,
        ino: Ino,
        name: &[u8],
        value: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        sb.check_writable()?;
        let node = sb.node(ino)?;
        sb.with_handle(&node, |h| sb.origin().setxattr(h, name, value, flags))?;
        sb.expire_attr(&node);
        Ok(())
    }

    /// Removes extended attribute `name`.
    pub(crate) fn removexattr(&self, sb: &Superblock, ino: Ino, name: &[u8]) -> FsResult<()> {
        sb.check_writable()?;
        let node = sb.node(ino)?;
        sb.with_handle(&node, |h| sb.origin().removexattr(h, name))?;
        sb.expire_attr(&node);
        Ok(())
    }
}
