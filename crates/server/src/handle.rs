//! Request handlers: run one request against the origin (on the blocking pool), encode the
//! reply, and register callbacks for the objects the reply tells the client about.
//!
//! Each request is performed as its caller: the identity it claims, mapped by its
//! session's [`IdMap`] (root squash, the credential's restriction), is entered as the
//! ambient caller (`hoardfs_origin::caller`) around every origin call the request makes;
//! an origin that acts as its callers (`LocalOrigin` of a server running as root) takes
//! that identity's credentials for the call.

use std::sync::Arc;

use hoardfs_origin::{Origin, OriginError, caller};
use hoardfs_proto::{
    Break, Handle, IdMap, MAX_READ_LEN, MAX_TREE_ENTRIES, Op, Reply, SetAttrs, WireError,
};

use crate::Shared;
use crate::callbacks::ConnId;
use crate::outgoing::{Outgoing, wire_error};

/// One decoded request.
pub(crate) struct Req {
    /// Connection it came from.
    pub(crate) conn: ConnId,
    /// Request id.
    pub(crate) id: u64,
    /// Operation.
    pub(crate) op: Op,
    /// Data section (write payload, xattr value).
    pub(crate) data: Vec<u8>,
    /// Who the request claims to be made for.
    pub(crate) caller: hoardfs_proto::Caller,
    /// What the connection's credential may do.
    pub(crate) rights: Arc<SessionRights>,
    /// Where an answer given later goes (a lock granted to a waiting request).
    pub(crate) later: tokio::sync::mpsc::UnboundedSender<Outgoing>,
}

/// What one connection's credential may do.
#[derive(Debug)]
pub(crate) struct SessionRights {
    /// How its claims map to the identities requests are performed as.
    pub(crate) ids: IdMap,
    /// Only requests that change nothing.
    pub(crate) read_only: bool,
}

/// Whether `op` modifies the export (or asks whether it may).
fn modifies(op: &Op) -> bool {
    if let Op::Access { mask, .. } = op {
        return mask & hoardfs_proto::MAY_WRITE != 0;
    }
    matches!(
        op,
        Op::Create { .. }
            | Op::MkNod { .. }
            | Op::MkDir { .. }
            | Op::Symlink { .. }
            | Op::Link { .. }
            | Op::Unlink { .. }
            | Op::RmDir { .. }
            | Op::Rename { .. }
            | Op::SetAttr { .. }
            | Op::Write { .. }
            | Op::Fallocate { .. }
            | Op::SetXattr { .. }
            | Op::RemoveXattr { .. }
    )
}

/// Runs a request and returns its reply. A conservative callback break for a reply that
/// raced a change goes out on its own, through `callbacks` (sent before the reply).
pub(crate) fn handle(shared: &Shared, req: Req) -> Option<Outgoing> {
    let Req {
        conn,
        id,
        op,
        data,
        caller,
        rights,
        later,
    } = req;
    if (shared.cfg.read_only || rights.read_only) && modifies(&op) {
        return Some(Outgoing::new(id, Err(WireError::ReadOnly), Vec::new()));
    }
    // Everything below, origin calls and the breaks that settle a race, is done as the
    // request's (mapped) caller.
    let _caller = caller::enter(Arc::new(rights.ids.map(&caller)));
    // Client identities and privileges are mapped before anything reaches the origin.
    let as_callers = matches!(
        *shared.origin.identities(),
        hoardfs_proto::Identities::Callers(_)
    );
    let op = match shared.cfg.id_map.apply(op, as_callers) {
        Ok(op) => op,
        Err(e) => return Some(Outgoing::new(id, Err(e), Vec::new())),
    };
    match op {
        Op::Lock { .. } | Op::TestLock { .. } | Op::UnlockAll { .. } | Op::CancelLock { .. } => {
            crate::lock_requests::handle(shared, conn, id, op, later)
        }
        op => Some(answer(shared, conn, id, op, data)),
    }
}

