//! The poll path: completions from the backend to the caller's handler.
//!
//! Per completion the layer adds one test of the user data (a split child
//! goes to its parent), an error count when it failed, and the latency
//! slot when tracking is on; the handler is called with the channel's
//! submission view so it can submit the next request at once.
use std::mem::MaybeUninit;

use io_uring::cqueue;

use crate::channel::{ChanBe, Channel, Io, IoBe};
use crate::common::Common;
use crate::data::{Completion, Data};
use crate::nvme::NvmeSide;
use crate::split::CHILD;
use crate::uring::REAP_BATCH;

/// Receives completions from [`Channel::poll`]. Closures
/// `FnMut(&mut Io, Completion)` implement it; a type implementing it
/// with an `#[inline(always)]` method is inlined into the poll loop.
pub trait Handler {
    fn complete(&mut self, io: &mut Io<'_>, c: Completion);
}

impl<F: FnMut(&mut Io<'_>, Completion)> Handler for F {
    #[inline(always)]
    fn complete(&mut self, io: &mut Io<'_>, c: Completion) {
        self(io, c)
    }
}

/// Hands `c` to the handler after the layer's bookkeeping: one test sends
/// split children and latency tracking to the slow path. The slow path
/// gets the channel's common part only, never the `Io` view, so the view
/// stays in registers on the hot path.
#[inline(always)]
fn deliver<H: Handler>(io: &mut Io<'_>, c: Completion, h: &mut H) {
    let c = if (c.user_data | io.c.slow_bit) & CHILD != 0 {
        match slow(io.c, c) {
            Some(c) => c,
            None => return,
        }
    } else {
        if c.result.is_err() {
            io.c.n.errors += 1;
        }
        c
    };
    h.complete(io, c)
}

/// A split child (its parent's completion when it was the last child) or
/// a latency-tracked request.
#[cold]
#[inline(never)]
fn slow(cm: &mut Common, mut c: Completion) -> Option<Completion> {
    if c.user_data & CHILD != 0 {
        c = cm.parents.on_child(c)?;
    }
    if c.result.is_err() {
        cm.n.errors += 1;
    }
    if let Some(l) = &mut cm.lat {
        let (ud, due) = l.finish(c.user_data);
        c.user_data = ud;
        if due {
            cm.reg.merge_latency(&l.hist);
            l.hist.reset();
        }
    }
    Some(c)
}

/// The NVMe queue pair's handler: converts each completion and passes it
/// on with the layer's view.
struct NvmeSink<'h, 'c, H> {
    c: &'c mut Common,
    side: &'c mut NvmeSide,
    h: &'h mut H,
}

impl<H: Handler> pollux_host::Handler for NvmeSink<'_, '_, H> {
    /// `deliver` for NVMe, with the test made on the driver's completion
    /// before the layer's is built, so that it is built only where the
    /// handler takes it (and stays in registers). A request with one
    /// buffer and no split or latency slot is the hot case: there the
    /// layer's completion is built as `Data::One`, so the handler's test
    /// of the variant folds away.
    #[inline(always)]
    fn complete(&mut self, sub: &mut pollux_host::Submitter<'_>, c: pollux_nvme::Completion) {
        let pollux_nvme::Completion {
            user_data,
            result,
            buf,
        } = c;
        match buf {
            Some(buf) if (user_data | self.c.slow_bit) & CHILD == 0 => {
                if result.is_err() {
                    self.c.n.errors += 1;
                }
                let c = Completion {
                    user_data,
                    result,
                    data: Data::One(buf),
                };
                let mut io = Io {
                    c: &mut *self.c,
                    be: IoBe::Nvme(sub.reborrow(), &mut *self.side),
                };
                self.h.complete(&mut io, c);
            }
            // The view by value: were the cold call handed the handler's
            // view by reference, it would stay in memory and its
            // transport be tested again per request (+6 instructions per
            // I/O in `pollux bdevperf`).
            buf => self.complete_other(sub.reborrow(), user_data, result, buf),
        }
    }
}

impl<H: Handler> NvmeSink<'_, '_, H> {
    /// The rest: a split child, a latency-tracked request, or a command
    /// without a buffer.
    #[cold]
    #[inline(never)]
    fn complete_other(
        &mut self,
        mut sub: pollux_host::Submitter<'_>,
        user_data: u64,
        result: Result<u32, pollux_nvme::IoError>,
        buf: Option<pollux_nvme::IoBuf>,
    ) {
        let c = Completion {
            user_data,
            result,
            data: buf.into(),
        };
        let c = if (user_data | self.c.slow_bit) & CHILD != 0 {
            match slow(self.c, c) {
                Some(c) => c,
                None => return,
            }
        } else {
            if c.result.is_err() {
                self.c.n.errors += 1;
            }
            c
        };
        let mut io = Io {
            c: &mut *self.c,
            be: IoBe::Nvme(sub.reborrow(), &mut *self.side),
        };
        self.h.complete(&mut io, c);
    }
}

impl Channel {
    /// Delivers up to `max` finished requests to `h` (which may submit
    /// more through the `Io` it is given) and tells the backend about new
    /// requests. Returns how many were delivered.
    #[inline(always)]
    pub fn poll<H: Handler>(&mut self, max: u32, h: &mut H) -> u32 {
        let n = match &mut self.be {
            ChanBe::Local(l) => {
                let mut n = 0;
                while n < max {
                    let Some(c) = l.pop() else { break };
                    n += 1;
                    let mut io = Io {
                        c: &mut self.c,
                        be: IoBe::Local(l),
                    };
                    deliver(&mut io, c, h);
                }
                n
            }
            ChanBe::Nvme(nv) => {
                let mut n = 0;
                if !nv.side.deferred.is_empty() {
                    n = deferred(&mut self.c, nv, h);
                }
                let sink = NvmeSink {
                    c: &mut self.c,
                    side: &mut nv.side,
                    h,
                };
                n + nv.qp.poll_owned(max, sink)
            }
            ChanBe::Uring(u) => {
                // One io_uring_enter for what was queued since the last
                // poll; its return runs the kernel's completion work, so
                // the CQEs it posts are reaped below.
                u.kick();
                let mut n = 0;
                let mut buf = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
                for side in [false, true] {
                    if side && !u.has_side() {
                        break;
                    }
                    while n < max {
                        let want = ((max - n) as usize).min(REAP_BATCH);
                        let got = u.reap(side, &mut buf[..want]);
                        if got.is_empty() {
                            break;
                        }
                        for e in got.iter() {
                            if let Some(c) = u.on_cqe(e) {
                                n += 1;
                                let mut io = Io {
                                    c: &mut self.c,
                                    be: IoBe::Uring(u),
                                };
                                deliver(&mut io, c, h);
                            }
                        }
                    }
                }
                u.polled(n);
                n
            }
            ChanBe::NvmeMp(m) => {
                let c = &mut self.c;
                m.poll(|m, comp| {
                    let comp = Completion {
                        user_data: comp.user_data,
                        result: comp.result,
                        data: comp.buf.into(),
                    };
                    let mut io = Io {
                        c: &mut *c,
                        be: IoBe::NvmeMp(m),
                    };
                    deliver(&mut io, comp, h);
                })
            }
        };
        self.c.publish();
        n
    }

    /// Polls until nothing is outstanding (or `max_polls` polls passed);
    /// returns whether the channel is drained.
    pub fn drain<H: Handler>(&mut self, h: &mut H, max_polls: u64) -> bool {
        for _ in 0..max_polls {
            if self.outstanding() == 0 {
                return true;
            }
            self.poll(u32::MAX, h);
            match &mut self.be {
                ChanBe::Nvme(n) => n.side.ctrl.relax(),
                // Sleep in the kernel until a completion (or 1 ms).
                ChanBe::Uring(u) => u.wait(std::time::Duration::from_millis(1)),
                ChanBe::Local(_) | ChanBe::NvmeMp(_) => {}
            }
        }
        self.outstanding() == 0
    }
}

#[cold]
fn deferred<H: Handler>(c: &mut Common, nv: &mut crate::nvme::NvmeChan, h: &mut H) -> u32 {
    let list = std::mem::take(&mut nv.side.deferred);
    let n = list.len() as u32;
    for comp in list {
        let mut io = Io {
            c: &mut *c,
            be: IoBe::Nvme(nv.qp.submitter(), &mut nv.side),
        };
        deliver(&mut io, comp, h);
    }
    n
}
