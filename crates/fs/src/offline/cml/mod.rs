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
//! kinds leave it empty. Reintegration (`crate::offline::reintegrate`, each change by `crate::offline::reintegrate::send_back`) sends the change back and
//! removes both.
//!
//! On disk, in `CACHE_DIR/cml/`: `SEQ.data` (the staging file) and `SEQ.rec` (the
//! record: magic, postcard body, xxh3 checksum), both made durable (fsync, rename, fsync
//! of the directory) before the first change is acknowledged; the staging file's later
//! changes are made durable by `fsync` and at close, as a local file system's are. The
//! record is rewritten (atomically) whenever the change's path, kind, attributes or phase
//! change. With [`LogSync::OnSync`] (`--write-back=async`, whose changes leave within a
//! second) nothing is fsynced but by `fsync`: a new record is written in one write, a
//! changed one over the old in one write of at most a page padded with zeros (no inode,
//! no rename per change), so that a killed client leaves the old record or the new.
//! Before an upload starts the record says `Uploading`, so that a client killed in the
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
//! The order: a change's lock → `moves` (a sender making a move, [`ChangeLog::moving`])
//! → the locks of the changes inside the moved directory (`moved_under`, skipping the
//! changes of the pass); and `moves` (a change recorded under [`ChangeLog::at_origin`], by
//! a thread holding no change's lock) → `next_seq` → the table. So only a sender takes a
//! change's lock while holding `moves`, and only of changes no other sender holds;
//! nothing takes a change's lock or `moves` while holding `next_seq`: under `at_origin`
//! a file is staged with [`ChangeLog::stage_if_new`], and [`ChangeLog::stage`] locks an
//! existing change only after letting `next_seq` go. Debug builds check that last rule
//! (`Pending::lock` and `ChangeLog::moving` panic on a thread holding `next_seq`).
//!
//! This module owns one change ([`Pending`], its locked state [`Inner`]); `log` owns the
//! table of them ([`ChangeLog`]) and `conflicts` the conflict records.

mod conflicts;
mod log;
pub(crate) mod record;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Mutex, MutexGuard};

use crate::offline::cml::record::encode;
pub(crate) use crate::offline::cml::record::now_secs;
pub use crate::offline::cml::record::{AttrChange, Kind, Phase, Record, is_under};
pub use conflicts::Conflict;
pub use log::{ChangeLog, LogStats};

/// When the log's changes are made durable on this disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSync {
    /// Before each change is acknowledged (its record and staging file fsynced, and the
    /// directory): `--offline-writes`, whose changes may wait days for the server.
    Each,
    /// At `fsync` of the changed file only (`--write-back=async`, whose changes leave
    /// within a second): written before each change is acknowledged, so a killed client
    /// loses nothing; a crash of the machine may lose the last seconds' changes not
    /// fsynced, as a local file system's writes.
    OnSync,
}

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
    /// When the record and staging file are made durable.
    sync: LogSync,
    /// The staging file, kept open from its first write until the change is done (if
    /// fewer than [`KEPT_OPEN`] are).
    kept: std::cell::OnceCell<KeptFile>,
}

/// Most staging files kept open between operations, in the process: a file being written
/// is not opened again for each `write()`, and thousands of pending changes do not hold a
/// descriptor each.
const KEPT_OPEN: usize = 64;

/// Staging files kept open now.
static KEPT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A staging file kept open (counted in [`KEPT`] while it lives).
struct KeptFile(File);

impl Drop for KeptFile {
    fn drop(&mut self) {
        KEPT.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A change's staging file for one operation: the one kept open, or opened for it.
enum Staging<'a> {
    Kept(&'a File),
    Opened(File),
}

impl std::ops::Deref for Staging<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            Staging::Kept(f) => f,
            Staging::Opened(f) => f,
        }
    }
}