/// The reply to a request other than a lock's, made as its caller.
fn answer(shared: &Shared, conn: ConnId, id: u64, op: Op, data: Vec<u8>) -> Outgoing {
    let origin = &*shared.origin;
    if let (
        Op::Read {
            handle,
            offset,
            len,
        },
        Some(quiet),
    ) = (&op, shared.cfg.zero_copy)
        && *len <= MAX_READ_LEN
    {
        // Zero-copy where the origin offers it; otherwise (or for a file changed recently)
        // the read below copies and checks the version after. A read reply names no file,
        // so it registers no callback.
        let range = origin
            .file_ranges()
            .map(|r| r.read_range(*handle, *offset, *len, quiet));
        match range {
            Some(Ok(Some(range))) => {
                origin.settle_changes();
                return Outgoing::file(id, range);
            }
            None | Some(Ok(None)) => {}
            Some(Err(e)) => return Outgoing::new(id, Err(wire_error(e)), Vec::new()),
        }
    }
    let seq_before = shared.callbacks.seq();
    // Context for a conservative break on a race: the directory and name a reply is about.
    let dir_ctx = match &op {
        Op::Lookup { parent, name } => Some((*parent, name.clone())),
        Op::ReadDir { dir, .. } | Op::ReadTree { dir, .. } => Some((*dir, Vec::new())),
        _ => None,
    };
    let (result, out_data) = run(shared, origin, op, data);
    // The breaks of every change made before this request's own go out ahead of its
    // reply: a request that succeeded only after another client's change (an `O_EXCL`
    // create after the other's unlink of a lock file, then an open of what the lock
    // protects) must not find its cached copy still under a callback the other's
    // earlier write broke.
    origin.settle_changes();
    let result = result.map_err(wire_error);
    let files = match &result {
        Ok(r) => files_in(r),
        Err(_) => Vec::new(),
    };
    let raced = shared.callbacks.register(conn, &files, seq_before);
    if raced && let Ok(r) = &result {
        // Something changed while this reply was computed: it may be out of date, and the
        // break for that change may have missed our registration. Break it ourselves.
        let breaks = match r {
            Reply::Tree { .. } => settle_precisely(shared, &files, seq_before),
            _ => None,
        };
        let breaks = breaks.unwrap_or_else(|| conservative_breaks(origin, r, &files, dir_ctx));
        shared.callbacks.send_to(conn, breaks);
    }
    // Built last so the reply (a directory page can hold thousands of entries) is moved,
    // not copied.
    Outgoing::new(id, result, out_data)
}

/// Encoded bytes per directory entry at most in a reply: a 255-byte name, its handle and
/// attributes at their widest (postcard varints: 396 bytes in all), and in a subtree
/// reply the header of the directory it may be (each listed directory is an entry of its
/// parent's listing). Checked by `a_directory_page_is_charged_at_least_what_its_reply_can_hold`.
const ENTRY_BOUND: usize = 416;

/// Entries a `ReadTree` asking for `max_entries` gets at most.
fn tree_entries(max_entries: u32) -> u32 {
    max_entries.clamp(1, MAX_TREE_ENTRIES as u32)
}

/// Entries one `ReadDir` page asking for `max_entries` gets at most.
fn dir_page_entries(max_entries: u32) -> u32 {
    max_entries.clamp(1, MAX_DIR_PAGE)
}

/// Bytes the reply to a `ReadDir` asking for `max_entries` holds at most (its memory
/// charge: about 3 MiB for a full page of long names).
pub(crate) fn dir_page_bound(max_entries: u32) -> usize {
    dir_page_entries(max_entries) as usize * ENTRY_BOUND
}

/// Bytes the reply to a `ReadTree` asking for `max_entries` holds at most (its memory
/// charge: about 6.5 MiB for the 16 Ki entries a client asks for at most).
pub(crate) fn tree_reply_bound(max_entries: u32) -> usize {
    tree_entries(max_entries) as usize * ENTRY_BOUND
}

