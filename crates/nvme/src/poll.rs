//! The poll path: reap completions, hand each to the user's handler
//! through one indexed load (`trackers[cid]`), then release CQ entries,
//! issue waiting requests and tell the controller about new commands —
//! Linux's `nvme_poll_cq`, transport-free. Also recovery after a
//! controller reset, which is driven from the poll.
use std::sync::atomic::Ordering;

use pollux_spec::Status;

use crate::completion::Completion;
use crate::dma::IoBuf;
use crate::error::IoError;
use crate::qpair::QueuePair;
use crate::submit::{Core, Handler, QpState, Submitter, T_BUSY, T_CHILD, T_TIMED_OUT};
use crate::transport::{CompletionQueue, CqeSink, SubmissionQueue, Transport};

#[inline(always)]
fn prefetch<P>(p: *const P) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl<T: Transport> QueuePair<T> {
    /// Processes up to `max` completions, calling `f` for each finished
    /// request (a split request finishes once). `f` may submit new requests
    /// through the `Submitter` it is given. Then submits waiting requests,
    /// tells the controller about new commands once, and releases CQ
    /// entries if needed. Returns the number of completions consumed.
    #[inline(always)]
    pub fn poll<F: FnMut(&mut Submitter<'_, T>, Completion)>(&mut self, max: u32, mut f: F) -> u32 {
        self.poll_with(max, &mut f)
    }

    /// `poll` with a borrowed handler (e.g. a struct implementing `Handler`
    /// that lives on across polls).
    #[inline(always)]
    pub fn poll_with<F: Handler<T>>(&mut self, max: u32, f: &mut F) -> u32 {
        if self.shared.generation.load(Ordering::Relaxed) != self.generation {
            self.recover(f);
        }
        if !self.core.deferred.is_empty() {
            self.deliver_deferred(f);
        }
        let n = self.reap(max, f);
        self.finish_poll(n);
        n
    }

    #[cold]
    fn deliver_deferred<F: Handler<T>>(&mut self, f: &mut F) {
        let d = std::mem::take(&mut self.core.deferred);
        let mut sub = self.submitter();
        for c in d {
            f.complete(&mut sub.reborrow(), c);
        }
    }

    /// The completion loop.
    #[inline(always)]
    fn reap<F: Handler<T>>(&mut self, max: u32, f: &mut F) -> u32 {
        let mut sink = Sink {
            sub: Submitter {
                core: &mut self.core,
                sq: &mut self.sq,
                _invariant: std::marker::PhantomData,
            },
            f,
        };
        let n = self.cq.reap(max, &mut sink);
        self.core.return_spare();
        self.core.stats.completed += n as u64;
        n
    }

    /// Doorbells and queued work at the end of a poll.
    #[inline(always)]
    fn finish_poll(&mut self, n: u32) {
        self.core.stats.polls += 1;
        if n > 0 {
            self.cq.release(n);
        }
        if !self.core.queue.is_empty() {
            self.submitter().drain_queue();
        }
        self.sq.publish(self.core.outstanding());
        if self.timeout.is_some() && self.core.stats.polls & 4095 == 0 {
            self.tick();
        }
        if n == 0 && self.cq.broken() {
            self.transport_broken();
        }
    }

    /// The transport says this queue's connection is gone: reset the
    /// controller (the recovery on the next poll fails what was
    /// outstanding and re-creates the queues). Not once the queue pair has
    /// failed for good: there is nothing left to recover.
    #[cold]
    fn transport_broken(&mut self) {
        if self.core.state == QpState::Failed {
            return;
        }
        if self.shared.generation.load(Ordering::Acquire) != self.generation {
            return; // a reset is under way: `recover` waits for it
        }
        let warn = || {
            tracing::warn!(
                qid = self.qid,
                transport = %self.shared.transport.describe(),
                "queue's connection is broken; resetting the controller"
            )
        };
        if self.shared.transport.reconnects() {
            if self.shared.reset_in_background(self.generation) {
                warn();
            }
            return;
        }
        warn();
        if let Err(e) = self.shared.reset(self.generation) {
            tracing::error!(qid = self.qid, "controller reset failed: {e}");
        }
    }

    /// The controller was reset (by this or another queue pair). In order:
    /// requests wait in the backlog from now on (so a handler that
    /// resubmits cannot write into queues about to be re-created);
    /// completions the controller posted before the reset are delivered as
    /// they are; every command still outstanding fails with
    /// `ControllerReset` exactly once (unless the transport `reconnects`:
    /// then it stays outstanding and the re-created queues carry it again,
    /// or it fails with `FastFail` if the transport says so while the reset
    /// runs); the queues are re-created under the admin lock, only if no
    /// further reset began meanwhile and the lock is free (else this
    /// repeats on the next poll: a poll never waits for a reset); then the
    /// backlog is issued.
    #[cold]
    pub(crate) fn recover<F: Handler<T>>(&mut self, f: &mut F) {
        if self.core.state != QpState::Failed {
            self.core.set_state(QpState::Resetting);
        }
        // Completions posted before the reset.
        if self.core.outstanding() > 0 {
            let n = self.reap(u32::MAX, f);
            if n > 0 {
                tracing::debug!(qid = self.qid, n, "completions reaped after reset");
            }
        }
        let g = self.shared.generation.load(Ordering::Acquire);
        if g & 1 == 1 {
            // Reset in progress elsewhere: wait until it ends (or, if the
            // transport says the I/O held meanwhile has waited too long,
            // fail it now).
            if self.shared.transport.fail_held_io() {
                self.fail_held(f);
            }
            return;
        }
        if self.shared.failed.load(Ordering::Acquire) {
            // What is outstanding fails with `ControllerFailed` there,
            // after the transport forgot it.
            self.core.stats.resets_seen += 1;
            self.generation = g;
            self.fail_for_good(f);
            return;
        }
        let retry = self.shared.transport.reconnects();
        if self.core.outstanding() > 0 && !retry {
            fail_outstanding(&mut self.submitter(), IoError::ControllerReset, f);
        }
        if !retry {
            // SAFETY: the reset disabled the controller (generation `g` is
            // even and the controller not failed) after these commands
            // were sent; their trackers were just failed and emptied.
            unsafe {
                self.sq.restart();
                self.cq.restart();
            }
        }
        let qid = self.qid;
        let (sq, cq) = (&mut self.sq, &mut self.cq);
        let r = {
            let Some(mut st) = self.shared.try_lock_admin() else {
                return; // busy (perhaps a new reset): next poll
            };
            if self.shared.generation.load(Ordering::Acquire) != g {
                // Another reset began: try again once it is over.
                return;
            }
            let t = &self.shared.transport;
            // SAFETY: after the reset of generation `g` (the controller
            // was disabled, or the association ended, since the queues
            // ran), under the admin lock with no newer reset begun; `sq`
            // and `cq` are this queue pair's halves of `qid`, restarted
            // above, or (a transport that reconnects) holding the commands
            // whose buffers the trackers still keep.
            self.shared.with_admin(&mut st, |exec| unsafe {
                t.recreate_io_queues(exec, qid, sq, cq)
            })
        };
        match r {
            Ok(()) => {
                tracing::info!(qid, "queue pair re-created after controller reset");
                self.core.stats.resets_seen += 1;
                self.generation = g;
                if retry {
                    // Sent again just now: their timeout starts over.
                    let epoch = self.core.epoch;
                    for t in self.core.trackers.iter_mut() {
                        t.epoch = epoch;
                    }
                }
                self.core.set_state(QpState::Ready);
                if !self.core.queue.is_empty() {
                    self.submitter().drain_queue();
                }
                self.sq.flush();
            }
            Err(e) => {
                tracing::error!(qid, "re-creating queues after reset failed: {e}");
                self.core.stats.resets_seen += 1;
                self.generation = g;
                self.fail_for_good(f);
            }
        }
    }

    /// The controller is gone for good: everything waiting fails with
    /// `ControllerFailed`, and so does everything submitted from now on.
    #[cold]
    fn fail_for_good<F: Handler<T>>(&mut self, f: &mut F) {
        self.core.set_state(QpState::Failed);
        // The transport forgets every command before their buffers are
        // handed back: a fabrics transport would otherwise still copy late
        // data into them (the reset path restarts the halves too).
        if self.shared.unstopped.load(Ordering::Acquire) {
            // It may still run this queue's commands: their memory is not
            // handed back, and the halves stay as they are (a restart
            // would zero the shadow SQ tail, and a controller still
            // running would fetch its ring again). A failed queue pair
            // submits nothing more; completions it still posts are bogus.
            self.withhold_buffers();
        } else {
            // SAFETY: the controller has failed for good: a reset failed
            // after disabling it (or the association could not be made
            // again, which on fabrics ends every transfer once the halves
            // restart), so it runs no more commands of this queue.
            unsafe {
                self.sq.restart();
                self.cq.restart();
            }
        }
        let mut sub = self.submitter();
        let held = sub.core.queue.len();
        fail_outstanding(&mut sub, IoError::ControllerFailed, f);
        fail_queued(&mut sub, held, IoError::ControllerFailed, f);
        sub.core.fast = false;
    }

    /// The controller failed without confirming it stopped: it may still
    /// transfer into the buffers of the commands outstanding, so they are
    /// taken from their trackers (and split requests) and dropped instead
    /// of going back with the completions. Dropping gives the memory to
    /// the platform, which unmaps it from the device's IOMMU before
    /// freeing it (VFIO, the emulated controller) or, without an IOMMU
    /// (UIO), keeps it until the device can no longer reach it (bus
    /// mastering off), never handing it out again meanwhile (see
    /// `DmaRelease`).
    #[cold]
    fn withhold_buffers(&mut self) {
        let core = &mut self.core;
        let (mut n, mut bytes) = (0u64, 0u64);
        for cid in 0..core.trackers.len() {
            let t = &mut core.trackers[cid];
            if t.flags & T_BUSY == 0 {
                continue;
            }
            let b = if t.flags & T_CHILD != 0 {
                let idx = t.user_data as usize;
                core.splits.get_mut(idx).and_then(|s| s.buf.take())
            } else {
                t.buf.take()
            };
            if let Some(b) = b {
                n += 1;
                bytes += b.len() as u64;
                drop(b);
            }
        }
        if n > 0 {
            core.stats.withheld_buffers += n;
            core.stats.withheld_bytes += bytes;
            tracing::warn!(
                qid = self.qid,
                buffers = n,
                bytes,
                transport = %self.shared.transport.describe(),
                "controller failed without confirming it stopped: the buffers of its \
                 outstanding commands are not handed back (their completions carry none); \
                 the platform unmaps them from the device's IOMMU, or keeps them until the \
                 device can no longer reach them"
            );
        }
    }

    /// The transport's fast-fail time passed while a reset reconnects:
    /// what is outstanding and what waits in the backlog fails with
    /// `FastFail` (the transport forgets the commands first, as for a
    /// failed controller). Requests submitted from now on wait in the
    /// backlog and fail on the next poll, until the reset ends.
    #[cold]
    fn fail_held<F: Handler<T>>(&mut self, f: &mut F) {
        if self.core.outstanding() == 0 && self.core.queue.is_empty() {
            return;
        }
        // Logged once by the transport; here for every batch.
        tracing::debug!(
            qid = self.qid,
            outstanding = self.core.outstanding(),
            queued = self.core.queue.len(),
            "fast-fail time passed while reconnecting: failing the I/O held"
        );
        // SAFETY: only a transport that reconnects asks for this, while a
        // reset is reconnecting: the association these commands went out
        // on has ended, and restarting a fabrics queue closes its
        // connection, so nothing transfers for them any more.
        unsafe {
            self.sq.restart();
            self.cq.restart();
        }
        let mut sub = self.submitter();
        let held = sub.core.queue.len();
        if sub.core.outstanding() > 0 {
            fail_outstanding(&mut sub, IoError::FastFail, f);
        }
        fail_queued(&mut sub, held, IoError::FastFail, f);
    }
}

