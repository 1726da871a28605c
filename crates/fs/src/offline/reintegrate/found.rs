//! Where a path of the log leads on the origin ([`Found`]), walked name by name from the
//! export's root: reintegration asks it before each step of a change.

use hoardfs_origin::{Entry, Handle, Origin, WireError};

use crate::{FsError, FsResult};

/// Where a path leads on the origin.
pub(crate) struct Found {
    /// Its directory (`None` if a component is gone).
    pub(crate) dir: Option<Handle>,
    /// Its entry (`None` if absent).
    pub(crate) entry: Option<Entry>,
}

impl Found {
    /// A component of the path is gone.
    pub(crate) const NOWHERE: Found = Found {
        dir: None,
        entry: None,
    };

    /// Walks `path` from `root` on the origin: its directory's handle (`None` if a
    /// component is gone) and its entry (`None` if absent).
    pub(crate) fn at(origin: &dyn Origin, root: Handle, path: &[Vec<u8>]) -> FsResult<Found> {
        let Some((name, dirs)) = path.split_last() else {
            return Err(FsError::Origin(WireError::Invalid));
        };
        let mut dir = root;
        for c in dirs {
            dir = match origin.lookup(dir, c) {
                Ok(e) if e.attr.kind == hoardfs_origin::FileKind::Dir => e.handle,
                Ok(_) => return Ok(Found::NOWHERE),
                Err(hoardfs_origin::OriginError::Fs(WireError::NotFound | WireError::NotDir)) => {
                    return Ok(Found::NOWHERE);
                }
                Err(e) => return Err(e.into()),
            };
        }
        match origin.lookup(dir, name) {
            Ok(e) => Ok(Found {
                dir: Some(dir),
                entry: Some(e),
            }),
            Err(hoardfs_origin::OriginError::Fs(WireError::NotFound)) => Ok(Found {
                dir: Some(dir),
                entry: None,
            }),
            Err(e) => Err(e.into()),
        }
    }
}