impl Pending {
    /// The change `record` (its record at `rec_path`, its staging file of `size` bytes at
    /// `data_path`, content last changed at `mtime`), counted in `names` if it changes
    /// names, made durable as `sync` says.
    fn new(
        record: Record,
        rec_path: PathBuf,
        data_path: PathBuf,
        size: u64,
        mtime: Option<SystemTime>,
        names: &Arc<std::sync::atomic::AtomicUsize>,
        sync: LogSync,
    ) -> Pending {
        let counted_names = record.changes_names();
        if counted_names {
            names.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Pending {
            seq: record.seq,
            file_id: record.file_id,
            since: record.since,
            size: size.into(),
            inner: Mutex::new(Inner {
                record,
                rec_path,
                data_path,
                size,
                mtime,
                gone: false,
                counted_names,
                names: names.clone(),
                sync,
                kept: std::cell::OnceCell::new(),
            }),
        }
    }

    /// When the object was first changed (seconds since the epoch).
    pub fn since(&self) -> u64 {
        self.since
    }

    /// Locks the change (its staging file's I/O, or an upload, happens under it).
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        log::check_not_under_next_seq("a change's lock");
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

    /// Writes the record (durably unless the log syncs on demand), and keeps the log's
    /// count of changes to names.
    fn persist(&mut self) -> std::io::Result<()> {
        let bytes = encode(&self.record);
        match self.sync {
            LogSync::Each => crate::sealed::write_atomically(&self.rec_path, &bytes)?,
            // No new inode for every change (a build changes the times and modes of
            // thousands of files).
            LogSync::OnSync => crate::sealed::rewrite_in_place(&self.rec_path, &bytes)?,
        }
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

    /// The staging file: the one kept open, or opened for this operation (thousands of
    /// changes may be pending: few hold a descriptor between operations, see
    /// [`KEPT_OPEN`]).
    fn staging(&self) -> std::io::Result<Staging<'_>> {
        if let Some(k) = self.kept.get() {
            return Ok(Staging::Kept(&k.0));
        }
        let f = hoardfs_cache::private::file_options()
            .read(true)
            .write(true)
            .open(&self.data_path)?;
        Ok(Staging::Opened(f))
    }

    /// The staging file, kept open for the next operations if few are.
    fn staging_kept(&self) -> std::io::Result<Staging<'_>> {
        let f = match self.staging()? {
            Staging::Opened(f) => f,
            kept => return Ok(kept),
        };
        use std::sync::atomic::Ordering::Relaxed;
        if KEPT.fetch_add(1, Relaxed) >= KEPT_OPEN {
            KEPT.fetch_sub(1, Relaxed);
            return Ok(Staging::Opened(f));
        }
        let _ = self.kept.set(KeptFile(f));
        Ok(Staging::Kept(&self.kept.get().expect("just set").0))
    }

    /// Lets go of the staging file kept open (the change is done, or its staging file
    /// replaced).
    pub(crate) fn let_go_of_staging(&mut self) {
        self.kept.take();
    }

    /// Writes `data` at `offset` of the staged content.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> std::io::Result<()> {
        self.staging_kept()?.write_all_at(data, offset)?;
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

    /// Makes the staged content durable (and the record, if it was not at each change).
    pub fn sync(&self) -> std::io::Result<()> {
        self.staging()?.sync_data()?;
        if self.sync == LogSync::OnSync {
            File::open(&self.rec_path)?.sync_all()?;
            if let Some(dir) = self.rec_path.parent() {
                File::open(dir)?.sync_all()?;
            }
        }
        Ok(())
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
    /// directory): the change becomes its removal, where the origin has it, of the base
    /// version of a `Store` (the staged content's) or of `seen` for a `Meta` (the version
    /// this client last saw), and the staged bytes go.
    pub fn become_removal(&mut self, dir: bool, seen: u64) -> std::io::Result<()> {
        // The record first: a crash between the two leaves a removal with the staged
        // content still beside it (unused), never a `Store` of an emptied file.
        let (was, base) = (self.record.kind, self.record.base_version);
        self.record.kind = if dir { Kind::Rmdir } else { Kind::Remove };
        // A move or attributes only: the content is the origin's, and this client may
        // have written it there since the change began (a write is not held back by a
        // pending rename): the removal is of the version it saw last.
        if was == Kind::Meta {
            self.record.base_version = seen;
        }
        if let Err(e) = self.persist() {
            self.record.kind = was;
            self.record.base_version = base;
            return Err(e);
        }
        // The removal is recorded: the staged bytes are unused from here on, and failing
        // to free them is no reason to fail it.
        if let Err(e) = self.staging().and_then(|f| f.set_len(0)) {
            tracing::warn!("cannot empty {}: {e}", self.data_path.display());
        }
        self.size = 0;
        Ok(())
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
        if self.sync == LogSync::Each {
            self.staging()?.sync_data()?;
        }
        self.record.phase = phase;
        self.persist()
    }
}
