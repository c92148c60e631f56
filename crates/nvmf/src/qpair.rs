//! The queue-level state of a connection, whatever its transport: command
//! slots and their data buffers (from the target's pool, or waiting for
//! it), completions, the submission queue head, Keep Alive, and leaving
//! the controller table.
use std::time::Duration;

use pollux_nvme::Transport;
use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::FABRICS_OPCODE;
use pollux_spec::status::generic;
use pollux_spec::{Cqe, Status};

use crate::buf::AlignedBuf;
use crate::pool;
use crate::shared::{teardown, SubsysId};
use crate::tcp::conn::{Bound, Conn, Phase, St};
use crate::tcp::sock::Wire;

/// Keep Alive Timeout of a discovery controller whose host asked for none
/// (KATO 0), so an idle one does not stay forever: Linux's nvmet's
/// `NVMET_DISC_KATO_MS`.
pub(crate) const DISCOVERY_KATO_MS: u32 = 120_000;
#[inline(always)]
pub(crate) fn gen(sc: u8) -> Status {
    Status::generic(sc)
}
impl<W: Wire, T: Transport> Conn<W, T> {
    pub(crate) fn give_back_data_slot(&mut self) {
        if std::mem::take(&mut self.data_slot) {
            crate::shared::DataSlot::give_back(&self.shared.data_conns);
        }
    }

    /// A data buffer of `len` bytes from the pool: `strict`, within the
    /// budget (and, while others wait, this connection's fair share);
    /// else charged in any case (in-capsule and admin data).
    #[inline]
    pub(crate) fn take_buf(&mut self, len: usize, strict: bool) -> Option<AlignedBuf> {
        let (k, cap) = pool::class(len);
        let pool = self.cache.pool();
        if strict && self.held > 0 && pool.pressed() && self.held + cap > pool.fair_share() {
            return None;
        }
        let mut b = self.cache.take(k, cap, strict)?;
        b.set_len(len);
        self.held += cap;
        if !self.pool_active {
            self.pool_active = true;
            pool.set_active(true);
        }
        Some(b)
    }

    /// Gives slot `i` a data buffer of `len` bytes: the page it kept (see
    /// `release`), or one from the pool (`take_buf`). False if none.
    #[inline]
    pub(crate) fn slot_buf(&mut self, i: u16, len: usize, strict: bool) -> bool {
        if let Some(b) = self.slots[i as usize].buf.as_mut() {
            if b.set_len(len) {
                return true;
            }
        }
        if let Some(b) = self.slots[i as usize].buf.take() {
            self.give_buf(b);
        }
        let mut b = self.take_buf(len, strict);
        if b.is_none() && strict && self.give_back_kept() {
            b = self.take_buf(len, strict);
        }
        match b {
            Some(b) => {
                self.slots[i as usize].buf = Some(b);
                true
            }
            None => false,
        }
    }

    /// Gives back the pages free slots keep; true if there were any.
    #[cold]
    pub(crate) fn give_back_kept(&mut self) -> bool {
        let mut any = false;
        for k in 0..self.slots.len() {
            if self.slots[k].st == St::Free {
                if let Some(b) = self.slots[k].buf.take() {
                    self.give_buf(b);
                    any = true;
                }
            }
        }
        any
    }

    /// Gives a data buffer back to the pool.
    #[inline]
    pub(crate) fn give_buf(&mut self, b: AlignedBuf) {
        self.held = self.held.saturating_sub(b.capacity());
        self.cache.give(b);
    }

    /// Slot `i` waits for a data buffer.
    #[cold]
    pub(crate) fn wait_buf(&mut self, i: u16) {
        self.slots[i as usize].st = St::WaitBuf;
        self.waiting.push_back(i);
        if !self.wait_counted {
            self.wait_counted = true;
            self.cache.pool().set_waiting(true);
        }
    }

    /// Gives the waiting slots their buffers, in order, while the pool
    /// has them; true if any got one.
    pub(crate) fn serve_waiting(&mut self) -> bool {
        let mut any = false;
        if self.phase == Phase::Ready && !self.terminated {
            while let Some(&i) = self.waiting.front() {
                let len = self.slots[i as usize].xfer as usize;
                if !self.slot_buf(i, len, true) {
                    break;
                }
                self.waiting.pop_front();
                self.transfer(i);
                any = true;
            }
        }
        if self.waiting.is_empty() && std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
        any
    }

