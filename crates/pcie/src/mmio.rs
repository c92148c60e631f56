//! MMIO: BAR0 register access.
//!
//! Every access is a naturally aligned 32-bit atomic load (Acquire) or store
//! (Release). 64-bit registers (CAP, ASQ, ACQ) are accessed as two 32-bit
//! halves, low first: the NVMe spec allows it and QEMU's nvme device only
//! implements 4-byte accesses (quirk handled here, once). On x86-64 these
//! compile to plain `mov`s; the atomics make the ordering explicit and keep
//! the in-process emulated controller (which polls the same memory from
//! another thread) free of data races.
//!
//! An offset outside the window (a device-supplied CAP.DSTRD that puts a
//! doorbell past the BAR, say) is an error, never an out-of-bounds access.
//!
//! Reads are safe. Writes are this crate's (the transport's doorbells and
//! admin queue registers) or, through `Registers`, an `unsafe fn` of the
//! core's: a write can ring a doorbell, so that the controller runs
//! commands again into buffers handed back, or reprogram the controller.
//!
//! ```compile_fail
//! # fn f(ctrl: &pollux_pcie::Controller) {
//! // I/O queue 1's SQ tail doorbell.
//! ctrl.transport().platform().bar0().write32(0x1008, 5).unwrap(); // error: private (or unsafe)
//! # }
//! ```
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use pollux_nvme::error::{Error, Result};
use pollux_nvme::Registers;

/// A mapped register window, borrowed from the platform that maps it.
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

    /// The register at `off`, or an error naming the offset.
    pub(crate) fn reg(&self, off: usize) -> Result<&AtomicU32> {
        if !off.is_multiple_of(4) || off.checked_add(4).is_none_or(|end| end > self.len) {
            return Err(Error::Platform(format!(
                "register offset {off:#x} is outside BAR0 ({:#x} bytes) or unaligned",
                self.len
            )));
        }
        // SAFETY: bounds and alignment checked above; the window is valid for
        // the lifetime of self (constructor contract).
        Ok(unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast()) })
    }

    pub fn read32(&self, off: usize) -> Result<u32> {
        Ok(self.reg(off)?.load(Ordering::Acquire))
    }

    /// A register write: only this crate's (see the module docs).
    pub(crate) fn write32(&self, off: usize, v: u32) -> Result<()> {
        self.reg(off)?.store(v, Ordering::Release);
        Ok(())
    }

    /// 64-bit register read as two 32-bit reads, low half first.
    pub fn read64(&self, off: usize) -> Result<u64> {
        let lo = self.read32(off)? as u64;
        let hi = self.read32(off + 4)? as u64;
        Ok(lo | hi << 32)
    }

    /// 64-bit register write as two 32-bit writes, low half first.
    pub(crate) fn write64(&self, off: usize, v: u64) -> Result<()> {
        self.write32(off, v as u32)?;
        self.write32(off + 4, (v >> 32) as u32)
    }
}

impl Registers for Mmio {
    fn read32(&self, off: usize) -> Result<u32> {
        Mmio::read32(self, off)
    }
    unsafe fn write32(&self, off: usize, v: u32) -> Result<()> {
        Mmio::write32(self, off, v)
    }
    fn read64(&self, off: usize) -> Result<u64> {
        Mmio::read64(self, off)
    }
    unsafe fn write64(&self, off: usize, v: u64) -> Result<()> {
        Mmio::write64(self, off, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register offset past BAR0 (as a device-supplied CAP.DSTRD can
    /// make a doorbell's) is an error naming it, not a panic or an
    /// out-of-bounds access. Before, `Mmio::reg` asserted.
    #[test]
    fn out_of_range_offset_is_an_error() {
        let mut regs = vec![0u32; 1024]; // 4 KiB standing in for BAR0
        let base = NonNull::new(regs.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `regs` outlives `bar` and is 4-byte aligned.
        let bar = unsafe { Mmio::new(base, 4096) };
        bar.write32(0x1000 - 4, 7).unwrap();
        assert_eq!(bar.read32(0x1000 - 4).unwrap(), 7);
        // Queue 1's SQ doorbell with CAP.DSTRD = 15: 0x1000 + 2 * (4 << 15).
        let off = pollux_spec::regs::sq_tail_doorbell(1, 15);
        let e = bar.read32(off).unwrap_err().to_string();
        assert!(e.contains(&format!("{off:#x}")), "{e}");
        assert!(bar.write32(4095, 1).is_err(), "unaligned");
        assert!(bar.read64(usize::MAX - 3).is_err(), "overflowing offset");
    }
}
