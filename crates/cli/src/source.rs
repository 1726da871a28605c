//! What `hoardfs mount SOURCE` and `server-stats SERVER` accept: `HOST[:PORT]` of a server
//! (port 7070 when omitted, as `hoardfs serve` listens by default), or, for `mount`, an
//! absolute path to a local directory or an S3 bucket, `s3://BUCKET[/PREFIX]`.

use crate::error::{CliError, CliResult};
use std::path::{Path, PathBuf};

/// The port `hoardfs serve` listens on by default, and clients assume without one.
pub const DEFAULT_PORT: u16 = 7070;

/// A parsed mount source.
#[derive(Debug, PartialEq, Eq)]
pub enum Source {
    /// A local directory (absolute path).
    Local(PathBuf),
    /// A server, `HOST:PORT` (the default port filled in).
    Server(String),
    /// An S3 bucket, `s3://BUCKET[/PREFIX]`.
    S3(hoardfs_origin::s3::location::S3Location),
}

/// Parses a mount source: an absolute path, or a server address (see [`server_addr`]).
/// A relative path is refused with the absolute one to use instead.
pub fn parse(s: &str) -> CliResult<Source> {
    parse_source(s).map_err(CliError::into_usage)
}

fn parse_source(s: &str) -> CliResult<Source> {
    if let Some(l) = hoardfs_origin::s3::location::S3Location::parse(s) {
        return l.map(Source::S3).map_err(CliError::Usage);
    }
    if s.starts_with('/') {
        return Ok(Source::Local(PathBuf::from(s)));
    }
    if s.contains('/') || s.starts_with('.') || s.starts_with('~') || Path::new(s).is_dir() {
        let abs = std::env::current_dir()
            .map(|d| d.join(s).display().to_string())
            .unwrap_or_else(|_| format!("/path/to/{s}"));
        return Err(format!(
            "{s:?} looks like a relative path: a local directory source must be absolute \
             (e.g. {abs}); a server is HOST:PORT (e.g. fileserver:{DEFAULT_PORT})"
        )
        .into());
    }
    server_addr(s).map(Source::Server)
}

/// `HOST:PORT` from `HOST`, `HOST:PORT`, `[V6]`, `[V6]:PORT` or a bare IPv6 address; a
/// missing port is [`DEFAULT_PORT`].
pub fn server_addr(s: &str) -> CliResult<String> {
    let bad = |why: &str| {
        format!(
            "{s:?} is not a server address ({why}): expected HOST:PORT or HOST (port \
             {DEFAULT_PORT}), e.g. fileserver:{DEFAULT_PORT} or [::1]:{DEFAULT_PORT}"
        )
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
        match after {
            "" => (format!("[{host}]"), None),
            p => (
                format!("[{host}]"),
                Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
            ),
        }
    } else if s.matches(':').count() > 1 {
        (format!("[{s}]"), None)
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (s.to_string(), None),
        }
    };
    if host.is_empty() || host == "[]" {
        return Err(bad("no host").into());
    }
    let port = match port {
        None => DEFAULT_PORT,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
    };
    Ok(format!("{host}:{port}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_get_the_default_port_and_relative_paths_are_refused() {
        let ok = |s: &str| server_addr(s).unwrap();
        assert_eq!(ok("fileserver"), "fileserver:7070");
        assert_eq!(ok("fileserver:7071"), "fileserver:7071");
        assert_eq!(ok("10.0.0.1"), "10.0.0.1:7070");
        assert_eq!(ok("::1"), "[::1]:7070");
        assert_eq!(ok("[::1]"), "[::1]:7070");
        assert_eq!(ok("[fe80::1]:9"), "[fe80::1]:9");
        for bad in [
            "",
            ":7070",
            "host:",
            "host:x",
            "host:0",
            "host:70000",
            "[::1",
            "[::1]x",
        ] {
            let e = server_addr(bad).unwrap_err().to_string();
            assert!(e.contains("HOST:PORT"), "{bad}: {e}");
        }
        assert_eq!(parse("/srv/x").unwrap(), Source::Local("/srv/x".into()));
        assert_eq!(parse("srv").unwrap(), Source::Server("srv:7070".into()));
        let e = parse("data/share").unwrap_err().to_string();
        assert!(
            e.contains("must be absolute") && e.contains("/data/share"),
            "{e}"
        );
        assert!(parse("./x").is_err() && parse("~/x").is_err());
    }
}
