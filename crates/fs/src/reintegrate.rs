//! Reintegration: sending the changes of `--offline-writes` back to the origin once it is
//! reachable, oldest first.
//!
//! Changes of different paths are independent and go [`SENDERS`] at a time; of several
//! changes to one path (a file removed, another created under its name), only the oldest
//! goes in a pass. For each
//! pending file the path recorded at its first change is looked up from the root. If it still names the same object at the **base version** the change started
//! from, the staged content is written over it (whole, then truncated to its size,
//! published and fsynced), and the change is done. If the file changed on the origin
//! meanwhile, or was removed or replaced by another file, or its directory is gone, the
//! origin's version stays where it is and this client's is written next to it as
//! `NAME.conflict-HOST-TIME` (in the root directory, with the path's components joined by
//! `_`, when the directory is gone); the conflict is logged and listed by
//! `hoardfs conflicts`. A file sent back is fetched again into the cache at its new
//! version, so that it can be changed offline again. Nothing is dropped: a change that cannot be sent for any other
//! reason (permissions, a full disk on the server) stays pending and is tried again later.
//!
//! Idempotent across a client killed in the middle: the record says `Uploading` (durably)
//! before the first byte goes out, and a change found `Uploading` is sent again whole
//! over the same object whatever its version, since that version may be its own half
//! upload. (A change made on the origin to that file between the crash and the next
//! attempt is then overwritten.) An upload that fails without a crash (the origin went
//! away again, or refused) records the version the origin reported after its last write
//! (`Resume`), and the next attempt goes on only if the file is still at that version;
//! otherwise somebody else changed it, and this client's version becomes a conflict copy.

use std::time::{SystemTime, UNIX_EPOCH};

use hoardfs_origin::{Entry, Handle, Owner, SetAttrs, WireError};

use crate::cml::{Conflict, Inner, Kind, Pending, Phase, now_secs};
use std::sync::atomic::Ordering;

use crate::nodes::Ino;
use crate::{FsError, FsResult, HoardFs};

/// Bytes per write when sending a staged file back.
const PIECE: usize = 1 << 20;

/// What one pass of [`HoardFs::reintegrate`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reintegrated {
    /// Changes written over their file.
    pub sent: u64,
    /// Changes written to a conflict copy.
    pub conflicts: u64,
    /// Changes still pending.
    pub left: u64,
}

/// How a change went back.
enum Outcome {
    /// Written over its file, which now has these attributes (and this node, if known).
    Sent(hoardfs_origin::Attr, Option<Ino>),
    /// Created as this origin object (and this node, if known).
    Created(Entry, Option<Ino>),
    /// Removed (or found gone already).
    Removed,
    Conflict(Conflict),
}

/// Changes sent at once.
const SENDERS: usize = 8;

