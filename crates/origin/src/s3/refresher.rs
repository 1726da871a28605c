//! Listings served past their TTL are listed again here, in the background, so that a
//! reader never waits for a LIST unless its listing is older than the staleness bound
//! (`--metadata-max-stale`): the readers' requests cost memory lookups, and the store sees
//! a bounded rate of listings (`--list-rate`) whatever the number of directories in use.
//!
//! A directory is queued when a listing of it is served stale (so only directories in
//! use are revalidated), and, while it was answered from within the last [`KEEP_FRESH`]
//! (a minute), once its listing is half as old as the bound: a reader coming back after a
//! pause finds it younger than the bound and waits for nothing. Each request lists the oldest queued directory, or, when more
//! queued directories share an ancestor than a listing of that ancestor's whole subtree
//! costs pages (1,000 keys each), that subtree in one listing without delimiter
//! ([`plan`]): revalidating 1,000 prefixes of 20 objects costs 20 requests, not 1,000.
//! What changed is reported as any listing's changes are (`watch::Relister`).
//!
//! Lock order: `queue` is a leaf, never held across a request or another lock (the
//! listings' and the node table's locks are taken by the relister after it is released).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::client::{S3Client, S3Result};
use super::listings::Listings;
use super::location::S3Location;
use super::nodes::NodeTable;
use super::watch::Relister;
use crate::BreakSink;

/// Threads listing at once (the rate limit, not these, bounds the store's load).
const THREADS: usize = 2;
/// Most directories waiting to be listed again (beyond, new ones wait for their readers).
const MAX_QUEUED: usize = 1 << 16;
/// Keys per page of a listing.
const PAGE: usize = 1000;
/// How long the first directory of a batch waits for others to be queued with it (an
/// epoch over cached files reaches dozens of directories in that time): what a listing of
/// their common subtree can revalidate in one request.
const GATHER: Duration = Duration::from_millis(100);
/// Directories answered from within this long are kept younger than the staleness bound
/// even when nobody reads them meanwhile: listed again once half the bound has passed.
pub const KEEP_FRESH: Duration = Duration::from_secs(60);
/// How often the listings in use are looked over for those due.
const SWEEP: Duration = Duration::from_millis(250);
/// The window over which the request rate and the staleness served are reported.
const WINDOW: Duration = Duration::from_secs(10);

/// What one background request lists.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// One directory (its delimiter listing).
    Dir(String),
    /// Every key under a directory, in at most `pages` pages: the listings of the
    /// directories it covers whole.
    Tree {
        /// The directory prefix listed.
        top: String,
        /// Pages expected.
        pages: usize,
    },
}

impl Plan {
    fn pages(&self) -> usize {
        match self {
            Plan::Dir(_) => 1,
            Plan::Tree { pages, .. } => *pages,
        }
    }

    /// Whether it lists directory `prefix`.
    pub fn covers(&self, prefix: &str) -> bool {
        match self {
            Plan::Dir(p) => p == prefix,
            Plan::Tree { top, .. } => prefix.starts_with(top.as_str()),
        }
    }
}

/// The cheapest useful request for the queued directories (`prefix` → when last listed;
/// `None`: out of date at any age): the oldest one, or the subtree of it or of one of its
/// ancestors below `root` whose listing without delimiter costs fewer pages than the
/// queued directories it covers (the one saving the most requests; the deepest of
/// equals). `entries_under` says how many entries were listed under each candidate.
pub fn plan(
    wanted: &HashMap<String, Option<Instant>>,
    root: &str,
    entries_under: impl FnOnce(&[String]) -> Vec<usize>,
) -> Option<Plan> {
    let (oldest, _) = wanted.iter().min_by_key(|(p, at)| (**at, p.as_str()))?;
    // The oldest directory and its ancestors, deepest first, none above the root.
    let mut tops = vec![oldest.clone()];
    let mut p = oldest.trim_end_matches('/');
    while let Some(at) = p.rfind('/') {
        let parent = &p[..=at];
        if parent.len() < root.len() {
            break;
        }
        tops.push(parent.to_string());
        p = &p[..at];
    }
    if oldest.len() > root.len() && !tops.iter().any(|t| t == root) {
        tops.push(root.to_string());
    }
    let entries = entries_under(&tops);
    let mut best: Option<(usize, Plan)> = None;
    for (top, n) in tops.into_iter().zip(entries) {
        let covered = wanted
            .keys()
            .filter(|p| p.starts_with(top.as_str()))
            .count();
        let pages = n.div_ceil(PAGE).max(1);
        let saved = covered.saturating_sub(pages);
        if saved > 0 && best.as_ref().is_none_or(|(s, _)| saved > *s) {
            best = Some((saved, Plan::Tree { top, pages }));
        }
    }
    Some(best.map_or_else(|| Plan::Dir(oldest.clone()), |(_, p)| p))
}

