//! pollux's thread-per-core runtime, modelled on SPDK's reactors.
//!
//! # Model
//!
//! [`Runtime::start`] spawns one OS thread per entry of a core list and pins
//! it there ([`pin_to_core`], which pins any thread; a failure is logged
//! and the thread runs unpinned). Each thread owns its state outright —
//! nothing is shared between threads except through messages — and runs a
//! loop:
//!
//! 1. read the clock once ([`ThreadCtx::now`]) and charge the previous
//!    iteration to busy, idle or asleep time;
//! 2. run the messages in its inbox: closures
//!    (`FnOnce(&mut ThreadCtx) + Send`) sent by other threads;
//! 3. run the timers whose deadline passed (one-shot or periodic, kept in
//!    a binary heap of deadlines);
//! 4. run every registered poller (`FnMut(&mut ThreadCtx) -> Poll`): a
//!    poller checks for work (e.g. a completion queue) and reports
//!    [`Poll::Busy`] or [`Poll::Idle`].
//!
//! # Messages
//!
//! Each thread's inbox is one single-producer single-consumer ring per
//! runtime thread (`rtrb`, lock-free: a Release store and an Acquire load
//! per message), so runtime threads send to each other
//! ([`ThreadCtx::send`], [`ThreadCtx::call`] with a reply back to the
//! sender's thread) without locks or atomic read-modify-writes. Messages
//! from one thread to another run in the order sent; a full ring spills to
//! a backlog on the sending side, flushed in order by the sender's loop.
//! Threads outside the runtime use [`RuntimeHandle::send`] and
//! [`RuntimeHandle::call`] (blocking for the result), which go through a
//! mutex-protected queue per thread.
//!
//! # Idle sleep
//!
//! When nothing (message, timer, poller) did work for
//! [`RuntimeOptions::idle_threshold`], the thread runs its
//! [`ThreadCtx::on_sleep`] hooks (which arm interrupt descriptors, or veto
//! the sleep), arms a timerfd for its next timer and sleeps in epoll on
//! that timerfd, its own eventfd and the descriptors registered with
//! [`ThreadCtx::register_wake_fd`] (e.g. a queue pair's interrupt
//! descriptor). A thread publishes that it is asleep in a flag; senders
//! write its eventfd only when the flag is set, so busy threads pay no
//! syscall per message. (A runtime thread issues one `SeqCst` fence per
//! loop iteration in which it sent something, to order its messages before
//! its read of the flag.)
//!
//! # Stats
//!
//! [`RuntimeHandle::stats`] (or [`ThreadCtx::stats`] on the thread)
//! returns per-thread busy/idle/asleep time, loop, message, timer and
//! sleep counts, and per-poller run and busy counts and busy/idle time
//! (time spent in the poller in runs that reported busy or idle; a thread
//! with `n` pollers reads the clock `n - 1` more times per pass for it, one
//! with a single poller no more: see [`ThreadCtx::register_poller`]).
//!
//! # Shutdown
//!
//! [`RuntimeHandle::shutdown`] refuses further messages from outside the
//! runtime, wakes every thread and lets each keep looping (messages,
//! timers, pollers) while calling its [`ThreadCtx::register_drain`]
//! callbacks until they all report drained and its inbox is empty, or
//! [`RuntimeOptions::drain_timeout`] passes; then it joins the threads.
//! [`RuntimeHandle::stop_on_signals`] triggers this on SIGINT/SIGTERM.
//!
//! # Scheduler
//!
//! Optionally ([`RuntimeOptions::scheduler`]), a dynamic scheduler as
//! SPDK's moves pollers registered as movable
//! ([`ThreadCtx::register_movable_poller`]) by their busy time: when
//! threads are lightly loaded their pollers gather on the lowest threads
//! that have room (thread 0 first) and the emptied cores sleep; when a
//! thread is overloaded it hands pollers back out (home first). A moved
//! poller keeps its id and counters and shows in the stats of the thread
//! running it; [`ThreadStats::pollers_moved_in`] and
//! [`ThreadStats::pollers_moved_out`] count the moves. See
//! [`SchedulerOptions`].

