//! Data buffers of commands: page-aligned memory a command's data lives
//! in while it moves between the socket and the bdev.
//!
//! A buffer is either owned ([`AlignedBuf`], readable and writable
//! through safe slices) or lent ([`Lent`]) to something that touches it
//! behind the compiler's back — the bdev (a read or write in flight) or
//! the socket's send queue (until `sendmsg` copied it). A lent buffer has no accessor: it
//! can only be taken back with [`Lent::reclaim`], whose caller states
//! that the borrower is done. So no safe slice of memory under I/O exists.
use std::alloc::Layout;
use std::ptr::NonNull;

use pollux_bdev::RawSeg;

/// Alignment of every buffer: a page, which every bdev accepts (O_DIRECT
/// included).
pub(crate) const ALIGN: usize = 4096;

/// Page-aligned, zero-initialised heap memory of a fixed length.
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: the buffer owns its memory exclusively (like a `Vec<u8>`).
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (at least one page is allocated).
    /// `None` if the allocation fails or the length overflows.
    pub fn new(len: usize) -> Option<AlignedBuf> {
        let cap = len.max(1).checked_next_multiple_of(ALIGN)?;
        let layout = Layout::from_size_align(cap, ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(AlignedBuf {
            ptr: NonNull::new(p)?,
            len,
            cap,
        })
    }

    /// Bytes allocated (the length rounded up to pages).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the length within the capacity (the bytes keep their
    /// contents). False if `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.cap {
            return false;
        }
        self.len = len;
        true
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised bytes,
        // owned by `self` and not lent (a lent buffer is a `Lent`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// Lends the first `len` bytes (clamped to the length) out; the
    /// segment stays valid until the `Lent` is reclaimed or dropped.
    pub fn lend(self, len: usize) -> (Lent, RawSeg) {
        let seg = RawSeg {
            ptr: self.ptr.as_ptr(),
            len: len.min(self.len),
        };
        (Lent(self), seg)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // The layout was valid at allocation with these values.
        if let Ok(layout) = Layout::from_size_align(self.cap, ALIGN) {
            // SAFETY: allocated by `alloc_zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// A buffer lent to the bdev or the kernel: no access until reclaimed.
pub(crate) struct Lent(AlignedBuf);

impl Lent {
    /// Takes the buffer back.
    ///
    /// # Safety
    /// Whatever it was lent to no longer reads or writes it (the bdev
    /// delivered the request's completion, the kernel notified the send).
    pub unsafe fn reclaim(self) -> AlignedBuf {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_resizable_within_capacity() {
        let mut b = AlignedBuf::new(100).unwrap();
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_slice().len(), 100);
        assert_eq!(b.capacity(), 4096);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[99] = 7;
        assert!(b.set_len(4096));
        assert_eq!(b.as_slice()[99], 7);
        assert!(!b.set_len(4097));
        let (lent, seg) = b.lend(10_000);
        assert_eq!(seg.len, 4096);
        // SAFETY: nothing borrowed it.
        let b = unsafe { lent.reclaim() };
        assert_eq!(b.as_slice()[99], 7);
    }
}
