//! A fake server that answers with extreme timestamps, sizes, permission bits and names
//! that are not names: a real mount of it stays up, refuses what makes no sense, and
//! serves what does.

mod common;

use std::io::BufReader;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use common::*;
use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{
    Attr, DirEntry, Entry, FileKind, Handle, Op, PROTOCOL_VERSION, Reply, Request, Response,
    ServerMessage, StatFs, Timestamp, WireError,
};

const ROOT: u64 = 1;
const BAD_DIR: u64 = 2;

fn attr(file_id: u64, kind: FileKind) -> Attr {
    Attr {
        file_id,
        version: 1,
        kind,
        perm: 0o644,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 10,
        blocks: 1,
        rdev: 0,
        blksize: 4096,
        atime: Timestamp::default(),
        mtime: Timestamp::default(),
        ctime: Timestamp::default(),
        acl: false,
    }
}

fn entry(id: u64, a: Attr) -> Entry {
    Entry {
        handle: Handle { epoch: 9, id },
        attr: a,
    }
}

/// The root's children: (name, entry). Ids are file ids and handle ids alike.
fn children() -> Vec<(Vec<u8>, Entry)> {
    let mut v = Vec::new();
    v.push((b"ok".to_vec(), entry(10, attr(10, FileKind::File))));
    let mut a = attr(11, FileKind::File);
    a.mtime = Timestamp {
        secs: i64::MAX,
        nanos: u32::MAX,
    };
    a.atime = Timestamp {
        secs: i64::MIN,
        nanos: 1_999_999_999,
    };
    a.ctime = a.mtime;
    v.push((b"far-future".to_vec(), entry(11, a)));
    let mut a = attr(12, FileKind::File);
    a.size = i64::MAX as u64;
    a.blocks = (i64::MAX as u64) / 512;
    a.blksize = 0;
    v.push((b"huge".to_vec(), entry(12, a)));
    let mut a = attr(13, FileKind::File);
    a.perm = u16::MAX;
    a.nlink = u32::MAX;
    a.uid = u32::MAX;
    v.push((b"odd-perm".to_vec(), entry(13, a)));
    let mut a = attr(14, FileKind::CharDev);
    a.rdev = u64::MAX;
    v.push((b"dev".to_vec(), entry(14, a)));
    v.push((
        b"bad".to_vec(),
        entry(BAD_DIR, attr(BAD_DIR, FileKind::Dir)),
    ));
    v
}

/// Sizes no file can have (listed in the directory `bad`, with the bad names).
fn impossible() -> Attr {
    let mut a = attr(21, FileKind::File);
    a.size = u64::MAX;
    a.blocks = u64::MAX;
    a
}

/// Names no directory can hold.
fn bad_names() -> Vec<Vec<u8>> {
    vec![
        b"a/b".to_vec(),
        Vec::new(),
        b"..".to_vec(),
        b"nul\0name".to_vec(),
        vec![b'x'; 300],
    ]
}

fn answer(op: &Op) -> (Result<Reply, WireError>, Vec<u8>) {
    let kids = children();
    let find = |h: &Handle| {
        kids.iter()
            .find(|(_, e)| e.handle.id == h.id)
            .map(|(_, e)| e)
    };
    match op {
        Op::Hello { .. } => (
            Ok(Reply::Hello {
                version: PROTOCOL_VERSION,
                export_id: 77,
                root: entry(ROOT, attr(ROOT, FileKind::Dir)),
                read_only: true,
                verifier: 5,
                publishes_on_close: false,
                identities: hoardfs_proto::Identities::Server,
            }),
            Vec::new(),
        ),
        Op::Lookup { parent, name } if parent.id == ROOT => {
            match kids.iter().find(|(n, _)| n == name) {
                Some((_, e)) => (Ok(Reply::Entry(e.clone())), Vec::new()),
                None => (Err(WireError::NotFound), Vec::new()),
            }
        }
        Op::GetAttr { handle } if handle.id == ROOT => {
            (Ok(Reply::Attr(attr(ROOT, FileKind::Dir))), Vec::new())
        }
        Op::GetAttr { handle } => match find(handle) {
            Some(e) => (Ok(Reply::Attr(e.attr)), Vec::new()),
            None => (Err(WireError::Stale), Vec::new()),
        },
        Op::ReadDir { dir, .. } if dir.id == ROOT => {
            let entries = kids
                .into_iter()
                .map(|(name, entry)| DirEntry { name, entry })
                .collect();
            (
                Ok(Reply::DirPage {
                    entries,
                    next: None,
                }),
                Vec::new(),
            )
        }
        Op::ReadDir { dir, .. } if dir.id == BAD_DIR => {
            let mut entries: Vec<DirEntry> = bad_names()
                .into_iter()
                .map(|name| DirEntry {
                    name,
                    entry: entry(20, attr(20, FileKind::File)),
                })
                .collect();
            entries.push(DirEntry {
                name: b"impossible".to_vec(),
                entry: entry(21, impossible()),
            });
            (
                Ok(Reply::DirPage {
                    entries,
                    next: None,
                }),
                Vec::new(),
            )
        }
        Op::Lookup { parent, .. } if parent.id == BAD_DIR => (Err(WireError::NotFound), Vec::new()),
        // Reads return what was asked, as zeros (even of the "huge" file).
        Op::Read { len, .. } => {
            let n = (*len).min(1 << 20);
            (
                Ok(Reply::Data { len: n, version: 1 }),
                vec![0u8; n as usize],
            )
        }
        Op::StatFs => (
            Ok(Reply::StatFs(StatFs {
                blocks: u64::MAX,
                bfree: u64::MAX,
                bavail: u64::MAX,
                files: u64::MAX,
                ffree: u64::MAX,
                bsize: 0,
                namelen: u32::MAX,
                frsize: 0,
            })),
            Vec::new(),
        ),
        Op::Ping => (Ok(Reply::Done), Vec::new()),
        _ => (Err(WireError::Io), Vec::new()),
    }
}

