//! The persistent object index (`CACHE-DIR/index`): one fixed-size, self-checking slot per
//! cached object, so that a client starts by reading one file instead of walking the cache
//! directory. Format version 1, little endian:
//!
//! ```text
//! header (64 bytes)
//! 0    8    magic b"HFSINDEX"
//! 8    2    format version (1)
//! 10   2    reserved (0)
//! 12   4    slot size (48)
//! 16   4    clean: 1 after an orderly shutdown (everything recorded was synced), else 0
//! 20   4    crash epoch: +1 at every start that follows an unclean shutdown
//! 24   36   reserved (0)
//! 60   4    CRC32C of bytes 0..60
//!
//! slot i at 64 + 48*i
//! 0    16   export id
//! 16   8    file id
//! 24   8    bytes allocated on disk (data blocks + record)
//! 32   4    flags: bit 0 in use, bit 1 pinned
//! 36   4    epoch at which the object's chunks were last written or verified
//! 40   2    hoard priority
//! 42   2    reserved (0)
//! 44   4    CRC32C of slot bytes 0..44
//! ```
//! The index is an accounting and eviction aid, never the authority on content (that is the
//! per-object record and its checksums): a torn or lost slot write only makes the object an
//! orphan, which is verified before use and swept after an unclean start. Slots are written
//! in place with one `pwrite` each and synced at orderly shutdown.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::meta::ObjectKey;
use crate::{CacheError, io_at};

const MAGIC: [u8; 8] = *b"HFSINDEX";
const FORMAT_VERSION: u16 = 1;
const HEADER: u64 = 64;
/// Bytes per slot.
pub const SLOT: u64 = 48;
const FLAG_USED: u32 = 1;
const FLAG_PINNED: u32 = 2;

/// What a slot says about one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRecord {
    /// Which object.
    pub key: ObjectKey,
    /// Bytes it occupies on disk.
    pub bytes: u64,
    /// Kept from eviction.
    pub pinned: bool,
    /// Crash epoch at which its chunks were last written or verified.
    pub crash_epoch: u32,
    /// Hoard priority (higher is fetched first).
    pub priority: u16,
}

