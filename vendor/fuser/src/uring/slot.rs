//! One ring entry's buffers, as the kernel lays them out (`fuse_uring_req_header` and the
//! payload), and the reply slot through which whatever thread answers a request writes
//! its reply into them ([`RingReply`]).

use parking_lot::Condvar;
use parking_lot::Mutex;
use parking_lot::MutexGuard;
use std::io;
use std::io::IoSlice;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use log::error;

use super::IN_OUT_HEADER_SZ;
use super::OP_IN_OUT_SZ;
use super::OUT_HEADER_SZ;
use crate::channel::ChannelSender;
use crate::passthrough::BackingId;

/// `struct fuse_uring_ent_in_out`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct EntInOut {
    pub(super) flags: u64,
    pub(super) commit_id: u64,
    pub(super) payload_sz: u32,
    pub(super) padding: u32,
    pub(super) reserved: u64,
}

/// `struct fuse_uring_req_header`: the entry's first buffer.
#[repr(C)]
#[derive(Debug)]
pub(super) struct ReqHeader {
    pub(super) in_out: [u8; IN_OUT_HEADER_SZ],
    pub(super) op_in: [u8; OP_IN_OUT_SZ],
    pub(super) ent: EntInOut,
}

/// One ring entry's buffers. The kernel writes a request into them (through the addresses
/// registered with `CMD_REGISTER`, which never move: both are boxed) while the entry is
/// with it, that is from a commit until the next completion; the daemon reads the request
/// and writes the reply between a completion and the next commit.
#[derive(Debug)]
pub(super) struct EntryBufs {
    pub(super) header: Box<ReqHeader>,
    pub(super) payload: Box<[u8]>,
    /// Set once the reply for the request now in the buffers is written.
    pub(super) replied: bool,
    /// Counts the requests the entry received, so that a reply is taken only for the
    /// request it was made for (a late reply to an earlier one is refused).
    pub(super) seq: u64,
}

/// The reply slot of one ring entry, shared between its ring thread and whatever thread
/// sends the reply.
#[derive(Debug)]
pub(crate) struct RingSlot {
    pub(super) bufs: Mutex<EntryBufs>,
    pub(super) replied: Condvar,
}

impl RingSlot {
    pub(super) fn wait_for_reply(&self) {
        let mut bufs = self.bufs.lock();
        while !bufs.replied {
            self.replied.wait(&mut bufs);
        }
    }
}

/// Sends one request's reply into its ring entry (a [`ReplySender`] variant). Passthrough
/// backing files are opened on `/dev/fuse`, as those ioctls do not go through the ring.
#[derive(Debug, Clone)]
pub(crate) struct RingReply {
    pub(super) slot: Arc<RingSlot>,
    /// The entry's request this reply answers (`EntryBufs::seq`).
    pub(super) seq: u64,
    pub(super) ch: ChannelSender,
}