/// The first `held` requests waiting in the backlog fail with `err` (a
/// split request whose issued pieces were failed already completes with
/// it): those that waited before the failing began. What the handler
/// submits again from these completions, or from those of the outstanding
/// commands failed just before, waits for the next poll, which must return
/// meanwhile (a handler that resubmits each failure would otherwise refill
/// the backlog as fast as this empties it, and the poll would never end).
fn fail_queued<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    held: usize,
    err: IoError,
    f: &mut F,
) {
    for _ in 0..held {
        let Some(p) = sub.core.queue.pop_front() else {
            break;
        };
        let split = match &p.op {
            crate::submit::PendingOp::Rw(rw) => rw.split_slot(),
            _ => None,
        };
        match split {
            // Partly issued: its issued pieces were failed above; the
            // rest never will be.
            Some(idx) => finish_split_unissued(sub, idx, err, f),
            None => f.complete(
                &mut sub.reborrow(),
                Completion {
                    user_data: p.user_data,
                    result: Err(err),
                    buf: p.buf,
                },
            ),
        }
    }
}

/// The core's side of `CompletionQueue::reap`.
struct Sink<'a, 'b, T: Transport, F> {
    sub: Submitter<'a, T>,
    f: &'b mut F,
}

impl<T: Transport, F: Handler<T>> CqeSink for Sink<'_, '_, T, F> {
    #[inline(always)]
    fn cqe(&mut self, cid: u16, status: u16, dw0: u32) {
        complete(
            &mut self.sub,
            cid as u32 | (status as u32) << 17,
            dw0,
            self.f,
        )
    }

