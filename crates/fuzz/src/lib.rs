//! A stable-Rust fuzz harness for what each end of a hoardfs connection does with bytes
//! from the other:
//!
//! - `server-request`: a request frame as the server reads it (header against the
//!   server's limits, body decoded into a `Request`, the checks before a request runs),
//!   in both connection phases ([`hoardfs_server::decode_frame`]);
//! - `client-reply`: a frame as the client's reader takes it (header against the client's
//!   limits, body decoded into a `ServerMessage`) and the client's checks of every reply
//!   kind and of callback breaks ([`hoardfs_origin::remote::validate`]).
//!
//! Inputs are messages generated with `arbitrary` (half of them "tamed" so that they pass
//! the checks and reach what comes after), framed and then mutated byte-wise, seed-corpus
//! entries mutated the same way, and pure noise. Each input runs under `catch_unwind`; with
//! the [`alloc::Counting`] allocator installed (the `fuzz` binary does), the largest single
//! allocation of each input is held against a bound: the frame limits while a frame is
//! read, a small multiple of the frame's actual size while it is decoded and checked. Run:
//! `cargo run --release -p hoardfs-fuzz --bin fuzz -- <target> --iterations N [--seed S]`.

pub mod alloc;
pub mod input;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hoardfs_origin::remote::validate::{self, Expect};
use hoardfs_proto::frame::{self, Limits};
use hoardfs_proto::{DirEntry, FileKind, Reply, Request, Response, ServerMessage};
use hoardfs_server::{Decoded, Phase};

use input::Rng;

/// Allocation allowed on top of what an input's size explains (error messages and such).
pub const SLACK: usize = 4096;

/// What is fuzzed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The server's request decoding and checks.
    ServerRequest,
    /// The client's reply decoding and checks.
    ClientReply,
}

/// Every target.
pub const TARGETS: [Target; 2] = [Target::ServerRequest, Target::ClientReply];

/// What one input did (beyond not panicking).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The frame decoded into a message.
    pub decoded: bool,
    /// The message passed the checks (a request to run, a reply accepted for at least one
    /// request it could answer).
    pub accepted: bool,
    /// Largest single allocation.
    pub max_alloc: usize,
    /// The allocation exceeded its bound.
    pub over_bound: bool,
}

impl Target {
    /// The target's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Target::ServerRequest => "server-request",
            Target::ClientReply => "client-reply",
        }
    }

    /// The target named `name`.
    pub fn from_name(name: &str) -> Option<Target> {
        TARGETS.into_iter().find(|t| t.name() == name)
    }

    /// The limits of the receiving side.
    pub fn limits(self) -> Limits {
        match self {
            Target::ServerRequest => Limits::REQUEST,
            Target::ClientReply => Limits::RESPONSE,
        }
    }

    /// A generated, framed message.
    pub fn generate(self, rng: &mut Rng) -> Vec<u8> {
        match self {
            Target::ServerRequest => input::request(rng),
            Target::ClientReply => input::reply(rng),
        }
    }

    /// Runs one input through the target (may panic: that is what is looked for).
    pub fn exercise(self, input: &[u8]) -> Outcome {
        match self {
            Target::ServerRequest => server_request(input),
            Target::ClientReply => client_reply(input),
        }
    }

    /// The seed corpus: one tamed (valid) message per request or reply kind, named by kind.
    pub fn seed_corpus(self) -> Vec<(String, Vec<u8>)> {
        let mut rng = Rng::new(0x5eed);
        let mut out: Vec<(String, Vec<u8>)> = Vec::new();
        let per_kind = match self {
            Target::ServerRequest => 1,
            Target::ClientReply => 2,
        };
        for _ in 0..100_000 {
            let (kind, bytes) = match self {
                Target::ServerRequest => {
                    let raw = rng.bytes(256);
                    let Ok(mut req) = <Request as arbitrary::Arbitrary>::arbitrary(
                        &mut arbitrary::Unstructured::new(&raw),
                    ) else {
                        continue;
                    };
                    input::tame_request(&mut rng, &mut req);
                    let data = match req.op {
                        hoardfs_proto::Op::Write { .. } | hoardfs_proto::Op::SetXattr { .. } => {
                            b"some data".to_vec()
                        }
                        _ => Vec::new(),
                    };
                    (
                        variant(&req.op),
                        input::framed(&frame::encode_body(&req), &data),
                    )
                }
                Target::ClientReply => {
                    let raw = rng.bytes(256);
                    let Ok(mut msg) = <ServerMessage as arbitrary::Arbitrary>::arbitrary(
                        &mut arbitrary::Unstructured::new(&raw),
                    ) else {
                        continue;
                    };
                    input::tame_reply(&mut rng, &mut msg);
                    let (kind, data) = match &msg {
                        ServerMessage::Breaks(_) => ("Breaks".to_string(), Vec::new()),
                        ServerMessage::Response(Response { result: Err(_), .. }) => {
                            ("Error".to_string(), Vec::new())
                        }
                        ServerMessage::Response(Response { result: Ok(r), .. }) => {
                            let data = match r {
                                Reply::Data { len, .. } => vec![b'x'; *len as usize],
                                Reply::Xattr { len } => {
                                    let mut l = b"user.a\0".repeat(*len as usize / 7 + 1);
                                    l.truncate(*len as usize);
                                    if let Some(last) = l.last_mut() {
                                        *last = 0;
                                    }
                                    l
                                }
                                _ => Vec::new(),
                            };
                            (variant(r), data)
                        }
                    };
                    (kind, input::framed(&frame::encode_body(&msg), &data))
                }
            };
            let have = out
                .iter()
                .filter(|(k, _)| k.starts_with(&format!("{kind}-")))
                .count();
            // Only messages the checks accept: a seed reaches as far as a message can.
            if have < per_kind && bytes.len() <= 4096 && self.exercise(&bytes).accepted {
                out.push((format!("{kind}-{have}"), bytes));
            }
        }
        out.sort();
        out
    }
}

