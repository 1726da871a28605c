//! Identity mapping of client requests, like the `root_squash` family of NFS export options.
//!
//! Who a request is performed as is the request's caller mapped by its session's
//! `hoardfs_proto::IdMap` (squash, the credential's restriction; see `handle`): the
//! server's kernel then decides what that identity may do, a `chown` included (its target
//! ids are the caller's wish, not mapped: the kernel lets only the privileged give files
//! away). An [`IdMapping`] holds the export's squash settings and decides, before a
//! request reaches the origin, what else the server accepts:
//!
//! - **Owners** a request names for new objects (create, mknod, mkdir, symlink), which an
//!   origin that cannot act as its callers records instead (a server not running as
//!   root records none): mapped by [`IdMapping::uid`] / [`IdMapping::gid`], with
//!   [`Squash::Root`] id 0 becoming the anonymous id, with [`Squash::All`] every id. The
//!   id `u32::MAX` (which `chown(2)` reads as "leave alone") is never recorded as an
//!   owner: in a setattr it means "no change", as new owner it becomes the anonymous id.
//! - **Set-id bits** (`S_ISUID`, `S_ISGID`) are dropped from every mode a client asks for
//!   ([`IdMapping::mode`]) unless `allow_setid`, and a regular file whose owner a client
//!   changes keeps none ([`IdMapping::setid_left_after_chown`]).
//! - **Device nodes** (character and block) cannot be created unless `allow_devices`
//!   ([`IdMapping::check_node`]); fifos and sockets can.
//!
//! [`IdMapping::apply`] applies all of this to one request. Hard links need nothing: a link
//! is another name of an object whose owner and mode stay as they are.

use hoardfs_proto::{ANON_ID, Attr, FileKind, Op, Owner, SetAttrs, Squash, WireError};

/// The set-user-id and set-group-id permission bits.
const SETID_BITS: u32 = 0o6000;

/// The id `chown(2)` reads as "leave this id alone"; never an owner.
const NO_ID: u32 = u32::MAX;

/// What a server accepts of the identities and privileges clients ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdMapping {
    /// Which ids are squashed.
    pub squash: Squash,
    /// The uid squashed uids become (not `u32::MAX`, which no object can be given).
    pub anon_uid: u32,
    /// The gid squashed gids become (not `u32::MAX`).
    pub anon_gid: u32,
    /// Keep set-user-id and set-group-id bits clients ask for.
    pub allow_setid: bool,
    /// Let clients create character and block devices.
    pub allow_devices: bool,
}

impl Default for IdMapping {
    /// Root squash to 65534/65534, set-id bits dropped, devices refused.
    fn default() -> Self {
        IdMapping {
            squash: Squash::Root,
            anon_uid: ANON_ID,
            anon_gid: ANON_ID,
            allow_setid: false,
            allow_devices: false,
        }
    }
}

impl IdMapping {
    /// The mapping that accepts everything: no squash, set-id bits and devices allowed.
    pub fn trusting() -> Self {
        IdMapping {
            squash: Squash::None,
            allow_setid: true,
            allow_devices: true,
            ..IdMapping::default()
        }
    }

    /// The uid the server records for client uid `uid`.
    pub fn uid(&self, uid: u32) -> u32 {
        self.id(uid, self.anon_uid)
    }

    /// The gid the server records for client gid `gid`.
    pub fn gid(&self, gid: u32) -> u32 {
        self.id(gid, self.anon_gid)
    }

    /// The one squash rule, for uids and gids alike.
    fn id(&self, id: u32, anon: u32) -> u32 {
        match self.squash {
            _ if id == NO_ID => anon,
            Squash::None => id,
            Squash::Root if id != 0 => id,
            Squash::Root | Squash::All => anon,
        }
    }

    /// The owner a new object gets for the client's `owner`; `Invalid` if that would be
    /// `u32::MAX` (an anonymous id of `u32::MAX` would leave the object the server's).
    pub fn owner(&self, owner: Owner) -> Result<Owner, WireError> {
        let mapped = Owner {
            uid: self.uid(owner.uid),
            gid: self.gid(owner.gid),
        };
        if mapped.uid == NO_ID || mapped.gid == NO_ID {
            return Err(WireError::Invalid);
        }
        Ok(mapped)
    }

    /// The mode applied for a client's `mode` (type bits, if any, untouched): without
    /// `allow_setid`, the set-id bits are dropped.
    pub fn mode(&self, mode: u32) -> u32 {
        if self.allow_setid {
            mode
        } else {
            mode & !SETID_BITS
        }
    }