mod reactor;
mod sched;
mod sys;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use reactor::{PollerId, PollerStats, ThreadCtx, ThreadStats, TimerId};
pub use sys::{pin_to_core, Epoll, EventFd, PinError};

use reactor::{lock, External, Prepared, Reactor, Shared, ThreadShared};

/// A message: a closure run on the target thread.
pub(crate) type Msg = Box<dyn FnOnce(&mut ThreadCtx) + Send>;

/// What a poller found when it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// It did work: keep polling.
    Busy,
    /// Nothing to do.
    Idle,
}

/// Errors of the runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the core list is empty: a runtime needs at least one core")]
    NoCores,
    #[error("core {core} appears twice in the core list (one thread per core)")]
    DuplicateCore { core: usize },
    #[error("inbox capacity must be at least 1 (got 0)")]
    ZeroCapacity,
    #[error("no runtime thread {index}: the runtime has {count} threads")]
    NoSuchThread { index: usize, count: usize },
    #[error("the runtime is shutting down: message refused")]
    ShuttingDown,
    #[error("runtime thread {index} has exited")]
    ThreadGone { index: usize },
    #[error("runtime thread {index} (core {core}) panicked")]
    ThreadPanicked { index: usize, core: usize },
    #[error("scheduler option {option} = {value}: {reason}")]
    SchedulerOption {
        option: &'static str,
        value: String,
        reason: &'static str,
    },
    #[error("descriptor {fd} is not registered as a wake descriptor on this thread")]
    NotRegistered { fd: std::os::fd::RawFd },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Tuning of a runtime.
#[derive(Clone, Debug)]
pub struct RuntimeOptions {
    /// How long a thread polls without finding work before it sleeps.
    pub idle_threshold: Duration,
    /// How long shutdown waits for a thread's drain callbacks.
    pub drain_timeout: Duration,
    /// Slots of each SPSC ring between two runtime threads.
    pub inbox_capacity: usize,
    /// Name prefix of the OS threads (`{prefix}-{core}`).
    pub thread_name: String,
    /// Moves movable pollers off lightly loaded threads (None: off).
    pub scheduler: Option<SchedulerOptions>,
}

/// The dynamic scheduler, modelled on SPDK's `scheduler_dynamic`: it moves
/// movable pollers ([`ThreadCtx::register_movable_poller`]) between
/// threads by their busy time.
///
/// Every `period` thread 0 asks every thread for its load (busy share of
/// its time since the last ask) and the busy share of each of its movable
/// pollers, then:
///
/// - spreads: a thread busier than `heavy_load` hands movable pollers out
///   one at a time (while it stays over the limit), each to its home
///   thread (where it was registered) if it fits there, else to the least
///   loaded thread, choosing the move that best evens out the two loads;
///   a poller that is (nearly) all of its thread's load stays;
/// - consolidates: a thread other than thread 0 at most `light_load` busy
///   hands all its movable pollers to lower threads (lowest first) if
///   they all fit, so it empties and sleeps.
///
/// A poller "fits" on a thread if that thread's load plus the poller's
/// share stays at most `fit_load`. A poller that moved stays put for
/// `min_dwell` periods, and no plan is made until a full period has passed
/// after the last move landed (the loads measured across a move are
/// mixed). Keep `light_load < heavy_load` and `fit_load < heavy_load` (the
/// gap is the hysteresis that keeps pollers from bouncing);
/// [`Runtime::start`] refuses other values.
///
/// Cost: one message to every thread per period (a sleeping thread wakes
/// for it), and one periodic timer on thread 0.
#[derive(Clone, Debug)]
pub struct SchedulerOptions {
    /// How often thread 0 gathers loads and moves pollers.
    pub period: Duration,
    /// A thread at most this busy (share of its time) gives its movable
    /// pollers away to lower threads.
    pub light_load: f64,
    /// A thread takes a poller in only while its load plus the poller's
    /// stays at most this.
    pub fit_load: f64,
    /// A thread busier than this hands movable pollers out.
    pub heavy_load: f64,
    /// Periods a moved poller stays on its new thread before it may move
    /// again.
    pub min_dwell: u32,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            period: Duration::from_millis(100),
            light_load: 0.2,
            fit_load: 0.8,
            heavy_load: 0.9,
            min_dwell: 3,
        }
    }
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            idle_threshold: Duration::from_micros(200),
            drain_timeout: Duration::from_secs(5),
            inbox_capacity: 1024,
            thread_name: "pollux-rt".into(),
            scheduler: None,
        }
    }
}

