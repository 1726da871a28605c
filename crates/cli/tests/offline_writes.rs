//! `--offline-writes`: changes made while the server is unreachable (file contents, names,
//! directories, links, permissions) are kept in the cache directory and sent back when it
//! returns; a file changed on both sides keeps the server's version and gets this
//! client's next to it; nothing is lost across a client crash or a remount while the
//! server is still away. Random sessions against a model: `offline_random.rs`.

mod common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::time::Duration;

use common::offline::{mount, offline, sync};
use common::*;

const MIB: usize = 1 << 20;

fn read_whole(m: &Mount, rel: &str) {
    std::fs::read(m.p(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
}

#[test]
fn changes_made_while_the_server_is_down_reach_it_when_it_returns() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::create_dir_all(exp.join("untouched")).unwrap();
    let mut a = bytes(1, 3 * MIB);
    let mut b = bytes(2, 100_000);
    std::fs::write(exp.join("a"), &a).unwrap();
    std::fs::write(exp.join("b"), &b).unwrap();
    std::fs::write(exp.join("c"), bytes(3, 10_000)).unwrap();
    std::fs::write(exp.join("d/e"), b"old e").unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    for f in ["a", "b", "d/e"] {
        read_whole(&m, f);
    }
    std::fs::metadata(m.p("c")).unwrap();
    srv.kill();

    // While the server is away.
    let patch = bytes(4, 65_536);
    let f = OpenOptions::new().write(true).open(m.p("a")).unwrap();
    f.write_all_at(&patch, MIB as u64).unwrap();
    a[MIB..MIB + patch.len()].copy_from_slice(&patch);
    f.sync_all().unwrap();
    close_checked(f).unwrap();
    let mut f = OpenOptions::new().append(true).open(m.p("a")).unwrap();
    f.write_all(b"appended offline").unwrap();
    a.extend_from_slice(b"appended offline");
    close_checked(f).unwrap();
    let f = OpenOptions::new().write(true).open(m.p("b")).unwrap();
    f.set_len(50_000).unwrap();
    f.write_all_at(b"past the end", 60_000).unwrap();
    b.truncate(50_000);
    b.resize(60_000, 0);
    b.extend_from_slice(b"past the end");
    close_checked(f).unwrap();
    let mut f = std::fs::File::create(m.p("d/e")).unwrap();
    f.write_all(b"new e, written offline").unwrap();
    close_checked(f).unwrap();
    // What this client does not hold cannot be changed; names cannot be made where it
    // never looked.
    assert_errno(
        "a file not cached",
        OpenOptions::new()
            .write(true)
            .open(m.p("c"))
            .and_then(|f| f.write_all_at(b"x", 0)),
        libc::EIO,
    );
    assert_errno(
        "a new name in a directory never used",
        std::fs::write(m.p("untouched/new"), b"x"),
        libc::EIO,
    );
    // The mount shows its own changes.
    assert_bytes_eq("a through the mount", &std::fs::read(m.p("a")).unwrap(), &a);
    assert_bytes_eq("b through the mount", &std::fs::read(m.p("b")).unwrap(), &b);
    assert_eq!(std::fs::metadata(m.p("b")).unwrap().len(), b.len() as u64);
    assert_eq!(
        std::fs::read(m.p("d/e")).unwrap(),
        b"new e, written offline"
    );
    let o = offline(&m);
    assert_eq!(o["pending_files"], 3, "{o}");
    assert_eq!(
        o["pending_bytes"].as_u64().unwrap(),
        (a.len() + b.len() + 22) as u64
    );
    let (ok, err) = sync(&m, "1");
    assert!(!ok, "sync succeeds with the server down");
    assert!(err.contains("not on the server yet"), "{err}");
    // The server, untouched meanwhile.
    assert_eq!(std::fs::read(exp.join("d/e")).unwrap(), b"old e");

    let _srv = Server::start_at(&exp, &addr, &[]);
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");
    assert_bytes_eq(
        "a on the server",
        &std::fs::read(exp.join("a")).unwrap(),
        &a,
    );
    assert_bytes_eq(
        "b on the server",
        &std::fs::read(exp.join("b")).unwrap(),
        &b,
    );
    assert_eq!(
        std::fs::read(exp.join("d/e")).unwrap(),
        b"new e, written offline"
    );
    assert_eq!(offline(&m)["pending_files"], 0);
    assert_eq!(offline(&m)["conflicts"], 0);
    // Back to normal: reads and writes go to the server again.
    assert_bytes_eq("a after", &std::fs::read(m.p("a")).unwrap(), &a);
    std::fs::write(m.p("d/e"), b"online again").unwrap();
    assert_eq!(std::fs::read(exp.join("d/e")).unwrap(), b"online again");
    m.unmount();
}

#[test]
fn a_file_changed_on_both_sides_keeps_both_versions() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("sub")).unwrap();
    for f in ["f", "g", "sub/h"] {
        std::fs::write(exp.join(f), format!("{f} before")).unwrap();
    }
    // h is readable by everyone by its mode, but protected by its directory.
    std::fs::set_permissions(exp.join("sub"), std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    for f in ["f", "g", "sub/h"] {
        read_whole(&m, f);
    }
    srv.kill();
    for f in ["f", "g", "sub/h"] {
        std::fs::write(m.p(f), format!("{f} by the client")).unwrap();
    }
    // Meanwhile on the server: f changed, g removed, the directory of h removed.
    std::fs::write(exp.join("f"), "f by the server").unwrap();
    std::fs::remove_file(exp.join("g")).unwrap();
    std::fs::remove_dir_all(exp.join("sub")).unwrap();
    let _srv = Server::start_at(&exp, &addr, &[]);
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");

    assert_eq!(
        std::fs::read_to_string(exp.join("f")).unwrap(),
        "f by the server"
    );
    assert!(!exp.join("g").exists(), "a removed file stays removed");
    let names: Vec<String> = std::fs::read_dir(&exp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let copy = |prefix: &str| {
        let n = names
            .iter()
            .find(|n| n.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix}* in {names:?}"));
        std::fs::read_to_string(exp.join(n)).unwrap()
    };
    assert_eq!(copy("f.conflict-"), "f by the client");
    assert_eq!(copy("g.conflict-"), "g by the client");
    // The copy of h is not put in the export root, readable by all, but in its maker's
    // private directory there (the client is root, not squashed, in this test).
    assert!(!names.iter().any(|n| n.starts_with("sub_h")), "{names:?}");
    let orphans = exp.join(".hoardfs-conflicts-0");
    let md = std::fs::metadata(&orphans).unwrap();
    assert_eq!((md.mode() & 0o777, md.uid()), (0o700, 0));
    let h = std::fs::read_dir(&orphans)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("sub_h.conflict-")
        })
        .expect("the copy of sub/h");
    assert_eq!(std::fs::read_to_string(h).unwrap(), "sub/h by the client");
    let (ok, out, err) = tool(&["conflicts", m.path.to_str().unwrap()]);
    assert!(ok, "{err}");
    for (path, why) in [
        ("/f:", "changed on the server"),
        ("/g:", "removed on the server"),
        ("/sub/h:", "directory was removed"),
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(path) && l.contains(why)),
            "{path} {why} not in:\n{out}"
        );
    }
    assert_eq!(offline(&m)["conflicts"], 3);
    assert_eq!(offline(&m)["pending_files"], 0);
    m.unmount();
}

