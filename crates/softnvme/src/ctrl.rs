//! The controller state machine: register reactions (enable, reset,
//! shutdown), the `step()` loop, completion posting and fault dispositions.
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
//! command (one IOMMU range check for a 4 KiB transfer), one CQE write.
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use pollux_spec::regs::{self, off, shst, Cap, Cc, Csts, Vs, CAP_CSS_NVM};
use pollux_spec::status::{generic, sct};
use pollux_spec::{AdminOpcode, Sqe, Status};

use crate::admin::features::Features;
use crate::bar::BarView;
use crate::config::SoftConfig;
use crate::dma::Seg;
use crate::fault::{DeferKind, Deferred, DeferredSet, FaultAction, Faults};
use crate::io::{self, IoCtx};
use crate::iommu::{Iommu, Mapping};
use crate::irq::Irqs;
use crate::queue::{Completion, Cq, Doorbell, Sq, HELD_LIMIT};
use crate::stats::Counters;
use crate::store::Store;
use pollux_controller::aer::AerState;
use pollux_controller::errlog::ErrorLog;

/// Most commands fetched from one SQ per `step()`.
pub const BUDGET: usize = 256;
/// Steps between housekeeping passes.
pub const HOUSEKEEPING_PERIOD: u64 = 256;
/// Steps between re-publications of the read-only registers.
pub const REPUBLISH_PERIOD: u64 = 16;

/// One namespace as the controller sees it.
pub(crate) struct Namespace {
    pub lba_shift: u8,
    /// Size in logical blocks.
    pub nsze: u64,
    pub store: Store,
}

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
    pub cap: Cap,
    pub iommu: Iommu,
    pub ns: Vec<Namespace>,
    /// CC value last acted on.
    pub cc: u32,
    pub csts: u32,
    /// RDY and not fatal, frozen or shut down: queues are processed.
    pub running: bool,
    pub frozen: bool,
    pub shut: bool,
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
    pub feat: Features,
    pub deferred: DeferredSet,
    pub aer: AerState,
    pub errlog: ErrorLog,
    pub faults: Faults,
    pub counters: Counters,
    pub shadow: Option<ShadowBuf>,
    pub segs: Vec<Seg>,
    pub scratch: Vec<u8>,
    pub ticks: u64,
    pub created: Instant,
    /// Largest data transfer in bytes.
    pub max_xfer: usize,
}

// SAFETY: the raw pointers inside (BAR view, queue bases, shadow buffers,
// IOMMU host addresses) refer to memory owned by the `SoftDevice` (BAR) or
// vouched for by the `dma_map` caller until `dma_unmap`; they are only
// dereferenced under the device Mutex, from whichever thread holds it.
unsafe impl Send for Controller {}

impl Controller {
    pub fn new(cfg: SoftConfig, bar: BarView, ns: Vec<Namespace>) -> Controller {
        let cap = Cap::new(cfg.mqes, true, cfg.cap_to, cfg.dstrd, CAP_CSS_NVM, 0, 4);
        let queues = cfg.max_io_queues as usize + 1;
        let max_xfer = cfg.max_transfer().unwrap_or(usize::MAX);
        let seg_cap = cfg.max_transfer().map_or(1024, |b| b / 4096 + 2).min(4096);
        let feat = Features::defaults(&cfg);
        let c = Controller {
            cap,
            bar,
            iommu: Iommu::default(),
            ns,
            cc: 0,
            csts: 0,
            running: false,
            frozen: false,
            shut: false,
            page_size: 4096,
            sqs: (0..queues).map(|_| None).collect(),
            cqs: (0..queues).map(|_| None).collect(),
            io_sqs: Vec::with_capacity(queues),
            cq_ids: Vec::with_capacity(queues),
            deleting: Vec::new(),
            irq_cqs: Vec::new(),
            irqs: Irqs::new(cfg.irq_vectors),
            feat,
            deferred: DeferredSet::default(),
            aer: AerState::default(),
            errlog: ErrorLog::default(),
            faults: Faults::default(),
            counters: Counters::default(),
            shadow: None,
            segs: Vec::with_capacity(seg_cap),
            scratch: Vec::with_capacity(4096),
            ticks: 0,
            created: Instant::now(),
            max_xfer,
            cfg,
        };
        c.publish_registers();
        c
    }

