//! Callbacks on the client: which cached attributes and names the origin has promised to
//! report changes to, and what happens when it does (a *break*).
//!
//! While a node holds a valid callback, its attributes are answered from memory and opens
//! skip the version round trip; the kernel is given long timeouts and is told explicitly
//! (through a [`KernelNotifier`]) when a break arrives. Breaks are handled on a dedicated
//! thread, never on the origin's reader thread: a kernel invalidation may wait for a
//! directory lock held by a request that itself waits for the reader.
//!
//! Race rule: a reply may be overtaken by a break for the same object (the server sends
//! breaks as changes happen). The [`BreakLog`] numbers breaks as they arrive; a caller notes
//! the number before sending a request and grants the callback only if no break for that
//! object arrived since (checked under the node's lock, which the break handler also takes,
//! so a break handled after the check clears what the check granted).
//!
//! Applying a break lags behind its arrival (it is queued for the callback thread). A
//! caller about to trust a callback first waits until every break that arrived before
//! it has been applied ([`Callbacks::caught_up`]): a break sent before a reply this
//! client already acted on (another client's write, then its unlink of a lock file this
//! client's `O_EXCL` create then won) must not be overtaken by the next open, which would
//! otherwise read the version from before that write (close-to-open).
//!
//! [`Callbacks`] is the subscription as the superblock holds it: whether the origin holds
//! callbacks at all, the break numbers to note, whether a reply may grant one, and how
//! far the callback thread has applied them; its [`BreakQueue`] feeds the callback thread,
//! which hands each batch to a `BreakApplier` (the rules of what each kind of break
//! changes).
//!
//! Locks: the log and the applied mark are leaves; nobody waits on the applied mark while
//! holding a node's lock (the callback thread takes node locks), and the wait is bounded.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use hoardfs_origin::{Break, Origin};
use parking_lot::{Condvar, Mutex};

use crate::nodes::NodeTable;

use crate::Ino;
use crate::offline::state::OfflineWrites;
use crate::trees::TreeAhead;
use crate::{FsError, FsResult, error};

/// Tells the kernel to drop what it cached (implemented by the FUSE bridge).
pub trait KernelNotifier: Send + Sync {
    /// Attributes (and, for files, page-cache data) of `ino` are out of date.
    fn inval_inode(&self, ino: Ino);
    /// Only the attributes of `ino` are out of date.
    fn inval_attr(&self, ino: Ino);
    /// The dentry `name` in directory `parent` is out of date.
    fn inval_entry(&self, parent: Ino, name: &[u8]);
}

/// The origin's callbacks as the fs uses them.
pub(crate) struct Callbacks {
    /// Whether the origin reports changes (holds callbacks) at all.
    held: bool,
    log: Arc<BreakLog>,
    applied: Arc<Applied>,
}

/// How long a caller waits for the callback thread to apply the breaks that arrived
/// before it; beyond, it asks the origin instead of trusting a callback.
const CATCH_UP_WAIT: Duration = Duration::from_millis(100);

/// A batch of breaks on its way to the callback thread, with its number in the log
/// (`None`: the `Break::All` that stands for breaks dropped past the backlog's bound,
/// which covers everything that arrived before the thread takes it).
type Batch = (Option<u64>, Vec<Break>);

/// The number of the last batch of breaks the callback thread applied. Lock: a leaf.
#[derive(Default)]
struct Applied {
    through: Mutex<u64>,
    moved: Condvar,
}

impl Applied {
    fn advance(&self, seq: u64) {
        let mut g = self.through.lock();
        if seq > *g {
            *g = seq;
            self.moved.notify_all();
        }
    }

    /// Whether batch `seq` is applied, waiting up to `wait` for it.
    fn wait_for(&self, seq: u64, wait: Duration) -> bool {
        let mut g = self.through.lock();
        let deadline = std::time::Instant::now() + wait;
        while *g < seq {
            if self.moved.wait_until(&mut g, deadline).timed_out() {
                return *g >= seq;
            }
        }
        true
    }
}

