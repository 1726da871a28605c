//! Says so in the log, once per change, when the cache file system runs short of room.
//!
//! The free-space thresholds are percentages of the whole file system the cache lives on
//! (cachefilesd's 10/7/3 % by default). Falling below `cull` now and then is the culler's
//! normal work on a cache that has its file system to itself, and is not reported. What is
//! reported is what a user would otherwise take for a cache that does not work: free space
//! below `cull` after the culler evicted everything it may ([`Room::Short`]: other data
//! fills the disk), or below `stop` ([`Room::Stopped`]: nothing new is cached, every read
//! goes to the server). [`SpaceAlarm`] logs a warning with the numbers and what to do when
//! the room shrinks to one of these, and a note when it is back above `run` (a state is
//! left only past the next threshold up, so a disk hovering at a line does not flap).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use crate::quota::{Limits, Space, pct};

/// What the free space of the cache file system means for caching.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Room {
    /// Room enough (or free space unknown, or not looked at yet).
    #[default]
    Enough = 0,
    /// Below a cull threshold with nothing left that may be evicted: other data fills it.
    Short = 1,
    /// Below a stop threshold: nothing new is cached.
    Stopped = 2,
}

impl Room {
    /// Its name in `stats --json`: `enough`, `short` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            Room::Enough => "enough",
            Room::Short => "short",
            Room::Stopped => "stopped",
        }
    }

    fn from_u8(v: u8) -> Room {
        match v {
            1 => Room::Short,
            2 => Room::Stopped,
            _ => Room::Enough,
        }
    }

    /// The room after `before`, given `space` and whether the culler, having just run,
    /// is still short of its target (`exhausted`).
    pub(crate) fn next(
        before: Room,
        limits: &Limits,
        space: Option<Space>,
        exhausted: bool,
    ) -> Room {
        if space.is_none() {
            // Not known this time (a failed statvfs): nothing has changed.
            return before;
        }
        let below = |b: u8, f: u8| below(space, b, f);
        let (stop, cull, run) = (
            below(limits.bstop, limits.fstop),
            below(limits.bcull, limits.fcull),
            below(limits.brun, limits.frun),
        );
        // Each state is left only past the next threshold up.
        let stopped = stop || (before == Room::Stopped && cull);
        let short =
            (cull && (exhausted || before == Room::Short)) || (before != Room::Enough && run);
        if stopped {
            Room::Stopped
        } else if short {
            Room::Short
        } else {
            Room::Enough
        }
    }

    /// What the cache file system has now, in words, for the log.
    fn describe(self, limits: &Limits, space: Option<Space>) -> String {
        let Some(s) = space else {
            return String::new();
        };
        let free = |avail: u64, total: u64| avail as f64 * 100.0 / total.max(1) as f64;
        let (b, f) = (
            free(s.bytes_avail, s.bytes_total),
            free(s.files_avail, s.files_total),
        );
        // The scarcer of space and inodes, against its thresholds.
        let inodes = s.files_total > 0 && f - f64::from(limits.fcull) < b - f64::from(limits.bcull);
        let (what, free, p, cull, stop, run) = if inodes {
            ("inodes", f, "f", limits.fcull, limits.fstop, limits.frun)
        } else {
            ("space", b, "b", limits.bcull, limits.bstop, limits.brun)
        };
        match self {
            Room::Stopped => format!(
                "{free:.1}% of its {what} free, below {p}stop {stop}%: nothing new is cached \
                 and reads go to the server"
            ),
            Room::Short => format!(
                "{free:.1}% of its {what} free, below {p}cull {cull}% with nothing left to \
                 evict (open and pinned files stay): other data fills it"
            ),
            Room::Enough => format!("{free:.1}% of its {what} free again, {p}run is {run}%"),
        }
    }
}

/// Whether `space` has less than `b` % of its blocks or `f` % of its inodes free (as the
/// quota computes thresholds); false when it is unknown.
fn below(space: Option<Space>, b: u8, f: u8) -> bool {
    space.is_some_and(|s| {
        s.bytes_avail < pct(s.bytes_total, b)
            || (s.files_total > 0 && s.files_avail < pct(s.files_total, f))
    })
}

/// Remembers the last [`Room`] seen and logs when it changes.
#[derive(Debug, Default)]
pub(crate) struct SpaceAlarm {
    last: AtomicU8,
    /// Whether free space was below a stop threshold at the last look (no hysteresis:
    /// what a reservation would find).
    below_stop: AtomicBool,
}

