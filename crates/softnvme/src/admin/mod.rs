//! The admin commands of the PCIe transport: queue creation and deletion,
//! Abort and Doorbell Buffer Config. Every other admin command is the
//! controller model's (`pollux_controller::Controller::exec_admin`): this
//! file moves its data to the host through the command's PRPs.
//!
//! Every field of an admin SQE comes from the untrusted host: each path
//! below ends in a spec status, never a panic.
use std::ptr::NonNull;

use pollux_controller::{AdminEnv, AdminOutcome};
use pollux_spec::cmd::{CQ_IEN, QUEUE_PC};
use pollux_spec::regs::{self, Cc};
use pollux_spec::status::{generic, specific};
use pollux_spec::{AdminOpcode, Sqe, Status};

use crate::ctrl::{Controller, ShadowBuf, SqDeletion};
use crate::dma;
use crate::fault::DeferKind;
use crate::queue::{Completion, Cq, Doorbell, Sq};

/// Admin command result: `None` = no completion now (AER held).
pub(crate) type AdminResult = Option<(u32, Status)>;

#[inline]
pub(crate) fn ok(dw0: u32) -> AdminResult {
    Some((dw0, Status::SUCCESS))
}
#[inline]
pub(crate) fn gen(sc: u8) -> AdminResult {
    Some((0, Status::generic(sc)))
}
#[inline]
pub(crate) fn spec(sc: u8) -> AdminResult {
    Some((0, Status::specific(sc)))
}

impl Controller {
    pub(crate) fn exec_admin(&mut self, sqe: &Sqe) -> AdminResult {
        let env = AdminEnv {
            io_queues_exist: self.io_queues_exist(),
        };
        // The I/O queue's counts reach SMART only when published: here,
        // not on the I/O path (one thread runs both).
        self.io.publish();
        match self.core.exec_admin(sqe, env) {
            AdminOutcome::Complete { dw0, status } => Some((dw0, status)),
            AdminOutcome::Data {
                data,
                xfer_len,
                then,
            } => match self.xfer_to_host(sqe, xfer_len, &data) {
                Ok(()) => {
                    self.core.data_sent(then);
                    ok(0)
                }
                Err(s) => Some((0, s)),
            },
            AdminOutcome::Held => None,
            AdminOutcome::NotMine => self.exec_pcie_admin(sqe),
        }
    }

    /// The transport's admin commands (`exec_admin` checked FUSE and PSDT
    /// and that the opcode is one of these).
    fn exec_pcie_admin(&mut self, sqe: &Sqe) -> AdminResult {
        use AdminOpcode::*;
        match AdminOpcode::from_u8(sqe.opc) {
            Some(CreateIoCq) => self.create_io_cq(sqe),
            Some(CreateIoSq) => self.create_io_sq(sqe),
            Some(DeleteIoSq) => self.delete_io_sq(sqe),
            Some(DeleteIoCq) => self.delete_io_cq(sqe),
            Some(Abort) => self.abort(sqe),
            Some(DoorbellBufferConfig) if self.cfg.shadow_doorbells => {
                self.doorbell_buffer_config(sqe)
            }
            _ => gen(generic::INVALID_OPCODE),
        }
    }

    /// Copies `data` to the host buffer described by the SQE's PRPs, whose
    /// length is `xfer_len` (at least `data.len()`; the controller model
    /// checked it against MDTS).
    pub(crate) fn xfer_to_host(
        &mut self,
        sqe: &Sqe,
        xfer_len: usize,
        data: &[u8],
    ) -> Result<(), Status> {
        debug_assert!(data.len() <= xfer_len);
        dma::map_prps(
            &self.iommu,
            sqe.prp1,
            sqe.prp2,
            xfer_len,
            self.page_size,
            &mut self.segs,
        )
        .map_err(|e| e.status())?;
        dma::copy_to_host(&self.segs, data);
        Ok(())
    }

    /// Any I/O queue exists.
    pub(crate) fn io_queues_exist(&self) -> bool {
        !self.io_sqs.is_empty() || self.cq_ids.iter().any(|&q| q != 0)
    }

    /// CC.IOSQES / IOCQES as required for queue creation.
    fn entry_sizes_ok(&self) -> bool {
        let cc = Cc(self.core.registers().cc());
        cc.iosqes() == 6 && cc.iocqes() == 4
    }

