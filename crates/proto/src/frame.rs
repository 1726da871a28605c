//! Frame layout and limits.
//!
//! ```text
//! offset  size  field
//! 0       4     magic  b"HFS1"
//! 4       4     body length (u32 LE)
//! 8       4     data length (u32 LE)
//! 12      ..    body (postcard), then data (raw bytes)
//! ```
//! A receiver checks the magic and both lengths against its [`Limits`] *before* allocating,
//! so a hostile peer cannot make it reserve memory it did not agree to.

use std::io::{self, Read, Write};

/// Magic bytes that open every frame.
pub const MAGIC: [u8; 4] = *b"HFS1";
/// Size of the fixed frame header.
pub const HEADER_LEN: usize = 12;

/// Upper bounds a receiver enforces on incoming frames.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest body accepted.
    pub max_body: u32,
    /// Largest data section accepted.
    pub max_data: u32,
}

impl Limits {
    /// What a server accepts from clients: small bodies, data only for writes.
    pub const REQUEST: Limits = Limits {
        max_body: 64 << 10,
        max_data: 16 << 20,
    };
    /// What a client accepts from a server: directory pages can be large.
    pub const RESPONSE: Limits = Limits {
        max_body: 16 << 20,
        max_data: 16 << 20,
    };
}

/// Why an incoming frame was rejected.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The connection failed or closed mid-frame.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The first four bytes were not the hoardfs magic.
    #[error("bad frame magic {0:02x?} (not a hoardfs peer?)")]
    BadMagic([u8; 4]),
    /// A length exceeded the receiver's limits.
    #[error("frame too large: body {body} bytes, data {data} bytes")]
    TooLarge {
        /// Declared body length.
        body: u32,
        /// Declared data length.
        data: u32,
    },
    /// The body did not decode as the expected message.
    #[error("malformed frame body: {0}")]
    Malformed(String),
}

/// The fixed part of a frame, decoded and checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Length of the postcard body.
    pub body_len: u32,
    /// Length of the raw data section.
    pub data_len: u32,
}

impl FrameHeader {
    /// Decodes and validates a header against `limits`.
    pub fn parse(bytes: &[u8; HEADER_LEN], limits: Limits) -> Result<Self, FrameError> {
        let magic: [u8; 4] = bytes[0..4].try_into().expect("4 bytes");
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let body_len = u32::from_le_bytes(bytes[4..8].try_into().expect("4 bytes"));
        let data_len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes"));
        if body_len > limits.max_body || data_len > limits.max_data {
            return Err(FrameError::TooLarge {
                body: body_len,
                data: data_len,
            });
        }
        Ok(FrameHeader { body_len, data_len })
    }

    /// Encodes a header for a body and data of the given lengths.
    pub fn encode(body_len: usize, data_len: usize) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[0..4].copy_from_slice(&MAGIC);
        h[4..8].copy_from_slice(&(body_len as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(data_len as u32).to_le_bytes());
        h
    }
}

/// Serialises a message body.
pub fn encode_body<T: serde::Serialize>(msg: &T) -> Vec<u8> {
    postcard::to_allocvec(msg).expect("in-memory serialisation cannot fail")
}

/// Deserialises a message body, rejecting trailing garbage.
pub fn decode_body<'a, T: serde::Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, FrameError> {
    let (msg, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| FrameError::Malformed(e.to_string()))?;
    if !rest.is_empty() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes",
            rest.len()
        )));
    }
    Ok(msg)
}

/// Writes one frame (header, body, data) with a single vectored write where possible.
pub fn write_frame<W: Write>(w: &mut W, body: &[u8], data: &[u8]) -> io::Result<()> {
    let header = FrameHeader::encode(body.len(), data.len());
    let mut bufs = [
        io::IoSlice::new(&header),
        io::IoSlice::new(body),
        io::IoSlice::new(data),
    ];
    let mut slices: &mut [io::IoSlice<'_>] = &mut bufs;
    while !slices.is_empty() {
        let n = w.write_vectored(slices)?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        io::IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

/// Reads one frame: returns the body and the data section (read into `data`, which is
/// resized to fit so callers can reuse its allocation).
pub fn read_frame<R: Read>(
    r: &mut R,
    limits: Limits,
    data: &mut Vec<u8>,
) -> Result<Vec<u8>, FrameError> {
    let (body, want) = read_head(r, limits)?;
    read_data(r, want, data)?;
    Ok(body)
}

/// Reads a frame's header and body: returns the body and the length of the data section
/// that follows (for the caller to read, e.g. with [`read_data`], before the next frame).
pub fn read_head<R: Read>(r: &mut R, limits: Limits) -> Result<(Vec<u8>, usize), FrameError> {
    let mut hdr = [0u8; HEADER_LEN];
    r.read_exact(&mut hdr)?;
    let h = FrameHeader::parse(&hdr, limits)?;
    let mut body = vec![0u8; h.body_len as usize];
    r.read_exact(&mut body)?;
    Ok((body, h.data_len as usize))
}

/// Reads a data section of `want` bytes into `data` (resized to fit, reusing its
/// allocation).
pub fn read_data<R: Read>(r: &mut R, want: usize, data: &mut Vec<u8>) -> Result<(), FrameError> {
    // Data sections are file contents of up to several MiB: read over what the buffer
    // (recycled) already holds, zeroing only bytes it never held.
    if data.capacity() < want && want >= crate::buffers::MIN_POOLED {
        crate::buffers::give(std::mem::replace(data, crate::buffers::take_filled(want)));
    }
    crate::buffers::fill_to(data, want);
    r.read_exact(data)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_roundtrip_and_limits() {
        let h = FrameHeader::encode(10, 20);
        assert_eq!(&h[..4], b"HFS1");
        let p = FrameHeader::parse(&h, Limits::REQUEST).unwrap();
        assert_eq!(
            p,
            FrameHeader {
                body_len: 10,
                data_len: 20
            }
        );
        let big = FrameHeader::encode(1 << 30, 0);
        assert!(matches!(
            FrameHeader::parse(&big, Limits::REQUEST),
            Err(FrameError::TooLarge { .. })
        ));
        let mut bad = h;
        bad[0] = b'X';
        assert!(matches!(
            FrameHeader::parse(&bad, Limits::REQUEST),
            Err(FrameError::BadMagic(_))
        ));
    }

    #[test]
    fn frame_roundtrip() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"body", b"payload").unwrap();
        // A reused buffer's old, longer content must not survive.
        let mut data = b"an earlier, longer data section".to_vec();
        let body = read_frame(&mut wire.as_slice(), Limits::RESPONSE, &mut data).unwrap();
        assert_eq!(body, b"body");
        assert_eq!(data, b"payload");
    }

    #[test]
    fn truncated_frame_is_an_error() {
        let mut wire = Vec::new();
        write_frame(&mut wire, b"body", b"payload").unwrap();
        wire.truncate(wire.len() - 1);
        let mut data = Vec::new();
        assert!(read_frame(&mut wire.as_slice(), Limits::RESPONSE, &mut data).is_err());
    }
}
