//! Change reports for an S3 origin that serves other clients (`hoardfs serve --origin
//! s3://…`): S3 has no notifications, so the directories clients use are listed again
//! every `--metadata-ttl`, and the differences become callback breaks. One listing per
//! directory per period replaces a HEAD per file per client: the store's load no longer
//! grows with the number of clients.
//!
//! Watched directories ([`Watched`]): those listed, or with names looked up, most
//! recently (at most [`MAX_WATCHED`]); the others are forgotten and a client that still
//! holds their entries revalidates by time when its callback expires. Every listing goes
//! through a [`Relister`], whoever asks (a reader, the refresher, the tier's
//! `super::poller::Poller`), so that no change is absorbed unreported.

use std::collections::HashMap;
use std::sync::Arc;

use hoardfs_proto::{Break, FileKind};
use parking_lot::Mutex;

use super::client::S3Client;
use super::listings::{Listed, Listings, Snapshot};
use super::location::{S3Location, join};
use super::nodes::{NodeTable, S3Node, file_id, version};
use crate::BreakSink;

/// Most directories listed again each period.
pub const MAX_WATCHED: usize = 1024;

/// The directories to watch, by recency of use.
#[derive(Default)]
pub struct Watched {
    dirs: Mutex<(HashMap<String, u64>, u64)>,
}

impl Watched {
    /// A client used directory `path`.
    pub fn touch(&self, path: &str) {
        let mut g = self.dirs.lock();
        let (m, clock) = &mut *g;
        *clock += 1;
        let now = *clock;
        m.insert(path.to_string(), now);
        if m.len() > MAX_WATCHED {
            let mut uses: Vec<u64> = m.values().copied().collect();
            uses.sort_unstable();
            let cut = uses[uses.len() - MAX_WATCHED];
            m.retain(|_, u| *u >= cut);
        }
    }

    /// The directories watched now.
    pub fn list(&self) -> Vec<String> {
        self.dirs.lock().0.keys().cloned().collect()
    }
}

/// What relisting needs: the store, the listings it keeps, the handle table, and where
/// changes are reported (a tier's subscribers; `None` for a mount).
pub struct Relister<'a> {
    /// The store.
    pub client: &'a S3Client,
    /// Paths ↔ keys.
    pub location: &'a S3Location,
    /// The listings kept.
    pub listings: &'a Listings,
    /// What clients were told of files.
    pub table: &'a NodeTable,
    /// Where changes go.
    pub sink: Option<&'a BreakSink>,
}

impl Relister<'_> {
    /// Lists directory `dir` again and, with a `sink`, reports what changed since the last
    /// listing (or since what clients were told of its files): every listing goes through
    /// here, whoever asked for it, so no change is absorbed unreported.
    pub fn relist(&self, dir: &str) -> super::client::S3Result<Arc<Snapshot>> {
        let prefix = self.location.dir_prefix(dir);
        let old = self.sink.and_then(|_| self.listings.any(&prefix));
        let new = self.listings.refresh(self.client, &prefix)?;
        self.report(dir, old.as_deref(), &new);
        Ok(new)
    }

    /// Lists directory `dir` with one request and keeps the listing if that was all of it
    /// (`None`: more than a page, nothing kept), reporting changes as [`Relister::relist`].
    pub fn relist_if_small(&self, dir: &str) -> super::client::S3Result<Option<Arc<Snapshot>>> {
        let prefix = self.location.dir_prefix(dir);
        let old = self.sink.and_then(|_| self.listings.any(&prefix));
        let new = self.listings.refresh_if_small(self.client, &prefix)?;
        if let Some(new) = &new {
            self.report(dir, old.as_deref(), new);
        }
        Ok(new)
    }

    /// Reports to the sink (if any) what changed in directory `dir` from `old` to `new`.
    fn report(&self, dir: &str, old: Option<&Snapshot>, new: &Snapshot) {
        if let Some(sink) = self.sink {
            let breaks = diff(dir, old, new, self.table);
            if !breaks.is_empty() {
                tracing::debug!("{} changes seen in {dir:?}", breaks.len());
                sink(breaks);
            }
        }
    }

    /// Lists the keys under directory `dir` (after its entry `start_after`, if given) in one
    /// listing without delimiter (pages of 1,000 keys, at most `max_keys` keys and, if
    /// given, `budget` of time: a reader waiting on it is given
    /// [`crate::tree::TREE_TIME_BUDGET`]) and keeps
    /// the listing of every directory it covers whole, reporting what changed in each as
    /// [`Relister::relist`] does: a walk of a tree of many small directories then costs a request per
    /// 1,000 keys instead of one per directory (goofys lists a prefix the same way).
    /// Returns the number of directories kept.
    pub fn relist_tree(
        &self,
        dir: &str,
        start_after: Option<&str>,
        max_keys: usize,
        budget: Option<std::time::Duration>,
    ) -> super::client::S3Result<usize> {
        let started = std::time::Instant::now();
        let top = self.location.dir_prefix(dir);
        let changes = self.listings.changes();
        let mut objects: Vec<(String, super::client::ObjectInfo)> = Vec::new();
        let mut token: Option<String> = None;
        let after = start_after.map(|name| format!("{top}{name}"));
        let complete = loop {
            let page =
                self.client
                    .list_flat_page(&top, token.as_deref(), after.as_deref(), 1000)?;
            if page.next.is_some() && page.next == token {
                return Err(super::client::S3Error::Protocol(format!(
                    "the listing of {top:?} does not end"
                )));
            }
            objects.extend(page.objects);
            token = page.next;
            if token.is_none() {
                break true;
            }
            if objects.len() >= max_keys || budget.is_some_and(|b| started.elapsed() >= b) {
                break false;
            }
        };
        // What is whole is told by the key order: a store that lists in another order (S3
        // Express directory buckets do) gives nothing to keep unless the listing is complete
        // and from the start.
        let ordered = objects.windows(2).all(|w| w[0].0 < w[1].0);
        let usable = ordered || (complete && after.is_none());
        if !usable {
            return Ok(0);
        }
        let dirs = Snapshot::tree_from_flat(&top, &objects, complete, after.is_none());
        let kept = dirs.len();
        for (prefix, snap) in dirs {
            let Some(path) = self.location.dir_path(&prefix) else {
                continue;
            };
            let old = self.sink.and_then(|_| self.listings.any(&prefix));
            let snap = self.listings.install(&prefix, snap, changes);
            self.report(&path, old.as_deref(), &snap);
        }
        Ok(kept)
    }
}

