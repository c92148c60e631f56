//! Host memory for backends that are not reached by DMA (null, RAM,
//! io_uring): page-aligned anonymous mappings wrapped as the driver's
//! [`DmaBuffer`], so every backend takes the same owned [`IoBuf`]. The
//! "bus address" of such memory is its virtual address.
use std::ptr::NonNull;
use std::sync::Arc;

use pollux_nvme::dma::{DmaRelease, Iova};
use pollux_nvme::{DmaBuffer, IoBuf};

/// Frees an anonymous mapping.
struct Unmap;

impl DmaRelease for Unmap {
    fn release(&self, ptr: NonNull<u8>, len: usize, _iova: u64) {
        // SAFETY: ptr/len are exactly what `alloc_host` mapped (rounded up
        // to a page), released once by DmaBuffer::drop.
        unsafe {
            libc::munmap(ptr.as_ptr().cast(), len.max(1).next_multiple_of(4096));
        }
    }
}

/// `len` bytes of zeroed, 4 KiB-aligned host memory.
pub fn alloc_host(len: usize) -> std::io::Result<DmaBuffer> {
    let map_len = len.max(1).next_multiple_of(4096);
    // SAFETY: an anonymous private mapping; no existing memory is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let ptr = NonNull::new(p.cast::<u8>()).ok_or_else(std::io::Error::last_os_error)?;
    // SAFETY: the mapping is ours alone, `map_len >= len` bytes, and Unmap
    // gives it back; the identity IOVA is what host-memory backends use.
    Ok(unsafe {
        DmaBuffer::from_raw(
            ptr,
            len,
            Iova::Contiguous(ptr.as_ptr() as u64),
            Arc::new(Unmap),
        )
    })
}

/// `alloc_host` as one owned buffer.
pub fn alloc_host_buf(len: usize) -> std::io::Result<IoBuf> {
    alloc_host(len).map(IoBuf::new)
}
