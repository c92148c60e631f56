//! [`ThreadCtx`]: what closures, pollers and timers see, and the types of
//! what it holds (pollers, timers, counters).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::shared::{Shared, ThreadShared};
use crate::sched::ThreadLoad;
use crate::sys::Epoll;
use crate::{Error, Msg, Poll, Result, SchedulerOptions};

/// Identifies a poller on its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PollerId(pub(crate) u64);

/// Identifies a timer on its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

type PollerFn = Box<dyn FnMut(&mut ThreadCtx) -> Poll>;
type MovableFn = Box<dyn FnMut(&mut ThreadCtx) -> Poll + Send>;

/// A poller's closure: movable ones may migrate between threads.
pub(super) enum PollerBox {
    Local(PollerFn),
    Movable(MovableFn),
}

impl PollerBox {
    pub(super) fn call(&mut self, ctx: &mut ThreadCtx) -> Poll {
        match self {
            PollerBox::Local(f) => f(ctx),
            PollerBox::Movable(f) => f(ctx),
        }
    }
}

/// What a poller carries wherever it runs: its counters.
#[derive(Clone, Debug)]
pub(super) struct Counters {
    pub(super) runs: u64,
    pub(super) busy_runs: u64,
    /// Time inside the poller in runs that reported Busy / Idle.
    pub(super) busy: Duration,
    pub(super) idle: Duration,
    /// The thread it was registered on.
    pub(super) home: usize,
    /// Times the scheduler moved it.
    pub(super) moves: u64,
    /// When the scheduler last measured it, and its busy time then.
    pub(super) mark: (Instant, Duration),
}

impl Counters {
    pub(super) fn new(home: usize, now: Instant) -> Self {
        Self {
            runs: 0,
            busy_runs: 0,
            busy: Duration::ZERO,
            idle: Duration::ZERO,
            home,
            moves: 0,
            mark: (now, Duration::ZERO),
        }
    }

    pub(super) fn charge(&mut self, busy: bool, spent: Duration) {
        if busy {
            self.busy += spent;
        } else {
            self.idle += spent;
        }
    }
}

/// A movable poller in transit to another thread.
pub(super) struct Moving {
    pub(super) id: PollerId,
    pub(super) name: String,
    pub(super) f: MovableFn,
    pub(super) c: Counters,
}
type DrainFn = Box<dyn FnMut(&mut ThreadCtx) -> bool>;

pub(super) struct PollerEntry {
    pub(super) id: PollerId,
    pub(super) name: String,
    /// None while it runs (so it can get `&mut ThreadCtx`).
    pub(super) f: Option<PollerBox>,
    pub(super) c: Counters,
    /// Registered as movable (its closure is `Send`); kept apart from `f`,
    /// which is None while it runs.
    pub(super) movable: bool,
    pub(super) removed: bool,
}

pub(super) enum TimerKind {
    Once(Box<dyn FnOnce(&mut ThreadCtx)>),
    Periodic(Duration, Box<dyn FnMut(&mut ThreadCtx)>),
}

#[derive(Default)]
pub(super) struct Timers {
    pub(super) heap: BinaryHeap<Reverse<(Instant, u64)>>,
    pub(super) live: HashMap<u64, TimerKind>,
    /// The periodic timer running now, and whether it cancelled itself.
    pub(super) firing: Option<(u64, bool)>,
}

impl Timers {
    /// The earliest deadline of a live timer (drops cancelled ones on top).
    pub(super) fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, id))) = self.heap.peek() {
            if self.live.contains_key(&id) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }
}

/// Per-poller counters. A movable poller keeps them (and its id) when the
/// scheduler moves it: they count its runs on every thread it ran on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PollerStats {
    pub id: PollerId,
    pub name: String,
    /// Times it ran.
    pub runs: u64,
    /// Times it reported [`Poll::Busy`].
    pub busy_runs: u64,
    /// Time spent inside it in runs that reported [`Poll::Busy`]. See
    /// [`ThreadCtx::register_poller`] for how it is measured.
    pub busy: Duration,
    /// Time spent inside it in runs that reported [`Poll::Idle`].
    pub idle: Duration,
    /// Registered with [`ThreadCtx::register_movable_poller`].
    pub movable: bool,
    /// The index of the thread it was registered on.
    pub home: usize,
    /// Times the scheduler moved it to another thread.
    pub moves: u64,
}

