//! Writes while the origin is unreachable (`--offline-writes`).
//!
//! When a write or truncation of a regular file fails because the origin is unreachable,
//! and the file's cached copy is complete, the change is kept in the client modify log
//! ([`crate::cml`]) instead: the file is staged (a copy of its cached bytes) and the change
//! applies to the staging file. From then on, until the change is sent back
//! (`crate::reintegrate`), every write, truncation, read, open and `stat` of that file is
//! served from the staging file, whether or not the origin is back, so the file's changes
//! reach the origin in order and whole. `fsync` and the writer's close make the staged
//! bytes durable on this disk. A file not completely cached cannot be changed offline
//! (`EIO`, with a warning naming the file): the client does not have its bytes.
//!
//! Regular files can also be created (in a directory listed while connected: a node
//! with an id of this client's own, an empty staging file, a `Create` record) and removed
//! (a `Remove` record, replacing a pending change of the file's content; removing a file
//! created offline cancels it). A file created offline can be renamed to a free name, or
//! over a file of the origin, whose content it then becomes (an editor's save).
//! Directories, other renames, links, permissions and times still need the origin (`EIO`
//! while it is unreachable).
//!
//! The [`OfflineWrites`] value owns the log; the `HoardFs` methods here route the
//! operations of files with a pending change to it.

use std::sync::Arc;

use hoardfs_proto::buffers::Recycled;

use crate::cml::{ChangeLog, Pending};
use crate::nodes::Node;
use crate::open_files::OpenFile;
use crate::read::{ModeKind, OpenMode, Opened};
use crate::stats::Stats;
use crate::{Access, FsError, FsResult, HoardFs, NodeAttr, Shared};

/// The offline-writes state of a mount: the log and the name conflicts are kept under.
pub(crate) struct OfflineWrites {
    pub(crate) log: ChangeLog,
    /// This client's host name, in conflict copies' names.
    pub(crate) host: String,
    /// Whether new changes are kept (`--offline-writes`), or only an earlier mount's are
    /// sent back.
    keep_new: bool,
}

impl OfflineWrites {
    /// Whether new changes are kept (`--offline-writes`).
    pub(crate) fn keeps_new(&self) -> bool {
        self.keep_new
    }

    /// The log of export `export_id` under `config.offline_log`: opened when offline
    /// writes are on, or when an earlier mount left changes in it (they are sent back
    /// whatever this mount's options; new ones are then not kept).
    pub(crate) fn open(config: &crate::FsConfig, export_id: u128) -> FsResult<Option<Self>> {
        let Some(base) = &config.offline_log else {
            return Ok(None);
        };
        let dir = base.join(format!("{export_id:032x}"));
        let left = std::fs::read_dir(&dir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".rec")))
        });
        if !config.offline_writes && !left {
            return Ok(None);
        }
        let log = ChangeLog::open(&dir).map_err(kept)?;
        if !config.offline_writes {
            tracing::warn!(
                "{} change(s) made offline by an earlier mount are sent back to the server; \
                 new ones are not kept (mount with --offline-writes for that)",
                log.stats().files
            );
        }
        Ok(Some(OfflineWrites {
            log,
            host: config.host.clone(),
            keep_new: config.offline_writes,
        }))
    }
}

/// A local I/O error of the offline change log as the fs reports it.
pub(crate) fn kept(e: std::io::Error) -> FsError {
    FsError::OfflineChange(Shared::new(e))
}

impl HoardFs {
    /// The pending change of `node`'s file, if offline writes are on and it has one.
    pub(crate) fn pending_of(&self, node: &Node) -> Option<Arc<Pending>> {
        let off = self.offline.as_ref()?;
        // Every file with a content change in the log carries it as its local change (a
        // removal's node is gone from the names): the log is looked at only for those,
        // not on every read and write.
        let file_id = {
            let st = node.state.lock();
            if !st.is_local() {
                return None;
            }
            st.attr().file_id
        };
        off.log.get(file_id)
    }

