//! What a directory node holds besides its attributes: the last listing fetched and the
//! names seen in it (from lookups, creations and listings), which answer lookups while
//! the origin is unreachable. When a listing may be reused is [`crate::freshness`]'s rule;
//! when it is dropped is the node's (`NodeState`): whenever the directory's version or
//! size changes, or a break or a change through this client touches its names.
//!
//! `Superblock::listing` serves a directory's listing: reused while fresh, fetched page
//! by page otherwise, the last one kept while the origin is unreachable.

use std::collections::{HashMap, HashSet};

use std::sync::Arc;
use std::time::Instant;

use hoardfs_origin::DirEntry;

use crate::Ino;

/// A directory listing snapshot.
#[derive(Debug, Clone)]
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
    /// Names made or removed through this client so far: a listing fetched while one
    /// was made does not hold it, and must not replace the listing that does.
    edits: u64,
    /// Listings kept so far: a listing whose fetch began before another was kept may be
    /// the older of the two, and must not replace it (nor drop the names it holds).
    kept: u64,
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
        self.kept += 1;
    }

    /// How many listings were kept so far.
    pub(crate) fn kept(&self) -> u64 {
        self.kept
    }

    /// The kept listing, if any, with a change made through this client (it stays as
    /// fresh, or as out of date, as it was). Changed in place unless a reader (a
    /// `readdir` in progress) holds it: a build making thousands of files in one
    /// directory does not copy its listing for each.
    pub(crate) fn patch_listing(&mut self, change: impl FnOnce(&mut Vec<DirEntry>)) {
        if let Some(l) = &mut self.listing {
            change(&mut Arc::make_mut(l).entries);
        }
    }

    /// The listing is out of date (kept for use while the origin is unreachable).
    pub(crate) fn drop_listing(&mut self) {
        self.stale = true;
    }

    /// The node of `name`, as last seen.
    pub(crate) fn child(&self, name: &[u8]) -> Option<Ino> {
        self.children.get(name).copied()
    }

    /// How many names were made or removed through this client so far.
    pub(crate) fn edits(&self) -> u64 {
        self.edits
    }

    /// A name was made or removed through this client.
    pub(crate) fn edited(&mut self) {
        self.edits += 1;
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
