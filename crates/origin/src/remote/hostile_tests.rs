//! A hostile server against a real [`RemoteOrigin`]: every reply goes through the checks of
//! `validate` before a caller sees it.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{
    Attr, Break, DirEntry, Entry, FileKind, Handle, Op, PROTOCOL_VERSION, Reply, Request, Response,
    ServerMessage, Timestamp,
};

use crate::remote::{RemoteOptions, RemoteOrigin};
use crate::{Origin, OriginError};

const EXTREME: Timestamp = Timestamp {
    secs: i64::MAX,
    nanos: u32::MAX,
};

fn attr(kind: FileKind) -> Attr {
    Attr {
        file_id: 1,
        version: 1,
        kind,
        perm: 0o170_755,
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        blocks: 0,
        rdev: 0,
        blksize: 4096,
        atime: EXTREME,
        mtime: Timestamp {
            secs: i64::MIN,
            nanos: 1_000_000_000,
        },
        ctime: EXTREME,
        acl: false,
    }
}

fn handle() -> Handle {
    Handle { epoch: 1, id: 1 }
}

/// Serves one connection with `answer`; with `breaks`, sends them before the first reply
/// after the handshake.
fn hostile(breaks: Option<Vec<Break>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut data = Vec::new();
        let mut breaks = breaks;
        while let Ok(body) = frame::read_frame(&mut s, Limits::REQUEST, &mut data) {
            let req: Request = frame::decode_body(&body).unwrap();
            if !matches!(req.op, Op::Hello { .. })
                && let Some(b) = breaks.take()
            {
                let body = frame::encode_body(&ServerMessage::Breaks(b));
                frame::write_frame(&mut s, &body, &[]).unwrap();
            }
            let (reply, data) = answer(&req.op, data.len());
            let msg = ServerMessage::Response(Response {
                id: req.id,
                result: Ok(reply),
            });
            frame::write_frame(&mut s, &frame::encode_body(&msg), &data).unwrap();
        }
    });
    addr
}

fn answer(op: &Op, sent: usize) -> (Reply, Vec<u8>) {
    let entry = |kind| Entry {
        handle: handle(),
        attr: attr(kind),
    };
    match op {
        Op::Hello { .. } => (
            Reply::Hello {
                version: PROTOCOL_VERSION,
                export_id: 1,
                root: entry(FileKind::Dir),
                read_only: false,
                verifier: 1,
                publishes_on_close: false,
                identities: hoardfs_proto::Identities::Server,
            },
            Vec::new(),
        ),
        Op::GetAttr { .. } => (Reply::Attr(attr(FileKind::File)), Vec::new()),
        Op::Lookup { .. } => (Reply::Entry(entry(FileKind::File)), Vec::new()),
        Op::ReadDir { .. } => (
            Reply::DirPage {
                entries: vec![DirEntry {
                    name: b"../etc".to_vec(),
                    entry: entry(FileKind::File),
                }],
                next: None,
            },
            Vec::new(),
        ),
        Op::ReadLink { .. } => (Reply::Link(b"a\0b".to_vec()), Vec::new()),
        Op::Write { .. } => (
            Reply::Written {
                len: sent as u32 + 1,
                offset: 0,
                pre_version: 0,
                attr: attr(FileKind::File),
            },
            Vec::new(),
        ),
        Op::ListXattr { .. } => (Reply::Xattr { len: 3 }, b"abc".to_vec()),
        _ => (Reply::Done, b"stray".to_vec()),
    }
}

fn connect(addr: &str) -> RemoteOrigin {
    let opts = RemoteOptions {
        request_timeout: Duration::from_secs(5),
        ..RemoteOptions::default()
    };
    // (No token: `Default` whatever form the credentials take.)
    RemoteOrigin::connect(addr, Default::default(), opts).unwrap()
}

fn is_protocol<T: std::fmt::Debug>(r: crate::Result<T>) -> bool {
    matches!(r, Err(OriginError::Protocol(_)))
}

#[test]
fn hostile_values_are_sanitised_or_rejected() {
    let o = connect(&hostile(None));
    let clamped = |a: &Attr| {
        assert_eq!(a.atime.nanos, 999_999_999);
        assert_eq!(a.atime.secs, i64::MAX);
        assert_eq!(a.mtime.nanos, 999_999_999);
        assert_eq!(a.perm, 0o755);
    };
    clamped(&o.info().unwrap().root.attr);
    clamped(&o.getattr(handle()).unwrap());
    clamped(&o.lookup(handle(), b"f").unwrap().attr);
    assert!(is_protocol(o.readdir(handle(), 0, 10)));
    assert!(is_protocol(o.readlink(handle())));
    assert!(is_protocol(o.write(handle(), 0, b"abc", false)));
    assert!(is_protocol(o.listxattr(handle())));
    assert!(is_protocol(o.fsync(handle(), false)));
    // A rejected reply is the request's failure only: the connection stays.
    assert!(o.is_connected());
}

#[test]
fn hostile_break_names_break_everything() {
    let bad = Break::Entry {
        dir_id: 1,
        name: b"a/b".to_vec(),
        file_id: None,
    };
    let o = connect(&hostile(Some(vec![bad])));
    let (tx, rx) = mpsc::channel();
    o.subscribe(Arc::new(move |b| {
        let _ = tx.send(b);
    }));
    o.getattr(handle()).unwrap();
    let got = rx.recv_timeout(Duration::from_secs(5)).unwrap();
    assert_eq!(got, vec![Break::All]);
}
