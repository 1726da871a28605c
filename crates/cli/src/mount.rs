//! `hoardfs mount SOURCE MOUNTPOINT`: mount a hoardfs server or local directory through FUSE
//! with a persistent disk cache. Runs until unmounted (`umount`, `fusermount3 -u`, SIGINT or
//! SIGTERM); `--daemon` returns once the mount is ready.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use fuser::{Config, MountOption, SessionACL};
use hoardfs_cache::{CacheDir, CacheError, Limits};
use hoardfs_fs::{FsConfig, HoardFs};
use hoardfs_fuse::FuseBridge;
use hoardfs_origin::Origin;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin};

/// Shown after the options of `hoardfs mount --help`.
const MOUNT_AFTER_HELP: &str = "\
Examples:
  hoardfs mount fileserver:7070 /mnt/data --cache-dir /var/cache/hoardfs/data
  hoardfs mount fileserver /mnt/data --cache-dir /var/cache/hoardfs/data --cache-size 50G \\
      --token-file /etc/hoardfs/token --daemon          # port 7070 when omitted
  hoardfs mount fileserver:7070 /mnt/data -o cache_dir=/var/cache/hoardfs/data,ro
  hoardfs mount /mnt/nfs/share /mnt/cached --cache-dir /var/cache/share   # any local directory
  umount /mnt/data

Cache size: the cache shares its file system with everything else on it. When free space
there drops below --bcull % (default 7), the least useful cached files are evicted until
--brun % (default 10) is free again; below --bstop % (default 3) nothing new is cached
(reads still work, straight from the server). --fcull, --frun and --fstop do the same for
free inodes. --cache-size adds a limit on the cache itself. Open and pinned files are never
evicted.";