    // ------------------------------------------------------------------
    // Registers
    // ------------------------------------------------------------------

    /// Re-publishes the device-owned registers (undoing host writes).
    #[inline]
    fn publish_registers(&self) {
        self.bar.publish(off::CAP, self.cap.0 as u32);
        self.bar.publish(off::CAP + 4, (self.cap.0 >> 32) as u32);
        self.bar.publish(off::VS, Vs::NVME_2_0.0);
        self.bar.publish(off::CSTS, self.csts);
    }

    fn set_csts(&mut self, v: u32) {
        self.csts = v;
        self.bar.store(off::CSTS, v);
        self.update_running();
    }

    fn update_running(&mut self) {
        let c = Csts(self.csts);
        self.running = c.rdy() && !c.cfs() && !self.frozen && !self.shut;
    }

    /// Sets CSTS.CFS and stops all processing until reset.
    pub fn fatal(&mut self, why: &str) {
        tracing::error!(why, "controller fatal status");
        self.set_csts(self.csts | Csts::CFS);
    }

    /// Stops all processing, CSTS unchanged, until reset.
    pub fn freeze(&mut self) {
        tracing::warn!("controller frozen by fault injection");
        self.frozen = true;
        self.update_running();
    }

    fn poll_cc(&mut self) {
        let cc = self.bar.load(off::CC);
        if cc == self.cc {
            return;
        }
        let old = Cc(self.cc);
        let new = Cc(cc);
        self.cc = cc;
        if old.en() && !new.en() {
            self.reset();
        } else if !old.en() && new.en() {
            self.enable(new);
        }
        if new.shn() != regs::shn::NONE && new.shn() != old.shn() {
            self.shutdown(new.shn());
        }
    }

    /// CC.EN 0 -> 1.
    fn enable(&mut self, cc: Cc) {
        if let Err(why) = self.try_enable(cc) {
            tracing::error!(why, cc = cc.0, "invalid controller configuration at enable");
            self.set_csts(self.csts | Csts::CFS);
        }
    }

    fn try_enable(&mut self, cc: Cc) -> Result<(), String> {
        debug_assert!(self.sqs.iter().all(Option::is_none));
        if cc.css() != 0 {
            return Err(format!("CC.CSS {} not supported (NVM only)", cc.css()));
        }
        if cc.mps() < self.cap.mpsmin() || cc.mps() > self.cap.mpsmax() {
            return Err(format!("CC.MPS {} outside CAP range", cc.mps()));
        }
        if cc.ams() != 0 {
            return Err(format!(
                "CC.AMS {} not supported (round robin only)",
                cc.ams()
            ));
        }
        self.page_size = 4096usize << cc.mps();
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
        self.shut = false;
        self.set_csts(Csts::RDY);
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
        self.aer.reset();
        self.shadow = None;
        self.counters.s.shadow_doorbell_enabled = false;
        self.feat = Features::defaults(&self.cfg);
        self.frozen = false;
        self.shut = false;
        self.bar.clear_doorbells();
        self.counters.s.resets += 1;
        self.set_csts(0);
    }

    fn shutdown(&mut self, shn: u8) {
        tracing::debug!(shn, "shutdown notification");
        for (i, ns) in self.ns.iter_mut().enumerate() {
            if let Err(e) = ns.store.flush() {
                tracing::error!(nsid = i + 1, error = %e, "flush at shutdown failed");
            }
        }
        self.shut = true;
        self.set_csts(Csts(self.csts).with_shst(shst::COMPLETE).0);
    }

    // ------------------------------------------------------------------
    // IOMMU
    // ------------------------------------------------------------------

