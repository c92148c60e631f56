//! BAR0: the register page and the doorbells, as shared memory.
//!
//! The host accesses BAR0 only with 32-bit aligned atomic loads and stores
//! (Acquire/Release), exactly like MMIO; so does the device. Because there is
//! no bus to intercept writes, "read-only" registers are re-published by the
//! device (a host store to CAP, VS or CSTS is undone at the next `step()`),
//! and write-only doorbells are detected by *polling* their values.
//!
//! Layout: registers at 0x000..0x1000 (see `pollux_spec::regs::off`),
//! doorbells from 0x1000 at stride `4 << DSTRD`, SQ tail then CQ head per
//! queue, for `max_io_queues + 1` queues; rounded up to whole pages.
//!
//! Caveats: INTMS/INTMC are plain memory: the emulated interrupts are
//! MSI-X style (per-vector eventfds, see `irq`), and with MSI-X the spec
//! leaves these pin/MSI mask registers undefined;
//! NSSR is not supported (CAP.NSSRS = 0) and reads back 0.
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use pollux_spec::regs::{self, off};

/// Owner of the BAR0 mapping; unmapped on drop.
pub(crate) struct BarMem {
    view: BarView,
}

impl BarMem {
    /// Maps zeroed memory for `queues` queue pairs at stride `4 << dstrd`.
    pub fn new(queues: usize, dstrd: u8) -> io::Result<BarMem> {
        let bytes = off::DOORBELL_BASE + queues * 2 * (4usize << dstrd);
        let len = bytes.div_ceil(4096) * 4096;
        // SAFETY: anonymous private mapping with no address hint; the result
        // is checked for MAP_FAILED before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(BarMem {
            view: BarView {
                ptr,
                len,
                dstrd,
                queues,
            },
        })
    }

    pub fn view(&self) -> BarView {
        self.view
    }
}

impl Drop for BarMem {
    fn drop(&mut self) {
        // SAFETY: exactly the region mmap returned in `new`; the device (and
        // its controller, which holds `BarView` copies) is being dropped.
        unsafe {
            libc::munmap(self.view.ptr.as_ptr().cast(), self.view.len);
        }
    }
}

/// A copyable handle on the BAR memory, valid while the owning `BarMem`
/// lives (the `SoftDevice` owns both and drops the controller first).
#[derive(Clone, Copy, Debug)]
pub(crate) struct BarView {
    ptr: NonNull<u8>,
    len: usize,
    dstrd: u8,
    queues: usize,
}

impl BarView {
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.len
    }
    /// Number of queue pairs with a doorbell slot (admin included).
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// The 32-bit register at byte offset `off`.
    #[inline(always)]
    pub fn reg(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "BAR offset {off:#x} out of range"
        );
        // SAFETY: in bounds and 4-byte aligned (checked above; the mapping is
        // page aligned); the memory lives as long as `BarMem`, and both the
        // host and the device access it only atomically.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }

    /// The `n` 32-bit registers from byte offset `off` (one bounds check
    /// for all of them).
    #[inline]
    pub fn regs(&self, off: usize, n: usize) -> &[AtomicU32] {
        assert!(
            off.is_multiple_of(4) && n <= (self.len.saturating_sub(off)) / 4,
            "BAR range {off:#x} + {n} registers out of range"
        );
        // SAFETY: `n` registers from `off` are in bounds and 4-byte aligned
        // (checked above; the mapping is page aligned); the memory lives as
        // long as `BarMem`, and both the host and the device access it only
        // atomically.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off).cast::<AtomicU32>(), n) }
    }

    /// The doorbell registers: SQ `q` tail at index `2 * q << dstrd`, CQ
    /// `q` head at `(2 * q + 1) << dstrd`.
    #[inline]
    pub fn doorbells(&self) -> &[AtomicU32] {
        self.regs(off::DOORBELL_BASE, (self.queues * 2) << self.dstrd)
    }

    /// Doorbell stride in registers (`1 << CAP.DSTRD`).
    #[inline]
    pub fn stride(&self) -> usize {
        1 << self.dstrd
    }

    #[inline(always)]
    pub fn load(&self, off: usize) -> u32 {
        self.reg(off).load(Ordering::Acquire)
    }

    #[inline(always)]
    pub fn store(&self, off: usize, v: u32) {
        self.reg(off).store(v, Ordering::Release)
    }

    /// Stores `v` unless the register already holds it (avoids dirtying the
    /// cache line the host polls).
    #[inline(always)]
    pub fn publish(&self, off: usize, v: u32) {
        let r = self.reg(off);
        if r.load(Ordering::Relaxed) != v {
            r.store(v, Ordering::Release);
        }
    }

    /// SQ `qid` tail doorbell.
    #[inline(always)]
    pub fn sq_tail(&self, qid: u16) -> &AtomicU32 {
        self.reg(regs::sq_tail_doorbell(qid, self.dstrd))
    }

    /// CQ `qid` head doorbell.
    #[inline(always)]
    pub fn cq_head(&self, qid: u16) -> &AtomicU32 {
        self.reg(regs::cq_head_doorbell(qid, self.dstrd))
    }

    /// Zeroes every doorbell (controller reset).
    pub fn clear_doorbells(&self) {
        for q in 0..self.queues as u16 {
            self.sq_tail(q).store(0, Ordering::Release);
            self.cq_head(q).store(0, Ordering::Release);
        }
    }
}
