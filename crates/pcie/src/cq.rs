//! The PCIe completion queue: the CQ ring with its phase tag, and the head
//! doorbell, rung lazily (only when the controller could otherwise run out
//! of CQ slots) or behind a shadow doorbell.
//!
//! Each entry's status dword is loaded with Acquire (the phase check is
//! Linux's `dma_rmb`); the controller stores it last, with Release.
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};

use std::os::fd::{AsFd, BorrowedFd};

use pollux_nvme::dma::DmaBuffer;
use pollux_nvme::error::Result;
use pollux_nvme::{CompletionQueue, CqeSink, WireCounters};

use crate::doorbell::{Doorbell, Shadow};
use crate::platform::irq::IrqFd;

/// The completion half of a PCIe queue pair.
pub struct PcieCq {
    ring: NonNull<u8>,
    head: u16,
    entries: u16,
    phase: u32,
    /// Entries consumed since the last CQ doorbell.
    unacked: u32,
    /// Ring the CQ doorbell when `unacked` exceeds this (0: every poll).
    unacked_limit: u32,
    prefetch: bool,
    line_batch: bool,
    bell: Doorbell,
    shadow: Option<Shadow>,
    /// CQ head the controller was last told about (for the shadow rule).
    rung_head: u16,
    counters: WireCounters,
    /// The interrupt vector and its descriptor, when created with
    /// interrupts.
    irq: Option<(u16, IrqFd)>,
    ring_mem: DmaBuffer,
}

// SAFETY: the ring pointer points into `ring_mem` (owned); all access goes
// through `&mut self`.
unsafe impl Send for PcieCq {}

/// Settings of one completion queue.
pub(crate) struct CqConfig {
    pub(crate) entries: u16,
    /// Ring the head doorbell only past this many unacknowledged entries.
    pub(crate) unacked_limit: u32,
    pub(crate) prefetch: bool,
    pub(crate) line_batch: bool,
}

impl PcieCq {
    /// `ring_mem` holds `cfg.entries` zeroed CQEs, contiguous in bus
    /// address space (checked by the caller).
    pub(crate) fn new(
        cfg: CqConfig,
        ring_mem: DmaBuffer,
        bell: Doorbell,
        shadow: Option<Shadow>,
    ) -> PcieCq {
        assert!(ring_mem.len() >= cfg.entries as usize * 16);
        let ring = NonNull::new(ring_mem.as_ptr()).expect("DmaBuffer is non-null");
        PcieCq {
            ring,
            head: 0,
            entries: cfg.entries,
            phase: 1,
            unacked: 0,
            unacked_limit: cfg.unacked_limit,
            prefetch: cfg.prefetch,
            line_batch: cfg.line_batch,
            bell,
            shadow,
            rung_head: 0,
            counters: WireCounters::default(),
            irq: None,
            ring_mem,
        }
    }

    /// Completions raise interrupt `vector`, signalled through `fd`.
    pub(crate) fn set_irq(&mut self, vector: u16, fd: IrqFd) {
        self.irq = Some((vector, fd));
    }

    /// The interrupt vector, if the queue uses interrupts.
    pub(crate) fn irq_vector(&self) -> Option<u16> {
        self.irq.as_ref().map(|(v, _)| *v)
    }

    /// Bus address of the ring (for Create I/O CQ / ACQ).
    pub(crate) fn ring_iova(&self) -> u64 {
        self.ring_mem.iova_at(0)
    }

    pub(crate) fn shadow(&self) -> Option<&Shadow> {
        self.shadow.as_ref()
    }

    /// The status dword (dword 3) of entry `idx`.
    #[inline(always)]
    fn status_word(&self, idx: u16) -> u32 {
        // SAFETY: idx < entries; the ring holds `entries` 16-byte CQEs and
        // dword 3 is 4-byte aligned. The controller stores it last, with
        // Release.
        unsafe { AtomicU32::from_ptr(self.ring.as_ptr().add(idx as usize * 16 + 12).cast()) }
            .load(Ordering::Acquire)
    }

    /// Entry `idx`, if the controller has posted it (its phase tag is the
    /// current phase): its status dword (dword 3) and dword 0. The entry's
    /// address is computed once, before the Acquire load: computed after
    /// it (as dword 0's was), the ring pointer and the head were loaded
    /// from `self` again, since the compiler keeps no field in a register
    /// across an Acquire load (3 instructions per I/O).
    #[inline(always)]
    fn posted(&self, idx: u16) -> Option<(u32, u32)> {
        let phase = self.phase;
        // SAFETY: idx < entries and the ring holds `entries` 16-byte CQEs.
        let e = unsafe { self.ring.as_ptr().add(idx as usize * 16) };
        // SAFETY: dword 3 of the entry, 4-byte aligned. The controller
        // stores it last, with Release.
        let w3 = unsafe { AtomicU32::from_ptr(e.add(12).cast()) }.load(Ordering::Acquire);
        if (w3 >> 16) & 1 != phase {
            return None;
        }
        // SAFETY: dword 0 of the same entry; it was written before dword 3
        // was published, and the entry is ours until the head doorbell
        // releases it.
        let dw0 = unsafe { ptr::read_volatile(e.cast::<u32>()) };
        Some((w3, dw0))
    }

