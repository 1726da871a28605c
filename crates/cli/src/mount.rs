//! `hoardfs mount SOURCE MOUNTPOINT`: mount a hoardfs server or local directory through FUSE
//! with a persistent disk cache. Runs until unmounted (`umount`, `fusermount3 -u`, SIGINT or
//! SIGTERM); `--daemon` returns once the mount is ready.

use crate::error::{CliError, CliResult};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use fuser::{Config, MountOption, SessionACL};
use hoardfs_cache::{CacheDir, CacheError, Limits};
use hoardfs_fs::{FsConfig, HoardFs};
use hoardfs_fuse::FuseBridge;
use hoardfs_origin::Origin;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin};

pub use crate::mount_args::{MountArgs, helper_argv, log_file};

/// Write end of the pipe to the waiting parent, when daemonised.
static READY_FD: AtomicI32 = AtomicI32::new(-1);

/// With `--daemon`, forks: the parent waits until the child reports the mount ready (exit
/// 0) or failed (its message, exit 1). Must run before any thread is started.
pub fn maybe_daemonize(args: &MountArgs) -> CliResult<()> {
    let a = args.resolve()?;
    if !a.daemon {
        return Ok(());
    }
    let mut fds = [0i32; 2];
    // SAFETY: plain pipe(2) into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: single-threaded at this point (checked by the caller's ordering).
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error()).into()),
        0 => {
            // SAFETY: closing our copy of the read end; setsid detaches from the terminal.
            unsafe {
                libc::close(fds[0]);
                libc::setsid();
            }
            READY_FD.store(fds[1], Ordering::SeqCst);
            Ok(())
        }
        _child => {
            // SAFETY: we own the write end's copy in the parent and close it here.
            unsafe { libc::close(fds[1]) };
            // SAFETY: the read end is ours.
            let mut r = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fds[0]) });
            let mut msg = String::new();
            let _ = r.read_to_string(&mut msg);
            if msg.trim() == "ok" {
                std::process::exit(0);
            }
            let msg = if msg.is_empty() {
                "mount process exited before the mount was ready".into()
            } else {
                msg
            };
            eprintln!("hoardfs: {}", msg.trim());
            std::process::exit(1);
        }
    }
}

/// Tells the waiting parent (if daemonised) `msg`; true if there was one.
fn report_to_parent(msg: &str) -> bool {
    let fd = READY_FD.swap(-1, Ordering::SeqCst);
    if fd < 0 {
        return false;
    }
    // SAFETY: the fd was stored by maybe_daemonize and is used once.
    let mut f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let _ = f.write_all(msg.as_bytes());
    true
}

/// Set once the mount is up: from then on the cache directory holds real data.
static MOUNTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Mounts and serves until unmounted. A mount that fails leaves nothing behind: a cache
/// directory it created (with any missing parents) is removed again.
pub fn run(args: MountArgs) -> CliResult<()> {
    let created = args
        .resolve()
        .ok()
        .filter(|a| !a.no_cache)
        .and_then(|a| a.cache_dir)
        .and_then(|d| first_missing_ancestor(&d));
    let result = mount_and_serve(args);
    if let Err(e) = &result {
        if let Some(dir) = created
            && !MOUNTED.load(Ordering::SeqCst)
        {
            let _ = std::fs::remove_dir_all(&dir);
        }
        if report_to_parent(&e.to_string()) {
            // The waiting parent prints the message: it is said once, by one process.
            std::process::exit(1);
        }
    }
    result
}

/// The outermost of `path` and its ancestors that does not exist yet (what creating
/// `path` with its parents would create), if any.
fn first_missing_ancestor(path: &Path) -> Option<PathBuf> {
    let mut missing = None;
    let mut p = path;
    while !p.as_os_str().is_empty() && std::fs::symlink_metadata(p).is_err() {
        missing = Some(p.to_path_buf());
        p = p.parent()?;
    }
    missing
}

