//! The free-space thresholds of a cache directory as command-line flags, shared by `hoardfs
//! mount` (the client's cache) and `hoardfs serve --origin` (the tier's cache), and turned
//! into the cache's [`Limits`].

use crate::error::CliResult;
use clap::Args;
use hoardfs_cache::Limits;

/// cachefilesd-style thresholds, in percent of the cache file system (blocks and inodes).
#[derive(Args, Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreeSpaceArgs {
    /// Eviction, once started, goes on until this % of the cache file system's space is
    /// free [default: 10].
    #[arg(long, value_name = "PERCENT")]
    pub brun: Option<u8>,
    /// Eviction starts when less than this % of the cache file system's space is free
    /// [default: 7].
    #[arg(long, value_name = "PERCENT")]
    pub bcull: Option<u8>,
    /// Nothing new is cached while less than this % of the cache file system's space is
    /// free (reads go straight to the server) [default: 3].
    #[arg(long, value_name = "PERCENT")]
    pub bstop: Option<u8>,
    /// As --brun, for free inodes (number of files) instead of space [default: 10].
    #[arg(long, value_name = "PERCENT")]
    pub frun: Option<u8>,
    /// As --bcull, for free inodes (number of files) instead of space [default: 7].
    #[arg(long, value_name = "PERCENT")]
    pub fcull: Option<u8>,
    /// As --bstop, for free inodes (number of files) instead of space [default: 3].
    #[arg(long, value_name = "PERCENT")]
    pub fstop: Option<u8>,
}

impl FreeSpaceArgs {
    /// The cache's limits: these thresholds and `max_bytes`, checked
    /// (`stop < cull < run < 100`).
    pub fn limits(&self, max_bytes: Option<u64>) -> CliResult<Limits> {
        let d = Limits::default();
        let l = Limits {
            max_bytes,
            brun: self.brun.unwrap_or(d.brun),
            bcull: self.bcull.unwrap_or(d.bcull),
            bstop: self.bstop.unwrap_or(d.bstop),
            frun: self.frun.unwrap_or(d.frun),
            fcull: self.fcull.unwrap_or(d.fcull),
            fstop: self.fstop.unwrap_or(d.fstop),
        };
        l.validate()?;
        Ok(l)
    }

    /// The thresholds' names, as flags (`--NAME`) and mount options (`NAME=PCT`).
    pub const NAMES: [&'static str; 6] = ["brun", "bcull", "bstop", "frun", "fcull", "fstop"];

    /// Sets the threshold named `key` (one of [`Self::NAMES`]) to `pct`; false if `key`
    /// is not one (for `-o key=value` mount options).
    pub fn set(&mut self, key: &str, pct: u8) -> bool {
        let slot = match key {
            "brun" => &mut self.brun,
            "bcull" => &mut self.bcull,
            "bstop" => &mut self.bstop,
            "frun" => &mut self.frun,
            "fcull" => &mut self.fcull,
            "fstop" => &mut self.fstop,
            _ => return false,
        };
        *slot = Some(pct);
        true
    }

    /// Whether any threshold was given.
    pub fn any_given(&self) -> bool {
        *self != FreeSpaceArgs::default()
    }
}
