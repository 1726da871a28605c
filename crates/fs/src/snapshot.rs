//! The namespace a client knows, saved in its cache directory so that a later mount can
//! start while the server is unreachable (Coda's disconnected operation starts from the
//! hoard): every node reachable from the root with its name, handle and last attributes,
//! and each directory's last listing. Cached *data* is keyed by file id and version in the
//! cache store and needs nothing from here.
//!
//! A snapshot is taken by [`crate::HoardFs::namespace_snapshot`] (the mount saves one every
//! minute while the namespace changes, when the connection is lost, and at unmount) and
//! written atomically
//! ([`NamespaceSnapshot::save`]: temporary file, fsync, rename). [`crate::HoardFs::restore_namespace`]
//! adds its nodes to a fresh file system with expired attributes and listings and no
//! callbacks, so the first use after the server is back revalidates each of them (a handle
//! from an earlier server instance is stale and resolved again by name). Format: a magic
//! line, the postcard body and its xxh3 checksum; anything that does not check out is
//! reported and ignored, never half-applied.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use hoardfs_origin::{Attr, DirEntry, Entry, FileKind, Handle, Identities, OriginInfo};
use serde::{Deserialize, Serialize};

use crate::dirs::Listing;
use crate::nodes::NodeTable;
use crate::{Ino, ROOT_INO};

const MAGIC: &[u8; 8] = b"HFSNS\x003\n";

/// Largest snapshot file read back (the node table holds at most 250,000 nodes).
const MAX_FILE: u64 = 1 << 30;

/// The saved namespace of one mount source.
#[derive(Debug, Serialize, Deserialize)]
pub struct NamespaceSnapshot {
    /// The source it was taken from (as given to `mount`, e.g. `host:port`).
    pub source: String,
    /// The export's identity at the time.
    pub export_id: u128,
    read_only: bool,
    publishes_on_close: bool,
    /// How the server performed requests (a mount started from this snapshot checks
    /// cached opens as the server would have).
    identities: Identities,
    root: Entry,
    root_listing: Option<Vec<DirEntry>>,
    /// Parents before children.
    nodes: Vec<SavedNode>,
    /// Symlink targets read or made, by file id (whether the node is saved with its name
    /// or only listed).
    targets: Vec<(u64, Vec<u8>)>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedNode {
    /// Index of the parent in `nodes`, or `u32::MAX` for the root.
    parent: u32,
    name: Vec<u8>,
    handle: Handle,
    attr: Attr,
    listing: Option<Vec<DirEntry>>,
}

/// Why a snapshot could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Reading the file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not a snapshot this version wrote, or it is damaged.
    #[error("{path} is damaged or from another version ({why})")]
    Damaged {
        /// The file.
        path: String,
        /// What did not check out.
        #[source]
        why: crate::sealed::Unsealed,
    },
    /// The file is larger than any snapshot this version writes.
    #[error("{path} is too large for a snapshot ({len} bytes)")]
    TooLarge {
        /// The file.
        path: String,
        /// Its length.
        len: u64,
    },
}

impl NamespaceSnapshot {
    /// What the origin said about itself when the snapshot was taken (write verifier 0).
    pub fn info(&self) -> OriginInfo {
        OriginInfo {
            export_id: self.export_id,
            root: self.root.clone(),
            read_only: self.read_only,
            verifier: 0,
            identities: self.identities.clone(),
        }
    }

    /// Whether the origin published written files only at close.
    pub fn publishes_on_close(&self) -> bool {
        self.publishes_on_close
    }

    /// Number of nodes besides the root.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when only the root was known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// A hash of the whole snapshot: equal digests, same content.
    pub fn digest(&self) -> u64 {
        xxhash_rust::xxh3::xxh3_64(&hoardfs_proto::frame::encode_body(self))
    }

    /// Writes the snapshot to `path` atomically (a crash leaves the old one or this one).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        crate::sealed::write_atomically(path, &crate::sealed::seal(MAGIC, self))
    }

    /// Reads the snapshot at `path`; `Ok(None)` if there is none.
    pub fn load(path: &Path) -> Result<Option<NamespaceSnapshot>, SnapshotError> {
        let shown = path.display().to_string();
        let io = |source| SnapshotError::Io {
            path: shown.clone(),
            source,
        };
        let damaged = |why| SnapshotError::Damaged {
            path: shown.clone(),
            why,
        };
        let len = match std::fs::metadata(path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        if len > MAX_FILE {
            return Err(SnapshotError::TooLarge { path: shown, len });
        }
        let bytes = std::fs::read(path).map_err(io)?;
        let snap: NamespaceSnapshot = crate::sealed::unseal(MAGIC, &bytes).map_err(damaged)?;
        Ok(Some(snap))
    }
}

