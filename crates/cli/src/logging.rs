//! Log output: one line per event on stderr, coloured only when stderr is a terminal, or
//! appended to `--log-file FILE` (never coloured). `HOARDFS_LOG` sets the filter
//! (tracing's `EnvFilter` syntax, default `warn` plus hoard-file summaries).

use crate::error::{CliError, CliResult};
use std::io::IsTerminal;
use std::path::Path;

use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// What is logged unless `HOARDFS_LOG` says otherwise: warnings, the one-line summaries
/// of hoard-file fetches at mount, and the cache's notes that it has room again.
const DEFAULT_FILTER: &str = "warn,hoardfs::hoard=info,hoardfs_cache::space_alarm=info,fuser=error";

/// Opens `path` for appending (created mode 0640 if missing).
pub fn open_log_file(path: &Path) -> CliResult<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
        .map_err(|e| CliError::io("cannot open log file", path, e))
}

/// Installs the global subscriber: to `file` if given, else to stderr.
pub fn init(file: Option<std::fs::File>) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOARDFS_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_FILTER));
    let (writer, ansi) = match file {
        Some(f) => (BoxMakeWriter::new(std::sync::Mutex::new(f)), false),
        None => (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        ),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .init();
}
