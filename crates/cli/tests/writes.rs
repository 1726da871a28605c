//! Writes and namespace operations through a read-write mount, against a real `hoardfs serve`:
//! every change made through the mount is on the server's disk once `close` (or `fsync`)
//! returns, reads back identically through the mount (from the client's cache, without
//! fetching it again), and fails with the errno a local file system would give (`EEXIST`,
//! `ENOTEMPTY`, `ENAMETOOLONG`, `EROFS`, `ENOSPC`, ...) without leaving the client's view and
//! the server's disk out of step.

mod common;

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::*;

/// One server and one read-write client. Fields drop in order: mount, server, directory.
struct Rig {
    m: Mount,
    srv: Server,
    exp: PathBuf,
    t: tempfile::TempDir,
}

impl Rig {
    /// A second client of the same server, with its own cache directory.
    fn second_client(&self, extra: &[&str]) -> Mount {
        let t = self.t.path();
        Mount::with_cache(&self.srv.addr, &t.join("mnt2"), &t.join("cache2"), extra)
    }

    /// Path in the exported directory (the server's disk).
    fn srv(&self, rel: &str) -> PathBuf {
        self.exp.join(rel)
    }
}

/// An export prepared by `setup`, served with `server_args`, mounted with `mount_args`.
fn rig_with(setup: impl FnOnce(&Path), server_args: &[&str], mount_args: &[&str]) -> Rig {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    setup(&exp);
    let srv = Server::start_args(&exp, server_args);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        mount_args,
    );
    Rig { m, srv, exp, t }
}

fn rig() -> Rig {
    rig_with(|_| {}, &[], &[])
}

