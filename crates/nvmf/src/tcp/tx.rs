//! Send: what the core asks of the connection ([`QueueTransport`]:
//! response capsules, C2HData, R2T, close), C2HTermReq, and everything
//! queued flushed with one `sendmsg` per poll.
use pollux_runtime::ThreadCtx;
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    flags, C2HData, CapsuleResp, DataDigest, PduLayout, PduType, Role, TermReq, R2T,
    TERM_REQ_MAX_DATA,
};
use pollux_spec::{Cqe, Status};
use zerocopy::IntoBytes;

use crate::qpair::{gen, Qpair, QueueTransport, St};
use crate::tcp::conn::{Fatal, H2c, Phase, Tcp};
use crate::tcp::queue::Seg;
use crate::tcp::sock::{self, Wire};

impl<W: Wire> QueueTransport for Tcp<W> {
    /// Queues a response capsule; frees slot `slot` (if any) once sent.
    #[inline]
    fn respond(&mut self, qp: &mut Qpair, slot: Option<u16>, cqe: &Cqe) {
        if self.terminated {
            if let Some(i) = slot {
                // SAFETY: nothing of the slot is queued (nothing is after
                // the TermReq; a slot whose data was queued before it has
                // its Release queued, and gets no other response).
                unsafe { qp.release(i) };
            }
            return;
        }
        let r = CapsuleResp::new(*cqe, self.digests.header);
        if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
            self.tx.push_header(r.as_bytes(), &l);
        }
        if let Some(i) = slot {
            qp.slots[i as usize].st = St::Tx;
            self.tx.push(Seg::Release { slot: i });
        }
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
        let success = qp.flow_off;
        let cid = qp.slots[i as usize].cid;
        let Some((h, l)) = C2HData::new(cid, 0, len, true, success, self.digests, self.hpda) else {
            return qp.finish(self, i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let s = &mut qp.slots[i as usize];
        let Some(b) = s.buf.take() else {
            return qp.finish(self, i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let dd = l.ddgst.then(|| {
            let mut d = DataDigest::new();
            d.update(&b.as_slice()[..len as usize]);
            d.value()
        });
        let (lent, seg) = b.lend(len as usize);
        s.lent = Some(lent);
        s.st = St::Tx;
        self.tx.push_header(h.as_bytes(), &l);
        self.tx.push(Seg::Data {
            ptr: seg.ptr,
            len: seg.len,
        });
        if let Some(d) = dd {
            self.tx.push_bytes(&d.to_le_bytes());
        }
        if !success {
            let r = CapsuleResp::new(qp.cqe(cid, Status::SUCCESS, 0, 0), self.digests.header);
            if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
                self.tx.push_header(r.as_bytes(), &l);
            }
        }
        self.tx.push(Seg::Release { slot: i });
        debug_assert!(h.ch.flags & flags::LAST_PDU != 0);
    }

    /// Asks for slot `i`'s data with one R2T covering the whole transfer
    /// (its H2CData PDUs must then arrive in order, within it).
    #[inline]
    fn receive_data(&mut self, qp: &mut Qpair, i: u16) {
        let s = &qp.slots[i as usize];
        self.h2c[i as usize] = H2c {
            got: 0,
            r2t_at: Some(qp.now),
        };
        self.r2t_out += 1;
        let r = R2T::new(s.cid, i, 0, s.xfer, self.digests.header);
        let l = PduLayout::new(PduType::R2T, self.digests, 0, 0);
        if let Some(l) = l {
            self.tx.push_header(r.as_bytes(), &l);
        }
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
}

impl<W: Wire> Tcp<W> {
    /// Queues a C2HTermReq for a protocol error and closes.
    pub(crate) fn fatal(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, f: Fatal, header: &[u8]) {
        tracing::warn!(peer = %qp.peer, fes = %f.fes, fei = f.fei, "protocol error: {}; terminating the connection", f.why);
        let n = header.len().min(TERM_REQ_MAX_DATA as usize);
        let t = TermReq::new(Role::Controller, f.fes, f.fei, n);
        self.tx.push_bytes(t.as_bytes());
        self.tx.push_bytes(&header[..n]);
        self.terminated = true;
        self.begin_close(ctx, qp, "protocol error");
    }

    pub(crate) fn flush(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) -> bool {
        let mut busy = false;
        let max_iov = qp.shared.opts.send_iov.clamp(1, sock::MAX_IOV);
        loop {
            while let Some(Seg::Release { slot }) = self.tx.front() {
                self.tx.pop_front();
                // SAFETY: the slot's Release segment follows its data: all
                // of it was handed to the kernel by copying sends, which
                // have returned.
                unsafe { qp.release(slot) };
            }
            if self.tx.is_empty() {
                self.tx.bytes.clear();
                self.tx.front = 0;
                break;
            }
            self.iov.clear();
            for (k, seg) in self.tx.pending().iter().enumerate() {
                let skip = if k == 0 { self.tx.front } else { 0 };
                match *seg {
                    Seg::Bytes { start, len } => {
                        self.iov.push(libc::iovec {
                            iov_base: self.tx.bytes[start + skip..].as_ptr() as *mut _,
                            iov_len: len - skip,
                        });
                    }
                    Seg::Data { ptr, len, .. } => {
                        // SAFETY: `ptr` starts a lent slot buffer of at
                        // least `len` bytes, and `skip <= len`.
                        let base = unsafe { ptr.add(skip) };
                        self.iov.push(libc::iovec {
                            iov_base: base as *mut _,
                            iov_len: len - skip,
                        });
                    }
                    Seg::Release { .. } => {}
                }
                if self.iov.len() == max_iov {
                    break;
                }
            }
            // SAFETY: the iovecs point into `tx.bytes` (not modified until
            // the call returns) and into lent slot buffers (taken back
            // only once sent, or when the connection, with this queue, is
            // dropped).
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
            self.advance(qp, sent);
        }
        busy
    }

    /// `sent` bytes of the queue went out.
    fn advance(&mut self, qp: &mut Qpair, mut sent: usize) {
        while sent > 0 {
            let Some(seg) = self.tx.front() else {
                break;
            };
            let len = match seg {
                Seg::Bytes { len, .. } | Seg::Data { len, .. } => len,
                Seg::Release { slot } => {
                    self.tx.pop_front();
                    // SAFETY: as in `flush`: the data before it is sent.
                    unsafe { qp.release(slot) };
                    continue;
                }
            };
            let left = len - self.tx.front;
            if sent >= left {
                sent -= left;
                self.tx.front = 0;
                self.tx.pop_front();
            } else {
                self.tx.front += sent;
                sent = 0;
            }
        }
    }
}
