//! hoardfs file-system logic: names, attributes, listings, opens and reads, answered from
//! the persistent cache where it can and from the origin where it must. Nothing here knows
//! FUSE; the `hoardfs-fuse` crate is a thin bridge over [`HoardFs`], and tests can drive it
//! directly.
//!
//! Consistency (doc/SEMANTICS.md): close-to-open. Every open asks the origin for the file's
//! version (one round trip) and drops cached data of other versions; attributes, names and
//! listings are cached for short, configurable TTLs. When the origin is unreachable, cached
//! attributes, names and data are served and everything else fails fast.

mod error;
pub mod nodes;
mod read;
mod stats;

use std::sync::Arc;
use std::time::{Duration, Instant};

use hoardfs_cache::CacheDir;
use hoardfs_origin::{Attr, DirEntry, FileKind, Handle, Origin, OriginError, StatFs, WireError};

pub use error::{FsError, FsResult};
pub use nodes::{Backing, Ino, Listing, Node, ROOT_INO};
pub use read::{FileHandle, OpenMode};
pub use stats::{Stats, StatsSnapshot};

use nodes::NodeTable;

/// Tunables of a mount.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted without asking the origin.
    pub attr_ttl: Duration,
    /// How long a directory listing is reused.
    pub dir_ttl: Duration,
    /// Hand fully cached files to the kernel (FUSE passthrough).
    pub passthrough: bool,
    /// Chunks fetched ahead of a sequential reader.
    pub readahead_chunks: u64,
    /// Threads fetching readahead chunks.
    pub fetch_threads: usize,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            attr_ttl: Duration::from_secs(1),
            dir_ttl: Duration::from_secs(1),
            passthrough: true,
            readahead_chunks: 8,
            fetch_threads: 4,
        }
    }
}

/// The file system: an origin, an optional disk cache, and the inode table.
pub struct HoardFs {
    origin: Arc<dyn Origin>,
    cache: Option<CacheDir>,
    export_id: u128,
    config: FsConfig,
    nodes: NodeTable,
    reads: read::ReadEngine,
    stats: Arc<Stats>,
}

impl HoardFs {
    /// A file system over `origin`, caching in `cache` (`None`: read through, no disk cache).
    pub fn new(
        origin: Arc<dyn Origin>,
        cache: Option<CacheDir>,
        config: FsConfig,
    ) -> FsResult<Arc<HoardFs>> {
        let info = origin.info()?;
        let stats = Arc::new(Stats::default());
        Ok(Arc::new_cyclic(|weak| HoardFs {
            nodes: NodeTable::new(info.root.handle, info.root.attr),
            export_id: info.export_id,
            reads: read::ReadEngine::new(weak.clone(), &config),
            origin,
            cache,
            config,
            stats,
        }))
    }

    /// Mount configuration.
    pub fn config(&self) -> &FsConfig {
        &self.config
    }

