//! Checks of everything a server sends, in one place, before any of it is used.
//!
//! A server is a peer, not a trusted component: a buggy or hostile one must not be able to
//! panic the client, make it allocate without bound or hand the kernel something it cannot
//! represent. Every reply passes through [`answer`] (called by `RemoteOrigin` for each
//! request, with the [`Expect`]ation the request sets) and every batch of callback breaks
//! through [`breaks`]. Values that are merely odd are *sanitised* (timestamps clamped,
//! permission bits masked); values that cannot be right are *rejected*: the request fails
//! with [`OriginError::Protocol`] (EIO at the FUSE boundary) and nothing of the reply is
//! used.
//!
//! | what | rule |
//! | --- | --- |
//! | every `Attr` | timestamp nanoseconds clamped below 1e9; `perm` masked to 0o7777; `size` ≤ `i64::MAX` and `blocks * 512` ≤ `i64::MAX`, else rejected |
//! | reply kind | must be the one the request asks for; a data section only on `Data`/`Xattr` |
//! | `Hello` | the root must be a directory |
//! | `Entry` of create/mkdir/symlink | of the kind created |
//! | `DirPage` | names pass [`check_name`]; at most `max(max_entries, 1)` entries; `next` differs from the cookie asked with |
//! | `Data` | `len` = the data section's length ≤ the length asked |
//! | `Link` | [`hoardfs_proto::check_target`]: not empty, no NUL, ≤ 4095 bytes |
//! | `Written` | `len` ≤ bytes sent; at the offset asked (unless appending); `offset + len` ≤ `i64::MAX`; a regular file |
//! | `Xattr` | `len` = the data section's length ≤ 64 KiB; a name list is NUL-terminated names of 1..=255 bytes |
//! | `Tree` | at most `max(max_entries, 1)` entries in all; every listing passes the `DirPage` rules; the first is the directory asked for, each later one a directory listed before it, none twice |
//! | `Break::Entry` | a name failing [`check_name`] turns the break into `Break::All` |

use hoardfs_proto::check::XATTR_SIZE_MAX;
use hoardfs_proto::{
    Attr, Break, DirEntry, Entry, FileKind, Op, Reply, Timestamp, TreeDir, check_name,
    check_target, check_xattr_list,
};

use crate::{BreakSink, OriginError, Result};

/// What a request allows its reply to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The handshake.
    Hello,
    /// An `Entry`, of this kind if given.
    Entry(Option<FileKind>),
    /// Attributes.
    Attr,
    /// A directory page asked for from `cookie` with at most `max_entries` entries.
    DirPage {
        /// Cookie of the request.
        cookie: u64,
        /// Entry limit of the request.
        max_entries: u32,
    },
    /// File data of at most `asked` bytes.
    Data {
        /// Length of the request.
        asked: u32,
    },
    /// A symlink target.
    Link,
    /// File-system statistics.
    StatFs,
    /// Server counters.
    Counters,
    /// Success without a value.
    Done,
    /// The result of writing `sent` bytes at `offset` (or appending).
    Written {
        /// Bytes sent.
        sent: u32,
        /// Offset asked for.
        offset: u64,
        /// Whether the write appends (then the server picks the offset).
        append: bool,
    },
    /// An extended attribute's value.
    XattrValue,
    /// A list of extended attribute names.
    XattrList,
    /// `Done`, or `Written` of nothing with the attributes after a file was published.
    Flushed,
    /// The listings of a subtree, at most `max_entries` entries in all.
    Tree {
        /// Entry limit of the request.
        max_entries: u32,
    },
    /// The lock in the way of a `TestLock`, if any.
    LockTest,
    /// A granted lock: the file's attributes, or `Done`.
    Locked,
}

