//! `mount --metrics-listen ADDR`: the counters of `hoardfs stats`, in the Prometheus text
//! exposition format, over a minimal HTTP/1.0 responder (any GET path).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
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
    out
}

/// Binds `addr` and serves metrics on a thread.
pub fn start(addr: &str, fs: Arc<HoardFs>, info: MountInfo) -> Result<(), String> {
    let l = TcpListener::bind(addr).map_err(|e| format!("--metrics-listen {addr}: {e}"))?;
    std::thread::Builder::new()
        .name("hoardfs-metrics".into())
        .spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.windows(4).any(|w| w == b"\r\n\r\n") && got.len() < 16384 {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got.extend_from_slice(&buf[..n]),
                    }
                }
                let body = render(&stats_json(&fs, &info));
                let _ = write!(
                    s,
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n\
                     Content-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}
