//! The options of `hoardfs mount`: the clap flags, the same flags as `-o key=value` mount
//! options (as mount(8) and fstab pass them), the generic options mount(8) adds, and the
//! argument shape `mount.fuse3` uses to run this program as the `fuse.hoardfs` helper.

use crate::error::{CliError, CliResult};
use std::path::PathBuf;

use clap::Args;
use fuser::MountOption;
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
    /// Say `hoardfs: mounted SOURCE on MOUNTPOINT` on stdout once the mount is ready (a
    /// successful mount is otherwise silent, as mount(8), NFS and sshfs are).
    #[arg(long, short = 'v')]
    pub verbose: bool,
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
    /// How the kernel's FUSE requests reach this daemon. `auto`: over io_uring (one queue
    /// per CPU; about half the round trip of /dev/fuse, so faster opens of small files)
    /// when the kernel offers it, that is while the fuse module's `enable_uring` parameter
    /// is set (`echo Y > /sys/module/fuse/parameters/enable_uring`, or `fuse.enable_uring=1`
    /// on the kernel command line; Linux 6.14+), else /dev/fuse. `io-uring`: fail the mount
    /// if the kernel does not offer it. `dev-fuse`: never use io_uring.
    #[arg(long, value_enum, default_value_t = FuseTransport::Auto)]
    pub fuse_transport: FuseTransport,
    /// When writes reach the server. `close` (default): behind the writer, in batches of
    /// up to 2 MiB sent in the order they were made; `close()` and `fsync()` return once
    /// every byte written is on the server (another client opening the file after the
    /// close sees all of it), and fail if a write did not get there (`ENOSPC`, `EDQUOT`,
    /// `EIO`: reported there and at the file's next write instead of at the `write()`
    /// itself). `through`: every `write()` reaches the server before it returns (one
    /// round trip each; errors at the write that caused them). `async` (Coda's weakly
    /// connected mode; needs --cache-dir and a hoardfs server): creations, removals,
    /// renames, symlinks, chmod/utimes and the content of new files are kept in the
    /// change log at local speed and sent within about a second in the background
    /// (`hoardfs sync` waits for them; `hoardfs stats` shows what waits); other clients
    /// see them only then, and errors such as ENOSPC come as conflicts, not at the call
    /// (doc/SEMANTICS.md, "Write-back").
    #[arg(long, value_enum, default_value_t = WriteBackMode::Close)]
    pub write_back: WriteBackMode,
    /// Serve extended attributes. Off by default: each xattr call is then refused by the
    /// kernel itself (EOPNOTSUPP) instead of costing a round trip, and `ls -l` makes up to
    /// three per file.
    #[arg(long)]
    pub xattrs: bool,
    /// Keep changes made while the server is unreachable (writes and truncations of fully
    /// cached files; creating, removing and renaming files, directories and symlinks;
    /// chmod, utimes), in a log in the cache directory, and send them back when it returns;
    /// a file changed on both sides keeps the server's version and gets this client's
    /// next to it as NAME.conflict-HOST-TIME (`hoardfs conflicts`). Off by default:
    /// other clients do not see such changes until then, and `fsync` then means "on this
    /// disk" (doc/SEMANTICS.md, "Offline writes").
    #[arg(long)]
    pub offline_writes: bool,
    /// Let users other than the mounting one access the mount (default when run as root).
    #[arg(long)]
    pub allow_other: bool,
    /// Upper bound of the disk cache (allocated blocks plus records), e.g. `50G`, `512M`.
    /// Default: none; the free-space thresholds alone bound it.
    #[arg(long, value_parser = parse_size)]
    pub cache_size: Option<u64>,
    #[command(flatten)]
    pub free_space: crate::free_space::FreeSpaceArgs,
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
    /// Files fetched at once ahead of a reader walking a directory in listing order (the
    /// next files of the listing, fetched whole into the disk cache; files up to 16 MiB).
    /// 0 turns it off.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub files_ahead: usize,
    /// Append log lines to FILE instead of writing them to stderr (never coloured; a
    /// failure to mount is logged there too).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// S3 sources: the store's endpoint URL (default: AWS's for the region;
    /// `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL` are read too).
    #[arg(long, value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// S3 sources: the region used to sign requests (default: `AWS_REGION`,
    /// `AWS_DEFAULT_REGION`, the profile's, else us-east-1).
    #[arg(long)]
    pub region: Option<String>,
    /// S3 sources: address the bucket as ENDPOINT/BUCKET rather than BUCKET.ENDPOINT
    /// (needed for most stores other than AWS, and for IP addresses).
    #[arg(long)]
    pub force_path_style: bool,
    /// S3 sources: how long listings, attributes and "no such file" answers are trusted
    /// before the store is asked again, in seconds (S3 has no callbacks). Sets
    /// --attr-timeout.
    #[arg(long, value_name = "SECS")]
    pub metadata_ttl: Option<f64>,
    /// S3 sources: how old a listing may be, in seconds, and still be answered from while
    /// it is listed again in the background once --metadata-ttl has passed; beyond it,
    /// readers wait for the store (default 5, or 0 with --metadata-ttl 0: never past the
    /// TTL).
    #[arg(long, value_name = "SECS")]
    pub metadata_max_stale: Option<f64>,
    /// S3 sources: listing requests per second the background revalidation may send
    /// (default 20; a listing of up to 1,000 keys is one request).
    #[arg(long, value_name = "N")]
    pub list_rate: Option<f64>,
    /// S3 sources: the bucket never changes (published datasets): never revalidate.
    #[arg(long)]
    pub immutable: bool,
    /// S3 sources: the owner every object and directory shows (default: the mounting
    /// user). Only this user may use the mount unless --allow-other.
    #[arg(long, value_name = "UID")]
    pub uid: Option<u32>,
    /// S3 sources: the group every object and directory shows (default: the mounting
    /// user's).
    #[arg(long, value_name = "GID")]
    pub gid: Option<u32>,
    /// S3 sources: the permission bits of every object, octal (default 644; e.g. 640 to
    /// let the --gid group read, 600 for the owner alone).
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub file_mode: Option<u16>,
    /// S3 sources: the permission bits of every directory, octal (default 755).
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub dir_mode: Option<u16>,
    /// Mount options, `-o key[=value],...`: every flag above with `_` for `-` (e.g.
    /// `cache_dir=DIR`, `no_cache`, `ro` for --read-only), the kernel's `exec`, `noexec`,
    /// `sync`, `async`, `dirsync` (every mount is `noatime`; `atime` is refused), and,
    /// ignored, what mount(8) and
    /// fstab add: `rw`, `defaults`, `dev`, `suid` (hoardfs always mounts nodev,nosuid),
    /// `_netdev`, `nofail`, `auto`, `noauto`, `user`, `nouser`, `x-*`, `comment=`.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
    /// Kernel mount flags from `-o` (exec, noatime, sync, ...), passed on as given.
    #[arg(skip)]
    pub kernel_flags: Vec<MountOption>,
}

