//! The table of pending changes ([`ChangeLog`]): loading it from `CACHE_DIR/cml/`,
//! staging new changes (each one a [`Pending`]), finishing them, and the counters.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hoardfs_cache::CachedObject;
use parking_lot::{Mutex, MutexGuard};

use super::conflicts::{conflict_line, parse_conflict};
use super::{Conflict, Inner, Kind, LocalChange, LogSync, Pending, Record, is_under, now_secs};
use crate::offline::cml::record::{decode, encode};

/// The next change number (numbers are never reused), taken from `next_seq`'s value.
fn take_seq(next: &mut u64) -> u64 {
    *next += 1;
    *next - 1
}

/// `next_seq` held: nothing takes a change's lock or `moves` meanwhile (the lock order of
/// `crate::offline::cml`), checked in debug builds through [`NextSeq::held`].
struct NextSeq<'a> {
    guard: MutexGuard<'a, u64>,
}

thread_local! {
    /// How many `next_seq` guards this thread holds (debug builds).
    static NEXT_SEQ_HELD: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

impl<'a> NextSeq<'a> {
    fn lock(m: &'a Mutex<u64>) -> Self {
        let guard = m.lock();
        if cfg!(debug_assertions) {
            NEXT_SEQ_HELD.with(|h| h.set(h.get() + 1));
        }
        NextSeq { guard }
    }

    /// Whether this thread holds `next_seq` (always `false` in release builds).
    pub(super) fn held() -> bool {
        cfg!(debug_assertions) && NEXT_SEQ_HELD.with(|h| h.get() > 0)
    }
}

impl Drop for NextSeq<'_> {
    fn drop(&mut self) {
        if cfg!(debug_assertions) {
            NEXT_SEQ_HELD.with(|h| h.set(h.get() - 1));
        }
    }
}

impl std::ops::Deref for NextSeq<'_> {
    type Target = u64;
    fn deref(&self) -> &u64 {
        &self.guard
    }
}

impl std::ops::DerefMut for NextSeq<'_> {
    fn deref_mut(&mut self) -> &mut u64 {
        &mut self.guard
    }
}

/// Panics (debug builds) if this thread holds `next_seq`: called before taking a
/// change's lock or `moves`.
pub(super) fn check_not_under_next_seq(what: &str) {
    debug_assert!(
        !NextSeq::held(),
        "lock order: {what} taken while holding the log's next_seq"
    );
}

