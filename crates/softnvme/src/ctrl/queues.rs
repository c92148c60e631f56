//! Running the queues: CQ heads, the admin SQ, the I/O SQs (the fast path
//! without fault rules, the generic path with them), completions and their
//! dispositions, doorbell errors.

use std::time::Instant;

use pollux_controller::IoQueue;
use pollux_spec::status::generic;
use pollux_spec::{AdminOpcode, Sqe, Status};

use super::{Controller, Disposition, BUDGET};
use crate::dma::{self, Seg};
use crate::fault::{DeferKind, Deferred, FaultAction};
use crate::iommu::Iommu;
use crate::queue::{Completion, Cq, HELD_LIMIT};
use crate::stats::Counters;

impl Controller {
    pub(super) fn run_due(&mut self) -> usize {
        let due = self.deferred.take_due(Instant::now());
        let n = due.len();
        for d in due {
            self.post(d.cqid, d.c);
        }
        n
    }

    /// Polls every CQ head and drains backlogs; the doorbell error flags
    /// are read on the CQs there and reported after the pass.
    pub(super) fn poll_cqs(&mut self) -> usize {
        let Controller { cq_ids, cqs, .. } = self;
        let mut n = 0;
        let mut db_error = false;
        for &qid in cq_ids.iter() {
            let Some(cq) = cqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "cq_ids out of sync");
                continue;
            };
            cq.poll_head();
            if cq.stalled() {
                n += cq.drain();
            }
            db_error |= cq.db_error;
        }
        if db_error {
            self.report_cq_db_errors();
        }
        n
    }

    /// Reports the doorbell errors flagged on the CQs, in `cq_ids` order.
    #[cold]
    fn report_cq_db_errors(&mut self) {
        for i in 0..self.cq_ids.len() {
            let qid = self.cq_ids[i];
            if self.db_error_pending(u16::MAX, qid) {
                self.report_db_errors(None, Some(qid));
            }
        }
    }

    pub(super) fn run_admin(&mut self) -> usize {
        let Some(sq) = self.sqs[0].as_mut() else {
            debug_assert!(false, "running without an admin SQ");
            return 0;
        };
        sq.poll_tail();
        if sq.head != sq.tail {
            let n = self.run_sq_slow(0);
            if self.db_error_pending(0, 0) {
                self.report_db_errors(Some(0), Some(0));
            }
            return n;
        }
        // Idle: the SQ's flag on the queue at hand; the admin CQ's (set by a
        // head refresh while posting since `poll_cqs`) as before.
        if sq.db_error || self.cqs[0].as_ref().is_some_and(|c| c.db_error) {
            self.report_db_errors(Some(0), Some(0));
        }
        0
    }

    pub(super) fn run_io(&mut self) -> usize {
        if self.faults.is_empty() {
            self.run_io_fast()
        } else {
            self.run_io_slow()
        }
    }

    /// I/O SQs while fault rules exist: the generic loop per SQ.
    fn run_io_slow(&mut self) -> usize {
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
            n += self.run_sq_slow(qid);
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

    /// The I/O hot loop (no fault rules installed): each I/O SQ and its CQ
    /// are looked up once per step; the doorbell error flags are read on
    /// them there, and reported after the pass (`report_io_db_errors`).
    #[inline]
    fn run_io_fast(&mut self) -> usize {
        let Controller {
            io_sqs,
            sqs,
            cqs,
            core,
            io,
            iommu,
            counters,
            segs,
            page_size,
            ..
        } = self;
        let mut n = 0;
        let mut db_error = false;
        for &qid in io_sqs.iter() {
            let Some(sq) = sqs.get_mut(qid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "io_sqs out of sync");
                continue;
            };
            sq.prefetch_head();
            sq.poll_tail();
            let Some(cq) = cqs.get_mut(sq.cqid as usize).and_then(Option::as_mut) else {
                debug_assert!(false, "SQ bound to a missing CQ");
                db_error |= sq.db_error;
                continue;
            };
            if sq.head != sq.tail {
                sq.prefetch_batch(Self::SQE_PREFETCH);
                let mut k = 0;
                while k < BUDGET && sq.head != sq.tail && !cq.stalled() {
                    let sqe = sq.fetch();
                    k += 1;
                    let status = exec_io(io, iommu, segs, *page_size, &sqe);
                    let c = Completion {
                        dw0: 0,
                        sqhd: sq.head as u16,
                        sqid: qid,
                        cid: sqe.cid,
                        status,
                    };
                    if !status.is_success() {
                        note_error(counters, core, &c, &sqe);
                    }
                    post_to(cq, c, counters);
                }
                n += k;
            }
            // Set by the tail poll above, or by a head refresh of a full CQ
            // while posting.
            db_error |= sq.db_error | cq.db_error;
        }
        counters.s.io_commands += n as u64;
        if db_error {
            self.report_io_db_errors();
        }
        n
    }

    /// Reports the doorbell errors flagged on the I/O SQs and their CQs.
    #[cold]
    fn report_io_db_errors(&mut self) {
        for i in 0..self.io_sqs.len() {
            let qid = self.io_sqs[i];
            let Some(cqid) = self
                .sqs
                .get(qid as usize)
                .and_then(Option::as_ref)
                .map(|s| s.cqid)
            else {
                continue;
            };
            if self.db_error_pending(qid, cqid) {
                self.report_db_errors(Some(qid), Some(cqid));
            }
        }
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
                let status = exec_io(
                    &mut self.io,
                    &self.iommu,
                    &mut self.segs,
                    self.page_size,
                    &sqe,
                );
                Some((0, status))
            };
            if let Some((dw0, status)) = result {
                self.finish(qid, cqid, &sqe, sqhd, dw0, status, disp);
            }
        }
        n
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
            note_error(&mut self.counters, &mut self.core, &c, sqe);
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

    pub(super) fn deliver_events(&mut self) -> usize {
        let mut n = 0;
        while let Some((cid, dw0)) = self.core.next_event() {
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

    pub(super) fn invalid_doorbell(&mut self, info: u8) {
        self.counters.s.invalid_doorbell_writes += 1;
        self.core.error_event(info);
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

/// Accounts a failed command: counters, the Error Information log and
/// SMART's media errors.
#[cold]
pub(crate) fn note_error(
    counters: &mut Counters,
    core: &mut pollux_controller::Controller,
    c: &Completion,
    sqe: &Sqe,
) {
    counters.s.errors += 1;
    let lba = if c.sqid != 0 { sqe.slba() } else { 0 };
    core.note_error(c.sqid, c.cid, c.status, sqe.nsid, lba);
}

/// One I/O command: the controller model's checks, the PRPs of its data
/// (nothing moves unless every check passed), its execution.
#[inline(always)]
fn exec_io(
    io: &mut IoQueue,
    iommu: &Iommu,
    segs: &mut Vec<Seg>,
    page_size: usize,
    sqe: &Sqe,
) -> Status {
    let cmd = match io.check(sqe) {
        Ok(cmd) => cmd,
        Err(status) => return status,
    };
    if cmd.xfer_len != 0 {
        if let Err(e) = dma::map_prps(iommu, sqe.prp1, sqe.prp2, cmd.xfer_len, page_size, segs) {
            return e.status();
        }
    } else {
        segs.clear();
    }
    // SAFETY: the segments were translated just now under the controller
    // lock, which is held until the command is done (their memory stays
    // mapped); the device touches them only through this command.
    unsafe { io.exec(&cmd, segs) }
}
