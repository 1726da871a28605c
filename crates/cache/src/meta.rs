//! The per-object record (`*.meta`): which chunks of the data file are present, their
//! checksums, and the origin version they belong to. Format version 1, little endian:
//!
//! ```text
//! off  len  field
//! 0    8    magic b"HFSMETA\0"
//! 8    2    format version (1)
//! 10   2    reserved (0)
//! 12   4    chunk shift (chunk size = 1 << shift)
//! 16   16   export id
//! 32   8    file id
//! 40   8    origin version (change attribute)
//! 48   8    file size
//! 56   4    chunk count = ceil(size / chunk size)
//! 60   4    reserved (0)
//! 64   B    presence bitmap, B = ceil(chunks / 8), bit i of byte i/8 = chunk i present
//! ..   4*N  CRC32C of each chunk (0 when absent)
//! ..   4    CRC32C of all preceding bytes
//! ```
//! A record that fails any check (magic, version, lengths, trailing CRC) is treated as absent:
//! the object is refetched, never served from unverified presence bits.

use thiserror::Error;

/// Magic bytes of a record.
pub const MAGIC: [u8; 8] = *b"HFSMETA\0";
/// Record format version written by this build.
pub const FORMAT_VERSION: u16 = 1;
const FIXED: usize = 64;
/// Smallest chunk: 1 MiB, the unit of fetching and of presence.
pub const MIN_CHUNK_SHIFT: u32 = 20;
/// Chunks per object are capped so records stay small; huge files get bigger chunks.
pub const MAX_CHUNKS: u64 = 4096;

/// Identity of a cached object: which export, which file on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// The origin's export id.
    pub export_id: u128,
    /// The file's id on the origin (inode number).
    pub file_id: u64,
}

/// Decoded record of one cached object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// Which object.
    pub key: ObjectKey,
    /// Origin version the present chunks belong to.
    pub version: u64,
    /// File size at that version.
    pub size: u64,
    /// log2 of the chunk size.
    pub chunk_shift: u32,
    /// Presence bitmap.
    pub present: Vec<u8>,
    /// Per-chunk CRC32C.
    pub crcs: Vec<u32>,
}

/// Why a record could not be decoded.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum MetaError {
    /// Too short or wrong length for its chunk count.
    #[error("record has the wrong length")]
    Length,
    /// Not a hoardfs record.
    #[error("bad magic")]
    Magic,
    /// Written by an incompatible build.
    #[error("unsupported record format {0}")]
    Format(u16),
    /// Checksum mismatch (torn or corrupted write).
    #[error("record checksum mismatch")]
    Checksum,
    /// Fields inconsistent with each other.
    #[error("inconsistent record: {0}")]
    Inconsistent(&'static str),
}

/// Chunk shift chosen for a file of `size` bytes.
pub fn chunk_shift_for(size: u64) -> u32 {
    let mut shift = MIN_CHUNK_SHIFT;
    while size.div_ceil(1u64 << shift) > MAX_CHUNKS {
        shift += 1;
    }
    shift
}

impl ObjectMeta {
    /// An empty record (nothing present) for a file of `size` bytes at `version`.
    pub fn empty(key: ObjectKey, version: u64, size: u64) -> Self {
        let chunk_shift = chunk_shift_for(size);
        let n = size.div_ceil(1u64 << chunk_shift) as usize;
        ObjectMeta {
            key,
            version,
            size,
            chunk_shift,
            present: vec![0; n.div_ceil(8)],
            crcs: vec![0; n],
        }
    }

    /// Number of chunks.
    pub fn chunks(&self) -> u64 {
        self.crcs.len() as u64
    }

    /// Chunk size in bytes.
    pub fn chunk_size(&self) -> u64 {
        1u64 << self.chunk_shift
    }

    /// Byte range `[start, end)` of chunk `i`.
    pub fn chunk_range(&self, i: u64) -> (u64, u64) {
        let start = i << self.chunk_shift;
        (
            start,
            start.saturating_add(self.chunk_size()).min(self.size),
        )
    }

    /// Whether chunk `i` is present.
    pub fn is_present(&self, i: u64) -> bool {
        let i = i as usize;
        i < self.crcs.len() && self.present[i / 8] & (1 << (i % 8)) != 0
    }

    /// Marks chunk `i` present with checksum `crc`.
    pub fn set_present(&mut self, i: u64, crc: u32) {
        let i = i as usize;
        self.present[i / 8] |= 1 << (i % 8);
        self.crcs[i] = crc;
    }

    /// Marks chunk `i` absent.
    pub fn clear(&mut self, i: u64) {
        let i = i as usize;
        self.present[i / 8] &= !(1 << (i % 8));
        self.crcs[i] = 0;
    }