    #[inline(always)]
    fn cqe_dw3(&mut self, dw3: u32, dw0: u32) {
        complete(&mut self.sub, dw3, dw0, self.f)
    }

    #[inline(always)]
    fn peek(&mut self, cid: u16) {
        prefetch(self.sub.core.trackers.as_ptr().wrapping_add(cid as usize))
    }
}

/// Releases the tracker of the completion whose dword 3 is `dw3` (CID,
/// phase, status: `CqeSink::cqe_dw3`) and delivers its completion.
#[inline(always)]
fn complete<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    dw3: u32,
    dw0: u32,
    f: &mut F,
) {
    let cid = dw3 as u16;
    let Some(t) = sub.core.trackers.get_mut(cid as usize) else {
        return bogus(sub.core, cid);
    };
    let flags = t.flags;
    let user_data = t.user_data;
    // One test for the common case: outstanding, not split, not timed out.
    if flags == T_BUSY {
        t.flags = 0;
        let buf = t.buf.take();
        sub.core.release_spare(cid);
        // SCT and SC (`Status::is_success`) tested in place in dword 3.
        let result = if dw3 & (0x7FF << 17) == 0 {
            Ok(dw0)
        } else {
            Err(IoError::Nvme(Status((dw3 >> 17) as u16)))
        };
        // A fresh view for the handler (here and wherever a handler is
        // called): if it swaps that view for another queue pair's, `sub`
        // still names this one's trackers for the next completion.
        f.complete(
            &mut sub.reborrow(),
            Completion {
                user_data,
                result,
                buf,
            },
        );
    } else {
        complete_other(sub, cid, flags, user_data, (dw3 >> 17) as u16, dw0, f);
    }
}