/// Creates `p` with `data` through `File`, checking the result of `close` too.
fn put(p: &Path, data: &[u8]) {
    let mut f = File::create(p).unwrap_or_else(|e| panic!("create {}: {e}", p.display()));
    f.write_all(data)
        .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    close_checked(f).unwrap_or_else(|e| panic!("close {}: {e}", p.display()));
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

#[track_caller]
fn assert_content(what: &str, p: &Path, want: &[u8]) {
    if let Err(e) = has_content(p, want) {
        panic!("{what}: {e}");
    }
}

#[track_caller]
fn assert_gone(p: &Path) {
    if let Err(e) = gone(p) {
        panic!("{e}");
    }
}

#[test]
fn a_written_file_is_on_the_server_at_close_and_rereads_from_the_client_cache() {
    let r = rig();
    let data = bytes(1, (3 << 20) + 4321);
    put(&r.m.p("new.bin"), &data);
    // Write-through: the server's disk has every byte once close returned.
    assert_bytes_eq("server copy after close", &read(&r.srv("new.bin")), &data);
    let before = r.srv.counters();
    assert!(
        before.bytes_written >= data.len() as u64,
        "server counted {} bytes written for a {} byte file",
        before.bytes_written,
        data.len()
    );
    assert_content("read back", &r.m.p("new.bin"), &data);
    drop_caches();
    assert_content("read back after drop_caches", &r.m.p("new.bin"), &data);
    let after = r.srv.counters();
    assert_eq!(
        after.bytes_read, before.bytes_read,
        "re-reading data this client wrote fetched it from the server again"
    );
}

#[test]
fn o_excl_on_an_existing_name_fails_with_eexist() {
    let r = rig_with(
        |exp| std::fs::write(exp.join("theirs"), b"made on the server").unwrap(),
        &[],
        &[],
    );
    put(&r.m.p("mine"), b"made by the client");
    let excl = |p: &Path| OpenOptions::new().write(true).create_new(true).open(p);
    assert_errno(
        "O_EXCL on a server-made file",
        excl(&r.m.p("theirs")),
        libc::EEXIST,
    );
    assert_errno(
        "O_EXCL on a client-made file",
        excl(&r.m.p("mine")),
        libc::EEXIST,
    );
    assert_content("untouched", &r.m.p("theirs"), b"made on the server");
    assert_content("untouched", &r.m.p("mine"), b"made by the client");
    let f = excl(&r.m.p("fresh")).expect("O_EXCL on a new name");
    close_checked(f).unwrap();
    assert_content("created on the server", &r.srv("fresh"), b"");
}

#[test]
fn o_trunc_discards_the_old_content() {
    let r = rig();
    put(&r.m.p("f"), &bytes(2, 100_000));
    let mut f = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(r.m.p("f"))
        .unwrap();
    f.write_all(b"short").unwrap();
    close_checked(f).unwrap();
    assert_content("client after O_TRUNC", &r.m.p("f"), b"short");
    assert_content("server after O_TRUNC", &r.srv("f"), b"short");
    // O_TRUNC with nothing written leaves an empty file.
    close_checked(File::create(r.m.p("f")).unwrap()).unwrap();
    assert_content("client after bare O_TRUNC", &r.m.p("f"), b"");
    assert_content("server after bare O_TRUNC", &r.srv("f"), b"");
}

#[test]
fn o_append_on_two_descriptors_keeps_every_write() {
    let r = rig();
    put(&r.m.p("log"), b"head\n");
    let open = || OpenOptions::new().append(true).open(r.m.p("log")).unwrap();
    let (mut f1, mut f2) = (open(), open());
    let (p1, p2) = (bytes(3, 3000), bytes(4, 5000));
    f1.write_all(&p1).unwrap();
    f2.write_all(&p2).unwrap();
    f1.write_all(b"tail").unwrap();
    close_checked(f1).unwrap();
    close_checked(f2).unwrap();
    let want = [&b"head\n"[..], &p1, &p2, b"tail"].concat();
    assert_content("client", &r.m.p("log"), &want);
    assert_content("server", &r.srv("log"), &want);
}

#[test]
fn o_append_from_two_clients_keeps_both_payloads() {
    let r = rig();
    put(&r.m.p("log"), b"head\n");
    let m2 = r.second_client(&[]);
    assert_content("second client sees the file", &m2.p("log"), b"head\n");
    let (pa, pb) = (bytes(5, 4000), bytes(6, 7000));
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        for (path, payload) in [(r.m.p("log"), &pa), (m2.p("log"), &pb)] {
            let barrier = &barrier;
            s.spawn(move || {
                let mut f = OpenOptions::new().append(true).open(&path).unwrap();
                barrier.wait();
                f.write_all(payload).unwrap();
                close_checked(f).unwrap();
            });
        }
    });
    let ab = [&b"head\n"[..], &pa, &pb].concat();
    let ba = [&b"head\n"[..], &pb, &pa].concat();
    let either = |p: &Path| has_content(p, &ab).or_else(|_| has_content(p, &ba));
    let on_server = read(&r.srv("log"));
    assert_eq!(
        on_server.len(),
        ab.len(),
        "appends from two clients overwrote each other on the server"
    );
    either(&r.srv("log")).unwrap();
    assert_soon("first client sees both appends", || either(&r.m.p("log")));
    assert_soon("second client sees both appends", || either(&m2.p("log")));
}

#[test]
fn truncate_then_extend_reads_zeros_in_the_gap() {
    let r = rig();
    let orig = bytes(7, 3 << 20);
    put(&r.m.p("f"), &orig);
    assert_content("before", &r.m.p("f"), &orig); // in the client's cache now
    // truncate(2) by path shrinks.
    let path = cpath(&r.m.p("f"));
    // SAFETY: a valid NUL-terminated path.
    let rc = unsafe { libc::truncate(path.as_ptr(), 1000) };
    assert_eq!(rc, 0, "truncate: {}", std::io::Error::last_os_error());
    assert_content("after truncate", &r.m.p("f"), &orig[..1000]);
    // A write far past the end extends; the gap reads as zeros, not as the old bytes.
    let f = OpenOptions::new().write(true).open(r.m.p("f")).unwrap();
    f.write_all_at(b"tail", 2_500_000).unwrap();
    close_checked(f).unwrap();
    let mut want = orig[..1000].to_vec();
    want.resize(2_500_000, 0);
    want.extend_from_slice(b"tail");
    assert_content("client after extend", &r.m.p("f"), &want);
    assert_content("server after extend", &r.srv("f"), &want);
    drop_caches();
    assert_content("client after extend, drop_caches", &r.m.p("f"), &want);
}

