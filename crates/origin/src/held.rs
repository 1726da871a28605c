//! A bound on the files held open by replies in flight: a [`FileRange`](crate::FileRange)
//! keeps its file open until the server has sent it, which for a client that does not read
//! its socket is until the connection ends. The open-file cache may close its own
//! reference meanwhile (to make room), so without this bound every stalled range would be
//! one more descriptor outside `--max-open-files`. An origin takes a [`Held`] per range
//! from its [`HeldFiles`], and offers no range (its caller then copies the bytes with
//! `read`) when none is left.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The count of ranges in flight, up to a cap.
#[derive(Debug)]
pub struct HeldFiles {
    cap: usize,
    held: Arc<AtomicUsize>,
}

/// One range's share of [`HeldFiles`], given back when the range is dropped (sent, or its
/// connection gone).
#[derive(Debug)]
pub struct Held(Arc<AtomicUsize>);

impl HeldFiles {
    /// At most `cap` ranges at once (at least one).
    pub fn new(cap: usize) -> Self {
        HeldFiles {
            cap: cap.max(1),
            held: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A share, or `None` when `cap` ranges are in flight.
    pub fn take(&self) -> Option<Held> {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.cap).then_some(n + 1)
            })
            .ok()
            .map(|_| Held(self.held.clone()))
    }

    /// Ranges in flight now.
    pub fn in_flight(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_run_out_at_the_cap_and_come_back_when_dropped() {
        let h = HeldFiles::new(2);
        let a = h.take().unwrap();
        let b = h.take().unwrap();
        assert!(h.take().is_none());
        assert_eq!(h.in_flight(), 2);
        drop(a);
        let c = h.take().unwrap();
        assert!(h.take().is_none());
        drop((b, c));
        assert_eq!(h.in_flight(), 0);
    }
}
