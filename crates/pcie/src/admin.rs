//! The admin queue: one command at a time, synchronously, under the
//! controller's admin lock. The control path, not the I/O path: clarity over
//! speed. Every wait is bounded and checks CSTS for a fatal or vanished
//! controller.
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use pollux_spec::{regs, Cqe, Sqe};

use crate::dma::DmaBuffer;
use crate::error::{Error, Result};
use crate::mmio::{Doorbell, Mmio};
use crate::platform::Platform;

pub(crate) struct AdminQueue {
    pub(crate) sq: DmaBuffer,
    pub(crate) cq: DmaBuffer,
    pub(crate) size: u16,
    sq_tail: u16,
    cq_head: u16,
    phase: u32,
    sq_db: Doorbell,
    cq_db: Doorbell,
    next_cid: u16,
}

impl AdminQueue {
    pub(crate) fn new(platform: &dyn Platform, size: u16, dstrd: u8) -> Result<Self> {
        let sq = platform.alloc_dma(size as usize * 64)?;
        let cq = platform.alloc_dma(size as usize * 16)?;
        if !sq.is_iova_contiguous() || !cq.is_iova_contiguous() {
            return Err(crate::error::Error::Dma(
                "admin queue memory is not contiguous in bus address space".into(),
            ));
        }
        let bar = platform.bar0();
        Ok(AdminQueue {
            sq,
            cq,
            size,
            sq_tail: 0,
            cq_head: 0,
            phase: 1,
            sq_db: bar.doorbell(regs::sq_tail_doorbell(0, dstrd)),
            cq_db: bar.doorbell(regs::cq_head_doorbell(0, dstrd)),
            next_cid: 0,
        })
    }

    /// Back to the state after CC.EN 0→1: empty queues, phase 1.
    pub(crate) fn reset(&mut self) {
        self.cq.as_mut_slice().fill(0);
        self.sq_tail = 0;
        self.cq_head = 0;
        self.phase = 1;
    }

    fn cqe_status_word(&self, idx: u16) -> u32 {
        // SAFETY: idx < size, the CQ buffer holds size 16-byte entries; dword
        // 3 is 4-byte aligned. The device writes it with a Release store.
        unsafe { AtomicU32::from_ptr(self.cq.as_ptr().add(idx as usize * 16 + 12).cast()) }
            .load(Ordering::Acquire)
    }

    fn read_cqe(&self, idx: u16) -> Cqe {
        // SAFETY: as above; read after the Acquire load of the phase.
        unsafe { ptr::read_volatile(self.cq.as_ptr().add(idx as usize * 16).cast::<Cqe>()) }
    }

    /// Executes one admin command and waits for its completion.
    pub(crate) fn exec(
        &mut self,
        platform: &dyn Platform,
        mut sqe: Sqe,
        timeout: Duration,
    ) -> Result<Cqe> {
        let bar = platform.bar0();
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        sqe.cid = cid;
        // SAFETY: sq_tail < size; the SQ buffer holds size 64-byte slots.
        unsafe {
            ptr::write_volatile(
                self.sq
                    .as_ptr()
                    .add(self.sq_tail as usize * 64)
                    .cast::<Sqe>(),
                sqe,
            )
        };
        self.sq_tail = if self.sq_tail + 1 == self.size {
            0
        } else {
            self.sq_tail + 1
        };
        self.sq_db.write(self.sq_tail as u32);

        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let w = self.cqe_status_word(self.cq_head);
            if (w >> 16) & 1 == self.phase {
                let cqe = self.read_cqe(self.cq_head);
                self.cq_head += 1;
                if self.cq_head == self.size {
                    self.cq_head = 0;
                    self.phase ^= 1;
                }
                self.cq_db.write(self.cq_head as u32);
                if cqe.cid == cid {
                    return Ok(cqe);
                }
                // A late completion of an earlier command that timed out, or
                // an asynchronous event: not ours.
                tracing::debug!(cid = cqe.cid, status = %cqe.status(), "admin completion for another command");
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                check_csts(bar)?;
                if start.elapsed() >= timeout {
                    return Err(Error::Timeout {
                        what: "admin command",
                        ms: timeout.as_millis() as u64,
                    });
                }
            }
            platform.relax();
        }
    }
}

/// Fails if the controller reports fatal status or has disappeared.
pub(crate) fn check_csts(bar: &Mmio) -> Result<()> {
    let csts = regs::Csts(bar.read32(regs::off::CSTS));
    if csts.is_dead() {
        return Err(Error::ControllerGone);
    }
    if csts.cfs() {
        return Err(Error::ControllerFatal);
    }
    Ok(())
}