    /// Called after `m` left the IOMMU: anything live inside it is an
    /// IOMMU fault for a running controller (it goes fatal). A controller
    /// that is shut down, frozen or already fatal touches no queue memory
    /// until a reset drops its queues, so unmapping is then harmless (the
    /// usual teardown order: shutdown, then free the queues).
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
            if !Csts(self.csts).cfs() {
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
            feat,
            counters,
            ..
        } = self;
        let mut now = None;
        for &qid in irq_cqs.iter() {
            let Some(cq) = cqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "irq_cqs out of sync");
                continue;
            };
            if cq.irq_new != 0 {
                let n = std::mem::take(&mut cq.irq_new);
                irqs.add(cq.iv, n, feat.coalescing, &feat.no_coalesce, &mut now);
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

    fn run_due(&mut self) -> usize {
        let due = self.deferred.take_due(Instant::now());
        let n = due.len();
        for d in due {
            self.post(d.cqid, d.c);
        }
        n
    }

    fn poll_cqs(&mut self) -> usize {
        let mut n = 0;
        for i in 0..self.cq_ids.len() {
            let qid = self.cq_ids[i];
            let Some(cq) = self.cqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "cq_ids out of sync");
                continue;
            };
            cq.poll_head();
            if cq.stalled() {
                n += cq.drain();
            }
            if cq.db_error {
                self.report_db_errors(None, Some(qid));
            }
        }
        n
    }

    fn run_admin(&mut self) -> usize {
        let Some(sq) = self.sqs[0].as_mut() else {
            debug_assert!(false, "running without an admin SQ");
            return 0;
        };
        sq.poll_tail();
        let busy = sq.head != sq.tail;
        let n = if busy { self.run_sq_slow(0) } else { 0 };
        if self.db_error_pending(0, 0) {
            self.report_db_errors(Some(0), Some(0));
        }
        n
    }

    fn run_io(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.io_sqs.len() && self.running {
            let qid = self.io_sqs[i];
            i += 1;
            let Some(sq) = self.sqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "io_sqs out of sync");
                continue;
            };
            sq.prefetch_head();
            sq.poll_tail();
            let cqid = sq.cqid;
            n += if self.faults.is_empty() {
                self.run_io_sq_fast(qid)
            } else {
                self.run_sq_slow(qid)
            };
            if self.db_error_pending(qid, cqid) {
                self.report_db_errors(Some(qid), Some(cqid));
            }
        }
        n
    }

    /// Cheap test before `report_db_errors`.
    #[inline(always)]
    fn db_error_pending(&self, sqid: u16, cqid: u16) -> bool {
        let sq = self
            .sqs
            .get(sqid as usize)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.db_error);
        let cq = self
            .cqs
            .get(cqid as usize)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.db_error);
        sq || cq
    }

    /// SQEs prefetched at the start of a batch (see `Sq::prefetch_batch`).
    const SQE_PREFETCH: u32 = 32;

    /// The I/O hot loop: no fault rules installed.
    #[inline]
    fn run_io_sq_fast(&mut self, qid: u16) -> usize {
        let Controller {
            sqs,
            cqs,
            ns,
            iommu,
            counters,
            errlog,
            segs,
            scratch,
            page_size,
            max_xfer,
            ..
        } = self;
        let Some(sq) = sqs.get_mut(qid as usize).and_then(Option::as_mut) else {
            return 0;
        };
        if sq.head == sq.tail {
            return 0;
        }
        let Some(cq) = cqs.get_mut(sq.cqid as usize).and_then(Option::as_mut) else {
            debug_assert!(false, "SQ bound to a missing CQ");
            return 0;
        };
        let mut ctx = IoCtx {
            ns,
            iommu,
            segs,
            scratch,
            page_size: *page_size,
            max_xfer: *max_xfer,
            counters,
        };
        let mut n = 0;
        sq.prefetch_batch(Self::SQE_PREFETCH);
        while n < BUDGET && sq.head != sq.tail && !cq.stalled() {
            let sqe = sq.fetch();
            n += 1;
            let status = io::exec(&mut ctx, &sqe);
            let c = Completion {
                dw0: 0,
                sqhd: sq.head as u16,
                sqid: qid,
                cid: sqe.cid,
                status,
            };
            if !status.is_success() {
                note_error(ctx.counters, errlog, &c, &sqe);
            }
            post_to(cq, c, ctx.counters);
        }
        ctx.counters.s.io_commands += n as u64;
        n
    }

    /// Generic SQ loop: admin commands, and I/O while fault rules exist.
    fn run_sq_slow(&mut self, qid: u16) -> usize {
        let mut n = 0;
        while n < BUDGET && self.running {
            let Some(sq) = self.sqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                break; // deleted by the command just run
            };
            let cqid = sq.cqid;
            if sq.head == sq.tail
                || cq_blocked(self.cqs[cqid as usize].as_ref())
                || (!self.faults.is_empty() && self.deferred.is_full())
            {
                break;
            }
            let sqe = sq.fetch();
            let sqhd = sq.head as u16;
            n += 1;
            if qid == 0 {
                self.counters.s.admin_commands += 1;
            } else {
                self.counters.s.io_commands += 1;
            }
            let action = if self.faults.is_empty() {
                None
            } else {
                self.faults.check(qid == 0, &sqe)
            };
            let disp = match action {
                None => Disposition::Post,
                Some(a) => {
                    self.counters.s.faults_fired += 1;
                    tracing::debug!(qid, cid = sqe.cid, opc = sqe.opc, action = ?a, "fault fired");
                    match a {
                        FaultAction::Status(s) => {
                            self.finish(qid, cqid, &sqe, sqhd, 0, s, Disposition::Post);
                            continue;
                        }
                        FaultAction::Drop => {
                            self.deferred.push(Deferred {
                                c: Completion {
                                    dw0: 0,
                                    sqhd,
                                    sqid: qid,
                                    cid: sqe.cid,
                                    status: Status::generic(generic::ABORT_REQUESTED),
                                },
                                cqid,
                                kind: DeferKind::Dropped,
                                is_abort: qid == 0 && sqe.opc == AdminOpcode::Abort as u8,
                            });
                            continue;
                        }
                        FaultAction::Fatal => {
                            self.fatal("fault injection");
                            break;
                        }
                        FaultAction::Freeze => {
                            self.freeze();
                            break;
                        }
                        FaultAction::Delay(d) => Disposition::Delay(d),
                        FaultAction::Reorder => Disposition::Reorder,
                    }
                }
            };
            let result = if qid == 0 {
                self.exec_admin(&sqe)
            } else {
                let status = io::exec(&mut self.io_ctx(), &sqe);
                Some((0, status))
            };
            if let Some((dw0, status)) = result {
                self.finish(qid, cqid, &sqe, sqhd, dw0, status, disp);
            }
        }
        n
    }

    pub(crate) fn io_ctx(&mut self) -> IoCtx<'_> {
        IoCtx {
            ns: &mut self.ns,
            iommu: &self.iommu,
            segs: &mut self.segs,
            scratch: &mut self.scratch,
            page_size: self.page_size,
            max_xfer: self.max_xfer,
            counters: &mut self.counters,
        }
    }

    /// Completes an executed command according to its disposition.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        sqid: u16,
        cqid: u16,
        sqe: &Sqe,
        sqhd: u16,
        dw0: u32,
        status: Status,
        disp: Disposition,
    ) {
        let c = Completion {
            dw0,
            sqhd,
            sqid,
            cid: sqe.cid,
            status,
        };
        if !status.is_success() {
            note_error(&mut self.counters, &mut self.errlog, &c, sqe);
        }
        match disp {
            Disposition::Post => self.post(cqid, c),
            Disposition::Delay(d) => self.deferred.push(Deferred {
                c,
                cqid,
                kind: DeferKind::Delayed(Instant::now() + d),
                is_abort: sqid == 0 && sqe.opc == AdminOpcode::Abort as u8,
            }),
            Disposition::Reorder => {
                match self.cqs.get_mut(cqid as usize).and_then(Option::as_mut) {
                    Some(cq) if cq.held.len() < HELD_LIMIT => cq.held.push(c),
                    _ => self.post(cqid, c),
                }
            }
        }
    }

    /// Posts `c` to CQ `cqid` (or its backlog).
    pub(crate) fn post(&mut self, cqid: u16, c: Completion) {
        match self.cqs.get_mut(cqid as usize).and_then(Option::as_mut) {
            Some(cq) => post_to(cq, c, &mut self.counters),
            None => tracing::warn!(cqid, cid = c.cid, "completion for a missing CQ dropped"),
        }
    }

    fn deliver_events(&mut self) -> usize {
        let mut n = 0;
        while let Some((cid, dw0)) = self.aer.next() {
            let sqhd = self.sqs[0].as_ref().map_or(0, |s| s.head as u16);
            self.post(
                0,
                Completion {
                    dw0,
                    sqhd,
                    sqid: 0,
                    cid,
                    status: Status::SUCCESS,
                },
            );
            n += 1;
        }
        n
    }

    /// Reports invalid doorbell values flagged on SQ `sqid` / CQ `cqid`
    /// (the queues set the flag while polling, including the head refresh
    /// a full CQ does while posting).
    #[inline]
    fn report_db_errors(&mut self, sqid: Option<u16>, cqid: Option<u16>) {
        let sq = sqid.and_then(|q| self.sqs.get_mut(q as usize)?.as_mut());
        let sq_err = sq.is_some_and(|s| std::mem::take(&mut s.db_error));
        let cq = cqid.and_then(|q| self.cqs.get_mut(q as usize)?.as_mut());
        let cq_err = cq.is_some_and(|c| std::mem::take(&mut c.db_error));
        if sq_err {
            self.invalid_doorbell_value(sqid.unwrap_or(0), true);
        }
        if cq_err {
            self.invalid_doorbell_value(cqid.unwrap_or(0), false);
        }
    }

    /// An invalid value was written to an existing queue's doorbell.
    #[cold]
    fn invalid_doorbell_value(&mut self, qid: u16, sq: bool) {
        tracing::warn!(qid, sq, "invalid doorbell write value ignored");
        self.invalid_doorbell(pollux_spec::features::aer::ERROR_INVALID_DOORBELL_WRITE);
    }

    fn invalid_doorbell(&mut self, info: u8) {
        use pollux_spec::features::aer;
        use pollux_spec::log::{lid, ERROR_LOG_NOT_SPECIFIC};
        self.counters.s.invalid_doorbell_writes += 1;
        self.errlog.record(
            ERROR_LOG_NOT_SPECIFIC,
            ERROR_LOG_NOT_SPECIFIC,
            Status::SUCCESS,
            0,
            0,
        );
        self.aer.raise(aer::ERROR, info, lid::ERROR);
    }

    /// Periodic checks that are too costly for every step.
    fn housekeeping(&mut self) {
        // Reserved / unsupported registers read 0 (NSSR, CMB*, BP*, PMR*...).
        self.bar.publish(off::NSSR, 0);
        for o in (off::CMBLOC..off::DOORBELL_BASE).step_by(4) {
            self.bar.publish(o, 0);
        }
        if !self.running {
            return;
        }
        // Doorbells of queues that do not exist.
        let bar = self.bar;
        for q in 0..bar.queues() {
            let qid = q as u16;
            let sq_missing = self.sqs[q].is_none();
            let cq_missing = self.cqs[q].is_none();
            for (missing, reg) in [
                (sq_missing, bar.sq_tail(qid)),
                (cq_missing, bar.cq_head(qid)),
            ] {
                if missing && reg.load(std::sync::atomic::Ordering::Acquire) != 0 {
                    reg.store(0, std::sync::atomic::Ordering::Release);
                    tracing::warn!(qid, "doorbell write for a queue that does not exist");
                    self.invalid_doorbell(
                        pollux_spec::features::aer::ERROR_INVALID_DOORBELL_REGISTER,
                    );
                }
            }
        }
    }
}

