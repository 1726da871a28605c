//! [`Lister`]: lists, in the background and while connected, the directories this mount
//! resolves names in without listing them, so that with `--offline-writes` they can take
//! offline creates, mkdirs, symlinks and renames (an offline name can be made only where
//! the kept listing proves it free: `names::OfflineNames`). An editor that opens
//! `~/work/thesis/ch1.tex` by path, or a build that reads `src/main.c`, never lists the
//! directory; Coda's Venus fetches a directory whole when it is used, and so does this.
//!
//! Bounded and never on a caller's path: one thread, a queue of at most [`QUEUE`]
//! directories (a directory asked for again while queued is queued once; beyond the bound
//! requests are dropped, and the directory is asked for again at its next lookup), each
//! listed as a `readdir` would (`Superblock::listing`, through the owner's closure), and
//! as the user whose lookup asked for it (the ambient caller then, entered again on the
//! thread): the server lists it only if that user may.
//!
//! Below the superblock: it knows directories by inode only. Lock: one mutex (the queued
//! set), a leaf.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::mpsc;

use hoardfs_origin::caller::{self, Caller};
use parking_lot::Mutex;

use crate::Ino;

/// Most directories waiting to be listed.
pub(crate) const QUEUE: usize = 256;

/// A directory to list, and the user to list it as.
type Job = (Ino, Arc<Caller>);

/// The background lister of one mount.
pub(crate) struct Lister {
    queue: Mutex<Option<mpsc::SyncSender<Job>>>,
    queued: Arc<Mutex<HashSet<Ino>>>,
}

impl Lister {
    /// A lister whose thread lists each queued directory with `list` (the owner's; `false`:
    /// the owner is gone and the thread ends).
    pub(crate) fn new(list: impl Fn(Ino) -> bool + Send + 'static) -> std::io::Result<Lister> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let queued = Arc::new(Mutex::new(HashSet::new()));
        let done = queued.clone();
        std::thread::Builder::new()
            .name("hoardfs-lister".into())
            .spawn(move || {
                while let Ok((ino, by)) = rx.recv() {
                    done.lock().remove(&ino);
                    if !caller::with(by, || list(ino)) {
                        return;
                    }
                }
            })?;
        Ok(Lister {
            queue: Mutex::new(Some(tx)),
            queued,
        })
    }

    /// Asks for directory `ino` to be listed as the current ambient caller (unless it is
    /// queued already, or the queue is full or stopped).
    pub(crate) fn want(&self, ino: Ino) {
        if !self.queued.lock().insert(ino) {
            return;
        }
        let by = caller::current();
        let sent = self
            .queue
            .lock()
            .as_ref()
            .is_some_and(|tx| tx.try_send((ino, by)).is_ok());
        if !sent {
            self.queued.lock().remove(&ino);
        }
    }

    /// Stops the thread (what is queued is dropped).
    pub(crate) fn stop(&self) {
        self.queue.lock().take();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn each_directory_is_listed_once_per_request_and_the_queue_is_bounded() {
        let (listed_tx, listed) = channel();
        let (gate_tx, gate) = channel::<()>();
        let gate = Mutex::new(gate);
        let l = Lister::new(move |ino| {
            // Held until the test lets it go, so that requests pile up meanwhile.
            let _ = gate.lock().recv();
            listed_tx.send(ino).is_ok()
        })
        .unwrap();
        l.want(1);
        // The thread took 1 and waits at the gate: 2 is queued once however often asked.
        std::thread::sleep(Duration::from_millis(50));
        for _ in 0..10 {
            l.want(2);
        }
        for ino in 100..100 + 2 * QUEUE as u64 {
            l.want(ino);
        }
        for _ in 0..2 * QUEUE + 2 {
            let _ = gate_tx.send(());
        }
        drop(gate_tx);
        let mut got = Vec::new();
        while let Ok(ino) = listed.recv_timeout(Duration::from_secs(2)) {
            got.push(ino);
        }
        assert_eq!(got[..2], [1, 2]);
        assert_eq!(got.iter().filter(|&&i| i == 2).count(), 1);
        assert!(got.len() <= QUEUE + 1, "{} listed", got.len());
        // Stopped: requests are dropped, not blocked on.
        l.stop();
        l.want(3);
        assert!(listed.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn a_directory_is_listed_as_the_user_who_asked() {
        let (tx, rx) = channel();
        let l = Lister::new(move |ino| tx.send((ino, caller::current().uid)).is_ok()).unwrap();
        let mut user: Caller = (**caller::process()).clone();
        user.uid = 4242;
        caller::with(Arc::new(user), || l.want(7));
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), (7, 4242));
    }
}
