//! Namespace operations: create, mknod, mkdir, symlink, link, unlink, rmdir, rename.
//!
//! Each one is a single origin round trip; afterwards the node table is updated the way
//! the kernel updates its dentries (names move, disappear or appear), the directories'
//! listings are dropped and their attributes expire (their mtime changed). The origin's
//! callback break for the change comes back to this client too and is recognised as
//! already known (see `callbacks`).

use std::sync::Arc;
use std::time::Duration;

use hoardfs_origin::{Attr, Entry, FileKind, Owner, RENAME_EXCHANGE, SetAttrs, WireError};

use crate::nodes::Ino;
use crate::offline_names::{Created, OfflineNames};
use crate::read::{Access, Opened};
use crate::{FsError, FsResult, HoardFs, ListedNode, NodeAttr};

/// A name the kernel learns of (by lookup or creation): its node, the node's attributes
/// and how long the kernel may cache both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeEntry {
    /// The node.
    pub ino: Ino,
    /// Its attributes.
    pub attr: Attr,
    /// How long the kernel may keep the name and attributes.
    pub ttl: Duration,
}

impl HoardFs {
    /// Runs a creating operation in `parent` and records the new name.
    fn make(
        &self,
        parent: Ino,
        name: &[u8],
        op: impl FnMut(hoardfs_origin::Handle) -> Result<Entry, hoardfs_origin::OriginError>,
    ) -> FsResult<NodeEntry> {
        self.sb.check_writable()?;
        let dir = self.sb.dir(parent)?;
        let dir_id = dir.state.lock().attr().file_id;
        let since = self.sb.callbacks.seq();
        let e = self.sb.with_handle(&dir, op)?;
        let ListedNode { ino, ttl, attr } = self.sb.remember(parent, name, &e, dir_id, since, None);
        let listed = hoardfs_origin::DirEntry {
            name: name.to_vec(),
            entry: e,
        };
        dir.state.lock().add_local_entry(listed, ino);
        if attr.kind == FileKind::Dir
            && let Some(made) = self.sb.nodes.get(ino)
        {
            // Empty when made: listed without asking (and served while the origin is
            // unreachable).
            made.state.lock().keep_listing(Arc::new(crate::Listing {
                entries: Vec::new(),
                fetched: std::time::Instant::now(),
                since,
            }));
        }
        self.sb.dir_changed(&dir);
        Ok(NodeEntry { ino, attr, ttl })
    }