/// Entry point: see the crate docs.
pub struct Runtime;

impl Runtime {
    /// Starts one pinned thread per core of `cores` (thread `i` runs on
    /// `cores[i]`). Each thread first runs `init` (e.g. to register its
    /// pollers).
    pub fn start(cores: &[usize], opts: RuntimeOptions) -> Result<RuntimeHandle> {
        Self::start_with(cores, opts, |_| {})
    }

    /// [`start`](Self::start), running `init` on each thread before its
    /// loop.
    pub fn start_with(
        cores: &[usize],
        opts: RuntimeOptions,
        init: impl Fn(&mut ThreadCtx) + Send + Sync + 'static,
    ) -> Result<RuntimeHandle> {
        if cores.is_empty() {
            return Err(Error::NoCores);
        }
        for (i, c) in cores.iter().enumerate() {
            if cores[..i].contains(c) {
                return Err(Error::DuplicateCore { core: *c });
            }
        }
        if opts.inbox_capacity == 0 {
            return Err(Error::ZeroCapacity);
        }
        if let Some(sched) = &opts.scheduler {
            sched::validate(sched)?;
        }
        let n = cores.len();
        let mut threads = Vec::with_capacity(n);
        for (index, &core) in cores.iter().enumerate() {
            let wake = EventFd::new().map_err(|source| Error::Io {
                what: format!("creating the wake eventfd of runtime thread {index} (core {core})"),
                source,
            })?;
            threads.push(Arc::new(ThreadShared {
                index,
                core,
                asleep: AtomicBool::new(false),
                wake,
                external: Mutex::new(External::default()),
                external_pending: AtomicBool::new(false),
            }));
        }
        let shared = Arc::new(Shared {
            threads,
            stop: AtomicBool::new(false),
        });
        // rings[from][to]
        let mut producers: Vec<Vec<_>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        let mut consumers: Vec<Vec<_>> = (0..n).map(|_| Vec::with_capacity(n)).collect();
        for from in producers.iter_mut() {
            for to in consumers.iter_mut() {
                let (p, c) = rtrb::RingBuffer::new(opts.inbox_capacity);
                from.push(p);
                to.push(c);
            }
        }
        let mut reactors = Vec::with_capacity(n);
        for (index, (p, c)) in producers.into_iter().zip(consumers).enumerate() {
            reactors.push(Prepared::new(shared.clone(), index, p, c, opts.clone())?);
        }
        let init = Arc::new(init);
        let mut joins = Vec::with_capacity(n);
        for (index, reactor) in reactors.into_iter().enumerate() {
            let core = cores[index];
            let init = init.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("{}-{core}", opts.thread_name))
                .spawn(move || {
                    if let Err(e) = sys::pin_to_core(core) {
                        tracing::warn!(
                            thread = index,
                            core,
                            "could not pin runtime thread to core {core}: {e}"
                        );
                    }
                    Reactor::run_with(reactor, |ctx| init(ctx));
                });
            match spawned {
                Ok(j) => joins.push(j),
                Err(source) => {
                    // Stop those already started.
                    let h = RuntimeHandle {
                        shared,
                        joins: Mutex::new(joins),
                        cores: cores.to_vec(),
                    };
                    h.request_shutdown();
                    let _ = h.wait();
                    return Err(Error::Io {
                        what: format!("spawning runtime thread {index} (core {core})"),
                        source,
                    });
                }
            }
        }
        Ok(RuntimeHandle {
            shared,
            joins: Mutex::new(joins),
            cores: cores.to_vec(),
        })
    }
}

