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
