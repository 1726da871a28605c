//! Transport security as the command line sets it up: the server's TLS identity (`serve`)
//! and, for clients (`mount`, `server-stats`), whom to trust and which credential to
//! present, including trust on first use recorded in the cache directory.

use crate::error::{CliError, CliResult};
use std::path::{Path, PathBuf};

use clap::Args;
use hoardfs_origin::OriginError;
use hoardfs_origin::remote::{ClientTls, Fingerprint, Security, Trust};
use hoardfs_tls::ServerIdentity;

/// Name of the trust-on-first-use record inside a cache directory.
pub const KNOWN_SERVER_FILE: &str = "server-identity";

/// How a client checks its server and proves itself.
#[derive(Args, Debug, Clone, Default)]
pub struct ClientSecurityArgs {
    /// File holding this client's credential (from `hoardfs token add`, or the server's
    /// shared --token-file). Sent inside TLS, after the server proved its identity (in
    /// clear with --insecure-plaintext).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Accept only the server whose certificate has this fingerprint (`SHA256:…`, as
    /// `hoardfs serve --print-fingerprint` prints it). Without it or --tls-ca, the first
    /// fingerprint seen is trusted and recorded in the cache directory (as ssh's
    /// accept-new), and a different one is refused later.
    #[arg(long, value_name = "SHA256:…")]
    pub server_fingerprint: Option<String>,
    /// Verify the server's certificate chain against these CA certificates (PEM) and its
    /// name against SERVER's host part, instead of a fingerprint.
    #[arg(long, value_name = "FILE", conflicts_with = "server_fingerprint")]
    pub tls_ca: Option<PathBuf>,
    /// Talk to a server started with --insecure-plaintext: no encryption, no server
    /// identity, credentials in clear text. For benchmarks on a trusted link only.
    #[arg(long)]
    pub insecure_plaintext: bool,
}

/// A client's security plus what to do once connected.
pub struct ClientSecurity {
    /// What `RemoteOrigin::connect` takes.
    pub security: Security,
    /// Where a first-use fingerprint is recorded, and the one recorded before.
    record: Option<PathBuf>,
    recorded: Option<Fingerprint>,
    /// Whether the server is trusted on first use (no pin, no CA, nothing recorded).
    first_use: bool,
}

impl ClientSecurityArgs {
    /// Builds the client's security; `cache_dir` holds the trust-on-first-use record.
    pub fn build(&self, cache_dir: Option<&Path>) -> CliResult<ClientSecurity> {
        let token = self
            .token_file
            .as_deref()
            .map(crate::read_token)
            .transpose()?
            .unwrap_or_default();
        if self.insecure_plaintext {
            if self.server_fingerprint.is_some() || self.tls_ca.is_some() {
                return Err("--insecure-plaintext cannot check a server identity: drop \
                     --server-fingerprint/--tls-ca, or drop --insecure-plaintext"
                    .into());
            }
            return Ok(ClientSecurity {
                security: Security::plaintext(token),
                record: None,
                recorded: None,
                first_use: false,
            });
        }
        let record = cache_dir.map(|d| d.join(KNOWN_SERVER_FILE));
        let recorded = match &record {
            Some(p) => read_record(p)?,
            None => None,
        };
        let trust = match (&self.server_fingerprint, &self.tls_ca, recorded) {
            (Some(f), _, _) => Trust::Pinned(f.parse().map_err(|e| format!("{e}"))?),
            (None, Some(ca), _) => Trust::Ca(ca.clone()),
            (None, None, Some(f)) => Trust::Pinned(f),
            (None, None, None) => Trust::FirstUse,
        };
        let first_use = matches!(trust, Trust::FirstUse);
        let tls = ClientTls::new(trust).map_err(|e| e.to_string())?;
        Ok(ClientSecurity {
            security: Security::tls(token, tls),
            record,
            recorded,
            first_use,
        })
    }
}

impl ClientSecurity {
    /// After a successful connection: records the server's fingerprint when it was
    /// trusted on first use or pinned anew, and says so.
    pub fn connected(&self, server: &str) -> CliResult<()> {
        let Some(tls) = &self.security.tls else {
            return Ok(());
        };
        let Some(seen) = tls.presented() else {
            return Ok(());
        };
        if self.recorded == Some(seen) {
            return Ok(());
        }
        match &self.record {
            Some(p) => {
                let text = format!("{seen} {server}\n");
                write_record(p, &text).map_err(|e| {
                    format!("cannot record the server identity in {}: {e}", p.display())
                })?;
                if self.first_use {
                    eprintln!(
                        "hoardfs: trusting {server} on first use: its identity is {seen} \
                         (recorded in {}; compare with `hoardfs serve --print-fingerprint` \
                         on the server)",
                        p.display()
                    );
                }
            }
            None if self.first_use => eprintln!(
                "hoardfs: {server} presented identity {seen} (not recorded: no cache \
                 directory; pass --server-fingerprint to pin it)"
            ),
            None => {}
        }
        Ok(())
    }

