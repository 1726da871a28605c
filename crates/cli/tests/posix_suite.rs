//! The POSIX conformance suite pjdfstest on a mount of a real `hoardfs serve`, run as its
//! users run it: as root, in a directory of the mount, against a server that keeps the
//! callers' identities (`--squash none`) and allows set-id bits and device nodes. Every
//! test the suite runs must pass.
//!
//! The suite is the maintained Rust rewrite of pjdfstest (crates.io `pjdfstest` 0.2.2, the
//! successor of the C suite, which no package registry carries): `.ci/run` builds it once
//! into `~/.cache/hoardfs-test/pjdfstest-0.2.2/` (about a minute), or give its path in
//! `HOARDFS_PJDFSTEST`. Its summary line is also written to the file named by
//! `HOARDFS_PJDFSTEST_REPORT`, if set, for `.ci/run` to print.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;

/// The suite's binary: `HOARDFS_PJDFSTEST`, else where `.ci/run` builds it.
fn pjdfstest_path() -> PathBuf {
    match std::env::var_os("HOARDFS_PJDFSTEST") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/hoardfs-test/pjdfstest-0.2.2/bin/pjdfstest"),
    }
}

/// Features the mount has beyond the suite's baseline (`pjdfstest -l` lists them).
const CONFIG: &str = r#"
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.01
allow_remount = false

# Users the suite switches to (Debian's: nobody and daemon).
[dummy_auth]
entries = [
  ["nobody", "nogroup"],
  ["daemon", "daemon"],
]
"#;

#[test]
fn pjdfstest_passes_on_a_mount() {
    require_fuse();
    let bin = pjdfstest_path();
    assert!(
        bin.is_file(),
        "this test needs pjdfstest 0.2.2 at {} ($HOARDFS_PJDFSTEST): `bash .ci/run` builds \
         it, or `cargo install pjdfstest --version 0.2.2 --locked --root \
         ~/.cache/hoardfs-test/pjdfstest-0.2.2`",
        bin.display()
    );
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let srv = Server::start_args(
        &exp,
        &["--squash", "none", "--allow-setid", "--allow-devices"],
    );
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    let config = t.path().join("pjdfstest.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let out = Command::new(&bin)
        .arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(&m.path)
        .current_dir(&m.path)
        .output()
        .expect("pjdfstest runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let summary = text
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or("no summary line")
        .to_string();
    if let Some(report) = std::env::var_os("HOARDFS_PJDFSTEST_REPORT") {
        std::fs::write(report, format!("pjdfstest on a mount: {summary}\n")).unwrap();
    }
    let failed: Vec<&str> = text.lines().filter(|l| l.ends_with("FAILED")).collect();
    assert!(
        out.status.success() && failed.is_empty() && summary.contains(" 0 failed"),
        "{}\n{summary}\n{}",
        failed.join("\n"),
        // The end of the suite's output (its failures' details).
        &text[text.char_indices().rev().nth(4000).map_or(0, |(i, _)| i)..]
    );
    // The suite ran (rather than finding nothing to do): 377 tests pass on this kernel.
    let passed: u32 = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" passed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 350, "{summary}");
    m.unmount();
}