impl SpaceAlarm {
    /// The room the culler last saw.
    pub(crate) fn room(&self) -> Room {
        Room::from_u8(self.last.load(Ordering::Relaxed))
    }

    /// Whether free space was below a stop threshold when the culler last looked.
    pub(crate) fn below_stop(&self) -> bool {
        self.below_stop.load(Ordering::Relaxed)
    }

    /// After a round of culling: `space` now, and whether the culler is still short of its
    /// target. Logs a warning when the room shrinks, a note when it grows.
    pub(crate) fn observe(&self, limits: &Limits, space: Option<Space>, exhausted: bool) -> Room {
        let stop = below(space, limits.bstop, limits.fstop);
        self.below_stop.store(stop, Ordering::Relaxed);
        let before = Room::from_u8(self.last.load(Ordering::Relaxed));
        let room = Room::next(before, limits, space, exhausted);
        if room == before {
            return room;
        }
        self.last.store(room as u8, Ordering::Relaxed);
        let now = room.describe(limits, space);
        if room > before {
            tracing::warn!(
                "the cache file system has {now}. Free space there, give the cache a file \
                 system of its own, or lower the thresholds (bcull/brun/bstop, fcull/frun/fstop)"
            );
        } else if room == Room::Enough {
            tracing::info!("the cache file system has {now}: caching as usual");
        } else {
            tracing::info!("the cache file system has {now}");
        }
        room
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
    fn culling_alone_is_normal_and_short_or_stopped_is_reported() {
        let l = Limits::default();
        let next = |before, b, f, exhausted| Room::next(before, &l, space(b, f), exhausted);
        assert_eq!(Room::next(Room::Enough, &l, None, true), Room::Enough);
        assert_eq!(next(Room::Enough, 50, 50, false), Room::Enough);
        // Below bcull while the culler still finds something to evict: its normal work.
        assert_eq!(next(Room::Enough, 6, 50, false), Room::Enough);
        // Below bcull with nothing left to evict, by space or by inodes.
        assert_eq!(next(Room::Enough, 6, 50, true), Room::Short);
        assert_eq!(next(Room::Enough, 50, 6, true), Room::Short);
        assert_eq!(next(Room::Enough, 2, 50, false), Room::Stopped);
        assert_eq!(next(Room::Enough, 50, 2, false), Room::Stopped);
        // Thresholds of 0 never stop caching.
        let low = Limits {
            bstop: 0,
            bcull: 1,
            brun: 2,
            ..l
        };
        assert_eq!(
            Room::next(Room::Enough, &low, space(0, 50), true),
            Room::Short
        );
        assert_eq!(
            Room::next(Room::Enough, &low, space(2, 50), true),
            Room::Enough
        );
    }

    #[test]
    fn a_state_is_left_only_past_the_next_threshold_up() {
        let l = Limits::default();
        let next = |before, b| Room::next(before, &l, space(b, 50), false);
        // Stopped until bcull is free again, then short until brun is.
        assert_eq!(next(Room::Stopped, 4), Room::Stopped);
        assert_eq!(next(Room::Stopped, 8), Room::Short);
        assert_eq!(next(Room::Short, 8), Room::Short);
        assert_eq!(next(Room::Short, 10), Room::Enough);
    }

    #[test]
    fn the_message_names_the_scarcer_resource_and_its_threshold() {
        let l = Limits::default();
        let why = Room::Short.describe(&l, space(6, 50));
        assert!(
            why.contains("6.0% of its space free, below bcull 7%"),
            "{why}"
        );
        let why = Room::Stopped.describe(&l, space(50, 2));
        assert!(
            why.contains("2.0% of its inodes free, below fstop 3%"),
            "{why}"
        );
        assert!(why.contains("nothing new is cached"), "{why}");
    }

    #[test]
    fn the_alarm_reports_each_change_once() {
        let l = Limits::default();
        let a = SpaceAlarm::default();
        assert_eq!(a.observe(&l, space(6, 50), true), Room::Short);
        assert_eq!(a.observe(&l, space(6, 50), false), Room::Short);
        assert_eq!(a.observe(&l, space(2, 50), false), Room::Stopped);
        assert!(a.below_stop());
        // Above stop but below cull: still reported as stopped, yet caching is possible.
        assert_eq!(a.observe(&l, space(5, 50), false), Room::Stopped);
        assert!(!a.below_stop());
        assert_eq!(a.observe(&l, space(50, 50), false), Room::Enough);
        assert_eq!(a.room(), Room::Enough);
    }
}
