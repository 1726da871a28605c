//! Writes and namespace operations through a read-write mount, against a real `hoardfs serve`:
//! every change made through the mount is on the server's disk once `close` (or `fsync`)
//! returns, reads back identically through the mount (from the client's cache, without
//! fetching it again), and fails with the errno a local file system would give (`EEXIST`,
//! `ENOTEMPTY`, `ENAMETOOLONG`, `EROFS`, `ENOSPC`, ...) without leaving the client's view and
//! the server's disk out of step.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::Path;

use common::*;

use common::rig::*;

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

/// `fallocate(2)` on `f`.
fn falloc(f: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on an open descriptor; no memory is passed.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

#[test]
fn fallocate_reaches_the_server_and_every_client_reads_what_it_made() {
    let r = rig();
    let data = bytes(9, 1 << 20);
    put(&r.m.p("f"), &data);
    let m2 = r.second_client(&[]);
    assert_content("the second client caches it", &m2.p("f"), &data);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(r.m.p("f"))
        .unwrap();
    // Allocated past the end: the file grows, the new part reads as zeros.
    falloc(&f, 0, 1 << 20, 8192).unwrap();
    let mut want = data.clone();
    want.resize((1 << 20) + 8192, 0);
    assert_eq!(f.metadata().unwrap().len(), want.len() as u64, "fstat");
    // A hole punched in the middle reads as zeros; the size stays.
    let (hole, hole_len) = (12_288usize, 65_536usize);
    let punch = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
    falloc(&f, punch, hole as u64, hole_len as u64).unwrap();
    want[hole..hole + hole_len].fill(0);
    // Preallocated past the end without changing the size.
    falloc(&f, libc::FALLOC_FL_KEEP_SIZE, want.len() as u64, 1 << 20).unwrap();
    // A range zeroed (the page cache holds the file: it was just read).
    let mut buf = vec![0u8; want.len()];
    f.read_exact_at(&mut buf, 0).unwrap();
    let zeroed = 200_000usize..300_000;
    falloc(
        &f,
        libc::FALLOC_FL_ZERO_RANGE,
        zeroed.start as u64,
        zeroed.len() as u64,
    )
    .unwrap();
    want[zeroed].fill(0);
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_bytes_eq("read on the same descriptor", &buf, &want);
    close_checked(f).unwrap();
    assert_content("server", &r.srv("f"), &want);
    let blocks = std::fs::metadata(r.srv("f")).unwrap().blocks() * 512;
    assert!(
        blocks >= (2 << 20) - hole_len as u64,
        "the server's file holds {blocks} bytes of blocks: the preallocation is missing"
    );
    assert_content("this client", &r.m.p("f"), &want);
    drop_caches();
    assert_content("this client, page cache dropped", &r.m.p("f"), &want);
    assert_soon("the other client sees it", || {
        has_content(&m2.p("f"), &want)
    });
    // Modes the kernel does not pass to FUSE fail with EOPNOTSUPP, nothing changed.
    let f = OpenOptions::new().write(true).open(r.m.p("f")).unwrap();
    assert_errno(
        "collapse range",
        falloc(&f, libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096),
        libc::EOPNOTSUPP,
    );
    // A descriptor open for reading only cannot (EBADF, as on a local file system).
    let ro = File::open(r.m.p("f")).unwrap();
    assert_errno("read-only descriptor", falloc(&ro, 0, 0, 4096), libc::EBADF);
    close_checked(f).unwrap();
    assert_content("server, unchanged", &r.srv("f"), &want);
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

#[test]
fn a_write_open_waits_for_a_cached_reader_that_is_closing() {
    let r = rig();
    let old = bytes(5, 200_000);
    put(&r.m.p("f"), &old);
    let passthrough = || counter(&r.m, "passthrough_opens");
    let before = passthrough();
    // Written through this client, so completely cached: read-only opens are passthrough,
    // and while one is open the kernel refuses every other kind of open of the file (EIO).
    let reader = File::open(r.m.p("f")).unwrap();
    assert_eq!(
        passthrough(),
        before + 1,
        "the reader is a passthrough open"
    );
    // A reader that closes soon (or a descriptor a child holds until it execs): the write
    // open waits for it instead of failing.
    let closer = std::thread::spawn(move || {
        // The reader closing a little later is the point: the write open must wait.
        std::thread::sleep(std::time::Duration::from_millis(100));
        drop(reader);
    });
    let w = OpenOptions::new().write(true).open(r.m.p("f")).unwrap();
    w.write_all_at(b"new", 0).unwrap();
    close_checked(w).unwrap();
    closer.join().unwrap();
    let want = [&b"new"[..], &old[3..]].concat();
    assert_content("server", &r.srv("f"), &want);
    assert_content("client", &r.m.p("f"), &want);
    // One that stays open: the write open fails (doc/SEMANTICS.md), and works once it closed.
    // The writer's RELEASE reaches the daemon after close() returns, and until it has, a
    // read open is a daemon open (a write open is still there): open until passthrough.
    let mut reader = None;
    assert_eventually(
        "a passthrough reader once the writer's release is in",
        || {
            let before = passthrough();
            let f = File::open(r.m.p("f")).unwrap();
            let passes = passthrough() == before + 1;
            reader = passes.then_some(f);
            passes
        },
    );
    assert_errno(
        "write open beside a passthrough reader",
        OpenOptions::new().write(true).open(r.m.p("f")),
        libc::EIO,
    );
    drop(reader);
    close_checked(OpenOptions::new().write(true).open(r.m.p("f")).unwrap()).unwrap();
    assert_content("unchanged by the failed open", &r.srv("f"), &want);
}