/// The CQ is missing or has a backlog: SQs bound to it must not fetch.
#[inline]
fn cq_blocked(cq: Option<&Cq>) -> bool {
    match cq {
        None => true,
        Some(cq) => cq.stalled(),
    }
}

/// Posts `c` and then any completions held back for reordering.
#[inline(always)]
pub(crate) fn post_to(cq: &mut Cq, c: Completion, counters: &mut Counters) {
    if !cq.post(c) {
        counters.s.cq_full_waits += 1;
    }
    if !cq.held.is_empty() {
        post_held(cq, counters);
    }
}

#[cold]
fn post_held(cq: &mut Cq, counters: &mut Counters) {
    for h in std::mem::take(&mut cq.held) {
        if !cq.post(h) {
            counters.s.cq_full_waits += 1;
        }
    }
}

/// Accounts a failed command: counters and the Error Information log.
#[cold]
pub(crate) fn note_error(
    counters: &mut Counters,
    errlog: &mut ErrorLog,
    c: &Completion,
    sqe: &Sqe,
) {
    counters.s.errors += 1;
    if c.status.sct() == sct::MEDIA {
        counters.media_errors += 1;
    }
    let lba = if c.sqid != 0 { sqe.slba() } else { 0 };
    errlog.record(c.sqid, c.cid, c.status, sqe.nsid, lba);
}
