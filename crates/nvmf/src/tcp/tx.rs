//! Send: response capsules, C2HData, C2HTermReq queued, and everything
//! queued flushed with one `sendmsg` per poll.
use pollux_nvme::Transport;
use pollux_runtime::ThreadCtx;
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    flags, C2HData, CapsuleResp, DataDigest, PduLayout, PduType, Role, TermReq, TERM_REQ_MAX_DATA,
};
use pollux_spec::Status;
use zerocopy::IntoBytes;

use crate::qpair::gen;
use crate::tcp::conn::{Conn, Fatal, St};
use crate::tcp::queue::Seg;
use crate::tcp::sock::{self, Wire};

impl<W: Wire, T: Transport> Conn<W, T> {
    /// Queues a response capsule; frees slot `slot` (if any) once sent.
    pub(crate) fn respond(
        &mut self,
        slot: Option<u16>,
        cid: u16,
        status: Status,
        dw0: u32,
        dw1: u32,
    ) {
        if self.terminated {
            if let Some(i) = slot {
                self.release(i);
            }
            return;
        }
        let r = CapsuleResp::new(self.cqe(cid, status, dw0, dw1), self.digests.header);
        if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
            self.tx.push_header(r.as_bytes(), &l);
        }
        if let Some(i) = slot {
            self.slots[i as usize].st = St::Tx;
            self.tx.push(Seg::Release { slot: i });
        }
    }

    /// Sends the first `len` bytes of slot `i`'s buffer as the command's
    /// data, then its successful completion (SUCCESS flag without SQ
    /// flow control, else a response capsule).
    pub(crate) fn send_data(&mut self, i: u16, len: u32) {
        if self.terminated {
            return self.release(i);
        }
        let success = self.flow_off;
        let cid = self.slots[i as usize].cid;
        let Some((h, l)) = C2HData::new(cid, 0, len, true, success, self.digests, self.hpda) else {
            return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let s = &mut self.slots[i as usize];
        let Some(b) = s.buf.take() else {
            return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
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
            let r = CapsuleResp::new(self.cqe(cid, Status::SUCCESS, 0, 0), self.digests.header);
            if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
                self.tx.push_header(r.as_bytes(), &l);
            }
        }
        self.tx.push(Seg::Release { slot: i });
        debug_assert!(h.ch.flags & flags::LAST_PDU != 0);
    }

    /// Queues a C2HTermReq for a protocol error and closes.
    pub(crate) fn fatal(&mut self, ctx: &mut ThreadCtx, f: Fatal, header: &[u8]) {
        tracing::warn!(peer = %self.peer, fes = %f.fes, fei = f.fei, "protocol error: {}; terminating the connection", f.why);
        let n = header.len().min(TERM_REQ_MAX_DATA as usize);
        let t = TermReq::new(Role::Controller, f.fes, f.fei, n);
        self.tx.push_bytes(t.as_bytes());
        self.tx.push_bytes(&header[..n]);
        self.terminated = true;
        self.begin_close(ctx, "protocol error");
    }

    pub(crate) fn flush(&mut self, ctx: &mut ThreadCtx) -> bool {
        let mut busy = false;
        let max_iov = self.shared.opts.send_iov.clamp(1, sock::MAX_IOV);
        loop {
            while let Some(Seg::Release { slot }) = self.tx.front() {
                self.tx.pop_front();
                self.release(slot);
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
            // the call returns) and into lent slot buffers (released only
            // once sent).
            let r = unsafe { self.sock.send_iov(&self.iov) };
            let sent = match r {
                Ok(0) => {
                    // (The data timeout closes a queue stalled too long.)
                    if self.tx_stalled_since.is_none() {
                        self.tx_stalled_since = Some(self.now);
                    }
                    break;
                }
                Ok(k) => {
                    self.tx_stalled_since = None;
                    k
                }
                Err(e) => {
                    self.close_now(ctx, &format!("send failed: {e}"));
                    return true;
                }
            };
            busy = true;
            self.advance(sent);
        }
        busy
    }

    /// `sent` bytes of the queue went out.
    pub(crate) fn advance(&mut self, mut sent: usize) {
        while sent > 0 {
            let Some(seg) = self.tx.front() else {
                break;
            };
            let len = match seg {
                Seg::Bytes { len, .. } | Seg::Data { len, .. } => len,
                Seg::Release { slot } => {
                    self.tx.pop_front();
                    self.release(slot);
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