    /// Creates (or with `!exclusive` opens an existing) regular file and opens it.
    #[allow(clippy::too_many_arguments)]
    pub fn create(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        exclusive: bool,
        truncate: bool,
        access: Access,
        owner: Owner,
        make_backing: &crate::MakeBacking,
    ) -> FsResult<(NodeEntry, Opened)> {
        let offline = |names: OfflineNames<'_>, why: String| {
            names.create(parent, name, mode, exclusive, owner, why)
        };
        let made = match self.sb.logged(offline) {
            Some(r) => {
                let opened = self.open_created(r?, access, make_backing)?;
                return self.truncated_offline(opened, truncate);
            }
            None => self.make(parent, name, |h| {
                self.sb.origin.create(h, name, mode, exclusive, owner)
            }),
        };
        let NodeEntry {
            ino,
            mut attr,
            mut ttl,
        } = match made {
            Err(FsError::Offline(why)) => {
                let created = self.sb.names_offline(why, offline)?;
                let opened = self.open_created(created, access, make_backing)?;
                return self.truncated_offline(opened, truncate);
            }
            r => r?,
        };
        if truncate && attr.size > 0 {
            let set = SetAttrs {
                size: Some(0),
                ..Default::default()
            };
            NodeAttr { attr, ttl } = self.setattr(ino, &set)?;
        }
        let node = self.sb.node(ino)?;
        let opened = self
            .reads
            .open_node(&self.sb, node, attr, access, false, make_backing);
        Ok((NodeEntry { ino, attr, ttl }, opened))
    }

    /// Opens what an offline create found or made.
    fn open_created(
        &self,
        created: Created,
        access: Access,
        make_backing: &crate::MakeBacking,
    ) -> FsResult<(NodeEntry, Opened)> {
        let (ino, opened) = match created {
            Created::Existing(ino) => (ino, self.open(ino, access, make_backing)?),
            Created::Made(node) => (node.ino, self.reads.open_pending(node, access)),
        };
        let attr = self.sb.node(ino)?.state.lock().attr();
        let ttl = self.sb.config.attr_ttl;
        Ok((NodeEntry { ino, attr, ttl }, opened))
    }

    /// A file opened by a create while offline, truncated if the create asked for that
    /// (an existing file opened with `O_TRUNC`).
    fn truncated_offline(
        &self,
        (entry, opened): (NodeEntry, Opened),
        truncate: bool,
    ) -> FsResult<(NodeEntry, Opened)> {
        if !truncate || entry.attr.size == 0 {
            return Ok((entry, opened));
        }
        let set = SetAttrs {
            size: Some(0),
            ..Default::default()
        };
        let NodeAttr { attr, ttl } = self.setattr(entry.ino, &set)?;
        Ok((
            NodeEntry {
                ino: entry.ino,
                attr,
                ttl,
            },
            opened,
        ))
    }

    /// An operation the log cannot take must follow its changes to names: `Offline`
    /// while they are not on the origin yet. (They are not sent from here: the kernel
    /// holds directories locked for this operation, and sending them back tells it to drop
    /// names, which takes those locks. The mount's keeper sends them within a second.)
    fn names_sent(&self) -> FsResult<()> {
        if self.sb.names_logged() {
            return Err(FsError::Offline(
                "earlier changes to names are not on the server yet".into(),
            ));
        }
        Ok(())
    }

    /// Creates a special file (fifo, socket, device; `mode` includes the type bits).
    pub fn mknod(
        &self,
        parent: Ino,
        name: &[u8],
        mode: u32,
        rdev: u64,
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        self.names_sent()?;
        self.make(parent, name, |h| {
            self.sb.origin.mknod(h, name, mode, rdev, owner)
        })
    }

    /// Creates a directory.
    pub fn mkdir(&self, parent: Ino, name: &[u8], mode: u32, owner: Owner) -> FsResult<NodeEntry> {
        let offline =
            |names: OfflineNames<'_>, why| names.make(parent, name, mode, None, owner, why);
        if let Some(r) = self.sb.logged(offline) {
            return r;
        }
        match self.make(parent, name, |h| self.sb.origin.mkdir(h, name, mode, owner)) {
            Err(FsError::Offline(why)) => self.sb.names_offline(why, offline),
            r => r,
        }
    }

    /// Creates a symbolic link `name` → `target`.
    pub fn symlink(
        &self,
        parent: Ino,
        name: &[u8],
        target: &[u8],
        owner: Owner,
    ) -> FsResult<NodeEntry> {
        let offline =
            |names: OfflineNames<'_>, why| names.make(parent, name, 0, Some(target), owner, why);
        if let Some(r) = self.sb.logged(offline) {
            return r;
        }
        match self.make(parent, name, |h| {
            self.sb.origin.symlink(h, name, target, owner)
        }) {
            Err(FsError::Offline(why)) => self.sb.names_offline(why, offline),
            Ok(e) => {
                // Known without a readlink (served while the origin is unreachable).
                if let Some(n) = self.sb.nodes.get(e.ino) {
                    n.state.lock().keep_target(target);
                }
                Ok(e)
            }
            r => r,
        }
    }

    /// Creates hard link `parent/name` to `ino`.
    pub fn link(&self, ino: Ino, parent: Ino, name: &[u8]) -> FsResult<NodeEntry> {
        self.names_sent()?;
        let node = self.sb.node(ino)?;
        if self.sb.pending_of(&node).is_some() {
            return Err(FsError::Offline(
                "the file's change is not on the server yet".into(),
            ));
        }
        let target = node.handle();
        self.make(parent, name, |h| self.sb.origin.link(target, h, name))
    }

    /// Removes a non-directory name.
    pub fn unlink(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.remove(parent, name, false)
    }

    /// At mount: removes the hidden names a previous run of this client journaled and
    /// could not remove (it crashed, or the server was unreachable), walking their paths
    /// from the root; those not removable now stay journaled.
    pub(crate) fn remove_leftover_hidden_names(&self) {
        let mut left = Vec::new();
        for path in self.unlinked.journaled() {
            let Some((name, dirs)) = path.split_last() else {
                continue;
            };
            let root = match self.sb.origin.info() {
                Ok(i) => i.root.handle,
                Err(_) => {
                    left.push(path);
                    continue;
                }
            };
            let mut h = Ok(root);
            for d in dirs {
                h = h.and_then(|h| self.sb.origin.lookup(h, d).map(|e| e.handle));
            }
            let r = h.and_then(|h| self.sb.origin.unlink(h, name));
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
    pub fn rmdir(&self, parent: Ino, name: &[u8]) -> FsResult<()> {
        self.remove(parent, name, true)
    }

    fn remove(&self, parent: Ino, name: &[u8], dir_wanted: bool) -> FsResult<()> {
        self.sb.check_writable()?;
        let dir = self.sb.dir(parent)?;
        // Looked up before the round trip: the break for this very change may be handled
        // (and drop the name) before the reply is.
        let child = dir.state.lock().child(name);
        // An object with a change not yet sent back (perhaps not even made on the origin)
        // is the log's until then, connected or not, and so are all names while the log
        // holds changes to names: the removal is logged too, in order (`crate::offline_names`).
        // (An open file is not hidden then: that would rename it behind the log's back.)
        let child_pending = child
            .and_then(|c| self.sb.nodes.get(c))
            .is_some_and(|n| self.sb.pending_of(&n).is_some());
        if child_pending || self.sb.names_logged() {
            let why = "the change is not on the server yet".to_string();
            match self
                .sb
                .names_offline(why, |n, why| n.remove(parent, name, dir_wanted, why))
            {
                Err(FsError::Offline(_) | FsError::SentMeanwhile) if !child_pending => {
                    self.names_sent()?
                }
                r => return r,
            }
        }
        // Its last name, and it is open here: keep it reachable under a hidden name until
        // it is closed (module `unlinked`).
        // A file whose descriptors may all be closed waits a little for their releases
        // first (`Unlinked::wait_for_releases`).
        let open_last_name = child
            .filter(|_| !dir_wanted)
            .and_then(|c| self.sb.nodes.get(c))
            .filter(|n| n.kind == FileKind::File)
            .and_then(|n| {
                let mut st = n.state.lock();
                if st.attr().nlink > 1 {
                    return None;
                }
                self.unlinked.wait_for_releases(&n, &mut st);
                st.is_open().then(|| (n.ino, st.attr().file_id))
            });
        if let Some((ino, file_id)) = open_last_name {
            let hidden = self.unlinked.name_for(file_id);
            let mut path = self.sb.components_of(parent).unwrap_or_default();
            path.push(hidden.clone());
            // Journaled first: a crash after the rename leaves a name the next run removes.
            self.unlinked.hiding(ino, parent, path);
            if let Err(e) = self.rename(
                parent,
                name,
                parent,
                &hidden,
                hoardfs_origin::RENAME_NOREPLACE,
            ) {
                self.unlinked.not_hidden(ino);
                return Err(e);
            }
            return Ok(());
        }
        let removed = self.sb.with_handle(&dir, |h| {
            if dir_wanted {
                self.sb.origin.rmdir(h, name)
            } else {
                self.sb.origin.unlink(h, name)
            }
        });
        match removed {
            Err(FsError::Offline(why)) => {
                return self
                    .sb
                    .names_offline(why, |n, why| n.remove(parent, name, dir_wanted, why));
            }
            r => r?,
        }
        dir.state.lock().remove_local_entry(name);
        if let Some(child) = child.and_then(|c| self.sb.nodes.get(c)) {
            // Its link count changed.
            self.sb.expire_attr(&child);
            // A symbolic link's last name is gone, and with it the object: its id (an
            // inode number, reused) must not lead a new object to this node and its
            // kept target.
            let (kind, attr) = (child.kind, child.state.lock().attr());
            if kind == FileKind::Symlink && attr.nlink <= 1 {
                self.sb.nodes.unbind_file_id(child.ino, attr.file_id);
            }
        }
        self.sb.dir_changed(&dir);
        Ok(())
    }

    /// Renames `parent/name` to `new_parent/new_name` (`flags`: NOREPLACE, EXCHANGE).
    pub fn rename(
        &self,
        parent: Ino,
        name: &[u8],
        new_parent: Ino,
        new_name: &[u8],
        flags: u32,
    ) -> FsResult<()> {
        self.sb.check_writable()?;
        let dir = self.sb.dir(parent)?;
        let new_dir = self.sb.dir(new_parent)?;
        let target = new_dir.handle();
        // Looked up before the round trip (see `remove`).
        let moved = dir.state.lock().child(name);
        let replaced = new_dir.state.lock().child(new_name);
        // Objects with a change not yet sent back are the log's, and so are all names
        // while it holds changes to names (as in `remove`).
        let pending = [moved, replaced]
            .into_iter()
            .flatten()
            .filter_map(|i| self.sb.nodes.get(i))
            .any(|n| self.sb.pending_of(&n).is_some())
            || moved.is_some_and(|m| self.sb.offline_names().is_some_and(|n| n.changes_inside(m)));
        if pending || self.sb.names_logged() {
            let why = "the change is not on the server yet".to_string();
            let rename =
                |n: OfflineNames<'_>, why| n.rename(parent, name, new_parent, new_name, flags, why);
            match self.sb.names_offline(why, rename) {
                Err(FsError::Offline(_) | FsError::SentMeanwhile) if !pending => {
                    self.names_sent()?
                }
                r => return r,
            }
        }
        let renamed = self.sb.with_handle(&dir, |h| {
            self.sb.origin.rename(h, name, target, new_name, flags)
        });
        match renamed {
            Err(FsError::Offline(why)) => {
                return self.sb.names_offline(why, |n, why| {
                    n.rename(parent, name, new_parent, new_name, flags, why)
                });
            }
            r => r?,
        }
        // The kept listings follow (for use while the origin is unreachable).
        let entry_of = |ino: Ino, name: &[u8]| {
            self.sb.nodes.get(ino).map(|n| {
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
            if let Some(n) = self.sb.nodes.get(m) {
                n.state.lock().moved(new_parent, new_name);
            }
        }
        if let Some(r) = replaced {
            if flags & RENAME_EXCHANGE != 0 {
                match entry_of(r, name) {
                    Some(e) => dir.state.lock().add_local_entry(e, r),
                    None => dir.state.lock().add_child(name, r),
                }
                if let Some(n) = self.sb.nodes.get(r) {
                    n.state.lock().moved(parent, name);
                }
            }
            if let Some(n) = self.sb.nodes.get(r) {
                self.sb.expire_attr(&n);
            }
        }
        if let Some(n) = moved.and_then(|m| self.sb.nodes.get(m)) {
            self.sb.expire_attr(&n);
        }
        self.sb.dir_changed(&dir);
        self.sb.dir_changed(&new_dir);
        Ok(())
    }
}
