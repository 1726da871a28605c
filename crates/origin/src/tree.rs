//! Listings of a whole subtree in one call ([`Origin::read_tree`]): the default walk,
//! breadth first over [`Origin::readdir`], with the bounds every implementation keeps.
//!
//! A `hoardfs serve` process answers a client's `ReadTree` request with this walk over
//! its own origin, so that a client walking a tree (`ls -lR`, `find`, a build scanning a
//! toolchain) pays one round trip for many directories instead of one per directory
//! (AFS's bulk status and goofys's one listing per prefix are the models).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use hoardfs_proto::{FileKind, Handle, MAX_TREE_ENTRIES, TreeDir};

use crate::{Origin, OriginError, Result};

/// Time a walk spends at most before it answers with what it has (the requested
/// directory is always complete): a slow origin (an S3 bucket, one LIST per directory)
/// must not hold a request for seconds.
pub const TREE_TIME_BUDGET: Duration = Duration::from_millis(200);

/// Entries of one directory page asked of the origin during a walk.
const PAGE: u32 = 4096;

/// Complete listings of `dir` (file id `dir_id`) and of the directories below it,
/// breadth first, at most `max_entries` entries in all (each directory counts one more),
/// within [`TREE_TIME_BUDGET`]. A directory that would exceed the bound is left out and
/// the walk ends there; one that cannot be listed (removed meanwhile, no permission) is
/// left out and the walk goes on. An error listing `dir` itself is returned.
pub fn walk<O: Origin + ?Sized>(
    origin: &O,
    dir: Handle,
    dir_id: u64,
    max_entries: u32,
) -> Result<Vec<TreeDir>> {
    walk_from(origin, dir, dir_id, max_entries, None)
}

/// [`walk`], leaving out the directories of `dir` (and their subtrees) named up to
/// `after`: a walker that was given those by an earlier call goes on from there.
pub fn walk_from<O: Origin + ?Sized>(
    origin: &O,
    dir: Handle,
    dir_id: u64,
    max_entries: u32,
    after: Option<&[u8]>,
) -> Result<Vec<TreeDir>> {
    let budget = (max_entries as usize).clamp(1, MAX_TREE_ENTRIES);
    let started = Instant::now();
    let mut out: Vec<TreeDir> = Vec::new();
    let mut used = 0usize;
    let mut queue = VecDeque::from([(dir, dir_id)]);
    while let Some((h, id)) = queue.pop_front() {
        let first = out.is_empty();
        if !first && (started.elapsed() >= TREE_TIME_BUDGET || out.len() >= MAX_TREE_ENTRIES) {
            break;
        }
        let entries = match listing(origin, h, budget - used) {
            Ok(Some(e)) => e,
            // Larger than what is left of the bound.
            Ok(None) => break,
            Err(e) if first => return Err(e),
            Err(_) => continue,
        };
        used += entries.len() + 1;
        queue.extend(
            entries
                .iter()
                .filter(|e| e.entry.attr.kind == FileKind::Dir)
                .filter(|e| !first || after.is_none_or(|a| e.name.as_slice() > a))
                .map(|e| (e.entry.handle, e.entry.attr.file_id)),
        );
        out.push(TreeDir {
            file_id: id,
            entries,
        });
        if used >= budget {
            break;
        }
    }
    Ok(out)
}

