//! Directory listings of the bucket, kept in memory and on disk.
//!
//! A listing ([`Snapshot`], module `snapshot`) is every page of
//! `ListObjectsV2(prefix=DIR/, delimiter=/)` folded into one sorted snapshot. A snapshot
//! answers lookups and `readdir` while it is fresh (`--metadata-ttl`, forever with
//! `--immutable`), past that up to `--metadata-max-stale` while it is listed again
//! (module `refresher`), and at any age while the store is unreachable, also after a
//! remount: each is kept on disk (module `disk`), as are names looked up one by one
//! (module `seen`). This module owns what is in memory: which listings may be served
//! ([`Listings::usable`]), which are due for a listing again, and the changes made
//! through this origin that void them.

mod disk;
mod seen;
mod snapshot;
mod versions;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::s3::client::{S3Client, S3Error, S3Result};
use disk::SnapshotFiles;
use seen::SeenNames;
use snapshot::now_unix;
pub use snapshot::{Listed, Snapshot};
pub use versions::DirVersion;
use versions::Versions;

/// Most entries one directory may have (beyond it listing fails rather than exhaust memory).
pub const MAX_ENTRIES: usize = 2_000_000;
/// Keys asked for per page.
const PAGE: usize = 1000;
/// Snapshots kept in memory (others are reloaded from disk when needed).
const MEM_SNAPSHOTS: usize = 4096;
/// An unchanged listing is written to disk again at most this often.
const DISK_REFRESH: Duration = Duration::from_secs(30);

struct Held {
    snap: Arc<Snapshot>,
    /// When the store was asked for it (`None`: out of date whatever its age, as a
    /// change made through this origin may be missing from it; kept for offline use).
    listed: Option<Instant>,
    used: u64,
    /// When a reader was last answered from it.
    used_at: Instant,
    /// When the same entries were last written to disk (`None`: not since it was held).
    stored: Option<Instant>,
}

/// The listing store. Locks: `mem`, `expired` and `versions` are leaves (as are the
/// locks of `disk` and `seen`); `mem` is never held across a request or a disk write.
pub struct Listings {
    mem: Mutex<(HashMap<String, Held>, u64)>,
    /// Names resolved one by one (outside any listing), for offline lookups after a
    /// remount.
    seen: SeenNames,
    /// The listings kept on disk.
    disk: SnapshotFiles,
    ttl: Duration,
    /// How old a listing may be and still be served while it is listed again in the
    /// background (at least `ttl`).
    max_stale: Duration,
    immutable: bool,
    /// Counts the changes made through this origin ([`Listings::expire`]): a listing
    /// begun before one of its directory may not show it, and is kept as out of date.
    changes: std::sync::atomic::AtomicU64,
    /// The latest changes by prefix: runs of consecutive counts of one prefix (a write
    /// stream to one directory is one entry).
    expired: Mutex<ExpiredLog>,
    /// Each directory's names hash and `changed_at` as last listed, for its attributes.
    versions: Mutex<Versions>,
}

/// Changes through this origin by prefix, for [`Listings::changed_since`].
#[derive(Default)]
struct ExpiredLog {
    /// (first count, last count, prefix): every count in between was a change of it.
    runs: std::collections::VecDeque<(u64, u64, String)>,
    /// Counts up to this one are no longer told apart.
    dropped_upto: u64,
}

/// Runs of changes of names remembered by prefix ([`Listings::changed_since`]).
const EXPIRED_LOG: usize = 4096;

impl Listings {
    /// A store keeping snapshots under `disk` (if any), fresh for `ttl` and served while
    /// they are listed again up to `max_stale` ([`Listings::usable`]).
    pub fn new(
        disk: Option<PathBuf>,
        ttl: Duration,
        max_stale: Duration,
        immutable: bool,
    ) -> Listings {
        let disk = SnapshotFiles::new(disk);
        Listings {
            mem: Mutex::new((HashMap::new(), 0)),
            seen: SeenNames::new(disk.dir()),
            disk,
            ttl,
            max_stale: max_stale.max(ttl),
            immutable,
            changes: std::sync::atomic::AtomicU64::new(0),
            expired: Mutex::new(ExpiredLog::default()),
            versions: Mutex::new(Versions::default()),
        }
    }

