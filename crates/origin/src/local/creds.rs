//! Performing a call as its caller: the thread's filesystem uid and gid, supplementary
//! groups and effective capabilities, set with raw system calls (glibc's `setgroups` and
//! friends change every thread of the process; the kernel's calls change only the
//! calling thread, which is what a server serving many users at once needs).
//!
//! The kernel then checks everything the caller does as it checks a local process of that
//! identity: modes, POSIX ACLs, sticky directories, immutable files, quotas and reserved
//! blocks. A caller other than root runs with no effective capability but `CAP_SETUID` and
//! `CAP_SETGID` (which grant no file access and let the thread switch again): in
//! particular without `CAP_SYS_RESOURCE`, so quotas and the root reserve apply, and
//! without `CAP_FSETID`, so a write clears set-id bits as it would locally. Root (not
//! squashed) keeps the process's capabilities.
//!
//! Switching is lazy: a thread keeps the identity its last call needed ([`act_as`] makes
//! only the calls that change something), because one switch costs several microseconds
//! (each call commits new credentials) and consecutive requests almost always come from
//! the same user. Every entry point of an origin that acts as its callers therefore sets
//! the identity it needs first, the process's own included ([`act_as`] with `None`), and
//! work done for the export rather than the caller (watches, mtime repairs) runs in
//! [`as_process`].
//!
//! Changing the fsuid makes the process non-dumpable (the kernel's rule for any fsuid
//! change): no core dumps, and `/proc/PID` owned by root; its own `/proc/self/fd`
//! stays usable (the kernel lets a thread group reach its own descriptors).

use std::cell::RefCell;
use std::io;
use std::sync::{Arc, OnceLock};

use hoardfs_proto::Caller;

/// `_LINUX_CAPABILITY_VERSION_3`: two 32-bit words per set.
const CAP_VERSION_3: u32 = 0x2008_0522;
const CAP_FOWNER: u32 = 3;
const CAP_SETGID: u32 = 6;
const CAP_SETUID: u32 = 7;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The process's own credentials, read once before any switch.
#[derive(Debug)]
struct Process {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    caps: [CapData; 2],
    /// Whether the process may switch at all (`CAP_SETUID` and `CAP_SETGID` effective).
    can_switch: bool,
}

fn process() -> &'static Process {
    static PROCESS: OnceLock<Process> = OnceLock::new();
    PROCESS.get_or_init(|| {
        let me = crate::caller::process();
        let caps = capget().unwrap_or_default();
        let bit = |n: u32| caps[0].effective & (1 << n) != 0;
        Process {
            uid: me.uid,
            gid: me.gid,
            groups: me.groups.clone(),
            caps,
            can_switch: bit(CAP_SETUID) && bit(CAP_SETGID),
        }
    })
}

/// Whether this process can act as other users (it has `CAP_SETUID` and `CAP_SETGID`,
/// in practice: it runs as root).
pub fn can_switch() -> bool {
    process().can_switch
}

/// What this thread's credentials are now.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Applied {
    /// The process's own.
    Process,
    /// A caller's: fsuid, fsgid and groups as given; capabilities reduced unless uid 0.
    Caller(Arc<Caller>),
    /// Not known: a switch failed partway, or the thread is new (a thread starts with
    /// the credentials of the thread that made it, which may have been acting as a
    /// caller). The next switch sets everything.
    Unknown,
}

thread_local! {
    static APPLIED: RefCell<Applied> = const { RefCell::new(Applied::Unknown) };
}

/// Sets this thread's credentials to `caller`'s (`None`: the process's own), making only
/// the system calls that change something. On error the thread's credentials are
/// unknown (the next call sets them all) and the caller must not go on with the call.
pub fn act_as(caller: Option<&Arc<Caller>>) -> io::Result<()> {
    let p = process();
    if !p.can_switch {
        return Ok(());
    }
    // The process's identity named as a caller is the process.
    let caller = caller.filter(|c| !(c.uid == p.uid && c.gid == p.gid && c.groups == p.groups));
    APPLIED.with(|applied| {
        let mut applied = applied.borrow_mut();
        let same = match (&*applied, caller) {
            (Applied::Process, None) => true,
            (Applied::Caller(now), Some(c)) => **now == **c,
            _ => false,
        };
        if same {
            return Ok(());
        }
        let before = std::mem::replace(&mut *applied, Applied::Unknown);
        switch(p, &before, caller.map(|c| &**c))?;
        *applied = match caller {
            None => Applied::Process,
            Some(c) => Applied::Caller(Arc::clone(c)),
        };
        Ok(())
    })
}

/// Runs `f` with the process's own credentials, then returns to what the thread had.
/// For work a server does for the export rather than for the caller (watching a
/// directory, repairing a modification time). Fails only if the switch does.
pub fn as_process<T>(f: impl FnOnce() -> T) -> io::Result<T> {
    let before = APPLIED.with(|a| a.borrow().clone());
    match before {
        Applied::Process => Ok(f()),
        Applied::Caller(c) => {
            act_as(None)?;
            let out = f();
            act_as(Some(&c))?;
            Ok(out)
        }
        Applied::Unknown => {
            act_as(None)?;
            Ok(f())
        }
    }
}

