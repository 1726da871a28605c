//! The names a restored namespace shows, made to agree with the log of offline changes
//! (`crate::offline::cml`): a saved namespace may predate the log's latest changes.

use std::sync::Arc;

use crate::nodes::{Node, NodeTable};
use crate::offline::cml::ChangeLog;
use crate::offline::made::{LOCAL_ID, made_attr};

/// Makes the names this client shows agree with the log of offline changes, after a
/// saved namespace was restored (it may predate the log's latest changes): objects
/// the log removes leave their names, moved ones go to their new ones, and objects
/// made offline that the saved namespace lacks are added (parents before children).
pub(crate) fn log_into_view(nodes: &NodeTable, log: &ChangeLog) {
    use crate::offline::cml::Kind;
    use hoardfs_origin::FileKind;
    let mut records: Vec<_> = log.records().into_iter().map(|(_, r)| r).collect();
    // Objects made offline whose change is gone (cancelled, or turned into a
    // document's content) are not anywhere.
    let logged: std::collections::HashSet<u64> = records.iter().map(|r| r.file_id).collect();
    for n in nodes.all() {
        let (file_id, parent, name) = {
            let st = n.state.lock();
            (st.origin_attr().file_id, st.parent(), st.name().to_vec())
        };
        if file_id & LOCAL_ID != 0 && !logged.contains(&file_id) {
            if let Some(p) = nodes.get(parent) {
                let mut st = p.state.lock();
                if st.child(&name) == Some(n.ino) {
                    st.remove_local_entry(&name);
                }
            }
            nodes.unbind_file_id(n.ino, file_id);
            n.state.lock().mark_deleted();
        }
    }
    records.sort_by_key(|r| (!r.removes(), r.path.len()));
    for r in records {
        let node = nodes.by_file_id(r.file_id);
        let detach = |n: &Node| {
            let (parent, name) = {
                let st = n.state.lock();
                (st.parent(), st.name().to_vec())
            };
            if let Some(p) = nodes.get(parent) {
                let mut st = p.state.lock();
                // (Only its own name: another object may have it by now.)
                if st.child(&name) == Some(n.ino) {
                    st.remove_local_entry(&name);
                }
            }
        };
        if r.removes() {
            if let Some(n) = node {
                detach(&n);
                nodes.unbind_file_id(n.ino, r.file_id);
                n.state.lock().mark_deleted();
            }
            continue;
        }
        let Some((name, dirs)) = r.path.split_last() else {
            continue;
        };
        let mut parent = nodes.get(crate::ROOT_INO);
        for d in dirs {
            let child = parent.and_then(|p| p.state.lock().child(d));
            parent = child.and_then(|c| nodes.get(c));
        }
        let Some(parent) = parent.filter(|p| p.kind == FileKind::Dir) else {
            tracing::warn!(
                "an offline change's directory is not in the saved names: {} is not \
                 shown until it is sent back",
                String::from_utf8_lossy(&r.path.join(&b'/'))
            );
            continue;
        };
        let (handle, attr, ino) = match node {
            Some(n) => {
                let at = {
                    let st = n.state.lock();
                    (st.parent(), st.name().to_vec())
                };
                if at == (parent.ino, name.clone()) {
                    continue;
                }
                detach(&n);
                n.state.lock().moved(parent.ino, name);
                let st = n.state.lock();
                (st.handle(), st.origin_attr(), n.ino)
            }
            None if r.creates() || r.kind == Kind::Create => {
                let kind = match r.kind {
                    Kind::Mkdir => FileKind::Dir,
                    Kind::Symlink => FileKind::Symlink,
                    _ => FileKind::File,
                };
                let t = hoardfs_origin::Timestamp {
                    secs: r.since as i64,
                    nanos: 0,
                };
                let owner = hoardfs_origin::Owner {
                    uid: r.uid,
                    gid: r.gid,
                };
                let size = r.target.len() as u64;
                let attr = made_attr(r.file_id, kind, r.perm, owner, size, t);
                let handle = hoardfs_origin::Handle { epoch: 0, id: 0 };
                let Some(n) = nodes.restore(parent.ino, name, handle, attr) else {
                    continue;
                };
                if kind == FileKind::Dir {
                    n.state.lock().keep_listing(Arc::new(crate::Listing {
                        entries: Vec::new(),
                        fetched: std::time::Instant::now(),
                        since: 0,
                    }));
                }
                (handle, attr, n.ino)
            }
            // An object of the origin this client never looked up: nothing to show.
            None => continue,
        };
        let entry = hoardfs_origin::DirEntry {
            name: name.clone(),
            entry: hoardfs_origin::Entry { handle, attr },
        };
        parent.state.lock().add_local_entry(entry, ino);
    }
}