/// Options of `hoardfs mount`.
#[derive(Args, Debug, Clone)]
#[command(after_help = MOUNT_AFTER_HELP)]
pub struct MountArgs {
    /// `HOST:PORT` of a hoardfs server (`HOST` alone: port 7070), or an absolute path to
    /// a local directory.
    pub source: String,
    /// Where to mount.
    pub mountpoint: PathBuf,
    /// Persistent cache directory (created if missing; one client at a time).
    #[arg(long)]
    pub cache_dir: Option<PathBuf>,
    #[command(flatten)]
    pub security: crate::security::ClientSecurityArgs,
    /// Read through without a disk cache.
    #[arg(long)]
    pub no_cache: bool,
    /// Return once the mount is ready, leaving the client running in the background.
    #[arg(long)]
    pub daemon: bool,
    /// Seconds attributes, names and listings are trusted without asking the server when
    /// it holds no callback for them (local-directory sources, after a lost connection).
    #[arg(long, default_value_t = 1.0)]
    pub attr_timeout: f64,
    /// Seconds attributes, names and listings are trusted at most while the server holds
    /// a callback for them (it reports every change; this bounds the damage of a lost one).
    #[arg(long, default_value_t = 600.0)]
    pub callback_timeout: f64,
    /// Mount read-only (also implied by a read-only server).
    #[arg(long)]
    pub read_only: bool,
    /// Seconds to wait for the server before failing an operation.
    #[arg(long, default_value_t = 15.0)]
    pub timeout: f64,
    /// Serve fully cached files with daemon reads instead of FUSE passthrough.
    #[arg(long)]
    pub no_passthrough: bool,
    /// Let the kernel open files without asking this daemon (needs --read-only and a disk
    /// cache). Saves a
    /// FUSE round trip per open (many small files read again and again from the page
    /// cache), but gives up passthrough and the version check at open: a change made
    /// elsewhere shows when the server's callback arrives, or, without callbacks, once
    /// the attribute timeout has passed (doc/SEMANTICS.md).
    #[arg(long)]
    pub kernel_opens: bool,
    /// Serve extended attributes. Off by default: each xattr call is then refused by the
    /// kernel itself (EOPNOTSUPP) instead of costing a round trip, and `ls -l` makes up to
    /// three per file.
    #[arg(long)]
    pub xattrs: bool,
    /// Let users other than the mounting one access the mount (default when run as root).
    #[arg(long)]
    pub allow_other: bool,
    /// Upper bound of the disk cache (allocated blocks plus records), e.g. `50G`, `512M`.
    /// Default: none; the free-space thresholds alone bound it.
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    /// Eviction, once started, goes on until this % of the cache file system's space is
    /// free.
    #[arg(long, default_value_t = 10, value_name = "PERCENT")]
    pub brun: u8,
    /// Eviction starts when less than this % of the cache file system's space is free.
    #[arg(long, default_value_t = 7, value_name = "PERCENT")]
    pub bcull: u8,
    /// Nothing new is cached while less than this % of the cache file system's space is
    /// free (reads go straight to the server).
    #[arg(long, default_value_t = 3, value_name = "PERCENT")]
    pub bstop: u8,
    /// As --brun, for free inodes (number of files) instead of space.
    #[arg(long, default_value_t = 10, value_name = "PERCENT")]
    pub frun: u8,
    /// As --bcull, for free inodes (number of files) instead of space.
    #[arg(long, default_value_t = 7, value_name = "PERCENT")]
    pub fcull: u8,
    /// As --bstop, for free inodes (number of files) instead of space.
    #[arg(long, default_value_t = 3, value_name = "PERCENT")]
    pub fstop: u8,
    /// Hoard file: paths or globs (one per line, optional priority) to pin and fetch.
    #[arg(long)]
    pub hoard_file: Option<PathBuf>,
    /// Serve Prometheus metrics on this address: PORT (loopback) or HOST:PORT.
    #[arg(long)]
    pub metrics_listen: Option<String>,
    /// Kernel readahead for reads the daemon serves (misses, partly cached files,
    /// `--no-cache`), in KiB: sequential reads reach the daemon as requests of up to this
    /// size (at most 1024, the largest FUSE request). The kernel's default is 128. Needs
    /// root (it is the mount's `read_ahead_kb` in /sys/class/bdi); 0 leaves it alone.
    #[arg(long, default_value_t = 1024)]
    pub readahead_kb: u32,
    /// Append log lines to FILE instead of writing them to stderr (never coloured; a
    /// failure to mount is logged there too).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Mount options, `-o key[=value],...`: every flag above with `_` for `-` (e.g.
    /// `cache_dir=DIR`, `no_cache`, `ro` for --read-only), the kernel's `exec`, `noexec`,
    /// `atime`, `noatime`, `sync`, `async`, `dirsync`, and, ignored, what mount(8) and
    /// fstab add: `rw`, `defaults`, `dev`, `suid` (hoardfs always mounts nodev,nosuid),
    /// `_netdev`, `nofail`, `auto`, `noauto`, `user`, `nouser`, `x-*`, `comment=`.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Kernel mount flags from `-o` (exec, noatime, sync, ...), passed on as given.
    #[arg(skip)]
    pub kernel_flags: Vec<MountOption>,
}

/// Options mount(8), mount.fuse3 and fstab add that mean nothing to hoardfs (`x-*` and
/// `comment=*` too): accepted and ignored. `dev` and `suid` are here because mount.fuse3
/// adds them to every mount by root, so a request for them cannot be told apart from
/// none: hoardfs always mounts nodev,nosuid (the server drops set-id bits and refuses
/// devices by default anyway).
const IGNORED_OPTIONS: &[&str] = &[
    "rw",
    "defaults",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "_netdev",
    "nofail",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "default_permissions",
    "relatime",
    "strictatime",
    "nodiratime",
    "lazytime",
];