impl RingReply {
    pub(crate) fn send(&self, data: &[IoSlice<'_>]) -> io::Result<()> {
        let mut guard = self.slot.bufs.lock();
        self.unanswered(&guard)?;
        let bufs = &mut *guard;
        // The reply is a `fuse_out_header` followed by its arguments; the header goes to the
        // entry's header area, the arguments to its payload.
        let mut header = [0u8; OUT_HEADER_SZ];
        let mut at = 0usize;
        let mut payload_sz = 0usize;
        let mut too_long = false;
        for slice in data {
            let mut s: &[u8] = slice;
            if at < OUT_HEADER_SZ {
                let n = s.len().min(OUT_HEADER_SZ - at);
                header[at..at + n].copy_from_slice(&s[..n]);
                at += n;
                s = &s[n..];
            }
            if s.is_empty() {
                continue;
            }
            match bufs.payload.get_mut(payload_sz..payload_sz + s.len()) {
                Some(dst) => dst.copy_from_slice(s),
                None => too_long = true,
            }
            payload_sz += s.len();
        }
        let short = at < OUT_HEADER_SZ;
        if short {
            // Not a reply: the request (whose header is still in the entry) is answered
            // EIO all the same, as its entry waits for an answer to be committed.
            error!("ring reply of {at} bytes is shorter than its header");
            header = [0u8; OUT_HEADER_SZ];
            header[8..16].copy_from_slice(&bufs.header.in_out[8..16]);
        }
        if short || too_long {
            // Too long cannot happen for replies the kernel sized (a READ's reply is at most
            // its size, which is at most max_pages); answer EIO rather than truncate.
            if too_long {
                error!("ring reply of {payload_sz} bytes exceeds the entry's payload buffer");
            }
            header[4..8].copy_from_slice(&(-libc::EIO).to_ne_bytes());
            payload_sz = 0;
        }
        self.commit(guard, header, payload_sz);
        if short {
            return Err(io::Error::other("reply shorter than its header"));
        }
        Ok(())
    }

    /// The size of the entry's payload buffer: the most data a reply can carry.
    pub(crate) fn capacity(&self) -> usize {
        self.slot.bufs.lock().payload.len()
    }

    /// Answers request `unique` with `len` bytes of data that `fill` writes straight into
    /// the entry's payload buffer (with the entry locked: its ring thread only waits for
    /// the reply meanwhile), saving the copy [`RingReply::send`] makes. If `fill` fails,
    /// or `len` exceeds the buffer, the request is answered `EIO`; `fill` is not called
    /// when the request was answered already or `len` does not fit.
    pub(crate) fn fill(
        &self,
        unique: u64,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut guard = self.slot.bufs.lock();
        self.unanswered(&guard)?;
        let filled = match guard.payload.get_mut(..len) {
            Some(dst) => fill(dst),
            None => Err(io::Error::other(format!(
                "ring reply of {len} bytes exceeds the entry's payload buffer"
            ))),
        };
        let (error, payload_sz) = match &filled {
            Ok(()) => (0i32, len),
            Err(e) => {
                error!("direct ring reply failed: {e}");
                (-libc::EIO, 0)
            }
        };
        let mut header = [0u8; OUT_HEADER_SZ];
        header[4..8].copy_from_slice(&error.to_ne_bytes());
        header[8..16].copy_from_slice(&unique.to_ne_bytes());
        self.commit(guard, header, payload_sz);
        filled
    }

    /// Fails unless the entry holds this reply's request, still unanswered.
    fn unanswered(&self, bufs: &EntryBufs) -> io::Result<()> {
        if bufs.seq != self.seq {
            return Err(io::Error::other(
                "reply to a ring request already answered (EIO after a panic)",
            ));
        }
        if bufs.replied {
            return Err(io::Error::other("second reply to one ring request"));
        }
        Ok(())
    }

    /// Writes `header` (its length filled in from `payload_sz`, the bytes already in the
    /// payload buffer) into the entry, marks it answered and wakes its ring thread.
    fn commit(
        &self,
        mut bufs: MutexGuard<'_, EntryBufs>,
        mut header: [u8; OUT_HEADER_SZ],
        payload_sz: usize,
    ) {
        header[0..4].copy_from_slice(&((OUT_HEADER_SZ + payload_sz) as u32).to_ne_bytes());
        bufs.header.in_out = [0; IN_OUT_HEADER_SZ];
        bufs.header.in_out[..OUT_HEADER_SZ].copy_from_slice(&header);
        bufs.header.ent.payload_sz = payload_sz as u32;
        bufs.replied = true;
        drop(bufs);
        // (Only the entry's ring thread waits. parking_lot's condvar makes no system call
        // when nobody waits, std's always wakes the futex: one call per request.)
        self.slot.replied.notify_one();
    }

    pub(crate) fn open_backing(&self, fd: BorrowedFd<'_>) -> io::Result<BackingId> {
        self.ch.open_backing(fd)
    }

    pub(crate) unsafe fn wrap_backing(&self, id: u32) -> BackingId {
        unsafe { self.ch.wrap_backing(id) }
    }
}
