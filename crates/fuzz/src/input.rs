//! Inputs: structure-aware generation of messages (`arbitrary`, then sometimes "tamed" into
//! values that pass the checks, so that the code behind them is reached too), framing, and
//! mutation of framed messages at the byte level.

use arbitrary::{Arbitrary, Unstructured};
use hoardfs_proto::frame::{self, HEADER_LEN, Limits};
use hoardfs_proto::{
    Attr, Break, DirEntry, Op, PROTOCOL_VERSION, Reply, Request, ServerMessage, Timestamp,
};

/// A small, fast, seedable generator (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// A value in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next_u64() % den < num
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// `min` to `min + spread - 1` random bytes.
    pub fn some_bytes(&mut self, min: usize, spread: usize) -> Vec<u8> {
        let n = min + self.below(spread);
        self.bytes(n)
    }
    /// A length-field value: small, near a limit, or anything.
    pub fn length(&mut self, actual: usize, limit: u32) -> u32 {
        match self.below(8) {
            0 => 0,
            1 => u32::MAX,
            2 => limit,
            3 => limit.saturating_add(1),
            4 => self.next_u64() as u32,
            5 => (actual as u32).saturating_add(1 + self.below(16) as u32),
            6 => (actual as u32).saturating_sub(1 + self.below(16) as u32),
            _ => self.below(1 << 12) as u32,
        }
    }
}

/// A frame of `body` and `data`.
pub fn framed(body: &[u8], data: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(HEADER_LEN + body.len() + data.len());
    frame::write_frame(&mut f, body, data).expect("writing to memory");
    f
}

/// A random, valid path component.
fn name(rng: &mut Rng) -> Vec<u8> {
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789._-";
    let len = match rng.below(16) {
        0 => 255,
        _ => 1 + rng.below(24),
    };
    loop {
        let n: Vec<u8> = (0..len).map(|_| CHARS[rng.below(CHARS.len())]).collect();
        if n != b"." && n != b".." {
            return n;
        }
    }
}

fn arbitrary<T: for<'a> Arbitrary<'a>>(rng: &mut Rng, max: usize) -> Option<T> {
    let raw = rng.some_bytes(8, max);
    T::arbitrary(&mut Unstructured::new(&raw)).ok()
}

/// A request as `arbitrary` makes it, tamed half the time, framed with data where it
/// takes some (and now and then where it does not).
pub fn request(rng: &mut Rng) -> Vec<u8> {
    let mut req = arbitrary::<Request>(rng, 512).unwrap_or(Request {
        id: rng.next_u64(),
        op: Op::StatFs,
        caller: hoardfs_proto::Caller::new(0, 0),
    });
    if rng.chance(1, 2) {
        tame_request(rng, &mut req);
    }
    let data = match req.op {
        Op::Write { .. } | Op::SetXattr { .. } => rng.some_bytes(0, 64),
        _ if rng.chance(1, 16) => rng.some_bytes(1, 16),
        _ => Vec::new(),
    };
    framed(&frame::encode_body(&req), &data)
}

/// Makes the names of a request valid.
pub fn tame_request(rng: &mut Rng, req: &mut Request) {
    match &mut req.op {
        Op::Hello { version, token } => {
            *version = PROTOCOL_VERSION;
            token.truncate(64);
        }
        Op::Lookup { name, .. }
        | Op::Create { name, .. }
        | Op::MkNod { name, .. }
        | Op::MkDir { name, .. }
        | Op::Link { name, .. }
        | Op::Unlink { name, .. }
        | Op::RmDir { name, .. } => *name = self::name(rng),
        Op::Symlink { name, target, .. } => {
            *name = self::name(rng);
            *target = self::name(rng);
        }
        Op::Rename { name, new_name, .. } => {
            *name = self::name(rng);
            *new_name = self::name(rng);
        }
        Op::GetXattr { name, .. } | Op::SetXattr { name, .. } | Op::RemoveXattr { name, .. } => {
            *name = [b"user.".as_slice(), &self::name(rng)].concat();
            name.truncate(255);
        }
        _ => {}
    }
}

