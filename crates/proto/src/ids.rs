//! Who a request is performed as: the identity a client claims for each request
//! ([`Caller`]), how a server maps claims to the identity it acts with ([`IdMap`], announced
//! to clients in `Hello` as [`Identities`]), and the permission check both ends apply to
//! mode bits ([`may`]).
//!
//! The mapping is a pure function shared by both ends: the server applies it to every
//! request before performing it as the mapped identity (the kernel of the server then
//! checks modes, ACLs, sticky directories and quotas), and a client applies the same
//! function to decide, without a round trip, what a cached open would be allowed on the
//! server (for files without an access ACL; the others are asked, see `Op::Access`).

use serde::{Deserialize, Serialize};

/// Most supplementary groups a request carries (more are dropped by the client, as NFS's
/// `AUTH_SYS` drops those beyond 16: mostly a denial, but an ACL entry that refuses one of
/// the dropped groups then no longer applies).
pub const MAX_GROUPS: usize = 1024;

/// The identity a request claims: the calling process's fsuid, fsgid and supplementary
/// groups, as the client's kernel reported them.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Caller {
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Supplementary groups (at most [`MAX_GROUPS`]).
    #[serde(deserialize_with = "crate::msg::bounded_groups")]
    pub groups: Vec<u32>,
}

impl Caller {
    /// A caller with no supplementary groups.
    pub fn new(uid: u32, gid: u32) -> Caller {
        Caller {
            uid,
            gid,
            groups: Vec::new(),
        }
    }

    /// Whether `gid` is the caller's primary group or one of its supplementary groups.
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }

    /// A stable 64-bit key of the whole identity (uid, gid and groups in order), for
    /// caches of decisions per identity.
    pub fn key(&self) -> u64 {
        // FNV-1a over the little-endian ids: stable, dependency-free, not cryptographic
        // (a collision could only make one identity reuse another's cached answer, and the
        // ids come from the same client's kernel).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut mix = |v: u32| {
            for b in v.to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        };
        mix(self.uid);
        mix(self.gid);
        mix(self.groups.len() as u32);
        for &g in &self.groups {
            mix(g);
        }
        h
    }
}

/// Which claimed ids become the anonymous id.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Squash {
    /// Every id is taken as claimed (NFS `no_root_squash`).
    None,
    /// Uid 0 and gid 0 (also among the supplementary groups) become the anonymous ids (NFS
    /// `root_squash`).
    #[default]
    Root,
    /// Every id becomes the anonymous id and no supplementary group is kept (NFS
    /// `all_squash`).
    All,
}

/// An inclusive range of ids.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdRange {
    /// First id of the range.
    pub first: u32,
    /// Last id of the range (inclusive).
    pub last: u32,
}

impl IdRange {
    /// Whether `id` lies in the range.
    pub fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }
}

/// What a credential restricts its claims to (`hoardfs token add --user` or `--uids`).
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Restrict {
    /// Claims are taken as they come (a machine credential, NFS `AUTH_SYS`).
    #[default]
    None,
    /// Uids outside `uids` and gids outside `gids` become the anonymous ids; supplementary
    /// groups outside `gids` are dropped.
    Ranges {
        /// Uids the credential may claim.
        uids: IdRange,
        /// Gids the credential may claim.
        gids: IdRange,
    },
    /// Every request is this identity, whatever it claims (a user's own credential).
    User(Caller),
}

/// How a server maps the identity a request claims to the one it performs the request as.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IdMap {
    /// Which ids are squashed (applied after `restrict`).
    pub squash: Squash,
    /// The uid squashed uids become.
    pub anon_uid: u32,
    /// The gid squashed gids become.
    pub anon_gid: u32,
    /// The credential's restriction.
    pub restrict: Restrict,
}

/// The anonymous uid and gid of the default mapping (`nobody`/`nogroup` on most systems).
pub const ANON_ID: u32 = 65534;

impl Default for IdMap {
    /// Root squash to 65534/65534, no restriction.
    fn default() -> Self {
        IdMap {
            squash: Squash::Root,
            anon_uid: ANON_ID,
            anon_gid: ANON_ID,
            restrict: Restrict::None,
        }
    }
}