/// Every entry of directory `dir`, or `None` if it has `room` entries or more.
fn listing<O: Origin + ?Sized>(
    origin: &O,
    dir: Handle,
    room: usize,
) -> Result<Option<Vec<hoardfs_proto::DirEntry>>> {
    let mut entries = Vec::new();
    let mut cookie = 0;
    loop {
        let page = origin.readdir(dir, cookie, PAGE)?;
        entries.extend(page.entries);
        if entries.len() >= room {
            return Ok(None);
        }
        match page.next {
            Some(c) if c != cookie => cookie = c,
            Some(_) => {
                return Err(OriginError::Protocol(
                    "directory page does not advance".into(),
                ));
            }
            None => return Ok(Some(entries)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::LocalOrigin;

    fn tree(root: &std::path::Path) {
        for d in ["a", "a/x", "a/x/deep", "b", "c"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in ["f1", "a/f2", "a/x/f3", "a/x/deep/f4", "b/f5"] {
            std::fs::write(root.join(f), f).unwrap();
        }
    }

    fn names(d: &TreeDir) -> Vec<String> {
        let mut v: Vec<String> = d
            .entries
            .iter()
            .map(|e| String::from_utf8_lossy(&e.name).into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_walk_lists_every_directory_once_breadth_first() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let o = LocalOrigin::new(t.path(), Default::default()).unwrap();
        let root = o.info().unwrap().root;
        let dirs = walk(&o, root.handle, root.attr.file_id, 1000).unwrap();
        assert_eq!(dirs.len(), 6, "root, a, b, c, a/x, a/x/deep");
        assert_eq!(dirs[0].file_id, root.attr.file_id);
        assert_eq!(names(&dirs[0]), ["a", "b", "c", "f1"]);
        // Every listed directory after the first is an entry of one listed before it.
        for (i, d) in dirs.iter().enumerate().skip(1) {
            assert!(
                dirs[..i]
                    .iter()
                    .any(|p| p.entries.iter().any(|e| e.entry.attr.file_id == d.file_id)),
                "directory {i} appears before its parent"
            );
        }
        let deepest = dirs.last().unwrap();
        assert_eq!(names(deepest), ["f4"]);
    }

    #[test]
    fn a_walk_stops_at_its_bound_with_whole_directories_only() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let o = LocalOrigin::new(t.path(), Default::default()).unwrap();
        let root = o.info().unwrap().root;
        // Root (4 entries + 1) fills a bound of 5 exactly.
        let dirs = walk(&o, root.handle, root.attr.file_id, 5).unwrap();
        assert_eq!(dirs.len(), 1);
        assert_eq!(dirs[0].entries.len(), 4);
        // Whatever the bound, each listing is complete and all of them fit in it.
        let full = walk(&o, root.handle, root.attr.file_id, 1000).unwrap();
        for bound in 4..20 {
            let dirs = walk(&o, root.handle, root.attr.file_id, bound).unwrap();
            let used: usize = dirs.iter().map(|d| d.entries.len() + 1).sum();
            assert!(used <= bound as usize, "bound {bound}: {used}");
            for d in &dirs {
                let whole = full.iter().find(|f| f.file_id == d.file_id).unwrap();
                assert_eq!(names(d), names(whole), "bound {bound}");
            }
        }
        // A top directory larger than the bound gives nothing: the caller lists it by pages.
        assert!(
            walk(&o, root.handle, root.attr.file_id, 3)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_walk_goes_on_after_the_directories_already_given() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let o = LocalOrigin::new(t.path(), Default::default()).unwrap();
        let root = o.info().unwrap().root;
        let all = walk(&o, root.handle, root.attr.file_id, 1000).unwrap();
        let top: Vec<&[u8]> = all[0]
            .entries
            .iter()
            .filter(|e| e.entry.attr.kind == FileKind::Dir)
            .map(|e| e.name.as_slice())
            .collect();
        assert!(
            top.len() >= 2,
            "the fixture has several directories at the top"
        );
        let rest = walk_from(&o, root.handle, root.attr.file_id, 1000, Some(top[0])).unwrap();
        assert_eq!(
            rest[0].file_id, root.attr.file_id,
            "the top is always given"
        );
        let skipped = all[0].entries.iter().find(|e| e.name == top[0]).unwrap();
        assert!(rest.iter().all(|d| d.file_id != skipped.entry.attr.file_id));
        assert!(rest.len() < all.len());
    }

    #[test]
    fn a_walk_of_something_that_is_not_a_directory_fails() {
        let t = tempfile::tempdir().unwrap();
        tree(t.path());
        let o = LocalOrigin::new(t.path(), Default::default()).unwrap();
        let root = o.info().unwrap().root;
        let f = o.lookup(root.handle, b"f1").unwrap();
        assert!(walk(&o, f.handle, f.attr.file_id, 100).is_err());
    }
}
