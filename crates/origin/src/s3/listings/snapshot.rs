//! One directory's listing ([`Snapshot`]): the pages of a delimiter listing, or one
//! listing without delimiter of a whole subtree, folded into sorted entries by the same
//! rules (common prefixes are directories, keys are files, the `DIR/` marker itself is
//! not an entry, a directory shadows a file of the same name, names that cannot be path
//! components are left out).

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::s3::client::{ListPage, ObjectInfo};
use crate::s3::location::valid_name;

/// What a name in a directory is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Listed {
    /// An object.
    File(ObjectInfo),
    /// A common prefix (or a marker object).
    Dir,
}

/// One directory's listing.
#[derive(Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// Entries sorted by name.
    pub entries: Vec<(String, Listed)>,
    /// When it was listed (seconds since the epoch).
    pub listed_at: i64,
    /// When this mount first saw the directory's names as they are here (nanoseconds
    /// since the epoch; 0 until kept): the directory's mtime, so that the kernel's copy
    /// of a listing is dropped when a revalidation finds other names.
    pub changed_at: i64,
}

impl Snapshot {
    /// Folds listing pages of `prefix` into a snapshot.
    pub fn from_pages(prefix: &str, pages: Vec<ListPage>) -> Snapshot {
        let mut m: BTreeMap<String, Listed> = BTreeMap::new();
        for page in pages {
            for (key, info) in page.objects {
                if let Some(name) = key.strip_prefix(prefix)
                    && valid_name(name)
                    && !matches!(m.get(name), Some(Listed::Dir))
                {
                    m.insert(name.to_string(), Listed::File(info));
                }
            }
            for p in page.prefixes {
                if let Some(name) = p.strip_prefix(prefix).and_then(|n| n.strip_suffix('/'))
                    && valid_name(name)
                {
                    m.insert(name.to_string(), Listed::Dir);
                }
            }
        }
        Snapshot {
            entries: m.into_iter().collect(),
            listed_at: now_unix(),
            changed_at: 0,
        }
    }

    /// A hash of the names and kinds listed (the directory's version).
    pub fn names_hash(&self) -> u64 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        for (name, l) in &self.entries {
            h.update(name.as_bytes());
            h.update(&[0, matches!(l, Listed::Dir) as u8]);
        }
        h.digest()
    }

    /// The listings of directory `top` (a prefix: empty or ending in `/`) and of every
    /// directory below it, folded from the keys of one listing without delimiter, in key
    /// order, by the rules of [`Snapshot::from_pages`]. With `complete` false the keys end
    /// somewhere in the middle, and only the directories whose keys all came are returned
    /// (keys under one prefix are contiguous in key order, so those are the directories
    /// the last key is not under; never `top`). With `from_start` false the keys start
    /// after some key under `top` (a listing with `start-after` a name in it): `top` is
    /// not returned either. Returned as (prefix, snapshot).
    pub fn tree_from_flat(
        top: &str,
        objects: &[(String, ObjectInfo)],
        complete: bool,
        from_start: bool,
    ) -> Vec<(String, Snapshot)> {
        let mut dirs: BTreeMap<String, BTreeMap<String, Listed>> = BTreeMap::new();
        dirs.insert(top.to_string(), BTreeMap::new());
        for (key, info) in objects {
            let Some(rest) = key.strip_prefix(top) else {
                continue;
            };
            let parts: Vec<&str> = rest.split('/').collect();
            let mut dir = top.to_string();
            for (i, part) in parts.iter().enumerate() {
                if i + 1 == parts.len() {
                    // A file, or (empty: the key ends in `/`) the marker of `dir`.
                    if valid_name(part) {
                        let m = dirs.entry(dir.clone()).or_default();
                        if !matches!(m.get(*part), Some(Listed::Dir)) {
                            m.insert(part.to_string(), Listed::File(info.clone()));
                        }
                    }
                    break;
                }
                if !valid_name(part) {
                    break; // no path leads below a name that cannot be one
                }
                dirs.entry(dir.clone())
                    .or_default()
                    .insert(part.to_string(), Listed::Dir);
                dir = format!("{dir}{part}/");
                dirs.entry(dir.clone()).or_default();
            }
        }
        let last = objects.last().map(|(k, _)| k.as_str());
        let listed_at = now_unix();
        dirs.into_iter()
            .filter(|(prefix, _)| from_start || prefix != top)
            .filter(|(prefix, _)| complete || last.is_some_and(|k| !k.starts_with(prefix.as_str())))
            .map(|(prefix, m)| {
                let snap = Snapshot {
                    entries: m.into_iter().collect(),
                    listed_at,
                    changed_at: 0,
                };
                (prefix, snap)
            })
            .collect()
    }

    /// The entry called `name`.
    pub fn get(&self, name: &str) -> Option<&Listed> {
        self.entries
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()
            .map(|i| &self.entries[i].1)
    }
}