#[test]
fn ftruncate_shrinks_and_never_resurrects_the_old_tail() {
    let r = rig();
    let data = bytes(8, 3 << 20);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(r.m.p("f"))
        .unwrap();
    f.write_all(&data).unwrap();
    let cut = 1_500_007usize;
    f.set_len(cut as u64).unwrap();
    assert_eq!(
        f.metadata().unwrap().len(),
        cut as u64,
        "fstat after ftruncate"
    );
    let mut buf = vec![0u8; cut];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_bytes_eq("read on the same fd", &buf, &data[..cut]);
    let mut past = [0u8; 16];
    assert_eq!(
        f.read_at(&mut past, cut as u64).unwrap(),
        0,
        "read past the new end"
    );
    close_checked(f).unwrap();
    assert_content("server after ftruncate", &r.srv("f"), &data[..cut]);
    drop_caches();
    assert_content("client after ftruncate", &r.m.p("f"), &data[..cut]);
    // Growing again exposes zeros, not the cut-off bytes still in some cache.
    let f = OpenOptions::new().write(true).open(r.m.p("f")).unwrap();
    f.set_len(data.len() as u64).unwrap();
    close_checked(f).unwrap();
    let mut want = data[..cut].to_vec();
    want.resize(data.len(), 0);
    assert_content("client after growing", &r.m.p("f"), &want);
    assert_content("server after growing", &r.srv("f"), &want);
}

#[test]
fn chmod_chown_and_utimens_reach_the_server() {
    let r = rig();
    put(&r.m.p("f"), b"attrs");
    std::fs::set_permissions(r.m.p("f"), std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(r.m.p("f"), Some(1234), Some(2345)).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 111_111_111,
        },
        libc::timespec {
            tv_sec: 1_234_567_890,
            tv_nsec: 987_654_321,
        },
    ];
    let path = cpath(&r.m.p("f"));
    // SAFETY: a valid NUL-terminated path and an array of two timespecs.
    let rc = unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
    for (side, p) in [("client", r.m.p("f")), ("server", r.srv("f"))] {
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.mode() & 0o7777, 0o640, "{side}: mode");
        assert_eq!((md.uid(), md.gid()), (1234, 2345), "{side}: owner");
        assert_eq!(
            (md.atime(), md.atime_nsec()),
            (1_000_000_000, 111_111_111),
            "{side}: atime"
        );
        assert_eq!(
            (md.mtime(), md.mtime_nsec()),
            (1_234_567_890, 987_654_321),
            "{side}: mtime"
        );
        assert_eq!(md.len(), 5, "{side}: size");
    }
    // Directories too.
    std::fs::create_dir(r.m.p("d")).unwrap();
    std::fs::set_permissions(r.m.p("d"), std::fs::Permissions::from_mode(0o711)).unwrap();
    for p in [r.m.p("d"), r.srv("d")] {
        assert_eq!(
            std::fs::metadata(&p).unwrap().mode() & 0o7777,
            0o711,
            "{}",
            p.display()
        );
    }
}

#[test]
fn mkdir_and_rmdir_refuse_non_empty_directories() {
    let r = rig();
    std::fs::create_dir(r.m.p("a")).unwrap();
    std::fs::create_dir(r.m.p("a/b")).unwrap();
    assert!(r.srv("a/b").is_dir(), "mkdir did not reach the server");
    assert_errno(
        "mkdir of an existing name",
        std::fs::create_dir(r.m.p("a")),
        libc::EEXIST,
    );
    put(&r.m.p("a/b/f"), b"inside");
    assert_errno(
        "rmdir of a non-empty directory",
        std::fs::remove_dir(r.m.p("a/b")),
        libc::ENOTEMPTY,
    );
    assert!(r.srv("a/b/f").is_file(), "failed rmdir removed something");
    assert_errno(
        "rmdir of a file",
        std::fs::remove_dir(r.m.p("a/b/f")),
        libc::ENOTDIR,
    );
    std::fs::remove_file(r.m.p("a/b/f")).unwrap();
    std::fs::remove_dir(r.m.p("a/b")).unwrap();
    assert_gone(&r.m.p("a/b"));
    assert_gone(&r.srv("a/b"));
    assert_eq!(list(&r.m.p("a")).unwrap(), Vec::<Vec<u8>>::new());
    std::fs::remove_dir(r.m.p("a")).unwrap();
    assert_gone(&r.srv("a"));
}

