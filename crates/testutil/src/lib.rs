//! The one way hoardfs tests wait for something that happens on another thread or in
//! another process (a callback break applied, a mount ready, a server noticing a
//! revocation): poll a condition until it holds or a bound passes. Tests never sleep a
//! fixed time and hope: what waits for an event polls for it ([`wait_until`],
//! [`wait_for`], [`poll`]), what checks that something does *not* happen watches for the
//! whole period ([`assert_stays`]), and what waits for activity to end waits for a value
//! to stop changing ([`settled`]). (The sleeps left in the suites let a timeout of the
//! code under test expire, or make one side of a race late on purpose: that is what they
//! test.) Used by the `cache`, `origin`, `fs`, `server` and `cli` test suites.

use std::time::{Duration, Instant};

/// The bound for something that should happen "promptly" (a callback: target 100 ms).
/// Generous, so a loaded CI machine does not fail a correct test, but far below the 60 s
/// attribute timeouts the observers in the tests use.
pub const PROMPTLY: Duration = Duration::from_secs(5);

/// How often the waits look again, unless told otherwise.
const EVERY: Duration = Duration::from_millis(5);

/// Calls `f` every `every` until it yields a value or `timeout` passes; `f` is always called
/// once more at the deadline. A loop with several outcomes (ready, failed early) returns
/// `Some` of each, and `None` from here means the bound passed.
pub fn poll<T>(every: Duration, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(t) = f() {
            return Some(t);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return f();
        }
        std::thread::sleep(every.min(left));
    }
}

/// [`poll`] every 5 ms.
pub fn wait_for<T>(timeout: Duration, f: impl FnMut() -> Option<T>) -> Option<T> {
    poll(EVERY, timeout, f)
}

/// Polls `cond` every 5 ms until it holds or `timeout` passes; true if it held. The
/// condition is always evaluated once more at the deadline.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    wait_for(timeout, || cond().then_some(())).is_some()
}

/// Panics with `what` if `cond` fails at any look (every 5 ms) during `period`: for the
/// absence of an event, where there is nothing to wait for, the test watches the whole
/// period instead of sleeping through it and looking once.
#[track_caller]
pub fn assert_stays(what: &str, period: Duration, mut cond: impl FnMut() -> bool) {
    let started = Instant::now();
    let broke = wait_until(period, || !cond());
    assert!(
        !broke,
        "{what}: no longer true after {:?}",
        started.elapsed()
    );
}

/// Waits until `f` (looked at every `every`) returns the same value for `quiet`, at most
/// `timeout`; returns the last value, and whether it settled. For activity with no event
/// that says it ended (a server taking in what it will of a flood).
pub fn settled<T: PartialEq>(
    every: Duration,
    quiet: Duration,
    timeout: Duration,
    mut f: impl FnMut() -> T,
) -> (T, bool) {
    let mut last = f();
    let mut since = Instant::now();
    let calm = poll(every, timeout, || {
        let now = f();
        if now != last {
            last = now;
            since = Instant::now();
            return None;
        }
        (since.elapsed() >= quiet).then_some(())
    });
    (last, calm.is_some())
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

    #[test]
    fn poll_returns_the_first_outcome_or_none_at_the_bound() {
        let mut n = 0;
        let got = wait_for(Duration::from_secs(5), || {
            n += 1;
            (n == 4).then_some(n * 10)
        });
        assert_eq!(got, Some(40));
        let start = Instant::now();
        let none: Option<()> = poll(Duration::from_millis(20), Duration::from_millis(60), || {
            None
        });
        assert_eq!(none, None);
        assert!(start.elapsed() >= Duration::from_millis(60));
    }

    #[test]
    fn assert_stays_watches_the_whole_period() {
        let start = Instant::now();
        assert_stays("true", Duration::from_millis(40), || true);
        assert!(start.elapsed() >= Duration::from_millis(40));
        let mut n = 0;
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_stays("changes", Duration::from_secs(5), || {
                n += 1;
                n < 3
            })
        }));
        assert!(
            caught.is_err(),
            "a condition that stopped holding was not caught"
        );
        assert_eq!(n, 3, "it stopped at the first look that failed");
    }

    #[test]
    fn settled_waits_for_a_value_to_stop_changing() {
        let mut n = 0u32;
        let (v, calm) = settled(
            Duration::from_millis(1),
            Duration::from_millis(20),
            Duration::from_secs(5),
            || {
                n += 1;
                n.min(10)
            },
        );
        assert_eq!((v, calm), (10, true));
        let mut m = 0u32;
        let (_, calm) = settled(
            Duration::from_millis(1),
            Duration::from_millis(20),
            Duration::from_millis(100),
            || {
                m += 1;
                m
            },
        );
        assert!(
            !calm,
            "a value still changing at the bound counted as settled"
        );
    }
}
