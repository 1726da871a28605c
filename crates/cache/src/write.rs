//! Writes through this client: keeping a cached object in step with the origin when the
//! client itself changed the file, so that reading back what it wrote is a cache hit.
//!
//! The origin reports, with every write, the file's version just before and just after it,
//! taken under its per-file write lock. If the object holds exactly the "before" version,
//! the object plus this write *is* the "after" version: the bytes are written into the
//! data file and the object moves to the new version in place. Otherwise somebody else
//! changed the file meanwhile and the caller replaces the object.
//!
//! Crash safety: chunks a write touches are first recorded absent (the record is rewritten
//! before the data file changes), then the bytes are written, then the record moves to the
//! new version. Touched chunks become present again (with a fresh checksum) once every byte
//! of them is known; partly written chunks stay absent, their written ranges remembered in
//! memory only, and are fetched whole when read. The last, partial chunk of a file that
//! grows waits for [`CachedObject::seal`] (the writer's close) for its checksum.

use std::os::unix::fs::FileExt;

use crate::meta::{ObjectMeta, chunk_shift_for};
use crate::object::{CachedObject, State};
use crate::{CacheError, io_at};

impl CachedObject {
    /// Applies `data`, written at `offset` through this client, moving the object from
    /// `pre_version` to `post_version`/`post_size`. Returns false (and changes nothing) when
    /// the object does not hold `pre_version`, is retired, or cannot follow the new size.
    pub fn apply_write(
        &self,
        pre_version: u64,
        offset: u64,
        data: &[u8],
        post_version: u64,
        post_size: u64,
    ) -> Result<bool, CacheError> {
        // Room for the written bytes (and the file's growth) is reserved first; without
        // room the caller replaces the object (an empty one costs nothing).
        let growth = post_size.saturating_sub(self.size());
        let want = (data.len() as u64)
            .saturating_add(growth)
            .div_ceil(4096)
            .saturating_mul(4096);
        if !self.store.reserve(want) {
            return Ok(false);
        }
        let r = self.apply_write_reserved(pre_version, offset, data, post_version, post_size);
        let delta = r.as_ref().map_or(0, |(_, d)| *d);
        self.store.settle(&self.key, want, delta);
        r.map(|(applied, _)| applied)
    }

    fn apply_write_reserved(
        &self,
        pre_version: u64,
        offset: u64,
        data: &[u8],
        post_version: u64,
        post_size: u64,
    ) -> Result<(bool, i64), CacheError> {
        let mut st = self.state.lock();
        // (A write ending past the largest file size cannot be followed: the caller
        // replaces the object.)
        let Some(end) = offset.checked_add(data.len() as u64) else {
            return Ok((false, 0));
        };
        if st.retired
            || st.meta.version != pre_version
            || post_size < st.meta.size
            || post_size < end
            || chunk_shift_for(post_size) != st.meta.chunk_shift
        {
            return Ok((false, 0));
        }
        let r = self.apply_locked(&mut st, offset, data, post_version, post_size);
        if r.is_err() {
            // The data file may be half written: nothing of this object can be trusted.
            st.retired = true;
            st.meta = ObjectMeta::empty(st.meta.key, 0, st.meta.size);
            let _ = self.meta_file.write_all_at(&st.meta.encode(), 0);
        }
        let delta = self.recharge(&mut st);
        r.map(|()| (true, delta))
    }