/// Why a change left by an earlier mount cannot be loaded.
#[derive(Debug, thiserror::Error)]
enum Unloadable {
    #[error("cannot read the record: {0}")]
    Record(#[source] std::io::Error),
    #[error("the record is damaged: {0}")]
    Damaged(#[source] crate::sealed::Unsealed),
    #[error("cannot open or stat its staging file {}: {source}", path.display())]
    Staging {
        source: std::io::Error,
        path: PathBuf,
    },
}

impl Unloadable {
    /// Whether the change itself is damaged (its record does not check out, or its
    /// staging file is gone), as opposed to unreadable for now.
    fn is_damage(&self) -> bool {
        match self {
            Unloadable::Damaged(_) => true,
            Unloadable::Staging { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Unloadable::Record(_) => false,
        }
    }
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

/// The log: pending changes by file id, persisted in a directory.
pub struct ChangeLog {
    dir: PathBuf,
    /// Changes that alter names on the origin (while any is pending, this client's view of
    /// names is its own: see `Superblock::names_pending`).
    names: Arc<std::sync::atomic::AtomicUsize>,
    pending: Mutex<BTreeMap<u64, Arc<Pending>>>,
    /// Held while a new change is staged, so one file is staged once. Taken after
    /// `moves` and before the table's lock, never while taking a change's lock.
    next_seq: Mutex<u64>,
    /// Counts the moves made on the origin (held while one is made and its changes
    /// follow it): a change recorded with where the origin has its object is recorded
    /// under it, and only if no move happened since that place was worked out
    /// ([`ChangeLog::at_origin`]). Taken with no `Pending` lock held by the recorder, and
    /// after its own by a sender: never the other way round.
    moves: Mutex<u64>,
    /// When changes are made durable.
    sync: LogSync,
}

impl ChangeLog {
    /// Opens (creating) the log in `dir` and loads the changes a previous mount left;
    /// new changes are made durable as `sync` says.
    pub fn open(dir: &Path, sync: LogSync) -> std::io::Result<ChangeLog> {
        hoardfs_cache::private::create_dir_all(dir)?;
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
                .map_err(Unloadable::Record)
                .and_then(|b| decode(&b).map_err(Unloadable::Damaged))
                .and_then(|rec| {
                    let staging = hoardfs_cache::private::file_options()
                        .read(true)
                        .write(true)
                        .open(&data_path)
                        .and_then(|f| f.metadata().map(|md| (f, md)));
                    let (staging, md) = staging.map_err(|source| Unloadable::Staging {
                        source,
                        path: data_path.clone(),
                    })?;
                    Ok((rec, staging, md))
                });
            match loaded {
                Ok((record, _, md)) => {
                    next = next.max(record.seq + 1);
                    let file_id = record.file_id;
                    let mtime = record
                        .has_content()
                        .then(|| md.modified().unwrap_or_else(|_| SystemTime::now()));
                    let p = Pending::new(
                        record,
                        path.clone(),
                        data_path,
                        md.len(),
                        mtime,
                        &names,
                        sync,
                    );
                    pending.insert(file_id, Arc::new(p));
                }
                // A record that cannot be read now (an I/O error, out of descriptors) may
                // be sound: the log does not open, rather than set a change aside.
                Err(why) if !why.is_damage() => {
                    return Err(std::io::Error::other(format!(
                        "offline change record {}: {why}",
                        path.display()
                    )));
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
            sync,
        })
    }

    /// Whether each change is made durable before it is acknowledged.
    fn durable(&self) -> bool {
        self.sync == LogSync::Each
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
        check_not_under_next_seq("moves");
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
            check_not_under_next_seq("moves");
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
        // (A `Meta` sent back meanwhile is finished, and leaves the table at once: a new
        // change starts.)
        for _ in 0..64 {
            let next = NextSeq::lock(&self.next_seq);
            let Some(p) = self.get(file_id) else {
                return self.stage_store(next, path, origin, base, object);
            };
            // An existing change: locked with no other lock of the log held (a sender
            // holds a change's lock while it takes `moves`, and a recorder holds `moves`
            // while it takes `next_seq`).
            drop(next);
            let mut g = p.lock();
            if g.record.kind != Kind::Meta {
                drop(g);
                return Ok(p);
            }
            if g.gone {
                continue;
            }
            // A file renamed or with attributes changed offline gets its content staged
            // too, under its change's lock (as every change's staging I/O is). A crash
            // before the record says `Store` leaves a `Meta` record with data nobody
            // reads: the content is the origin's again, as before this write.
            let size = self.copy_to_staging(p.seq, object)?;
            g.let_go_of_staging();
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
        Err(std::io::Error::other(
            "its change was sent back meanwhile: try again",
        ))
    }

    /// A new `Store` change of `base`, as [`ChangeLog::stage`] makes; but if the file has
    /// a change already, that change, untouched (for use under [`ChangeLog::at_origin`],
    /// where no change's lock may be taken: the caller stages onto a `Meta` one after).
    pub fn stage_if_new(
        &self,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
        object: &CachedObject,
    ) -> std::io::Result<Arc<Pending>> {
        let next = NextSeq::lock(&self.next_seq);
        if let Some(p) = self.get(base.file_id) {
            return Ok(p);
        }
        self.stage_store(next, path, origin, base, object)
    }

    /// A new `Store` change of `base` (see [`ChangeLog::stage`]), `next` held throughout so
    /// that the file is staged once.
    fn stage_store(
        &self,
        next: NextSeq<'_>,
        path: Vec<Vec<u8>>,
        origin: Option<Vec<Vec<u8>>>,
        base: &hoardfs_origin::Attr,
        object: &CachedObject,
    ) -> std::io::Result<Arc<Pending>> {
        let mut next = next;
        let seq = take_seq(&mut next);
        let size = self.copy_to_staging(seq, object)?;
        let mut record = Record::new(seq, path, base, Kind::Store);
        record.origin_path = origin.filter(|o| *o != record.path);
        let p = self.insert(record, size)?;
        drop(next);
        Ok(p)
    }

    /// Copies complete `object` into change `seq`'s staging file (through a temporary
    /// file, synced, then renamed into place); returns its size.
    fn copy_to_staging(&self, seq: u64, object: &CachedObject) -> std::io::Result<u64> {
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let tmp = data_path.with_extension("data.tmp");
        let staging = hoardfs_cache::private::file_options()
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
        if self.durable() {
            staging.sync_all()?;
        }
        std::fs::rename(&tmp, &data_path)?;
        Ok(size)
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
        let mut next = NextSeq::lock(&self.next_seq);
        let seq = take_seq(&mut next);
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
        if self.durable() {
            File::open(&self.dir)?.sync_all()?;
        }
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
        let mut next = NextSeq::lock(&self.next_seq);
        if let Some(p) = self.get(attr.file_id) {
            return Ok(p);
        }
        let seq = take_seq(&mut next);
        let data_path = self.dir.join(format!("{seq:016}.data"));
        let f = hoardfs_cache::private::file_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&data_path)?;
        if self.durable() {
            f.sync_all()?;
        }
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
        let bytes = encode(&record);
        if self.durable() {
            crate::sealed::write_atomically(&rec_path, &bytes)?;
        } else {
            crate::sealed::write_new(&rec_path, &bytes)?;
        }
        let mtime = record.has_content().then(SystemTime::now);
        let p = Arc::new(Pending::new(
            record,
            rec_path,
            data_path,
            size,
            mtime,
            &self.names,
            self.sync,
        ));
        self.pending.lock().insert(file_id, p.clone());
        Ok(p)
    }

    /// Forgets `file_id`'s pending change (sent back, or kept as a conflict copy): removes
    /// its record, then its staging file. Called with the pending's lock held (`g`).
    pub fn finish(&self, file_id: u64, g: &mut Inner) {
        g.gone = true;
        g.let_go_of_staging();
        if std::mem::take(&mut g.counted_names) {
            self.names.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Err(e) = std::fs::remove_file(&g.rec_path) {
            tracing::warn!("cannot remove {}: {e}", g.rec_path.display());
        }
        let _ = std::fs::remove_file(&g.data_path);
        if self.durable() {
            let _ = File::open(&self.dir).and_then(|d| d.sync_all());
        }
        self.pending.lock().remove(&file_id);
    }

    /// Records a conflict (appended to `conflicts`, fsynced) and logs it.
    pub fn record_conflict(&self, c: &Conflict) {
        tracing::warn!(
            "conflict: {} ({}); this client's version is at {}",
            c.path,
            c.reason,
            c.copy
        );
        let path = self.dir.join("conflicts");
        let line = conflict_line(c);
        let r = hoardfs_cache::private::file_options()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_record_is_set_aside_with_its_data_and_its_number_never_reused() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("0000000000000005.rec"), b"not a record").unwrap();
        std::fs::write(d.path().join("0000000000000005.data"), b"precious").unwrap();
        std::fs::write(d.path().join("0000000000000009.data.tmp"), b"half made").unwrap();
        let log = ChangeLog::open(d.path(), LogSync::Each).unwrap();
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
    fn a_record_that_cannot_be_read_now_stops_the_log_instead_of_being_set_aside() {
        let d = tempfile::tempdir().unwrap();
        // Not readable as a file (as an I/O error would leave it): not known to be damaged.
        std::fs::create_dir(d.path().join("0000000000000005.rec")).unwrap();
        std::fs::write(d.path().join("0000000000000005.data"), b"precious").unwrap();
        let err = ChangeLog::open(d.path(), LogSync::Each)
            .err()
            .expect("the log must not open");
        assert!(err.to_string().contains("0000000000000005.rec"), "{err}");
        assert!(d.path().join("0000000000000005.rec").is_dir());
        assert!(!d.path().join("0000000000000005.rec.damaged").exists());
        assert_eq!(
            std::fs::read(d.path().join("0000000000000005.data")).unwrap(),
            b"precious"
        );
    }

    #[test]
    #[cfg(debug_assertions)]
    fn taking_moves_while_holding_next_seq_breaks_the_lock_order_and_is_caught() {
        let d = tempfile::tempdir().unwrap();
        let log = ChangeLog::open(d.path(), LogSync::Each).unwrap();
        // In order: moves, then next_seq.
        let moves = log.moving();
        let next = NextSeq::lock(&log.next_seq);
        drop((next, moves));
        // Out of order: caught.
        let next = NextSeq::lock(&log.next_seq);
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            drop(log.moving());
        }));
        drop(next);
        let msg = caught.expect_err("moves under next_seq must panic");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("lock order"), "{msg}");
        assert!(!NextSeq::held());
    }
}
