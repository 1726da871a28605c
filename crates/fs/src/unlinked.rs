//! [`Unlinked`]: files whose last name was removed while this client had them open.
//!
//! POSIX lets a process keep using a file after its last name is gone (temporary files,
//! editors, package managers). The server releases a file when its last name goes, so the
//! client does what NFS clients do ("silly rename"): instead of removing the last name of a
//! file it has open, it renames it to a hidden name in the same directory
//! (`.hoardfs-unlinked-FILEID-CLIENT-PID-N`) and removes that name when the last descriptor
//! is closed. Other clients see the hidden name until then.
//!
//! A client that crashes cannot remove its hidden names, so with a disk cache they are
//! journaled: `CLIENT` is the cache directory's client id ([`FsConfig::client_id`]) and
//! every hidden name (its directory's path from the root, and the name) is written to the
//! journal file ([`FsConfig::unlinked_journal`]) before the rename and dropped from it once
//! the name is removed. The next mount with that cache directory (which no other client
//! can hold at the same time) removes the names the journal lists: no process of this
//! client has them open any more. The journal holds one line per name, its path components
//! in hex joined by `/`, and is replaced atomically (written, synced, renamed) at every
//! change; silly renames are rare, so that costs nothing that matters.
//!
//! Lock: one mutex, a leaf, held for a map operation and the journal write.
//!
//! [`FsConfig::client_id`]: crate::FsConfig::client_id
//! [`FsConfig::unlinked_journal`]: crate::FsConfig::unlinked_journal

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::nodes::{Node, NodeState, ReleaseWaits};

use crate::Ino;

/// How long a removal waits for the releases of a file whose descriptors may all be
/// closed before it hides the file as an open one. Releases come within microseconds
/// normally; this bounds the wait when a descriptor is still open (read-only elsewhere,
/// or a duplicate of one closed first).
const RELEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Removals that wait for releases at once, at most.
const MAX_RELEASE_WAITERS: usize = 2;

/// Prefix of the hidden names.
pub const HIDDEN_PREFIX: &str = ".hoardfs-unlinked-";

/// A hidden name's place: the path components of its directory, then the name.
pub type HiddenPath = Vec<Vec<u8>>;

/// The hidden name an open file lives under after an unlink.
#[derive(Debug)]
pub struct HiddenName {
    /// The directory holding it.
    pub dir: Ino,
    /// As journaled: the directory's path from the root, then the name.
    pub path: HiddenPath,
}

impl HiddenName {
    /// The name itself (the last component of the path).
    pub fn name(&self) -> &[u8] {
        self.path.last().map_or(&[], |n| n.as_slice())
    }
}

/// Open files whose name was replaced by a hidden one, and the journal of hidden names.
#[derive(Debug)]
pub struct Unlinked {
    inner: Mutex<Inner>,
    next: AtomicU64,
    /// Removals waiting for the releases of a file about to be closed
    /// ([`Unlinked::wait_for_releases`]).
    waiting: ReleaseWaits,
    client: String,
    journal: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The hidden name of each open file unlinked on this client.
    hidden: HashMap<Ino, HiddenName>,
    /// Journaled names not tied to an open file: left by an earlier run and not removable
    /// yet (the server was unreachable), kept for the next mount.
    leftover: Vec<HiddenPath>,
}

impl Unlinked {
    /// Hidden names carry `client` (empty: none); `journal` (if any) records them.
    pub fn new(client: Option<String>, journal: Option<PathBuf>) -> Unlinked {
        Unlinked {
            inner: Mutex::default(),
            next: AtomicU64::new(0),
            waiting: ReleaseWaits::new(MAX_RELEASE_WAITERS, RELEASE_WAIT),
            client: client.unwrap_or_default(),
            journal,
        }
    }

    /// Before a removal hides `node` as an open file (`st`: its state, locked): if every
    /// open of it may be closed already (`OpenState::only_closing`), waits up to
    /// [`RELEASE_WAIT`] for their releases, which the kernel sends after `close`
    /// returned (`rm` right after `cat`). At most [`MAX_RELEASE_WAITERS`] removals wait
    /// at once: each holds a FUSE thread, and the releases need one.
    pub(crate) fn wait_for_releases(&self, node: &Node, st: &mut MutexGuard<'_, NodeState>) {
        self.waiting
            .wait(node, st, |st: &NodeState| st.opens.only_closing());
    }