/// Seconds since the epoch, now.
pub(super) fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::s3) fn info(size: u64) -> ObjectInfo {
        ObjectInfo {
            size,
            etag: format!("e{size}").into(),
            mtime: 1,
        }
    }

    #[test]
    fn pages_fold_into_one_sorted_listing() {
        let pages = vec![
            ListPage {
                objects: vec![
                    ("p/".into(), info(0)),
                    ("p/b".into(), info(2)),
                    ("p/..".into(), info(3)),
                    ("p/same".into(), info(4)),
                ],
                prefixes: vec!["p/a/".into(), "p//".into()],
                next: Some("t".into()),
            },
            ListPage {
                objects: vec![("p/c".into(), info(5))],
                prefixes: vec!["p/same/".into()],
                next: None,
            },
        ];
        let s = Snapshot::from_pages("p/", pages);
        let names: Vec<&str> = s.entries.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "same"]);
        assert_eq!(
            s.get("same"),
            Some(&Listed::Dir),
            "a directory shadows a file"
        );
        assert_eq!(s.get("b"), Some(&Listed::File(info(2))));
        assert_eq!(s.get("zzz"), None);
    }

    #[test]
    fn one_listing_without_delimiter_folds_into_the_listings_of_a_tree() {
        let keys = |ks: &[&str]| -> Vec<(String, ObjectInfo)> {
            ks.iter()
                .map(|k| (k.to_string(), info(k.len() as u64)))
                .collect()
        };
        // In key order, as a store returns them.
        let objects = keys(&[
            "p/a/", "p/a/b/c", "p/a/f", "p/a//x", "p/b", "p/b/g", "p/c/../h", "p/e",
        ]);
        let delimited = |prefix: &str| {
            // What the delimiter listing of `prefix` would hold, from the same keys.
            let mut page = ListPage::default();
            for (k, i) in &objects {
                let Some(rest) = k.strip_prefix(prefix) else {
                    continue;
                };
                match rest.find('/') {
                    Some(at) => {
                        let p = format!("{prefix}{}", &rest[..=at]);
                        if !page.prefixes.contains(&p) {
                            page.prefixes.push(p);
                        }
                    }
                    None => page.objects.push((k.clone(), i.clone())),
                }
            }
            Snapshot::from_pages(prefix, vec![page]).entries
        };
        let tree = Snapshot::tree_from_flat("p/", &objects, true, true);
        let prefixes: Vec<&str> = tree.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(prefixes, ["p/", "p/a/", "p/a/b/", "p/b/", "p/c/"]);
        for (prefix, snap) in &tree {
            assert_eq!(snap.entries, delimited(prefix), "{prefix}");
        }
        // Cut after "p/a/f": only directories the last key is not under are whole.
        let cut = Snapshot::tree_from_flat("p/", &objects[..3], false, true);
        let prefixes: Vec<&str> = cut.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(prefixes, ["p/a/b/"]);
        assert!(Snapshot::tree_from_flat("p/", &[], false, true).is_empty());
        // Started after "p/a" (its keys onwards): every directory but the top is whole.
        let after = Snapshot::tree_from_flat("p/", &objects, true, false);
        let prefixes: Vec<&str> = after.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(prefixes, ["p/a/", "p/a/b/", "p/b/", "p/c/"]);
    }
}