/// A completion for a split or timed-out command, or a bogus one.
#[cold]
fn complete_other<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    cid: u16,
    flags: u32,
    user_data: u64,
    status: u16,
    dw0: u32,
    f: &mut F,
) {
    if flags & T_BUSY == 0 {
        return bogus(sub.core, cid);
    }
    let t = &mut sub.core.trackers[cid as usize];
    t.flags = 0;
    let buf = t.buf.take();
    sub.core.free.push(cid);
    let st = Status(status);
    // A command that completes successfully after it timed out (its abort
    // lost the race) did its work: report the success.
    let result = if st.is_success() {
        Ok(dw0)
    } else if flags & T_TIMED_OUT != 0 {
        Err(IoError::Timeout)
    } else {
        Err(IoError::Nvme(st))
    };
    finish(sub, flags, user_data, result, buf, f);
}

#[cold]
fn bogus(core: &mut Core, cid: u16) {
    core.stats.bogus_completions += 1;
    tracing::error!(
        cid,
        "controller completed a command that is not outstanding; ignored"
    );
}

/// Delivers a result for a tracker that has already been released (`buf`:
/// what the tracker held; a child's buffer is in its split slot).
fn finish<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    flags: u32,
    user_data: u64,
    result: Result<u32, IoError>,
    buf: Option<IoBuf>,
    f: &mut F,
) {
    if flags & T_CHILD == 0 {
        f.complete(
            &mut sub.reborrow(),
            Completion {
                user_data,
                result,
                buf,
            },
        );
        return;
    }
    let idx = user_data as usize;
    let Some(s) = sub.core.splits.get_mut(idx) else {
        tracing::error!(idx, "split index out of range");
        return;
    };
    if let Err(e) = result {
        s.error.get_or_insert(e);
    }
    s.remaining -= 1;
    if s.remaining == 0 {
        let c = Completion {
            user_data: s.user_data,
            result: s.error.map_or(Ok(0), Err),
            buf: s.buf.take(),
        };
        sub.core.free_splits.push(idx as u32);
        f.complete(&mut sub.reborrow(), c);
    }
}

