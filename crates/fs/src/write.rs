//! Writes, attribute changes, fsync and extended attributes.
//!
//! A write is queued behind the writer (`crate::write_behind`; `--write-back close`, the
//! default) and sent by a sender thread through [`write_through`], or, with `--write-back
//! through` (and for `O_SYNC` opens, files staged offline, a mount that believes the origin
//! gone), sent before `write()` returns, so that every error (`ENOSPC`, `EDQUOT`,
//! `EACCES`...) reaches the `write()` it belongs to. Close by the writing process and fsync
//! wait for the queued writes and report one that failed. The written bytes also land in
//! the cached object when the origin says nobody else changed the file in between (the
//! object then moves to the new version in place), so reading them back is a cache hit;
//! otherwise the object is replaced by an empty one for the new version.
//!
//! Lock ordering: as in `read`, a node's `state` lock is held across disk I/O only to
//! replace or update that node's cached object (never across origin round trips).

use hoardfs_origin::{Attr, SetAttrs, WireError};

use crate::nodes::Node;

use crate::Ino;
use crate::offline::Offline;
use crate::stats::Stats;
use std::sync::Arc;

use crate::WriteBack;
use crate::durability::Durability;
use crate::error::retried;
use crate::open_files::OpenFile;
use crate::superblock::Superblock;
use crate::write_behind::{self, Batch, WriteBehind};
use crate::{FsError, FsResult, NodeAttr};

/// Largest size a file held whole is fetched again at after a truncation, or after writes
/// its cached copy could not follow.
const REFETCH_AFTER_TRUNCATE: u64 = 64 << 20;

/// The writing side of a mount: writes (queued behind the writer, or through to the
/// origin), attribute changes, syncs and extended attributes; it owns what must be known
/// of writes after they returned (queued ones, and their durability on the server).
pub(crate) struct Writes {
    /// Writes acknowledged but not yet durable on the server.
    durability: Arc<Durability>,
    /// Writes acknowledged but not yet sent (`None`: every write goes through).
    behind: Option<WriteBehind>,
}

/// Bytes queued behind writers at most, for the whole mount.
const BEHIND_LIMIT: usize = 64 << 20;

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
    /// The writing side of the mount over `sb`: write-behind unless the configuration
    /// says through, the mount is read-only, or the origin publishes whole files at close
    /// (S3, whose writes land in a local staging file anyway).
    pub(crate) fn new(sb: &Arc<Superblock>) -> Writes {
        let durability = Arc::new(Durability::default());
        let behind = (sb.config().write_back != WriteBack::Through
            && !sb.read_only()
            && !sb.origin().publishes_on_close())
        .then(|| {
            let (sb, durability) = (Arc::downgrade(sb), durability.clone());
            let gave_up = GaveUp::default();
            let send: write_behind::Send = Arc::new(move |b: &Batch| {
                let Some(sb) = sb.upgrade() else {
                    return Err(FsError::Offline("the mount is gone".into()));
                };
                send_batch(&sb, &durability, &gave_up, b)
            });
            WriteBehind::new(send, BEHIND_LIMIT)
        });
        Writes { durability, behind }
    }

    /// The kernel forgot node `ino`: no descriptor of it is left to fsync or close.
    pub(crate) fn forget(&self, ino: Ino) {
        if let Some(b) = &self.behind {
            b.forget(ino);
        }
        self.durability.forget(ino);
    }

    /// Waits until every write queued for `ino` reached the origin (or failed: the
    /// failure is reported at the next write, close or fsync).
    /// Returns whether it had writes queued lately (see [`WriteBehind::settle`]).
    pub(crate) fn settle(&self, ino: Ino) -> bool {
        self.behind.as_ref().is_some_and(|b| b.settle(ino))
    }

    /// Settles `ino` and reports a queued write that failed (`take`: once; see
    /// [`WriteBehind::report`]).
    fn report(&self, ino: Ino, take: bool) -> FsResult<()> {
        match &self.behind {
            Some(b) => b.report(ino, take),
            None => Ok(()),
        }
    }

    /// Bytes written and not yet on the origin.
    pub(crate) fn unsent(&self) -> u64 {
        self.behind.as_ref().map_or(0, WriteBehind::unsent)
    }

    /// Sends every queued write and stops the senders (at unmount).
    pub(crate) fn stop(&self) {
        if let Some(b) = &self.behind {
            b.stop();
        }
    }

    /// Waits until every write queued before the call reached the origin (or failed).
    pub(crate) fn settle_all(&self) {
        if let Some(b) = &self.behind {
            b.settle_all();
        }
    }

    /// Process `pid` writes `data` at `offset` through open file `of`; returns the bytes
    /// written. (The writer's pid decides which close publishes the file: see
    /// [`Writes::flush`].)
    pub(crate) fn write(
        &self,
        sb: &Superblock,
        of: &Arc<OpenFile>,
        offset: u64,
        data: &[u8],
        pid: u32,
    ) -> FsResult<u32> {
        if !of.access.write {
            return Err(FsError::BadHandle);
        }
        of.wrote_from(pid);
        if let Some(b) = &self.behind {
            // Queued while the origin is there to send to, the file is not the offline
            // log's and not known to be removed elsewhere (that write fails now, ESTALE,
            // as it would through); otherwise through, after what was queued before.
            if !of.access.sync
                && sb.origin().is_connected()
                && !of.node.state.lock().is_deleted()
                && !Offline::of(sb).owns(&of.node)
                && sb.staged_change_of(&of.node).is_none()
            {
                let n = u32::try_from(data.len()).map_err(|_| FsError::BadHandle)?;
                b.queue(of, offset, data)?;
                return Ok(n);
            }
            b.report(of.node.ino, true)?;
        }
        write_through(sb, &self.durability, of, offset, data)
    }
}

