//! The PCIe shell around the controller model (`pollux_controller`):
//! register publication and reactions (enable sets up the admin queue,
//! reset drops the queues, shutdown flushes), the `step()` loop,
//! completion posting and fault dispositions. The command set itself —
//! admin commands, the register state machine, I/O on the namespaces —
//! is `pollux_controller`'s; this file moves commands, data and
//! completions.
//!
//! Everything here runs under the device's single Mutex. One `step()`:
//! 1. every [`REPUBLISH_PERIOD`] steps re-publishes the read-only registers;
//!    reacts to a changed CC;
//! 2. if the controller is running (RDY, no CFS, not frozen or shut down):
//!    posts due delayed completions (a clock read, only while some are
//!    pending), polls every CQ head and drains backlogs, advances SQ
//!    deletions waiting for CQ room, runs the admin SQ, delivers
//!    asynchronous events, then runs every I/O SQ with a bounded budget;
//! 3. if some CQ has interrupts enabled or a coalesced interrupt waits for
//!    its aggregation time, hands the entries posted to their vectors and
//!    signals the interrupts raised (`irq`; a clock read only while a
//!    coalesced interrupt waits or starts waiting);
//! 4. every [`HOUSEKEEPING_PERIOD`] steps, checks reserved registers and the
//!    doorbells of queues that do not exist.
//!
//! The I/O fast path (no fault rules installed) borrows the controller's
//! fields disjointly and does, per command: one 64-byte SQE copy, the
//! command's checks (`IoQueue::check`), its PRPs (one IOMMU range check
//! for a 4 KiB transfer), its execution (`IoQueue::exec`), one CQE write.
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use std::sync::Arc;

use pollux_controller::{IoQueue, IoQueueOptions, Subsystem};
use pollux_spec::regs::{self, off, Csts};

use crate::bar::BarView;
use crate::config::{SoftConfig, CNTLID};
use crate::dma::Seg;
use crate::fault::{DeferredSet, Faults};
use crate::iommu::{Iommu, Mapping};
use crate::irq::Irqs;
use crate::queue::{Cq, Doorbell, Sq};
use crate::stats::Counters;
use crate::SoftError;

mod queues;

pub(crate) use queues::{note_error, post_to};

/// Most commands fetched from one SQ per `step()`.
pub const BUDGET: usize = 256;
/// Steps between housekeeping passes.
pub const HOUSEKEEPING_PERIOD: u64 = 256;
/// Steps between re-publications of the read-only registers.
pub const REPUBLISH_PERIOD: u64 = 16;

/// The shadow doorbell and event index buffers (Doorbell Buffer Config).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ShadowBuf {
    pub db_iova: u64,
    pub ei_iova: u64,
    pub db: NonNull<u8>,
    pub ei: NonNull<u8>,
    /// Bytes usable in both buffers (at least one page).
    pub len: usize,
}

impl ShadowBuf {
    /// Shadow doorbell and event index slots at byte offset `off`, if
    /// they fit in the buffers.
    pub fn slot(&self, off: usize) -> Option<(NonNull<u32>, NonNull<u32>)> {
        if off + 4 > self.len {
            return None;
        }
        // SAFETY: `off + 4 <= len`, and `len` bytes of both buffers were
        // translated (mapped) when the buffers were configured; offsets of
        // 4-byte aligned slots in page-aligned buffers stay aligned.
        unsafe {
            Some((
                NonNull::new_unchecked(self.db.as_ptr().add(off).cast()),
                NonNull::new_unchecked(self.ei.as_ptr().add(off).cast()),
            ))
        }
    }
}

/// A Delete I/O SQ command waiting for room in the SQ's CQ to post the
/// aborted completions of the commands the SQ still holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SqDeletion {
    pub sqid: u16,
    /// CID of the Delete command (admin SQ).
    pub cid: u16,
}

/// What happens to a completion once the command has been executed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Disposition {
    Post,
    Delay(Duration),
    Reorder,
}