/// How long a mount waits for the previous client of its cache directory or mount point
/// to exit. `umount` returns before that client has closed its cache and control socket
/// (the kernel does not wait for the daemon), so a mount right after an unmount can find
/// them held for a moment.
pub const CLIENT_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Opens the cache directory, waiting up to [`CLIENT_EXIT_WAIT`] for a client that is
/// exiting to release it.
fn open_cache(dir: &Path, limits: Limits) -> CliResult<CacheDir> {
    let deadline = Instant::now() + CLIENT_EXIT_WAIT;
    loop {
        match CacheDir::open_with(dir, limits, None) {
            Err(CacheError::Locked(_)) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(CacheError::Locked(p)) => {
                return Err(format!(
                    "cache directory {} is still in use by another hoardfs client after \
                     waiting {} s: is it mounted elsewhere? (`hoardfs cache status \
                     MOUNTPOINT` names a mount's cache)",
                    p.display(),
                    CLIENT_EXIT_WAIT.as_secs()
                )
                .into());
            }
            r => return r.map_err(|e| CliError::Failed(e.to_string())),
        }
    }
}

/// File in the cache directory holding the client id (see [`client_id`]).
const CLIENT_ID: &str = "client-id";

/// File in the cache directory journaling the hidden names of files unlinked while open
/// (`hoardfs_fs::FsConfig::unlinked_journal`).
const UNLINKED_JOURNAL: &str = "unlinked";

/// Directory in the cache directory holding the offline change logs (`--offline-writes`),
/// one per export.
const OFFLINE_LOG: &str = "cml";

/// This machine's host name (for conflict copies' names), made safe for a file name.
fn host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name: String = raw
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if name.is_empty() {
        "client".into()
    } else {
        name
    }
}

/// The id of the client that uses cache directory `dir` (16 hex digits, random, made at
/// its first mount and kept in `dir/client-id`): hidden names carry it, so that the next
/// mount of `dir` knows which ones it may remove after a crash.
fn client_id(dir: &Path) -> CliResult<String> {
    let p = dir.join(CLIENT_ID);
    if let Ok(text) = std::fs::read_to_string(&p) {
        let id = text.trim();
        if id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(id.to_owned());
        }
    }
    let id = format!("{:016x}", hoardfs_server::random_verifier());
    let tmp = dir.join(format!("{CLIENT_ID}.tmp"));
    hoardfs_cache::private::write(&tmp, format!("{id}\n").as_bytes())
        .and_then(|()| std::fs::File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, &p))
        .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    Ok(id)
}

/// The origin of a mount, and for a hoardfs server its concrete type and, when it starts
/// disconnected, the namespace saved by an earlier mount.
struct OpenedOrigin {
    origin: Arc<dyn Origin>,
    remote: Option<Arc<RemoteOrigin>>,
    restored: Option<hoardfs_fs::NamespaceSnapshot>,
}

impl OpenedOrigin {
    fn other(origin: Arc<dyn Origin>) -> OpenedOrigin {
        OpenedOrigin {
            origin,
            remote: None,
            restored: None,
        }
    }
}

fn open_origin(a: &MountArgs) -> CliResult<OpenedOrigin> {
    if let Some(loc) = hoardfs_origin::s3::location::S3Location::parse(&a.source) {
        let state = a
            .cache_dir
            .as_deref()
            .filter(|_| !a.no_cache)
            .map(|d| d.join("s3"));
        let o = crate::s3::open(
            loc?,
            &crate::s3::S3Args {
                endpoint_url: a.endpoint_url.clone(),
                region: a.region.clone(),
                force_path_style: a.force_path_style,
                metadata_ttl: Duration::from_secs_f64(a.attr_timeout),
                max_stale: a.metadata_max_stale.map(Duration::from_secs_f64),
                list_rate: a.list_rate,
                immutable: a.immutable,
                read_only: a.read_only,
                timeout: Duration::from_secs_f64(a.timeout),
                owner: (a.uid, a.gid, a.file_mode, a.dir_mode),
            },
            state,
        )?;
        return Ok(OpenedOrigin::other(Arc::new(o)));
    }
    if a.source.starts_with('/') {
        let o = LocalOrigin::new(Path::new(&a.source), LocalOptions::default())
            .map_err(|e| format!("cannot use {} as a source: {e}", a.source))?;
        return Ok(OpenedOrigin::other(Arc::new(o)));
    }
    let known = a.cache_dir.as_deref().filter(|_| !a.no_cache);
    let sec = a.security.build(known)?;
    let opts = RemoteOptions {
        request_timeout: Duration::from_secs_f64(a.timeout),
        connect_timeout: Duration::from_secs_f64(a.timeout.min(5.0)),
        ..Default::default()
    };
    match RemoteOrigin::connect(&a.source, sec.security.clone(), opts) {
        Ok(o) => {
            sec.connected(&a.source)?;
            let o = Arc::new(o);
            Ok(OpenedOrigin {
                origin: o.clone(),
                remote: Some(o),
                restored: None,
            })
        }
        Err(e) => {
            let offline = known.and_then(|dir| {
                crate::disconnected::start_offline(dir, &a.source, sec.security.clone(), opts, &e)
            });
            let Some((o, snap)) = offline else {
                return Err(sec.explain(&a.source, &e).into());
            };
            eprintln!(
                "hoardfs: {} is unreachable ({e}); starting disconnected from the cache: \
                 cached files and names seen before are served, the rest fails with EIO \
                 until the server is back (reconnecting in the background)",
                a.source
            );
            let o = Arc::new(o);
            Ok(OpenedOrigin {
                origin: o.clone(),
                remote: Some(o),
                restored: Some(snap),
            })
        }
    }
}

