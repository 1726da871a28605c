//! Small tools of the Garage harness: free ports, random secrets, a minimal HTTP GET for
//! the admin API and metrics, and commands run with a time bound.

use std::fs::File;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Sum of the samples of `name` in a Prometheus text exposition whose labels include
/// every pair in `labels` (in any order, among others).
pub fn metric_in(body: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let mut sum = 0.0;
    for line in body.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (set, value) = match rest.strip_prefix('{') {
            Some(r) => match r.split_once('}') {
                Some((set, v)) => (set, v),
                None => continue,
            },
            None if rest.starts_with(' ') => ("", rest),
            None => continue, // a longer metric name with this prefix
        };
        let has = |k: &str, v: &str| set.split(',').any(|kv| kv.trim() == format!("{k}=\"{v}\""));
        if labels.iter().all(|(k, v)| has(k, v))
            && let Some(v) = value
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        {
            sum += v;
        }
    }
    sum
}

/// `s` without ANSI colour sequences (`ESC [ ... m`), which Garage writes to its log.
pub(super) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A port that was free a moment ago (bind :0, release), and never handed out before in
/// this test process: the kernel may give a released port to the next `bind(:0)`. Seen in
/// CI: one node got the same port for its RPC and its admin API, and both listeners took
/// it, so its own peers' RPC reached the admin API and `/health` reached RPC ("failed
/// verifing client hello" in its log, `/health` reset).
pub(super) fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// `bytes` random bytes as lowercase hex.
pub(super) fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .unwrap();
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

/// Minimal HTTP/1.1 GET (connection: close) on 127.0.0.1:`port`: `(status, body)`.
pub fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no header end")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("bad status line in {head:?}"))?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

/// Decodes a chunked HTTP body (text only, enough for /health and /metrics).
fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Runs `cmd` to completion with piped output, killing it after `timeout`.
pub fn output_within(mut cmd: Command, timeout: Duration) -> Result<Output, String> {
    cmd.stdin(Stdio::null());
    run_bounded(cmd, None, timeout)
}

/// Runs `cmd` with `input` on stdin; panics if it cannot run or overruns `timeout`.
pub(super) fn output_with_stdin(cmd: Command, input: &[u8], timeout: Duration) -> Output {
    run_bounded(cmd, Some(input.to_vec()), timeout).unwrap()
}

fn run_bounded(
    mut cmd: Command,
    input: Option<Vec<u8>>,
    timeout: Duration,
) -> Result<Output, String> {
    if input.is_some() {
        cmd.stdin(Stdio::piped());
    }
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawn {cmd:?}: {e}"))?;
    if let Some(input) = input {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
    }
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_t = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let status = hoardfs_testutil::wait_for(timeout, || child.try_wait().transpose());
    let status = match status {
        Some(st) => st.map_err(|e| e.to_string())?,
        None => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{cmd:?} did not finish within {timeout:?}"));
        }
    };
    Ok(Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    })
}
