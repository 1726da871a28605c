//! The client modify log (Coda's CML) of `--offline-writes`: objects changed, made or
//! removed while the origin was unreachable, waiting to be sent back (a record's
//! [`Kind`]).
//!
//! One [`Pending`] per changed object (repeated changes of an object collapse into it): a
//! record naming the object (its path here, and where the origin has it when it moved:
//! `origin_path`; its file id, and the **base version** the change started from;
//! permission and time changes; a symlink's target) and a staging file. For a file whose
//! content changed (`Store`, `Create`) the staging file holds its whole new content: it
//! starts as a copy of the complete cached object of the base version; writes and
//! truncations apply to it; reads of the file come from it while it is pending. Other
//! kinds leave it empty. Reintegration (`crate::reintegrate`) sends the change back and
//! removes both.
//!
//! On disk, in `CACHE_DIR/cml/`: `SEQ.data` (the staging file) and `SEQ.rec` (the
//! record: magic, postcard body, xxh3 checksum), both made durable (fsync, rename, fsync
//! of the directory) before the first change is acknowledged; the staging file's later
//! changes are made durable by `fsync` and at close, as a local file system's are. The
//! record is rewritten (atomically) whenever the change's path, kind, attributes or phase
//! change; before an upload starts it says `Uploading`, so that a client killed in the
//! middle sends the whole file again rather than take its own half-sent file for
//! somebody else's change. A record that does not check out is set aside
//! (`SEQ.rec.damaged`, with its `SEQ.data.damaged`) and reported, never applied; numbers
//! are never reused. Conflicts are appended to `cml/conflicts` (one JSON object per line).
//! The log counts the records that change names (`names_pending`).
//!
//! Locks: the log's table is a leaf; a [`Pending`]'s lock is held across its staging
//! file's I/O and, during reintegration, across the upload (writes to that file wait).
//! One `Pending`'s lock may be held while taking another's: a directory's while the
//! changes inside it follow its move ([`ChangeLog::moved_under`], which skips the changes
//! being sent), and a created file's while the document it is saved over gets its new
//! change ([`ChangeLog::adopt`], only for a document with no change of its own).

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

pub use crate::record::{AttrChange, Kind, Phase, Record, is_under};
use crate::record::{decode, encode};

/// Local attributes of an object with a pending change (what overrides the origin's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LocalChange {
    /// Size of the staged content; `None`: the content is the origin's.
    pub size: Option<u64>,
    /// When it was last changed here (by a write, or set).
    pub mtime: Option<SystemTime>,
    /// Access time set here.
    pub atime: Option<hoardfs_origin::Timestamp>,
    /// Permission bits set here.
    pub perm: Option<u16>,
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
    /// When the content was last changed here (`None`: not changed here).
    mtime: Option<SystemTime>,
    /// Sent back (or given up): writes must not land here any more.
    gone: bool,
    /// Counted in the log's number of changes to names.
    counted_names: bool,
    /// The log's number of changes to names.
    names: Arc<std::sync::atomic::AtomicUsize>,
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
    /// Changes that alter names on the origin (while any is pending, this client's view of
    /// names is its own: see `HoardFs::names_pending`).
    names: Arc<std::sync::atomic::AtomicUsize>,
    pending: Mutex<BTreeMap<u64, Arc<Pending>>>,
    /// Held across [`ChangeLog::stage`], so one file is staged once (taken before the
    /// table's lock).
    next_seq: Mutex<u64>,
    /// Counts the moves made on the origin (held while one is made and its changes
    /// follow it): a change recorded with where the origin has its object is recorded
    /// under it, and only if no move happened since that place was worked out
    /// ([`ChangeLog::at_origin`]). Taken with no `Pending` lock held by the recorder, and
    /// after its own by a sender: never the other way round.
    moves: Mutex<u64>,
}