impl Callbacks {
    /// Subscribes to `origin`'s breaks: each is numbered in the log as it arrives and
    /// queued (bounded by a [`Backlog`]) for the callback thread, which the returned
    /// [`BreakQueue`] starts.
    pub(crate) fn subscribe(origin: &dyn Origin) -> (Callbacks, BreakQueue) {
        let log = Arc::new(BreakLog::default());
        let applied = Arc::new(Applied::default());
        let (tx, rx) = mpsc::channel::<Batch>();
        let backlog = Arc::new(Backlog::default());
        let (logged, queued) = (log.clone(), backlog.clone());
        let held = origin.subscribe(Arc::new(move |b| {
            let seq = logged.record(&b);
            if let Some((whole, b)) = queued.admit(b) {
                let _ = tx.send((whole.then_some(seq), b));
            }
        }));
        let queue = BreakQueue {
            rx,
            backlog,
            log: log.clone(),
            applied: applied.clone(),
        };
        (Callbacks { held, log, applied }, queue)
    }

    /// Whether every break that arrived so far has been applied, waiting a little for the
    /// callback thread if not (see the module docs). `false`: do not trust a callback now.
    pub(crate) fn caught_up(&self) -> bool {
        !self.held || self.applied.wait_for(self.log.seq(), CATCH_UP_WAIT)
    }

    /// Whether the origin holds callbacks (changes are pushed, TTLs can be long).
    pub(crate) fn held(&self) -> bool {
        self.held
    }

    /// Records a `Break::All` that no origin sent: nothing known before this moment may
    /// be granted a callback (used for a namespace restored from disk).
    pub(crate) fn presume_all_broken(&self) {
        // Nothing to apply: recorded as applied at once.
        let seq = self.log.record(&[Break::All]);
        self.applied.advance(seq);
    }

    /// Number of breaks received so far: noted before a request, for [`Callbacks::grants`].
    pub(crate) fn seq(&self) -> u64 {
        self.log.seq()
    }

    /// Whether a reply about `file_id` to a request sent after break number `since` comes
    /// with a callback.
    pub(crate) fn grants(&self, file_id: u64, since: u64) -> bool {
        self.held && !self.log.broken_since(file_id, since)
    }
}

/// The breaks on their way to the callback thread.
pub(crate) struct BreakQueue {
    rx: mpsc::Receiver<Batch>,
    backlog: Arc<Backlog>,
    log: Arc<BreakLog>,
    applied: Arc<Applied>,
}

impl BreakQueue {
    /// Starts the callback thread, which hands each batch of breaks to `apply` (the
    /// superblock's `apply_breaks`) until it answers `false` (the superblock is gone).
    pub(crate) fn spawn(self, apply: impl Fn(Vec<Break>) -> bool + Send + 'static) -> FsResult<()> {
        let BreakQueue {
            rx,
            backlog,
            log,
            applied,
        } = self;
        std::thread::Builder::new()
            .name("hoardfs-callbacks".into())
            .spawn(move || {
                while let Ok((seq, b)) = rx.recv() {
                    // The overflow `Break::All` covers everything that arrived so far.
                    let seq = seq.unwrap_or_else(|| log.seq());
                    backlog.taken(&b);
                    if !apply(b) {
                        return;
                    }
                    applied.advance(seq);
                }
            })
            .map_err(|e| FsError::Thread {
                what: "callback",
                source: error::Shared::new(e),
            })?;
        Ok(())
    }
}

/// Breaks remembered individually; older ones are summarised by a horizon.
const LOG_CAP: usize = 1 << 16;

/// Breaks waiting for the callback thread at most; beyond, they are summarised by one
/// `Break::All`.
const BACKLOG_CAP: usize = 1 << 16;

