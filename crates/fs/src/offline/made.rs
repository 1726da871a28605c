//! Objects this client makes while the origin is unreachable: their file ids (the top
//! bit set, so they never collide with the origin's) and their attributes.

/// The top bit marks the file ids this client makes for objects created offline (origin
/// ids of local exports are inode numbers, far below it; S3 origins are not offline).
pub(crate) const LOCAL_ID: u64 = 1 << 63;

/// The attributes of an object made here: id `file_id` (this client's own), no origin
/// version, times `t`.
pub(crate) fn made_attr(
    file_id: u64,
    kind: hoardfs_origin::FileKind,
    perm: u16,
    owner: hoardfs_origin::Owner,
    size: u64,
    t: hoardfs_origin::Timestamp,
) -> hoardfs_origin::Attr {
    hoardfs_origin::Attr {
        file_id,
        version: 0,
        kind,
        perm,
        nlink: if kind == hoardfs_origin::FileKind::Dir {
            2
        } else {
            1
        },
        uid: owner.uid,
        gid: owner.gid,
        size,
        blocks: 0,
        rdev: 0,
        blksize: 4096,
        atime: t,
        mtime: t,
        ctime: t,
        acl: false,
    }
}

/// A timestamp for now.
pub(crate) fn now_stamp() -> hoardfs_origin::Timestamp {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    hoardfs_origin::Timestamp {
        secs: now.as_secs() as i64,
        nanos: now.subsec_nanos(),
    }
}

/// Attributes for an object made here (id of this client's own).
pub(crate) fn made_here(
    parent: crate::Ino,
    name: &[u8],
    kind: hoardfs_origin::FileKind,
    perm: u16,
    owner: hoardfs_origin::Owner,
    size: u64,
) -> hoardfs_origin::Attr {
    let t = now_stamp();
    let seed = [
        &t.secs.to_le_bytes()[..],
        &t.nanos.to_le_bytes(),
        &parent.to_le_bytes(),
        name,
    ]
    .concat();
    made_attr(
        LOCAL_ID | xxhash_rust::xxh3::xxh3_64(&seed),
        kind,
        perm,
        owner,
        size,
        t,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_origin::{FileKind, Owner};

    #[test]
    fn ids_made_here_are_marked_and_differ_by_name() {
        let owner = Owner { uid: 1, gid: 2 };
        let a = made_here(1, b"a", FileKind::File, 0o644, owner, 0);
        let b = made_here(1, b"b", FileKind::File, 0o644, owner, 0);
        assert_ne!(a.file_id & LOCAL_ID, 0);
        assert_ne!(b.file_id & LOCAL_ID, 0);
        assert_ne!(a.file_id, b.file_id);
        assert_eq!((a.version, a.nlink, a.uid, a.gid), (0, 1, 1, 2));
        let d = made_here(1, b"d", FileKind::Dir, 0o755, owner, 0);
        assert_eq!((d.kind, d.nlink, d.perm), (FileKind::Dir, 2, 0o755));
    }
}