impl Expect {
    /// What the reply to `op` (sent with `data_len` bytes of data) may be.
    pub fn of(op: &Op, data_len: usize) -> Expect {
        match op {
            Op::Hello { .. } => Expect::Hello,
            Op::Lookup { .. } | Op::MkNod { .. } | Op::Link { .. } => Expect::Entry(None),
            Op::Create { .. } => Expect::Entry(Some(FileKind::File)),
            Op::MkDir { .. } => Expect::Entry(Some(FileKind::Dir)),
            Op::Symlink { .. } => Expect::Entry(Some(FileKind::Symlink)),
            Op::GetAttr { .. } | Op::SetAttr { .. } | Op::Fallocate { .. } => Expect::Attr,
            Op::ReadDir {
                cookie,
                max_entries,
                ..
            } => Expect::DirPage {
                cookie: *cookie,
                max_entries: *max_entries,
            },
            Op::Read { len, .. } => Expect::Data { asked: *len },
            Op::ReadLink { .. } => Expect::Link,
            Op::StatFs => Expect::StatFs,
            Op::Counters => Expect::Counters,
            Op::Unlink { .. }
            | Op::RmDir { .. }
            | Op::Rename { .. }
            | Op::Fsync { .. }
            | Op::SetXattr { .. }
            | Op::RemoveXattr { .. } => Expect::Done,
            Op::Flush { .. } => Expect::Flushed,
            Op::Write { offset, append, .. } => Expect::Written {
                sent: u32::try_from(data_len).unwrap_or(u32::MAX),
                offset: *offset,
                append: *append,
            },
            Op::GetXattr { .. } => Expect::XattrValue,
            Op::ListXattr { .. } => Expect::XattrList,
            Op::ReadTree { max_entries, .. } => Expect::Tree {
                max_entries: *max_entries,
            },
            Op::TestLock { .. } => Expect::LockTest,
            Op::Lock { .. } => Expect::Locked,
            // Operations without a result of their own (keep-alives, ...) answer `Done`.
            #[allow(unreachable_patterns)]
            _ => Expect::Done,
        }
    }
}

fn protocol(why: impl Into<String>) -> OriginError {
    OriginError::Protocol(why.into())
}

/// Name of a reply's kind, for messages.
pub(crate) fn kind_name(reply: &Reply) -> &'static str {
    match reply {
        Reply::Hello { .. } => "Hello",
        Reply::Entry(_) => "Entry",
        Reply::Attr(_) => "Attr",
        Reply::DirPage { .. } => "DirPage",
        Reply::Data { .. } => "Data",
        Reply::Link(_) => "Link",
        Reply::StatFs(_) => "StatFs",
        Reply::Counters(_) => "Counters",
        Reply::Done => "Done",
        Reply::Written { .. } => "Written",
        Reply::Xattr { .. } => "Xattr",
        Reply::Tree { .. } => "Tree",
        Reply::LockTest(_) => "LockTest",
    }
}

/// Checks (and sanitises) the reply to a request that expects `expect`: the reply kind,
/// its data section and every value in it. See the module docs for the rules.
pub fn answer(expect: &Expect, (mut reply, data): (Reply, Vec<u8>)) -> Result<(Reply, Vec<u8>)> {
    let takes_data = matches!(
        (expect, &reply),
        (Expect::Data { .. }, Reply::Data { .. })
            | (Expect::XattrValue | Expect::XattrList, Reply::Xattr { .. })
    );
    if !takes_data && !data.is_empty() {
        return Err(protocol(format!(
            "{} reply with a stray data section of {} bytes",
            kind_name(&reply),
            data.len()
        )));
    }
    match (expect, &mut reply) {
        (Expect::Hello, Reply::Hello { root, .. }) => {
            entry(root, Some(FileKind::Dir)).map_err(|e| protocol(format!("root: {e}")))?;
        }
        (Expect::Entry(kind), Reply::Entry(e)) => entry(e, *kind).map_err(protocol)?,
        (Expect::Attr, Reply::Attr(a)) => attr(a).map_err(protocol)?,
        (
            Expect::DirPage {
                cookie,
                max_entries,
            },
            Reply::DirPage { entries, next },
        ) => dir_page(entries, *next, *cookie, *max_entries).map_err(protocol)?,
        (Expect::Data { asked }, Reply::Data { len, .. }) => {
            if data.len() != *len as usize || *len > *asked {
                return Err(protocol(format!(
                    "read reply announces {len} bytes (asked {asked}) but carries {}",
                    data.len()
                )));
            }
        }
        (Expect::Link, Reply::Link(target)) => {
            check_target(target).map_err(|e| protocol(format!("symlink target: {e}")))?;
        }
        (Expect::StatFs, Reply::StatFs(_))
        | (Expect::Counters, Reply::Counters(_))
        | (Expect::Done | Expect::Flushed | Expect::Locked, Reply::Done) => {}
        (Expect::Locked, Reply::Attr(a)) => attr(a).map_err(protocol)?,
        (Expect::LockTest, Reply::LockTest(holder)) => {
            if let Some(h) = holder
                && (!h.range.is_valid() || h.range.typ == hoardfs_proto::LockType::Unlock)
            {
                return Err(protocol(format!("a lock in the way that is none: {h:?}")));
            }
        }
        (Expect::Flushed, Reply::Written { len, attr, .. }) => {
            if *len != 0 {
                return Err(protocol(format!(
                    "a flush reply says {len} bytes were written"
                )));
            }
            file_attr(attr, Some(FileKind::File)).map_err(protocol)?;
        }
        (
            Expect::Written {
                sent,
                offset: asked_at,
                append,
            },
            Reply::Written {
                len, offset, attr, ..
            },
        ) => {
            if *len > *sent {
                return Err(protocol(format!("wrote {len} bytes of {sent} sent")));
            }
            if !append && offset != asked_at {
                return Err(protocol(format!("wrote at {offset}, asked {asked_at}")));
            }
            if offset
                .checked_add(u64::from(*len))
                .is_none_or(|end| end > i64::MAX as u64)
            {
                return Err(protocol(format!("wrote {len} bytes at {offset}")));
            }
            file_attr(attr, Some(FileKind::File)).map_err(protocol)?;
        }
        (Expect::XattrValue | Expect::XattrList, Reply::Xattr { len }) => {
            if data.len() != *len as usize || data.len() > XATTR_SIZE_MAX {
                return Err(protocol(format!(
                    "extended attribute reply announces {len} bytes but carries {}",
                    data.len()
                )));
            }
            if *expect == Expect::XattrList {
                check_xattr_list(&data)
                    .map_err(|e| protocol(format!("extended attribute names: {e}")))?;
            }
        }
        (Expect::Tree { max_entries }, Reply::Tree { dirs }) => {
            let total: usize = dirs.iter().map(|d| d.entries.len()).sum();
            if total > (*max_entries).max(1) as usize {
                return Err(protocol(format!(
                    "tree of {total} entries (asked at most {max_entries})"
                )));
            }
            for d in dirs.iter_mut() {
                dir_page(&mut d.entries, None, 0, u32::MAX)
                    .map_err(|e| protocol(format!("tree listing of {}: {e}", d.file_id)))?;
            }
        }
        (_, r) => {
            return Err(protocol(format!(
                "unexpected {} reply to a request expecting {expect:?}",
                kind_name(r)
            )));
        }
    }
    Ok((reply, data))
}

