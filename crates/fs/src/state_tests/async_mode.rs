//! State tests of `--write-back=async` (Coda's weakly connected mode): changes to names
//! and new files go to the change log with the origin reachable, reach it when the log
//! is sent back, and what was made here keeps working across that.

use hoardfs_origin::Owner;

use super::offline::{create, offline_rig_with, read_all};
use super::*;

const ME: Owner = Owner { uid: 0, gid: 0 };

fn async_rig() -> (Rig, Registrar, Ino) {
    offline_rig_with(b"f", crate::WriteBack::Async)
}

#[test]
fn names_and_new_files_wait_in_the_log_until_it_is_sent() {
    let (r, reg, _) = async_rig();
    let d = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    let f = create(&r, &reg, d, "new", b"made here");
    // Here at once, on the origin not yet.
    assert!(!r.export.join("d").exists());
    assert_eq!(r.fs.pending_changes(), 2);
    let (o, _) = open_read(&r, f, READ, &reg);
    assert_eq!(read_all(&r, o.fh), b"made here");
    r.fs.release(o.fh);
    let sent = r.fs.reintegrate();
    assert_eq!(sent.left, 0);
    assert_eq!(std::fs::read(r.export.join("d/new")).unwrap(), b"made here");
}

#[test]
fn a_directory_sent_back_is_used_at_the_origin_afterwards() {
    let (r, reg, _) = async_rig();
    let d = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    assert_eq!(r.fs.reintegrate().left, 0);
    assert!(r.export.join("d").is_dir());
    // No change waits: lookups, listings and new names in it reach the origin's directory.
    assert!(matches!(
        r.fs.lookup(d, b"absent"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotFound))
    ));
    r.fs.listing(d).unwrap();
    create(&r, &reg, d, "later", b"after");
    assert_eq!(r.fs.reintegrate().left, 0);
    assert_eq!(std::fs::read(r.export.join("d/later")).unwrap(), b"after");
}

#[test]
fn a_listing_served_while_names_wait_names_what_was_sent_back_by_its_origin_id() {
    let (r, reg, _) = async_rig();
    r.fs.listing(ROOT_INO).unwrap();
    let d = r.fs.mkdir(ROOT_INO, b"d", 0o755, ME).unwrap().ino;
    assert_eq!(r.fs.reintegrate().left, 0);
    // Names wait again: the root's listing is this client's (the kept one).
    create(&r, &reg, ROOT_INO, "x", b"x");
    let listing = r.fs.listing(ROOT_INO).unwrap();
    let e = listing.entries.iter().find(|e| e.name == b"d").unwrap();
    // A readdirplus hands the entry to the kernel: the directory made here, at the origin.
    assert_eq!(r.fs.remember_entry(ROOT_INO, &listing, e).ino, d);
    assert!(matches!(
        r.fs.lookup(d, b"absent"),
        Err(FsError::Origin(hoardfs_origin::WireError::NotFound))
    ));
    assert_eq!(r.fs.reintegrate().left, 0);
}

#[test]
fn a_file_being_written_is_sent_after_its_close_and_a_barrier_sends_it_open() {
    let (r, reg, _) = async_rig();
    r.fs.listing(ROOT_INO).unwrap();
    let (e, o) =
        r.fs.create(ROOT_INO, b"log", 0o640, true, false, WRITE, ME, &|f| {
            reg.register(f)
        })
        .unwrap();
    r.fs.write(o.fh, 0, b"first ", 1).unwrap();
    // The keeper's pass leaves it to its writer...
    r.fs.trickle();
    assert_eq!(r.fs.pending_changes(), 1);
    assert!(!r.export.join("log").exists());
    r.fs.write(o.fh, 6, b"second", 1).unwrap();
    r.fs.flush(e.ino, o.fh, 1).unwrap();
    r.fs.release(o.fh);
    // ... and sends it once closed, whole.
    assert_eq!(r.fs.trickle().left, 0);
    assert_eq!(
        std::fs::read(r.export.join("log")).unwrap(),
        b"first second"
    );
    // A barrier (`hoardfs sync`) sends a file still open.
    let (e, o) =
        r.fs.create(ROOT_INO, b"open", 0o640, true, false, WRITE, ME, &|f| {
            reg.register(f)
        })
        .unwrap();
    r.fs.write(o.fh, 0, b"open", 1).unwrap();
    assert_eq!(r.fs.reintegrate().left, 0);
    assert_eq!(std::fs::read(r.export.join("open")).unwrap(), b"open");
    r.fs.flush(e.ino, o.fh, 1).unwrap();
    r.fs.release(o.fh);
}