/// What the refresher reports (`hoardfs stats`, the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RefreshStats {
    /// Listings trusted without asking the store.
    pub ttl: Duration,
    /// Listings served stale up to this age while listed again.
    pub max_stale: Duration,
    /// Background requests allowed per second.
    pub rate_limit: f64,
    /// Listing requests this origin sent (readers' and the refresher's), in all.
    pub list_requests: u64,
    /// Listing requests per second over the last window (about ten seconds).
    pub list_rate: f64,
    /// Listings served past their TTL, in all.
    pub stale_served: u64,
    /// The oldest listing served in the last window (zero: none past its TTL).
    pub max_age_served: Duration,
    /// Readers that waited for the store because their listing was older than the bound.
    pub waited: u64,
    /// Directories listed again in the background, in all.
    pub refreshed: u64,
    /// Background requests that failed.
    pub failures: u64,
    /// Directories waiting to be listed again.
    pub queued: usize,
}

/// What the threads use to list (the origin's parts).
pub struct Parts {
    /// The store.
    pub client: Arc<S3Client>,
    /// Paths ↔ keys.
    pub location: S3Location,
    /// The listings kept.
    pub listings: Arc<Listings>,
    /// What clients were told of files.
    pub table: Arc<NodeTable>,
    /// Where changes go (a tier's subscribers).
    pub sink: Arc<Mutex<Option<BreakSink>>>,
    /// Set when the origin is dropped.
    pub stop: Arc<AtomicBool>,
}

#[derive(Default)]
struct Queue {
    /// Directory prefix → when its listing was made.
    wanted: HashMap<String, Option<Instant>>,
    /// Being listed now.
    busy: HashSet<String>,
    /// The rate limit: no request before then.
    next_send: Option<Instant>,
    /// A batch begun: no plan before then (`GATHER`).
    ready_at: Option<Instant>,
    /// When the listings in use were last looked over.
    last_sweep: Option<Instant>,
    /// The current reporting window: its start, the request count then, the oldest
    /// listing served in it.
    window: Option<(Instant, u64, Duration)>,
    /// The previous window's rate and oldest listing served.
    last_window: (f64, Duration),
}

/// What a refresher thread does next.
enum Step {
    /// Send this request.
    Plan(Plan),
    /// Nothing queued: look over the listings in use.
    Idle,
    /// The origin is gone.
    Stop,
}

struct Inner {
    parts: Parts,
    queue: Mutex<Queue>,
    wake: Condvar,
    rate: f64,
    ttl: Duration,
    max_stale: Duration,
    stale_served: AtomicU64,
    /// The threads were started.
    started: AtomicBool,
    waited: AtomicU64,
    refreshed: AtomicU64,
    failures: AtomicU64,
}

/// The background refresher of one origin's listings; see the module docs.
pub struct Refresher {
    inner: Arc<Inner>,
}

impl Refresher {
    /// A refresher over `parts` sending at most `rate` requests per second (threads start
    /// with the first directory queued).
    pub fn new(parts: Parts, ttl: Duration, max_stale: Duration, rate: f64) -> Refresher {
        Refresher {
            inner: Arc::new(Inner {
                parts,
                queue: Mutex::default(),
                wake: Condvar::new(),
                rate: if rate.is_finite() && rate > 0.0 {
                    rate
                } else {
                    1.0
                },
                ttl,
                max_stale,
                stale_served: AtomicU64::new(0),
                started: AtomicBool::new(false),
                waited: AtomicU64::new(0),
                refreshed: AtomicU64::new(0),
                failures: AtomicU64::new(0),
            }),
        }
    }

    /// A listing of `prefix` made `age` ago was served past its TTL: list it again.
    pub fn served_stale(&self, prefix: &str, age: Duration) {
        let inner = &self.inner;
        inner.stale_served.fetch_add(1, Relaxed);
        let listed = inner.parts.listings.listed_at(prefix);
        let mut q = inner.queue.lock();
        inner.roll_window(&mut q);
        if let Some((_, _, oldest)) = &mut q.window {
            *oldest = (*oldest).max(age);
        }
        if q.wanted.contains_key(prefix) || q.busy.contains(prefix) {
            return;
        }
        if q.wanted.len() >= MAX_QUEUED {
            return;
        }
        if q.wanted.is_empty() {
            q.ready_at = Some(Instant::now() + GATHER);
        }
        q.wanted.insert(prefix.to_string(), listed);
        drop(q);
        self.start();
        inner.wake.notify_one();
    }

