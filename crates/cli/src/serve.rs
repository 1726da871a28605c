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
