//! The client modify log (Coda's CML) of `--offline-writes`: files changed, created or
//! removed while the origin was unreachable, waiting to be sent back (a record's
//! [`Kind`]).
//!
//! One [`Pending`] per changed file (repeated writes of a file collapse into it): a
//! record naming the file (its path from the export root at the first change, its file
//! id, and the **base version** the change started from) and a staging file holding the
//! file's whole new content. The staging file starts as a copy of the complete cached
//! object of the base version; writes and truncations apply to it; reads of the file
//! come from it while it is pending. Reintegration (`crate::reintegrate`) sends it back
//! and removes both.
//!
//! On disk, in `CACHE_DIR/cml/`: `SEQ.data` (the staging file) and `SEQ.rec` (the
//! record: magic, postcard body, xxh3 checksum), both made durable (fsync, rename, fsync
//! of the directory) before the first change is acknowledged; the staging file's later
//! changes are made durable by `fsync` and at close, as a local file system's are. The
//! record is rewritten once more when an upload starts (`Uploading`), so that a client
//! killed in the middle sends the whole file again rather than take its own half-sent
//! file for somebody else's change. A record that does not check out is set aside
//! (`SEQ.rec.damaged`, with its `SEQ.data.damaged`) and reported, never applied; numbers
//! are never reused. Conflicts are appended to
//! `cml/conflicts` (one JSON object per line).
//!
//! Locks: the log's table is a leaf; a [`Pending`]'s lock is held across its staging
//! file's I/O and, during reintegration, across the upload (writes to that file wait).

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hoardfs_cache::CachedObject;
use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

const MAGIC: &[u8; 8] = b"HFSCML2\n";

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
    /// The file is removed (nothing staged).
    Remove,
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
    /// For a `Create`: the origin's id of the file once created (an upload then goes on
    /// over it after a failure).
    pub created: Option<u64>,
}

impl Record {
    /// A fresh record (`Staged`, just now) number `seq` of `kind` for the file at `path`
    /// whose attributes are `base` (the origin's, or for a `Create` this client's own).
    fn new(seq: u64, path: Vec<Vec<u8>>, base: &hoardfs_origin::Attr, kind: Kind) -> Record {
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
        }
    }
}

/// Local attributes of a file with a pending change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalChange {
    /// Size of the staged content.
    pub size: u64,
    /// When it was last changed here.
    pub mtime: SystemTime,
}

/// One file with a pending change: its record and staging file.
pub struct Pending {
    /// Order of first change (also in the record).
    pub seq: u64,
    /// The origin object changed (also in the record).
    pub file_id: u64,
    /// When it was first changed (seconds since the epoch; also in the record).
    since: u64,
    /// The staged size, readable without the lock (for `stats`, which must not wait for
    /// an upload).
    size: std::sync::atomic::AtomicU64,
    inner: Mutex<Inner>,
}

/// What the lock of a [`Pending`] covers.
pub struct Inner {
    record: Record,
    rec_path: PathBuf,
    data_path: PathBuf,
    size: u64,
    mtime: SystemTime,
    /// Sent back (or given up): writes must not land here any more.
    gone: bool,
}

/// The log's counters for `stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Files with a pending change.
    pub files: u64,
    /// Bytes staged for them.
    pub bytes: u64,
    /// Age of the oldest pending change.
    pub oldest: Option<Duration>,
    /// Conflicts recorded (in this cache directory, ever).
    pub conflicts: u64,
}

/// One conflict, as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// When (seconds since the epoch).
    pub at: u64,
    /// The path whose change conflicted.
    pub path: String,
    /// Where this client's version was put instead.
    pub copy: String,
    /// Why.
    pub reason: String,
}

/// The log: pending changes by file id, persisted in a directory.
pub struct ChangeLog {
    dir: PathBuf,
    pending: Mutex<BTreeMap<u64, Arc<Pending>>>,
    /// Held across [`ChangeLog::stage`], so one file is staged once (taken before the
    /// table's lock).
    next_seq: Mutex<u64>,
}