/// Runs `f` with `CAP_FOWNER` effective if this thread acts as a caller other than root
/// (two `capset` calls), for a query the kernel allows only to a file's owner that the
/// server makes for itself, not for the caller: `cachestat(2)`, whether a range is in the
/// page cache before it is sent with `sendfile` (the caller's right to read the file was
/// checked when its descriptor was taken). `f` must make no other file-system call.
/// `None` if the capability could not be raised or dropped again (then the thread's
/// credentials are unknown, and the next switch sets them all).
pub fn with_fowner<T>(f: impl FnOnce() -> T) -> Option<T> {
    let reduced = APPLIED.with(|a| matches!(&*a.borrow(), Applied::Caller(c) if c.uid != 0));
    if !reduced {
        return Some(f());
    }
    let p = process();
    let mut caps = p.caps;
    caps[0].effective &= (1 << CAP_SETUID) | (1 << CAP_SETGID);
    caps[1].effective = 0;
    let mut raised = caps;
    raised[0].effective |= p.caps[0].permitted & (1 << CAP_FOWNER);
    let unknown = || APPLIED.with(|a| *a.borrow_mut() = Applied::Unknown);
    if capset(&raised).is_err() {
        unknown();
        return None;
    }
    let out = f();
    if capset(&caps).is_err() {
        unknown();
        return None;
    }
    Some(out)
}

/// Who this thread acts as, for caches of what was opened by whom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acting {
    /// The process itself.
    Process,
    /// A caller other than the process.
    Caller(Arc<Caller>),
    /// Not known (no switch yet, or one failed): trusted for nothing.
    Unknown,
}

/// Who this thread acts as now.
pub fn acting() -> Acting {
    APPLIED.with(|a| match &*a.borrow() {
        Applied::Process => Acting::Process,
        Applied::Caller(c) => Acting::Caller(Arc::clone(c)),
        Applied::Unknown => Acting::Unknown,
    })
}

/// The system calls from `before` to `caller` (`None`: the process).
fn switch(p: &Process, before: &Applied, caller: Option<&Caller>) -> io::Result<()> {
    let (uid, gid, groups) = match caller {
        None => (p.uid, p.gid, p.groups.as_slice()),
        Some(c) => (c.uid, c.gid, c.groups.as_slice()),
    };
    // What the thread had (`None`: unknown, so everything is set).
    let (was, was_reduced) = match before {
        Applied::Process => (Some((p.uid, p.gid, p.groups.as_slice())), false),
        Applied::Caller(c) => (Some((c.uid, c.gid, c.groups.as_slice())), c.uid != 0),
        Applied::Unknown => (None, true),
    };
    let reduced = uid != 0;
    // The process's capabilities back first where the target keeps them or nothing is
    // known (a reduced thread keeps `CAP_SETUID`/`CAP_SETGID`, enough to switch ids).
    let full = if was_reduced && (!reduced || was.is_none()) {
        capset(&p.caps)?;
        true
    } else {
        !was_reduced
    };
    if was.map(|w| w.2) != Some(groups) {
        // SAFETY: `groups` is a valid slice of gid_t for the length given.
        let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    if was.map(|w| w.1) != Some(gid) {
        // SAFETY: setfsgid takes an id and returns the previous one; it reports no error,
        // so the result is read back with an id that changes nothing.
        unsafe { libc::syscall(libc::SYS_setfsgid, gid) };
        let now = unsafe { libc::syscall(libc::SYS_setfsgid, u32::MAX) } as u32;
        if now != gid {
            return Err(io::Error::other(format!("setfsgid({gid}) left {now}")));
        }
    }
    if was.map(|w| w.0) != Some(uid) {
        // SAFETY: as setfsgid.
        unsafe { libc::syscall(libc::SYS_setfsuid, uid) };
        let now = unsafe { libc::syscall(libc::SYS_setfsuid, u32::MAX) } as u32;
        if now != uid {
            return Err(io::Error::other(format!("setfsuid({uid}) left {now}")));
        }
    }
    if reduced && full {
        // Only the capabilities that let the thread switch again stay effective (the
        // kernel already dropped the file-system ones when the fsuid left 0).
        let mut caps = p.caps;
        caps[0].effective &= (1 << CAP_SETUID) | (1 << CAP_SETGID);
        caps[1].effective = 0;
        capset(&caps)?;
    }
    Ok(())
}

fn capget() -> io::Result<[CapData; 2]> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: header and a two-element data array, as version 3 requires.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(data)
}

