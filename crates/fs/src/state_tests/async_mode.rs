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
