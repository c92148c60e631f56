//! DH-HMAC-CHAP secrets in the DHHC-1 text form `nvme gen-dhchap-key`
//! writes (`DHHC-1:XX:base64(key || crc32(key) LE):`), and the key
//! transformation of Linux's `nvme_auth_transform_key`.

use std::fmt;
use std::path::Path;

use base64::Engine as _;
use pollux_spec::fabrics::HashId;
use zeroize::{Zeroize, Zeroizing};

use crate::bytes::Secret;
use crate::digest::hmac_parts;
use crate::error::SecretError;

/// A parsed DHHC-1 secret: the key and the hash (if any) used to
/// transform it with an NQN before use.
#[derive(Clone, PartialEq, Eq)]
pub struct DhchapKey {
    /// `None` for `00` (the key is used as is), else the hash of the
    /// transformation.
    transform: Option<HashId>,
    key: Secret,
}

impl fmt::Debug for DhchapKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DhchapKey")
            .field("transform", &self.transform)
            .field("key", &self.key)
            .finish()
    }
}

impl DhchapKey {
    /// Parse `DHHC-1:XX:<base64 of key || crc32 LE>:` (the trailing ':'
    /// and surrounding whitespace are optional). XX is 00 (no
    /// transformation), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512); the key
    /// is 32, 48 or 64 bytes and its CRC-32 must match.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let text = text.trim();
        let rest = text.strip_prefix("DHHC-1:").ok_or(SecretError::BadPrefix)?;
        let (hash, rest) = rest.split_once(':').ok_or(SecretError::BadHashId)?;
        let transform = match hash {
            "00" => None,
            "01" => Some(HashId::Sha256),
            "02" => Some(HashId::Sha384),
            "03" => Some(HashId::Sha512),
            _ => return Err(SecretError::BadHashId),
        };
        let b64 = rest.strip_suffix(':').unwrap_or(rest);
        let mut raw = Zeroizing::new(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .map_err(|_| SecretError::BadBase64)?,
        );
        if !matches!(raw.len(), 36 | 52 | 68) {
            return Err(SecretError::BadLength(raw.len().saturating_sub(4)));
        }
        let klen = raw.len() - 4;
        let crc = u32::from_le_bytes([raw[klen], raw[klen + 1], raw[klen + 2], raw[klen + 3]]);
        if crc32fast::hash(&raw[..klen]) != crc {
            return Err(SecretError::BadCrc);
        }
        let key = Secret::new(raw[..klen].to_vec());
        raw.zeroize();
        Ok(DhchapKey { transform, key })
    }

    /// Read and parse a key file holding one DHHC-1 secret.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, SecretError> {
        let path = path.as_ref();
        let text =
            Zeroizing::new(
                std::fs::read_to_string(path).map_err(|source| SecretError::Io {
                    path: path.display().to_string(),
                    source,
                })?,
            );
        Self::parse(&text)
    }

    /// A key used as is (hash field 00) or transformed with `transform`.
    pub fn from_raw(key: Secret, transform: Option<HashId>) -> Self {
        DhchapKey { transform, key }
    }

    /// The DHHC-1 text of this key (what `nvme gen-dhchap-key` prints).
    pub fn to_dhhc1(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.expose().to_vec());
        raw.extend_from_slice(&crc32fast::hash(self.key.expose()).to_le_bytes());
        let b64 = Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&*raw));
        Zeroizing::new(format!(
            "DHHC-1:{:02}:{}:",
            self.transform.map_or(0, |h| h as u8),
            &*b64
        ))
    }

    /// The hash of the transformation, `None` for 00.
    pub fn transform_hash(&self) -> Option<HashId> {
        self.transform
    }

    /// The untransformed key.
    pub fn key(&self) -> &Secret {
        &self.key
    }

    /// The key used in responses for `nqn` (Linux
    /// `nvme_auth_transform_key`): the key itself for 00, else
    /// HMAC-hash(key, nqn || "NVMe-over-Fabrics").
    pub fn transform(&self, nqn: &str) -> Secret {
        match self.transform {
            None => self.key.clone(),
            Some(h) => hmac_parts(
                h,
                self.key.expose(),
                &[nqn.as_bytes(), b"NVMe-over-Fabrics"],
            ),
        }
    }
}
