//! Mount-wide passthrough admission ([`PassthroughGate`]): whether the kernel refused a
//! backing registration (daemon reads for the rest of the mount, `Reads::open`), and the
//! opens waiting for an inode's passthrough opens to be released (the kernel fails any
//! other open of an inode open in passthrough).
//!
//! Lock ordering: the wait is on the node's `state` lock and its `released` condvar
//! (`crate::nodes::ReleaseWaits`); the gate itself holds no lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::MutexGuard;

use crate::nodes::{Node, NodeState, ReleaseWaits};

/// How long an open that the kernel would refuse while the file is open in passthrough
/// waits for those opens to be released.
pub(crate) const PASSTHROUGH_DRAIN: Duration = Duration::from_secs(1);

/// Opens that may wait for passthrough opens at once (each holds a FUSE thread).
const MAX_DRAINING: usize = 2;

/// Mount-wide passthrough admission: whether the kernel refused a backing registration
/// (daemon reads for the rest of the mount), and the opens waiting for passthrough opens
/// to be released.
pub(crate) struct PassthroughGate {
    refused: AtomicBool,
    /// Opens waiting for passthrough opens to be released (see `drain`).
    draining: ReleaseWaits,
}

impl Default for PassthroughGate {
    fn default() -> Self {
        PassthroughGate {
            refused: AtomicBool::new(false),
            draining: ReleaseWaits::new(MAX_DRAINING, PASSTHROUGH_DRAIN),
        }
    }
}

impl PassthroughGate {
    /// Whether the kernel refused passthrough for this mount.
    pub(crate) fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// The kernel refused a registration: no passthrough for the rest of the mount.
    pub(crate) fn refuse(&self) {
        self.refused.store(true, Ordering::Relaxed);
    }

    /// Waits on `node`'s passthrough releases while `must_wait` holds, for at most
    /// [`PASSTHROUGH_DRAIN`]; beyond [`MAX_DRAINING`] waiting opens, does not wait at all.
    pub(crate) fn drain(
        &self,
        node: &Node,
        st: &mut MutexGuard<'_, NodeState>,
        must_wait: impl Fn(&NodeState) -> bool,
    ) {
        self.draining.wait(node, st, must_wait);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    use hoardfs_origin::Origin;
    use hoardfs_origin::local::{LocalOptions, LocalOrigin};

    use super::{MAX_DRAINING, PASSTHROUGH_DRAIN, PassthroughGate};
    use crate::ROOT_INO;
    use crate::nodes::{Node, NodeTable};

    /// A node to wait on (the root of an empty export).
    fn node() -> Arc<Node> {
        let dir = tempfile::tempdir().unwrap();
        let origin = LocalOrigin::new(dir.path(), LocalOptions::default()).unwrap();
        let root = origin.info().unwrap().root;
        NodeTable::new(root.handle, root.attr)
            .get(ROOT_INO)
            .unwrap()
    }

    #[test]
    fn a_release_ends_the_wait_for_passthrough_opens() {
        let (gate, node) = (PassthroughGate::default(), node());
        let open = Arc::new(AtomicBool::new(true));
        let started = Instant::now();
        let mut st = node.state.lock();
        // The release takes the node's lock, so it happens while the open waits.
        let release = {
            let (node, open) = (node.clone(), open.clone());
            std::thread::spawn(move || {
                let _st = node.state.lock();
                open.store(false, Ordering::SeqCst);
                node.released.notify_all();
            })
        };
        gate.drain(&node, &mut st, |_| open.load(Ordering::SeqCst));
        drop(st);
        release.join().unwrap();
        assert!(!open.load(Ordering::SeqCst));
        assert!(started.elapsed() < PASSTHROUGH_DRAIN);
        assert_eq!(gate.draining.waiting(), 0);
    }

    #[test]
    fn the_wait_is_bounded_in_time_and_in_waiters() {
        let (gate, node) = (PassthroughGate::default(), node());
        let started = Instant::now();
        gate.drain(&node, &mut node.state.lock(), |_| true);
        // Letting the wait expire is the point.
        assert!(started.elapsed() >= PASSTHROUGH_DRAIN);
        // With as many opens waiting as allowed, another does not wait at all.
        gate.draining.occupy(MAX_DRAINING);
        let started = Instant::now();
        gate.drain(&node, &mut node.state.lock(), |_| true);
        assert!(started.elapsed() < PASSTHROUGH_DRAIN);
        assert_eq!(gate.draining.waiting(), MAX_DRAINING);
        assert!(!gate.refused());
        gate.refuse();
        assert!(gate.refused());
    }
}