/// Kernel flags FUSE honours, each with its opposite (the later one given wins).
const KERNEL_FLAGS: &[(&str, MountOption, MountOption)] = &[
    ("exec", MountOption::Exec, MountOption::NoExec),
    ("noexec", MountOption::NoExec, MountOption::Exec),
    ("atime", MountOption::Atime, MountOption::NoAtime),
    ("noatime", MountOption::NoAtime, MountOption::Atime),
    ("sync", MountOption::Sync, MountOption::Async),
    ("async", MountOption::Async, MountOption::Sync),
    ("dirsync", MountOption::DirSync, MountOption::DirSync),
];

/// The argument list of `hoardfs SOURCE MOUNTPOINT -o OPTIONS`, as mount.fuse3 (run by
/// mount(8) and fstab for type `fuse.hoardfs`) invokes it, rewritten to `hoardfs mount
/// --daemon SOURCE MOUNTPOINT -o OPTIONS`: mount(8) waits for the program to exit, so it
/// must return once the mount is ready. The first argument must look like a SOURCE
/// (`HOST:PORT` or `/path`), so that a mistyped command is still reported as one. Any
/// other argument list is returned unchanged.
pub fn helper_argv(
    mut args: Vec<std::ffi::OsString>,
    is_subcommand: impl Fn(&str) -> bool,
) -> Vec<std::ffi::OsString> {
    let helper = args.get(1).is_some_and(|a| {
        let a = a.to_string_lossy();
        (a.contains(':') || a.starts_with('/')) && !is_subcommand(&a)
    });
    if helper {
        args.splice(1..1, ["mount".into(), "--daemon".into()]);
    }
    args
}

/// The log file of a mount: `--log-file` or `-o log_file=` (none if the options are bad:
/// the mount then fails with their error).
pub fn log_file(args: &MountArgs) -> Option<PathBuf> {
    args.resolve().ok().and_then(|a| a.log_file)
}

impl MountArgs {
    /// Folds `-o` options into the typed flags.
    fn resolve(&self) -> Result<MountArgs, String> {
        let mut a = self.clone();
        for opt in self
            .options
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|o| !o.is_empty())
        {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            let need = || v.ok_or_else(|| format!("mount option {k} needs a value"));
            let num = || -> Result<f64, String> {
                need()?
                    .parse()
                    .map_err(|_| format!("mount option {k}: not a number"))
            };
            let pct = || -> Result<u8, String> {
                need()?
                    .parse()
                    .map_err(|_| format!("mount option {k}: not a percentage"))
            };
            if let Some((_, on, off)) = KERNEL_FLAGS.iter().find(|f| f.0 == k) {
                a.kernel_flags.retain(|f| f != on && f != off);
                a.kernel_flags.push(on.clone());
                continue;
            }
            if IGNORED_OPTIONS.contains(&k) || k.starts_with("x-") || k == "comment" {
                continue;
            }
            match k {
                "cache_dir" => a.cache_dir = Some(need()?.into()),
                "log_file" => a.log_file = Some(need()?.into()),
                "token_file" => a.security.token_file = Some(need()?.into()),
                "server_fingerprint" => a.security.server_fingerprint = Some(need()?.into()),
                "tls_ca" => a.security.tls_ca = Some(need()?.into()),
                "insecure_plaintext" => a.security.insecure_plaintext = true,
                "no_cache" => a.no_cache = true,
                "daemon" => a.daemon = true,
                "attr_timeout" => a.attr_timeout = num()?,
                "callback_timeout" => a.callback_timeout = num()?,
                "ro" | "read_only" => a.read_only = true,
                "timeout" => a.timeout = num()?,
                "no_passthrough" => a.no_passthrough = true,
                "kernel_opens" => a.kernel_opens = true,
                "xattrs" => a.xattrs = true,
                "allow_other" => a.allow_other = true,
                "cache_size" => a.cache_size = Some(parse_size(need()?)?),
                "brun" => a.brun = pct()?,
                "bcull" => a.bcull = pct()?,
                "bstop" => a.bstop = pct()?,
                "frun" => a.frun = pct()?,
                "fcull" => a.fcull = pct()?,
                "fstop" => a.fstop = pct()?,
                "hoard_file" => a.hoard_file = Some(need()?.into()),
                "metrics_listen" => a.metrics_listen = Some(need()?.into()),
                "readahead_kb" => {
                    a.readahead_kb = need()?
                        .parse()
                        .map_err(|_| format!("mount option {k}: not a number"))?
                }
                "fd" | "drop_privileges" => {
                    return Err(format!(
                        "mount option {k}: hoardfs opens /dev/fuse and mounts by itself; \
                         drop mount.fuse3's drop_privileges"
                    ));
                }
                _ => {
                    return Err(format!(
                        "unknown mount option {opt:?} (see hoardfs mount --help)"
                    ));
                }
            }
        }
        let valid = |x: f64, min: f64| x >= min && x < 1e6;
        if !valid(a.attr_timeout, 0.0)
            || !valid(a.callback_timeout, 0.0)
            || !valid(a.timeout, 0.001)
        {
            return Err("timeouts must be positive numbers of seconds".into());
        }
        if a.readahead_kb > 1024 {
            return Err("--readahead-kb is at most 1024 (the largest FUSE request)".into());
        }
        if a.kernel_opens && !a.read_only {
            return Err(
                "--kernel-opens needs --read-only: writes need the daemon to see \
                        every open and close"
                    .into(),
            );
        }
        if a.kernel_opens && a.no_cache {
            return Err("--kernel-opens needs a disk cache (--cache-dir), not --no-cache".into());
        }
        if a.cache_dir.is_none() && !a.no_cache {
            return Err("--cache-dir DIR is required (or --no-cache to read through)".into());
        }
        Ok(a)
    }
}

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(format!("{s:?}: unknown size suffix")),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 50G, 512M, 1048576)"))?;
    if n.is_nan() || n <= 0.0 {
        return Err(format!("{s:?}: the size must be positive"));
    }
    Ok((n * mult as f64) as u64)
}