    /// The doorbell a new I/O queue uses: shadow if configured and the
    /// slot fits in the shadow buffer, else BAR0.
    fn doorbell_for(&self, qid: u16, sq: bool) -> Doorbell {
        let dstrd = self.cfg.dstrd;
        let off = if sq {
            regs::sq_tail_doorbell(qid, dstrd)
        } else {
            regs::cq_head_doorbell(qid, dstrd)
        };
        let slot = match self.shadow {
            Some(s) if qid != 0 => s.slot(off - regs::off::DOORBELL_BASE),
            _ => None,
        };
        match slot {
            Some((db, ei)) => Doorbell {
                value: db.cast(),
                event_idx: Some(ei.cast()),
            },
            None => Doorbell {
                value: NonNull::from(self.bar.reg(off)),
                event_idx: None,
            },
        }
    }

    fn create_io_cq(&mut self, sqe: &Sqe) -> AdminResult {
        let qid = sqe.cdw10 as u16;
        let qsize = (sqe.cdw10 >> 16) as u16;
        let pc = sqe.cdw11 & QUEUE_PC != 0;
        let ien = sqe.cdw11 & CQ_IEN != 0;
        let iv = (sqe.cdw11 >> 16) as u16;
        if !self.entry_sizes_ok() {
            return gen(generic::INVALID_FIELD);
        }
        if qid == 0
            || qid > self.core.queues_granted().ncq
            || self.cqs.get(qid as usize).is_none_or_some()
        {
            return spec(specific::INVALID_QID);
        }
        if qsize == 0 || qsize > self.core.registers().cap().mqes() {
            return spec(specific::INVALID_QUEUE_SIZE);
        }
        if !pc {
            return gen(generic::INVALID_FIELD);
        }
        // IV is checked even without IEN (as QEMU does): it names a vector.
        if iv >= self.irqs.len() {
            return spec(specific::INVALID_INTERRUPT_VECTOR);
        }
        let size = qsize as u32 + 1;
        if sqe.prp1 & (self.page_size as u64 - 1) != 0 {
            return gen(generic::PRP_OFFSET_INVALID);
        }
        let Some(base) = self.iommu.translate(sqe.prp1, size as usize * 16) else {
            tracing::warn!(qid, prp1 = sqe.prp1, "Create I/O CQ: memory not mapped");
            return gen(generic::INVALID_FIELD);
        };
        if ien {
            if let Err(e) = self.ensure_vector(iv) {
                tracing::error!(qid, iv, error = %e, "Create I/O CQ: no eventfd for the vector");
                return gen(generic::INTERNAL_ERROR);
            }
        }
        let db = self.doorbell_for(qid, false);
        db.reset();
        // SAFETY: `size` CQEs at `base` were translated above; `db` is a
        // BAR register or a slot inside the mapped shadow buffer.
        let mut cq = unsafe { Cq::new(qid, sqe.prp1, base, size, db) };
        cq.ien = ien;
        cq.iv = iv;
        self.cqs[qid as usize] = Some(cq);
        self.cq_ids.push(qid);
        if ien {
            self.irq_cqs.push(qid);
        }
        tracing::debug!(qid, size, ien, iv, "I/O CQ created");
        ok(0)
    }