/// The breaks a raced reply about `files` is settled with: every object in it and, for a
/// directory context, the directory and the names the reply lists.
fn conservative_breaks(
    origin: &dyn Origin,
    r: &Reply,
    files: &[u64],
    dir_ctx: Option<(Handle, Vec<u8>)>,
) -> Vec<Break> {
    let mut breaks: Vec<Break> = files
        .iter()
        .map(|&file_id| Break::Attr {
            file_id,
            change_id: 0,
        })
        .collect();
    if let Some((dir, name)) = dir_ctx
        && let Ok(dattr) = origin.getattr(dir)
    {
        breaks.push(Break::Attr {
            file_id: dattr.file_id,
            change_id: 0,
        });
        let names: Vec<Vec<u8>> = match r {
            Reply::DirPage { entries, .. } => entries.iter().map(|e| e.name.clone()).collect(),
            // The top directory's names; the directories below are among `files`, and a
            // break of a directory voids the client's listing of it.
            Reply::Tree { dirs } => dirs.first().map_or_else(Vec::new, |d| {
                d.entries.iter().map(|e| e.name.clone()).collect()
            }),
            _ => vec![name],
        };
        breaks.extend(names.into_iter().map(|name| Break::Entry {
            dir_id: dattr.file_id,
            name,
            file_id: None,
        }));
    }
    breaks
}

/// The breaks a raced subtree listing about `files` is settled with: the changes reported
/// since `seq_before` that concern its objects or its directories' names, sent again (a
/// walk of 200 ms on a busy server almost always races something, usually elsewhere).
/// `None` when those changes are no longer all kept.
fn settle_precisely(shared: &Shared, files: &[u64], seq_before: u64) -> Option<Vec<Break>> {
    let ids: std::collections::HashSet<u64> = files.iter().copied().collect();
    let changes = shared.callbacks.changes_since(seq_before)?;
    Some(
        changes
            .iter()
            .flat_map(|batch| batch.iter())
            .filter(|b| match b {
                Break::Attr { file_id, .. } => ids.contains(file_id),
                Break::Entry { dir_id, .. } => ids.contains(dir_id),
                Break::All => true,
            })
            .cloned()
            .collect(),
    )
}