/// Seconds since the epoch, now.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn encode(rec: &Record) -> Vec<u8> {
    crate::sealed::seal(MAGIC, rec)
}

fn decode(bytes: &[u8]) -> Result<Record, String> {
    crate::sealed::unseal(MAGIC, bytes)
}

impl ChangeLog {
    /// Opens (creating) the log in `dir` and loads the changes a previous mount left.
    pub fn open(dir: &Path) -> std::io::Result<ChangeLog> {
        std::fs::create_dir_all(dir)?;
        let mut pending = BTreeMap::new();
        let mut next = 1;
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            // Numbers are never reused, whatever became of their files (set aside as
            // damaged, or left half made).
            if let Some(n) = name.split('.').next().and_then(|s| s.parse::<u64>().ok()) {
                next = next.max(n.saturating_add(1));
            }
            if name.ends_with(".tmp") {
                // An unfinished stage or record update: its first change was never
                // acknowledged (or the previous record is still in place).
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let Some(seq) = name
                .strip_suffix(".rec")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let data_path = dir.join(format!("{seq:016}.data"));
            let loaded = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| decode(&b))
                .and_then(|rec| {
                    let staging = OpenOptions::new()
                        .read(true)
                        .write(true)
                        .open(&data_path)
                        .map_err(|e| format!("{}: {e}", data_path.display()))?;
                    let md = staging.metadata().map_err(|e| e.to_string())?;
                    Ok((rec, staging, md))
                });
            match loaded {
                Ok((record, _, md)) => {
                    next = next.max(record.seq + 1);
                    let (seq, file_id, since) = (record.seq, record.file_id, record.since);
                    let p = Pending {
                        seq,
                        file_id,
                        since,
                        size: md.len().into(),
                        inner: Mutex::new(Inner {
                            size: md.len(),
                            mtime: md.modified().unwrap_or_else(|_| SystemTime::now()),
                            rec_path: path.clone(),
                            data_path,
                            gone: false,
                            record,
                        }),
                    };
                    pending.insert(file_id, Arc::new(p));
                }
                Err(why) => {
                    tracing::error!(
                        "offline change record {} cannot be used ({why}); set aside as \
                         .damaged with its data, not applied",
                        path.display()
                    );
                    let _ = std::fs::rename(&path, path.with_extension("rec.damaged"));
                    let _ = std::fs::rename(&data_path, data_path.with_extension("data.damaged"));
                }
            }
        }
        Ok(ChangeLog {
            dir: dir.to_path_buf(),
            pending: Mutex::new(pending),
            next_seq: Mutex::new(next),
        })
    }

    /// The pending change of `file_id`, if any.
    pub fn get(&self, file_id: u64) -> Option<Arc<Pending>> {
        self.pending.lock().get(&file_id).cloned()
    }

    /// Number of pending changes (cheap: the keeper asks every second).
    pub fn count(&self) -> usize {
        self.pending.lock().len()
    }

    /// Every pending change, oldest first.
    pub fn all(&self) -> Vec<Arc<Pending>> {
        let mut v: Vec<Arc<Pending>> = self.pending.lock().values().cloned().collect();
        v.sort_by_key(|p| p.seq);
        v
    }

    /// Local attributes of every file whose content is pending (not removals), by file id.
    pub fn local_changes(&self) -> Vec<(u64, LocalChange)> {
        self.all()
            .iter()
            .filter_map(|p| {
                let g = p.lock();
                (g.record.kind != Kind::Remove).then(|| (g.record.file_id, g.local()))
            })
            .collect()
    }

    /// Starts a pending change of file `file_id` at `path`, from `object` (which must be
    /// complete and hold `base_version`): copies it into a staging file and records it,
    /// durably. Returns the existing one if the file is pending already.
    pub fn stage(
        &self,
        path: Vec<Vec<u8>>,
        base: &hoardfs_origin::Attr,
        object: &CachedObject,
    ) -> std::io::Result<Arc<Pending>> {
        let file_id = base.file_id;
        let mut next = self.next_seq.lock();
        if let Some(p) = self.get(file_id) {
            return Ok(p);
        }
        let seq = *next;
        *next += 1;
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let tmp = data_path.with_extension("data.tmp");
        let staging = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        let size = object.shape().size;
        let chunk = object.shape().chunk_size;
        let mut buf = vec![0u8; chunk as usize];
        let mut off = 0;
        while off < size {
            let len = chunk.min(size - off) as usize;
            let c = off / chunk;
            let ok = object
                .read_chunk_at(c, &mut buf[..len], off)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            if !ok {
                let _ = std::fs::remove_file(&tmp);
                return Err(std::io::Error::other("the cached copy is not complete"));
            }
            staging.write_all_at(&buf[..len], off)?;
            off += len as u64;
        }
        staging.sync_all()?;
        std::fs::rename(&tmp, &data_path)?;
        let record = Record::new(seq, path, base, Kind::Store);
        drop(staging);
        let p = self.insert(record, size)?;
        drop(next);
        Ok(p)
    }

    /// Starts a pending creation of a new file at `path` with attributes `attr` (its file
    /// id this client's own): an empty staging file and a record, durably.
    pub fn stage_new(
        &self,
        path: Vec<Vec<u8>>,
        attr: &hoardfs_origin::Attr,
    ) -> std::io::Result<Arc<Pending>> {
        self.stage_empty(path, attr, Kind::Create)
    }

    /// Makes the staged content at `from` (another change's, which the caller then
    /// finishes) the new content of origin file `base` at `path`: replaces the content of
    /// its pending change, or starts a `Store` from `base`'s version. For a file created
    /// offline and renamed over a file of the origin (an editor's save), durably.
    pub fn adopt(
        &self,
        path: Vec<Vec<u8>>,
        base: &hoardfs_origin::Attr,
        from: &Path,
    ) -> std::io::Result<Arc<Pending>> {
        if let Some(p) = self.get(base.file_id) {
            let mut g = p.lock();
            if !g.gone {
                std::fs::rename(from, &g.data_path)?;
                File::open(&self.dir)?.sync_all()?;
                g.size = std::fs::metadata(&g.data_path)?.len();
                g.mtime = SystemTime::now();
                p.note_size(&g);
                drop(g);
                return Ok(p);
            }
        }
        let mut next = self.next_seq.lock();
        let seq = *next;
        *next += 1;
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let record = Record::new(seq, path, base, Kind::Store);
        // The record first: a crash before the content moves leaves a record without
        // data (set aside at the next start) and the content where it was. (Until the
        // content is in place, sending the record fails to read it: nothing is sent.)
        let size = std::fs::metadata(from)?.len();
        let p = self.insert(record, size)?;
        drop(next);
        std::fs::rename(from, &data_path)?;
        File::open(&self.dir)?.sync_all()?;
        Ok(p)
    }

    /// Starts a pending removal of the file at `path` (attributes `base`, as the origin
    /// last reported them), durably.
    pub fn stage_remove(
        &self,
        path: Vec<Vec<u8>>,
        base: &hoardfs_origin::Attr,
    ) -> std::io::Result<Arc<Pending>> {
        self.stage_empty(path, base, Kind::Remove)
    }

    fn stage_empty(
        &self,
        path: Vec<Vec<u8>>,
        attr: &hoardfs_origin::Attr,
        kind: Kind,
    ) -> std::io::Result<Arc<Pending>> {
        let mut next = self.next_seq.lock();
        if let Some(p) = self.get(attr.file_id) {
            return Ok(p);
        }
        let seq = *next;
        *next += 1;
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let f = File::create(&data_path)?;
        f.sync_all()?;
        drop(f);
        let record = Record::new(seq, path, attr, kind);
        let p = self.insert(record, 0)?;
        drop(next);
        Ok(p)
    }

    /// Writes `record` durably and adds it to the table (its staging file is in place).
    fn insert(&self, record: Record, size: u64) -> std::io::Result<Arc<Pending>> {
        let (seq, file_id) = (record.seq, record.file_id);
        let rec_path = self.dir.join(format!("{seq:016}.rec"));
        let data_path = self.dir.join(format!("{seq:016}.data"));
        crate::sealed::write_atomically(&rec_path, &encode(&record))?;
        let p = Arc::new(Pending {
            seq,
            file_id,
            since: record.since,
            size: size.into(),
            inner: Mutex::new(Inner {
                record,
                rec_path,
                data_path,
                size,
                mtime: SystemTime::now(),
                gone: false,
            }),
        });
        self.pending.lock().insert(file_id, p.clone());
        Ok(p)
    }

    /// Forgets `file_id`'s pending change (sent back, or kept as a conflict copy): removes
    /// its record, then its staging file. Called with the pending's lock held (`g`).
    pub fn finish(&self, file_id: u64, g: &mut Inner) {
        g.gone = true;
        if let Err(e) = std::fs::remove_file(&g.rec_path) {
            tracing::warn!("cannot remove {}: {e}", g.rec_path.display());
        }
        let _ = std::fs::remove_file(&g.data_path);
        let _ = File::open(&self.dir).and_then(|d| d.sync_all());
        self.pending.lock().remove(&file_id);
    }

    /// Records a conflict (appended to `conflicts`, fsynced).
    pub fn record_conflict(&self, c: &Conflict) {
        let path = self.dir.join("conflicts");
        let line = conflict_line(c);
        let r = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(line.as_bytes())?;
                f.sync_all()
            });
        if let Err(e) = r {
            tracing::error!("cannot record a conflict in {}: {e}", path.display());
        }
    }

    /// Every conflict recorded, oldest first (lines that do not parse are skipped).
    pub fn conflicts(&self) -> Vec<Conflict> {
        let text = std::fs::read_to_string(self.dir.join("conflicts")).unwrap_or_default();
        text.lines().filter_map(parse_conflict).collect()
    }

    /// Counters for `stats`.
    pub fn stats(&self) -> LogStats {
        let all = self.all();
        let now = now_secs();
        let mut s = LogStats {
            files: all.len() as u64,
            conflicts: self.conflicts().len() as u64,
            ..Default::default()
        };
        for p in &all {
            s.bytes += p.size.load(std::sync::atomic::Ordering::Relaxed);
            let age = Duration::from_secs(now.saturating_sub(p.since));
            s.oldest = Some(s.oldest.map_or(age, |o| o.max(age)));
        }
        s
    }
}

