//! `hoardfs serve DIR`: export a directory.

use crate::error::{CliError, CliResult};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use hoardfs_origin::local::{LocalOptions, LocalOrigin};
use hoardfs_server::{ServerConfig, run_blocking};

/// Options of `hoardfs serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Directory to export.
    #[arg(required_unless_present_any = ["print_fingerprint", "origin"], conflicts_with = "origin")]
    pub dir: Option<PathBuf>,
    /// Export an S3 bucket instead of a directory, as a shared cache tier:
    /// `s3://BUCKET[/PREFIX]`. File data read by any client is cached in --cache-dir and
    /// fetched from the store once; the directories clients use are listed again every
    /// --metadata-ttl and changes are sent to clients as callbacks.
    #[arg(long, value_name = "s3://BUCKET[/PREFIX]")]
    pub origin: Option<String>,
    /// With --origin: the tier's cache directory (data, listings, files being written;
    /// default: `tier-cache-HASH` in the state directory, `HASH` of the --origin URL).
    #[arg(long, requires = "origin")]
    pub cache_dir: Option<PathBuf>,
    /// With --origin: most bytes the tier's cache may hold (K/M/G/T suffixes).
    #[arg(long, requires = "origin", value_parser = crate::mount_args::parse_size)]
    pub cache_size: Option<u64>,
    /// With --origin: the store's endpoint URL.
    #[arg(long, requires = "origin", value_name = "URL")]
    pub endpoint_url: Option<String>,
    /// With --origin: the region used to sign requests.
    #[arg(long, requires = "origin")]
    pub region: Option<String>,
    /// With --origin: path-style bucket URLs.
    #[arg(long, requires = "origin")]
    pub force_path_style: bool,
    /// With --origin: seconds between listings of the directories clients use (and how
    /// long a listing or a "no such file" is trusted).
    #[arg(long, requires = "origin", default_value_t = 1.0, value_name = "SECS")]
    pub metadata_ttl: f64,
    /// With --origin: how old a listing may be, in seconds, and still be answered from
    /// while it is listed again in the background (default 5, or 0 with --metadata-ttl
    /// 0); beyond it, requests wait for the store.
    #[arg(long, requires = "origin", value_name = "SECS")]
    pub metadata_max_stale: Option<f64>,
    /// With --origin: listing requests per second the background revalidation may send
    /// (default 20).
    #[arg(long, requires = "origin", value_name = "N")]
    pub list_rate: Option<f64>,
    /// With --origin: the bucket never changes: list each directory once.
    #[arg(long, requires = "origin")]
    pub immutable: bool,
    /// With --origin: how long a request to the store may take, in seconds.
    #[arg(long, requires = "origin", default_value_t = 15.0)]
    pub timeout: f64,
    /// Print the server's identity (the fingerprint clients pin with
    /// --server-fingerprint), generating it first if needed, and exit.
    #[arg(long)]
    pub print_fingerprint: bool,
    #[command(flatten)]
    pub tls: crate::security::ServerTlsArgs,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// File holding one secret shared by every client. Named, revocable credentials
    /// (`hoardfs token add NAME`, kept in --state-dir) work alongside it.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Refuse all modifications (EROFS for clients).
    #[arg(long)]
    pub read_only: bool,
    #[command(flatten)]
    pub id_map: IdMapArgs,
    /// Allow listening on a non-loopback address without any credential.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Most authenticated client connections at once (each mount holds one); more are
    /// refused with "server busy". Lowered to fit the open-file limit if needed.
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// Seconds a connection may stay silent (clients ping every 30 s while idle) or leave
    /// its replies unread before it is closed.
    #[arg(long, default_value_t = 120.0)]
    pub idle_timeout: f64,
    /// MiB of request and reply data in flight for the whole server; a client that stops
    /// reading replies holds at most --conn-memory-mib of it.
    #[arg(long, default_value_t = 1024)]
    pub max_memory_mib: usize,
    /// MiB of request and reply data in flight per connection (at least 8). A client's
    /// readahead for many parallel readers keeps about this much in flight.
    #[arg(long, default_value_t = 128)]
    pub conn_memory_mib: usize,
    /// Most files kept open for reading at once [default: 4096] (lowered to fit the
    /// open-file limit).
    #[arg(long, value_name = "N")]
    pub max_open_files: Option<usize>,
    /// Copy every read through the server's memory instead of sending file data with
    /// sendfile(2) (zero-copy is used only for files unchanged for 2 s).
    #[arg(long)]
    pub no_zero_copy: bool,
    /// Append log lines to FILE instead of writing them to stderr (never coloured).
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    // Last: the heading carries over to the flags after it.
    #[command(
        flatten,
        next_help_heading = "Free space of the tier's cache (with --origin)"
    )]
    pub free_space: crate::free_space::FreeSpaceArgs,
}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> CliResult<()> {
    if a.print_fingerprint {
        println!("{}", a.tls.identity()?.fingerprint());
        return Ok(());
    }
    if a.origin.is_some() {
        return run_tier(a);
    }
    if a.free_space.any_given() {
        return Err(
            "--brun/--bcull/--bstop/--frun/--fcull/--fstop set the thresholds of the \
                    tier's cache (with --origin); an exported directory has no cache"
                .into(),
        );
    }
    let dir = a.dir.clone().expect("clap requires DIR");
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()).into());
    }
    let (cfg, identity, limits) = server_config(&a, &dir.display().to_string())?;
    let opts = LocalOptions {
        read_only: a.read_only,
        max_open_files: limits.open_files,
        max_handles: limits.handles,
        max_watches: limits.watches,
        // As root, every request is performed as its (mapped) caller, so the kernel
        // checks it; otherwise the export is what this user may do, for everyone.
        act_as_callers: hoardfs_origin::local::creds::can_switch(),
        ..Default::default()
    };
    if !opts.act_as_callers {
        let me = hoardfs_origin::caller::process();
        tracing::warn!(
            uid = me.uid,
            "not running as root: every request is performed with this user's rights \
             (files are created as this user; only the clients' kernels check permissions)"
        );
    }
    let origin = Arc::new(
        LocalOrigin::new(&dir, opts)
            .map_err(|e| format!("cannot export {}: {e}", dir.display()))?,
    );
    let counters = {
        let o = origin.clone();
        Arc::new(move || o.counters()) as hoardfs_server::OriginCounters
    };
    let root = origin.root_path().to_path_buf();
    let dir = root.display().to_string();
    let mut cfg = cfg;
    let instance =
        crate::instance::Instance::start(cfg.tokens_dir.as_deref().expect("set above"), &root);
    cfg.verifier = instance.verifier;
    run_blocking(cfg, origin, Some(counters), |addr| {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "hoardfs: serving {dir} on {addr} ({identity})");
        let _ = out.flush();
        crate::notify::ready(&format!("serving {dir} on {addr}"));
    })
    .map_err(|e| CliError::Failed(format!("cannot serve on {}: {e}", a.listen)))?;
    instance.stopped_cleanly(&root);
    Ok(())
}