    /// Starts a pending change of `node`'s file (the origin just failed with `why`):
    /// the file's complete cached copy becomes its staging file. Without offline writes,
    /// or without a complete copy, the change fails as the origin did.
    pub(crate) fn stage(&self, node: &Node, why: String) -> FsResult<Arc<Pending>> {
        let Some(off) = self.offline.as_ref().filter(|o| o.keep_new) else {
            return Err(FsError::Offline(why));
        };
        let (attr, object) = {
            let st = node.state.lock();
            (st.attr(), st.opens.object().cloned())
        };
        let complete = object
            .as_ref()
            .filter(|o| o.is_complete() && o.shape().version == attr.version);
        let (Some(object), Some(path)) = (complete, self.components_of(node.ino)) else {
            tracing::warn!(
                ino = node.ino,
                object = object.is_some(),
                complete = object.as_ref().is_some_and(|o| o.is_complete()),
                version = object
                    .as_ref()
                    .is_some_and(|o| o.shape().version == attr.version),
                "cannot change a file offline that is not completely cached \
                 (hoardfs prefetch or pin it while connected)"
            );
            return Err(FsError::Offline(why));
        };
        let p = off.log.stage(path, &attr, object).map_err(kept)?;
        let local = p.lock().local();
        self.nodes.set_local(attr.file_id, Some(local));
        // Pages cached from the origin's version are the staged content's too, but its
        // size and times change from here on.
        if let Some(n) = self.notifier.get() {
            n.inval_attr(node.ino);
        }
        tracing::info!(
            ino = node.ino,
            "the server is unreachable: this file's changes are kept locally until it is back"
        );
        Ok(p)
    }

    /// Writes `data` at `offset` (or at the end, for `O_APPEND` opens) of the staged
    /// content of `of`'s file. `None`: the change was sent back meanwhile (the caller
    /// writes through the origin instead).
    pub(crate) fn write_pending(
        &self,
        of: &OpenFile,
        p: &Pending,
        offset: u64,
        data: &[u8],
    ) -> FsResult<Option<u32>> {
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let offset = if of.access.append {
            g.local().size
        } else {
            offset
        };
        g.write(offset, data).map_err(kept)?;
        p.note_size(&g);
        let local = g.local();
        drop(g);
        self.nodes.set_local(p.file_id, Some(local));
        Stats::add(&self.stats.writes, 1);
        Stats::add(&self.stats.bytes_written, data.len() as u64);
        if of.access.append
            && let Some(n) = self.notifier.get()
        {
            n.inval_attr(of.node.ino);
        }
        Ok(Some(data.len() as u32))
    }

    /// Sets the size of the staged content of `node`'s file; `None` if it was sent back
    /// meanwhile.
    pub(crate) fn truncate_pending(
        &self,
        node: &Node,
        p: &Pending,
        size: u64,
    ) -> FsResult<Option<NodeAttr>> {
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        g.truncate(size).map_err(kept)?;
        p.note_size(&g);
        let local = g.local();
        drop(g);
        self.nodes.set_local(p.file_id, Some(local));
        let st = node.state.lock();
        Ok(Some(NodeAttr {
            attr: st.attr(),
            ttl: st.kernel_ttl(&self.config),
        }))
    }

    /// Makes the staged content of a pending file durable (`fsync`, and the writer's
    /// close).
    pub(crate) fn sync_pending(&self, p: &Pending) -> FsResult<()> {
        let g = p.lock();
        if g.is_gone() {
            return Ok(());
        }
        g.sync().map_err(kept)
    }