/// Sends queued batch `b` through to the origin, all of it (the origin may take less
/// than it was given in one write).
fn send_batch(
    sb: &Superblock,
    durability: &Durability,
    gave_up: &GaveUp,
    b: &Batch,
) -> FsResult<()> {
    let mut done = 0;
    while done < b.data.len() {
        let rest = &b.data[done..];
        let at = b.offset + done as u64;
        let n = if b.of.access.append {
            // (Not tried twice: a write whose reply was lost may have been appended.)
            write_through(sb, durability, &b.of, at, rest)?
        } else {
            resent(sb, gave_up, || {
                retried(|| write_through(sb, durability, &b.of, at, rest))
            })?
        };
        if n == 0 {
            return Err(FsError::Protocol("the origin wrote nothing".into()));
        }
        done += n as usize;
    }
    Ok(())
}

/// How long a queued write is sent again while the origin is unreachable (a server
/// restarting, a connection lost), as an NFS client retransmits; then it fails.
const RESEND_FOR: std::time::Duration = std::time::Duration::from_secs(15);

/// When a queued write last stopped waiting for an unreachable origin: for
/// [`RESEND_FOR`] after that, others try once instead of waiting too (an unmount, or a
/// close of many files, against a server that is gone takes one wait, not one per file).
#[derive(Default)]
struct GaveUp(parking_lot::Mutex<Option<std::time::Instant>>);

