//! The tier's watch ([`Poller`], `hoardfs serve --origin s3://…`): every period
//! (`--metadata-ttl`) the directories clients use (`super::watch::Watched`) are listed
//! again and what changed becomes callback breaks. A round costs what the refresher's
//! plans cost (`super::refresher::plan`): directories that share an ancestor whose whole
//! subtree fits in fewer pages than they number are listed in one listing without
//! delimiter, so 1,000 watched directories of 20 objects cost about 20 requests a round,
//! not 1,000.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::client::S3Client;
use super::listings::Listings;
use super::location::S3Location;
use super::nodes::NodeTable;
use super::refresher::{carry_out, plan};
use super::watch::{Relister, Watched};
use crate::BreakSink;

/// What the poller needs of the origin.
pub struct Poller {
    /// The store.
    pub client: Arc<S3Client>,
    /// Bucket and prefix.
    pub location: S3Location,
    /// The origin's listings.
    pub listings: Arc<Listings>,
    /// The origin's handle table.
    pub table: Arc<NodeTable>,
    /// Directories in use.
    pub watched: Arc<Watched>,
    /// Where breaks go.
    pub sink: BreakSink,
    /// Set when the origin is dropped.
    pub stop: Arc<AtomicBool>,
    /// Time between rounds.
    pub period: Duration,
}

impl Poller {
    /// Runs rounds until stopped.
    pub fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            self.round();
            let left = self.period.saturating_sub(start.elapsed());
            // Sleeps in slices so that a dropped origin stops its poller soon.
            let until = Instant::now() + left.max(Duration::from_millis(50));
            while Instant::now() < until && !self.stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
            }
        }
    }

    /// Lists every watched directory once, by the cheapest plans.
    fn round(&self) {
        let relister = Relister {
            client: &self.client,
            location: &self.location,
            listings: &self.listings,
            table: &self.table,
            sink: Some(&self.sink),
        };
        let root = self.location.dir_prefix("");
        let mut wanted: HashMap<String, Option<Instant>> = self
            .watched
            .list()
            .into_iter()
            .map(|dir| {
                let prefix = self.location.dir_prefix(&dir);
                let at = self.listings.listed_at(&prefix);
                (prefix, at)
            })
            .collect();
        while let Some(p) = plan(&wanted, &root, |tops| self.listings.entries_under(tops)) {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            wanted.retain(|prefix, _| !p.covers(prefix));
            if let Err(e) = carry_out(&relister, &p) {
                tracing::debug!("watching {p:?}: {e}");
            }
        }
    }
}
