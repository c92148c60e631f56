//! The poller: submitting what was queued, reaping CQEs, finishing or
//! resubmitting slots, and waiting.

use std::mem::MaybeUninit;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, types};

use super::chan::{push, submit_failed, UringChan};
use super::options::{CANCEL_UD, REAP_BATCH};
use super::slot::{Op, Slot};
use crate::data::Completion;
use crate::error::{IoError, Result};

#[inline(never)]
fn yield_core() {
    // SAFETY: sched_yield takes no arguments and cannot fail in a way
    // that matters here.
    unsafe { libc::sched_yield() };
}

impl UringChan {
    /// Submits what was queued: one `io_uring_enter` (none with SQPOLL
    /// while its thread is awake); with IOPOLL it also polls the device
    /// for completions while requests are in flight.
    #[inline(always)]
    pub fn kick(&mut self) {
        if self.queued
            || (self.iopoll && self.inflight > 0)
            || (self.coop && self.inflight > 0 && self.ring.submission().taskrun())
        {
            self.queued = false;
            if let Err(e) = self.ring.submit() {
                self.queued = true;
                submit_failed(e);
            } else if !self.sqpoll && !self.ring.submission().is_empty() {
                self.queued = true;
            }
        }
        if self.side_queued {
            if let Some(r) = &mut self.side {
                self.side_queued = false;
                if let Err(e) = r.submit() {
                    self.side_queued = true;
                    submit_failed(e);
                }
            }
        }
    }