/// A server message as `arbitrary` makes it, tamed half the time, framed with the data
/// section its reply announces.
pub fn reply(rng: &mut Rng) -> Vec<u8> {
    let mut msg = arbitrary::<ServerMessage>(rng, 1024).unwrap_or(ServerMessage::Breaks(vec![]));
    let tame = rng.chance(1, 2);
    if tame {
        tame_reply(rng, &mut msg);
    }
    let data = match &msg {
        ServerMessage::Response(r) => match &r.result {
            Ok(Reply::Data { len, .. }) | Ok(Reply::Xattr { len }) if tame => {
                data_for(rng, &r.result, *len as usize)
            }
            _ if rng.chance(1, 16) => rng.some_bytes(1, 16),
            _ => Vec::new(),
        },
        ServerMessage::Breaks(_) => Vec::new(),
    };
    framed(&frame::encode_body(&msg), &data)
}

fn data_for(
    rng: &mut Rng,
    result: &Result<Reply, hoardfs_proto::WireError>,
    len: usize,
) -> Vec<u8> {
    if matches!(result, Ok(Reply::Xattr { .. })) && rng.chance(1, 2) {
        // An xattr name list of `len` bytes would be: names, each NUL-terminated.
        let mut l = Vec::new();
        while l.len() < len {
            l.extend_from_slice(&name(rng));
            l.push(0);
        }
        l.truncate(len);
        if let Some(last) = l.last_mut() {
            *last = 0;
        }
        return l;
    }
    rng.bytes(len)
}

fn tame_time(t: &mut Timestamp) {
    t.nanos %= 1_000_000_000;
}

/// One of the values at the edges of what a field can hold.
fn edge(rng: &mut Rng, values: &[u64]) -> u64 {
    values[rng.below(values.len())]
}

/// Makes attributes valid, or (a quarter of the time) puts their fields at the edges of
/// what the checks accept or sanitise.
fn tame_attr(rng: &mut Rng, a: &mut Attr) {
    if rng.chance(1, 4) {
        const SECS: [u64; 6] = [
            i64::MAX as u64,
            i64::MIN as u64,
            (i64::MAX - 1) as u64,
            (i64::MIN + 1) as u64,
            u64::MAX,
            0,
        ];
        const NANOS: [u64; 5] = [0, 999_999_999, 1_000_000_000, u32::MAX as u64, 1];
        for t in [&mut a.atime, &mut a.mtime, &mut a.ctime] {
            t.secs = edge(rng, &SECS) as i64;
            t.nanos = edge(rng, &NANOS) as u32;
        }
        const SIZES: [u64; 5] = [i64::MAX as u64, i64::MAX as u64 + 1, u64::MAX, 0, 1 << 43];
        a.size = edge(rng, &SIZES);
        const BLOCKS: [u64; 4] = [
            i64::MAX as u64 / 512,
            i64::MAX as u64 / 512 + 1,
            u64::MAX,
            0,
        ];
        a.blocks = edge(rng, &BLOCKS);
        a.perm = edge(rng, &[0o7777, 0o10_000, 0xffff, 0o170_644]) as u16;
        return;
    }
    a.size &= i64::MAX as u64;
    a.blocks %= 1 << 40;
    a.perm &= 0o7777;
    tame_time(&mut a.atime);
    tame_time(&mut a.mtime);
    tame_time(&mut a.ctime);
}