/// Bounds the breaks queued for the callback thread: an origin that sends breaks faster
/// than they are applied (a flood of `Break::All`, each of which invalidates every node)
/// must not make the queue grow without bound. Past [`BACKLOG_CAP`] one `Break::All` is
/// queued and further breaks are dropped until the thread takes a `Break::All` off the
/// queue: that one is applied after every dropped break arrived, and covers them.
#[derive(Default)]
struct Backlog {
    queued: AtomicUsize,
    overflowed: AtomicBool,
}

impl Backlog {
    /// What to queue for breaks `b` as they arrive: `b` (`true`: as itself), or past the
    /// bound one `Break::All` (the first time; `false`: standing for what is dropped) or
    /// nothing.
    pub(crate) fn admit(&self, b: Vec<Break>) -> Option<(bool, Vec<Break>)> {
        // An empty batch still costs a queue slot: count it as one.
        let n = b.len().max(1);
        if self.queued.fetch_add(n, Ordering::SeqCst) + n <= BACKLOG_CAP {
            return Some((true, b));
        }
        self.queued.fetch_sub(n, Ordering::SeqCst);
        if self.overflowed.swap(true, Ordering::SeqCst) {
            return None;
        }
        tracing::warn!("the origin sends breaks faster than they are applied: breaking everything");
        self.queued.fetch_add(1, Ordering::SeqCst);
        Some((false, vec![Break::All]))
    }

    /// The callback thread took `b` off the queue (before applying it).
    pub(crate) fn taken(&self, b: &[Break]) {
        if b.contains(&Break::All) {
            self.overflowed.store(false, Ordering::SeqCst);
        }
        self.queued.fetch_sub(b.len().max(1), Ordering::SeqCst);
    }
}

/// Numbered record of recent breaks; see the module docs. Lock: a leaf.
#[derive(Default)]
struct BreakLog {
    inner: Mutex<LogInner>,
}

#[derive(Default)]
struct LogInner {
    seq: u64,
    /// Sequence number of the last `Break::All`.
    all_at: u64,
    /// Latest break per object.
    recent: HashMap<u64, u64>,
    /// `(file id, break number)` of every note, oldest first, at most `LOG_CAP`.
    order: VecDeque<(u64, u64)>,
    /// Breaks at or below this number were forgotten: treat them as touching everything.
    horizon: u64,
}

impl BreakLog {
    /// Number of breaks received so far.
    pub(crate) fn seq(&self) -> u64 {
        self.inner.lock().seq
    }

    /// Records breaks as they arrive (on the origin's thread, in order with replies);
    /// returns their number.
    pub(crate) fn record(&self, breaks: &[Break]) -> u64 {
        let mut g = self.inner.lock();
        g.seq += 1;
        let seq = g.seq;
        for b in breaks {
            match b {
                Break::Attr { file_id, .. } => g.note(*file_id, seq),
                Break::Entry {
                    dir_id, file_id, ..
                } => {
                    g.note(*dir_id, seq);
                    if let Some(f) = file_id {
                        g.note(*f, seq);
                    }
                }
                Break::All => g.all_at = seq,
            }
        }
        seq
    }

    /// Whether a break touching `file_id` arrived after `since`.
    pub(crate) fn broken_since(&self, file_id: u64, since: u64) -> bool {
        let g = self.inner.lock();
        g.all_at > since || g.horizon > since || g.recent.get(&file_id).is_some_and(|&s| s > since)
    }
}

impl LogInner {
    fn note(&mut self, file_id: u64, seq: u64) {
        self.recent.insert(file_id, seq);
        self.order.push_back((file_id, seq));
        while self.order.len() > LOG_CAP {
            let Some((f, s)) = self.order.pop_front() else {
                break;
            };
            self.horizon = self.horizon.max(s);
            if self.recent.get(&f) == Some(&s) {
                self.recent.remove(&f);
            }
        }
    }
}

/// What a break changes: the nodes' freshness and names, the listings read ahead, the
/// breaks the offline log puts off, and the kernel's copies (through the notifier, once
/// the session has one). Borrowed from the file system for one batch of breaks.
pub(crate) struct BreakApplier<'a> {
    nodes: &'a NodeTable,
    trees: &'a TreeAhead,
    offline: Option<&'a OfflineWrites>,
    notifier: Option<&'a dyn KernelNotifier>,
}

