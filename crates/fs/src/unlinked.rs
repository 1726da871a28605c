//! [`Unlinked`]: files whose last name was removed while this client had them open.
//!
//! POSIX lets a process keep using a file after its last name is gone (temporary files,
//! editors, package managers). The server releases a file when its last name goes, so the
//! client does what NFS clients do ("silly rename"): instead of removing the last name of a
//! file it has open, it renames it to a hidden name in the same directory
//! (`.hoardfs-unlinked-…`) and removes that name when the last descriptor is closed. Other
//! clients see the hidden name until then; a client that crashes leaves it behind.
//!
//! Lock: one mutex, a leaf, held for a map operation.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::nodes::Ino;

/// Prefix of the hidden names.
pub const HIDDEN_PREFIX: &str = ".hoardfs-unlinked-";

/// Open files whose name was replaced by a hidden one: inode → (directory, hidden name).
#[derive(Debug, Default)]
pub struct Unlinked {
    hidden: Mutex<HashMap<Ino, (Ino, Vec<u8>)>>,
    next: AtomicU64,
}

impl Unlinked {
    /// A fresh hidden name for the file `file_id`.
    pub fn name_for(&self, file_id: u64) -> Vec<u8> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        format!("{HIDDEN_PREFIX}{file_id:x}-{:x}-{n}", std::process::id()).into_bytes()
    }

    /// Records that `ino` now lives under `name` in `dir` until it is closed.
    pub fn hid(&self, ino: Ino, dir: Ino, name: Vec<u8>) {
        self.hidden.lock().insert(ino, (dir, name));
    }

    /// The hidden name of `ino` to remove now that it is closed, if it has one.
    pub fn closed(&self, ino: Ino) -> Option<(Ino, Vec<u8>)> {
        self.hidden.lock().remove(&ino)
    }
}
