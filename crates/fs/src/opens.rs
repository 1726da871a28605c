//! The open state of one file node: its cached object, the opens the kernel holds and how
//! each is served, and the passthrough registration they share. Every change is one method
//! here, which states its rule; the node's `state` lock covers it (see `nodes`).
//!
//! The kernel refuses to mix passthrough and page-cached opens of one inode: an inode is
//! [`Opens::Idle`], open by daemon reads only ([`Opens::Daemon`]), or open in passthrough
//! ([`Opens::Passthrough`]), where every other open is `Direct` (which the kernel then
//! fails: the caller first waits a little for the passthrough opens to end, see `read`).
//! The passthrough registration is shared by the passthrough opens and kept, idle, after
//! the last one closes while it is the current object's, so that opening a cached file
//! again costs no file open and no registration.

use std::sync::Arc;

use hoardfs_cache::CachedObject;

/// Passthrough backing registration, opaque to this layer (a `fuser::BackingId`).
pub type Backing = Arc<dyn std::any::Any + Send + Sync>;

/// Why the kernel did not take a cache file for passthrough.
#[derive(Debug, thiserror::Error)]
pub enum BackingError {
    /// It takes none on this mount (no `CAP_SYS_ADMIN`, no passthrough support): passthrough
    /// stays off for the rest of the mount.
    #[error("the kernel refuses passthrough backing files: {0}")]
    Refused(std::io::Error),
    /// A passing failure (out of descriptors or memory): this open uses daemon reads, the
    /// next one tries again.
    #[error("passthrough registration failed: {0}")]
    Failed(std::io::Error),
}

/// Registers a cache file with the kernel for passthrough (supplied by the FUSE bridge).
pub type MakeBacking<'a> = dyn Fn(&std::fs::File) -> Result<Backing, BackingError> + 'a;

/// How an open is served.
#[derive(Clone)]
pub enum OpenMode {
    /// The kernel reads the cache file directly through this backing registration.
    Passthrough(Backing),
    /// Daemon reads through the page cache; `keep_cache` keeps pages from earlier opens.
    Cached {
        /// Whether the kernel may keep the pages it already has.
        keep_cache: bool,
    },
    /// Daemon reads without the page cache (appends; also the answer when passthrough
    /// opens of the inode outlast the wait for them, which the kernel then refuses).
    Direct,
}

impl OpenMode {
    /// The mode without its payload.
    pub(crate) fn kind(&self) -> ModeKind {
        match self {
            OpenMode::Passthrough(_) => ModeKind::Passthrough,
            OpenMode::Cached { .. } => ModeKind::Cached,
            OpenMode::Direct => ModeKind::Direct,
        }
    }
}

/// How an open file is served (the kernel-facing [`crate::OpenMode`] without its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModeKind {
    /// The kernel reads the cache file itself.
    Passthrough,
    /// Daemon reads through the page cache.
    Cached,
    /// Daemon reads without the page cache.
    Direct,
}

/// A passthrough registration and the cached object whose data file it registers.
pub(crate) struct HeldBacking {
    /// The object (its data file is the one registered: truncating or refilling it in
    /// place keeps the registration valid, replacing the object does not).
    object: Arc<CachedObject>,
    /// The registration.
    id: Backing,
}

/// Who has the node open, and how.
enum Opens {
    /// Nobody; `kept`: a registration for the next passthrough open.
    Idle { kept: Option<HeldBacking> },
    /// Opens served by daemon reads only (at least one): `cached` through the page cache,
    /// `direct` without it; `kept` as in `Idle`, for when they are gone.
    Daemon {
        cached: u32,
        direct: u32,
        kept: Option<HeldBacking>,
    },
    /// At least one passthrough open (`opens`), all sharing `backing`, and the `direct`
    /// opens admitted meanwhile (which the kernel fails).
    Passthrough {
        opens: u32,
        backing: HeldBacking,
        direct: u32,
    },
}