impl<'a> BreakApplier<'a> {
    /// An applier over these parts of a file system.
    pub(crate) fn new(
        nodes: &'a NodeTable,
        trees: &'a TreeAhead,
        offline: Option<&'a OfflineWrites>,
        notifier: Option<&'a dyn KernelNotifier>,
    ) -> Self {
        BreakApplier {
            nodes,
            trees,
            offline,
            notifier,
        }
    }

    /// Applies one batch of breaks, in order.
    pub(crate) fn apply(&self, breaks: Vec<Break>) {
        for b in breaks {
            match b {
                Break::Attr { file_id, change_id } => self.attr(file_id, change_id),
                Break::Entry {
                    dir_id,
                    name,
                    file_id,
                } => self.entry(dir_id, &name, file_id),
                Break::All => {
                    self.trees.forget_all();
                    self.all()
                }
            }
        }
    }

    /// While the offline log holds changes to names (see `entry`).
    fn names_pending(&self) -> bool {
        self.offline.is_some_and(|o| o.log.names_pending())
    }

    /// The attributes (and maybe the content) of `file_id` changed to `change_id`: unless
    /// this client already holds them under a callback (typically its own change coming
    /// back), they expire with any listing, and the kernel drops its copy.
    fn attr(&self, file_id: u64, change_id: u64) {
        let Some(node) = self.nodes.by_file_id(file_id) else {
            return;
        };
        {
            let mut st = node.state.lock();
            if st.has_callback() && hoardfs_proto::change_id(&st.attr()) == change_id {
                return;
            }
            st.contents_changed();
        }
        if let Some(n) = self.notifier {
            n.inval_inode(node.ino);
        }
    }

    /// Name `name` of directory `dir_id` now refers to `file_id` (`None`: nothing). If the
    /// client knew otherwise, the object that lost the name expires (its link count and
    /// ctime changed), the directory forgets the name, drops its listing and expires, and
    /// the kernel drops the dentry and its cached listing; while names wait to be sent
    /// back, only the directory expires.
    fn entry(&self, dir_id: u64, name: &[u8], file_id: Option<u64>) {
        let Some(dir) = self.nodes.by_file_id(dir_id) else {
            return;
        };
        // (The directory's lock is released before the table's is taken.)
        let child = dir.state.lock().child(name);
        let child = child.and_then(|c| self.nodes.get(c));
        let known = child.as_ref().map(|c| c.state.lock().attr().file_id);
        if known == file_id {
            return;
        }
        // While the log holds changes to names, this client's view of names is its own
        // (`crate::offline::names`), and the break may be the server's report of a name
        // being sent back right now (its node has this client's id until the reply is
        // in): the name stays. The directory expires (its listing kept), and the break
        // is applied once names no longer wait (`HoardFs::settle_names`).
        if self.names_pending() {
            // (The object that lost the name still expires, unless it is one of the
            // log's: its attributes are the server's to tell.)
            if let Some(c) = &child {
                let mut st = c.state.lock();
                let ours = st.attr().file_id & crate::offline::made::LOCAL_ID != 0;
                if !st.has_change() && !ours {
                    st.expire();
                    drop(st);
                    if let Some(n) = self.notifier {
                        n.inval_attr(c.ino);
                    }
                }
            }
            dir.state.lock().expire();
            if let Some(off) = self.offline {
                off.skip(Break::Entry {
                    dir_id,
                    name: name.to_vec(),
                    file_id,
                });
            }
            return;
        }
        if let Some(c) = &child {
            c.state.lock().expire();
            if let Some(n) = self.notifier {
                n.inval_attr(c.ino);
            }
        }
        {
            let mut st = dir.state.lock();
            st.remove_child(name);
            st.contents_changed();
        }
        if let Some(n) = self.notifier {
            n.inval_entry(dir.ino, name);
            // The kernel's copy of the listing (FOPEN_CACHE_DIR) too.
            n.inval_inode(dir.ino);
        }
    }

