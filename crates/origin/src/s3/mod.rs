//! An S3 bucket (or a prefix of one) as an [`Origin`]: `hoardfs mount s3://BUCKET/PREFIX`.
//!
//! Module map: `client` (the S3 requests, signed by `rusty-s3`, carried by `ureq`),
//! `credentials` (the AWS chain: environment and profile files), `location` (paths ↔
//! keys), `nodes` (handles ↔ paths; identities and versions), `listings` (directory
//! snapshots in memory and on disk), `resolve` (what is at a path; attributes, entries,
//! change reports), `modify` (namespace changes), `staging` (files being written,
//! uploaded on close), `watch` (change reports for a tier), `refresher` (listings past
//! their TTL listed again in the background), `options`.
//!
//! S3 has no callbacks, so this origin does not subscribe: the file-system layer
//! revalidates by time (`--metadata-ttl`), and this origin answers it from listings up to
//! `--metadata-max-stale` old while the `refresher` lists them again. A file's version is a hash of its ETag and
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
mod modify;
pub mod nodes;
mod options;
pub mod poller;
pub mod refresher;
mod resolve;
mod staging;
pub mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hoardfs_proto::{
    Attr, DirEntry, Entry, FileKind, Handle, Owner, SetAttrs, StatFs, Timestamp, WireError,
};
use parking_lot::Mutex;

use self::client::{ClientConfig, S3Client, S3Error};
use self::listings::{Listed, Listings};
use self::location::{join, split, valid_name};
use self::nodes::{NodeTable, S3Node, version};
use self::staging::Staging;
use crate::{DirPage, Origin, OriginError, OriginInfo, ReadReply, Result, WriteReply};

pub use self::credentials::CredentialSource;
pub use self::options::S3Options;

