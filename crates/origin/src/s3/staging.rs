//! Files being written through an S3 origin. S3 replaces whole objects, so a written file
//! is staged: a local copy (the object's bytes, fetched at the first write, or empty for a
//! new file) takes random writes and truncates, and is uploaded when the file is closed or
//! fsynced: one PUT up to `multipart_threshold`, parts in parallel above it. Either way
//! the store switches from the old object to the new one at once, so a crash during an
//! upload leaves the old object (or none), never a mix.
//!
//! The upload is conditional on the object being the one the copy started from (or on
//! there being none, for a new file): `If-Match` / `If-None-Match: *` for stores that
//! honour them, and a HEAD just before the PUT for those that do not (Garage), which
//! leaves a window of one request. When the object changed meanwhile, the upload is
//! refused (`EIO` at `close`) and the staged copy is kept under `STAGING/conflicts/`.
//!
//! Staged copies live in memory's index only: after a crash they are not uploaded (as
//! writes not yet closed would be lost on a local file system); the next start removes
//! them.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use hoardfs_proto::{Attr, FileKind, WireError};
use parking_lot::Mutex;

use super::S3Origin;
use super::client::{ObjectInfo, PutCondition, S3Error};
use super::location::split;
use super::nodes::{S3Node, version};
use crate::{OriginError, ReadReply, Result, WriteReply};

/// Most parts uploaded at once.
const PARALLEL_PARTS: usize = 4;
/// Piece size when copying an object into its staged file.
const FETCH_PIECE: u32 = 8 << 20;

struct Staged {
    file: File,
    disk: PathBuf,
    size: u64,
    version: u64,
    dirty: bool,
    /// The object the copy started from (`None`: a new file).
    base: Option<ObjectInfo>,
}

