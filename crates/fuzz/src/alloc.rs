//! A global allocator that remembers the largest single allocation (or reallocation) since
//! the last [`reset`], so the harness can tell an allocation sized by a length field (which
//! a hostile peer chooses) from one sized by bytes actually received. Install it in a
//! binary with `#[global_allocator] static A: Counting = Counting;`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The counting allocator (over the system allocator).
pub struct Counting;

static MAX: AtomicUsize = AtomicUsize::new(0);

fn note(size: usize) {
    // The harness runs inputs on one thread: a plain compare-and-store is enough (another
    // thread's allocation can at worst be missed, never invented).
    if size > MAX.load(Ordering::Relaxed) {
        MAX.store(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Starts a new measurement.
pub fn reset() {
    MAX.store(0, Ordering::Relaxed);
}

/// The largest single allocation since [`reset`].
pub fn max() -> usize {
    MAX.load(Ordering::Relaxed)
}

/// Whether [`Counting`] is this process's allocator (otherwise nothing is measured).
pub fn installed() -> bool {
    reset();
    let probe = std::hint::black_box(vec![0u8; 12345]);
    let seen = max() >= probe.len();
    drop(probe);
    reset();
    seen
}
