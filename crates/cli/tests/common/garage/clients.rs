//! The clients the S3 tests point at a [`Garage`] cluster: rclone (the independent S3
//! client that puts and checks objects), curl (signed requests rclone cannot make, such as
//! conditional ones), and `hoardfs` itself (mounts of the bucket, tiers in front of it).

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use super::{
    AWS_ENV_NOISE, BUCKET, Garage, KEY_ID, REGION, SECRET, output_with_stdin, output_within,
};

/// Clients of the cluster.
impl Garage {
    /// rclone preconfigured by environment only (any config file ignored) with the remote
    /// `garage:` pointing at node `i`'s S3 API. Retries are off (`--retries 1
    /// --low-level-retries 1`) so request counters are exact and failures surface.
    pub fn rclone(&self, i: usize) -> Command {
        let mut c = Command::new("rclone");
        // The AWS SDK inside rclone reads these; AWS_CA_BUNDLE in particular makes every
        // request fail ("LoadCustomCABundleError ... unsupported transport").
        for k in AWS_ENV_NOISE {
            c.env_remove(k);
        }
        for (k, v) in [
            ("RCLONE_CONFIG", "/dev/null".to_string()),
            ("RCLONE_CONFIG_GARAGE_TYPE", "s3".into()),
            ("RCLONE_CONFIG_GARAGE_PROVIDER", "Other".into()),
            ("RCLONE_CONFIG_GARAGE_ENDPOINT", self.endpoint(i)),
            ("RCLONE_CONFIG_GARAGE_REGION", REGION.into()),
            ("RCLONE_CONFIG_GARAGE_ACCESS_KEY_ID", KEY_ID.into()),
            ("RCLONE_CONFIG_GARAGE_SECRET_ACCESS_KEY", SECRET.into()),
            ("RCLONE_CONFIG_GARAGE_FORCE_PATH_STYLE", "true".into()),
            ("RCLONE_CONFIG_GARAGE_NO_CHECK_BUCKET", "true".into()),
            ("RCLONE_RETRIES", "1".into()),
            ("RCLONE_LOW_LEVEL_RETRIES", "1".into()),
            ("RCLONE_CONTIMEOUT", "5s".into()),
            ("RCLONE_TIMEOUT", "30s".into()),
        ] {
            c.env(k, v);
        }
        c.env("NO_PROXY", "127.0.0.1").env("no_proxy", "127.0.0.1");
        c.stdin(Stdio::null());
        c
    }

    /// curl signing with SigV4 as [`KEY_ID`] (curl ≥ 7.75), for requests rclone cannot
    /// make, such as conditional ones: add `-H`, `-X`, `-T FILE` and [`Self::url`].
    /// `-w '%{http_code}'` prints the status.
    pub fn curl(&self) -> Command {
        let mut c = Command::new("curl");
        c.args(["-sS", "--aws-sigv4"])
            .arg(format!("aws:amz:{REGION}:s3"))
            .arg("--user")
            .arg(format!("{KEY_ID}:{SECRET}"))
            // Garage requires the header; curl signs it as given.
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .args(["--noproxy", "*", "--max-time", "60"]);
        c.stdin(Stdio::null());
        c
    }

    /// The path-style URL of `key` in the bucket on node `i`'s S3 API.
    pub fn url(&self, i: usize, key: &str) -> String {
        format!("{}/{BUCKET}/{key}", self.endpoint(i))
    }

    /// The first running node (for the convenience helpers).
    fn live(&self) -> usize {
        (0..self.nodes.len())
            .find(|&i| self.is_running(i))
            .expect("no garage node is running")
    }

    /// `garage:BUCKET/key` for rclone.
    pub fn remote(&self, key: &str) -> String {
        format!("garage:{BUCKET}/{key}")
    }

    /// Uploads `bytes` as `key` through node `i` (`rclone rcat`).
    pub fn put_via(&self, i: usize, key: &str, bytes: &[u8]) {
        let mut cmd = self.rclone(i);
        cmd.arg("rcat").arg(self.remote(key));
        let out = output_with_stdin(cmd, bytes, Duration::from_secs(60));
        check_rclone(&format!("rclone rcat {key} via node {i}"), &out);
    }

    /// Downloads `key` through node `i` (`rclone cat`: one GetObject).
    pub fn get_via(&self, i: usize, key: &str) -> Vec<u8> {
        let mut cmd = self.rclone(i);
        cmd.arg("cat").arg(self.remote(key));
        let out = output_within(cmd, Duration::from_secs(60)).unwrap();
        check_rclone(&format!("rclone cat {key} via node {i}"), &out);
        out.stdout
    }