    /// Copies up to `out.len()` CQEs of the polled ring (`side`: of the
    /// iopoll side ring) out, freeing their ring space.
    #[inline(always)]
    pub fn reap<'a>(
        &mut self,
        side: bool,
        out: &'a mut [MaybeUninit<cqueue::Entry>],
    ) -> &'a [cqueue::Entry] {
        let ring = if side {
            match &mut self.side {
                Some(r) => r,
                None => return &[],
            }
        } else {
            &mut self.ring
        };
        ring.completion().fill(out)
    }

    /// A poll found `n` completions. After `yield_after` empty polls in a
    /// row with requests in flight, yields the core (see
    /// `UringOptions::yield_after`).
    #[inline(always)]
    pub fn polled(&mut self, n: u32) {
        if n > 0 || self.inflight == 0 || self.yield_after == 0 {
            self.empty_polls = 0;
            return;
        }
        self.empty_polls += 1;
        if self.empty_polls == self.yield_after {
            self.empty_polls = 0;
            yield_core();
        }
    }

    pub fn has_side(&self) -> bool {
        self.side.is_some()
    }

    /// A CQE: the completion to deliver, or None (not a request's, or its
    /// request goes on with another SQE).
    #[inline(always)]
    pub fn on_cqe(&mut self, e: &cqueue::Entry) -> Option<Completion> {
        let i = e.user_data() as usize;
        let res = e.result();
        let s = self.slots.get(i)?;
        if !s.busy {
            return None;
        }
        let result = if res >= 0 && res as u64 == s.left && matches!(s.op, Op::Read | Op::Write) {
            Ok(0)
        } else {
            self.step(i, res)?
        };
        Some(self.finish(i, result))
    }

    /// Frees slot `i` and makes its completion.
    #[inline(always)]
    pub(super) fn finish(&mut self, i: usize, mut result: Result<u32, IoError>) -> Completion {
        let s = &mut self.slots[i];
        s.busy = false;
        let data = std::mem::take(&mut s.data);
        let user_data = s.ud;
        self.free.push(i as u32);
        self.inflight -= 1;
        if self.shared.failed.load(Ordering::Relaxed) {
            result = Err(IoError::Failed);
        }
        Completion {
            user_data,
            result,
            data,
        }
    }

    /// Anything but a full transfer: the request's result, or None if it
    /// goes on (remainder of a short transfer, a zeroing fallback).
    #[cold]
    #[inline(never)]
    pub(super) fn step(&mut self, i: usize, res: i32) -> Option<Result<u32, IoError>> {
        let s = &mut self.slots[i];
        if s.sync_first {
            // A FUA read's fdatasync is done: now the read.
            if res < 0 {
                return Some(Err(IoError::os(-res)));
            }
            s.sync_first = false;
            return self.reissue(i);
        }
        let short = |s: &Slot| {
            tracing::warn!(
                expected = s.total,
                got = s.total - s.left,
                "transfer ended early (the file shrank?): failing it with ENODATA"
            );
            IoError::os(libc::ENODATA)
        };
        match s.op {
            Op::Zero | Op::Punch if res == -libc::EOPNOTSUPP => {
                if s.op == Op::Punch {
                    tracing::debug!(path = %self.shared.path.display(), "PUNCH_HOLE refused; unmap zeroes instead");
                    self.punch = false;
                } else {
                    tracing::debug!(path = %self.shared.path.display(), "ZERO_RANGE refused; writing zeroes instead");
                    self.zero_range = false;
                }
                let op = self.zero_op();
                self.slots[i].op = op;
                return self.reissue(i);
            }
            _ if res < 0 => return Some(Err(IoError::os(-res))),
            Op::Flush | Op::Drain | Op::Zero | Op::Punch => return Some(Ok(0)),
            Op::Read | Op::Write | Op::ZeroWrite => {}
        }
        let n = res as u64;
        if n == 0 {
            return Some(Err(short(s)));
        }
        if n >= s.left {
            return Some(Ok(0));
        }
        if s.op == Op::ZeroWrite {
            s.off += n;
            s.left -= n;
        } else {
            s.advance(n);
        }
        self.reissue(i)
    }

    pub(super) fn reissue(&mut self, i: usize) -> Option<Result<u32, IoError>> {
        if self.issue(i) {
            None
        } else {
            Some(Err(IoError::os(libc::EBUSY)))
        }
    }

    /// Waits up to `timeout` for a completion (submitting what is queued).
    pub fn wait(&mut self, timeout: Duration) {
        if self.inflight == 0 {
            return;
        }
        if self.side_queued || self.side.is_some() {
            self.kick();
        }
        self.queued = false;
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        let r = if self.ring.params().is_feature_ext_arg() {
            self.ring.submitter().submit_with_args(1, &args)
        } else {
            // Before Linux 5.11: no timeout; some request is in flight,
            // so a completion comes.
            self.ring.submit_and_wait(1)
        };
        match r {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            Err(e) => {
                self.queued = true;
                submit_failed(e);
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Drop: the request of a CQE is over; free its slot.
    pub(super) fn forget(&mut self, e: &cqueue::Entry) {
        let i = e.user_data() as usize;
        if let Some(s) = self.slots.get_mut(i) {
            if s.busy {
                s.busy = false;
                drop(std::mem::take(&mut s.data));
                self.free.push(i as u32);
                self.inflight -= 1;
            }
        }
    }
}

impl Drop for UringChan {
    fn drop(&mut self) {
        if self.inflight == 0 {
            return;
        }
        tracing::debug!(
            n = self.inflight,
            "io_uring channel dropped with requests in flight: cancelling and waiting for the kernel"
        );
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_UD);
        push(&mut self.ring, &cancel);
        self.queued = true;
        if let Some(r) = &mut self.side {
            push(r, &cancel);
            self.side_queued = true;
        }
        let t0 = Instant::now();
        let mut warned = t0;
        let mut buf = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        while self.inflight > 0 {
            self.kick();
            self.wait(Duration::from_millis(10));
            for side in [false, true] {
                loop {
                    let got = self.reap(side, &mut buf);
                    if got.is_empty() {
                        break;
                    }
                    for e in got.iter() {
                        self.forget(e);
                    }
                }
            }
            if warned.elapsed() >= Duration::from_secs(5) {
                warned = Instant::now();
                tracing::warn!(
                    n = self.inflight,
                    waited_s = t0.elapsed().as_secs(),
                    "still waiting for the kernel to finish requests of a dropped io_uring channel"
                );
            }
        }
    }
}
