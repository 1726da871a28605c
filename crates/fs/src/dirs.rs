//! What a directory node holds besides its attributes: the last listing fetched and the
//! names seen in it (from lookups, creations and listings), which answer lookups while
//! the origin is unreachable. When a listing may be reused is [`crate::freshness`]'s rule;
//! when it is dropped is the node's (`NodeState`): whenever the directory's version or
//! size changes, or a break or a change through this client touches its names.
//!
//! `HoardFs::listing` (here too) serves a directory's listing: reused while fresh, fetched
//! page by page otherwise, the last one kept while the origin is unreachable.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use hoardfs_origin::{DirEntry, FileKind, OriginError, WireError};

use crate::nodes::{Ino, Node};
use crate::{FsError, FsResult, HoardFs, ListedNode, MAX_LISTING};

/// A directory listing snapshot.
#[derive(Debug)]
pub struct Listing {
    /// Entries in origin order.
    pub entries: Vec<DirEntry>,
    /// When it was fetched.
    pub fetched: Instant,
    /// Break number before it was fetched (for callback grants of its entries).
    pub since: u64,
}

/// The directory part of a node's state (empty for other nodes). Covered by the node's
/// `state` lock.
#[derive(Default)]
pub(crate) struct DirState {
    /// The last listing fetched (with the changes made through this client since).
    listing: Option<Arc<Listing>>,
    /// The listing is out of date: not reused while the origin is reachable, but served
    /// (with the changes made here) while it is not.
    stale: bool,
    /// Names seen in this directory, for offline lookups.
    children: HashMap<Vec<u8>, Ino>,
}

impl DirState {
    /// The listing kept, if not out of date (whatever its age).
    pub(crate) fn listing(&self) -> Option<&Arc<Listing>> {
        self.listing.as_ref().filter(|_| !self.stale)
    }

    /// The last listing kept, even if out of date.
    pub(crate) fn last(&self) -> Option<&Arc<Listing>> {
        self.listing.as_ref()
    }

    /// Keeps a freshly fetched listing.
    pub(crate) fn keep_listing(&mut self, listing: Arc<Listing>) {
        self.listing = Some(listing);
        self.stale = false;
    }

    /// The listing with a change made through this client (it stays as fresh, or as
    /// out of date, as it was).
    pub(crate) fn patch_listing(&mut self, listing: Arc<Listing>) {
        self.listing = Some(listing);
    }

    /// The listing is out of date (kept for use while the origin is unreachable).
    pub(crate) fn drop_listing(&mut self) {
        self.stale = true;
    }

    /// The node of `name`, as last seen.
    pub(crate) fn child(&self, name: &[u8]) -> Option<Ino> {
        self.children.get(name).copied()
    }

    /// `name` refers to node `ino`.
    pub(crate) fn add_child(&mut self, name: &[u8], ino: Ino) {
        self.children.insert(name.to_vec(), ino);
    }

    /// `name` is gone.
    pub(crate) fn remove_child(&mut self, name: &[u8]) {
        self.children.remove(name);
    }

    /// Keeps only the names `listed` holds.
    pub(crate) fn retain_children(&mut self, listed: &HashSet<&[u8]>) {
        self.children.retain(|n, _| listed.contains(n.as_slice()));
    }
}

impl HoardFs {
    /// The full listing of directory `ino` (reused within the directory TTL). When it is
    /// fetched, the disk cache reads the records of the listed files it holds ahead of
    /// their opens.
    pub fn listing(&self, ino: Ino) -> FsResult<Arc<Listing>> {
        let node = self.node(ino)?;
        if node.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        if let Some(l) = node.state.lock().fresh_listing(&self.config) {
            return Ok(l);
        }
        // While the log holds changes to names, this client's view of them is its own.
        if self.names_pending()
            && let Some(l) = node.state.lock().last_listing()
        {
            return Ok(l);
        }
        let since = self.callbacks.seq();
        let listing = match self.fetch_listing(&node) {
            Ok(entries) => {
                let l = Arc::new(Listing {
                    entries,
                    fetched: Instant::now(),
                    since,
                });
                self.objects.warm_listed(&l);
                l
            }
            Err(FsError::Offline(why)) => {
                return node
                    .state
                    .lock()
                    .last_listing()
                    .ok_or(FsError::Offline(why));
            }
            Err(e) => return Err(e),
        };
        let names: std::collections::HashSet<&[u8]> =
            listing.entries.iter().map(|e| e.name.as_slice()).collect();
        let mut st = node.state.lock();
        st.retain_children(&names);
        // Kept only if no break for the directory overtook it (checked under the lock the
        // break handler takes to drop listings).
        if self.grant(st.attr().file_id, since) || !self.callbacks.held() {
            st.keep_listing(listing.clone());
        }
        Ok(listing)
    }

    /// Every entry of directory `node`, page by page from the origin (at most
    /// [`MAX_LISTING`] entries and pages).
    fn fetch_listing(&self, node: &Node) -> FsResult<Vec<DirEntry>> {
        self.with_handle(node, |h| {
            let mut entries = Vec::new();
            let mut cookie = 0;
            let mut pages = 0;
            loop {
                let page = self.origin.readdir(h, cookie, 1024)?;
                pages += 1;
                if entries.len() + page.entries.len() + pages > MAX_LISTING {
                    return Err(OriginError::Protocol(format!(
                        "directory listing longer than {MAX_LISTING} entries"
                    )));
                }
                entries.extend(page.entries);
                match page.next {
                    Some(c) => cookie = c,
                    None => return Ok(entries),
                }
            }
        })
    }

    /// Records that a listing entry was handed to the kernel with its attributes
    /// (readdirplus), counting one kernel lookup; returns its node and kernel TTL.
    pub fn remember_entry(&self, dir: Ino, listing: &Listing, e: &DirEntry) -> ListedNode {
        let dir_id = self
            .nodes
            .get(dir)
            .map_or(0, |d| d.state.lock().attr().file_id);
        self.remember(
            dir,
            &e.name,
            &e.entry,
            dir_id,
            listing.since,
            Some(listing.fetched),
        )
    }
}