    /// Whether a client may create a node of type `mode & S_IFMT`: character and block
    /// devices only with `allow_devices` (`NotPermitted` otherwise, i.e. `EPERM`).
    pub fn check_node(&self, mode: u32) -> Result<(), WireError> {
        let kind = mode & libc::S_IFMT;
        if !self.allow_devices && (kind == libc::S_IFCHR || kind == libc::S_IFBLK) {
            return Err(WireError::NotPermitted);
        }
        Ok(())
    }

    /// A setattr's changes as the server applies them: an id of `u32::MAX` dropped (it asks
    /// for no change), the mode's set-id bits dropped unless allowed. With `as_callers`
    /// (the origin performs the request as its mapped caller), a chown's ids pass as asked:
    /// the kernel decides whether the caller may. Otherwise (the server performs it with
    /// its own privileges) they are squashed like the owners of new objects.
    pub fn set_attrs(&self, set: SetAttrs, as_callers: bool) -> SetAttrs {
        let keep = |id: u32, map: &dyn Fn(u32) -> u32| if as_callers { id } else { map(id) };
        SetAttrs {
            mode: set.mode.map(|m| self.mode(m)),
            uid: set
                .uid
                .filter(|&u| u != NO_ID)
                .map(|u| keep(u, &|u| self.uid(u))),
            gid: set
                .gid
                .filter(|&g| g != NO_ID)
                .map(|g| keep(g, &|g| self.gid(g))),
            ..set
        }
    }

    /// After setattr `set` (already mapped) left a file with attributes `attr`: the mode
    /// that clears set-id bits which survived a change of owner, if any must be cleared.
    ///
    /// Linux's `chown` clears `S_ISUID`, and `S_ISGID` when group-executable, of
    /// non-directories even when root calls it; this also covers the `S_ISGID` it keeps
    /// (no group execute) and file systems that keep both.
    pub fn setid_left_after_chown(&self, set: &SetAttrs, attr: &Attr) -> Option<u32> {
        let chown = set.uid.is_some() || set.gid.is_some();
        let perm = u32::from(attr.perm);
        let left = attr.kind == FileKind::File && perm & SETID_BITS != 0;
        (chown && left && !self.allow_setid).then_some(perm & !SETID_BITS)
    }

    /// The mode to give a regular file after a client wrote to it, when it still has set-id
    /// bits and they are not allowed: the kernel clears them on a write by an unprivileged
    /// process, but the server writes with the privilege to keep them (`CAP_FSETID`), so a
    /// client could otherwise plant code in a set-id file it may write to.
    pub fn setid_left_after_write(&self, attr: &Attr) -> Option<u32> {
        let perm = u32::from(attr.perm);
        let left = attr.kind == FileKind::File && perm & SETID_BITS != 0;
        (left && !self.allow_setid).then_some(perm & !SETID_BITS)
    }

    /// Applies the mapping to a request: the request to run, or the error to answer.
    /// Requests that carry no identity, mode or node type pass unchanged. `as_callers`:
    /// the origin performs requests as their mapped callers ([`IdMapping::set_attrs`]).
    pub fn apply(&self, op: Op, as_callers: bool) -> Result<Op, WireError> {
        Ok(match op {
            Op::Create {
                parent,
                name,
                mode,
                exclusive,
                owner,
            } => Op::Create {
                parent,
                name,
                mode: self.mode(mode),
                exclusive,
                owner: self.owner(owner)?,
            },
            Op::MkNod {
                parent,
                name,
                mode,
                rdev,
                owner,
            } => {
                self.check_node(mode)?;
                Op::MkNod {
                    parent,
                    name,
                    mode: self.mode(mode),
                    rdev,
                    owner: self.owner(owner)?,
                }
            }
            Op::MkDir {
                parent,
                name,
                mode,
                owner,
            } => Op::MkDir {
                parent,
                name,
                mode: self.mode(mode),
                owner: self.owner(owner)?,
            },
            Op::Symlink {
                parent,
                name,
                target,
                owner,
            } => Op::Symlink {
                parent,
                name,
                target,
                owner: self.owner(owner)?,
            },
            Op::SetAttr { handle, set } => Op::SetAttr {
                handle,
                set: self.set_attrs(set, as_callers),
            },
            other => other,
        })
    }
}

#[cfg(test)]
mod tests {
    use hoardfs_proto::{Handle, TimeSet, Timestamp};

    use super::*;

    const ROOT: Owner = Owner { uid: 0, gid: 0 };
    const USER: Owner = Owner {
        uid: 1000,
        gid: 100,
    };
    const H: Handle = Handle { epoch: 1, id: 2 };

    fn with(squash: Squash) -> IdMapping {
        IdMapping {
            squash,
            anon_uid: 7,
            anon_gid: 8,
            ..IdMapping::default()
        }
    }

    /// The owner `m` gives a new object of `owner`, which must be a valid one.
    fn mapped(m: IdMapping, owner: Owner) -> Owner {
        m.owner(owner).expect("a valid owner")
    }