/// The S3 origin.
pub struct S3Origin {
    opts: S3Options,
    client: Arc<S3Client>,
    table: Arc<NodeTable>,
    listings: Arc<Listings>,
    watched: Arc<watch::Watched>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// Where changes made through this origin are reported (with `watch`).
    sink: Arc<Mutex<Option<crate::BreakSink>>>,
    /// Lists again, in the background, the listings served past their TTL.
    refresher: refresher::Refresher,
    /// Where the walks asking for subtrees go on from.
    walks: Mutex<Walks>,
    staging: Staging,
    /// Recent "no such name" answers: path → when.
    negative: Mutex<std::collections::HashMap<String, Instant>>,
    export_id: u128,
    started: Timestamp,
    connected: std::sync::atomic::AtomicBool,
    /// The private staging directory of a mount without a state directory.
    _scratch: Option<tempfile::TempDir>,
}

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
        // Without a state directory (a mount with --no-cache), writes are staged in a
        // fresh private directory (mode 0700, a random name made with O_EXCL semantics:
        // nobody can have made it first), removed when the origin is dropped.
        let (state, scratch) = match &opts.state_dir {
            Some(d) => (d.clone(), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("hoardfs-s3-")
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(|e| format!("cannot create a private staging directory: {e}"))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let listings = Listings::new(
            opts.state_dir.as_ref().map(|d| d.join("listings")),
            opts.metadata_ttl,
            opts.max_stale,
            opts.immutable,
        );
        let staging = Staging::new(state.join("staging"))
            .map_err(|e| format!("cannot create {}: {e}", state.join("staging").display()))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let client = Arc::new(client);
        let table = Arc::new(NodeTable::new(
            rand::random::<u64>() | 1,
            1 << 20,
            S3Node::root(),
        ));
        let listings = Arc::new(listings);
        let stop = Arc::<std::sync::atomic::AtomicBool>::default();
        let sink = Arc::new(Mutex::new(None));
        let refresher = refresher::Refresher::new(
            refresher::Parts {
                client: client.clone(),
                location: opts.location.clone(),
                listings: listings.clone(),
                table: table.clone(),
                sink: sink.clone(),
                stop: stop.clone(),
            },
            opts.metadata_ttl,
            opts.max_stale.max(opts.metadata_ttl),
            opts.list_rate,
        );
        Ok(S3Origin {
            client,
            table,
            listings,
            watched: Arc::default(),
            stop,
            sink,
            refresher,
            walks: Mutex::default(),
            staging,
            negative: Mutex::new(Default::default()),
            export_id,
            started: Timestamp {
                secs: now.as_secs() as i64,
                nanos: 0,
            },
            connected: std::sync::atomic::AtomicBool::new(true),
            opts,
            _scratch: scratch,
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
        // A store that kept answering 5xx or 429 through the retries (Garage without a
        // quorum, AWS's SlowDown) is unavailable, as an unreachable one is: what is
        // cached is served and the rest fails at once, instead of failing everything.
        let overloaded = matches!(
            e,
            S3Error::Status { status, .. } if status == 429 || (status >= 500 && !matches!(status, 501 | 507))
        );
        let offline = overloaded || matches!(e, S3Error::Unreachable(_) | S3Error::Timeout(_));
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
            S3Error::Status { status, message } if overloaded => {
                OriginError::Unreachable(format!("the store answered {status}: {message}"))
            }
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

    /// The store answered: it is reachable.
    fn reached(&self) {
        self.connected
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `r` as an origin result, noting whether the store was reachable.
    fn ok<T>(&self, r: std::result::Result<T, S3Error>) -> Result<T> {
        match r {
            Ok(v) => {
                self.reached();
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
            Ok(_) => self.reached(),
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
            identities: hoardfs_proto::Identities::Server,
            verifier: 0,
        })
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        let path = self.child_path(parent, name)?;
        let mut e = self.resolve(&path)?;
        if e.attr.kind == FileKind::Dir {
            e.attr = self.revalidated_dir_attr(&path);
        }
        Ok(e)
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        let n = self.table.get(handle)?;
        if n.kind == FileKind::Dir {
            return Ok(self.revalidated_dir_attr(&n.path));
        }
        if let Some(a) = self.staging.attr(&n.path, self) {
            return Ok(a);
        }
        // A fresh listing of the directory says as much as a HEAD would.
        let (parent, name) = split(&n.path);
        if let Some(s) = self.served_listing(&self.opts.location.dir_prefix(parent))
            && let Some(Listed::File(info)) = s.get(name)
        {
            self.learn(&n.path, info.clone());
            return Ok(self.file_attr(&n.path, info, version(info)));
        }
        let info = self.current(&n)?;
        Ok(self.file_attr(&n.path, &info, version(&info)))
    }

    fn lists_trees(&self) -> bool {
        true
    }

    /// One listing without delimiter fills the listings of the directories under `dir`
    /// (`watch::relist_tree`), then the walk reads them from memory: a request per 1,000
    /// keys instead of one per directory. Not when the listings of `dir` and of its
    /// directories are all still fresh. A walk that asks from the same directory again
    /// (within [`WALK_RESUME`]) is given the directories after the last one it was given
    /// (`walks`): a walk larger than one reply moves on instead of getting its first
    /// directories again each time. A directory of a parent whose listing is kept (a
    /// walker listed it) is listed together with the siblings after it, a page of keys
    /// at a time (`SIBLING_KEYS`): a walker asks for the subtree of each directory of a
    /// large parent in turn (the client does not ask for the parent's whole subtree,
    /// which would come again with every request), and finds the next ones listed.
    fn read_tree(
        &self,
        dir: Handle,
        dir_id: u64,
        max_entries: u32,
    ) -> Result<Vec<hoardfs_proto::TreeDir>> {
        let d = self.dir_node(dir)?;
        let resume = self.walks.lock().resume(&d.path);
        // Fresh (or servable) listings of the top and of its directories (kept on disk
        // within the bound, or under `--immutable`): the walk finds them without the
        // store. The top's own listing (one request, if it has at most 1,000 entries)
        // says where its stale directories start: the listing starts at the first one
        // after where the walk resumes.
        let fresh = |path: &str| self.served_listing(&self.opts.location.dir_prefix(path));
        if !d.path.is_empty() && fresh(&d.path).is_none() {
            let (parent, name) = split(&d.path);
            if fresh(parent).is_some_and(|p| matches!(p.get(name), Some(Listed::Dir))) {
                // (Keys after `parent/name`: its own first.)
                self.relist_subtree(parent, Some(name), SIBLING_KEYS);
            }
        }
        let top = fresh(&d.path).or_else(|| self.list_if_small(&d.path).ok().flatten());
        let start_after = match top {
            Some(s) => s
                .entries
                .iter()
                .filter(|(_, l)| matches!(l, Listed::Dir))
                .filter(|(name, _)| resume.as_ref().is_none_or(|r| name > r))
                .find(|(name, _)| fresh(&join(&d.path, name)).is_none())
                .map(|(name, _)| Some(name.clone())),
            None => Some(None),
        };
        if let Some(start_after) = start_after {
            // (On failure the walk lists what it can, or serves what is kept, unreachable.)
            self.relist_subtree(&d.path, start_after.as_deref(), max_entries as usize);
        }
        let after = resume.as_deref().map(str::as_bytes);
        let dirs = crate::tree::walk_from(self, dir, dir_id, max_entries, after)?;
        // The last directory of the top given: where the next call goes on from.
        let last = dirs.first().and_then(|top| {
            dirs[1..].iter().rev().find_map(|d| {
                top.entries
                    .iter()
                    .find(|e| e.entry.attr.file_id == d.file_id)
                    .and_then(|e| String::from_utf8(e.name.clone()).ok())
            })
        });
        self.walks.lock().given(&d.path, last);
        Ok(dirs)
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
                    self.reached();
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
        let poller = poller::Poller {
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

    fn listing_refresh(&self) -> Option<refresher::RefreshStats> {
        (!self.opts.immutable).then(|| self.refresher.stats())
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
        self.create_file(parent, name, exclusive)
    }

    fn mkdir(&self, parent: Handle, name: &[u8], _mode: u32, _owner: Owner) -> Result<Entry> {
        self.make_dir(parent, name)
    }

    fn unlink(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.remove_file(parent, name)
    }

    fn rmdir(&self, parent: Handle, name: &[u8]) -> Result<()> {
        self.remove_dir(parent, name)
    }

    fn rename(
        &self,
        parent: Handle,
        name: &[u8],
        new_parent: Handle,
        new_name: &[u8],
        flags: u32,
    ) -> Result<()> {
        self.rename_file(parent, name, new_parent, new_name, flags)
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
        // Modes and owners are not stored in S3: every object shows the mount's
        // (--uid, --gid, --file-mode, --dir-mode). A change to them is refused rather
        // than accepted and lost; setting what is shown already succeeds (`cp -p` of a
        // file that has the mount's mode). Times are accepted and not kept (SEMANTICS.md).
        let (perm, uid, gid) = match n.kind {
            FileKind::Dir => (self.opts.dir_mode, self.opts.uid, self.opts.gid),
            _ => (self.opts.file_mode, self.opts.uid, self.opts.gid),
        };
        let changes_mode = set.mode.is_some_and(|m| (m & 0o7777) as u16 != perm);
        let changes_owner = set.uid.is_some_and(|u| u != uid) || set.gid.is_some_and(|g| g != gid);
        if changes_mode || changes_owner {
            return Err(WireError::NotPermitted.into());
        }
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

/// Keys listed at once for a directory and the siblings after it (one page): each
/// directory it covers whole is kept, at most this many, well within the listings kept
/// in memory (listing more at once would only push the first ones out before the walker
/// reaches them).
const SIBLING_KEYS: usize = 1000;

/// A walk that asks for the same directory's subtree within this time goes on from where
/// the last reply ended.
pub const WALK_RESUME: Duration = Duration::from_secs(2);

/// Walks in progress: by top directory, the last of its directories given and when.
#[derive(Default)]
struct Walks(std::collections::HashMap<String, (String, Instant)>);

impl Walks {
    /// Most walks remembered.
    const MAX: usize = 64;

    /// Where a walk from `top` goes on from: after the directory given last, if that was
    /// within [`WALK_RESUME`].
    fn resume(&self, top: &str) -> Option<String> {
        self.0
            .get(top)
            .filter(|(_, at)| at.elapsed() < WALK_RESUME)
            .map(|(name, _)| name.clone())
    }

    /// A reply from `top` ended with its directory `last` (`None`: it reached the end, or
    /// gave none of them; the next walk starts over).
    fn given(&mut self, top: &str, last: Option<String>) {
        match last {
            Some(name) => {
                if self.0.len() >= Self::MAX {
                    self.0.retain(|_, (_, at)| at.elapsed() < WALK_RESUME);
                }
                if self.0.len() < Self::MAX {
                    self.0.insert(top.to_string(), (name, Instant::now()));
                }
            }
            None => {
                self.0.remove(top);
            }
        }
    }
}

fn io_error(e: &std::io::Error) -> WireError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => WireError::NoSpace,
        Some(libc::EDQUOT) => WireError::QuotaExceeded,
        _ => WireError::Io,
    }
}
