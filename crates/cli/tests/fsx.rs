//! fsx-style random test of the write path: one file on a hoardfs mount and an in-memory
//! reference copy, driven by a seeded PRNG through random `pwrite`s (1 B to 256 KiB, offsets
//! up to 4 MiB), `pread`s, `ftruncate`s (shrinking and growing), close and reopen (sometimes
//! with an `O_APPEND` write in between), `MAP_SHARED` `mmap` writes and reads with `msync`,
//! and `fsync`s. After every operation the affected bytes and the size, read back through
//! the mount, must equal the reference; the whole file is compared every few operations, the
//! server's copy after every `fsync` and at the end, and the mount's view again after
//! dropping the page cache and after a remount on the same cache directory. One operation
//! in twenty races a client `pwrite` with a `pwrite` by a process on the server to another
//! range of the file; the mount must then promptly show both.
//!
//! `HOARDFS_FSX_SEED` replays a seed (printed on failure), `HOARDFS_FSX_OPS` sets the number
//! of operations (default 2000), `HOARDFS_FSX_NO_MMAP=1` leaves out the mmap operations.

mod common;

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;

use common::rng::Rng;
use common::*;

/// Largest offset a write starts at.
const MAX_OFF: u64 = 4 << 20;
/// Largest single write, read or mapping.
const MAX_LEN: u64 = 256 << 10;
/// Largest size a truncate grows the file to.
const MAX_SIZE: u64 = MAX_OFF + MAX_LEN;
/// The whole file is compared through the mount every this many operations.
const FULL_CHECK_EVERY: usize = 64;
/// Operations kept for the failure report.
const LOG_TAIL: usize = 40;

/// A length in `1..=MAX_LEN`, log-uniform so that small and page-sized I/O is common.
fn io_len(rng: &mut Rng) -> u64 {
    let bits = rng.below(19); // 2^0 ..= 2^18 = 256 KiB
    1 + rng.below(1 << bits)
}

struct Fsx {
    seed: u64,
    ops: usize,
    rng: Rng,
    mmap: bool,
    /// The file on the mount, and the server's copy of it.
    path: PathBuf,
    server_path: PathBuf,
    file: Option<File>,
    /// What the file must contain.
    model: Vec<u8>,
    step: usize,
    log: VecDeque<String>,
}

impl Fsx {
    fn note(&mut self, op: String) {
        if self.log.len() == LOG_TAIL {
            self.log.pop_front();
        }
        self.log.push_back(format!("#{:<5} {op}", self.step));
    }

    fn fail(&self, msg: String) -> ! {
        panic!(
            "fsx failed at op #{} of {}: {msg}\n\
             replay: HOARDFS_FSX_SEED={} HOARDFS_FSX_OPS={} cargo test -p hoardfs --test fsx\n\
             file size in the reference: {}\nlast {} ops:\n{}",
            self.step,
            self.ops,
            self.seed,
            self.ops,
            self.model.len(),
            self.log.len(),
            self.log.iter().cloned().collect::<Vec<_>>().join("\n")
        )
    }

    fn file(&self) -> &File {
        self.file.as_ref().expect("file is open")
    }

    /// `got` must equal the reference's bytes starting at `off` (`what` names the view).
    fn compare(&self, what: &str, off: usize, got: &[u8]) {
        let end = (off + got.len()).min(self.model.len());
        let want = &self.model[off.min(end)..end];
        if let Some(d) = first_diff(got, want) {
            let show = |v: &[u8]| format!("{:02x?}", &v[d.min(v.len())..(d + 16).min(v.len())]);
            self.fail(format!(
                "{what}: first difference at file offset {} (read {} bytes at {off}, \
                 reference has {}): got {} want {}",
                off + d,
                got.len(),
                want.len(),
                show(got),
                show(want)
            ));
        }
    }

