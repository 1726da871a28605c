//! The hoardfs server: exports any [`Origin`] (in practice a `LocalOrigin`) over TCP.
//!
//! Every accepted connection is served by its own task (module `conn`): a reader parses
//! request frames, each request runs concurrently on tokio's blocking pool (origin calls are
//! blocking syscalls) bounded by [`ServerConfig::max_in_flight_per_conn`], and a writer task
//! sends the replies in completion order. The first frame must be a `Hello` with the right
//! protocol version and token; a peer that breaks the protocol loses its connection (and
//! bumps the `bad_frames` counter) while everybody else is served on.
//!
//! The CLI uses [`run_blocking`]; tests and embedders use [`Server`] directly.

mod callbacks;
mod conn;
mod decode;
mod handle;

pub use decode::{Decoded, Phase, decode_frame, decode_request};

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hoardfs_origin::Origin;
use hoardfs_proto::{DEFAULT_PORT, ServerCounters};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tokio::task::JoinSet;

/// How a server listens and whom it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// Address to bind (port 0 picks a free port).
    pub listen: SocketAddr,
    /// Shared secret clients must present in `Hello`; `None` accepts everyone.
    pub token: Option<Vec<u8>>,
    /// Announce the export as read-only (it is also read-only if the origin says so).
    pub read_only: bool,
    /// Requests of one connection that may run at the same time; further requests wait
    /// unread in the socket (back-pressure on that client only).
    pub max_in_flight_per_conn: usize,
    /// Send file data with `sendfile(2)` (no copy through the server's memory) for files
    /// unchanged for at least this long; `None` copies every read. Files changed more
    /// recently are read and copied, so that a write landing while the kernel copies the
    /// bytes is caught by the version check (see doc/SEMANTICS.md).
    pub zero_copy: Option<Duration>,
}

/// How long a file must have been unchanged before its reads are sent with `sendfile`.
pub const ZERO_COPY_QUIET: Duration = Duration::from_secs(2);

impl ServerConfig {
    /// Defaults with the given listen address.
    pub fn new(listen: SocketAddr) -> ServerConfig {
        ServerConfig {
            listen,
            ..ServerConfig::default()
        }
    }
}

impl Default for ServerConfig {
    /// All interfaces on [`DEFAULT_PORT`], no token, writable, 64 requests in flight,
    /// zero-copy for files unchanged for [`ZERO_COPY_QUIET`].
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)),
            token: None,
            read_only: false,
            max_in_flight_per_conn: 64,
            zero_copy: Some(ZERO_COPY_QUIET),
        }
    }
}

/// Supplies the origin's share of the counters (reads, bytes_read, opens), e.g.
/// `Arc::new(move || local.counters())`.
pub type OriginCounters = Arc<dyn Fn() -> ServerCounters + Send + Sync>;

/// Counters the server keeps itself; the rest come from [`OriginCounters`].
#[derive(Debug, Default)]
pub struct Stats {
    connections: AtomicU64,
    requests: AtomicU64,
    bad_frames: AtomicU64,
    callbacks: Arc<callbacks::Callbacks>,
}

impl Stats {
    /// The server's own counters (origin fields are zero).
    pub fn snapshot(&self) -> ServerCounters {
        ServerCounters {
            connections: self.connections.load(Ordering::Relaxed),
            requests: self.requests.load(Ordering::Relaxed),
            bad_frames: self.bad_frames.load(Ordering::Relaxed),
            breaks_sent: self.callbacks.sent(),
            ..ServerCounters::default()
        }
    }

    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Everything a connection task needs.
pub(crate) struct Shared {
    pub(crate) origin: Arc<dyn Origin>,
    pub(crate) cfg: ServerConfig,
    pub(crate) stats: Arc<Stats>,
    pub(crate) origin_counters: Option<OriginCounters>,
    pub(crate) callbacks: Arc<callbacks::Callbacks>,
}

impl Shared {
    /// The server's counters merged with the origin's.
    pub(crate) fn counters(&self) -> ServerCounters {
        merge(&self.stats, self.origin_counters.as_ref())
    }
}

fn merge(stats: &Stats, origin: Option<&OriginCounters>) -> ServerCounters {
    let own = stats.snapshot();
    let o = origin.map(|f| f()).unwrap_or_default();
    ServerCounters {
        reads: o.reads,
        bytes_read: o.bytes_read,
        opens: o.opens,
        writes: o.writes,
        bytes_written: o.bytes_written,
        ..own
    }
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    origin: Arc<dyn Origin>,
    cfg: ServerConfig,
    stats: Arc<Stats>,
    origin_counters: Option<OriginCounters>,
}

impl Server {
    /// Binds `cfg.listen`.
    pub async fn bind(cfg: ServerConfig, origin: Arc<dyn Origin>) -> io::Result<Server> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Ok(Server::from_listener(listener, cfg, origin))
    }

    /// Serves on an already bound listener (`cfg.listen` is ignored).
    pub fn from_listener(
        listener: TcpListener,
        cfg: ServerConfig,
        origin: Arc<dyn Origin>,
    ) -> Server {
        Server {
            listener,
            origin,
            cfg,
            stats: Arc::default(),
            origin_counters: None,
        }
    }

    /// Sets where the origin's counters come from (otherwise they read as zero).
    pub fn with_origin_counters(mut self, f: OriginCounters) -> Server {
        self.origin_counters = Some(f);
        self
    }

    /// The address actually bound (useful with port 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// A handle on the server's own counters, valid after `run` consumed the server.
    pub fn stats(&self) -> Arc<Stats> {
        Arc::clone(&self.stats)
    }

    /// Current counters, the server's own merged with the origin's.
    pub fn counters(&self) -> ServerCounters {
        merge(&self.stats, self.origin_counters.as_ref())
    }

    /// Serves forever.
    pub async fn run(self) -> io::Result<()> {
        self.run_until(std::future::pending()).await
    }

    /// Serves until `shutdown` completes, then closes every connection.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) -> io::Result<()> {
        let callbacks = Arc::clone(&self.stats.callbacks);
        let sink = Arc::clone(&callbacks);
        if !self.origin.subscribe(Arc::new(move |b| sink.changed(b))) {
            tracing::warn!("the origin cannot report changes: clients will revalidate by time");
        }
        let shared = Arc::new(Shared {
            origin: self.origin,
            cfg: self.cfg,
            stats: self.stats,
            origin_counters: self.origin_counters,
            callbacks,
        });
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        conns.spawn(conn::serve(stream, peer, Arc::clone(&shared)));
                    }
                    Err(e) => {
                        // Typically EMFILE; keep serving the connections we have.
                        tracing::warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
            }
        }
        // Dropping the set aborts the connection tasks, which closes their sockets.
        drop(conns);
        Ok(())
    }
}

/// What the CLI calls: builds a multi-thread runtime, binds `cfg.listen`, calls
/// `on_ready` with the bound address (print the "serving" line there), and serves until
/// SIGINT or SIGTERM.
pub fn run_blocking(
    cfg: ServerConfig,
    origin: Arc<dyn Origin>,
    origin_counters: Option<OriginCounters>,
    on_ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let mut server = Server::bind(cfg, origin).await?;
        if let Some(f) = origin_counters {
            server = server.with_origin_counters(f);
        }
        // Handlers go in before anyone learns the address, so an early signal is not lost.
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        on_ready(server.local_addr()?);
        let stop = async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            tracing::info!("signal received, shutting down");
        };
        server.run_until(stop).await
    });
    // Origin calls still running on the blocking pool get a moment to finish.
    rt.shutdown_timeout(Duration::from_secs(1));
    result
}
