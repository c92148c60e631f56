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
//!
//! ```compile_fail
//! # fn f(ctrl: &pollux_pcie::Controller) {
//! let bell = pollux_pcie::mmio::Doorbell::new(ctrl.transport().platform(), 0x1008).unwrap(); // error[E0624]: private
//! bell.write(5);
//! # }
//! ```
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pollux_nvme::error::{Error, Result};
use pollux_nvme::Registers;

use crate::platform::Platform;

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
    fn reg(&self, off: usize) -> Result<&AtomicU32> {
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

/// One doorbell register, for the hot path. It holds the platform that
/// maps the BAR, so it can never outlive the mapping; bounds are checked
/// once, when it is made. Only this crate makes and rings them (each
/// queue its own).
pub struct Doorbell {
    reg: NonNull<AtomicU32>,
    _platform: Arc<dyn Platform>,
}

// SAFETY: a doorbell is an atomic register in a mapping kept alive by
// `_platform` (itself Send + Sync); writing it from any thread is fine.
unsafe impl Send for Doorbell {}

impl Doorbell {
    /// The register at `off` of `platform`'s BAR0.
    pub(crate) fn new(platform: &Arc<dyn Platform>, off: usize) -> Result<Doorbell> {
        let reg = NonNull::from(platform.bar0().reg(off)?);
        Ok(Doorbell {
            reg,
            _platform: platform.clone(),
        })
    }

    #[inline(always)]
    pub(crate) fn write(&self, v: u32) {
        // SAFETY: points into BAR0 of `_platform`, which this doorbell keeps
        // alive (and so mapped); bounds were checked in `new`.
        unsafe { self.reg.as_ref() }.store(v, Ordering::Release)
    }
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell").field("reg", &self.reg).finish()
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

    /// A doorbell keeps the platform that maps BAR0 alive: writing it after
    /// every other handle is gone still hits mapped memory. Before,
    /// `Doorbell` was `Copy` with no lifetime, so this was a use after
    /// unmap.
    #[test]
    fn doorbell_outlives_every_other_handle() {
        /// Stands in for a platform: its BAR0 is memory it owns, and it
        /// tells when it is dropped (so the BAR with it).
        struct Bar {
            bar: Mmio,
            regs: NonNull<u32>,
            _alive: Arc<()>,
        }
        // SAFETY: `regs` is owned by `Bar` (freed in its drop) and only
        // accessed atomically through `bar`.
        unsafe impl Send for Bar {}
        // SAFETY: as above.
        unsafe impl Sync for Bar {}
        impl Drop for Bar {
            fn drop(&mut self) {
                // SAFETY: made by `Box::into_raw` of a 2048-word slice below,
                // freed once, here.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.regs.as_ptr(), 2048))
                });
            }
        }
        impl Platform for Bar {
            fn describe(&self) -> String {
                "test BAR".into()
            }
            fn bar0(&self) -> &Mmio {
                &self.bar
            }
            fn alloc_dma(&self, _: usize) -> Result<pollux_nvme::DmaBuffer> {
                Err(Error::Unsupported("no DMA".into()))
            }
        }
        let regs = Box::into_raw(vec![0u32; 2048].into_boxed_slice()).cast::<u32>();
        let regs = NonNull::new(regs).unwrap();
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        // SAFETY: 8 KiB, 4-byte aligned, freed only when `Bar` drops (after
        // `bar`, which it owns, is gone).
        let bar = unsafe { Mmio::new(regs.cast(), 8192) };
        let p: Arc<dyn Platform> = Arc::new(Bar {
            bar,
            regs,
            _alive: alive,
        });
        let db = Doorbell::new(&p, pollux_spec::regs::off::DOORBELL_BASE).unwrap();
        drop(p);
        assert!(
            weak.upgrade().is_some(),
            "the doorbell keeps the platform (and its BAR) alive"
        );
        db.write(1);
        drop(db);
        assert!(weak.upgrade().is_none(), "and releases it when dropped");
    }
}