    /// The listing of `prefix` if it is fresh.
    pub fn fresh(&self, prefix: &str) -> Option<Arc<Snapshot>> {
        match self.usable(prefix)? {
            (s, Age::Fresh) => Some(s),
            (_, Age::Stale(_)) => None,
        }
    }

    /// The listing of `prefix` if it may be served: fresh, or listed less than the
    /// staleness bound ago (the caller has it listed again in the background) and with no
    /// change made through this origin since.
    pub fn usable(&self, prefix: &str) -> Option<(Arc<Snapshot>, Age)> {
        let now = Instant::now();
        {
            let mut g = self.mem.lock();
            let (m, clock) = &mut *g;
            *clock += 1;
            if let Some(h) = m.get_mut(prefix) {
                let age = self.age(h.listed, now)?;
                h.used = *clock;
                h.used_at = now;
                return Some((h.snap.clone(), age));
            }
        }
        // Not in memory: a snapshot on disk young enough (a remount within the bound).
        let snap = self.disk.load(prefix)?;
        let listed = listed_instant(&snap, now);
        let age = self.age(listed, now)?;
        self.known_version(prefix, &snap);
        let snap = Arc::new(snap);
        self.hold(prefix, snap.clone(), listed);
        Some((snap, age))
    }

    /// How a listing made at `listed` may be used at `now` (`None`: not without the store).
    fn age(&self, listed: Option<Instant>, now: Instant) -> Option<Age> {
        if self.immutable {
            return Some(Age::Fresh);
        }
        let age = now.saturating_duration_since(listed?);
        if age < self.ttl {
            Some(Age::Fresh)
        } else if age < self.max_stale {
            Some(Age::Stale(age))
        } else {
            None
        }
    }

    /// When the listing of `prefix` kept in memory was made, if it is not out of date.
    pub fn listed_at(&self, prefix: &str) -> Option<Instant> {
        self.mem.lock().0.get(prefix).and_then(|h| h.listed)
    }

    /// The directories answered from since `used_since` whose listing was made before
    /// `listed_before` (or is out of date), with when it was made: what to list again
    /// before a reader finds it past the staleness bound. None under `--immutable`.
    pub fn due(
        &self,
        used_since: Instant,
        listed_before: Instant,
    ) -> Vec<(String, Option<Instant>)> {
        if self.immutable {
            return Vec::new();
        }
        let g = self.mem.lock();
        g.0.iter()
            .filter(|(_, h)| h.used_at >= used_since && h.listed.is_none_or(|l| l < listed_before))
            .map(|(p, h)| (p.clone(), h.listed))
            .collect()
    }

    /// Entries listed under each of `tops` (directory prefixes), counted over every
    /// directory this mount has listed: what one listing without delimiter of each would
    /// read, about.
    pub fn entries_under(&self, tops: &[String]) -> Vec<usize> {
        let v = self.versions.lock();
        tops.iter().map(|top| v.entries_under(top)).collect()
    }

    /// Records the version of a listing loaded from disk (kept by an earlier mount), if
    /// none is known yet.
    fn known_version(&self, prefix: &str, snap: &Snapshot) {
        if snap.changed_at == 0 {
            return;
        }
        self.versions.lock().insert_if_absent(
            prefix,
            DirVersion {
                hash: snap.names_hash(),
                changed_at: snap.changed_at,
                entries: snap.entries.len(),
            },
        );
    }

    /// The last listing of `prefix`, whatever its age (for when the store is unreachable).
    pub fn any(&self, prefix: &str) -> Option<Arc<Snapshot>> {
        if let Some(h) = self.mem.lock().0.get(prefix) {
            return Some(h.snap.clone());
        }
        let snap = self.disk.load(prefix)?;
        self.known_version(prefix, &snap);
        let listed = listed_instant(&snap, Instant::now());
        let snap = Arc::new(snap);
        self.hold(prefix, snap.clone(), listed);
        Some(snap)
    }