/// The server configuration shared by directory exports and tiers.
fn server_config(a: &ServeArgs, what: &str) -> CliResult<(ServerConfig, String, FdBudget)> {
    let state_dir = a.tls.state_dir();
    let named_tokens = state_dir
        .join(hoardfs_server::credentials::TOKENS_FILE)
        .exists();
    if !a.listen.ip().is_loopback()
        && a.token_file.is_none()
        && !named_tokens
        && !a.allow_unauthenticated
    {
        return Err(format!(
            "refusing to listen on {} without authentication: anyone who can reach it could read {what}. \
             Create client credentials with `hoardfs token add NAME` (or pass --token-file FILE), \
             or pass --allow-unauthenticated on a trusted network",
            a.listen,
        ).into());
    }
    if !(a.idle_timeout.is_finite() && a.idle_timeout > 0.0) {
        return Err(format!(
            "--idle-timeout {} must be a positive number of seconds",
            a.idle_timeout
        )
        .into());
    }
    // Idle clients send something at least every PING_INTERVAL.
    let min_idle = 2.0 * hoardfs_proto::PING_INTERVAL.as_secs_f64();
    if a.idle_timeout < min_idle {
        tracing::warn!(
            "--idle-timeout {} is under {min_idle} s: idle clients ping every {} s, so their \
             connections (and callbacks) may be cut while they are idle",
            a.idle_timeout,
            hoardfs_proto::PING_INTERVAL.as_secs()
        );
    }
    let token = a.token_file.as_deref().map(crate::read_token).transpose()?;
    let (tls, identity) = if a.tls.insecure_plaintext {
        (None, "plaintext: --insecure-plaintext".to_owned())
    } else {
        let id = a.tls.identity()?;
        let cfg = hoardfs_tls::server_config(&id).map_err(|e| e.to_string())?;
        (Some(cfg), format!("TLS, identity {}", id.fingerprint()))
    };
    let limits = FdBudget::split(
        crate::descriptors::raise_limit(),
        a.max_connections,
        a.max_open_files,
    );
    let mut cfg = ServerConfig::new(a.listen);
    cfg.token = token;
    cfg.tokens_dir = Some(state_dir);
    cfg.tls = tls;
    cfg.max_connections = limits.connections;
    cfg.idle_timeout = std::time::Duration::from_secs_f64(a.idle_timeout);
    cfg.memory_per_conn = a.conn_memory_mib.max(8) << 20;
    cfg.memory_total = a.max_memory_mib.max(a.conn_memory_mib.max(8)) << 20;
    cfg.read_only = a.read_only;
    cfg.id_map = a.id_map.mapping();
    if a.no_zero_copy {
        cfg.zero_copy = None;
    }
    if let Err(e) = hoardfs_tls::create_private_dir(cfg.tokens_dir.as_deref().expect("set above")) {
        tracing::warn!("{e}");
    }
    Ok((cfg, identity, limits))
}