/// Write end of the pipe to the waiting parent, when daemonised.
static READY_FD: AtomicI32 = AtomicI32::new(-1);

/// With `--daemon`, forks: the parent waits until the child reports the mount ready (exit
/// 0) or failed (its message, exit 1). Must run before any thread is started.
pub fn maybe_daemonize(args: &MountArgs) -> Result<(), String> {
    let a = args.resolve()?;
    if !a.daemon {
        return Ok(());
    }
    let mut fds = [0i32; 2];
    // SAFETY: plain pipe(2) into a local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: single-threaded at this point (checked by the caller's ordering).
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", std::io::Error::last_os_error())),
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
pub fn run(args: MountArgs) -> Result<(), String> {
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
        if report_to_parent(e) {
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
fn open_cache(dir: &Path, limits: Limits) -> Result<CacheDir, String> {
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
                ));
            }
            r => return r.map_err(|e| e.to_string()),
        }
    }
}

fn open_origin(a: &MountArgs) -> Result<Arc<dyn Origin>, String> {
    if a.source.starts_with('/') {
        let o = LocalOrigin::new(Path::new(&a.source), LocalOptions::default())
            .map_err(|e| format!("cannot use {} as a source: {e}", a.source))?;
        return Ok(Arc::new(o));
    }
    let known = a.cache_dir.as_deref().filter(|_| !a.no_cache);
    let sec = a.security.build(known)?;
    let opts = RemoteOptions {
        request_timeout: Duration::from_secs_f64(a.timeout),
        connect_timeout: Duration::from_secs_f64(a.timeout.min(5.0)),
        ..Default::default()
    };
    let o = RemoteOrigin::connect(&a.source, sec.security.clone(), opts)
        .map_err(|e| sec.explain(&a.source, &e))?;
    sec.connected(&a.source)?;
    Ok(Arc::new(o))
}