    /// Turns a failed connection into a message that says what to do.
    pub fn explain(&self, server: &str, e: &OriginError) -> String {
        if let (Some(tls), OriginError::Security(_)) = (&self.security.tls, e)
            && let Some((expected, presented)) = tls.mismatch()
        {
            let whence = match (&self.record, self.recorded) {
                (Some(p), Some(r)) if r == expected => format!(
                    "this cache trusts {expected} (recorded in {} when it first connected)",
                    p.display()
                ),
                _ => format!("--server-fingerprint says {expected}"),
            };
            return format!(
                "refusing hoardfs server {server}: it presented identity {presented}, but \
                 {whence}. Someone may be intercepting the connection, or the server's key \
                 was replaced. If the change is expected, check the fingerprint on the server \
                 (`hoardfs serve --print-fingerprint`) and mount with --server-fingerprint \
                 {presented} (it replaces the record)"
            );
        }
        match e {
            OriginError::Fs(hoardfs_origin::WireError::AuthFailed) => format!(
                "hoardfs server {server} refused our credential: check --token-file (a revoked \
                 or mistyped token; `hoardfs token list` on the server shows the valid ones)"
            ),
            OriginError::Unreachable(m) if m.contains("Connection refused") => format!(
                "cannot connect to hoardfs server {server}: {m}. Is `hoardfs serve` running \
                 there and listening on that address?"
            ),
            e => format!("cannot connect to hoardfs server {server}: {e}"),
        }
    }
}

fn read_record(p: &Path) -> CliResult<Option<Fingerprint>> {
    let read = hoardfs_cache::private::file_options()
        .read(true)
        .open(p)
        .and_then(|f| {
            use std::io::Read;
            use std::os::unix::fs::MetadataExt;
            let md = f.metadata()?;
            // SAFETY: geteuid has no preconditions.
            let me = unsafe { libc::geteuid() };
            // Whoever could write this record chose the server this mount trusts.
            if md.uid() != me || md.mode() & 0o022 != 0 {
                return Err(std::io::Error::other(format!(
                    "it belongs to uid {} with mode {:o}: only uid {me} may have written it \
                     (delete it to trust the server again on first use)",
                    md.uid(),
                    md.mode() & 0o7777
                )));
            }
            let mut text = String::new();
            (&f).take(4096).read_to_string(&mut text)?;
            Ok(text)
        });
    match read {
        Ok(text) => {
            let first = text.split_whitespace().next().unwrap_or("");
            first.parse().map(Some).map_err(|e| {
                CliError::Failed(format!(
                    "{}: {e}; delete the file to trust the server again on first use",
                    p.display()
                ))
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("cannot read {}: {e}", p.display()).into()),
    }
}

fn write_record(p: &Path, text: &str) -> std::io::Result<()> {
    let tmp = p.with_extension("tmp");
    hoardfs_cache::private::write(&tmp, text.as_bytes())?;
    std::fs::File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, p)
}

/// Server identity options of `hoardfs serve`.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerTlsArgs {
    /// Directory holding the server's generated identity (identity.pem) and client
    /// credentials (tokens). Default: /var/lib/hoardfs as root, else
    /// $XDG_STATE_HOME/hoardfs or ~/.local/state/hoardfs.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// A CA-issued certificate chain (PEM, leaf first) to present instead of the generated
    /// identity; needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert; must not be readable by group or others.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve without TLS: file data and credentials cross the network in clear text and
    /// clients cannot check who they talk to. For benchmarks on a trusted link only;
    /// clients must pass it too.
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    pub insecure_plaintext: bool,
}

impl ServerTlsArgs {
    /// The state directory in use.
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(hoardfs_tls::default_state_dir)
    }

    /// Loads (or generates) the server's identity.
    pub fn identity(&self) -> CliResult<ServerIdentity> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => {
                ServerIdentity::load_pem(c, k).map_err(|e| CliError::Failed(e.to_string()))
            }
            _ => {
                let dir = self.state_dir();
                let (id, fresh) = ServerIdentity::load_or_generate(&dir).map_err(|e| {
                    format!("{e} (the server keeps its TLS identity there: pass --state-dir)")
                })?;
                if fresh {
                    eprintln!(
                        "hoardfs: generated a new server identity {} in {}",
                        id.fingerprint(),
                        id.source().display()
                    );
                }
                Ok(id)
            }
        }
    }
}
