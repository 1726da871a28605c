//! The cache directory is private to the user who mounts: cached bytes carry none of the
//! origin's per-file permissions, and the directory also holds the record of which server
//! to trust. So a cache directory that others could read, write or replace is refused
//! (as OpenSSH's `StrictModes` and cachefilesd refuse theirs), and everything made inside
//! is made private: directories 0700, files 0600, never through a symbolic link.

use std::fs::{DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

/// Why a directory is not private enough.
#[derive(Debug, thiserror::Error)]
pub enum NotPrivate {
    /// It is a symbolic link, or not a directory.
    #[error("{path} is not a directory (a symbolic link or another kind of file): {fix}")]
    NotADirectory {
        /// The path.
        path: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// Another user owns it.
    #[error(
        "{path} belongs to uid {owner}, not to uid {me} who mounts: whoever owns it can read \
         the cached files and choose the server this mount trusts (chown {me} {path}, or \
         use another directory)"
    )]
    Foreign {
        /// The path.
        path: String,
        /// Its owner.
        owner: u32,
        /// Who mounts.
        me: u32,
    },
    /// Group or others may access it.
    #[error(
        "{path} has mode {mode:o}: group and others must have no access to a cache directory \
         (cached files keep none of the origin's permissions), run chmod 700 {path}"
    )]
    Open {
        /// The path.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
    /// It cannot be examined.
    #[error("cannot examine {path}: {source}")]
    Io {
        /// The path.
        path: String,
        /// The cause.
        source: io::Error,
    },
}

/// Checks that `dir` is a directory (not a symbolic link) owned by this process's
/// effective user, with no permission for group or others.
pub fn check_dir(dir: &Path) -> Result<(), NotPrivate> {
    let path = dir.display().to_string();
    let md = std::fs::symlink_metadata(dir).map_err(|source| NotPrivate::Io {
        path: path.clone(),
        source,
    })?;
    if !md.file_type().is_dir() {
        return Err(NotPrivate::NotADirectory {
            path,
            fix: "give --cache-dir a real directory",
        });
    }
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if md.uid() != me {
        return Err(NotPrivate::Foreign {
            path,
            owner: md.uid(),
            me,
        });
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(NotPrivate::Open { path, mode });
    }
    Ok(())
}

/// Creates `dir` and its missing parents, each new one mode 0700.
pub fn create_dir_all(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Options for a file inside the cache: mode 0600 when created, and never opened through
/// a symbolic link.
pub fn file_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
    o
}

/// Writes `data` to a new or truncated private file `path` ([`file_options`]).
pub fn write(path: &Path, data: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = file_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    f.write_all(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_a_private_directory_of_ones_own_passes() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("c");
        create_dir_all(&d.join("a/b")).unwrap();
        for p in [d.clone(), d.join("a"), d.join("a/b")] {
            assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o700);
        }
        check_dir(&d).unwrap();
        for (mode, refused) in [(0o750, true), (0o705, true), (0o770, true), (0o700, false)] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(check_dir(&d).is_err(), refused, "{mode:o}");
        }
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        assert!(matches!(
            check_dir(&link),
            Err(NotPrivate::NotADirectory { .. })
        ));
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&d, Some(4321), None).unwrap();
            let e = check_dir(&d).unwrap_err();
            assert!(matches!(e, NotPrivate::Foreign { owner: 4321, .. }));
            assert!(e.to_string().contains("chown"), "{e}");
        }
    }

    #[test]
    fn files_are_private_and_never_opened_through_a_link() {
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("f");
        write(&f, b"x").unwrap();
        assert_eq!(std::fs::metadata(&f).unwrap().mode() & 0o777, 0o600);
        let elsewhere = t.path().join("elsewhere");
        std::fs::write(&elsewhere, b"keep").unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let e = write(&link, b"overwritten").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
        assert_eq!(std::fs::read(&elsewhere).unwrap(), b"keep");
    }
}
