//! Each directory's version as this mount last listed it ([`Versions`]): what its
//! attributes are made of, kept apart from the snapshots (never evicted with them, so a
//! directory's version does not flip back), and the entries listed under any directory,
//! for the refresher's plans.

use std::collections::BTreeMap;
use std::ops::Bound;

/// What a directory's attributes are made of, as this mount last listed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirVersion {
    /// [`super::Snapshot::names_hash`].
    pub hash: u64,
    /// [`super::Snapshot::changed_at`].
    pub changed_at: i64,
    /// Entries listed.
    pub entries: usize,
}

/// Directories whose version is remembered at most (beyond, the memory starts afresh).
const VERSIONS_MAX: usize = 1 << 20;

/// The versions by directory prefix, in key order (a subtree is a range), with the sum of
/// their entries.
#[derive(Default)]
pub(super) struct Versions {
    map: BTreeMap<String, DirVersion>,
    total: usize,
}

impl Versions {
    /// The version of directory `prefix`.
    pub(super) fn get(&self, prefix: &str) -> Option<DirVersion> {
        self.map.get(prefix).copied()
    }

    /// Records `v` as directory `prefix`'s version.
    pub(super) fn insert(&mut self, prefix: &str, v: DirVersion) {
        if self.map.len() >= VERSIONS_MAX && !self.map.contains_key(prefix) {
            *self = Versions::default();
        }
        self.total += v.entries;
        if let Some(old) = self.map.insert(prefix.to_string(), v) {
            self.total -= old.entries;
        }
    }

    /// Records `v` as directory `prefix`'s version if it has none (and there is room).
    pub(super) fn insert_if_absent(&mut self, prefix: &str, v: DirVersion) {
        if self.map.len() < VERSIONS_MAX && !self.map.contains_key(prefix) {
            self.insert(prefix, v);
        }
    }

    /// Entries listed in `top` and every directory below it (a directory prefix): what
    /// one listing without delimiter of it would read, about. The whole map when every
    /// known directory lies under `top` (the root), else the range of its subtree.
    pub(super) fn entries_under(&self, top: &str) -> usize {
        let (Some((first, _)), Some((last, _))) =
            (self.map.first_key_value(), self.map.last_key_value())
        else {
            return 0;
        };
        // (The prefixes starting with `top` are one range in key order.)
        if first.starts_with(top) && last.starts_with(top) {
            return self.total;
        }
        self.map
            .range::<str, _>((Bound::Included(top), Bound::Unbounded))
            .take_while(|(p, _)| p.starts_with(top))
            .map(|(_, v)| v.entries)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(entries: usize) -> DirVersion {
        DirVersion {
            hash: 0,
            changed_at: 1,
            entries,
        }
    }

    #[test]
    fn entries_under_a_directory_are_those_of_its_subtree_kept_in_sum() {
        let mut vs = Versions::default();
        vs.insert("a/", v(3));
        vs.insert("a/b/", v(2));
        vs.insert("ab/", v(7));
        vs.insert("c/", v(1));
        vs.insert("a/b/", v(5)); // listed again
        vs.insert_if_absent("c/", v(100));
        assert_eq!(vs.entries_under("a/"), 8);
        assert_eq!(vs.entries_under("a/b/"), 5);
        assert_eq!(vs.entries_under("ab/"), 7);
        assert_eq!(vs.entries_under("d/"), 0);
        assert_eq!(vs.entries_under(""), 16, "the root: the sum kept");
        assert_eq!(vs.get("c/").map(|v| v.entries), Some(1));
    }
}