#[test]
fn unlink_removes_the_file_everywhere() {
    let r = rig_with(
        |exp| {
            std::fs::create_dir(exp.join("d")).unwrap();
            std::fs::write(exp.join("d/theirs"), b"server file").unwrap();
        },
        &[],
        &[],
    );
    put(&r.m.p("d/mine"), b"client file");
    assert_eq!(
        list(&r.m.p("d")).unwrap(),
        [b"mine".to_vec(), b"theirs".to_vec()]
    );
    assert_content("cached", &r.m.p("d/theirs"), b"server file");
    for name in ["d/mine", "d/theirs"] {
        std::fs::remove_file(r.m.p(name)).unwrap();
        assert_gone(&r.m.p(name));
        assert_gone(&r.srv(name));
        assert_errno(
            "unlink again",
            std::fs::remove_file(r.m.p(name)),
            libc::ENOENT,
        );
    }
    assert_eq!(
        list(&r.m.p("d")).unwrap(),
        Vec::<Vec<u8>>::new(),
        "the client's listing still shows unlinked files"
    );
}

#[test]
fn rename_across_directories_and_over_an_existing_target() {
    let r = rig_with(
        |exp| {
            std::fs::create_dir_all(exp.join("d2")).unwrap();
            std::fs::write(exp.join("d2/b"), b"old target").unwrap();
        },
        &[],
        &[],
    );
    std::fs::create_dir(r.m.p("d1")).unwrap();
    let a = bytes(9, 200_000);
    put(&r.m.p("d1/a"), &a);
    assert_content("target cached before", &r.m.p("d2/b"), b"old target");
    std::fs::rename(r.m.p("d1/a"), r.m.p("d2/b")).unwrap();
    assert_gone(&r.m.p("d1/a"));
    assert_gone(&r.srv("d1/a"));
    assert_content("client: replaced target", &r.m.p("d2/b"), &a);
    assert_content("server: replaced target", &r.srv("d2/b"), &a);
    assert_eq!(list(&r.m.p("d1")).unwrap(), Vec::<Vec<u8>>::new());
    assert_eq!(list(&r.m.p("d2")).unwrap(), [b"b".to_vec()]);
    // A directory with content moves too.
    std::fs::create_dir(r.m.p("d1/sub")).unwrap();
    put(&r.m.p("d1/sub/x"), b"moved with its directory");
    std::fs::rename(r.m.p("d1/sub"), r.m.p("d2/moved")).unwrap();
    assert_gone(&r.m.p("d1/sub"));
    assert_content("client", &r.m.p("d2/moved/x"), b"moved with its directory");
    assert_content("server", &r.srv("d2/moved/x"), b"moved with its directory");
    // And within one directory.
    std::fs::rename(r.m.p("d2/moved/x"), r.m.p("d2/moved/y")).unwrap();
    assert_eq!(list(&r.srv("d2/moved")).unwrap(), [b"y".to_vec()]);
}

#[test]
fn rename_noreplace_refuses_an_existing_target() {
    let r = rig();
    put(&r.m.p("x"), b"xxx");
    put(&r.m.p("y"), b"yyyyy");
    assert_errno(
        "RENAME_NOREPLACE onto an existing name",
        renameat2(&r.m.p("x"), &r.m.p("y"), libc::RENAME_NOREPLACE),
        libc::EEXIST,
    );
    for (name, want) in [("x", &b"xxx"[..]), ("y", b"yyyyy")] {
        assert_content("client, unchanged", &r.m.p(name), want);
        assert_content("server, unchanged", &r.srv(name), want);
    }
    renameat2(&r.m.p("x"), &r.m.p("z"), libc::RENAME_NOREPLACE).unwrap();
    assert_gone(&r.m.p("x"));
    assert_content("client", &r.m.p("z"), b"xxx");
    assert_content("server", &r.srv("z"), b"xxx");
}

