//! Namespace storage backends: byte-addressed read/write/flush/deallocate/
//! write-zeroes, dispatched statically (no vtable on the I/O path).
//!
//! Callers (the I/O command layer) have already checked that every range lies
//! inside the namespace; backends check again and fail with an I/O error
//! rather than touching memory out of bounds.
use std::io;

use crate::config::{BackendConfig, NamespaceConfig};

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

/// Every backend, as one enum so dispatch is a `match`.
pub(crate) enum AnyBackend {
    Null(null::NullBackend),
    Ram(ram::RamBackend),
    File(file::FileBackend),
}

impl AnyBackend {
    /// Creates the backend; returns it with the namespace size in bytes.
    pub fn open(cfg: &NamespaceConfig) -> io::Result<(AnyBackend, u64)> {
        Ok(match &cfg.backend {
            BackendConfig::Null => (AnyBackend::Null(null::NullBackend), cfg.size_bytes),
            BackendConfig::Ram => (
                AnyBackend::Ram(ram::RamBackend::new(cfg.size_bytes)?),
                cfg.size_bytes,
            ),
            BackendConfig::File { path } => {
                let f = file::FileBackend::open(path, cfg.size_bytes, 1u64 << cfg.lba_shift)?;
                let size = f.size();
                (AnyBackend::File(f), size)
            }
        })
    }
}

macro_rules! dispatch {
    ($self:ident, $b:ident => $e:expr) => {
        match $self {
            AnyBackend::Null($b) => $e,
            AnyBackend::Ram($b) => $e,
            AnyBackend::File($b) => $e,
        }
    };
}

impl Backend for AnyBackend {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        dispatch!(self, b => b.read(off, buf))
    }
    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        dispatch!(self, b => b.write(off, buf))
    }
    fn flush(&mut self) -> io::Result<()> {
        dispatch!(self, b => b.flush())
    }
    fn deallocate(&mut self, off: u64, len: u64) -> io::Result<()> {
        dispatch!(self, b => b.deallocate(off, len))
    }
    fn write_zeroes(&mut self, off: u64, len: u64) -> io::Result<()> {
        dispatch!(self, b => b.write_zeroes(off, len))
    }
    #[inline]
    fn moves_data(&self) -> bool {
        !matches!(self, AnyBackend::Null(_))
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
