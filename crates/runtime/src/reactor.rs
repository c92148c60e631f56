//! One runtime thread: its context (what closures, pollers and timers see)
//! and its loop.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sched::{self, MovableLoad, Move, ThreadLoad};
use crate::sys::{Epoll, EventFd, TimerFd};
use crate::{Error, Msg, Poll, Result, RuntimeOptions, SchedulerOptions};

/// What a runtime thread shares with senders on other threads.
pub(crate) struct ThreadShared {
    pub(crate) index: usize,
    pub(crate) core: usize,
    /// Set while the thread sleeps (or is about to) in epoll: senders
    /// signal `wake` only then.
    pub(crate) asleep: AtomicBool,
    pub(crate) wake: EventFd,
    /// Messages from non-runtime threads.
    pub(crate) external: Mutex<External>,
    /// Set (under the lock) when `external` has messages: the loop takes
    /// the lock only then.
    pub(crate) external_pending: AtomicBool,
}

#[derive(Default)]
pub(crate) struct External {
    pub(crate) queue: VecDeque<Msg>,
    /// The thread has exited: nothing will run what is pushed.
    pub(crate) closed: bool,
}

impl ThreadShared {
    /// Wakes the thread if it sleeps. Call after making a message visible.
    pub(crate) fn notify(&self) {
        // Pairs with the fence in `Reactor::sleep`: either the thread sees
        // the message before sleeping, or this sees `asleep` set.
        fence(Ordering::SeqCst);
        self.wake_if_asleep();
    }

    fn wake_if_asleep(&self) {
        if self.asleep.load(Ordering::Relaxed) {
            if let Err(e) = self.wake.signal() {
                tracing::error!(thread = self.index, "waking runtime thread failed: {e}");
            }
        }
    }
}

/// The whole runtime's shared state.
pub(crate) struct Shared {
    pub(crate) threads: Vec<Arc<ThreadShared>>,
    /// Shutdown requested: external senders are refused, threads drain.
    pub(crate) stop: AtomicBool,
}

/// Identifies a poller on its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PollerId(pub(crate) u64);

/// Identifies a timer on its thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

type PollerFn = Box<dyn FnMut(&mut ThreadCtx) -> Poll>;
type MovableFn = Box<dyn FnMut(&mut ThreadCtx) -> Poll + Send>;

/// A poller's closure: movable ones may migrate between threads.
enum PollerBox {
    Local(PollerFn),
    Movable(MovableFn),
}

impl PollerBox {
    fn call(&mut self, ctx: &mut ThreadCtx) -> Poll {
        match self {
            PollerBox::Local(f) => f(ctx),
            PollerBox::Movable(f) => f(ctx),
        }
    }
}

/// What a poller carries wherever it runs: its counters.
#[derive(Clone, Debug)]
struct Counters {
    runs: u64,
    busy_runs: u64,
    /// Time inside the poller in runs that reported Busy / Idle.
    busy: Duration,
    idle: Duration,
    /// The thread it was registered on.
    home: usize,
    /// Times the scheduler moved it.
    moves: u64,
    /// When the scheduler last measured it, and its busy time then.
    mark: (Instant, Duration),
}

impl Counters {
    fn new(home: usize, now: Instant) -> Self {
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

    fn charge(&mut self, busy: bool, spent: Duration) {
        if busy {
            self.busy += spent;
        } else {
            self.idle += spent;
        }
    }
}

/// A movable poller in transit to another thread.
struct Moving {
    id: PollerId,
    name: String,
    f: MovableFn,
    c: Counters,
}
type DrainFn = Box<dyn FnMut(&mut ThreadCtx) -> bool>;

struct PollerEntry {
    id: PollerId,
    name: String,
    /// None while it runs (so it can get `&mut ThreadCtx`).
    f: Option<PollerBox>,
    c: Counters,
    /// Registered as movable (its closure is `Send`); kept apart from `f`,
    /// which is None while it runs.
    movable: bool,
    removed: bool,
}

enum TimerKind {
    Once(Box<dyn FnOnce(&mut ThreadCtx)>),
    Periodic(Duration, Box<dyn FnMut(&mut ThreadCtx)>),
}

#[derive(Default)]
struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    live: HashMap<u64, TimerKind>,
    /// The periodic timer running now, and whether it cancelled itself.
    firing: Option<(u64, bool)>,
}

