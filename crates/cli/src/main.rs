//! The `hoardfs` command: `serve` exports a directory, `mount` mounts one through FUSE with
//! a persistent disk cache, `demo` shows both end to end on a generated tree.

mod cachedir;
mod control;
mod demo;
mod descriptors;
mod disconnected;
mod docs;
mod error;
mod free_space;
mod hoard;
mod instance;
mod logging;
mod metrics;
mod mount;
mod mount_args;
mod names;
mod notify;
mod prefetch;
mod s3;
mod security;
mod serve;
mod source;
mod token;
mod tools;

use crate::error::{CliError, CliResult};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// hoardfs: a network file system whose clients keep a persistent, coherent disk cache.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Export a directory to hoardfs clients over TCP.
    Serve(serve::ServeArgs),
    /// Mount a hoardfs server (HOST:PORT) or a local directory (/abs/path) with a disk cache.
    Mount(mount::MountArgs),
    /// Serve a generated sample tree, mount it with a temporary cache and print cold/hot
    /// read times (needs root and /dev/fuse).
    Demo(demo::DemoArgs),
    /// Counters of a running mount: hits, misses, bytes, evictions, usage, connection.
    Stats(tools::StatsArgs),
    /// Counters of a running server: connections, requests, reads, file opens, bytes.
    ServerStats(tools::ServerStatsArgs),
    /// Wait until the changes a mount kept in its change log (made while its server was
    /// unreachable with --offline-writes, or any with --write-back async) and the writes
    /// queued behind writers are on the server; fails if some are left at the timeout.
    Sync(tools::SyncArgs),
    /// List the offline changes that met a change on the server, and where this client's
    /// version was put.
    Conflicts(tools::ConflictsArgs),
    /// Inspect, evict from or verify a mount's cache or a cache directory.
    #[command(subcommand)]
    Cache(tools::CacheCommand),
    /// Fetch files (recursively) into the cache of their mount, with progress.
    Prefetch(prefetch::PrefetchArgs),
    /// Keep files (recursively) from eviction, and fetch them unless --no-fetch.
    Pin(prefetch::PinArgs),
    /// Let pinned files be evicted again.
    Unpin(prefetch::UnpinArgs),
    /// Manage a server's client credentials: add, list, revoke (a running server picks
    /// changes up within a second and closes revoked clients' connections).
    #[command(subcommand)]
    Token(token::TokenCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// Write man pages (hoardfs.1, hoardfs-mount.1, ...) into a directory.
    Man(docs::ManArgs),
}

fn main() -> ExitCode {
    // mount(8) and fstab run `hoardfs SOURCE MOUNTPOINT -o OPTIONS` (through mount.fuse3).
    let args = mount::helper_argv(std::env::args_os().collect(), |name| {
        name == "help" || Cli::command().find_subcommand(name).is_some()
    });
    let cli = Cli::parse_from(args);
    // Opened before daemonising, so that a bad path fails in the foreground.
    let log_file = match &cli.command {
        Command::Serve(a) => a.log_file.clone(),
        Command::Mount(a) => mount::log_file(a),
        _ => None,
    };
    let log_file = match log_file.as_deref().map(logging::open_log_file).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("hoardfs: {e}");
            return ExitCode::FAILURE;
        }
    };
    let logs_to_file = log_file.is_some();
    // Daemonising forks, which must happen before any thread exists (logging included).
    if let Command::Mount(args) = &cli.command
        && let Err(e) = mount::maybe_daemonize(args)
    {
        eprintln!("hoardfs: {e}");
        return e.exit_code();
    }
    if matches!(cli.command, Command::Serve(_) | Command::Mount(_)) {
        // While the process is still single-threaded (logging may start a thread).
        descriptors::prepare();
    }
    logging::init(log_file);
    let result = match cli.command {
        Command::Serve(a) => serve::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Stats(a) => tools::stats(a),
        Command::ServerStats(a) => tools::server_stats(a),
        Command::Sync(a) => tools::sync(a),
        Command::Conflicts(a) => tools::conflicts(a),
        Command::Cache(c) => tools::cache(c),
        Command::Prefetch(a) => prefetch::prefetch(a),
        Command::Pin(a) => prefetch::pin(a),
        Command::Unpin(a) => prefetch::unpin(a),
        Command::Token(c) => token::run(c),
        Command::Completions(a) => docs::completions(a, Cli::command()),
        Command::Man(a) => docs::man(a, Cli::command()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if logs_to_file {
                tracing::error!("{e}");
            }
            eprintln!("hoardfs: {e}");
            e.exit_code()
        }
    }
}

/// Reads a token file: its content without trailing newline; refuses an empty token.
pub fn read_token(path: &std::path::Path) -> CliResult<Vec<u8>> {
    let mut t = std::fs::read(path).map_err(|e| CliError::io("cannot read token file", path, e))?;
    while t.last().is_some_and(|b| b.is_ascii_whitespace()) {
        t.pop();
    }
    if t.is_empty() {
        return Err(format!("token file {} is empty", path.display()).into());
    }
    Ok(t)
}
