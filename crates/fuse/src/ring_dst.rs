//! [`RingDst`]: a READ's io_uring entry as the destination the file-system layer writes
//! the read's bytes into (`hoardfs_origin::ReadDst`), straight from the network when they
//! are fetched for that read alone. Dropped unanswered, it answers `EIO` (fuser's
//! `ReplyDirect`), so a reader is never left waiting whatever path a read takes.

/// A READ's io_uring entry, as the destination `hoardfs_fs` writes a read's bytes into.
pub(crate) struct RingDst(pub(crate) fuser::ReplyDirect);

impl hoardfs_origin::ReadDst for RingDst {
    fn capacity(&self) -> usize {
        self.0.capacity()
    }

    fn fill(
        self: Box<Self>,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        self.0.fill(len, fill)
    }

    fn fail(self: Box<Self>, errno: i32) {
        self.0.error(fuser::Errno::from_i32(errno));
    }
}