impl NamespaceSnapshot {
    /// The namespace `table` knows now: every node whose names lead to the root, with its
    /// last attributes and (directories) last listing. Deleted nodes are left out.
    /// `info` and `publishes_on_close` are the origin's.
    pub(crate) fn capture(
        table: &NodeTable,
        source: &str,
        info: OriginInfo,
        publishes_on_close: bool,
    ) -> NamespaceSnapshot {
        let mut children: HashMap<Ino, Vec<(Ino, SavedNode)>> = HashMap::new();
        let mut root_listing = None;
        let mut root = info.root.clone();
        let mut targets = Vec::new();
        for node in table.all() {
            let st = node.state.lock();
            let file_id = st.origin_attr().file_id;
            let target = st.kept_target().filter(|_| !st.is_deleted());
            drop(st);
            // Only the node that has the id now: an object removed while its node
            // lived on may have left its id to a new one (inode numbers are reused), and
            // its target must not become the new object's. (The table's lock is taken
            // without the node's.)
            if let Some(t) = target
                && table.by_file_id(file_id).is_some_and(|o| o.ino == node.ino)
            {
                targets.push((file_id, t));
            }
            let st = node.state.lock();
            let listing = st.last_listing().map(|l| l.entries.clone());
            if node.ino == ROOT_INO {
                root = Entry {
                    handle: st.handle(),
                    attr: st.origin_attr(),
                };
                root_listing = listing;
                continue;
            }
            if st.is_deleted() {
                continue;
            }
            // Only under a name it still has (a node outlives its removed name).
            let (parent, name) = (st.parent(), st.name().to_vec());
            drop(st);
            let named = table
                .get(parent)
                .is_some_and(|p| p.state.lock().child(&name) == Some(node.ino));
            if !named {
                continue;
            }
            let st = node.state.lock();
            let saved = SavedNode {
                parent: u32::MAX,
                name: st.name().to_vec(),
                handle: st.handle(),
                // The origin's attributes: a local change is in the log, not here.
                attr: st.origin_attr(),
                listing,
            };
            children
                .entry(st.parent())
                .or_default()
                .push((node.ino, saved));
        }
        // Breadth first from the root, so parents come before children; nodes whose
        // parent chain does not reach the root are left out.
        let mut nodes = Vec::new();
        let mut queue = std::collections::VecDeque::from([(ROOT_INO, u32::MAX)]);
        while let Some((ino, index)) = queue.pop_front() {
            for (child, saved) in children.remove(&ino).unwrap_or_default() {
                let me = nodes.len() as u32;
                if saved.attr.kind == FileKind::Dir {
                    queue.push_back((child, me));
                }
                nodes.push(SavedNode {
                    parent: index,
                    ..saved
                });
            }
        }
        NamespaceSnapshot {
            source: source.to_owned(),
            export_id: info.export_id,
            read_only: info.read_only,
            publishes_on_close,
            identities: info.identities,
            root,
            root_listing,
            nodes,
            targets,
        }
    }

    /// Adds this snapshot's nodes to `table` (of a file system of the same export), expired;
    /// returns how many were added.
    pub(crate) fn restore_into(&self, table: &NodeTable) -> usize {
        let restored_listing = |entries: &Vec<DirEntry>| {
            Arc::new(Listing {
                entries: entries.clone(),
                fetched: Instant::now(),
                since: 0,
            })
        };
        let Some(root) = table.get(ROOT_INO) else {
            return 0;
        };
        {
            let mut st = root.state.lock();
            st.expire();
            if let Some(l) = &self.root_listing {
                st.keep_listing(restored_listing(l));
            }
        }
        let mut inos: Vec<Option<Ino>> = Vec::with_capacity(self.nodes.len());
        let mut listed: Vec<(Ino, &Vec<DirEntry>)> = Vec::new();
        listed.extend(self.root_listing.as_ref().map(|l| (ROOT_INO, l)));
        let mut added = 0;
        for n in &self.nodes {
            let parent = match n.parent {
                u32::MAX => Some(ROOT_INO),
                i => inos.get(i as usize).copied().flatten(),
            };
            let node = parent.and_then(|p| table.restore(p, &n.name, n.handle, n.attr));
            if let (Some(node), Some(l)) = (&node, &n.listing) {
                node.state.lock().keep_listing(restored_listing(l));
                listed.push((node.ino, l));
            }
            added += node.is_some() as usize;
            inos.push(node.map(|n| n.ino));
        }
        // Names only listed (never looked up) answer offline lookups too.
        for (dir, entries) in listed {
            for e in entries {
                let node = table.restore(dir, &e.name, e.entry.handle, e.entry.attr);
                added += node.is_some() as usize;
            }
        }
        for (file_id, t) in &self.targets {
            if let Some(n) = table.by_file_id(*file_id) {
                n.state.lock().keep_target(t);
            }
        }
        added
    }
}
