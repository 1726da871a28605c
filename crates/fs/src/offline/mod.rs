//! Disconnected operation (`--offline-writes`): the changes made while the origin is
//! unreachable, kept in a log in the cache directory and sent back once it answers.
//!
//! - the log and its state, below the superblock: [`state`] (`OfflineWrites`: the log of
//!   one mount and what the file system asks of it), [`cml`] (the client modify log: a
//!   `Pending` change per object, its durable [`cml::record`] and staging file), [`made`]
//!   (ids and attributes of objects made offline), [`log_view`] (a restored namespace
//!   made to agree with the log), [`lister`] (directories used by path, listed in the
//!   background so that they can take offline names);
//! - the changes themselves, above it: [`staged`] (a file's content change) and [`names`]
//!   (changes to names and attributes);
//! - [`reintegrate`]: sending the changes back (the scheduler, each change's steps, the
//!   uploads and the names of conflict copies).
//!
//! The operation families (`namespace`, `write`, `read`) reach the log through one door,
//! [`Offline`]: each operation chooses its route in one call. The superblock answers only
//! what lookups and listings need of the log (`pending_of`, `names_pending`).
//!
//! Imports: the files below the superblock never import it (nor anything above it), and
//! files here import each other by path (`super::state::…`), not through this module,
//! which only the operation families above import, so that the crate's modules form no
//! circle through it.

pub(crate) mod cml;
pub(crate) mod lister;
pub(crate) mod log_view;
pub(crate) mod made;
pub(crate) mod names;
pub(crate) mod reintegrate;
pub(crate) mod staged;
pub(crate) mod state;

use crate::nodes::Node;
use crate::superblock::Superblock;
use crate::{FsError, FsResult};
use names::OfflineNames;
use staged::Staged;
use state::{NAMES_WAIT, OfflineWrites, SENT_BEHIND};

/// The door the operation families go through to the log: "logged or online?" for each
/// change, in one call (`online_or_logged` for names and attributes, `online_or_staged`
/// for a file's content), and the log's changes of an object. Borrowed for one
/// operation (`Offline::of`).
pub(crate) struct Offline<'a> {
    sb: &'a Superblock,
}

impl<'a> Offline<'a> {
    /// The log of the mount `sb` (perhaps none: then every route is the origin's).
    pub(crate) fn of(sb: &'a Superblock) -> Self {
        Offline { sb }
    }

