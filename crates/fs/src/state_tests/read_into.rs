//! Reads answered into a destination (`HoardFs::read_into`, the FUSE io_uring entry's
//! payload in the product): from the origin for a read without a cache, copied in from
//! the cache otherwise, and left unanswered in its slot on failure.

use std::time::Duration;

use super::*;

/// What a reader was answered with: bytes, or an error number.
type Answer = Option<std::result::Result<Vec<u8>, i32>>;

/// A reader's destination that keeps what it was answered with.
struct Answered(Arc<Mutex<Answer>>);

impl hoardfs_origin::ReadDst for Answered {
    fn capacity(&self) -> usize {
        MIB
    }
    fn fill(
        self: Box<Self>,
        len: usize,
        fill: &mut dyn FnMut(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut buf = vec![0u8; len];
        fill(&mut buf)?;
        *self.0.lock() = Some(Ok(buf));
        Ok(())
    }
    fn fail(self: Box<Self>, errno: i32) {
        *self.0.lock() = Some(Err(errno));
    }
}

#[test]
fn reads_into_a_destination_answer_it_from_the_origin_and_from_the_cache() {
    let got = Arc::new(Mutex::new(None));
    let dst = || hoardfs_origin::ReadSlot::new(Box::new(Answered(got.clone())));
    // Without a cache: fetched for the read alone, through `hoardfs_origin::read_into`.
    let (r, f, _) = one_file(false, config(Duration::ZERO));
    let reg = Registrar(AtomicUsize::new(0));
    let o = r.fs.open(f, READ, &|file| reg.register(file)).unwrap();
    assert!(r.fs.read_into(o.fh, 0, 100, &mut dst()).is_ok());
    assert_eq!(got.lock().take(), Some(Ok(b"x".to_vec())));
    r.fs.release(o.fh);
    // A handle that is not open: the destination stays in its slot, unanswered.
    let mut slot = dst();
    let Err(e) = r.fs.read_into(o.fh, 0, 100, &mut slot) else {
        panic!("read through a released handle");
    };
    assert!(matches!(e, FsError::BadHandle), "{e:?}");
    assert!(!slot.answered() && got.lock().is_none());
    // Through the cache: copied in.
    let data = content(6, MIB + 10);
    let (r, reg, f) = cached_file(&data, false, config(Duration::ZERO));
    let o = r.fs.open(f, READ, &|file| reg.register(file)).unwrap();
    assert!(r.fs.read_into(o.fh, 5, 1000, &mut dst()).is_ok());
    assert_eq!(got.lock().take(), Some(Ok(data[5..1005].to_vec())));
    r.fs.release(o.fh);
}