    const ANON: Owner = Owner { uid: 7, gid: 8 };

    #[test]
    fn default_squashes_root_strips_setid_and_refuses_devices() {
        let m = IdMapping::default();
        assert_eq!(m.squash, Squash::Root);
        assert_eq!((m.anon_uid, m.anon_gid), (65534, 65534));
        let nobody = Owner {
            uid: 65534,
            gid: 65534,
        };
        assert_eq!(mapped(m, ROOT), nobody);
        assert_eq!(m.mode(0o4755), 0o755);
        assert_eq!(
            m.check_node(libc::S_IFCHR | 0o600),
            Err(WireError::NotPermitted)
        );
    }

    #[test]
    fn squash_rules_for_uids_and_gids() {
        let none = with(Squash::None);
        let root = with(Squash::Root);
        let all = with(Squash::All);
        assert_eq!(mapped(none, ROOT), ROOT);
        assert_eq!(mapped(none, USER), USER);
        assert_eq!(mapped(root, ROOT), ANON);
        assert_eq!(mapped(root, USER), USER);
        // Uid and gid are squashed independently.
        let uid0 = Owner { uid: 0, gid: 100 };
        assert_eq!(mapped(root, uid0), Owner { uid: 7, gid: 100 });
        let gid0 = Owner { uid: 1000, gid: 0 };
        assert_eq!(mapped(root, gid0), Owner { uid: 1000, gid: 8 });
        assert_eq!(mapped(all, ROOT), ANON);
        assert_eq!(mapped(all, USER), ANON);
    }

    #[test]
    fn the_no_change_id_is_never_an_owner() {
        // fchown(-1) would leave a new object with the server's (root's) ids.
        let minus_one = Owner {
            uid: u32::MAX,
            gid: u32::MAX,
        };
        for squash in [Squash::None, Squash::Root, Squash::All] {
            assert_eq!(mapped(with(squash), minus_one), ANON);
        }
        // Nor can a mapping make it one.
        let broken = IdMapping {
            anon_uid: u32::MAX,
            ..IdMapping::default()
        };
        assert_eq!(broken.owner(ROOT), Err(WireError::Invalid));
        assert_eq!(broken.owner(USER), Ok(USER));
        // In a setattr it asks for no change, and no change is made.
        let set = SetAttrs {
            uid: Some(u32::MAX),
            gid: Some(u32::MAX),
            ..Default::default()
        };
        assert_eq!(with(Squash::All).set_attrs(set, true), SetAttrs::default());
        assert_eq!(with(Squash::All).set_attrs(set, false), SetAttrs::default());
    }

    #[test]
    fn setid_bits_only_when_allowed_other_bits_untouched() {
        let strict = IdMapping::default();
        let lax = IdMapping {
            allow_setid: true,
            ..strict
        };
        assert_eq!(strict.mode(0o7777), 0o1777, "sticky bit kept");
        assert_eq!(strict.mode(libc::S_IFREG | 0o2750), libc::S_IFREG | 0o750);
        assert_eq!(lax.mode(libc::S_IFREG | 0o6755), libc::S_IFREG | 0o6755);
    }

    #[test]
    fn devices_only_when_allowed_fifos_and_sockets_always() {
        let strict = IdMapping::default();
        let lax = IdMapping {
            allow_devices: true,
            ..strict
        };
        for kind in [libc::S_IFCHR, libc::S_IFBLK] {
            assert_eq!(
                strict.check_node(kind | 0o666),
                Err(WireError::NotPermitted)
            );
            assert_eq!(lax.check_node(kind | 0o666), Ok(()));
        }
        for kind in [0, libc::S_IFREG, libc::S_IFIFO, libc::S_IFSOCK] {
            assert_eq!(strict.check_node(kind | 0o644), Ok(()));
        }
    }

    #[test]
    fn setattr_maps_the_mode_and_keeps_the_rest() {
        let t = TimeSet::At(Timestamp { secs: 5, nanos: 6 });
        let set = SetAttrs {
            mode: Some(0o4755),
            uid: Some(0),
            gid: Some(0),
            size: Some(9),
            atime: Some(t),
            mtime: Some(TimeSet::Now),
        };
        let want = SetAttrs {
            mode: Some(0o755),
            ..set
        };
        // Performed as the caller, a chown's ids are the caller's wish: whether it may is
        // the kernel's to say.
        assert_eq!(with(Squash::Root).set_attrs(set, true), want);
        assert_eq!(with(Squash::All).set_attrs(set, true), want);
        assert_eq!(IdMapping::trusting().set_attrs(set, true), set);
        // Performed with the server's privileges, they are squashed.
        let squashed = SetAttrs {
            mode: Some(0o755),
            uid: Some(7),
            gid: Some(8),
            ..set
        };
        assert_eq!(with(Squash::Root).set_attrs(set, false), squashed);
        let to_user = SetAttrs {
            uid: Some(1000),
            ..Default::default()
        };
        assert_eq!(with(Squash::Root).set_attrs(to_user, false), to_user);
        assert_eq!(with(Squash::All).set_attrs(to_user, false).uid, Some(7));
    }