/// A tier's cache directory unless --cache-dir: in the state directory, one per origin URL
/// (two tiers sharing a state directory do not share a cache).
fn default_tier_cache(state_dir: &std::path::Path, url: &str) -> PathBuf {
    let h = xxhash_rust::xxh3::xxh3_64(url.as_bytes());
    state_dir.join(format!("tier-cache-{h:016x}"))
}

/// `hoardfs serve --origin s3://…`: a shared cache tier in front of a bucket.
fn run_tier(a: ServeArgs) -> CliResult<()> {
    let url = a.origin.clone().expect("checked by the caller");
    let loc = match hoardfs_origin::s3::location::S3Location::parse(&url) {
        Some(l) => l?,
        None => return Err(format!("--origin {url:?}: expected s3://BUCKET[/PREFIX]").into()),
    };
    let cache_dir = a
        .cache_dir
        .clone()
        .unwrap_or_else(|| default_tier_cache(&a.tls.state_dir(), &url));
    let valid = |x: f64| (0.0..1e6).contains(&x);
    if !(valid(a.metadata_ttl) && valid(a.timeout) && a.timeout > 0.0)
        || a.metadata_max_stale.is_some_and(|x| !valid(x))
    {
        return Err(
            "--metadata-ttl, --metadata-max-stale and --timeout must be numbers of seconds".into(),
        );
    }
    if a.list_rate.is_some_and(|x| !(x > 0.0 && x < 1e6)) {
        return Err("--list-rate must be a positive number of requests per second".into());
    }
    let (cfg, identity, _) = server_config(&a, &url)?;
    let limits = a.free_space.limits(a.cache_size)?;
    std::fs::create_dir_all(&cache_dir)
        .map_err(|e| format!("cannot create {}: {e}", cache_dir.display()))?;
    let cache = hoardfs_cache::CacheDir::open_with(&cache_dir, limits, None)
        .map_err(|e| format!("cache directory {}: {e}", cache_dir.display()))?;
    let mut s3 = crate::s3::open(
        loc,
        &crate::s3::S3Args {
            endpoint_url: a.endpoint_url.clone(),
            region: a.region.clone(),
            force_path_style: a.force_path_style,
            metadata_ttl: std::time::Duration::from_secs_f64(a.metadata_ttl),
            max_stale: a.metadata_max_stale.map(std::time::Duration::from_secs_f64),
            list_rate: a.list_rate,
            immutable: a.immutable,
            read_only: a.read_only,
            timeout: std::time::Duration::from_secs_f64(a.timeout),
            owner: (None, None, None, None),
        },
        Some(cache_dir.join("s3")),
    )?;
    s3.watch(!a.immutable);
    let info = hoardfs_origin::Origin::info(&s3).map_err(|e| format!("cannot start: {e}"))?;
    let origin = Arc::new(hoardfs_server::tier::CachingOrigin::new(
        Arc::new(s3),
        cache,
        info.export_id,
    ));
    run_blocking(cfg, origin, None, |addr| {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "hoardfs: serving {url} on {addr} ({identity})");
        let _ = out.flush();
        crate::notify::ready(&format!("serving {url} on {addr}"));
    })
    .map_err(|e| CliError::Failed(format!("cannot serve on {}: {e}", a.listen)))
}