/// Controls a running runtime. Dropping it shuts the runtime down.
pub struct RuntimeHandle {
    shared: Arc<Shared>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    cores: Vec<usize>,
}

impl RuntimeHandle {
    /// How many threads the runtime has.
    pub fn thread_count(&self) -> usize {
        self.cores.len()
    }

    /// The core list: thread `i` runs on `cores()[i]`.
    pub fn cores(&self) -> &[usize] {
        &self.cores
    }

    /// Sends `f` to run on thread `index`. Messages from one sender
    /// thread run in the order sent. Do not call from a runtime thread
    /// (use [`ThreadCtx::send`]).
    pub fn send(
        &self,
        index: usize,
        f: impl FnOnce(&mut ThreadCtx) + Send + 'static,
    ) -> Result<()> {
        send_external(&self.shared, index, Box::new(f))
    }

    /// Runs `f` on thread `index` and waits for its result. Never call it
    /// from a runtime thread (it would block that thread's loop).
    pub fn call<R: Send + 'static>(
        &self,
        index: usize,
        f: impl FnOnce(&mut ThreadCtx) -> R + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.send(index, move |ctx| {
            let _ = tx.send(f(ctx));
        })?;
        // The closure is dropped unrun only if the thread exits first.
        rx.recv().map_err(|_| Error::ThreadGone { index })
    }

    /// The counters of every thread, read on each thread by a message.
    ///
    /// Each thread reports in turn, not at one instant: a poller that
    /// moves between two threads' reports shows on both, or on neither.
    pub fn stats(&self) -> Result<Vec<ThreadStats>> {
        (0..self.thread_count())
            .map(|i| self.call(i, |ctx| ctx.stats()))
            .collect()
    }

    /// Whether thread `index` sleeps in epoll right now (for tests and
    /// monitoring: it may change at once).
    pub fn is_asleep(&self, index: usize) -> bool {
        self.shared
            .threads
            .get(index)
            .is_some_and(|t| t.asleep.load(Ordering::Relaxed))
    }

    /// A cloneable, sendable trigger of shutdown (e.g. for a signal
    /// handler thread).
    pub fn shutdown_trigger(&self) -> ShutdownTrigger {
        ShutdownTrigger {
            shared: self.shared.clone(),
        }
    }

    /// Starts shutdown without waiting: see [`shutdown`](Self::shutdown).
    pub fn request_shutdown(&self) {
        self.shutdown_trigger().trigger();
    }

    /// Waits for the threads to exit (after a shutdown was requested).
    pub fn wait(&self) -> Result<()> {
        let joins = std::mem::take(&mut *lock(&self.joins));
        let mut result = Ok(());
        for (index, j) in joins.into_iter().enumerate() {
            if j.join().is_err() {
                let core = self.cores[index];
                tracing::error!(thread = index, core, "runtime thread panicked");
                result = Err(Error::ThreadPanicked { index, core });
            }
        }
        result
    }

    /// Refuses further messages from outside the runtime, lets every
    /// thread drain (its drain callbacks report drained and its inbox is
    /// empty, or the drain timeout passes), and joins the threads.
    /// Runtime threads may still message each other while draining, but
    /// each exits on its own once drained: a later message to it fails
    /// with [`Error::ThreadGone`] (or, in a race with its exit, is dropped
    /// unrun).
    pub fn shutdown(&self) -> Result<()> {
        self.request_shutdown();
        self.wait()
    }

    /// Triggers shutdown on SIGINT or SIGTERM (the process no longer dies
    /// of them while the watcher lives). Wait with
    /// [`wait`](Self::wait).
    pub fn stop_on_signals(&self) -> Result<SignalWatcher> {
        SignalWatcher::new(self.shutdown_trigger())
    }
}