#[test]
fn offline_changes_survive_a_client_crash_and_a_remount_while_the_server_is_away() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let mut f0 = bytes(5, 2 * MIB);
    std::fs::write(exp.join("f"), &f0).unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    read_whole(&m, "f");
    let killed = std::time::SystemTime::now();
    srv.kill();
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all_at(b"durable before the crash", 1000).unwrap();
    f0[1000..1024].copy_from_slice(b"durable before the crash");
    f.sync_all().unwrap();
    // Give the mount's keeper its second to save the namespace after the disconnect (the
    // file is there from the start: it must be newer than the disconnect).
    assert_soon("the namespace is saved after the disconnect", || {
        let saved = std::fs::read_dir(t.path().join("cache"))
            .unwrap()
            .flatten()
            .any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n.starts_with("namespace-")
                    && !n.ends_with(".tmp")
                    && e.metadata()
                        .and_then(|m| m.modified())
                        .is_ok_and(|at| at >= killed)
            });
        if saved {
            Ok(())
        } else {
            Err("no namespace file".into())
        }
    });
    m.kill9();
    drop(f);

    // Remounted with the server still away: the change is there.
    let m = mount(&addr, t.path());
    assert_bytes_eq("f after the crash", &std::fs::read(m.p("f")).unwrap(), &f0);
    std::fs::OpenOptions::new()
        .write(true)
        .open(m.p("f"))
        .unwrap()
        .write_all_at(b"after the remount", 5000)
        .unwrap();
    f0[5000..5017].copy_from_slice(b"after the remount");
    assert_eq!(offline(&m)["pending_files"], 1);
    m.unmount();

    // Mounted again once the server is back: sent at once.
    let _srv = Server::start_at(&exp, &addr, &[]);
    let m = mount(&addr, t.path());
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");
    assert_bytes_eq(
        "f on the server",
        &std::fs::read(exp.join("f")).unwrap(),
        &f0,
    );
    assert_bytes_eq(
        "f through the mount",
        &std::fs::read(m.p("f")).unwrap(),
        &f0,
    );
    m.unmount();
}

