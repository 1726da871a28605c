//! [`Durability`]: which files have writes the server acknowledged but has not yet made
//! durable, and under which server instance, so that `fsync` and `close` never report
//! success for writes a server restart may have lost.
//!
//! Every acknowledged write is tagged with the server's write verifier (it changes only
//! when the server did not stop cleanly; see `hoardfs_proto::Reply::Hello`). A file's
//! writes are *unstable* under one verifier until an fsync that ran under that same
//! verifier succeeds. If the verifier a file's writes were acknowledged under is not the
//! one in force when it is fsynced or closed, those writes may be gone: the fsync or close
//! fails with EIO. An fsync, or a close by the thread that wrote last, reports it once and
//! clears the state (as Linux reports a writeback error once per file). The close of an
//! open that wrote, by another thread or process (a child forked while the file was open,
//! closing its copy at exec or exit), reports it too but leaves it for the writer, which
//! would otherwise be told its writes were safe; the release of the file's last open for
//! writing then clears a loss its closes reported, so that the next writer is not blamed
//! for it. Closes of opens that wrote nothing report nothing.
//! Writes the client cannot place under one verifier (the verifier changed
//! while the write was in flight) are treated as lost.
//!
//! Lock: one mutex, a leaf, held for a map operation.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::Ino;

/// The state of one file's unsynced writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unsynced {
    /// Acknowledged under this verifier, none of them synced yet.
    Under(u64),
    /// Some may have been lost (acknowledged under a verifier no longer in force).
    Lost,
}

/// Why an fsync or close must fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server restarted without stopping cleanly after acknowledging writes to this file \
     that were not yet durable: they may be lost (write verifier {then:#x}, now {now:#x})"
)]
pub struct WritesMayBeLost {
    /// The verifier the writes were acknowledged under (0: unknown, already lost).
    pub then: u64,
    /// The verifier in force now.
    pub now: u64,
}

impl Unsynced {
    /// The loss to report if the verifier is `now`, if any.
    fn lost(self, now: u64) -> Option<WritesMayBeLost> {
        match self {
            Unsynced::Under(v) if v == now => None,
            Unsynced::Under(v) => Some(WritesMayBeLost { then: v, now }),
            Unsynced::Lost => Some(WritesMayBeLost { then: 0, now }),
        }
    }
}

/// Unsynced writes by inode; see the module docs.
#[derive(Debug, Default)]
pub struct Durability {
    files: Mutex<HashMap<Ino, Unsynced>>,
}

impl Durability {
    /// Records a write to `ino` acknowledged while the verifier was `before` when it was
    /// sent and `after` when its reply was seen.
    pub fn wrote(&self, ino: Ino, before: u64, after: u64) {
        let mut files = self.files.lock();
        let next = match (files.get(&ino), before == after) {
            (_, false) | (Some(Unsynced::Lost), _) => Unsynced::Lost,
            (None, true) => Unsynced::Under(before),
            (Some(Unsynced::Under(v)), true) if *v == before => Unsynced::Under(before),
            (Some(Unsynced::Under(_)), true) => Unsynced::Lost,
        };
        files.insert(ino, next);
    }

    /// An fsync of `ino` that ran while the verifier was `before` (sent) and `after`
    /// (answered) succeeded: its writes are durable, unless they were acknowledged under
    /// another verifier.
    pub fn synced(&self, ino: Ino, before: u64, after: u64) -> Result<(), WritesMayBeLost> {
        match self.files.lock().remove(&ino) {
            None => Ok(()),
            Some(Unsynced::Under(v)) if v == before && v == after => Ok(()),
            Some(Unsynced::Under(v)) => Err(WritesMayBeLost {
                then: v,
                now: after,
            }),
            Some(Unsynced::Lost) => Err(WritesMayBeLost {
                then: 0,
                now: after,
            }),
        }
    }