pub(crate) struct Controller {
    pub cfg: SoftConfig,
    pub bar: BarView,
    /// The controller model: registers, admin command set, features,
    /// logs, events.
    pub core: pollux_controller::Controller,
    /// The NVM command set on the namespaces, for every I/O SQ (one
    /// thread steps them all, synchronously).
    pub io: IoQueue,
    pub iommu: Iommu,
    /// RDY and not fatal, frozen or shut down: queues are processed.
    pub running: bool,
    pub frozen: bool,
    /// Hung (`SoftDevice::hang`): frozen, and CC writes are not even
    /// looked at (CC.EN=0 is not honoured) until `resume`.
    pub hung: bool,
    /// Queue or shadow doorbell memory was unmapped while the controller
    /// was stopped with its queues: it must not run them again (`resume`
    /// makes it fatal instead). Cleared by a reset, which drops them.
    pub queue_mem_lost: bool,
    /// Memory page size from CC.MPS at enable.
    pub page_size: usize,
    pub sqs: Vec<Option<Sq>>,
    pub cqs: Vec<Option<Cq>>,
    /// Existing I/O SQ identifiers, in creation order.
    pub io_sqs: Vec<u16>,
    /// Existing CQ identifiers (admin included).
    pub cq_ids: Vec<u16>,
    /// SQ deletions in progress, oldest first (at most one per I/O SQ).
    pub deleting: Vec<SqDeletion>,
    /// CQs whose interrupts are enabled (collected at the end of a step).
    pub irq_cqs: Vec<u16>,
    pub irqs: Irqs,
    pub deferred: DeferredSet,
    pub faults: Faults,
    pub counters: Counters,
    pub shadow: Option<ShadowBuf>,
    pub segs: Vec<Seg>,
    pub ticks: u64,
}

// SAFETY: the raw pointers inside (BAR view, queue bases, shadow buffers,
// IOMMU host addresses) refer to memory owned by the `SoftDevice` (BAR) or
// vouched for by the `dma_map` caller until `dma_unmap`; they are only
// dereferenced under the device Mutex, from whichever thread holds it.
unsafe impl Send for Controller {}

impl Controller {
    pub fn new(
        cfg: SoftConfig,
        bar: BarView,
        subsys: Arc<Subsystem>,
    ) -> Result<Controller, SoftError> {
        let queues = cfg.max_io_queues as usize + 1;
        let seg_cap = cfg.max_transfer().map_or(1024, |b| b / 4096 + 2).min(4096);
        let core = pollux_controller::Controller::new(subsys, CNTLID);
        let io =
            IoQueue::for_controller(&core, IoQueueOptions { depth: 0 }).map_err(|e| match e {
                pollux_controller::ControllerError::Bdev { nsid, source } => {
                    SoftError::Bdev { nsid, source }
                }
                e => SoftError::InvalidConfig(e.to_string()),
            })?;
        let c = Controller {
            bar,
            core,
            io,
            iommu: Iommu::default(),
            running: false,
            frozen: false,
            hung: false,
            queue_mem_lost: false,
            page_size: 4096,
            sqs: (0..queues).map(|_| None).collect(),
            cqs: (0..queues).map(|_| None).collect(),
            io_sqs: Vec::with_capacity(queues),
            cq_ids: Vec::with_capacity(queues),
            deleting: Vec::new(),
            irq_cqs: Vec::new(),
            irqs: Irqs::new(cfg.irq_vectors),
            deferred: DeferredSet::default(),
            faults: Faults::default(),
            counters: Counters::default(),
            shadow: None,
            segs: Vec::with_capacity(seg_cap),
            ticks: 0,
            cfg,
        };
        c.publish_registers();
        Ok(c)
    }

    // ------------------------------------------------------------------
    // Registers
    // ------------------------------------------------------------------

    /// Re-publishes the device-owned registers (undoing host writes).
    #[inline]
    fn publish_registers(&self) {
        let r = self.core.registers();
        let cap = r.cap().0;
        self.bar.publish(off::CAP, cap as u32);
        self.bar.publish(off::CAP + 4, (cap >> 32) as u32);
        self.bar.publish(off::VS, r.vs().0);
        self.bar.publish(off::CSTS, r.csts());
    }

