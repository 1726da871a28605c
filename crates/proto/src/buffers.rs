//! Recycled data buffers for file contents in flight.
//!
//! Every read moves file contents through a buffer of up to a few MiB: the server fills
//! one from the file and writes it to the socket, a client receives a frame into one and
//! answers FUSE reads from it. Allocators hand such sizes out as fresh `mmap`ed memory and
//! unmap them on free, so without recycling every byte read lands on a freshly faulted,
//! zeroed page (and every free is a TLB shootdown across the process's threads); with 256
//! parallel readers that cost more CPU than the copies themselves. Buffers of
//! [`MIN_POOLED`] and up therefore come from, and return to, one process-wide pool that
//! keeps at most [`IDLE_LIMIT`] bytes of idle buffers; smaller ones are left to the
//! allocator. Capacities are rounded up to a power of two so that buffers fit many
//! requests of nearby sizes.

use std::sync::Mutex;

/// Smallest capacity worth recycling.
pub const MIN_POOLED: usize = 64 << 10;

/// Idle bytes the pool keeps; buffers given back beyond this are freed.
pub const IDLE_LIMIT: usize = 32 << 20;

/// Size classes: one per power of two of a `usize`.
const CLASSES: usize = usize::BITS as usize;

struct Pool {
    /// Idle buffers by size class (`capacity.trailing_zeros()`), newest last.
    idle: [Vec<Vec<u8>>; CLASSES],
    idle_bytes: usize,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    idle: [const { Vec::new() }; CLASSES],
    idle_bytes: 0,
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    // The pool holds no invariant a panic could break: a poisoned lock is still usable.
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// An empty buffer with room for at least `capacity` bytes: a recycled one when the pool
/// has one of the right size class, otherwise a new one.
pub fn take(capacity: usize) -> Vec<u8> {
    if capacity < MIN_POOLED {
        return Vec::with_capacity(capacity);
    }
    let mut buf = pooled(capacity);
    buf.clear();
    buf
}

/// A buffer of at least `capacity` (at least [`MIN_POOLED`]) bytes, from the pool if it
/// has one of the size class, holding what it held.
fn pooled(capacity: usize) -> Vec<u8> {
    let class = capacity.next_power_of_two();
    let mut p = pool();
    // Newest first: its pages are the likeliest to be in the CPU caches.
    match p.idle[class.trailing_zeros() as usize].pop() {
        Some(buf) => {
            p.idle_bytes -= buf.capacity();
            buf
        }
        None => Vec::with_capacity(class),
    }
}

/// A buffer of exactly `len` bytes to be overwritten (a frame's data section read into
/// it): a recycled one keeps what it held, so only bytes it never held are zeroed. (Zeroing
/// every received byte first cost about 3 % of all CPU at 256 parallel readers.)
pub fn take_filled(len: usize) -> Vec<u8> {
    let mut buf = if len < MIN_POOLED {
        Vec::with_capacity(len)
    } else {
        pooled(len)
    };
    fill_to(&mut buf, len);
    buf
}

/// Makes `buf` exactly `len` bytes long, zeroing only bytes beyond what it holds.
pub fn fill_to(buf: &mut Vec<u8>, len: usize) {
    if buf.len() > len {
        buf.truncate(len);
    } else {
        buf.resize(len, 0);
    }
}

/// Returns a buffer for reuse (its contents are kept for [`take_filled`], never shown to
/// [`take`]). Buffers that are small, of an odd capacity (not from [`take`]) or beyond the
/// idle limit are freed instead.
pub fn give(buf: Vec<u8>) {
    let cap = buf.capacity();
    if cap < MIN_POOLED || !cap.is_power_of_two() {
        return;
    }
    let mut p = pool();
    if p.idle_bytes + cap <= IDLE_LIMIT {
        p.idle_bytes += cap;
        p.idle[cap.trailing_zeros() as usize].push(buf);
    }
}

/// Idle bytes currently held by the pool.
pub fn idle_bytes() -> usize {
    pool().idle_bytes
}

/// A buffer that goes back to the pool when dropped (file contents shared between the
/// readers of a chunk until the last one is done).
#[derive(Debug, Default)]
pub struct Recycled(Vec<u8>);

impl From<Vec<u8>> for Recycled {
    fn from(v: Vec<u8>) -> Self {
        Recycled(v)
    }
}

impl std::ops::Deref for Recycled {
    type Target = Vec<u8>;
    fn deref(&self) -> &Vec<u8> {
        &self.0
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        give(std::mem::take(&mut self.0));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One test: the pool is process-wide, and parallel tests would see each other's
    // buffers.
    #[test]
    fn recycles_by_size_class_within_the_limit() {
        let small = take(100);
        assert!(small.capacity() >= 100 && small.capacity() < MIN_POOLED);
        give(small);
        assert_eq!(idle_bytes(), 0, "small buffers are not pooled");

        let mut a = take(MIN_POOLED * 3);
        assert_eq!(a.capacity(), MIN_POOLED * 4, "rounded up to a power of two");
        a.extend_from_slice(b"stale");
        let ptr = a.as_ptr();
        give(a);
        assert_eq!(idle_bytes(), MIN_POOLED * 4);

        let other = take(MIN_POOLED);
        assert_eq!(
            other.capacity(),
            MIN_POOLED,
            "another class is not handed out"
        );
        let b = take(MIN_POOLED * 4);
        assert_eq!(b.as_ptr(), ptr, "the idle buffer of this class is reused");
        assert!(b.is_empty(), "recycled buffers come back empty");
        assert_eq!(idle_bytes(), 0);
        drop(Recycled::from(b));
        assert_eq!(idle_bytes(), MIN_POOLED * 4, "Recycled gives back on drop");

        give(Vec::with_capacity(MIN_POOLED * 3));
        assert_eq!(idle_bytes(), MIN_POOLED * 4, "odd capacities are freed");

        let many: Vec<_> = (0..IDLE_LIMIT / (1 << 20) + 4)
            .map(|_| take(1 << 20))
            .collect();
        many.into_iter().for_each(give);
        assert!(
            idle_bytes() <= IDLE_LIMIT,
            "idle bytes stay within the limit"
        );
        assert!(idle_bytes() >= IDLE_LIMIT - (1 << 20));
        drop(other);

        // take_filled: exactly the length asked for, over what a recycled buffer held.
        let mut held = take(MIN_POOLED * 8);
        held.resize(MIN_POOLED * 6, 7);
        let ptr = held.as_ptr();
        give(held);
        let f = take_filled(MIN_POOLED * 5);
        assert_eq!((f.as_ptr(), f.len()), (ptr, MIN_POOLED * 5));
        assert!(f.iter().all(|&b| b == 7), "not zeroed again");
        give(f);
        let f = take_filled(MIN_POOLED * 7);
        assert_eq!((f.as_ptr(), f.len()), (ptr, MIN_POOLED * 7));
        assert!(
            f[MIN_POOLED * 5..].iter().all(|&b| b == 0),
            "new bytes are zeroed"
        );
        give(f);
        assert!(
            take(MIN_POOLED * 8).is_empty(),
            "take still hands out empty buffers"
        );
        let mut small = vec![1u8; 10];
        fill_to(&mut small, 4);
        assert_eq!(small, [1, 1, 1, 1]);
        fill_to(&mut small, 6);
        assert_eq!(small, [1, 1, 1, 1, 0, 0]);
    }
}
