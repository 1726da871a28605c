//! `--offline-writes` against a model: random sessions of every kind of change kept
//! offline, with the link cut and restored and the client killed at random points; the
//! server's tree and the mount's must match the model after each session.

mod common;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::offline::{mount_with, offline, sync};
use common::rng::Rng;
use common::tree::{Obj, Tree, join, tree_diff, tree_of};
use common::*;

const MIB: usize = 1 << 20;

fn sessions() -> u64 {
    std::env::var("HOARDFS_OFFLINE_SESSIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25)
}

/// Random sessions of every kind of change `--offline-writes` keeps — file writes,
/// appends, truncations, creations and removals; directories made, removed and renamed;
/// files and symbolic links renamed (also over other files); symbolic links made;
/// permission bits changed — with the link to the server cut and restored at random
/// points (the server keeps running), and now and then the client killed right after the
/// link comes back (in the middle of sending its changes) and mounted again. After each
/// session the server's tree must equal a model of what the client did, byte for byte,
/// and so must the mount's. `HOARDFS_OFFLINE_SESSIONS` sets the number of sessions
/// (default 25); `HOARDFS_OFFLINE_SEED` replays a seed.
#[test]
fn random_sessions_of_names_and_contents_match_a_model() {
    sessions_match_a_model(&[]);
}

/// The same with `--write-back async`: every change goes to the log first, connected or
/// not, and the keeper sends it within a second while the link is up.
#[test]
fn random_async_sessions_match_a_model() {
    sessions_match_a_model(&["--write-back", "async"]);
}

fn sessions_match_a_model(extra: &[&str]) {
    require_fuse();
    let seed = std::env::var("HOARDFS_OFFLINE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    eprintln!(
        "offline name sessions: seed {seed}, {} sessions",
        sessions()
    );
    let mut rng = Rng(seed);
    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(exp.join("d0")).unwrap();
    // Modes as the client asks for them, less this umask.
    let umask = 0o022;
    unsafe { libc::umask(umask) };
    let mut model = Tree::new();
    model.insert("d0".into(), Obj::Dir { mode: 0o755 });
    std::fs::set_permissions(
        exp.join("d0"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    for i in 0..4u64 {
        let len = 1 + rng.below(MIB as u64) as usize;
        let data = bytes(100 + i, len);
        let rel = if i % 2 == 0 {
            format!("f{i}")
        } else {
            format!("d0/f{i}")
        };
        std::fs::write(exp.join(&rel), &data).unwrap();
        std::fs::set_permissions(
            exp.join(&rel),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        model.insert(rel, Obj::File { data, mode: 0o644 });
    }
    let srv = Server::start(&exp);
    let mut link = common::link::Link::start(&srv.addr);
    let mut m = mount_with(&link.addr, t.path(), extra);
    let mut log: Vec<String> = Vec::new();
    let mut made = 0;
    let mut names_pending = 0;
    let mut cut_at = std::time::SystemTime::now();
    let cache_dir = t.path().join("cache");
    // The saved namespace as it was at the last cut (a save replaces the file).
    let mut saved_at_cut = saved_namespace(&cache_dir);
    let fail = |log: &[String], msg: String| -> ! {
        panic!(
            "seed {seed}: {msg}\nlast operations:\n{}",
            log[log.len().saturating_sub(40)..].join("\n")
        )
    };
    for session in 0..sessions() {
        // Cached whole and every directory listed (as a user prepares to go offline).
        let (ok, _, err) = tool(&["prefetch", m.path.to_str().unwrap(), "-q"]);
        if !ok {
            fail(&log, format!("prefetch: {err}"));
        }
        if let Err(e) = tree_of(&m.p("")) {
            fail(&log, format!("walking the mount: {e}"));
        }
        let ops = 5 + rng.below(20);
        for _ in 0..ops {
            let pick = |rng: &mut Rng, f: &dyn Fn(&Obj) -> bool| -> Option<String> {
                let v: Vec<&String> = model.iter().filter(|(_, o)| f(o)).map(|(p, _)| p).collect();
                (!v.is_empty()).then(|| v[rng.below(v.len() as u64) as usize].clone())
            };
            let is_file = |o: &Obj| matches!(o, Obj::File { .. });
            let is_dir = |o: &Obj| matches!(o, Obj::Dir { .. });
            let mut dirs: Vec<String> = vec![String::new()];
            dirs.extend(
                model
                    .iter()
                    .filter(|(_, o)| is_dir(o))
                    .map(|(p, _)| p.clone()),
            );
            let dir = dirs[rng.below(dirs.len() as u64) as usize].clone();
            made += 1;
            let roll = rng.below(16);
            let step = format!("s{session} op{roll}");
            let touched: Option<String> = match roll {
                0 | 1 => {
                    if link.is_up() && !extra.is_empty() {
                        // With `--write-back async` what was made while connected went
                        // through the log and is fetched back after it was sent: a user
                        // going offline syncs and prefetches first (SEMANTICS.md).
                        let (ok, err) = sync(&m, "30");
                        if !ok {
                            fail(&log, format!("sync before the cut: {err}"));
                        }
                        let (ok, _, err) = tool(&["prefetch", m.path.to_str().unwrap(), "-q"]);
                        if !ok {
                            fail(&log, format!("prefetch before the cut: {err}"));
                        }
                    }
                    if link.is_up() {
                        // A mount connected until the cut saves its names once it
                        // notices; one still waiting to reconnect since the last cut
                        // has those it saved then.
                        if stats(&m)["connected"] == true {
                            cut_at = std::time::SystemTime::now();
                            saved_at_cut = saved_namespace(&cache_dir);
                        }
                        link.cut();
                        log.push(format!("s{session} cut"));
                    } else {
                        link.restore();
                        log.push(format!("s{session} restore"));
                    }
                    None
                }
                2 | 3 => {
                    let new = join(&dir, &format!("n{made}"));
                    let data = bytes(rng.next(), rng.below(100_000) as usize);
                    log.push(format!("{step} create {new} {}", data.len()));
                    if let Err(e) = std::fs::write(m.p(&new), &data) {
                        fail(&log, format!("create {new}: {e}"));
                    }
                    model.insert(
                        new.clone(),
                        Obj::File {
                            data,
                            mode: 0o666 & !umask,
                        },
                    );
                    Some(new)
                }
                4 => {
                    let Some(victim) = pick(&mut rng, &|o| !is_dir(o)) else {
                        continue;
                    };
                    log.push(format!("{step} unlink {victim}"));
                    if let Err(e) = std::fs::remove_file(m.p(&victim)) {
                        fail(&log, format!("unlink {victim}: {e}"));
                    }
                    model.remove(&victim);
                    None
                }
                5 => {
                    let new = join(&dir, &format!("d{made}"));
                    let mode = [0o755, 0o700, 0o750][rng.below(3) as usize];
                    log.push(format!("{step} mkdir {new} {mode:o}"));
                    let r = std::os::unix::fs::DirBuilderExt::mode(
                        &mut std::fs::DirBuilder::new(),
                        mode,
                    )
                    .create(m.p(&new));
                    if let Err(e) = r {
                        fail(&log, format!("mkdir {new}: {e}"));
                    }
                    model.insert(
                        new,
                        Obj::Dir {
                            mode: mode & !umask,
                        },
                    );
                    None
                }
                6 => {
                    let empty: Vec<String> = model
                        .iter()
                        .filter(|(p, o)| {
                            is_dir(o) && !model.keys().any(|k| k.starts_with(&format!("{p}/")))
                        })
                        .map(|(p, _)| p.clone())
                        .collect();
                    if empty.is_empty() {
                        continue;
                    }
                    let victim = empty[rng.below(empty.len() as u64) as usize].clone();
                    log.push(format!("{step} rmdir {victim}"));
                    if let Err(e) = std::fs::remove_dir(m.p(&victim)) {
                        fail(&log, format!("rmdir {victim}: {e}"));
                    }
                    model.remove(&victim);
                    None
                }
                7 | 8 => {
                    let Some(src) = pick(&mut rng, &|_| true) else {
                        continue;
                    };
                    let src_dir = is_dir(&model[&src]);
                    // Over an existing file now and then (a non-directory only).
                    let over = if !src_dir && rng.below(3) == 0 {
                        pick(&mut rng, &|o| is_file(o)).filter(|d| *d != src)
                    } else {
                        None
                    };
                    let dst = match over {
                        Some(d) => d,
                        None => {
                            let dirs: Vec<&String> = dirs
                                .iter()
                                .filter(|d| {
                                    !src_dir || (**d != src && !d.starts_with(&format!("{src}/")))
                                })
                                .collect();
                            join(
                                dirs[rng.below(dirs.len() as u64) as usize],
                                &format!("r{made}"),
                            )
                        }
                    };
                    log.push(format!("{step} rename {src} {dst}"));
                    if let Err(e) = std::fs::rename(m.p(&src), m.p(&dst)) {
                        fail(&log, format!("rename {src} {dst}: {e}"));
                    }
                    let moved: Vec<(String, Obj)> = model
                        .iter()
                        .filter(|(p, _)| **p == src || p.starts_with(&format!("{src}/")))
                        .map(|(p, o)| (p.clone(), o.clone()))
                        .collect();
                    for (p, o) in moved {
                        model.remove(&p);
                        model.insert(format!("{dst}{}", &p[src.len()..]), o);
                    }
                    None
                }
                9 => {
                    let new = join(&dir, &format!("l{made}"));
                    let target = format!("target-{}", rng.below(1000));
                    log.push(format!("{step} symlink {new} -> {target}"));
                    if let Err(e) = std::os::unix::fs::symlink(&target, m.p(&new)) {
                        fail(&log, format!("symlink {new}: {e}"));
                    }
                    model.insert(new, Obj::Link(target));
                    None
                }
                10 => {
                    let Some(victim) = pick(&mut rng, &|o| !matches!(o, Obj::Link(_))) else {
                        continue;
                    };
                    let mode = match model.get_mut(&victim).unwrap() {
                        Obj::File { mode, .. } => {
                            *mode = [0o600, 0o640, 0o644, 0o755][rng.below(4) as usize];
                            *mode
                        }
                        Obj::Dir { mode } => {
                            *mode = [0o700, 0o750, 0o755][rng.below(3) as usize];
                            *mode
                        }
                        Obj::Link(_) => unreachable!(),
                    };
                    log.push(format!("{step} chmod {victim} {mode:o}"));
                    let r = std::fs::set_permissions(
                        m.p(&victim),
                        std::os::unix::fs::PermissionsExt::from_mode(mode),
                    );
                    if let Err(e) = r {
                        fail(&log, format!("chmod {victim}: {e}"));
                    }
                    None
                }
                11 => {
                    let Some(name) = pick(&mut rng, &is_file) else {
                        continue;
                    };
                    let Obj::File { data: cur, .. } = model.get_mut(&name).unwrap() else {
                        unreachable!()
                    };
                    let size = rng.below(cur.len() as u64 + 100_000) as usize;
                    log.push(format!("{step} truncate {name} {size}"));
                    let f = OpenOptions::new()
                        .write(true)
                        .open(m.p(&name))
                        .unwrap_or_else(|e| fail(&log, format!("open {name}: {e}")));
                    if let Err(e) = f.set_len(size as u64) {
                        fail(&log, format!("truncate {name}: {e}"));
                    }
                    cur.resize(size, 0);
                    Some(name)
                }
                12 => {
                    let Some(name) = pick(&mut rng, &is_file) else {
                        continue;
                    };
                    let Obj::File { data: cur, .. } = model.get_mut(&name).unwrap() else {
                        unreachable!()
                    };
                    let data = bytes(rng.next(), 1 + rng.below(50_000) as usize);
                    log.push(format!("{step} append {name} {}", data.len()));
                    let mut f = OpenOptions::new()
                        .append(true)
                        .open(m.p(&name))
                        .unwrap_or_else(|e| fail(&log, format!("open {name}: {e}")));
                    if let Err(e) = f.write_all(&data).and_then(|()| close_checked(f)) {
                        fail(&log, format!("append {name}: {e}"));
                    }
                    cur.extend_from_slice(&data);
                    Some(name)
                }
                _ => {
                    let Some(name) = pick(&mut rng, &is_file) else {
                        continue;
                    };
                    let Obj::File { data: cur, .. } = model.get_mut(&name).unwrap() else {
                        unreachable!()
                    };
                    let off = rng.below(cur.len() as u64 + 1000) as usize;
                    let data = bytes(rng.next(), 1 + rng.below(200_000) as usize);
                    log.push(format!("{step} pwrite {name} {off} {}", data.len()));
                    let f = OpenOptions::new()
                        .write(true)
                        .open(m.p(&name))
                        .unwrap_or_else(|e| fail(&log, format!("open {name}: {e}")));
                    if let Err(e) = f
                        .write_all_at(&data, off as u64)
                        .and_then(|()| close_checked(f))
                    {
                        fail(&log, format!("pwrite {name}: {e}"));
                    }
                    if cur.len() < off + data.len() {
                        cur.resize(off + data.len(), 0);
                    }
                    cur[off..off + data.len()].copy_from_slice(&data);
                    Some(name)
                }
            };
            if let Some(touched) = touched {
                let got = std::fs::read(m.p(&touched))
                    .unwrap_or_else(|e| fail(&log, format!("reading {touched} back: {e}")));
                let Obj::File { data: cur, .. } = &model[&touched] else {
                    unreachable!()
                };
                if first_diff(&got, cur).is_some() || got.len() != cur.len() {
                    fail(
                        &log,
                        format!("{touched} through the mount differs from the model"),
                    );
                }
            }
        }
        if !link.is_up() {
            match tree_of(&m.p("")) {
                Ok(seen) => {
                    if let Some(d) = tree_diff(&seen, &model) {
                        fail(
                            &log,
                            format!("offline, the mount differs from the model: {d}"),
                        );
                    }
                }
                Err(e) => fail(&log, format!("walking the mount offline: {e}")),
            }
        }
        names_pending += offline(&m)["pending_files"].as_u64().unwrap_or(0);
        if !link.is_up() && rng.below(4) == 0 {
            // Killed while offline, mounted again with the server still unreachable: the
            // names saved at the disconnection and the log show the same tree.
            log.push(format!("s{session} kill -9 and remount offline"));
            // The mount saves its names once it notices the disconnection.
            if !wait_until(Duration::from_secs(10), || stats(&m)["connected"] == false) {
                fail(&log, "the mount does not notice the cut".into());
            }
            // A file other than the one there at the cut, and not from before it. (File
            // times are coarse, a few ms behind the clock: a save right after the cut may
            // carry a time just before it.)
            let saved_since = || {
                saved_namespace(&cache_dir).is_some_and(|now| {
                    Some(&now) != saved_at_cut.as_ref()
                        && now.1 + Duration::from_millis(50) >= cut_at
                })
            };
            // (Within a few of its one-second ticks, and before any kill: what a user
            // who restarts offline relies on.)
            if !wait_until(Duration::from_secs(5), saved_since) {
                fail(&log, "the mount does not save its names at the cut".into());
            }
            m.kill9();
            m = mount_with(&link.addr, t.path(), extra);
            match tree_of(&m.p("")) {
                Ok(seen) => {
                    if let Some(d) = tree_diff(&seen, &model) {
                        fail(&log, format!("remounted offline, the mount differs: {d}"));
                    }
                }
                Err(e) => fail(&log, format!("walking the mount remounted offline: {e}")),
            }
        }
        link.restore();
        if rng.below(4) == 0 {
            // Killed while (perhaps) sending its changes back; mounted again.
            log.push(format!("s{session} kill -9 and remount"));
            m.kill9();
            m = mount_with(&link.addr, t.path(), extra);
        }
        let (ok, err) = sync(&m, "60");
        if !ok {
            fail(&log, format!("sync: {err}"));
        }
        let on_server = tree_of(&exp).unwrap();
        if let Some(d) = tree_diff(&on_server, &model) {
            fail(&log, format!("the server differs from the model: {d}"));
        }
        let o = offline(&m);
        if o["pending_files"] != 0 || o["conflicts"] != 0 {
            fail(&log, format!("after sync: {o}"));
        }
        let mut last = String::new();
        let same =
            hoardfs_testutil::wait_until(Duration::from_secs(10), || match tree_of(&m.p("")) {
                Ok(seen) => {
                    last = tree_diff(&seen, &model).unwrap_or_default();
                    last.is_empty()
                }
                Err(e) => {
                    last = e.to_string();
                    false
                }
            });
        if !same {
            fail(
                &log,
                format!("after sync, the mount differs from the model: {last}"),
            );
        }
    }
    assert!(
        names_pending > 0,
        "no session ended with changes kept offline"
    );
    eprintln!("offline name sessions: {names_pending} change(s) pending at session ends");
    m.unmount();
}

/// The namespace file saved in `cache` (not a save in progress: its temporary file), as
/// inode, modification time and size, if there is one.
fn saved_namespace(cache: &std::path::Path) -> Option<(u64, std::time::SystemTime, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(cache).ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("namespace-") || name.contains('.') {
            return None;
        }
        let md = e.metadata().ok()?;
        Some((md.ino(), md.modified().ok()?, md.len()))
    })
}
