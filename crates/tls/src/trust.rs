//! Client side: whom a client trusts to be its server ([`Trust`]) and the rustls
//! configuration that enforces it ([`ClientTls`]).
//!
//! A pinned fingerprint or the first-use fingerprint is checked against the leaf
//! certificate, and the handshake's signature is still verified with that certificate's key
//! (a peer that merely replays the certificate cannot complete the handshake). Names and
//! expiry are not checked in those modes, as with SSH host keys. With a CA file the chain
//! and the server name are verified the usual way (webpki).

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};

use crate::{Fingerprint, TlsError};

/// What a client accepts as its server's identity.
#[derive(Debug, Clone)]
pub enum Trust {
    /// Only the certificate with this fingerprint (`--server-fingerprint`).
    Pinned(Fingerprint),
    /// A chain to one of the CA certificates in this PEM file, for the server's name
    /// (`--tls-ca`).
    Ca(std::path::PathBuf),
    /// Whatever the first handshake presents, and from then on only that (trust on first
    /// use; the caller records it, see `presented`).
    FirstUse,
}

/// A client TLS configuration plus what the server presented.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<rustls::ClientConfig>,
    verifier: Arc<Verifier>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("mode", &self.verifier.mode)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// Builds the configuration for `trust`.
    pub fn new(trust: Trust) -> Result<ClientTls, TlsError> {
        let provider = crate::provider();
        let mode = match trust {
            Trust::Pinned(f) => Mode::Pinned(f),
            Trust::FirstUse => Mode::FirstUse(Mutex::new(None)),
            Trust::Ca(path) => Mode::Ca(ca_verifier(&path, &provider)?),
        };
        let verifier = Arc::new(Verifier {
            mode,
            presented: Mutex::new(None),
            provider: Arc::clone(&provider),
        });
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| TlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier.clone())
            .with_no_client_auth();
        config.alpn_protocols = vec![crate::ALPN.to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        Ok(ClientTls {
            config: Arc::new(config),
            verifier,
        })
    }

    /// The rustls configuration.
    pub fn config(&self) -> Arc<rustls::ClientConfig> {
        Arc::clone(&self.config)
    }

    /// Fingerprint of the certificate the most recent handshake presented (accepted or
    /// not).
    pub fn presented(&self) -> Option<Fingerprint> {
        *self.verifier.presented.lock()
    }

    /// When the most recent handshake was refused because the server's certificate was not
    /// the expected one: (expected, presented). `None` for CA mode (see the TLS error).
    pub fn mismatch(&self) -> Option<(Fingerprint, Fingerprint)> {
        let presented = self.presented()?;
        let expected = match &self.verifier.mode {
            Mode::Pinned(f) => *f,
            Mode::FirstUse(seen) => (*seen.lock())?,
            Mode::Ca(_) => return None,
        };
        (expected != presented).then_some((expected, presented))
    }

    /// The name to send and (in CA mode) verify, from `HOST:PORT`: its host, or
    /// `hoardfs` when that is not a host name or IP address (fine where the certificate
    /// is pinned or trusted on first use, which do not look at names).
    pub fn server_name(addr: &str) -> ServerName<'static> {
        Self::host_name(addr)
            .unwrap_or_else(|| ServerName::try_from("hoardfs".to_owned()).expect("valid name"))
    }

    /// [`ClientTls::server_name`], except that in CA mode, where the certificate is
    /// checked against it, a host that is not a name or an address is refused.
    pub fn checked_server_name(&self, addr: &str) -> Result<ServerName<'static>, String> {
        match (&self.verifier.mode, Self::host_name(addr)) {
            (_, Some(name)) => Ok(name),
            (Mode::Ca(_), None) => Err(format!(
                "{addr} has no host name or IP address to check the server's certificate \
                 against (give HOST:PORT, [IPV6]:PORT)"
            )),
            (_, None) => Ok(Self::server_name(addr)),
        }
    }

    /// The host of `HOST:PORT` (or `[V6]:PORT`) as a server name, if it is one.
    fn host_name(addr: &str) -> Option<ServerName<'static>> {
        let host = match addr.rsplit_once(':') {
            Some((h, _)) => h,
            None => addr,
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        ServerName::try_from(host.to_owned()).ok()
    }
}

enum Mode {
    Pinned(Fingerprint),
    FirstUse(Mutex<Option<Fingerprint>>),
    Ca(Arc<WebPkiServerVerifier>),
}

impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Pinned(p) => write!(f, "Pinned({p})"),
            Mode::FirstUse(s) => write!(f, "FirstUse({:?})", *s.lock()),
            Mode::Ca(_) => write!(f, "Ca"),
        }
    }
}

#[derive(Debug)]
struct Verifier {
    mode: Mode,
    presented: Mutex<Option<Fingerprint>>,
    provider: Arc<CryptoProvider>,
}

fn ca_verifier(
    path: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Pem(path.to_owned(), e.to_string()))?;
    for c in certs {
        roots
            .add(c)
            .map_err(|e| TlsError::Pem(path.to_owned(), e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem(
            path.to_owned(),
            "no CA certificate in it".into(),
        ));
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))
}

fn refused(expected: Fingerprint, presented: Fingerprint) -> rustls::Error {
    rustls::Error::General(format!(
        "server identity changed: expected {expected}, the server presented {presented}"
    ))
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let presented = Fingerprint::of_der(end_entity);
        *self.presented.lock() = Some(presented);
        match &self.mode {
            Mode::Pinned(expected) if *expected == presented => Ok(ServerCertVerified::assertion()),
            Mode::Pinned(expected) => Err(refused(*expected, presented)),
            Mode::FirstUse(seen) => {
                let mut seen = seen.lock();
                match *seen {
                    None => {
                        *seen = Some(presented);
                        Ok(ServerCertVerified::assertion())
                    }
                    Some(s) if s == presented => Ok(ServerCertVerified::assertion()),
                    Some(s) => Err(refused(s, presented)),
                }
            }
            Mode::Ca(v) => {
                v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is offered.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_mode_refuses_an_address_with_no_host_to_check_the_certificate_against() {
        let d = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["example.test".to_owned()]).unwrap();
        let pem = d.path().join("ca.pem");
        std::fs::write(&pem, ck.cert.pem()).unwrap();
        let ca = ClientTls::new(Trust::Ca(pem)).unwrap();
        assert!(ca.checked_server_name("example.test:7070").is_ok());
        assert!(ca.checked_server_name("[::1]:7070").is_ok());
        // A bare IPv6 address reads as host ":" and port "1": not a name.
        let err = ca.checked_server_name("::1").unwrap_err();
        assert!(err.contains("HOST:PORT"), "{err}");
        // Pinned and first-use trust do not look at names.
        let tofu = ClientTls::new(Trust::FirstUse).unwrap();
        assert!(tofu.checked_server_name("::1").is_ok());
    }
}
