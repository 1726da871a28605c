//! `hoardfs prefetch`, `pin` and `unpin`: walk the given paths on a mount and ask its client
//! (over the control socket, several connections in parallel) to fetch each file into the
//! cache and/or pin it, with a progress bar (files, bytes, rate, ETA) and a summary.

use crate::error::{CliError, CliResult};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;

use crate::tools::{Control, collect_files, human, plural, took};

/// Options of `hoardfs prefetch` (and the common part of `hoardfs pin`).
#[derive(Args, Debug)]
pub struct PrefetchArgs {
    /// Files or directories (recursive) on a hoardfs mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Files fetched in parallel.
    #[arg(long, default_value_t = 4)]
    pub jobs: usize,
    /// No progress bar.
    #[arg(long, short)]
    pub quiet: bool,
}

/// Options of `hoardfs pin`.
#[derive(Args, Debug)]
pub struct PinArgs {
    #[command(flatten)]
    pub files: PrefetchArgs,
    /// Hoard priority of the pinned files (kept in the cache record; hoard files fetch
    /// higher priorities first).
    #[arg(long, default_value_t = 0)]
    pub priority: u16,
    /// Only pin, do not fetch now (the files are cached as they are read).
    #[arg(long)]
    pub no_fetch: bool,
}

/// How `hoardfs pin` pins.
struct Pin {
    priority: u16,
    fetch: bool,
}

/// `hoardfs prefetch`.
pub fn prefetch(a: PrefetchArgs) -> CliResult<()> {
    run(a, None)
}

/// `hoardfs pin`.
pub fn pin(a: PinArgs) -> CliResult<()> {
    let pin = Pin {
        priority: a.priority,
        fetch: !a.no_fetch,
    };
    run(a.files, Some(pin))
}

/// Options of `hoardfs unpin`.
#[derive(Args, Debug)]
pub struct UnpinArgs {
    /// Files or directories (recursive) on a hoardfs mount.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
}

/// Fetches (prefetch, or pin unless --no-fetch) and/or pins the files.
fn run(a: PrefetchArgs, pin: Option<Pin>) -> CliResult<()> {
    let (mp, files) = collect_files(&a.paths)?;
    let total_bytes: u64 = files.iter().map(|f| f.2).sum();
    let fetch = pin.as_ref().is_none_or(|p| p.fetch);
    let bar = if a.quiet || !fetch {
        ProgressBar::with_draw_target(Some(total_bytes), ProgressDrawTarget::hidden())
    } else {
        ProgressBar::new(total_bytes)
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
        )
        .expect("template")
        .progress_chars("=> "),
    );
    let n_files = files.len() as u64;
    let queue = Mutex::new(files.into_iter());
    let (done, fetched, failed) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let start = Instant::now();
    let worker = || -> CliResult<()> {
        let mut c = Control::connect(&mp)?;
        loop {
            let Some((path, ino, size)) = queue.lock().expect("queue").next() else {
                return Ok(());
            };
            let mut result = Ok(());
            if let Some(p) = &pin {
                result = c
                    .call(json!({"op": "pin", "ino": ino, "priority": p.priority}))
                    .map(|_| ());
            }
            if fetch && result.is_ok() {
                result = c.call(json!({"op": "prefetch", "ino": ino})).map(|v| {
                    fetched.fetch_add(v["fetched"].as_u64().unwrap_or(0), Relaxed);
                    if v["complete"] != json!(true) {
                        bar.suspend(|| {
                            eprintln!("hoardfs: {}: not fully cached (no room)", path.display())
                        });
                    }
                });
            }
            if let Err(e) = result {
                failed.fetch_add(1, Relaxed);
                bar.suspend(|| eprintln!("hoardfs: {}: {e}", path.display()));
            }
            let d = done.fetch_add(1, Relaxed) + 1;
            bar.set_message(format!("{d}/{n_files} files"));
            bar.inc(size);
        }
    };
    let errors: Vec<CliError> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.jobs.max(1)).map(|_| s.spawn(worker)).collect();
        hs.into_iter()
            .filter_map(|h| h.join().expect("worker").err())
            .collect()
    });
    bar.finish_and_clear();
    if let Some(e) = errors.into_iter().next() {
        return Err(e);
    }
    let f = fetched.load(Relaxed);
    let from_server = if fetch {
        format!(" ({} from the server)", human(f))
    } else {
        String::new()
    };
    println!(
        "{} {}, {}{from_server} {}",
        if pin.is_some() {
            "pinned"
        } else {
            "prefetched"
        },
        plural(done.load(Relaxed) - failed.load(Relaxed), "file"),
        human(total_bytes),
        took(f, start.elapsed())
    );
    match failed.load(Relaxed) {
        0 => Ok(()),
        n => Err(format!("{} failed", plural(n, "file")).into()),
    }
}

/// `hoardfs unpin`.
pub fn unpin(a: UnpinArgs) -> CliResult<()> {
    let (mp, files) = collect_files(&a.paths)?;
    let mut c = Control::connect(&mp)?;
    for (path, ino, _) in &files {
        c.call(json!({"op": "unpin", "ino": ino}))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    println!("unpinned {}", plural(files.len() as u64, "file"));
    Ok(())
}
