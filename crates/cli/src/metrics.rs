//! `mount --metrics-listen ADDR`: the counters of `hoardfs stats`, in the Prometheus text
//! exposition format, over a minimal HTTP/1.0 responder (any GET path). Each scrape is
//! served on its own thread with read and write timeouts, at most [`MAX_SCRAPES`] at once;
//! a port alone binds loopback.

use crate::error::CliResult;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use hoardfs_fs::HoardFs;
use serde_json::Value;

use crate::control::{MountInfo, stats_json};

/// Values that go up and down; everything else numeric is a counter.
const GAUGES: &[&str] = &[
    "connected",
    "objects",
    "bytes",
    "reserved_bytes",
    "pinned_objects",
    "pinned_bytes",
    "open_objects",
    "limit_bytes",
    "fs_bytes_total",
    "fs_bytes_avail",
    "fs_files_total",
    "fs_files_avail",
    "recovered_from_crash",
    "pending_files",
    "pending_bytes",
    "oldest_pending_secs",
    "io_uring",
    "caching_stopped",
    "short_of_room",
    "ttl_secs",
    "max_stale_secs",
    "list_rate_limit",
    "list_rate",
    "max_age_served_secs",
    "queued",
];

/// Renders the stats as Prometheus text.
pub fn render(stats: &Value) -> String {
    let mut out = String::new();
    let mut emit = |prefix: &str, name: &str, v: &Value| {
        let x = match v {
            Value::Bool(b) => u64::from(*b) as f64,
            Value::Number(n) => n.as_f64().unwrap_or(0.0),
            _ => return,
        };
        let gauge = GAUGES.contains(&name);
        let full = if gauge {
            format!("hoardfs_{prefix}{name}")
        } else {
            format!("hoardfs_{prefix}{name}_total")
        };
        let kind = if gauge { "gauge" } else { "counter" };
        out.push_str(&format!("# TYPE {full} {kind}\n{full} {x}\n"));
    };
    emit("", "connected", &stats["connected"]);
    if let Some(c) = stats["counters"].as_object() {
        for (k, v) in c {
            emit("", k, v);
        }
    }
    if let Some(c) = stats["cache"].as_object() {
        for (k, v) in c {
            emit("cache_", k, v);
        }
    }
    // The room the cache file system leaves (a string in the stats): 1 while it holds.
    if let Some(room) = stats["cache"]["room"].as_str() {
        emit("cache_", "caching_stopped", &Value::Bool(room == "stopped"));
        emit("cache_", "short_of_room", &Value::Bool(room == "short"));
    }
    if let Some(c) = stats["listings"].as_object() {
        for (k, v) in c {
            emit("listings_", k, v);
        }
    }
    if let Some(c) = stats["offline_writes"].as_object() {
        for (k, v) in c {
            emit("offline_", k, v);
        }
    }
    // The FUSE transport: whether the mount is served over io_uring (1) or /dev/fuse (0),
    // and the requests answered over the rings.
    if let Some(t) = stats["fuse"]["transport"].as_str() {
        emit("fuse_", "io_uring", &Value::Bool(t == "io_uring"));
        emit("fuse_", "ring_requests", &stats["fuse"]["ring_requests"]);
    }
    out
}

/// Scrapes served at once; connections beyond are closed at once (a scraper retries).
const MAX_SCRAPES: usize = 16;
/// How long a scraper may take to send its request (then it gets the metrics anyway).
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a scraper may take to read the reply.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where `--metrics-listen ADDR` binds: `PORT` or `:PORT` is loopback (127.0.0.1), anything
/// else is taken as given (`HOST:PORT`, `[V6]:PORT`); only an explicit address reaches
/// beyond this machine.
pub fn listen_addrs(addr: &str) -> CliResult<Vec<SocketAddr>> {
    let port_only = addr.strip_prefix(':').unwrap_or(addr);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(vec![SocketAddr::from((Ipv4Addr::LOCALHOST, port))]);
    }
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| format!("--metrics-listen {addr}: {e} (give PORT or HOST:PORT)"))?
        .collect();
    if addrs.is_empty() {
        return Err(format!("--metrics-listen {addr}: resolves to no address").into());
    }
    Ok(addrs)
}

