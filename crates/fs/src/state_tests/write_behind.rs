//! Writes queued behind the writer (`crate::write_behind`) through the file system: a
//! queued write that finds the origin unreachable goes to the offline log, and a crash
//! of the server after it acknowledged a queued write is told at the writer's close.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::offline::offline_rig_with;
use super::*;

#[test]
fn a_queued_write_that_finds_the_origin_gone_is_kept_offline_and_sent_back() {
    let base = content(3, 50_000);
    let (r, reg, f) = offline_rig_with(&base, crate::WriteBack::Close);
    let o = r.fs.open(f, WRITE, &|f| reg.register(f)).unwrap();
    // The mount does not know yet: the write is queued, and its sender finds out.
    r.origin.offline.store(true, Ordering::SeqCst);
    assert_eq!(r.fs.write(o.fh, 0, b"ours", 1).unwrap(), 4);
    r.fs.fsync(f, false).unwrap();
    assert_eq!(r.fs.pending_changes(), 1, "kept in the offline log");
    r.fs.flush(f, o.fh, 1).unwrap();
    r.fs.release(o.fh);
    r.origin.offline.store(false, Ordering::SeqCst);
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (1, 0, 0));
    let mut want = base.clone();
    want[..4].copy_from_slice(b"ours");
    assert!(std::fs::read(r.export.join("f")).unwrap() == want);
}

#[test]
fn a_crash_after_a_queued_write_was_acknowledged_is_told_at_the_writers_close() {
    let (r, reg, f) = cached_file(b"journal", false, config(Duration::ZERO));
    let (o, _) = open_read(&r, f, WRITE, &reg);
    r.fs.write(o.fh, 0, b"acknowledged", 7).unwrap();
    // A stat waits until the server acknowledged it.
    assert_eq!(r.fs.getattr(f).unwrap().attr.size, 12);
    r.origin.verifier.store(2, Ordering::SeqCst);
    assert!(matches!(
        r.fs.flush(f, o.fh, 7),
        Err(FsError::WritesLost(_))
    ));
    assert!(r.fs.flush(f, o.fh, 7).is_ok(), "told once");
    r.fs.release(o.fh);
}
