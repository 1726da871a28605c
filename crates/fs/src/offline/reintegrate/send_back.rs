//! One change of `--offline-writes` sent back to the origin (a [`ChangeSender`], for
//! the passes of `crate::offline::reintegrate`).
//!
//! A change is sent in steps: its move (from where the origin has the object to
//! its path here), then its creation, content or removal, then its permission bits and
//! times. Content: if the path still names the same object at the **base version** the
//! change started from, the staged content is written over it (whole, then truncated to
//! its size, published and fsynced). If the file changed on the origin meanwhile, or was
//! removed or replaced by another file, or its directory is gone, the origin's version
//! stays where it is and this client's is written next to it as `NAME.conflict-HOST-TIME`
//! (in the root directory, with the path's components joined by `_`, when the directory
//! is gone); a directory or link made here whose name was taken gets such a name too.
//! A change that cannot be sent (permissions, a full disk on the server) is left as it
//! is, for a later pass.
//!
//! Names are recorded before the origin sees them: a conflict name is written to the
//! record (and to those of the changes inside it) before it is tried, and the changes
//! inside a moved directory are rewritten to its new place once it moved and before the
//! move is recorded done (until then they wait for it); a move found done already, or an
//! object found parked, is taken from there.
//!
//! Idempotent across a client killed in the middle: the record says `Uploading` (durably)
//! before the first byte goes out, and a change found `Uploading` is sent again whole
//! over the same object whatever its version, since that version may be its own half
//! upload. (A change made on the origin to that file between the crash and the next
//! attempt is then overwritten.) So is an upload cut short by the connection: its last
//! write may have been applied without a reply. An upload the origin refused records the
//! version the origin reported after its last write (`Resume`), and the next attempt goes
//! on only if the file is still at that version; otherwise somebody else changed it, and
//! this client's version becomes a conflict copy.

use std::collections::HashSet;
use std::time::SystemTime;

use hoardfs_origin::{Entry, Handle, Owner, SetAttrs, WireError};

use crate::Ino;
use crate::offline::cml::{Conflict, Inner, Kind, Pending, Phase, Record, now_secs};
use crate::offline::reintegrate::Writing;
use crate::offline::reintegrate::conflict_names::{
    conflict_candidate, conflict_name, orphans_dir, utc_stamp,
};
use crate::offline::reintegrate::found::Found;
use crate::offline::reintegrate::order::parking;
use crate::offline::reintegrate::upload::upload;
use crate::offline::state::OfflineWrites;
use crate::superblock::Superblock;
use crate::{FsError, FsResult};

/// How a change went back.
pub(crate) enum Outcome {
    /// Written over its object, which now has this entry (and this node, if known).
    Sent(Entry, Option<Ino>),
    /// Created as this origin object (and this node, if known).
    Created(Entry, Option<Ino>),
    /// Removed (or found gone already).
    Removed,
    Conflict(Conflict),
}

/// What became of one change in a pass.
pub(crate) enum Sending {
    /// Sent (or written to a conflict copy, noted).
    Went(Box<(Outcome, Option<Conflict>)>),
    /// Done already, or cannot be done yet.
    Waits,
    /// Its names changed here since the pass was planned: planned again.
    Replanned,
}

/// How a rename went back.
enum Moved {
    /// The object is where the change says (perhaps under a conflict name: noted).
    Done(Option<Conflict>),
    /// The object is no longer where the origin had it.
    Lost,
}

fn shown(path: &[Vec<u8>]) -> String {
    let mut s = String::new();
    for c in path {
        s.push('/');
        s.push_str(&String::from_utf8_lossy(c));
    }
    s
}

/// Sends one change back: the superblock, its change log and whether a file is being
/// written here, borrowed for one change.
pub(crate) struct ChangeSender<'a> {
    sb: &'a Superblock,
    off: &'a OfflineWrites,
    writing: Writing<'a>,
}