    #[inline(always)]
    fn advance(&mut self) {
        self.head += 1;
        if self.head == self.entries {
            self.head = 0;
            self.phase ^= 1;
        }
    }

    /// The loop over one entry at a time; `PREFETCH` is `self.prefetch`,
    /// a constant of the loop so it is not tested per entry.
    #[inline(always)]
    fn reap_each<S: CqeSink, const PREFETCH: bool>(&mut self, max: u32, sink: &mut S) -> u32 {
        // Counted down: the count lives in memory across the handler
        // (the loop is at the register limit), and a decrement with its
        // zero test is one instruction fewer than load, increment and
        // compare.
        let mut left = max;
        while left > 0 {
            let Some((w3, dw0)) = self.posted(self.head) else {
                break;
            };
            self.advance();
            if PREFETCH {
                // A relaxed peek only chooses what to prefetch; a stale CID
                // is harmless.
                // SAFETY: as in `status_word`.
                let nw = unsafe {
                    AtomicU32::from_ptr(self.ring.as_ptr().add(self.head as usize * 16 + 12).cast())
                }
                .load(Ordering::Relaxed);
                sink.peek((nw & 0xFFFF) as u16);
            }
            left -= 1;
            sink.cqe_dw3(w3, dw0);
        }
        max - left
    }

    /// The loop over a cache line (four entries) at a time: the posted
    /// entries of the line are copied onto the stack, then handled, so the
    /// line the controller is writing is touched once per batch.
    #[inline(always)]
    fn reap_lines<S: CqeSink>(&mut self, max: u32, sink: &mut S) -> u32 {
        let mut n = 0;
        let mut batch = [(0u32, 0u32); 4];
        while n < max {
            // Entries from head to the end of its 64-byte line (or ring).
            let line_end = ((self.head as u32 | 3) + 1).min(self.entries as u32) as u16;
            let mut k = 0;
            while self.head + (k as u16) < line_end && n + (k as u32) < max {
                let idx = self.head + k as u16;
                let Some(entry) = self.posted(idx) else {
                    break;
                };
                batch[k] = entry;
                k += 1;
            }
            if k == 0 {
                break;
            }
            for &(w3, dw0) in &batch[..k] {
                self.advance();
                sink.cqe((w3 & 0xFFFF) as u16, (w3 >> 17) as u16, dw0);
            }
            n += k as u32;
            if self.head != line_end % self.entries {
                break; // the line is not complete yet
            }
        }
        n
    }
}

impl CompletionQueue for PcieCq {
    #[inline(always)]
    fn reap<S: CqeSink>(&mut self, max: u32, sink: &mut S) -> u32 {
        if self.line_batch {
            self.reap_lines(max, sink)
        } else if self.prefetch {
            self.reap_each::<S, true>(max, sink)
        } else {
            self.reap_each::<S, false>(max, sink)
        }
    }

    #[inline(always)]
    fn release(&mut self, n: u32) {
        self.unacked += n;
        if self.unacked > self.unacked_limit {
            let head = self.head as u32;
            let mmio = match &self.shadow {
                None => true,
                Some(s) => {
                    self.counters.shadow_updates += 1;
                    s.publish(head, self.rung_head as u32)
                }
            };
            if mmio {
                self.bell.write(head);
                self.counters.doorbells += 1;
            }
            self.rung_head = self.head;
            self.unacked = 0;
        }
    }

    unsafe fn restart(&mut self) {
        // The controller is disabled or the queue deleted: nothing writes
        // the ring while it is cleared.
        let words = self.entries as usize * 4;
        for i in 0..words {
            // SAFETY: the ring holds entries * 16 bytes = `words` aligned
            // dwords; atomic stores keep this sound even against a device
            // that (wrongly) still writes.
            unsafe { AtomicU32::from_ptr(self.ring.as_ptr().cast::<u32>().add(i)) }
                .store(0, Ordering::Relaxed);
        }
        self.head = 0;
        self.phase = 1;
        self.unacked = 0;
        self.rung_head = 0;
        if let Some(s) = &self.shadow {
            s.clear();
        }
    }

    fn entries(&self) -> u16 {
        self.entries
    }

    fn counters(&self) -> WireCounters {
        self.counters
    }

    fn reset_counters(&mut self) {
        self.counters = WireCounters::default();
    }

    fn ready(&self) -> bool {
        (self.status_word(self.head) >> 16) & 1 == self.phase
    }

    fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        self.irq.as_ref().map(|(_, fd)| fd.as_fd())
    }

    fn ack_interrupt(&mut self) -> Result<()> {
        if self.irq.is_none() {
            return Ok(());
        }
        // Before sleeping: tell the controller about every consumed entry
        // (the lazy doorbell may be behind), through the shadow and the
        // register both. A level-triggered INTx stays asserted while the
        // controller sees entries it thinks are unconsumed.
        if self.head != self.rung_head {
            let head = self.head as u32;
            if let Some(s) = &self.shadow {
                s.publish(head, self.rung_head as u32);
            }
            self.bell.write(head);
            self.counters.doorbells += 1;
            self.rung_head = self.head;
            self.unacked = 0;
        }
        if let Some((_, fd)) = &self.irq {
            fd.ack()?;
        }
        Ok(())
    }
}
