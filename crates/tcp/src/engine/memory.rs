//! How the engine reaches data it does not own: the buffers of commands,
//! named by address. The host's are its I/O buffers, by the tagged "bus
//! addresses" of `crate::mem`; the target's are slot buffers lent while
//! queued for the socket. The engine reads and writes them only through
//! this trait, and only while the command they belong to is outstanding.
/// Access to buffers by address.
pub trait Memory {
    /// The bytes at `addr`.
    ///
    /// # Safety
    /// `addr..addr + len` must lie in a live buffer lent to the engine
    /// that nothing writes while the slice lives.
    unsafe fn bytes<'a>(&self, addr: u64, len: usize) -> &'a [u8];
    /// Copies `src` to `addr`.
    ///
    /// # Safety
    /// `addr..addr + src.len()` must lie in a live buffer lent to the
    /// engine that nothing else reads or writes meanwhile.
    unsafe fn write(&self, addr: u64, src: &[u8]);
    /// Zeroes `len` bytes at `addr`.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    unsafe fn zero(&self, addr: u64, len: usize);
}

/// Addresses that are plain pointers (the target's lent buffers; tests).
#[derive(Clone, Copy, Debug, Default)]
pub struct Pointers;

impl Memory for Pointers {
    #[inline(always)]
    unsafe fn bytes<'a>(&self, addr: u64, len: usize) -> &'a [u8] {
        // SAFETY: the caller's contract: `addr` points at `len` live bytes
        // nothing writes meanwhile.
        unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) }
    }

    #[inline(always)]
    unsafe fn write(&self, addr: u64, src: &[u8]) {
        // SAFETY: the caller's contract: `addr` points at `src.len()` live
        // bytes nothing else touches meanwhile; `src` is another buffer.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as usize as *mut u8, src.len()) }
    }

    #[inline(always)]
    unsafe fn zero(&self, addr: u64, len: usize) {
        // SAFETY: as for `write`.
        unsafe { std::ptr::write_bytes(addr as usize as *mut u8, 0, len) }
    }
}