    fn create_io_sq(&mut self, sqe: &Sqe) -> AdminResult {
        let qid = sqe.cdw10 as u16;
        let qsize = (sqe.cdw10 >> 16) as u16;
        let pc = sqe.cdw11 & QUEUE_PC != 0;
        let cqid = (sqe.cdw11 >> 16) as u16;
        if !self.entry_sizes_ok() {
            return gen(generic::INVALID_FIELD);
        }
        if qid == 0
            || qid > self.core.queues_granted().nsq
            || self.sqs.get(qid as usize).is_none_or_some()
        {
            return spec(specific::INVALID_QID);
        }
        if cqid == 0 || !matches!(self.cqs.get(cqid as usize), Some(Some(_))) {
            return spec(specific::INVALID_CQ);
        }
        if qsize == 0 || qsize > self.core.registers().cap().mqes() {
            return spec(specific::INVALID_QUEUE_SIZE);
        }
        if !pc {
            return gen(generic::INVALID_FIELD);
        }
        let size = qsize as u32 + 1;
        if sqe.prp1 & (self.page_size as u64 - 1) != 0 {
            return gen(generic::PRP_OFFSET_INVALID);
        }
        let Some(base) = self.iommu.translate(sqe.prp1, size as usize * 64) else {
            tracing::warn!(qid, prp1 = sqe.prp1, "Create I/O SQ: memory not mapped");
            return gen(generic::INVALID_FIELD);
        };
        let db = self.doorbell_for(qid, true);
        db.reset();
        // SAFETY: `size` SQEs at the page-aligned `base` were translated
        // above; `db` is a BAR register or a mapped shadow slot.
        let sq = unsafe { Sq::new(cqid, sqe.prp1, base.cast(), size, db) };
        self.sqs[qid as usize] = Some(sq);
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            cq.sq_count += 1;
        }
        self.io_sqs.push(qid);
        tracing::debug!(qid, cqid, size, "I/O SQ created");
        ok(0)
    }

    /// Delete I/O Submission Queue. Every command submitted to the SQ is
    /// completed with Command Aborted due to SQ Deletion: those in progress
    /// (delayed or held back by fault injection) at once, those not fetched
    /// yet as the CQ has room for them. The SQ stays allocated (not fetched
    /// from, its doorbell no longer read) until then, and the Delete itself
    /// completes only once no completion of the SQ is left unwritten: the
    /// host sees every aborted command before it may delete the CQ, and a
    /// CQ that the host does not consume holds the Delete back (as it would
    /// on hardware) instead of piling the aborts up in a backlog.
    fn delete_io_sq(&mut self, sqe: &Sqe) -> AdminResult {
        let qid = sqe.cdw10 as u16;
        if qid == 0
            || !matches!(self.sqs.get(qid as usize), Some(Some(_)))
            || self.deleting.iter().any(|d| d.sqid == qid)
        {
            return spec(specific::INVALID_QID);
        }
        let Some(sq) = self.sqs[qid as usize].as_mut() else {
            return spec(specific::INVALID_QID);
        };
        // Commands submitted before the Delete: the tail as of now. The
        // doorbell is not read again.
        let _ = sq.poll_tail();
        let cqid = sq.cqid;
        self.io_sqs.retain(|&q| q != qid);
        let aborted = Status::generic(generic::ABORTED_SQ_DELETION);
        // Commands in progress (delayed, held back) complete as aborted;
        // dropped ones are forgotten. They were already counted against the
        // CQ's backlog bound (see `queue::BACKLOG_LIMIT`).
        for d in self.deferred.take_where(|d| d.c.sqid == qid) {
            if d.kind != DeferKind::Dropped {
                self.post(
                    cqid,
                    Completion {
                        status: aborted,
                        dw0: 0,
                        ..d.c
                    },
                );
            }
        }
        if let Some(cq) = self.cqs[cqid as usize].as_mut() {
            let held: Vec<Completion> = cq.held.iter().copied().filter(|c| c.sqid == qid).collect();
            cq.held.retain(|c| c.sqid != qid);
            for c in held {
                self.post(
                    cqid,
                    Completion {
                        status: aborted,
                        dw0: 0,
                        ..c
                    },
                );
            }
        }
        let (_, done) = self.abort_unfetched(qid);
        if done {
            self.remove_sq(qid);
            return ok(0);
        }
        tracing::debug!(qid, cqid, "I/O SQ deletion waits for room in its CQ");
        self.deleting.push(SqDeletion {
            sqid: qid,
            cid: sqe.cid,
        });
        None
    }

    /// Completes as aborted the unfetched commands of SQ `qid` (being
    /// deleted) that fit in its CQ now. Returns the number posted and
    /// whether the deletion is complete: nothing left in the SQ and none of
    /// its completions waiting in the CQ's backlog.
    fn abort_unfetched(&mut self, qid: u16) -> (usize, bool) {
        let Controller {
            sqs,
            cqs,
            counters,
            core,
            ..
        } = self;
        let Some(sq) = sqs.get_mut(qid as usize).and_then(Option::as_mut) else {
            debug_assert!(false, "deleting a missing SQ");
            return (0, true);
        };
        let Some(cq) = cqs.get_mut(sq.cqid as usize).and_then(Option::as_mut) else {
            // Cannot happen: a CQ with SQs bound cannot be deleted.
            debug_assert!(false, "SQ bound to a missing CQ");
            return (0, true);
        };
        let mut n = 0;
        while sq.head != sq.tail && cq.can_post() {
            let s = sq.fetch();
            let c = Completion {
                dw0: 0,
                sqhd: sq.head as u16,
                sqid: qid,
                cid: s.cid,
                status: Status::generic(generic::ABORTED_SQ_DELETION),
            };
            crate::ctrl::note_error(counters, core, &c, &s);
            crate::ctrl::post_to(cq, c, counters);
            n += 1;
        }
        let done = sq.head == sq.tail && !cq.backlog.iter().any(|c| c.sqid == qid);
        (n, done)
    }

    /// Frees SQ `qid` once its deletion is complete.
    fn remove_sq(&mut self, qid: u16) {
        let Some(sq) = self.sqs.get_mut(qid as usize).and_then(Option::take) else {
            return;
        };
        if let Some(cq) = self.cqs[sq.cqid as usize].as_mut() {
            debug_assert!(cq.sq_count > 0);
            cq.sq_count = cq.sq_count.saturating_sub(1);
        }
        self.bar
            .sq_tail(qid)
            .store(0, std::sync::atomic::Ordering::Release);
        tracing::debug!(qid, "I/O SQ deleted");
    }

    /// Advances the SQ deletions waiting for CQ room; posts the Delete
    /// completions of those that are done. Returns the completions posted.
    pub(crate) fn run_deletions(&mut self) -> usize {
        let mut n = 0;
        let mut i = 0;
        while i < self.deleting.len() {
            let d = self.deleting[i];
            let (posted, done) = self.abort_unfetched(d.sqid);
            n += posted;
            if !done {
                i += 1;
                continue;
            }
            self.deleting.remove(i);
            self.remove_sq(d.sqid);
            let sqhd = self.sqs[0].as_ref().map_or(0, |s| s.head as u16);
            self.post(
                0,
                Completion {
                    dw0: 0,
                    sqhd,
                    sqid: 0,
                    cid: d.cid,
                    status: Status::SUCCESS,
                },
            );
            n += 1;
        }
        n
    }

    fn delete_io_cq(&mut self, sqe: &Sqe) -> AdminResult {
        let qid = sqe.cdw10 as u16;
        let Some(Some(cq)) = self.cqs.get(qid as usize) else {
            return spec(specific::INVALID_QID);
        };
        if qid == 0 {
            return spec(specific::INVALID_QID);
        }
        if cq.sq_count != 0 {
            return spec(specific::INVALID_QUEUE_DELETION);
        }
        if !cq.backlog.is_empty() || !cq.held.is_empty() {
            tracing::warn!(
                qid,
                backlog = cq.backlog.len(),
                held = cq.held.len(),
                "CQ deleted with unposted completions"
            );
        }
        if let Some(cq) = self.cqs[qid as usize].take() {
            if cq.ien {
                self.irq_cqs.retain(|&q| q != qid);
            }
            if cq.irq_new != 0 {
                // Entries written this step still raise their interrupt.
                let mut now = None;
                let (coalescing, no_coalesce) = self.core.coalescing();
                self.irqs
                    .add(cq.iv, cq.irq_new, coalescing, no_coalesce, &mut now);
            }
        }
        self.cq_ids.retain(|&q| q != qid);
        self.bar
            .cq_head(qid)
            .store(0, std::sync::atomic::Ordering::Release);
        tracing::debug!(qid, "I/O CQ deleted");
        ok(0)
    }

    fn abort(&mut self, sqe: &Sqe) -> AdminResult {
        let sqid = sqe.cdw10 as u16;
        let cid = (sqe.cdw10 >> 16) as u16;
        // This Abort plus deferred ones in flight.
        if self.deferred.aborts() + 1 > self.cfg.abort_limit as usize + 1 {
            return spec(specific::ABORT_LIMIT_EXCEEDED);
        }
        let requested = Status::generic(generic::ABORT_REQUESTED);
        // Deferred (delayed or dropped) commands.
        if let Some(d) = self
            .deferred
            .take_where(|d| d.c.sqid == sqid && d.c.cid == cid)
            .into_iter()
            .next()
        {
            let c = Completion {
                status: requested,
                dw0: 0,
                ..d.c
            };
            self.note_abort(&c);
            self.post(d.cqid, c);
            return ok(0);
        }
        // Held back (Reorder) or backlogged (CQ full) completions.
        for i in 0..self.cq_ids.len() {
            let cqid = self.cq_ids[i];
            let Some(cq) = self.cqs[cqid as usize].as_mut() else {
                continue;
            };
            if let Some(pos) = cq.held.iter().position(|c| c.sqid == sqid && c.cid == cid) {
                let c = Completion {
                    status: requested,
                    dw0: 0,
                    ..cq.held.remove(pos)
                };
                self.note_abort(&c);
                self.post(cqid, c);
                return ok(0);
            }
            if let Some(c) = cq
                .backlog
                .iter_mut()
                .find(|c| c.sqid == sqid && c.cid == cid)
            {
                c.status = requested;
                c.dw0 = 0;
                let c = *c;
                self.note_abort(&c);
                return ok(0);
            }
        }
        // An outstanding Asynchronous Event Request.
        if sqid == 0 && self.core.abort_aer(cid) {
            let sqhd = self.sqs[0].as_ref().map_or(0, |s| s.head as u16);
            let c = Completion {
                dw0: 0,
                sqhd,
                sqid: 0,
                cid,
                status: requested,
            };
            self.note_abort(&c);
            self.post(0, c);
            return ok(0);
        }
        ok(1) // not aborted
    }

    fn note_abort(&mut self, c: &Completion) {
        self.counters.s.errors += 1;
        self.core.note_error(c.sqid, c.cid, c.status, 0, 0);
    }

    fn doorbell_buffer_config(&mut self, sqe: &Sqe) -> AdminResult {
        let mask = self.page_size as u64 - 1;
        let (db_iova, ei_iova) = (sqe.prp1, sqe.prp2);
        if db_iova & mask != 0 || ei_iova & mask != 0 {
            return gen(generic::INVALID_FIELD);
        }
        // The buffers cover every doorbell if the mapping allows, and at
        // least one page; queues whose slot does not fit use BAR0.
        let want = self.bar.queues() * 2 * (4usize << self.cfg.dstrd);
        let want = want.max(self.page_size);
        let (Some((db, db_len)), Some((ei, ei_len))) = (
            self.iommu.translate_prefix(db_iova, want),
            self.iommu.translate_prefix(ei_iova, want),
        ) else {
            return gen(generic::INVALID_FIELD);
        };
        let len = db_len.min(ei_len);
        if len < self.page_size {
            return gen(generic::INVALID_FIELD);
        }
        let buf = ShadowBuf {
            db_iova,
            ei_iova,
            db,
            ei,
            len,
        };
        self.shadow = Some(buf);
        self.counters.s.shadow_doorbell_enabled = true;
        // Existing I/O queues switch over, carrying their current values.
        for qid in 1..self.sqs.len() as u16 {
            if let Some(sq) = self.sqs[qid as usize].as_ref() {
                let tail = sq.tail;
                let db = self.doorbell_for(qid, true);
                seed(&db, tail);
                if let Some(sq) = self.sqs[qid as usize].as_mut() {
                    sq.db = db;
                }
            }
            if let Some(cq) = self.cqs[qid as usize].as_ref() {
                let head = cq.head;
                let db = self.doorbell_for(qid, false);
                seed(&db, head);
                if let Some(cq) = self.cqs[qid as usize].as_mut() {
                    cq.db = db;
                }
            }
        }
        tracing::debug!(db_iova, ei_iova, len, "shadow doorbells enabled");
        ok(0)
    }
}

/// Writes `v` to a shadow doorbell and `v - 1` to its event index.
fn seed(db: &Doorbell, v: u32) {
    // SAFETY: `db` points into BAR0 or a mapped shadow buffer (see
    // `Doorbell`); atomic access.
    unsafe { db.value.as_ref() }.store(v, std::sync::atomic::Ordering::Release);
    if let Some(ei) = db.event_idx {
        // SAFETY: as above.
        unsafe { ei.as_ref() }.store(
            v.wrapping_sub(1) & 0xFFFF,
            std::sync::atomic::Ordering::Release,
        );
    }
}

trait SlotTaken {
    /// The index is out of range or the slot is occupied.
    fn is_none_or_some(&self) -> bool;
}

impl<T> SlotTaken for Option<&Option<T>> {
    fn is_none_or_some(&self) -> bool {
        !matches!(self, Some(None))
    }
}