/// Sanitises attributes: see the module docs.
pub fn attr(a: &mut Attr) -> std::result::Result<(), String> {
    file_attr(a, None)
}

fn file_attr(a: &mut Attr, kind: Option<FileKind>) -> std::result::Result<(), String> {
    if let Some(k) = kind
        && a.kind != k
    {
        return Err(format!("a {:?} where a {k:?} was expected", a.kind));
    }
    if a.size > i64::MAX as u64 {
        return Err(format!("size {} out of range", a.size));
    }
    if a.blocks
        .checked_mul(512)
        .is_none_or(|b| b > i64::MAX as u64)
    {
        return Err(format!("block count {} out of range", a.blocks));
    }
    // Only permission bits: anything above would change the file type the kernel sees.
    a.perm &= 0o7777;
    for t in [&mut a.atime, &mut a.mtime, &mut a.ctime] {
        *t = time(*t);
    }
    Ok(())
}

/// A timestamp the client can convert: nanoseconds below 1e9.
pub fn time(t: Timestamp) -> Timestamp {
    t.clamped()
}

fn entry(e: &mut Entry, kind: Option<FileKind>) -> std::result::Result<(), String> {
    file_attr(&mut e.attr, kind)
}

fn dir_page(
    entries: &mut [DirEntry],
    next: Option<u64>,
    cookie: u64,
    max_entries: u32,
) -> std::result::Result<(), String> {
    if entries.len() > max_entries.max(1) as usize {
        return Err(format!(
            "directory page of {} entries (asked at most {max_entries})",
            entries.len()
        ));
    }
    if next == Some(cookie) {
        // Continuing from the same cookie would return the same page forever.
        return Err(format!(
            "directory page does not advance from cookie {cookie}"
        ));
    }
    for e in entries {
        // (Names in messages are cut short: a name is as long as the server likes.)
        let shown = || String::from_utf8_lossy(&e.name[..e.name.len().min(64)]).into_owned();
        check_name(&e.name).map_err(|err| format!("directory entry {:?}: {err}", shown()))?;
        entry(&mut e.entry, None).map_err(|err| format!("directory entry {:?}: {err}", shown()))?;
    }
    Ok(())
}

