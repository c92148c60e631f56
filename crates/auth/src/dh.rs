//! Finite-field Diffie-Hellman over RFC 7919's ffdhe groups (generator 2),
//! with constant-time modular exponentiation from `crypto-bigint`.
//!
//! The primes are RFC 7919's (Appendix A), as OpenSSL gives them
//! (`openssl genpkey -genparam -algorithm DH -pkeyopt group:ffdheN`); a
//! test checks each against the structure the RFC fixes and that p and
//! (p-1)/2 pass a Fermat test, and against OpenSSL when it is installed.

use std::sync::OnceLock;

use crypto_bigint::modular::{BoxedMontyForm, BoxedMontyParams};
use crypto_bigint::{BoxedUint, Odd};
use pollux_spec::fabrics::DhGroupId;
use zeroize::Zeroize;

use crate::bytes::Secret;
use crate::error::AuthError;

/// Bits of a private exponent: at least twice the strength of the
/// largest group (ffdhe8192, 200 bits; Linux uses 2 x strength too).
const PRIVATE_BITS: u32 = 512;

/// The prime of an ffdhe group as hex (RFC 7919 Appendix A).
pub fn prime_hex(g: DhGroupId) -> Option<&'static str> {
    Some(match g {
        DhGroupId::Null => return None,
        DhGroupId::Ffdhe2048 => include_str!("primes/ffdhe2048.hex"),
        DhGroupId::Ffdhe3072 => include_str!("primes/ffdhe3072.hex"),
        DhGroupId::Ffdhe4096 => include_str!("primes/ffdhe4096.hex"),
        DhGroupId::Ffdhe6144 => include_str!("primes/ffdhe6144.hex"),
        DhGroupId::Ffdhe8192 => include_str!("primes/ffdhe8192.hex"),
    })
}

fn hex_to_bytes(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex
        .bytes()
        .filter(u8::is_ascii_hexdigit)
        .map(|c| match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => c - b'A' + 10,
        })
        .collect();
    digits
        .chunks(2)
        .map(|p| p[0] << 4 | p.get(1).copied().unwrap_or(0))
        .collect()
}

/// The prime of an ffdhe group, big-endian, `value_len()` bytes.
pub fn prime_bytes(g: DhGroupId) -> Option<Vec<u8>> {
    prime_hex(g).map(hex_to_bytes)
}

struct Group {
    bits: u32,
    p: BoxedUint,
    params: BoxedMontyParams,
}

fn group(g: DhGroupId) -> Option<&'static Group> {
    static GROUPS: [OnceLock<Option<Group>>; 6] = [const { OnceLock::new() }; 6];
    GROUPS[g as usize]
        .get_or_init(|| {
            let bytes = prime_bytes(g)?;
            let bits = (bytes.len() * 8) as u32;
            let p = BoxedUint::from_be_slice(&bytes, bits).ok()?;
            let odd = Option::<Odd<BoxedUint>>::from(Odd::new(p.clone()))?;
            Some(Group {
                bits,
                p,
                params: BoxedMontyParams::new_vartime(odd),
            })
        })
        .as_ref()
}

fn pow(grp: &Group, base: &BoxedUint, exp: &BoxedUint) -> BoxedUint {
    BoxedMontyForm::new(base.clone(), &grp.params)
        .pow(exp)
        .retrieve()
}

fn to_fixed_be(v: &BoxedUint, len: usize) -> Vec<u8> {
    let b = v.to_be_bytes();
    let mut out = vec![0u8; len];
    let n = b.len().min(len);
    out[len - n..].copy_from_slice(&b[b.len() - n..]);
    out
}

/// One side's ephemeral DH key pair in a group; the private exponent is
/// zeroised on drop.
pub struct DhKeyPair {
    group: DhGroupId,
    x: BoxedUint,
    public: Vec<u8>,
}

impl Drop for DhKeyPair {
    fn drop(&mut self) {
        self.x.zeroize();
    }
}

impl DhKeyPair {
    /// A fresh key pair (random exponent from the OS); `None` group is
    /// [`DhGroupId::Null`].
    pub fn generate(g: DhGroupId) -> Result<Self, AuthError> {
        let grp = group(g).ok_or(AuthError::DhGroupUnusable(g as u8))?;
        let mut raw = [0u8; (PRIVATE_BITS / 8) as usize];
        crate::random::fill(&mut raw)?;
        raw[0] |= 0x80;
        let x = BoxedUint::from_be_slice(&raw, PRIVATE_BITS)
            .map_err(|_| AuthError::DhGroupUnusable(g as u8))?;
        raw.zeroize();
        let two = BoxedUint::from_be_slice(&[2], grp.bits)
            .map_err(|_| AuthError::DhGroupUnusable(g as u8))?;
        let y = pow(grp, &two, &x);
        Ok(DhKeyPair {
            group: g,
            public: to_fixed_be(&y, g.value_len()),
            x,
        })
    }

    /// Our public value g^x mod p, big-endian, padded to the prime's
    /// length (as Linux and SPDK send it).
    pub fn public(&self) -> &[u8] {
        &self.public
    }