    /// Opens a file with a pending change: daemon reads without the page cache, served
    /// from the staging file (no cached object is involved).
    pub(crate) fn open_pending(&self, node: Arc<Node>, access: Access) -> Opened {
        {
            // The kernel refuses a non-passthrough open of an inode open in passthrough:
            // wait a little for those opens to end, as any other daemon open does.
            let mut st = node.state.lock();
            self.drain_passthrough(&node, &mut st, None);
            st.opens.admit_direct();
        }
        let fh = self
            .files
            .insert(OpenFile::new(node, ModeKind::Direct, access, None));
        Opened {
            fh,
            mode: OpenMode::Direct,
            changed: true,
        }
    }

    /// Reads up to `size` bytes at `offset` of a pending file's staged content; `None`
    /// if it was sent back meanwhile.
    pub(crate) fn read_pending(
        &self,
        p: &Pending,
        offset: u64,
        size: u32,
    ) -> FsResult<Option<Recycled>> {
        let g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let data = g.read(offset, size as usize).map_err(kept)?;
        Stats::add(&self.stats.bytes_from_cache, data.len() as u64);
        Ok(Some(Recycled::from(data)))
    }
}

impl HoardFs {
    /// The offline change log's counters; `None` without `--offline-writes`.
    pub fn offline_stats(&self) -> Option<crate::LogStats> {
        self.offline.as_ref().map(|o| o.log.stats())
    }

    /// The conflicts recorded in this cache directory, oldest first.
    pub fn conflicts(&self) -> Vec<crate::Conflict> {
        self.offline
            .as_ref()
            .map(|o| o.log.conflicts())
            .unwrap_or_default()
    }
}

/// Whether nothing has `node` open, waiting up to 0.2 s for that: the kernel sends the
/// RELEASE of a closed descriptor without waiting for it, so a file closed just before
/// may still count as open for a moment.
pub(crate) fn closed(node: &Node) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(200);
    while node.state.lock().is_open() {
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    true
}

/// The top bit marks the file ids this client makes for files created offline (origin
/// ids of local exports are inode numbers, far below it; S3 origins are not offline).
const LOCAL_ID: u64 = 1 << 63;

