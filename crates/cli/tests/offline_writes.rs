//! `--offline-writes`: changes to cached files made while the server is unreachable are
//! kept in the cache directory and sent back when it returns; a file changed on both sides
//! keeps the server's version and gets this client's next to it; nothing is lost across a
//! client crash or a remount while the server is still away.

mod common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::*;

const MIB: usize = 1 << 20;

fn mount(addr: &str, t: &Path) -> Mount {
    Mount::with_cache(
        addr,
        &t.join("mnt"),
        &t.join("cache"),
        &["--offline-writes", "--timeout", "2"],
    )
}

fn read_whole(m: &Mount, rel: &str) {
    std::fs::read(m.p(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"));
}

fn offline(m: &Mount) -> serde_json::Value {
    stats(m)["offline_writes"].clone()
}

fn sync(m: &Mount, timeout: &str) -> (bool, String) {
    let (ok, _, err) = tool(&["sync", m.path.to_str().unwrap(), "--timeout", timeout]);
    (ok, err)
}

#[test]
fn changes_made_while_the_server_is_down_reach_it_when_it_returns() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d")).unwrap();
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
    // What this client does not hold cannot be changed; names cannot be made.
    assert_errno(
        "a file not cached",
        OpenOptions::new()
            .write(true)
            .open(m.p("c"))
            .and_then(|f| f.write_all_at(b"x", 0)),
        libc::EIO,
    );
    assert_errno("a new name", std::fs::write(m.p("new"), b"x"), libc::EIO);
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
    assert_eq!(copy("sub_h.conflict-"), "sub/h by the client");
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
    srv.kill();
    let f = OpenOptions::new().write(true).open(m.p("f")).unwrap();
    f.write_all_at(b"durable before the crash", 1000).unwrap();
    f0[1000..1024].copy_from_slice(b"durable before the crash");
    f.sync_all().unwrap();
    // Give the mount's keeper its second to save the namespace after the disconnect.
    assert_soon("the namespace is saved after the disconnect", || {
        let saved = std::fs::read_dir(t.path().join("cache"))
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("namespace-"));
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