/// The breaks that take clients from `old` (and what `table` knows of the files) to
/// `new`; files whose object changed get their new information in `table`.
pub fn diff(dir: &str, old: Option<&Snapshot>, new: &Snapshot, table: &NodeTable) -> Vec<Break> {
    let dir_id = if dir.is_empty() {
        1
    } else {
        file_id(dir, FileKind::Dir)
    };
    let mut out = Vec::new();
    let id_of = |path: &str, l: &Listed| match l {
        Listed::Dir => file_id(path, FileKind::Dir),
        Listed::File(_) => file_id(path, FileKind::File),
    };
    let mut dir_changed = false;
    for (name, l) in &new.entries {
        let path = join(dir, name);
        let before = old.and_then(|o| o.get(name));
        if let Listed::File(info) = l {
            // What clients were told last (the table), else the last listing.
            let was = table
                .find(&S3Node::key_of(&path, FileKind::File))
                .and_then(|n| n.info.clone())
                .or_else(|| match before {
                    Some(Listed::File(i)) => Some(i.clone()),
                    _ => None,
                });
            if was.as_ref().is_some_and(|w| version(w) != version(info)) {
                out.push(Break::Attr {
                    file_id: file_id(&path, FileKind::File),
                    change_id: 0,
                });
                table.refresh(S3Node {
                    path: path.clone(),
                    kind: FileKind::File,
                    info: Some(info.clone()),
                });
            }
        }
        let kind_changed =
            before.is_some_and(|b| std::mem::discriminant(b) != std::mem::discriminant(l));
        if old.is_some() && (before.is_none() || kind_changed) {
            dir_changed = true;
            out.push(Break::Entry {
                dir_id,
                name: name.clone().into_bytes(),
                file_id: Some(id_of(&path, l)),
            });
        }
    }
    if let Some(o) = old {
        for (name, _) in &o.entries {
            if new.get(name).is_none() {
                dir_changed = true;
                out.push(Break::Entry {
                    dir_id,
                    name: name.clone().into_bytes(),
                    file_id: None,
                });
            }
        }
    }
    if dir_changed {
        out.push(Break::Attr {
            file_id: dir_id,
            change_id: 0,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::client::ObjectInfo;
    use super::*;

    fn snap(entries: &[(&str, Option<&str>)]) -> Snapshot {
        Snapshot {
            changed_at: 0,
            entries: entries
                .iter()
                .map(|(n, e)| {
                    let l = match e {
                        Some(e) => Listed::File(ObjectInfo {
                            size: 1,
                            etag: (*e).into(),
                            mtime: 0,
                        }),
                        None => Listed::Dir,
                    };
                    (n.to_string(), l)
                })
                .collect(),
            listed_at: 0,
        }
    }

    #[test]
    fn listing_differences_become_breaks() {
        let t = NodeTable::new(1, 100, S3Node::root());
        let old = snap(&[("a", Some("1")), ("b", Some("1")), ("d", None)]);
        let new = snap(&[("a", Some("2")), ("c", Some("1")), ("d", None)]);
        let b = diff("x", Some(&old), &new, &t);
        assert!(b.contains(&Break::Attr {
            file_id: file_id("x/a", FileKind::File),
            change_id: 0
        }));
        assert!(b.contains(&Break::Entry {
            dir_id: file_id("x", FileKind::Dir),
            name: b"b".to_vec(),
            file_id: None
        }));
        assert!(b.contains(&Break::Entry {
            dir_id: file_id("x", FileKind::Dir),
            name: b"c".to_vec(),
            file_id: Some(file_id("x/c", FileKind::File))
        }));
        assert!(b.contains(&Break::Attr {
            file_id: file_id("x", FileKind::Dir),
            change_id: 0
        }));
        assert_eq!(b.len(), 4);
        assert!(
            diff("x", Some(&new), &new, &t).is_empty(),
            "no change, no break"
        );
    }

    #[test]
    fn a_file_looked_up_before_its_first_listing_is_compared_too() {
        let t = NodeTable::new(1, 100, S3Node::root());
        t.put(S3Node {
            path: "f".into(),
            kind: FileKind::File,
            info: Some(ObjectInfo {
                size: 1,
                etag: "old".into(),
                mtime: 0,
            }),
        });
        let new = snap(&[("f", Some("new"))]);
        let b = diff("", None, &new, &t);
        assert_eq!(
            b,
            vec![Break::Attr {
                file_id: file_id("f", FileKind::File),
                change_id: 0
            }]
        );
        assert_eq!(
            t.find(&S3Node::key_of("f", FileKind::File))
                .unwrap()
                .info
                .as_ref()
                .unwrap()
                .etag,
            "new".into()
        );
    }
}