    /// Publishes the controller model's CSTS after a change.
    fn sync_csts(&mut self) {
        self.bar.store(off::CSTS, self.core.registers().csts());
        self.update_running();
    }

    fn update_running(&mut self) {
        self.running = self.core.is_running() && !self.frozen;
    }

    /// Sets CSTS.CFS and stops all processing until reset.
    pub fn fatal(&mut self, why: &str) {
        self.core.fatal(why);
        self.sync_csts();
    }

    /// Stops all processing, CSTS unchanged, until reset.
    pub fn freeze(&mut self) {
        tracing::warn!("controller frozen by fault injection");
        self.frozen = true;
        self.update_running();
    }

    /// Stops all processing and stops reacting to CC (a CC.EN=0 is not
    /// honoured, CSTS stays as it is) until `resume`: a controller that
    /// hung and ignores the host's disable.
    pub fn hang(&mut self) {
        tracing::warn!("controller hung by fault injection (CC.EN=0 is not honoured)");
        self.hung = true;
        self.frozen = true;
        self.update_running();
    }

    /// Ends a hang or a freeze: the controller runs the queues it had
    /// again, from where it stopped. A CC value written meanwhile is
    /// forgotten (it hung through it). If memory of those queues was
    /// unmapped meanwhile, it goes fatal instead (an IOMMU fault).
    pub fn resume(&mut self) {
        if !self.hung && !self.frozen {
            return;
        }
        tracing::warn!("controller resumed after a hang or freeze");
        self.hung = false;
        self.frozen = false;
        self.bar.store(off::CC, self.core.registers().cc());
        if self.queue_mem_lost {
            self.queue_mem_lost = false;
            if !Csts(self.core.registers().csts()).cfs() {
                self.fatal("IOMMU fault: queue memory unmapped while the controller was stopped");
            }
            return;
        }
        self.update_running();
    }

    fn poll_cc(&mut self) {
        let cc = self.bar.load(off::CC);
        if cc == self.core.registers().cc() || self.hung {
            return;
        }
        let ch = self.core.write_cc(cc);
        if ch.reset {
            self.reset();
        } else if ch.enable {
            self.enable();
        }
        if let Some(shn) = ch.shutdown {
            self.shutdown(shn);
        }
    }

    /// CC.EN 0 -> 1: the controller model's checks of CC, then the admin
    /// queue.
    fn enable(&mut self) {
        let r = self
            .core
            .registers()
            .check_enable()
            .and_then(|page_size| self.setup_admin_queue(page_size));
        self.core.enable_done(r);
        self.sync_csts();
    }

    fn setup_admin_queue(&mut self, page_size: usize) -> Result<(), String> {
        debug_assert!(self.sqs.iter().all(Option::is_none));
        self.page_size = page_size;
        let aqa = regs::Aqa(self.bar.load(off::AQA));
        let asq = self.bar.load(off::ASQ) as u64 | (self.bar.load(off::ASQ + 4) as u64) << 32;
        let acq = self.bar.load(off::ACQ) as u64 | (self.bar.load(off::ACQ + 4) as u64) << 32;
        let (sqs, cqs) = (aqa.asqs() as u32 + 1, aqa.acqs() as u32 + 1);
        if sqs < 2 || cqs < 2 {
            return Err(format!(
                "AQA {:#x}: admin queues need at least 2 entries",
                aqa.0
            ));
        }
        let mask = self.page_size as u64 - 1;
        if asq & mask != 0 || acq & mask != 0 {
            return Err(format!("ASQ {asq:#x} / ACQ {acq:#x} not page aligned"));
        }
        let sq_base = self
            .iommu
            .translate(asq, sqs as usize * 64)
            .ok_or_else(|| format!("ASQ {asq:#x} ({sqs} entries) not inside an IOMMU mapping"))?;
        let cq_base = self
            .iommu
            .translate(acq, cqs as usize * 16)
            .ok_or_else(|| format!("ACQ {acq:#x} ({cqs} entries) not inside an IOMMU mapping"))?;
        self.bar.clear_doorbells();
        let sq_db = Doorbell {
            value: NonNull::from(self.bar.sq_tail(0)),
            event_idx: None,
        };
        let cq_db = Doorbell {
            value: NonNull::from(self.bar.cq_head(0)),
            event_idx: None,
        };
        // SAFETY: bases translated above for the full queue sizes; the
        // doorbells are BAR registers.
        unsafe {
            let mut cq = Cq::new(0, acq, cq_base, cqs, cq_db);
            cq.sq_count = 1;
            self.cqs[0] = Some(cq);
            self.sqs[0] = Some(Sq::new(0, asq, sq_base.cast(), sqs, sq_db));
        }
        self.cq_ids.push(0);
        if self.irqs.has_fd(0) {
            self.enable_admin_irq();
        }
        tracing::debug!(page_size = self.page_size, sqs, cqs, "controller enabled");
        Ok(())
    }