/// Checks the shape of a subtree's listings (`Tree`) asked for directory `dir_id`: the
/// first listing is that directory's, each later one a directory of an earlier listing,
/// and none comes twice (so that a listing is never taken for another directory's).
pub fn tree_shape(dirs: &[TreeDir], dir_id: u64) -> Result<()> {
    let mut listed = std::collections::HashSet::new();
    let mut seen = std::collections::HashSet::new();
    for (i, d) in dirs.iter().enumerate() {
        let placed = if i == 0 {
            d.file_id == dir_id
        } else {
            listed.contains(&d.file_id)
        };
        if !placed || !seen.insert(d.file_id) {
            return Err(protocol(format!(
                "tree listing {i} (directory {}) is not a directory of the tree asked for",
                d.file_id
            )));
        }
        listed.extend(
            d.entries
                .iter()
                .filter(|e| e.entry.attr.kind == FileKind::Dir)
                .map(|e| e.entry.attr.file_id),
        );
    }
    Ok(())
}

/// Checks callback breaks: an entry break naming something that cannot be a name becomes
/// a break of everything (the safe reading of a break we cannot apply precisely).
pub fn breaks(mut b: Vec<Break>) -> Vec<Break> {
    let bad = |x: &Break| matches!(x, Break::Entry { name, .. } if check_name(name).is_err());
    if b.iter().any(bad) {
        tracing::warn!("server sent a callback break with an invalid name: breaking everything");
        b.retain(|x| !bad(x));
        b.push(Break::All);
    }
    b
}

