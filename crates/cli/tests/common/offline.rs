//! Helpers of the `--offline-writes` suites.

use std::path::Path;

use super::{Mount, stats, tool};

/// A mount of `addr` with `--offline-writes` (and a short timeout, so that a cut link is
/// noticed quickly), at `t/mnt` with its cache in `t/cache`.
pub fn mount(addr: &str, t: &Path) -> Mount {
    mount_with(addr, t, &[])
}

/// [`mount`] with `extra` arguments.
pub fn mount_with(addr: &str, t: &Path, extra: &[&str]) -> Mount {
    let mut args = vec!["--offline-writes", "--timeout", "2"];
    args.extend_from_slice(extra);
    Mount::with_cache(addr, &t.join("mnt"), &t.join("cache"), &args)
}

/// The offline log's part of `hoardfs stats --json`.
pub fn offline(m: &Mount) -> serde_json::Value {
    stats(m)["offline_writes"].clone()
}

/// `hoardfs sync MNT --timeout T`: whether it succeeded, and its stderr.
pub fn sync(m: &Mount, timeout: &str) -> (bool, String) {
    let (ok, _, err) = tool(&["sync", m.path.to_str().unwrap(), "--timeout", timeout]);
    (ok, err)
}