impl<'a> ChangeSender<'a> {
    /// A sender of `off`'s changes to the origin of `sb`.
    pub(crate) fn new(sb: &'a Superblock, off: &'a OfflineWrites, writing: Writing<'a>) -> Self {
        ChangeSender { sb, off, writing }
    }

    /// Sends one change back (under its lock, so writes to the object wait): its move,
    /// then its creation, content or removal, then its permission bits and times.
    /// `planned`: its record when the pass was planned (`ready`); `sending`: the changes
    /// of this pass.
    pub(crate) fn send_back(
        &self,
        p: &Pending,
        planned: &Record,
        sending: &HashSet<u64>,
    ) -> FsResult<Sending> {
        let g = p.lock();
        if g.is_gone() {
            return Ok(Sending::Waits);
        }
        // Moved here since the pass was planned (a directory above it renamed: its path
        // now names a place the origin has yet to have): what it waits for is worked out
        // again. (Its names change only under its lock, held from here on.)
        let rec = g.record();
        if rec.path != planned.path
            || rec.origin_loc() != planned.origin_loc()
            || rec.kind != planned.kind
        {
            return Ok(Sending::Replanned);
        }
        Ok(match self.send_locked(p, g, sending)? {
            Some(went) => Sending::Went(Box::new(went)),
            None => Sending::Waits,
        })
    }

    /// [`ChangeSender::send_back`] under the change's lock `g`: `None` if it was done
    /// already, or cannot be done yet.
    fn send_locked(
        &self,
        p: &Pending,
        mut g: parking_lot::MutexGuard<'_, Inner>,
        sending: &HashSet<u64>,
    ) -> FsResult<Option<(Outcome, Option<Conflict>)>> {
        // A change of the export root's own attributes (logged by an earlier build) has
        // no path to be sent to: it is dropped, and listed.
        if g.record().path.is_empty() {
            let c = Conflict {
                at: now_secs(),
                path: "/".into(),
                copy: "/".into(),
                reason: "permissions or times of the export's root changed offline: not \
                         applied (they need the server)"
                    .into(),
            };
            return self.finish_change(p, g, Outcome::Conflict(c), None);
        }
        let root = self.sb.origin().info()?.root.handle;
        let mut noted = None;
        let before = g.record().path.clone();
        // A directory moved or made now: its permissions and times wait for what is to go
        // inside it (`ready`), since changes inside would change its times and a
        // read-only mode would refuse them.
        let placed_dir = g.record().is_dir && g.record().changes_names() && !g.record().removes();
        if g.record().renames() {
            match self.send_rename(&mut g, root, sending)? {
                Moved::Done(c) => noted = c,
                Moved::Lost if g.record().has_content() => {
                    // Its content goes to a conflict copy at the name it was given.
                    let at = g.record().path.clone();
                    g.placed_at(at).map_err(crate::offline::state::kept)?;
                }
                Moved::Lost => {
                    let rec = g.record();
                    let c = Conflict {
                        at: now_secs(),
                        path: shown(rec.origin_loc()),
                        copy: shown(&rec.path),
                        reason: "renamed here, but removed or replaced on the server: not \
                                 renamed"
                            .into(),
                    };
                    return self.finish_change(p, g, Outcome::Conflict(c), None);
                }
            }
        }
        let rec = g.record().clone();
        let outcome = match rec.kind {
            Kind::Mkdir | Kind::Symlink => self.send_made(&mut g, root, sending, &mut noted)?,
            Kind::Rmdir => self.send_rmdir(&rec, root)?,
            Kind::Meta => match Found::at(self.sb.origin(), root, &rec.path)?.entry {
                Some(e) if e.attr.file_id == rec.origin_id() => Outcome::Sent(e, None),
                _ => Outcome::Conflict(Conflict {
                    at: now_secs(),
                    path: shown(&rec.path),
                    copy: shown(&rec.path),
                    reason: "permissions or times changed here, but removed or replaced on \
                             the server"
                        .into(),
                }),
            },
            Kind::Store | Kind::Create | Kind::Remove => match self.send_file(&mut g, root)? {
                Some(o) => o,
                None => return Ok(None),
            },
        };
        if placed_dir
            && !rec.set.is_empty()
            && matches!(outcome, Outcome::Sent(..) | Outcome::Created(..))
        {
            // Placed now, perhaps under a conflict name: that is recorded now, as the
            // next pass finds it placed already and notes nothing.
            if let Some(c) = noted {
                self.off.log.record_conflict(&c);
            }
            return Ok(None);
        }
        let outcome = match outcome {
            Outcome::Sent(e, ino) => {
                let (e, c) = self.send_attrs(&rec, e)?;
                self.attrs_sent(&mut g, &rec, &e)?;
                noted = noted.or(c);
                Outcome::Sent(e, ino)
            }
            Outcome::Created(e, ino) => {
                let (e, c) = self.send_attrs(&rec, e)?;
                self.attrs_sent(&mut g, &rec, &e)?;
                noted = noted.or(c);
                Outcome::Created(e, ino)
            }
            o => o,
        };
        let renamed_to = (g.record().path != before).then(|| g.record().path.clone());
        self.finish_change(p, g, outcome, renamed_to)
            .map(|o| o.map(|(o, c)| (o, c.or(noted))))
    }