/// Runs `send` (a write that may be made twice) until it is not refused for the origin
/// being unreachable, for at most [`RESEND_FOR`] (see [`GaveUp`]). (The write verifier
/// tells whether a server that came back lost what it had acknowledged: see
/// `durability`.)
fn resent(
    sb: &Superblock,
    gave_up: &GaveUp,
    mut send: impl FnMut() -> FsResult<u32>,
) -> FsResult<u32> {
    let started = std::time::Instant::now();
    let wait = match *gave_up.0.lock() {
        Some(t) if t.elapsed() < RESEND_FOR => std::time::Duration::ZERO,
        _ => RESEND_FOR,
    };
    loop {
        match send() {
            Err(FsError::Offline(why)) if started.elapsed() < wait => {
                tracing::debug!("a queued write waits for the server: {why}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                sb.origin().reconnect_now();
            }
            Err(FsError::Offline(why)) => {
                *gave_up.0.lock() = Some(std::time::Instant::now());
                return Err(FsError::Offline(why));
            }
            r => {
                if r.is_ok() {
                    *gave_up.0.lock() = None;
                }
                return r;
            }
        }
    }
}

/// Writes `data` at `offset` through open file `of` to the origin (or to the file's
/// staged copy while the origin is unreachable); returns the bytes written.
fn write_through(
    sb: &Superblock,
    durability: &Durability,
    of: &OpenFile,
    offset: u64,
    data: &[u8],
) -> FsResult<u32> {
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
        || durability.forget(node.ino),
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
    durability.wrote(node.ino, verifier, sb.verifier());
    Stats::add(&sb.stats().writes, 1);
    Stats::add(&sb.stats().bytes_written, w.written as u64);
    follow_write(sb, node, &w, written);
    sb.install_attr(node, w.attr, since);
    if append && let Some(n) = sb.notifier() {
        // The kernel guessed the offset from a size that may be stale.
        n.inval_attr(node.ino);
    }
    Ok(w.written)
}

/// The writer closed `node`: its cached object checksums what it holds whole (the last
/// chunk of a file that grew, left open while the writes came).
pub(crate) fn seal(node: &Node) {
    let object = node.state.lock().opens.object().cloned();
    if let Some(o) = object
        && let Err(e) = o.seal()
    {
        tracing::warn!(
            ino = node.ino,
            "sealing the cached copy of a written file failed: {e}"
        );
    }
}

/// Moves the node's cached object along with a write made through this client.
fn follow_write(sb: &Superblock, node: &Node, w: &hoardfs_origin::WriteReply, data: &[u8]) {
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

impl Writes {
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

    /// Allocates or deallocates space of the file open as `of` (`fallocate(2)` with
    /// `mode`) on the origin. The cached copy moves to the new version empty (the range
    /// may read as zeros now, or the file be longer) and is fetched again if it was held
    /// whole, as after a truncation. Not kept by the offline log: `Unsupported` while the
    /// file's change is staged there or the origin is unreachable, so that
    /// `posix_fallocate(3)` writes zeros instead, which the log keeps.
    pub(crate) fn fallocate(
        &self,
        sb: &Superblock,
        of: &OpenFile,
        (offset, length): (u64, u64),
        mode: u32,
    ) -> FsResult<()> {
        if !of.access.write {
            return Err(FsError::BadHandle);
        }
        let node = &of.node;
        if node.kind != hoardfs_origin::FileKind::File {
            return Err(WireError::Invalid.into());
        }
        if Offline::of(sb).owns(node)
            || sb.staged_change_of(node).is_some()
            || !sb.origin().is_connected()
        {
            return Err(WireError::Unsupported.into());
        }
        let keep_whole = !sb.origin().publishes_on_close() && self.cached_whole(sb, node);
        let (since, verifier) = (sb.callbacks().seq(), sb.verifier());
        let attr = sb
            .with_handle(node, |h| sb.origin().fallocate(h, offset, length, mode))
            .map_err(|e| match e {
                FsError::Offline(_) => WireError::Unsupported.into(),
                e => e,
            })?;
        self.durability.wrote(node.ino, verifier, sb.verifier());
        self.reset_object(sb, node, &attr);
        let size = attr.size;
        sb.install_attr(node, attr, since);
        if keep_whole
            && size <= REFETCH_AFTER_TRUNCATE
            && let Err(e) = sb.prefetch(node.ino)
        {
            tracing::debug!(
                ino = node.ino,
                "refetching a file after fallocate failed: {e}"
            );
        }
        Ok(())
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
        self.report(ino, true)?;
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
        // Close-to-open: every byte written is on the server when a close by the writing
        // process returns (whichever of its threads closes), and a write that did not get
        // there fails it. Another process closing a copy of the descriptor (a child at
        // exec) does not wait, and is told of a failure already known without taking the
        // report from the writer.
        let writer = of.closed_in_writer_process(pid);
        self.report(ino, writer)?;
        if writer {
            seal(&of.node);
        }
        if let Some(p) = Offline::of(sb).staged(&of.node) {
            // As a local file system would not, but as close-to-open promises:
            // what was written is durable (here) once close returns. (Not with
            // `--write-back=async`, whose changes leave within a second: as on a local
            // file system, `fsync` makes them durable here.)
            if Offline::of(sb).logs_first() {
                return Ok(());
            }
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
        if let Some(b) = &self.behind {
            // A failure the closes reported to copies of the writer's descriptor but the
            // writer never took: the next writer is not blamed for it.
            b.forget(ino);
        }
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
