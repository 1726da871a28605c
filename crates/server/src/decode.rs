//! Decoding and checking of request frames, before anything runs: a pure function of the
//! bytes a client sent, shared by the connection's reader and the fuzz harness.
//!
//! The frame header is checked against the limits of the connection's [`Phase`] before
//! anything is allocated; a body that does not decode as a [`Request`] (or, before the
//! handshake, as a `Hello`) ends the connection. A decoded request that cannot be run
//! (a second `Hello`, data on a request that takes none, too much data, a name that is not
//! one plain path component) is refused with an error reply and the connection goes on.

use hoardfs_proto::check::NAME_MAX;
use hoardfs_proto::frame::{self, FrameError, FrameHeader, HEADER_LEN, Limits};
use hoardfs_proto::{MAX_WRITE_LEN, Op, Request, WireError, check_name, check_target};

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the handshake: only a small `Hello` without data is accepted.
    Hello,
    /// Authenticated: any request.
    Requests,
}

/// What is accepted before authentication: a `Hello` body and nothing else.
const HELLO_LIMITS: Limits = Limits {
    max_body: 4096,
    max_data: 0,
};

impl Phase {
    /// Frame limits in this phase.
    pub const fn limits(self) -> Limits {
        match self {
            Phase::Hello => HELLO_LIMITS,
            Phase::Requests => Limits::REQUEST,
        }
    }
}

/// A request of protocol 5 and earlier (no caller).
#[derive(serde::Deserialize)]
struct LegacyRequest {
    id: u64,
    op: Op,
}

/// What to do with one request frame that decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// Run it (in [`Phase::Hello`]: a `Hello`, whose version and token are checked next).
    Run(Request),
    /// Answer request `id` with `error` without running it; the connection goes on.
    Refuse {
        /// Request id.
        id: u64,
        /// The error reply.
        error: WireError,
    },
}

/// Decodes the body of a request frame that carried `data_len` bytes of data, and checks
/// it as the server does before running it. An error means the connection must close.
pub fn decode_request(phase: Phase, body: &[u8], data_len: usize) -> Result<Decoded, FrameError> {
    let req: Request = match frame::decode_body(body) {
        Ok(r) => r,
        // A client older than protocol 6 sends no caller: its `Hello` is read all the
        // same, so that the handshake can tell it which versions this server speaks.
        Err(e) if phase == Phase::Hello => match frame::decode_body::<LegacyRequest>(body) {
            Ok(old) => Request {
                id: old.id,
                op: old.op,
                caller: Default::default(),
            },
            Err(_) => return Err(e),
        },
        Err(e) => return Err(e),
    };
    if phase == Phase::Hello {
        return match req.op {
            Op::Hello { .. } if data_len == 0 => Ok(Decoded::Run(req)),
            _ => Err(FrameError::Malformed("request before hello".into())),
        };
    }
    let takes_data = matches!(req.op, Op::Write { .. } | Op::SetXattr { .. });
    let refusal = if matches!(req.op, Op::Hello { .. }) {
        Some(WireError::Protocol)
    } else if data_len > 0 && !takes_data {
        Some(WireError::Invalid)
    } else if data_len > MAX_WRITE_LEN as usize {
        Some(WireError::TooBig)
    } else {
        check_names(&req.op).err()
    };
    Ok(match refusal {
        Some(error) => Decoded::Refuse { id: req.id, error },
        None => Decoded::Run(req),
    })
}

/// Checks the names a request carries: path components must be plain components, a
/// symlink target a possible target, an extended attribute name at most `NAME_MAX` bytes.
fn check_names(op: &Op) -> Result<(), WireError> {
    match op {
        Op::Lookup { name, .. }
        | Op::Create { name, .. }
        | Op::MkNod { name, .. }
        | Op::MkDir { name, .. }
        | Op::Link { name, .. }
        | Op::Unlink { name, .. }
        | Op::RmDir { name, .. } => check_name(name),
        Op::Symlink { name, target, .. } => check_name(name).and_then(|()| check_target(target)),
        Op::Rename { name, new_name, .. } => check_name(name).and_then(|()| check_name(new_name)),
        Op::GetXattr { name, .. } | Op::SetXattr { name, .. } | Op::RemoveXattr { name, .. } => {
            if name.len() > NAME_MAX {
                Err(WireError::Range)
            } else {
                Ok(())
            }
        }
        _ => Ok(()),
    }
}

