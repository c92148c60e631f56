//! Randomness from the operating system (`getrandom`).

use crate::error::AuthError;

/// Fill `buf` with random bytes.
pub fn fill(buf: &mut [u8]) -> Result<(), AuthError> {
    getrandom::fill(buf).map_err(AuthError::Random)
}

/// A random non-zero sequence number.
pub fn nonzero_u32() -> Result<u32, AuthError> {
    loop {
        let mut b = [0u8; 4];
        fill(&mut b)?;
        let v = u32::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}