/// Creates `dir` (and missing parents) mode 0700, and checks that it is a directory of
/// this user's that group and others cannot use: a private place for writes not yet
/// uploaded (a directory someone else made or can change could show them the writes, or
/// make the cleanup of leftovers delete their choice of files).
pub(super) fn private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let md = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if !md.file_type().is_dir() || md.uid() != me || md.mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private directory of uid {me} (a link, another user's, or mode {:o}): \
             refusing to keep writes in it",
            dir.display(),
            md.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Options for a file of the origin's own state: mode 0600 when created, never opened
/// through a symbolic link.
pub(super) fn private_file() -> std::fs::OpenOptions {
    use std::os::unix::fs::OpenOptionsExt;
    let mut o = std::fs::OpenOptions::new();
    o.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    o
}

/// The staged files, by path. Lock order: the map's lock is a leaf; an entry's lock is
/// taken without holding the map's and may be held across store requests.
pub struct Staging {
    dir: PathBuf,
    files: Mutex<HashMap<String, Arc<Mutex<Staged>>>>,
    seq: AtomicU64,
    seed: u64,
}

impl Staging {
    /// Staging in `dir` (created, private to this user; leftovers of a previous run are
    /// removed). A `dir` that is a symbolic link, someone else's or open to others is
    /// refused: it holds the writes not yet uploaded, and its leftovers are deleted.
    pub fn new(dir: PathBuf) -> std::io::Result<Staging> {
        private_dir(&dir)?;
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                if e.file_type().is_ok_and(|t| t.is_file()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(Staging {
            dir,
            files: Mutex::new(HashMap::new()),
            seq: AtomicU64::new(1),
            seed: rand::random(),
        })
    }

    fn next_version(&self) -> u64 {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        xxhash_rust::xxh3::xxh3_64_with_seed(&n.to_le_bytes(), self.seed).max(1)
    }

    fn entry(&self, path: &str) -> Option<Arc<Mutex<Staged>>> {
        self.files.lock().get(path).cloned()
    }

    fn attr_of(&self, path: &str, s: &Staged, o: &S3Origin) -> Attr {
        let info = ObjectInfo {
            size: s.size,
            etag: "".into(),
            mtime: now(),
        };
        o.file_attr(path, &info, s.version)
    }

    /// Attributes of `path` if it is staged.
    pub fn attr(&self, path: &str, o: &S3Origin) -> Option<Attr> {
        let e = self.entry(path)?;
        let s = e.lock();
        Some(self.attr_of(path, &s, o))
    }

    /// Names of new (never uploaded) files staged in directory `dir`.
    pub fn new_files_in(&self, dir: &str) -> Vec<String> {
        let g = self.files.lock();
        let mut v: Vec<String> = g
            .iter()
            .filter(|(p, e)| split(p).0 == dir && e.lock().base.is_none())
            .map(|(p, _)| split(p).1.to_string())
            .collect();
        v.sort();
        v
    }

    /// Reads a staged file.
    pub fn read(&self, path: &str, offset: u64, len: u32) -> Option<Result<ReadReply>> {
        let e = self.entry(path)?;
        let s = e.lock();
        let n = s.size.saturating_sub(offset).min(u64::from(len)) as usize;
        let mut data = vec![0; n];
        Some(match s.file.read_exact_at(&mut data, offset) {
            Ok(()) => Ok(ReadReply {
                data,
                version: s.version,
            }),
            Err(e) => Err(OriginError::Fs(super::io_error(&e))),
        })
    }

    fn new_file(&self, path: &str) -> std::io::Result<(File, PathBuf)> {
        let name = format!(
            "{:016x}-{}",
            xxhash_rust::xxh3::xxh3_64(path.as_bytes()),
            self.seq.fetch_add(1, Ordering::Relaxed)
        );
        let disk = self.dir.join(name);
        let file = private_file()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&disk)?;
        Ok((file, disk))
    }

    /// Stages a new, empty file at `path` (uploaded at its first close).
    pub fn create(&self, path: &str) -> std::io::Result<()> {
        let (file, disk) = self.new_file(path)?;
        let s = Staged {
            file,
            disk,
            size: 0,
            version: self.next_version(),
            dirty: true,
            base: None,
        };
        self.files
            .lock()
            .insert(path.to_string(), Arc::new(Mutex::new(s)));
        Ok(())
    }

    /// The staged copy of `n`, made now if there is none: with the object's bytes, or
    /// empty when `keep` is false (a truncation to zero needs none of them).
    fn stage(&self, n: &S3Node, o: &S3Origin, keep: bool) -> Result<Arc<Mutex<Staged>>> {
        if let Some(e) = self.entry(&n.path) {
            return Ok(e);
        }
        let info = o.current(&S3Node {
            info: None,
            ..n.clone()
        })?;
        let (file, disk) = self
            .new_file(&n.path)
            .map_err(|e| OriginError::Fs(super::io_error(&e)))?;
        let key = o.opts.location.key(&n.path);
        let mut off = 0u64;
        let size = if keep { info.size } else { 0 };
        while off < size {
            let want = (info.size - off).min(u64::from(FETCH_PIECE)) as u32;
            let data = match o.client.get_range(&key, &info.etag, off, want) {
                Ok(d) => d,
                Err(e) => {
                    let _ = std::fs::remove_file(&disk);
                    return Err(o.err(e));
                }
            };
            if data.len() != want as usize {
                let _ = std::fs::remove_file(&disk);
                return Err(OriginError::Protocol("object shorter than its size".into()));
            }
            file.write_all_at(&data, off)
                .map_err(|e| OriginError::Fs(super::io_error(&e)))?;
            off += want as u64;
        }
        let s = Staged {
            file,
            disk,
            size,
            version: if keep {
                version(&info)
            } else {
                self.next_version()
            },
            dirty: !keep,
            base: Some(info),
        };
        let mut g = self.files.lock();
        // Another thread may have staged it meanwhile: keep theirs.
        if let Some(e) = g.get(&n.path) {
            let _ = std::fs::remove_file(&s.disk);
            return Ok(e.clone());
        }
        let e = Arc::new(Mutex::new(s));
        g.insert(n.path.clone(), e.clone());
        Ok(e)
    }

    /// Writes into the staged copy of `n`.
    pub fn write(
        &self,
        n: &S3Node,
        offset: u64,
        data: &[u8],
        append: bool,
        o: &S3Origin,
    ) -> Result<WriteReply> {
        let e = self.stage(n, o, true)?;
        let mut s = e.lock();
        let at = if append { s.size } else { offset };
        s.file
            .write_all_at(data, at)
            .map_err(|e| OriginError::Fs(super::io_error(&e)))?;
        let pre = s.version;
        s.size = s.size.max(at + data.len() as u64);
        s.version = self.next_version();
        s.dirty = true;
        Ok(WriteReply {
            written: data.len() as u32,
            offset: at,
            pre_version: pre,
            attr: self.attr_of(&n.path, &s, o),
        })
    }

    /// Truncates (or extends) the staged copy of `n`.
    pub fn truncate(&self, n: &S3Node, size: u64, o: &S3Origin) -> Result<()> {
        let e = self.stage(n, o, size > 0)?;
        let mut s = e.lock();
        s.file
            .set_len(size)
            .map_err(|e| OriginError::Fs(super::io_error(&e)))?;
        s.size = size;
        s.version = self.next_version();
        s.dirty = true;
        Ok(())
    }

    /// Forgets the staged copy of `path`; true if it was a file never uploaded.
    pub fn discard(&self, path: &str) -> bool {
        let Some(e) = self.files.lock().remove(path) else {
            return false;
        };
        let s = e.lock();
        let _ = std::fs::remove_file(&s.disk);
        s.base.is_none()
    }

    /// Uploads `path` if it has changes not in the store yet. Returns the version before
    /// the upload and the attributes after it (`None`: nothing to upload).
    pub fn upload(&self, path: &str, o: &S3Origin) -> Result<Option<(u64, Attr)>> {
        let Some(e) = self.entry(path) else {
            return Ok(None);
        };
        let mut s = e.lock();
        if !s.dirty {
            drop(s);
            self.forget_clean(path, &e);
            return Ok(None);
        }
        let key = o.opts.location.key(path);
        // Check-and-race for stores that ignore conditional PUTs (Garage).
        let now_there = match o.client.head(&key) {
            Ok(i) => Some(i),
            Err(S3Error::NotFound) => None,
            Err(err) => return Err(o.err(err)),
        };
        tracing::debug!(path, base = ?s.base, now = ?now_there, size = s.size, "uploading");
        let cond = match (&s.base, &now_there) {
            (None, None) | (Some(_), None) => PutCondition::Absent,
            (Some(b), Some(n)) if b.etag == n.etag => PutCondition::Matches(&n.etag),
            _ => {
                drop(s);
                return Err(self.conflict(path, &e));
            }
        };
        let result = if s.size <= o.opts.multipart_threshold {
            let mut data = vec![0; s.size as usize];
            s.file
                .read_exact_at(&mut data, 0)
                .map_err(|e| OriginError::Fs(super::io_error(&e)))?;
            o.client.put(&key, &data, cond)
        } else {
            multipart(o, &key, &s)
        };
        let etag = match result {
            Ok(t) => t,
            Err(S3Error::Changed) => {
                drop(s);
                return Err(self.conflict(path, &e));
            }
            Err(err) => return Err(o.err(err)),
        };
        let info = ObjectInfo {
            size: s.size,
            etag: etag.into(),
            mtime: now(),
        };
        let pre = s.version;
        let attr = o.file_attr(path, &info, version(&info));
        s.dirty = false;
        s.version = attr.version;
        s.base = Some(info.clone());
        o.table.put(S3Node {
            path: path.to_string(),
            kind: FileKind::File,
            info: Some(info),
        });
        drop(s);
        self.forget_clean(path, &e);
        o.changed(path);
        o.report(path, Some(FileKind::File));
        Ok(Some((pre, attr)))
    }

    /// Drops `e` (uploaded, unchanged since) from the index and its file from disk.
    fn forget_clean(&self, path: &str, e: &Arc<Mutex<Staged>>) {
        let mut g = self.files.lock();
        if g.get(path).is_some_and(|x| Arc::ptr_eq(x, e)) {
            let s = e.lock();
            if !s.dirty {
                g.remove(path);
                let _ = std::fs::remove_file(&s.disk);
            }
        }
    }

    /// The object changed in the store while `path` was being written here: the staged
    /// copy is moved aside, and the close fails.
    fn conflict(&self, path: &str, e: &Arc<Mutex<Staged>>) -> OriginError {
        let mut g = self.files.lock();
        if g.get(path).is_some_and(|x| Arc::ptr_eq(x, e)) {
            g.remove(path);
        }
        drop(g);
        let s = e.lock();
        let dir = self.dir.join("conflicts");
        let _ = private_dir(&dir);
        let kept = dir.join(format!("{}.{}", path.replace('/', "%2F"), now()));
        match std::fs::rename(&s.disk, &kept) {
            Ok(()) => tracing::error!(
                "{path}: changed in the store while written here; not uploaded, \
                 this client's version is kept in {}",
                kept.display()
            ),
            Err(err) => tracing::error!(
                "{path}: changed in the store while written here; not uploaded ({err})"
            ),
        }
        OriginError::Fs(WireError::Io)
    }
}

/// Uploads the staged copy in parts, `PARALLEL_PARTS` at a time; aborts on failure.
fn multipart(o: &S3Origin, key: &str, s: &Staged) -> std::result::Result<String, S3Error> {
    // S3 allows 10,000 parts: larger files get larger parts.
    let part = o.opts.part_size.max(s.size.div_ceil(10_000)).max(5 << 20);
    let parts = s.size.div_ceil(part) as usize;
    let upload = o.client.create_multipart(key)?;
    let etags: Mutex<Vec<Option<String>>> = Mutex::new(vec![None; parts]);
    let next = AtomicU64::new(0);
    let failed: Mutex<Option<S3Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..PARALLEL_PARTS.min(parts) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    if i >= parts || failed.lock().is_some() {
                        return;
                    }
                    let start = i as u64 * part;
                    let len = part.min(s.size - start) as usize;
                    let mut buf = vec![0; len];
                    if let Err(e) = s.file.read_exact_at(&mut buf, start) {
                        *failed.lock() = Some(S3Error::Protocol(format!("staged copy: {e}")));
                        return;
                    }
                    match o.client.upload_part(key, &upload, (i + 1) as u16, &buf) {
                        Ok(t) => etags.lock()[i] = Some(t),
                        Err(e) => {
                            *failed.lock() = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner() {
        let _ = o.client.abort_multipart(key, &upload);
        return Err(e);
    }
    let etags: Vec<String> = etags.into_inner().into_iter().flatten().collect();
    match o.client.complete_multipart(key, &upload, &etags) {
        Ok(t) => Ok(t),
        Err(e) => {
            let _ = o.client.abort_multipart(key, &upload);
            Err(e)
        }
    }
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn origin_without_state() -> S3Origin {
        let state_dir: Option<PathBuf> = None;
        let location = super::super::location::S3Location::parse("s3://bucket/prefix")
            .expect("an s3 location")
            .unwrap();
        let mut opts =
            super::super::S3Options::new(location, "http://127.0.0.1:9".into(), "garage".into());
        opts.state_dir = state_dir;
        opts.path_style = true;
        S3Origin::new(opts).expect("made without contacting the store")
    }

    #[test]
    fn a_mount_without_state_stages_in_a_fresh_private_directory_not_a_predictable_one() {
        // What a local user could have prepared where earlier versions staged:
        // $TMPDIR/hoardfs-s3-PID/staging, a link to a directory of someone else's files.
        let victim = tempfile::tempdir().unwrap();
        std::fs::write(victim.path().join("precious"), b"keep me").unwrap();
        let planted = std::env::temp_dir().join(format!("hoardfs-s3-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&planted);
        std::fs::create_dir_all(&planted).unwrap();
        std::os::unix::fs::symlink(victim.path(), planted.join("staging")).unwrap();
        let o = origin_without_state();
        assert_eq!(
            std::fs::read(victim.path().join("precious")).unwrap(),
            b"keep me"
        );
        let dir = o.staging.dir.clone();
        assert!(!dir.starts_with(&planted), "{}", dir.display());
        let md = std::fs::symlink_metadata(dir.parent().unwrap()).unwrap();
        assert!(md.is_dir());
        assert_eq!(md.mode() & 0o777, 0o700);
        // Files staged there are the mounting user's alone.
        let (_, disk) = o.staging.new_file("a/b").unwrap();
        assert_eq!(std::fs::metadata(&disk).unwrap().mode() & 0o777, 0o600);
        drop(o);
        assert!(
            !dir.exists(),
            "the private directory is removed with the origin"
        );
        std::fs::remove_dir_all(&planted).unwrap();
    }

    #[test]
    fn a_staging_directory_that_is_a_link_or_open_to_others_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("f"), b"x").unwrap();
        std::os::unix::fs::symlink(&elsewhere, t.path().join("link")).unwrap();
        assert!(Staging::new(t.path().join("link")).is_err());
        assert!(
            elsewhere.join("f").exists(),
            "nothing deleted through the link"
        );
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(Staging::new(open).is_err());
        Staging::new(t.path().join("fine")).unwrap();
    }
}
