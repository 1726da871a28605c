//! The durable description of one pending offline change ([`Record`]: what it does to
//! which object, from which version, where it is here and on the origin) and its format
//! on disk: a magic naming the format, the postcard body and an xxh3 checksum
//! (`crate::sealed`). Records of the previous format are read and converted; the log
//! (`crate::offline::cml`) writes the current one at the next change.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Seconds since the epoch, now.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

const MAGIC: &[u8; 8] = b"HFSCML4\n";
/// The format before records said who made the change (read, converted: sent back as
/// the object's owner, as this format's records were).
const MAGIC_V3: &[u8; 8] = b"HFSCML3\n";
/// The format before renames, directories, symlinks and attribute changes were logged
/// (read, converted, rewritten in the new format at the next change).
const MAGIC_V2: &[u8; 8] = b"HFSCML2\n";

/// Where a pending change is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Phase {
    /// Staged; the origin has none of it.
    Staged,
    /// An upload started and may have been cut short by a crash: the origin's file may
    /// hold part of it, at a version nobody recorded.
    Uploading,
    /// An upload failed (the origin went away, or refused): the origin's file may hold
    /// part of it, and `expected` is the version it reported after this client's last
    /// write; another version there means somebody else changed the file since.
    Resume {
        /// The origin's version after the failed upload's last write.
        expected: u64,
    },
}

/// What a pending change does to its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    /// The file's content becomes the staged content.
    Store,
    /// A new file with the staged content (the log's file id is this client's own).
    Create,
    /// The file (or symlink) is removed (nothing staged).
    Remove,
    /// A new directory (the log's file id is this client's own).
    Mkdir,
    /// The directory is removed.
    Rmdir,
    /// A new symbolic link to `target` (the log's file id is this client's own).
    Symlink,
    /// The object's content stays the origin's; only its name (`origin_path`) or its
    /// attributes (`set`) changed.
    Meta,
}

/// Permission and time changes made while the origin was unreachable, applied after the
/// content.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttrChange {
    /// New permission bits.
    pub perm: Option<u16>,
    /// New access time.
    pub atime: Option<hoardfs_origin::Timestamp>,
    /// New modification time.
    pub mtime: Option<hoardfs_origin::Timestamp>,
}

impl AttrChange {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        *self == AttrChange::default()
    }
}

/// The durable description of one pending change.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// Order of first change.
    pub seq: u64,
    /// Path components from the export root at the first change.
    pub path: Vec<Vec<u8>>,
    /// The origin object changed.
    pub file_id: u64,
    /// The origin's version the change started from.
    pub base_version: u64,
    /// Permission bits, owner and group, for a conflict copy.
    pub perm: u16,
    /// Owner (see `perm`).
    pub uid: u32,
    /// Group (see `perm`).
    pub gid: u32,
    /// When the file was first changed (seconds since the epoch).
    pub since: u64,
    /// Where it is.
    pub phase: Phase,
    /// What it does.
    pub kind: Kind,
    /// For an object made offline (`Create`, `Mkdir`, `Symlink`): the origin's id once
    /// made there (a `Create`'s upload then goes on over it after a failure).
    pub created: Option<u64>,
    /// Where the object is on the origin, when that is not `path` (it was renamed here,
    /// or the directory holding it was).
    pub origin_path: Option<Vec<Vec<u8>>>,
    /// Permission and time changes.
    pub set: AttrChange,
    /// A `Symlink`'s target.
    pub target: Vec<u8>,
    /// Whether the object is a directory (what lies inside it follows its moves).
    pub is_dir: bool,
    /// Who made the change (the calling process's identity when it started): the change
    /// is sent back as this identity, so the server judges it as it would have judged
    /// the change made online. `None` in records of earlier formats: their owner.
    pub by: Option<hoardfs_origin::Caller>,
}

/// A record in the format before `by` ([`MAGIC_V3`]).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RecordV3 {
    seq: u64,
    path: Vec<Vec<u8>>,
    file_id: u64,
    base_version: u64,
    perm: u16,
    uid: u32,
    gid: u32,
    since: u64,
    phase: Phase,
    kind: Kind,
    created: Option<u64>,
    origin_path: Option<Vec<Vec<u8>>>,
    set: AttrChange,
    target: Vec<u8>,
    is_dir: bool,
}

