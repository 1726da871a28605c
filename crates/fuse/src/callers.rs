//! The identity behind each kernel request: the calling thread's fsuid and fsgid (from
//! the request) and its supplementary groups, read from `/proc/PID/task/PID/status` (the
//! kernel does not send them; ceph-fuse and libfuse's `fuse_req_getgroups` read them the
//! same way) and kept for [`GROUPS_TTL`] per thread, so that a busy reader does not read
//! the file at every request. The bridge enters it as the ambient caller
//! (`hoardfs_origin::caller`) for the request's duration.
//!
//! Groups are read only when the origin acts as its callers; otherwise the identity
//! carries none (nobody would look at them).
//!
//! Lock: one mutex, a leaf, held for a map lookup or insert (never while reading `/proc`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hoardfs_origin::Caller;
use parking_lot::Mutex;

/// How long the groups read for one thread are used for its requests: a process that
/// changes its groups (`setgroups`, rare outside login programs) is seen with the old ones
/// for at most this long.
const GROUPS_TTL: Duration = Duration::from_secs(1);

/// Most threads remembered at once.
const MAX_THREADS: usize = 4096;

/// A thread's request ids: (thread id, uid, gid).
type Key = (u32, u32, u32);

/// Identities by the ids of their requests, with when their groups were read.
#[derive(Default)]
pub(crate) struct Callers {
    known: Mutex<HashMap<Key, (Arc<Caller>, Instant)>>,
}

impl Callers {
    /// The identity of a request from thread `pid` with ids `uid` and `gid`; with its
    /// supplementary groups if `with_groups`.
    pub(crate) fn of(&self, pid: u32, uid: u32, gid: u32, with_groups: bool) -> Arc<Caller> {
        if !with_groups || pid == 0 {
            return Arc::new(Caller::new(uid, gid));
        }
        let key = (pid, uid, gid);
        let now = Instant::now();
        if let Some((c, at)) = self.known.lock().get(&key)
            && now.duration_since(*at) < GROUPS_TTL
        {
            return Arc::clone(c);
        }
        let caller = Arc::new(Caller {
            uid,
            gid,
            groups: groups_of(pid).unwrap_or_default(),
        });
        let mut known = self.known.lock();
        if known.len() >= MAX_THREADS {
            known.retain(|_, (_, at)| now.duration_since(*at) < GROUPS_TTL);
            if known.len() >= MAX_THREADS {
                known.clear();
            }
        }
        known.insert(key, (Arc::clone(&caller), now));
        caller
    }
}

/// The supplementary groups of thread `pid` (the "Groups:" line of its status), at most
/// `MAX_GROUPS`; `None` if the thread is gone or the line unreadable (the request then
/// claims no groups: mostly a denial, though an ACL entry refusing one of its groups then
/// no longer applies; a thread that is gone has nobody waiting for the answer).
fn groups_of(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status"))
        .or_else(|_| std::fs::read_to_string(format!("/proc/{pid}/status")))
        .ok()?;
    parse_groups(&status)
}

fn parse_groups(status: &str) -> Option<Vec<u32>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Groups:"))?;
    let mut groups: Vec<u32> = line
        .split_whitespace()
        .filter_map(|g| g.parse().ok())
        .collect();
    groups.truncate(hoardfs_origin::caller::MAX_GROUPS);
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_read_from_the_status_line() {
        let status =
            "Name:\tbash\nUid:\t1000\t1000\t1000\t1000\nGroups:\t4 24 27 1000 \nNgid:\t0\n";
        assert_eq!(parse_groups(status), Some(vec![4, 24, 27, 1000]));
        assert_eq!(parse_groups("Groups:\n"), Some(vec![]));
        assert_eq!(parse_groups("Name:\tx\n"), None);
    }

    #[test]
    fn this_threads_groups_are_the_kernels() {
        let me = unsafe { libc::gettid() } as u32;
        let want = {
            let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
            let mut g = vec![0; n as usize];
            unsafe { libc::getgroups(n, g.as_mut_ptr()) };
            g
        };
        let callers = Callers::default();
        let c = callers.of(me, 5, 6, true);
        assert_eq!((c.uid, c.gid), (5, 6));
        assert_eq!(c.groups, want);
        // Kept: the same identity, not read again.
        assert!(Arc::ptr_eq(&c, &callers.of(me, 5, 6, true)));
        // Without groups, none are read.
        assert!(callers.of(me, 5, 6, false).groups.is_empty());
    }
}