/// The pieces of split request `idx` that were never issued fail with
/// `err`; the request completes if nothing of it is outstanding.
fn finish_split_unissued<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    idx: u32,
    err: IoError,
    f: &mut F,
) {
    let s = &mut sub.core.splits[idx as usize];
    s.error.get_or_insert(err);
    // Nothing of it is outstanding any more (failed above): what remains
    // was never issued.
    s.remaining = 0;
    let c = Completion {
        user_data: s.user_data,
        result: Err(s.error.unwrap_or(err)),
        buf: s.buf.take(),
    };
    sub.core.free_splits.push(idx);
    f.complete(&mut sub.reborrow(), c);
}

/// Fails every outstanding command with `err` (a controller reset or
/// failure; a command that had timed out fails with `Timeout`). A handler
/// may submit meanwhile: the queue pair is not `Ready`, so that waits in
/// the backlog.
fn fail_outstanding<T: Transport, F: Handler<T>>(
    sub: &mut Submitter<'_, T>,
    err: IoError,
    f: &mut F,
) {
    debug_assert_ne!(sub.core.state, QpState::Ready);
    for cid in 0..sub.core.trackers.len() {
        let t = &mut sub.core.trackers[cid];
        let (flags, user_data) = (t.flags, t.user_data);
        if flags & T_BUSY == 0 {
            continue;
        }
        t.flags = 0;
        let buf = t.buf.take();
        sub.core.free.push(cid as u16);
        sub.core.failed_outstanding += 1;
        let e = if flags & T_TIMED_OUT != 0 {
            IoError::Timeout
        } else {
            err
        };
        finish(sub, flags, user_data, Err(e), buf, f);
    }
    debug_assert_eq!(sub.core.outstanding(), 0);
}
