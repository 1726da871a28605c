//! Sending a change's staged content over an origin file, in pieces: every byte, then
//! the size, then a publish (origins that publish at close) and an fsync; and what a
//! failed upload leaves known about the origin's file (`UploadFailed`).

use hoardfs_origin::{Handle, Origin, SetAttrs, WireError};

use crate::FsError;
use crate::offline::cml::Inner;

/// Bytes per write when sending a staged file back.
const PIECE: usize = 1 << 20;

/// An upload that failed: why, the last version the origin reported for the file (the
/// version it started from if nothing was written), and whether its last request may
/// have been carried out without an answer (so that the origin's version is not known).
pub(crate) struct UploadFailed {
    pub(crate) error: FsError,
    pub(crate) last_version: u64,
    pub(crate) maybe_applied: bool,
}

impl UploadFailed {
    fn new(error: FsError, last_version: u64) -> Self {
        UploadFailed {
            error,
            last_version,
            maybe_applied: false,
        }
    }

    /// A request to the origin failed with `e`.
    fn origin(e: hoardfs_origin::OriginError, last_version: u64) -> Self {
        UploadFailed {
            maybe_applied: e.maybe_carried_out(),
            error: e.into(),
            last_version,
        }
    }
}

/// Writes the staged content over the object at `handle` (at version `at_start`):
/// every byte, then the size, then publishes (origins that publish at close) and
/// fsyncs; returns the file's attributes after. On failure, also the last version the
/// origin reported for it (`at_start` if nothing was written).
pub(crate) fn upload(
    origin: &dyn Origin,
    handle: Handle,
    g: &Inner,
    at_start: u64,
) -> Result<hoardfs_origin::Attr, UploadFailed> {
    let mut last = at_start;
    let size = g.size();
    let mut at = 0u64;
    while at < size {
        let piece = g
            .read(at, PIECE)
            .map_err(|e| UploadFailed::new(crate::offline::state::kept(e), last))?;
        if piece.is_empty() {
            break;
        }
        let mut done = 0;
        while done < piece.len() {
            let w = origin
                .write(handle, at + done as u64, &piece[done..], false)
                .map_err(|e| UploadFailed::origin(e, last))?;
            last = w.attr.version;
            if w.written == 0 {
                return Err(UploadFailed::new(FsError::Origin(WireError::NoSpace), last));
            }
            done += w.written as usize;
        }
        at += piece.len() as u64;
    }
    let set = SetAttrs {
        size: Some(size),
        ..Default::default()
    };
    let mut attr = origin
        .setattr(handle, &set)
        .map_err(|e| UploadFailed::origin(e, last))?;
    last = attr.version;
    if origin.publishes_on_close()
        && let Some((_, a)) = origin
            .flush(handle)
            .map_err(|e| UploadFailed::origin(e, last))?
    {
        attr = a;
    }
    origin
        .fsync(handle, false)
        .map_err(|e| UploadFailed::origin(e, attr.version))?;
    Ok(attr)
}
