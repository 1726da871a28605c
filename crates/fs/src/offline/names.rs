//! Names changed while the origin is unreachable (`--offline-writes`; the writes of file
//! contents are `crate::offline::staged`).
//!
//! Names change offline too, in directories listed while connected (so that this client
//! knows which names are free): regular files are created (a node with an id of this
//! client's own, an empty staging file, a `Create` record), directories made (`Mkdir`,
//! known to be empty) and symbolic links (`Symlink`, the target in the record); objects
//! are removed (`Remove`, `Rmdir`: a directory this client knows to be empty), replacing
//! a pending change of the object, or cancelling one made offline; any object is renamed
//! (one made offline is made at its new name; one of the origin gets a move in its change,
//! and the changes inside a moved directory follow it); a file created offline renamed
//! over a file of the origin becomes that file's new content (an editor's save).
//! Permission bits and times are kept in the object's change and set after its content.
//! Owners, hard links, special files and exchanges still need the origin.
//!
//! While the log holds changes to names, this client's view of names is its own (lookups
//! and listings are answered from it), and new changes to names are logged after them
//! even if the origin is back, until reintegration sent them.
//!
use std::sync::Arc;

use crate::error::retried;
use crate::nodes::Node;
use crate::offline::cml::Pending;
use crate::offline::made::{LOCAL_ID, made_here, now_stamp};
use crate::offline::state::OfflineWrites;
use crate::offline::state::{closed, kept};
use crate::superblock::Superblock;
use crate::{FsError, FsResult, Ino, NodeAttr};

/// A rename this client can make offline: the directories, the object moved and the one
/// it replaces, and the paths from and to (`OfflineNames::resolve_move`).
struct Move {
    dir: Arc<Node>,
    new_dir: Arc<Node>,
    src: Arc<Node>,
    dst: Option<Arc<Node>>,
    old_path: Vec<Vec<u8>>,
    new_path: Vec<Vec<u8>>,
}

/// What an offline create found or made, for its caller to open.
pub(crate) enum Created {
    /// The name was taken (the create was not exclusive): that file.
    Existing(Ino),
    /// A file made here, with its staging file.
    Made(Arc<Node>),
}

/// The changes to names of the change log: the superblock and its log, borrowed for
/// one operation (`Offline::names`). Each operation that makes a new change
/// refuses unless the log takes new ones (`OfflineWrites::keeps_new`).
pub(crate) struct OfflineNames<'a> {
    sb: &'a Superblock,
    off: &'a OfflineWrites,
}

impl<'a> OfflineNames<'a> {
    pub(crate) fn new(sb: &'a Superblock, off: &'a OfflineWrites) -> Self {
        OfflineNames { sb, off }
    }