/// A conflict as one JSON line.
fn conflict_line(c: &Conflict) -> String {
    let mut line = serde_json::to_string(c).expect("a conflict serialises");
    line.push('\n');
    line
}

/// Parses a line written by [`conflict_line`].
fn parse_conflict(line: &str) -> Option<Conflict> {
    serde_json::from_str(line).ok()
}

impl Pending {
    /// Locks the change (its staging file's I/O, or an upload, happens under it).
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    /// Publishes the staged size of `g` (this change's locked state) to `stats`.
    pub fn note_size(&self, g: &Inner) {
        self.size
            .store(g.size, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Inner {
    /// The record.
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// Whether the change was sent back or set aside (writes must go elsewhere).
    pub fn is_gone(&self) -> bool {
        self.gone
    }

    /// The file's local attributes.
    pub fn local(&self) -> LocalChange {
        LocalChange {
            size: self.size,
            mtime: self.mtime,
        }
    }

    /// The staging file, opened for this operation (thousands of changes may be pending:
    /// none holds a descriptor between operations).
    fn staging(&self) -> std::io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.data_path)
    }

    /// Writes `data` at `offset` of the staged content.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.staging()?.write_all_at(data, offset)?;
        self.size = self.size.max(offset + data.len() as u64);
        self.mtime = SystemTime::now();
        Ok(())
    }

