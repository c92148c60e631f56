//! Namespace storage backends: byte-addressed read/write/flush/deallocate/
//! write-zeroes, dispatched statically (no vtable on the I/O path).
//!
//! Callers (the I/O command layer) have already checked that every range lies
//! inside the namespace; backends check again and fail with an I/O error
//! rather than touching memory out of bounds.
use std::io;

pub mod file;
pub mod null;
pub mod ram;

/// Storage for one namespace.
pub trait Backend: Send {
    /// Copies `buf.len()` bytes at byte offset `off` into `buf`.
    fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Stores `buf` at byte offset `off`.
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes written data durable.
    fn flush(&mut self) -> io::Result<()>;
    /// Deallocates `[off, off + len)`; it reads back as zeroes afterwards.
    fn deallocate(&mut self, off: u64, len: u64) -> io::Result<()>;
    /// Writes zeroes to `[off, off + len)`.
    fn write_zeroes(&mut self, off: u64, len: u64) -> io::Result<()>;
    /// False if reads and writes move no data (null backend).
    fn moves_data(&self) -> bool {
        true
    }
}

/// `[off, off + len)` lies inside `[0, size)`.
#[inline]
pub(crate) fn in_bounds(off: u64, len: u64, size: u64) -> io::Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {off:#x}+{len:#x} outside backend of {size:#x} bytes"),
        )),
    }
}