    /// Lists `prefix` from the store (every page), keeps and returns the snapshot.
    pub fn refresh(&self, client: &S3Client, prefix: &str) -> S3Result<Arc<Snapshot>> {
        let changes = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        let mut pages = Vec::new();
        let mut token: Option<String> = None;
        let mut count = 0usize;
        loop {
            let page = client.list_page(prefix, token.as_deref(), PAGE)?;
            count += page.objects.len() + page.prefixes.len();
            if count > MAX_ENTRIES {
                return Err(S3Error::Protocol(format!(
                    "{prefix:?} has more than {MAX_ENTRIES} entries"
                )));
            }
            // A store that keeps answering with a continuation token but no entries (or
            // the token it was given) would keep us listing forever.
            if pages.len() > MAX_ENTRIES / PAGE + 1 || (page.next.is_some() && page.next == token) {
                return Err(S3Error::Protocol(format!(
                    "the listing of {prefix:?} does not end"
                )));
            }
            token = page.next.clone();
            pages.push(page);
            if token.is_none() {
                break;
            }
        }
        Ok(self.install(prefix, Snapshot::from_pages(prefix, pages), changes))
    }

    /// Lists `prefix` with one request: kept and returned if that was all of it (`None`: a
    /// larger directory, nothing kept).
    pub fn refresh_if_small(
        &self,
        client: &S3Client,
        prefix: &str,
    ) -> S3Result<Option<Arc<Snapshot>>> {
        let changes = self.changes.load(std::sync::atomic::Ordering::SeqCst);
        let page = client.list_page(prefix, None, PAGE)?;
        if page.next.is_some() {
            return Ok(None);
        }
        let snap = Snapshot::from_pages(prefix, vec![page]);
        Ok(Some(self.install(prefix, snap, changes)))
    }

    /// Changes made through this origin so far: taken before listing, and given to
    /// [`Listings::install`].
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps a listing of `prefix` made by a request sent when [`Listings::changes`] was
    /// `changes_before` (as [`Listings::refresh`] keeps its own: not fresh if a change
    /// through this origin may be missing from it).
    pub fn install(&self, prefix: &str, snap: Snapshot, changes_before: u64) -> Arc<Snapshot> {
        let snap = Arc::new(self.stamped(prefix, snap));
        // A change made through this origin meanwhile may be missing from it: used for
        // this answer, but not reused as fresh.
        if self.changed_since(changes_before, prefix) {
            self.hold(prefix, snap.clone(), None);
            return snap;
        }
        // A listing like the one on disk is rewritten (to say when it was made, for a
        // remount) at most every `DISK_REFRESH`: revalidating 1,000 unchanged directories
        // every few seconds must not cost 1,000 files written each time.
        let on_disk = self.mem.lock().0.get(prefix).is_some_and(|h| {
            h.stored.is_some_and(|t| t.elapsed() < DISK_REFRESH) && h.snap.entries == snap.entries
        });
        self.hold(prefix, snap.clone(), Some(Instant::now()));
        if !on_disk {
            self.disk.store(prefix, &snap);
            if let Some(h) = self.mem.lock().0.get_mut(prefix) {
                h.stored = Some(Instant::now());
            }
        }
        // A change that came between the check and now expired what was there before:
        // this one may miss it too.
        if self.changed_since(changes_before, prefix) {
            self.expire_kept(prefix);
        }
        snap
    }

    /// Whether names under `prefix` changed through this origin since the count was
    /// `before` (or changes since then are no longer told apart).
    pub fn changed_since(&self, before: u64, prefix: &str) -> bool {
        let log = self.expired.lock();
        if self.changes() == before {
            return false;
        }
        log.dropped_upto > before
            || log
                .runs
                .iter()
                .any(|(_, last, p)| *last > before && p == prefix)
    }

