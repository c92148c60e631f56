//! CRC32C header and data digests (§3.6.2.2).

use super::error::PduError;

/// CRC32C (Castagnoli) of `bytes`, hardware accelerated where available.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header digest of a PDU header (its first HLEN bytes).
#[inline]
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c::crc32c(header)
}

/// An incremental data digest over data given in pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataDigest(u32);

impl DataDigest {
    pub const fn new() -> Self {
        DataDigest(0)
    }
    /// Adds the next piece of data.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }
    /// The digest of all data so far.
    #[inline]
    pub const fn value(&self) -> u32 {
        self.0
    }
}

/// The data digest of data in one or more pieces.
pub fn data_digest<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut d = DataDigest::new();
    for p in pieces {
        d.update(p);
    }
    d.value()
}

/// A digest as stored on the wire (little-endian).
#[inline]
pub const fn digest_bytes(digest: u32) -> [u8; 4] {
    digest.to_le_bytes()
}

/// A digest read from its wire bytes; `None` if `bytes` is not 4 long.
#[inline]
pub fn digest_from_bytes(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Checks the header digest `received` (4 wire bytes) against `header`.
pub fn verify_header_digest(header: &[u8], received: [u8; 4]) -> Result<(), PduError> {
    let computed = header_digest(header);
    let received = u32::from_le_bytes(received);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::HeaderDigest { received, computed })
    }
}

/// Checks a data digest: `computed` (from [`DataDigest`] or
/// [`data_digest`]) against the 4 bytes received.
pub fn verify_data_digest(computed: u32, received: [u8; 4]) -> Result<(), PduError> {
    let received = u32::from_le_bytes(received);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::DataDigest { received, computed })
    }
}