/// Reads the address and, with TLS, the identity out of the line `serve` prints when it is
/// ready: `hoardfs: serving DIR on ADDR (TLS, identity SHA256:…)`.
pub fn parse_ready_line(line: &str) -> Option<(String, Option<hoardfs_tls::Fingerprint>)> {
    let rest = line.strip_prefix("hoardfs: serving ")?;
    let (_, after) = rest.rsplit_once(" on ")?;
    let (addr, how) = after.split_once(' ')?;
    let fingerprint = match how.split_once("identity ") {
        Some((_, f)) => Some(f.trim_end_matches(')').parse().ok()?),
        None => None,
    };
    Some((addr.to_owned(), fingerprint))
}

/// How the open-file limit is shared between client connections, open files (cached for
/// reading, as many again for writing, and as many again held by zero-copy replies not yet
/// sent) and handles (one `O_PATH` descriptor each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FdBudget {
    /// Most authenticated connections.
    pub connections: usize,
    /// Most open files of each kind (cached for reading, for writing, held by replies).
    pub open_files: usize,
    /// Most handles remembered.
    pub handles: usize,
    /// Most directories watched for callbacks (each holds its directory open).
    pub watches: usize,
}

impl FdBudget {
    /// Descriptors kept for everything else: connections in their handshake (at most 256),
    /// the listening socket, inotify, logs, ...
    const RESERVE: usize = 128 + 256;
    /// Most handles remembered when descriptors are plentiful.
    const MAX_HANDLES: usize = 500_000;

    /// `--max-open-files` unless given (as the origin's default).
    pub const DEFAULT_OPEN_FILES: usize = 4096;

