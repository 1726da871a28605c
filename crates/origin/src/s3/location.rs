//! `s3://BUCKET[/PREFIX]` and how file-system paths map to keys.
//!
//! A path `a/b/c` below the mount is the key `PREFIX/a/b/c`; a directory `a/b` is every
//! key starting with `PREFIX/a/b/` (and, if present, the empty marker object `PREFIX/a/b/`
//! that `mkdir` creates). Names that cannot be a path component (empty, `.`, `..`, with a
//! NUL) are never shown, and names that are not UTF-8 cannot be created.

/// A bucket and a key prefix (empty, or ending with `/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    /// Bucket name.
    pub bucket: String,
    /// Key prefix of the mount's root: empty or ending with `/`.
    pub prefix: String,
}

impl S3Location {
    /// Parses `s3://BUCKET[/PREFIX]`; `None` if `s` is not an `s3://` URL at all.
    pub fn parse(s: &str) -> Option<Result<S3Location, String>> {
        let rest = s.strip_prefix("s3://")?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty()
            || bucket.len() > 63
            || !bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b))
        {
            return Some(Err(format!(
                "{s:?}: not a bucket name (lowercase letters, digits, '-', '.', '_')"
            )));
        }
        let prefix = prefix.trim_matches('/');
        if prefix
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            && !prefix.is_empty()
        {
            return Some(Err(format!(
                "{s:?}: the prefix has an empty, '.' or '..' component"
            )));
        }
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        Some(Ok(S3Location {
            bucket: bucket.to_string(),
            prefix,
        }))
    }

    /// The key of the object at `path` (relative to the root; never empty for files).
    pub fn key(&self, path: &str) -> String {
        format!("{}{path}", self.prefix)
    }

    /// The key prefix of the directory at `path` (`""` = the root).
    pub fn dir_prefix(&self, path: &str) -> String {
        if path.is_empty() {
            self.prefix.clone()
        } else {
            format!("{}{path}/", self.prefix)
        }
    }

    /// The path of the directory whose key prefix is `prefix` ([`S3Location::dir_prefix`]
    /// undone); `None` outside the root.
    pub fn dir_path(&self, prefix: &str) -> Option<String> {
        prefix
            .strip_prefix(self.prefix.as_str())
            .map(|p| p.trim_end_matches('/').to_string())
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.prefix)
    }
}

/// A file-system name that can stand for a key component (at most NAME_MAX bytes: a
/// longer key component cannot be shown, so it is left out of listings).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains(['/', '\0'])
}

/// Joins a directory path and a name.
pub fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The parent path and last name of `path` (`("", path)` at the top).
pub fn split(path: &str) -> (&str, &str) {
    path.rsplit_once('/').unwrap_or(("", path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_into_bucket_and_prefix() {
        let l = S3Location::parse("s3://data/a/b/").unwrap().unwrap();
        assert_eq!((l.bucket.as_str(), l.prefix.as_str()), ("data", "a/b/"));
        assert_eq!(l.key("x/y"), "a/b/x/y");
        assert_eq!(l.dir_prefix(""), "a/b/");
        assert_eq!(l.dir_prefix("x"), "a/b/x/");
        let r = S3Location::parse("s3://data").unwrap().unwrap();
        assert_eq!(r.prefix, "");
        assert_eq!(r.key("f"), "f");
        assert!(S3Location::parse("/local/dir").is_none());
        assert!(S3Location::parse("s3://").unwrap().is_err());
        assert!(S3Location::parse("s3://Bad_Bucket").unwrap().is_err());
        assert!(S3Location::parse("s3://b/a/../c").unwrap().is_err());
        assert!(S3Location::parse("s3://b/a//c").unwrap().is_err());
    }

    #[test]
    fn names_and_paths() {
        assert!(valid_name("a.txt"));
        for bad in ["", ".", "..", "a/b", "a\0", &"x".repeat(256)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name(&"x".repeat(255)));
        assert_eq!(join("", "a"), "a");
        assert_eq!(join("a", "b"), "a/b");
        assert_eq!(split("a/b/c"), ("a/b", "c"));
        assert_eq!(split("c"), ("", "c"));
    }
}