fn mount_and_serve(args: MountArgs) -> Result<(), String> {
    let mut a = args.resolve()?;
    if let crate::source::Source::Server(addr) = crate::source::parse(&a.source)? {
        a.source = addr;
    }
    crate::raise_fd_limit();
    if !a.mountpoint.is_dir() {
        return Err(format!(
            "mount point {} is not a directory",
            a.mountpoint.display()
        ));
    }
    let limits = Limits {
        max_bytes: a.cache_size,
        brun: a.brun,
        bcull: a.bcull,
        bstop: a.bstop,
        frun: a.frun,
        fcull: a.fcull,
        fstop: a.fstop,
    };
    limits.validate()?;
    let hoard = match &a.hoard_file {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .map_err(|e| format!("cannot read hoard file {}: {e}", p.display()))?;
            crate::hoard::parse(&text)?
        }
        None => Vec::new(),
    };
    let cache = match (&a.cache_dir, a.no_cache) {
        (Some(dir), false) => {
            if dir.exists() && !dir.is_dir() {
                return Err(format!(
                    "--cache-dir {} is a file, not a directory: give a directory (it is \
                     created if missing)",
                    dir.display()
                ));
            }
            Some(open_cache(dir, limits)?)
        }
        _ => None,
    };
    let origin = open_origin(&a)?;
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
    let config = FsConfig {
        attr_ttl: Duration::from_secs_f64(a.attr_timeout),
        callback_ttl: Duration::from_secs_f64(a.callback_timeout),
        read_only: a.read_only,
        dir_ttl: Duration::from_secs_f64(a.attr_timeout),
        passthrough: !a.no_passthrough,
        xattrs: a.xattrs,
        kernel_opens: a.kernel_opens,
        ..Default::default()
    };
    let fs = HoardFs::new(origin, cache, config).map_err(|e| format!("cannot start: {e}"))?;
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
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cfg = Config::default();
    cfg.mount_options = vec![
        MountOption::FSName(a.source.clone()),
        MountOption::Subtype("hoardfs".into()),
        // The kernel checks permissions against the server's uid/gid/mode.
        MountOption::DefaultPermissions,
        if fs.is_read_only() {
            MountOption::RO
        } else {
            MountOption::RW
        },
        MountOption::NoDev,
        MountOption::NoSuid,
    ];
    cfg.mount_options.extend(a.kernel_flags.iter().cloned());
    if root {
        // fuser mounts by mount(2) itself when it may, with type "fuse" and no subtype
        // (which only fusermount gets): the kernel takes it as an option, so that
        // /proc/mounts says "fuse.hoardfs", as for mounts by mount(8) or fusermount.
        cfg.mount_options
            .push(MountOption::CUSTOM("subtype=hoardfs".into()));
    }
    cfg.acl = if a.allow_other || root {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    cfg.n_threads = Some(8);
    cfg.clone_fd = true;
    let notifier = Arc::new(std::sync::OnceLock::new());
    let bridge = FuseBridge::new(fs.clone(), notifier.clone());
    // The canonical path: a daemon leaves its working directory, and unmounts by path.
    let mut session = fuser::Session::new(bridge, &info.mountpoint, &cfg)
        .map_err(|e| format!("cannot mount on {}: {e}", a.mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
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
    let mut unmounter = session.unmount_callable();
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .map_err(|e| format!("signals: {e}"))?;
    let mnt = a.mountpoint.clone();
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
    println!(
        "hoardfs: mounted {} on {}",
        a.source,
        a.mountpoint.display()
    );
    let _ = std::io::stdout().flush();
    MOUNTED.store(true, Ordering::SeqCst);
    crate::notify::ready(&format!(
        "mounted {} on {}",
        a.source,
        info.mountpoint.display()
    ));
    if READY_FD.load(Ordering::SeqCst) >= 0 {
        report_to_parent("ok");
        detach();
    }
    session
        .run()
        .map_err(|e| format!("FUSE session ended with an error: {e}"))?;
    if let Some(dir) = cache_dir
        && let Ok(entries) = fs.cache_entries()
        && let Err(e) = crate::names::save(dir, export_id, &entries)
    {
        tracing::warn!(
            "cannot record the names of cached files in {}: {e}",
            dir.display()
        );
    }
    fs.shutdown();
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::FromArgMatches as _;

    fn parse(args: &[&str]) -> MountArgs {
        let cmd = MountArgs::augment_args(clap::Command::new("mount"));
        let m = cmd
            .try_get_matches_from(["mount", "host:1", "/mnt"].iter().chain(args))
            .unwrap();
        MountArgs::from_arg_matches(&m).unwrap()
    }

    #[test]
    fn every_flag_is_also_a_mount_option() {
        let cmd = MountArgs::augment_args(clap::Command::new("mount"));
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else {
                continue;
            };
            let key = long.replace('-', "_");
            let takes_value = arg.get_action().takes_values();
            let opt = if takes_value {
                format!("{key}=1")
            } else {
                key.clone()
            };
            let r = parse(&["-o", &opt, "--no-cache"]).resolve();
            if let Err(e) = &r {
                assert!(
                    !e.contains("unknown mount option"),
                    "--{long} has no -o form: {e}"
                );
            }
        }
    }

    #[test]
    fn mount_8_and_fstab_options_are_accepted() {
        let a = parse(&[
            "-o",
            "rw,cache_dir=/c,dev,suid,_netdev,nofail,noauto,auto,user,nouser,defaults",
            "-o",
            "x-systemd.automount,x-systemd.idle-timeout=60,comment=hello world,noexec",
            "-o",
            "exec,noatime,allow_other,ro,metrics_listen=9100,bcull=9",
        ])
        .resolve()
        .unwrap();
        assert_eq!(a.cache_dir.as_deref(), Some(Path::new("/c")));
        assert!(a.read_only && a.allow_other);
        assert_eq!(a.metrics_listen.as_deref(), Some("9100"));
        assert_eq!(a.bcull, 9);
        // The later of exec/noexec wins.
        assert_eq!(
            a.kernel_flags,
            vec![MountOption::Exec, MountOption::NoAtime]
        );
        let e = parse(&["-o", "cache_dir=/c,bogus"]).resolve().unwrap_err();
        assert!(e.contains("unknown mount option \"bogus\""), "{e}");
        let e = parse(&["-o", "cache_dir=/c,fd=3"]).resolve().unwrap_err();
        assert!(e.contains("drop_privileges"), "{e}");
    }

    #[test]
    fn mount_helper_arguments_become_a_daemon_mount() {
        let is_sub = |s: &str| ["mount", "serve", "help"].contains(&s);
        let v = |a: &[&str]| {
            a.iter()
                .map(Into::into)
                .collect::<Vec<std::ffi::OsString>>()
        };
        assert_eq!(
            helper_argv(v(&["hoardfs", "srv:7070", "/mnt", "-o", "rw"]), is_sub),
            v(&[
                "hoardfs", "mount", "--daemon", "srv:7070", "/mnt", "-o", "rw"
            ])
        );
        assert_eq!(
            helper_argv(v(&["hoardfs", "/srv/data", "/mnt"]), is_sub),
            v(&["hoardfs", "mount", "--daemon", "/srv/data", "/mnt"])
        );
        for unchanged in [
            &["hoardfs", "mount", "srv:7070", "/mnt"][..],
            &["hoardfs", "moutn", "srv:7070", "/mnt"],
            &["hoardfs", "--version"],
            &["hoardfs", "help"],
            &["hoardfs"],
        ] {
            assert_eq!(helper_argv(v(unchanged), is_sub), v(unchanged));
        }
    }

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