/// Mounts and serves until unmounted, in phases: the arguments checked and the hoard
/// file read, the cache and the origin opened (`open_cache`, `open_origin`), the file
/// system started (`fs_config`), the FUSE session made (`session_config`) and run, and
/// what must outlive the mount saved (`after_unmount`).
fn mount_and_serve(args: MountArgs) -> CliResult<()> {
    let mut a = args.resolve()?;
    if let crate::source::Source::Server(addr) = crate::source::parse(&a.source)? {
        a.source = addr;
    }
    if !a.mountpoint.is_dir() {
        return Err(format!("mount point {} is not a directory", a.mountpoint.display()).into());
    }
    let limits = a.free_space.limits(a.cache_size)?;
    let hoard = read_hoard(&a)?;
    let cache = match (&a.cache_dir, a.no_cache) {
        (Some(dir), false) => Some(open_cache_dir(dir, limits)?),
        _ => None,
    };
    let OpenedOrigin {
        origin,
        remote,
        restored,
    } = open_origin(&a)?;
    let export_id = origin
        .info()
        .map_err(|e| format!("cannot start: {e}"))?
        .export_id;
    // Absolute: a daemon changes to / once mounted, and names are saved at unmount.
    let cache_dir = a
        .cache_dir
        .as_deref()
        .filter(|_| !a.no_cache)
        .map(|d| d.canonicalize().unwrap_or_else(|_| d.to_path_buf()));
    let cache_dir = cache_dir.as_deref();
    let known_names = cache_dir
        .map(|d| crate::names::of_export(&crate::names::load(d), export_id))
        .unwrap_or_default();
    if a.immutable {
        // Never revalidated: a year stands for forever.
        a.attr_timeout = 365.0 * 86400.0;
    }
    let config = fs_config(&a, cache_dir)?;
    let fs = HoardFs::new(origin, cache, config).map_err(|e| format!("cannot start: {e}"))?;
    if let Some(snap) = &restored {
        let n = fs.restore_namespace(snap);
        tracing::info!("started disconnected: {n} names restored from the cache directory");
    }
    let namespace_file = cache_dir
        .filter(|_| remote.is_some())
        .map(|d| crate::disconnected::namespace_file(d, &a.source));
    crate::disconnected::start_keeper(&fs, remote, namespace_file.clone(), a.source.clone());
    // Canonicalised before the mount exists: afterwards the path would be served by us.
    let info = crate::control::MountInfo {
        source: a.source.clone(),
        mountpoint: a
            .mountpoint
            .canonicalize()
            .map_err(|e| format!("mount point {}: {e}", a.mountpoint.display()))?,
        known_names: Arc::new(known_names),
    };
    let _control = crate::control::start(fs.clone(), info.clone())?;
    let cfg = session_config(&a, fs.is_read_only())?;
    let bridge = FuseBridge::new(fs.clone());
    // The canonical path: a daemon leaves its working directory, and unmounts by path.
    let mut session = fuser::Session::new(bridge, &info.mountpoint, &cfg)
        .map_err(|e| format!("cannot mount on {}: {e}", a.mountpoint.display()))?;
    if a.fuse_transport == crate::mount_args::FuseTransport::IoUring && !session.io_uring() {
        return Err(format!(
            "--fuse-transport io-uring: the kernel did not enable FUSE over io_uring on \
             {} (the log says why)",
            a.mountpoint.display()
        )
        .into());
    }
    if a.readahead_kb > 0 {
        set_readahead(&info.mountpoint, a.readahead_kb);
    }
    fs.set_notifier(Arc::new(hoardfs_fuse::FuseNotifier(session.notifier())));
    if let Some(addr) = &a.metrics_listen {
        crate::metrics::start(addr, fs.clone(), info.clone())?;
    }
    if !hoard.is_empty() {
        crate::hoard::start(fs.clone(), info.mountpoint.clone(), hoard);
    }
    unmount_on_signals(session.unmount_callable(), a.mountpoint.clone())?;
    announce(&a, &info.mountpoint, session.io_uring());
    session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"))?;
    after_unmount(
        &fs,
        &a.source,
        cache_dir,
        export_id,
        namespace_file.as_deref(),
    );
    Ok(())
}

