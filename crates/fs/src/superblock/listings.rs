//! Listings, the superblock's part: a directory's listing reused while fresh, taken from
//! what a walk read ahead (`crate::trees`), or fetched from the origin page by page (or
//! as a subtree in one request); kept on the node unless a break overtook it.
//!
//! Locks as in the superblock: a node's `state` lock is never held across origin I/O.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hoardfs_origin::{DirEntry, FileKind, OriginError, WireError};

use super::Superblock;
use crate::nodes::Node;
use crate::trees::{DirStamp, Kept};
use crate::{FsError, FsResult, Ino, Listing, MAX_LISTING, MAX_LISTING_NAME_BYTES};

impl Superblock {
    /// The full listing of directory `ino` (reused within the directory TTL). When it is
    /// fetched, the disk cache reads the records of the listed files it holds ahead of
    /// their opens.
    pub(crate) fn listing(&self, ino: Ino) -> FsResult<Arc<Listing>> {
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
        let (dir_id, edits) = {
            let st = node.state.lock();
            (st.attr().file_id, st.local_edits())
        };
        let listing = match self.listing_read_ahead(&node, dir_id) {
            Some(l) => l,
            None => match self.fetch_listing_or_tree(&node, dir_id) {
                Ok(l) => l,
                Err(FsError::Offline(why)) => {
                    return node
                        .state
                        .lock()
                        .last_listing()
                        .ok_or(FsError::Offline(why));
                }
                Err(e) => return Err(e),
            },
        };
        self.objects.warm_listed(&listing);
        let since = listing.since;
        let names: std::collections::HashSet<&[u8]> =
            listing.entries.iter().map(|e| e.name.as_slice()).collect();
        let mut st = node.state.lock();
        // Names made here since the check above (the log took them) are not in it.
        if self.names_pending()
            && let Some(l) = st.last_listing()
        {
            return Ok(l);
        }
        // Nor are names made or removed here while it was fetched (an offline one perhaps
        // not yet in the log): served once, but the names and listing kept, which have
        // them, stay. Nor is a listing kept meanwhile by another fetch (the background
        // lister's, a walk's) replaced by this one, which may be the older: a name looked
        // up since would be dropped.
        if st.local_edits() != edits {
            return Ok(listing);
        }
        st.retain_children(&names);
        // Kept only if no break for the directory overtook it (checked under the lock the
        // break handler takes to drop listings).
        if self.grant(st.attr().file_id, since) || !self.callbacks.held() {
            st.keep_listing(listing.clone());
        }
        Ok(listing)
    }

    /// The listing of directory `node` (file id `dir_id`) read ahead by a walk, if it is
    /// still as good as a fresh one (`crate::trees`): no break of the directory since the
    /// request (within the callback TTL), or without callbacks within the directory TTL;
    /// and in both cases the directory's version and size still those of the reply.
    fn listing_read_ahead(&self, node: &Node, dir_id: u64) -> Option<Arc<Listing>> {
        let k = self.trees.take(dir_id)?;
        let age = k.listing.fetched.elapsed();
        let fresh = if self.callbacks.held() {
            self.grant(dir_id, k.listing.since)
                && age < self.config.callback_ttl.max(self.config.dir_ttl)
        } else {
            age < self.config.dir_ttl
        };
        let attr = node.state.lock().attr();
        let same = k.seen == Some(DirStamp::of(&attr));
        if !(fresh && same) {
            return None;
        }
        self.stats.count_listing_read_ahead();
        Some(k.listing)
    }

