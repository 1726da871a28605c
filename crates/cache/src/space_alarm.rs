//! Says so in the log, once per change, when the cache file system runs short of room.
//!
//! The free-space thresholds are percentages of the whole file system the cache lives on
//! (cachefilesd's 10/7/3 % by default). On a disk that other data fills past them, the
//! culler keeps evicting and below `stop` nothing new is cached: every read goes to the
//! server. That is the rule working as documented, but without a word it looks like a cache
//! that does not work, so [`SpaceAlarm`] logs each change of [`Room`] with the numbers and
//! what to do about it.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::quota::{Limits, Space};

/// How much room the thresholds leave the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Room {
    /// Above the cull thresholds (or free space unknown).
    Enough = 0,
    /// Below a cull threshold: cached files are being evicted.
    Culling = 1,
    /// Below a stop threshold: nothing new is cached.
    Stopped = 2,
}

impl Room {
    /// The room `space` leaves under `limits`, and a description of the scarcer resource.
    pub(crate) fn of(limits: &Limits, space: Option<Space>) -> (Room, String) {
        let Some(s) = space else {
            return (Room::Enough, String::new());
        };
        let pct = |avail: u64, total: u64| avail as f64 * 100.0 / total.max(1) as f64;
        let mut worst = (Room::Enough, String::new());
        let checks = [
            (
                "space",
                s.bytes_avail,
                s.bytes_total,
                limits.bcull,
                limits.bstop,
                limits.brun,
            ),
            (
                "inodes",
                s.files_avail,
                s.files_total,
                limits.fcull,
                limits.fstop,
                limits.frun,
            ),
        ];
        for (what, avail, total, cull, stop, run) in checks {
            if total == 0 {
                continue;
            }
            let free = pct(avail, total);
            let (room, why) = if free < stop as f64 {
                let p = if what == "space" { "b" } else { "f" };
                (
                    Room::Stopped,
                    format!(
                        "{free:.1}% of its {what} free, below {p}stop {stop}%: nothing new is \
                         cached and reads go to the server"
                    ),
                )
            } else if free < cull as f64 {
                let p = if what == "space" { "b" } else { "f" };
                (
                    Room::Culling,
                    format!(
                        "{free:.1}% of its {what} free, below {p}cull {cull}%: cached files \
                         are evicted until {run}% is free"
                    ),
                )
            } else {
                continue;
            };
            if room > worst.0 {
                worst = (room, why);
            }
        }
        worst
    }
}

/// Remembers the last [`Room`] seen and logs when it changes.
#[derive(Debug, Default)]
pub(crate) struct SpaceAlarm {
    last: AtomicU8,
}

impl SpaceAlarm {
    /// Looks at `space`; logs a warning when the room shrinks, a note when it is back.
    pub(crate) fn observe(&self, limits: &Limits, space: Option<Space>) {
        let (room, why) = Room::of(limits, space);
        let before = self.last.swap(room as u8, Ordering::Relaxed);
        if before == room as u8 {
            return;
        }
        if room == Room::Enough {
            tracing::info!("the cache file system has room again: caching as usual");
        } else if room as u8 > before {
            tracing::warn!(
                "the cache file system has {why}. Free space there, give the cache a file \
                 system of its own, or lower the thresholds (mount options bcull/brun/bstop, \
                 fcull/frun/fstop)"
            );
        } else {
            tracing::info!("the cache file system has {why}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn space(bytes_pct: u64, files_pct: u64) -> Option<Space> {
        Some(Space {
            bytes_total: 1000,
            bytes_avail: bytes_pct * 10,
            files_total: 100,
            files_avail: files_pct,
        })
    }

    #[test]
    fn the_scarcer_resource_decides_and_the_message_names_it() {
        let l = Limits::default();
        assert_eq!(Room::of(&l, None).0, Room::Enough);
        assert_eq!(Room::of(&l, space(50, 50)).0, Room::Enough);
        let (room, why) = Room::of(&l, space(6, 50));
        assert_eq!(room, Room::Culling);
        assert!(
            why.contains("6.0% of its space free, below bcull 7%"),
            "{why}"
        );
        assert!(why.contains("until 10% is free"), "{why}");
        let (room, why) = Room::of(&l, space(6, 2));
        assert_eq!(room, Room::Stopped);
        assert!(why.contains("of its inodes free, below fstop 3%"), "{why}");
        assert!(why.contains("nothing new is cached"), "{why}");
        // Thresholds of 0 never stop caching.
        let low = Limits {
            bstop: 0,
            bcull: 1,
            brun: 2,
            ..l
        };
        assert_eq!(Room::of(&low, space(0, 50)).0, Room::Culling);
        assert_eq!(Room::of(&low, space(1, 50)).0, Room::Enough);
    }

    #[test]
    fn the_alarm_remembers_the_last_room() {
        let l = Limits::default();
        let a = SpaceAlarm::default();
        a.observe(&l, space(6, 50));
        assert_eq!(a.last.load(Ordering::Relaxed), Room::Culling as u8);
        a.observe(&l, space(2, 50));
        assert_eq!(a.last.load(Ordering::Relaxed), Room::Stopped as u8);
        a.observe(&l, space(50, 50));
        assert_eq!(a.last.load(Ordering::Relaxed), Room::Enough as u8);
    }
}
