//! What is at a path, as this origin answers it: from a fresh listing, from the store
//! (HEAD of the key, a one-key listing of the prefix), or, while the store is
//! unreachable, from the listings and lookups kept on disk; the attributes and entries
//! it hands out; and the bookkeeping of changes (expiring cached answers, reporting to
//! subscribers). `learn` is where every new fact about a file enters the handle table, so
//! a changed object is reported whichever request noticed it.

use std::sync::Arc;
use std::time::Instant;

use hoardfs_proto::{Attr, Entry, FileKind, Handle, Timestamp, WireError};

use super::S3Origin;
use super::client::{ObjectInfo, S3Error};
use super::listings::{self, Listed};
use super::location::split;
use super::nodes::{S3Node, file_id, version};
use super::watch;
use crate::Result;

/// Most "no such name" answers remembered.
const NEGATIVE_MAX: usize = 10_000;
/// Directories of at most this many entries are listed again to answer a lookup once
/// their listing expired (larger ones get a HEAD and a one-key listing per name).
const RELIST_MAX: usize = 10_000;

impl S3Origin {
    /// The attributes of directory `path` as this mount last listed it (no request).
    pub(super) fn dir_attr(&self, path: &str) -> Attr {
        let v = self.listings.version(&self.opts.location.dir_prefix(path));
        self.dir_attr_of(path, v)
    }

    /// The attributes of directory `path` for a lookup or a getattr: if this mount has
    /// listed it (and it has at most [`RELIST_MAX`] entries), revalidated with its
    /// listing (a LIST once per TTL), so that names changed elsewhere change its version
    /// and mtime and the kernel drops the listing it keeps. In a parent's READDIRPLUS a
    /// directory costs no request ([`Self::dir_attr`]).
    pub(super) fn revalidated_dir_attr(&self, path: &str) -> Attr {
        let prefix = self.opts.location.dir_prefix(path);
        let listed = self.listings.version(&prefix);
        if listed.is_none_or(|v| v.entries > RELIST_MAX) {
            return self.dir_attr(path);
        }
        if self.served_listing(&prefix).is_none() {
            self.refresher.waited();
            // One page of the subtree revalidates this directory and, when it holds them
            // whole, the directories below: a walk repeated after the TTL then costs a
            // request per small subtree, not one per directory. (A failed listing leaves
            // what was listed last.)
            self.relist_subtree(path, None, 1000);
            if self.listings.fresh(&prefix).is_none() {
                let _ = self.listing(path);
            }
        }
        self.dir_attr(path)
    }

    /// The listing of directory `prefix` if it may be answered from without the store:
    /// fresh, or past its TTL but within the staleness bound, in which case it is listed
    /// again in the background (module `refresher`).
    pub(super) fn served_listing(&self, prefix: &str) -> Option<Arc<listings::Snapshot>> {
        let (snap, age) = self.listings.usable(prefix)?;
        match age {
            listings::Age::Stale(age) => self.refresher.served_stale(prefix, age),
            listings::Age::Fresh if !self.opts.immutable => self.refresher.answered(),
            listings::Age::Fresh => {}
        }
        Some(snap)
    }

    /// This origin's relisting context, reporting to `sink`.
    fn relister<'a>(&'a self, sink: Option<&'a crate::BreakSink>) -> watch::Relister<'a> {
        watch::Relister {
            client: &self.client,
            location: &self.opts.location,
            listings: &self.listings,
            table: &self.table,
            sink,
        }
    }

    /// Lists the keys under directory `path` (after its entry `start_after`) without
    /// delimiter, at most `max_keys` of them, and keeps the listing of every directory
    /// the listing covers whole (`watch::relist_tree`). Returns whether the store
    /// answered.
    pub(super) fn relist_subtree(
        &self,
        path: &str,
        start_after: Option<&str>,
        max_keys: usize,
    ) -> bool {
        if self.opts.watch {
            self.watched.touch(path);
        }
        let sink = self.sink.lock().clone();
        let filled = self.relister(sink.as_ref()).relist_tree(
            path,
            start_after,
            max_keys,
            Some(crate::tree::TREE_TIME_BUDGET),
        );
        match filled {
            Ok(_) => {
                self.reached();
                true
            }
            Err(e) => {
                tracing::debug!("listing {path:?} as a tree: {e}");
                false
            }
        }
    }

    /// The attributes of directory `path` listed as `v`: its version is a hash of the
    /// names, its mtime when this mount first saw those names (the kernel keeps a
    /// directory's listing until its mtime changes). Not listed yet: version 1 and the
    /// mount's start.
    pub(super) fn dir_attr_of(&self, path: &str, v: Option<listings::DirVersion>) -> Attr {
        let (version, mtime) = match v.filter(|v| v.changed_at != 0) {
            Some(v) => (
                v.hash | 2,
                Timestamp {
                    secs: v.changed_at.div_euclid(1_000_000_000),
                    nanos: v.changed_at.rem_euclid(1_000_000_000) as u32,
                },
            ),
            None => (1, self.started),
        };
        Attr {
            file_id: if path.is_empty() {
                1
            } else {
                file_id(path, FileKind::Dir)
            },
            version,
            kind: FileKind::Dir,
            perm: self.opts.dir_mode,
            nlink: 2,
            uid: self.opts.uid,
            gid: self.opts.gid,
            size: 0,
            blocks: 0,
            rdev: 0,
            blksize: 4096,
            atime: mtime,
            mtime,
            ctime: mtime,
            acl: false,
        }
    }

