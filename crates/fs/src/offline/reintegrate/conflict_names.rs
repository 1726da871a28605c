//! Names of conflict copies: `NAME.conflict-HOST-TIME` (then `-2`, `-3`, ...), the time
//! in UTC; and where a copy goes whose own directory is gone on the server: a private
//! directory of the change's maker in the export root ([`orphans_dir`]), so that a copy
//! is never more visible than its original was (a file protected only by a 0700
//! directory stays protected).

use std::time::{SystemTime, UNIX_EPOCH};

use hoardfs_origin::WireError;

use crate::{FsError, FsResult};

/// A UTC time as `YYYYMMDDTHHMMSSZ` (civil-from-days, proleptic Gregorian).
pub(crate) fn utc_stamp(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The `n`th conflict name for `name`: `NAME.conflict-HOST-STAMP`, then `...-2`, `-3`; a
/// long name is shortened so that the suffix fits in 255 bytes.
pub(crate) fn conflict_candidate(name: &[u8], host: &str, stamp: &str, n: u32) -> Vec<u8> {
    let suffix = if n > 1 {
        format!(".conflict-{host}-{stamp}-{n}")
    } else {
        format!(".conflict-{host}-{stamp}")
    };
    let mut copy = name[..name.len().min(255usize.saturating_sub(suffix.len()))].to_vec();
    copy.extend_from_slice(suffix.as_bytes());
    copy
}

/// The name of the directory of `uid`'s orphaned conflict copies, in the export root.
pub(crate) fn orphans_dir_name(uid: u32) -> Vec<u8> {
    format!(".hoardfs-conflicts-{uid}").into_bytes()
}

/// The directory of the orphaned conflict copies of `maker` (who made the change) in the
/// export root (`root`): its name and handle. It is named after the identity the origin
/// performs the maker's requests as (the mapped one, on a server acting as its callers),
/// and made mode 0700 if missing (the change is sent as its maker, so the directory is
/// theirs). One that is not a directory, or (on a server acting as its callers) not that
/// identity's, or open to group or others, is refused: somebody else made or opened it,
/// and the change stays in the log.
pub(crate) fn orphans_dir(
    origin: &dyn hoardfs_origin::Origin,
    root: hoardfs_origin::Handle,
    maker: &hoardfs_origin::Caller,
) -> FsResult<(Vec<u8>, hoardfs_origin::Handle)> {
    let mapped = origin.identities().acting_as(maker);
    let uid = mapped.as_ref().map_or(maker.uid, |m| m.uid);
    let name = orphans_dir_name(uid);
    let owner = hoardfs_origin::Owner {
        uid: maker.uid,
        gid: maker.gid,
    };
    let found = match origin.lookup(root, &name) {
        Ok(e) => e,
        Err(hoardfs_origin::OriginError::Fs(WireError::NotFound)) => {
            match origin.mkdir(root, &name, 0o700, owner) {
                Ok(e) => e,
                Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => {
                    origin.lookup(root, &name)?
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    let a = &found.attr;
    // Only a server acting as its callers says whose a directory is, and keeps modes.
    let private = mapped.is_none() || (a.uid == uid && a.perm & 0o077 == 0);
    if a.kind != hoardfs_origin::FileKind::Dir || !private {
        tracing::error!(
            name = %String::from_utf8_lossy(&name),
            uid = a.uid,
            mode = format!("{:o}", a.perm),
            "the server's conflicts directory is not a private directory of the change's \
             maker: keeping the change here"
        );
        return Err(FsError::Origin(WireError::Access));
    }
    Ok((name, found.handle))
}

/// Tries `attempt` with `NAME.conflict-HOST-TIME` (or `...-2`, `-3`, while taken);
/// returns the name it succeeded with and its result.
pub(crate) fn conflict_name<T>(
    name: &[u8],
    host: &str,
    mut attempt: impl FnMut(&[u8]) -> Result<T, hoardfs_origin::OriginError>,
) -> FsResult<(Vec<u8>, T)> {
    let stamp = utc_stamp(SystemTime::now());
    for n in 1..100 {
        let copy = conflict_candidate(name, host, &stamp, n);
        match attempt(&copy) {
            Ok(t) => return Ok((copy, t)),
            Err(hoardfs_origin::OriginError::Fs(WireError::Exists)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(FsError::Origin(WireError::Exists))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_stamps() {
        assert_eq!(utc_stamp(UNIX_EPOCH), "19700101T000000Z");
        let t = UNIX_EPOCH + std::time::Duration::from_secs(1_795_519_500);
        assert_eq!(utc_stamp(t), "20261124T112500Z");
        let leap = UNIX_EPOCH + std::time::Duration::from_secs(951_825_600);
        assert_eq!(utc_stamp(leap), "20000229T120000Z");
    }
}
