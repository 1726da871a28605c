//! The open state of one file node: its cached object, the opens the kernel holds and how
//! each is served, and the passthrough registration they share. Every change is one method
//! here, which states its rule; the node's `state` lock covers it (see `nodes`).
//!
//! The kernel refuses to mix passthrough and page-cached opens of one inode, so a
//! passthrough open is admitted only while no daemon-read open exists, and while
//! passthrough opens exist every other open is `Direct` (which the kernel then fails: the
//! caller first waits a little for them, see `read`). Direct opens can therefore coexist
//! with passthrough ones, and a registration is kept, idle, across daemon opens: the
//! counts are not one enum, the registration is ([`Passthrough`]).

use std::sync::Arc;

use hoardfs_cache::CachedObject;

use crate::nodes::Backing;

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

/// The node's passthrough registration.
enum Passthrough {
    /// None held.
    Unregistered,
    /// Kept after the last passthrough open closed, while it belongs to the node's current
    /// object, so that opening a cached file again costs no file open and no
    /// registration; released with the object.
    Kept(HeldBacking),
    /// Shared by `opens` (at least one) passthrough opens.
    Open {
        /// Passthrough opens of the node.
        opens: u32,
        /// Their registration.
        backing: HeldBacking,
    },
}

/// The open state of a file node; see the module docs.
pub(crate) struct OpenState {
    /// The cached object for the current version (regular files, cache enabled).
    object: Option<Arc<CachedObject>>,
    /// Opens served by daemon reads with the page cache.
    cached: u32,
    /// Opens served by daemon reads in direct-I/O mode.
    direct: u32,
    passthrough: Passthrough,
    /// Version of the last page-cached open, to decide whether kernel pages can be kept.
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
            cached: 0,
            direct: 0,
            passthrough: Passthrough::Unregistered,
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
        if let Passthrough::Kept(b) = &self.passthrough
            && !self
                .object
                .as_ref()
                .is_some_and(|o| Arc::ptr_eq(&b.object, o))
        {
            self.passthrough = Passthrough::Unregistered;
        }
    }

    /// Whether any open file refers to this node.
    pub(crate) fn is_open(&self) -> bool {
        self.opens() > 0
    }

    fn opens(&self) -> u32 {
        self.cached + self.direct + self.passthrough_opens()
    }

    /// An open's descriptor was closed (its first flush), or it is read-only: see
    /// `closing`.
    pub(crate) fn closing(&mut self) {
        self.closing += 1;
    }

    /// Whether the node is open only by opens whose descriptors may all be closed
    /// (their releases on their way).
    pub(crate) fn only_closing(&self) -> bool {
        self.is_open() && self.closing >= self.opens()
    }

    /// Passthrough opens of the node.
    pub(crate) fn passthrough_opens(&self) -> u32 {
        match &self.passthrough {
            Passthrough::Open { opens, .. } => *opens,
            _ => 0,
        }
    }

    /// Whether opens served by daemon reads exist (which rule out passthrough).
    pub(crate) fn has_daemon_opens(&self) -> bool {
        self.cached + self.direct > 0
    }

    /// The registration a read-only open of `object` (complete) can share: the node's, if
    /// it registers that very object.
    pub(crate) fn shareable(&self, object: &Arc<CachedObject>) -> Option<Backing> {
        match &self.passthrough {
            Passthrough::Kept(b) | Passthrough::Open { backing: b, .. }
                if Arc::ptr_eq(&b.object, object) =>
            {
                Some(b.id.clone())
            }
            _ => None,
        }
    }

    /// Whether a new registration may be made: not while passthrough opens of an older
    /// object hold theirs.
    pub(crate) fn may_register(&self) -> bool {
        !matches!(self.passthrough, Passthrough::Open { .. })
    }

    /// Admits a passthrough open sharing the node's registration of `object` (see
    /// [`OpenState::shareable`]).
    pub(crate) fn admit_shared_passthrough(&mut self, object: &Arc<CachedObject>) -> bool {
        if self.shareable(object).is_none() {
            return false;
        }
        self.passthrough = match std::mem::replace(&mut self.passthrough, Passthrough::Unregistered)
        {
            Passthrough::Kept(backing) => Passthrough::Open { opens: 1, backing },
            Passthrough::Open { opens, backing } => Passthrough::Open {
                opens: opens + 1,
                backing,
            },
            Passthrough::Unregistered => unreachable!("shareable implies a registration"),
        };
        true
    }

    /// Admits the first passthrough open of `object` with its new registration `id`,
    /// replacing an idle registration (only allowed when [`OpenState::may_register`]).
    pub(crate) fn admit_registered_passthrough(&mut self, object: Arc<CachedObject>, id: Backing) {
        debug_assert!(self.may_register());
        self.passthrough = Passthrough::Open {
            opens: 1,
            backing: HeldBacking { object, id },
        };
    }

    /// Admits an open served by daemon reads without the page cache.
    pub(crate) fn admit_direct(&mut self) {
        self.direct += 1;
    }

    /// Admits an open served by daemon reads through the page cache, at `version`; returns
    /// whether the kernel may keep the pages it has (the previous page-cached open was of
    /// the same version).
    pub(crate) fn admit_cached(&mut self, version: u64) -> bool {
        let keep_cache = self.last_cached_version == Some(version);
        self.last_cached_version = Some(version);
        self.cached += 1;
        keep_cache
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
        match mode {
            ModeKind::Cached => self.cached -= 1,
            ModeKind::Direct => self.direct -= 1,
            ModeKind::Passthrough => {
                let Passthrough::Open { opens, .. } = &mut self.passthrough else {
                    unreachable!("a passthrough open holds the registration");
                };
                *opens -= 1;
                if *opens > 0 {
                    return false;
                }
                let Passthrough::Open { backing, .. } =
                    std::mem::replace(&mut self.passthrough, Passthrough::Unregistered)
                else {
                    unreachable!()
                };
                self.passthrough = Passthrough::Kept(backing);
                self.drop_stale_backing();
                return true;
            }
        }
        false
    }
}
