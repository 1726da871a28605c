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
    #[arg(required_unless_present = "print_fingerprint")]
    pub dir: Option<PathBuf>,
    /// Print the server's identity (the fingerprint clients pin with
    /// --server-fingerprint), generating it first if needed, and exit.
    #[arg(long)]
    pub print_fingerprint: bool,
    #[command(flatten)]
    pub tls: crate::security::ServerTlsArgs,
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
    if a.print_fingerprint {
        println!("{}", a.tls.identity()?.fingerprint());
        return Ok(());
    }
    let dir = a.dir.clone().expect("clap requires DIR");
    if !a.listen.ip().is_loopback() && a.token_file.is_none() && !a.allow_unauthenticated {
        return Err(format!(
            "refusing to listen on {} without authentication: anyone who can reach it could read {}. \
             Pass --token-file FILE, or --allow-unauthenticated on a trusted network",
            a.listen,
            dir.display()
        ));
    }
    let token = a.token_file.as_deref().map(crate::read_token).transpose()?;
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let (tls, identity) = if a.tls.insecure_plaintext {
        (None, "plaintext: --insecure-plaintext".to_owned())
    } else {
        let id = a.tls.identity()?;
        let cfg = hoardfs_tls::server_config(&id).map_err(|e| e.to_string())?;
        (Some(cfg), format!("TLS, identity {}", id.fingerprint()))
    };
    let opts = LocalOptions {
        read_only: a.read_only,
        max_open_files: a.max_open_files,
        ..Default::default()
    };
    let origin = Arc::new(
        LocalOrigin::new(&dir, opts)
            .map_err(|e| format!("cannot export {}: {e}", dir.display()))?,
    );
    crate::raise_fd_limit();
    let mut cfg = ServerConfig::new(a.listen);
    cfg.token = token;
    cfg.tls = tls;
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
        let _ = writeln!(out, "hoardfs: serving {dir} on {addr} ({identity})");
        let _ = out.flush();
    })
    .map_err(|e| format!("cannot serve on {}: {e}", a.listen))
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