/// A record in the format before this one ([`MAGIC_V2`]).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct RecordV2 {
    seq: u64,
    path: Vec<Vec<u8>>,
    file_id: u64,
    base_version: u64,
    perm: u16,
    uid: u32,
    gid: u32,
    since: u64,
    phase: Phase,
    kind: Kind,
    created: Option<u64>,
}

/// Whether `path` lies strictly inside directory `dir`.
pub fn is_under(path: &[Vec<u8>], dir: &[Vec<u8>]) -> bool {
    path.len() > dir.len() && path.starts_with(dir)
}

impl Record {
    /// A fresh record (`Staged`, just now) number `seq` of `kind` for the file at `path`
    /// whose attributes are `base` (the origin's, or for a `Create` this client's own).
    pub(crate) fn new(
        seq: u64,
        path: Vec<Vec<u8>>,
        base: &hoardfs_origin::Attr,
        kind: Kind,
    ) -> Record {
        Record {
            seq,
            path,
            file_id: base.file_id,
            base_version: base.version,
            perm: base.perm,
            uid: base.uid,
            gid: base.gid,
            since: now_secs(),
            phase: Phase::Staged,
            kind,
            created: None,
            origin_path: None,
            set: AttrChange::default(),
            target: Vec::new(),
            is_dir: base.kind == hoardfs_origin::FileKind::Dir,
            by: Some((*hoardfs_origin::caller::current()).clone()),
        }
    }

    /// The identity the change is sent back as: who made it, or (a record of an earlier
    /// format) the object's owner.
    pub fn sender(&self) -> hoardfs_origin::Caller {
        self.by
            .clone()
            .unwrap_or_else(|| hoardfs_origin::Caller::new(self.uid, self.gid))
    }

    /// Whether the object is still to be made on the origin (a `Create`, `Mkdir` or
    /// `Symlink` of which nothing reached it yet).
    pub fn creates(&self) -> bool {
        matches!(self.kind, Kind::Create | Kind::Mkdir | Kind::Symlink) && self.created.is_none()
    }

    /// Whether an object made here may have reached the origin without being done: a
    /// `Create` made there with its content not all sent, or any creation sent with no
    /// answer recorded (it began: `Uploading`).
    pub fn create_in_flight(&self) -> bool {
        match self.kind {
            Kind::Create => self.created.is_some() || self.phase == Phase::Uploading,
            Kind::Mkdir | Kind::Symlink => self.created.is_none() && self.phase == Phase::Uploading,
            _ => false,
        }
    }

    /// The origin's id of the object (this client's own id until it was made there).
    pub fn origin_id(&self) -> u64 {
        self.created.unwrap_or(self.file_id)
    }

    /// Whether the change removes the object from the origin.
    pub fn removes(&self) -> bool {
        matches!(self.kind, Kind::Remove | Kind::Rmdir)
    }

    /// Whether the object moves from `origin_path` to `path` on the origin.
    pub fn renames(&self) -> bool {
        self.origin_path.is_some() && !self.removes()
    }

    /// Whether the change puts something at `path` on the origin.
    pub fn places(&self) -> bool {
        self.creates() || self.renames()
    }

    /// Whether the change takes the object away from where the origin has it.
    pub fn vacates(&self) -> bool {
        self.removes() || self.renames()
    }

    /// Whether the change alters names on the origin (not only content or attributes).
    pub fn changes_names(&self) -> bool {
        self.places() || self.vacates()
    }

    /// Where the object is on the origin (or, for one still to be made, will be).
    pub fn origin_loc(&self) -> &[Vec<u8>] {
        self.origin_path.as_deref().unwrap_or(&self.path)
    }

    /// Whether the content is staged here (the staging file is the new content).
    pub fn has_content(&self) -> bool {
        matches!(self.kind, Kind::Store | Kind::Create)
    }
}

pub(crate) fn encode(rec: &Record) -> Vec<u8> {
    crate::sealed::seal(MAGIC, rec)
}

