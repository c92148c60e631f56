//! The admin queue: the same rings as an I/O queue pair (the transport's
//! `SubmissionQueue`/`CompletionQueue`), driven one command at a time under
//! the controller's admin lock. The control path: clarity over speed. Every
//! wait is bounded and checks CSTS for a fatal or vanished controller.
use std::time::{Duration, Instant};

use pollux_spec::{regs, Cqe, Sqe};

use crate::dma::IoBuf;
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
    /// The CIDs of those commands. A CID is never reused while its command
    /// may still complete, and all are below the queue's depth (`entries -
    /// 1`), which the transport sizes its memory per command by (PCIe: a
    /// PRP list slice per CID).
    busy: Vec<bool>,
    /// Buffers of commands that timed out, kept until their completion
    /// arrives or the controller has been disabled: the controller may
    /// still transfer into them.
    parked: Vec<(u16, IoBuf)>,
}

impl<T: Transport> AdminQueue<T> {
    /// # Safety
    /// Once per controller (see `Transport::admin_queues`).
    pub(crate) unsafe fn new(t: &T, entries: u16) -> Result<Self> {
        // SAFETY: the caller makes one admin queue per controller.
        let (sq, cq) = unsafe { t.admin_queues(entries) }?;
        Ok(AdminQueue {
            sq,
            cq,
            next_cid: 0,
            pending: 0,
            entries,
            busy: vec![false; entries.saturating_sub(1).max(1) as usize],
            parked: Vec::new(),
        })
    }

    /// Back to the state after CC.EN 0→1: empty queues. The buffers of
    /// commands that timed out are freed here.
    ///
    /// # Safety
    /// Only once the controller has been disabled (CSTS.RDY=0) since the
    /// commands were sent.
    pub(crate) unsafe fn restart(&mut self) {
        // SAFETY: the controller has been disabled (the caller's promise):
        // it runs none of these queues' commands any more.
        unsafe {
            self.sq.restart();
            self.cq.restart();
        }
        self.pending = 0;
        self.busy.fill(false);
        self.parked.clear();
    }

    /// The controller has been disabled for good: nothing transfers into
    /// the parked buffers any more.
    pub(crate) fn release_parked(&mut self) {
        self.parked.clear();
    }

    /// Executes one admin command and waits for its completion. `data`, if
    /// given, is described by the transport (PRPs on PCIe) and comes back
    /// with the completion; if the command times out, the queue keeps it
    /// until the command completes or the controller is disabled.
    pub(crate) fn exec(
        &mut self,
        t: &T,
        sqe: Sqe,
        data: Option<IoBuf>,
        timeout: Duration,
    ) -> Result<(Cqe, Option<IoBuf>)> {
        if self.pending + 1 >= self.entries as u32 {
            return Err(Error::Platform(format!(
                "admin queue holds {} commands that never completed; the controller needs a reset",
                self.pending
            )));
        }
        // A free CID below the depth: one exists, since fewer than
        // `entries - 1` commands are pending.
        let depth = self.busy.len();
        let cid = (0..depth)
            .map(|i| (self.next_cid as usize + i) % depth)
            .find(|&c| !self.busy[c])
            .ok_or_else(|| Error::Platform("admin queue: no free command ID".into()))?
            as u16;
        self.next_cid = ((cid as usize + 1) % depth) as u16;
        // SAFETY: `cid` is below the depth and not outstanding (`busy`).
        // The data, if any, is `data`'s buffer, which this queue holds
        // until the command's completion is reaped (it goes back with it)
        // or, if the command times out, keeps (`parked`) until that
        // completion arrives or the controller has been disabled; the core
        // cleared a passthrough command's pointer fields and checked its
        // length (`Controller::admin`) or its caller promised it
        // (`admin_unchecked`); the core's own commands move only `data`.
        let pushed = unsafe {
            match &data {
                Some(b) => {
                    let d = b.dma_slice();
                    self.sq.push(cid, sqe, d.len(), d.iova0(), |i| d.iova_at(i))
                }
                None => self.sq.push(cid, sqe, 0, 0, |_| 0),
            }
        };
        pushed.map_err(|e| Error::InvalidArgument(format!("admin command data: {e}")))?;
        self.sq.flush();
        self.pending += 1;
        self.busy[cid as usize] = true;

        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let mut got = Got(None);
            let n = self.cq.reap(1, &mut got);
            let got = got.0;
            if n > 0 {
                self.cq.release(n);
            }
            if let Some(cqe) = got {
                if let Some(b) = self.busy.get_mut(cqe.cid as usize).filter(|b| **b) {
                    *b = false;
                    self.pending = self.pending.saturating_sub(1);
                }
                if cqe.cid == cid {
                    return Ok((cqe, data));
                }
                // A late completion of an earlier command that timed out:
                // its buffer is free now.
                tracing::debug!(cid = cqe.cid, status = %cqe.status(), "admin completion for another command");
                self.parked.retain(|(c, _)| *c != cqe.cid);
                continue;
            }
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                let r = check_csts(t.regs()).and_then(|()| {
                    if start.elapsed() >= timeout {
                        Err(Error::Timeout {
                            what: "admin command",
                            ms: timeout.as_millis() as u64,
                        })
                    } else {
                        Ok(())
                    }
                });
                if let Err(e) = r {
                    if let Some(b) = data {
                        self.parked.push((cid, b));
                    }
                    return Err(e);
                }
            }
            t.relax();
        }
    }
}

impl<T: Transport> Drop for AdminQueue<T> {
    /// Buffers still parked here may yet be written by a controller that
    /// was never disabled (a failed bring-up or shutdown): leaked, never
    /// freed.
    fn drop(&mut self) {
        if !self.parked.is_empty() {
            tracing::warn!(
                buffers = self.parked.len(),
                "admin buffers of timed-out commands leaked: the controller may still write them"
            );
            for (_, b) in self.parked.drain(..) {
                std::mem::forget(b);
            }
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
