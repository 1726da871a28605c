//! [`S3Options`]: how an S3 origin is set up, with the defaults a mount starts from.

use std::path::PathBuf;
use std::time::Duration;

use super::location::S3Location;

/// How an S3 origin is set up.
#[derive(Debug, Clone)]
pub struct S3Options {
    /// Bucket and prefix.
    pub location: S3Location,
    /// Endpoint URL.
    pub endpoint: String,
    /// Region for signatures.
    pub region: String,
    /// Path-style URLs.
    pub path_style: bool,
    /// Credentials (`None`: unsigned).
    pub credentials: Option<rusty_s3::Credentials>,
    /// How long a request may wait.
    pub timeout: Duration,
    /// How long listings and negative lookups are trusted.
    pub metadata_ttl: Duration,
    /// How old a listing may be and still be served while it is listed again in the
    /// background (module `refresher`); beyond it, readers wait for the store. At least
    /// `metadata_ttl`.
    pub max_stale: Duration,
    /// Listing requests per second the background refresher may send, at most.
    pub list_rate: f64,
    /// The bucket never changes: listings are trusted forever.
    pub immutable: bool,
    /// Refuse modifications.
    pub read_only: bool,
    /// Where listings and files being written are kept (`None`: memory and a temp dir).
    pub state_dir: Option<PathBuf>,
    /// Owner shown for every file.
    pub uid: u32,
    /// Group shown for every file.
    pub gid: u32,
    /// Permission bits of files.
    pub file_mode: u16,
    /// Permission bits of directories.
    pub dir_mode: u16,
    /// Objects up to this size are uploaded in one PUT; larger ones in parts.
    pub multipart_threshold: u64,
    /// Size of each uploaded part.
    pub part_size: u64,
    /// Report changes to subscribers by listing the directories in use every
    /// `metadata_ttl` (for a server exporting the bucket; module `watch`).
    pub watch: bool,
}

impl S3Options {
    /// Defaults for `location` at `endpoint` (no credentials, 1 s TTL, read-write).
    pub fn new(location: S3Location, endpoint: String, region: String) -> S3Options {
        S3Options {
            location,
            endpoint,
            region,
            path_style: false,
            credentials: None,
            timeout: Duration::from_secs(15),
            metadata_ttl: Duration::from_secs(1),
            max_stale: Duration::from_secs(5),
            list_rate: 20.0,
            immutable: false,
            read_only: false,
            state_dir: None,
            uid: unsafe { libc::getuid() },
            gid: unsafe { libc::getgid() },
            file_mode: 0o644,
            dir_mode: 0o755,
            multipart_threshold: 16 << 20,
            part_size: 8 << 20,
            watch: false,
        }
    }
}
