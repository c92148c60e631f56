//! Identify data structures: Identify Controller (NVMe 2.0c base spec
//! Figure 275) with its Power State Descriptors (Figure 276), Identify
//! Namespace for the NVM command set (NVM Command Set spec 1.0 Figure 97)
//! with its LBA Format descriptors, namespace ID lists and the Namespace
//! Identification Descriptor list (CNS 03h).
//!
//! Multi-byte integers are little-endian on the wire; the crate refuses to
//! build on a big-endian host, so native integers are used wherever the
//! specification places a field on its natural alignment. 128-bit values and
//! unaligned fields are byte arrays with accessors.
use std::borrow::Cow;

/// Size of every Identify data structure returned by the Identify command.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

mod controller;
mod lists;
mod namespace;

// Each part's public items are `identify`'s: the paths stay
// `crate::identify::X`.
pub use controller::*;
pub use lists::*;
pub use namespace::*;

/// Fills `dst` with `s`, left-justified and padded with ASCII spaces (0x20),
/// the encoding the specification uses for SN, MN, FR and similar fields.
///
/// `s` is truncated to `dst.len()` bytes. Characters outside printable ASCII
/// (0x20..=0x7E) are replaced by `?` so that the field is always ASCII.
pub fn set_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.chars()) {
        *d = if (' '..='~').contains(&c) {
            c as u8
        } else {
            b'?'
        };
    }
}

/// Reads a space-padded (or NUL-padded) ASCII/UTF-8 field, trimming leading
/// and trailing spaces and NULs. Invalid UTF-8 is replaced with U+FFFD; this
/// never panics.
pub fn ascii_str(src: &[u8]) -> Cow<'_, str> {
    // A NUL-terminated field (e.g. SUBNQN) ends at the first NUL.
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    let trim = |c: char| c == ' ' || c == '\0';
    match String::from_utf8_lossy(&src[..end]) {
        Cow::Borrowed(s) => Cow::Borrowed(s.trim_matches(trim)),
        Cow::Owned(s) => Cow::Owned(s.trim_matches(trim).to_owned()),
    }
}

/// Writes a NUL-terminated UTF-8 string (e.g. an NQN) into `dst`, zero-filling
/// the rest. At most `dst.len() - 1` bytes of `s` are copied, cut at a
/// character boundary, so the field is always NUL-terminated.
pub fn set_nul_terminated(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let Some(max) = dst.len().checked_sub(1) else {
        return;
    };
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

#[cfg(test)]
mod tests;