    /// `ino` is closed while the verifier is `now`: fails if its unsynced writes were
    /// acknowledged under another one (they stay unsynced otherwise: close does not sync).
    pub fn closed(&self, ino: Ino, now: u64) -> Result<(), WritesMayBeLost> {
        let mut files = self.files.lock();
        match files.get(&ino).and_then(|u| u.lost(now)) {
            Some(e) => {
                files.remove(&ino);
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Like [`Durability::closed`] but keeps the state: a descriptor of `ino` that another
    /// process inherited is closed, and the writer must still hear of the loss.
    pub fn checked(&self, ino: Ino, now: u64) -> Result<(), WritesMayBeLost> {
        match self.files.lock().get(&ino).and_then(|u| u.lost(now)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The last open of `ino` for writing is released while the verifier is `now`: a loss
    /// its closes reported (the writes were acknowledged under another verifier) is
    /// cleared, so that it is not reported again to whoever writes the file next. Writes
    /// still unsynced under `now` stay: a later restart must fail a later fsync.
    pub fn released(&self, ino: Ino, now: u64) {
        let mut files = self.files.lock();
        if files.get(&ino).is_some_and(|u| u.lost(now).is_some()) {
            files.remove(&ino);
        }
    }

    /// Forgets `ino` (its last name and handle are gone).
    pub fn forget(&self, ino: Ino) {
        self.files.lock().remove(&ino);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_synced_under_their_own_verifier_are_durable() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        d.wrote(5, 1, 1);
        assert_eq!(d.closed(5, 1), Ok(()));
        assert_eq!(d.synced(5, 1, 1), Ok(()));
        // Nothing unsynced: a later restart does not matter.
        assert_eq!(d.closed(5, 2), Ok(()));
        assert_eq!(d.synced(5, 2, 2), Ok(()));
    }

    #[test]
    fn a_restart_between_write_and_fsync_fails_the_fsync_once() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        let e = d.synced(5, 2, 2).unwrap_err();
        assert_eq!((e.then, e.now), (1, 2));
        assert_eq!(d.synced(5, 2, 2), Ok(()), "reported once");
    }

    #[test]
    fn a_restart_between_write_and_close_fails_the_close() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        assert!(d.closed(5, 2).is_err());
        assert_eq!(d.closed(5, 2), Ok(()));
    }

    #[test]
    fn a_check_reports_the_loss_and_leaves_it_for_the_writer() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        assert_eq!(d.checked(5, 1), Ok(()), "no restart, nothing lost");
        let e = d.checked(5, 2).unwrap_err();
        assert_eq!((e.then, e.now), (1, 2));
        assert!(d.checked(5, 2).is_err(), "a check does not clear");
        assert!(
            d.closed(5, 2).is_err(),
            "the writer's close still hears of it"
        );
        assert_eq!(d.checked(5, 2), Ok(()));
    }

    #[test]
    fn a_release_clears_a_reported_loss_and_keeps_unsynced_writes() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        assert!(d.checked(5, 2).is_err());
        d.released(5, 2);
        d.wrote(5, 2, 2);
        assert_eq!(d.synced(5, 2, 2), Ok(()), "the next writer starts afresh");
        d.wrote(6, 1, 1);
        d.released(6, 1);
        assert!(
            d.synced(6, 2, 2).is_err(),
            "a restart after the release still counts"
        );
    }

    #[test]
    fn writes_under_two_verifiers_or_racing_a_restart_are_lost() {
        let d = Durability::default();
        d.wrote(5, 1, 1);
        d.wrote(5, 2, 2);
        // Even an fsync under the newest verifier cannot vouch for the first write.
        assert!(d.synced(5, 2, 2).is_err());
        d.wrote(6, 1, 2);
        assert!(d.closed(6, 2).is_err());
        d.wrote(7, 3, 3);
        // The verifier changed while the fsync was in flight.
        assert!(d.synced(7, 3, 4).is_err());
    }
}
