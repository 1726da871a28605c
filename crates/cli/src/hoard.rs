//! Hoard files (`mount --hoard-file FILE`), after Coda's hoard database: one path or glob per
//! line, relative to the mount root, optionally followed by a priority (default 0). Every
//! matching file is pinned, and fetched in priority order (highest first) in the
//! background once the mount is up. A matching directory means everything below it.
//!
//! ```text
//! # toolchain first, then textures
//! /opt/toolchain        100
//! /textures/**/*.png    10
//! ```

use crate::error::{CliError, CliResult};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use globset::{GlobBuilder, GlobMatcher};
use hoardfs_fs::HoardFs;

use crate::tools::{human, plural, took};

/// One line of a hoard file.
#[derive(Debug, Clone)]
pub struct HoardEntry {
    /// The pattern as written (relative to the mount root).
    pub pattern: String,
    /// Higher is fetched first.
    pub priority: u16,
}

/// Parses a hoard file.
pub fn parse(text: &str) -> CliResult<Vec<HoardEntry>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (pattern, priority) = match line.rsplit_once(char::is_whitespace) {
            Some((p, prio)) if prio.parse::<u16>().is_ok() => {
                (p.trim(), prio.parse().expect("checked"))
            }
            _ => (line, 0),
        };
        let pattern = pattern.trim_start_matches('/').to_string();
        if pattern.split('/').any(|c| c == "..") {
            return Err(format!("hoard file line {}: \"..\" is not allowed", n + 1).into());
        }
        glob(&pattern).map_err(|e| format!("hoard file line {}: {e}", n + 1))?;
        out.push(HoardEntry { pattern, priority });
    }
    out.sort_by_key(|e| std::cmp::Reverse(e.priority));
    Ok(out)
}

fn glob(pattern: &str) -> CliResult<GlobMatcher> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| CliError::Usage(e.to_string()))
}

/// The directory to walk for `pattern`: its components before the first glob character.
fn literal_prefix(pattern: &str) -> PathBuf {
    pattern
        .split('/')
        .take_while(|c| !c.contains(['*', '?', '[', '{']))
        .collect()
}

/// Files under `root` matched by `entry`: `(path, inode)`.
fn matches(root: &Path, entry: &HoardEntry) -> Vec<(PathBuf, u64)> {
    let m = match glob(&entry.pattern) {
        Ok(m) => m,
        Err(_) => return Vec::new(),
    };
    let mut out = Vec::new();
    let start = root.join(literal_prefix(&entry.pattern));
    let mut stack = vec![(start, false)];
    while let Some((p, inside)) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        let rel = p.strip_prefix(root).unwrap_or(&p);
        let hit = inside || m.is_match(rel);
        if md.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.flatten().map(|e| (e.path(), hit)));
            }
        } else if md.is_file() && hit {
            out.push((p, md.ino()));
        }
    }
    out
}

/// Pins and fetches everything the hoard file names, in priority order, on a thread.
pub fn start(fs: Arc<HoardFs>, mountpoint: PathBuf, entries: Vec<HoardEntry>) {
    let _ = std::thread::Builder::new()
        .name("hoardfs-hoard".into())
        .spawn(move || {
            let start = std::time::Instant::now();
            tracing::info!(
                "hoard: pinning and fetching what {} names",
                plural(entries.len() as u64, "hoard-file line")
            );
            let (mut files, mut bytes, mut failed, mut incomplete) = (0u64, 0u64, 0u64, 0u64);
            for e in &entries {
                for (path, ino) in matches(&mountpoint, e) {
                    let r = fs
                        .pin(ino, true, e.priority)
                        .and_then(|()| fs.prefetch(ino));
                    match r {
                        Ok(p) => {
                            files += 1;
                            bytes += p.fetched;
                            if !p.complete {
                                incomplete += 1;
                                tracing::warn!(
                                    "hoard: {}: not fully cached (no room)",
                                    path.display()
                                );
                            }
                        }
                        Err(err) => {
                            failed += 1;
                            tracing::warn!("hoard: {}: {err}", path.display());
                        }
                    }
                }
            }
            let mut tail = match failed {
                0 => String::new(),
                n => format!("; {} failed (see above)", plural(n, "file")),
            };
            if incomplete > 0 {
                tail += &format!(
                    "; {} not fully cached (no room)",
                    plural(incomplete, "file")
                );
            }
            tracing::info!(
                "hoard: pinned {}, fetched {} from the server {}{tail}",
                plural(files, "file"),
                human(bytes),
                took(bytes, start.elapsed())
            );
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hoard_lines_parse_with_priorities_and_bad_lines_are_refused() {
        let e = parse("# c\n/a/b  7\nsrc/**/*.rs\n\n/x y 3\n").unwrap();
        let got: Vec<(&str, u16)> = e.iter().map(|e| (e.pattern.as_str(), e.priority)).collect();
        assert_eq!(got, vec![("a/b", 7), ("x y", 3), ("src/**/*.rs", 0)]);
        assert!(parse("a/../../etc 1\n").is_err());
        assert!(parse("a/[b\n").is_err());
        assert_eq!(literal_prefix("src/**/*.rs"), PathBuf::from("src"));
    }
}
