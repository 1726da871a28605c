//! Files deleted while open, through a read-write mount against a real `hoardfs serve`:
//! removed (or replaced by a rename) through this client, they live under a hidden name
//! until closed and keep working through their descriptors; removed by another client,
//! they keep what this client had; both across server restarts, and hidden names a
//! crashed client left go at its next mount.

mod common;

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};

use common::rig::*;
use common::*;
/// A file whose last name is removed while it is open here keeps working through its
/// descriptor (fstat, read, write), as on a local file system; it lives under a hidden name
/// until the last descriptor is closed, and then nothing is left.
#[test]
fn an_unlinked_open_file_keeps_working_until_closed() {
    let r = rig_with(
        |exp| std::fs::write(exp.join("tmpfile"), b"scratch").unwrap(),
        &[],
        &[],
    );
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.m.p("tmpfile"))
        .unwrap();
    std::fs::remove_file(r.m.p("tmpfile")).unwrap();
    assert_gone(&r.m.p("tmpfile"));
    assert_gone(&r.srv("tmpfile"));
    assert_eq!(f.metadata().unwrap().len(), 7);
    // As on a local file system (pjdfstest unlink/14): no name left, so no link; the
    // hidden name below is the client's own business.
    assert_eq!(f.metadata().unwrap().nlink(), 0, "fstat after the unlink");
    let mut buf = [0u8; 7];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"scratch");
    f.write_all_at(b" pad", 7).unwrap();
    assert_eq!(f.metadata().unwrap().len(), 11);
    let mut buf = [0u8; 11];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"scratch pad");
    // Meanwhile the server holds it under one hidden name.
    let hidden = list(&r.exp).unwrap();
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    assert!(hidden[0].starts_with(b".hoardfs-unlinked-"), "{hidden:?}");
    drop(f);
    assert_soon("the hidden name goes at close", || match list(&r.exp) {
        Ok(l) if l.is_empty() => Ok(()),
        other => Err(format!("{other:?}")),
    });
    assert_eq!(list(&r.m.path).unwrap(), Vec::<Vec<u8>>::new());
    let journal = r.t.path().join("cache/unlinked");
    assert_eq!(
        std::fs::read(journal).unwrap(),
        b"",
        "the journal forgets removed names"
    );
}

/// A file open here that a rename through this client replaces keeps working where it is
/// open, with a link count of 0 (xfstests generic/035), as one unlinked does; the name is
/// the new file's, here and on the server.
#[test]
fn a_file_replaced_by_a_rename_keeps_working_where_it_is_open() {
    let r = rig_with(
        |exp| {
            std::fs::write(exp.join("old"), b"old content").unwrap();
            std::fs::write(exp.join("new"), b"new content").unwrap();
        },
        &[],
        &[],
    );
    let f = File::open(r.m.p("old")).unwrap();
    std::fs::rename(r.m.p("new"), r.m.p("old")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 0, "fstat after the rename");
    let mut buf = [0u8; 11];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(
        &buf, b"old content",
        "never read before: fetched after the rename"
    );
    assert_eq!(std::fs::read(r.m.p("old")).unwrap(), b"new content");
    assert_eq!(std::fs::read(r.srv("old")).unwrap(), b"new content");
    drop(f);
    assert_soon("the hidden name goes at close", || match list(&r.exp) {
        Ok(l) if l == [b"old".to_vec()] => Ok(()),
        other => Err(format!("{other:?}")),
    });
}

/// `rm` right after a writer and a reader closed: the kernel sends releases after `close`
/// returned, so the removal may arrive first; it must not hide the file as an open one
/// (a hidden name on the server, and in listings while the server is unreachable).
/// A directory replaced by a rename, or removed, while a descriptor of it is open here
/// answers `fstat` with a link count of 0, as on a local file system (xfstests
/// generic/035), not `ESTALE`.
#[test]
fn a_directory_replaced_or_removed_while_open_reports_no_links() {
    let r = rig();
    std::fs::create_dir(r.m.p("dir1")).unwrap();
    std::fs::create_dir(r.m.p("dir2")).unwrap();
    let d = File::open(r.m.p("dir2")).unwrap();
    assert_eq!(d.metadata().unwrap().nlink(), 2);
    std::fs::rename(r.m.p("dir1"), r.m.p("dir2")).unwrap();
    assert_eq!(d.metadata().unwrap().nlink(), 0, "the replaced directory");
    std::fs::remove_dir(r.m.p("dir2")).unwrap();
    std::fs::create_dir(r.m.p("dir3")).unwrap();
    let e = File::open(r.m.p("dir3")).unwrap();
    std::fs::remove_dir(r.m.p("dir3")).unwrap();
    assert_eq!(e.metadata().unwrap().nlink(), 0, "the removed directory");
    assert!(!r.srv("dir2").exists() && !r.srv("dir3").exists());
    // A new directory of either name is a directory of its own.
    std::fs::create_dir(r.m.p("dir3")).unwrap();
    assert_eq!(std::fs::metadata(r.m.p("dir3")).unwrap().nlink(), 2);
    drop((d, e));
}

