//! The listings kept on disk ([`SnapshotFiles`]): one file per directory,
//! `STATE/listings/<xxh3 of the prefix>`, so that a remount within the staleness bound
//! (or without the store) answers from them. Each is written in place behind a checksum
//! of what follows it: a write torn by a crash, a shorter one over a longer, or a foreign
//! file fails the check and is ignored like a missing file.

use std::path::PathBuf;

use parking_lot::Mutex;

use super::snapshot::Snapshot;

/// Format tag of the files on disk.
const DISK_MAGIC: &str = "hoardfs-s3-listing-3";

/// The directory of listing files (none: nothing kept on disk). Lock: `writing` is a leaf,
/// held across one listing's write only.
pub(super) struct SnapshotFiles {
    dir: Option<PathBuf>,
    /// Held while a listing is written.
    writing: Mutex<()>,
}

impl SnapshotFiles {
    /// The listing files in `dir` (made private if missing).
    pub(super) fn new(dir: Option<PathBuf>) -> SnapshotFiles {
        if let Some(d) = &dir {
            let _ = crate::s3::staging::private_dir(d);
        }
        SnapshotFiles {
            dir,
            writing: Mutex::new(()),
        }
    }

    /// The directory they are kept in.
    pub(super) fn dir(&self) -> Option<&std::path::Path> {
        self.dir.as_deref()
    }

    /// The file of the listing of `prefix`.
    pub(super) fn path(&self, prefix: &str) -> Option<PathBuf> {
        let h = xxhash_rust::xxh3::xxh3_64(prefix.as_bytes());
        Some(self.dir.as_ref()?.join(format!("{h:016x}")))
    }

    /// Keeps `snap` as the listing of `prefix` (failures are logged: the listing is then
    /// only in memory).
    pub(super) fn store(&self, prefix: &str, snap: &Snapshot) {
        let Some(path) = self.path(prefix) else {
            return;
        };
        let Ok(body) = postcard::to_stdvec(&(DISK_MAGIC, prefix, snap)) else {
            return;
        };
        let mut bytes = xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes().to_vec();
        bytes.extend_from_slice(&body);
        // Written in place, then cut to length (one writer at a time): a new file per
        // listing written cost an inode created and one deleted each time, and a
        // truncation to zero makes ext4 flush the file at close; the two were most of the
        // cost of revalidating many directories.
        let _one = self.writing.lock();
        let written = crate::s3::staging::private_file()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .and_then(|mut f| {
                std::io::Write::write_all(&mut f, &bytes)?;
                f.set_len(bytes.len() as u64)
            });
        if written.is_err() {
            let _ = std::fs::remove_file(&path);
            tracing::debug!("could not keep the listing of {prefix:?} on disk");
        }
    }

    /// The listing of `prefix` kept on disk, if whole and its own.
    pub(super) fn load(&self, prefix: &str) -> Option<Snapshot> {
        let bytes = std::fs::read(self.path(prefix)?).ok()?;
        let (sum, body) = bytes.split_first_chunk::<8>()?;
        if u64::from_le_bytes(*sum) != xxhash_rust::xxh3::xxh3_64(body) {
            return None;
        }
        let (magic, p, snap): (String, String, Snapshot) = postcard::from_bytes(body).ok()?;
        (magic == DISK_MAGIC && p == prefix).then_some(snap)
    }

    /// Forgets the listing of `prefix` (a change made here: a remount must not find it
    /// fresh).
    pub(super) fn remove(&self, prefix: &str) {
        if let Some(p) = self.path(prefix) {
            let _ = std::fs::remove_file(p);
        }
    }
}
