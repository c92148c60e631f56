//! SHA-2 digests and HMACs by DH-HMAC-CHAP hash identifier (RustCrypto
//! `sha2` and `hmac`).

use hmac::{Hmac, KeyInit, Mac};
use pollux_spec::fabrics::HashId;
use sha2::{Digest, Sha256, Sha384, Sha512};
use subtle::ConstantTimeEq;

use crate::bytes::Secret;

/// H(data).
pub fn hash(h: HashId, data: &[u8]) -> Secret {
    Secret::new(match h {
        HashId::Sha256 => Sha256::digest(data).to_vec(),
        HashId::Sha384 => Sha384::digest(data).to_vec(),
        HashId::Sha512 => Sha512::digest(data).to_vec(),
    })
}

fn mac<M: Mac + KeyInit>(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    // HMAC takes keys of any length: new_from_slice cannot fail.
    let mut m = <M as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().to_vec()
}

/// HMAC-H(key, parts[0] || parts[1] || ...).
pub fn hmac_parts(h: HashId, key: &[u8], parts: &[&[u8]]) -> Secret {
    Secret::new(match h {
        HashId::Sha256 => mac::<Hmac<Sha256>>(key, parts),
        HashId::Sha384 => mac::<Hmac<Sha384>>(key, parts),
        HashId::Sha512 => mac::<Hmac<Sha512>>(key, parts),
    })
}

/// Constant-time equality of two byte strings (lengths are public).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && bool::from(a.ct_eq(b))
}
