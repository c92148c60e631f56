//! NVM I/O commands: the SGL checks, a data buffer from the pool (or a
//! wait for one), the data asked for (writes), submission to the I/O
//! queue and its completions.
use pollux_spec::fabrics::Sgl;
use pollux_spec::status::generic;
use pollux_spec::{Sqe, Status};

use crate::model;
use crate::qpair::{gen, Qpair, QueueTransport, St};

impl Qpair {
    /// The SGL of a command moving `want` bytes; `to_host`: its data goes
    /// to the host. In-capsule data (`icd` bytes) is only for writes.
    pub(crate) fn data_sgl(sqe: &Sqe, want: u32, to_host: bool, icd: u32) -> Result<Sgl, Status> {
        let sgl = Sgl::from_sqe(sqe).map_err(|e| e.status())?;
        match sgl {
            Sgl::InCapsule { .. } if to_host => Err(gen(generic::INVALID_FIELD)),
            Sgl::InCapsule { offset, .. } if offset != 0 => Err(gen(generic::SGL_OFFSET_INVALID)),
            Sgl::InCapsule { len, .. } if len < want || len > icd => {
                Err(gen(generic::DATA_SGL_LENGTH_INVALID))
            }
            Sgl::Transport { len } if len < want => Err(gen(generic::DATA_SGL_LENGTH_INVALID)),
            Sgl::Address { .. } => Err(gen(generic::SGL_TYPE_INVALID)),
            ok => Ok(ok),
        }
    }

    pub(crate) fn nvm<X: QueueTransport>(&mut self, x: &mut X, i: u16, sqe: &Sqe, icd: u32) {
        let Some(q) = self.io.as_ref() else {
            // (An I/O queue not authenticated yet keeps its `io` aside.)
            let st = self.refusal_before_auth();
            return self.finish(x, i, st, 0, 0);
        };
        let cmd = match q.check(sqe) {
            Ok(c) => c,
            Err(st) => return self.finish(x, i, st, 0, 0),
        };
        let xfer = model::io_xfer_len(&cmd) as u32;
        let to_host = model::io_to_host(&cmd);
        let s = &mut self.slots[i as usize];
        s.io = Some(cmd);
        s.xfer = xfer;
        if xfer == 0 {
            return self.submit(x, i, None);
        }
        let sgl = match Self::data_sgl(sqe, xfer, to_host, self.icd_max.min(icd)) {
            Ok(s) => s,
            Err(st) => return self.finish(x, i, st, 0, 0),
        };
        match sgl {
            Sgl::InCapsule { .. } => {
                // The data is in the slot's buffer already.
                if let Some(b) = s.buf.as_mut() {
                    b.set_len(xfer as usize);
                }
                self.submit(x, i, Some(xfer));
            }
            Sgl::Transport { .. } => {
                // A buffer from the pool, or wait for one (after those
                // already waiting).
                if !self.waiting.is_empty() || !self.slot_buf(i, xfer as usize, true) {
                    self.wait_buf(i);
                } else if to_host {
                    self.submit(x, i, Some(xfer));
                } else {
                    self.transfer(x, i);
                }
            }
            Sgl::Address { .. } => self.finish(x, i, gen(generic::SGL_TYPE_INVALID), 0, 0),
        }
    }

    /// Slot `i` has its data buffer: a read goes to the bdev, a write
    /// gets its data from the host (R2T, for TCP).
    pub(crate) fn transfer<X: QueueTransport>(&mut self, x: &mut X, i: u16) {
        let s = &mut self.slots[i as usize];
        let xfer = s.xfer;
        if s.io.is_some_and(|c| model::io_to_host(&c)) {
            return self.submit(x, i, Some(xfer));
        }
        s.st = St::AwaitData;
        x.receive_data(self, i);
    }

    /// All the data of slot `i`'s write is in (`err`: a transport error
    /// seen on the way, the command's status then).
    pub(crate) fn data_in<X: QueueTransport>(&mut self, x: &mut X, i: u16) {
        let s = &self.slots[i as usize];
        if let Some(st) = s.err {
            return self.finish(x, i, st, 0, 0);
        }
        let xfer = s.xfer;
        self.submit(x, i, Some(xfer));
    }

    /// Hands slot `i`'s command (with its first `len` buffer bytes as
    /// data) to the I/O queue.
    pub(crate) fn submit<X: QueueTransport>(&mut self, x: &mut X, i: u16, len: Option<u32>) {
        let (Some(q), Some(s)) = (self.io.as_mut(), self.slots.get_mut(i as usize)) else {
            return self.data_in_other(x, i);
        };
        let Some(cmd) = s.io else {
            return self.data_in_other(x, i);
        };
        let seg = match len {
            Some(n) => match s.buf.take() {
                Some(b) => {
                    let (lent, seg) = b.lend(n as usize);
                    s.lent = Some(lent);
                    Some(seg)
                }
                None => return self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0),
            },
            None => None,
        };
        s.st = St::Bdev;
        // SAFETY: the segment is the slot's buffer, now `Lent`: nothing
        // touches it until `poll` delivers tag `i` (then it is reclaimed)
        // or the queue is dropped (first, in `Drop for Qpair`).
        let r = unsafe { q.submit(i as u32, &cmd, seg) };
        if r.is_err() {
            // Refused before it started: the buffer is ours again.
            if let Some(l) = s.lent.take() {
                // SAFETY: the queue refused the command: it never saw the
                // segment.
                s.buf = Some(unsafe { l.reclaim() });
            }
            self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0);
        }
    }

    /// Reaps the I/O queue's completions: a read's data goes to the host,
    /// the others complete; true if there were any.
    pub(crate) fn poll_io<X: QueueTransport>(&mut self, x: &mut X) -> bool {
        let Some(q) = self.io.as_mut() else {
            return false;
        };
        let mut done = std::mem::take(&mut self.done);
        let n = q.poll(&mut |tag, st| done.push((tag, st)));
        if n > 0 {
            q.publish();
        }
        for &(tag, st) in &done {
            let i = tag as u16;
            let Some(s) = self.slots.get_mut(i as usize) else {
                continue;
            };
            if let Some(l) = s.lent.take() {
                // SAFETY: the I/O queue delivered this tag: the bdev is
                // done with the buffer.
                s.buf = Some(unsafe { l.reclaim() });
            }
            let read = s.io.is_some_and(|c| model::io_to_host(&c));
            if st.is_success() && read && s.xfer > 0 {
                let len = s.xfer;
                x.send_data(self, i, len);
            } else {
                self.finish(x, i, st, 0, 0);
            }
        }
        done.clear();
        self.done = done;
        n > 0
    }
}
