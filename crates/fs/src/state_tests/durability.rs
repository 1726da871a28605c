//! Writes a crashed server may have lost (`crate::durability`), through the file system:
//! who is told at close, who clears the report, and that a release forgets a reported
//! loss.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

#[test]
fn a_loss_is_told_to_every_close_cleared_by_the_writers_and_forgotten_at_release() {
    // (Each write on the server when it returns; the same with writes queued behind
    // the writer: `state_tests::write_behind`.)
    let through = FsConfig {
        write_back: crate::WriteBack::Through,
        ..config(Duration::ZERO)
    };
    let (r, reg, f) = cached_file(b"journal", false, through);
    let (o, _) = open_read(&r, f, WRITE, &reg);
    let (writer, child) = (7, 8);
    r.fs.write(o.fh, 0, b"acknowledged", writer).unwrap();
    // A crash: the server comes back under another verifier.
    r.origin.verifier.store(2, Ordering::SeqCst);
    let lost = |res: crate::FsResult<()>| matches!(res, Err(FsError::WritesLost(_)));
    assert!(lost(r.fs.flush(f, o.fh, child)), "a child's close is told");
    assert!(lost(r.fs.flush(f, o.fh, child)), "and does not clear it");
    assert!(
        lost(r.fs.flush(f, o.fh, writer)),
        "the writer's close is told"
    );
    assert!(r.fs.flush(f, o.fh, writer).is_ok(), "once");
    r.fs.release(o.fh);

    // Written, closed by another thread (told), released: the next writer starts afresh.
    let (o, _) = open_read(&r, f, WRITE, &reg);
    r.fs.write(o.fh, 0, b"again", writer).unwrap();
    r.origin.verifier.store(3, Ordering::SeqCst);
    assert!(lost(r.fs.flush(f, o.fh, child)));
    r.fs.release(o.fh);
    let (o, _) = open_read(&r, f, WRITE, &reg);
    r.fs.write(o.fh, 0, b"new", writer).unwrap();
    assert!(
        r.fs.flush(f, o.fh, writer).is_ok(),
        "blamed for an old loss"
    );
    // A read-write open that wrote nothing is not told of others' losses.
    let (idle, _) = open_read(&r, f, WRITE, &reg);
    r.origin.verifier.store(4, Ordering::SeqCst);
    assert!(r.fs.flush(f, idle.fh, child).is_ok());
    assert!(lost(r.fs.flush(f, o.fh, writer)));
    r.fs.release(idle.fh);
    r.fs.release(o.fh);
}