#[test]
fn a_file_made_and_removed_between_two_passes_never_reaches_the_origin() {
    let (r, reg, _) = async_rig();
    r.fs.listing(ROOT_INO).unwrap();
    create(&r, &reg, ROOT_INO, "tmp_pack", b"temporary");
    r.fs.unlink(ROOT_INO, b"tmp_pack").unwrap();
    assert_eq!(r.fs.pending_changes(), 0);
    assert_eq!(r.fs.trickle().sent, 0);
    assert!(!r.export.join("tmp_pack").exists());
}

#[test]
fn a_file_renamed_written_and_replaced_is_removed_without_a_conflict() {
    let (r, reg, f) = async_rig();
    std::fs::write(r.export.join("other"), b"other").unwrap();
    r.fs.listing(ROOT_INO).unwrap();
    r.fs.lookup(ROOT_INO, b"other").unwrap();
    // Renamed in the log; the write goes to the server's file (a pending rename does not
    // hold back writes)...
    r.fs.rename(ROOT_INO, b"f", ROOT_INO, b"r", 0).unwrap();
    let o = r.fs.open(f, WRITE, &|file| reg.register(file)).unwrap();
    r.fs.write(o.fh, 0, b"written", 1).unwrap();
    r.fs.flush(f, o.fh, 1).unwrap();
    r.fs.release(o.fh);
    // ... then replaced: its removal is of the version this client wrote, not a conflict.
    r.fs.rename(ROOT_INO, b"other", ROOT_INO, b"r", 0).unwrap();
    assert_eq!(r.fs.reintegrate().left, 0);
    assert!(r.fs.conflicts().is_empty(), "{:?}", r.fs.conflicts());
    assert!(!r.export.join("f").exists());
    assert_eq!(std::fs::read(r.export.join("r")).unwrap(), b"other");
}

#[test]
fn a_change_whose_directory_moved_here_after_its_pass_was_planned_waits_for_the_move() {
    use crate::offline::reintegrate::order::ready;
    use crate::offline::reintegrate::send_back::{ChangeSender, Sending};
    let (r, reg, _) = async_rig();
    r.fs.listing(ROOT_INO).unwrap();
    let a = r.fs.mkdir(ROOT_INO, b"a", 0o755, ME).unwrap().ino;
    assert_eq!(r.fs.reintegrate().left, 0);
    create(&r, &reg, a, "f", b"made in a");
    // A pass is planned: the file in `a` waits for nothing...
    let off = r.fs.sb.offline_writes().unwrap();
    let planned = ready(&off.log.records());
    assert_eq!(planned.len(), 1);
    // ... and `a` is renamed here before a sender takes the file's change.
    r.fs.rename(ROOT_INO, b"a", ROOT_INO, b"b", 0).unwrap();
    let (p, rec) = &planned[0];
    let writing = |_| false;
    let sent = ChangeSender::new(&r.fs.sb, off, &writing)
        .send_back(p, rec, &[p.seq].into())
        .unwrap();
    // The file's path names `b`, which the origin has yet to have: planned again, not
    // taken for a directory removed on the server.
    assert!(matches!(sent, Sending::Replanned));
    assert!(r.fs.conflicts().is_empty(), "{:?}", r.fs.conflicts());
    assert!(!r.export.join("b").exists());
    let done = r.fs.reintegrate();
    assert_eq!((done.sent, done.conflicts, done.left), (2, 0, 0));
    assert_eq!(std::fs::read(r.export.join("b/f")).unwrap(), b"made in a");
    assert!(!r.export.join("a").exists());
}

#[test]
fn files_renamed_while_their_creation_is_being_sent_back_are_renamed_on_the_origin() {
    // Git's lock files: made, written, renamed over at once, while the keeper sends the
    // log every moment.
    let (r, reg, _) = async_rig();
    r.fs.listing(ROOT_INO).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                r.fs.trickle();
            }
        });
        for i in 0..200 {
            let lock = format!("ref{i}.lock");
            create(&r, &reg, ROOT_INO, &lock, format!("commit {i}").as_bytes());
            r.fs.rename(
                ROOT_INO,
                lock.as_bytes(),
                ROOT_INO,
                format!("ref{i}").as_bytes(),
                0,
            )
            .unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
    });
    assert_eq!(r.fs.reintegrate().left, 0);
    assert!(r.fs.conflicts().is_empty(), "{:?}", r.fs.conflicts());
    for i in 0..200 {
        assert_eq!(
            std::fs::read(r.export.join(format!("ref{i}"))).unwrap(),
            format!("commit {i}").as_bytes()
        );
        assert!(!r.export.join(format!("ref{i}.lock")).exists());
    }
}
