//! Running hoardfs like any Linux file system: plain log lines and log files, errors that
//! say what to do, tool summaries, completions and man pages.

mod common;

use std::process::Command;

use common::*;

/// Runs `hoardfs ARGS` with the environment variable `HOARDFS_LOG=debug`; returns
/// (success, stderr).
fn run_logged(args: &[&str]) -> (bool, String) {
    let out = Command::new(bin())
        .args(args)
        .env("HOARDFS_LOG", "debug")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_refused_credential_is_one_plain_line_and_both_sides_can_log_to_files() {
    require_fuse();
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let (good, bad) = (t.path().join("good"), t.path().join("bad"));
    std::fs::write(&good, "correct horse\n").unwrap();
    std::fs::write(&bad, "battery staple\n").unwrap();
    let server_log = t.path().join("serve.log");
    std::fs::write(&server_log, "an earlier line\n").unwrap();
    let srv = Server::start_args(
        &exp,
        &[
            "--token-file",
            good.to_str().unwrap(),
            "--log-file",
            server_log.to_str().unwrap(),
        ],
    );
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let (cache, mnt_s) = (t.path().join("cache"), mnt.to_str().unwrap());
    let args = [
        "mount",
        &srv.addr,
        mnt_s,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--token-file",
        bad.to_str().unwrap(),
    ];
    let (ok, _, err) = tool(&args);
    assert!(!ok, "a wrong token must not mount");
    assert_eq!(
        err.lines().count(),
        1,
        "one line, nothing before it: {err:?}"
    );
    assert!(
        err.starts_with("hoardfs: ") && err.contains("refused our credential"),
        "{err:?}"
    );
    assert!(!err.contains('\x1b'), "colour codes on a pipe: {err:?}");
    // The server logged the refusal to its file, appended, without colour, one event a line.
    assert_soon("the server logs the refusal", || {
        let log = std::fs::read_to_string(&server_log).unwrap();
        log.contains("refused a credential")
            .then_some(())
            .ok_or(log)
    });
    let log = std::fs::read_to_string(&server_log).unwrap();
    assert!(log.starts_with("an earlier line\n"), "not appended: {log}");
    assert!(!log.contains('\x1b'), "colour codes in a log file: {log}");
    for line in log.lines().skip(1) {
        assert!(
            line.starts_with(|c: char| c.is_ascii_digit()),
            "not one timestamped line per event: {line:?}"
        );
    }
    // A failed mount logs its error to its own log file, and still says it on stderr.
    let mount_log = t.path().join("mount.log");
    let mut with_log = args.to_vec();
    with_log.extend(["--log-file", mount_log.to_str().unwrap()]);
    let (ok, _, err) = tool(&with_log);
    assert!(!ok);
    assert!(err.contains("refused our credential"), "{err}");
    let log = std::fs::read_to_string(&mount_log).unwrap();
    assert!(
        log.contains("ERROR") && log.contains("refused our credential"),
        "{log}"
    );
    // Debug logging on a pipe is plain text too.
    let (ok, err) = run_logged(&args);
    assert!(!ok);
    assert!(err.contains("DEBUG"), "no debug lines: {err}");
    assert!(!err.contains('\x1b'), "colour codes on a pipe: {err}");
}
