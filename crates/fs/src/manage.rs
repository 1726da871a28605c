//! Cache management on a running mount, for the control socket and the hoard file: what is
//! cached (with paths where the client knows them), pinning, explicit eviction, prefetching
//! a file into the cache without reading it through the kernel, and the checksum scrub.

use std::sync::Arc;

use hoardfs_cache::{EvictError, ObjectKey, Usage, VerifyReport};
use hoardfs_origin::{FileKind, WireError};

use crate::nodes::{Ino, Node, ROOT_INO};
use crate::read::View;
use crate::{CacheFault, FsResult, HoardFs};

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

impl HoardFs {
    fn cache_or_err(&self) -> FsResult<&hoardfs_cache::CacheDir> {
        self.objects.dir()
    }

    /// The node of regular file `ino` (anything else is an error).
    pub(crate) fn file_node(&self, ino: Ino) -> FsResult<Arc<Node>> {
        let node = self.node(ino)?;
        match node.kind {
            FileKind::File => Ok(node),
            FileKind::Dir => Err(WireError::IsDir.into()),
            _ => Err(WireError::Invalid.into()),
        }
    }

    fn key_of(&self, node: &Node) -> ObjectKey {
        self.objects.key(node.state.lock().attr().file_id)
    }

    /// Occupancy, limits and counters of the disk cache (`None` without one).
    pub fn cache_usage(&self) -> Option<Usage> {
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
    pub fn cache_entries(&self) -> FsResult<Vec<CachedEntry>> {
        let cache = self.cache_or_err()?;
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

    /// Pins (keeps from eviction) or unpins file `ino`.
    pub fn pin(&self, ino: Ino, pinned: bool, priority: u16) -> FsResult<()> {
        let cache = self.cache_or_err()?;
        let node = self.file_node(ino)?;
        cache.pin(self.key_of(&node), pinned, priority);
        Ok(())
    }

    /// Drops file `ino` from the disk cache; returns the bytes freed (0 if nothing of it
    /// was cached). Pinned and open files are refused.
    pub fn evict(&self, ino: Ino) -> FsResult<u64> {
        let cache = self.cache_or_err()?;
        let node = self.file_node(ino)?;
        match cache.evict(&self.key_of(&node)) {
            Ok(n) => Ok(n),
            Err(EvictError::NotCached) => Ok(0),
            Err(e) => Err(CacheFault::Evict(e).into()),
        }
    }

    /// Fetches every missing chunk of file `ino` (current version) into the disk cache.
    pub fn prefetch(&self, ino: Ino) -> FsResult<Prefetched> {
        self.cache_or_err()?;
        let node = self.file_node(ino)?;
        let attr = self.validated_attr(&node)?.now;
        let object = self
            .objects
            .object_for(&node, attr.file_id, attr.version, attr.size);
        let Some(object) = object else {
            return Err(CacheFault::CannotHold.into());
        };
        // Held like an open file, so the chunks fetched first are not evicted meanwhile.
        let _hold = object.hold_open();
        // It may have been emptied between its creation and the hold: fetch what is missing.
        let view = View::of(&node);
        let mut done = Prefetched {
            size: attr.size,
            ..Prefetched::default()
        };
        for c in 0..view.chunks() {
            if let Some(bytes) = self.ensure_chunk(&node, &view, c)? {
                done.fetched += bytes.len() as u64;
            }
        }
        done.complete = object.is_complete();
        drop(_hold);
        drop(object);
        // Not an open: a file nobody has open lets go of its object (its descriptors), so
        // that prefetching a tree of any size does not hold two descriptors per file; the
        // next open finds the object in the cache again.
        let mut st = node.state.lock();
        if !st.is_open() {
            st.opens.set_object(None);
        }
        Ok(done)
    }

    /// Checks every cached chunk against its checksum; bad chunks are dropped (and fetched
    /// again when next read).
    pub fn verify_cache(&self, progress: &dyn Fn(u64, u64)) -> FsResult<VerifyReport> {
        Ok(self.cache_or_err()?.verify(progress))
    }
}
