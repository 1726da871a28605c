//! The process's file descriptors: as many as the hard limit allows, and a descriptor
//! table sized for them before any thread exists.
//!
//! Handles, watched directories, cached open files, connections and cache objects are all
//! descriptors. The kernel grows a process's descriptor table by doubling it when a new
//! descriptor does not fit, and once the process has more than one thread each doubling
//! waits for an RCU grace period (`expand_fdtable` → `synchronize_rcu`): 10–20 ms on the
//! benchmark VM. A fresh server's first `ReadTree` of a 2,000-entry tree opened a
//! handle per entry and waited through six of them, 60–80 ms of a request otherwise
//! answered in under 10 ms; a mount opening its first thousand cache files waits likewise.
//! [`prepare`] grows the table once, while the process is single-threaded (no grace
//! period then), to the descriptor limit, at most [`PRESIZED`] slots (about 8 bytes of
//! kernel memory each): a table grown further later waits again, rarely.

/// Most descriptor-table slots reserved at start (512 KiB of kernel memory).
const PRESIZED: u64 = 1 << 16;

/// Raises the descriptor limit to the hard limit and grows the descriptor table to fit it
/// (at most [`PRESIZED`] slots). Call before any thread is started; forks (daemonising)
/// copy only the slots in use, so after them.
pub fn prepare() {
    presize_table(raise_limit().min(PRESIZED));
}

/// Allows as many descriptors as the hard limit permits; returns the soft limit in force
/// afterwards.
pub fn raise_limit() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) != 0 {
            return 1024;
        }
        if r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                r = raised;
            }
        }
        r.rlim_cur
    }
}

/// Grows the descriptor table to at least `slots` by placing a descriptor in the last
/// slot and closing it again (the table never shrinks); a descriptor already there is
/// left alone. Only a cost saved: failures are ignored.
fn presize_table(slots: u64) {
    let Ok(top) = libc::c_int::try_from(slots.saturating_sub(1)) else {
        return;
    };
    if top < 3 {
        return;
    }
    // SAFETY: plain system calls on descriptors this function opens and closes itself
    // (`F_DUPFD` takes the lowest free slot from `top` on: it never closes one in use).
    unsafe {
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let high = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, top);
        if high >= 0 {
            libc::close(high);
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's size shows as `FDSize` in /proc/self/status.
    fn table_size() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("FDSize:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn the_table_is_grown_to_the_asked_size_and_no_descriptor_is_left_open() {
        let limit = raise_limit();
        // Larger than the table is now, so that it must grow.
        let want = (table_size() * 4).min(limit);
        assert!(
            want > table_size(),
            "the descriptor limit ({limit}) leaves no room"
        );
        presize_table(want);
        assert!(table_size() >= want, "FDSize {} < {want}", table_size());
        // SAFETY: a query of a descriptor number.
        let open = unsafe { libc::fcntl(want as i32 - 1, libc::F_GETFD) } >= 0;
        assert!(
            !open,
            "the descriptor placed in the last slot was left open"
        );
    }

    #[test]
    fn a_descriptor_already_in_the_last_slot_is_left_open() {
        use std::os::fd::AsRawFd;
        let limit = raise_limit();
        // Even, so never the (odd) last slot the other test checks.
        let slot = (table_size() * 8).min(limit) - 2;
        let f = tempfile::tempfile().unwrap();
        // SAFETY: `slot` is checked free first; the test closes what it opened.
        unsafe {
            assert!(
                libc::fcntl(slot as i32, libc::F_GETFD) < 0,
                "slot {slot} in use"
            );
            assert_eq!(libc::dup2(f.as_raw_fd(), slot as i32), slot as i32);
        }
        presize_table(slot + 1);
        let ino = |fd: i32| {
            // SAFETY: zeroed stat is a valid out-parameter.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: valid out-pointer; the kernel checks the descriptor.
            let r = unsafe { libc::fstat(fd, &mut st) };
            (r == 0).then_some(st.st_ino)
        };
        assert_eq!(
            ino(slot as i32),
            ino(f.as_raw_fd()),
            "the slot's file was replaced"
        );
        // SAFETY: the descriptor this test placed there.
        unsafe { libc::close(slot as i32) };
    }
}