/// A directory only used by path while connected (an editor opens `work/thesis/ch1.tex`,
/// nobody lists `work/thesis`) takes offline creates, mkdirs, symlinks and renames into
/// it; they reach the server when it is back. A name that exists on the server but was
/// never seen here becomes a conflict copy, never an overwrite.
#[test]
fn a_directory_used_only_by_path_takes_offline_names() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    let thesis = exp.join("work/thesis");
    std::fs::create_dir_all(&thesis).unwrap();
    std::fs::write(thesis.join("ch1.tex"), b"chapter one").unwrap();
    std::fs::write(thesis.join("notes"), b"theirs").unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    assert_eq!(
        std::fs::read(m.p("work/thesis/ch1.tex")).unwrap(),
        b"chapter one"
    );
    // The directories are listed in the background, off the reader's path.
    assert_soon("background listings", || {
        let c = &stats(&m)["counters"];
        let n =
            c["listing_fetches"].as_u64().unwrap_or(0) + c["tree_requests"].as_u64().unwrap_or(0);
        if n >= 1 { Ok(()) } else { Err(format!("{c}")) }
    });
    std::thread::sleep(Duration::from_millis(500));
    srv.kill();

    std::fs::write(m.p("work/thesis/.ch1.tex.swp"), b"swap").unwrap();
    std::fs::create_dir(m.p("work/thesis/figs")).unwrap();
    std::os::unix::fs::symlink("ch1.tex", m.p("work/thesis/latest")).unwrap();
    std::fs::write(m.p("work/draft"), b"moved in").unwrap();
    std::fs::rename(m.p("work/draft"), m.p("work/thesis/draft")).unwrap();
    // Made on the server after the listing, and here offline under the same name.
    std::fs::write(thesis.join("late"), b"theirs, made meanwhile").unwrap();
    std::fs::write(m.p("work/thesis/late"), b"ours").unwrap();
    // Listed, so known (never read, so its data is not here): not a free name.
    assert_eq!(
        std::fs::metadata(m.p("work/thesis/notes")).unwrap().len(),
        6
    );
    assert_errno(
        "a listed name is not free",
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(m.p("work/thesis/notes")),
        libc::EEXIST,
    );

    let _srv = Server::start_at(&exp, &addr, &[]);
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");
    assert_eq!(std::fs::read(thesis.join(".ch1.tex.swp")).unwrap(), b"swap");
    assert!(thesis.join("figs").is_dir());
    assert_eq!(
        std::fs::read_link(thesis.join("latest")).unwrap(),
        std::path::Path::new("ch1.tex")
    );
    assert_eq!(std::fs::read(thesis.join("draft")).unwrap(), b"moved in");
    assert_eq!(std::fs::read(thesis.join("notes")).unwrap(), b"theirs");
    assert_eq!(
        std::fs::read(thesis.join("late")).unwrap(),
        b"theirs, made meanwhile",
        "never overwritten"
    );
    let copies: Vec<_> = list(&thesis)
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(b"late.conflict"))
        .collect();
    assert_eq!(copies.len(), 1, "one conflict copy: {copies:?}");
    let copy = thesis.join(std::ffi::OsStr::from_bytes(&copies[0]));
    assert_eq!(std::fs::read(copy).unwrap(), b"ours");
    m.unmount();
}

