//! Namespace operations: create, mknod, mkdir, symlink, link, unlink, rmdir, rename.
//!
//! Each one is a single origin round trip; afterwards the node table is updated the way
//! the kernel updates its dentries (names move, disappear or appear), the directories'
//! listings are dropped and their attributes expire (their mtime changed). The origin's
//! callback break for the change comes back to this client too and is recognised as
//! already known (see `callbacks`).

use std::sync::Arc;

use hoardfs_origin::{Entry, FileKind, Owner, RENAME_EXCHANGE, WireError};

use crate::Ino;
use crate::nodes::Node;
use crate::offline::Offline;
use crate::offline::names::Created;
use crate::superblock::Superblock;
use crate::unlinked::Unlinked;
use crate::{FsError, FsResult, ListedNode, NodeEntry};

/// A regular file a create made or found (`Names::create`), to be opened.
pub(crate) enum NewFile {
    /// On the origin.
    Origin(NodeEntry),
    /// In the change log: made here, or an existing name (`Created`).
    Offline(Created),
}

/// The namespace side of a mount: operations that make, remove and rename names, and the
/// files unlinked while open that it keeps under hidden names.
pub(crate) struct Names {
    /// Open files whose last name was replaced by a hidden one.
    unlinked: Unlinked,
}

impl Names {
    /// Changes to names, with `unlinked` keeping the files unlinked while open.
    pub(crate) fn new(unlinked: Unlinked) -> Self {
        Names { unlinked }
    }

    /// The last descriptor of `ino` was closed: if the file was unlinked while open here,
    /// its hidden name goes now.
    pub(crate) fn last_closed(&self, sb: &Superblock, ino: Ino) {
        let Some(hidden) = self.unlinked.closed(ino) else {
            return;
        };
        let gone = match self.unlink(sb, hidden.dir, hidden.name()) {
            Ok(()) | Err(FsError::Origin(WireError::NotFound)) => true,
            Err(e) => {
                tracing::warn!("cannot remove the hidden name of an unlinked file: {e}");
                false
            }
        };
        self.unlinked.removed(hidden.path, gone);
    }

    /// Runs a creating operation in `parent` and records the new name.
    fn make(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        op: impl FnMut(hoardfs_origin::Handle) -> Result<Entry, hoardfs_origin::OriginError>,
    ) -> FsResult<NodeEntry> {
        sb.check_writable()?;
        let dir = sb.dir(parent)?;
        let dir_id = dir.state.lock().attr().file_id;
        let since = sb.callbacks().seq();
        let e = sb.with_handle(&dir, op)?;
        let ListedNode { ino, ttl, attr } = sb.remember(parent, name, &e, dir_id, since, None);
        let listed = hoardfs_origin::DirEntry {
            name: name.to_vec(),
            entry: e,
        };
        dir.state.lock().add_local_entry(listed, ino);
        if attr.kind == FileKind::Dir
            && let Some(made) = sb.nodes().get(ino)
        {
            // Empty when made: listed without asking (and served while the origin is
            // unreachable).
            made.state.lock().keep_listing(Arc::new(crate::Listing {
                entries: Vec::new(),
                fetched: std::time::Instant::now(),
                since,
            }));
        }
        sb.dir_changed(&dir);
        Ok(NodeEntry { ino, attr, ttl })
    }

    /// Creates (or with `!exclusive` finds an existing) regular file `parent/name`: on the
    /// origin, or in the change log when names wait to be sent back or the origin is
    /// unreachable. The caller opens it (`HoardFs::create`).
    pub(crate) fn create(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        owner: Owner,
    ) -> FsResult<NewFile> {
        let online = || {
            self.make(sb, parent, name, |h| {
                sb.origin().create(h, name, mode, exclusive, owner)
            })
            .map(NewFile::Origin)
        };
        let off = Offline::of(sb);
        off.listed_for_log(parent);
        off.online_or_logged(false, online, |names, why| {
            names
                .create(parent, name, mode, exclusive, owner, why)
                .map(NewFile::Offline)
        })
    }