/// Seconds since the epoch, now.
pub(crate) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl ChangeLog {
    /// Opens (creating) the log in `dir` and loads the changes a previous mount left.
    pub fn open(dir: &Path) -> std::io::Result<ChangeLog> {
        std::fs::create_dir_all(dir)?;
        let names = Arc::new(std::sync::atomic::AtomicUsize::new(0));
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
                    let counted_names = record.changes_names();
                    if counted_names {
                        names.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    let p = Pending {
                        seq,
                        file_id,
                        since,
                        size: md.len().into(),
                        inner: Mutex::new(Inner {
                            size: md.len(),
                            mtime: record
                                .has_content()
                                .then(|| md.modified().unwrap_or_else(|_| SystemTime::now())),
                            rec_path: path.clone(),
                            data_path,
                            gone: false,
                            record,
                            counted_names,
                            names: names.clone(),
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
            moves: Mutex::new(0),
            names,
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

    /// Local attributes of every object with a pending change (not removals), by file id.
    pub fn local_changes(&self) -> Vec<(u64, LocalChange)> {
        self.all()
            .iter()
            .filter_map(|p| {
                let g = p.lock();
                (!g.record.removes()).then(|| (g.record.file_id, g.local()))
            })
            .collect()
    }

    /// Whether any pending change alters names on the origin.
    pub fn names_pending(&self) -> bool {
        self.names.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Every pending change's record, oldest first (for reintegration's order).
    pub fn records(&self) -> Vec<(Arc<Pending>, Record)> {
        self.all()
            .into_iter()
            .filter_map(|p| {
                let g = p.lock();
                let r = (!g.gone).then(|| g.record.clone());
                drop(g);
                r.map(|r| (p, r))
            })
            .collect()
    }

    /// The object at `from` moved to `to` (here, or on the origin at reintegration): the
    /// paths of the changes inside it follow; for `origin`, where they are on the origin
    /// (`Record::origin_loc`), otherwise where they are here. Changes whose lock the
    /// caller (or another sender) may hold, and which are not inside `from`, are passed
    /// as `skip` (by sequence number): every other change's lock is taken in turn.
    pub fn moved_under(
        &self,
        from: &[Vec<u8>],
        to: &[Vec<u8>],
        origin: bool,
        skip: &std::collections::HashSet<u64>,
    ) -> std::io::Result<()> {
        let vacated = if origin {
            Default::default()
        } else {
            self.vacated(skip)
        };
        for p in self.all() {
            if skip.contains(&p.seq) {
                continue;
            }
            let mut g = p.lock();
            if g.gone {
                continue;
            }
            if origin && g.record.creates() {
                // Not on the origin: nothing of it moves there.
                continue;
            }
            let at = if origin {
                g.record.origin_loc().to_vec()
            } else {
                g.record.path.clone()
            };
            if !is_under(&at, from) {
                continue;
            }
            let mut moved = to.to_vec();
            moved.extend_from_slice(&at[from.len()..]);
            if origin {
                g.record.origin_path = Some(moved);
                g.normalise();
                g.persist()?;
            } else {
                g.moved_to(moved, &vacated)?;
            }
        }
        Ok(())
    }

    /// A move on the origin is made (and the changes inside it follow it) while the
    /// returned guard is held.
    pub fn moving(&self) -> MutexGuard<'_, u64> {
        let mut g = self.moves.lock();
        *g += 1;
        g
    }

    /// Records a change with `origin`'s answer for where the origin has its object
    /// (worked out again while a move happened meanwhile), with no move in between.
    pub fn at_origin<T>(
        &self,
        origin: impl Fn() -> Option<Vec<Vec<u8>>>,
        record: impl FnOnce(Option<Vec<Vec<u8>>>) -> T,
    ) -> T {
        loop {
            let before = *self.moves.lock();
            let at = origin();
            let g = self.moves.lock();
            if *g == before {
                let r = record(at);
                drop(g);
                return r;
            }
        }
    }

    /// Where the pending changes (but those in `skip`, whose locks may be held) take
    /// objects away on the origin (removals, moves away).
    pub fn vacated(
        &self,
        skip: &std::collections::HashSet<u64>,
    ) -> std::collections::HashSet<Vec<Vec<u8>>> {
        self.all()
            .into_iter()
            .filter(|p| !skip.contains(&p.seq))
            .filter_map(|p| {
                let g = p.lock();
                (!g.gone && g.record.vacates()).then(|| g.record.origin_loc().to_vec())
            })
            .collect()
    }

    /// Starts a pending change of names or attributes only of origin object `base` at
    /// `path` (its content stays the origin's), durably.
    pub fn stage_meta(
        &self,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
    ) -> std::io::Result<Arc<Pending>> {
        self.stage_empty(path, origin, base, Kind::Meta, &[])
    }

    /// Starts a pending creation of a directory or (with `target`) a symbolic link at
    /// `path` with attributes `attr` (its file id this client's own), durably.
    pub fn stage_made(
        &self,
        path: Vec<Vec<u8>>,
        attr: &hoardfs_origin::Attr,
        target: Option<&[u8]>,
    ) -> std::io::Result<Arc<Pending>> {
        match target {
            Some(t) => self.stage_empty(path, None, attr, Kind::Symlink, t),
            None => self.stage_empty(path, None, attr, Kind::Mkdir, &[]),
        }
    }

    /// Starts a pending change of file `file_id` at `path` (at `origin` on the origin, if
    /// elsewhere), from `object` (which must be complete and hold `base_version`): copies
    /// it into a staging file and records it, durably. Returns the existing change if the
    /// file has one with staged content; a `Meta` change (a move, attributes) gets the
    /// content and becomes a `Store`.
    pub fn stage(
        &self,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
        object: &CachedObject,
    ) -> std::io::Result<Arc<Pending>> {
        let file_id = base.file_id;
        let mut next = self.next_seq.lock();
        // A file renamed or with attributes changed offline gets its content staged too.
        let meta = match self.get(file_id) {
            Some(p) if p.lock().record.kind == Kind::Meta => Some(p),
            Some(p) => return Ok(p),
            None => None,
        };
        // (A `Meta` sent back meanwhile is finished: a new change starts.)
        let meta = meta.filter(|p| !p.lock().gone);
        let seq = match &meta {
            Some(p) => p.seq,
            None => {
                *next += 1;
                *next - 1
            }
        };
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
        drop(staging);
        if let Some(p) = meta {
            // (A crash before the record says `Store` leaves a `Meta` record with data
            // nobody reads: the content is the origin's again, as before this write.)
            let mut g = p.lock();
            if g.gone {
                drop(g);
                let _ = std::fs::remove_file(&data_path);
                return Err(std::io::Error::other(
                    "its change was sent back meanwhile: try again",
                ));
            }
            g.record.kind = Kind::Store;
            // (The content staged is of this version, whatever the move started from.)
            g.record.base_version = base.version;
            g.size = size;
            g.mtime = Some(SystemTime::now());
            g.persist()?;
            p.note_size(&g);
            drop(g);
            return Ok(p);
        }
        let mut record = Record::new(seq, path, base, Kind::Store);
        record.origin_path = origin.filter(|o| *o != record.path);
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
        self.stage_empty(path, None, attr, Kind::Create, &[])
    }

    /// Makes the staged content at `from` (another change's, which the caller then
    /// finishes) the new content of origin file `base` at `path` (which has no change of
    /// its own): a `Store` from `base`'s version. For a file created offline and renamed
    /// over a file of the origin (an editor's save), durably.
    pub fn adopt(
        &self,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
        from: &Path,
    ) -> std::io::Result<Arc<Pending>> {
        let mut next = self.next_seq.lock();
        let seq = *next;
        *next += 1;
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let mut record = Record::new(seq, path, base, Kind::Store);
        record.origin_path = origin.filter(|o| *o != record.path);
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
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
    ) -> std::io::Result<Arc<Pending>> {
        let kind = if base.kind == hoardfs_origin::FileKind::Dir {
            Kind::Rmdir
        } else {
            Kind::Remove
        };
        self.stage_empty(path, origin, base, kind, &[])
    }

    /// Starts a pending change without staged content (a symlink's `target` in the
    /// record), durably; the existing one if the object has one.
    fn stage_empty(
        &self,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        attr: &hoardfs_origin::Attr,
        kind: Kind,
        target: &[u8],
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
        let mut record = Record::new(seq, path, attr, kind);
        record.target = target.to_vec();
        record.origin_path = origin.filter(|o| *o != record.path);
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
        let counted_names = record.changes_names();
        if counted_names {
            self.names.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let p = Arc::new(Pending {
            seq,
            file_id,
            since: record.since,
            size: size.into(),
            inner: Mutex::new(Inner {
                mtime: record.has_content().then(SystemTime::now),
                record,
                rec_path,
                data_path,
                size,
                gone: false,
                counted_names,
                names: self.names.clone(),
            }),
        });
        self.pending.lock().insert(file_id, p.clone());
        Ok(p)
    }

    /// Forgets `file_id`'s pending change (sent back, or kept as a conflict copy): removes
    /// its record, then its staging file. Called with the pending's lock held (`g`).
    pub fn finish(&self, file_id: u64, g: &mut Inner) {
        g.gone = true;
        if std::mem::take(&mut g.counted_names) {
            self.names.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
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

    /// The object's local attributes.
    pub fn local(&self) -> LocalChange {
        let set = self.record.set;
        let stamp = |t: hoardfs_origin::Timestamp| {
            let nanos = Duration::new(t.secs.max(0) as u64, t.nanos.min(999_999_999));
            UNIX_EPOCH + nanos
        };
        LocalChange {
            size: self.record.has_content().then_some(self.size),
            mtime: set.mtime.map(stamp).or(self.mtime),
            atime: set.atime,
            perm: set.perm,
        }
    }

    /// The staged content's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Writes the record durably, and keeps the log's count of changes to names.
    fn persist(&mut self) -> std::io::Result<()> {
        crate::sealed::write_atomically(&self.rec_path, &encode(&self.record))?;
        let names = self.record.changes_names();
        if names != self.counted_names {
            self.counted_names = names;
            if names {
                self.names.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            } else {
                self.names.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        Ok(())
    }

    /// An object back at its origin name is not renamed.
    fn normalise(&mut self) {
        if self.record.origin_path.as_ref() == Some(&self.record.path) {
            self.record.origin_path = None;
        }
    }

    /// Whether the change no longer does anything (renamed back, nothing else changed).
    pub fn is_void(&self) -> bool {
        self.record.kind == Kind::Meta
            && self.record.origin_path.is_none()
            && self.record.set.is_empty()
    }

    /// Sets permission bits and times (`None`: left as they are), durably.
    pub fn set_attrs(&mut self, change: AttrChange) -> std::io::Result<()> {
        let set = &mut self.record.set;
        set.perm = change.perm.or(set.perm);
        set.atime = change.atime.or(set.atime);
        set.mtime = change.mtime.or(set.mtime);
        self.persist()
    }

    /// The origin has the object at `path` now (its rename was sent back), durably.
    pub fn arrived(&mut self) -> std::io::Result<()> {
        self.record.origin_path = None;
        self.persist()
    }

    /// The origin has the object at `at` now (moved out of the way there), durably.
    pub fn moved_on_origin(&mut self, at: Vec<Vec<u8>>) -> std::io::Result<()> {
        self.record.origin_path = Some(at);
        self.normalise();
        self.persist()
    }

    /// The change's object is to be at `path` (a conflict name chosen before it is
    /// tried), durably.
    pub fn set_path(&mut self, path: Vec<Vec<u8>>) -> std::io::Result<()> {
        self.record.path = path;
        self.normalise();
        self.persist()
    }

    /// The origin has the object at `at`, not where this change put it (a name taken
    /// there, or the destination gone): this change's path is `at` from now on, durably.
    pub fn placed_at(&mut self, at: Vec<Vec<u8>>) -> std::io::Result<()> {
        self.record.path = at;
        self.record.origin_path = None;
        self.persist()
    }

    /// A directory or symlink created offline reached the origin as `server_id` (its
    /// attributes are set next).
    pub fn made(&mut self, server_id: u64) -> std::io::Result<()> {
        self.record.created = Some(server_id);
        self.persist()
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
        self.touched()
    }

    /// Sets the staged content's size.
    pub fn truncate(&mut self, size: u64) -> std::io::Result<()> {
        self.staging()?.set_len(size)?;
        self.size = size;
        self.touched()
    }

    /// The content changed now: a modification time set earlier no longer holds.
    fn touched(&mut self) -> std::io::Result<()> {
        self.mtime = Some(SystemTime::now());
        if self.record.set.mtime.take().is_some() {
            self.persist()?;
        }
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

    /// The object was renamed here to `path`: one still to be made is made there; one the
    /// origin has moves there from where the origin has it. A path equal to where the
    /// origin has it is no move, unless a directory on the way is another object by then
    /// (`vacated`: where other changes take objects away on the origin).
    pub fn moved_to(
        &mut self,
        path: Vec<Vec<u8>>,
        vacated: &std::collections::HashSet<Vec<Vec<u8>>>,
    ) -> std::io::Result<()> {
        if self.record.origin_path.is_none() && !self.record.creates() {
            self.record.origin_path = Some(self.record.path.clone());
        }
        let replaced_on_the_way = (1..path.len()).any(|i| vacated.contains(&path[..i]));
        self.record.path = path;
        if !replaced_on_the_way {
            self.normalise();
        }
        self.persist()
    }

    /// Where the staged content is (to be moved into another change: [`ChangeLog::adopt`]).
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    /// The object with a pending `Store` or `Meta` change is removed too (`dir`: it is a
    /// directory): the change becomes its removal (from the same base version, where
    /// the origin has it), and the staged bytes go.
    pub fn become_removal(&mut self, dir: bool) -> std::io::Result<()> {
        self.staging()?.set_len(0)?;
        self.size = 0;
        self.record.kind = if dir { Kind::Rmdir } else { Kind::Remove };
        self.persist()
    }

    /// A `Create` reached the origin as file `server_id` (at version `version`): a
    /// failed upload goes on over that file.
    pub fn created(&mut self, server_id: u64, version: u64) -> std::io::Result<()> {
        self.record.created = Some(server_id);
        self.record.phase = Phase::Resume { expected: version };
        self.persist()
    }

    /// Records that an upload (or a creation) did not start after all.
    pub fn not_started(&mut self) -> std::io::Result<()> {
        self.set_phase(Phase::Staged)
    }

    /// Records that an upload starts (durably, before the origin sees any of it).
    pub fn start_upload(&mut self) -> std::io::Result<()> {
        self.set_phase(Phase::Uploading)
    }

    /// Records that an upload ended (failed, or done with more to send), leaving the
    /// origin's file at version `expected`.
    pub fn upload_failed(&mut self, expected: u64) -> std::io::Result<()> {
        self.set_phase(Phase::Resume { expected })
    }

    fn set_phase(&mut self, phase: Phase) -> std::io::Result<()> {
        if self.record.phase == phase {
            return Ok(());
        }
        self.staging()?.sync_data()?;
        self.record.phase = phase;
        self.persist()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
