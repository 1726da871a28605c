//! A real Garage cluster (S3-compatible, version 2.5.0) on 127.0.0.1 for the S3 tests: one
//! `garage server` process per node on ephemeral ports, in a scratch dir, killed on drop.
//!
//! [`Garage::start`] returns once every node reports "fully operational" on `/health` and a
//! bucket plus an access key with read/write/owner rights on it exist. `rclone` (configured
//! only by environment variables, remote `garage:`) is the independent S3 client; the
//! clients pointed at the cluster (rclone, curl, `hoardfs` mounts and tiers) are in
//! `clients`.
//!
//! The binary comes from [`garage_bin`]: `$HOARDFS_GARAGE`, else the copy `.ci/run` builds
//! into `~/.cache/hoardfs-test/garage-2.5.0/bin/garage`. A missing binary fails the test
//! with the build command, unless `HOARDFS_SKIP_S3=1` says to skip S3 tests
//! ([`Garage::start_or_skip`]).

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hoardfs_testutil::poll;

mod clients;
mod util;

use util::{free_port, output_with_stdin, random_hex, strip_ansi};
pub use util::{http_get, metric_in, output_within};

/// The S3 region every node announces (`[s3_api] s3_region`).
pub const REGION: &str = "garage";
/// The bucket [`Garage::start`] creates.
pub const BUCKET: &str = "hoardfs-test";
/// The imported access key (Garage accepts any id of 8+ chars of `[A-Za-z0-9._-]`).
pub const KEY_ID: &str = "GKhoardfs000000000000000001";
/// Its secret (16+ graphic ASCII chars).
pub const SECRET: &str = "hoardfs-test-secret-0123456789abcdef0123456789abcdef";
/// The name of the key in Garage.
const KEY_NAME: &str = "hoardfs-test";

/// Environment variables that would make an S3 client spawned by a test talk to something
/// else than the cluster or with other credentials; removed from every such command.
pub const AWS_ENV_NOISE: &[&str] = &[
    "AWS_CA_BUNDLE",
    "AWS_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_SESSION_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
];

/// How long a whole cluster start (or restart) may take before the harness gives up.
const START_TIMEOUT: Duration = Duration::from_secs(60);

const BUILD_HINT: &str = "build it once with `bash .ci/run` (or `cargo install garage --version 2.5.0 \
    --locked --no-default-features --features bundled-libs,lmdb,metrics --root \
    ~/.cache/hoardfs-test/garage-2.5.0`), or point $HOARDFS_GARAGE at a garage 2.5.0 binary; \
    HOARDFS_SKIP_S3=1 skips the S3 tests instead";

/// Where the garage binary should be: `$HOARDFS_GARAGE`, else
/// `~/.cache/hoardfs-test/garage-2.5.0/bin/garage` (where `.ci/run` builds it).
fn garage_path() -> PathBuf {
    match std::env::var_os("HOARDFS_GARAGE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
            .join(".cache/hoardfs-test/garage-2.5.0/bin/garage"),
    }
}

/// The garage binary ([`garage_path`]), or `None` if that file does not exist.
pub fn garage_bin() -> Option<PathBuf> {
    let p = garage_path();
    p.is_file().then_some(p)
}

/// True when `HOARDFS_SKIP_S3=1`: S3 tests print "skipped" and pass.
pub fn skip_s3() -> bool {
    std::env::var("HOARDFS_SKIP_S3").is_ok_and(|v| v == "1")
}

/// The garage binary, or a panic that says how to get one.
fn require_garage() -> PathBuf {
    match garage_bin() {
        Some(p) => p,
        None => panic!(
            "these tests need a Garage 2.5.0 binary, and there is none at {} ($HOARDFS_GARAGE, \
             else ~/.cache/hoardfs-test/garage-2.5.0/bin/garage): {BUILD_HINT}",
            garage_path().display()
        ),
    }
}

/// Fails loudly unless rclone is installed (the S3 tests' independent client).
fn require_rclone() {
    let ok = Command::new("rclone")
        .arg("version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "these tests need rclone on $PATH (apt-get install rclone)"
    );
}

