//! A tree model for the randomized suites: paths relative to a root and what they are
//! (files with content and mode, directories with mode, symbolic links with their
//! target), read from a directory (a mount or an export) and compared.

use std::path::Path;

use super::first_diff;

/// One object of a tree model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Obj {
    /// A regular file: its content and permission bits.
    File { data: Vec<u8>, mode: u32 },
    /// A directory and its permission bits.
    Dir { mode: u32 },
    /// A symbolic link and its target.
    Link(String),
}

/// Paths relative to the root ("a", "a/b") and what they are.
pub type Tree = std::collections::BTreeMap<String, Obj>;

pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The tree under `root` as it is on disk (or through a mount).
pub fn tree_of(root: &Path) -> std::io::Result<Tree> {
    use std::os::unix::fs::PermissionsExt;
    let mut tree = Tree::new();
    let mut dirs = vec![String::new()];
    while let Some(dir) = dirs.pop() {
        let listed = std::fs::read_dir(root.join(&dir))
            .map_err(|e| std::io::Error::new(e.kind(), format!("listing {dir}: {e}")))?;
        for e in listed {
            let e = e.map_err(|e| std::io::Error::new(e.kind(), format!("listing {dir}: {e}")))?;
            let rel = join(&dir, &e.file_name().into_string().unwrap());
            let at = |op: &str| {
                let rel = rel.clone();
                let op = op.to_owned();
                move |e: std::io::Error| std::io::Error::new(e.kind(), format!("{op} {rel}: {e}"))
            };
            let md = std::fs::symlink_metadata(root.join(&rel)).map_err(at("lstat"))?;
            let mode = md.permissions().mode() & 0o7777;
            let obj = if md.file_type().is_symlink() {
                Obj::Link(
                    std::fs::read_link(root.join(&rel))
                        .map_err(at("readlink"))?
                        .to_string_lossy()
                        .into_owned(),
                )
            } else if md.is_dir() {
                dirs.push(rel.clone());
                Obj::Dir { mode }
            } else {
                Obj::File {
                    data: std::fs::read(root.join(&rel)).map_err(at("read"))?,
                    mode,
                }
            };
            tree.insert(rel, obj);
        }
    }
    Ok(tree)
}

/// The first difference between two trees, described.
pub fn tree_diff(got: &Tree, want: &Tree) -> Option<String> {
    for (p, w) in want {
        match got.get(p) {
            None => return Some(format!("{p} is missing")),
            Some(g) if g != w => {
                return Some(match (g, w) {
                    (Obj::File { data: a, mode: ma }, Obj::File { data: b, mode: mb }) => {
                        format!(
                            "{p}: {} bytes mode {ma:o}, want {} bytes mode {mb:o} (first \
                             difference at {:?})",
                            a.len(),
                            b.len(),
                            first_diff(a, b)
                        )
                    }
                    _ => format!("{p} is {g:?}, want {w:?}"),
                });
            }
            Some(_) => {}
        }
    }
    got.keys()
        .find(|p| !want.contains_key(*p))
        .map(|p| format!("{p} should not be there"))
}