/// Reads one request frame from `bytes` the way a connection does (header against the
/// phase's limits, body, data) and decodes it. Returns the outcome and the bytes the frame
/// took; a frame cut short is an `UnexpectedEof` error. For tests and the fuzz harness.
pub fn decode_frame(phase: Phase, bytes: &[u8]) -> Result<(Decoded, usize), FrameError> {
    let eof = || FrameError::Io(std::io::ErrorKind::UnexpectedEof.into());
    let hdr: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or_else(eof)?;
    let h = FrameHeader::parse(hdr, phase.limits())?;
    let body_end = HEADER_LEN + h.body_len as usize;
    let end = body_end + h.data_len as usize;
    if bytes.len() < end {
        return Err(eof());
    }
    let decoded = decode_request(phase, &bytes[HEADER_LEN..body_end], h.data_len as usize)?;
    Ok((decoded, end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoardfs_proto::Handle;

    const H: Handle = Handle { epoch: 1, id: 1 };

    fn framed(op: Op, data: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        let body = frame::encode_body(&Request {
            id: 7,
            op,
            caller: Default::default(),
        });
        frame::write_frame(&mut f, &body, data).unwrap();
        f
    }

    fn refused(phase: Phase, op: Op, data: &[u8]) -> Option<WireError> {
        match decode_frame(phase, &framed(op, data)) {
            Ok((Decoded::Refuse { id: 7, error }, _)) => Some(error),
            Ok((Decoded::Run(_), _)) => None,
            other => panic!("{other:?}"),
        }
    }

    fn hello() -> Op {
        Op::Hello {
            version: 2,
            token: b"t".to_vec(),
        }
    }

    fn lookup(name: &[u8]) -> Op {
        Op::Lookup {
            parent: H,
            name: name.to_vec(),
        }
    }

    #[test]
    fn the_handshake_takes_only_a_hello() {
        let f = framed(hello(), b"");
        assert_eq!(
            decode_frame(Phase::Hello, &f).unwrap(),
            (
                Decoded::Run(Request {
                    id: 7,
                    op: hello(),
                    caller: Default::default()
                }),
                f.len()
            )
        );
        assert!(decode_frame(Phase::Hello, &framed(Op::StatFs, b"")).is_err());
        // No data before the handshake: the header is refused before the body is read.
        assert!(matches!(
            decode_frame(Phase::Hello, &framed(hello(), b"x")),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn an_old_clients_hello_is_read_so_that_it_can_be_told_the_versions() {
        #[derive(serde::Serialize)]
        struct Old {
            id: u64,
            op: Op,
        }
        let mut f = Vec::new();
        let body = frame::encode_body(&Old { id: 3, op: hello() });
        frame::write_frame(&mut f, &body, b"").unwrap();
        match decode_frame(Phase::Hello, &f).unwrap().0 {
            Decoded::Run(Request {
                id: 3,
                op: Op::Hello { version: 2, .. },
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
        // After the handshake, a request must say who it is for.
        assert!(decode_frame(Phase::Requests, &f).is_err());
    }

    #[test]
    fn requests_that_cannot_run_are_refused() {
        let r = Phase::Requests;
        assert_eq!(refused(r, Op::StatFs, b""), None);
        assert_eq!(refused(r, hello(), b""), Some(WireError::Protocol));
        assert_eq!(refused(r, Op::StatFs, b"x"), Some(WireError::Invalid));
        let write = Op::Write {
            handle: H,
            offset: 0,
            append: false,
        };
        assert_eq!(refused(r, write.clone(), b"data"), None);
        let big = vec![0; MAX_WRITE_LEN as usize + 1];
        assert_eq!(refused(r, write, &big), Some(WireError::TooBig));
    }

    #[test]
    fn names_are_checked_before_running() {
        let r = Phase::Requests;
        assert_eq!(refused(r, lookup(b"a"), b""), None);
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0"] {
            assert_eq!(refused(r, lookup(bad), b""), Some(WireError::Invalid));
        }
        assert_eq!(
            refused(r, lookup(&[b'a'; 256]), b""),
            Some(WireError::NameTooLong)
        );
        let rename = Op::Rename {
            parent: H,
            name: b"a".to_vec(),
            new_parent: H,
            new_name: b"..".to_vec(),
            flags: 0,
        };
        assert_eq!(refused(r, rename, b""), Some(WireError::Invalid));
        let symlink = |target: &[u8]| Op::Symlink {
            parent: H,
            name: b"l".to_vec(),
            target: target.to_vec(),
            owner: Default::default(),
        };
        assert_eq!(refused(r, symlink(b"../x"), b""), None);
        assert_eq!(
            refused(r, symlink(&[b'x'; 4096]), b""),
            Some(WireError::NameTooLong)
        );
        let getx = |n: usize| Op::GetXattr {
            handle: H,
            name: vec![b'u'; n],
        };
        assert_eq!(refused(r, getx(255), b""), None);
        assert_eq!(refused(r, getx(256), b""), Some(WireError::Range));
    }

    #[test]
    fn frames_cut_short_or_too_large_end_the_connection() {
        let f = framed(lookup(b"a"), b"");
        for cut in 0..f.len() {
            assert!(matches!(
                decode_frame(Phase::Requests, &f[..cut]),
                Err(FrameError::Io(_))
            ));
        }
        let mut huge = f.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode_frame(Phase::Requests, &huge),
            Err(FrameError::TooLarge { .. })
        ));
        let mut trailing = f;
        trailing[4] += 1;
        trailing.push(0);
        assert!(matches!(
            decode_frame(Phase::Requests, &trailing),
            Err(FrameError::Malformed(_))
        ));
    }
}