/// `sink`, receiving only checked breaks.
pub(crate) fn break_sink(sink: BreakSink) -> BreakSink {
    std::sync::Arc::new(move |b| sink(breaks(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_proto::{Handle, StatFs};

    fn a(kind: FileKind) -> Attr {
        Attr {
            file_id: 2,
            version: 1,
            kind,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size: 10,
            blocks: 8,
            rdev: 0,
            blksize: 4096,
            atime: Timestamp::default(),
            mtime: Timestamp::default(),
            ctime: Timestamp::default(),
            acl: false,
        }
    }

    fn e(kind: FileKind) -> Entry {
        Entry {
            handle: Handle { epoch: 1, id: 2 },
            attr: a(kind),
        }
    }

    fn page(names: &[&[u8]], next: Option<u64>) -> Reply {
        Reply::DirPage {
            entries: names
                .iter()
                .map(|n| DirEntry {
                    name: n.to_vec(),
                    entry: e(FileKind::File),
                })
                .collect(),
            next,
        }
    }

    fn ok(expect: Expect, reply: Reply, data: &[u8]) -> (Reply, Vec<u8>) {
        answer(&expect, (reply, data.to_vec())).expect("accepted")
    }

    fn rejected(expect: Expect, reply: Reply, data: &[u8]) -> bool {
        matches!(
            answer(&expect, (reply, data.to_vec())),
            Err(OriginError::Protocol(_))
        )
    }

    const PAGE: Expect = Expect::DirPage {
        cookie: 5,
        max_entries: 3,
    };

    #[test]
    fn timestamps_are_clamped() {
        let mut bad = a(FileKind::File);
        bad.mtime = Timestamp {
            secs: i64::MAX,
            nanos: u32::MAX,
        };
        bad.atime = Timestamp {
            secs: i64::MIN,
            nanos: 1_000_000_000,
        };
        let (r, _) = ok(Expect::Attr, Reply::Attr(bad), b"");
        let Reply::Attr(got) = r else { panic!() };
        assert_eq!(got.mtime.nanos, 999_999_999);
        assert_eq!(got.mtime.secs, i64::MAX);
        assert_eq!(got.atime.nanos, 999_999_999);
        assert_eq!(got.atime.secs, i64::MIN);
        // Also inside entries and directory pages.
        let mut en = e(FileKind::File);
        en.attr.ctime.nanos = 2_000_000_000;
        let (r, _) = ok(Expect::Entry(None), Reply::Entry(en), b"");
        let Reply::Entry(got) = r else { panic!() };
        assert_eq!(got.attr.ctime.nanos, 999_999_999);
        let Reply::DirPage { mut entries, next } = page(&[b"a"], None) else {
            panic!()
        };
        entries[0].entry.attr.atime.nanos = u32::MAX;
        let (r, _) = ok(PAGE, Reply::DirPage { entries, next }, b"");
        let Reply::DirPage { entries, .. } = r else {
            panic!()
        };
        assert_eq!(entries[0].entry.attr.atime.nanos, 999_999_999);
    }

    /// A directory entry `name` of `kind` with file id `id`.
    fn de(name: &[u8], kind: FileKind, id: u64) -> DirEntry {
        let mut en = e(kind);
        en.attr.file_id = id;
        DirEntry {
            name: name.to_vec(),
            entry: en,
        }
    }

    #[test]
    fn subtree_listings_are_bounded_checked_and_shaped() {
        let tree = |dirs: Vec<TreeDir>| Reply::Tree { dirs };
        let top = TreeDir {
            file_id: 1,
            entries: vec![de(b"sub", FileKind::Dir, 7), de(b"f", FileKind::File, 8)],
        };
        let sub = TreeDir {
            file_id: 7,
            entries: vec![de(b"g", FileKind::File, 9)],
        };
        let asked = Expect::Tree { max_entries: 3 };
        let (r, _) = ok(asked, tree(vec![top.clone(), sub.clone()]), b"");
        let Reply::Tree { dirs } = r else { panic!() };
        assert_eq!(tree_shape(&dirs, 1).map_err(|e| e.to_string()), Ok(()));
        // More entries than asked for, a bad name, a data section.
        assert!(rejected(
            Expect::Tree { max_entries: 2 },
            tree(vec![top.clone(), sub.clone()]),
            b""
        ));
        let mut bad = sub.clone();
        bad.entries[0].name = b"a/b".to_vec();
        assert!(rejected(asked, tree(vec![top.clone(), bad]), b""));
        assert!(rejected(asked, tree(vec![top.clone()]), b"x"));
        // Not the directory asked for; a listing of a directory not listed before it (a
        // file's id, or one from nowhere); the same directory twice.
        assert!(tree_shape(std::slice::from_ref(&top), 2).is_err());
        for id in [8, 99] {
            let stray = TreeDir {
                file_id: id,
                entries: Vec::new(),
            };
            assert!(tree_shape(&[top.clone(), stray], 1).is_err());
        }
        assert!(tree_shape(&[top.clone(), sub.clone(), sub], 1).is_err());
        assert_eq!(tree_shape(&[], 1).map_err(|e| e.to_string()), Ok(()));
    }

    #[test]
    fn permission_bits_are_masked() {
        let mut bad = a(FileKind::File);
        bad.perm = 0o170_755;
        let (r, _) = ok(Expect::Attr, Reply::Attr(bad), b"");
        assert!(matches!(r, Reply::Attr(x) if x.perm == 0o755));
    }

    #[test]
    fn sizes_and_blocks_in_range() {
        let mut big = a(FileKind::File);
        big.size = i64::MAX as u64;
        ok(Expect::Attr, Reply::Attr(big), b"");
        big.size += 1;
        assert!(rejected(Expect::Attr, Reply::Attr(big), b""));
        let mut blocks = a(FileKind::File);
        blocks.blocks = i64::MAX as u64 / 512;
        ok(Expect::Attr, Reply::Attr(blocks), b"");
        blocks.blocks += 1;
        assert!(rejected(Expect::Attr, Reply::Attr(blocks), b""));
        blocks.blocks = u64::MAX;
        assert!(rejected(Expect::Attr, Reply::Attr(blocks), b""));
    }

    #[test]
    fn reply_kind_and_stray_data() {
        assert!(rejected(Expect::Attr, Reply::Done, b""));
        assert!(rejected(Expect::Done, Reply::Attr(a(FileKind::File)), b""));
        assert!(rejected(Expect::Done, Reply::Done, b"x"));
        assert!(rejected(Expect::Link, Reply::Link(b"t".to_vec()), b"x"));
        ok(Expect::Done, Reply::Done, b"");
        ok(Expect::StatFs, Reply::StatFs(StatFs::default()), b"");
    }

    #[test]
    fn hello_root_must_be_a_directory() {
        let hello = |kind| Reply::Hello {
            version: hoardfs_proto::PROTOCOL_VERSION,
            export_id: 1,
            root: e(kind),
            read_only: false,
            verifier: 1,
            publishes_on_close: false,
            identities: hoardfs_proto::Identities::Server,
        };
        ok(Expect::Hello, hello(FileKind::Dir), b"");
        assert!(rejected(Expect::Hello, hello(FileKind::File), b""));
    }

    #[test]
    fn created_entries_have_the_created_kind() {
        let create = Expect::of(
            &Op::Create {
                parent: Handle { epoch: 1, id: 1 },
                name: b"f".to_vec(),
                mode: 0o644,
                exclusive: false,
                owner: Default::default(),
            },
            0,
        );
        ok(create, Reply::Entry(e(FileKind::File)), b"");
        assert!(rejected(create, Reply::Entry(e(FileKind::Dir)), b""));
        let mkdir = Expect::Entry(Some(FileKind::Dir));
        assert!(rejected(mkdir, Reply::Entry(e(FileKind::File)), b""));
        ok(Expect::Entry(None), Reply::Entry(e(FileKind::Fifo)), b"");
    }

    #[test]
    fn directory_names_must_be_plain_components() {
        ok(PAGE, page(&[b"a", b"...", &[b'n'; 255]], Some(9)), b"");
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b", &[b'n'; 256]] {
            assert!(rejected(PAGE, page(&[b"ok", bad], None), b""), "{bad:?}");
        }
    }

    #[test]
    fn directory_pages_are_bounded_and_advance() {
        assert!(rejected(PAGE, page(&[b"a", b"b", b"c", b"d"], None), b""));
        // The page's cookie again would loop forever.
        assert!(rejected(PAGE, page(&[b"a"], Some(5)), b""));
        ok(PAGE, page(&[], Some(6)), b"");
        // A server gives at least one entry, even when asked for none.
        let zero = Expect::DirPage {
            cookie: 0,
            max_entries: 0,
        };
        ok(zero, page(&[b"a"], Some(1)), b"");
        assert!(rejected(zero, page(&[b"a", b"b"], Some(1)), b""));
    }

    #[test]
    fn read_replies_are_no_longer_than_asked() {
        let data = |len| Reply::Data { len, version: 1 };
        ok(Expect::Data { asked: 4 }, data(3), b"abc");
        assert!(rejected(Expect::Data { asked: 2 }, data(3), b"abc"));
        assert!(rejected(Expect::Data { asked: 4 }, data(4), b"abc"));
    }

    #[test]
    fn symlink_targets() {
        ok(Expect::Link, Reply::Link(b"../a".to_vec()), b"");
        assert!(rejected(Expect::Link, Reply::Link(b"a\0b".to_vec()), b""));
        assert!(rejected(Expect::Link, Reply::Link(Vec::new()), b""));
        assert!(rejected(Expect::Link, Reply::Link(vec![b'a'; 4096]), b""));
    }

    #[test]
    fn written_is_within_what_was_sent() {
        let written = |len, offset| Reply::Written {
            len,
            offset,
            pre_version: 1,
            attr: a(FileKind::File),
        };
        let at = |offset, append| Expect::Written {
            sent: 10,
            offset,
            append,
        };
        ok(at(100, false), written(10, 100), b"");
        assert!(rejected(at(100, false), written(11, 100), b""));
        assert!(rejected(at(100, false), written(10, 101), b""));
        ok(at(100, true), written(10, 5000), b"");
        assert!(rejected(at(0, true), written(10, u64::MAX - 5), b""));
        assert!(rejected(at(0, true), written(10, i64::MAX as u64 - 5), b""));
        let mut dir = written(1, 0);
        if let Reply::Written { attr, .. } = &mut dir {
            attr.kind = FileKind::Dir;
        }
        assert!(rejected(at(0, false), dir, b""));
    }

    #[test]
    fn xattrs() {
        let x = |len| Reply::Xattr { len };
        ok(Expect::XattrValue, x(3), b"a\0b");
        assert!(rejected(Expect::XattrValue, x(4), b"a\0b"));
        let big = vec![0; XATTR_SIZE_MAX + 1];
        assert!(rejected(
            Expect::XattrValue,
            x(big.len() as u32),
            big.as_slice()
        ));
        ok(Expect::XattrList, x(14), b"user.a\0user.b\0");
        assert!(rejected(Expect::XattrList, x(6), b"user.a"));
        assert!(rejected(Expect::XattrList, x(3), b"a\0\0"));
    }

    #[test]
    fn entry_breaks_with_bad_names_break_everything() {
        let good = Break::Entry {
            dir_id: 1,
            name: b"a".to_vec(),
            file_id: None,
        };
        let attr = Break::Attr {
            file_id: 3,
            change_id: 0,
        };
        assert_eq!(
            breaks(vec![good.clone(), attr.clone()]),
            vec![good.clone(), attr.clone()]
        );
        let bad = Break::Entry {
            dir_id: 1,
            name: b"../x".to_vec(),
            file_id: Some(4),
        };
        assert_eq!(
            breaks(vec![good.clone(), bad, attr.clone()]),
            vec![good, attr, Break::All]
        );
    }
}

#[cfg(test)]
#[path = "hostile_tests.rs"]
mod hostile_tests;