    /// Splits `nofile` descriptors, lowering the requested connection and open-file counts
    /// where they would not fit beside a useful number of handles. That is a warning when
    /// it turns clients away (fewer connections) or undoes an explicit --max-open-files; a
    /// smaller cache of open files than the default is only noted (it costs reopens, not
    /// service), so that a default server on a host with a modest limit does not warn.
    pub fn split(nofile: u64, connections: usize, open_files: Option<usize>) -> FdBudget {
        let asked = open_files.is_some();
        let open_files = open_files.unwrap_or(Self::DEFAULT_OPEN_FILES);
        let total = (nofile as usize).saturating_sub(Self::RESERVE).max(64);
        // Connections get at most a quarter, open files of each kind a twelfth.
        let connections_fit = connections.min(total / 4).max(1);
        let open_fit = open_files.min(total / 12).max(1);
        if connections_fit < connections || (open_fit < open_files && asked) {
            tracing::warn!(
                nofile,
                connections = connections_fit,
                open_files = open_fit,
                "the open-file limit is low: serving fewer connections and open files than asked"
            );
        } else if open_fit < open_files {
            tracing::info!(
                nofile,
                open_files = open_fit,
                "keeping fewer files open than the default, to fit the open-file limit"
            );
        }
        // The rest: half for watched directories, half for handles.
        let rest = total.saturating_sub(connections_fit + 3 * open_fit);
        let watches = (rest / 2).clamp(16, Self::MAX_HANDLES / 2);
        let handles = rest.saturating_sub(watches).clamp(16, Self::MAX_HANDLES);
        FdBudget {
            connections: connections_fit,
            open_files: open_fit,
            handles,
            watches,
        }
    }
}

/// Identity mapping options of `hoardfs serve` (see doc/SEMANTICS.md, "Identity mapping").
#[derive(Args, Debug)]
pub struct IdMapArgs {
    /// Which ids clients send (as owner of a new object, or in a chown) the server records
    /// as --anon-uid/--anon-gid instead, like NFS root_squash and all_squash.
    #[arg(long, value_enum, default_value_t = SquashArg::Root)]
    pub squash: SquashArg,
    /// The uid recorded instead of a squashed uid (65534 is nobody on most systems).
    #[arg(long, default_value_t = hoardfs_server::ANON_ID, value_parser = anon_id())]
    pub anon_uid: u32,
    /// The gid recorded instead of a squashed gid.
    #[arg(long, default_value_t = hoardfs_server::ANON_ID, value_parser = anon_id())]
    pub anon_gid: u32,
    /// Keep the set-user-id and set-group-id bits clients set (by default they are
    /// dropped from every mode a client sets or creates with).
    #[arg(long)]
    pub allow_setid: bool,
    /// Let clients create character and block devices (by default EPERM; fifos and
    /// sockets are always allowed).
    #[arg(long)]
    pub allow_devices: bool,
}

/// Parses an anonymous id: any uid or gid but 4294967295, which chown(2) reads as "no
/// change" (a new object would stay the server's).
fn anon_id() -> clap::builder::RangedI64ValueParser<u32> {
    clap::value_parser!(u32).range(..i64::from(u32::MAX))
}

/// Values of `--squash`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SquashArg {
    /// Record every id as the client sends it.
    None,
    /// Record uid 0 and gid 0 as the anonymous ids.
    Root,
    /// Record every id as the anonymous ids.
    All,
}

impl IdMapArgs {
    /// The server's mapping.
    pub fn mapping(&self) -> hoardfs_server::IdMapping {
        use hoardfs_server::Squash;
        hoardfs_server::IdMapping {
            squash: match self.squash {
                SquashArg::None => Squash::None,
                SquashArg::Root => Squash::Root,
                SquashArg::All => Squash::All,
            },
            anon_uid: self.anon_uid,
            anon_gid: self.anon_gid,
            allow_setid: self.allow_setid,
            allow_devices: self.allow_devices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_are_shared_without_overcommitting() {
        let b = FdBudget::split(1 << 20, 1024, None);
        assert_eq!(
            (b.connections, b.open_files, b.handles, b.watches),
            (1024, 4096, 500_000, 250_000)
        );
        // The common default soft limit: a quarter and three twelfths of what is left
        // after the reserve, and handles and watched directories share the rest.
        let b = FdBudget::split(1024, 1024, Some(4096));
        let usable = 1024 - FdBudget::RESERVE;
        assert!(b.connections + 3 * b.open_files + b.handles + b.watches <= usable);
        assert_eq!((b.connections, b.open_files), (usable / 4, usable / 12));
        assert!(b.handles >= usable / 4);
        assert!(b.watches >= usable / 16);
    }
}