/// A UTC time as `YYYYMMDDTHHMMSSZ` (civil-from-days, proleptic Gregorian).
fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn shown(path: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for c in path {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    s
}

impl HoardFs {
    /// Sends pending offline changes back, oldest first, until one cannot be sent because
    /// the origin is unreachable. Safe to call at any time and from any thread (one pass
    /// at a time).
    pub fn reintegrate(&self) -> Reintegrated {
        let Some(off) = &self.offline else {
            return Reintegrated::default();
        };
        let _one_pass = self.reintegrating.lock();
        // One change per path per pass, the oldest: a file removed and another created
        // under its name must reach the origin in that order (the next pass sends the
        // rest).
        // Removals go first: a file created offline may have been renamed to a name
        // whose (older) file was removed after it was created.
        let pending: Vec<_> = off
            .log
            .all()
            .into_iter()
            .map(|p| {
                let (path, kind) = {
                    let g = p.lock();
                    (g.record().path.clone(), g.record().kind)
                };
                (p, path, kind)
            })
            .collect();
        let removing: std::collections::HashSet<_> = pending
            .iter()
            .filter(|(_, _, k)| *k == Kind::Remove)
            .map(|(_, path, _)| path.clone())
            .collect();
        let mut paths = std::collections::HashSet::new();
        let (all, waiting): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(_, path, kind)| {
            (*kind == Kind::Remove || !removing.contains(path)) && paths.insert(path.clone())
        });
        let all: Vec<_> = all.into_iter().map(|(p, _, _)| p).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stopped = std::sync::atomic::AtomicBool::new(false);
        let totals = parking_lot::Mutex::new((Reintegrated::default(), Vec::new()));
        // Changes of different files are independent: a few are sent at once (each
        // costs round trips and a server fsync), oldest first.
        let workers = SENDERS.min(all.len());
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        let Some(p) = all.get(i) else { return };
                        if stopped.load(Ordering::SeqCst) {
                            totals.lock().0.left += 1;
                            continue;
                        }
                        let outcome = self.send_back(p);
                        let mut t = totals.lock();
                        match outcome {
                            Ok(Some(Outcome::Sent(_, ino) | Outcome::Created(_, ino))) => {
                                t.0.sent += 1;
                                t.1.extend(ino);
                            }
                            Ok(Some(Outcome::Removed)) => t.0.sent += 1,
                            Ok(Some(Outcome::Conflict(c))) => {
                                tracing::warn!(
                                    "conflict: {} changed on the server while this client \
                                     changed it offline ({}); this client's version is at {}",
                                    c.path,
                                    c.reason,
                                    c.copy
                                );
                                off.log.record_conflict(&c);
                                t.0.conflicts += 1;
                            }
                            Ok(None) => {}
                            Err(FsError::Offline(why)) => {
                                tracing::debug!("reintegration paused: {why}");
                                stopped.store(true, Ordering::SeqCst);
                                t.0.left += 1;
                            }
                            Err(e) => {
                                tracing::error!(
                                    file_id = p.file_id,
                                    "an offline change cannot be sent back now (kept, tried \
                                     again later): {e}"
                                );
                                t.0.left += 1;
                            }
                        }
                    }
                });
            }
        });
        let (mut r, sent) = totals.into_inner();
        r.left += waiting.len() as u64;
        // Cached again (fetched at the origin's new version), so that the files can be
        // changed offline at the next disconnection; after the log is empty, not before.
        for ino in sent {
            if let Err(e) = self.prefetch(ino) {
                tracing::debug!(ino, "refetching a file sent back failed: {e}");
            }
        }
        r
    }

    /// Number of changes waiting to be sent back.
    pub fn pending_changes(&self) -> u64 {
        self.offline.as_ref().map_or(0, |o| o.log.count() as u64)
    }

    /// Sends one change back (under its lock, so writes to the file wait); `None` if it
    /// was done already.
    fn send_back(&self, p: &Pending) -> FsResult<Option<Outcome>> {
        let off = self
            .offline
            .as_ref()
            .expect("called with offline writes on");
        let mut g = p.lock();
        if g.is_gone() {
            return Ok(None);
        }
        let rec = g.record().clone();
        let Some((name, dirs)) = rec.path.split_last() else {
            return Err(FsError::Origin(WireError::Invalid));
        };
        let root = self.origin.info()?.root.handle;
        let mut dir = Some(root);
        for c in dirs {
            let Some(d) = dir else { break };
            dir = match self.origin.lookup(d, c) {
                Ok(e) => Some(e.handle),
                Err(hoardfs_origin::OriginError::Fs(WireError::NotFound | WireError::NotDir)) => {
                    None
                }
                Err(e) => return Err(e.into()),
            };
        }
        let found = match dir {
            Some(d) => match self.origin.lookup(d, name) {
                Ok(e) => Some(e),
                Err(hoardfs_origin::OriginError::Fs(WireError::NotFound)) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        // Whether the file holds what this change started from (or this change's own
        // half upload).
        let phase_allows = |e: &Entry| match rec.phase {
            Phase::Staged => e.attr.version == rec.base_version,
            Phase::Uploading => true,
            Phase::Resume { expected } => e.attr.version == expected,
        };
        let outcome = match (rec.kind, &dir, found) {
            (Kind::Remove, Some(d), Some(e)) if e.attr.file_id == rec.file_id => {
                // (Or this client's own half upload of a change it then removed.)
                if phase_allows(&e) {
                    self.origin.unlink(*d, name)?;
                    Outcome::Removed
                } else {
                    Outcome::Conflict(Conflict {
                        at: now_secs(),
                        path: shown(&rec.path),
                        copy: shown(&rec.path),
                        reason: "removed here, but changed on the server: the server's \
                                 version is kept"
                            .into(),
                    })
                }
            }
            // Gone already, or the name is another file's now: nothing of ours to remove.
            (Kind::Remove, _, _) => Outcome::Removed,
            (Kind::Store, Some(_), Some(e))
                if e.attr.file_id == rec.file_id && phase_allows(&e) =>
            {
                let attr = self.send_content(&mut g, e.handle, e.attr.version)?;
                Outcome::Sent(attr, None)
            }
            (Kind::Create, Some(_), Some(e))
                if rec.created == Some(e.attr.file_id) && phase_allows(&e) =>
            {
                self.send_created(&mut g, &e)?
            }
            (Kind::Create, Some(d), None) => {
                let owner = Owner {
                    uid: rec.uid,
                    gid: rec.gid,
                };
                match self
                    .origin
                    .create(*d, name, u32::from(rec.perm), true, owner)
                {
                    Ok(e) => {
                        g.created(e.attr.file_id, e.attr.version)
                            .map_err(crate::offline::kept)?;
                        self.send_created(&mut g, &e)?
                    }
                    // Taken meanwhile: next time round it is a conflict.
                    Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => return Ok(None),
                    Err(e) => return Err(e.into()),
                }
            }
            (_, Some(d), found) => {
                let reason = match (rec.kind, found) {
                    (Kind::Create, _) => "a file of that name was created on the server",
                    (_, None) => "removed on the server",
                    (_, Some(e)) if e.attr.file_id != rec.file_id => "replaced on the server",
                    _ => "changed on the server since the change began",
                };
                let copy = self.conflict_copy(*d, name, &g, &off.host)?;
                let mut at = rec.path[..rec.path.len() - 1].to_vec();
                at.push(copy);
                Outcome::Conflict(Conflict {
                    at: now_secs(),
                    path: shown(&rec.path),
                    copy: shown(&at),
                    reason: reason.into(),
                })
            }
            (_, None, _) => {
                let flat = rec.path.join(&b'_');
                let copy = self.conflict_copy(root, &flat, &g, &off.host)?;
                Outcome::Conflict(Conflict {
                    at: now_secs(),
                    path: shown(&rec.path),
                    copy: shown(&[copy]),
                    reason: "its directory was removed on the server".into(),
                })
            }
        };
        // The node leaves the staged content before the change is marked done, still
        // under its lock: a read or write waiting for it then finds the origin's file
        // (with its new attributes, or expired ones after a conflict), never the cached
        // object of the base version.
        self.nodes.set_local(p.file_id, None);
        let node = self.nodes.by_file_id(p.file_id);
        let (mut stale_entry, mut stale_dir) = (None, None);
        if let Some(node) = &node {
            let mut created_lost = None;
            {
                let mut st = node.state.lock();
                match &outcome {
                    Outcome::Sent(attr, _) => st.install_attr(*attr, false),
                    Outcome::Created(..) | Outcome::Removed => {}
                    Outcome::Conflict(_) if rec.kind == Kind::Create => {
                        // The name is the server's file: this node (ours) leaves it.
                        st.mark_deleted();
                        created_lost = Some(st.parent());
                    }
                    Outcome::Conflict(_) => st.contents_changed(),
                }
                if let Some(old) = st.opens.set_object(None) {
                    old.retire();
                }
            }
            if let Outcome::Created(entry, _) = &outcome {
                self.nodes.rebind(node.ino, p.file_id, entry);
            }
            if let Some(parent) = created_lost.and_then(|pi| self.nodes.get(pi)) {
                self.nodes.unbind_file_id(node.ino, p.file_id);
                // The name is the origin's file's: asked for again.
                parent.state.lock().remove_child(name);
                parent.state.lock().contents_changed();
                stale_entry = Some(parent.ino);
            }
        }
        let parent_ino = node.as_ref().map(|n| n.state.lock().parent());
        if let (Outcome::Conflict(_), Kind::Remove) = (&outcome, rec.kind)
            && let Some(parent) = parent_ino.and_then(|i| self.nodes.get(i))
        {
            // The origin's file stays: the directory's names are asked for again.
            parent.state.lock().contents_changed();
            stale_dir = Some(parent.ino);
        }
        off.log.finish(p.file_id, &mut g);
        drop(g);
        // The kernel is told only now: an operation it holds a directory locked for may be
        // waiting for this change's lock.
        if let Some(n) = self.notifier.get() {
            if let Some(dir) = stale_entry {
                n.inval_entry(dir, name);
            }
            if let Some(dir) = stale_dir {
                n.inval_inode(dir);
            }
        }
        let mut outcome = outcome;
        if let Some(node) = node {
            if let Some(n) = self.notifier.get() {
                n.inval_inode(node.ino);
            }
            if let Outcome::Sent(_, ino) | Outcome::Created(_, ino) = &mut outcome {
                *ino = Some(node.ino);
            }
        }
        Ok(Some(outcome))
    }

    /// Sends the staged content of a created file to the origin's file `e`.
    fn send_created(&self, g: &mut Inner, e: &Entry) -> FsResult<Outcome> {
        let attr = self.send_content(g, e.handle, e.attr.version)?;
        let entry = Entry {
            handle: e.handle,
            attr,
        };
        Ok(Outcome::Created(entry, None))
    }

    /// Sends the staged content over the object at `handle` (at version `at_start`),
    /// recording the upload's start, and its end point if it fails.
    fn send_content(
        &self,
        g: &mut Inner,
        handle: Handle,
        at_start: u64,
    ) -> FsResult<hoardfs_origin::Attr> {
        g.start_upload().map_err(crate::offline::kept)?;
        self.upload(handle, g, at_start).map_err(|(err, last)| {
            if let Err(io) = g.upload_failed(last) {
                tracing::warn!("cannot record a failed upload: {io}");
            }
            err
        })
    }

    /// Writes the staged content over the object at `handle` (at version `at_start`):
    /// every byte, then the size, then publishes (origins that publish at close) and
    /// fsyncs; returns the file's attributes after. On failure, also the last version the
    /// origin reported for it (`at_start` if nothing was written).
    fn upload(
        &self,
        handle: Handle,
        g: &Inner,
        at_start: u64,
    ) -> Result<hoardfs_origin::Attr, (FsError, u64)> {
        let mut last = at_start;
        let size = g.local().size;
        let mut at = 0u64;
        while at < size {
            let piece = g
                .read(at, PIECE)
                .map_err(|e| (crate::offline::kept(e), last))?;
            if piece.is_empty() {
                break;
            }
            let mut done = 0;
            while done < piece.len() {
                let w = self
                    .origin
                    .write(handle, at + done as u64, &piece[done..], false)
                    .map_err(|e| (e.into(), last))?;
                last = w.attr.version;
                if w.written == 0 {
                    return Err((FsError::Origin(WireError::NoSpace), last));
                }
                done += w.written as usize;
            }
            at += piece.len() as u64;
        }
        let set = SetAttrs {
            size: Some(size),
            ..Default::default()
        };
        let mut attr = self
            .origin
            .setattr(handle, &set)
            .map_err(|e| (e.into(), last))?;
        last = attr.version;
        if self.origin.publishes_on_close()
            && let Some((_, a)) = self.origin.flush(handle).map_err(|e| (e.into(), last))?
        {
            attr = a;
        }
        self.origin
            .fsync(handle, false)
            .map_err(|e| (e.into(), attr.version))?;
        Ok(attr)
    }

    /// Creates `NAME.conflict-HOST-TIME` (or `...-2`, `-3` if taken) in `dir` with the
    /// change's permissions and owner, writes the staged content to it; returns its name.
    fn conflict_copy(&self, dir: Handle, name: &[u8], g: &Inner, host: &str) -> FsResult<Vec<u8>> {
        let rec = g.record();
        let base = format!(".conflict-{host}-{}", utc_stamp(SystemTime::now()));
        let owner = Owner {
            uid: rec.uid,
            gid: rec.gid,
        };
        for n in 1..100 {
            let suffix = if n > 1 {
                format!("{base}-{n}")
            } else {
                base.clone()
            };
            // A long name is shortened so that the suffix fits in 255 bytes.
            let mut copy = name[..name.len().min(255 - suffix.len())].to_vec();
            copy.extend_from_slice(suffix.as_bytes());
            match self
                .origin
                .create(dir, &copy, u32::from(rec.perm), true, owner)
            {
                Ok(Entry { handle, attr }) => {
                    self.upload(handle, g, attr.version).map_err(|(e, _)| e)?;
                    return Ok(copy);
                }
                Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(FsError::Origin(WireError::Exists))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_519_500);
        assert_eq!(utc_stamp(t), "20261124T112500Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_825_600);
        assert_eq!(utc_stamp(leap), "20000229T120000Z");
    }
}
