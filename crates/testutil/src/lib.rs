//! The one way hoardfs tests wait for something that happens on another thread or in
//! another process (a callback break applied, a mount ready, a server noticing a
//! revocation): poll a condition until it holds or a bound passes. Tests never sleep a
//! fixed time and hope. Used by the `cache`, `origin`, `fs`, `server` and `cli` test suites.

use std::time::{Duration, Instant};

/// The bound for something that should happen "promptly" (a callback: target 100 ms).
/// Generous, so a loaded CI machine does not fail a correct test, but far below the 60 s
/// attribute timeouts the observers in the tests use.
pub const PROMPTLY: Duration = Duration::from_secs(5);

/// Polls `cond` every 5 ms until it holds or `timeout` passes; true if it held. The
/// condition is always evaluated once more at the deadline.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return cond();
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Panics with `what` and the last observed state unless `cond` holds within
/// [`PROMPTLY`]. `cond` returns `Ok(())` when satisfied, `Err(what it saw)` otherwise.
#[track_caller]
pub fn assert_soon(what: &str, mut cond: impl FnMut() -> Result<(), String>) {
    let started = Instant::now();
    let mut last = String::new();
    let ok = wait_until(PROMPTLY, || match cond() {
        Ok(()) => true,
        Err(e) => {
            last = e;
            false
        }
    });
    assert!(
        ok,
        "{what}: not true after {:?}; last seen: {last}",
        started.elapsed()
    );
}

/// Panics with `what` unless `cond` holds within [`PROMPTLY`].
#[track_caller]
pub fn assert_eventually(what: &str, cond: impl FnMut() -> bool) {
    let started = Instant::now();
    assert!(
        wait_until(PROMPTLY, cond),
        "{what}: not true after {:?}",
        started.elapsed()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_a_condition_and_gives_up_at_the_bound() {
        let start = Instant::now();
        let mut n = 0;
        assert!(wait_until(Duration::from_secs(5), || {
            n += 1;
            n == 3
        }));
        assert!(start.elapsed() < Duration::from_secs(1));
        let start = Instant::now();
        assert!(!wait_until(Duration::from_millis(50), || false));
        assert!(start.elapsed() >= Duration::from_millis(50));
    }
}