/// The hoard file's entries (none without `--hoard-file`).
fn read_hoard(a: &MountArgs) -> CliResult<Vec<crate::hoard::HoardEntry>> {
    let Some(p) = &a.hoard_file else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(p)
        .map_err(|e| format!("cannot read hoard file {}: {e}", p.display()))?;
    crate::hoard::parse(&text)
}

/// Opens the cache directory `dir` (created if missing; a file there is an error).
fn open_cache_dir(dir: &Path, limits: Limits) -> CliResult<CacheDir> {
    if dir.exists() && !dir.is_dir() {
        return Err(format!(
            "--cache-dir {} is a file, not a directory: give a directory (it is \
             created if missing)",
            dir.display()
        )
        .into());
    }
    open_cache(dir, limits)
}

/// Says the mount is up: on stdout with `--verbose` (with what /dev/fuse costs when
/// io_uring is off in the kernel), to systemd, and to the parent of a daemon (which then
/// detaches).
fn announce(a: &MountArgs, mountpoint: &Path, io_uring: bool) {
    if a.verbose {
        println!(
            "hoardfs: mounted {} on {}",
            a.source,
            a.mountpoint.display()
        );
        if !io_uring
            && a.fuse_transport == crate::mount_args::FuseTransport::Auto
            && let Some(hint) = uring_off_hint()
        {
            println!("hoardfs: {hint}");
        }
        let _ = std::io::stdout().flush();
    }
    MOUNTED.store(true, Ordering::SeqCst);
    crate::notify::ready(&format!("mounted {} on {}", a.source, mountpoint.display()));
    if READY_FD.load(Ordering::SeqCst) >= 0 {
        report_to_parent("ok");
        detach();
    }
}

/// The file system's configuration from the mount's arguments (`cache_dir`: absolute).
fn fs_config(a: &MountArgs, cache_dir: Option<&Path>) -> CliResult<FsConfig> {
    let client_id = cache_dir.map(client_id).transpose()?;
    Ok(FsConfig {
        client_id,
        unlinked_journal: cache_dir.map(|d| d.join(UNLINKED_JOURNAL)),
        attr_ttl: Duration::from_secs_f64(a.attr_timeout),
        callback_ttl: Duration::from_secs_f64(a.callback_timeout),
        read_only: a.read_only,
        dir_ttl: Duration::from_secs_f64(a.attr_timeout),
        passthrough: !a.no_passthrough,
        xattrs: a.xattrs,
        kernel_opens: a.kernel_opens,
        offline_log: cache_dir.map(|d| d.join(OFFLINE_LOG)),
        offline_writes: a.offline_writes,
        host: host_name(),
        write_back: a.write_back.into(),
        files_ahead: a.files_ahead,
        ..Default::default()
    })
}

/// The FUSE session's configuration: mount options, who may use the mount, threads and
/// transport.
fn session_config(a: &MountArgs, read_only: bool) -> CliResult<Config> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(a.source.clone()),
        MountOption::Subtype("hoardfs".into()),
        // The kernel checks permissions against the server's uid/gid/mode.
        MountOption::DefaultPermissions,
        if read_only {
            MountOption::RO
        } else {
            MountOption::RW
        },
        MountOption::NoDev,
        MountOption::NoSuid,
        // Said as it is: FUSE inodes are S_NOATIME and this daemon keeps no access times,
        // so reads never update them (`-o atime` is refused).
        MountOption::NoAtime,
    ];
    cfg.mount_options.extend(a.kernel_flags.iter().cloned());
    if root {
        // fuser mounts by mount(2) itself when it may, with type "fuse" and no subtype
        // (which only fusermount gets): the kernel takes it as an option, so that
        // /proc/mounts says "fuse.hoardfs", as for mounts by mount(8) or fusermount.
        cfg.mount_options
            .push(MountOption::CUSTOM("subtype=hoardfs".into()));
    }
    // A root mount lets every user in, each checked as the server checks them, except
    // of a bucket: every object there shows one owner and mode (--uid, --file-mode), so
    // others get in only when asked for (s3fs and rclone do the same).
    let s3 = hoardfs_origin::s3::location::S3Location::parse(&a.source).is_some();
    cfg.acl = if a.allow_other || (root && !s3) {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(8);
    cfg.clone_fd = true;
    cfg.io_uring = ring_config(a.fuse_transport)?;
    Ok(cfg)
}