fn serve(s: TcpStream) {
    let w = Arc::new(Mutex::new(s.try_clone().unwrap()));
    let mut r = BufReader::new(s);
    let mut data = Vec::new();
    while let Ok(body) = frame::read_frame(&mut r, Limits::REQUEST, &mut data) {
        let Ok(req) = frame::decode_body::<Request>(&body) else {
            return;
        };
        let (result, out) = answer(&req.op);
        let msg = ServerMessage::Response(Response { id: req.id, result });
        let body = frame::encode_body(&msg);
        if frame::write_frame(&mut *w.lock().unwrap(), &body, &out).is_err() {
            return;
        }
    }
}

fn start_fake() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for s in l.incoming().flatten() {
            thread::spawn(move || serve(s));
        }
    });
    addr
}

#[test]
fn extreme_replies_do_not_bring_the_client_down() {
    require_fuse();
    let addr = start_fake();
    let t = scratch();
    for cached in [false, true] {
        let cache = t.path().join("cache");
        let c = cache.to_str().unwrap();
        let mut args = vec!["--insecure-plaintext", "--timeout", "3"];
        if cached {
            args.extend(["--cache-dir", c]);
        } else {
            args.push("--no-cache");
        }
        let mut m = Mount::start(&addr, &t.path().join("mnt"), &args).unwrap();
        // Listing and stat of every name: whatever each gives, nothing panics.
        let names: Vec<_> = std::fs::read_dir(&m.path)
            .expect("the root lists")
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(names.iter().any(|n| n == "ok"), "{names:?}");
        for n in &names {
            let p = m.path.join(n);
            let md = std::fs::symlink_metadata(&p);
            eprintln!("{n:?}: {:?}", md.as_ref().map(|m| (m.len(), m.modified())));
            let _ = std::fs::read(&p).map(|d| d.len());
        }
        // A page of names that are not names, or of a size no file has, is refused whole.
        let bad = std::fs::read_dir(m.p("bad")).and_then(|d| d.collect::<Result<Vec<_>, _>>());
        assert!(
            bad.is_err(),
            "names with '/', NUL, '..' or 300 bytes were listed: {bad:?}"
        );
        // The largest size a file can have reads as what the server sends, without a
        // giant allocation.
        let mut f = std::fs::File::open(m.p("huge")).unwrap();
        let mut buf = vec![1u8; 4096];
        assert_eq!(std::io::Read::read(&mut f, &mut buf).unwrap(), 4096);
        assert!(buf.iter().all(|&b| b == 0));
        drop(f);
        let _ = nix_statfs(&m.path);
        // The client is still up and serving.
        assert!(m.alive(), "the client died");
        assert_eq!(std::fs::read(m.p("ok")).unwrap().len(), 10);
        m.unmount();
    }
}

fn nix_statfs(p: &std::path::Path) -> i32 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statvfs into a local struct with a valid path.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        libc::statvfs(c.as_ptr(), &mut s)
    }
}
