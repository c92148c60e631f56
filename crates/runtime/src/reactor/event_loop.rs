//! The loop of one runtime thread.

use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ctx::{
    Planner, PollerId, ThreadCtx, ThreadStats, TimerKind, Timers, TOKEN_TIMER, TOKEN_WAKE,
};
use super::shared::{lock, Shared};
use crate::sys::{Epoll, TimerFd};
use crate::{Error, Msg, Poll, Result, RuntimeOptions};

/// A runtime thread's descriptors and rings, made before spawning it (so
/// errors reach `Runtime::start`).
pub(crate) struct Prepared {
    shared: Arc<Shared>,
    index: usize,
    producers: Vec<rtrb::Producer<Msg>>,
    consumers: Vec<rtrb::Consumer<Msg>>,
    epoll: Epoll,
    timerfd: TimerFd,
    opts: RuntimeOptions,
}

impl Prepared {
    pub(crate) fn new(
        shared: Arc<Shared>,
        index: usize,
        producers: Vec<rtrb::Producer<Msg>>,
        consumers: Vec<rtrb::Consumer<Msg>>,
        opts: RuntimeOptions,
    ) -> Result<Self> {
        let core = shared.threads[index].core;
        let io = |what: &str| {
            let what = format!("{what} for runtime thread {index} (core {core})");
            move |source| Error::Io { what, source }
        };
        let epoll = Epoll::new().map_err(io("creating the epoll set"))?;
        let timerfd = TimerFd::new().map_err(io("creating the timerfd"))?;
        let wake = shared.threads[index].wake.as_fd().as_raw_fd();
        epoll
            .add(wake, TOKEN_WAKE)
            .map_err(io("watching the wake eventfd"))?;
        epoll
            .add(timerfd.as_fd().as_raw_fd(), TOKEN_TIMER)
            .map_err(io("watching the timerfd"))?;
        Ok(Self {
            shared,
            index,
            producers,
            consumers,
            epoll,
            timerfd,
            opts,
        })
    }
}

/// The loop of one runtime thread.
pub(crate) struct Reactor {
    ctx: ThreadCtx,
    consumers: Vec<rtrb::Consumer<Msg>>,
    timerfd: TimerFd,
    opts: RuntimeOptions,
    pending: Option<Pending>,
}

/// The last poller of a pass, whose time is charged at the next clock
/// read.
///
/// A poller's time is the time between two clock reads around its run:
/// the pass starts at the loop's own clock read (or one more read if
/// messages or timers ran first), each poller after the first reads the
/// clock once before it runs (charging the one before it), and the last
/// poller is charged at the next iteration's clock read (or just before the
/// thread sleeps). So a thread with one poller reads the clock no more
/// often than without per-poller times, `n` pollers cost `n - 1` clock
/// reads per pass, and the last poller of a pass is also charged the
/// loop's bookkeeping after it (flushing backlogged messages, waking their
/// targets, the sleep check).
struct Pending {
    index: usize,
    id: PollerId,
    busy: bool,
    since: Instant,
}

#[derive(Clone, Copy)]
enum Phase {
    Busy,
    Idle,
    Asleep,
}

/// Messages taken from one ring per iteration, so pollers keep running
/// under a flood.
const MSG_BATCH: usize = 256;

impl Reactor {
    /// Builds the loop from what `prepare` made (on the thread itself:
    /// pollers and timers need not be `Send`).
    fn new(p: Prepared) -> Self {
        let Prepared {
            shared,
            index,
            producers,
            consumers,
            epoll,
            timerfd,
            opts,
        } = p;
        let me = shared.threads[index].clone();
        let n = producers.len();
        let stats = ThreadStats {
            index,
            core: me.core,
            ..Default::default()
        };
        Self {
            ctx: ThreadCtx {
                shared,
                me,
                now: Instant::now(),
                producers,
                backlog: (0..n).map(|_| VecDeque::new()).collect(),
                backlogged: 0,
                to_notify: Vec::new(),
                notify_marked: vec![false; n],
                pollers: Vec::new(),
                next_id: 0,
                timers: Timers::default(),
                drains: Vec::new(),
                sleep_hooks: Vec::new(),
                wake_fds: Vec::new(),
                epoll,
                stats,
                draining: false,
                load_mark: (Duration::ZERO, Duration::ZERO),
                planner: None,
            },
            consumers,
            timerfd,
            opts,
            pending: None,
        }
    }