/// Unmounts `mnt` (through `unmounter`) on the first SIGINT or SIGTERM.
fn unmount_on_signals(
    mut unmounter: fuser::SessionUnmounter,
    mnt: std::path::PathBuf,
) -> CliResult<()> {
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("signals: {e}"))?;
    std::thread::Builder::new()
        .name("hoardfs-signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                tracing::info!("signal received, unmounting {}", mnt.display());
                if let Err(e) = unmounter.unmount() {
                    eprintln!("hoardfs: unmount of {} failed: {e}", mnt.display());
                }
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Once unmounted: the names of cached files and the namespace saved for the next mount,
/// offline changes not yet sent reported, and the file system shut down.
fn after_unmount(
    fs: &HoardFs,
    source: &str,
    cache_dir: Option<&Path>,
    export_id: u128,
    namespace_file: Option<&Path>,
) {
    if let Some(dir) = cache_dir
        && let Ok(entries) = fs.cache_entries()
        && let Err(e) = crate::names::save(dir, export_id, &entries)
    {
        tracing::warn!(
            "cannot record the names of cached files in {}: {e}",
            dir.display()
        );
    }
    if let Some(p) = namespace_file {
        crate::disconnected::save(fs, p, source, &mut None, true);
    }
    if let Some(s) = fs.offline_stats().filter(|s| s.files > 0) {
        eprintln!(
            "hoardfs: {} file(s) changed while {} was unreachable ({} bytes) are not on the \
             server yet; they are kept in {} and sent at the next mount of this cache \
             directory",
            s.files,
            source,
            s.bytes,
            cache_dir.map_or_else(String::new, |d| format!(
                "{}/{export_id:032x}",
                d.join(OFFLINE_LOG).display()
            ))
        );
    }
    fs.shutdown();
}

/// Sets the kernel readahead of the FUSE mount on `mountpoint` (its backing device info,
/// found through /proc/self/mountinfo: a `stat` of the mount point would be a request to
/// this very daemon, which is not serving yet). Best effort: a failure is logged.
fn set_readahead(mountpoint: &Path, kb: u32) {
    let result = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("/proc/self/mountinfo: {e}"))
        .and_then(|info| {
            fuse_device_of(&info, mountpoint)
                .ok_or_else(|| "the mount is not in /proc/self/mountinfo".to_string())
        })
        .and_then(|dev| {
            let path = format!("/sys/class/bdi/{dev}/read_ahead_kb");
            std::fs::write(&path, kb.to_string()).map_err(|e| format!("{path}: {e}"))
        });
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    match result {
        Ok(()) => tracing::debug!(
            "kernel readahead of {} set to {kb} KiB",
            mountpoint.display()
        ),
        // Only root may write sysfs: for anyone else the default is expected, not news.
        Err(e) if !root => tracing::debug!("kernel readahead left at its default: {e}"),
        Err(e) => tracing::warn!(
            "cannot set the kernel readahead to {kb} KiB ({e}); daemon reads stay at the \
             kernel's default size"
        ),
    }
}

/// The `MAJOR:MINOR` device of the FUSE file system mounted last on `mountpoint`, from the
/// text of /proc/self/mountinfo.
fn fuse_device_of(mountinfo: &str, mountpoint: &Path) -> Option<String> {
    // Mount points are escaped there: space, tab, newline and backslash as octal.
    let mut want = String::new();
    for ch in mountpoint.to_string_lossy().chars() {
        match ch {
            ' ' | '\t' | '\n' | '\\' => want.push_str(&format!("\\{:03o}", ch as u32)),
            c => want.push(c),
        }
    }
    mountinfo
        .lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let f: Vec<&str> = mount.split(' ').collect();
            (f.len() >= 5 && f[4] == want && fs.starts_with("fuse")).then(|| f[2].to_string())
        })
        .next_back()
}