impl Timers {
    /// The earliest deadline of a live timer (drops cancelled ones on top).
    fn next_deadline(&mut self) -> Option<Instant> {
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
    shared: Arc<Shared>,
    me: Arc<ThreadShared>,
    now: Instant,
    /// One SPSC ring to each thread (including this one).
    producers: Vec<rtrb::Producer<Msg>>,
    /// Messages that did not fit in a full ring, per target, in order.
    backlog: Vec<VecDeque<Msg>>,
    backlogged: usize,
    /// Targets sent to since the last notification pass.
    to_notify: Vec<usize>,
    notify_marked: Vec<bool>,
    pollers: Vec<PollerEntry>,
    next_id: u64,
    timers: Timers,
    drains: Vec<(String, Option<DrainFn>)>,
    sleep_hooks: Vec<Box<dyn FnMut() -> bool>>,
    wake_fds: Vec<RawFd>,
    epoll: Epoll,
    stats: ThreadStats,
    draining: bool,
    /// Scheduler state: busy and total time at the last tick, the main
    /// thread's load, and whether an offer to the main thread is out.
    load_mark: (Duration, Duration),
    /// Thread 0's scheduler state (None elsewhere, or with no scheduler).
    planner: Option<Box<Planner>>,
}

/// Thread 0's scheduler state: one round per period gathers every
/// thread's [`ThreadLoad`], plans with [`sched::plan`] and orders the moves.
struct Planner {
    opts: SchedulerOptions,
    round: u64,
    /// Reports still awaited this round.
    waiting: usize,
    loads: Vec<ThreadLoad>,
    /// Moves ordered and not yet landed.
    in_flight: usize,
    /// The first round whose loads were all measured after the last move
    /// landed.
    quiet_from: u64,
    /// The round each recently moved poller moved in (for the dwell).
    moved_in_round: HashMap<PollerId, u64>,
}

/// Token of the thread's own eventfd and timerfd in its epoll set; user
/// descriptors get token 2.
const TOKEN_WAKE: u64 = 0;
const TOKEN_TIMER: u64 = 1;
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
    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        ((self.me.index as u64) << 48) | self.next_id
    }

    /// Registers a poller the scheduler (see
    /// [`RuntimeOptions::scheduler`](crate::RuntimeOptions::scheduler)) may
    /// move to another thread, keeping its id and counters: it must be
    /// `Send` and must not rely on which thread runs it (it reads
    /// [`index`](Self::index) to know). It can remove itself with
    /// [`unregister_poller`](Self::unregister_poller) wherever it runs.
    /// This thread is its home: when load rises, the scheduler sends it
    /// back here first if it fits (see
    /// [`SchedulerOptions`](crate::SchedulerOptions)). Timers, drain
    /// callbacks and wake descriptors stay on the thread that registered
    /// them.
    pub fn register_movable_poller(
        &mut self,
        name: impl Into<String>,
        f: impl FnMut(&mut ThreadCtx) -> Poll + Send + 'static,
    ) -> PollerId {
        let id = PollerId(self.fresh_id());
        self.adopt(Moving {
            id,
            name: name.into(),
            f: Box::new(f),
            c: Counters::new(self.me.index, self.now),
        });
        id
    }

    fn adopt(&mut self, m: Moving) {
        self.pollers.push(PollerEntry {
            id: m.id,
            name: m.name,
            f: Some(PollerBox::Movable(m.f)),
            c: m.c,
            movable: true,
            removed: false,
        });
    }

    /// Takes movable poller `id` out to send it to another thread (from a
    /// message, between poller passes); None if it is not here, was
    /// removed or is not movable.
    fn take_poller(&mut self, id: PollerId) -> Option<Moving> {
        let k = self
            .pollers
            .iter()
            .position(|p| p.id == id && !p.removed && p.movable && p.f.is_some())?;
        let p = self.pollers.remove(k);
        match p.f {
            Some(PollerBox::Movable(f)) => Some(Moving {
                id: p.id,
                name: p.name,
                f,
                c: p.c,
            }),
            _ => None,
        }
    }

    /// The share of time busy since the last call (0..=1).
    fn load_since_last(&mut self) -> f64 {
        let s = &self.stats;
        let (busy, total) = (s.busy, s.busy + s.idle + s.asleep);
        let (b0, t0) = std::mem::replace(&mut self.load_mark, (busy, total));
        let dt = total.saturating_sub(t0).as_secs_f64();
        if dt <= 0.0 {
            return 0.0;
        }
        (busy.saturating_sub(b0).as_secs_f64() / dt).min(1.0)
    }

    /// This thread's load and its movable pollers' busy shares since the
    /// last report (for the scheduler on thread 0).
    fn load_report(&mut self) -> ThreadLoad {
        let load = self.load_since_last();
        let now = self.now;
        let movable = self
            .pollers
            .iter_mut()
            .filter(|p| !p.removed && p.movable)
            .map(|p| {
                let (t0, b0) = std::mem::replace(&mut p.c.mark, (now, p.c.busy));
                let dt = now.saturating_duration_since(t0).as_secs_f64();
                let share = if dt > 0.0 {
                    (p.c.busy.saturating_sub(b0).as_secs_f64() / dt).min(1.0)
                } else {
                    0.0
                };
                MovableLoad {
                    id: p.id,
                    share,
                    home: p.c.home,
                    eligible: true,
                }
            })
            .collect();
        ThreadLoad { load, movable }
    }

    /// The scheduler tick (a periodic timer on thread 0 when the scheduler
    /// is on): starts a round by asking every thread for its load report.
    fn scheduler_tick(&mut self) {
        if self.draining {
            return;
        }
        let n = self.thread_count();
        let Some(pl) = self.planner.as_mut() else {
            return;
        };
        if pl.waiting > 0 {
            return; // the last round's reports are not all in yet
        }
        pl.round += 1;
        let round = pl.round;
        pl.waiting = n;
        pl.loads = vec![ThreadLoad::default(); n];
        let mine = self.load_report();
        self.on_load_report(round, 0, mine);
        for i in 1..n {
            let r = self.call(
                i,
                |ctx| ctx.load_report(),
                move |main, load| main.on_load_report(round, i, load),
            );
            if let Err(e) = r {
                tracing::debug!(thread = i, "scheduler: round {round} abandoned: {e}");
                if let Some(pl) = self.planner.as_mut() {
                    // Late reports of this round are ignored.
                    pl.round += 1;
                    pl.waiting = 0;
                }
                return;
            }
        }
    }

    /// Thread 0 takes thread `index`'s report; with the round's last one
    /// it plans and orders the moves.
    fn on_load_report(&mut self, round: u64, index: usize, load: ThreadLoad) {
        let Some(pl) = self.planner.as_mut() else {
            return;
        };
        if round != pl.round || pl.waiting == 0 || index >= pl.loads.len() {
            return;
        }
        pl.loads[index] = load;
        pl.waiting -= 1;
        if pl.waiting > 0 || pl.in_flight > 0 || round < pl.quiet_from || self.draining {
            return;
        }
        let dwell = u64::from(pl.opts.min_dwell);
        pl.moved_in_round.retain(|_, r| round - *r < dwell);
        for t in &mut pl.loads {
            for m in &mut t.movable {
                m.eligible = !pl.moved_in_round.contains_key(&m.id);
            }
        }
        let moves = sched::plan(&pl.loads, &pl.opts);
        if moves.is_empty() {
            return;
        }
        pl.in_flight += moves.len();
        for m in &moves {
            pl.moved_in_round.insert(m.id, round);
        }
        tracing::debug!(
            round,
            loads = ?pl.loads.iter().map(|t| t.load).collect::<Vec<_>>(),
            ?moves,
            "scheduler: moving pollers"
        );
        for Move { id, from, to } in moves {
            if let Err(e) = self.send(from, move |src| src.move_out(id, to)) {
                tracing::debug!(from, "scheduler: move not ordered: {e}");
                self.move_landed();
            }
        }
    }

    /// On the source thread: sends poller `id` to thread `to`.
    fn move_out(&mut self, id: PollerId, to: usize) {
        let target_gone = !matches!(self.producers.get(to), Some(p) if !p.is_abandoned());
        let taken = if target_gone || to == self.index() {
            None
        } else {
            self.take_poller(id)
        };
        let Some(m) = taken else {
            // Removed meanwhile, or the target has exited.
            self.report_landed();
            return;
        };
        self.stats.pollers_moved_out += 1;
        let from = self.index();
        if let Err(e) = self.send(to, move |dst| dst.move_in(m)) {
            // Only in a race with the target's exit at shutdown.
            tracing::warn!(from, to, "scheduler: poller dropped in transit: {e}");
            self.report_landed();
        }
    }

    /// On the target thread: adopts a moved poller.
    fn move_in(&mut self, mut m: Moving) {
        m.c.moves += 1;
        self.stats.pollers_moved_in += 1;
        self.adopt(m);
        self.report_landed();
    }

    fn report_landed(&mut self) {
        if let Err(e) = self.send(0, |main| main.move_landed()) {
            tracing::debug!(thread = self.index(), "scheduler: move report lost: {e}");
        }
    }

    /// On thread 0: a move ordered has completed (or was dropped).
    fn move_landed(&mut self) {
        if let Some(pl) = self.planner.as_mut() {
            pl.in_flight = pl.in_flight.saturating_sub(1);
            if pl.in_flight == 0 {
                // Loads of the next round were partly measured before
                // the move: plan again only with the one after.
                pl.quiet_from = pl.round + 2;
            }
        }
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
    fn flush_backlog(&mut self) -> bool {
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
    fn notify_targets(&mut self) {
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

/// Locks, ignoring poisoning (the data are queues that stay consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