impl IdMap {
    /// The identity a request claiming `claim` is performed as.
    pub fn map(&self, claim: &Caller) -> Caller {
        let c = match &self.restrict {
            Restrict::None => claim.clone(),
            Restrict::User(user) => user.clone(),
            Restrict::Ranges { uids, gids } => Caller {
                uid: if uids.contains(claim.uid) {
                    claim.uid
                } else {
                    self.anon_uid
                },
                gid: if gids.contains(claim.gid) {
                    claim.gid
                } else {
                    self.anon_gid
                },
                groups: claim
                    .groups
                    .iter()
                    .copied()
                    .filter(|g| gids.contains(*g))
                    .collect(),
            },
        };
        let squash = |id: u32, anon: u32| if id == 0 { anon } else { id };
        let mut c = match self.squash {
            Squash::None => c,
            Squash::Root => Caller {
                uid: squash(c.uid, self.anon_uid),
                gid: squash(c.gid, self.anon_gid),
                groups: c.groups.iter().map(|&g| squash(g, self.anon_gid)).collect(),
            },
            Squash::All => Caller::new(self.anon_uid, self.anon_gid),
        };
        // `u32::MAX` is "no id" to the kernel's chown and setfsuid: never act as it.
        if c.uid == u32::MAX {
            c.uid = self.anon_uid;
        }
        if c.gid == u32::MAX {
            c.gid = self.anon_gid;
        }
        c.groups.retain(|&g| g != u32::MAX);
        c.groups.sort_unstable();
        c.groups.dedup();
        c.groups.truncate(MAX_GROUPS);
        c
    }
}

impl IdMap {
    /// The uid and gid a claim maps to (what [`IdMap::map`] gives them), without building
    /// the identity.
    fn ids_of(&self, claim: &Caller) -> (u32, u32) {
        let (uid, gid) = match &self.restrict {
            Restrict::None => (claim.uid, claim.gid),
            Restrict::User(user) => (user.uid, user.gid),
            Restrict::Ranges { uids, gids } => (
                if uids.contains(claim.uid) {
                    claim.uid
                } else {
                    self.anon_uid
                },
                if gids.contains(claim.gid) {
                    claim.gid
                } else {
                    self.anon_gid
                },
            ),
        };
        let (uid, gid) = match self.squash {
            Squash::None => (uid, gid),
            Squash::Root => (
                if uid == 0 { self.anon_uid } else { uid },
                if gid == 0 { self.anon_gid } else { gid },
            ),
            Squash::All => (self.anon_uid, self.anon_gid),
        };
        (
            if uid == u32::MAX { self.anon_uid } else { uid },
            if gid == u32::MAX { self.anon_gid } else { gid },
        )
    }

    /// Whether the identity a claim maps to has `g` among its supplementary groups (what
    /// [`IdMap::map`] keeps of them), without building it.
    fn has_group(&self, claim: &Caller, g: u32) -> bool {
        if g == u32::MAX {
            return false;
        }
        let (source, gids) = match &self.restrict {
            Restrict::None => (claim, None),
            Restrict::User(user) => (user, None),
            Restrict::Ranges { gids, .. } => (claim, Some(gids)),
        };
        // Only the first MAX_GROUPS (sorted) are kept: a claim over the bound is mapped.
        if source.groups.len() > MAX_GROUPS {
            return self.map(claim).groups.contains(&g);
        }
        let kept = |x: u32| gids.is_none_or(|r| r.contains(x));
        match self.squash {
            Squash::All => false,
            Squash::None => source.groups.iter().any(|&x| x == g && kept(x)),
            Squash::Root => source
                .groups
                .iter()
                .any(|&x| kept(x) && (if x == 0 { self.anon_gid } else { x }) == g),
        }
    }

    /// Whether the identity `claim` maps to may access an object (see [`may`]): the same
    /// answer as `may(&self.map(claim), ..)`, without building that identity (this is
    /// asked at every open a client answers itself).
    pub fn may_for(
        &self,
        claim: &Caller,
        kind: crate::FileKind,
        perm: u16,
        uid: u32,
        gid: u32,
        mask: u32,
    ) -> bool {
        let (me, my_gid) = self.ids_of(claim);
        let in_group = |g: u32| my_gid == g || self.has_group(claim, g);
        may_ids(me, in_group, kind, perm, uid, gid, mask)
    }
}

/// How a server performs requests, announced in `Hello`.
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Identities {
    /// With its own credentials for every request: the server cannot act as others (it
    /// does not run as root) or its store has no owners (S3). Only the client's kernel
    /// checks permissions, against the attributes the server reports.
    #[default]
    Server,
    /// As the identity each request claims, mapped by this map: the server's kernel
    /// checks every request.
    Callers(IdMap),
}