/// Binds `addr` (see [`listen_addrs`]) and serves metrics on a thread.
pub fn start(addr: &str, fs: Arc<HoardFs>, info: MountInfo) -> CliResult<()> {
    let addrs = listen_addrs(addr)?;
    let l = TcpListener::bind(&addrs[..]).map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    if let Ok(a) = l.local_addr()
        && !a.ip().is_loopback()
    {
        tracing::warn!("metrics are served without authentication on {a}, beyond this machine");
    }
    serve(l, move || render(&stats_json(&fs, &info))).map(drop)
}

/// Serves `body()` to every connection on `l`, each on its own thread (at most
/// [`MAX_SCRAPES`] at once), so that a slow or stuck scraper holds up nobody else. Returns
/// the number of connections being answered.
fn serve(
    l: TcpListener,
    body: impl Fn() -> String + Send + Sync + 'static,
) -> CliResult<Arc<AtomicUsize>> {
    let body = Arc::new(body);
    let active = Arc::new(AtomicUsize::new(0));
    let answering = active.clone();
    std::thread::Builder::new()
        .name("hoardfs-metrics".into())
        .spawn(move || {
            for s in l.incoming().flatten() {
                if active.fetch_add(1, Ordering::SeqCst) >= MAX_SCRAPES {
                    active.fetch_sub(1, Ordering::SeqCst);
                    continue; // (closed when dropped)
                }
                let (body, slot) = (body.clone(), Slot(active.clone()));
                let spawned = std::thread::Builder::new()
                    .name("hoardfs-metrics-conn".into())
                    .spawn(move || {
                        let _slot = slot;
                        answer(s, &*body);
                    });
                // (On failure the closure, and with it the slot, is dropped.)
                drop(spawned);
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(answering)
}

/// One of the [`MAX_SCRAPES`] connection slots, given back when dropped.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads (and ignores) a request, then sends the metrics. Each direction has a deadline
/// for the whole of it, not for each read or write: a scraper that trickles its request
/// a byte at a time (or reads the reply so) still gives its slot back in time.
fn answer(mut s: TcpStream, body: &dyn Fn() -> String) {
    let deadline = std::time::Instant::now() + READ_TIMEOUT;
    let mut buf = [0u8; 4096];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 16384 {
        let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
            break;
        };
        if left.is_zero() || s.set_read_timeout(Some(left)).is_err() {
            break;
        }
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let body = body();
    let reply = format!(
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let deadline = std::time::Instant::now() + WRITE_TIMEOUT;
    let mut sent = 0;
    while sent < reply.len() {
        let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) else {
            return;
        };
        if left.is_zero() || s.set_write_timeout(Some(left)).is_err() {
            return;
        }
        match s.write(&reply.as_bytes()[sent..]) {
            Ok(0) | Err(_) => return,
            Ok(n) => sent += n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn scrape(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    }

    #[test]
    fn a_stuck_scraper_does_not_hold_up_another() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let answering = serve(l, || "hoardfs_test 1\n".to_string()).unwrap();
        // Connects and sends nothing (nor reads).
        let _stuck = TcpStream::connect(addr).unwrap();
        hoardfs_testutil::assert_eventually("the stuck scraper is being answered", || {
            answering.load(Ordering::SeqCst) == 1
        });
        let t = Instant::now();
        let reply = scrape(addr);
        assert!(reply.ends_with("\r\n\r\nhoardfs_test 1\n"), "{reply:?}");
        assert!(t.elapsed() < READ_TIMEOUT / 2, "waited {:?}", t.elapsed());
    }

    #[test]
    fn a_scraper_trickling_its_request_loses_its_slot_after_the_deadline() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let answering = serve(l, || "x 1\n".to_string()).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // Every slot taken by a sender of one byte every 500 ms (each read within the
        // old per-read timeout), never ending its request.
        let tricklers: Vec<_> = (0..MAX_SCRAPES)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(addr).unwrap();
                    while !stop.load(Ordering::SeqCst) && s.write_all(b"G").is_ok() {
                        std::thread::sleep(Duration::from_millis(500));
                    }
                })
            })
            .collect();
        hoardfs_testutil::assert_eventually("every slot taken", || {
            answering.load(Ordering::SeqCst) == MAX_SCRAPES
        });
        let t = Instant::now();
        // Within the request deadline (and the time to answer), slots come back.
        let freed = hoardfs_testutil::wait_until(READ_TIMEOUT * 3, || {
            answering.load(Ordering::SeqCst) < MAX_SCRAPES
        });
        stop.store(true, Ordering::SeqCst);
        assert!(
            freed,
            "tricklers still hold every slot after {:?}",
            t.elapsed()
        );
        for t in tricklers {
            t.join().unwrap();
        }
    }

    #[test]
    fn scrapes_beyond_the_limit_are_closed_and_the_rest_served() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let answering = serve(l, || "x 1\n".to_string()).unwrap();
        let stuck: Vec<TcpStream> = (0..MAX_SCRAPES)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        hoardfs_testutil::assert_eventually("every slot taken", || {
            answering.load(Ordering::SeqCst) == MAX_SCRAPES
        });
        let mut extra = TcpStream::connect(addr).unwrap();
        extra
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut b = [0u8; 16];
        let t = Instant::now();
        assert!(matches!(extra.read(&mut b), Ok(0) | Err(_)));
        assert!(t.elapsed() < Duration::from_secs(1), "closed at once");
        drop(stuck);
        // The stuck ones end (EOF): their slots come back.
        hoardfs_testutil::assert_eventually("served again", || {
            let mut s = TcpStream::connect(addr).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
            let mut reply = String::new();
            let _ = s.read_to_string(&mut reply);
            reply.ends_with("x 1\n")
        });
    }

    #[test]
    fn offline_changes_are_gauges_and_conflicts_a_counter() {
        let v = serde_json::json!({"connected": false, "offline_writes": {
            "pending_files": 3, "pending_bytes": 4096, "oldest_pending_secs": 12,
            "conflicts": 1}});
        let text = render(&v);
        for line in [
            "# TYPE hoardfs_offline_pending_files gauge\nhoardfs_offline_pending_files 3\n",
            "hoardfs_offline_pending_bytes 4096\n",
            "hoardfs_offline_oldest_pending_secs 12\n",
            "# TYPE hoardfs_offline_conflicts_total counter\nhoardfs_offline_conflicts_total 1\n",
            "hoardfs_connected 0\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }

    #[test]
    fn the_cache_room_is_two_gauges() {
        let v = serde_json::json!({"connected": true, "cache": {"room": "stopped"}});
        let text = render(&v);
        for line in [
            "# TYPE hoardfs_cache_caching_stopped gauge\nhoardfs_cache_caching_stopped 1\n",
            "# TYPE hoardfs_cache_short_of_room gauge\nhoardfs_cache_short_of_room 0\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
    }

    #[test]
    fn the_fuse_transport_is_a_gauge_and_ring_requests_a_counter() {
        let v = serde_json::json!({"connected": true,
            "fuse": {"transport": "io_uring", "ring_requests": 42}});
        let text = render(&v);
        for line in [
            "# TYPE hoardfs_fuse_io_uring gauge\nhoardfs_fuse_io_uring 1\n",
            "# TYPE hoardfs_fuse_ring_requests_total counter\nhoardfs_fuse_ring_requests_total 42\n",
        ] {
            assert!(text.contains(line), "{line:?} not in:\n{text}");
        }
        let v = serde_json::json!({"fuse": {"transport": "dev_fuse", "ring_requests": 0}});
        assert!(render(&v).contains("hoardfs_fuse_io_uring 0\n"));
    }

    #[test]
    fn a_port_alone_is_loopback() {
        let lo = |p| vec![SocketAddr::from((Ipv4Addr::LOCALHOST, p))];
        assert_eq!(listen_addrs("9477").unwrap(), lo(9477));
        assert_eq!(listen_addrs(":9477").unwrap(), lo(9477));
        assert_eq!(
            listen_addrs("0.0.0.0:9477").unwrap(),
            vec!["0.0.0.0:9477".parse().unwrap()]
        );
        assert_eq!(
            listen_addrs("[::1]:9").unwrap(),
            vec!["[::1]:9".parse().unwrap()]
        );
        assert!(
            listen_addrs("localhost:9477").unwrap()[0]
                .ip()
                .is_loopback()
        );
        assert!(listen_addrs("nonsense").is_err());
    }
}