    pub(super) fn file_attr(&self, path: &str, info: &ObjectInfo, version: u64) -> Attr {
        let t = Timestamp {
            secs: info.mtime,
            nanos: 0,
        };
        Attr {
            file_id: file_id(path, FileKind::File),
            version,
            kind: FileKind::File,
            perm: self.opts.file_mode,
            nlink: 1,
            uid: self.opts.uid,
            gid: self.opts.gid,
            size: info.size,
            blocks: info.size.div_ceil(512),
            rdev: 0,
            blksize: 1 << 17,
            atime: t,
            mtime: t,
            ctime: t,
            acl: false,
        }
    }

    /// The entry for a file at `path` as the store last described it (or as staged here).
    pub(super) fn file_entry(&self, path: &str, info: ObjectInfo) -> Entry {
        let staged = self.staging.attr(path, self);
        let attr = staged.unwrap_or_else(|| self.file_attr(path, &info, version(&info)));
        let handle = self.learn(path, info);
        Entry { handle, attr }
    }

    /// Records what the store says the object at `path` is now. If that differs from what
    /// clients were told before, subscribers hear of it: whichever request notices a
    /// change (a lookup, a getattr, a listing) reports it, so none goes unreported.
    pub(super) fn learn(&self, path: &str, info: ObjectInfo) -> Handle {
        let before = self.table.find(&S3Node::key_of(path, FileKind::File));
        let sink = self.sink.lock().clone();
        if let Some(prev) = before.as_ref().and_then(|n| n.info.as_ref())
            && *prev != info
            && let Some(sink) = sink
        {
            sink(vec![hoardfs_proto::Break::Attr {
                file_id: file_id(path, FileKind::File),
                change_id: 0,
            }]);
        }
        self.table.put(S3Node {
            path: path.to_string(),
            kind: FileKind::File,
            info: Some(info),
        })
    }

    pub(super) fn dir_entry(&self, path: &str) -> Entry {
        let handle = self.table.put(S3Node {
            path: path.to_string(),
            kind: FileKind::Dir,
            info: None,
        });
        Entry {
            handle,
            attr: self.dir_attr(path),
        }
    }

    pub(super) fn listed_entry(&self, path: &str, l: &Listed) -> Entry {
        match l {
            Listed::Dir => self.dir_entry(path),
            Listed::File(info) => self.file_entry(path, info.clone()),
        }
    }