    /// Number of chunks present.
    pub fn present_count(&self) -> u64 {
        self.present.iter().map(|b| b.count_ones() as u64).sum()
    }

    /// True when every chunk is present.
    pub fn is_complete(&self) -> bool {
        self.present_count() == self.chunks()
    }

    /// Length of the encoded record.
    pub fn encoded_len(&self) -> usize {
        FIXED + self.present.len() + 4 * self.crcs.len() + 4
    }

    /// Encodes the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.encoded_len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
        b.extend_from_slice(&self.chunk_shift.to_le_bytes());
        b.extend_from_slice(&self.key.export_id.to_le_bytes());
        b.extend_from_slice(&self.key.file_id.to_le_bytes());
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&self.size.to_le_bytes());
        b.extend_from_slice(&(self.crcs.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.present);
        for c in &self.crcs {
            b.extend_from_slice(&c.to_le_bytes());
        }
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes and fully validates a record.
    pub fn decode(b: &[u8]) -> Result<Self, MetaError> {
        if b.len() < FIXED + 4 {
            return Err(MetaError::Length);
        }
        if b[0..8] != MAGIC {
            return Err(MetaError::Magic);
        }
        let u16_at = |o: usize| u16::from_le_bytes(b[o..o + 2].try_into().expect("2"));
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
        let format = u16_at(8);
        if format != FORMAT_VERSION {
            return Err(MetaError::Format(format));
        }
        let n = u32_at(56) as usize;
        let bitmap = n.div_ceil(8);
        let total = FIXED + bitmap + 4 * n + 4;
        if b.len() != total {
            return Err(MetaError::Length);
        }
        if crc32c::crc32c(&b[..total - 4]) != u32_at(total - 4) {
            return Err(MetaError::Checksum);
        }
        let chunk_shift = u32_at(12);
        let size = u64_at(48);
        if !(MIN_CHUNK_SHIFT..64).contains(&chunk_shift) {
            return Err(MetaError::Inconsistent("chunk shift"));
        }
        if size.div_ceil(1u64 << chunk_shift) != n as u64 {
            return Err(MetaError::Inconsistent("chunk count"));
        }
        let key = ObjectKey {
            export_id: u128::from_le_bytes(b[16..32].try_into().expect("16")),
            file_id: u64_at(32),
        };
        let crcs = (0..n).map(|i| u32_at(FIXED + bitmap + 4 * i)).collect();
        Ok(ObjectMeta {
            key,
            version: u64_at(40),
            size,
            chunk_shift,
            present: b[FIXED..FIXED + bitmap].to_vec(),
            crcs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ObjectMeta {
        let key = ObjectKey {
            export_id: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
            file_id: 42,
        };
        let mut m = ObjectMeta::empty(key, 0xdead_beef, 3 * (1 << 20) + 5);
        m.set_present(0, 0x1111_2222);
        m.set_present(3, 0x3333_4444);
        m
    }

    /// Golden bytes: if this fails, the on-disk format changed. Bump FORMAT_VERSION and
    /// handle old records instead of editing the expected bytes.
    #[test]
    fn golden_bytes() {
        let hex: String = sample()
            .encode()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            concat!(
                "4846534d45544100",
                "0100",
                "0000",
                "14000000",
                "100f0e0d0c0b0a090807060504030201",
                "2a00000000000000",
                "efbeadde00000000",
                "0500300000000000",
                "04000000",
                "00000000",
                "09",
                "22221111",
                "00000000",
                "00000000",
                "44443333",
                "3aa7707c"
            )
        );
    }

    #[test]
    fn roundtrip_and_corruption_is_detected() {
        let m = sample();
        let b = m.encode();
        assert_eq!(ObjectMeta::decode(&b).unwrap(), m);
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert!(
                ObjectMeta::decode(&c).is_err(),
                "flip at byte {i} went unnoticed"
            );
        }
        assert_eq!(
            ObjectMeta::decode(&b[..b.len() - 1]),
            Err(MetaError::Length)
        );
    }

    #[test]
    fn chunk_geometry() {
        assert_eq!(chunk_shift_for(0), 20);
        assert_eq!(chunk_shift_for(4096 << 20), 20);
        assert_eq!(chunk_shift_for((4096 << 20) + 1), 21);
        let m = ObjectMeta::empty(
            ObjectKey {
                export_id: 1,
                file_id: 1,
            },
            1,
            0,
        );
        assert!(m.is_complete());
        let m = sample();
        assert_eq!(m.chunks(), 4);
        assert_eq!(m.chunk_range(3), (3 << 20, (3 << 20) + 5));
        assert!(!m.is_complete());
        assert_eq!(m.present_count(), 2);
    }
}