    pub(crate) fn run_with(p: Prepared, init: impl FnOnce(&mut ThreadCtx)) {
        let mut this = Self::new(p);
        this.ctx.now = Instant::now();
        if let Some(opts) = this.opts.scheduler.clone() {
            if this.ctx.index() == 0 {
                let period = opts.period;
                this.ctx.planner = Some(Box::new(Planner {
                    opts,
                    round: 0,
                    waiting: 0,
                    loads: Vec::new(),
                    in_flight: 0,
                    quiet_from: 0,
                    moved_in_round: HashMap::new(),
                }));
                this.ctx.add_periodic(period, |ctx| ctx.scheduler_tick());
            }
        }
        init(&mut this.ctx);
        this.ctx.notify_targets();
        this.run();
    }

    fn run(mut self) {
        let mut prev = Instant::now();
        let mut phase = Phase::Idle;
        let mut last_work = prev;
        let mut drain_start = None;
        loop {
            let now = Instant::now();
            let dt = now - prev;
            prev = now;
            self.ctx.now = now;
            let s = &mut self.ctx.stats;
            s.loops += 1;
            match phase {
                Phase::Busy => s.busy += dt,
                Phase::Idle => s.idle += dt,
                Phase::Asleep => s.asleep += dt,
            }

            self.charge_pending(now);
            let mut busy = self.run_messages();
            busy |= self.run_timers(now);
            // Messages or timers took time: the pollers start later.
            let pass_start = if busy { Instant::now() } else { now };
            busy |= self.run_pollers(pass_start);
            let backlog = self.ctx.flush_backlog();
            self.ctx.notify_targets();

            if self.ctx.shared.stop.load(Ordering::Relaxed) {
                let start = *drain_start.get_or_insert_with(|| {
                    self.ctx.draining = true;
                    tracing::debug!(thread = self.ctx.index(), "draining");
                    now
                });
                let drained = self.run_drains();
                if drained && !backlog && !self.inbox_pending() {
                    break;
                }
                if now - start >= self.opts.drain_timeout {
                    let left: Vec<&str> = self.ctx.drains.iter().map(|(n, _)| n.as_str()).collect();
                    tracing::warn!(
                        thread = self.ctx.index(),
                        core = self.ctx.core(),
                        "drain timed out after {:?}; not drained: {left:?}",
                        self.opts.drain_timeout
                    );
                    break;
                }
                phase = if busy { Phase::Busy } else { Phase::Idle };
                continue;
            }

            if busy || backlog {
                last_work = now;
                phase = Phase::Busy;
            } else if now - last_work >= self.opts.idle_threshold && self.sleep() {
                phase = Phase::Asleep;
            } else {
                phase = Phase::Idle;
            }
        }
        self.close();
    }

    fn inbox_pending(&self) -> bool {
        self.consumers.iter().any(|c| !c.is_empty())
            || self.ctx.me.external_pending.load(Ordering::Acquire)
    }

    fn run_messages(&mut self) -> bool {
        let mut n = 0u64;
        for c in &mut self.consumers {
            for _ in 0..MSG_BATCH {
                match c.pop() {
                    Ok(m) => {
                        m(&mut self.ctx);
                        n += 1;
                    }
                    Err(_) => break,
                }
            }
        }
        if self.ctx.me.external_pending.load(Ordering::Acquire) {
            let batch = {
                let mut ext = lock(&self.ctx.me.external);
                self.ctx.me.external_pending.store(false, Ordering::Relaxed);
                std::mem::take(&mut ext.queue)
            };
            for m in batch {
                m(&mut self.ctx);
                n += 1;
            }
        }
        self.ctx.stats.messages += n;
        n > 0
    }

    fn run_timers(&mut self, now: Instant) -> bool {
        let mut fired = 0u64;
        let ctx = &mut self.ctx;
        while let Some(&Reverse((deadline, id))) = ctx.timers.heap.peek() {
            if deadline > now {
                break;
            }
            ctx.timers.heap.pop();
            let Some(kind) = ctx.timers.live.remove(&id) else {
                continue; // cancelled
            };
            fired += 1;
            match kind {
                TimerKind::Once(f) => f(ctx),
                TimerKind::Periodic(period, mut f) => {
                    ctx.timers.firing = Some((id, false));
                    f(ctx);
                    let cancelled = matches!(ctx.timers.firing.take(), Some((_, true)));
                    if !cancelled {
                        let mut next = deadline + period;
                        if next <= now {
                            next = now + period;
                        }
                        ctx.timers.heap.push(Reverse((next, id)));
                        ctx.timers.live.insert(id, TimerKind::Periodic(period, f));
                    }
                }
            }
        }
        ctx.stats.timers_fired += fired;
        fired > 0
    }