/// The open state of a file node; see the module docs.
pub(crate) struct OpenState {
    /// The cached object for the current version (regular files, cache enabled).
    object: Option<Arc<CachedObject>>,
    opens: Opens,
    /// Version of the last page-cached open, to decide whether kernel pages can be kept
    /// (the kernel keeps them across opens, whoever holds the node open meanwhile).
    last_cached_version: Option<u64>,
    /// Opens whose descriptors may all be closed already, the release on its way (the
    /// kernel sends it after `close` returned): those flushed, and the read-only ones
    /// (which get no FLUSH, so that their closes are not seen).
    closing: u32,
}

impl Default for OpenState {
    fn default() -> Self {
        OpenState {
            object: None,
            opens: Opens::Idle { kept: None },
            last_cached_version: None,
            closing: 0,
        }
    }
}

impl OpenState {
    /// The cached object for the current version.
    pub(crate) fn object(&self) -> Option<&Arc<CachedObject>> {
        self.object.as_ref()
    }

    /// Replaces the cached object and returns the previous one. An idle passthrough
    /// registration of another object goes with it: that object's data file may be
    /// deleted, and the registration must not keep it alive or be reused.
    pub(crate) fn set_object(
        &mut self,
        object: Option<Arc<CachedObject>>,
    ) -> Option<Arc<CachedObject>> {
        let old = std::mem::replace(&mut self.object, object);
        self.drop_stale_backing();
        old
    }

    /// Drops a registration no open uses that is not for the current object.
    fn drop_stale_backing(&mut self) {
        let object = &self.object;
        if let Opens::Idle { kept } | Opens::Daemon { kept, .. } = &mut self.opens
            && kept
                .as_ref()
                .is_some_and(|b| !object.as_ref().is_some_and(|o| Arc::ptr_eq(&b.object, o)))
        {
            *kept = None;
        }
    }

    /// Whether any open file refers to this node.
    pub(crate) fn is_open(&self) -> bool {
        !matches!(self.opens, Opens::Idle { .. })
    }

    fn count(&self) -> u32 {
        match &self.opens {
            Opens::Idle { .. } => 0,
            Opens::Daemon { cached, direct, .. } => cached + direct,
            Opens::Passthrough { opens, direct, .. } => opens + direct,
        }
    }

    /// An open's descriptor was closed (its first flush), or it is read-only: see
    /// `closing`.
    pub(crate) fn closing(&mut self) {
        self.closing += 1;
    }

    /// Whether the node is open only by opens whose descriptors may all be closed
    /// (their releases on their way).
    pub(crate) fn only_closing(&self) -> bool {
        self.is_open() && self.closing >= self.count()
    }

    /// Passthrough opens of the node.
    pub(crate) fn passthrough_opens(&self) -> u32 {
        match &self.opens {
            Opens::Passthrough { opens, .. } => *opens,
            _ => 0,
        }
    }

    /// Whether the kernel holds opens served by daemon reads (which rule out passthrough).
    /// Direct opens admitted beside passthrough ones do not count: the kernel refused
    /// them (and sends their release at once), so passthrough opens may still share the
    /// registration meanwhile.
    pub(crate) fn has_daemon_opens(&self) -> bool {
        matches!(self.opens, Opens::Daemon { .. })
    }

    /// The registration a read-only open of `object` (complete) can share: the node's, if
    /// it registers that very object.
    pub(crate) fn shareable(&self, object: &Arc<CachedObject>) -> Option<Backing> {
        let held = match &self.opens {
            Opens::Idle { kept } | Opens::Daemon { kept, .. } => kept.as_ref(),
            Opens::Passthrough { backing, .. } => Some(backing),
        };
        held.filter(|b| Arc::ptr_eq(&b.object, object))
            .map(|b| b.id.clone())
    }

    /// Whether a new registration may be made: not while passthrough opens of an older
    /// object hold theirs.
    pub(crate) fn may_register(&self) -> bool {
        !matches!(self.opens, Opens::Passthrough { .. })
    }

    /// Admits a passthrough open sharing the node's registration of `object` (see
    /// [`OpenState::shareable`]); not while daemon-read opens exist.
    pub(crate) fn admit_shared_passthrough(&mut self, object: &Arc<CachedObject>) {
        debug_assert!(self.shareable(object).is_some() && !self.has_daemon_opens());
        match &mut self.opens {
            Opens::Passthrough { opens, .. } => *opens += 1,
            Opens::Idle { kept } => {
                let backing = kept.take().expect("shareable implies a registration");
                self.opens = Opens::Passthrough {
                    opens: 1,
                    backing,
                    direct: 0,
                };
            }
            Opens::Daemon { .. } => unreachable!("daemon opens refuse passthrough"),
        }
    }