/// When writes reach the server (`--write-back`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteBackMode {
    /// Behind the writer; `close()` and `fsync()` wait for them.
    Close,
    /// Before each `write()` returns.
    Through,
    /// Names and new files through the change log, sent within a second.
    Async,
}

impl From<WriteBackMode> for hoardfs_fs::WriteBack {
    fn from(m: WriteBackMode) -> Self {
        match m {
            WriteBackMode::Close => hoardfs_fs::WriteBack::Close,
            WriteBackMode::Through => hoardfs_fs::WriteBack::Through,
            WriteBackMode::Async => hoardfs_fs::WriteBack::Async,
        }
    }
}

/// How FUSE requests reach the daemon (`--fuse-transport`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseTransport {
    /// io_uring when the kernel offers it, else /dev/fuse.
    Auto,
    /// io_uring, or the mount fails.
    IoUring,
    /// /dev/fuse only.
    DevFuse,
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
    // Every mount is noatime (see `mount::fuse_config`).
    "noatime",
    "nodiratime",
    "lazytime",
];

/// Kernel flags FUSE honours, each with its opposite (the later one given wins).
const KERNEL_FLAGS: &[(&str, MountOption, MountOption)] = &[
    ("exec", MountOption::Exec, MountOption::NoExec),
    ("noexec", MountOption::NoExec, MountOption::Exec),
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
    /// Folds `-o` options into the typed flags, then checks that they go together.
    pub(crate) fn resolve(&self) -> CliResult<MountArgs> {
        let mut a = self.clone();
        for opt in self
            .options
            .iter()
            .flat_map(|o| o.split(','))
            .filter(|o| !o.is_empty())
        {
            a.apply_option(opt).map_err(CliError::into_usage)?;
        }
        if let Some(t) = a.metadata_ttl {
            a.attr_timeout = t;
        }
        a.check().map_err(CliError::into_usage)?;
        Ok(a)
    }

    /// Applies one `-o` option (`KEY` or `KEY=VALUE`).
    fn apply_option(&mut self, opt: &str) -> CliResult<()> {
        let a = self;
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = || v.ok_or_else(|| format!("mount option {k} needs a value"));
        let num = || -> CliResult<f64> {
            need()?
                .parse()
                .map_err(|_| CliError::Usage(format!("mount option {k}: not a number")))
        };
        let pct = || -> CliResult<u8> {
            need()?
                .parse()
                .map_err(|_| CliError::Usage(format!("mount option {k}: not a percentage")))
        };
        if let Some((_, on, off)) = KERNEL_FLAGS.iter().find(|f| f.0 == k) {
            a.kernel_flags.retain(|f| f != on && f != off);
            a.kernel_flags.push(on.clone());
            return Ok(());
        }
        if IGNORED_OPTIONS.contains(&k) || k.starts_with("x-") || k == "comment" {
            return Ok(());
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
            "verbose" => a.verbose = true,
            "atime" => {
                return Err(CliError::Usage(
                    "mount option atime: hoardfs does not keep access times (reads through \
                     the mount never update them), so every mount is noatime"
                        .into(),
                ));
            }
            "attr_timeout" => a.attr_timeout = num()?,
            "callback_timeout" => a.callback_timeout = num()?,
            "ro" | "read_only" => a.read_only = true,
            "timeout" => a.timeout = num()?,
            "no_passthrough" => a.no_passthrough = true,
            "kernel_opens" => a.kernel_opens = true,
            "fuse_transport" => {
                a.fuse_transport = <FuseTransport as clap::ValueEnum>::from_str(need()?, false)
                    .map_err(|_| format!("mount option {k}: one of auto, io-uring, dev-fuse"))?
            }
            "write_back" => {
                a.write_back = <WriteBackMode as clap::ValueEnum>::from_str(need()?, false)
                    .map_err(|_| format!("mount option {k}: one of close, through"))?
            }
            "xattrs" => a.xattrs = true,
            "offline_writes" => a.offline_writes = true,
            "allow_other" => a.allow_other = true,
            "endpoint_url" => a.endpoint_url = Some(need()?.into()),
            "region" => a.region = Some(need()?.into()),
            "force_path_style" => a.force_path_style = true,
            "metadata_ttl" => a.metadata_ttl = Some(num()?),
            "metadata_max_stale" => a.metadata_max_stale = Some(num()?),
            "list_rate" => a.list_rate = Some(num()?),
            "immutable" => a.immutable = true,
            "uid" => {
                a.uid = Some(
                    need()?
                        .parse()
                        .map_err(|_| format!("mount option {k}: not a uid"))?,
                )
            }
            "gid" => {
                a.gid = Some(
                    need()?
                        .parse()
                        .map_err(|_| format!("mount option {k}: not a gid"))?,
                )
            }
            "file_mode" => a.file_mode = Some(parse_mode(need()?)?),
            "dir_mode" => a.dir_mode = Some(parse_mode(need()?)?),
            "cache_size" => a.cache_size = Some(parse_size(need()?)?),
            k if crate::free_space::FreeSpaceArgs::NAMES.contains(&k) => {
                let p = pct()?;
                a.free_space.set(k, p);
            }
            "hoard_file" => a.hoard_file = Some(need()?.into()),
            "metrics_listen" => a.metrics_listen = Some(need()?.into()),
            "files_ahead" => {
                a.files_ahead = need()?
                    .parse()
                    .map_err(|_| CliError::Usage(format!("mount option {k}: not a number")))?
            }
            "readahead_kb" => {
                a.readahead_kb = need()?
                    .parse()
                    .map_err(|_| CliError::Usage(format!("mount option {k}: not a number")))?
            }
            "fd" | "drop_privileges" => {
                return Err(format!(
                    "mount option {k}: hoardfs opens /dev/fuse and mounts by itself; \
                     drop mount.fuse3's drop_privileges"
                )
                .into());
            }
            _ => {
                return Err(
                    format!("unknown mount option {opt:?} (see hoardfs mount --help)").into(),
                );
            }
        }
        Ok(())
    }

    /// Whether the flags go together (and their values are in range).
    fn check(&self) -> CliResult<()> {
        let a = self;
        let s3 = a.source.starts_with("s3://");
        if !s3
            && (a.endpoint_url.is_some()
                || a.region.is_some()
                || a.force_path_style
                || a.immutable
                || a.metadata_ttl.is_some()
                || a.metadata_max_stale.is_some()
                || a.list_rate.is_some())
        {
            return Err(
                "--endpoint-url, --region, --force-path-style, --metadata-ttl, \
                 --metadata-max-stale, --list-rate and --immutable apply to s3:// sources \
                 only"
                    .into(),
            );
        }
        if a.metadata_max_stale
            .is_some_and(|x| !(0.0..1e6).contains(&x))
            || a.list_rate.is_some_and(|x| !(x > 0.0 && x < 1e6))
        {
            return Err(
                "--metadata-max-stale is a number of seconds, --list-rate a positive \
                 number of requests per second"
                    .into(),
            );
        }
        let valid = |x: f64, min: f64| x >= min && x < 1e6;
        if !valid(a.attr_timeout, 0.0)
            || !valid(a.callback_timeout, 0.0)
            || !valid(a.timeout, 0.001)
        {
            return Err("timeouts must be positive numbers of seconds".into());
        }
        if a.files_ahead > 64 {
            return Err("--files-ahead is at most 64".into());
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
        let logged = if a.offline_writes {
            Some("--offline-writes")
        } else if a.write_back == WriteBackMode::Async {
            Some("--write-back=async")
        } else {
            None
        };
        if let Some(opt) = logged {
            if a.no_cache || a.cache_dir.is_none() {
                return Err(format!("{opt} needs a disk cache (--cache-dir)").into());
            }
            if s3 || a.source.starts_with('/') {
                return Err(format!(
                    "{opt} applies to hoardfs servers (HOST:PORT), not to s3:// or \
                     local-path sources"
                )
                .into());
            }
        }
        if a.cache_dir.is_none() && !a.no_cache {
            return Err("--cache-dir DIR is required (or --no-cache to read through)".into());
        }
        Ok(())
    }
}

/// Permission bits in octal (`644`, `0750`), at most 7777.
pub fn parse_mode(s: &str) -> CliResult<u16> {
    match u16::from_str_radix(s, 8) {
        Ok(m) if m <= 0o7777 => Ok(m),
        _ => Err(CliError::Usage(format!(
            "{s:?} is not an octal mode such as 644"
        ))),
    }
}

/// Parses a byte size: a number with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size(s: &str) -> CliResult<u64> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let m = match c.to_ascii_uppercase() {
                'K' => 1u64 << 10,
                'M' => 1 << 20,
                'G' => 1 << 30,
                'T' => 1 << 40,
                _ => return Err(CliError::Usage(format!("{s:?}: unknown size suffix"))),
            };
            (&t[..i], m)
        }
        _ => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| CliError::Usage(format!("{s:?} is not a size (e.g. 50G, 512M, 1048576)")))?;
    if n.is_nan() || n <= 0.0 {
        return Err(CliError::Usage(format!("{s:?}: the size must be positive")));
    }
    Ok((n * mult as f64) as u64)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

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
                    !e.to_string().contains("unknown mount option"),
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
        assert_eq!(a.free_space.bcull, Some(9));
        // The later of exec/noexec wins; noatime is every mount's (not a flag to pass).
        assert_eq!(a.kernel_flags, vec![MountOption::Exec]);
        let e = parse(&["-o", "cache_dir=/c,atime"]).resolve().unwrap_err();
        assert!(matches!(e, CliError::Usage(_)), "a usage error: {e:?}");
        assert!(e.to_string().contains("noatime"), "{e}");
        let e = parse(&["-o", "cache_dir=/c,bogus"]).resolve().unwrap_err();
        assert!(matches!(e, CliError::Usage(_)), "a usage error: {e:?}");
        let e = e.to_string();
        assert!(e.contains("unknown mount option \"bogus\""), "{e}");
        let e = parse(&["-o", "cache_dir=/c,fd=3"])
            .resolve()
            .unwrap_err()
            .to_string();
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
}