pub(crate) fn decode(bytes: &[u8]) -> Result<Record, crate::sealed::Unsealed> {
    // (Rewritten in place, shorter: `Inner::persist`.)
    let bytes = crate::sealed::without_padding(bytes);
    if bytes.starts_with(MAGIC_V2) {
        let old: RecordV2 = crate::sealed::unseal(MAGIC_V2, bytes)?;
        return Ok(RecordV3::from(old).into());
    }
    if bytes.starts_with(MAGIC_V3) {
        let old: RecordV3 = crate::sealed::unseal(MAGIC_V3, bytes)?;
        return Ok(old.into());
    }
    crate::sealed::unseal(MAGIC, bytes)
}

impl From<RecordV2> for RecordV3 {
    /// A change of the format before renames, directories, symlinks and attribute changes.
    fn from(old: RecordV2) -> RecordV3 {
        RecordV3 {
            seq: old.seq,
            path: old.path,
            file_id: old.file_id,
            base_version: old.base_version,
            perm: old.perm,
            uid: old.uid,
            gid: old.gid,
            since: old.since,
            phase: old.phase,
            kind: old.kind,
            created: old.created,
            origin_path: None,
            set: AttrChange::default(),
            target: Vec::new(),
            is_dir: false,
        }
    }
}

impl From<RecordV3> for Record {
    /// A change that does not say who made it: sent back as its owner.
    fn from(old: RecordV3) -> Record {
        Record {
            seq: old.seq,
            path: old.path,
            file_id: old.file_id,
            base_version: old.base_version,
            perm: old.perm,
            uid: old.uid,
            gid: old.gid,
            since: old.since,
            phase: old.phase,
            kind: old.kind,
            created: old.created,
            origin_path: old.origin_path,
            set: old.set,
            target: old.target,
            is_dir: old.is_dir,
            by: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let rec = Record {
            seq: 7,
            path: vec![b"d".to_vec(), b"f".to_vec()],
            file_id: 42,
            base_version: 99,
            perm: 0o644,
            uid: 1,
            gid: 2,
            since: 1,
            phase: Phase::Uploading,
            kind: Kind::Create,
            created: Some(3),
            origin_path: Some(vec![b"e".to_vec()]),
            set: AttrChange {
                perm: Some(0o600),
                ..Default::default()
            },
            target: b"t".to_vec(),
            is_dir: false,
            by: Some(hoardfs_origin::Caller {
                uid: 5,
                gid: 6,
                groups: vec![7],
            }),
        };
        let bytes = encode(&rec);
        let back = decode(&bytes).unwrap();
        assert_eq!(
            (back.seq, back.path.clone(), back.phase),
            (7, rec.path.clone(), Phase::Uploading)
        );
        assert_eq!(back.sender(), rec.by.clone().unwrap());
        for i in [0, 9, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flipped byte {i}");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn records_of_the_previous_format_are_read() {
        let old = RecordV2 {
            seq: 3,
            path: vec![b"f".to_vec()],
            file_id: 9,
            base_version: 4,
            perm: 0o644,
            uid: 1,
            gid: 1,
            since: 2,
            phase: Phase::Staged,
            kind: Kind::Remove,
            created: None,
        };
        let rec = decode(&crate::sealed::seal(MAGIC_V2, &old)).unwrap();
        assert_eq!((rec.seq, rec.file_id, rec.kind), (3, 9, Kind::Remove));
        assert_eq!(rec.origin_path, None);
        assert!(rec.set.is_empty());
        assert_eq!(rec.sender(), hoardfs_origin::Caller::new(1, 1));
    }

    #[test]
    fn records_that_do_not_say_who_made_them_are_sent_as_their_owner() {
        let old = RecordV3 {
            seq: 3,
            path: vec![b"f".to_vec()],
            file_id: 9,
            base_version: 4,
            perm: 0o640,
            uid: 1000,
            gid: 100,
            since: 2,
            phase: Phase::Staged,
            kind: Kind::Store,
            created: None,
            origin_path: Some(vec![b"g".to_vec()]),
            set: AttrChange::default(),
            target: Vec::new(),
            is_dir: false,
        };
        let rec = decode(&crate::sealed::seal(MAGIC_V3, &old)).unwrap();
        assert_eq!(rec.origin_path, Some(vec![b"g".to_vec()]));
        assert_eq!(rec.by, None);
        assert_eq!(rec.sender(), hoardfs_origin::Caller::new(1000, 100));
    }
}