/// One `garage server` process and its fixed identity (config, data, ports).
struct Node {
    dir: PathBuf,
    cfg: PathBuf,
    log: PathBuf,
    s3: u16,
    rpc: u16,
    admin: u16,
    /// The length of `log` when the current process was spawned (the log is appended to).
    log_start: u64,
    /// `<64 hex>@127.0.0.1:<rpc port>`, known once the node has started the first time.
    id: String,
    child: Option<Child>,
}

/// A running Garage cluster (see the module docs). Dropping it kills every node; if the
/// thread is panicking, the scratch dir (configs, data, logs) is kept and its path printed.
pub struct Garage {
    dir: Option<tempfile::TempDir>,
    bin: PathBuf,
    nodes: Vec<Node>,
}

/// Why one start attempt failed: a port taken between probing and binding (retry with new
/// ports), or anything else (give up).
enum StartError {
    PortTaken(String),
    Fatal(String),
}

impl Garage {
    /// Starts an `n`-node cluster (replication factor `n`, consistent mode) and returns
    /// once it is healthy and [`BUCKET`] and [`KEY_ID`] exist. Panics with the node log paths
    /// on failure, or if garage or rclone is missing (see [`Garage::start_or_skip`]).
    pub fn start(n: usize) -> Garage {
        assert!(n >= 1, "a cluster needs at least one node");
        let bin = require_garage();
        require_rclone();
        let mut last = String::new();
        for _attempt in 0..3 {
            let t0 = Instant::now();
            let mut g = Garage::spawn(&bin, n);
            match g.form() {
                Ok(()) => {
                    eprintln!(
                        "garage: {n}-node cluster up in {:?} (logs under {})",
                        t0.elapsed(),
                        g.root().display()
                    );
                    return g;
                }
                Err(StartError::PortTaken(e)) => {
                    // Another process took a port between probe and bind: drop (kill) this
                    // attempt and start over on new ports.
                    eprintln!("garage: a port was taken; starting over on new ports");
                    last = e;
                }
                Err(StartError::Fatal(e)) => panic!("garage cluster did not start: {e}"),
            }
        }
        panic!("garage cluster did not start: ports kept being taken: {last}");
    }

    /// As [`Garage::start`], but `None` (after printing "skipped") when `HOARDFS_SKIP_S3=1`.
    pub fn start_or_skip(n: usize) -> Option<Garage> {
        if skip_s3() {
            eprintln!("skipped: HOARDFS_SKIP_S3=1 (this test needs a Garage cluster)");
            return None;
        }
        Some(Garage::start(n))
    }

    /// Writes the configs and spawns every node (no cluster formed yet).
    fn spawn(bin: &Path, n: usize) -> Garage {
        let dir = super::scratch();
        let rpc_secret = random_hex(32);
        let admin_token = random_hex(16);
        let mut nodes = Vec::new();
        for i in 0..n {
            let (s3, rpc, admin) = (free_port(), free_port(), free_port());
            let nd = dir.path().join(format!("node{i}"));
            std::fs::create_dir_all(&nd).unwrap();
            let cfg = nd.join("garage.toml");
            std::fs::write(
                &cfg,
                format!(
                    r#"# node {i} of {n}: written by crates/cli/tests/common/garage/mod.rs
metadata_dir = "{meta}"
data_dir = "{data}"
db_engine = "lmdb"
lmdb_map_size = "1G"
replication_factor = {n}
consistency_mode = "consistent"
compression_level = "none"
disable_scrub = true
rpc_bind_addr = "127.0.0.1:{rpc}"
rpc_public_addr = "127.0.0.1:{rpc}"
rpc_secret = "{rpc_secret}"
rpc_timeout_msec = 5000

[s3_api]
s3_region = "{REGION}"
api_bind_addr = "127.0.0.1:{s3}"

[admin]
api_bind_addr = "127.0.0.1:{admin}"
admin_token = "{admin_token}"
"#,
                    meta = nd.join("meta").display(),
                    data = nd.join("data").display(),
                ),
            )
            .unwrap();
            let log = nd.join("garage.log");
            nodes.push(Node {
                dir: nd,
                cfg,
                log,
                s3,
                rpc,
                admin,
                log_start: 0,
                id: String::new(),
                child: None,
            });
        }
        let mut g = Garage {
            dir: Some(dir),
            bin: bin.to_path_buf(),
            nodes,
        };
        for i in 0..n {
            g.spawn_node(i);
        }
        g
    }

