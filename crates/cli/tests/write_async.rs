//! `--write-back async` (Coda's weakly connected mode): an archive extracted and a
//! repository cloned onto a mount land in the change log at local speed and reach the
//! server in the background within a few seconds (`hoardfs sync` waits for them), whole,
//! as another client then sees them; a client killed before it sent them sends them after
//! its restart.

mod common;

use std::path::Path;
use std::process::Command;

use common::offline::{offline, sync};
use common::*;

/// A mount of `addr` with `--write-back async` at `t/NAME`, its cache in `t/NAME-cache`.
fn async_mount(addr: &str, t: &Path, name: &str) -> Mount {
    Mount::with_cache(
        addr,
        &t.join(name),
        &t.join(format!("{name}-cache")),
        &["--write-back", "async"],
    )
}

/// A default mount of `addr` at `t/b` (the other client).
fn other_client(addr: &str, t: &Path) -> Mount {
    Mount::with_cache(addr, &t.join("b"), &t.join("b-cache"), &[])
}

/// Runs `cmd`, failing the test with its output if it fails.
fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file, directory and symlink under `root` (relative paths, sorted), with file
/// contents and link targets.
fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let md = std::fs::symlink_metadata(&p).unwrap();
            if md.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                walk(root, &p, out);
            } else if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).unwrap();
                out.push((format!("{rel} ->"), t.into_os_string().into_encoded_bytes()));
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.sort();
    out
}

#[test]
fn an_archive_extracted_reaches_the_server_in_the_background_whole() {
    require_fuse();
    let t = scratch();
    let (exp, src) = (t.path().join("export"), t.path().join("src"));
    std::fs::create_dir_all(&exp).unwrap();
    make_tree(&src);
    for d in 0..20 {
        for f in 0..10 {
            let p = src.join(format!("many/d{d}/f{f}.c"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, bytes(d * 10 + f, 1000 + 37 * f as usize)).unwrap();
        }
    }
    let archive = t.path().join("src.tar");
    run(Command::new("tar")
        .arg("cf")
        .arg(&archive)
        .arg("-C")
        .arg(&src)
        .arg("."));
    let srv = Server::start(&exp);
    let m = async_mount(&srv.addr, t.path(), "a");
    let b = other_client(&srv.addr, t.path());
    std::fs::create_dir(m.p("x")).unwrap();
    // (`tar` runs as root: it sets every file's owner, as it was.)
    run(Command::new("tar")
        .arg("xf")
        .arg(&archive)
        .arg("-C")
        .arg(m.p("x")));
    let want = tree(&src);
    assert_eq!(tree(&m.p("x")), want, "the tree on the writing client");
    // Sent by the mount's keeper without anybody asking, within a few seconds.
    assert_soon("the tree reaches the server", || {
        if offline(&m)["pending_files"] != 0 {
            return Err(format!("{} pending", offline(&m)["pending_files"]));
        }
        (tree(&exp.join("x")) == want)
            .then_some(())
            .ok_or_else(|| "the server's tree differs".into())
    });
    assert_eq!(tree(&b.p("x")), want, "the tree on the other client");
    assert_eq!(offline(&m)["conflicts"], 0);
}

#[test]
fn a_repository_cloned_is_whole_on_the_other_client_after_sync() {
    require_fuse();
    let t = scratch();
    let (exp, repo) = (t.path().join("export"), t.path().join("repo"));
    std::fs::create_dir_all(&exp).unwrap();
    make_tree(&repo);
    let git = |dir: &Path, args: &[&str]| {
        run(Command::new("git")
            .arg("-C")
            .arg(dir)
            .args([
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "-c",
                "init.defaultBranch=main",
            ])
            .args(args));
    };
    git(&repo, &["init", "-q"]);
    git(&repo, &["add", "-A"]);
    git(&repo, &["commit", "-qm", "one"]);
    std::fs::write(repo.join("dir1/sub/f2.txt"), b"changed").unwrap();
    git(&repo, &["commit", "-qam", "two"]);
    let srv = Server::start(&exp);
    let m = async_mount(&srv.addr, t.path(), "a");
    let b = other_client(&srv.addr, t.path());
    let url = format!("file://{}", repo.display());
    git(&m.path, &["clone", "-q", "--no-local", &url, "clone"]);
    let (ok, err) = sync(&m, "60");
    assert!(ok, "sync: {err}");
    assert_eq!(offline(&m)["pending_files"], 0);
    // The other client: every object there, the work tree as committed.
    git(&b.p("clone"), &["fsck", "--no-progress", "--strict"]);
    let status = Command::new("git")
        .arg("-C")
        .arg(b.p("clone"))
        .args(["status", "--porcelain"])
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "",
        "a clean work tree"
    );
    assert_eq!(
        std::fs::read(b.p("clone/dir1/sub/f2.txt")).unwrap(),
        b"changed"
    );
    assert_eq!(offline(&m)["conflicts"], 0);
}

#[test]
fn a_client_killed_before_it_sent_its_changes_sends_them_after_its_restart() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let srv = Server::start(&exp);
    let m = async_mount(&srv.addr, t.path(), "a");
    std::fs::create_dir(m.p("d")).unwrap();
    let files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("d/f{i}"), bytes(500 + i, 100 + 13 * i as usize)))
        .collect();
    for (rel, data) in &files {
        std::fs::write(m.p(rel), data).unwrap();
    }
    std::fs::rename(m.p("d/f0"), m.p("d/renamed")).unwrap();
    std::fs::remove_file(m.p("d/f1")).unwrap();
    // Killed at once: most of this has not left (the keeper sends once a second).
    eprintln!("pending when killed: {}", offline(&m)["pending_files"]);
    m.kill9();
    let m = async_mount(&srv.addr, t.path(), "a");
    let (ok, err) = sync(&m, "60");
    assert!(ok, "sync: {err}");
    for (rel, data) in &files[2..] {
        assert_bytes_eq(rel, &std::fs::read(exp.join(rel)).unwrap(), data);
    }
    assert_bytes_eq(
        "d/renamed",
        &std::fs::read(exp.join("d/renamed")).unwrap(),
        &files[0].1,
    );
    assert!(!exp.join("d/f0").exists() && !exp.join("d/f1").exists());
    assert_eq!(offline(&m)["conflicts"], 0);
}

#[test]
fn async_write_back_needs_a_cache_and_a_hoardfs_server() {
    let (ok, _, err) = tool(&[
        "mount",
        "127.0.0.1:1",
        "/nonexistent",
        "--no-cache",
        "--write-back",
        "async",
    ]);
    assert!(!ok);
    assert!(
        err.contains("--write-back=async needs a disk cache"),
        "{err}"
    );
}
