//! The null backend: accepts every command and moves no data (reads leave
//! host memory untouched). For benchmarking the host driver; the I/O layer
//! still validates the PRPs and their IOMMU translation.
use std::io;

use super::Backend;

pub struct NullBackend;

impl Backend for NullBackend {
    #[inline]
    fn read(&mut self, _off: u64, _buf: &mut [u8]) -> io::Result<()> {
        Ok(())
    }
    #[inline]
    fn write(&mut self, _off: u64, _buf: &[u8]) -> io::Result<()> {
        Ok(())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
    fn deallocate(&mut self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn write_zeroes(&mut self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
    fn moves_data(&self) -> bool {
        false
    }
}
