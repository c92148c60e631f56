//! The admin queue: the same rings as an I/O queue pair (the transport's
//! `SubmissionQueue`/`CompletionQueue`), driven one command at a time under
//! the controller's admin lock. The control path: clarity over speed. Every
//! wait is bounded and checks CSTS for a fatal or vanished controller.
use std::time::{Duration, Instant};

use pollux_spec::{regs, Cqe, Sqe};

use crate::dma::DmaBuffer;
use crate::error::{Error, Result};
use crate::transport::{CompletionQueue, CqeSink, Registers, SubmissionQueue, Transport};

pub(crate) struct AdminQueue<T: Transport> {
    pub(crate) sq: T::Sq,
    pub(crate) cq: T::Cq,
    next_cid: u16,
    /// Commands in the SQ whose completion has not been seen (an admin
    /// command that timed out stays here until its completion arrives or
    /// the controller is reset), so the ring never overflows.
    pending: u32,
    entries: u16,
}

impl<T: Transport> AdminQueue<T> {
    pub(crate) fn new(t: &T, entries: u16) -> Result<Self> {
        let (sq, cq) = t.admin_queues(entries)?;
        Ok(AdminQueue {
            sq,
            cq,
            next_cid: 0,
            pending: 0,
            entries,
        })
    }

    /// Back to the state after CC.EN 0→1: empty queues.
    pub(crate) fn restart(&mut self) {
        self.sq.restart();
        self.cq.restart();
        self.pending = 0;
    }

    /// Executes one admin command and waits for its completion. `data`, if
    /// given, is described by the transport (PRPs on PCIe).
    pub(crate) fn exec(
        &mut self,
        t: &T,
        sqe: Sqe,
        data: Option<&DmaBuffer>,
        timeout: Duration,
    ) -> Result<Cqe> {
        if self.pending + 1 >= self.entries as u32 {
            return Err(Error::Platform(format!(
                "admin queue holds {} commands that never completed; the controller needs a reset",
                self.pending
            )));
        }
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1);
        let pushed = match data {
            Some(d) => self
                .sq
                .push(cid, sqe, d.len(), d.iova_at(0), |i| d.iova_at(i)),
            None => self.sq.push(cid, sqe, 0, 0, |_| 0),
        };
        pushed.map_err(|e| Error::InvalidArgument(format!("admin command data: {e}")))?;
        self.sq.flush();
        self.pending += 1;

        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let mut got = Got(None);
            let n = self.cq.reap(1, &mut got);
            let got = got.0;
            if n > 0 {
                self.cq.release(n);
                self.pending = self.pending.saturating_sub(1);
            }
            if let Some(cqe) = got {
                if cqe.cid == cid {
                    return Ok(cqe);
                }
                // A late completion of an earlier command that timed out.
                tracing::debug!(cid = cqe.cid, status = %cqe.status(), "admin completion for another command");
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                check_csts(t.regs())?;
                if start.elapsed() >= timeout {
                    return Err(Error::Timeout {
                        what: "admin command",
                        ms: timeout.as_millis() as u64,
                    });
                }
            }
            t.relax();
        }
    }
}

/// Keeps the one completion an admin poll reaps.
struct Got(Option<Cqe>);

impl CqeSink for Got {
    fn cqe(&mut self, cid: u16, status: u16, dw0: u32) {
        self.0 = Some(Cqe {
            dw0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            status: status << 1,
        });
    }
}

/// Fails if the controller reports fatal status or has disappeared.
pub(crate) fn check_csts<R: Registers + ?Sized>(r: &R) -> Result<()> {
    let csts = regs::Csts(r.read32(regs::off::CSTS)?);
    if csts.is_dead() {
        return Err(Error::ControllerGone);
    }
    if csts.cfs() {
        return Err(Error::ControllerFatal);
    }
    Ok(())
}
