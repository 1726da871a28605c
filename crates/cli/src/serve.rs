//! `hoardfs serve DIR`: export a directory.

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
    pub dir: PathBuf,
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub listen: SocketAddr,
    /// File holding the shared secret clients must present.
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Refuse all modifications (EROFS for clients).
    #[arg(long)]
    pub read_only: bool,
    #[command(flatten)]
    pub id_map: IdMapArgs,
    /// Allow listening on a non-loopback address without a token.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Most files kept open for reading at once.
    #[arg(long, default_value_t = 4096)]
    pub max_open_files: usize,
    /// Copy every read through the server's memory instead of sending file data with
    /// sendfile(2) (zero-copy is used only for files unchanged for 2 s).
    #[arg(long)]
    pub no_zero_copy: bool,
}

/// Runs the server until SIGINT/SIGTERM.
pub fn run(a: ServeArgs) -> Result<(), String> {
    if !a.listen.ip().is_loopback() && a.token_file.is_none() && !a.allow_unauthenticated {
        return Err(format!(
            "refusing to listen on {} without authentication: anyone who can reach it could read {}. \
             Pass --token-file FILE, or --allow-unauthenticated on a trusted network",
            a.listen,
            a.dir.display()
        ));
    }
    let token = a.token_file.as_deref().map(crate::read_token).transpose()?;
    if !a.dir.is_dir() {
        return Err(format!("{} is not a directory", a.dir.display()));
    }
    let opts = LocalOptions {
        read_only: a.read_only,
        max_open_files: a.max_open_files,
        ..Default::default()
    };
    let origin = Arc::new(
        LocalOrigin::new(&a.dir, opts)
            .map_err(|e| format!("cannot export {}: {e}", a.dir.display()))?,
    );
    crate::raise_fd_limit();
    let mut cfg = ServerConfig::new(a.listen);
    cfg.token = token;
    cfg.read_only = a.read_only;
    cfg.id_map = a.id_map.mapping();
    if a.no_zero_copy {
        cfg.zero_copy = None;
    }
    let counters = {
        let o = origin.clone();
        Arc::new(move || o.counters()) as hoardfs_server::OriginCounters
    };
    let dir = origin.root_path().display().to_string();
    run_blocking(cfg, origin, Some(counters), |addr| {
        use std::io::Write;
        let mut out = std::io::stdout();
        let _ = writeln!(out, "hoardfs: serving {dir} on {addr}");
        let _ = out.flush();
    })
    .map_err(|e| format!("cannot serve on {}: {e}", a.listen))
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