    /// Every callback is gone (the origin lost track, or the connection): every node
    /// expires, and the kernel drops every inode and name. Listings stay (expired) so
    /// they can be served while offline.
    fn all(&self) {
        let nodes = self.nodes.all();
        for node in &nodes {
            node.state.lock().expire();
        }
        let Some(n) = self.notifier else {
            return;
        };
        for node in &nodes {
            n.inval_inode(node.ino);
            let (parent, name) = {
                let st = node.state.lock();
                (st.parent(), st.name().to_vec())
            };
            if !name.is_empty() {
                n.inval_entry(parent, &name);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::BreakLog;
    use hoardfs_origin::Break;

    #[test]
    fn log_tells_which_replies_were_overtaken() {
        let log = BreakLog::default();
        let before = log.seq();
        log.record(&[Break::Attr {
            file_id: 7,
            change_id: 1,
        }]);
        assert!(log.broken_since(7, before));
        assert!(!log.broken_since(8, before));
        assert!(!log.broken_since(7, log.seq()));
        let before = log.seq();
        log.record(&[Break::Entry {
            dir_id: 1,
            name: b"x".to_vec(),
            file_id: Some(9),
        }]);
        assert!(log.broken_since(1, before) && log.broken_since(9, before));
        let before = log.seq();
        log.record(&[Break::All]);
        assert!(log.broken_since(12345, before));
    }

    #[test]
    fn the_backlog_is_bounded_and_summarised_by_one_break_all() {
        use super::{BACKLOG_CAP, Backlog};
        let attr = |file_id| Break::Attr {
            file_id,
            change_id: 0,
        };
        let b = Backlog::default();
        let mut queue = Vec::new();
        for i in 0..BACKLOG_CAP as u64 * 4 {
            queue.extend(b.admit(vec![attr(i)]));
        }
        assert_eq!(queue.len(), BACKLOG_CAP + 1);
        assert_eq!(queue.last(), Some(&(false, vec![Break::All])));
        assert!(queue[..BACKLOG_CAP].iter().all(|(whole, _)| *whole));
        // Until the Break::All is taken, breaks are dropped; then queued again.
        for (_, q) in &queue[..BACKLOG_CAP] {
            b.taken(q);
        }
        assert_eq!(b.admit(vec![attr(1)]), Some((true, vec![attr(1)])));
        assert_eq!(
            b.admit(vec![attr(2); BACKLOG_CAP]),
            None,
            "still overflowed"
        );
        b.taken(&queue[BACKLOG_CAP].1);
        assert_eq!(b.admit(vec![attr(3)]), Some((true, vec![attr(3)])));
    }

    #[test]
    fn a_caller_waits_until_the_breaks_that_arrived_before_it_are_applied() {
        use super::Applied;
        use std::time::Duration;
        let applied = std::sync::Arc::new(Applied::default());
        assert!(applied.wait_for(0, Duration::ZERO), "nothing arrived yet");
        assert!(
            !applied.wait_for(2, Duration::from_millis(20)),
            "not applied: gives up"
        );
        let a = applied.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            a.advance(1);
            std::thread::sleep(Duration::from_millis(30));
            a.advance(2);
        });
        assert!(
            applied.wait_for(2, Duration::from_secs(10)),
            "applied: waited for"
        );
        applied.advance(1);
        assert!(applied.wait_for(2, Duration::ZERO), "never moves back");
        t.join().unwrap();
    }

    #[test]
    fn forgotten_breaks_count_as_touching_everything() {
        let log = BreakLog::default();
        let before = log.seq();
        for i in 0..(super::LOG_CAP as u64 + 10) {
            log.record(&[Break::Attr {
                file_id: i,
                change_id: 0,
            }]);
        }
        assert!(log.broken_since(u64::MAX, before));
        assert!(!log.broken_since(u64::MAX, log.seq()));
    }
}
