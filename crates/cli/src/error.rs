//! The command's errors: what kind of failure it was, which decides the exit status and
//! what scripts can tell apart, and the message a user reads.
//!
//! Exit status 2 is a usage error (the command line, a mount option or a configuration
//! value is wrong, as clap reports its own), 1 every other failure. Library errors keep
//! their type (and their `source()`) up to here; only their message reaches the terminal.

use std::fmt;
use std::path::Path;
use std::process::ExitCode;

/// Why a command failed.
#[derive(Debug)]
pub enum CliError {
    /// The command line, a mount option or a configuration value is wrong; nothing was
    /// changed. Exit status 2.
    Usage(String),
    /// A file or directory the command needs could not be used.
    Io {
        /// What was being done, with the path (`cannot read token file /etc/x`).
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The origin (server, directory, bucket) refused or failed.
    Origin {
        /// What was being done.
        what: String,
        /// What the origin said.
        source: hoardfs_origin::OriginError,
    },
    /// Anything else that stopped the command, said in a sentence.
    Failed(String),
}

/// Result of a command or one of its steps.
pub type CliResult<T> = Result<T, CliError>;

impl CliError {
    /// A failure to use `path` while doing `doing` (`"cannot read"`).
    pub fn io(doing: &str, path: &Path, source: std::io::Error) -> CliError {
        CliError::Io {
            what: format!("{doing} {}", path.display()),
            source,
        }
    }

    /// The process's exit status for this error.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            CliError::Usage(_) => ExitCode::from(2),
            _ => ExitCode::FAILURE,
        }
    }

    /// The same failure found while reading what the user asked for: a
    /// [`CliError::Failed`] becomes a [`CliError::Usage`].
    pub fn into_usage(self) -> CliError {
        match self {
            CliError::Failed(m) => CliError::Usage(m),
            e => e,
        }
    }

    /// The error with `context` said first (`mounting /mnt: ...`), its kind kept.
    pub fn context(self, context: &str) -> CliError {
        match self {
            CliError::Usage(m) => CliError::Usage(format!("{context}: {m}")),
            CliError::Io { what, source } => CliError::Io {
                what: format!("{context}: {what}"),
                source,
            },
            CliError::Origin { what, source } => CliError::Origin {
                what: format!("{context}: {what}"),
                source,
            },
            CliError::Failed(m) => CliError::Failed(format!("{context}: {m}")),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Failed(m) => f.write_str(m),
            CliError::Io { what, source } => write!(f, "{what}: {source}"),
            CliError::Origin { what, source } => write!(f, "{what}: {source}"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Io { source, .. } => Some(source),
            CliError::Origin { source, .. } => Some(source),
            CliError::Usage(_) | CliError::Failed(_) => None,
        }
    }
}

/// A sentence built where the failure was found is a [`CliError::Failed`].
impl From<String> for CliError {
    fn from(m: String) -> CliError {
        CliError::Failed(m)
    }
}

/// A fixed sentence is a [`CliError::Failed`].
impl From<&str> for CliError {
    fn from(m: &str) -> CliError {
        CliError::Failed(m.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_errors_exit_2_and_keep_their_kind_under_context() {
        let e = CliError::Usage("bad -o foo".into()).context("mount");
        assert!(matches!(e, CliError::Usage(_)));
        assert_eq!(e.exit_code(), ExitCode::from(2));
        assert_eq!(e.to_string(), "mount: bad -o foo");
        let io = CliError::io(
            "cannot read token file",
            Path::new("/x"),
            std::io::Error::from_raw_os_error(libc::ENOENT),
        );
        assert_eq!(io.exit_code(), ExitCode::FAILURE);
        assert!(std::error::Error::source(&io).is_some());
        assert!(io.to_string().starts_with("cannot read token file /x: "));
    }
}