    /// Runs every poller once; `start` is when the pass starts (see
    /// [`Pending`] for how their time is measured).
    fn run_pollers(&mut self, start: Instant) -> bool {
        let mut busy = false;
        let mut removed = false;
        // The poller that ran last, its result, and when it started.
        let mut last: Option<(usize, bool)> = None;
        let mut mark = start;
        let mut i = 0;
        // Pollers registered meanwhile are appended and run this pass too.
        while i < self.ctx.pollers.len() {
            let p = &mut self.ctx.pollers[i];
            if p.removed {
                removed = true;
            } else if let Some(mut f) = p.f.take() {
                if let Some((j, was_busy)) = last {
                    let t = Instant::now();
                    self.ctx.pollers[j].c.charge(was_busy, t - mark);
                    mark = t;
                }
                let r = f.call(&mut self.ctx);
                let p = &mut self.ctx.pollers[i];
                p.f = Some(f);
                p.c.runs += 1;
                let b = r == Poll::Busy;
                if b {
                    p.c.busy_runs += 1;
                    busy = true;
                }
                removed |= p.removed;
                last = Some((i, b));
            }
            i += 1;
        }
        self.pending = last.map(|(j, busy)| Pending {
            index: j,
            id: self.ctx.pollers[j].id,
            busy,
            since: mark,
        });
        if removed {
            self.ctx.pollers.retain(|p| !p.removed);
            if let Some(p) = &mut self.pending {
                match self.ctx.pollers.iter().position(|e| e.id == p.id) {
                    Some(k) => p.index = k,
                    None => self.pending = None,
                }
            }
        }
        busy
    }

    /// Charges the last poller of the previous pass up to `now`.
    fn charge_pending(&mut self, now: Instant) {
        let Some(p) = self.pending.take() else {
            return;
        };
        let pollers = &mut self.ctx.pollers;
        let entry = match pollers.get(p.index) {
            Some(e) if e.id == p.id => Some(p.index),
            _ => pollers.iter().position(|e| e.id == p.id),
        };
        if let Some(k) = entry {
            pollers[k]
                .c
                .charge(p.busy, now.saturating_duration_since(p.since));
        }
    }

    /// Runs drain callbacks, dropping those that report drained; true once
    /// none is left.
    fn run_drains(&mut self) -> bool {
        let mut i = 0;
        while i < self.ctx.drains.len() {
            let Some(mut f) = self.ctx.drains[i].1.take() else {
                i += 1;
                continue;
            };
            if f(&mut self.ctx) {
                self.ctx.drains.remove(i);
            } else {
                self.ctx.drains[i].1 = Some(f);
                i += 1;
            }
        }
        self.ctx.drains.is_empty()
    }

    /// Sleeps in epoll until a message, the next timer or a registered
    /// descriptor wakes the thread; false if it did not sleep.
    fn sleep(&mut self) -> bool {
        for hook in &mut self.ctx.sleep_hooks {
            if !hook() {
                return false;
            }
        }
        let next = self.ctx.timers.next_deadline();
        let after = match next {
            Some(d) if d <= self.ctx.now => return false,
            Some(d) => Some(d - self.ctx.now),
            None => None,
        };
        if let Err(e) = self.timerfd.set(after) {
            tracing::error!(
                thread = self.ctx.index(),
                "arming the timerfd failed, not sleeping: {e}"
            );
            return false;
        }
        if self.pending.is_some() {
            // The sleep must not count as the last poller's time.
            self.charge_pending(Instant::now());
        }
        let me = self.ctx.me.clone();
        me.asleep.store(true, Ordering::Relaxed);
        // Pairs with the fence in senders' notification: either they see
        // `asleep` set, or this sees their message.
        fence(Ordering::SeqCst);
        if self.inbox_pending() || self.ctx.shared.stop.load(Ordering::Relaxed) {
            me.asleep.store(false, Ordering::Relaxed);
            return false;
        }
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 8];
        let n = match self.ctx.epoll.wait(&mut events, -1) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(thread = self.ctx.index(), "epoll_wait failed: {e}");
                0
            }
        };
        me.asleep.store(false, Ordering::Relaxed);
        self.ctx.stats.sleeps += 1;
        for ev in &events[..n] {
            let r = match ev.u64 {
                TOKEN_WAKE => me.wake.drain().map(drop),
                TOKEN_TIMER => self.timerfd.drain().map(drop),
                _ => {
                    self.ctx.stats.fd_wakeups += 1;
                    Ok(())
                }
            };
            if let Err(e) = r {
                tracing::error!(
                    thread = self.ctx.index(),
                    "reading a wake-up descriptor failed: {e}"
                );
            }
        }
        true
    }

    /// Refuses further external messages and drops those left.
    fn close(self) {
        let left = {
            let mut ext = lock(&self.ctx.me.external);
            ext.closed = true;
            std::mem::take(&mut ext.queue)
        };
        tracing::debug!(
            thread = self.ctx.index(),
            dropped = left.len(),
            "runtime thread exits"
        );
        drop(left);
    }
}