    /// Sets the staged content's size.
    pub fn truncate(&mut self, size: u64) -> std::io::Result<()> {
        self.staging()?.set_len(size)?;
        self.size = size;
        self.mtime = SystemTime::now();
        Ok(())
    }

    /// Reads up to `len` bytes at `offset` of the staged content.
    pub fn read(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let end = offset.saturating_add(len as u64).min(self.size);
        let mut buf = vec![0u8; end.saturating_sub(offset) as usize];
        let file = self.staging()?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64)? {
                0 => break,
                n => done += n,
            }
        }
        buf.truncate(done);
        Ok(buf)
    }

    /// Makes the staged content durable.
    pub fn sync(&self) -> std::io::Result<()> {
        self.staging()?.sync_data()
    }

    /// The file was renamed to `path` before any of it reached the origin (a `Create`):
    /// it is created there.
    pub fn moved_to(&mut self, path: Vec<Vec<u8>>) -> std::io::Result<()> {
        self.record.path = path;
        crate::sealed::write_atomically(&self.rec_path, &encode(&self.record))
    }

    /// Where the staged content is (to be moved into another change: [`ChangeLog::adopt`]).
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// The file with a pending `Store` is removed too: the change becomes its removal
    /// (from the same base version), and the staged bytes go.
    pub fn become_removal(&mut self) -> std::io::Result<()> {
        self.staging()?.set_len(0)?;
        self.size = 0;
        self.record.kind = Kind::Remove;
        crate::sealed::write_atomically(&self.rec_path, &encode(&self.record))
    }

    /// A `Create` reached the origin as file `server_id` (at version `version`): a
    /// failed upload goes on over that file.
    pub fn created(&mut self, server_id: u64, version: u64) -> std::io::Result<()> {
        self.record.created = Some(server_id);
        self.record.phase = Phase::Resume { expected: version };
        crate::sealed::write_atomically(&self.rec_path, &encode(&self.record))
    }

    /// Records that an upload starts (durably, before the origin sees any of it).
    pub fn start_upload(&mut self) -> std::io::Result<()> {
        self.set_phase(Phase::Uploading)
    }

    /// Records that an upload failed, leaving the origin's file at version `expected`.
    pub fn upload_failed(&mut self, expected: u64) -> std::io::Result<()> {
        self.set_phase(Phase::Resume { expected })
    }

    fn set_phase(&mut self, phase: Phase) -> std::io::Result<()> {
        if self.record.phase == phase {
            return Ok(());
        }
        self.staging()?.sync_data()?;
        self.record.phase = phase;
        crate::sealed::write_atomically(&self.rec_path, &encode(&self.record))
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
        };
        let bytes = encode(&rec);
        let back = decode(&bytes).unwrap();
        assert_eq!(
            (back.seq, back.path, back.phase),
            (7, rec.path.clone(), Phase::Uploading)
        );
        for i in [0, 9, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(decode(&bad).is_err(), "flipped byte {i}");
        }
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn a_damaged_record_is_set_aside_with_its_data_and_its_number_never_reused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("0000000000000005.rec"), b"not a record").unwrap();
        std::fs::write(d.path().join("0000000000000005.data"), b"precious").unwrap();
        std::fs::write(d.path().join("0000000000000009.data.tmp"), b"half made").unwrap();
        let log = ChangeLog::open(d.path()).unwrap();
        assert!(log.all().is_empty());
        assert!(d.path().join("0000000000000005.rec.damaged").exists());
        assert_eq!(
            std::fs::read(d.path().join("0000000000000005.data.damaged")).unwrap(),
            b"precious"
        );
        assert!(!d.path().join("0000000000000009.data.tmp").exists());
        assert_eq!(*log.next_seq.lock(), 10);
    }

    #[test]
    fn conflicts_round_trip_with_awkward_names() {
        let c = Conflict {
            at: 5,
            path: "/d/we\"ird\\name\n".into(),
            copy: "/d/x.conflict-h-1".into(),
            reason: "changed on the server".into(),
        };
        let line = conflict_line(&c);
        assert_eq!(line.matches('\n').count(), 1);
        assert_eq!(parse_conflict(line.trim_end()), Some(c));
    }
}
