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

mod admission;
mod callbacks;
mod conn;
pub mod credentials;
mod decode;
mod handle;
mod handshakes;
mod idmap;
mod lock_requests;
mod locks;
mod outgoing;
pub mod tier;
mod units;

pub use hoardfs_proto::{ANON_ID, Squash};
pub use idmap::IdMapping;

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
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to bind (port 0 picks a free port).
    pub listen: SocketAddr,
    /// TLS 1.3 for every connection (see `hoardfs_tls::server_config`); `None` serves
    /// plaintext, which the CLI allows only with `--insecure-plaintext`.
    pub tls: Option<Arc<hoardfs_tls::rustls::ServerConfig>>,
    /// Shared secret clients may present in `Hello` (`--token-file`).
    pub token: Option<Vec<u8>>,
    /// Directory whose `tokens` file lists named, revocable credentials (module
    /// [`credentials`]). With neither this file nor `token`, everyone is accepted.
    pub tokens_dir: Option<std::path::PathBuf>,
    /// Announce the export as read-only (it is also read-only if the origin says so).
    pub read_only: bool,
    /// Write verifier announced in `Hello`: must change whenever acknowledged writes may
    /// have been lost (the CLI keeps it across clean restarts, see `hoardfs serve`).
    /// Default: random, i.e. a new one for every server instance.
    pub verifier: u64,
    /// Which client uids, gids, set-id bits and device nodes the server accepts (default:
    /// root squash to 65534/65534, set-id bits dropped, devices refused).
    pub id_map: IdMapping,
    /// Requests of one connection that may run at the same time (or whose replies wait to
    /// be written); further requests wait unread in the socket (back-pressure on that
    /// client only).
    pub max_in_flight_per_conn: usize,
    /// Authenticated connections served at once; one more is refused with `Busy`.
    pub max_connections: usize,
    /// Connections between accept and an accepted `Hello` at once (module `handshakes`:
    /// a full table evicts the oldest of the source holding the most).
    pub max_handshakes: usize,
    /// Of those, at most this many from one source (IPv4 address or IPv6 /64): a newer
    /// one evicts that source's oldest.
    pub max_handshakes_per_source: usize,
    /// Bytes of request and reply data one connection may have in flight (reads charge
    /// their length, writes their payload) until its replies are written.
    pub memory_per_conn: usize,
    /// The same bound for the whole server.
    pub memory_total: usize,
    /// An authenticated connection that sends nothing for this long (clients ping every
    /// [`hoardfs_proto::PING_INTERVAL`]), or whose replies make no progress for this long,
    /// is closed.
    pub idle_timeout: Duration,
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
    /// All interfaces on [`DEFAULT_PORT`], plaintext (set `tls`), no token, writable, 64
    /// requests in flight, 1024 connections, 256 handshakes, 128 MiB per connection and
    /// 1 GiB in all of request data in flight, 120 s idle timeout, zero-copy for files
    /// unchanged for [`ZERO_COPY_QUIET`].
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from((Ipv4Addr::UNSPECIFIED, DEFAULT_PORT)),
            tls: None,
            verifier: random_verifier(),
            token: None,
            tokens_dir: None,
            read_only: false,
            id_map: IdMapping::default(),
            max_in_flight_per_conn: 64,
            max_connections: 1024,
            max_handshakes: 256,
            max_handshakes_per_source: 64,
            memory_per_conn: 128 << 20,
            memory_total: 1 << 30,
            idle_timeout: Duration::from_secs(120),
            zero_copy: Some(ZERO_COPY_QUIET),
        }
    }
}

/// A random write verifier (never 0, which local origins use).
pub fn random_verifier() -> u64 {
    let mut b = [0u8; 8];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b);
    u64::from_le_bytes(b) | 1
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
    pub(crate) admission: Arc<admission::Admission>,
    pub(crate) credentials: credentials::Credentials,
    /// The locks clients hold.
    pub(crate) locks: locks::Locks,
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
        let mut cfg = self.cfg;
        if cfg.tls.is_some() {
            // File data must pass through the cipher: no sendfile ranges.
            cfg.zero_copy = None;
        }
        let credentials =
            credentials::Credentials::new(cfg.token.clone(), cfg.tokens_dir.as_deref())?;
        let admission = Arc::new(admission::Admission::new(&cfg));
        callbacks.charge_to(admission.callback_memory());
        let shared = Arc::new(Shared {
            locks: locks::Locks::default(),
            credentials,
            admission,
            origin: self.origin,
            cfg,
            stats: self.stats,
            origin_counters: self.origin_counters,
            callbacks,
        });
        let mut conns = JoinSet::new();
        tokio::pin!(shutdown);
        // Picks up `hoardfs token revoke` while no client connects.
        let mut recheck = tokio::time::interval(Duration::from_secs(1));
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = recheck.tick() => revoke_gone(&shared),
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

/// Rereads the credentials and closes the connections of names that went away.
fn revoke_gone(shared: &Shared) {
    if shared.credentials.required() {
        // Connections let in while the server required nothing (before the first
        // `hoardfs token add`) must now present a credential too.
        let n = shared.admission.sessions.revoke_open();
        if n > 0 {
            tracing::info!(
                connections = n,
                "credentials now required: closing unauthenticated connections"
            );
        }
    }
    let gone = shared.credentials.take_revoked();
    if !gone.is_empty() {
        let n = shared.admission.sessions.revoke(&gone);
        let names: Vec<&str> = gone.iter().map(|g| g.name.as_str()).collect();
        tracing::info!(?names, connections = n, "credentials revoked");
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
