//! An S3 bucket (or a prefix of one) as an [`Origin`]: `hoardfs mount s3://BUCKET/PREFIX`.
//!
//! Module map: `client` (the S3 requests, signed by `rusty-s3`, carried by `ureq`),
//! `credentials` (the AWS chain: environment and profile files), `location` (paths ↔
//! keys), `nodes` (handles ↔ paths; identities and versions), `listings` (directory
//! snapshots in memory and on disk), `staging` (files being written, uploaded on close).
//!
//! S3 has no callbacks, so this origin does not subscribe: the file-system layer
//! revalidates by time (`--metadata-ttl`). A file's version is a hash of its ETag and
//! size; every read is a ranged GET with `If-Match` on the ETag the caller was told
//! about, so bytes of two objects are never mixed under one version. Listings and the
//! last attributes seen are kept on disk, so a remount serves cached files and listed
//! directories while the store is unreachable.
//!
//! Lock order: `staging` entries' locks may be taken while holding nothing else, and
//! are held across the store requests of their own upload (so two flushes of one file
//! do not race); the node table's and listings' locks are leaves, never held across a
//! request.

pub mod client;
pub mod credentials;
pub mod listings;
pub mod location;
pub mod nodes;
mod staging;
pub mod watch;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hoardfs_proto::{
    Attr, DirEntry, Entry, FileKind, Handle, Owner, RENAME_EXCHANGE, RENAME_NOREPLACE, SetAttrs,
    StatFs, Timestamp, WireError,
};
use parking_lot::Mutex;

use self::client::{ClientConfig, ObjectInfo, S3Client, S3Error};
use self::listings::{Listed, Listings};
use self::location::{S3Location, join, split, valid_name};
use self::nodes::{NodeTable, S3Node, file_id, version};
use self::staging::Staging;
use crate::{DirPage, Origin, OriginError, OriginInfo, ReadReply, Result, WriteReply};

pub use self::credentials::CredentialSource;

/// How an S3 origin is set up.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Bucket and prefix.
    pub location: S3Location,
    /// Endpoint URL.
    pub endpoint: String,
    /// Region for signatures.
    pub region: String,
    /// Path-style URLs.
    pub path_style: bool,
    /// Credentials (`None`: unsigned).
    pub credentials: Option<rusty_s3::Credentials>,
    /// How long a request may wait.
    pub timeout: Duration,
    /// How long listings and negative lookups are trusted.
    pub metadata_ttl: Duration,
    /// The bucket never changes: listings are trusted forever.
    pub immutable: bool,
    /// Refuse modifications.
    pub read_only: bool,
    /// Where listings and files being written are kept (`None`: memory and a temp dir).
    pub state_dir: Option<PathBuf>,
    /// Owner shown for every file.
    pub uid: u32,
    /// Group shown for every file.
    pub gid: u32,
    /// Permission bits of files.
    pub file_mode: u16,
    /// Permission bits of directories.
    pub dir_mode: u16,
    /// Objects up to this size are uploaded in one PUT; larger ones in parts.
    pub multipart_threshold: u64,
    /// Size of each uploaded part.
    pub part_size: u64,
    /// Report changes to subscribers by listing the directories in use every
    /// `metadata_ttl` (for a server exporting the bucket; module `watch`).
    pub watch: bool,
}

impl S3Options {
    /// Defaults for `location` at `endpoint` (no credentials, 1 s TTL, read-write).
    pub fn new(location: S3Location, endpoint: String, region: String) -> S3Options {
        S3Options {
            location,
            endpoint,
            region,
            path_style: false,
            credentials: None,
            timeout: Duration::from_secs(15),
            metadata_ttl: Duration::from_secs(1),
            immutable: false,
            read_only: false,
            state_dir: None,
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            file_mode: 0o644,
            dir_mode: 0o755,
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            watch: false,
        }
    }
}

/// The S3 origin.
pub struct S3Origin {
    opts: S3Options,
    client: Arc<S3Client>,
    table: Arc<NodeTable>,
    listings: Arc<Listings>,
    watched: Arc<watch::Watched>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Where changes made through this origin are reported (with `watch`).
    sink: Mutex<Option<crate::BreakSink>>,
    staging: Staging,
    /// Recent "no such name" answers: path → when.
    negative: Mutex<std::collections::HashMap<String, Instant>>,
    export_id: u128,
    started: Timestamp,
    connected: std::sync::atomic::AtomicBool,
}