    /// `snap` with its `changed_at`: the last listing's if that one had the same names,
    /// else now. Recorded for the directory's attributes ([`Listings::version`]).
    fn stamped(&self, prefix: &str, mut snap: Snapshot) -> Snapshot {
        let hash = snap.names_hash();
        let known = self
            .versions
            .lock()
            .get(prefix)
            .map(|v| (v.hash, v.changed_at));
        let previous = match known {
            Some(v) => Some(v),
            None => self.any(prefix).map(|o| (o.names_hash(), o.changed_at)),
        };
        snap.changed_at = match previous {
            Some((h, at)) if h == hash && at != 0 => at,
            _ => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos().min(i64::MAX as u128) as i64),
        };
        let version = DirVersion {
            hash,
            changed_at: snap.changed_at,
            entries: snap.entries.len(),
        };
        self.versions.lock().insert(prefix, version);
        snap
    }

    /// Directory `prefix` as this mount last listed it (no disk or network).
    pub fn version(&self, prefix: &str) -> Option<DirVersion> {
        self.versions.lock().get(prefix)
    }

    /// Makes the kept listing of `prefix` out of date, in memory and on disk.
    fn expire_kept(&self, prefix: &str) {
        if let Some(h) = self.mem.lock().0.get_mut(prefix) {
            h.listed = None;
            h.stored = None;
        }
        // A snapshot on disk must not look fresh to a remount either.
        self.disk.remove(prefix);
    }

    /// The listing of `prefix` changed (through this origin): the next use lists again.
    pub fn expire(&self, prefix: &str) {
        {
            // Logged before the count moves, so whoever sees the new count finds it.
            let mut log = self.expired.lock();
            let n = self.changes() + 1;
            match log.runs.back_mut() {
                Some((_, last, p)) if p == prefix => *last = n,
                _ => log.runs.push_back((n, n, prefix.to_string())),
            }
            while log.runs.len() > EXPIRED_LOG {
                if let Some((_, last, _)) = log.runs.pop_front() {
                    log.dropped_upto = last;
                }
            }
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        self.expire_kept(prefix);
    }

    /// Records that `path` (a full key path) was found to be `l` by a lookup.
    pub fn remember(&self, path: &str, l: &Listed) {
        self.seen.remember(path, l);
    }

    /// What a lookup last found at `path`, whatever its age.
    pub fn recall(&self, path: &str) -> Option<Listed> {
        self.seen.recall(path)
    }

    fn hold(&self, prefix: &str, snap: Arc<Snapshot>, listed: Option<Instant>) {
        let mut g = self.mem.lock();
        let (m, clock) = &mut *g;
        *clock += 1;
        let used = *clock;
        // A listing made again keeps its readers' last use: the refresher's own listings
        // must not keep a directory nobody reads in use.
        let (used_at, stored) = m
            .get(prefix)
            .map_or_else(|| (Instant::now(), None), |h| (h.used_at, h.stored));
        m.insert(
            prefix.to_string(),
            Held {
                snap,
                listed,
                used,
                used_at,
                stored,
            },
        );
        if m.len() > MEM_SNAPSHOTS {
            // Drop the least recently used half (they stay on disk).
            let mut uses: Vec<u64> = m.values().map(|h| h.used).collect();
            uses.sort_unstable();
            let cut = uses[uses.len() / 2];
            m.retain(|_, h| h.used > cut);
        }
    }
}

/// How a kept listing may be used ([`Listings::usable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Age {
    /// Within the TTL (or `--immutable`): as good as asking the store.
    Fresh,
    /// Past the TTL by this much in all, within the staleness bound: served while it is
    /// listed again.
    Stale(Duration),
}

/// When a snapshot read from disk was listed, as an instant of this process (`None`:
/// before this machine's clock can say, or in the future).
fn listed_instant(snap: &Snapshot, now: Instant) -> Option<Instant> {
    let age = now_unix().checked_sub(snap.listed_at)?;
    now.checked_sub(Duration::from_secs(u64::try_from(age).ok()?))
}

