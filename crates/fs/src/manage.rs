//! Cache management on a running mount, for the control socket and the hoard file: what is
//! cached (with paths where the client knows them), pinning, explicit eviction and the
//! checksum scrub. A [`CacheManager`] borrows the node table (for paths) and the mount's
//! objects (for the cache and which objects are this export's); `HoardFs` resolves inodes
//! through the superblock and hands it their nodes. Prefetching, which fetches, lives with the fetch path
//! (`fetch/fill.rs`).

use hoardfs_cache::{CacheDir, EvictError, Usage, VerifyReport};

use crate::nodes::{Node, NodeTable};

use crate::ROOT_INO;
use crate::objects::Objects;
use crate::{CacheFault, FsResult};

/// One cached object as `hoardfs cache ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedEntry {
    /// The file's id on the server.
    pub file_id: u64,
    /// Its path in the mount, if this client has seen its name since it started.
    pub path: Option<String>,
    /// Bytes it occupies in the cache.
    pub bytes: u64,
    /// Kept from eviction.
    pub pinned: bool,
    /// Held by open files.
    pub open: bool,
    /// Hoard priority.
    pub priority: u16,
}

/// What a prefetch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Prefetched {
    /// The file's size.
    pub size: u64,
    /// Bytes fetched from the origin now.
    pub fetched: u64,
    /// Every byte of the file is now cached.
    pub complete: bool,
}

/// Cache management over one mount's node table and objects.
pub(crate) struct CacheManager<'a> {
    nodes: &'a NodeTable,
    objects: &'a Objects,
}

impl<'a> CacheManager<'a> {
    /// A manager of `objects`, naming files by the paths `nodes` knows.
    pub(crate) fn new(nodes: &'a NodeTable, objects: &'a Objects) -> Self {
        CacheManager { nodes, objects }
    }

    /// The disk cache (an error on a mount without one).
    fn cache(&self) -> FsResult<&'a CacheDir> {
        self.objects.dir()
    }

    /// Occupancy, limits and counters of the disk cache (`None` without one).
    pub(crate) fn usage(&self) -> Option<Usage> {
        self.objects.dir_if_any().map(|c| c.usage())
    }

    /// The path of `node` from the mount root, as this client last saw its names.
    fn path_of(&self, node: &Node) -> Option<String> {
        let mut parts = Vec::new();
        let mut cur = node.ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                parts.reverse();
                return Some(format!("/{}", parts.join("/")));
            }
            let n = self.nodes.get(cur)?;
            let st = n.state.lock();
            parts.push(String::from_utf8_lossy(st.name()).into_owned());
            cur = st.parent();
        }
        None
    }

    /// Every object in the disk cache of this mount's export.
    pub(crate) fn entries(&self) -> FsResult<Vec<CachedEntry>> {
        let cache = self.cache()?;
        let mut out: Vec<CachedEntry> = cache
            .entries()
            .into_iter()
            .filter(|e| self.objects.is_ours(&e.key))
            .map(|e| CachedEntry {
                file_id: e.key.file_id,
                path: self
                    .nodes
                    .by_file_id(e.key.file_id)
                    .and_then(|n| self.path_of(&n)),
                bytes: e.bytes,
                pinned: e.tracked.pinned,
                open: e.tracked.opens > 0,
                priority: e.tracked.priority,
            })
            .collect();
        out.sort_by(|a, b| a.path.cmp(&b.path).then(a.file_id.cmp(&b.file_id)));
        Ok(out)
    }

    /// Pins (keeps from eviction) or unpins the file of `node`.
    pub(crate) fn pin(&self, node: &Node, pinned: bool, priority: u16) -> FsResult<()> {
        let cache = self.cache()?;
        cache.pin(
            self.objects.key(node.state.lock().attr().file_id),
            pinned,
            priority,
        );
        Ok(())
    }

    /// Drops the file of `node` from the disk cache; returns the bytes freed (0 if nothing
    /// of it was cached). Pinned and open files are refused.
    pub(crate) fn evict(&self, node: &Node) -> FsResult<u64> {
        let cache = self.cache()?;
        match cache.evict(&self.objects.key(node.state.lock().attr().file_id)) {
            Ok(n) => Ok(n),
            Err(EvictError::NotCached) => Ok(0),
            Err(e) => Err(CacheFault::Evict(e).into()),
        }
    }

    /// Checks every cached chunk against its checksum; bad chunks are dropped (and fetched
    /// again when next read).
    pub(crate) fn verify(&self, progress: &dyn Fn(u64, u64)) -> FsResult<VerifyReport> {
        Ok(self.cache()?.verify(progress))
    }
}