#[test]
fn files_created_and_removed_offline_are_created_and_removed_on_the_server() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
    std::fs::create_dir_all(exp.join("other")).unwrap();
    for f in ["keep", "gone", "edited", "theirs", "changed", "replaced"] {
        std::fs::write(exp.join("d").join(f), format!("{f} before")).unwrap();
    }
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    for f in ["keep", "gone", "edited", "theirs", "changed", "replaced"] {
        read_whole(&m, &format!("d/{f}"));
    }
    // Names are created offline only in a directory listed while connected (by a
    // reader, or in the background once a name in it was used).
    list(&m.p("d")).unwrap();
    srv.kill();

    assert_errno(
        "a name in a directory never used",
        std::fs::write(m.p("other/new"), b"x"),
        libc::EIO,
    );
    std::fs::write(m.p("d/new"), b"created offline").unwrap();
    std::fs::write(m.p("d/tmp"), b"created and removed offline").unwrap();
    std::fs::remove_file(m.p("d/tmp")).unwrap();
    std::fs::remove_file(m.p("d/gone")).unwrap();
    std::fs::write(m.p("d/edited"), b"edited, then removed").unwrap();
    std::fs::remove_file(m.p("d/edited")).unwrap();
    std::fs::remove_file(m.p("d/changed")).unwrap();
    std::fs::write(m.p("d/clash"), b"ours").unwrap();
    // Removed, then another file created under its name: in that order on the server.
    std::fs::remove_file(m.p("d/replaced")).unwrap();
    std::fs::write(m.p("d/replaced"), b"a new file, same name").unwrap();
    std::fs::create_dir(m.p("d/sub")).unwrap();
    std::fs::write(m.p("d/sub/inner"), b"in a directory made offline").unwrap();
    assert_eq!(std::fs::read(m.p("d/new")).unwrap(), b"created offline");
    let mut names = list(&m.p("d")).unwrap();
    names.sort();
    let want: Vec<Vec<u8>> = ["clash", "keep", "new", "replaced", "sub", "theirs"]
        .iter()
        .map(|n| n.as_bytes().to_vec())
        .collect();
    assert_eq!(names, want, "the listing follows the offline changes");
    assert_errno(
        "a removed name",
        std::fs::metadata(m.p("d/gone")),
        libc::ENOENT,
    );
    // Meanwhile on the server: a clashing name, and a change to a file removed here.
    std::fs::write(exp.join("d/clash"), b"theirs").unwrap();
    std::fs::write(exp.join("d/changed"), b"changed on the server").unwrap();

    let _srv = Server::start_at(&exp, &addr, &[]);
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");
    let d = exp.join("d");
    assert_eq!(std::fs::read(d.join("new")).unwrap(), b"created offline");
    assert_eq!(
        std::fs::read(d.join("sub/inner")).unwrap(),
        b"in a directory made offline"
    );
    for gone in ["tmp", "gone", "edited"] {
        assert!(!d.join(gone).exists(), "{gone} is still on the server");
    }
    assert_eq!(std::fs::read(d.join("keep")).unwrap(), b"keep before");
    assert_eq!(
        std::fs::read(d.join("replaced")).unwrap(),
        b"a new file, same name"
    );
    assert_eq!(std::fs::read(d.join("clash")).unwrap(), b"theirs");
    assert_eq!(
        std::fs::read(d.join("changed")).unwrap(),
        b"changed on the server",
        "a file changed on the server is not removed"
    );
    let copies: Vec<String> = std::fs::read_dir(&d)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".conflict-"))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    assert!(copies[0].starts_with("clash.conflict-"));
    assert_eq!(std::fs::read(d.join(&copies[0])).unwrap(), b"ours");
    let (ok, out, err) = tool(&["conflicts", m.path.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("/d/clash: a file of that name was created"),
        "{out}"
    );
    assert!(
        out.contains("/d/changed: removed here, but changed"),
        "{out}"
    );
    // The created file is the server's file now: written through, seen by the server.
    assert_soon("the mount shows the server's clash", || {
        has_content(&m.p("d/clash"), b"theirs")
    });
    std::fs::write(m.p("d/new"), b"online again").unwrap();
    assert_eq!(std::fs::read(d.join("new")).unwrap(), b"online again");
    m.unmount();
}