    /// Notes the version the origin reports after a change's permissions and times were
    /// set (they change it): a client killed before the change is marked done sends its
    /// content again over that version, not into a conflict copy.
    fn attrs_sent(&self, g: &mut Inner, rec: &Record, e: &Entry) -> FsResult<()> {
        if rec.has_content() && !rec.set.is_empty() {
            g.upload_failed(e.attr.version)
                .map_err(crate::offline::state::kept)?;
        }
        Ok(())
    }

    /// Sets the change's permission bits and times on the origin's object `e`; returns
    /// its entry after, and a conflict if the origin refuses them for good (this client
    /// may not set them there: the change is done without them, and listed).
    fn send_attrs(&self, rec: &Record, e: Entry) -> FsResult<(Entry, Option<Conflict>)> {
        if rec.set.is_empty() {
            return Ok((e, None));
        }
        let set = SetAttrs {
            mode: rec.set.perm.map(u32::from),
            atime: rec.set.atime.map(hoardfs_origin::TimeSet::At),
            mtime: rec.set.mtime.map(hoardfs_origin::TimeSet::At),
            ..Default::default()
        };
        let attr = match self.sb.origin().setattr(e.handle, &set) {
            Ok(a) => a,
            Err(hoardfs_origin::OriginError::Fs(
                w @ (WireError::Access | WireError::NotPermitted),
            )) => {
                let c = Conflict {
                    at: now_secs(),
                    path: shown(&rec.path),
                    copy: shown(&rec.path),
                    reason: format!(
                        "permissions or times changed here, refused by the server ({w:?}): \
                         not applied"
                    ),
                };
                return Ok((e, Some(c)));
            }
            Err(err) => return Err(err.into()),
        };
        let e = Entry {
            handle: e.handle,
            attr,
        };
        Ok((e, None))
    }