impl Identities {
    /// The identity the server acts as for `claim`, if it acts as callers at all.
    pub fn acting_as(&self, claim: &Caller) -> Option<Caller> {
        match self {
            Identities::Server => None,
            Identities::Callers(map) => Some(map.map(claim)),
        }
    }
}

/// Access bits of [`may`] and `Op::Access`, as `access(2)` numbers them.
pub const MAY_READ: u32 = 4;
/// Write access.
pub const MAY_WRITE: u32 = 2;
/// Execute (search, for a directory) access.
pub const MAY_EXEC: u32 = 1;

/// Whether `who` may access an object of kind `kind`, permission bits `perm`, owner `uid`
/// and group `gid` for `mask` ([`MAY_READ`] | [`MAY_WRITE`] | [`MAY_EXEC`]) by its mode
/// bits alone, as the kernel's `generic_permission` decides without an ACL: uid 0 may
/// read and write anything, and execute what has any execute bit (search any directory);
/// others get the owner's, the group's or the others' bits, the first class they are in.
pub fn may(who: &Caller, kind: crate::FileKind, perm: u16, uid: u32, gid: u32, mask: u32) -> bool {
    may_ids(who.uid, |g| who.in_group(g), kind, perm, uid, gid, mask)
}

/// [`may`] for user `me`, whose group membership `in_group` tells.
fn may_ids(
    me: u32,
    in_group: impl Fn(u32) -> bool,
    kind: crate::FileKind,
    perm: u16,
    uid: u32,
    gid: u32,
    mask: u32,
) -> bool {
    let mask = mask & 7;
    if me == 0 {
        let any_exec = perm & 0o111 != 0 || kind == crate::FileKind::Dir;
        return mask & MAY_EXEC == 0 || any_exec;
    }
    let bits = if me == uid {
        (perm >> 6) & 7
    } else if in_group(gid) {
        (perm >> 3) & 7
    } else {
        perm & 7
    };
    u32::from(bits) & mask == mask
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileKind;

    fn caller(uid: u32, gid: u32, groups: &[u32]) -> Caller {
        Caller {
            uid,
            gid,
            groups: groups.to_vec(),
        }
    }

    fn map(squash: Squash, restrict: Restrict) -> IdMap {
        IdMap {
            squash,
            anon_uid: 7,
            anon_gid: 8,
            restrict,
        }
    }

    #[test]
    fn root_squash_maps_root_and_its_group_everywhere() {
        let m = map(Squash::Root, Restrict::None);
        assert_eq!(m.map(&caller(0, 0, &[0, 4, 27])), caller(7, 8, &[4, 8, 27]));
        assert_eq!(m.map(&caller(1000, 100, &[5])), caller(1000, 100, &[5]));
        assert_eq!(m.map(&caller(1000, 0, &[])), caller(1000, 8, &[]));
    }

    #[test]
    fn no_squash_and_all_squash() {
        let none = map(Squash::None, Restrict::None);
        assert_eq!(none.map(&caller(0, 0, &[0])), caller(0, 0, &[0]));
        let all = map(Squash::All, Restrict::None);
        assert_eq!(all.map(&caller(1000, 100, &[5, 6])), caller(7, 8, &[]));
    }

    #[test]
    fn the_no_change_id_is_never_acted_as() {
        let none = map(Squash::None, Restrict::None);
        assert_eq!(
            none.map(&caller(u32::MAX, u32::MAX, &[u32::MAX, 3])),
            caller(7, 8, &[3])
        );
    }

    #[test]
    fn ranges_squash_claims_outside_them_and_drop_groups_outside() {
        let r = Restrict::Ranges {
            uids: IdRange {
                first: 1000,
                last: 1999,
            },
            gids: IdRange {
                first: 1000,
                last: 1999,
            },
        };
        let m = map(Squash::None, r);
        assert_eq!(
            m.map(&caller(1500, 1500, &[1501, 27])),
            caller(1500, 1500, &[1501])
        );
        // Claiming root or another user outside the range gets the anonymous ids.
        assert_eq!(m.map(&caller(0, 0, &[0])), caller(7, 8, &[]));
        assert_eq!(m.map(&caller(2000, 100, &[])), caller(7, 8, &[]));
    }

    #[test]
    fn a_user_credential_is_that_user_whatever_it_claims() {
        let user = caller(1234, 1234, &[10, 20]);
        let m = map(Squash::Root, Restrict::User(user.clone()));
        assert_eq!(m.map(&caller(0, 0, &[0])), user);
        assert_eq!(m.map(&caller(99, 99, &[])), user);
        // Root squash still applies to a credential made for root.
        let root = map(Squash::Root, Restrict::User(caller(0, 0, &[])));
        assert_eq!(root.map(&caller(5, 5, &[])), caller(7, 8, &[]));
    }

    #[test]
    fn groups_come_out_sorted_unique_and_bounded() {
        let m = map(Squash::None, Restrict::None);
        let many: Vec<u32> = (0..MAX_GROUPS as u32 + 10).rev().chain([3, 3]).collect();
        let out = m.map(&caller(1, 1, &many));
        assert_eq!(out.groups.len(), MAX_GROUPS);
        assert!(out.groups.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn mode_bits_decide_as_the_kernel_does() {
        let f = FileKind::File;
        let alice = caller(1000, 100, &[]);
        let bob = caller(1001, 101, &[100]);
        let eve = caller(1002, 102, &[]);
        // 0640 alice:100 — alice rw, group (bob through a supplementary group) r, others none.
        assert!(may(&alice, f, 0o640, 1000, 100, MAY_READ | MAY_WRITE));
        assert!(may(&bob, f, 0o640, 1000, 100, MAY_READ));
        assert!(!may(&bob, f, 0o640, 1000, 100, MAY_WRITE));
        assert!(!may(&eve, f, 0o640, 1000, 100, MAY_READ));
        // The owner's class decides even when others have more.
        assert!(!may(&alice, f, 0o077, 1000, 100, MAY_READ));
        // Root reads and writes anything, executes only what has an execute bit.
        let root = caller(0, 0, &[]);
        assert!(may(&root, f, 0o000, 1000, 100, MAY_READ | MAY_WRITE));
        assert!(!may(&root, f, 0o600, 1000, 100, MAY_EXEC));
        assert!(may(&root, f, 0o700, 1000, 100, MAY_EXEC));
        assert!(may(&root, FileKind::Dir, 0o000, 1000, 100, MAY_EXEC));
        // An empty mask asks nothing.
        assert!(may(&eve, f, 0o000, 1000, 100, 0));
    }

    #[test]
    fn deciding_without_building_the_identity_agrees_with_building_it() {
        let range = IdRange {
            first: 1000,
            last: 1999,
        };
        let maps: Vec<IdMap> = [Squash::None, Squash::Root, Squash::All]
            .into_iter()
            .flat_map(|squash| {
                [
                    Restrict::None,
                    Restrict::Ranges {
                        uids: range,
                        gids: range,
                    },
                    Restrict::User(caller(1500, 1500, &[0, 1501, 7])),
                    Restrict::User(caller(0, 0, &[])),
                ]
                .into_iter()
                .map(move |restrict| map(squash, restrict))
            })
            .collect();
        let claims = [
            caller(0, 0, &[0, 4]),
            caller(1000, 100, &[7, 1001]),
            caller(1500, 0, &[0, 1500]),
            caller(2000, 2000, &[u32::MAX, 1000]),
            caller(u32::MAX, u32::MAX, &[]),
        ];
        let ids = [0, 7, 8, 100, 1000, 1001, 1500, 1501, 2000];
        for m in &maps {
            for c in &claims {
                let built = m.map(c);
                for perm in [0o000, 0o007, 0o070, 0o700, 0o640, 0o755, 0o111] {
                    for &owner in &ids {
                        for &group in &ids {
                            for mask in 0..8 {
                                let kind = FileKind::File;
                                assert_eq!(
                                    m.may_for(c, kind, perm, owner, group, mask),
                                    may(&built, kind, perm, owner, group, mask),
                                    "{m:?} {c:?} {perm:o} {owner} {group} {mask}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn keys_differ_with_any_id() {
        let a = caller(1, 2, &[3]);
        assert_eq!(a.key(), caller(1, 2, &[3]).key());
        for b in [
            caller(2, 2, &[3]),
            caller(1, 3, &[3]),
            caller(1, 2, &[4]),
            caller(1, 2, &[]),
        ] {
            assert_ne!(a.key(), b.key(), "{b:?}");
        }
    }
}