    /// Spawns node `i`'s server process, appending to its log.
    fn spawn_node(&mut self, i: usize) {
        let node = &mut self.nodes[i];
        assert!(node.child.is_none(), "garage node {i} is already running");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)
            .unwrap();
        node.log_start = log.metadata().unwrap().len();
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(&node.cfg)
            .arg("server")
            .env("RUST_LOG", "garage=info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {}: {e}", self.bin.display()));
        node.child = Some(child);
    }

    /// Waits for the daemons, connects them, applies a layout, waits for health, then
    /// creates the key and the bucket.
    fn form(&mut self) -> Result<(), StartError> {
        let n = self.nodes.len();
        let deadline = Instant::now() + START_TIMEOUT;
        for i in 0..n {
            self.wait_listening(i, deadline)?;
        }
        let ids: Vec<String> = (0..n)
            .map(|i| {
                self.cli(i, &["node", "id", "-q"])
                    .map(|s| s.trim().to_string())
            })
            .collect::<Result<_, _>>()
            .map_err(StartError::Fatal)?;
        for (node, id) in self.nodes.iter_mut().zip(&ids) {
            node.id = id.clone();
        }
        for id in &ids[1..] {
            self.retry(deadline, "node connect", || {
                self.cli(0, &["node", "connect", id])
            })?;
        }
        let mut assign = vec!["layout", "assign", "-z", "dc1", "-c", "1G"];
        assign.extend(ids.iter().map(|id| id.split('@').next().unwrap()));
        // The peers' ids reach node 0's peer list asynchronously after `node connect`.
        self.retry(deadline, "layout assign", || self.cli(0, &assign))?;
        self.cli(0, &["layout", "apply", "--version", "1"])
            .map_err(StartError::Fatal)?;
        self.wait_healthy_until(deadline, true)?;
        self.retry(deadline, "key import", || {
            self.cli(
                0,
                &["key", "import", "--yes", "-n", KEY_NAME, KEY_ID, SECRET],
            )
        })?;
        self.retry(deadline, "bucket create", || {
            self.cli(0, &["bucket", "create", BUCKET])
        })?;
        self.retry(deadline, "bucket allow", || {
            self.cli(
                0,
                &[
                    "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", KEY_ID,
                ],
            )
        })?;
        Ok(())
    }

    /// Waits until node `i`'s log says that it listens on its three ports. Garage does not
    /// exit when its S3 or admin port is taken (it logs "Address already in use" and runs
    /// on), and another process on that port could answer in its place, so the log is the
    /// only reliable signal; a taken port gives [`StartError::PortTaken`].
    fn wait_listening(&mut self, i: usize, deadline: Instant) -> Result<(), StartError> {
        let (s3, rpc, admin) = (self.nodes[i].s3, self.nodes[i].rpc, self.nodes[i].admin);
        let want = [
            format!("Listening on 127.0.0.1:{rpc}"),
            format!("Admin API server listening on http://127.0.0.1:{admin}"),
            format!("S3 API server listening on http://127.0.0.1:{s3}"),
        ];
        let left = deadline.saturating_duration_since(Instant::now());
        let outcome = poll(Duration::from_millis(20), left, || {
            let log = self.current_log(i);
            if log.contains("ddress already in use") {
                return Some(Err(StartError::PortTaken(format!(
                    "node {i}: a port was taken; {}",
                    self.logs()
                ))));
            }
            if want.iter().all(|w| log.contains(w.as_str())) {
                return Some(Ok(()));
            }
            let node = &mut self.nodes[i];
            let st = node
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())?;
            node.child = None;
            Some(Err(StartError::Fatal(format!(
                "node {i} exited ({st}) while starting; {}",
                self.logs()
            ))))
        });
        outcome.unwrap_or_else(|| {
            Err(StartError::Fatal(format!(
                "node {i} did not listen on all of {want:?} within {START_TIMEOUT:?}; {}",
                self.logs()
            )))
        })
    }

    /// What node `i`'s current process has logged so far (escape sequences included).
    fn current_log(&self, i: usize) -> String {
        let node = &self.nodes[i];
        let mut buf = Vec::new();
        if let Ok(mut f) = File::open(&node.log) {
            let _ = f.seek(SeekFrom::Start(node.log_start));
            let _ = f.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    }

    /// Retries `f` every 100 ms until it succeeds or `deadline` passes.
    fn retry(
        &self,
        deadline: Instant,
        what: &str,
        mut f: impl FnMut() -> Result<String, String>,
    ) -> Result<(), StartError> {
        let mut last = String::new();
        let left = deadline.saturating_duration_since(Instant::now());
        let ok = poll(Duration::from_millis(100), left, || match f() {
            Ok(_) => Some(()),
            Err(e) => {
                last = e;
                None
            }
        });
        ok.ok_or_else(|| {
            StartError::Fatal(format!(
                "`garage {what}` kept failing: {last}; {}",
                self.logs()
            ))
        })
    }

    /// `starting`: the cluster is being formed, so RPC from outside it means a port given
    /// twice (and the start goes over on new ports).
    fn wait_healthy_until(&self, deadline: Instant, starting: bool) -> Result<(), StartError> {
        let all_live = self.nodes.iter().all(|n| n.child.is_some());
        let mut last = String::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let outcome = poll(Duration::from_millis(50), left, || {
                match http_get(node.admin, "/health") {
                    Ok((200, body)) if !all_live || body.contains("fully operational") => {
                        return Some(Ok(()));
                    }
                    other => last = format!("node {i}: {other:?}"),
                }
                // RPC from a node that is not of this cluster, or not to an RPC port (a
                // port given twice, e.g. by another test process): start over on new ports.
                (starting && self.current_log(i).contains("failed verifing client hello")).then(
                    || {
                        Err(StartError::PortTaken(format!(
                            "node {i} hears from another cluster; {}",
                            self.logs()
                        )))
                    },
                )
            });
            match outcome {
                Some(Ok(())) => {}
                Some(Err(e)) => return Err(e),
                None => {
                    return Err(StartError::Fatal(format!(
                        "cluster not healthy within {START_TIMEOUT:?}: last /health {last}; {}",
                        self.logs()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Waits until every live node's `/health` is 200 ("fully operational" if no node is
    /// down); panics with the logs otherwise. For use after [`Garage::start_again`].
    pub fn wait_healthy(&self) {
        if let Err(StartError::Fatal(e) | StartError::PortTaken(e)) =
            self.wait_healthy_until(Instant::now() + START_TIMEOUT, false)
        {
            panic!("{e}");
        }
    }

    /// Runs the garage CLI against node `i` (any running node works for cluster-wide
    /// commands): `Ok(stdout)` or `Err(stderr)`.
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(&self.bin);
        cmd.arg("-c").arg(&self.nodes[i].cfg).args(args);
        let out = output_within(cmd, Duration::from_secs(30))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(format!(
                "garage {}: {}: {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout)
            ))
        }
    }

    /// The scratch dir holding every node's config, data and log.
    pub fn root(&self) -> &Path {
        self.dir.as_ref().expect("present until drop").path()
    }

    /// Node `i`'s directory (`garage.toml`, `garage.log`, `meta/`, `data/`).
    pub fn node_dir(&self, i: usize) -> &Path {
        &self.nodes[i].dir
    }

    /// The number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether node `i` has a running process (not killed or stopped).
    pub fn is_running(&self, i: usize) -> bool {
        self.nodes[i].child.is_some()
    }

    /// `http://127.0.0.1:PORT` of node `i`'s S3 API.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.nodes[i].s3)
    }

    /// Node `i`'s admin port (`/health`, `/metrics`).
    pub fn admin_port(&self, i: usize) -> u16 {
        self.nodes[i].admin
    }

    pub fn bucket(&self) -> &str {
        BUCKET
    }

    pub fn key_id(&self) -> &str {
        KEY_ID
    }

    pub fn secret(&self) -> &str {
        SECRET
    }

    pub fn region(&self) -> &str {
        REGION
    }

    /// The credentials and region for a spawned S3 client (the endpoint is [`Self::endpoint`]).
    /// Remove [`AWS_ENV_NOISE`] from the command first (`AWS_CA_BUNDLE` is set on some
    /// machines and replaces the trusted roots).
    pub fn aws_env(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY".into(), SECRET.into()),
            ("AWS_REGION".into(), REGION.into()),
        ]
    }

    /// SIGKILLs node `i` (no clean shutdown) and reaps it. Its config and data stay, for
    /// [`Self::start_again`].
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops every node: SIGTERM, then SIGKILL for any still running after 10 s.
    pub fn stop_all(&mut self) {
        for node in &mut self.nodes {
            if let Some(c) = &node.child {
                // SAFETY: kill(2) on a child we spawned and have not reaped.
                unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for node in &mut self.nodes {
            if let Some(mut c) = node.child.take() {
                let left = deadline.saturating_duration_since(Instant::now());
                poll(Duration::from_millis(20), left, || {
                    c.try_wait().ok().flatten()
                });
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }

    /// Restarts a killed or stopped node `i` with the same config, ports and data, and
    /// returns once it listens and is connected to every other running node. It serves
    /// requests once a quorum of nodes is back: call [`Self::wait_healthy`] after
    /// restarting the nodes a test needs.
    ///
    /// Garage alone takes 25-30 s to count a restarted node as up again: the node does not
    /// redial its peers at once, and a peer that saw it die keeps it "unavailable" until
    /// its own redial backoff fires, even with the node's connection to it up. So the
    /// harness runs `node connect` both ways (back to healthy in about 0.5 s).
    pub fn start_again(&mut self, i: usize) {
        self.spawn_node(i);
        let deadline = Instant::now() + START_TIMEOUT;
        let connected = self.wait_listening(i, deadline).and_then(|()| {
            let me = self.nodes[i].id.clone();
            for j in (0..self.nodes.len()).filter(|&j| j != i && self.is_running(j)) {
                let peer = self.nodes[j].id.clone();
                self.retry(deadline, "node connect", || {
                    self.cli(i, &["node", "connect", &peer])
                })?;
                // Both ways: the peer keeps counting the node as down until it dials it
                // itself, even when the node's own connection to it is up.
                self.retry(deadline, "node connect", || {
                    self.cli(j, &["node", "connect", &me])
                })?;
            }
            Ok(())
        });
        if let Err(StartError::Fatal(e) | StartError::PortTaken(e)) = connected {
            panic!("restarting garage node {i}: {e}");
        }
    }

    /// Sum over running nodes of `api_s3_request_counter{api_endpoint="<endpoint>"}` from
    /// `/metrics` (`GetObject`, `HeadObject`, `PutObject`, `ListObjectsV2`, ...). A request
    /// counts on the node whose S3 port received it; a restarted node starts again from 0,
    /// so take before/after deltas around the action being measured.
    pub fn s3_requests(&self, endpoint: &str) -> u64 {
        self.metric_sum("api_s3_request_counter", &[("api_endpoint", endpoint)])
    }

    /// Sum over running nodes of `api_s3_error_counter{api_endpoint=..,status_code=..}`.
    pub fn s3_errors(&self, endpoint: &str, status: u16) -> u64 {
        self.metric_sum(
            "api_s3_error_counter",
            &[
                ("api_endpoint", endpoint),
                ("status_code", &status.to_string()),
            ],
        )
    }

    /// Sum over running nodes of every sample of `name` whose labels include `labels`.
    pub fn metric_sum(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let mut sum = 0.0;
        for (i, node) in self.nodes.iter().enumerate() {
            if node.child.is_none() {
                continue;
            }
            let body = match http_get(node.admin, "/metrics") {
                Ok((200, body)) => body,
                other => panic!("GET /metrics on garage node {i}: {other:?}"),
            };
            sum += metric_in(&body, name, labels);
        }
        sum as u64
    }

    /// Every node's log path, with its last lines, for failure messages.
    pub fn logs(&self) -> String {
        let mut s = String::from("node logs:");
        for (i, node) in self.nodes.iter().enumerate() {
            let text = strip_ansi(&std::fs::read_to_string(&node.log).unwrap_or_default());
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(8)..].join("\n    ");
            s.push_str(&format!("\n  node {i}: {}\n    {tail}", node.log.display()));
        }
        s
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        if std::thread::panicking()
            && let Some(dir) = self.dir.take()
        {
            let kept = dir.keep();
            eprintln!("garage: kept {} for inspection", kept.display());
            for node in &self.nodes {
                eprintln!("garage: log {}", node.log.display());
            }
        }
    }
}