/// The variant name of an enum value, from its `Debug` form.
fn variant(v: &impl std::fmt::Debug) -> String {
    let s = format!("{v:?}");
    s.split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or("")
        .to_string()
}

/// Measures the largest allocation of `f` against `bound`.
fn measured<T>(bound: usize, f: impl FnOnce() -> T) -> (T, usize, bool) {
    alloc::reset();
    let r = f();
    let max = alloc::max();
    (r, max, max > bound)
}

/// `server-request`: both phases of a connection.
fn server_request(input: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    // (The connection's reader allocates the body and data section the header announces
    // once `FrameHeader::parse` accepted them against the phase's limits: that check is
    // part of `decode_frame`.)
    // Decoding and checking allocate no more than the frame holds.
    for phase in [Phase::Hello, Phase::Requests] {
        let (r, max, over) = measured(input.len() + SLACK, || {
            hoardfs_server::decode_frame(phase, input)
        });
        o.max_alloc = o.max_alloc.max(max);
        o.over_bound |= over;
        if let Ok((d, _)) = r {
            o.decoded = true;
            o.accepted |= matches!(d, Decoded::Run(_));
        }
    }
    o
}

/// Requests a reply could answer, with parameters taken from the reply's id (which the
/// input controls): the matching kind with two parameter sets, and a mismatching one.
fn expects(reply: &Reply, id: u64) -> Vec<Expect> {
    let kinds = [
        FileKind::File,
        FileKind::Dir,
        FileKind::Symlink,
        FileKind::Fifo,
        FileKind::Socket,
        FileKind::CharDev,
        FileKind::BlockDev,
    ];
    let mut e = match reply {
        Reply::Hello { .. } => vec![Expect::Hello],
        Reply::Entry(_) => vec![
            Expect::Entry(None),
            Expect::Entry(Some(kinds[id as usize % 7])),
        ],
        Reply::Attr(_) => vec![Expect::Attr],
        Reply::DirPage { .. } => vec![
            Expect::DirPage {
                cookie: id,
                max_entries: (id >> 32) as u32,
            },
            Expect::DirPage {
                cookie: id.wrapping_add(1),
                max_entries: u32::MAX,
            },
        ],
        Reply::Data { .. } => vec![
            Expect::Data { asked: id as u32 },
            Expect::Data { asked: u32::MAX },
        ],
        Reply::Link(_) => vec![Expect::Link],
        Reply::StatFs(_) => vec![Expect::StatFs],
        Reply::Counters(_) => vec![Expect::Counters],
        Reply::Done => vec![Expect::Done],
        Reply::Written { offset, .. } => vec![
            Expect::Written {
                sent: id as u32,
                offset: id >> 8,
                append: id & 1 == 1,
            },
            Expect::Written {
                sent: u32::MAX,
                offset: *offset,
                append: false,
            },
        ],
        Reply::Xattr { .. } => vec![Expect::XattrValue, Expect::XattrList],
        Reply::Tree { .. } => vec![
            Expect::Tree {
                max_entries: id as u32,
            },
            Expect::Tree {
                max_entries: u32::MAX,
            },
        ],
        Reply::LockTest(_) => vec![Expect::LockTest],
    };
    e.push(if matches!(reply, Reply::Done) {
        Expect::Attr
    } else {
        Expect::Done
    });
    e
}