    fn apply_locked(
        &self,
        st: &mut State,
        offset: u64,
        data: &[u8],
        post_version: u64,
        post_size: u64,
    ) -> Result<(), CacheError> {
        let end = offset + data.len() as u64;
        let old_size = st.meta.size;
        // Chunks whose bytes or length change: those the write touches and, when the file
        // grows, the old last (partial) chunk. Their present bytes stay valid as `known`.
        let mut touched: Vec<u64> = Vec::new();
        if !data.is_empty() {
            touched.extend((offset >> st.meta.chunk_shift)..=((end - 1) >> st.meta.chunk_shift));
        }
        if post_size > old_size && !old_size.is_multiple_of(st.meta.chunk_size()) {
            touched.push(old_size >> st.meta.chunk_shift);
        }
        let mut cleared = false;
        for &c in &touched {
            if st.meta.is_present(c) {
                let (a, b) = st.meta.chunk_range(c);
                st.known.insert(a, b);
                st.meta.clear(c);
                cleared = true;
            }
        }
        if cleared {
            self.meta_file
                .write_all_at(&st.meta.encode(), 0)
                .map_err(io_at(&self.meta_path))?;
        }
        if post_size > old_size {
            self.data
                .set_len(post_size)
                .map_err(io_at(&self.data_path))?;
            // What the file grew by reads as zeros (on the origin as in the data file),
            // except where this write puts its bytes.
            st.known.insert(old_size, post_size);
        }
        self.data
            .write_all_at(data, offset)
            .map_err(io_at(&self.data_path))?;
        st.known.insert(offset, end);
        st.meta = st.meta.resized(post_size, post_version);
        touched.extend(old_size >> st.meta.chunk_shift..st.meta.chunks());
        touched.sort_unstable();
        touched.dedup();
        // The last chunk of a file that grows is left to `seal` (the writer's close):
        // checksummed after every write, a file written in small appends would be read
        // back and checksummed over and over.
        let last_partial = |c: u64, b: u64| {
            b == post_size && b - (c << st.meta.chunk_shift) < st.meta.chunk_size()
        };
        let grows = post_size > old_size;
        touched.retain(|&c| !(grows && last_partial(c, st.meta.chunk_range(c).1)));
        self.checksum_known(st, touched)?;
        self.meta_file
            .write_all_at(&st.meta.encode(), 0)
            .map_err(io_at(&self.meta_path))?;
        Ok(())
    }

    /// Makes present, with a fresh checksum, each of `chunks` that is absent and whose
    /// bytes are all known (the record is not written).
    fn checksum_known(
        &self,
        st: &mut State,
        chunks: impl IntoIterator<Item = u64>,
    ) -> Result<bool, CacheError> {
        let mut buf = Vec::new();
        let mut changed = false;
        for c in chunks {
            let (a, b) = st.meta.chunk_range(c);
            if c >= st.meta.chunks() || st.meta.is_present(c) || !st.known.covers(a, b) {
                continue;
            }
            buf.resize((b - a) as usize, 0);
            self.data
                .read_exact_at(&mut buf, a)
                .map_err(io_at(&self.data_path))?;
            st.meta.set_present(c, crc32c::crc32c(&buf));
            st.known.remove(a, b);
            changed = true;
        }
        Ok(changed)
    }

    /// The writer is done (its close): every chunk whose bytes are all known (the last,
    /// partial chunk of a file that grew) becomes present, so the file written here reads
    /// back from the cache whole.
    pub fn seal(&self) -> Result<(), CacheError> {
        let mut st = self.state.lock();
        if st.retired {
            return Ok(());
        }
        let chunks = 0..st.meta.chunks();
        if self.checksum_known(&mut st, chunks)? {
            self.meta_file
                .write_all_at(&st.meta.encode(), 0)
                .map_err(io_at(&self.meta_path))?;
        }
        Ok(())
    }
}

impl ObjectMeta {
    /// The record for the same object grown to `size` at `version`: full chunks keep their
    /// presence; a chunk whose length changes is absent. The chunk shift must suit `size`.
    pub fn resized(&self, size: u64, version: u64) -> ObjectMeta {
        let mut m = ObjectMeta::empty(self.key, version, size);
        m.chunk_shift = self.chunk_shift;
        let n = size.div_ceil(self.chunk_size());
        m.present = vec![0; (n as usize).div_ceil(8)];
        m.crcs = vec![0; n as usize];
        for c in 0..n.min(self.chunks()) {
            if self.is_present(c) && self.chunk_range(c) == m.chunk_range(c) {
                m.set_present(c, self.crcs[c as usize]);
            }
        }
        m
    }
}