    /// Creates a special file (fifo, socket, device; `mode` includes the type bits).
    pub(crate) fn mknod(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        Offline::of(sb).names_sent()?;
        self.make(sb, parent, name, |h| {
            sb.origin().mknod(h, name, mode, rdev, owner)
        })
    }

    /// Creates a directory.
    pub(crate) fn mkdir(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        mode: u32,
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        let off = Offline::of(sb);
        off.listed_for_log(parent);
        off.online_or_logged(
            false,
            || {
                self.make(sb, parent, name, |h| {
                    sb.origin().mkdir(h, name, mode, owner)
                })
            },
            |names, why| names.make(parent, name, mode, None, owner, why),
        )
    }

    /// Creates a symbolic link `name` → `target`.
    pub(crate) fn symlink(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        let online = || {
            let e = self.make(sb, parent, name, |h| {
                sb.origin().symlink(h, name, target, owner)
            })?;
            // Known without a readlink (served while the origin is unreachable).
            if let Some(n) = sb.nodes().get(e.ino) {
                n.state.lock().keep_target(target);
            }
            Ok(e)
        };
        let off = Offline::of(sb);
        off.listed_for_log(parent);
        off.online_or_logged(false, online, |names, why| {
            names.make(parent, name, 0, Some(target), owner, why)
        })
    }

    /// Creates hard link `parent/name` to `ino`.
    pub(crate) fn link(
        &self,
        sb: &Superblock,
        ino: Ino,
        parent: Ino,
        name: &[u8],
    ) -> FsResult<NodeEntry> {
        Offline::of(sb).names_sent()?;
        let node = sb.node(ino)?;
        if Offline::of(sb).owns(&node) {
            return Err(FsError::Offline(
                "the file's change is not on the server yet".into(),
            ));
        }
        let target = node.handle();
        self.make(sb, parent, name, |h| sb.origin().link(target, h, name))
    }

    /// Removes a non-directory name.
    pub(crate) fn unlink(&self, sb: &Superblock, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.remove(sb, parent, name, false)
    }

    /// At mount: removes the hidden names a previous run of this client journaled and
    /// could not remove (it crashed, or the server was unreachable), walking their paths
    /// from the root; those not removable now stay journaled.
    pub(crate) fn remove_leftover_hidden_names(&self, sb: &Superblock) {
        let mut left = Vec::new();
        for path in self.unlinked.journaled() {
            let Some((name, dirs)) = path.split_last() else {
                continue;
            };
            let root = match sb.origin().info() {
                Ok(i) => i.root.handle,
                Err(_) => {
                    left.push(path);
                    continue;
                }
            };
            let mut h = Ok(root);
            for d in dirs {
                h = h.and_then(|h| sb.origin().lookup(h, d).map(|e| e.handle));
            }
            let r = h.and_then(|h| sb.origin().unlink(h, name));
            match r.map_err(FsError::from) {
                Ok(()) => tracing::info!(
                    name = %String::from_utf8_lossy(name),
                    "removed the hidden name of a file a previous run had open"
                ),
                Err(FsError::Origin(WireError::NotFound | WireError::Stale)) => {}
                Err(e) => {
                    tracing::warn!("cannot remove a hidden name left by a previous run: {e}");
                    left.push(path);
                }
            }
        }
        self.unlinked.cleaned(left);
    }

    /// Removes an empty directory.
    pub(crate) fn rmdir(&self, sb: &Superblock, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.remove(sb, parent, name, true)
    }

    fn remove(&self, sb: &Superblock, parent: Ino, name: &[u8], dir_wanted: bool) -> FsResult<()> {
        sb.check_writable()?;
        let dir = sb.dir(parent)?;
        // Looked up before the round trip: the break for this very change may be handled
        // (and drop the name) before the reply is.
        let child = dir.state.lock().child(name);
        // An object with a change not yet sent back (perhaps not even made on the origin)
        // is the log's until then, connected or not, and so are all names while the log
        // holds changes to names: the removal is logged too, in order (`crate::offline::names`).
        // (An open file is not hidden then: that would rename it behind the log's back.)
        let off = Offline::of(sb);
        off.listed_for_log(parent);
        let owned = child
            .and_then(|c| sb.nodes().get(c))
            .is_some_and(|n| off.owns(&n));
        off.online_or_logged(
            owned,
            || self.remove_online(sb, &dir, child, name, dir_wanted),
            |n, why| n.remove(parent, name, dir_wanted, why),
        )
    }