/// File ids a reply tells the client about (each gets a callback).
fn files_in(r: &Reply) -> Vec<u64> {
    match r {
        Reply::Entry(e) => vec![e.attr.file_id],
        Reply::Attr(a) => vec![a.file_id],
        Reply::Written { attr, .. } => vec![attr.file_id],
        Reply::DirPage { entries, .. } => entries.iter().map(|e| e.entry.attr.file_id).collect(),
        // Every listed directory too (the top one is no entry of the reply): its names
        // are what the client keeps.
        Reply::Tree { dirs } => dirs
            .iter()
            .flat_map(|d| {
                std::iter::once(d.file_id).chain(d.entries.iter().map(|e| e.entry.attr.file_id))
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Calls the origin; returns the reply and its data section.
fn run(
    shared: &Shared,
    origin: &dyn Origin,
    op: Op,
    data: Vec<u8>,
) -> (Result<Reply, OriginError>, Vec<u8>) {
    let none = Vec::new;
    let done = |r: Result<(), OriginError>| (r.map(|()| Reply::Done), Vec::new());
    match op {
        Op::Lookup { parent, name } => (origin.lookup(parent, &name).map(Reply::Entry), none()),
        Op::GetAttr { handle } => (origin.getattr(handle).map(Reply::Attr), none()),
        Op::ReadDir {
            dir,
            cookie,
            max_entries,
        } => {
            let page = origin.readdir(dir, cookie, dir_page_entries(max_entries));
            let reply = page.map(|p| Reply::DirPage {
                entries: p.entries,
                next: p.next,
            });
            (reply, none())
        }
        Op::Read {
            handle,
            offset,
            len,
        } => read(origin, handle, offset, len),
        Op::ReadLink { handle } => (origin.readlink(handle).map(Reply::Link), none()),
        Op::StatFs => (origin.statfs().map(Reply::StatFs), none()),
        Op::Counters => (Ok(Reply::Counters(shared.counters())), none()),
        Op::Hello { .. } => (Err(WireError::Protocol.into()), none()),
        Op::Create {
            parent,
            name,
            mode,
            exclusive,
            owner,
        } => {
            let e = origin.create(parent, &name, mode, exclusive, owner);
            (e.map(Reply::Entry), none())
        }
        Op::MkNod {
            parent,
            name,
            mode,
            rdev,
            owner,
        } => {
            let e = origin.mknod(parent, &name, mode, rdev, owner);
            (e.map(Reply::Entry), none())
        }
        Op::MkDir {
            parent,
            name,
            mode,
            owner,
        } => (
            origin.mkdir(parent, &name, mode, owner).map(Reply::Entry),
            none(),
        ),
        Op::Symlink {
            parent,
            name,
            target,
            owner,
        } => {
            let e = origin.symlink(parent, &name, &target, owner);
            (e.map(Reply::Entry), none())
        }
        Op::Link {
            handle,
            parent,
            name,
        } => (origin.link(handle, parent, &name).map(Reply::Entry), none()),
        Op::Unlink { parent, name } => done(origin.unlink(parent, &name)),
        Op::RmDir { parent, name } => done(origin.rmdir(parent, &name)),
        Op::Rename {
            parent,
            name,
            new_parent,
            new_name,
            flags,
        } => done(origin.rename(parent, &name, new_parent, &new_name, flags)),
        Op::SetAttr { handle, set } => (setattr(shared, origin, handle, &set), none()),
        Op::Write {
            handle,
            offset,
            append,
        } => (write(shared, origin, handle, (offset, &data), append), {
            hoardfs_proto::buffers::give(data);
            none()
        }),
        Op::Fallocate {
            handle,
            offset,
            length,
            mode,
        } => (
            origin
                .fallocate(handle, offset, length, mode)
                .map(|attr| Reply::Attr(setid_cleared(shared, origin, handle, attr))),
            none(),
        ),
        Op::Fsync { handle, datasync } => done(origin.fsync(handle, datasync)),
        Op::GetXattr { handle, name } => xattr(origin.getxattr(handle, &name)),
        Op::ListXattr { handle } => xattr(origin.listxattr(handle)),
        Op::SetXattr {
            handle,
            name,
            flags,
        } => done(origin.setxattr(handle, &name, &data, flags)),
        Op::RemoveXattr { handle, name } => done(origin.removexattr(handle, &name)),
        Op::Ping => (Ok(Reply::Done), none()),
        Op::ReadTree { dir, max_entries } => {
            let max = tree_entries(max_entries);
            let tree = origin
                .getattr(dir)
                .and_then(|a| origin.read_tree(dir, a.file_id, max));
            (tree.map(|dirs| Reply::Tree { dirs }), none())
        }
        Op::Access { handle, mask } => done(origin.access(handle, mask)),
        Op::Flush { handle } => (flush(origin, handle), none()),
        // Answered by `lock_requests` before reaching here.
        Op::Lock { .. } | Op::TestLock { .. } | Op::UnlockAll { .. } | Op::CancelLock { .. } => {
            (Err(WireError::Protocol.into()), none())
        }
    }
}

/// A `Read` of at most `MAX_READ_LEN` bytes: the reply and its data section.
fn read(
    origin: &dyn Origin,
    handle: Handle,
    offset: u64,
    len: u32,
) -> (Result<Reply, OriginError>, Vec<u8>) {
    if len > MAX_READ_LEN {
        return (Err(WireError::Invalid.into()), Vec::new());
    }
    match origin.read(handle, offset, len) {
        Ok(mut r) => {
            r.data.truncate(len as usize);
            let reply = Reply::Data {
                len: r.data.len() as u32,
                version: r.version,
            };
            (Ok(reply), r.data)
        }
        Err(e) => (Err(e), Vec::new()),
    }
}

/// A `Write` of `data` at `offset`; then, if the write left set-id bits the mapping does
/// not allow, clears them.
fn write(
    shared: &Shared,
    origin: &dyn Origin,
    handle: Handle,
    (offset, data): (u64, &[u8]),
    append: bool,
) -> Result<Reply, OriginError> {
    let w = origin.write(handle, offset, data, append)?;
    let attr = setid_cleared(shared, origin, handle, w.attr);
    Ok(Reply::Written {
        len: w.written,
        offset: w.offset,
        pre_version: w.pre_version,
        attr,
    })
}

/// A `Flush`: the file published, with its attributes before and after (origins that
/// publish at close), or nothing to do.
fn flush(origin: &dyn Origin, handle: Handle) -> Result<Reply, OriginError> {
    origin.flush(handle).map(|r| match r {
        None => Reply::Done,
        Some((pre_version, attr)) => Reply::Written {
            len: 0,
            offset: attr.size,
            pre_version,
            attr,
        },
    })
}

/// A setattr (already mapped); then, if a change of owner left set-id bits on a regular
/// file that the mapping does not allow, clears them.
/// The attributes `attr` of a file just changed, after clearing the set-id bits the
/// change left that the mapping says a change clears. The change is made: a failure here
/// must not report it as failed (a retried append would land twice).
fn setid_cleared(
    shared: &Shared,
    origin: &dyn Origin,
    handle: Handle,
    attr: hoardfs_proto::Attr,
) -> hoardfs_proto::Attr {
    let Some(mode) = shared.cfg.id_map.setid_left_after_write(&attr) else {
        return attr;
    };
    let clear = SetAttrs {
        mode: Some(mode),
        ..SetAttrs::default()
    };
    origin.setattr(handle, &clear).unwrap_or_else(|e| {
        tracing::warn!("cannot clear set-id bits after a write: {e}");
        attr
    })
}

fn setattr(
    shared: &Shared,
    origin: &dyn Origin,
    handle: Handle,
    set: &SetAttrs,
) -> Result<Reply, OriginError> {
    let attr = origin.setattr(handle, set)?;
    let Some(mode) = shared.cfg.id_map.setid_left_after_chown(set, &attr) else {
        return Ok(Reply::Attr(attr));
    };
    let clear = SetAttrs {
        mode: Some(mode),
        ..SetAttrs::default()
    };
    origin.setattr(handle, &clear).map(Reply::Attr)
}

fn xattr(r: Result<Vec<u8>, OriginError>) -> (Result<Reply, OriginError>, Vec<u8>) {
    match r {
        Ok(v) => (
            Ok(Reply::Xattr {
                len: v.len() as u32,
            }),
            v,
        ),
        Err(e) => (Err(e), Vec::new()),
    }
}

/// Upper bound on entries in one directory page, so replies stay well under the client's
/// body limit whatever the client asks for.
const MAX_DIR_PAGE: u32 = 8192;

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_proto::{Attr, DirEntry, Entry, FileKind, Response, ServerMessage, Timestamp};

    /// The largest entry a directory page can carry: a 255-byte name, every number at its
    /// widest encoding.
    fn widest_entry() -> DirEntry {
        let t = Timestamp {
            secs: i64::MIN,
            nanos: u32::MAX,
        };
        DirEntry {
            name: vec![b'x'; 255],
            entry: Entry {
                handle: Handle {
                    epoch: u64::MAX,
                    id: u64::MAX,
                },
                attr: Attr {
                    file_id: u64::MAX,
                    version: u64::MAX,
                    kind: FileKind::Symlink,
                    perm: u16::MAX,
                    nlink: u32::MAX,
                    uid: u32::MAX,
                    gid: u32::MAX,
                    size: u64::MAX,
                    blocks: u64::MAX,
                    rdev: u64::MAX,
                    blksize: u32::MAX,
                    atime: t,
                    mtime: t,
                    ctime: t,
                    acl: true,
                },
            },
        }
    }

    #[test]
    fn a_directory_page_is_charged_at_least_what_its_reply_can_hold() {
        let n = dir_page_entries(u32::MAX) as usize;
        let reply = ServerMessage::Response(Response {
            id: u64::MAX,
            result: Ok(Reply::DirPage {
                entries: vec![widest_entry(); n],
                next: Some(u64::MAX),
            }),
        });
        let encoded = hoardfs_proto::frame::encode_body(&reply).len();
        assert!(
            encoded <= dir_page_bound(u32::MAX),
            "{encoded} > {}",
            dir_page_bound(u32::MAX)
        );
        assert!(dir_page_bound(0) >= ENTRY_BOUND);
    }
}
