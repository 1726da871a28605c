//! How far a node's attributes (and a directory's listing) can be trusted without asking
//! the origin: one [`Freshness`] per node, with the rules of how long each state lasts.
//!
//! - [`Freshness::Callback`]: the origin promised to report changes (a callback, module
//!   `callbacks`). Trusted until a break, for at most the callback TTL (and at least the
//!   attribute TTL); the kernel is given the callback TTL.
//! - [`Freshness::Ttl`]: no promise. Trusted for the attribute TTL after they were fetched.
//! - [`Freshness::Expired`]: known out of date whatever their age (a break, or a change
//!   made through this client): the next use asks the origin.
//!
//! Listings are fetched at their own time ([`crate::Listing::fetched`]) and trusted for the
//! directory TTL, or the callback TTL under a callback, never once the node expired.

use std::time::{Duration, Instant};

use crate::FsConfig;

/// How far a node's attributes can be trusted; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Freshness {
    /// Fetched at `since` under a callback.
    Callback {
        /// When the attributes were fetched.
        since: Instant,
    },
    /// Fetched at `since` without a callback.
    Ttl {
        /// When the attributes were fetched.
        since: Instant,
    },
    /// Out of date.
    Expired,
}

impl Freshness {
    /// Attributes fetched just now, with a callback if `callback`.
    pub(crate) fn fetched(callback: bool) -> Freshness {
        let since = Instant::now();
        if callback {
            Freshness::Callback { since }
        } else {
            Freshness::Ttl { since }
        }
    }

    /// Attributes fetched just now by re-resolving a node's name: they renew the TTL but
    /// bring no callback, and do not make expired attributes valid again (the caller
    /// wanted a handle, not attributes; the next use still asks the origin).
    pub(crate) fn renew_without_callback(&mut self) {
        if *self != Freshness::Expired {
            *self = Freshness::fetched(false);
        }
    }

    /// The attributes are out of date (a break, or a change made through this client);
    /// any callback is gone.
    pub(crate) fn expire(&mut self) {
        *self = Freshness::Expired;
    }

    /// Whether the origin holds a callback for these attributes.
    pub(crate) fn has_callback(&self) -> bool {
        matches!(self, Freshness::Callback { .. })
    }

    /// Whether the attributes can be used without asking the origin.
    pub(crate) fn attr_fresh(&self, config: &FsConfig) -> bool {
        self.attr_fresh_at(Instant::now(), config)
    }

    /// [`Freshness::attr_fresh`] at time `now`.
    fn attr_fresh_at(&self, now: Instant, config: &FsConfig) -> bool {
        match self {
            Freshness::Callback { since } => {
                let age = now.saturating_duration_since(*since);
                age < config.attr_ttl || age < config.callback_ttl
            }
            Freshness::Ttl { since } => now.saturating_duration_since(*since) < config.attr_ttl,
            Freshness::Expired => false,
        }
    }

    /// Whether a listing fetched at `fetched` can be reused.
    pub(crate) fn listing_fresh(&self, fetched: Instant, config: &FsConfig) -> bool {
        self.listing_fresh_at(Instant::now(), fetched, config)
    }

    /// [`Freshness::listing_fresh`] at time `now`.
    fn listing_fresh_at(&self, now: Instant, fetched: Instant, config: &FsConfig) -> bool {
        let age = now.saturating_duration_since(fetched);
        match self {
            Freshness::Callback { .. } => age < config.dir_ttl || age < config.callback_ttl,
            Freshness::Ttl { .. } => age < config.dir_ttl,
            Freshness::Expired => false,
        }
    }

    /// How long the kernel may keep the attributes and names.
    pub(crate) fn kernel_ttl(&self, config: &FsConfig) -> Duration {
        if self.has_callback() {
            config.callback_ttl
        } else {
            config.attr_ttl
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Freshness;
    use crate::FsConfig;
    use std::time::{Duration, Instant};

    fn config() -> FsConfig {
        FsConfig {
            attr_ttl: Duration::from_secs(1),
            callback_ttl: Duration::from_secs(600),
            dir_ttl: Duration::from_secs(2),
            ..FsConfig::default()
        }
    }

    fn later(t: Instant, secs: u64) -> Instant {
        t + Duration::from_secs(secs)
    }

    #[test]
    fn attributes_last_the_attr_ttl_or_under_a_callback_the_callback_ttl() {
        let (c, t) = (config(), Instant::now());
        let ttl = Freshness::Ttl { since: t };
        let cb = Freshness::Callback { since: t };
        assert!(ttl.attr_fresh_at(t, &c));
        assert!(!ttl.attr_fresh_at(later(t, 5), &c));
        assert!(cb.attr_fresh_at(later(t, 5), &c));
        assert!(!cb.attr_fresh_at(later(t, 700), &c));
        assert!(!Freshness::Expired.attr_fresh_at(t, &c));
        assert_eq!(cb.kernel_ttl(&c), c.callback_ttl);
        assert_eq!(ttl.kernel_ttl(&c), c.attr_ttl);
        assert_eq!(Freshness::Expired.kernel_ttl(&c), c.attr_ttl);
    }

    #[test]
    fn listings_last_the_dir_ttl_or_under_a_callback_the_callback_ttl() {
        let (c, t) = (config(), Instant::now());
        let ttl = Freshness::Ttl { since: t };
        let cb = Freshness::Callback { since: t };
        assert!(ttl.listing_fresh_at(later(t, 1), t, &c));
        assert!(!ttl.listing_fresh_at(later(t, 3), t, &c));
        assert!(cb.listing_fresh_at(later(t, 3), t, &c));
        assert!(!cb.listing_fresh_at(later(t, 700), t, &c));
        assert!(!Freshness::Expired.listing_fresh_at(t, t, &c));
    }

    #[test]
    fn a_re_resolved_handle_renews_the_ttl_but_neither_a_callback_nor_an_expiry() {
        let mut f = Freshness::fetched(true);
        assert!(f.has_callback());
        f.renew_without_callback();
        assert!(matches!(f, Freshness::Ttl { .. }));
        f.expire();
        f.renew_without_callback();
        assert_eq!(f, Freshness::Expired);
        assert!(!f.has_callback());
    }
}