    /// Where the origin has node `ino` (an object of the origin): its names from the
    /// root, except that from the nearest node (it or a directory above it) with a move
    /// not yet sent back, the origin's location of that node. `None` if unknown.
    pub(crate) fn origin_components_of(&self, ino: crate::Ino) -> Option<Vec<Vec<u8>>> {
        let off = self.off;
        let mut parts = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == crate::ROOT_INO {
                parts.reverse();
                return Some(parts);
            }
            let n = self.sb.nodes().get(cur)?;
            let (changed, file_id, name, parent) = {
                let st = n.state.lock();
                (
                    st.has_change(),
                    st.attr().file_id,
                    st.name().to_vec(),
                    st.parent(),
                )
            };
            if changed && let Some(p) = off.log.get(file_id) {
                let g = p.lock();
                let r = g.record();
                if !g.is_gone() && r.renames() {
                    let mut at = r.origin_loc().to_vec();
                    drop(g);
                    parts.reverse();
                    at.extend(parts);
                    return Some(at);
                }
            }
            parts.push(name);
            cur = parent;
        }
        None
    }

    /// Whether the log holds changes of objects inside directory node `ino` (a move of
    /// the directory must then go through the log, for them to follow it).
    pub(crate) fn changes_inside(&self, ino: crate::Ino) -> bool {
        let off = self.off;
        if off.log.count() == 0 {
            return false;
        }
        let is_dir = self
            .sb
            .nodes()
            .get(ino)
            .is_some_and(|n| n.kind == hoardfs_origin::FileKind::Dir);
        let Some(path) = self.sb.components_of(ino).filter(|_| is_dir) else {
            return false;
        };
        off.log
            .records()
            .iter()
            .any(|(_, r)| crate::offline::cml::is_under(&r.path, &path))
    }

    /// The directory `parent` where a name is made offline, the made object's path, and
    /// whether `name` is free there (`EEXIST` if not; `Offline(why)` if this client
    /// cannot tell, because it never listed the directory).
    fn free_name(
        &self,
        parent: crate::Ino,
        name: &[u8],
        why: &str,
    ) -> FsResult<(Arc<Node>, Vec<Vec<u8>>)> {
        let dir = self.sb.node(parent)?;
        if dir.kind != hoardfs_origin::FileKind::Dir {
            return Err(hoardfs_origin::WireError::NotDir.into());
        }
        let (child, listed) = {
            let st = dir.state.lock();
            (st.child(name), st.last_listing().is_some())
        };
        if child.and_then(|c| self.sb.nodes().get(c)).is_some() {
            return Err(hoardfs_origin::WireError::Exists.into());
        }
        let path = self.sb.components_of(parent);
        let (true, Some(mut path)) = (listed, path) else {
            return Err(FsError::Offline(why.into()));
        };
        path.push(name.to_vec());
        Ok((dir, path))
    }

    /// Makes the object `attr` (made here) known as `dir/name` with its change, staged by
    /// `stage`: the node first, listed and looked up from now on, then the change (a
    /// sender that sends it at once finds the node and moves it to the origin's object),
    /// then the node's local attributes, under the change's lock.
    fn add_made(
        &self,
        dir: &Node,
        name: &[u8],
        attr: hoardfs_origin::Attr,
        stage: impl FnOnce() -> std::io::Result<Arc<Pending>>,
    ) -> FsResult<Arc<Node>> {
        let handle = hoardfs_origin::Handle { epoch: 0, id: 0 };
        let node = self
            .sb
            .nodes()
            .remember(dir.ino, name, handle, attr, None, |_| false);
        if attr.kind == hoardfs_origin::FileKind::Dir {
            // Empty, and known to be: names can be made in it.
            node.state.lock().keep_listing(Arc::new(crate::Listing {
                entries: Vec::new(),
                fetched: std::time::Instant::now(),
                since: self.sb.callbacks().seq(),
            }));
        }
        let entry = hoardfs_origin::DirEntry {
            name: name.to_vec(),
            entry: hoardfs_origin::Entry { handle, attr },
        };
        dir.state.lock().add_local_entry(entry, node.ino);
        let p = match stage() {
            Ok(p) => p,
            Err(e) => {
                dir.state.lock().remove_local_entry(name);
                self.sb.nodes().unbind_file_id(node.ino, attr.file_id);
                node.state.lock().mark_deleted();
                return Err(kept(e));
            }
        };
        let g = p.lock();
        if !g.is_gone() {
            self.sb.nodes().set_local(attr.file_id, Some(g.local()));
        }
        drop(g);
        Ok(node)
    }

    /// Creates regular file `parent/name` while the origin is unreachable (it failed
    /// with `why`): a node with an id of this client's own, an empty staging file and a
    /// `Create` record; the name is listed and looked up from now on. An existing name is
    /// that file's (`EEXIST` if `exclusive`). The caller opens what this returns.
    pub(crate) fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: hoardfs_origin::Owner,
        why: String,
    ) -> FsResult<Created> {
        if !self.off.keeps_new() {
            return Err(FsError::Offline(why));
        }
        let off = self.off;
        let existing = self.sb.node(parent)?.state.lock().child(name);
        if let Some(existing) = existing.filter(|e| self.sb.nodes().get(*e).is_some()) {
            if exclusive {
                return Err(hoardfs_origin::WireError::Exists.into());
            }
            return Ok(Created::Existing(existing));
        }
        let (dir, path) = self.free_name(parent, name, &why)?;
        let kind = hoardfs_origin::FileKind::File;
        let attr = made_here(parent, name, kind, (mode & 0o7777) as u16, owner, 0);
        let node = self.add_made(&dir, name, attr, || off.log.stage_new(path, &attr))?;
        tracing::debug!(
            ino = node.ino,
            "a file created here waits in the log: {why}"
        );
        Ok(Created::Made(node))
    }

    /// Makes directory `parent/name` (or, with `target`, a symbolic link to it) while the
    /// origin is unreachable (it failed with `why`): a node with an id of this client's
    /// own (an empty directory, known to be empty) and a `Mkdir` or `Symlink` record.
    pub(crate) fn make(
        &self,
        parent: crate::Ino,
        name: &[u8],
        mode: u32,
        target: Option<&[u8]>,
        owner: hoardfs_origin::Owner,
        why: String,
    ) -> FsResult<crate::NodeEntry> {
        if !self.off.keeps_new() {
            return Err(FsError::Offline(why));
        }
        let off = self.off;
        let (dir, path) = self.free_name(parent, name, &why)?;
        let attr = match target {
            Some(t) => made_here(
                parent,
                name,
                hoardfs_origin::FileKind::Symlink,
                0o777,
                owner,
                t.len() as u64,
            ),
            None => made_here(
                parent,
                name,
                hoardfs_origin::FileKind::Dir,
                (mode & 0o7777) as u16,
                owner,
                0,
            ),
        };
        let node = self.add_made(&dir, name, attr, || off.log.stage_made(path, &attr, target))?;
        let attr = node.state.lock().attr();
        Ok(crate::NodeEntry {
            ino: node.ino,
            attr,
            ttl: self.sb.config().attr_ttl,
        })
    }

    /// Removes `parent/name` (a directory if `dir_wanted`) while the origin is
    /// unreachable (it failed with `why`) or the log holds the object's change: an object
    /// made offline just goes (with its staged content); one of the origin gets a
    /// `Remove` or `Rmdir` record (replacing a pending change of its content, name or
    /// attributes). Only an object this client knows can be removed, a file only if
    /// nobody has it open here, a directory only if this client knows it is empty.
    pub(crate) fn remove(
        &self,
        parent: crate::Ino,
        name: &[u8],
        dir_wanted: bool,
        why: String,
    ) -> FsResult<()> {
        retried(|| self.remove_once(parent, name, dir_wanted, why.clone()))
    }

    fn remove_once(
        &self,
        parent: crate::Ino,
        name: &[u8],
        dir_wanted: bool,
        why: String,
    ) -> FsResult<()> {
        use hoardfs_origin::{FileKind, WireError};
        let off = self.off;
        let dir = self.sb.node(parent)?;
        let (child, listed) = {
            let st = dir.state.lock();
            (st.child(name), st.last_listing().is_some())
        };
        let Some(node) = child.and_then(|c| self.sb.nodes().get(c)) else {
            return Err(if listed && off.keeps_new() {
                WireError::NotFound.into()
            } else {
                FsError::Offline(why)
            });
        };
        let is_dir = node.kind == FileKind::Dir;
        match (dir_wanted, is_dir) {
            (true, false) => return Err(WireError::NotDir.into()),
            (false, true) => return Err(WireError::IsDir.into()),
            _ => {}
        }
        if is_dir {
            let listing = node.state.lock().last_listing();
            match listing {
                None => return Err(FsError::Offline(why)),
                Some(l) if !l.entries.is_empty() => return Err(WireError::NotEmpty.into()),
                Some(_) => {}
            }
        } else if !closed(&node) {
            return Err(FsError::Offline(why));
        }
        let base = node.state.lock().origin_attr();
        let Some(mut path) = self.sb.components_of(parent) else {
            return Err(FsError::Offline(why));
        };
        path.push(name.to_vec());
        match off.log.get(base.file_id) {
            Some(p) => {
                let mut g = p.lock();
                if g.is_gone() {
                    // Sent back meanwhile: an ordinary removal now.
                    drop(g);
                    return self.remove_sent(&dir, name, dir_wanted);
                }
                let rec = g.record();
                if rec.create_in_flight() {
                    // Created on the origin already (or perhaps: its create's answer
                    // never came), and not all of it sent: the log must finish sending
                    // it first.
                    return Err(FsError::Offline(why));
                } else if rec.creates() {
                    off.log.finish(base.file_id, &mut g);
                } else if !rec.removes() {
                    g.become_removal(is_dir, base.version).map_err(kept)?;
                }
            }
            // Made here, and sent back since its attributes were read: the node is the
            // origin's object now, under another id.
            None if base.file_id & LOCAL_ID != 0 => return Err(FsError::SentMeanwhile),
            None if off.keeps_new() => {
                off.log
                    .at_origin(
                        || self.origin_components_of(node.ino),
                        |origin| off.log.stage_remove(path, origin, &base),
                    )
                    .map_err(kept)?;
            }
            None => return Err(FsError::Offline(why)),
        }
        self.sb.nodes().set_local(base.file_id, None);
        // The origin may give the id to a new object once this one is gone.
        self.sb.nodes().unbind_file_id(node.ino, base.file_id);
        dir.state.lock().remove_local_entry(name);
        let mut st = node.state.lock();
        st.mark_deleted();
        if let Some(old) = st.opens.set_object(None) {
            old.retire();
        }
        Ok(())
    }

    /// Changes permission bits and times of `node` while the origin is unreachable (it
    /// failed with `why`) or the log holds the object's change: kept in its change (a
    /// `Meta` one if it has none) and applied after its content.
    pub(crate) fn setattr(
        &self,
        node: &Node,
        set: &hoardfs_origin::SetAttrs,
        why: String,
    ) -> FsResult<NodeAttr> {
        retried(|| self.setattr_once(node, set, why.clone()))
    }

    fn setattr_once(
        &self,
        node: &Node,
        set: &hoardfs_origin::SetAttrs,
        why: String,
    ) -> FsResult<NodeAttr> {
        if !self.off.keeps_new() {
            return Err(FsError::Offline(why));
        }
        let off = self.off;
        // A change is sent back to its path, and the root has none: its attributes need
        // the origin. So do owners, except the owner the object has already (`tar` and
        // `cp -p` run as root set it on every file they make; with no set-id bit to
        // clear, that changes nothing).
        let attr = node.state.lock().attr();
        let same_owner = set.uid.is_none_or(|u| u == attr.uid)
            && set.gid.is_none_or(|g| g == attr.gid)
            && (set.uid.is_none() && set.gid.is_none() || attr.perm & 0o6000 == 0);
        if node.ino == crate::ROOT_INO || !same_owner || set.size.is_some() {
            return Err(FsError::Offline(why));
        }
        let at = |t: &hoardfs_origin::TimeSet| match t {
            hoardfs_origin::TimeSet::Now => now_stamp(),
            hoardfs_origin::TimeSet::At(t) => *t,
        };
        let change = crate::offline::cml::AttrChange {
            perm: set.mode.map(|m| (m & 0o7777) as u16),
            atime: set.atime.as_ref().map(at),
            mtime: set.mtime.as_ref().map(at),
        };
        let p = match self.sb.pending_of(node) {
            Some(p) => p,
            None => {
                let Some(path) = self.sb.components_of(node.ino) else {
                    return Err(FsError::Offline(why));
                };
                let base = node.state.lock().origin_attr();
                off.log
                    .at_origin(
                        || self.origin_components_of(node.ino),
                        |origin| off.log.stage_meta(path, origin, &base),
                    )
                    .map_err(kept)?
            }
        };
        let mut g = p.lock();
        if g.is_gone() {
            return Err(FsError::SentMeanwhile);
        }
        g.set_attrs(change).map_err(kept)?;
        self.sb.nodes().set_local(p.file_id, Some(g.local()));
        drop(g);
        let st = node.state.lock();
        Ok(NodeAttr {
            attr: st.attr(),
            ttl: self.sb.config().attr_ttl,
        })
    }

    /// Renames `parent/name` to `new_parent/new_name` while the origin is unreachable (it
    /// failed with `why`) or the log holds changes to names. An object made offline is
    /// made at the new name; one of the origin gets (or its change gains) the move, and
    /// the changes inside a moved directory follow it. A name replaced is removed first
    /// (logged as any removal), except that a file created offline renamed over a file of
    /// the origin (an editor's save) becomes that file's new content, from the version
    /// this client last saw. Exchanges need the origin.
    pub(crate) fn rename(
        &self,
        parent: crate::Ino,
        name: &[u8],
        new_parent: crate::Ino,
        new_name: &[u8],
        flags: u32,
        why: String,
    ) -> FsResult<()> {
        retried(|| self.rename_once(parent, name, new_parent, new_name, flags, why.clone()))
    }

    fn rename_once(
        &self,
        parent: crate::Ino,
        name: &[u8],
        new_parent: crate::Ino,
        new_name: &[u8],
        flags: u32,
        why: String,
    ) -> FsResult<()> {
        use hoardfs_origin::{FileKind, WireError};
        if !self.off.keeps_new() || flags & hoardfs_origin::RENAME_EXCHANGE != 0 {
            return Err(FsError::Offline(why));
        }
        let off = self.off;
        let Some(mv) = self.resolve_move((parent, name), (new_parent, new_name), flags, &why)?
        else {
            return Ok(());
        };
        let src_attr = mv.src.state.lock().origin_attr();
        let change = off
            .log
            .get(src_attr.file_id)
            .filter(|p| !p.lock().is_gone());
        if change.is_none() && src_attr.file_id & LOCAL_ID != 0 {
            // Made here, and sent back since its attributes were read: the node is the
            // origin's object now, under another id.
            return Err(FsError::SentMeanwhile);
        }
        let (created, half_sent) = change.as_ref().map_or((false, false), |p| {
            let g = p.lock();
            let r = g.record();
            (
                r.kind == crate::offline::cml::Kind::Create && r.creates() && !r.create_in_flight(),
                r.create_in_flight(),
            )
        });
        if half_sent {
            // Created on the origin already (or perhaps), and not all of it sent.
            return Err(FsError::Offline(why));
        }
        if let Some(d) = &mv.dst {
            match (mv.src.kind == FileKind::Dir, d.kind == FileKind::Dir) {
                (true, false) => return Err(WireError::NotDir.into()),
                (false, true) => return Err(WireError::IsDir.into()),
                _ => {}
            }
            let d_attr = d.state.lock().origin_attr();
            // (Over a file with a change of its own, the ordinary way below: its change
            // becomes its removal, and the new file is made at the name.)
            if created
                && d.kind == FileKind::File
                && d_attr.file_id & LOCAL_ID == 0
                && off.log.get(d_attr.file_id).is_none()
            {
                let p = change.expect("a created file has its change");
                return self.save_over(
                    &p,
                    &mv.src,
                    d,
                    (&mv.dir, name),
                    (&mv.new_dir, new_name),
                    mv.new_path,
                    &why,
                );
            }
            self.remove(new_parent, new_name, d.kind == FileKind::Dir, why.clone())?;
        }
        let p = match change {
            Some(p) => p,
            None => off
                .log
                .at_origin(
                    || self.origin_components_of(mv.src.ino),
                    |origin| off.log.stage_meta(mv.old_path.clone(), origin, &src_attr),
                )
                .map_err(kept)?,
        };
        self.record_move(&p, &mv, &src_attr)?;
        mv.dir.state.lock().remove_local_entry(name);
        mv.src.state.lock().moved(new_parent, new_name);
        let entry = hoardfs_origin::DirEntry {
            name: new_name.to_vec(),
            entry: hoardfs_origin::Entry {
                handle: mv.src.handle(),
                attr: src_attr,
            },
        };
        mv.new_dir.state.lock().add_local_entry(entry, mv.src.ino);
        Ok(())
    }

    /// The objects and paths of a rename of `parent/name` to `new_parent/new_name`
    /// (`None`: both names are the same object, nothing to do), checked as the origin
    /// would check them (`Offline(why)` where this client cannot tell).
    fn resolve_move(
        &self,
        (parent, name): (crate::Ino, &[u8]),
        (new_parent, new_name): (crate::Ino, &[u8]),
        flags: u32,
        why: &str,
    ) -> FsResult<Option<Move>> {
        use hoardfs_origin::{FileKind, WireError};
        let offline = || FsError::Offline(why.to_string());
        let (dir, new_dir) = (self.sb.node(parent)?, self.sb.node(new_parent)?);
        if new_dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        let (src, listed) = {
            let st = dir.state.lock();
            (st.child(name), st.last_listing().is_some())
        };
        let Some(src) = src.and_then(|c| self.sb.nodes().get(c)) else {
            return Err(if listed {
                WireError::NotFound.into()
            } else {
                offline()
            });
        };
        let (dst, new_listed) = {
            let st = new_dir.state.lock();
            (st.child(new_name), st.last_listing().is_some())
        };
        let dst = dst.and_then(|c| self.sb.nodes().get(c));
        if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
            return Ok(None);
        }
        if dst.is_none() && !new_listed {
            return Err(offline());
        }
        if dst.is_some() && flags & hoardfs_origin::RENAME_NOREPLACE != 0 {
            return Err(WireError::Exists.into());
        }
        if src.kind == FileKind::Dir {
            // Not into itself.
            let mut cur = new_parent;
            while cur != crate::ROOT_INO {
                if cur == src.ino {
                    return Err(WireError::Invalid.into());
                }
                cur = self.sb.node(cur)?.state.lock().parent();
            }
        }
        let (Some(mut old_path), Some(mut new_path)) = (
            self.sb.components_of(parent),
            self.sb.components_of(new_parent),
        ) else {
            return Err(offline());
        };
        old_path.push(name.to_vec());
        new_path.push(new_name.to_vec());
        Ok(Some(Move {
            dir,
            new_dir,
            src,
            dst,
            old_path,
            new_path,
        }))
    }

    /// Records move `mv` in change `p` of its object (`src_attr`: as the origin has it),
    /// and the changes inside a moved directory follow it.
    fn record_move(&self, p: &Pending, mv: &Move, src_attr: &hoardfs_origin::Attr) -> FsResult<()> {
        let off = self.off;
        // (Taken before the change's lock: it locks the other changes in turn.)
        let vacated = off.log.vacated(&Default::default());
        {
            let mut g = p.lock();
            if g.is_gone() {
                return Err(FsError::SentMeanwhile);
            }
            g.moved_to(mv.new_path.clone(), &vacated).map_err(kept)?;
            if g.is_void() {
                // Back at its name on the origin, nothing else changed.
                off.log.finish(src_attr.file_id, &mut g);
                self.sb.nodes().set_local(src_attr.file_id, None);
            } else {
                self.sb.nodes().set_local(src_attr.file_id, Some(g.local()));
            }
        }
        if mv.src.kind == hoardfs_origin::FileKind::Dir {
            off.log
                .moved_under(&mv.old_path, &mv.new_path, false, &[p.seq].into())
                .map_err(kept)?;
        }
        Ok(())
    }

    /// A file created offline (`src`, its change `p`) renamed over file `d` of the origin
    /// (an editor's save): `d`'s content becomes the new one, from the version this client
    /// last saw; the renamed node answers for `d` from now on.
    #[allow(clippy::too_many_arguments)]
    fn save_over(
        &self,
        p: &Pending,
        src: &Node,
        d: &Node,
        (dir, name): (&Node, &[u8]),
        (new_dir, new_name): (&Node, &[u8]),
        path: Vec<Vec<u8>>,
        why: &str,
    ) -> FsResult<()> {
        let off = self.off;
        let src_attr = src.state.lock().origin_attr();
        let (d_attr, d_handle) = {
            let st = d.state.lock();
            (st.origin_attr(), st.handle())
        };
        if !closed(d) {
            return Err(FsError::Offline(why.into()));
        }
        // Where the origin has the document (a directory above it may have moved here):
        // worked out before the created file's change is locked, as every lock this takes
        // must be.
        let origin = self.origin_components_of(d.ino);
        let mut g = p.lock();
        if g.is_gone() {
            return Err(FsError::Offline(why.into()));
        }
        let from = g.data_path().to_path_buf();
        let mut set = g.record().set;
        // The name now leads to the new file, with its permission bits (as a rename
        // gives them): those it was made with unless it was given others since (an
        // editor gives it the document's).
        if set.perm.is_none() && src_attr.perm != d_attr.perm {
            set.perm = Some(src_attr.perm);
        }
        let target = off.log.adopt(path, origin, &d_attr, &from).map_err(kept)?;
        // Permission bits and times given to the new file go with its content (unless a
        // sender took the new change meanwhile: its record is gone).
        let local = {
            let mut t = target.lock();
            if t.is_gone() {
                None
            } else {
                if !set.is_empty() {
                    t.set_attrs(set).map_err(kept)?;
                }
                Some(t.local())
            }
        };
        off.log.finish(src_attr.file_id, &mut g);
        drop(g);
        // The renamed node is the origin's file now (as the kernel sees it: the name leads
        // to the renamed inode); the replaced node is gone.
        self.sb.nodes().set_local(src_attr.file_id, None);
        self.sb.nodes().unbind_file_id(d.ino, d_attr.file_id);
        d.state.lock().mark_deleted();
        let entry = hoardfs_origin::Entry {
            handle: d_handle,
            attr: d_attr,
        };
        self.sb.nodes().rebind(src.ino, src_attr.file_id, &entry);
        self.sb.nodes().set_local(d_attr.file_id, local);
        src.state.lock().moved(new_dir.ino, new_name);
        dir.state.lock().remove_local_entry(name);
        let listed = hoardfs_origin::DirEntry {
            name: new_name.to_vec(),
            entry,
        };
        new_dir.state.lock().add_local_entry(listed, src.ino);
        Ok(())
    }

    /// Removes `dir/name` on the origin (an object whose pending change was sent back
    /// while its removal waited for the log).
    fn remove_sent(&self, dir: &Node, name: &[u8], is_dir: bool) -> FsResult<()> {
        self.sb.with_handle(dir, |h| {
            if is_dir {
                self.sb.origin().rmdir(h, name)
            } else {
                self.sb.origin().unlink(h, name)
            }
        })?;
        dir.state.lock().remove_child(name);
        self.sb.dir_changed(dir);
        Ok(())
    }
}
