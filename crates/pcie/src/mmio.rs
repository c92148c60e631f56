//! MMIO: BAR0 register access.
//!
//! Every access is a naturally aligned 32-bit atomic load (Acquire) or store
//! (Release). 64-bit registers (CAP, ASQ, ACQ) are accessed as two 32-bit
//! halves, low first: the NVMe spec allows it and QEMU's nvme device only
//! implements 4-byte accesses (quirk handled here, once). On x86-64 these
//! compile to plain `mov`s; the atomics make the ordering explicit and keep
//! the in-process emulated controller (which polls the same memory from
//! another thread) free of data races.
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

/// A mapped register window.
#[derive(Debug)]
pub struct Mmio {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: Mmio is a pointer to device registers; every access is atomic.
unsafe impl Send for Mmio {}
// SAFETY: as above; concurrent atomic accesses are fine.
unsafe impl Sync for Mmio {}

impl Mmio {
    /// # Safety
    /// `base..base+len` must be a register window (or memory standing in for
    /// one) that stays mapped for the lifetime of the returned value, and
    /// `base` must be 4-byte aligned.
    pub unsafe fn new(base: NonNull<u8>, len: usize) -> Self {
        assert_eq!(base.as_ptr() as usize % 4, 0, "BAR must be 4-byte aligned");
        Mmio { base, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn reg(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "register offset {off:#x} outside BAR ({:#x})",
            self.len
        );
        // SAFETY: bounds and alignment checked above; the window is valid for
        // the lifetime of self (constructor contract).
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast()) }
    }

    #[inline]
    pub fn read32(&self, off: usize) -> u32 {
        self.reg(off).load(Ordering::Acquire)
    }

    #[inline]
    pub fn write32(&self, off: usize, v: u32) {
        self.reg(off).store(v, Ordering::Release)
    }

    /// 64-bit register read as two 32-bit reads, low half first.
    pub fn read64(&self, off: usize) -> u64 {
        let lo = self.read32(off) as u64;
        let hi = self.read32(off + 4) as u64;
        lo | hi << 32
    }

    /// 64-bit register write as two 32-bit writes, low half first.
    pub fn write64(&self, off: usize, v: u64) {
        self.write32(off, v as u32);
        self.write32(off + 4, (v >> 32) as u32);
    }

    /// A doorbell handle for the hot path (bounds checked once, here).
    pub fn doorbell(&self, off: usize) -> Doorbell {
        Doorbell(NonNull::from(self.reg(off)))
    }
}

/// One doorbell register. Valid while the `Mmio` it came from is; the queue
/// pair keeps the controller (and so the mapping) alive.
#[derive(Clone, Copy, Debug)]
pub struct Doorbell(NonNull<AtomicU32>);

// SAFETY: a doorbell is an atomic register; writing it from the owning thread is fine.
unsafe impl Send for Doorbell {}

impl Doorbell {
    #[inline(always)]
    pub fn write(&self, v: u32) {
        // SAFETY: points into a live register window (see type docs).
        unsafe { self.0.as_ref() }.store(v, Ordering::Release)
    }
}
