//! The RAM backend: a private anonymous `MAP_NORESERVE` mapping of the
//! namespace size, so untouched blocks cost nothing and read as zeroes.
//! Deallocate and write-zeroes drop whole pages with `MADV_DONTNEED` (they
//! read back as zeroes) and zero the partial pages at the edges.
//!
//! Caveat: with `MAP_NORESERVE`, writing more than the machine can back ends
//! with the kernel's OOM killer, not an I/O error.
use std::io;
use std::ptr::NonNull;

use super::{in_bounds, Backend};

const PAGE: u64 = 4096;

pub struct RamBackend {
    ptr: NonNull<u8>,
    size: u64,
}

// SAFETY: the mapping is owned exclusively by this value; it is only
// accessed through `&mut self` (under the controller lock).
unsafe impl Send for RamBackend {}

impl RamBackend {
    pub fn new(size: u64) -> io::Result<RamBackend> {
        let len = usize::try_from(size).map_err(|_| io::Error::other("namespace too large"))?;
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty RAM namespace",
            ));
        }
        // SAFETY: new anonymous mapping, no hint; checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(RamBackend { ptr, size })
    }

    fn zero(&mut self, off: u64, len: u64) -> io::Result<()> {
        in_bounds(off, len, self.size)?;
        let end = off + len;
        let a = off.next_multiple_of(PAGE).min(end);
        let b = (end / PAGE * PAGE).max(a);
        // SAFETY: all ranges are inside the mapping (bounds checked above).
        unsafe {
            let base = self.ptr.as_ptr();
            std::ptr::write_bytes(base.add(off as usize), 0, (a - off) as usize);
            if b > a {
                let r = libc::madvise(
                    base.add(a as usize).cast(),
                    (b - a) as usize,
                    libc::MADV_DONTNEED,
                );
                if r != 0 {
                    // Fall back to plain zeroing.
                    std::ptr::write_bytes(base.add(a as usize), 0, (b - a) as usize);
                }
            }
            std::ptr::write_bytes(base.add(b as usize), 0, (end - b) as usize);
        }
        Ok(())
    }
}

impl Drop for RamBackend {
    fn drop(&mut self) {
        // SAFETY: the exact mapping created in `new`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.size as usize);
        }
    }
}

impl Backend for RamBackend {
    #[inline]
    fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        in_bounds(off, buf.len() as u64, self.size)?;
        // SAFETY: source range inside the mapping (checked); `buf` is a
        // distinct (host) buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(off as usize),
                buf.as_mut_ptr(),
                buf.len(),
            );
        }
        Ok(())
    }

    #[inline]
    fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        in_bounds(off, buf.len() as u64, self.size)?;
        // SAFETY: destination range inside the mapping (checked).
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                self.ptr.as_ptr().add(off as usize),
                buf.len(),
            );
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn deallocate(&mut self, off: u64, len: u64) -> io::Result<()> {
        self.zero(off, len)
    }

    fn write_zeroes(&mut self, off: u64, len: u64) -> io::Result<()> {
        self.zero(off, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroing_edges_and_pages() {
        let mut r = RamBackend::new(64 * 1024).unwrap();
        r.write(0, &[0xAB; 65536]).unwrap();
        r.deallocate(1000, 20_000).unwrap();
        let mut b = vec![0u8; 65536];
        r.read(0, &mut b).unwrap();
        assert!(b[..1000].iter().all(|&x| x == 0xAB));
        assert!(b[1000..21_000].iter().all(|&x| x == 0));
        assert!(b[21_000..].iter().all(|&x| x == 0xAB));
        assert!(r.read(65535, &mut [0u8; 2]).is_err());
    }
}