    /// If `name` in `dir` (node `child`) is the last name of a regular file open here, keeps
    /// the file reachable under a hidden name until it is closed (module `unlinked`)
    /// instead of letting its last name go: the result of hiding it. `None`: not such a
    /// file. A file whose descriptors may all be closed waits a little for their releases
    /// first (`Unlinked::wait_for_releases`).
    fn hide_if_open(
        &self,
        sb: &Superblock,
        dir: &Node,
        child: Option<Ino>,
        name: &[u8],
    ) -> Option<FsResult<()>> {
        let parent = dir.ino;
        let (ino, file_id) = child
            .and_then(|c| sb.nodes().get(c))
            .filter(|n| n.kind == FileKind::File)
            .and_then(|n| {
                let mut st = n.state.lock();
                if st.attr().nlink > 1 {
                    return None;
                }
                self.unlinked.wait_for_releases(&n, &mut st);
                st.is_open().then(|| (n.ino, st.attr().file_id))
            })?;
        let hidden = self.unlinked.name_for(file_id);
        let mut path = sb.components_of(parent).unwrap_or_default();
        path.push(hidden.clone());
        // Journaled first: a crash after the rename leaves a name the next run removes.
        self.unlinked.hiding(ino, parent, path);
        if let Err(e) = self.rename(
            sb,
            parent,
            name,
            parent,
            &hidden,
            hoardfs_origin::RENAME_NOREPLACE,
        ) {
            self.unlinked.not_hidden(ino);
            return Some(Err(e));
        }
        if let Some(n) = sb.nodes().get(ino) {
            n.state.lock().mark_unlinked_here();
            // The kernel asks again: `fstat` of a descriptor must now say 0 links.
            sb.expire_attr(&n);
        }
        Some(Ok(()))
    }

    /// Removes `name` (whose node, if known, is `child`) from directory `dir` on the
    /// origin, or hides it while it is open here.
    fn remove_online(
        &self,
        sb: &Superblock,
        dir: &Node,
        child: Option<Ino>,
        name: &[u8],
        dir_wanted: bool,
    ) -> FsResult<()> {
        if let Some(hidden) = self.hide_if_open(sb, dir, child.filter(|_| !dir_wanted), name) {
            return hidden;
        }
        sb.with_handle(dir, |h| {
            if dir_wanted {
                sb.origin().rmdir(h, name)
            } else {
                sb.origin().unlink(h, name)
            }
        })?;
        dir.state.lock().remove_local_entry(name);
        if let Some(child) = child.and_then(|c| sb.nodes().get(c)) {
            if dir_wanted {
                gone_dir(sb, &child);
            }
            // Its link count changed.
            sb.expire_attr(&child);
            // A symbolic link's last name is gone, and with it the object: its id (an
            // inode number, reused) must not lead a new object to this node and its
            // kept target.
            let (kind, attr) = (child.kind, child.state.lock().attr());
            if kind == FileKind::Symlink && attr.nlink <= 1 {
                sb.nodes().unbind_file_id(child.ino, attr.file_id);
            }
        }
        sb.dir_changed(dir);
        Ok(())
    }