/// Leaves what the daemon inherited from whoever started it: stdin and stdout go to
/// /dev/null, stderr too unless it is a regular file (a log: `2>>/var/log/hoardfs.log`),
/// so that a terminal, pipe or socket sees its end (`hoardfs mount --daemon … 2>&1 | cat`
/// returns), and the working directory becomes `/` (so it keeps no file system busy).
fn detach() {
    // SAFETY: fstat into a local struct; open, dup2, close and chdir on values we own.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        let log_file = libc::fstat(2, &mut st) == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG;
        let fd = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if fd >= 0 {
            libc::dup2(fd, 0);
            libc::dup2(fd, 1);
            if !log_file {
                libc::dup2(fd, 2);
            }
            if fd > 2 {
                libc::close(fd);
            }
        }
        libc::chdir(c"/".as_ptr());
    }
}

/// The fuse module's switch for FUSE over io_uring.
const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// One line saying what serving over /dev/fuse costs and how to turn io_uring on, when
/// this kernel has FUSE over io_uring but it is off (`None` otherwise). Shown by `mount
/// -v` and `hoardfs stats`; the mount does not turn it on itself (doc/DESIGN.md).
pub(crate) fn uring_off_hint() -> Option<String> {
    let v = std::fs::read_to_string(URING_PARAM).ok()?;
    (v.trim() == "N").then(|| {
        format!(
            "FUSE over io_uring is off in this kernel ({URING_PARAM} is N): each FUSE \
             request costs about twice its io_uring round trip; as root, echo Y > \
             {URING_PARAM} and mount again (at boot: options fuse enable_uring=1 in \
             modprobe.d, or fuse.enable_uring=1 on the kernel command line)"
        )
    })
}

/// The FUSE-over-io_uring configuration for `--fuse-transport`: `None` for /dev/fuse only.
/// The kernel offers io_uring at INIT only while the fuse module's `enable_uring` parameter
/// is set, so `io-uring` checks it here to fail with a clear message rather than quietly
/// serving /dev/fuse.
fn ring_config(t: crate::mount_args::FuseTransport) -> CliResult<Option<fuser::RingConfig>> {
    use crate::mount_args::FuseTransport;
    const PARAM: &str = URING_PARAM;
    let rc = fuser::RingConfig::default();
    match t {
        FuseTransport::DevFuse => Ok(None),
        FuseTransport::Auto => Ok(Some(rc)),
        FuseTransport::IoUring => match std::fs::read_to_string(PARAM) {
            Ok(v) if v.trim() == "Y" => Ok(Some(rc)),
            Ok(_) => Err(format!(
                "--fuse-transport io-uring: the kernel does not offer FUSE over io_uring: \
                 {PARAM} is N (as root: echo Y > {PARAM}, then mount again)"
            )
            .into()),
            Err(e) => Err(format!(
                "--fuse-transport io-uring: this kernel has no FUSE over io_uring ({PARAM}: {e}; \
                 it needs Linux 6.14+ built with CONFIG_FUSE_IO_URING)"
            )
            .into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_mount_knows_which_directories_it_created() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(first_missing_ancestor(t.path()), None);
        let deep = t.path().join("a/b/c");
        assert_eq!(first_missing_ancestor(&deep), Some(t.path().join("a")));
        assert_eq!(
            first_missing_ancestor(Path::new("no-such-relative-dir/x")),
            Some(PathBuf::from("no-such-relative-dir"))
        );
    }

    #[test]
    fn finds_the_last_fuse_mount_on_an_escaped_mount_point() {
        let info = "\
22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw
90 22 0:51 / /mnt/my\\040data rw,nosuid - fuse.hoardfs hoardfs:a rw,user_id=0
91 22 0:52 / /mnt/my\\040data/x rw,nosuid - fuse.hoardfs hoardfs:b rw,user_id=0
92 90 0:53 / /mnt/my\\040data rw,nosuid - fuse.hoardfs hoardfs:c rw,user_id=0
93 22 8:2 / /mnt/disk rw - ext4 /dev/sda2 rw
";
        assert_eq!(
            fuse_device_of(info, Path::new("/mnt/my data")).as_deref(),
            Some("0:53"),
            "the last mount stacked on the path"
        );
        assert_eq!(
            fuse_device_of(info, Path::new("/mnt/disk")),
            None,
            "not FUSE"
        );
        assert_eq!(fuse_device_of(info, Path::new("/mnt/other")), None);
    }
}