#[cfg(test)]
mod tests {
    use super::snapshot::tests::info;
    use super::*;
    use crate::s3::client::ListPage;

    #[test]
    fn a_change_voids_only_the_listings_of_its_directory_begun_before_it() {
        let l = Listings::new(
            None,
            Duration::from_secs(60),
            Duration::from_secs(60),
            false,
        );
        let before = l.changes();
        l.expire("a/");
        assert!(l.changed_since(before, "a/"));
        assert!(!l.changed_since(before, "b/"), "a write elsewhere");
        assert!(!l.changed_since(l.changes(), "a/"), "begun after it");
        // A write stream to one directory is one entry, however long.
        let mid = l.changes();
        for _ in 0..10 * EXPIRED_LOG {
            l.expire("w/");
        }
        assert!(!l.changed_since(mid, "b/"));
        assert!(l.changed_since(mid, "w/"));
        for i in 0..EXPIRED_LOG {
            l.expire(&format!("x{i}/"));
        }
        assert!(l.changed_since(before, "b/"), "no longer told apart");
    }

    #[test]
    fn snapshots_outlive_the_process_and_expire_by_age() {
        let d = tempfile::tempdir().unwrap();
        let snap = Snapshot::from_pages(
            "",
            vec![ListPage {
                objects: vec![("f".into(), info(1))],
                ..ListPage::default()
            }],
        );
        let a = Listings::new(
            Some(d.path().into()),
            Duration::from_secs(60),
            Duration::from_secs(60),
            false,
        );
        a.hold("", Arc::new(snap), Some(Instant::now()));
        a.disk.store("", &a.any("").unwrap());
        // A new store (a remount) finds it fresh on disk within the TTL...
        let b = Listings::new(
            Some(d.path().into()),
            Duration::from_secs(60),
            Duration::from_secs(60),
            false,
        );
        assert!(b.fresh("").is_some_and(|s| s.get("f").is_some()));
        // ...not fresh with a TTL it outlived, but still there for offline use.
        let c = Listings::new(Some(d.path().into()), Duration::ZERO, Duration::ZERO, false);
        assert!(c.fresh("").is_none());
        assert!(c.any("").is_some());
        assert!(c.any("other/").is_none());
        // A change through this mount expires it everywhere.
        c.expire("");
        let e = Listings::new(
            Some(d.path().into()),
            Duration::from_secs(60),
            Duration::from_secs(60),
            false,
        );
        assert!(e.fresh("").is_none());
        // Names looked up one by one are remembered across a remount, torn tail or not.
        c.remember("a/b", &Listed::Dir);
        c.remember("a/f", &Listed::File(info(3)));
        let log = d.path().join("seen.log");
        let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        std::io::Write::write_all(&mut f, &[200, 0, 0, 0, 1, 2]).unwrap();
        let r = Listings::new(Some(d.path().into()), Duration::ZERO, Duration::ZERO, false);
        assert_eq!(r.recall("a/b"), Some(Listed::Dir));
        assert_eq!(r.recall("a/f"), Some(Listed::File(info(3))));
        assert_eq!(r.recall("a/g"), None);
        // Garbage on disk is ignored.
        std::fs::write(c.disk.path("x/").unwrap(), b"garbage").unwrap();
        assert!(c.any("x/").is_none());
    }

