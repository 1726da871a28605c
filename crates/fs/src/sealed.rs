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

/// Writes `bytes` to `path` durably and atomically: a temporary file next to it, fsync,
/// rename, fsync of the directory. A crash leaves the old content or the new.
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    // Inside the cache directory: private, never through a link.
    let mut f = hoardfs_cache::private::file_options()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}