    /// CC.EN 1 -> 0: controller reset.
    fn reset(&mut self) {
        tracing::debug!("controller reset");
        for s in &mut self.sqs {
            *s = None;
        }
        for c in &mut self.cqs {
            *c = None;
        }
        self.io_sqs.clear();
        self.cq_ids.clear();
        self.deleting.clear();
        self.irq_cqs.clear();
        self.irqs.reset();
        self.deferred.clear();
        self.shadow = None;
        self.counters.s.shadow_doorbell_enabled = false;
        self.frozen = false;
        self.queue_mem_lost = false;
        self.bar.clear_doorbells();
        self.counters.s.resets += 1;
        self.core.reset();
        self.sync_csts();
    }

    fn shutdown(&mut self, shn: u8) {
        tracing::debug!(shn, "shutdown notification");
        self.io.flush_all();
        self.core.shutdown_complete();
        self.sync_csts();
    }

    // ------------------------------------------------------------------
    // IOMMU
    // ------------------------------------------------------------------

    /// Called after `m` left the IOMMU: anything live inside it is an
    /// IOMMU fault for a running controller (it goes fatal). A controller
    /// that is shut down, frozen or already fatal touches no queue memory
    /// until a reset drops its queues, so unmapping is then harmless (the
    /// usual teardown order: shutdown, then free the queues); one resumed
    /// after a hang or freeze goes fatal instead of running them
    /// (`queue_mem_lost`).
    pub fn on_unmap(&mut self, m: &Mapping) {
        let live_q = self
            .sqs
            .iter()
            .flatten()
            .map(Sq::range)
            .chain(self.cqs.iter().flatten().map(Cq::range))
            .any(|(a, l)| m.intersects(a, l));
        let live_shadow = self.shadow.is_some_and(|s| {
            m.intersects(s.db_iova, s.len as u64) || m.intersects(s.ei_iova, s.len as u64)
        });
        if (live_q || live_shadow) && !self.running {
            self.queue_mem_lost = true;
            tracing::debug!(
                iova = m.iova,
                "queue memory unmapped while the controller is stopped"
            );
        } else if live_q || live_shadow {
            tracing::error!(
                iova = m.iova,
                len = m.len,
                "memory unmapped while the device uses it"
            );
            if !Csts(self.core.registers().csts()).cfs() {
                self.fatal("IOMMU fault: queue or shadow doorbell memory unmapped");
            }
        }
    }

    // ------------------------------------------------------------------
    // step
    // ------------------------------------------------------------------

