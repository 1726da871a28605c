//! hoardfs file-system logic: names, attributes, listings, opens and reads, answered from
//! the persistent cache where it can and from the origin where it must. Nothing here knows
//! FUSE; the `hoardfs-fuse` crate is a thin bridge over [`HoardFs`], and tests can drive it
//! directly.
//!
//! Consistency (doc/SEMANTICS.md): close-to-open, with callbacks. An open validates the
//! file's version (a round trip, unless the origin holds a callback for it) and drops cached
//! data of other versions; writes go through to the origin before they return. With an
//! origin that reports changes (module `callbacks`), attributes, names and listings are
//! trusted until a break; otherwise for short TTLs. When the origin is unreachable, cached
//! attributes, names and data are served and everything else fails fast.

mod access;
mod callbacks;
mod dirs;
mod durability;
mod error;
mod fetch;
mod freshness;
mod hoardfs;
mod kernel_opens;
mod locks;
mod manage;
mod namespace;
mod nodes;
mod objects;
mod offline;
mod open_files;
mod opens;
mod passthrough;
mod read;
mod sealed;
mod snapshot;
mod stats;
mod superblock;
mod trees;
mod unlinked;
mod write;
mod write_behind;

use std::time::Duration;

use hoardfs_origin::Attr;

pub use callbacks::KernelNotifier;
pub use error::{CacheFault, FsError, FsResult, Shared};
pub use hoardfs::HoardFs;
pub use locks::LockDone;
pub use manage::{CachedEntry, Prefetched};
pub use nodes::{Listing, Node};
pub use offline::cml::{Conflict, LogStats};
pub use offline::reintegrate::Reintegrated;
pub use opens::{Backing, BackingError, MakeBacking};
pub use read::{Access, FileHandle, OpenMode, Opened, ReadData};
pub use sealed::Unsealed;
pub use snapshot::{NamespaceSnapshot, SnapshotError};
pub use stats::{Stats, StatsSnapshot};

/// FUSE inode number.
pub type Ino = u64;
/// The root's inode number.
pub const ROOT_INO: Ino = 1;

/// Files of one listing whose cached records are read ahead at most (the first ones by
/// name; the disk cache's queue bounds it further).
pub(crate) const WARM_PER_LISTING: usize = 1024;

/// Entries plus pages of one directory listing at most: a server that keeps answering
/// with further pages (each with a new cookie) cannot make a listing grow without bound.
pub(crate) const MAX_LISTING: usize = 1 << 22;

/// Bytes of names in one directory listing at most (a server answering with long names
/// would otherwise make the entry bound hold about a gibibyte).
pub(crate) const MAX_LISTING_NAME_BYTES: usize = 128 << 20;

/// Tunables of a mount.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// How long attributes and names are trusted without asking the origin (when the
    /// origin holds no callback for them).
    pub attr_ttl: Duration,
    /// How long attributes and names under a valid callback are trusted at most.
    pub callback_ttl: Duration,
    /// Refuse every modification.
    pub read_only: bool,
    /// How long a directory listing is reused.
    pub dir_ttl: Duration,
    /// Hand fully cached files to the kernel (FUSE passthrough).
    pub passthrough: bool,
    /// Chunks fetched ahead of a sequential reader.
    pub readahead_chunks: u64,
    /// Threads fetching readahead chunks.
    pub fetch_threads: usize,
    /// Threads fetching whole files ahead of a reader walking a directory in listing
    /// order (0: none; `fetch::siblings`).
    pub files_ahead: usize,
    /// Serve extended attributes (each call a round trip to the origin). Off, the FUSE
    /// bridge tells the kernel they are unsupported, once for the whole mount.
    pub xattrs: bool,
    /// Let the kernel open files without asking the daemon (read-only mounts with a disk
    /// cache; ignored otherwise): no per-open round trip, no passthrough, no open-time
    /// version check (`crate::kernel_opens`).
    pub kernel_opens: bool,
    /// This client's id, stable across its runs (one per cache directory): part of the
    /// hidden names of files unlinked while open (`crate::unlinked`).
    pub client_id: Option<String>,
    /// Where hidden names are journaled until removed, so that the next run removes
    /// those a crash left behind (`crate::unlinked`).
    pub unlinked_journal: Option<std::path::PathBuf>,
    /// Where client modify logs live (`crate::offline::cml`; one subdirectory per export). A log
    /// left by an earlier mount is sent back whenever this is set.
    pub offline_log: Option<std::path::PathBuf>,
    /// `--offline-writes`: keep changes made while the origin is unreachable in the log
    /// (needs `offline_log`); off, they fail.
    pub offline_writes: bool,
    /// This client's host name, in the names of conflict copies.
    pub host: String,
    /// When writes reach the origin (`crate::write_behind`).
    pub write_back: WriteBack,
}

/// When a write reaches the origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteBack {
    /// Before `write()` returns: one round trip per write.
    Through,
    /// In batches behind the writer; `close()` and `fsync()` return once every byte is
    /// on the server (close-to-open), and report a write that failed.
    #[default]
    Close,
    /// Coda's weakly connected mode: creations, removals, renames, symlinks and attribute
    /// changes, and the content of files made here, go into the offline change log at
    /// local speed and reach the origin in the background within about a second (the
    /// mount's keeper sends them; `HoardFs::reintegrate` is the barrier); writes to the
    /// origin's existing files go behind the writer as with `Close`. Needs
    /// `offline_log`; implies `offline_writes`.
    Async,
}

impl Default for FsConfig {
    fn default() -> Self {
        FsConfig {
            attr_ttl: Duration::from_secs(1),
            callback_ttl: Duration::from_secs(600),
            read_only: false,
            dir_ttl: Duration::from_secs(1),
            passthrough: true,
            readahead_chunks: 8,
            fetch_threads: 4,
            files_ahead: 8,
            xattrs: false,
            kernel_opens: false,
            client_id: None,
            unlinked_journal: None,
            offline_log: None,
            offline_writes: false,
            host: "client".into(),
            write_back: WriteBack::default(),
        }
    }
}

/// A name the kernel learns of (by lookup or creation): its node, the node's attributes
/// and how long the kernel may cache both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeEntry {
    /// The node.
    pub ino: Ino,
    /// Its attributes.
    pub attr: Attr,
    /// How long the kernel may keep the name and attributes.
    pub ttl: Duration,
}

/// Attributes of a node and how long the kernel may cache them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeAttr {
    /// The attributes.
    pub attr: Attr,
    /// How long the kernel may keep them.
    pub ttl: Duration,
}

/// A listing entry handed to the kernel with its attributes (readdirplus): its node and
/// how long the kernel may cache its name and attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedNode {
    /// The entry's node.
    pub ino: Ino,
    /// How long the kernel may keep the name and attributes.
    pub ttl: Duration,
    /// The attributes to hand out (the entry's, or a file's local ones while it has a
    /// change not yet sent back).
    pub attr: Attr,
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod state_tests;
#[cfg(test)]
mod tests;
