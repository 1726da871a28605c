//! Names resolved one by one, outside any listing ([`SeenNames`]), for lookups without
//! the store after a remount: loaded from `STATE/listings/seen.log` at the first need and
//! appended to as they come (length-prefixed postcard records; a torn last record is
//! ignored; the log starts afresh beyond [`SEEN_LOG_MAX`]).

use std::collections::HashMap;
use std::path::PathBuf;

use parking_lot::Mutex;

use super::snapshot::Listed;

/// The log of names looked up is started afresh beyond this size.
const SEEN_LOG_MAX: u64 = 64 << 20;

/// The names seen, and their log. Lock: `names` is a leaf, held only across an append to
/// the log.
pub(super) struct SeenNames {
    names: Mutex<Option<HashMap<String, Listed>>>,
    log: Option<PathBuf>,
}

impl SeenNames {
    /// The names logged in `dir/seen.log` (none kept without a directory).
    pub(super) fn new(dir: Option<&std::path::Path>) -> SeenNames {
        SeenNames {
            names: Mutex::new(None),
            log: dir.map(|d| d.join("seen.log")),
        }
    }

    /// Records that `path` (a full key path) was found to be `l` by a lookup.
    pub(super) fn remember(&self, path: &str, l: &Listed) {
        let mut g = self.names.lock();
        let m = g.get_or_insert_with(|| self.load());
        if m.get(path) == Some(l) {
            return;
        }
        m.insert(path.to_string(), l.clone());
        let Some(log) = &self.log else {
            return;
        };
        if std::fs::metadata(log).is_ok_and(|md| md.len() > SEEN_LOG_MAX) {
            let _ = std::fs::remove_file(log);
        }
        let Ok(rec) = postcard::to_stdvec(&(path, l)) else {
            return;
        };
        let mut buf = (rec.len() as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(&rec);
        use std::io::Write;
        let _ = crate::s3::staging::private_file()
            .create(true)
            .append(true)
            .open(log)
            .and_then(|mut f| f.write_all(&buf));
    }

    /// What a lookup last found at `path`, whatever its age.
    pub(super) fn recall(&self, path: &str) -> Option<Listed> {
        let mut g = self.names.lock();
        g.get_or_insert_with(|| self.load()).get(path).cloned()
    }

    fn load(&self) -> HashMap<String, Listed> {
        let mut m = HashMap::new();
        let Some(bytes) = self.log.as_ref().and_then(|l| std::fs::read(l).ok()) else {
            return m;
        };
        let mut rest = &bytes[..];
        while rest.len() >= 4 {
            let n = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            let Some(rec) = rest.get(4..4 + n) else {
                break; // a torn last record
            };
            if let Ok((path, l)) = postcard::from_bytes::<(String, Listed)>(rec) {
                m.insert(path, l);
            }
            rest = &rest[4 + n..];
        }
        m
    }
}