impl HoardFs {
    /// Creates regular file `parent/name` while the origin is unreachable (it failed
    /// with `why`): a node with an id of this client's own, an empty staging file and a
    /// `Create` record; the name is listed and looked up from now on, and the file is
    /// opened. An existing name opens that file instead (`EEXIST` if `exclusive`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create_offline(
        &self,
        parent: crate::Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        access: Access,
        owner: hoardfs_origin::Owner,
        make_backing: &crate::MakeBacking,
        why: String,
    ) -> FsResult<(crate::NodeEntry, Opened)> {
        let Some(off) = self.offline.as_ref().filter(|o| o.keep_new) else {
            return Err(FsError::Offline(why));
        };
        let dir = self.node(parent)?;
        let existing = dir.state.lock().child(name);
        if let Some(existing) = existing {
            if exclusive {
                return Err(hoardfs_origin::WireError::Exists.into());
            }
            let opened = self.open(existing, access, make_backing)?;
            let st = self.node(existing)?;
            let attr = st.state.lock().attr();
            return Ok((
                crate::NodeEntry {
                    ino: existing,
                    attr,
                    ttl: self.config.attr_ttl,
                },
                opened,
            ));
        }
        let Some(mut path) = self.components_of(parent) else {
            return Err(FsError::Offline(why));
        };
        path.push(name.to_vec());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let t = hoardfs_origin::Timestamp {
            secs: now.as_secs() as i64,
            nanos: now.subsec_nanos(),
        };
        let seed = [
            &now.as_nanos().to_le_bytes()[..],
            &parent.to_le_bytes(),
            name,
        ]
        .concat();
        let attr = hoardfs_origin::Attr {
            file_id: LOCAL_ID | xxhash_rust::xxh3::xxh3_64(&seed),
            version: 0,
            kind: hoardfs_origin::FileKind::File,
            perm: (mode & 0o7777) as u16,
            nlink: 1,
            uid: owner.uid,
            gid: owner.gid,
            size: 0,
            blocks: 0,
            rdev: 0,
            blksize: 4096,
            atime: t,
            mtime: t,
            ctime: t,
        };
        let p = off.log.stage_new(path, &attr).map_err(kept)?;
        let local = p.lock().local();
        self.nodes.set_local(attr.file_id, Some(local));
        let handle = hoardfs_origin::Handle { epoch: 0, id: 0 };
        let node = self.nodes.remember(parent, name, handle, attr, |_| false);
        let entry = hoardfs_origin::DirEntry {
            name: name.to_vec(),
            entry: hoardfs_origin::Entry { handle, attr },
        };
        dir.state.lock().add_local_entry(entry, node.ino);
        tracing::info!(
            ino = node.ino,
            "the server is unreachable: a file created here is kept locally until it is back"
        );
        let attr = node.state.lock().attr();
        let opened = self.open_pending(node.clone(), access);
        Ok((
            crate::NodeEntry {
                ino: node.ino,
                attr,
                ttl: self.config.attr_ttl,
            },
            opened,
        ))
    }

    /// Removes file `parent/name` while the origin is unreachable (it failed with
    /// `why`): a file created offline just goes (with its staged content); a file of
    /// the origin gets a `Remove` record (replacing a pending change of its content).
    /// Only a regular file this client knows and nobody has open here can be removed.
    pub(crate) fn unlink_offline(
        &self,
        parent: crate::Ino,
        name: &[u8],
        why: String,
    ) -> FsResult<()> {
        let Some(off) = self.offline.as_ref() else {
            return Err(FsError::Offline(why));
        };
        let dir = self.node(parent)?;
        let child = dir.state.lock().child(name);
        let child = child.and_then(|c| self.nodes.get(c));
        let Some(node) = child else {
            return Err(FsError::Offline(why));
        };
        if node.kind != hoardfs_origin::FileKind::File {
            return Err(FsError::Offline(why));
        }
        if !closed(&node) {
            return Err(FsError::Offline(why));
        }
        let base = node.state.lock().origin_attr();
        let Some(mut path) = self.components_of(parent) else {
            return Err(FsError::Offline(why));
        };
        path.push(name.to_vec());
        match off.log.get(base.file_id) {
            Some(p) => {
                let mut g = p.lock();
                if g.is_gone() {
                    // Sent back meanwhile: an ordinary removal now.
                    drop(g);
                    return self.unlink_sent(&dir, name);
                }
                if g.record().created.is_some() {
                    // Created on the origin already, and not all of it sent: the log
                    // must finish sending it first.
                    return Err(FsError::Offline(why));
                }
                match g.record().kind {
                    crate::cml::Kind::Create => off.log.finish(base.file_id, &mut g),
                    crate::cml::Kind::Store => g.become_removal().map_err(kept)?,
                    crate::cml::Kind::Remove => {}
                }
            }
            None if off.keep_new => {
                off.log.stage_remove(path, &base).map_err(kept)?;
            }
            None => return Err(FsError::Offline(why)),
        }
        self.nodes.set_local(base.file_id, None);
        // The origin may give the id to a new file once this one is gone.
        self.nodes.unbind_file_id(node.ino, base.file_id);
        dir.state.lock().remove_local_entry(name);
        let mut st = node.state.lock();
        st.mark_deleted();
        if let Some(old) = st.opens.set_object(None) {
            old.retire();
        }
        Ok(())
    }
}