const NEGATIVE_MAX: usize = 10_000;
/// Directories of at most this many entries are listed again to answer a lookup once
/// their listing expired (larger ones get a HEAD and a one-key listing per name).
const RELIST_MAX: usize = 10_000;

impl S3Origin {
    /// An origin for `opts`. Does not contact the store (see [`Origin::info`]).
    pub fn new(opts: S3Options) -> std::result::Result<S3Origin, String> {
        let client = S3Client::new(ClientConfig {
            endpoint: opts.endpoint.clone(),
            region: opts.region.clone(),
            path_style: opts.path_style,
            bucket: opts.location.bucket.clone(),
            credentials: opts.credentials.clone(),
            timeout: opts.timeout,
            max_connections: 16,
        })?;
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(b"hoardfs-s3\0");
        h.update(client.base_url().as_bytes());
        h.update(b"\0");
        h.update(opts.location.prefix.as_bytes());
        let export_id = h.digest128();
        let opts = S3Options {
            state_dir: opts.state_dir.map(|d| d.join(format!("{export_id:032x}"))),
            ..opts
        };
        let state = match &opts.state_dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!("hoardfs-s3-{}", std::process::id())),
        };
        let listings = Listings::new(
            opts.state_dir.as_ref().map(|d| d.join("listings")),
            opts.metadata_ttl,
            opts.immutable,
        );
        let staging = Staging::new(state.join("staging"))
            .map_err(|e| format!("cannot create {}: {e}", state.join("staging").display()))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Ok(S3Origin {
            client: Arc::new(client),
            table: Arc::new(NodeTable::new(rand::random::<u64>() | 1, 1 << 20)),
            listings: Arc::new(listings),
            watched: Arc::default(),
            stop: Arc::default(),
            sink: Mutex::new(None),
            staging,
            negative: Mutex::new(Default::default()),
            export_id,
            started: Timestamp {
                secs: now.as_secs() as i64,
                nanos: 0,
            },
            connected: std::sync::atomic::AtomicBool::new(true),
            opts,
        })
    }

    /// Turns change reports on or off (before [`Origin::subscribe`]; see `watch`).
    pub fn watch(&mut self, on: bool) {
        self.opts.watch = on;
    }

    /// The bucket URL this origin talks to (for messages).
    pub fn describe(&self) -> String {
        format!("{} at {}", self.opts.location, self.client.base_url())
    }

    fn err(&self, e: S3Error) -> OriginError {
        let offline = matches!(e, S3Error::Unreachable(_) | S3Error::Timeout(_));
        self.connected
            .store(!offline, std::sync::atomic::Ordering::Relaxed);
        match e {
            S3Error::NotFound => OriginError::Fs(WireError::NotFound),
            S3Error::Denied(m) => {
                tracing::warn!("S3: {m}");
                OriginError::Fs(WireError::Access)
            }
            S3Error::Changed => OriginError::Fs(WireError::Stale),
            S3Error::Unreachable(m) => OriginError::Unreachable(m),
            S3Error::Timeout(d) => OriginError::Timeout(d),
            S3Error::Protocol(m) => OriginError::Protocol(m),
            S3Error::Status { status, message } => {
                tracing::warn!("S3 answered {status}: {message}");
                OriginError::Fs(match status {
                    507 => WireError::NoSpace,
                    400 | 501 => WireError::Unsupported,
                    _ => WireError::Io,
                })
            }
        }
    }

    fn ok<T>(&self, r: std::result::Result<T, S3Error>) -> Result<T> {
        match r {
            Ok(v) => {
                self.connected
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(v)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    fn dir_node(&self, h: Handle) -> Result<Arc<S3Node>> {
        let n = self.table.get(h)?;
        if n.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        Ok(n)
    }

    fn dir_attr(&self, path: &str) -> Attr {
        Attr {
            file_id: if path.is_empty() {
                1
            } else {
                file_id(path, FileKind::Dir)
            },
            version: 1,
            kind: FileKind::Dir,
            perm: self.opts.dir_mode,
            nlink: 2,
            uid: self.opts.uid,
            gid: self.opts.gid,
            size: 0,
            blocks: 0,
            rdev: 0,
            blksize: 4096,
            atime: self.started,
            mtime: self.started,
            ctime: self.started,
        }
    }

    fn file_attr(&self, path: &str, info: &ObjectInfo, version: u64) -> Attr {
        let t = Timestamp {
            secs: info.mtime,
            nanos: 0,
        };
        Attr {
            file_id: file_id(path, FileKind::File),
            version,
            kind: FileKind::File,
            perm: self.opts.file_mode,
            nlink: 1,
            uid: self.opts.uid,
            gid: self.opts.gid,
            size: info.size,
            blocks: info.size.div_ceil(512),
            rdev: 0,
            blksize: 1 << 17,
            atime: t,
            mtime: t,
            ctime: t,
        }
    }

    /// The entry for a file at `path` as the store last described it (or as staged here).
    fn file_entry(&self, path: &str, info: ObjectInfo) -> Entry {
        let staged = self.staging.attr(path, self);
        let attr = staged.unwrap_or_else(|| self.file_attr(path, &info, version(&info)));
        let handle = self.learn(path, info);
        Entry { handle, attr }
    }

    /// Records what the store says the object at `path` is now. If that differs from what
    /// clients were told before, subscribers hear of it: whichever request notices a
    /// change (a lookup, a getattr, a listing) reports it, so none goes unreported.
    fn learn(&self, path: &str, info: ObjectInfo) -> Handle {
        let before = self.table.known(path, FileKind::File);
        let sink = self.sink.lock().clone();
        if let Some(prev) = before.as_ref().and_then(|n| n.info.as_ref())
            && *prev != info
            && let Some(sink) = sink
        {
            sink(vec![hoardfs_proto::Break::Attr {
                file_id: file_id(path, FileKind::File),
                version: 0,
            }]);
        }
        self.table.put(S3Node {
            path: path.to_string(),
            kind: FileKind::File,
            info: Some(info),
        })
    }

    fn dir_entry(&self, path: &str) -> Entry {
        let handle = self.table.put(S3Node {
            path: path.to_string(),
            kind: FileKind::Dir,
            info: None,
        });
        Entry {
            handle,
            attr: self.dir_attr(path),
        }
    }

    fn listed_entry(&self, path: &str, l: &Listed) -> Entry {
        match l {
            Listed::Dir => self.dir_entry(path),
            Listed::File(info) => self.file_entry(path, info.clone()),
        }
    }

    /// The listing of the directory at `path`: fresh, or from the store, or (store
    /// unreachable) the last one kept.
    fn listing(&self, path: &str) -> Result<Arc<listings::Snapshot>> {
        if self.opts.watch {
            self.watched.touch(path);
        }
        let prefix = self.opts.location.dir_prefix(path);
        if let Some(s) = self.listings.fresh(&prefix) {
            return Ok(s);
        }
        let sink = self.sink.lock().clone();
        let r = watch::relist(
            &self.client,
            &self.opts.location,
            &self.listings,
            &self.table,
            sink.as_ref(),
            path,
        );
        match r {
            Ok(s) => {
                self.ok(Ok(()))?;
                Ok(s)
            }
            Err(e) => {
                let e = self.err(e);
                if e.is_offline()
                    && let Some(s) = self.listings.any(&prefix)
                {
                    return Ok(s);
                }
                Err(e)
            }
        }
    }

    fn negative_fresh(&self, path: &str) -> bool {
        if self.opts.metadata_ttl.is_zero() && !self.opts.immutable {
            return false;
        }
        let g = self.negative.lock();
        g.get(path)
            .is_some_and(|t| self.opts.immutable || t.elapsed() < self.opts.metadata_ttl)
    }

    fn remember_missing(&self, path: &str) {
        let mut g = self.negative.lock();
        if g.len() >= NEGATIVE_MAX {
            g.clear();
        }
        g.insert(path.to_string(), Instant::now());
    }

    /// A change made here: forget cached answers about `path` and its directory.
    fn changed(&self, path: &str) {
        self.negative.lock().remove(path);
        let (parent, _) = split(path);
        self.listings.expire(&self.opts.location.dir_prefix(parent));
    }

    /// Tells subscribers (the clients of a server exporting this origin) that `path` now
    /// names an object of kind `now` (`None`: nothing).
    fn report(&self, path: &str, now: Option<FileKind>) {
        let Some(sink) = self.sink.lock().clone() else {
            return;
        };
        let (parent, name) = split(path);
        let dir_id = if parent.is_empty() {
            1
        } else {
            file_id(parent, FileKind::Dir)
        };
        let mut breaks = vec![hoardfs_proto::Break::Entry {
            dir_id,
            name: name.as_bytes().to_vec(),
            file_id: now.map(|k| file_id(path, k)),
        }];
        if let Some(k) = now {
            breaks.push(hoardfs_proto::Break::Attr {
                file_id: file_id(path, k),
                version: 0,
            });
        }
        sink(breaks);
    }

    /// What is at `path` now: from a fresh listing of its directory if there is one,
    /// else from the store (HEAD of the key, then a one-key listing of the prefix).
    fn resolve(&self, path: &str) -> Result<Entry> {
        if let Some(attr) = self.staging.attr(path, self) {
            let handle = self.table.put(S3Node {
                path: path.into(),
                kind: FileKind::File,
                info: None,
            });
            return Ok(Entry { handle, attr });
        }
        let (parent, name) = split(path);
        if self.opts.watch {
            self.watched.touch(parent);
        }
        let prefix = self.opts.location.dir_prefix(parent);
        let listed = match self.listings.fresh(&prefix) {
            Some(s) => Some(s),
            // A directory listed before (and not huge) is listed again: one request
            // answers this name and, for the next TTL, its neighbours (`find`, `ls -l`,
            // a build reading a source tree), where a probe would cost two per name.
            None if self
                .listings
                .any(&prefix)
                .is_some_and(|s| s.entries.len() <= RELIST_MAX) =>
            {
                Some(self.listing(parent)?)
            }
            None => None,
        };
        if let Some(s) = listed {
            return match s.get(name) {
                Some(l) => Ok(self.listed_entry(path, l)),
                None => Err(WireError::NotFound.into()),
            };
        }
        if self.negative_fresh(path) {
            return Err(WireError::NotFound.into());
        }
        let r = self
            .client
            .any_under(&self.opts.location.dir_prefix(path))
            .and_then(|dir| {
                if dir {
                    return Ok(None);
                }
                self.client.head(&self.opts.location.key(path)).map(Some)
            });
        match r {
            Ok(None) => {
                self.ok(Ok(()))?;
                self.listings.remember(path, &Listed::Dir);
                Ok(self.dir_entry(path))
            }
            Ok(Some(info)) => {
                self.ok(Ok(()))?;
                self.listings.remember(path, &Listed::File(info.clone()));
                Ok(self.file_entry(path, info))
            }
            Err(S3Error::NotFound) => {
                self.ok(Ok(()))?;
                self.remember_missing(path);
                Err(WireError::NotFound.into())
            }
            Err(e) => {
                let e = self.err(e);
                if e.is_offline() {
                    // Unreachable: answer from the last listing of the directory, or
                    // from what an earlier lookup of this very name found.
                    if let Some(s) = self.listings.any(&self.opts.location.dir_prefix(parent)) {
                        return match s.get(name) {
                            Some(l) => Ok(self.listed_entry(path, l)),
                            None => Err(WireError::NotFound.into()),
                        };
                    }
                    if let Some(l) = self.listings.recall(path) {
                        return Ok(self.listed_entry(path, &l));
                    }
                }
                Err(e)
            }
        }
    }

    /// The node's object as the store has it now (HEAD), or the last seen while the
    /// store is unreachable.
    fn current(&self, n: &S3Node) -> Result<ObjectInfo> {
        match self.client.head(&self.opts.location.key(&n.path)) {
            Ok(info) => {
                self.ok(Ok(()))?;
                self.learn(&n.path, info.clone());
                Ok(info)
            }
            Err(S3Error::NotFound) => {
                self.ok(Ok(()))?;
                Err(WireError::Stale.into())
            }
            Err(e) => {
                let e = self.err(e);
                match (&n.info, e.is_offline()) {
                    (Some(i), true) => Ok(i.clone()),
                    _ => Err(e),
                }
            }
        }
    }

    fn writable(&self) -> Result<()> {
        if self.opts.read_only {
            Err(WireError::ReadOnly.into())
        } else {
            Ok(())
        }
    }

    fn child_path(&self, parent: Handle, name: &[u8]) -> Result<String> {
        let p = self.dir_node(parent)?;
        let name = std::str::from_utf8(name).map_err(|_| WireError::Invalid)?;
        if !valid_name(name) {
            return Err(WireError::Invalid.into());
        }
        if name.len() > 255 {
            return Err(WireError::NameTooLong.into());
        }
        Ok(join(&p.path, name))
    }
}

impl Origin for S3Origin {
    fn info(&self) -> Result<OriginInfo> {
        // One cheap request proves the bucket and the credentials; an unreachable store
        // is not an error here (listings kept on disk can still be served).
        match self.client.list_page(&self.opts.location.prefix, None, 1) {
            Ok(_) => self.ok(Ok(()))?,
            Err(S3Error::NotFound) => {
                return Err(OriginError::Protocol(format!(
                    "bucket {:?} does not exist at {}",
                    self.opts.location.bucket, self.opts.endpoint
                )));
            }
            Err(S3Error::Denied(m)) => {
                return Err(OriginError::Security(format!(
                    "the store refuses to list {}: {m} (check the credentials)",
                    self.opts.location
                )));
            }
            Err(e) => {
                let e = self.err(e);
                if !e.is_offline() {
                    return Err(e);
                }
                tracing::warn!("{}: {e}; serving what is cached", self.describe());
            }
        }
        Ok(OriginInfo {
            export_id: self.export_id,
            root: Entry {
                handle: self.table.root(),
                attr: self.dir_attr(""),
            },
            read_only: self.opts.read_only,
            verifier: 0,
        })
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        let path = self.child_path(parent, name)?;
        self.resolve(&path)
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        let n = self.table.get(handle)?;
        if n.kind == FileKind::Dir {
            return Ok(self.dir_attr(&n.path));
        }
        if let Some(a) = self.staging.attr(&n.path, self) {
            return Ok(a);
        }
        // A fresh listing of the directory says as much as a HEAD would.
        let (parent, name) = split(&n.path);
        if let Some(s) = self.listings.fresh(&self.opts.location.dir_prefix(parent))
            && let Some(Listed::File(info)) = s.get(name)
        {
            self.learn(&n.path, info.clone());
            return Ok(self.file_attr(&n.path, info, version(info)));
        }
        let info = self.current(&n)?;
        Ok(self.file_attr(&n.path, &info, version(&info)))
    }

    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<crate::DirPage> {
        let d = self.dir_node(dir)?;
        let snap = self.listing(&d.path)?;
        let mut names: Vec<(String, Option<&Listed>)> = Vec::new();
        // Files created here and not uploaded yet are in no listing.
        let staged = self.staging.new_files_in(&d.path);
        let total = snap.entries.len() + staged.len();
        let start = cookie as usize;
        for (i, (name, l)) in snap.entries.iter().enumerate().skip(start) {
            if names.len() >= max_entries as usize {
                break;
            }
            let _ = i;
            names.push((name.clone(), Some(l)));
        }
        if start + names.len() >= snap.entries.len() {
            let skip = (start + names.len()).saturating_sub(snap.entries.len());
            for name in staged.iter().skip(skip) {
                if names.len() >= max_entries as usize {
                    break;
                }
                if snap.get(name).is_none() {
                    names.push((name.clone(), None));
                }
            }
        }
        let mut entries = Vec::with_capacity(names.len());
        let consumed = names.len();
        for (name, l) in names {
            let path = join(&d.path, &name);
            let entry = match l {
                Some(l) => self.listed_entry(&path, l),
                None => match self.resolve(&path) {
                    Ok(e) => e,
                    Err(_) => continue,
                },
            };
            entries.push(DirEntry {
                name: name.into_bytes(),
                entry,
            });
        }
        let next = start + consumed;
        Ok(DirPage {
            entries,
            next: (next < total && consumed > 0).then_some(next as u64),
        })
    }

    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        let n = self.table.get(handle)?;
        if n.kind != FileKind::File {
            return Err(WireError::IsDir.into());
        }
        if let Some(r) = self.staging.read(&n.path, offset, len) {
            return r;
        }
        let mut info = match &n.info {
            Some(i) => i.clone(),
            None => self.current(&n)?,
        };
        for _ in 0..3 {
            if offset >= info.size {
                return Ok(ReadReply {
                    data: Vec::new(),
                    version: version(&info),
                });
            }
            let want = (info.size - offset).min(u64::from(len)) as u32;
            match self
                .client
                .get_range(&self.opts.location.key(&n.path), &info.etag, offset, want)
            {
                Ok(data) => {
                    self.ok(Ok(()))?;
                    return Ok(ReadReply {
                        data,
                        version: version(&info),
                    });
                }
                Err(S3Error::Changed) => {
                    // Replaced since we last looked: read the new object, under its own
                    // version (the caller sees the version change and does not mix it).
                    let fresh = S3Node {
                        info: None,
                        ..(*n).clone()
                    };
                    info = self.current(&fresh)?;
                }
                Err(S3Error::NotFound) => return Err(WireError::Stale.into()),
                Err(e) => return Err(self.err(e)),
            }
        }
        Err(OriginError::Protocol(
            "the object keeps changing while being read".into(),
        ))
    }

    fn readlink(&self, _handle: Handle) -> Result<Vec<u8>> {
        Err(WireError::Invalid.into())
    }

    fn statfs(&self) -> Result<StatFs> {
        // S3 has no capacity to report: a large, mostly free file system.
        Ok(StatFs {
            blocks: 1 << 40,
            bfree: 1 << 39,
            bavail: 1 << 39,
            files: 1 << 32,
            ffree: 1 << 31,
            bsize: 4096,
            namelen: 255,
            frsize: 4096,
        })
    }

    fn subscribe(&self, sink: crate::BreakSink) -> bool {
        if !self.opts.watch {
            return false;
        }
        *self.sink.lock() = Some(sink.clone());
        let poller = watch::Poller {
            client: self.client.clone(),
            location: self.opts.location.clone(),
            listings: self.listings.clone(),
            table: self.table.clone(),
            watched: self.watched.clone(),
            sink,
            stop: self.stop.clone(),
            period: self.opts.metadata_ttl.max(Duration::from_millis(200)),
        };
        std::thread::Builder::new()
            .name("s3-watch".into())
            .spawn(move || poller.run())
            .is_ok()
    }

    fn is_connected(&self) -> bool {
        self.connected.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn create(
        &self,
        parent: Handle,
        name: &[u8],
        _mode: u32,
        exclusive: bool,
        _owner: Owner,
    ) -> Result<Entry> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(e) if e.attr.kind == FileKind::Dir => return Err(WireError::IsDir.into()),
            Ok(_) if exclusive => return Err(WireError::Exists.into()),
            Ok(e) => return Ok(e),
            Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        self.staging
            .create(&path)
            .map_err(|e| OriginError::Fs(io_error(&e)))?;
        self.changed(&path);
        self.report(&path, Some(FileKind::File));
        self.resolve(&path)
    }

    fn mkdir(&self, parent: Handle, name: &[u8], _mode: u32, _owner: Owner) -> Result<Entry> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(_) => return Err(WireError::Exists.into()),
            Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        let marker = self.opts.location.dir_prefix(&path);
        let r = self.client.put(&marker, &[], client::PutCondition::Absent);
        self.ok(r)?;
        self.changed(&path);
        self.report(&path, Some(FileKind::Dir));
        Ok(self.dir_entry(&path))
    }

    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        let e = self.resolve(&path)?;
        if e.attr.kind == FileKind::Dir {
            return Err(WireError::IsDir.into());
        }
        let was_staged_only = self.staging.discard(&path);
        if !was_staged_only {
            let r = self.client.delete(&self.opts.location.key(&path));
            self.ok(r)?;
        }
        self.table.forget(&path, FileKind::File);
        self.changed(&path);
        self.report(&path, None);
        Ok(())
    }

    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.writable()?;
        let path = self.child_path(parent, name)?;
        match self.resolve(&path) {
            Ok(e) if e.attr.kind != FileKind::Dir => return Err(WireError::NotDir.into()),
            Ok(_) => {}
            // A directory that existed only through the keys under it vanished with the
            // last of them (`rm -r` removes the files first): removing it succeeds.
            Err(OriginError::Fs(WireError::NotFound))
                if self.table.known(&path, FileKind::Dir).is_some() =>
            {
                self.table.forget(&path, FileKind::Dir);
                self.changed(&path);
                return Ok(());
            }
            Err(e) => return Err(e),
        }
        let prefix = self.opts.location.dir_prefix(&path);
        let page = self.client.list_page(&prefix, None, 2);
        let page = self.ok(page)?;
        let others = page.objects.iter().any(|(k, _)| *k != prefix) || !page.prefixes.is_empty();
        if others || !self.staging.new_files_in(&path).is_empty() {
            return Err(WireError::NotEmpty.into());
        }
        let r = self.client.delete(&prefix);
        self.ok(r)?;
        self.table.forget(&path, FileKind::Dir);
        self.changed(&path);
        self.listings.expire(&prefix);
        self.report(&path, None);
        Ok(())
    }

    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.writable()?;
        if flags & RENAME_EXCHANGE != 0 {
            return Err(WireError::Unsupported.into());
        }
        let from = self.child_path(parent, name)?;
        let to = self.child_path(new_parent, new_name)?;
        let src = self.resolve(&from)?;
        if src.attr.kind == FileKind::Dir {
            // A directory is every key under it: no atomic way to move them.
            return Err(WireError::CrossDevice.into());
        }
        if from == to {
            return Ok(());
        }
        match self.resolve(&to) {
            Ok(e) if e.attr.kind == FileKind::Dir => return Err(WireError::IsDir.into()),
            Ok(_) if flags & RENAME_NOREPLACE != 0 => return Err(WireError::Exists.into()),
            Ok(_) | Err(OriginError::Fs(WireError::NotFound)) => {}
            Err(e) => return Err(e),
        }
        // Pending writes reach the store first, then copy + delete (not atomic).
        self.staging.upload(&from, self)?;
        let n = self.table.get(self.resolve(&from)?.handle)?;
        let info = self.current(&n)?;
        let r = self.client.copy(
            &self.opts.location.key(&from),
            &info.etag,
            &self.opts.location.key(&to),
        );
        self.ok(r)?;
        let r = self.client.delete(&self.opts.location.key(&from));
        self.ok(r)?;
        self.table.forget(&from, FileKind::File);
        self.table.forget(&to, FileKind::File);
        self.changed(&from);
        self.changed(&to);
        self.report(&from, None);
        self.report(&to, Some(FileKind::File));
        Ok(())
    }

    fn link(&self, _handle: Handle, _parent: Handle, _name: &[u8]) -> Result<Entry> {
        Err(WireError::NotPermitted.into())
    }

    fn symlink(&self, _p: Handle, _n: &[u8], _t: &[u8], _o: Owner) -> Result<Entry> {
        Err(WireError::NotPermitted.into())
    }

    fn mknod(&self, _p: Handle, _n: &[u8], _m: u32, _r: u64, _o: Owner) -> Result<Entry> {
        Err(WireError::NotPermitted.into())
    }

    fn setattr(&self, handle: Handle, set: &SetAttrs) -> Result<Attr> {
        let n = self.table.get(handle)?;
        if let Some(size) = set.size {
            self.writable()?;
            if n.kind != FileKind::File {
                return Err(WireError::IsDir.into());
            }
            self.staging.truncate(&n, size, self)?;
        }
        // Modes, owners and times are not stored in S3: accepted and not kept
        // (doc/SEMANTICS.md), so tools like `cp -p` work.
        self.getattr(handle)
    }

    fn write(&self, handle: Handle, offset: u64, data: &[u8], append: bool) -> Result<WriteReply> {
        self.writable()?;
        let n = self.table.get(handle)?;
        if n.kind != FileKind::File {
            return Err(WireError::IsDir.into());
        }
        let r = self.staging.write(&n, offset, data, append, self)?;
        self.changed(&n.path);
        Ok(r)
    }

    fn publishes_on_close(&self) -> bool {
        true
    }

    fn flush(&self, handle: Handle) -> Result<Option<(u64, Attr)>> {
        let n = self.table.get(handle)?;
        if n.kind != FileKind::File {
            return Ok(None);
        }
        self.staging.upload(&n.path, self)
    }

    fn fsync(&self, handle: Handle, _datasync: bool) -> Result<()> {
        self.flush(handle).map(|_| ())
    }
}

impl Drop for S3Origin {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

fn io_error(e: &std::io::Error) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => WireError::NoSpace,
        Some(libc::EDQUOT) => WireError::QuotaExceeded,
        _ => WireError::Io,
    }
}
