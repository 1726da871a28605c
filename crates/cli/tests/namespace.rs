//! Namespace operations through a read-write mount, against a real `hoardfs serve`:
//! mkdir/rmdir, unlink, rename (across directories, over a target, NOREPLACE, EXCHANGE),
//! symlinks, hard links, fsync, extended attributes, name limits and non-UTF-8 names, and
//! files renamed while open. Each change is on the server's disk when the call returns and
//! fails with the errno a local file system would give.

mod common;

use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use common::rig::*;
use common::*;

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

/// `utimensat(AT_SYMLINK_NOFOLLOW)` sets a symbolic link's own times (pjdfstest
/// utimensat/05), on the server too, and leaves its target's alone.
#[test]
fn a_symlinks_own_times_can_be_set() {
    let r = rig();
    put(&r.m.p("target"), b"t");
    std::os::unix::fs::symlink("target", r.m.p("link")).unwrap();
    let target_mtime = std::fs::metadata(r.srv("target")).unwrap().mtime();
    let path = std::ffi::CString::new(r.m.p("link").as_os_str().as_bytes()).unwrap();
    let times = [
        libc::timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 1,
        },
        libc::timespec {
            tv_sec: 1_100_000_000,
            tv_nsec: 2,
        },
    ];
    // SAFETY: a valid C string and a two-element timespec array.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            path.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(rc, 0, "utimensat: {}", std::io::Error::last_os_error());
    for (who, p) in [("client", r.m.p("link")), ("server", r.srv("link"))] {
        let md = std::fs::symlink_metadata(&p).unwrap();
        assert_eq!(
            (md.atime(), md.atime_nsec(), md.mtime(), md.mtime_nsec()),
            (1_000_000_000, 1, 1_100_000_000, 2),
            "{who}"
        );
    }
    assert_eq!(
        std::fs::metadata(r.srv("target")).unwrap().mtime(),
        target_mtime,
        "the target's times"
    );
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
    let r = rig_with(|_| {}, &[], &["--xattrs"]);
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
fn xattrs_are_refused_by_the_kernel_unless_enabled() {
    let r = rig();
    put(&r.m.p("f"), b"x");
    set_xattr(&r.srv("f"), "user.color", b"blue").unwrap();
    let before = r.srv.counters().requests;
    for _ in 0..3 {
        assert_errno(
            "get",
            get_xattr(&r.m.p("f"), "user.color"),
            libc::EOPNOTSUPP,
        );
        assert_errno(
            "set",
            set_xattr(&r.m.p("f"), "user.x", b"y"),
            libc::EOPNOTSUPP,
        );
        assert_errno("list", list_xattr(&r.m.p("f")), libc::EOPNOTSUPP);
        assert_errno(
            "remove",
            remove_xattr(&r.m.p("f"), "user.color"),
            libc::EOPNOTSUPP,
        );
    }
    // Two counter queries' worth of requests at most: no xattr call reached the server.
    let spent = r.srv.counters().requests - before;
    assert!(
        spent <= 4,
        "{spent} server requests for refused xattr calls"
    );
    assert_eq!(get_xattr(&r.srv("f"), "user.color").unwrap(), b"blue");
    assert!(get_xattr(&r.srv("f"), "user.x").is_err(), "nothing was set");
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
