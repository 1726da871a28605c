//! The opens of files the kernel opened without asking the daemon (`--kernel-opens`).
//!
//! With [`FsConfig::kernel_opens`](crate::FsConfig::kernel_opens) the FUSE bridge answers
//! the first OPEN with `ENOSYS`; from then on the kernel opens files of the mount itself.
//! No OPEN, FLUSH or RELEASE reaches the daemon, reads arrive with file handle 0, and the
//! kernel keeps a file's page cache across opens until a callback break or an attribute
//! change drops it. That saves the two cross-CPU wake-ups every open otherwise costs
//! (doc/BENCHMARKS.md), at the price of passthrough and of the open-time version check
//! (doc/SEMANTICS.md), and only on read-only mounts: writes need real opens.
//!
//! Such reads (`Reads::read_unopened`, in `read.rs`) get an open of their own, kept
//! here: an *implicit open* per inode,
//! created at the first read of the file's current version and replaced when the version
//! changes. Each one keeps its cached object from eviction, so only the [`IMPLICIT_OPENS`]
//! most recently created are kept (first in, first out: later reads do not refresh an
//! entry); an older one is released (a later read simply opens it again).
//!
//! The table is an [`ImplicitOpens`], which owns its lock; `Reads` (`read.rs`:
//! `read_unopened`) opens and releases the files it names.
//!
//! Lock ordering: the implicit-open table is a leaf; it is never held across `open_node`
//! or `release`, which take node locks and the open-file table.

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::Ino;
use crate::open_files::FileHandle;

/// Implicit opens kept at most (each pins its cached object against eviction).
pub(crate) const IMPLICIT_OPENS: usize = 1024;

/// The implicit opens: at most [`IMPLICIT_OPENS`], the oldest released first.
#[derive(Default)]
pub(crate) struct ImplicitOpens {
    /// Lock: a leaf.
    table: Mutex<Table>,
}

impl ImplicitOpens {
    /// `ino`'s implicit open, if it has one.
    pub(crate) fn current(&self, ino: Ino) -> Option<ImplicitOpen> {
        self.table.lock().by_ino.get(&ino).copied()
    }

    /// Records `fh` as the open of `ino` at `version`; returns the handles to release, or
    /// the open a concurrent read recorded first for the same version (see
    /// `Table::insert`).
    pub(crate) fn record(
        &self,
        ino: Ino,
        fh: FileHandle,
        version: u64,
    ) -> Result<Vec<FileHandle>, FileHandle> {
        self.table.lock().insert(ino, fh, version, IMPLICIT_OPENS)
    }

    /// Forgets every implicit open; returns their handles to release.
    pub(crate) fn take_all(&self) -> Vec<FileHandle> {
        let mut t = self.table.lock();
        t.order.clear();
        t.by_ino.drain().map(|(_, open)| open.fh).collect()
    }

    /// Implicit opens currently held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.table.lock().by_ino.len()
    }
}

/// One implicit open: its handle and the file version it opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImplicitOpen {
    pub(crate) fh: FileHandle,
    pub(crate) version: u64,
}

/// The implicit opens by inode, and in the order they were created.
#[derive(Default)]
struct Table {
    by_ino: HashMap<Ino, ImplicitOpen>,
    order: VecDeque<(Ino, FileHandle)>,
}

impl Table {
    /// Records `fh` as the open of `ino` at `version`; returns the handles to release (the
    /// one it replaces, and the oldest beyond the limit). If a concurrent read recorded an
    /// open of the same version first, nothing changes and that open is returned instead.
    fn insert(
        &mut self,
        ino: Ino,
        fh: FileHandle,
        version: u64,
        cap: usize,
    ) -> Result<Vec<FileHandle>, FileHandle> {
        if let Some(first) = self.by_ino.get(&ino)
            && first.version == version
        {
            return Err(first.fh);
        }
        let mut gone = Vec::new();
        if let Some(old) = self.by_ino.insert(ino, ImplicitOpen { fh, version }) {
            gone.push(old.fh);
        }
        self.order.push_back((ino, fh));
        while self.by_ino.len() > cap {
            let Some((i, h)) = self.order.pop_front() else {
                break;
            };
            if self.by_ino.get(&i).is_some_and(|cur| cur.fh == h) {
                self.by_ino.remove(&i);
                gone.push(h);
            }
        }
        // Entries of replaced opens are skipped above; drop them once they dominate.
        if self.order.len() > 2 * cap {
            let live = &self.by_ino;
            self.order
                .retain(|(i, h)| live.get(i).is_some_and(|cur| cur.fh == *h));
        }
        Ok(gone)
    }
}

#[cfg(test)]
mod tests {
    use super::{ImplicitOpen, Table};

    #[test]
    fn replaced_and_oldest_opens_are_handed_back_for_release() {
        let mut im = Table::default();
        assert_eq!(im.insert(1, 10, 1, 2), Ok(vec![]));
        assert_eq!(im.insert(2, 11, 1, 2), Ok(vec![]));
        // A racing open of the same version loses to the one recorded first.
        assert_eq!(im.insert(2, 14, 1, 2), Err(11));
        // A new version of inode 1 replaces its open.
        assert_eq!(im.insert(1, 12, 2, 2), Ok(vec![10]));
        // A third inode: the oldest live one (inode 2) goes; the stale entry of handle 10
        // is skipped, not released twice.
        assert_eq!(im.insert(3, 13, 1, 2), Ok(vec![11]));
        assert_eq!(im.by_ino.len(), 2);
        assert_eq!(im.by_ino[&1], ImplicitOpen { fh: 12, version: 2 });
        assert_eq!(im.by_ino[&3], ImplicitOpen { fh: 13, version: 1 });
    }
}
