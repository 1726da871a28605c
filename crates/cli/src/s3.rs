//! `s3://` sources: the S3 origin's settings from the command line, the environment and
//! the AWS profile files (shared by `hoardfs mount` and `hoardfs serve --origin`).

use crate::error::CliResult;
use std::path::PathBuf;
use std::time::Duration;

use hoardfs_origin::s3::credentials::{self, process_env};
use hoardfs_origin::s3::location::S3Location;
use hoardfs_origin::s3::{S3Options, S3Origin};

/// What the command line says about an S3 source.
#[derive(Debug, Clone)]
pub struct S3Args {
    /// `--endpoint-url`.
    pub endpoint_url: Option<String>,
    /// `--region`.
    pub region: Option<String>,
    /// `--force-path-style`.
    pub force_path_style: bool,
    /// `--metadata-ttl`.
    pub metadata_ttl: Duration,
    /// `--metadata-max-stale` (`None`: the default for the TTL, [`max_stale`]).
    pub max_stale: Option<Duration>,
    /// `--list-rate` (`None`: the origin's default).
    pub list_rate: Option<f64>,
    /// `--immutable`.
    pub immutable: bool,
    /// `--read-only`.
    pub read_only: bool,
    /// `--timeout`.
    pub timeout: Duration,
    /// `--uid`, `--gid`, `--file-mode`, `--dir-mode` (default: the mounting user's ids,
    /// 644 and 755).
    pub owner: (Option<u32>, Option<u32>, Option<u16>, Option<u16>),
}

/// The staleness bound when none is given: 5 s, or none past the TTL with a TTL of 0
/// (whoever asks the store every time does not want answers older than that).
pub fn max_stale(ttl: Duration) -> Duration {
    if ttl.is_zero() {
        Duration::ZERO
    } else {
        ttl.max(Duration::from_secs(5))
    }
}

/// The S3 origin for `loc`, keeping its listings and staged writes under `state`.
pub fn open(loc: S3Location, a: &S3Args, state: Option<PathBuf>) -> CliResult<S3Origin> {
    let env = &process_env;
    let region = credentials::region(a.region.as_deref(), env);
    let endpoint = credentials::endpoint(a.endpoint_url.as_deref(), &region, env);
    let (creds, source) = credentials::credentials(env)?;
    let mut o = S3Options::new(loc, endpoint, region);
    o.path_style = a.force_path_style;
    o.credentials = creds;
    o.metadata_ttl = a.metadata_ttl;
    o.max_stale = a.max_stale.unwrap_or_else(|| max_stale(a.metadata_ttl));
    o.list_rate = a.list_rate.unwrap_or(o.list_rate);
    o.immutable = a.immutable;
    o.read_only = a.read_only;
    o.timeout = a.timeout;
    o.state_dir = state;
    let (uid, gid, file_mode, dir_mode) = a.owner;
    o.uid = uid.unwrap_or(o.uid);
    o.gid = gid.unwrap_or(o.gid);
    o.file_mode = file_mode.unwrap_or(o.file_mode);
    o.dir_mode = dir_mode.unwrap_or(o.dir_mode);
    let origin = S3Origin::new(o)?;
    tracing::info!("{}: credentials from {source}", origin.describe());
    Ok(origin)
}