/// Counters of one runtime thread. Times are attributed per loop iteration
/// from the one clock read each iteration makes: an iteration in which a
/// message, timer or poller did work counts as busy, else idle; the
/// iteration that ends in epoll counts as asleep.
#[derive(Clone, Debug, Default)]
pub struct ThreadStats {
    pub index: usize,
    pub core: usize,
    pub loops: u64,
    pub busy: Duration,
    pub idle: Duration,
    pub asleep: Duration,
    /// Times it went to sleep in epoll.
    pub sleeps: u64,
    /// Wake-ups caused by a registered descriptor (see
    /// [`ThreadCtx::register_wake_fd`]).
    pub fd_wakeups: u64,
    pub messages: u64,
    pub timers_fired: u64,
    /// Movable pollers the scheduler moved onto / off this thread.
    pub pollers_moved_in: u64,
    pub pollers_moved_out: u64,
    /// The pollers running on this thread now (a poller the scheduler is
    /// moving shows on neither thread for the moment the move takes).
    pub pollers: Vec<PollerStats>,
}

/// The state of a runtime thread, handed to every closure, poller, timer
/// and drain callback that runs on it.
pub struct ThreadCtx {
    pub(super) shared: Arc<Shared>,
    pub(super) me: Arc<ThreadShared>,
    pub(super) now: Instant,
    /// One SPSC ring to each thread (including this one).
    pub(super) producers: Vec<rtrb::Producer<Msg>>,
    /// Messages that did not fit in a full ring, per target, in order.
    pub(super) backlog: Vec<VecDeque<Msg>>,
    pub(super) backlogged: usize,
    /// Targets sent to since the last notification pass.
    pub(super) to_notify: Vec<usize>,
    pub(super) notify_marked: Vec<bool>,
    pub(super) pollers: Vec<PollerEntry>,
    pub(super) next_id: u64,
    pub(super) timers: Timers,
    pub(super) drains: Vec<(String, Option<DrainFn>)>,
    pub(super) sleep_hooks: Vec<Box<dyn FnMut() -> bool>>,
    pub(super) wake_fds: Vec<RawFd>,
    pub(super) epoll: Epoll,
    pub(super) stats: ThreadStats,
    pub(super) draining: bool,
    /// Scheduler state: busy and total time at the last tick, the main
    /// thread's load, and whether an offer to the main thread is out.
    pub(super) load_mark: (Duration, Duration),
    /// Thread 0's scheduler state (None elsewhere, or with no scheduler).
    pub(super) planner: Option<Box<Planner>>,
}

/// Thread 0's scheduler state: one round per period gathers every
/// thread's [`ThreadLoad`], plans with [`sched::plan`](crate::sched::plan)
/// and orders the moves.
pub(super) struct Planner {
    pub(super) opts: SchedulerOptions,
    pub(super) round: u64,
    /// Reports still awaited this round.
    pub(super) waiting: usize,
    pub(super) loads: Vec<ThreadLoad>,
    /// Moves ordered and not yet landed.
    pub(super) in_flight: usize,
    /// The first round whose loads were all measured after the last move
    /// landed.
    pub(super) quiet_from: u64,
    /// The round each recently moved poller moved in (for the dwell).
    pub(super) moved_in_round: HashMap<PollerId, u64>,
}

/// Token of the thread's own eventfd and timerfd in its epoll set; user
/// descriptors get token 2.
pub(super) const TOKEN_WAKE: u64 = 0;
pub(super) const TOKEN_TIMER: u64 = 1;
const TOKEN_USER: u64 = 2;

impl ThreadCtx {
    /// This thread's index in the runtime (0-based, the order of the core
    /// list).
    pub fn index(&self) -> usize {
        self.me.index
    }

    /// The core this thread was pinned to.
    pub fn core(&self) -> usize {
        self.me.core
    }

    /// How many threads the runtime has.
    pub fn thread_count(&self) -> usize {
        self.producers.len()
    }

    /// The time read at the start of this loop iteration (the loop reads
    /// the clock once per iteration; use this instead of reading it again).
    pub fn now(&self) -> Instant {
        self.now
    }

    /// True once shutdown was requested: drain callbacks are running.
    pub fn is_shutting_down(&self) -> bool {
        self.draining
    }

    /// A handle that sends closures to this runtime's threads from any
    /// thread (see [`Remote`](crate::Remote)).
    pub fn remote(&self) -> crate::Remote {
        crate::Remote {
            shared: self.shared.clone(),
        }
    }

