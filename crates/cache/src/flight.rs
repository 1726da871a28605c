//! [`Flights`]: one fetch per key however many callers want it at the same time. The
//! first caller (the leader) runs the fetch with no lock held; the others wait for its
//! result, which every caller gets a clone of. Used for chunks by the client's fetcher
//! and by a server's cache tier.
//!
//! Lock: the in-flight map is a leaf; a flight's own mutex is held only to set or wait
//! for its result.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

struct Flight<V> {
    done: Mutex<Option<V>>,
    cv: Condvar,
}

/// Fetches in progress, by key.
pub struct Flights<K, V> {
    inflight: Mutex<HashMap<K, Arc<Flight<V>>>>,
}

impl<K, V> Default for Flights<K, V> {
    fn default() -> Self {
        Flights {
            inflight: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone, V: Clone> Flights<K, V> {
    /// The result of `fetch` for `key`: run now, or by a concurrent caller for the same
    /// key whose result this one waits for. The flag says whether this call ran it.
    pub fn run(&self, key: K, fetch: impl FnOnce() -> V) -> (V, bool) {
        let (flight, leader) = {
            let mut m = self.inflight.lock();
            match m.get(&key) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = Arc::new(Flight {
                        done: Mutex::new(None),
                        cv: Condvar::new(),
                    });
                    m.insert(key.clone(), f.clone());
                    (f, true)
                }
            }
        };
        if !leader {
            let mut g = flight.done.lock();
            while g.is_none() {
                flight.cv.wait(&mut g);
            }
            return (g.clone().expect("set before notify"), false);
        }
        let r = fetch();
        self.inflight.lock().remove(&key);
        *flight.done.lock() = Some(r.clone());
        flight.cv.notify_all();
        (r, true)
    }

    /// Callers waiting for a fetch in progress (for tests).
    pub fn waiting(&self) -> usize {
        // The map and the leader hold one reference each.
        self.inflight
            .lock()
            .values()
            .map(|f| Arc::strong_count(f) - 2)
            .sum()
    }

    /// Fetches in progress.
    pub fn in_progress(&self) -> usize {
        self.inflight.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Flights;

    #[test]
    fn concurrent_callers_of_one_key_share_one_fetch_and_others_do_not() {
        let f: Flights<u32, Result<u32, String>> = Flights::default();
        std::thread::scope(|s| {
            let mut follower = None;
            let (r, led) = f.run(1, || {
                follower = Some(s.spawn(|| f.run(1, || panic!("a second fetch of key 1"))));
                let joined = || f.waiting() > 0;
                assert!(
                    hoardfs_testutil::wait_until(Duration::from_secs(10), joined),
                    "the follower never joined"
                );
                // Another key is not held up by this one.
                assert_eq!(f.run(2, || Ok(20)), (Ok(20), true));
                Ok(10)
            });
            assert_eq!((r, led), (Ok(10), true));
            let followed = follower.expect("spawned").join().unwrap();
            assert_eq!(followed, (Ok(10), false));
        });
        assert_eq!(f.in_progress(), 0);
        // A failure is handed out, not kept: the next call fetches again.
        assert_eq!(f.run(1, || Err("down".into())), (Err("down".into()), true));
        assert_eq!(f.run(1, || Ok(11)), (Ok(11), true));
    }
}