    /// The shared secret (peer^x mod p), padded to the prime's length,
    /// after checking 1 < peer < p-1. The peer's value may be shorter
    /// than the prime (leading zeros left out) but not longer.
    pub fn shared(&self, peer: &[u8]) -> Result<Secret, AuthError> {
        let grp = group(self.group).ok_or(AuthError::DhGroupUnusable(self.group as u8))?;
        let len = self.group.value_len();
        if peer.is_empty() || peer.len() > len {
            return Err(AuthError::BadDhValue);
        }
        let y = BoxedUint::from_be_slice(peer, grp.bits).map_err(|_| AuthError::BadDhValue)?;
        let one = BoxedUint::one_with_precision(grp.bits);
        let p_minus_1 = grp.p.wrapping_sub(&one);
        if y <= one || y >= p_minus_1 {
            return Err(AuthError::BadDhValue);
        }
        let mut s = pow(grp, &y, &self.x);
        let out = Secret::new(to_fixed_be(&s, len));
        s.zeroize();
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fermat_two(n: &BoxedUint, e: &BoxedUint) -> BoxedUint {
        let bits = n.bits_precision();
        let odd = Option::<Odd<BoxedUint>>::from(Odd::new(n.clone())).expect("odd");
        let params = BoxedMontyParams::new_vartime(odd);
        let two = BoxedUint::from_be_slice(&[2], bits).expect("two");
        BoxedMontyForm::new(two, &params).pow(e).retrieve()
    }

    /// RFC 7919: p = 2^b - 2^(b-64) + {[2^(b-130) e] + X} * 2^64 - 1, so
    /// the top and bottom 64 bits are ones; p and q = (p-1)/2 are prime
    /// (checked here with base-2 Fermat tests, which any changed digit
    /// fails), and 2 generates the order-q subgroup (2^q = 1 mod p).
    #[test]
    fn primes_are_rfc7919_safe_primes() {
        for g in DhGroupId::ALL.into_iter().skip(1) {
            let bytes = prime_bytes(g).expect("prime");
            assert_eq!(bytes.len(), g.value_len(), "{g:?}");
            assert!(bytes[..8].iter().all(|&b| b == 0xFF), "{g:?} top");
            assert!(
                bytes[bytes.len() - 8..].iter().all(|&b| b == 0xFF),
                "{g:?} bottom"
            );
            if g > DhGroupId::Ffdhe3072 {
                // Fermat on the bigger primes is slow in debug builds;
                // OpenSSL's copy (below) covers them.
                continue;
            }
            let bits = (bytes.len() * 8) as u32;
            let p = BoxedUint::from_be_slice(&bytes, bits).expect("p");
            let one = BoxedUint::one_with_precision(bits);
            let pm1 = p.wrapping_sub(&one);
            assert_eq!(fermat_two(&p, &pm1), one, "{g:?}: p fails Fermat");
            let q = pm1.shr_vartime(1).expect("shift");
            assert_eq!(fermat_two(&p, &q), one, "{g:?}: 2 is not of order q");
            let qm1 = q.wrapping_sub(&one);
            assert_eq!(fermat_two(&q, &qm1), one, "{g:?}: q fails Fermat");
        }
    }

    /// The primes match OpenSSL's (an independent copy of RFC 7919), when
    /// the `openssl` command is installed.
    #[test]
    fn primes_match_openssl() {
        for g in DhGroupId::ALL.into_iter().skip(1) {
            let dir = std::env::temp_dir().join(format!(
                "pollux-auth-{}-{}.pem",
                std::process::id(),
                g.name()
            ));
            let gen = std::process::Command::new("openssl")
                .args(["genpkey", "-genparam", "-algorithm", "DH", "-pkeyopt"])
                .arg(format!("group:{}", g.name()))
                .arg("-out")
                .arg(&dir)
                .output();
            let Ok(gen) = gen else {
                eprintln!("openssl not installed: skipped");
                return;
            };
            assert!(gen.status.success());
            let out = std::process::Command::new("openssl")
                .args(["asn1parse", "-in"])
                .arg(&dir)
                .output()
                .expect("openssl asn1parse");
            let _ = std::fs::remove_file(&dir);
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text.lines().nth(1).expect("INTEGER line");
            let hex = line.rsplit(':').next().expect("hex");
            assert_eq!(
                hex_to_bytes(hex),
                prime_bytes(g).expect("prime"),
                "{g:?} differs from OpenSSL's"
            );
        }
    }

    #[test]
    fn dh_agrees_and_checks_range() {
        let g = DhGroupId::Ffdhe2048;
        let a = DhKeyPair::generate(g).expect("a");
        let b = DhKeyPair::generate(g).expect("b");
        assert_eq!(a.public().len(), 256);
        let sa = a.shared(b.public()).expect("sa");
        let sb = b.shared(a.public()).expect("sb");
        assert_eq!(sa, sb);
        assert_eq!(sa.len(), 256);
        let p = prime_bytes(g).expect("p");
        let mut pm1 = p.clone();
        pm1[255] -= 1;
        for bad in [
            vec![0u8],
            vec![1u8],
            pm1,
            p.clone(),
            vec![0xFF; 256],
            vec![1; 257],
            vec![],
        ] {
            assert!(matches!(a.shared(&bad), Err(AuthError::BadDhValue)));
        }
        // 2 is in range.
        assert!(a.shared(&[2]).is_ok());
    }
}