    /// Admits the first passthrough open of `object` with its new registration `id`,
    /// replacing an idle registration (only allowed when [`OpenState::may_register`] and
    /// no daemon-read open exists).
    pub(crate) fn admit_registered_passthrough(&mut self, object: Arc<CachedObject>, id: Backing) {
        debug_assert!(self.may_register() && !self.has_daemon_opens());
        self.opens = Opens::Passthrough {
            opens: 1,
            backing: HeldBacking { object, id },
            direct: 0,
        };
    }

    /// Admits an open served by daemon reads without the page cache.
    pub(crate) fn admit_direct(&mut self) {
        match &mut self.opens {
            Opens::Idle { kept } => {
                let kept = kept.take();
                self.opens = Opens::Daemon {
                    cached: 0,
                    direct: 1,
                    kept,
                };
            }
            Opens::Daemon { direct, .. } | Opens::Passthrough { direct, .. } => *direct += 1,
        }
    }

    /// Admits an open served by daemon reads: `Direct` for appends and while passthrough
    /// opens exist (the kernel fails it then), otherwise `Cached` at `version`, keeping the
    /// kernel's pages if the previous page-cached open was of the same version.
    pub(crate) fn admit_daemon(&mut self, append: bool, version: u64) -> OpenMode {
        if append || matches!(self.opens, Opens::Passthrough { .. }) {
            self.admit_direct();
            return OpenMode::Direct;
        }
        if let Opens::Idle { kept } = &mut self.opens {
            let kept = kept.take();
            self.opens = Opens::Daemon {
                cached: 0,
                direct: 0,
                kept,
            };
        }
        if let Opens::Daemon { cached, .. } = &mut self.opens {
            *cached += 1;
        }
        let keep_cache = self.last_cached_version == Some(version);
        self.last_cached_version = Some(version);
        OpenMode::Cached { keep_cache }
    }

    /// An open served as `mode` is released (`was_closing`: its descriptor was closed
    /// before, [`OpenState::closing`]). Returns true if it was the node's last
    /// passthrough open (waiting opens are then told). The registration is kept for the
    /// next open while it is the current object's.
    pub(crate) fn release(&mut self, mode: ModeKind, was_closing: bool) -> bool {
        if was_closing {
            debug_assert!(self.closing > 0, "a closing open is counted");
            self.closing = self.closing.saturating_sub(1);
        }
        let count = match (&mut self.opens, mode) {
            (Opens::Daemon { cached: n, .. }, ModeKind::Cached)
            | (Opens::Daemon { direct: n, .. }, ModeKind::Direct)
            | (Opens::Passthrough { direct: n, .. }, ModeKind::Direct)
            | (Opens::Passthrough { opens: n, .. }, ModeKind::Passthrough) => Some(n),
            _ => None,
        };
        // (An open is released once, as it was admitted: anything else is a bug, logged
        // rather than allowed to take the mount down.)
        let Some(n) = count.filter(|n| **n > 0) else {
            debug_assert!(false, "a {mode:?} open released that was not admitted");
            tracing::error!("a {mode:?} open released that was not admitted");
            return false;
        };
        *n -= 1;
        let last_passthrough = mode == ModeKind::Passthrough && *n == 0;
        self.opens = match std::mem::replace(&mut self.opens, Opens::Idle { kept: None }) {
            Opens::Daemon {
                cached: 0,
                direct: 0,
                kept,
            } => Opens::Idle { kept },
            Opens::Passthrough {
                opens: 0,
                backing,
                direct,
            } => {
                let kept = Some(backing);
                if direct > 0 {
                    Opens::Daemon {
                        cached: 0,
                        direct,
                        kept,
                    }
                } else {
                    Opens::Idle { kept }
                }
            }
            other => other,
        };
        if last_passthrough {
            self.drop_stale_backing();
        }
        last_passthrough
    }
}