    /// Renames `parent/name` to `new_parent/new_name` (`flags`: NOREPLACE, EXCHANGE).
    pub(crate) fn rename(
        &self,
        sb: &Superblock,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        sb.check_writable()?;
        let dir = sb.dir(parent)?;
        let new_dir = sb.dir(new_parent)?;
        let target = new_dir.handle();
        // Looked up before the round trip (see `remove`).
        let moved = dir.state.lock().child(name);
        let replaced = new_dir.state.lock().child(new_name);
        // Objects with a change not yet sent back are the log's, and so are all names
        // while it holds changes to names (as in `remove`).
        let off = Offline::of(sb);
        off.listed_for_log(parent);
        if new_parent != parent {
            off.listed_for_log(new_parent);
        }
        let owned = [moved, replaced]
            .into_iter()
            .flatten()
            .filter_map(|i| sb.nodes().get(i))
            .any(|n| off.owns(&n))
            || moved.is_some_and(|m| off.owns_inside(m));
        off.online_or_logged(
            owned,
            || {
                // A file open here that the rename replaces keeps working, as one
                // unlinked does: hidden first (as NFS clients do), so the rename does not
                // take its last name.
                let mut replaced = replaced;
                if flags & (RENAME_EXCHANGE | hoardfs_origin::RENAME_NOREPLACE) == 0
                    && replaced != moved
                    && let Some(hidden) = self.hide_if_open(sb, &new_dir, replaced, new_name)
                {
                    hidden?;
                    replaced = None;
                }
                sb.with_handle(&dir, |h| {
                    sb.origin().rename(h, name, target, new_name, flags)
                })?;
                self.renamed(
                    sb,
                    &dir,
                    &new_dir,
                    (moved, name),
                    (replaced, new_name),
                    flags,
                );
                Ok(())
            },
            |n, why| n.rename(parent, name, new_parent, new_name, flags, why),
        )
    }

    /// After a rename on the origin: the kept listings and the nodes follow (`moved` was
    /// at `name` in `dir`, `replaced` at `new_name` in `new_dir`).
    fn renamed(
        &self,
        sb: &Superblock,
        dir: &Node,
        new_dir: &Node,
        (moved, name): (Option<Ino>, &[u8]),
        (replaced, new_name): (Option<Ino>, &[u8]),
        flags: u32,
    ) {
        let (parent, new_parent) = (dir.ino, new_dir.ino);
        // The kept listings follow (for use while the origin is unreachable).
        let entry_of = |ino: Ino, name: &[u8]| {
            sb.nodes().get(ino).map(|n| {
                let st = n.state.lock();
                hoardfs_origin::DirEntry {
                    name: name.to_vec(),
                    entry: Entry {
                        handle: st.handle(),
                        attr: st.origin_attr(),
                    },
                }
            })
        };
        dir.state.lock().remove_local_entry(name);
        new_dir.state.lock().remove_local_entry(new_name);
        if let Some(m) = moved {
            match entry_of(m, new_name) {
                Some(e) => new_dir.state.lock().add_local_entry(e, m),
                None => new_dir.state.lock().add_child(new_name, m),
            }
            if let Some(n) = sb.nodes().get(m) {
                n.state.lock().moved(new_parent, new_name);
            }
        }
        if let Some(r) = replaced {
            if flags & RENAME_EXCHANGE != 0 {
                match entry_of(r, name) {
                    Some(e) => dir.state.lock().add_local_entry(e, r),
                    None => dir.state.lock().add_child(name, r),
                }
                if let Some(n) = sb.nodes().get(r) {
                    n.state.lock().moved(parent, name);
                }
            }
            if let Some(n) = sb.nodes().get(r) {
                if flags & RENAME_EXCHANGE == 0 && n.kind == FileKind::Dir {
                    gone_dir(sb, &n);
                }
                sb.expire_attr(&n);
            }
        }
        if let Some(n) = moved.and_then(|m| sb.nodes().get(m)) {
            sb.expire_attr(&n);
        }
        sb.dir_changed(dir);
        sb.dir_changed(new_dir);
    }
}

/// Directory `node` was removed through this client (by `rmdir`, or replaced by a rename):
/// a directory has no other name, so the origin no longer has it. A descriptor still open
/// on it answers `fstat` with its last attributes and a link count of zero, as a local
/// file system does, instead of `ESTALE` from a handle the origin no longer knows; its id
/// (an inode number, reused) must not lead a new object to this node.
fn gone_dir(sb: &Superblock, node: &Node) {
    let file_id = {
        let mut st = node.state.lock();
        st.mark_deleted();
        st.attr().file_id
    };
    sb.nodes().unbind_file_id(node.ino, file_id);
}