    #[test]
    fn a_listing_past_its_ttl_is_served_stale_up_to_the_bound_unless_changed_here() {
        let l = Listings::new(None, Duration::from_secs(1), Duration::from_secs(5), false);
        let snap = || Arc::new(Snapshot::from_pages("", vec![ListPage::default()]));
        let ago = |s| Instant::now().checked_sub(Duration::from_secs(s));
        l.hold("new/", snap(), ago(0));
        assert_eq!(l.usable("new/").map(|u| u.1), Some(Age::Fresh));
        l.hold("old/", snap(), ago(3));
        assert!(
            matches!(l.usable("old/"), Some((_, Age::Stale(a))) if a >= Duration::from_secs(3))
        );
        assert!(l.fresh("old/").is_none(), "stale is not fresh");
        l.hold("older/", snap(), ago(6));
        assert!(
            l.usable("older/").is_none(),
            "past the bound: readers wait for the store"
        );
        assert!(l.any("older/").is_some(), "but it is kept for offline use");
        l.expire("new/");
        assert!(
            l.usable("new/").is_none(),
            "a change made here is never served stale"
        );
        // What one listing of a whole subtree would read, from the directories listed.
        l.stamped(
            "a/",
            Snapshot::from_pages(
                "a/",
                vec![ListPage {
                    objects: vec![("a/x".into(), info(1)), ("a/y".into(), info(1))],
                    prefixes: vec!["a/b/".into()],
                    next: None,
                }],
            ),
        );
        l.stamped(
            "a/b/",
            Snapshot::from_pages(
                "a/b/",
                vec![ListPage {
                    objects: vec![("a/b/z".into(), info(1))],
                    ..ListPage::default()
                }],
            ),
        );
        assert_eq!(
            l.entries_under(&["a/".into(), "a/b/".into(), "c/".into()]),
            [4, 1, 0]
        );
        // Due for a listing: directories answered from since a time, listed before another.
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        assert!(
            l.due(t0, Instant::now()).is_empty(),
            "none answered from since"
        );
        l.usable("old/");
        l.usable("older/");
        let due: Vec<String> = l.due(t0, Instant::now()).into_iter().map(|d| d.0).collect();
        assert_eq!(
            due,
            ["old/"],
            "past the bound is not answered from, so not in use"
        );
        // Listed again (by the refresher): not due until it ages, and still in use.
        l.hold("old/", snap(), ago(0));
        let second_ago = Instant::now().checked_sub(Duration::from_secs(1)).unwrap();
        assert!(l.due(t0, second_ago).is_empty());
        assert_eq!(l.due(t0, Instant::now() + Duration::from_secs(1)).len(), 1);
    }

    #[test]
    fn an_unchanged_listing_is_not_written_to_disk_again_each_time() {
        let d = tempfile::tempdir().unwrap();
        let l = Listings::new(Some(d.path().into()), Duration::ZERO, Duration::ZERO, false);
        let page = |n: u64| ListPage {
            objects: vec![("p/f".into(), info(n))],
            ..ListPage::default()
        };
        let file = l.disk.path("p/").unwrap();
        l.install("p/", Snapshot::from_pages("p/", vec![page(1)]), l.changes());
        // (Taken away behind its back: whether it is written again shows.)
        std::fs::remove_file(&file).unwrap();
        l.install("p/", Snapshot::from_pages("p/", vec![page(1)]), l.changes());
        assert!(
            file.metadata().is_err(),
            "the same entries: not written again"
        );
        l.install("p/", Snapshot::from_pages("p/", vec![page(2)]), l.changes());
        assert!(file.metadata().is_ok(), "other entries are written");
        // A listing cut short, or overwritten in part (a write torn by a crash), is
        // ignored.
        let whole = std::fs::read(&file).unwrap();
        let mut flipped = whole.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        for torn in [whole[..whole.len() - 1].to_vec(), flipped] {
            std::fs::write(&file, &torn).unwrap();
            let other = Listings::new(Some(d.path().into()), Duration::ZERO, Duration::ZERO, false);
            assert!(other.any("p/").is_none());
        }
        l.install("p/", Snapshot::from_pages("p/", vec![page(3)]), l.changes());
        // Expired by a change here, the file is gone; the next listing writes it again.
        l.expire("p/");
        assert!(l.disk.path("p/").unwrap().metadata().is_err());
        l.install("p/", Snapshot::from_pages("p/", vec![page(2)]), l.changes());
        assert!(l.disk.path("p/").unwrap().metadata().is_ok());
    }
}