    /// Fetches the listing of directory `node` (file id `dir_id`): on its own, or, when
    /// directories are being walked and the origin lists subtrees in one request, with
    /// the listings around it (`crate::trees`), which are kept for the walk.
    fn fetch_listing_or_tree(&self, node: &Node, dir_id: u64) -> FsResult<Arc<Listing>> {
        let since = self.callbacks.seq();
        let fetched = |entries| {
            Arc::new(Listing {
                entries,
                fetched: Instant::now(),
                since,
            })
        };
        // Without callbacks, listings read ahead are good for the directory TTL only.
        let usable = self.callbacks.held() || !self.config.dir_ttl.is_zero();
        let ask = match self.trees.missed(Instant::now()) {
            Some(ask) if usable && self.origin.lists_trees() => ask,
            _ => return Ok(fetched(self.fetch_listing(node)?)),
        };
        // From the parent: a walker that lists one directory goes on to its siblings. But
        // not from a parent whose listing is unknown or would take much of the request
        // (it would come again with every request of the walk): then from the directory.
        // (The node's lock is let go before the table's is taken.)
        let parent_ino = node.state.lock().parent();
        let parent = self.nodes.get(parent_ino);
        let small = |p: &Node| {
            let entries = p.state.lock().last_listing().map(|l| l.entries.len());
            entries.is_some_and(|n| n <= ask as usize / 4)
        };
        let top = match parent {
            Some(p) if p.ino != node.ino && p.kind == FileKind::Dir && small(&p) => p,
            _ => self.node(node.ino)?,
        };
        let top_attr = top.state.lock().attr();
        let sent_at = self.trees.name_changes();
        let dirs = match self.with_handle(&top, |h| self.origin.read_tree(h, top_attr.file_id, ask))
        {
            Ok(dirs) => dirs,
            // The parent cannot be listed (no permission, gone): the directory still can.
            Err(e) if top.ino != node.ino && !matches!(e, FsError::Offline(_)) => {
                tracing::debug!(dir = dir_id, "subtree request from the parent failed: {e}");
                return Ok(fetched(self.fetch_listing(node)?));
            }
            Err(e) => return Err(e),
        };
        self.stats.count_tree_request();
        // Each directory's version and size as the reply shows them (the top's: as this
        // client knew it when asking).
        let mut seen: HashMap<u64, DirStamp> = HashMap::new();
        seen.insert(top_attr.file_id, DirStamp::of(&top_attr));
        for e in dirs.iter().flat_map(|d| &d.entries) {
            if e.entry.attr.kind == FileKind::Dir {
                seen.insert(e.entry.attr.file_id, DirStamp::of(&e.entry.attr));
            }
        }
        let mut own = None;
        let mut others = Vec::with_capacity(dirs.len());
        for d in dirs {
            let l = fetched(d.entries);
            if d.file_id == dir_id {
                own = Some(l);
            } else {
                others.push((d.file_id, Kept::new(l, seen.get(&d.file_id).copied())));
            }
        }
        let max_age = self.config.callback_ttl.max(self.config.dir_ttl);
        self.trees.keep(others, max_age, sent_at);
        match own {
            Some(l) => Ok(l),
            // Beyond what the subtree request covered (or too large for it).
            None => Ok(fetched(self.fetch_listing(node)?)),
        }
    }

    /// Every entry of directory `node`, page by page from the origin (at most
    /// [`MAX_LISTING`] entries and pages).
    fn fetch_listing(&self, node: &Node) -> FsResult<Vec<DirEntry>> {
        self.stats.count_listing_fetch();
        self.with_handle(node, |h| {
            let mut entries = Vec::new();
            let mut cookie = 0;
            let mut pages = 0;
            let mut name_bytes = 0;
            loop {
                let page = self.origin.readdir(h, cookie, 1024)?;
                pages += 1;
                if entries.len() + page.entries.len() + pages > MAX_LISTING {
                    return Err(OriginError::Protocol(format!(
                        "directory listing longer than {MAX_LISTING} entries"
                    )));
                }
                name_bytes += page.entries.iter().map(|e| e.name.len()).sum::<usize>();
                if name_bytes > MAX_LISTING_NAME_BYTES {
                    return Err(OriginError::Protocol(format!(
                        "directory listing with more than {} MiB of names",
                        MAX_LISTING_NAME_BYTES >> 20
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
}