    /// Reads `len` bytes at `off` through the open descriptor (short only at EOF) and compares
    /// them, including where the file ends.
    fn check_range(&self, what: &str, off: u64, len: u64) {
        let mut buf = vec![0u8; len as usize];
        let mut n = 0;
        while n < buf.len() {
            match self.file().read_at(&mut buf[n..], off + n as u64) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) => self.fail(format!("{what}: pread {off:#x}+{len:#x}: {e}")),
            }
        }
        buf.truncate(n);
        let want = (self.model.len() as u64).saturating_sub(off).min(len) as usize;
        if n != want {
            self.fail(format!(
                "{what}: pread {off:#x}+{len:#x} returned {n} bytes, want {want} \
                 (reference size {})",
                self.model.len()
            ));
        }
        self.compare(what, off as usize, &buf);
    }

    fn check_size(&self, what: &str) {
        let size = match self.file().metadata() {
            Ok(md) => md.len(),
            Err(e) => self.fail(format!("{what}: fstat: {e}")),
        };
        if size != self.model.len() as u64 {
            self.fail(format!(
                "{what}: fstat size {size}, want {}",
                self.model.len()
            ));
        }
    }

    /// The whole file through the open descriptor, or through a fresh open of the path.
    fn check_all(&self, what: &str, fresh_open: bool) {
        self.check_size(what);
        if fresh_open {
            match std::fs::read(&self.path) {
                Ok(got) => {
                    if got.len() != self.model.len() {
                        self.fail(format!(
                            "{what}: read of the path gave {} bytes, want {}",
                            got.len(),
                            self.model.len()
                        ));
                    }
                    self.compare(what, 0, &got);
                }
                Err(e) => self.fail(format!("{what}: read {}: {e}", self.path.display())),
            }
        } else {
            self.check_range(what, 0, self.model.len() as u64 + 1);
        }
    }

    fn check_server(&self, what: &str) {
        let got = std::fs::read(&self.server_path)
            .unwrap_or_else(|e| self.fail(format!("{what}: read the server's copy: {e}")));
        if got.len() != self.model.len() {
            self.fail(format!(
                "{what}: the server's copy has {} bytes, want {}",
                got.len(),
                self.model.len()
            ));
        }
        self.compare(what, 0, &got);
    }

    fn open(&self, append: bool) -> File {
        let mut o = OpenOptions::new();
        if append {
            o.append(true);
        } else {
            o.read(true).write(true);
        }
        o.open(&self.path)
            .unwrap_or_else(|e| self.fail(format!("open (append={append}): {e}")))
    }

    fn write_model(&mut self, off: usize, data: &[u8]) {
        if self.model.len() < off + data.len() {
            self.model.resize(off + data.len(), 0);
        }
        self.model[off..off + data.len()].copy_from_slice(data);
    }

    fn op_write(&mut self) {
        let len = io_len(&mut self.rng);
        let off = if !self.model.is_empty() && self.rng.below(2) == 0 {
            self.rng.below(self.model.len() as u64)
        } else {
            self.rng.below(MAX_OFF)
        };
        self.note(format!("pwrite    {off:#9x} +{len:#x}"));
        let data = self.rng.bytes(len as usize);
        if let Err(e) = self.file().write_all_at(&data, off) {
            self.fail(format!("pwrite: {e}"));
        }
        self.write_model(off as usize, &data);
        self.check_size("after pwrite");
        self.check_range("pwrite read-back", off.saturating_sub(100), len + 200);
    }

    /// A client `pwrite` racing a `pwrite` by a process on the server (a thread of this
    /// test writing the server's copy directly) to a disjoint range of the file. Once both
    /// returned, the mount must show both promptly (callbacks) and never settle on bytes
    /// that differ from the server's.
    fn op_race(&mut self) {
        let size = self.model.len() as u64;
        if size < 8192 {
            return self.op_write();
        }
        let half = size / 2;
        let (slen, clen) = (
            io_len(&mut self.rng).min(half),
            io_len(&mut self.rng).min(half),
        );
        let at = |rng: &mut Rng, lo: u64, hi: u64, len: u64| lo + rng.below(hi - lo - len + 1);
        let (soff, coff) = if self.rng.below(2) == 0 {
            (
                at(&mut self.rng, 0, half, slen),
                at(&mut self.rng, half, size, clen),
            )
        } else {
            (
                at(&mut self.rng, half, size, slen),
                at(&mut self.rng, 0, half, clen),
            )
        };
        let delay = std::time::Duration::from_micros(self.rng.below(2000));
        self.note(format!(
            "race      client {coff:#9x} +{clen:#x}, server-local {soff:#x} +{slen:#x} after {delay:?}"
        ));
        let (sdata, cdata) = (self.rng.bytes(slen as usize), self.rng.bytes(clen as usize));
        let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
        let server_path = self.server_path.clone();
        let (b, sd) = (barrier.clone(), sdata.clone());
        let local = std::thread::spawn(move || {
            let f = OpenOptions::new().write(true).open(&server_path)?;
            b.wait();
            std::thread::sleep(delay);
            f.write_all_at(&sd, soff)
        });
        barrier.wait();
        let r = self.file().write_all_at(&cdata, coff);
        if let Err(e) = local.join().unwrap() {
            self.fail(format!("server-local pwrite: {e}"));
        }
        if let Err(e) = r {
            self.fail(format!("pwrite: {e}"));
        }
        self.write_model(soff as usize, &sdata);
        self.write_model(coff as usize, &cdata);
        let mut got = Vec::new();
        let agreed = hoardfs_testutil::wait_until(PROMPTLY, || {
            got = std::fs::read(&self.path)
                .unwrap_or_else(|e| self.fail(format!("read after the race: {e}")));
            first_diff(&got, &self.model).is_none() && got.len() == self.model.len()
        });
        if !agreed {
            self.compare("after the race, through a fresh open", 0, &got);
            self.fail("after the race: the mount's size differs".into());
        }
    }

    fn op_read(&mut self) {
        let off = self.rng.below(self.model.len() as u64 + MAX_LEN);
        let len = io_len(&mut self.rng);
        self.note(format!("pread     {off:#9x} +{len:#x}"));
        self.check_range("pread", off, len);
    }

    fn op_truncate(&mut self) {
        let old = self.model.len() as u64;
        let new = match self.rng.below(3) {
            0 => self.rng.below(old + 1),
            1 => old + self.rng.below(MAX_SIZE - old.min(MAX_SIZE) + 1),
            _ => self.rng.below(MAX_SIZE + 1),
        };
        self.note(format!("ftruncate {old:#9x} -> {new:#x}"));
        if let Err(e) = self.file().set_len(new) {
            self.fail(format!("ftruncate: {e}"));
        }
        self.model.resize(new as usize, 0);
        self.check_size("after ftruncate");
        let (lo, hi) = (old.min(new), old.max(new));
        let from = lo.saturating_sub(4096);
        self.check_range(
            "around the truncation",
            from,
            (hi - from + 4096).min(2 * MAX_LEN),
        );
    }

    fn op_reopen(&mut self) {
        let append = self.rng.below(3) == 0;
        self.note(format!(
            "close+reopen{}",
            if append {
                " with an O_APPEND write"
            } else {
                ""
            }
        ));
        if let Err(e) = close_checked(self.file.take().expect("open")) {
            self.fail(format!("close: {e}"));
        }
        if append {
            let len = io_len(&mut self.rng);
            let data = self.rng.bytes(len as usize);
            let at = self.model.len();
            self.note(format!("  append  {at:#9x} +{len:#x}"));
            let mut f = self.open(true);
            if let Err(e) = f.write_all(&data) {
                self.fail(format!("O_APPEND write: {e}"));
            }
            if let Err(e) = close_checked(f) {
                self.fail(format!("close after O_APPEND write: {e}"));
            }
            self.write_model(at, &data);
            self.file = Some(self.open(false));
            self.check_size("after O_APPEND write");
            self.check_range("O_APPEND read-back", at as u64, len);
        } else {
            self.file = Some(self.open(false));
            self.check_size("after reopen");
            let off = self.rng.below(self.model.len() as u64 + 1);
            self.check_range("after reopen", off, MAX_LEN);
        }
    }

    fn op_mmap(&mut self) {
        if self.model.is_empty() {
            self.note("mmap skipped (empty file)".into());
            return;
        }
        let size = self.model.len() as u64;
        let off = self.rng.below(size);
        let len = io_len(&mut self.rng).min(size - off);
        let write = self.rng.below(2) == 0;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
        let map_off = off & !(page - 1);
        let map_len = (off + len - map_off) as usize;
        let at = (off - map_off) as usize;
        self.note(format!(
            "mmap {}{off:#9x} +{len:#x}",
            if write { "write " } else { "read  " }
        ));
        // SAFETY: a fresh shared mapping of an open descriptor; the mapped range lies within
        // the file, so no access below can fault (SIGBUS) while the size is unchanged.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.file().as_raw_fd(),
                map_off as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            self.fail(format!("mmap: {}", std::io::Error::last_os_error()));
        }
        // SAFETY: ptr maps map_len bytes, readable and writable, until munmap below.
        let mapped = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<u8>(), map_len) };
        let result = if write {
            let data = self.rng.bytes(len as usize);
            mapped[at..].copy_from_slice(&data);
            // SAFETY: the range is the mapping created above.
            let rc = unsafe { libc::msync(ptr, map_len, libc::MS_SYNC) };
            let msync = if rc == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            };
            self.write_model(off as usize, &data);
            msync
        } else {
            let got = mapped[at..].to_vec();
            self.compare("read through mmap", off as usize, &got);
            Ok(())
        };
        // SAFETY: unmaps exactly the mapping created above; `mapped` is not used again.
        let rc = unsafe { libc::munmap(ptr, map_len) };
        if let Err(e) = result {
            self.fail(format!("msync: {e}"));
        }
        if rc != 0 {
            self.fail(format!("munmap: {}", std::io::Error::last_os_error()));
        }
        self.check_size("after mmap");
        self.check_range("pread after mmap", off.saturating_sub(100), len + 200);
    }

    fn op_fsync(&mut self) {
        let data_only = self.rng.below(2) == 0;
        self.note(if data_only { "fdatasync" } else { "fsync" }.into());
        let r = if data_only {
            self.file().sync_data()
        } else {
            self.file().sync_all()
        };
        if let Err(e) = r {
            self.fail(format!("fsync: {e}"));
        }
        // Write-through: once fsync returned, the server's disk has every byte.
        self.check_server("server copy after fsync");
    }

    fn run_one(&mut self) {
        let roll = self.rng.below(100);
        match roll {
            0..35 => self.op_write(),
            35..50 => self.op_read(),
            50..60 => self.op_truncate(),
            60..70 => self.op_reopen(),
            70..90 if self.mmap => self.op_mmap(),
            70..90 => self.op_write(),
            90..95 => self.op_race(),
            _ => self.op_fsync(),
        }
        if self.step % FULL_CHECK_EVERY == FULL_CHECK_EVERY - 1 {
            let fresh = self.step / FULL_CHECK_EVERY % 2 == 1;
            self.check_all("periodic full compare", fresh);
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

#[test]
fn random_operations_match_an_in_memory_reference() {
    require_fuse();
    let seed = env_u64("HOARDFS_FSX_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    });
    let ops = env_u64("HOARDFS_FSX_OPS").unwrap_or(2000) as usize;
    let mmap = !std::env::var("HOARDFS_FSX_NO_MMAP").is_ok_and(|v| !v.is_empty() && v != "0");
    eprintln!("fsx: seed {seed}, {ops} ops, mmap {mmap}");

    let t = scratch();
    let exp = t.path().join("export");
    std::fs::create_dir_all(&exp).unwrap();
    let srv = Server::start(&exp);
    let (mnt, cache) = (t.path().join("mnt"), t.path().join("cache"));
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    let path = m.p("fsx.bin");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&path)
        .expect("create the test file");
    let mut fsx = Fsx {
        seed,
        ops,
        rng: Rng(seed),
        mmap,
        path,
        server_path: exp.join("fsx.bin"),
        file: Some(file),
        model: Vec::new(),
        step: 0,
        log: VecDeque::new(),
    };
    let started = std::time::Instant::now();
    while fsx.step < ops {
        fsx.run_one();
        fsx.step += 1;
    }

    fsx.note("final: close".into());
    fsx.check_all("final compare on the open descriptor", false);
    if let Err(e) = close_checked(fsx.file.take().unwrap()) {
        fsx.fail(format!("final close: {e}"));
    }
    fsx.file = Some(fsx.open(false));
    fsx.check_all("final compare after reopen", true);
    fsx.check_server("server copy at the end");
    drop_caches();
    fsx.check_all("final compare after drop_caches", true);
    drop(fsx.file.take());

    fsx.note("final: remount on the same cache".into());
    m.unmount();
    let m = Mount::with_cache(&srv.addr, &mnt, &cache, &[]);
    drop_caches();
    fsx.file = Some(fsx.open(false));
    fsx.check_all("after remount", true);
    fsx.check_all("after remount, through the descriptor", false);
    fsx.check_server("server copy after remount");
    drop(fsx.file.take());
    eprintln!(
        "fsx: {ops} ops in {:.1} s, final size {}",
        started.elapsed().as_secs_f64(),
        fsx.model.len()
    );
    m.unmount();
}
