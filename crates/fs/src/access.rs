//! Who may open what: the permission decisions this client makes for the opens and
//! listings it answers without asking the server (a file under a callback, a listing
//! read before), on behalf of a server that performs requests as their callers.
//!
//! The kernel has checked the mode bits already (`default_permissions`) against the
//! calling process's own ids, but the server judges the identity it maps the caller to
//! (root squashed to the anonymous user, a credential restricted to one user) and also
//! honours ACLs. So, for a server that acts as its callers ([`Identities::Callers`]):
//! - an object without an access ACL is decided here, by its mode bits, for the mapped
//!   identity ([`hoardfs_proto::may`], the function the server's mapping shares);
//! - an object with one (`Attr::acl`) is asked of the server (`Origin::access`, one round
//!   trip), and the answer is kept per identity ([`Answers`], in the node's state) until
//!   the object's attributes change; while the server is unreachable, an ACL'd object
//!   never decided for that identity is refused.
//!
//! A server that acts with its own credentials ([`Identities::Server`]) leaves the
//! kernel's check as the only one, as before.
//!
//! The decision itself is `Superblock::may_access`; this module keeps the rule's parts that
//! need no superblock. Lock order: a node's `state` lock is taken for a lookup or a record
//! only, never across the origin call.

use hoardfs_origin::Identities;

/// Most identities whose answers a node keeps (the oldest goes first).
const MAX_ANSWERS: usize = 8;

/// The server's answers for one object, by identity (key of the mapped [`Caller`]): the
/// access bits it allowed and those it refused.
#[derive(Debug, Default, Clone)]
pub(crate) struct Answers(Vec<(u64, u8, u8)>);

impl Answers {
    /// The answer for `key` and `mask`, if known: allowed when every bit was allowed,
    /// refused when any was refused.
    pub(crate) fn get(&self, key: u64, mask: u32) -> Option<bool> {
        let mask = (mask & 7) as u8;
        let (_, allowed, refused) = self.0.iter().find(|(k, ..)| *k == key)?;
        if allowed & mask == mask {
            Some(true)
        } else if refused & mask != 0 {
            Some(false)
        } else {
            None
        }
    }

    /// Records the server's answer for `key` and `mask`.
    pub(crate) fn record(&mut self, key: u64, mask: u32, allowed: bool) {
        let mask = (mask & 7) as u8;
        let i = match self.0.iter().position(|(k, ..)| *k == key) {
            Some(i) => i,
            None => {
                if self.0.len() >= MAX_ANSWERS {
                    self.0.remove(0);
                }
                self.0.push((key, 0, 0));
                self.0.len() - 1
            }
        };
        let e = &mut self.0[i];
        if allowed {
            e.1 |= mask;
        } else if mask.count_ones() == 1 {
            e.2 |= mask;
        }
        // A refusal of several bits at once says only that one of them is refused: the
        // next ask of any of them goes to the server.
    }

    /// Forgets every answer (the object's attributes changed).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Whether the server acts as its callers (so opens answered here are checked).
pub(crate) fn checks_callers(identities: &Identities) -> bool {
    matches!(identities, Identities::Callers(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_kept_per_identity_and_bit() {
        let mut a = Answers::default();
        assert_eq!(a.get(1, 4), None);
        a.record(1, 4, true);
        assert_eq!(a.get(1, 4), Some(true));
        assert_eq!(a.get(1, 6), None, "write was never asked");
        assert_eq!(a.get(2, 4), None, "another identity");
        a.record(1, 2, false);
        assert_eq!(a.get(1, 6), Some(false));
        // A refusal of two bits together says nothing of either alone.
        a.record(3, 6, false);
        assert_eq!(a.get(3, 4), None);
        a.clear();
        assert_eq!(a.get(1, 4), None);
    }

    #[test]
    fn the_oldest_identity_goes_first() {
        let mut a = Answers::default();
        for k in 0..(MAX_ANSWERS as u64 + 1) {
            a.record(k, 4, true);
        }
        assert_eq!(a.get(0, 4), None);
        assert_eq!(a.get(MAX_ANSWERS as u64, 4), Some(true));
    }
}
