//! `hoardfs cache status|ls|evict|verify`: on a mount through its control socket, or on a
//! cache directory opened directly (refused while a client holds it).

use crate::error::{CliError, CliResult};
use std::path::Path;

use hoardfs_cache::CacheDir;
use serde_json::{Value, json};

use crate::control::usage_json;
use crate::tools::{CacheCommand, Control, collect_files, human, mount_of, print_usage};

/// Where a `cache` command acts.
enum Target {
    Mount(Control),
    Dir(CacheDir),
}

fn target(p: &Path) -> CliResult<Target> {
    if p.join("HOARDFS-CACHE").is_file() {
        return CacheDir::open_for_inspection(p)
            .map(Target::Dir)
            .map_err(|e| match e {
                hoardfs_cache::CacheError::Locked(_) => CliError::Failed(format!(
                    "{} is in use by a running hoardfs client: run this on its mount point",
                    p.display()
                )),
                e => CliError::Failed(e.to_string()),
            });
    }
    Ok(Target::Mount(Control::connect(&mount_of(p)?)?))
}

/// Runs a `cache` subcommand.
pub fn cache(cmd: CacheCommand) -> CliResult<()> {
    match cmd {
        CacheCommand::Status { target: t, json } => {
            let usage = match target(&t)? {
                Target::Mount(mut c) => c.call(json!({"op": "status"}))?["usage"].clone(),
                Target::Dir(d) => usage_json(&d.usage()),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&usage).expect("json"));
            } else if usage.is_null() {
                println!("this mount has no disk cache");
            } else {
                print_usage(&usage);
            }
            Ok(())
        }
        CacheCommand::Ls { target: t, json } => {
            let entries: Vec<Value> = match target(&t)? {
                Target::Mount(mut c) => c.call(json!({"op": "ls"}))?["entries"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default(),
                Target::Dir(d) => {
                    let names = crate::names::load(&t);
                    d.entries()
                        .into_iter()
                        .map(|e| {
                            let path = names.get(&(e.key.export_id, e.key.file_id));
                            json!({"file_id": e.key.file_id, "path": path,
                                   "path_from_earlier_mount": path.is_some(),
                                   "bytes": e.bytes, "pinned": e.tracked.pinned,
                                   "open": false, "priority": e.tracked.priority})
                        })
                        .collect()
                }
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&entries).expect("json"));
                return Ok(());
            }
            println!("{:>10}  {:>6}  {:>16}  PATH", "BYTES", "FLAGS", "FILE-ID");
            for e in &entries {
                let flags = format!(
                    "{}{}",
                    if e["pinned"] == json!(true) { "P" } else { "-" },
                    if e["open"] == json!(true) { "O" } else { "-" }
                );
                println!(
                    "{:>10}  {:>6}  {:>16x}  {}",
                    human(e["bytes"].as_u64().unwrap_or(0)),
                    flags,
                    e["file_id"].as_u64().unwrap_or(0),
                    match (
                        e["path"].as_str(),
                        e["path_from_earlier_mount"] == json!(true)
                    ) {
                        (Some(p), false) => p.to_owned(),
                        (Some(p), true) => format!("{p}  (name seen before this mount)"),
                        (None, _) => "(name not known)".to_owned(),
                    }
                );
            }
            println!("{} objects", entries.len());
            Ok(())
        }
        CacheCommand::Evict { paths } => {
            let (mp, files) = collect_files(&paths)?;
            let mut c = Control::connect(&mp)?;
            let (mut freed, mut failed) = (0, 0);
            for (p, ino, _) in files {
                match c.call(json!({"op": "evict", "ino": ino})) {
                    Ok(v) => freed += v["freed"].as_u64().unwrap_or(0),
                    Err(e) => {
                        eprintln!("hoardfs: {}: {e}", p.display());
                        failed += 1;
                    }
                }
            }
            println!("freed {}", human(freed));
            if failed > 0 {
                return Err(format!(
                    "{} could not be evicted",
                    crate::tools::plural(failed, "file")
                )
                .into());
            }
            Ok(())
        }
        CacheCommand::Verify { target: t } => {
            let r = match target(&t)? {
                Target::Mount(mut c) => c.call(json!({"op": "verify"}))?,
                Target::Dir(d) => {
                    let r = d.verify(&|_, _| {});
                    json!({"objects": r.objects, "chunks": r.chunks,
                           "bad_chunks": r.bad_chunks, "damaged_objects": r.damaged_objects})
                }
            };
            let n = |k: &str| r[k].as_u64().unwrap_or(0);
            println!(
                "verified {} objects, {} chunks: {} bad chunks dropped, {} damaged objects removed",
                n("objects"),
                n("chunks"),
                n("bad_chunks"),
                n("damaged_objects")
            );
            if n("bad_chunks") + n("damaged_objects") > 0 {
                return Err(
                    "the cache held corrupt data (dropped; it will be fetched again)".into(),
                );
            }
            Ok(())
        }
    }
}
