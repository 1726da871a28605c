//! The framing of the small files the fs keeps in the cache directory (the saved
//! namespace, offline change records): an 8-byte magic naming the format and its version,
//! the body's length, the body (postcard) and its xxh3 checksum. Anything else, cut short
//! or changed, is refused whole.

/// Why sealed bytes were refused.
#[derive(Debug, thiserror::Error)]
pub enum Unsealed {
    /// They do not start with the expected magic (another format, or another version).
    #[error("not this format or version")]
    Format,
    /// Shorter or longer than their framing says.
    #[error("truncated")]
    Truncated,
    /// The body does not match its checksum.
    #[error("checksum mismatch")]
    Checksum,
    /// The body checks out but does not decode.
    #[error("body does not decode: {0}")]
    Body(#[source] hoardfs_proto::frame::FrameError),
}

/// `magic`, then `body` framed and checksummed.
pub(crate) fn seal<T: serde::Serialize>(magic: &[u8; 8], body: &T) -> Vec<u8> {
    let body = hoardfs_proto::frame::encode_body(body);
    let mut out = Vec::with_capacity(body.len() + 24);
    out.extend_from_slice(magic);
    out.extend_from_slice(&(body.len() as u64).to_le_bytes());
    out.extend_from_slice(&body);
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    out
}

/// The value sealed in `bytes` with `magic`; why not, otherwise.
pub(crate) fn unseal<T: serde::de::DeserializeOwned>(
    magic: &[u8; 8],
    bytes: &[u8],
) -> Result<T, Unsealed> {
    let rest = bytes
        .strip_prefix(magic.as_slice())
        .ok_or(Unsealed::Format)?;
    if rest.len() < 16 {
        return Err(Unsealed::Truncated);
    }
    let (n, rest) = rest.split_at(8);
    let n = u64::from_le_bytes(n.try_into().expect("8 bytes")) as usize;
    if rest.len() != n.saturating_add(8) {
        return Err(Unsealed::Truncated);
    }
    let (body, sum) = rest.split_at(n);
    if xxhash_rust::xxh3::xxh3_64(body).to_le_bytes() != sum {
        return Err(Unsealed::Checksum);
    }
    hoardfs_proto::frame::decode_body(body).map_err(Unsealed::Body)
}

/// `bytes` without the zeros [`rewrite_in_place`] may have left after the sealed value
/// (a value rewritten shorter than the one before).
pub(crate) fn without_padding(bytes: &[u8]) -> &[u8] {
    let Some(n) = bytes.get(8..16) else {
        return bytes;
    };
    let n = u64::from_le_bytes(n.try_into().expect("8 bytes"));
    let end = usize::try_from(n).ok().and_then(|n| n.checked_add(24));
    match end {
        Some(end) if end < bytes.len() && bytes[end..].iter().all(|&b| b == 0) => &bytes[..end],
        _ => bytes,
    }
}

/// Most bytes [`rewrite_in_place`] writes over a file: one page, which a write copies
/// into the page cache whole even if the process is killed meanwhile (a longer write may
/// stop between pages).
pub(crate) const IN_PLACE_MAX: usize = 4096;

/// Writes `bytes` (sealed) over the start of the existing file `path` in one write,
/// padded with zeros to the file's length: a killed process leaves the old value or the
/// new, without a new inode, a rename or an fsync (a crash of the machine may leave
/// either, or a torn page: refused whole when read). Longer values, or a file that is
/// not there, are written by [`replace_file`] instead.
pub(crate) fn rewrite_in_place(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let f = match hoardfs_cache::private::file_options()
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return replace_file(path, bytes, false);
        }
        Err(e) => return Err(e),
    };
    let len = f.metadata()?.len() as usize;
    if bytes.len().max(len) > IN_PLACE_MAX {
        drop(f);
        return replace_file(path, bytes, false);
    }
    let mut page = bytes.to_vec();
    page.resize(bytes.len().max(len), 0);
    let n = f.write_at(&page, 0)?;
    if n != page.len() {
        return Err(std::io::Error::other("a record was written short"));
    }
    Ok(())
}

/// Writes `bytes` (sealed) into the new file `path` in one write (see
/// [`rewrite_in_place`]): a killed process leaves no file, an empty one, or the value
/// (empty or torn: refused whole when read). Longer values go through [`replace_file`].
pub(crate) fn write_new(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    if bytes.len() > IN_PLACE_MAX {
        return replace_file(path, bytes, false);
    }
    let mut f = hoardfs_cache::private::file_options()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(bytes)
}

/// Writes `bytes` to `path` durably and atomically: a temporary file next to it, fsync,
/// rename, fsync of the directory. A crash leaves the old content or the new.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_file(path, bytes, true)
}

/// Writes `bytes` to `path` atomically (a temporary file next to it, renamed over it):
/// a killed process leaves the old content or the new; `durable`, also a crash of the
/// machine (both fsynced, and the directory).
pub(crate) fn replace_file(
    path: &std::path::Path,
    bytes: &[u8],
    durable: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    // Inside the cache directory: private, never through a link.
    let mut f = hoardfs_cache::private::file_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(bytes)?;
    if durable {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if durable && let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC: &[u8; 8] = b"TESTSEAL";

    #[test]
    fn a_value_rewritten_in_place_reads_back_whether_longer_or_shorter() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("v");
        let long = "a value that takes some room".repeat(4);
        for v in ["first".to_string(), long, "short".to_string()] {
            rewrite_in_place(&p, &seal(MAGIC, &v)).unwrap();
            let bytes = std::fs::read(&p).unwrap();
            let back: String = unseal(MAGIC, without_padding(&bytes)).unwrap();
            assert_eq!(back, v);
        }
        // Padding is zeros only: anything else after the value is refused, not dropped.
        let mut bytes = seal(MAGIC, &"v".to_string());
        bytes.extend_from_slice(&[0, 1]);
        assert!(unseal::<String>(MAGIC, without_padding(&bytes)).is_err());
    }
}