#[test]
fn rename_exchange_swaps_two_files() {
    let r = rig();
    let (x, y) = (bytes(10, 70_000), bytes(11, 1_500_000));
    put(&r.m.p("x"), &x);
    put(&r.m.p("y"), &y);
    assert_content("x cached", &r.m.p("x"), &x);
    assert_content("y cached", &r.m.p("y"), &y);
    renameat2(&r.m.p("x"), &r.m.p("y"), libc::RENAME_EXCHANGE).unwrap();
    assert_content("client x", &r.m.p("x"), &y);
    assert_content("client y", &r.m.p("y"), &x);
    assert_content("server x", &r.srv("x"), &y);
    assert_content("server y", &r.srv("y"), &x);
    assert_errno(
        "RENAME_EXCHANGE with a missing target",
        renameat2(&r.m.p("x"), &r.m.p("nope"), libc::RENAME_EXCHANGE),
        libc::ENOENT,
    );
}

#[test]
fn symlinks_store_their_target_verbatim() {
    let r = rig();
    std::fs::create_dir(r.m.p("dir")).unwrap();
    put(&r.m.p("dir/target.txt"), b"through the link");
    std::os::unix::fs::symlink("dir/target.txt", r.m.p("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/abs", r.m.p("dangling")).unwrap();
    for (name, target) in [("link", "dir/target.txt"), ("dangling", "/nonexistent/abs")] {
        assert_eq!(std::fs::read_link(r.m.p(name)).unwrap(), Path::new(target));
        assert_eq!(std::fs::read_link(r.srv(name)).unwrap(), Path::new(target));
        assert!(std::fs::symlink_metadata(r.m.p(name)).unwrap().is_symlink());
    }
    assert_eq!(read(&r.m.p("link")), b"through the link");
}

#[test]
fn hard_links_share_content_and_count() {
    let r = rig();
    put(&r.m.p("f"), &bytes(12, 10_000));
    std::fs::hard_link(r.m.p("f"), r.m.p("g")).unwrap();
    let (mf, mg) = (
        std::fs::metadata(r.m.p("f")).unwrap(),
        std::fs::metadata(r.m.p("g")).unwrap(),
    );
    assert_eq!((mf.nlink(), mg.nlink()), (2, 2), "client nlink");
    assert_eq!(mf.ino(), mg.ino(), "hard links have one client inode");
    let (sf, sg) = (
        std::fs::metadata(r.srv("f")).unwrap(),
        std::fs::metadata(r.srv("g")).unwrap(),
    );
    assert_eq!(
        (sf.nlink(), sf.ino()),
        (2, sg.ino()),
        "server: not one file with two names"
    );
    // A write through one name is read through the other.
    let f = OpenOptions::new().write(true).open(r.m.p("g")).unwrap();
    f.write_all_at(b"via g", 100).unwrap();
    close_checked(f).unwrap();
    let mut want = bytes(12, 10_000);
    want[100..105].copy_from_slice(b"via g");
    assert_content("read via f", &r.m.p("f"), &want);
    assert_content("server f", &r.srv("f"), &want);
    std::fs::remove_file(r.m.p("f")).unwrap();
    assert_eq!(
        std::fs::metadata(r.m.p("g")).unwrap().nlink(),
        1,
        "nlink after unlink"
    );
    assert_content("g survives", &r.m.p("g"), &want);
}

#[test]
fn fsync_puts_the_data_on_the_server_disk() {
    let r = rig();
    let (d1, d2) = (bytes(13, 200_000), bytes(14, 50_000));
    let mut f = File::create(r.m.p("f")).unwrap();
    f.write_all(&d1).unwrap();
    f.sync_all().expect("fsync");
    // Still open: the server's disk already has the data.
    assert_bytes_eq("server after fsync", &read(&r.srv("f")), &d1);
    f.write_all(&d2).unwrap();
    f.sync_data().expect("fdatasync");
    let mut want = [&d1[..], &d2].concat();
    assert_bytes_eq("server after fdatasync", &read(&r.srv("f")), &want);
    f.write_all_at(b"patched", 1000).unwrap();
    f.sync_all().expect("fsync after pwrite");
    want[1000..1007].copy_from_slice(b"patched");
    assert_bytes_eq("server after pwrite+fsync", &read(&r.srv("f")), &want);
    close_checked(f).unwrap();
}

#[test]
fn user_xattrs_set_get_list_remove() {
    let r = rig();
    put(&r.m.p("f"), b"x");
    std::fs::create_dir(r.m.p("d")).unwrap();
    let bin: Vec<u8> = (0..=255u8).chain(0..=44).collect();
    for obj in ["f", "d"] {
        let p = r.m.p(obj);
        set_xattr(&p, "user.color", b"blue").unwrap();
        set_xattr(&p, "user.empty", b"").unwrap();
        set_xattr(&p, "user.bin", &bin).unwrap();
        assert_eq!(get_xattr(&p, "user.color").unwrap(), b"blue");
        assert_eq!(get_xattr(&p, "user.empty").unwrap(), b"");
        assert_eq!(get_xattr(&p, "user.bin").unwrap(), bin);
        assert_eq!(
            get_xattr(&r.srv(obj), "user.color").unwrap(),
            b"blue",
            "server copy"
        );
        let names = list_xattr(&p).unwrap();
        for n in ["user.bin", "user.color", "user.empty"] {
            assert!(names.iter().any(|x| x == n), "{n} missing from {names:?}");
        }
        set_xattr(&p, "user.color", b"green").unwrap();
        assert_eq!(get_xattr(&p, "user.color").unwrap(), b"green", "replace");
        remove_xattr(&p, "user.color").unwrap();
        assert_errno("get removed", get_xattr(&p, "user.color"), libc::ENODATA);
        assert_errno(
            "server: get removed",
            get_xattr(&r.srv(obj), "user.color"),
            libc::ENODATA,
        );
        assert!(!list_xattr(&p).unwrap().iter().any(|x| x == "user.color"));
        assert_errno(
            "remove missing",
            remove_xattr(&p, "user.color"),
            libc::ENODATA,
        );
        assert_errno("get missing", get_xattr(&p, "user.never"), libc::ENODATA);
    }
    // Set on the server's disk: the client sees it.
    set_xattr(&r.srv("f"), "user.origin", b"server").unwrap();
    assert_soon("server-set xattr visible", || {
        match get_xattr(&r.m.p("f"), "user.origin") {
            Ok(v) if v == b"server" => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
}

#[test]
fn names_over_255_bytes_fail_with_enametoolong() {
    let r = rig();
    let long = "x".repeat(256);
    let max = "y".repeat(255);
    put(&r.m.p("short"), b"s");
    assert_errno("create", File::create(r.m.p(&long)), libc::ENAMETOOLONG);
    assert_errno(
        "mkdir",
        std::fs::create_dir(r.m.p(&long)),
        libc::ENAMETOOLONG,
    );
    assert_errno(
        "symlink",
        std::os::unix::fs::symlink("t", r.m.p(&long)),
        libc::ENAMETOOLONG,
    );
    assert_errno(
        "rename",
        std::fs::rename(r.m.p("short"), r.m.p(&long)),
        libc::ENAMETOOLONG,
    );
    assert_errno(
        "link",
        std::fs::hard_link(r.m.p("short"), r.m.p(&long)),
        libc::ENAMETOOLONG,
    );
    assert_errno("stat", std::fs::metadata(r.m.p(&long)), libc::ENAMETOOLONG);
    put(&r.m.p(&max), b"255 is fine");
    assert_content("server", &r.srv(&max), b"255 is fine");
    assert_eq!(
        list(&r.m.path).unwrap(),
        [b"short".to_vec(), max.as_bytes().to_vec()]
    );
}

#[test]
fn non_utf8_names_round_trip() {
    let odd = OsStr::from_bytes(b"na\xefve\xff");
    let r = rig_with(
        |exp| std::fs::write(exp.join(odd), b"server made").unwrap(),
        &[],
        &[],
    );
    let cafe = OsStr::from_bytes(b"caf\xe9");
    put(&r.m.path.join(cafe), b"latin-1 name");
    assert_content("server", &r.exp.join(cafe), b"latin-1 name");
    assert_content("client", &r.m.path.join(odd), b"server made");
    let want = vec![b"caf\xe9".to_vec(), b"na\xefve\xff".to_vec()];
    assert_eq!(list(&r.m.path).unwrap(), want, "client listing");
    assert_eq!(list(&r.exp).unwrap(), want, "server listing");
    let dir = OsStr::from_bytes(b"d\xfc");
    std::fs::create_dir(r.m.path.join(dir)).unwrap();
    std::fs::rename(r.m.path.join(cafe), r.m.path.join(dir).join(cafe)).unwrap();
    assert_content(
        "server after rename",
        &r.exp.join(dir).join(cafe),
        b"latin-1 name",
    );
}

/// Opens two files on the first client (one never read, one fully cached), lets `rename`
/// move them, and checks that the open descriptors keep reading the right bytes.
fn renamed_while_open(r: &Rig, rename: impl FnOnce()) {
    let cold = read(&r.srv("d/cold"));
    let hot = read(&r.srv("d/hot"));
    assert_content("hot cached", &r.m.p("d/hot"), &hot);
    let fc = File::open(r.m.p("d/cold")).unwrap();
    let fh = File::open(r.m.p("d/hot")).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    fc.read_exact_at(&mut buf, 0).unwrap();
    assert_bytes_eq("cold, first MiB", &buf, &cold[..1 << 20]);
    rename();
    for (what, f, want) in [("cold", &fc, &cold), ("hot", &fh, &hot)] {
        let offsets = [(5 << 20) + 3, 1 << 20, 3 << 20, 17, want.len() - 1000];
        for off in offsets.into_iter().filter(|&off| off < want.len()) {
            let n = 100_000.min(want.len() - off);
            let mut buf = vec![0u8; n];
            f.read_exact_at(&mut buf, off as u64)
                .unwrap_or_else(|e| panic!("{what}: read at {off} after rename: {e}"));
            assert_bytes_eq(
                &format!("{what} at {off} after rename"),
                &buf,
                &want[off..off + n],
            );
        }
    }
    assert_content("new name, cold", &r.m.p("e/cold"), &cold);
    assert_content("new name, hot", &r.m.p("e/hot"), &hot);
    assert_soon("old names gone", || {
        gone(&r.m.p("d/cold")).and(gone(&r.m.p("d/hot")))
    });
}

fn open_rename_setup(exp: &Path) {
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::create_dir_all(exp.join("e")).unwrap();
    std::fs::write(exp.join("d/cold"), bytes(15, (6 << 20) + 99)).unwrap();
    std::fs::write(exp.join("d/hot"), bytes(16, (3 << 20) + 7)).unwrap();
}

#[test]
fn a_file_renamed_on_the_server_while_open_stays_readable() {
    let r = rig_with(open_rename_setup, &[], &[]);
    renamed_while_open(&r, || {
        for f in ["cold", "hot"] {
            std::fs::rename(r.srv(&format!("d/{f}")), r.srv(&format!("e/{f}"))).unwrap();
        }
    });
}

#[test]
fn a_file_renamed_by_another_client_while_open_stays_readable() {
    let r = rig_with(open_rename_setup, &[], &[]);
    let m2 = r.second_client(&[]);
    renamed_while_open(&r, || {
        for f in ["cold", "hot"] {
            std::fs::rename(m2.p(&format!("d/{f}")), m2.p(&format!("e/{f}"))).unwrap();
        }
    });
    assert_gone(&r.srv("d/cold"));
}

#[test]
fn a_20_mib_file_written_in_1_mib_pieces_arrives_intact() {
    let r = rig();
    let data = bytes(17, 20 << 20);
    let mut f = File::create(r.m.p("big")).unwrap();
    for piece in data.chunks(1 << 20) {
        f.write_all(piece).unwrap();
    }
    close_checked(f).unwrap();
    let want = xxhash_rust::xxh3::xxh3_64(&data);
    assert_eq!(hash_file(&r.srv("big")), want, "server copy differs");
    assert_eq!(
        std::fs::metadata(r.srv("big")).unwrap().len(),
        data.len() as u64
    );
    drop_caches();
    assert_eq!(hash_file(&r.m.p("big")), want, "client copy differs");
}

/// Every kind of modification through `m` fails with `EROFS` and changes nothing in `exp`.
fn assert_modifications_refused(m: &Mount, exp: &Path) {
    let before = list(exp).unwrap();
    let erofs = |what: &str, r: std::io::Result<()>| assert_errno(what, r, libc::EROFS);
    erofs("create", File::create(m.p("new")).map(drop));
    erofs(
        "write-open",
        OpenOptions::new().write(true).open(m.p("f")).map(drop),
    );
    erofs("O_TRUNC open", File::create(m.p("f")).map(drop));
    erofs("mkdir", std::fs::create_dir(m.p("nd")));
    erofs("unlink", std::fs::remove_file(m.p("f")));
    erofs("rmdir", std::fs::remove_dir(m.p("d")));
    erofs("rename", std::fs::rename(m.p("f"), m.p("g")));
    erofs("symlink", std::os::unix::fs::symlink("f", m.p("l")));
    erofs("link", std::fs::hard_link(m.p("f"), m.p("h")));
    erofs(
        "chmod",
        std::fs::set_permissions(m.p("f"), std::fs::Permissions::from_mode(0o600)),
    );
    erofs("setxattr", set_xattr(&m.p("f"), "user.x", b"y"));
    assert_eq!(list(exp).unwrap(), before, "the export changed");
    assert_eq!(read(&exp.join("f")), b"read me");
    assert_eq!(
        std::fs::metadata(exp.join("f")).unwrap().mode() & 0o777,
        0o644
    );
    assert_eq!(read(&m.p("f")), b"read me", "reads must still work");
}

fn ro_setup(exp: &Path) {
    std::fs::write(exp.join("f"), b"read me").unwrap();
    std::fs::set_permissions(exp.join("f"), std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::create_dir(exp.join("d")).unwrap();
}

#[test]
fn a_read_only_server_refuses_modifications_with_erofs() {
    let r = rig_with(ro_setup, &["--read-only"], &[]);
    assert_modifications_refused(&r.m, &r.exp);
}

#[test]
fn a_mount_with_o_ro_refuses_modifications_with_erofs() {
    let r = rig_with(ro_setup, &[], &["-o", "ro"]);
    assert_modifications_refused(&r.m, &r.exp);
}

#[test]
fn a_full_server_disk_gives_enospc_and_the_client_shows_what_the_server_holds() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let _disk = Tmpfs::mount(&exp, "4m");
    let srv = Server::start(&exp);
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    let small = bytes(18, 100_000);
    put(&m.p("small"), &small);

    // Write until the disk is full (it must fill: 32 MiB do not fit in 4 MiB).
    let mut f = File::create(m.p("big")).unwrap();
    let (mut written, mut errors) = (0usize, Vec::new());
    while written < 32 << 20 {
        match f.write(&bytes(100 + written as u64, 256 << 10)) {
            Ok(0) => break,
            Ok(n) => written += n,
            Err(e) => {
                errors.push(("write", e));
                break;
            }
        }
    }
    if let Err(e) = f.sync_all() {
        errors.push(("fsync", e));
    }
    if let Err(e) = close_checked(f) {
        errors.push(("close", e));
    }
    assert!(
        !errors.is_empty(),
        "{written} bytes written to a 4 MiB disk, and write, fsync and close all succeeded"
    );
    for (what, e) in &errors {
        assert_eq!(
            e.raw_os_error(),
            Some(libc::ENOSPC),
            "{what} failed with {e}, not ENOSPC"
        );
    }

    // What the client shows is exactly what the server's disk holds.
    let check = |m: &Mount, when: &str| {
        drop_caches();
        let on_disk = read(&exp.join("big"));
        assert!(
            on_disk.len() <= 4 << 20,
            "{when}: server file larger than its disk"
        );
        assert_content(
            &format!("{when}: client view of the full file"),
            &m.p("big"),
            &on_disk,
        );
        assert_content(&format!("{when}: earlier file"), &m.p("small"), &small);
    };
    check(&m, "after ENOSPC");
    m.unmount();
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    check(&m, "after remount on the same cache");

    // Freeing space makes writes work again.
    std::fs::remove_file(m.p("big")).unwrap();
    assert_gone(&exp.join("big"));
    let again = bytes(19, 1 << 20);
    put(&m.p("again"), &again);
    assert_content("server after freeing space", &exp.join("again"), &again);
    m.unmount();
}