impl HoardFs {
    /// Renames `parent/name` to `new_parent/new_name` while the origin is unreachable (it
    /// failed with `why`), for a file created offline: to a free name (its creation moves
    /// there), or over a file of the origin this client knows (an editor's save: that
    /// file's content becomes the new one, from the version this client last saw). Other
    /// renames need the origin.
    pub(crate) fn rename_offline(
        &self,
        parent: crate::Ino,
        name: &[u8],
        new_parent: crate::Ino,
        new_name: &[u8],
        flags: u32,
        why: String,
    ) -> FsResult<()> {
        let Some(off) = self.offline.as_ref().filter(|o| o.keep_new) else {
            return Err(FsError::Offline(why));
        };
        if flags & hoardfs_origin::RENAME_EXCHANGE != 0 {
            return Err(FsError::Offline(why));
        }
        let (dir, new_dir) = (self.node(parent)?, self.node(new_parent)?);
        let src = dir.state.lock().child(name);
        let src = src.and_then(|c| self.nodes.get(c));
        let Some(src) = src else {
            return Err(FsError::Offline(why));
        };
        let src_attr = src.state.lock().origin_attr();
        let created = off.log.get(src_attr.file_id).filter(|p| {
            let g = p.lock();
            g.record().kind == crate::cml::Kind::Create && g.record().created.is_none()
        });
        let (Some(p), Some(mut path)) = (created, self.components_of(new_parent)) else {
            return Err(FsError::Offline(why));
        };
        path.push(new_name.to_vec());
        let dst = new_dir.state.lock().child(new_name);
        let dst = dst
            .and_then(|c| self.nodes.get(c))
            .filter(|d| d.ino != src.ino);
        if dst.is_some() && flags & hoardfs_origin::RENAME_NOREPLACE != 0 {
            return Err(hoardfs_origin::WireError::Exists.into());
        }
        match dst {
            None => {
                let mut g = p.lock();
                if g.is_gone() {
                    return Err(FsError::Offline(why));
                }
                g.moved_to(path).map_err(kept)?;
                drop(g);
                dir.state.lock().remove_local_entry(name);
                src.state.lock().moved(new_parent, new_name);
                let entry = hoardfs_origin::DirEntry {
                    name: new_name.to_vec(),
                    entry: hoardfs_origin::Entry {
                        handle: src.handle(),
                        attr: src_attr,
                    },
                };
                new_dir.state.lock().add_local_entry(entry, src.ino);
                Ok(())
            }
            Some(d) => {
                let (d_attr, d_handle) = {
                    let st = d.state.lock();
                    (st.origin_attr(), st.handle())
                };
                if d.kind != hoardfs_origin::FileKind::File
                    || d_attr.file_id & LOCAL_ID != 0
                    || !closed(&d)
                {
                    return Err(FsError::Offline(why));
                }
                let mut g = p.lock();
                if g.is_gone() {
                    return Err(FsError::Offline(why));
                }
                let from = g.data_path().to_path_buf();
                let target = off.log.adopt(path, &d_attr, &from).map_err(kept)?;
                off.log.finish(src_attr.file_id, &mut g);
                drop(g);
                let local = target.lock().local();
                // The renamed node is the origin's file now (as the kernel sees it: the
                // name leads to the renamed inode); the replaced node is gone.
                self.nodes.set_local(src_attr.file_id, None);
                self.nodes.unbind_file_id(d.ino, d_attr.file_id);
                d.state.lock().mark_deleted();
                let entry = hoardfs_origin::Entry {
                    handle: d_handle,
                    attr: d_attr,
                };
                self.nodes.rebind(src.ino, src_attr.file_id, &entry);
                self.nodes.set_local(d_attr.file_id, Some(local));
                src.state.lock().moved(new_parent, new_name);
                dir.state.lock().remove_local_entry(name);
                let listed = hoardfs_origin::DirEntry {
                    name: new_name.to_vec(),
                    entry,
                };
                new_dir.state.lock().add_local_entry(listed, src.ino);
                Ok(())
            }
        }
    }
}

impl HoardFs {
    /// Removes `dir/name` on the origin (a file whose pending change was sent back while
    /// its removal waited for the log).
    fn unlink_sent(&self, dir: &Node, name: &[u8]) -> FsResult<()> {
        self.with_handle(dir, |h| self.origin.unlink(h, name))?;
        dir.state.lock().remove_child(name);
        dir.state.lock().contents_changed();
        Ok(())
    }
}