    /// A fresh hidden name for the file `file_id`.
    pub fn name_for(&self, file_id: u64) -> Vec<u8> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        match self.client.as_str() {
            "" => format!("{HIDDEN_PREFIX}{file_id:x}-{pid:x}-{n}"),
            c => format!("{HIDDEN_PREFIX}{file_id:x}-{c}-{pid:x}-{n}"),
        }
        .into_bytes()
    }

    /// Whether `name` is a hidden name this client (any run of it) made.
    pub fn is_ours(&self, name: &[u8]) -> bool {
        let Some(rest) = name.strip_prefix(HIDDEN_PREFIX.as_bytes()) else {
            return false;
        };
        let tag = format!("-{}-", self.client);
        !self.client.is_empty() && rest.windows(tag.len()).any(|w| w == tag.as_bytes())
    }

    /// Journals that `ino` is about to live under hidden name `path` (in `dir`) until it
    /// is closed; called before the rename, so that a crash right after it leaves a
    /// journaled name (a journal that cannot be written only costs the crash cleanup).
    pub fn hiding(&self, ino: Ino, dir: Ino, path: HiddenPath) {
        let mut inner = self.inner.lock();
        inner.hidden.insert(ino, HiddenName { dir, path });
        self.journal_or_warn(&inner);
    }

    /// The rename to the hidden name failed: forgets it.
    pub fn not_hidden(&self, ino: Ino) {
        let mut inner = self.inner.lock();
        inner.hidden.remove(&ino);
        self.journal_or_warn(&inner);
    }

    /// The hidden name of `ino` to remove now that it is closed, if it has one (still
    /// journaled until [`Unlinked::removed`]).
    pub fn closed(&self, ino: Ino) -> Option<HiddenName> {
        self.inner.lock().hidden.remove(&ino)
    }

    /// The hidden name at `path` is gone (`gone`), or could not be removed and stays
    /// journaled for the next mount.
    pub fn removed(&self, path: HiddenPath, gone: bool) {
        let mut inner = self.inner.lock();
        if !gone {
            inner.leftover.push(path);
        }
        self.journal_or_warn(&inner);
    }

    /// The names a previous run of this client journaled (to remove at mount).
    pub fn journaled(&self) -> Vec<HiddenPath> {
        let Some(j) = &self.journal else {
            return Vec::new();
        };
        let text = std::fs::read(j).unwrap_or_default();
        text.split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                l.split(|&b| b == b'/')
                    .map(unhex)
                    .collect::<Option<Vec<_>>>()
            })
            .filter(|p| p.last().is_some_and(|n| self.is_ours(n)))
            .collect()
    }

    /// After the cleanup at mount: `left` could not be removed and stays journaled.
    pub fn cleaned(&self, left: Vec<HiddenPath>) {
        let mut inner = self.inner.lock();
        inner.leftover = left;
        self.journal_or_warn(&inner);
    }

    fn journal_or_warn(&self, inner: &Inner) {
        if let Err(e) = self.write_journal(inner) {
            tracing::warn!("cannot write the journal of hidden names: {e}");
        }
    }

    /// Replaces the journal with what `inner` holds (nothing to do without a journal).
    fn write_journal(&self, inner: &Inner) -> std::io::Result<()> {
        let Some(j) = &self.journal else {
            return Ok(());
        };
        let mut text = Vec::new();
        let paths = inner.hidden.values().map(|h| &h.path);
        for p in paths.chain(inner.leftover.iter()) {
            let parts: Vec<String> = p.iter().map(|c| hex(c)).collect();
            text.extend_from_slice(parts.join("/").as_bytes());
            text.push(b'\n');
        }
        let tmp = j.with_extension("tmp");
        let mut f = hoardfs_cache::private::file_options()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)?;
        f.write_all(&text)?;
        f.sync_all()?;
        std::fs::rename(&tmp, j)?;
        if let Some(d) = j.parent() {
            std::fs::File::open(d)?.sync_all()?;
        }
        Ok(())
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_lists_hidden_names_until_they_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let j = t.path().join("unlinked");
        let u = Unlinked::new(Some("c0ffee".into()), Some(j.clone()));
        let name = u.name_for(42);
        assert!(u.is_ours(&name));
        let path = vec![b"d\n/".to_vec(), name.clone()];
        u.hiding(7, 2, path.clone());
        let again = Unlinked::new(Some("c0ffee".into()), Some(j.clone()));
        assert_eq!(again.journaled(), vec![path.clone()]);
        let other = Unlinked::new(Some("beef".into()), Some(j.clone()));
        assert!(other.journaled().is_empty(), "names of another client");
        assert_eq!(u.closed(7).map(|c| c.name().to_vec()), Some(name));
        u.removed(path, true);
        assert!(again.journaled().is_empty());
    }
}