    /// A listing was answered from (fresh): from now on the listings in use are kept
    /// younger than the bound, so the threads are started (once).
    pub fn answered(&self) {
        if !self.inner.started.load(Relaxed) {
            self.start();
        }
    }

    /// Starts the threads unless they run.
    fn start(&self) {
        if self.inner.started.swap(true, Relaxed) {
            return;
        }
        for i in 0..THREADS {
            let inner = self.inner.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("s3-refresh-{i}"))
                .spawn(move || inner.run());
            if let Err(e) = spawned {
                tracing::warn!("cannot start a listing refresher: {e}");
            }
        }
    }

    /// A reader waited for the store: its listing was older than the bound.
    pub fn waited(&self) {
        self.inner.waited.fetch_add(1, Relaxed);
    }

    /// What has been done so far.
    pub fn stats(&self) -> RefreshStats {
        let inner = &self.inner;
        let mut q = inner.queue.lock();
        inner.roll_window(&mut q);
        let (list_rate, older) = q.last_window;
        let current = q.window.map_or(Duration::ZERO, |w| w.2);
        RefreshStats {
            ttl: inner.ttl,
            max_stale: inner.max_stale,
            rate_limit: inner.rate,
            list_requests: inner.parts.client.list_requests(),
            list_rate,
            stale_served: inner.stale_served.load(Relaxed),
            max_age_served: older.max(current),
            waited: inner.waited.load(Relaxed),
            refreshed: inner.refreshed.load(Relaxed),
            failures: inner.failures.load(Relaxed),
            queued: q.wanted.len() + q.busy.len(),
        }
    }
}

impl Inner {
    /// Starts a new reporting window once the current one is over.
    fn roll_window(&self, q: &mut Queue) {
        let now = Instant::now();
        let lists = self.parts.client.list_requests();
        match q.window {
            Some((start, at_start, oldest)) if now.duration_since(start) >= WINDOW => {
                let secs = now.duration_since(start).as_secs_f64();
                q.last_window = ((lists - at_start) as f64 / secs, oldest);
                q.window = Some((now, lists, Duration::ZERO));
            }
            Some(_) => {}
            None => q.window = Some((now, lists, Duration::ZERO)),
        }
    }

    /// A thread: takes the next plan (waiting for the rate limit), lists, repeats.
    fn run(&self) {
        loop {
            let plan = match self.next() {
                Step::Stop => return,
                Step::Idle => {
                    self.sweep();
                    continue;
                }
                Step::Plan(p) => p,
            };
            self.list(&plan);
            self.queue.lock().busy.retain(|p| !plan.covers(p));
            if matches!(plan, Plan::Tree { .. }) {
                self.forget_relisted();
            }
        }
    }

    /// Drops from the queue the directories listed since they were queued (by a listing
    /// of their subtree that was under way when they were served stale).
    fn forget_relisted(&self) {
        let queued: Vec<(String, Option<Instant>)> = {
            let q = self.queue.lock();
            q.wanted.iter().map(|(p, at)| (p.clone(), *at)).collect()
        };
        let listings = &self.parts.listings;
        let relisted: Vec<String> = queued
            .into_iter()
            .filter(|(p, at)| listings.listed_at(p) != *at)
            .map(|(p, _)| p)
            .collect();
        let mut q = self.queue.lock();
        for p in relisted {
            q.wanted.remove(&p);
        }
    }

    /// Queues the directories in use (answered from within [`KEEP_FRESH`]) whose listing
    /// is past half the staleness bound, so that a reader coming back to them finds them
    /// younger than the bound. Not when nothing is answered from past the TTL (a bound no
    /// longer than the TTL): there, readers ask the store.
    fn sweep(&self) {
        let now = Instant::now();
        if self.max_stale <= self.ttl {
            return;
        }
        {
            let mut q = self.queue.lock();
            if q.last_sweep.is_some_and(|t| now.duration_since(t) < SWEEP) {
                return;
            }
            q.last_sweep = Some(now);
        }
        let age = (self.max_stale / 2).max(self.ttl);
        let (Some(used_since), Some(listed_before)) =
            (now.checked_sub(KEEP_FRESH), now.checked_sub(age))
        else {
            return;
        };
        let due = self.parts.listings.due(used_since, listed_before);
        if due.is_empty() {
            return;
        }
        let mut q = self.queue.lock();
        if q.wanted.is_empty() {
            q.ready_at = Some(now + GATHER);
        }
        for (p, at) in due {
            if q.wanted.len() >= MAX_QUEUED {
                break;
            }
            if !q.busy.contains(&p) {
                q.wanted.entry(p).or_insert(at);
            }
        }
        drop(q);
        self.wake.notify_all();
    }

