//! Names of cached files that outlive the mount. The cache records key files by their
//! server id only, so after a remount `cache ls` knew no name for a file until it was
//! looked up again. At unmount the client writes the names it knows to `CACHE-DIR/names`
//! (JSON lines `{"export":"<32 hex digits>","file_id":N,"path":"/a/b"}`, replaced
//! atomically); `cache ls` shows them, marked, for files not seen since mount. A name is a
//! hint: a file renamed on the server meanwhile shows its old name. Cache directories
//! without the file (written by older versions) list as before; nothing else reads it.

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use hoardfs_fs::CachedEntry;
use serde_json::{Value, json};

/// The file's name in the cache directory.
pub const FILE: &str = "names";

/// Last known path by (export id, file id).
pub type Names = HashMap<(u128, u64), String>;

/// Reads `dir/names`; a missing file or unreadable lines mean no names.
pub fn load(dir: &Path) -> Names {
    let text = std::fs::read_to_string(dir.join(FILE)).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            let export = u128::from_str_radix(v["export"].as_str()?, 16).ok()?;
            Some((
                (export, v["file_id"].as_u64()?),
                v["path"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// The names of `export` in `names`, by file id.
pub fn of_export(names: &Names, export: u128) -> HashMap<u64, String> {
    names
        .iter()
        .filter(|((e, _), _)| *e == export)
        .map(|((_, f), p)| (*f, p.clone()))
        .collect()
}

/// Rewrites `dir/names`: `export`'s entries become the cached files in `entries`, with the
/// path seen now or else the one known before; other exports' entries stay.
pub fn save(dir: &Path, export: u128, entries: &[CachedEntry]) -> std::io::Result<()> {
    let mut names = load(dir);
    let before = of_export(&names, export);
    names.retain(|(e, _), _| *e != export);
    for e in entries {
        if let Some(p) = e.path.as_ref().or_else(|| before.get(&e.file_id)) {
            names.insert((export, e.file_id), p.clone());
        }
    }
    let mut sorted: Vec<_> = names.into_iter().collect();
    sorted.sort();
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = hoardfs_cache::private::file_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    for ((export, file_id), path) in sorted {
        let line = json!({"export": format!("{export:032x}"), "file_id": file_id, "path": path});
        writeln!(f, "{line}")?;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(file_id: u64, path: Option<&str>) -> CachedEntry {
        CachedEntry {
            file_id,
            path: path.map(str::to_owned),
            bytes: 1,
            pinned: false,
            open: false,
            priority: 0,
        }
    }

    #[test]
    fn names_survive_remounts_per_export_and_forget_evicted_files() {
        let t = tempfile::tempdir().unwrap();
        assert!(load(t.path()).is_empty(), "no file: no names");
        let (a, b) = (0xa_u128 << 100, 0xb_u128);
        save(t.path(), a, &[entry(1, Some("/x")), entry(2, None)]).unwrap();
        save(t.path(), b, &[entry(1, Some("/other"))]).unwrap();
        // Remounted: file 1 not looked up yet keeps its name, 3 is new, 2 is still nameless.
        save(
            t.path(),
            a,
            &[entry(1, None), entry(2, None), entry(3, Some("/d/y z"))],
        )
        .unwrap();
        let n = load(t.path());
        assert_eq!(n.len(), 3, "{n:?}");
        assert_eq!(n[&(a, 1)], "/x");
        assert_eq!(n[&(a, 3)], "/d/y z");
        assert_eq!(n[&(b, 1)], "/other");
        // File 1 evicted: its name goes.
        save(t.path(), a, &[entry(3, None)]).unwrap();
        assert_eq!(of_export(&load(t.path()), a).len(), 1);
        // Garbage lines are skipped, not fatal.
        std::fs::write(t.path().join(FILE), "junk\n{\"export\":\"zz\"}\n").unwrap();
        assert!(load(t.path()).is_empty());
    }
}