    fn attr(kind: FileKind, perm: u16) -> Attr {
        let ts = Timestamp::default();
        Attr {
            file_id: 1,
            version: 1,
            kind,
            perm,
            nlink: 1,
            uid: 7,
            gid: 8,
            size: 0,
            blocks: 0,
            rdev: 0,
            blksize: 4096,
            atime: ts,
            mtime: ts,
            ctime: ts,
            acl: false,
        }
    }

    #[test]
    fn setid_bits_surviving_a_chown_are_cleared_on_files() {
        let m = IdMapping::default();
        let chown = SetAttrs {
            gid: Some(8),
            ..Default::default()
        };
        // S_ISGID without group execute survives Linux's chown.
        let left = attr(FileKind::File, 0o2644);
        assert_eq!(m.setid_left_after_chown(&chown, &left), Some(0o644));
        assert_eq!(
            m.setid_left_after_chown(&chown, &attr(FileKind::File, 0o4755)),
            Some(0o755)
        );
        assert_eq!(
            m.setid_left_after_chown(&chown, &attr(FileKind::File, 0o755)),
            None
        );
        // Not a chown, not a regular file, or allowed: nothing to do.
        let chmod = SetAttrs {
            mode: Some(0o644),
            ..Default::default()
        };
        assert_eq!(m.setid_left_after_chown(&chmod, &left), None);
        assert_eq!(
            m.setid_left_after_chown(&chown, &attr(FileKind::Dir, 0o2755)),
            None
        );
        let lax = IdMapping {
            allow_setid: true,
            ..m
        };
        assert_eq!(lax.setid_left_after_chown(&chown, &left), None);
    }

    #[test]
    fn apply_maps_every_creating_request() {
        let m = with(Squash::Root);
        let name = b"n".to_vec();
        let create = Op::Create {
            parent: H,
            name: name.clone(),
            mode: 0o4755,
            exclusive: true,
            owner: ROOT,
        };
        assert_eq!(
            m.apply(create, false),
            Ok(Op::Create {
                parent: H,
                name: name.clone(),
                mode: 0o755,
                exclusive: true,
                owner: ANON,
            })
        );
        let mkdir = Op::MkDir {
            parent: H,
            name: name.clone(),
            mode: 0o2775,
            owner: USER,
        };
        assert_eq!(
            m.apply(mkdir, false),
            Ok(Op::MkDir {
                parent: H,
                name: name.clone(),
                mode: 0o775,
                owner: USER,
            })
        );
        let fifo = Op::MkNod {
            parent: H,
            name: name.clone(),
            mode: libc::S_IFIFO | 0o6644,
            rdev: 0,
            owner: ROOT,
        };
        assert_eq!(
            m.apply(fifo, false),
            Ok(Op::MkNod {
                parent: H,
                name: name.clone(),
                mode: libc::S_IFIFO | 0o644,
                rdev: 0,
                owner: ANON,
            })
        );
        let null = Op::MkNod {
            parent: H,
            name: name.clone(),
            mode: libc::S_IFCHR | 0o666,
            rdev: libc::makedev(1, 3),
            owner: ROOT,
        };
        assert_eq!(m.apply(null, false), Err(WireError::NotPermitted));
        let symlink = Op::Symlink {
            parent: H,
            name: name.clone(),
            target: b"t".to_vec(),
            owner: ROOT,
        };
        assert_eq!(
            m.apply(symlink, false),
            Ok(Op::Symlink {
                parent: H,
                name: name.clone(),
                target: b"t".to_vec(),
                owner: ANON,
            })
        );
        let chown = Op::SetAttr {
            handle: H,
            set: SetAttrs {
                uid: Some(0),
                ..Default::default()
            },
        };
        let Ok(Op::SetAttr { set, .. }) = m.apply(chown.clone(), false) else {
            panic!("a setattr stays a setattr");
        };
        assert_eq!(set.uid, Some(7), "squashed when the server acts as itself");
        let Ok(Op::SetAttr { set, .. }) = m.apply(chown, true) else {
            panic!("a setattr stays a setattr");
        };
        assert_eq!(set.uid, Some(0), "the kernel judges a chown, as the caller");
        // Links, and requests without identities, pass unchanged.
        let link = Op::Link {
            handle: H,
            parent: H,
            name,
        };
        assert_eq!(m.apply(link.clone(), false), Ok(link));
        assert_eq!(m.apply(Op::StatFs, false), Ok(Op::StatFs));
    }
}