    /// The next request to send, once the rate limit allows; `Idle` after a while with
    /// nothing to send.
    fn next(&self) -> Step {
        let mut q = self.queue.lock();
        loop {
            if self.parts.stop.load(Relaxed) {
                return Step::Stop;
            }
            let now = Instant::now();
            let not_before = q.next_send.max(q.ready_at);
            if let Some(t) = not_before.filter(|t| *t > now) {
                self.wake
                    .wait_for(&mut q, (t - now).min(Duration::from_millis(200)));
                continue;
            }
            if q.wanted.is_empty() {
                self.wake.wait_for(&mut q, SWEEP);
                return Step::Idle;
            }
            let root = self.parts.location.dir_prefix("");
            let listings = &self.parts.listings;
            let Some(plan) = plan(&q.wanted, &root, |tops| listings.entries_under(tops)) else {
                return Step::Idle;
            };
            let taken: Vec<String> = q
                .wanted
                .keys()
                .filter(|p| plan.covers(p))
                .cloned()
                .collect();
            for p in taken {
                q.wanted.remove(&p);
                q.busy.insert(p);
            }
            let cost = Duration::from_secs_f64(plan.pages() as f64 / self.rate);
            q.next_send = Some(q.next_send.map_or(now, |t| t.max(now)) + cost);
            return Step::Plan(plan);
        }
    }

    /// Sends `plan`'s request (the changes it finds are reported by the relister).
    fn list(&self, plan: &Plan) {
        let sink = self.parts.sink.lock().clone();
        let relister = Relister {
            client: &self.parts.client,
            location: &self.parts.location,
            listings: &self.parts.listings,
            table: &self.parts.table,
            sink: sink.as_ref(),
        };
        match carry_out(&relister, plan) {
            Ok(n) => {
                self.refreshed.fetch_add(n as u64, Relaxed);
            }
            Err(e) => {
                self.failures.fetch_add(1, Relaxed);
                tracing::debug!("listing {plan:?} again: {e}");
            }
        }
    }
}

/// Sends `plan`'s request through `relister` (which reports what changed); returns the
/// number of directories listed.
pub fn carry_out(relister: &Relister<'_>, plan: &Plan) -> S3Result<usize> {
    let path_of = |prefix: &str| relister.location.dir_path(prefix).unwrap_or_default();
    match plan {
        Plan::Dir(p) => relister.relist(&path_of(p)).map(|_| 1),
        // (No time budget: nobody waits on it.)
        Plan::Tree { top, pages } => {
            relister.relist_tree(&path_of(top), None, (pages + 1) * PAGE, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted(ps: &[&str]) -> HashMap<String, Option<Instant>> {
        let t0 = Instant::now();
        ps.iter()
            .enumerate()
            .map(|(i, p)| (p.to_string(), Some(t0 + Duration::from_millis(i as u64))))
            .collect()
    }

    #[test]
    fn one_listing_of_a_subtree_replaces_many_of_its_directories() {
        // Three small directories under d/: one page of d/ lists them all.
        let w = wanted(&["r/d/a/", "r/d/b/", "r/d/c/"]);
        let p = plan(&w, "r/", |tops| {
            assert_eq!(tops, ["r/d/a/", "r/d/", "r/"]);
            vec![20, 63, 70]
        });
        assert_eq!(
            p,
            Some(Plan::Tree {
                top: "r/d/".into(),
                pages: 1
            })
        );
        assert!(p.unwrap().covers("r/d/b/"));
        // Large directories: a page per 1,000 keys costs more than one listing each.
        let p = plan(&w, "r/", |_| vec![900, 3000, 3100]);
        assert_eq!(p, Some(Plan::Dir("r/d/a/".into())), "the oldest alone");
        // One directory: its own listing.
        let p = plan(&wanted(&["r/x/"]), "r/", |_| vec![5, 5]);
        assert_eq!(p, Some(Plan::Dir("r/x/".into())));
        // The root itself (an empty prefix) has no ancestors.
        let p = plan(&wanted(&[""]), "", |tops| {
            assert_eq!(tops, [""]);
            vec![10]
        });
        assert_eq!(p, Some(Plan::Dir(String::new())));
        assert_eq!(plan(&HashMap::new(), "", |_| vec![]), None);
    }

    #[test]
    fn the_oldest_listing_is_planned_first() {
        let t0 = Instant::now();
        let w: HashMap<String, Option<Instant>> = [
            ("a/".to_string(), Some(t0)),
            ("b/".to_string(), None),
            ("c/".to_string(), Some(t0 + Duration::from_secs(1))),
        ]
        .into();
        // Far apart and large: one at a time, out-of-date first.
        assert_eq!(
            plan(&w, "", |t| vec![5000; t.len()]),
            Some(Plan::Dir("b/".into()))
        );
    }
}