#[test]
fn a_file_removed_right_after_its_close_is_not_hidden() {
    let r = rig_with(|_| {}, &[], &[]);
    for i in 0..200 {
        let name = format!("f{i}");
        std::fs::write(r.m.p(&name), b"written, closed, read, removed").unwrap();
        // (A read-only open: its close sends no FLUSH.)
        assert_eq!(
            std::fs::read(r.m.p(&name)).unwrap(),
            b"written, closed, read, removed"
        );
        std::fs::remove_file(r.m.p(&name)).unwrap();
        let left = list(&r.exp).unwrap();
        assert!(left.is_empty(), "after {} removals: {left:?}", i + 1);
    }
}

/// Client A has a file open (and has read it); client B removes its last name. The server
/// released the file, so A's descriptor shows a link count of zero, and still reads the
/// bytes A had and takes writes into A's cache. What A sees is what SEMANTICS.md describes.
#[test]
fn a_file_unlinked_by_another_client_stays_usable_where_it_is_open() {
    let r = rig_with(
        |exp| std::fs::write(exp.join("shared"), b"scratch").unwrap(),
        &[],
        &[],
    );
    let b = r.second_client(&[]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.m.p("shared"))
        .unwrap();
    let mut buf = [0u8; 7];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"scratch");
    std::fs::remove_file(b.p("shared")).unwrap();
    assert_gone(&r.srv("shared"));
    assert_soon("A sees the name go", || gone(&r.m.p("shared")));
    assert_soon("A's fstat shows no link left", || {
        let st = f.metadata().map_err(|e| e.to_string())?;
        match (st.len(), st.nlink()) {
            (7, 0) => Ok(()),
            other => Err(format!("size, nlink {other:?}")),
        }
    });
    let mut buf = [0u8; 7];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"scratch", "A reads the bytes it had");
    // Writes fail as on NFS: A cannot tell a file removed elsewhere from one renamed
    // elsewhere and then forgotten by a restarted server, and bytes accepted then would
    // be lost without a word.
    assert_errno("a write", f.write_all_at(b" pad", 7), libc::ESTALE);
    assert_eq!(f.metadata().unwrap().len(), 7);
    f.sync_all().unwrap();
    let cached = |m: &Mount| stats(m)["cache"]["bytes"].as_u64().unwrap();
    let before = cached(&r.m);
    close_checked(f).unwrap();
    assert_soon("its cached bytes go at close", || match cached(&r.m) {
        n if n < before => Ok(()),
        n => Err(format!("{n} bytes of {before}")),
    });
    assert_eq!(list(&r.exp).unwrap(), Vec::<Vec<u8>>::new());
    assert_eq!(list(&b.path).unwrap(), Vec::<Vec<u8>>::new());
    assert_eq!(list(&r.m.path).unwrap(), Vec::<Vec<u8>>::new());
}

/// Bytes A never read of a file B removed are gone with it: reading them fails with
/// `ESTALE`, while what A had read stays readable.
#[test]
fn uncached_bytes_of_a_file_unlinked_by_another_client_are_stale() {
    let big = bytes(3, 16 << 20);
    let r = rig_with(
        |exp| std::fs::write(exp.join("big"), &big).unwrap(),
        &[],
        &[],
    );
    let b = r.second_client(&[]);
    let f = File::open(r.m.p("big")).unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    std::fs::remove_file(b.p("big")).unwrap();
    assert_soon("A sees the name go", || gone(&r.m.p("big")));
    let mut tail = vec![0u8; 4096];
    assert_errno(
        "read of bytes never fetched",
        f.read_exact_at(&mut tail, (16 << 20) - 4096),
        libc::ESTALE,
    );
    f.read_exact_at(&mut head, 0).unwrap();
    assert_eq!(head, big[..4096]);
    assert_eq!(f.metadata().unwrap().nlink(), 0);
}

/// Kills the rig's server, starts a new one on the same address and directory, and waits
/// for the client to be connected to it (until then its requests fail with `EIO`).
fn restart_server(r: &mut Rig) {
    let addr = r.srv.addr.clone();
    r.srv.kill();
    assert_soon("the client notices the server is gone", || {
        let s = stats(&r.m);
        (s["connected"] == false).then_some(()).ok_or(s.to_string())
    });
    r.srv = Server::start_at(&r.exp, &addr, &[]);
    assert_soon("the client is connected again", || {
        let s = stats(&r.m);
        (s["connected"] == true).then_some(()).ok_or(s.to_string())
    });
}

