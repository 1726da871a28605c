//! The server's write verifier across restarts (`STATE/instance-HASH`, one per exported
//! directory).
//!
//! Clients must learn when a server may have lost writes it acknowledged but had not made
//! durable (they then fail fsync and close instead of reporting success; see
//! `hoardfs_fs::durability`). That happens only when the server did not stop cleanly, so
//! the verifier is kept across clean restarts: at start the file is marked `running`, and
//! only after a clean stop has made every written byte durable (`sync(2)`: an export may
//! span file systems) is it marked `clean`. A start that finds `running` (a crash, `kill -9`, power loss) picks a new
//! verifier. The file is locked while a server runs; a second server of the same directory
//! uses a verifier of its own and keeps nothing.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// A running server's verifier and, if it owns the record, the locked file.
pub struct Instance {
    /// The verifier to announce.
    pub verifier: u64,
    file: Option<File>,
}

impl Instance {
    /// Loads (or creates) the record for `export` in `state_dir` and marks it running.
    pub fn start(state_dir: &Path, export: &Path) -> Instance {
        let name = format!(
            "instance-{:016x}",
            xxhash_rust::xxh3::xxh3_64(export.as_os_str().as_encoded_bytes())
        );
        let path = state_dir.join(name);
        let fresh = hoardfs_server::random_verifier();
        let opened = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path);
        let mut file = match opened {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(
                    "cannot keep the write verifier in {}: {e}; clients will treat every \
                     restart as a crash",
                    path.display()
                );
                return Instance {
                    verifier: fresh,
                    file: None,
                };
            }
        };
        // SAFETY: flock on a descriptor we own.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            tracing::warn!(
                "another server of this directory holds {}: using a verifier of our own",
                path.display()
            );
            return Instance {
                verifier: fresh,
                file: None,
            };
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let mut words = text.split_whitespace();
        let verifier = match (
            words.next().and_then(|v| u64::from_str_radix(v, 16).ok()),
            words.next(),
        ) {
            (Some(v), Some("clean")) if v != 0 => v,
            (Some(_), _) => {
                tracing::warn!(
                    "the previous server of this directory did not stop cleanly: clients with \
                     unsynced writes will see their fsync or close fail"
                );
                fresh
            }
            _ => fresh,
        };
        let mut inst = Instance {
            verifier,
            file: Some(file),
        };
        if let Err(e) = inst.mark("running") {
            tracing::warn!(
                "cannot record the server as running in {}: {e}",
                path.display()
            );
            // The record may still say "clean": a crash now must not keep this verifier.
            inst.verifier = fresh;
            inst.file = None;
        }
        inst
    }

    fn mark(&mut self, state: &str) -> std::io::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        f.set_len(0)?;
        f.rewind()?;
        writeln!(f, "{:016x} {state}", self.verifier)?;
        f.sync_all()
    }

    /// After a clean stop: makes everything written durable, then records the stop as clean
    /// so that the next start keeps the verifier. `sync(2)`, not `syncfs` of the export: an
    /// export may span several file systems (mounts below its root).
    pub fn stopped_cleanly(mut self, export: &Path) {
        if File::open(export).is_err() {
            return;
        }
        // SAFETY: sync has no preconditions; it returns once dirty data is written back.
        unsafe { libc::sync() };
        if let Err(e) = self.mark("clean") {
            tracing::warn!("cannot record the clean stop: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verifier_survives_clean_stops_only() {
        let t = tempfile::tempdir().unwrap();
        let export = t.path().join("export");
        std::fs::create_dir(&export).unwrap();
        let a = Instance::start(t.path(), &export);
        let v = a.verifier;
        // While it runs, a second server of the same directory gets its own.
        let b = Instance::start(t.path(), &export);
        assert_ne!(b.verifier, v);
        drop(b);
        a.stopped_cleanly(&export);
        let c = Instance::start(t.path(), &export);
        assert_eq!(c.verifier, v, "a clean stop keeps the verifier");
        // Crash: dropped without a clean stop.
        drop(c);
        let d = Instance::start(t.path(), &export);
        assert_ne!(d.verifier, v, "a crash changes it");
        // Another export has its own record.
        let other = t.path().join("other");
        std::fs::create_dir(&other).unwrap();
        assert_ne!(Instance::start(t.path(), &other).verifier, d.verifier);
    }
}
