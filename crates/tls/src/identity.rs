//! [`ServerIdentity`]: the certificate chain and private key a server proves itself with.
//!
//! Either generated on first start and kept in the state directory (`identity.pem`, mode
//! 0600, written to a temporary name and renamed so that a crash never leaves half a key),
//! or an administrator's CA-issued certificate and key (`--tls-cert`, `--tls-key`).

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{Fingerprint, TlsError};

/// Name of the generated identity inside the state directory.
pub const IDENTITY_FILE: &str = "identity.pem";

/// A server's certificate chain (leaf first) and its private key.
#[derive(Debug)]
pub struct ServerIdentity {
    pub(crate) certs: Vec<CertificateDer<'static>>,
    pub(crate) key: PrivateKeyDer<'static>,
    /// Where it came from, for messages.
    pub(crate) source: PathBuf,
}

impl ServerIdentity {
    /// Loads `STATE_DIR/identity.pem`, generating it (and the directory, mode 0700) first if
    /// it does not exist. Returns the identity and whether it was just generated.
    pub fn load_or_generate(state_dir: &Path) -> Result<(ServerIdentity, bool), TlsError> {
        let path = state_dir.join(IDENTITY_FILE);
        match fs::symlink_metadata(&path) {
            Ok(_) => return Ok((ServerIdentity::load_pem(&path, &path)?, false)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(TlsError::io(&path, e)),
        }
        create_private_dir(state_dir)?;
        let names = vec!["hoardfs".to_owned(), hostname()];
        let ck = rcgen::generate_simple_self_signed(names)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        let pem = format!("{}{}", ck.cert.pem(), ck.signing_key.serialize_pem());
        let tmp = state_dir.join(format!(".{IDENTITY_FILE}.{}.tmp", std::process::id()));
        let write = || -> io::Result<()> {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(pem.as_bytes())?;
            f.sync_all()?;
            // A second server starting at the same moment keeps the first one's key.
            fs::hard_link(&tmp, &path).or_else(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    Ok(())
                } else {
                    Err(e)
                }
            })
        };
        let written = write();
        let _ = fs::remove_file(&tmp);
        written.map_err(|e| TlsError::io(&path, e))?;
        Ok((ServerIdentity::load_pem(&path, &path)?, true))
    }

    /// Loads a PEM certificate chain (leaf first) and a PEM private key; they may be the
    /// same file.
    pub fn load_pem(cert: &Path, key: &Path) -> Result<ServerIdentity, TlsError> {
        let certs = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Pem(cert.to_owned(), e.to_string()))?;
        if certs.is_empty() {
            return Err(TlsError::Pem(
                cert.to_owned(),
                "no certificate in it".into(),
            ));
        }
        check_key_file(key)?;
        let key_der = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| TlsError::Pem(key.to_owned(), e.to_string()))?;
        Ok(ServerIdentity {
            certs,
            key: key_der,
            source: cert.to_owned(),
        })
    }

    /// The fingerprint of the leaf certificate (what clients pin).
    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint::of_der(&self.certs[0])
    }

    /// The file the certificate came from.
    pub fn source(&self) -> &Path {
        &self.source
    }
}

/// Creates `dir` (and its parents) with mode 0700 if missing; refuses a directory others
/// can write to, since whoever can replace the key can impersonate the server.
pub fn create_private_dir(dir: &Path) -> Result<(), TlsError> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| TlsError::io(dir, e))?;
    let md = fs::metadata(dir).map_err(|e| TlsError::io(dir, e))?;
    if md.permissions().mode() & 0o022 != 0 {
        return Err(TlsError::Insecure(
            dir.to_owned(),
            "is writable by group or others".into(),
        ));
    }
    Ok(())
}

/// A private key others can read is refused: it would let them impersonate the server.
fn check_key_file(key: &Path) -> Result<(), TlsError> {
    let md = fs::metadata(key).map_err(|e| TlsError::io(key, e))?;
    if md.permissions().mode() & 0o077 != 0 {
        return Err(TlsError::Insecure(
            key.to_owned(),
            format!(
                "holds a private key but has mode {:o}: run chmod 600 on it",
                md.permissions().mode() & 0o777
            ),
        ));
    }
    Ok(())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match (rc, std::str::from_utf8(&buf[..end])) {
        (0, Ok(h)) if !h.is_empty() => h.to_owned(),
        _ => "localhost".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_reloaded_with_the_same_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let (a, fresh) = ServerIdentity::load_or_generate(&state).unwrap();
        assert!(fresh);
        let (b, fresh) = ServerIdentity::load_or_generate(&state).unwrap();
        assert!(!fresh);
        assert_eq!(a.fingerprint(), b.fingerprint());
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&state), 0o700);
        assert_eq!(mode(&state.join(IDENTITY_FILE)), 0o600);
        // Another state directory is another identity.
        let (c, _) = ServerIdentity::load_or_generate(&dir.path().join("other")).unwrap();
        assert_ne!(a.fingerprint(), c.fingerprint());
    }

    #[test]
    fn a_key_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (_, _) = ServerIdentity::load_or_generate(dir.path()).unwrap();
        let key = dir.path().join(IDENTITY_FILE);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ServerIdentity::load_or_generate(dir.path()).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }
}