    /// One page of the listing of directory `path`, kept if it is the whole directory
    /// (`None`: larger, or the store did not answer; the caller probes the name instead).
    pub(super) fn list_if_small(&self, path: &str) -> Result<Option<Arc<listings::Snapshot>>> {
        if self.opts.watch {
            self.watched.touch(path);
        }
        let sink = self.sink.lock().clone();
        match self.relister(sink.as_ref()).relist_if_small(path) {
            Ok(s) => {
                self.reached();
                Ok(s)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// The listing of the directory at `path`: fresh, or from the store, or (store
    /// unreachable) the last one kept.
    pub(super) fn listing(&self, path: &str) -> Result<Arc<listings::Snapshot>> {
        if self.opts.watch {
            self.watched.touch(path);
        }
        let prefix = self.opts.location.dir_prefix(path);
        if let Some(s) = self.served_listing(&prefix) {
            return Ok(s);
        }
        if self.listings.version(&prefix).is_some() {
            self.refresher.waited();
        }
        let sink = self.sink.lock().clone();
        let r = self.relister(sink.as_ref()).relist(path);
        match r {
            Ok(s) => {
                self.reached();
                Ok(s)
            }
            Err(e) => {
                let e = self.err(e);
                if e.is_offline()
                    && let Some(s) = self.listings.any(&prefix)
                {
                    return Ok(s);
                }
                Err(e)
            }
        }
    }

    pub(super) fn negative_fresh(&self, path: &str) -> bool {
        if self.opts.metadata_ttl.is_zero() && !self.opts.immutable {
            return false;
        }
        let g = self.negative.lock();
        g.get(path)
            .is_some_and(|t| self.opts.immutable || t.elapsed() < self.opts.metadata_ttl)
    }

    pub(super) fn remember_missing(&self, path: &str) {
        let mut g = self.negative.lock();
        if g.len() >= NEGATIVE_MAX {
            g.clear();
        }
        g.insert(path.to_string(), Instant::now());
    }

    /// A change made here: forget cached answers about `path` and its directory.
    pub(super) fn changed(&self, path: &str) {
        self.negative.lock().remove(path);
        let (parent, _) = split(path);
        self.listings.expire(&self.opts.location.dir_prefix(parent));
    }

    /// Tells subscribers (the clients of a server exporting this origin) that `path` now
    /// names an object of kind `now` (`None`: nothing).
    pub(super) fn report(&self, path: &str, now: Option<FileKind>) {
        let Some(sink) = self.sink.lock().clone() else {
            return;
        };
        let (parent, name) = split(path);
        let dir_id = if parent.is_empty() {
            1
        } else {
            file_id(parent, FileKind::Dir)
        };
        let mut breaks = vec![hoardfs_proto::Break::Entry {
            dir_id,
            name: name.as_bytes().to_vec(),
            file_id: now.map(|k| file_id(path, k)),
        }];
        if let Some(k) = now {
            breaks.push(hoardfs_proto::Break::Attr {
                file_id: file_id(path, k),
                change_id: 0,
            });
        }
        sink(breaks);
    }

    /// What is at `path` now: from a fresh listing of its directory if there is one,
    /// else from the store (HEAD of the key, then a one-key listing of the prefix).
    pub(super) fn resolve(&self, path: &str) -> Result<Entry> {
        if let Some(attr) = self.staging.attr(path, self) {
            // Being written here: the staged attributes, and what the store has (if
            // anything) stays known, for change reports.
            let handle = match self.table.find(&S3Node::key_of(path, FileKind::File)) {
                Some(n) => self.table.put((*n).clone()),
                None => self.table.put(S3Node {
                    path: path.into(),
                    kind: FileKind::File,
                    info: None,
                }),
            };
            return Ok(Entry { handle, attr });
        }
        let (parent, name) = split(path);
        if self.opts.watch {
            self.watched.touch(parent);
        }
        let prefix = self.opts.location.dir_prefix(parent);
        let listed = match self.served_listing(&prefix) {
            Some(s) => Some(s),
            // A directory listed before (and not huge) is listed again: one request
            // answers this name and, for the next TTL, its neighbours (`find`, `ls -l`,
            // a build reading a source tree), where a probe would cost two per name.
            None if self
                .listings
                .any(&prefix)
                .is_some_and(|s| s.entries.len() <= RELIST_MAX) =>
            {
                Some(self.listing(parent)?)
            }
            // A directory not listed yet: one request lists it if it is small (most are),
            // which answers this name and its neighbours for the next TTL, where a probe
            // costs two requests per name. A larger one is probed name by name.
            None if self.listings.version(&prefix).is_none() => match self.list_if_small(parent) {
                Ok(s) => s,
                Err(e) => return self.answer_unreachable(path, e),
            },
            None => None,
        };
        if let Some(s) = listed {
            return match s.get(name) {
                Some(l) => Ok(self.listed_entry(path, l)),
                None => Err(WireError::NotFound.into()),
            };
        }
        if self.negative_fresh(path) {
            return Err(WireError::NotFound.into());
        }
        let r = self
            .client
            .any_under(&self.opts.location.dir_prefix(path))
            .and_then(|dir| {
                if dir {
                    return Ok(None);
                }
                self.client.head(&self.opts.location.key(path)).map(Some)
            });
        match r {
            Ok(None) => {
                self.reached();
                self.listings.remember(path, &Listed::Dir);
                Ok(self.dir_entry(path))
            }
            Ok(Some(info)) => {
                self.reached();
                self.listings.remember(path, &Listed::File(info.clone()));
                Ok(self.file_entry(path, info))
            }
            Err(S3Error::NotFound) => {
                self.reached();
                self.remember_missing(path);
                Err(WireError::NotFound.into())
            }
            Err(e) => self.answer_unreachable(path, self.err(e)),
        }
    }

    /// The answer for `path` when asking the store failed with `e`: if the store is
    /// unreachable, from the last listing of its directory, or from what an earlier lookup
    /// of this very name found; else the error.
    fn answer_unreachable(&self, path: &str, e: crate::OriginError) -> Result<Entry> {
        if e.is_offline() {
            let (parent, name) = split(path);
            if let Some(s) = self.listings.any(&self.opts.location.dir_prefix(parent)) {
                return match s.get(name) {
                    Some(l) => Ok(self.listed_entry(path, l)),
                    None => Err(WireError::NotFound.into()),
                };
            }
            if let Some(l) = self.listings.recall(path) {
                return Ok(self.listed_entry(path, &l));
            }
        }
        Err(e)
    }

    /// The node's object as the store has it now (HEAD), or the last seen while the
    /// store is unreachable.
    pub(super) fn current(&self, n: &S3Node) -> Result<ObjectInfo> {
        match self.client.head(&self.opts.location.key(&n.path)) {
            Ok(info) => {
                self.reached();
                self.learn(&n.path, info.clone());
                Ok(info)
            }
            Err(S3Error::NotFound) => {
                self.reached();
                Err(WireError::Stale.into())
            }
            Err(e) => {
                let e = self.err(e);
                match (&n.info, e.is_offline()) {
                    (Some(i), true) => Ok(i.clone()),
                    _ => Err(e),
                }
            }
        }
    }
}
