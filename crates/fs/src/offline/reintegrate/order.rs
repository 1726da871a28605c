//! The order in which reintegration (`crate::offline::reintegrate`) sends offline changes back:
//! which changes wait for others ([`ready`]), and how moves that wait for each other are
//! broken (`CycleBreaker::break_cycle`: one object is parked under a temporary name in the
//! root).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::FsResult;
use crate::offline::cml::{Kind, Pending, Record};
use crate::offline::reintegrate::found::Found;
use crate::offline::state::OfflineWrites;
use crate::superblock::Superblock;

/// Where [`CycleBreaker::break_cycle`] puts the object of change number `seq` on the origin
/// while the moves that wait for each other go: `/.hoardfs-moving-SEQ`.
pub(crate) fn parking(seq: u64) -> Vec<Vec<u8>> {
    vec![format!(".hoardfs-moving-{seq}").into_bytes()]
}

/// Which of `records` can be sent now: those that wait for no other change. A change
/// waits while
/// 1. it puts something at a name another change has yet to take away there (a removal,
///    or a rename away);
/// 2. it lies (or puts something) inside a directory not in place on the origin yet (made
///    offline, or moved there);
/// 3. it lies inside a directory that moves on the origin (its path there follows the
///    move once sent);
/// 4. it removes a directory that other changes have yet to leave;
/// 5. it sets a directory's permissions or times while changes inside it wait.
///
/// Chains of renames that wait for each other (a swap) are broken by
/// `CycleBreaker::break_cycle`. Each comes with its record as planned: a change whose
/// names changed here since (a directory above it renamed) is planned again, not sent.
pub(crate) fn ready(records: &[(Arc<Pending>, Record)]) -> Vec<(Arc<Pending>, Record)> {
    let mut vacating: HashMap<&[Vec<u8>], u64> = HashMap::new();
    let mut placing: HashSet<&[Vec<u8>]> = HashSet::new();
    let mut moving: HashSet<&[Vec<u8>]> = HashSet::new();
    let mut occupied: HashSet<&[Vec<u8>]> = HashSet::new();
    for (_, r) in records {
        if r.vacates() {
            vacating.insert(r.origin_loc(), r.seq);
        }
        if r.places() {
            placing.insert(&r.path);
        }
        if r.renames() {
            moving.insert(r.origin_loc());
        }
        // (What is still to be made is not in any directory of the origin yet.)
        if !r.creates() {
            let loc = r.origin_loc();
            for i in 1..loc.len() {
                occupied.insert(&loc[..i]);
            }
        }
    }
    let inside = |path: &[Vec<u8>], set: &HashSet<&[Vec<u8>]>| {
        (1..path.len()).any(|i| set.contains(&path[..i]))
    };
    // Directories with something still to go inside them (here, or on the origin).
    let mut holding: HashSet<&[Vec<u8>]> = HashSet::new();
    for (_, r) in records {
        for p in [r.path.as_slice(), r.origin_loc()] {
            for i in 1..p.len() {
                holding.insert(&p[..i]);
            }
        }
    }
    records
        .iter()
        .filter(|(_, r)| {
            let waits = (r.places()
                && (vacating.get(r.path.as_slice()).is_some_and(|s| *s != r.seq)
                    || inside(&r.path, &placing)))
                || (!r.creates() && inside(r.origin_loc(), &moving))
                || (r.kind == Kind::Rmdir && occupied.contains(r.origin_loc()))
                || (r.is_dir
                    && !r.set.is_empty()
                    && !r.changes_names()
                    && holding.contains(r.path.as_slice()));
            !waits
        })
        .map(|(p, r)| (p.clone(), r.clone()))
        .collect()
}

/// Breaks cycles of renames for one reintegration, by parking one object (see the module
/// docs): the superblock whose origin to move it on, and the change log to record the
/// move in.
pub(crate) struct CycleBreaker<'a> {
    sb: &'a Superblock,
    off: &'a OfflineWrites,
}

impl<'a> CycleBreaker<'a> {
    /// A cycle breaker moving objects on `sb`'s origin and recording it in `off`.
    pub(crate) fn new(sb: &'a Superblock, off: &'a OfflineWrites) -> Self {
        CycleBreaker { sb, off }
    }

    /// Renames waiting for each other (a swap, `a→b` and `b→a`; a directory moved into
    /// the place of something moved out of it): the oldest one's object moves on the
    /// origin to a temporary name in the root ([`parking`]), out of every directory that
    /// moves, so the others can go; its record follows. Returns whether one moved.
    pub(crate) fn break_cycle(&self, records: &[(Arc<Pending>, Record)]) -> bool {
        let candidates = records
            .iter()
            .filter(|(_, r)| r.renames() && r.origin_loc() != parking(r.seq).as_slice());
        for (p, r) in candidates {
            match self.park(p, r) {
                Ok(true) => return true,
                Ok(false) => continue,
                Err(e) => {
                    tracing::warn!("cannot move a renamed object out of the way: {e}");
                    return false;
                }
            }
        }
        false
    }

    /// Moves the object of rename `r` (change `p`) to its parking name, or finds it
    /// there (a client killed before it noted that), and records it; false if the origin
    /// has it in neither place.
    fn park(&self, p: &Pending, r: &Record) -> FsResult<bool> {
        let off = self.off;
        // (The change's lock, then the moves' guard, as a sender takes them.)
        let mut g = p.lock();
        let _moving = off.log.moving();
        let root = self.sb.origin().info()?.root.handle;
        let temp = parking(r.seq);
        let here = match Found::at(self.sb.origin(), root, r.origin_loc())? {
            Found {
                dir: Some(dir),
                entry: Some(e),
            } if e.attr.file_id == r.origin_id() => {
                let name = r.origin_loc().last().expect("a path has a name");
                self.sb.origin().rename(
                    dir,
                    name,
                    root,
                    &temp[0],
                    hoardfs_origin::RENAME_NOREPLACE,
                )?;
                true
            }
            _ => matches!(
                Found::at(self.sb.origin(), root, &temp)?.entry,
                Some(e) if e.attr.file_id == r.origin_id()
            ),
        };
        if !here {
            return Ok(false);
        }
        if r.is_dir {
            off.log
                .moved_under(r.origin_loc(), &temp, true, &[p.seq].into())
                .map_err(crate::offline::state::kept)?;
        }
        g.moved_on_origin(temp)
            .map_err(crate::offline::state::kept)?;
        Ok(true)
    }
}