    /// Closing: the waiting slots will not be served.
    pub(crate) fn abandon_waiting(&mut self) {
        self.waiting.clear();
        if std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
    }

    /// The Keep Alive Timeout of `kato_ms` on this queue's controller: a
    /// discovery controller has one even when the host asks for none.
    pub(crate) fn kato_for(&self, kato_ms: u32) -> Duration {
        let discovery = matches!(
            self.bound,
            Bound::Admin {
                subsys: SubsysId::Discovery,
                ..
            }
        );
        let ms = if discovery && kato_ms == 0 {
            DISCOVERY_KATO_MS
        } else {
            kato_ms
        };
        Duration::from_millis(ms as u64)
    }

    /// Leaves the controller table: an admin queue takes its controller
    /// (and that controller's I/O queues) down, an I/O queue leaves it.
    pub(crate) fn detach(&mut self, ctx: &mut ThreadCtx) {
        self.give_back_data_slot();
        self.abandon_waiting();
        match std::mem::replace(&mut self.bound, Bound::None) {
            Bound::None => {}
            Bound::Admin { cntlid, .. } => teardown(ctx, &self.shared, cntlid),
            Bound::Io { cntlid, qid } => {
                let mut t = self.shared.table();
                if let Some(e) = t.map.get_mut(&cntlid) {
                    e.io.retain(|(q, _)| *q != qid);
                }
            }
        }
    }

    /// Closed: reaps what the bdevs give back (nothing is sent; the slots'
    /// buffers go back when the connection is dropped).
    #[cold]
    pub(crate) fn settle(&mut self) -> bool {
        self.io
            .as_mut()
            .is_some_and(|q| q.outstanding() > 0 && q.poll(&mut |_, _| {}) > 0)
    }
    pub(crate) fn advance_sqhd(&mut self) {
        // (No division per command.)
        let next = self.sqhd.wrapping_add(1);
        self.sqhd = if next >= self.entries { 0 } else { next };
    }

    /// A command in slot `i` whose capsule (with `icd` bytes of data) is
    /// in.
    pub(crate) fn command(&mut self, ctx: &mut ThreadCtx, i: u16, icd: u32) {
        let s = &self.slots[i as usize];
        let sqe = s.sqe;
        if let Some(st) = s.err {
            return self.finish(i, st, 0, 0);
        }
        if sqe.opc == FABRICS_OPCODE {
            return self.fabrics(ctx, i, &sqe);
        }
        match self.bound {
            Bound::Admin { .. } => self.admin(ctx, i, &sqe, icd),
            Bound::Io { .. } => self.nvm(i, &sqe, icd),
            Bound::None => self.finish(i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0),
        }
    }

    // ------------------------------------------------------------------
    // Responses
    // ------------------------------------------------------------------

    pub(crate) fn cqe(&self, cid: u16, status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sqhd: self.sqhd,
            sqid: self.qid,
            cid,
            status: status.0 << 1,
        }
    }

    /// Completes slot `i`'s command with `status`.
    pub(crate) fn finish(&mut self, i: u16, status: Status, dw0: u32, dw1: u32) {
        let cid = self.slots[i as usize].cid;
        self.respond(Some(i), cid, status, dw0, dw1);
    }

    // ------------------------------------------------------------------
    // Send
    // ------------------------------------------------------------------

    #[inline]
    pub(crate) fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if let Some(l) = s.lent.take() {
            // SAFETY: every byte of the buffer queued for the socket was
            // handed to the kernel by a copying send, which has returned.
            s.buf = Some(unsafe { l.reclaim() });
        }
        s.st = St::Free;
        s.io = None;
        // The buffer goes back to the pool; only a page-sized one stays
        // with the slot for its next command (still counted in `held`,
        // and given back when others wait).
        let keep = s
            .buf
            .as_ref()
            .is_none_or(|b| b.capacity() == crate::buf::ALIGN && !self.cache.pool().pressed());
        if !keep {
            if let Some(b) = self.slots[i as usize].buf.take() {
                self.give_buf(b);
            }
        }
        self.free.push(i);
    }
}