    /// Deletes `key` through node `i` (`rclone deletefile`).
    pub fn delete_via(&self, i: usize, key: &str) {
        let mut cmd = self.rclone(i);
        cmd.arg("deletefile").arg(self.remote(key));
        let out = output_within(cmd, Duration::from_secs(60)).unwrap();
        check_rclone(&format!("rclone deletefile {key} via node {i}"), &out);
    }

    /// [`Self::put_via`] the first running node.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        self.put_via(self.live(), key, bytes)
    }

    /// [`Self::get_via`] the first running node.
    pub fn get(&self, key: &str) -> Vec<u8> {
        self.get_via(self.live(), key)
    }

    /// Whether the object `key` exists (`rclone cat` of a missing key succeeds: it takes
    /// it for an empty directory).
    pub fn exists(&self, key: &str) -> bool {
        let mut cmd = self.rclone(self.live());
        cmd.args(["lsf", "--files-only"]).arg(self.remote(key));
        let out = output_within(cmd, Duration::from_secs(60)).unwrap();
        check_rclone(&format!("rclone lsf {key}"), &out);
        !out.stdout.is_empty()
    }

    /// [`Self::delete_via`] the first running node.
    pub fn delete(&self, key: &str) {
        self.delete_via(self.live(), key)
    }

    /// A `hoardfs` command with this cluster's credentials in its environment (and
    /// nothing else of the `AWS_*` kind).
    pub fn hoardfs(&self) -> Command {
        let mut cmd = Command::new(super::super::bin());
        for v in AWS_ENV_NOISE {
            cmd.env_remove(v);
        }
        cmd.envs(self.aws_env());
        cmd
    }

    /// The flags that point an S3 source at node `i`.
    pub fn s3_flags(&self, i: usize) -> Vec<String> {
        vec![
            "--endpoint-url".into(),
            self.endpoint(i),
            "--force-path-style".into(),
        ]
    }

    /// Mounts `s3://BUCKET/prefix` through node `i` at `mnt` with the cache `cache`.
    pub fn mount(
        &self,
        i: usize,
        prefix: &str,
        mnt: &Path,
        cache: &Path,
        extra: &[&str],
    ) -> Result<super::super::Mount, String> {
        std::fs::create_dir_all(mnt).unwrap();
        let mut cmd = self.hoardfs();
        cmd.arg("mount")
            .arg("-v")
            .arg(format!("s3://{}/{prefix}", self.bucket()))
            .arg(mnt)
            .arg("--cache-dir")
            .arg(cache)
            .args(self.s3_flags(i))
            .args(super::super::thresholds_unless_named(extra))
            .args(extra);
        let (child, _) = super::super::spawn_until_line(cmd, "hoardfs: mounted")?;
        Ok(super::super::Mount {
            child: Some(child),
            path: mnt.to_path_buf(),
        })
    }

    /// `hoardfs serve --origin s3://BUCKET` through node `i` (a shared cache tier, plain
    /// TCP on an ephemeral port) with its cache in `cache`.
    pub fn serve_tier(&self, i: usize, cache: &Path, extra: &[&str]) -> super::super::Server {
        let cache_args = [Path::new("--cache-dir"), cache];
        self.start_tier(i, &cache_args, &super::super::state_dir(), extra)
    }

    /// `hoardfs serve --origin s3://BUCKET` through node `i` without `--cache-dir`, its
    /// state (and so its default cache) in `state`.
    pub fn serve_tier_in(&self, i: usize, state: &Path, extra: &[&str]) -> super::super::Server {
        self.start_tier(i, &[], state, extra)
    }

    fn start_tier(
        &self,
        i: usize,
        cache_args: &[&Path],
        state: &Path,
        extra: &[&str],
    ) -> super::super::Server {
        let cache = cache_args.last().copied().unwrap_or(state);
        let mut cmd = self.hoardfs();
        cmd.arg("serve")
            .arg("--origin")
            .arg(format!("s3://{}", self.bucket()))
            .args(cache_args)
            .args(self.s3_flags(i))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--insecure-plaintext",
                "--state-dir",
            ])
            .arg(state)
            .args(super::super::thresholds_unless_named(extra))
            .args(extra);
        let (child, line) =
            super::super::spawn_until_line(cmd, "hoardfs: serving").expect("tier starts");
        let (addr, fingerprint) = super::super::parse_ready(&line);
        super::super::Server {
            child: Some(child),
            addr,
            dir: cache.to_path_buf(),
            token: Vec::new(),
            fingerprint,
        }
    }
}

/// Panics with rclone's stderr unless it succeeded.
fn check_rclone(what: &str, out: &Output) {
    assert!(
        out.status.success(),
        "{what}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