/// In-memory size of the densest decoded value per wire byte: a directory entry takes a
/// score of bytes on the wire and `size_of::<DirEntry>()` in memory, and a vector may
/// double once while it grows.
pub fn expansion() -> usize {
    2 * std::mem::size_of::<DirEntry>()
}

/// What the client's code after the checks relies on, asserted of every accepted reply
/// (a violation panics, and is counted like any panic): attributes convert to `SystemTime`
/// the plain way, sizes and permission bits are in range, names are path components.
fn holds(reply: &Reply) {
    let attr = |a: &hoardfs_proto::Attr| {
        for t in [a.atime, a.mtime, a.ctime] {
            assert!(t.nanos < 1_000_000_000, "{t:?}");
            let _ = if t.secs >= 0 {
                std::time::UNIX_EPOCH + Duration::new(t.secs as u64, t.nanos)
            } else {
                std::time::UNIX_EPOCH - Duration::from_secs(t.secs.unsigned_abs())
                    + Duration::from_nanos(u64::from(t.nanos))
            };
        }
        assert!(a.perm <= 0o7777, "perm {:o}", a.perm);
        assert!(a.size <= i64::MAX as u64, "size {}", a.size);
        assert!(a.blocks.checked_mul(512).is_some(), "blocks {}", a.blocks);
    };
    match reply {
        Reply::Hello { root, .. } => attr(&root.attr),
        Reply::Entry(e) => attr(&e.attr),
        Reply::Attr(a) => attr(a),
        Reply::Written {
            len,
            offset,
            attr: a,
            ..
        } => {
            attr(a);
            assert!(offset.checked_add(u64::from(*len)).is_some());
        }
        Reply::DirPage { entries, .. } => {
            for e in entries {
                attr(&e.entry.attr);
                assert_eq!(hoardfs_proto::check_name(&e.name), Ok(()));
            }
        }
        Reply::Tree { dirs } => {
            for e in dirs.iter().flat_map(|d| &d.entries) {
                attr(&e.entry.attr);
                assert_eq!(hoardfs_proto::check_name(&e.name), Ok(()));
            }
        }
        Reply::Link(t) => assert!(!t.is_empty() && !t.contains(&0)),
        _ => {}
    }
}

/// `client-reply`: the reader's frame, then every check that applies.
fn client_reply(input: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let limits = Limits::RESPONSE;
    let read_bound = limits.max_body.max(limits.max_data) as usize;
    let mut data = Vec::new();
    let (body, max, over) = measured(read_bound + SLACK, || {
        frame::read_frame(&mut &input[..], limits, &mut data)
    });
    o.max_alloc = max;
    o.over_bound |= over;
    let Ok(body) = body else {
        return o;
    };
    let bound = expansion() * body.len() + 2 * data.len() + SLACK;
    let (accepted, max, over) = measured(bound, || {
        let Ok(msg) = frame::decode_body::<ServerMessage>(&body) else {
            return None;
        };
        Some(match msg {
            ServerMessage::Breaks(b) => {
                let n = b.len();
                validate::breaks(b).len() >= n
            }
            ServerMessage::Response(Response { result: Err(_), .. }) => true,
            ServerMessage::Response(Response {
                id,
                result: Ok(reply),
            }) => {
                let mut any = false;
                for e in expects(&reply, id) {
                    if let Ok((checked, _)) = validate::answer(&e, (reply.clone(), data.clone())) {
                        holds(&checked);
                        any = true;
                    }
                }
                any
            }
        })
    });
    o.max_alloc = o.max_alloc.max(max);
    o.over_bound |= over;
    o.decoded = accepted.is_some();
    o.accepted = accepted == Some(true);
    o
}