/// Sets this thread's capabilities (pid 0: the calling thread only).
fn capset(data: &[CapData; 2]) -> io::Result<()> {
    let mut hdr = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    // SAFETY: as capget.
    let r = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The capabilities of the calling thread (for tests).
#[cfg(test)]
fn effective() -> u64 {
    let c = capget().unwrap();
    u64::from(c[0].effective) | (u64::from(c[1].effective) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fsuid and fsgid of the calling thread.
    fn fs_ids() -> (u32, u32) {
        // SAFETY: reading back with ids that change nothing.
        unsafe {
            (
                libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32,
                libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32,
            )
        }
    }

    #[test]
    fn a_thread_acts_as_a_caller_and_returns_and_others_are_untouched() {
        if !can_switch() {
            eprintln!("skipped: not privileged");
            return;
        }
        let (ask, asked) = std::sync::mpsc::channel::<()>();
        let (tell, other_ids) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            asked.recv().unwrap();
            tell.send((fs_ids(), effective())).unwrap();
        });
        std::thread::spawn(move || {
            let full = effective();
            let user = Caller {
                uid: 4321,
                gid: 4322,
                groups: vec![4323, 4324],
            };
            let user = Arc::new(user);
            act_as(Some(&user)).unwrap();
            assert_eq!(fs_ids(), (4321, 4322));
            assert_eq!(acting(), Acting::Caller(user.clone()));
            ask.send(()).unwrap();
            let keep = (1 << CAP_SETUID) | (1 << CAP_SETGID);
            assert_eq!(
                effective(),
                full & keep,
                "only the switching capabilities stay"
            );
            // Another thread of the process (made before) still has the process's own.
            assert_eq!(other_ids.recv().unwrap(), ((0, 0), full));
            // A thread made now starts with this one's, which it does not take for the
            // process's: its first switch sets everything.
            let child = std::thread::spawn(|| {
                let inherited = fs_ids();
                act_as(None).unwrap();
                (inherited, fs_ids(), effective())
            })
            .join()
            .unwrap();
            assert_eq!(child, ((4321, 4322), (0, 0), full));
            // A file made now is the caller's.
            let dir = as_process(|| {
                let dir = tempfile::tempdir().unwrap();
                let mode = std::os::unix::fs::PermissionsExt::from_mode(0o777);
                std::fs::set_permissions(dir.path(), mode).unwrap();
                dir
            })
            .unwrap();
            std::fs::write(dir.path().join("f"), b"x").unwrap();
            let meta = std::fs::metadata(dir.path().join("f")).unwrap();
            assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 4321);
            // The process's own for a moment, then the caller's again.
            let inside = as_process(|| (fs_ids(), effective())).unwrap();
            assert_eq!(inside, ((0, 0), full));
            assert_eq!(fs_ids(), (4321, 4322));
            act_as(None).unwrap();
            assert_eq!((fs_ids(), effective()), ((0, 0), full));
            assert_eq!(acting(), Acting::Process);
        })
        .join()
        .unwrap();
        other.join().unwrap();
    }

    #[test]
    fn a_caller_is_refused_what_its_ids_are_refused() {
        if !can_switch() {
            eprintln!("skipped: not privileged");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"x").unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::thread::spawn(move || {
            act_as(Some(&Arc::new(Caller::new(4321, 4321)))).unwrap();
            let err = std::fs::read(&secret).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EACCES));
            // Root (not squashed) reads it.
            act_as(Some(&Arc::new(Caller::new(0, 0)))).unwrap();
            assert_eq!(std::fs::read(&secret).unwrap(), b"x");
            act_as(None).unwrap();
        })
        .join()
        .unwrap();
    }

    #[test]
    fn the_server_asks_what_is_cached_of_a_file_its_caller_may_read_but_not_own() {
        if !can_switch() {
            eprintln!("skipped: not privileged");
            return;
        }
        use std::os::fd::AsRawFd;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![7u8; 8192]).unwrap();
        let f = std::fs::File::open(&path).unwrap();
        let _ = std::fs::read(&path).unwrap();
        std::thread::spawn(move || {
            act_as(Some(&Arc::new(Caller::new(4321, 4321)))).unwrap();
            let fd = f.as_raw_fd();
            let plain = super::super::sys::all_cached(fd, 0, 8192);
            if plain.as_ref().err().and_then(|e| e.raw_os_error()) == Some(libc::ENOSYS) {
                eprintln!("skipped: no cachestat(2) in this kernel");
                return;
            }
            assert_eq!(
                plain.err().and_then(|e| e.raw_os_error()),
                Some(libc::EPERM),
                "the kernel tells only the owner"
            );
            let asked = with_fowner(|| super::super::sys::all_cached(fd, 0, 8192)).unwrap();
            assert!(asked.unwrap(), "the file was just read: it is cached");
            // And the capability is gone again.
            let keep = (1 << CAP_SETUID) | (1 << CAP_SETGID);
            assert_eq!(effective() & !keep, 0);
            act_as(None).unwrap();
        })
        .join()
        .unwrap();
    }
}
