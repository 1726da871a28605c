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
    let mut args = vec![
        "mount",
        &srv.addr,
        mnt_s,
        "--cache-dir",
        cache.to_str().unwrap(),
        "--token-file",
        bad.to_str().unwrap(),
    ];
    // Or a nearly full disk would add its warning to the one line.
    args.extend(HOST_INDEPENDENT_THRESHOLDS);
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
    // The same as a mount option (fstab).
    let opt_log = t.path().join("opt.log");
    let mut with_opt = args.to_vec();
    let opt = format!("log_file={}", opt_log.display());
    with_opt.extend(["-o", &opt]);
    let (ok, _, _) = tool(&with_opt);
    assert!(!ok);
    let log = std::fs::read_to_string(&opt_log).unwrap();
    assert!(log.contains("refused our credential"), "{log}");
    // Debug logging on a pipe is plain text too.
    let (ok, err) = run_logged(&args);
    assert!(!ok);
    assert!(err.contains("DEBUG"), "no debug lines: {err}");
    assert!(!err.contains('\x1b'), "colour codes on a pipe: {err}");
}

/// `t/export` holding `files` (relative path, content).
fn export_of(t: &tempfile::TempDir, files: &[(&str, &[u8])]) -> std::path::PathBuf {
    let exp = t.path().join("export");
    for (rel, content) in files {
        let p = exp.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }
    exp
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn mount_errors_say_what_to_do_and_leave_nothing_behind() {
    let t = scratch();
    let mnt = t.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mnt_s = mnt.to_str().unwrap();
    let cache = t.path().join("new/cache");
    let cache_s = cache.to_str().unwrap();
    let fails = |source: &str, cache: &str| {
        let mut args = vec!["mount", source, mnt_s, "--cache-dir", cache];
        args.extend(HOST_INDEPENDENT_THRESHOLDS);
        let (ok, _, err) = tool(&args);
        assert!(!ok, "mount {source} succeeded");
        assert_eq!(err.lines().count(), 1, "{err}");
        err
    };
    // A stopped server: say how to start one, and create no cache directory.
    let addr = format!("127.0.0.1:{}", closed_port());
    let err = fails(&addr, cache_s);
    assert!(err.contains("Is `hoardfs serve` running"), "{err}");
    assert!(
        !t.path().join("new").exists(),
        "a failed mount left the cache directory it created"
    );
    // A bad address names the expected form; a missing port means 7070.
    let err = fails("127.0.0.1:http", cache_s);
    assert!(err.contains("HOST:PORT") && err.contains("7070"), "{err}");
    let (ok, _, err) = tool(&["server-stats", "127.0.0.1:"]);
    assert!(!ok && err.contains("HOST:PORT"), "{err}");
    // A relative local source: the absolute path to use instead.
    let err = fails("export/dir", cache_s);
    assert!(
        err.contains("must be absolute") && err.contains("/export/dir"),
        "{err}"
    );
    // A cache directory that is a file.
    let file = t.path().join("file");
    std::fs::write(&file, b"x").unwrap();
    let err = fails(&addr, file.to_str().unwrap());
    assert!(err.contains("is a file, not a directory"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
    assert!(!t.path().join("new").exists());
}

#[test]
fn tools_tell_another_user_to_run_as_the_mounting_one_and_stale_sockets_go() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    require_fuse();
    let t = scratch();
    // Others must reach the mount point to ask about it.
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    std::fs::write(exp.join("f"), b"data").unwrap();
    // A socket left by a client killed long ago, in root's control socket directory.
    std::fs::create_dir_all("/run/hoardfs").unwrap();
    let stale = std::path::Path::new("/run/hoardfs")
        .join(format!("test-stale-{}.sock", std::process::id()));
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let st = Command::new("touch")
        .args(["-h", "-d", "1 hour ago"])
        .arg(&stale)
        .status()
        .unwrap();
    assert!(st.success());
    let m = Mount::with_cache(
        exp.to_str().unwrap(),
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    assert!(!stale.exists(), "the stale control socket was not removed");
    let out = Command::new(bin())
        .args(["stats", m.path.to_str().unwrap()])
        .uid(65534)
        .gid(65534)
        .env("XDG_RUNTIME_DIR", "/nonexistent")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("was mounted by uid 0") && err.contains("run this command as uid 0"),
        "{err}"
    );
    m.unmount();
}

#[test]
fn pin_without_fetch_and_summaries_read_well_and_stats_sees_a_server_return() {
    require_fuse();
    let t = scratch();
    let exp = export_of(&t, &[("d/a", b"aaaa"), ("d/b", b"bbbb")]);
    let mut srv = Server::start(&exp);
    let m = Mount::with_cache(
        &srv.addr,
        &t.path().join("mnt"),
        &t.path().join("cache"),
        &[],
    );
    let a = m.p("d/a");
    let a = a.to_str().unwrap();
    // prefetch has no pin options; pin --no-fetch pins without fetching.
    for flag in ["--no-fetch", "--priority=3"] {
        let (ok, _, err) = tool(&["prefetch", a, flag]);
        assert!(!ok && err.contains("unexpected argument"), "{flag}: {err}");
    }
    let (ok, out, err) = tool(&["pin", a, "--no-fetch", "--priority", "3", "--quiet"]);
    assert!(ok, "{err}");
    assert_eq!(counter(&m, "bytes_from_network"), 0, "--no-fetch fetched");
    assert!(out.starts_with("pinned 1 file, 4 B in "), "{out}");
    assert!(!out.contains("/s") && !out.contains("server"), "{out}");
    let (ok, out, err) = tool(&["prefetch", m.p("d").to_str().unwrap(), "--quiet"]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("prefetched 2 files, 8 B (8 B from the server) in "),
        "{out}"
    );
    let (ok, out, _) = tool(&["unpin", a]);
    assert!(ok && out.trim() == "unpinned 1 file", "{out}");
    // The server goes away and comes back: stats alone notices both.
    let addr = srv.addr.clone();
    srv.kill();
    assert_soon("stats shows the server gone", || {
        let s = stats(&m);
        (s["connected"] == false).then_some(()).ok_or(s.to_string())
    });
    let _srv = Server::start_at(&exp, &addr, &[]);
    assert_soon("stats shows the server back", || {
        let s = stats(&m);
        (s["connected"] == true).then_some(()).ok_or(s.to_string())
    });
    let (ok, out, _) = tool(&["stats", m.path.to_str().unwrap()]);
    assert!(
        ok && out.lines().next().unwrap().ends_with(": connected"),
        "{out}"
    );
    m.unmount();
}

#[test]
fn completions_and_man_pages_come_from_the_command_line_definitions() {
    for (shell, marker) in [
        ("bash", "_hoardfs()"),
        ("zsh", "#compdef hoardfs"),
        ("fish", "complete -c hoardfs"),
    ] {
        let (ok, out, err) = tool(&["completions", shell]);
        assert!(ok, "{shell}: {err}");
        assert!(out.contains(marker), "{shell}: {out}");
        assert!(
            out.contains("cache-dir") && out.contains("prefetch"),
            "{shell}"
        );
    }
    let (ok, _, err) = tool(&["completions", "cmd.exe"]);
    assert!(!ok && err.contains("possible values"), "{err}");
    let t = scratch();
    let dir = t.path().join("man/man1");
    let (ok, out, err) = tool(&["man", dir.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("wrote ") && out.contains(" man pages to "),
        "{out}"
    );
    for page in [
        "hoardfs",
        "hoardfs-mount",
        "hoardfs-serve",
        "hoardfs-cache-ls",
        "hoardfs-token-add",
    ] {
        let text = std::fs::read_to_string(dir.join(format!("{page}.1")))
            .unwrap_or_else(|e| panic!("{page}.1: {e}"));
        assert!(text.contains(".TH "), "{page}.1 is not a man page");
    }
    let mount = std::fs::read_to_string(dir.join("hoardfs-mount.1")).unwrap();
    assert!(mount.contains("\\-\\-cache\\-dir") && mount.contains(".SH EXAMPLES\n.nf\n"));
    assert!(
        mount.contains("hoardfs mount fileserver:7070 /mnt/data \\-\\-cache\\-dir"),
        "examples are kept line by line"
    );
}

#[test]
fn cache_ls_keeps_names_across_remounts() {
    require_fuse();
    let t = scratch();
    let exp = export_of(&t, &[("d/a b", b"aaaa")]);
    let srv = Server::start(&exp);
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let ls = |target: &std::path::Path| {
        let (ok, out, err) = tool(&["cache", "ls", target.to_str().unwrap()]);
        assert!(ok, "{err}");
        out
    };
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    assert_eq!(std::fs::read(m.p("d/a b")).unwrap(), b"aaaa");
    let out = ls(&m.path);
    assert!(out.contains("/d/a b\n"), "{out}");
    m.unmount();
    // The cache directory alone, and a new mount before the name is looked up again.
    let out = ls(&cache);
    assert!(
        out.contains("/d/a b  (name seen before this mount)"),
        "{out}"
    );
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    let (ok, out, _) = tool(&["cache", "ls", m.path.to_str().unwrap(), "--json"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["path"], "/d/a b", "{v}");
    assert_eq!(v[0]["path_from_earlier_mount"], true, "{v}");
    std::fs::metadata(m.p("d/a b")).unwrap();
    let out = ls(&m.path);
    assert!(out.contains("/d/a b\n"), "seen again: {out}");
    m.unmount();
}

#[test]
fn cache_thresholds_without_a_cache_are_refused() {
    let t = scratch();
    let dir = t.path().to_str().unwrap();
    let (ok, _, err) = tool(&["serve", dir, "--bcull", "5", "--listen", "127.0.0.1:0"]);
    assert!(!ok, "serve took thresholds for a cache it does not have");
    assert!(
        err.contains("thresholds of the tier's cache (with --origin)"),
        "{err}"
    );
}