#[test]
fn an_editors_save_offline_replaces_the_file_on_the_server() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("doc"), b"the document as it was").unwrap();
    std::fs::set_permissions(exp.join("doc"), PermissionsExt::from_mode(0o600)).unwrap();
    std::fs::write(exp.join("theirs"), b"theirs as it was").unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    read_whole(&m, "doc");
    read_whole(&m, "theirs");
    list(&m.p("")).unwrap();
    srv.kill();

    // Save: a new file, then renamed over the document.
    // (Made with its mode, not given it by a chmod.)
    std::os::unix::fs::OpenOptionsExt::mode(OpenOptions::new().write(true).create_new(true), 0o640)
        .open(m.p(".doc.tmp"))
        .and_then(|mut f| f.write_all(b"the document, saved offline"))
        .unwrap();
    std::fs::rename(m.p(".doc.tmp"), m.p("doc")).unwrap();
    assert_eq!(
        std::fs::read(m.p("doc")).unwrap(),
        b"the document, saved offline"
    );
    // Save as: a new file renamed to a new name.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode(&m.p("doc")), 0o640, "the saved file's mode");
    std::fs::write(m.p("draft"), b"a new file").unwrap();
    std::fs::rename(m.p("draft"), m.p("final")).unwrap();
    // The same save over a file that changes on the server meanwhile.
    std::fs::write(m.p(".theirs.tmp"), b"ours").unwrap();
    std::fs::rename(m.p(".theirs.tmp"), m.p("theirs")).unwrap();
    std::fs::write(exp.join("theirs"), b"changed on the server").unwrap();
    let mut names = list(&m.p("")).unwrap();
    names.sort();
    let want: Vec<Vec<u8>> = ["doc", "final", "theirs"]
        .iter()
        .map(|n| n.as_bytes().to_vec())
        .collect();
    assert_eq!(names, want);

    let _srv = Server::start_at(&exp, &addr, &[]);
    let (ok, err) = sync(&m, "30");
    assert!(ok, "sync: {err}");
    let mut on_server: Vec<String> = std::fs::read_dir(&exp)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    on_server.sort();
    assert_eq!(on_server.len(), 4, "{on_server:?}");
    assert_eq!(
        std::fs::read(exp.join("doc")).unwrap(),
        b"the document, saved offline"
    );
    // With the new file's permission bits, as the rename gave them (not the old 0o600).
    assert_eq!(mode(&exp.join("doc")), 0o640);
    assert_eq!(std::fs::read(exp.join("final")).unwrap(), b"a new file");
    assert_eq!(
        std::fs::read(exp.join("theirs")).unwrap(),
        b"changed on the server"
    );
    let copy = on_server
        .iter()
        .find(|n| n.starts_with("theirs.conflict-"))
        .expect("a conflict copy");
    assert_eq!(std::fs::read(exp.join(copy)).unwrap(), b"ours");
    assert_soon("the mount shows the saved document", || {
        has_content(&m.p("doc"), b"the document, saved offline")
    });
    m.unmount();
}

#[test]
fn a_client_killed_while_sending_a_change_sends_it_whole_at_the_next_mount() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let size = 96 * MIB;
    std::fs::write(exp.join("big"), bytes(1, size)).unwrap();
    let mut srv = Server::start(&exp);
    let addr = srv.addr.clone();
    let m = mount(&addr, t.path());
    let (ok, _, err) = tool(&["prefetch", m.p("big").to_str().unwrap(), "-q"]);
    assert!(ok, "{err}");
    srv.kill();
    let new = bytes(2, size);
    let f = OpenOptions::new().write(true).open(m.p("big")).unwrap();
    f.write_all_at(&new, 0).unwrap();
    close_checked(f).unwrap();
    let before = std::fs::metadata(exp.join("big"))
        .unwrap()
        .modified()
        .unwrap();
    let _srv = Server::start_at(&exp, &addr, &[]);
    // Killed as soon as the server's copy starts changing (the upload is under way).
    let started = wait_until(Duration::from_secs(20), || {
        std::fs::metadata(exp.join("big"))
            .and_then(|m| m.modified())
            .is_ok_and(|t| t != before)
    });
    assert!(started, "the upload did not start");
    m.kill9();
    let partial = std::fs::read(exp.join("big")).unwrap() != new;
    eprintln!("killed mid-upload: {partial}");
    let m = mount(&addr, t.path());
    let (ok, err) = sync(&m, "60");
    assert!(ok, "sync: {err}");
    assert_bytes_eq(
        "big on the server",
        &std::fs::read(exp.join("big")).unwrap(),
        &new,
    );
    assert_eq!(
        offline(&m)["conflicts"],
        0,
        "its own half upload is no conflict"
    );
    m.unmount();
}