impl Drop for RuntimeHandle {
    fn drop(&mut self) {
        self.request_shutdown();
        let _ = self.wait();
    }
}

/// Sends closures to a runtime's threads from any thread (a worker
/// thread's results, say): a cheap handle to clone and keep, unlike
/// [`RuntimeHandle`], which owns the runtime. From
/// [`ThreadCtx::remote`]. Sending fails once the runtime shuts down (the
/// closure is dropped unrun).
#[derive(Clone)]
pub struct Remote {
    pub(crate) shared: Arc<Shared>,
}

impl Remote {
    /// Sends `f` to run on thread `index` (as [`RuntimeHandle::send`]).
    /// Do not call from a runtime thread (use [`ThreadCtx::send`]).
    pub fn send(
        &self,
        index: usize,
        f: impl FnOnce(&mut ThreadCtx) + Send + 'static,
    ) -> Result<()> {
        send_external(&self.shared, index, Box::new(f))
    }
}

fn send_external(shared: &Shared, index: usize, msg: Msg) -> Result<()> {
    let count = shared.threads.len();
    let t = shared
        .threads
        .get(index)
        .ok_or(Error::NoSuchThread { index, count })?;
    {
        let mut ext = lock(&t.external);
        if ext.closed {
            return Err(Error::ThreadGone { index });
        }
        if shared.stop.load(Ordering::Relaxed) {
            return Err(Error::ShuttingDown);
        }
        ext.queue.push_back(msg);
        t.external_pending.store(true, Ordering::Release);
    }
    t.notify();
    Ok(())
}

/// Starts the shutdown of a runtime; see [`RuntimeHandle::shutdown`].
#[derive(Clone)]
pub struct ShutdownTrigger {
    shared: Arc<Shared>,
}

impl ShutdownTrigger {
    /// Requests shutdown and wakes every thread so it starts draining.
    pub fn trigger(&self) {
        for t in &self.shared.threads {
            // Under the lock: no external message is accepted after this.
            let _guard = lock(&t.external);
            self.shared.stop.store(true, Ordering::SeqCst);
        }
        for t in &self.shared.threads {
            if let Err(e) = t.wake.signal() {
                tracing::error!(
                    thread = t.index,
                    "waking runtime thread for shutdown failed: {e}"
                );
            }
        }
    }

    /// Whether shutdown was requested.
    pub fn is_triggered(&self) -> bool {
        self.shared.stop.load(Ordering::Relaxed)
    }
}

/// A thread that triggers shutdown on SIGINT/SIGTERM; dropping it stops
/// watching.
pub struct SignalWatcher {
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl SignalWatcher {
    fn new(trigger: ShutdownTrigger) -> Result<Self> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals =
            signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|source| Error::Io {
                what: "installing SIGINT/SIGTERM handlers".into(),
                source,
            })?;
        let handle = signals.handle();
        let thread = std::thread::Builder::new()
            .name("pollux-rt-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    tracing::info!(signal = sig, "signal received: shutting the runtime down");
                    trigger.trigger();
                }
            })
            .map_err(|source| Error::Io {
                what: "spawning the signal watcher thread".into(),
                source,
            })?;
        Ok(Self {
            handle,
            thread: Some(thread),
        })
    }
}

impl Drop for SignalWatcher {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The handle and trigger may be shared with other threads.
const _: () = {
    const fn is<T: Send + Sync>() {}
    is::<RuntimeHandle>();
    is::<ShutdownTrigger>();
};