    /// Moves the change's object on the origin from where the origin has it to the
    /// change's path (under a conflict name if that is taken, the name recorded before it
    /// is tried; left where it is if the directory it moved to is gone). The changes
    /// inside a moved directory follow it once it moved, before the move is recorded as
    /// done: until then they wait for it, and a move found done already (a client killed
    /// in between) is finished the same way.
    fn send_rename(&self, g: &mut Inner, root: Handle, sending: &HashSet<u64>) -> FsResult<Moved> {
        let off = self.off;
        // No change is recorded with where the origin has its object while it moves.
        let moving = off.log.moving();
        let kept = crate::offline::state::kept;
        let rec = g.record().clone();
        let from = rec.origin_loc().to_vec();
        let Found {
            dir: src_dir,
            entry: found,
        } = Found::at(self.sb.origin(), root, &from)?;
        let src_dir = match (src_dir, found) {
            (Some(d), Some(e)) if e.attr.file_id == rec.origin_id() => d,
            _ => {
                // Parked by `break_cycle`, by a client killed before it noted that?
                let parked = parking(rec.seq);
                if from != parked
                    && let Some(e) = Found::at(self.sb.origin(), root, &parked)?.entry
                    && e.attr.file_id == rec.origin_id()
                {
                    if rec.is_dir {
                        off.log
                            .moved_under(&from, &parked, true, sending)
                            .map_err(kept)?;
                    }
                    g.moved_on_origin(parked).map_err(kept)?;
                    drop(moving);
                    return self.send_rename(g, root, sending);
                }
                // Sent already (a client killed before it noted that)?
                if let Some(e) = Found::at(self.sb.origin(), root, &rec.path)?.entry
                    && e.attr.file_id == rec.origin_id()
                {
                    if rec.is_dir {
                        off.log
                            .moved_under(&from, &rec.path, true, sending)
                            .map_err(kept)?;
                    }
                    g.arrived().map_err(kept)?;
                    return Ok(Moved::Done(None));
                }
                return Ok(Moved::Lost);
            }
        };
        let dst_dir = Found::at(self.sb.origin(), root, &rec.path)?.dir;
        let Some(dst_dir) = dst_dir else {
            // The directory it moved to is gone on the origin: it stays where it is.
            g.placed_at(from.clone()).map_err(kept)?;
            if rec.is_dir {
                off.log
                    .moved_under(&rec.path, &from, false, sending)
                    .map_err(kept)?;
            }
            return Ok(Moved::Done(Some(Conflict {
                at: now_secs(),
                path: shown(&rec.path),
                copy: shown(&from),
                reason: "moved here into a directory removed on the server: left at its \
                         old name"
                    .into(),
            })));
        };
        let (name, parent) = rec.path.split_last().expect("a path has a name");
        let src_name = from.last().expect("a path has a name");
        let stamp = utc_stamp(SystemTime::now());
        let mut noted = None;
        for n in 1..100 {
            let to = g.record().path.clone();
            let at = to.last().expect("a path has a name");
            match self.sb.origin().rename(
                src_dir,
                src_name,
                dst_dir,
                at,
                hoardfs_origin::RENAME_NOREPLACE,
            ) {
                Ok(()) => {
                    if rec.is_dir {
                        off.log
                            .moved_under(&from, &to, true, sending)
                            .map_err(kept)?;
                    }
                    g.arrived().map_err(kept)?;
                    return Ok(Moved::Done(noted));
                }
                Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => {
                    let mut next = parent.to_vec();
                    next.push(conflict_candidate(name, &off.host, &stamp, n));
                    if rec.is_dir {
                        off.log
                            .moved_under(&to, &next, false, sending)
                            .map_err(kept)?;
                    }
                    g.set_path(next.clone()).map_err(kept)?;
                    noted = Some(Conflict {
                        at: now_secs(),
                        path: shown(&rec.path),
                        copy: shown(&next),
                        reason: "renamed here to a name taken on the server".into(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(FsError::Origin(WireError::Exists))
    }

    /// Makes the directory or symbolic link of the change on the origin (a directory of
    /// the same name there is taken as it, and so is a link to the same target; another
    /// name taken, or the directory gone, gives a conflict name, recorded before it is
    /// tried).
    fn send_made(
        &self,
        g: &mut Inner,
        root: Handle,
        sending: &HashSet<u64>,
        noted: &mut Option<Conflict>,
    ) -> FsResult<Outcome> {
        use hoardfs_origin::FileKind;
        let off = self.off;
        let kept = crate::offline::state::kept;
        let rec = g.record().clone();
        let owner = Owner {
            uid: rec.uid,
            gid: rec.gid,
        };
        let is_dir = rec.kind == Kind::Mkdir;
        let same = |e: &Entry| -> FsResult<bool> {
            Ok(match e.attr.kind {
                FileKind::Dir => is_dir,
                FileKind::Symlink if !is_dir => self.sb.origin().readlink(e.handle)? == rec.target,
                _ => false,
            })
        };
        let stamp = utc_stamp(SystemTime::now());
        for n in 1..100 {
            let at = g.record().path.clone();
            let (name, parent) = at.split_last().expect("a path has a name");
            let Found { dir, entry: found } = Found::at(self.sb.origin(), root, &at)?;
            let taken = match (dir, found) {
                (Some(d), None) => {
                    // Recorded as on its way first: an answer lost leaves it perhaps
                    // made, neither cancelled nor made elsewhere meanwhile.
                    g.start_upload().map_err(kept)?;
                    let made = if is_dir {
                        self.sb.origin().mkdir(d, name, u32::from(rec.perm), owner)
                    } else {
                        self.sb.origin().symlink(d, name, &rec.target, owner)
                    };
                    match made {
                        Ok(e) => {
                            g.made(e.attr.file_id).map_err(kept)?;
                            return Ok(Outcome::Created(e, None));
                        }
                        Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => {
                            g.not_started().map_err(kept)?;
                            true
                        }
                        Err(e) => {
                            if !e.maybe_carried_out() {
                                g.not_started().map_err(kept)?;
                            }
                            return Err(e.into());
                        }
                    }
                }
                // The same made on the server too (or by this client before a crash).
                (Some(_), Some(e)) if same(&e)? => {
                    g.made(e.attr.file_id).map_err(kept)?;
                    return Ok(Outcome::Created(e, None));
                }
                (Some(_), Some(_)) => true,
                (None, _) => false,
            };
            // Another name, recorded (with what is to be made inside it) before it is
            // tried: next to the name taken, or in the root if the directory is gone.
            let next = if taken {
                let mut next = parent.to_vec();
                next.push(conflict_candidate(
                    rec.path.last().expect("a path has a name"),
                    &off.host,
                    &stamp,
                    n,
                ));
                next
            } else {
                // Its directory is gone: in its maker's private directory of orphans.
                let (dir, _) = orphans_dir(self.sb.origin(), root, &rec.sender())?;
                vec![
                    dir,
                    conflict_candidate(&rec.path.join(&b'_'), &off.host, &stamp, n),
                ]
            };
            if is_dir {
                off.log
                    .moved_under(&at, &next, false, sending)
                    .map_err(kept)?;
            }
            g.set_path(next.clone()).map_err(kept)?;
            *noted = Some(Conflict {
                at: now_secs(),
                path: shown(&rec.path),
                copy: shown(&next),
                reason: if taken {
                    "the name was taken on the server".into()
                } else {
                    "its directory was removed on the server".into()
                },
            });
        }
        Err(FsError::Origin(WireError::Exists))
    }

    /// Removes the change's directory on the origin; one that gained entries there stays.
    fn send_rmdir(&self, rec: &Record, root: Handle) -> FsResult<Outcome> {
        let Found { dir, entry: found } = Found::at(self.sb.origin(), root, rec.origin_loc())?;
        let (Some(d), Some(e)) = (dir, found) else {
            return Ok(Outcome::Removed);
        };
        if e.attr.file_id != rec.origin_id() {
            return Ok(Outcome::Removed);
        }
        let name = rec.origin_loc().last().expect("a path has a name");
        match self.sb.origin().rmdir(d, name) {
            Ok(()) => Ok(Outcome::Removed),
            Err(hoardfs_origin::OriginError::Fs(WireError::NotEmpty)) => {
                Ok(Outcome::Conflict(Conflict {
                    at: now_secs(),
                    path: shown(rec.origin_loc()),
                    copy: shown(rec.origin_loc()),
                    reason: "removed here, but it has new entries on the server: kept".into(),
                }))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sends a file's content, creation or removal back; `None` if it cannot be done yet.
    fn send_file(&self, g: &mut Inner, root: Handle) -> FsResult<Option<Outcome>> {
        let rec = g.record().clone();
        let loc = rec.origin_loc().to_vec();
        let name = loc.last().expect("a path has a name").clone();
        let Found { dir, entry: found } = Found::at(self.sb.origin(), root, &loc)?;
        // Whether the file holds what this change started from (or this change's own
        // half upload).
        let phase_allows = |e: &Entry| match rec.phase {
            Phase::Staged => e.attr.version == rec.base_version,
            Phase::Uploading => true,
            Phase::Resume { expected } => e.attr.version == expected,
        };
        let outcome = match (rec.kind, &dir, found) {
            (Kind::Remove, Some(d), Some(e)) if e.attr.file_id == rec.origin_id() => {
                // (Or this client's own half upload of a change it then removed.)
                if phase_allows(&e) || e.attr.kind != hoardfs_origin::FileKind::File {
                    self.sb.origin().unlink(*d, &name)?;
                    Outcome::Removed
                } else {
                    Outcome::Conflict(Conflict {
                        at: now_secs(),
                        path: shown(&loc),
                        copy: shown(&loc),
                        reason: "removed here, but changed on the server: the server's \
                                 version is kept"
                            .into(),
                    })
                }
            }
            // Gone already, or the name is another file's now: nothing of ours to remove.
            (Kind::Remove, _, _) => Outcome::Removed,
            (Kind::Store, Some(_), Some(e))
                if e.attr.file_id == rec.origin_id() && phase_allows(&e) =>
            {
                let attr = self.send_content(g, e.handle, e.attr.version)?;
                Outcome::Sent(
                    Entry {
                        handle: e.handle,
                        attr,
                    },
                    None,
                )
            }
            (Kind::Create, Some(_), Some(e))
                if rec.created == Some(e.attr.file_id) && phase_allows(&e) =>
            {
                self.send_created(g, &e)?
            }
            // Created by this client, which was killed before it noted that (it notes the
            // attempt first): the file there is taken as its own, as a half upload is.
            (Kind::Create, Some(_), Some(e))
                if rec.created.is_none()
                    && rec.phase == Phase::Uploading
                    && e.attr.kind == hoardfs_origin::FileKind::File =>
            {
                g.created(e.attr.file_id, e.attr.version)
                    .map_err(crate::offline::state::kept)?;
                self.send_created(g, &e)?
            }
            (Kind::Create, Some(d), None) => match self.create_and_send(g, *d, &name)? {
                Some(outcome) => outcome,
                None => return Ok(None),
            },
            // A conflict copy of a file still open for writing here waits for its
            // writer to close it: made now, the later writes would go through to the
            // server's file, which is somebody else's version.
            _ if self.writing(&rec) => return Ok(None),
            (_, dir, found) => self.conflict_copy_of(g, root, dir, found.as_ref(), &loc)?,
        };
        Ok(Some(outcome))
    }

    /// A `Create` whose name is free on the origin (in directory `d`): the file is made
    /// (noted first, so that a client killed meanwhile takes it for its own) and its
    /// content sent; `None` if the name was taken meanwhile (a conflict next time round).
    fn create_and_send(&self, g: &mut Inner, d: Handle, name: &[u8]) -> FsResult<Option<Outcome>> {
        let rec = g.record().clone();
        let owner = Owner {
            uid: rec.uid,
            gid: rec.gid,
        };
        g.start_upload().map_err(crate::offline::state::kept)?;
        match self
            .sb
            .origin()
            .create(d, name, u32::from(rec.perm), true, owner)
        {
            Ok(e) => {
                g.created(e.attr.file_id, e.attr.version)
                    .map_err(crate::offline::state::kept)?;
                self.send_created(g, &e).map(Some)
            }
            // Taken meanwhile (not by this client): next time round it is a conflict.
            Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => {
                g.not_started().map_err(crate::offline::state::kept)?;
                Ok(None)
            }
            // Refused: not created, and tried afresh next time (a file made there by
            // somebody else meanwhile is then a conflict, not taken for ours).
            Err(hoardfs_origin::OriginError::Fs(w)) => {
                g.not_started().map_err(crate::offline::state::kept)?;
                Err(w.into())
            }
            // Sent with no answer: it may have been made; the record says so
            // (`Uploading`). Not sent: not made.
            Err(e) => {
                if !e.maybe_carried_out() {
                    g.not_started().map_err(crate::offline::state::kept)?;
                }
                Err(e.into())
            }
        }
    }

    /// This client's version of the file at `loc` written to a conflict copy: next to the
    /// origin's (in `dir`, where `found` is what the name leads to now), or, its directory
    /// gone, in its maker's private directory in the root.
    fn conflict_copy_of(
        &self,
        g: &Inner,
        root: Handle,
        dir: &Option<Handle>,
        found: Option<&Entry>,
        loc: &[Vec<u8>],
    ) -> FsResult<Outcome> {
        let rec = g.record();
        let name = loc.last().expect("a path has a name");
        let host = &self.off.host;
        let Some(d) = dir else {
            // Not in the export root, where everyone would see it: in its maker's
            // private directory there.
            let (dir, orphans) = orphans_dir(self.sb.origin(), root, &rec.sender())?;
            let flat = loc.join(&b'_');
            let copy = self.conflict_copy(orphans, &flat, g, host)?;
            return Ok(Outcome::Conflict(Conflict {
                at: now_secs(),
                path: shown(loc),
                copy: shown(&[dir, copy]),
                reason: "its directory was removed on the server".into(),
            }));
        };
        let reason = match (rec.kind, found) {
            (Kind::Create, _) => "a file of that name was created on the server",
            (_, None) => "removed on the server",
            (_, Some(e)) if e.attr.file_id != rec.origin_id() => "replaced on the server",
            _ => "changed on the server since the change began",
        };
        let copy = self.conflict_copy(*d, name, g, host)?;
        let mut at = loc[..loc.len() - 1].to_vec();
        at.push(copy);
        Ok(Outcome::Conflict(Conflict {
            at: now_secs(),
            path: shown(loc),
            copy: shown(&at),
            reason: reason.into(),
        }))
    }

    /// Marks the change done (`outcome`) and brings its node along: the node leaves the
    /// staged content before the change is marked done, still under its lock, so that a
    /// read or write waiting for it then finds the origin's object (with its new
    /// attributes, or expired ones after a conflict), never the cached object of the
    /// base version. `renamed_to`: the change's path when the origin has the object
    /// under another name than this client's view.
    fn finish_change(
        &self,
        p: &Pending,
        mut g: parking_lot::MutexGuard<'_, Inner>,
        outcome: Outcome,
        renamed_to: Option<Vec<Vec<u8>>>,
    ) -> FsResult<Option<(Outcome, Option<Conflict>)>> {
        let off = self.off;
        let rec = g.record().clone();
        self.sb.nodes().set_local(p.file_id, None);
        let node = self.sb.nodes().by_file_id(p.file_id);
        let (mut stale_entry, mut stale_dir) = (None, None);
        if let Some(node) = &node {
            let mut lost = None;
            {
                let mut st = node.state.lock();
                match &outcome {
                    Outcome::Sent(e, _) => st.install_attr(e.attr, false),
                    Outcome::Created(..) | Outcome::Removed => {}
                    Outcome::Conflict(_) if rec.kind == Kind::Create => {
                        // The name is the server's file: this node (ours) leaves it.
                        st.mark_deleted();
                        lost = Some(st.parent());
                    }
                    Outcome::Conflict(_) => st.contents_changed(),
                }
                if let Some(old) = st.opens.set_object(None) {
                    old.retire();
                }
                if renamed_to.is_some() {
                    // Its name on the origin is not the one the kernel knows.
                    lost = Some(st.parent());
                }
            }
            if let Outcome::Created(entry, _) = &outcome {
                self.sb.nodes().rebind(node.ino, p.file_id, entry);
                if rec.kind == Kind::Symlink {
                    // Known without a readlink (served while the origin is unreachable).
                    node.state.lock().keep_target(&rec.target);
                }
            }
            if let Some(parent) = lost.and_then(|pi| self.sb.nodes().get(pi)) {
                if rec.kind == Kind::Create && matches!(outcome, Outcome::Conflict(_)) {
                    self.sb.nodes().unbind_file_id(node.ino, p.file_id);
                }
                let known = node.state.lock().name().to_vec();
                // The name is asked for again.
                parent.state.lock().remove_child(&known);
                parent.state.lock().contents_changed();
                stale_entry = Some((parent.ino, known));
            }
        }
        let parent_ino = node.as_ref().map(|n| n.state.lock().parent());
        if let (Outcome::Conflict(_), Kind::Remove | Kind::Rmdir) = (&outcome, rec.kind)
            && let Some(parent) = parent_ino.and_then(|i| self.sb.nodes().get(i))
        {
            // The origin's object stays: the directory's names are asked for again.
            parent.state.lock().contents_changed();
            stale_dir = Some(parent.ino);
        }
        // Names changed on the origin: listings read ahead may not have the change.
        self.sb.trees().forget_all();
        off.log.finish(p.file_id, &mut g);
        drop(g);
        // The kernel is told only now: an operation it holds a directory locked for may be
        // waiting for this change's lock.
        if let Some(n) = self.sb.notifier() {
            if let Some((dir, name)) = &stale_entry {
                n.inval_entry(*dir, name);
            }
            if let Some(dir) = stale_dir {
                n.inval_inode(dir);
            }
        }
        let mut outcome = outcome;
        if let Some(node) = node {
            if let Some(n) = self.sb.notifier() {
                n.inval_inode(node.ino);
            }
            if let Outcome::Sent(_, ino) | Outcome::Created(_, ino) = &mut outcome
                && node.kind == hoardfs_origin::FileKind::File
            {
                *ino = Some(node.ino);
            }
        }
        Ok(Some((outcome, None)))
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
        g.start_upload().map_err(crate::offline::state::kept)?;
        let attr = upload(self.sb.origin(), handle, g, at_start).map_err(|f| {
            // Cut short after a request was sent, that request may have been carried
            // out without an answer: the origin's version is not known, and the change
            // stays `Uploading` (sent whole again over the same object, as after a
            // crash). Otherwise the version last reported is the one to go on from.
            if !f.maybe_applied
                && let Err(io) = g.upload_failed(f.last_version)
            {
                tracing::warn!("cannot record a failed upload: {io}");
            }
            f.error
        })?;
        // Sent whole: should what follows (permissions, times) fail, the next attempt
        // goes on only over this very version, never over somebody else's change.
        g.upload_failed(attr.version)
            .map_err(crate::offline::state::kept)?;
        Ok(attr)
    }

    /// Whether the file of change `rec` is open for writing here.
    fn writing(&self, rec: &Record) -> bool {
        self.sb
            .nodes()
            .by_file_id(rec.file_id)
            .is_some_and(|node| (self.writing)(node.ino))
    }

    /// Creates a conflict copy of `name` in `dir` (see [`conflict_name`]) with the
    /// change's permissions and owner, writes the staged content to it; returns its name.
    fn conflict_copy(&self, dir: Handle, name: &[u8], g: &Inner, host: &str) -> FsResult<Vec<u8>> {
        let rec = g.record();
        let owner = Owner {
            uid: rec.uid,
            gid: rec.gid,
        };
        let (copy, Entry { handle, attr }) = conflict_name(name, host, |n| {
            self.sb
                .origin()
                .create(dir, n, u32::from(rec.perm), true, owner)
        })?;
        upload(self.sb.origin(), handle, g, attr.version).map_err(|f| f.error)?;
        Ok(copy)
    }
}
