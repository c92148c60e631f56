//! Buffers of this transport: ordinary page-aligned memory. Data moves
//! through the socket, so a buffer's "bus address" is its virtual
//! address, tagged in its top byte (`TAG`) so a buffer of another
//! transport (whose bus addresses mean something else) is refused at
//! submission instead of being read or written as if it were ours.
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Arc;

use pollux_nvme::dma::{DmaBuffer, DmaRelease, Iova, PAGE_SIZE};
use pollux_nvme::error::{Error, Result};

/// Top byte of every bus address this transport hands out. User-space
/// addresses have a zero top byte (even with 5-level paging).
pub(crate) const TAG: u64 = 0xA5 << 56;
const MASK: u64 = (1 << 56) - 1;

/// True if `addr` is a bus address of a buffer of this transport.
#[inline(always)]
pub(crate) fn is_ours(addr: u64) -> bool {
    addr & !MASK == TAG
}

/// The pointer a tagged bus address stands for.
#[inline(always)]
pub(crate) fn ptr(addr: u64) -> *mut u8 {
    (addr & MASK) as usize as *mut u8
}

/// The bytes at a tagged bus address.
///
/// # Safety
/// `addr..addr+len` must lie in a live buffer of this transport that
/// nothing writes for the lifetime of the slice.
#[inline(always)]
pub(crate) unsafe fn slice<'a>(addr: u64, len: usize) -> &'a [u8] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr(addr), len) }
}

fn layout(len: usize) -> Option<Layout> {
    let size = len.max(1).checked_next_multiple_of(PAGE_SIZE)?;
    Layout::from_size_align(size, PAGE_SIZE).ok()
}

struct Heap;

impl DmaRelease for Heap {
    fn release(&self, ptr: NonNull<u8>, len: usize, _iova: u64) {
        if let Some(l) = layout(len) {
            // SAFETY: `ptr` came from `alloc_zeroed` with this layout
            // (same length, same rounding) in `alloc`, and is released once.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), l) }
        }
    }
}

/// Zeroed, page-aligned memory of `len` bytes.
pub(crate) fn alloc(len: usize) -> Result<DmaBuffer> {
    let l = layout(len).ok_or_else(|| Error::Dma(format!("{len} bytes: too large")))?;
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(l) };
    let p = NonNull::new(p).ok_or_else(|| Error::Dma(format!("out of memory for {len} bytes")))?;
    let iova = TAG | p.as_ptr() as usize as u64;
    // SAFETY: `p` is a fresh allocation of at least `len` bytes owned by
    // the buffer; its bus address is its (tagged) virtual address; `Heap`
    // frees it with the same layout.
    Ok(unsafe { DmaBuffer::from_raw(p, len, Iova::Contiguous(iova), Arc::new(Heap)) })
}

/// This transport's buffers as the engine reaches them (by tagged
/// address).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TcpMem;

impl crate::engine::memory::Memory for TcpMem {
    #[inline(always)]
    unsafe fn bytes<'a>(&self, addr: u64, len: usize) -> &'a [u8] {
        // SAFETY: the caller's contract (a live buffer of this transport
        // nothing writes meanwhile).
        unsafe { slice(addr, len) }
    }

    #[inline(always)]
    unsafe fn write(&self, addr: u64, src: &[u8]) {
        // SAFETY: the caller's contract: `addr..+src.len()` lies in a live
        // buffer of this transport nothing else touches meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), ptr(addr), src.len()) }
    }

    #[inline(always)]
    unsafe fn zero(&self, addr: u64, len: usize) {
        // SAFETY: as for `write`.
        unsafe { std::ptr::write_bytes(ptr(addr), 0, len) }
    }
}