/// A file this client unlinked while open lives under its hidden name, which a restarted
/// server resolves like any other: the descriptor keeps reading (bytes never fetched too),
/// writing and closing, and the hidden name goes at close.
#[test]
fn an_unlinked_open_file_survives_a_server_restart() {
    let big = bytes(4, 16 << 20);
    let mut r = rig_with(
        |exp| std::fs::write(exp.join("tmpfile"), &big).unwrap(),
        &[],
        &[],
    );
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.m.p("tmpfile"))
        .unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    std::fs::remove_file(r.m.p("tmpfile")).unwrap();
    assert_gone(&r.srv("tmpfile"));
    restart_server(&mut r);
    let mut tail = vec![0u8; 4096];
    f.read_exact_at(&mut tail, (16 << 20) - 4096).unwrap();
    assert_eq!(
        tail,
        big[(16 << 20) - 4096..],
        "bytes fetched after the restart"
    );
    f.write_all_at(b"tail", 16 << 20).unwrap();
    assert_eq!(f.metadata().unwrap().len(), (16 << 20) + 4);
    let hidden = list(&r.exp).unwrap();
    assert_eq!(hidden.len(), 1, "{hidden:?}");
    assert!(hidden[0].starts_with(b".hoardfs-unlinked-"), "{hidden:?}");
    let on_server = std::fs::read(r.exp.join(OsStr::from_bytes(&hidden[0]))).unwrap();
    assert_eq!(
        &on_server[16 << 20..],
        b"tail",
        "the write reached the hidden file"
    );
    close_checked(f).unwrap();
    assert_soon("the hidden name goes at close", || match list(&r.exp) {
        Ok(l) if l.is_empty() => Ok(()),
        other => Err(format!("{other:?}")),
    });
}

/// A file another client removed was held only by the old server process: after a server
/// restart the descriptor that has it open still works as a deleted file's (link count 0,
/// bytes read before, local writes) and the bytes never fetched are `ESTALE`.
#[test]
fn a_file_unlinked_by_another_client_across_a_server_restart() {
    let big = bytes(5, 16 << 20);
    let mut r = rig_with(
        |exp| std::fs::write(exp.join("shared"), &big).unwrap(),
        &[],
        &[],
    );
    let b = r.second_client(&[]);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.m.p("shared"))
        .unwrap();
    let mut head = vec![0u8; 4096];
    f.read_exact_at(&mut head, 0).unwrap();
    std::fs::remove_file(b.p("shared")).unwrap();
    assert_gone(&r.srv("shared"));
    restart_server(&mut r);
    let mut tail = vec![0u8; 4096];
    assert_errno(
        "read of bytes never fetched",
        f.read_exact_at(&mut tail, (16 << 20) - 4096),
        libc::ESTALE,
    );
    let st = f.metadata().unwrap();
    assert_eq!((st.len(), st.nlink()), (16 << 20, 0));
    let mut again = vec![0u8; 4096];
    f.read_exact_at(&mut again, 0).unwrap();
    assert_eq!(again, big[..4096]);
    assert_errno("a write", f.write_all_at(b"mine", 0), libc::ESTALE);
    close_checked(f).unwrap();
    assert_eq!(list(&r.exp).unwrap(), Vec::<Vec<u8>>::new());
}

/// A client killed while it holds a file unlinked while open leaves its hidden name on
/// the server; the next mount with the same cache directory removes it (and only the
/// names that client made: another client's open file keeps its hidden name).
#[test]
fn hidden_names_left_by_a_crashed_client_go_at_its_next_mount() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::write(exp.join("d/mine"), b"mine").unwrap();
    std::fs::write(exp.join("d/theirs"), b"theirs").unwrap();
    let srv = Server::start(&exp);
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let a = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    let b = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt2"),
        &t.path().join("cache2"),
        &[],
    );
    let mine = File::open(a.p("d/mine")).unwrap();
    let theirs = File::open(b.p("d/theirs")).unwrap();
    std::fs::remove_file(a.p("d/mine")).unwrap();
    std::fs::remove_file(b.p("d/theirs")).unwrap();
    let hidden = list(&exp.join("d")).unwrap();
    assert_eq!(hidden.len(), 2, "{hidden:?}");
    let id = std::fs::read_to_string(cache.join("client-id")).unwrap();
    let ours: Vec<_> = hidden
        .iter()
        .filter(|n| String::from_utf8_lossy(n).contains(id.trim()))
        .cloned()
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "one hidden name carries A's client id: {hidden:?}"
    );
    a.kill9();
    drop(mine);
    assert_eq!(
        list(&exp.join("d")).unwrap().len(),
        2,
        "nobody removed them"
    );
    let a = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    let left = list(&exp.join("d")).unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0] != ours[0],
        "A's hidden name is gone, B's stays: {left:?}"
    );
    assert_eq!(std::fs::read(cache.join("unlinked")).unwrap(), b"");
    assert_eq!(
        std::fs::read_to_string(cache.join("client-id")).unwrap(),
        id
    );
    drop(theirs);
    assert_soon("B's hidden name goes at its close", || {
        match list(&exp.join("d")) {
            Ok(l) if l.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    a.unmount();
    b.unmount();
}
