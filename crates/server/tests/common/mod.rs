//! Shared test harness: a server running on its own runtime thread, and a small in-memory
//! fake [`Origin`] whose `slow` file takes a while to read.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use hoardfs_origin::remote::{RemoteOptions, RemoteOrigin, Security};
use hoardfs_origin::{
    Attr, DirEntry, DirPage, Entry, FileKind, Handle, Origin, OriginInfo, ReadReply, Result,
    ServerCounters, StatFs, Timestamp, WireError,
};
use hoardfs_server::{OriginCounters, Server, ServerConfig, Stats};
use tokio::sync::oneshot;

/// A server serving on a background thread until dropped.
pub struct Running {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Running {
    /// Starts a server on `cfg.listen` (use port 0).
    pub fn start(
        cfg: ServerConfig,
        origin: Arc<dyn Origin>,
        oc: Option<OriginCounters>,
    ) -> Running {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut server = Server::bind(cfg, origin).await.unwrap();
                if let Some(f) = oc {
                    server = server.with_origin_counters(f);
                }
                ready_tx
                    .send((server.local_addr().unwrap(), server.stats()))
                    .unwrap();
                server
                    .run_until(async move {
                        let _ = stop_rx.await;
                    })
                    .await
                    .unwrap();
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        let (addr, stats) = ready_rx.recv().unwrap();
        Running {
            addr,
            stats,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// Stops the server and waits until it is gone.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }

    /// A client with short timeouts.
    pub fn client(&self, token: &[u8]) -> Result<RemoteOrigin> {
        RemoteOrigin::connect(
            &self.addr.to_string(),
            Security::plaintext(token.to_vec()),
            opts(),
        )
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Client options used by the tests.
pub fn opts() -> RemoteOptions {
    RemoteOptions {
        connect_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(10),
        reconnect_backoff: Duration::from_millis(100),
    }
}

/// Config on an ephemeral loopback port.
pub fn config(token: Option<&[u8]>) -> ServerConfig {
    ServerConfig {
        token: token.map(<[u8]>::to_vec),
        ..ServerConfig::new("127.0.0.1:0".parse().unwrap())
    }
}

/// Polls `cond` for up to [`hoardfs_testutil::PROMPTLY`].
pub fn eventually(cond: impl FnMut() -> bool) -> bool {
    hoardfs_testutil::wait_until(hoardfs_testutil::PROMPTLY, cond)
}

pub const EPOCH: u64 = 77;
pub const ROOT: Handle = Handle {
    epoch: EPOCH,
    id: 1,
};
pub const FILE: Handle = Handle {
    epoch: EPOCH,
    id: 2,
};
pub const LINK: Handle = Handle {
    epoch: EPOCH,
    id: 3,
};
pub const SLOW: Handle = Handle {
    epoch: EPOCH,
    id: 4,
};
/// How long reading `slow` takes.
pub const SLOW_READ: Duration = Duration::from_millis(1500);

/// Content of `file`: 1 MiB of a position-dependent pattern.
pub fn file_content() -> Vec<u8> {
    (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect()
}

/// In-memory tree: `/file` (1 MiB), `/link -> file`, `/slow` (reads take [`SLOW_READ`]).
pub struct FakeOrigin {
    content: Vec<u8>,
    pub reads: AtomicU64,
}

impl FakeOrigin {
    pub fn new() -> FakeOrigin {
        FakeOrigin {
            content: file_content(),
            reads: AtomicU64::new(0),
        }
    }

    pub fn counters(&self) -> ServerCounters {
        ServerCounters {
            reads: self.reads.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    fn attr(&self, h: Handle) -> Result<Attr> {
        if h.epoch != EPOCH {
            return Err(WireError::Stale.into());
        }
        let (kind, size) = match h.id {
            1 => (FileKind::Dir, 0),
            2 => (FileKind::File, self.content.len() as u64),
            3 => (FileKind::Symlink, 4),
            4 => (FileKind::File, 3),
            _ => return Err(WireError::Stale.into()),
        };
        let t = Timestamp {
            secs: 1_700_000_000,
            nanos: 0,
        };
        Ok(Attr {
            file_id: 100 + h.id,
            version: 1,
            kind,
            perm: 0o644,
            nlink: 1,
            uid: 0,
            gid: 0,
            size,
            blocks: size.div_ceil(512),
            rdev: 0,
            blksize: 4096,
            atime: t,
            mtime: t,
            ctime: t,
            acl: false,
        })
    }

    fn entry(&self, h: Handle) -> Result<Entry> {
        Ok(Entry {
            handle: h,
            attr: self.attr(h)?,
        })
    }
}

const NAMES: [(&[u8], Handle); 3] = [(b"file", FILE), (b"link", LINK), (b"slow", SLOW)];

impl Origin for FakeOrigin {
    fn info(&self) -> Result<OriginInfo> {
        Ok(OriginInfo {
            verifier: 0,
            export_id: 5,
            root: self.entry(ROOT)?,
            read_only: true,
            identities: hoardfs_proto::Identities::Server,
        })
    }

    fn lookup(&self, parent: Handle, name: &[u8]) -> Result<Entry> {
        if self.attr(parent)?.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        let h = NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or(WireError::NotFound)?
            .1;
        self.entry(h)
    }

    fn getattr(&self, handle: Handle) -> Result<Attr> {
        self.attr(handle)
    }

    fn readdir(&self, dir: Handle, cookie: u64, max_entries: u32) -> Result<DirPage> {
        if self.attr(dir)?.kind != FileKind::Dir {
            return Err(WireError::NotDir.into());
        }
        let start = cookie as usize;
        let end = (start + max_entries as usize).min(NAMES.len());
        let entries = NAMES[start.min(end)..end]
            .iter()
            .map(|(n, h)| {
                Ok(DirEntry {
                    name: n.to_vec(),
                    entry: self.entry(*h)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let next = (end < NAMES.len()).then_some(end as u64);
        Ok(DirPage { entries, next })
    }

    fn read(&self, handle: Handle, offset: u64, len: u32) -> Result<ReadReply> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let data: &[u8] = match self.attr(handle)?.kind {
            FileKind::File if handle == SLOW => {
                thread::sleep(SLOW_READ);
                b"zzz"
            }
            FileKind::File => &self.content,
            FileKind::Dir => return Err(WireError::IsDir.into()),
            _ => return Err(WireError::Invalid.into()),
        };
        let start = (offset as usize).min(data.len());
        let end = start.saturating_add(len as usize).min(data.len());
        Ok(ReadReply {
            data: data[start..end].to_vec(),
            version: 1,
        })
    }

    fn readlink(&self, handle: Handle) -> Result<Vec<u8>> {
        match self.attr(handle)?.kind {
            FileKind::Symlink => Ok(b"file".to_vec()),
            _ => Err(WireError::Invalid.into()),
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(StatFs {
            blocks: 10,
            bsize: 4096,
            namelen: 255,
            ..Default::default()
        })
    }
}
