//! Send: what the core asks of the connection ([`QueueTransport`]:
//! response capsules, C2HData, R2T, close), queued in the engine's send
//! queue, C2HTermReq, and everything queued flushed with one `sendmsg`
//! per poll.
use pollux_runtime::ThreadCtx;
use pollux_spec::status::generic;
use pollux_spec::Cqe;
use pollux_tcp::engine::memory::Pointers;

use crate::qpair::{gen, Qpair, QueueTransport, St};
use crate::tcp::conn::{Fatal, Phase, Tcp};
use crate::tcp::sock::{self, Wire};

impl<W: Wire> QueueTransport for Tcp<W> {
    /// Queues a response capsule; frees slot `slot` (if any) once sent.
    #[inline]
    fn respond(&mut self, qp: &mut Qpair, slot: Option<u16>, cqe: &Cqe) {
        if self.terminated {
            if let Some(i) = slot {
                // SAFETY: nothing of the slot is queued (nothing is after
                // the TermReq; a slot whose data was queued before it has
                // its mark queued, and gets no other response).
                unsafe { qp.release(i) };
            }
            return;
        }
        if let Some(i) = slot {
            qp.slots[i as usize].st = St::Tx;
        }
        self.eng.respond(*cqe, slot);
    }

    /// Sends the first `len` bytes of slot `i`'s buffer as the command's
    /// data, then its successful completion (SUCCESS flag without SQ
    /// flow control, else a response capsule). (Inlined into the core's
    /// completion loop: the call with both halves of the connection cost
    /// more than its body.)
    #[inline(always)]
    fn send_data(&mut self, qp: &mut Qpair, i: u16, len: u32) {
        if self.terminated {
            // SAFETY: nothing of the slot is queued (as in `respond`).
            return unsafe { qp.release(i) };
        }
        let response = (!qp.flow_off)
            .then(|| qp.cqe(qp.slots[i as usize].cid, pollux_spec::Status::SUCCESS, 0, 0));
        let s = &mut qp.slots[i as usize];
        let Some(b) = s.buf.take() else {
            return qp.finish(self, i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let Some(data) = b.as_slice().get(..len as usize) else {
            s.buf = Some(b);
            return qp.finish(self, i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        // SAFETY: `data` is the slot's buffer, lent just below (its heap
        // memory does not move with it): nothing reads or writes it
        // through a slice, nor frees it, until it is reclaimed at its
        // mark (`release`, once every byte queued before the mark went
        // to a copying send), or the connection, this queue with it, is
        // dropped (then nothing is sent).
        let queued = unsafe { self.eng.send_data(s.cid, data, u32::MAX, response, i) };
        if !queued {
            s.buf = Some(b);
            return qp.finish(self, i, gen(generic::INTERNAL_ERROR), 0, 0);
        }
        let (lent, _) = b.lend(len as usize);
        s.lent = Some(lent);
        s.st = St::Tx;
    }

    /// Asks for slot `i`'s data with one R2T covering the whole transfer
    /// (its H2CData PDUs must then arrive in order, within it).
    #[inline]
    fn receive_data(&mut self, qp: &mut Qpair, i: u16) {
        let s = &qp.slots[i as usize];
        self.r2t_at[i as usize] = Some(qp.now);
        self.r2t_out += 1;
        self.eng.r2t(i, s.cid, s.xfer);
    }

    fn close(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, why: &str) {
        self.begin_close(ctx, qp, why);
    }

    #[inline]
    fn can_send(&self) -> bool {
        self.phase == Phase::Ready && !self.terminated
    }

    fn close_queue(ctx: &mut ThreadCtx, conn: u64) {
        crate::tcp::server::close_conn(ctx, conn);
    }

    fn queue_events(ctx: &mut ThreadCtx, conn: u64) {
        crate::tcp::server::events_conn(ctx, conn);
    }

    fn auth_done(ctx: &mut ThreadCtx, conn: u64, done: crate::auth::state::DhDone) {
        crate::tcp::server::auth_done_conn(ctx, conn, done);
    }
}

impl<W: Wire> Tcp<W> {
    /// Queues a C2HTermReq for a protocol error and closes.
    pub(crate) fn fatal(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, f: Fatal, header: &[u8]) {
        tracing::warn!(peer = %qp.peer, fes = %f.fes, fei = f.fei, "protocol error: {}; terminating the connection", f.why);
        self.eng.terminate(f.fes, f.fei, header);
        self.terminated = true;
        self.begin_close(ctx, qp, "protocol error");
    }

    /// A send that completed after the flush that queued it took what
    /// `r` says (a wire whose sends complete later, `Wire::sent`).
    #[cold]
    pub(crate) fn sent(
        &mut self,
        ctx: &mut ThreadCtx,
        qp: &mut Qpair,
        r: std::io::Result<usize>,
    ) -> bool {
        match r {
            Ok(0) => {
                if self.tx_stalled_since.is_none() {
                    self.tx_stalled_since = Some(qp.now);
                }
                false
            }
            Ok(k) => {
                self.tx_stalled_since = None;
                // SAFETY: the marks reached follow sent data: the send
                // completed, the kernel reads none of it any more.
                self.eng.tx.advance(k, |slot| unsafe { qp.release(slot) });
                true
            }
            Err(e) => {
                self.close_now(ctx, qp, &format!("send failed: {e}"));
                true
            }
        }
    }

    pub(crate) fn flush(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) -> bool {
        let mut busy = false;
        let max_iov = qp.shared.opts.send_iov.clamp(1, sock::MAX_IOV);
        loop {
            // The marks at the front: their slots' data is sent.
            // SAFETY: a slot's mark follows its data: all of it was
            // handed to the kernel by copying sends, which have returned.
            self.eng.tx.advance(0, |slot| unsafe { qp.release(slot) });
            if self.eng.tx.is_empty() {
                break;
            }
            // SAFETY: the queue's slot segments are lent slot buffers
            // (taken back only at their marks, or when the connection,
            // with this queue, is dropped); the iovecs are used before
            // the queue changes.
            unsafe { self.eng.tx.iovecs_raw(&Pointers, &mut self.iov, max_iov) };
            // SAFETY: the iovecs point into the send queue's own buffer
            // (not modified until the call returns) and into lent slot
            // buffers (as above).
            let r = unsafe { self.sock.send_iov(&self.iov) };
            let sent = match r {
                Ok(0) => {
                    // (The data timeout closes a queue stalled too long.)
                    if self.tx_stalled_since.is_none() {
                        self.tx_stalled_since = Some(qp.now);
                    }
                    break;
                }
                Ok(k) => {
                    self.tx_stalled_since = None;
                    k
                }
                Err(e) => {
                    self.close_now(ctx, qp, &format!("send failed: {e}"));
                    return true;
                }
            };
            busy = true;
            // SAFETY: as above: the marks reached follow sent data.
            self.eng
                .tx
                .advance(sent, |slot| unsafe { qp.release(slot) });
        }
        busy
    }
}
