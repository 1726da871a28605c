//! The S3 origin's handle table: wire handles ↔ paths below the mount's prefix, with what
//! was last learned about each (an object's size and ETag). S3 has no inodes, so a file's
//! identity is its path: `file_id` is a hash of it (stable across restarts and the same
//! on every client), and its `version` a hash of ETag and size, which changes with every
//! new object written there.
//!
//! The table is the shared [`crate::handle_table::HandleTable`]: bounded, epoch-checked,
//! one handle per path and kind.

use hoardfs_proto::FileKind;

use super::client::ObjectInfo;
use crate::handle_table::Keyed;

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

impl S3Node {
    /// The table's key for the object of `kind` at `path`.
    pub fn key_of(path: &str, kind: FileKind) -> (String, bool) {
        (path.to_string(), kind == FileKind::Dir)
    }

    /// The root of the mount.
    pub fn root() -> S3Node {
        S3Node {
            path: String::new(),
            kind: FileKind::Dir,
            info: None,
        }
    }
}

impl Keyed for S3Node {
    /// The path, and whether it is a directory.
    type Key = (String, bool);
    fn key(&self) -> (String, bool) {
        S3Node::key_of(&self.path, self.kind)
    }
}

/// Handles of the objects and directories below the prefix, keyed by path and kind.
pub type NodeTable = crate::handle_table::HandleTable<S3Node>;

#[cfg(test)]
mod tests {
    use super::*;

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
