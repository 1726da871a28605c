//! Who the current thread's origin calls are made for: the *ambient caller*.
//!
//! A request reaches an origin through many layers (a FUSE request, the file-system
//! logic, a fetcher, a reconnect) and most origin calls do not concern identity at all, so
//! the caller is not a parameter of every [`crate::Origin`] method: like the kernel's
//! `current_cred()` and nfs-ganesha's per-thread `op_ctx`, it is a property of the thread
//! for the duration of one call ([`with`], or the [`Scope`] guard of [`enter`]).
//!
//! - On a client, the FUSE bridge enters the calling process's identity for each kernel
//!   request, background work enters the identity it works for (readahead: the opener's;
//!   reintegration: the user who made the change), and [`crate::remote::RemoteOrigin`]
//!   sends [`current`] with every request.
//! - On a server, each request's claim is mapped ([`hoardfs_proto::IdMap`]) and entered
//!   around the origin call; [`crate::local::LocalOrigin`] then performs the call with that
//!   identity's credentials (`local::creds`).
//!
//! Where nothing was entered, the caller is the process itself ([`process`]).

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

pub use hoardfs_proto::Caller;
pub use hoardfs_proto::ids::MAX_GROUPS;

thread_local! {
    static CURRENT: RefCell<Option<Arc<Caller>>> = const { RefCell::new(None) };
}

/// Restores the previous ambient caller when dropped.
#[must_use = "the caller is entered only while the scope lives"]
pub struct Scope {
    previous: Option<Arc<Caller>>,
    /// Not `Send`: the scope belongs to the thread it changed.
    _thread: std::marker::PhantomData<*const ()>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        let previous = self.previous.take();
        CURRENT.with(|c| *c.borrow_mut() = previous);
    }
}

/// Makes `caller` this thread's ambient caller until the returned scope is dropped.
pub fn enter(caller: Arc<Caller>) -> Scope {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(caller));
    Scope {
        previous,
        _thread: std::marker::PhantomData,
    }
}

/// Runs `f` with `caller` as this thread's ambient caller.
pub fn with<T>(caller: Arc<Caller>, f: impl FnOnce() -> T) -> T {
    let _scope = enter(caller);
    f()
}

/// The ambient caller entered on this thread, if any.
pub fn entered() -> Option<Arc<Caller>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// The ambient caller: the one entered on this thread, or the process itself.
pub fn current() -> Arc<Caller> {
    entered().unwrap_or_else(|| Arc::clone(process()))
}

/// The process's own identity (its filesystem uid and gid and its supplementary groups,
/// read once).
pub fn process() -> &'static Arc<Caller> {
    static PROCESS: OnceLock<Arc<Caller>> = OnceLock::new();
    PROCESS.get_or_init(|| {
        // SAFETY: plain queries of the calling process's credentials.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Arc::new(Caller {
            uid,
            gid,
            groups: process_groups(),
        })
    })
}

/// The supplementary groups of the process (empty if they cannot be read).
fn process_groups() -> Vec<u32> {
    // SAFETY: a size query, then a fill of a buffer of that size.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n <= 0 {
        return Vec::new();
    }
    let mut groups = vec![0 as libc::gid_t; n as usize];
    let got = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    groups.truncate(got.max(0) as usize);
    groups.truncate(hoardfs_proto::ids::MAX_GROUPS);
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        assert!(entered().is_none());
        assert_eq!(*current(), **process());
        let a = Arc::new(Caller::new(1, 1));
        let b = Arc::new(Caller::new(2, 2));
        with(a.clone(), || {
            assert_eq!(current(), a);
            with(b.clone(), || assert_eq!(current(), b));
            assert_eq!(current(), a);
        });
        assert!(entered().is_none());
    }

    #[test]
    fn a_caller_entered_on_one_thread_is_not_another_threads() {
        let _s = enter(Arc::new(Caller::new(7, 7)));
        std::thread::spawn(|| assert!(entered().is_none()))
            .join()
            .unwrap();
    }
}