impl SlotRecord {
    fn encode(&self) -> [u8; SLOT as usize] {
        let mut b = [0u8; SLOT as usize];
        b[0..16].copy_from_slice(&self.key.export_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.file_id.to_le_bytes());
        b[24..32].copy_from_slice(&self.bytes.to_le_bytes());
        let flags = FLAG_USED | if self.pinned { FLAG_PINNED } else { 0 };
        b[32..36].copy_from_slice(&flags.to_le_bytes());
        b[36..40].copy_from_slice(&self.crash_epoch.to_le_bytes());
        b[40..42].copy_from_slice(&self.priority.to_le_bytes());
        let crc = crc32c::crc32c(&b[..44]);
        b[44..48].copy_from_slice(&crc.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<SlotRecord> {
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
        if crc32c::crc32c(&b[..44]) != u32_at(44) || u32_at(32) & FLAG_USED == 0 {
            return None;
        }
        Some(SlotRecord {
            key: ObjectKey {
                export_id: u128::from_le_bytes(b[0..16].try_into().expect("16")),
                file_id: u64::from_le_bytes(b[16..24].try_into().expect("8")),
            },
            bytes: u64::from_le_bytes(b[24..32].try_into().expect("8")),
            pinned: u32_at(32) & FLAG_PINNED != 0,
            crash_epoch: u32_at(36),
            priority: u16::from_le_bytes(b[40..42].try_into().expect("2")),
        })
    }
}

/// The index as found at startup.
#[derive(Debug)]
pub struct Loaded {
    /// The previous client shut down in order.
    pub clean: bool,
    /// Crash epoch stored in the header (before this start's increment).
    pub crash_epoch: u32,
    /// Valid slots.
    pub records: Vec<(u32, SlotRecord)>,
    /// Slots that are free (never used, released, or torn).
    pub free: Vec<u32>,
    /// Number of slots in the file.
    pub slots: u32,
}

/// The open index file.
#[derive(Debug)]
pub struct IndexFile {
    file: File,
    path: PathBuf,
}

impl IndexFile {
    /// Opens (creating if missing) and reads the whole index. A damaged header is refused:
    /// the caller decides whether to start over.
    pub fn open(path: &Path) -> Result<(IndexFile, Loaded), CacheError> {
        let file = crate::private::file_options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_at(path))?;
        let idx = IndexFile {
            file,
            path: path.to_path_buf(),
        };
        let mut bytes = Vec::new();
        io::Read::read_to_end(&mut &idx.file, &mut bytes).map_err(io_at(path))?;
        if bytes.is_empty() {
            // A brand-new index: nothing can be stale, so it starts "clean".
            idx.write_header(true, 0)?;
            let loaded = Loaded {
                clean: true,
                crash_epoch: 0,
                records: Vec::new(),
                free: Vec::new(),
                slots: 0,
            };
            return Ok((idx, loaded));
        }
        let (clean, crash_epoch) =
            decode_header(&bytes).ok_or_else(|| CacheError::Incompatible {
                path: path.to_path_buf(),
                why: "index header is damaged or of an unknown format".into(),
            })?;
        let slots = ((bytes.len() as u64).saturating_sub(HEADER) / SLOT) as u32;
        let mut records = Vec::with_capacity(slots as usize);
        let mut free = Vec::new();
        for (i, s) in bytes[HEADER as usize..]
            .chunks_exact(SLOT as usize)
            .enumerate()
        {
            match SlotRecord::decode(s) {
                Some(r) => records.push((i as u32, r)),
                None => free.push(i as u32),
            }
        }
        let loaded = Loaded {
            clean,
            crash_epoch,
            records,
            free,
            slots,
        };
        Ok((idx, loaded))
    }

    /// Writes the header.
    pub fn write_header(&self, clean: bool, crash_epoch: u32) -> Result<(), CacheError> {
        let mut h = [0u8; HEADER as usize];
        h[0..8].copy_from_slice(&MAGIC);
        h[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&(SLOT as u32).to_le_bytes());
        h[16..20].copy_from_slice(&u32::from(clean).to_le_bytes());
        h[20..24].copy_from_slice(&crash_epoch.to_le_bytes());
        let crc = crc32c::crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        self.file.write_all_at(&h, 0).map_err(io_at(&self.path))
    }

    /// Writes slot `i`.
    pub fn write_slot(&self, i: u32, r: &SlotRecord) -> Result<(), CacheError> {
        self.file
            .write_all_at(&r.encode(), HEADER + SLOT * i as u64)
            .map_err(io_at(&self.path))
    }

    /// Marks slot `i` free.
    pub fn clear_slot(&self, i: u32) -> Result<(), CacheError> {
        self.file
            .write_all_at(&[0u8; SLOT as usize], HEADER + SLOT * i as u64)
            .map_err(io_at(&self.path))
    }

    /// Flushes the index to stable storage.
    pub fn sync(&self) -> Result<(), CacheError> {
        self.file.sync_data().map_err(io_at(&self.path))
    }
}

fn decode_header(b: &[u8]) -> Option<(bool, u32)> {
    if b.len() < HEADER as usize || b[0..8] != MAGIC {
        return None;
    }
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
    if crc32c::crc32c(&b[..60]) != u32_at(60)
        || u16::from_le_bytes([b[8], b[9]]) != FORMAT_VERSION
        || u32_at(12) as u64 != SLOT
    {
        return None;
    }
    Some((u32_at(16) == 1, u32_at(20)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: u64) -> SlotRecord {
        SlotRecord {
            key: ObjectKey {
                export_id: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
                file_id: id,
            },
            bytes: 0x1_0000,
            pinned: true,
            crash_epoch: 3,
            priority: 7,
        }
    }

    /// Golden bytes: if this fails, the on-disk format changed. Bump FORMAT_VERSION.
    #[test]
    fn golden_slot_bytes() {
        let hex: String = rec(42)
            .encode()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(
            hex,
            concat!(
                "100f0e0d0c0b0a090807060504030201",
                "2a00000000000000",
                "0000010000000000",
                "03000000",
                "03000000",
                "0700",
                "0000",
                "94718473"
            )
        );
    }

    #[test]
    fn slots_roundtrip_and_torn_slots_read_as_free() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("index");
        {
            let (idx, l) = IndexFile::open(&p).unwrap();
            assert!(l.clean && l.records.is_empty());
            idx.write_header(false, 5).unwrap();
            for i in 0..4 {
                idx.write_slot(i, &rec(i as u64)).unwrap();
            }
            idx.clear_slot(1).unwrap();
        }
        // Tear slot 2: flip one byte.
        let mut b = std::fs::read(&p).unwrap();
        b[(HEADER + 2 * SLOT + 20) as usize] ^= 1;
        std::fs::write(&p, &b).unwrap();
        let (_, l) = IndexFile::open(&p).unwrap();
        assert!(!l.clean);
        assert_eq!(l.crash_epoch, 5);
        assert_eq!(l.slots, 4);
        assert_eq!(l.free, vec![1, 2]);
        assert_eq!(l.records, vec![(0, rec(0)), (3, rec(3))]);
        // A damaged header is refused, not silently reset.
        b[3] ^= 1;
        std::fs::write(&p, &b).unwrap();
        assert!(IndexFile::open(&p).is_err());
    }
}