    /// Sends `f` to run on thread `target` (possibly this one, at its next
    /// loop iteration). Messages from one thread to another run in the
    /// order sent.
    pub fn send(
        &mut self,
        target: usize,
        f: impl FnOnce(&mut ThreadCtx) + Send + 'static,
    ) -> Result<()> {
        self.send_boxed(target, Box::new(f))
    }

    pub(crate) fn send_boxed(&mut self, target: usize, msg: Msg) -> Result<()> {
        let count = self.producers.len();
        let Some(p) = self.producers.get_mut(target) else {
            return Err(Error::NoSuchThread {
                index: target,
                count,
            });
        };
        if p.is_abandoned() {
            return Err(Error::ThreadGone { index: target });
        }
        if self.backlog[target].is_empty() {
            match p.push(msg) {
                Ok(()) => {
                    if !self.notify_marked[target] {
                        self.notify_marked[target] = true;
                        self.to_notify.push(target);
                    }
                    return Ok(());
                }
                Err(rtrb::PushError::Full(m)) => {
                    self.backlog[target].push_back(m);
                }
            }
        } else {
            self.backlog[target].push_back(msg);
        }
        self.backlogged += 1;
        Ok(())
    }

    /// Runs `f` on thread `target`, then `reply` with its result back on
    /// this thread.
    pub fn call<R: Send + 'static>(
        &mut self,
        target: usize,
        f: impl FnOnce(&mut ThreadCtx) -> R + Send + 'static,
        reply: impl FnOnce(&mut ThreadCtx, R) + Send + 'static,
    ) -> Result<()> {
        let origin = self.index();
        self.send(target, move |ctx| {
            let r = f(ctx);
            if let Err(e) = ctx.send(origin, move |ctx| reply(ctx, r)) {
                tracing::warn!(thread = ctx.index(), origin, "reply lost: {e}");
            }
        })
    }

    /// Registers a poller: it runs once every loop iteration and reports
    /// whether it found work. The thread may sleep once all pollers have
    /// reported [`Poll::Idle`] for the configured idle time.
    ///
    /// Its stats ([`PollerStats`]) count its runs and the time spent in it,
    /// as busy or idle time by what it reported. That time comes from
    /// clock reads between pollers: a thread with one poller charges it
    /// from the loop's own clock read per iteration (no extra read); with
    /// `n` pollers a pass costs `n - 1` more reads (a vDSO
    /// `clock_gettime`, some 20 ns each), plus one in iterations where
    /// messages or timers ran before the pollers. The last poller of a
    /// pass is also charged the loop's little bookkeeping after it.
    pub fn register_poller(
        &mut self,
        name: impl Into<String>,
        f: impl FnMut(&mut ThreadCtx) -> Poll + 'static,
    ) -> PollerId {
        let id = PollerId(self.fresh_id());
        self.pollers.push(PollerEntry {
            id,
            name: name.into(),
            f: Some(PollerBox::Local(Box::new(f))),
            c: Counters::new(self.me.index, self.now),
            movable: false,
            removed: false,
        });
        id
    }

    /// Removes a poller (it may be the one running); false if unknown.
    pub fn unregister_poller(&mut self, id: PollerId) -> bool {
        match self.pollers.iter_mut().find(|p| p.id == id && !p.removed) {
            Some(p) => {
                p.removed = true;
                true
            }
            None => false,
        }
    }

    /// Runs `f` once after `delay`.
    pub fn add_timer(
        &mut self,
        delay: Duration,
        f: impl FnOnce(&mut ThreadCtx) + 'static,
    ) -> TimerId {
        self.insert_timer(self.now + delay, TimerKind::Once(Box::new(f)))
    }

    /// Runs `f` every `period` (the first time after one period) until
    /// cancelled. A thread that falls behind skips missed runs rather than
    /// running them back to back. A zero period is taken as 1 ns.
    pub fn add_periodic(
        &mut self,
        period: Duration,
        f: impl FnMut(&mut ThreadCtx) + 'static,
    ) -> TimerId {
        let period = period.max(Duration::from_nanos(1));
        self.insert_timer(self.now + period, TimerKind::Periodic(period, Box::new(f)))
    }

    /// Cancels a timer (it may be the one running); false if it already
    /// fired (one-shot) or is unknown.
    pub fn cancel_timer(&mut self, id: TimerId) -> bool {
        if let Some((firing, cancelled)) = &mut self.timers.firing {
            if *firing == id.0 {
                let was = !*cancelled;
                *cancelled = true;
                return was;
            }
        }
        self.timers.live.remove(&id.0).is_some()
    }

    fn insert_timer(&mut self, deadline: Instant, kind: TimerKind) -> TimerId {
        let id = self.fresh_id();
        self.timers.heap.push(Reverse((deadline, id)));
        self.timers.live.insert(id, kind);
        TimerId(id)
    }

    /// Ids are unique runtime-wide (thread index in the top 16 bits), so a
    /// poller keeps its id when it migrates.
    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        ((self.me.index as u64) << 48) | self.next_id
    }

    /// Registers a callback run repeatedly once shutdown is requested,
    /// until it returns true (drained) or the drain timeout passes.
    pub fn register_drain(
        &mut self,
        name: impl Into<String>,
        f: impl FnMut(&mut ThreadCtx) -> bool + 'static,
    ) {
        self.drains.push((name.into(), Some(Box::new(f))));
    }

    /// Adds `fd` to the descriptors that wake this thread from its idle
    /// sleep when readable (level-triggered): e.g. a queue pair's interrupt
    /// descriptor. Whoever registers it arms it (see
    /// [`on_sleep`](Self::on_sleep)) and consumes its readiness, or the
    /// thread will not stay asleep. Unregister it before closing it.
    pub fn register_wake_fd(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        let raw = fd.as_raw_fd();
        self.epoll
            .add(raw, TOKEN_USER)
            .map_err(|source| Error::Io {
                what: format!("adding descriptor {raw} to the epoll set"),
                source,
            })?;
        self.wake_fds.push(raw);
        Ok(())
    }

    /// Removes a descriptor added by [`register_wake_fd`](Self::register_wake_fd).
    pub fn unregister_wake_fd(&mut self, fd: BorrowedFd<'_>) -> Result<()> {
        let raw = fd.as_raw_fd();
        let Some(pos) = self.wake_fds.iter().position(|&f| f == raw) else {
            return Err(Error::NotRegistered { fd: raw });
        };
        self.wake_fds.swap_remove(pos);
        self.epoll.delete(raw).map_err(|source| Error::Io {
            what: format!("removing descriptor {raw} from the epoll set"),
            source,
        })
    }

    /// Registers a hook run just before the thread sleeps: it arms wake
    /// descriptors (e.g. `QueuePair::arm`) and returns false if work is
    /// already pending, which cancels this sleep.
    pub fn on_sleep(&mut self, f: impl FnMut() -> bool + 'static) {
        self.sleep_hooks.push(Box::new(f));
    }

    /// This thread's counters so far.
    pub fn stats(&self) -> ThreadStats {
        let mut s = self.stats.clone();
        s.pollers = self
            .pollers
            .iter()
            .filter(|p| !p.removed)
            .map(|p| PollerStats {
                id: p.id,
                name: p.name.clone(),
                runs: p.c.runs,
                busy_runs: p.c.busy_runs,
                busy: p.c.busy,
                idle: p.c.idle,
                movable: p.movable,
                home: p.c.home,
                moves: p.c.moves,
            })
            .collect();
        s
    }

    /// Moves backlogged messages into rings that have room; true if some
    /// remain.
    pub(super) fn flush_backlog(&mut self) -> bool {
        if self.backlogged == 0 {
            return false;
        }
        for (t, q) in self.backlog.iter_mut().enumerate() {
            let mut moved = false;
            while let Some(m) = q.pop_front() {
                match self.producers[t].push(m) {
                    Ok(()) => {
                        self.backlogged -= 1;
                        moved = true;
                    }
                    Err(rtrb::PushError::Full(m)) => {
                        q.push_front(m);
                        break;
                    }
                }
            }
            if moved && !self.notify_marked[t] {
                self.notify_marked[t] = true;
                self.to_notify.push(t);
            }
        }
        self.backlogged > 0
    }

    /// Wakes the sleeping targets of messages sent since the last pass
    /// (one fence per pass, not per message).
    pub(super) fn notify_targets(&mut self) {
        if self.to_notify.is_empty() {
            return;
        }
        fence(Ordering::SeqCst);
        for t in self.to_notify.drain(..) {
            self.notify_marked[t] = false;
            self.shared.threads[t].wake_if_asleep();
        }
    }
}