    fn writes(&self) -> Option<&'a OfflineWrites> {
        self.sb.offline_writes()
    }

    /// The changes to names of the change log (`None` when no log is open). A log is open
    /// also on a mount without `--offline-writes` that still sends back an earlier
    /// mount's changes: its operations then refuse new changes (`keeps_new`), except that
    /// a removal may cancel or replace a logged one.
    pub(crate) fn names(&self) -> Option<OfflineNames<'a>> {
        self.writes().map(|off| OfflineNames::new(self.sb, off))
    }

    /// Whether new changes to names go to the log: offline writes are on and the log
    /// still holds changes to names (they reach the origin first, in order).
    pub(crate) fn names_logged(&self) -> bool {
        self.writes()
            .is_some_and(|o| o.keeps_new() && o.log.names_pending())
    }

    /// Whether changes to names and attributes go to the log first, whatever the
    /// origin's state (`--write-back=async`: the mount's keeper sends them within a
    /// second).
    pub(crate) fn logs_first(&self) -> bool {
        self.sb.config().write_back == crate::WriteBack::Async
            && self.writes().is_some_and(|o| o.keeps_new())
    }

    /// Before a change to names in directory `dir` goes to the log first: the log makes
    /// and removes names only where it holds the directory's listing (it proves a name
    /// free), so a directory not listed yet is listed now, once (otherwise the change
    /// would go to the origin, and while names wait, could not be made at all).
    pub(crate) fn listed_for_log(&self, dir: crate::Ino) {
        if !self.logs_first() {
            return;
        }
        let listed = self
            .sb
            .node(dir)
            .is_ok_and(|n| n.state.lock().last_listing().is_some());
        if !listed && let Err(e) = self.sb.listing(dir) {
            tracing::debug!(dir, "not listed for --write-back=async: {e}");
        }
    }

    /// An operation the log cannot take must follow its changes to names: `Offline`
    /// while they are not on the origin yet. (They are not sent from here: the kernel
    /// holds directories locked for the operation, and sending them back tells it to drop
    /// names, which takes those locks. The mount's keeper sends them within a second.)
    pub(crate) fn names_sent(&self) -> FsResult<()> {
        if self.names_logged() {
            return Err(FsError::Offline(NAMES_WAIT.into()));
        }
        Ok(())
    }

    /// Whether the log holds a change of `node`'s object (content, name or attributes):
    /// until it is sent back, the object is the log's, connected or not.
    pub(crate) fn owns(&self, node: &Node) -> bool {
        self.sb.pending_of(node).is_some()
    }

    /// Whether the log holds changes of objects inside directory node `ino` (a move of
    /// the directory must then go through the log, for them to follow it).
    pub(crate) fn owns_inside(&self, ino: crate::Ino) -> bool {
        self.names().is_some_and(|n| n.changes_inside(ino))
    }

    /// `node`'s file whose content is staged here (reads, writes, opens and syncs go to
    /// the staging file), if any.
    pub(crate) fn staged(&self, node: &Node) -> Option<Staged<'a>> {
        self.sb
            .staged_change_of(node)
            .map(|p| Staged::new(self.sb, p))
    }

    /// Runs `logged` over the changes to names of the change log, for an operation the
    /// origin failed with `why` or that must follow the log (`why` says which); with no
    /// log open it fails with `Offline(why)`, as the origin did.
    pub(crate) fn logged<T>(
        &self,
        why: String,
        logged: impl FnOnce(OfflineNames<'a>, String) -> FsResult<T>,
    ) -> FsResult<T> {
        match self.names() {
            Some(names) => logged(names, why),
            None => Err(FsError::Offline(why)),
        }
    }

    /// The route of a change to names (or an object's attributes): to the log first when
    /// it must follow the log's changes to names (`names_logged`) or touches objects the
    /// log `owns`; when the log declines one it does not own (it could not take it, or
    /// its change was sent back meanwhile), to the origin once the names are sent. Then
    /// `online`, and to the log after all when the origin is unreachable.
    pub(crate) fn online_or_logged<T>(
        &self,
        owned: bool,
        online: impl FnOnce() -> FsResult<T>,
        logged: impl Fn(OfflineNames<'a>, String) -> FsResult<T>,
    ) -> FsResult<T> {
        if owned || self.names_logged() || self.logs_first() {
            let why = if owned {
                "the change is not on the server yet"
            } else if self.names_logged() {
                NAMES_WAIT
            } else {
                SENT_BEHIND
            };
            match self.logged(why.into(), &logged) {
                Err(FsError::Offline(_) | FsError::SentMeanwhile) if !owned => self.names_sent()?,
                r => return r,
            }
        }
        self.or_logged(online(), logged)
    }

    /// What the origin answered, or when it was unreachable, what the log does instead.
    pub(crate) fn or_logged<T>(
        &self,
        online: FsResult<T>,
        logged: impl FnOnce(OfflineNames<'a>, String) -> FsResult<T>,
    ) -> FsResult<T> {
        match online {
            Err(FsError::Offline(why)) => self.logged(why, logged),
            r => r,
        }
    }

    /// The route of a change to `node`'s file content (a write, a truncation): to its
    /// staged copy while it has one, or, when the log `owned` the file's other change,
    /// to a copy staged now; else `online`, and when the origin is unreachable to a copy
    /// staged now. `staging` runs when a copy is started (the writes not yet durable on
    /// the origin are the copy's now). A copy that was sent back meanwhile sends the
    /// change `online` (a new copy: `SentMeanwhile`, for the caller to try again).
    pub(crate) fn online_or_staged<T>(
        &self,
        node: &Node,
        owned: bool,
        online: impl FnOnce() -> FsResult<T>,
        staged: impl Fn(&Staged<'a>) -> FsResult<Option<T>>,
        staging: impl FnOnce(),
    ) -> FsResult<T> {
        let mut staging = Some(staging);
        let mut start = |why: String| {
            let p = Staged::start(self.sb, node, why)?;
            if let Some(f) = staging.take() {
                f();
            }
            Ok::<_, FsError>(p)
        };
        if let Some(p) = self.staged(node) {
            if let Some(done) = staged(&p)? {
                return Ok(done);
            }
        } else if owned {
            let p = start("its change is not on the server yet".into())?;
            return staged(&p)?.ok_or(FsError::SentMeanwhile);
        }
        match online() {
            Err(FsError::Offline(why)) => {
                let p = start(why)?;
                staged(&p)?.ok_or(FsError::SentMeanwhile)
            }
            r => r,
        }
    }
}
