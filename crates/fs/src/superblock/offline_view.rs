//! The offline change log as the superblock's lookups and listings need it: whether names
//! are pending, an object's pending change, a symbolic link made offline, an entry this
//! client moved away. The operation families reach the log through
//! `crate::offline::Offline`.
//!
//! Locks as in the superblock: a node's `state` lock, then the log's.

use std::sync::Arc;

use super::Superblock;
use crate::Ino;
use crate::nodes::Node;
use crate::offline::cml::Pending;

impl Superblock {
    /// Whether the log holds changes to names (until they reach the origin, this
    /// client's view of names is its own: lookups and listings are answered from it).
    pub(crate) fn names_pending(&self) -> bool {
        self.offline.as_ref().is_some_and(|o| o.log.names_pending())
    }

    /// The pending change of `node`'s object (content, name or attributes), if offline
    /// writes are on and it has one.
    pub(crate) fn pending_of(&self, node: &Node) -> Option<Arc<Pending>> {
        self.change_of(node, false)
    }

    /// The pending change of `node`'s file whose content is staged here, if any.
    pub(crate) fn staged_change_of(&self, node: &Node) -> Option<Arc<Pending>> {
        self.change_of(node, true)
    }

    /// The target of symbolic link `node` made offline and not yet sent back.
    pub(super) fn offline_target(&self, node: &Node) -> Option<Vec<u8>> {
        let p = self.pending_of(node)?;
        let g = p.lock();
        (g.record().kind == crate::offline::cml::Kind::Symlink && !g.is_gone())
            .then(|| g.record().target.clone())
    }

    /// Whether the origin's entry `e` at `parent/name` is an object this client moved
    /// away or removed, which has its new name only here until the log is sent back.
    pub(super) fn moved_elsewhere(
        &self,
        e: &hoardfs_origin::Entry,
        parent: Ino,
        name: &[u8],
    ) -> bool {
        if !self.names_pending() {
            return false;
        }
        let Some(n) = self.nodes.by_file_id(e.attr.file_id) else {
            return false;
        };
        let st = n.state.lock();
        n.kind == e.attr.kind
            && st.has_change()
            && (st.is_deleted() || st.parent() != parent || st.name() != name)
    }

    fn change_of(&self, node: &Node, content: bool) -> Option<Arc<Pending>> {
        let off = self.offline.as_ref()?;
        // Every object with a change in the log carries it as its local change (a
        // removal's node is gone from the names): the log is looked at only for those,
        // not on every read and write.
        let file_id = {
            let st = node.state.lock();
            let marked = if content {
                st.is_local()
            } else {
                st.has_change()
            };
            if !marked {
                return None;
            }
            st.attr().file_id
        };
        off.log.get(file_id)
    }
}