/// How a run is done.
#[derive(Debug, Clone)]
pub struct Options {
    /// Inputs to run.
    pub iterations: u64,
    /// Seed of the input generator.
    pub seed: u64,
    /// Seed inputs (mutated, and run as they are first).
    pub corpus: Vec<Vec<u8>>,
    /// Inputs of panics (and allocation-bound violations) kept, at most.
    pub keep: usize,
}

/// What a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Inputs run.
    pub inputs: u64,
    /// Inputs that panicked.
    pub panics: u64,
    /// Inputs whose largest allocation exceeded its bound.
    pub over_bound: u64,
    /// Inputs that decoded.
    pub decoded: u64,
    /// Inputs that passed the checks.
    pub accepted: u64,
    /// Largest single allocation of any input.
    pub max_alloc: usize,
    /// Panic messages and inputs (the first few).
    pub failures: Vec<(String, Vec<u8>)>,
    /// Time taken.
    pub elapsed: Duration,
}

thread_local! {
    static LAST_PANIC: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

/// Replaces the panic hook with one that records the message quietly (the harness reports
/// panics itself).
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.location() {
            Some(l) => format!("{info} ({}:{})", l.file(), l.line()),
            None => info.to_string(),
        };
        LAST_PANIC.with(|p| *p.borrow_mut() = msg);
    }));
}

/// Runs `input` through `target`, catching a panic: `Err(message)` if it panicked.
pub fn run_one(target: Target, input: &[u8]) -> Result<Outcome, String> {
    catch_unwind(AssertUnwindSafe(|| target.exercise(input)))
        .map_err(|_| LAST_PANIC.with(|p| p.borrow().clone()))
}

/// Fuzzes `target` (call [`quiet_panics`] first to keep panics off stderr).
pub fn fuzz(target: Target, opts: &Options) -> Report {
    let mut rng = Rng::new(opts.seed ^ (target as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut report = Report::default();
    let start = Instant::now();
    let limits = target.limits();
    let mut input = Vec::new();
    for i in 0..opts.iterations {
        input.clear();
        let corpus_entry = |rng: &mut Rng| -> Vec<u8> {
            if opts.corpus.is_empty() {
                target.generate(rng)
            } else {
                opts.corpus[rng.below(opts.corpus.len())].clone()
            }
        };
        if (i as usize) < opts.corpus.len() {
            input.extend_from_slice(&opts.corpus[i as usize]);
        } else {
            match rng.below(20) {
                // Generated, as they are.
                0..=3 => input = target.generate(&mut rng),
                // Generated, mutated.
                4..=9 => {
                    input = target.generate(&mut rng);
                    let other = corpus_entry(&mut rng);
                    input::mutate(&mut rng, &mut input, &other, limits);
                }
                // Corpus entries, mutated.
                10..=16 => {
                    input = corpus_entry(&mut rng);
                    let other = target.generate(&mut rng);
                    input::mutate(&mut rng, &mut input, &other, limits);
                }
                // Noise.
                _ => input = input::noise(&mut rng),
            }
        }
        report.inputs += 1;
        match run_one(target, &input) {
            Ok(o) => {
                report.decoded += u64::from(o.decoded);
                report.accepted += u64::from(o.accepted);
                report.max_alloc = report.max_alloc.max(o.max_alloc);
                if o.over_bound {
                    report.over_bound += 1;
                    if report.failures.len() < opts.keep {
                        let why = format!("allocation of {} bytes over its bound", o.max_alloc);
                        report.failures.push((why, input.clone()));
                    }
                }
            }
            Err(msg) => {
                report.panics += 1;
                if report.failures.len() < opts.keep {
                    report.failures.push((msg, input.clone()));
                }
            }
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// Where the seed corpus of `target` lives in the source tree.
pub fn corpus_dir(target: Target) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target.name())
}

/// The files of a corpus directory (none if it does not exist).
pub fn load_corpus(dir: &Path) -> std::io::Result<Vec<Vec<u8>>> {
    let mut files: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd.filter_map(|e| e.ok().map(|e| e.path())).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    files.sort();
    files.iter().map(std::fs::read).collect()
}

/// Replaces the corpus directory's files with [`Target::seed_corpus`]; returns how many.
pub fn write_corpus(target: Target, dir: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(dir)?;
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "bin") {
            std::fs::remove_file(p)?;
        }
    }
    let corpus = target.seed_corpus();
    for (name, bytes) in &corpus {
        std::fs::write(dir.join(format!("{name}.bin")), bytes)?;
    }
    Ok(corpus.len())
}