    pub fn step(&mut self) -> usize {
        self.ticks = self.ticks.wrapping_add(1);
        // Read-only registers a host may have scribbled on are restored every
        // REPUBLISH_PERIOD steps, not every step: a host that writes them
        // misbehaves anyway, and the check costs ~35 instructions. State
        // changes (CSTS) are published when they happen.
        if self.ticks.is_multiple_of(REPUBLISH_PERIOD) {
            self.publish_registers();
        }
        self.poll_cc();
        let mut n = 0;
        if self.running {
            if self.deferred.has_delayed() {
                n += self.run_due();
            }
            n += self.poll_cqs();
            if !self.deleting.is_empty() {
                n += self.run_deletions();
            }
            n += self.run_admin();
            n += self.deliver_events();
            if self.running {
                n += self.run_io();
            }
        }
        // Interrupts: one branch per step unless some CQ has IEN set or a
        // coalesced interrupt is waiting for its aggregation time.
        if !self.irq_cqs.is_empty() || self.irqs.active() {
            self.deliver_irqs();
        }
        if self.ticks.is_multiple_of(HOUSEKEEPING_PERIOD) {
            self.housekeeping();
        }
        n
    }

    /// The earliest moment a step has something to do even if the host
    /// does nothing (a coalesced interrupt's aggregation time, a delayed
    /// completion): a device thread must not sleep past it.
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.irqs.next_deadline(), self.deferred.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Hands the entries written to IEN CQs to their vectors and signals
    /// the interrupts raised.
    fn deliver_irqs(&mut self) {
        let Controller {
            cqs,
            irq_cqs,
            irqs,
            core,
            counters,
            ..
        } = self;
        let (coalescing, no_coalesce) = core.coalescing();
        let mut now = None;
        for &qid in irq_cqs.iter() {
            let Some(cq) = cqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "irq_cqs out of sync");
                continue;
            };
            if cq.irq_new != 0 {
                let n = std::mem::take(&mut cq.irq_new);
                irqs.add(cq.iv, n, coalescing, no_coalesce, &mut now);
            }
        }
        irqs.expire(&mut now);
        counters.s.interrupts += irqs.signal();
    }

    /// Creates vector `v`'s eventfd if needed. The admin CQ signals
    /// vector 0 from the moment its eventfd exists.
    pub(crate) fn ensure_vector(&mut self, v: u16) -> std::io::Result<()> {
        self.irqs.fd(v)?;
        if v == 0 {
            self.enable_admin_irq();
        }
        Ok(())
    }

    fn enable_admin_irq(&mut self) {
        if let Some(cq) = self.cqs[0].as_mut() {
            if !cq.ien {
                cq.ien = true;
                cq.iv = 0;
                self.irq_cqs.push(0);
            }
        }
    }

    /// Periodic checks that are too costly for every step.
    fn housekeeping(&mut self) {
        // Reserved / unsupported registers read 0 (NSSR, CMB*, BP*, PMR*...):
        // one pass of loads over the ~1,000 registers, stores only if the
        // host wrote one.
        self.bar.publish(off::NSSR, 0);
        let reserved = self
            .bar
            .regs(off::CMBLOC, (off::DOORBELL_BASE - off::CMBLOC) / 4);
        if reserved.iter().fold(0, |acc, r| {
            acc | r.load(std::sync::atomic::Ordering::Relaxed)
        }) != 0
        {
            for r in reserved {
                if r.load(std::sync::atomic::Ordering::Relaxed) != 0 {
                    r.store(0, std::sync::atomic::Ordering::Release);
                }
            }
        }
        if !self.running {
            return;
        }
        // Doorbells of queues that do not exist.
        let bar = self.bar;
        let stride = bar.stride();
        let mut bad = 0;
        for (qid, ((db, sq), cq)) in bar
            .doorbells()
            .chunks_exact(2 * stride)
            .zip(&self.sqs)
            .zip(&self.cqs)
            .enumerate()
        {
            for (missing, reg) in [(sq.is_none(), &db[0]), (cq.is_none(), &db[stride])] {
                if missing && reg.load(std::sync::atomic::Ordering::Acquire) != 0 {
                    reg.store(0, std::sync::atomic::Ordering::Release);
                    tracing::warn!(qid, "doorbell write for a queue that does not exist");
                    bad += 1;
                }
            }
        }
        for _ in 0..bad {
            self.invalid_doorbell(pollux_spec::features::aer::ERROR_INVALID_DOORBELL_REGISTER);
        }
    }
}