/// Makes a server message pass the client's checks (mostly: which request it answers is
/// the harness's guess).
pub fn tame_reply(rng: &mut Rng, msg: &mut ServerMessage) {
    let reply = match msg {
        ServerMessage::Breaks(b) => {
            for x in b {
                if let Break::Entry { name, .. } = x {
                    *name = self::name(rng);
                }
            }
            return;
        }
        ServerMessage::Response(r) => match &mut r.result {
            Ok(reply) => reply,
            Err(_) => return,
        },
    };
    match reply {
        Reply::Hello { version, root, .. } => {
            *version = PROTOCOL_VERSION;
            root.attr.kind = hoardfs_proto::FileKind::Dir;
            tame_attr(rng, &mut root.attr);
        }
        Reply::Entry(e) => tame_attr(rng, &mut e.attr),
        Reply::Attr(a) => tame_attr(rng, a),
        Reply::DirPage { entries, .. } => {
            entries.truncate(1 + rng.below(8));
            for DirEntry { name, entry } in entries {
                *name = self::name(rng);
                tame_attr(rng, &mut entry.attr);
            }
        }
        Reply::Tree { dirs } => {
            dirs.truncate(1 + rng.below(4));
            for d in dirs {
                d.entries.truncate(rng.below(8));
                for DirEntry { name, entry } in &mut d.entries {
                    *name = self::name(rng);
                    tame_attr(rng, &mut entry.attr);
                }
            }
        }
        Reply::Data { len, .. } => *len %= 512,
        Reply::Xattr { len } => *len %= 512,
        Reply::Link(t) => *t = name(rng),
        Reply::Written {
            len, offset, attr, ..
        } => {
            *len %= 1 << 20;
            *offset %= 1 << 40;
            attr.kind = hoardfs_proto::FileKind::File;
            tame_attr(rng, attr);
        }
        Reply::StatFs(_) | Reply::Counters(_) | Reply::Done => {}
        Reply::LockTest(holder) => {
            if let Some(h) = holder
                && h.range.start > h.range.end
            {
                std::mem::swap(&mut h.range.start, &mut h.range.end);
            }
        }
    }
}

/// Pure noise, half the time behind a valid magic (so the header's lengths are read).
pub fn noise(rng: &mut Rng) -> Vec<u8> {
    let mut b = rng.some_bytes(0, 256);
    if rng.chance(1, 2) {
        let mut f = frame::MAGIC.to_vec();
        let body = rng.below(b.len() + 1);
        f.extend_from_slice(&(body as u32).to_le_bytes());
        f.extend_from_slice(&((b.len() - body) as u32).to_le_bytes());
        f.append(&mut b);
        b = f;
    }
    b
}

/// Mutates a framed message in place, one to four times over: bit flips, interesting bytes,
/// truncation, extension, insertion, deletion, splices with `other`, and edits of the
/// header's length fields (or their repair after the body changed, so that the mutated
/// body is what gets decoded).
pub fn mutate(rng: &mut Rng, input: &mut Vec<u8>, other: &[u8], limits: Limits) {
    let data_len = input.get(8..HEADER_LEN).map_or(0, |d| {
        u32::from_le_bytes(d.try_into().expect("4 bytes")) as usize
    });
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(11) {
            0 if len > 0 => {
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(len);
                    input[i] ^= 1 << rng.below(8);
                }
            }
            1 if len > 0 => {
                const INTERESTING: [u8; 8] = [0, 1, 0x7f, 0x80, 0xff, 0xfe, 0x40, b'/'];
                let i = rng.below(len);
                input[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => input.truncate(rng.below(len + 1)),
            3 => input.extend(rng.some_bytes(1, 32)),
            4 => {
                let at = rng.below(len + 1);
                let ins = rng.some_bytes(1, 16);
                input.splice(at..at, ins);
            }
            5 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(16));
                input.drain(at..at + n);
            }
            6 => {
                let at = rng.below(len + 1);
                let from = rng.below(other.len() + 1);
                input.truncate(at);
                input.extend_from_slice(&other[from..]);
            }
            7 if len >= HEADER_LEN => {
                let v = rng.length(len - HEADER_LEN, limits.max_body);
                input[4..8].copy_from_slice(&v.to_le_bytes());
            }
            8 if len >= HEADER_LEN => {
                let v = rng.length(data_len, limits.max_data);
                input[8..12].copy_from_slice(&v.to_le_bytes());
            }
            9 if len > HEADER_LEN => {
                // Varint fields: make one byte continue (or stop) a varint.
                let i = HEADER_LEN + rng.below(len - HEADER_LEN);
                input[i] ^= 0x80;
            }
            _ => {}
        }
    }
    if rng.chance(1, 2) && input.len() >= HEADER_LEN + data_len {
        // Repair the lengths around the mutated body.
        let body = (input.len() - HEADER_LEN - data_len) as u32;
        input[0..4].copy_from_slice(&frame::MAGIC);
        input[4..8].copy_from_slice(&body.to_le_bytes());
        input[8..12].copy_from_slice(&(data_len as u32).to_le_bytes());
    }
}
