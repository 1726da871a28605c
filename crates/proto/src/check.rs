//! Limits on names and values that each end enforces on what the other sends: the server
//! on requests before it runs them, the client on replies before it uses them.

use crate::WireError;

/// Longest file name (one path component), Linux's `NAME_MAX`.
pub const NAME_MAX: usize = 255;
/// Longest symlink target, Linux's `PATH_MAX` less its terminating NUL.
pub const PATH_MAX: usize = 4095;
/// Longest extended attribute name, Linux's `XATTR_NAME_MAX`.
pub const XATTR_NAME_MAX: usize = 255;
/// Largest extended attribute value, Linux's `XATTR_SIZE_MAX`.
pub const XATTR_SIZE_MAX: usize = 65536;
/// Largest extended attribute name list, Linux's `XATTR_LIST_MAX`.
pub const XATTR_LIST_MAX: usize = 65536;

/// Checks that `name` is one plain path component: not empty, not `.` or `..`, without `/`
/// or NUL, at most [`NAME_MAX`] bytes. The errors are those a local directory gives
/// (`Invalid`, `NameTooLong`), checked in the same order.
pub fn check_name(name: &[u8]) -> Result<(), WireError> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
        return Err(WireError::Invalid);
    }
    if name.len() > NAME_MAX {
        return Err(WireError::NameTooLong);
    }
    if name.contains(&0) {
        return Err(WireError::Invalid);
    }
    Ok(())
}

/// Checks a symlink target: not empty, without NUL, at most [`PATH_MAX`] bytes.
pub fn check_target(target: &[u8]) -> Result<(), WireError> {
    if target.len() > PATH_MAX {
        return Err(WireError::NameTooLong);
    }
    if target.is_empty() || target.contains(&0) {
        return Err(WireError::Invalid);
    }
    Ok(())
}

/// Checks an extended attribute name list (`listxattr`): at most [`XATTR_LIST_MAX`] bytes
/// of names, each non-empty, at most [`XATTR_NAME_MAX`] bytes and followed by a NUL.
pub fn check_xattr_list(list: &[u8]) -> Result<(), WireError> {
    if list.len() > XATTR_LIST_MAX {
        return Err(WireError::Range);
    }
    let Some(names) = list.strip_suffix(&[0]) else {
        return if list.is_empty() {
            Ok(())
        } else {
            Err(WireError::Invalid)
        };
    };
    for name in names.split(|&b| b == 0) {
        if name.is_empty() || name.len() > XATTR_NAME_MAX {
            return Err(WireError::Invalid);
        }
    }
    Ok(())
}

impl crate::Timestamp {
    /// The same time with nanoseconds brought into `0..1e9` (an out-of-range value is
    /// clamped to the last nanosecond of its second, never carried into the seconds, so
    /// this cannot overflow).
    pub fn clamped(self) -> crate::Timestamp {
        crate::Timestamp {
            secs: self.secs,
            nanos: self.nanos.min(999_999_999),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name(b"a"), Ok(()));
        assert_eq!(check_name(&[b'y'; 255]), Ok(()));
        assert_eq!(check_name(b"..."), Ok(()));
        for bad in [&b""[..], b".", b"..", b"a/b", b"/", b"a\0b"] {
            assert_eq!(check_name(bad), Err(WireError::Invalid), "{bad:?}");
        }
        assert_eq!(check_name(&[b'y'; 256]), Err(WireError::NameTooLong));
    }

    #[test]
    fn targets() {
        assert_eq!(check_target(b"../x/y"), Ok(()));
        assert_eq!(check_target(&[b'a'; 4095]), Ok(()));
        assert_eq!(check_target(&[b'a'; 4096]), Err(WireError::NameTooLong));
        assert_eq!(check_target(b""), Err(WireError::Invalid));
        assert_eq!(check_target(b"a\0b"), Err(WireError::Invalid));
    }

    #[test]
    fn xattr_lists() {
        assert_eq!(check_xattr_list(b""), Ok(()));
        assert_eq!(check_xattr_list(b"user.a\0user.b\0"), Ok(()));
        assert_eq!(check_xattr_list(b"user.a"), Err(WireError::Invalid));
        assert_eq!(check_xattr_list(b"\0"), Err(WireError::Invalid));
        assert_eq!(check_xattr_list(b"user.a\0\0"), Err(WireError::Invalid));
        let mut long = vec![b'u'; 256];
        long.push(0);
        assert_eq!(check_xattr_list(&long), Err(WireError::Invalid));
        assert_eq!(check_xattr_list(&vec![0; 65537]), Err(WireError::Range));
    }

    #[test]
    fn clamped_timestamps() {
        let t = crate::Timestamp {
            secs: i64::MAX,
            nanos: u32::MAX,
        };
        assert_eq!(
            t.clamped(),
            crate::Timestamp {
                secs: i64::MAX,
                nanos: 999_999_999
            }
        );
        let ok = crate::Timestamp { secs: -5, nanos: 7 };
        assert_eq!(ok.clamped(), ok);
    }
}
