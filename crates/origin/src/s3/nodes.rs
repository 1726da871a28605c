//! The S3 origin's handle table: wire handles ↔ paths below the mount's prefix, with what
//! was last learned about each (an object's size and ETag). S3 has no inodes, so a file's
//! identity is its path: `file_id` is a hash of it (stable across restarts and the same
//! on every client), and its `version` a hash of ETag and size, which changes with every
//! new object written there.
//!
//! The table is bounded; beyond its capacity the oldest handles are forgotten, and a
//! caller holding one gets `Stale` and resolves the name again.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use hoardfs_proto::{FileKind, Handle, WireError};
use parking_lot::Mutex;

use super::client::ObjectInfo;

/// Id of the root in every epoch.
pub const ROOT_ID: u64 = 1;

/// What a handle names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Node {
    /// Path below the prefix (`""` for the root).
    pub path: String,
    /// File or directory.
    pub kind: FileKind,
    /// For files: the object as last seen.
    pub info: Option<ObjectInfo>,
}

/// Stable identity of the object at `path` of `kind`.
pub fn file_id(path: &str, kind: FileKind) -> u64 {
    let tag: &[u8] = if kind == FileKind::Dir { b"d" } else { b"f" };
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(tag);
    h.update(path.as_bytes());
    // 0 and 1 are left to the root and "unknown".
    h.digest().max(2)
}

/// Change attribute of an object with `info`.
pub fn version(info: &ObjectInfo) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(info.etag.as_bytes());
    h.update(&info.size.to_le_bytes());
    h.digest().max(1)
}

struct Inner {
    by_id: HashMap<u64, Arc<S3Node>>,
    by_path: HashMap<(String, bool), u64>,
    order: VecDeque<u64>,
    next: u64,
}

/// Bounded map between handles and nodes. Lock: one mutex, never held across a request.
pub struct NodeTable {
    epoch: u64,
    cap: usize,
    inner: Mutex<Inner>,
}

impl NodeTable {
    /// A table (with the root) whose handles carry `epoch`.
    pub fn new(epoch: u64, cap: usize) -> NodeTable {
        let root = Arc::new(S3Node {
            path: String::new(),
            kind: FileKind::Dir,
            info: None,
        });
        let mut by_id = HashMap::new();
        by_id.insert(ROOT_ID, root);
        let mut by_path = HashMap::new();
        by_path.insert((String::new(), true), ROOT_ID);
        NodeTable {
            epoch,
            cap: cap.max(16),
            inner: Mutex::new(Inner {
                by_id,
                by_path,
                order: VecDeque::new(),
                next: ROOT_ID + 1,
            }),
        }
    }

    /// The root's handle.
    pub fn root(&self) -> Handle {
        Handle {
            epoch: self.epoch,
            id: ROOT_ID,
        }
    }

    /// The node `h` names, or `Stale`.
    pub fn get(&self, h: Handle) -> Result<Arc<S3Node>, WireError> {
        if h.epoch != self.epoch {
            return Err(WireError::Stale);
        }
        self.inner
            .lock()
            .by_id
            .get(&h.id)
            .cloned()
            .ok_or(WireError::Stale)
    }

    /// The handle of `node` (the same one as before for the same path and kind), with the
    /// node's information replaced by `node`'s.
    pub fn put(&self, node: S3Node) -> Handle {
        let key = (node.path.clone(), node.kind == FileKind::Dir);
        let mut g = self.inner.lock();
        let id = match g.by_path.get(&key) {
            Some(&id) => id,
            None => {
                let id = g.next;
                g.next += 1;
                g.by_path.insert(key, id);
                g.order.push_back(id);
                id
            }
        };
        g.by_id.insert(id, Arc::new(node));
        while g.order.len() > self.cap {
            if let Some(old) = g.order.pop_front()
                && let Some(n) = g.by_id.remove(&old)
            {
                g.by_path.remove(&(n.path.clone(), n.kind == FileKind::Dir));
            }
        }
        Handle {
            epoch: self.epoch,
            id,
        }
    }

    /// The object of `kind` at `path`, if a handle names it.
    pub fn known(&self, path: &str, kind: FileKind) -> Option<Arc<S3Node>> {
        let g = self.inner.lock();
        let id = g.by_path.get(&(path.to_string(), kind == FileKind::Dir))?;
        g.by_id.get(id).cloned()
    }

    /// Replaces what is known of `node`'s path, if a handle names it (no new handle).
    pub fn refresh(&self, node: S3Node) {
        let mut g = self.inner.lock();
        if let Some(&id) = g
            .by_path
            .get(&(node.path.clone(), node.kind == FileKind::Dir))
        {
            g.by_id.insert(id, Arc::new(node));
        }
    }

    /// Forgets the file at `path` (deleted or renamed away): its handles become stale.
    pub fn forget(&self, path: &str, kind: FileKind) {
        let mut g = self.inner.lock();
        if let Some(id) = g.by_path.remove(&(path.to_string(), kind == FileKind::Dir)) {
            g.by_id.remove(&id);
            g.order.retain(|&i| i != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, etag: &str) -> S3Node {
        S3Node {
            path: path.into(),
            kind: FileKind::File,
            info: Some(ObjectInfo {
                size: 1,
                etag: etag.into(),
                mtime: 0,
            }),
        }
    }

    #[test]
    fn a_path_keeps_its_handle_and_gets_new_information() {
        let t = NodeTable::new(7, 100);
        let a = t.put(file("a", "1"));
        let b = t.put(file("a", "2"));
        assert_eq!(a, b);
        assert_eq!(t.get(a).unwrap().info.as_ref().unwrap().etag, "2");
        assert_eq!(t.get(Handle { epoch: 8, id: a.id }), Err(WireError::Stale));
        t.forget("a", FileKind::File);
        assert_eq!(t.get(a), Err(WireError::Stale));
        assert_eq!(t.get(t.root()).unwrap().kind, FileKind::Dir);
    }

    #[test]
    fn the_table_is_bounded_and_never_forgets_the_root() {
        let t = NodeTable::new(1, 16);
        let first = t.put(file("f0", "e"));
        for i in 1..100 {
            t.put(file(&format!("f{i}"), "e"));
        }
        assert_eq!(t.get(first), Err(WireError::Stale));
        assert!(t.get(t.root()).is_ok());
        assert!(t.inner.lock().by_id.len() <= 17);
    }

    #[test]
    fn identities_depend_on_path_kind_and_content() {
        assert_ne!(file_id("a", FileKind::File), file_id("a", FileKind::Dir));
        assert_eq!(
            file_id("a/b", FileKind::File),
            file_id("a/b", FileKind::File)
        );
        let i = |e: &str, s| ObjectInfo {
            size: s,
            etag: e.into(),
            mtime: 0,
        };
        assert_ne!(version(&i("x", 1)), version(&i("x", 2)));
        assert_ne!(version(&i("x", 1)), version(&i("y", 1)));
    }
}
