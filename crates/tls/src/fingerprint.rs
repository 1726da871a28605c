//! [`Fingerprint`]: the SHA-256 digest of a server's certificate, written `SHA256:<base64>`
//! as OpenSSH writes host-key fingerprints. It is what a client pins
//! (`--server-fingerprint`) and what `hoardfs serve --print-fingerprint` shows; the same
//! value comes out of `openssl x509 -outform DER | openssl dgst -sha256 -binary | base64`.

use std::fmt;
use std::str::FromStr;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};

/// SHA-256 of a DER-encoded certificate.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    /// The fingerprint of a DER certificate.
    pub fn of_der(der: &[u8]) -> Fingerprint {
        let d = ring::digest::digest(&ring::digest::SHA256, der);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        Fingerprint(out)
    }

    /// The raw digest.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SHA256:{}", STANDARD_NO_PAD.encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Why a fingerprint string was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not a server fingerprint: {0:?} (expected SHA256: followed by 43 base64 characters, as \
     `hoardfs serve --print-fingerprint` prints it)"
)]
pub struct BadFingerprint(pub String);

impl FromStr for Fingerprint {
    type Err = BadFingerprint;

    fn from_str(s: &str) -> Result<Fingerprint, BadFingerprint> {
        let bad = || BadFingerprint(s.to_owned());
        let b64 = s.trim().strip_prefix("SHA256:").ok_or_else(bad)?;
        let bytes = STANDARD_NO_PAD
            .decode(b64)
            .or_else(|_| STANDARD.decode(b64))
            .map_err(|_| bad())?;
        let arr: [u8; 32] = bytes.try_into().map_err(|_| bad())?;
        Ok(Fingerprint(arr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_its_text_form() {
        let f = Fingerprint::of_der(b"certificate bytes");
        let s = f.to_string();
        assert!(s.starts_with("SHA256:") && s.len() == 7 + 43, "{s}");
        assert_eq!(s.parse::<Fingerprint>().unwrap(), f);
        // Padded base64 (as `base64` prints it) is accepted too.
        let padded = format!("{s}=");
        assert_eq!(padded.parse::<Fingerprint>().unwrap(), f);
    }

    #[test]
    fn rejects_what_is_not_a_sha256_fingerprint() {
        for s in ["", "SHA256:", "MD5:abcd", "SHA256:abc", "SHA256:!!!!"] {
            assert!(s.parse::<Fingerprint>().is_err(), "{s:?} accepted");
        }
        let f = Fingerprint::of_der(b"x").to_string();
        let short = &f[..f.len() - 4];
        assert!(short.parse::<Fingerprint>().is_err());
    }
}