    /// Counters of this mount.
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot(self.origin.is_connected())
    }

    fn node(&self, ino: Ino) -> FsResult<Arc<Node>> {
        self.nodes.get(ino).ok_or(FsError::BadHandle)
    }

    /// Runs `op` with the node's handle; if the origin says the handle is stale (server
    /// restarted or handle forgotten), resolves the node's name again and retries once.
    fn with_handle<T>(
        &self,
        node: &Node,
        mut op: impl FnMut(Handle) -> Result<T, OriginError>,
    ) -> FsResult<T> {
        match op(node.handle()) {
            Err(OriginError::Fs(WireError::Stale)) => {
                let h = self.resolve(node.ino, 0)?;
                Ok(op(h)?)
            }
            r => Ok(r?),
        }
    }

    /// Finds a fresh handle for `ino` by walking its names from the root.
    fn resolve(&self, ino: Ino, depth: u32) -> FsResult<Handle> {
        if depth > 256 {
            return Err(FsError::Origin(WireError::Stale));
        }
        let node = self.node(ino)?;
        if ino == ROOT_INO {
            let root = self.origin.info()?.root;
            node.state.lock().handle = root.handle;
            return Ok(root.handle);
        }
        let (parent, name, file_id) = {
            let st = node.state.lock();
            (st.parent, st.name.clone(), st.attr.file_id)
        };
        let ph = self.resolve(parent, depth + 1)?;
        let e = self.origin.lookup(ph, &name)?;
        if e.attr.file_id != file_id {
            // The name now refers to another object: ours is gone.
            return Err(FsError::Origin(WireError::Stale));
        }
        let mut st = node.state.lock();
        st.handle = e.handle;
        st.attr = e.attr;
        st.attr_fetched = Instant::now();
        Ok(e.handle)
    }

    /// Resolves `name` in directory `parent`; counts one kernel lookup on success.
    pub fn lookup(&self, parent: Ino, name: &[u8]) -> FsResult<(Ino, Attr)> {
        let dir = self.node(parent)?;
        if dir.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        match self.with_handle(&dir, |h| self.origin.lookup(h, name)) {
            Ok(e) => {
                let n = self.nodes.remember(parent, name, e.handle, e.attr);
                Ok((n.ino, e.attr))
            }
            Err(FsError::Offline(why)) => {
                // Serve the name from what we saw while connected.
                let child = dir.state.lock().children.get(name).copied();
                let node = child
                    .and_then(|c| self.nodes.get(c))
                    .ok_or(FsError::Offline(why))?;
                let mut st = node.state.lock();
                st.lookups += 1;
                Ok((node.ino, st.attr))
            }
            Err(e) => {
                if e == FsError::Origin(WireError::NotFound) {
                    dir.state.lock().children.remove(name);
                }
                Err(e)
            }
        }
    }

    /// The kernel forgot `n` lookups of `ino`.
    pub fn forget(&self, ino: Ino, n: u64) {
        self.nodes.forget(ino, n);
    }

    /// Attributes of `ino`, from cache while younger than the TTL.
    pub fn getattr(&self, ino: Ino) -> FsResult<Attr> {
        let node = self.node(ino)?;
        {
            let st = node.state.lock();
            if st.attr_fetched.elapsed() < self.config.attr_ttl {
                return Ok(st.attr);
            }
        }
        self.refresh_attr(&node)
    }

    /// Fresh attributes from the origin (cached ones if it is unreachable).
    fn refresh_attr(&self, node: &Node) -> FsResult<Attr> {
        self.stats.count_version_check();
        match self.with_handle(node, |h| self.origin.getattr(h)) {
            Ok(a) => {
                let mut st = node.state.lock();
                st.attr = a;
                st.attr_fetched = Instant::now();
                Ok(a)
            }
            Err(FsError::Offline(_)) => Ok(node.state.lock().attr),
            Err(e) => Err(e),
        }
    }

    /// The full listing of directory `ino` (reused within the directory TTL).
    pub fn listing(&self, ino: Ino) -> FsResult<Arc<Listing>> {
        let node = self.node(ino)?;
        if node.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        if let Some(l) = &node.state.lock().listing
            && l.fetched.elapsed() < self.config.dir_ttl
        {
            return Ok(l.clone());
        }
        let mut entries = Vec::new();
        let mut cookie = 0;
        let fetched = self.with_handle(&node, |h| {
            entries.clear();
            cookie = 0;
            loop {
                let page = self.origin.readdir(h, cookie, 1024)?;
                entries.extend(page.entries);
                match page.next {
                    Some(c) => cookie = c,
                    None => return Ok(()),
                }
            }
        });
        let listing = match fetched {
            Ok(()) => Arc::new(Listing {
                entries,
                fetched: Instant::now(),
            }),
            Err(FsError::Offline(why)) => {
                return node
                    .state
                    .lock()
                    .listing
                    .clone()
                    .ok_or(FsError::Offline(why));
            }
            Err(e) => return Err(e),
        };
        let names: std::collections::HashSet<&[u8]> =
            listing.entries.iter().map(|e| e.name.as_slice()).collect();
        let mut st = node.state.lock();
        st.children.retain(|n, _| names.contains(n.as_slice()));
        st.listing = Some(listing.clone());
        Ok(listing)
    }

    /// Records that a listing entry was handed to the kernel with its attributes
    /// (readdirplus), counting one kernel lookup.
    pub fn remember_entry(&self, dir: Ino, e: &DirEntry) -> Ino {
        self.nodes
            .remember(dir, &e.name, e.entry.handle, e.entry.attr)
            .ino
    }

    /// Attributes of `ino` as last seen, without any round trip (for `.` and `..`).
    pub fn cached_attr(&self, ino: Ino) -> FsResult<Attr> {
        Ok(self.node(ino)?.state.lock().attr)
    }

    /// Parent of `ino` (the root is its own parent).
    pub fn parent_of(&self, ino: Ino) -> FsResult<Ino> {
        Ok(self.node(ino)?.state.lock().parent)
    }

    /// Target of symlink `ino`.
    pub fn readlink(&self, ino: Ino) -> FsResult<Vec<u8>> {
        let node = self.node(ino)?;
        self.with_handle(&node, |h| self.origin.readlink(h))
    }

    /// Statistics of the exported file system.
    pub fn statfs(&self) -> FsResult<StatFs> {
        Ok(self.origin.statfs()?)
    }
}

#[cfg(test)]
mod tests;
