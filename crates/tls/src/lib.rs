//! Transport security for hoardfs: every connection is TLS 1.3 (rustls with the *ring*
//! provider) unless both sides opt out with `--insecure-plaintext`.
//!
//! The server proves its identity with a certificate ([`ServerIdentity`]): one it generated
//! on first start and keeps in its state directory, or a CA-issued one. Clients check it
//! against a pinned [`Fingerprint`], a CA file, or the fingerprint they recorded the first
//! time they connected ([`Trust`]). Client credentials (tokens) travel inside the TLS
//! session; see the server crate.

mod fingerprint;
mod identity;
mod keepalive;
mod trust;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub use fingerprint::{BadFingerprint, Fingerprint};
pub use identity::{IDENTITY_FILE, ServerIdentity, create_private_dir};
pub use keepalive::enable_keepalive;
pub use rustls;
pub use trust::{ClientTls, Trust};

/// The ALPN protocol name both sides require, so a hoardfs peer is never mistaken for
/// another TLS service on the same port.
pub const ALPN: &[u8] = b"hoardfs/1";

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read or written.
    #[error("{0}: {1}")]
    Io(PathBuf, #[source] io::Error),
    /// A PEM file held no usable certificate or key.
    #[error("{0}: not a usable PEM certificate or key: {1}")]
    Pem(PathBuf, String),
    /// A key or directory others could change or read.
    #[error("{0} {1}")]
    Insecure(PathBuf, String),
    /// Generating a key pair failed.
    #[error("cannot generate the server identity: {0}")]
    Generate(String),
    /// rustls refused the configuration (e.g. a key that does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl TlsError {
    pub(crate) fn io(path: &Path, e: io::Error) -> TlsError {
        TlsError::Io(path.to_owned(), e)
    }
}

/// The crypto provider both sides use: *ring*, with AES-128-GCM preferred (the fastest
/// suite on CPUs with AES instructions), then AES-256-GCM and ChaCha20-Poly1305.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites.sort_by_key(|s| match s.suite() {
        rustls::CipherSuite::TLS13_AES_128_GCM_SHA256 => 0,
        rustls::CipherSuite::TLS13_AES_256_GCM_SHA384 => 1,
        _ => 2,
    });
    Arc::new(p)
}

/// The rustls server configuration for `identity`: TLS 1.3 only, no client certificates
/// (clients authenticate with tokens inside the session), no session tickets.
pub fn server_config(identity: &ServerIdentity) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(identity.certs.clone(), identity.key.clone_key())
        .map_err(|e| {
            TlsError::Config(format!(
                "{}: {e} (does the key belong to the certificate?)",
                identity.source.display()
            ))
        })?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// Where a server keeps its identity and credentials unless told otherwise:
/// `/var/lib/hoardfs` for root, else `$XDG_STATE_HOME/hoardfs` or
/// `~/.local/state/hoardfs`.
pub fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/lib/hoardfs");
    }
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("hoardfs");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    PathBuf::from(home).join(".local/state/hoardfs")
}
