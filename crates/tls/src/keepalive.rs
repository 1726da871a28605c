//! TCP keepalive and user timeout on both sides' sockets, so that a peer that vanished
//! without a reset (power loss, a cut link) is noticed within about a minute even while no
//! request is outstanding, and its connection (and what it holds) is released.

use std::os::fd::AsRawFd;

/// Idle seconds before the first probe.
const IDLE_S: libc::c_int = 30;
/// Seconds between probes.
const INTERVAL_S: libc::c_int = 10;
/// Unanswered probes before the connection is dropped.
const COUNT: libc::c_int = 3;
/// Milliseconds sent data may stay unacknowledged before the connection is dropped.
const USER_TIMEOUT_MS: libc::c_int = 60_000;

/// Enables keepalive probes and the user timeout on the TCP socket `s` (best effort: a
/// failure only loses the early detection).
pub fn enable_keepalive(s: &impl AsRawFd) {
    let fd = s.as_raw_fd();
    let set = |level, name, value: libc::c_int| {
        // SAFETY: setsockopt on our own socket with a pointer to a local c_int.
        unsafe {
            libc::setsockopt(
                fd,
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, IDLE_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, INTERVAL_S);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, COUNT);
    set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, USER_TIMEOUT_MS);
}
