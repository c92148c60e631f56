//! The perf hot loop: one pinned thread polls its queue pairs; each
//! completion immediately submits the slot's next I/O through the
//! `Submitter` it is handed, and the poll rings the doorbells once.
//!
//! Budget per I/O: the pattern's step (`pattern.rs`: no division). The
//! clock is read per I/O only with `-L`; verification work only with
//! `--verify`.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pollux_host::multipath::PathStats;
use pollux_host::{
    Completion, Handler, IoBuf, MpQueuePair, Namespace, QpairStats, QueuePair, Refused,
    SubmitError, Submitter,
};
use pollux_softnvme::SoftDevice;

use crate::common::clock::thread_cpu_time;
use crate::common::errlog::ErrorLog;
use crate::common::latency;
use crate::common::pattern::Pattern;
use crate::common::verify::Verify;

use super::args::PollMode;
use super::hybrid::{Hybrid, HybridStats};

pub struct Latency {
    pub clock: crate::common::clock::LatClock,
    /// Per slot: the submission time in clock ticks, shifted left by one,
    /// and in the low bit the index in `hist` of the I/O in flight.
    pub submit: Vec<u64>,
    /// Latencies in clock ticks (converted to ns in the report): one
    /// histogram, or for a mixed workload two, reads then writes.
    pub hist: Vec<Histogram<u64>>,
    /// `hist.len() - 1`: the mask of the index.
    pub mixed: u64,
}

/// Everything a job needs besides its queue pair.
pub struct JobCtx {
    pub label: String,
    pub ns: Namespace,
    /// Each slot's buffer while it is not in flight (in flight, the queue
    /// pair holds it; it comes back with the completion).
    pub bufs: Vec<Option<IoBuf>>,
    pub io_size: usize,
    pub nlb: u32,
    /// Where the I/Os go (units of the namespace) and which read.
    pub pat: Pattern,
    /// I/Os still to submit.
    /// I/Os this job submits in total (`u64::MAX`: until stopped). Set
    /// once; `stop_at` is derived from it when the run starts.
    pub total: u64,
    /// A completion resubmits its slot while `ios <= stop_at` (the count
    /// kept anyway; no second counter per I/O). Zero stops submitting.
    pub stop_at: u64,
    pub ios: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// Logs each kind of error once and counts its repeats.
    pub errlog: ErrorLog,
    pub latency: Option<Latency>,
    pub verify: Option<Verify>,
    /// `latency.is_some() || verify.is_some()`: one test per I/O side keeps
    /// the plain benchmark free of both.
    pub slow: bool,
    /// Per slot: LBA of the I/O in flight (only kept with --verify).
    pub slot_lba: Vec<u64>,
    /// Slots whose last submission was refused and that are owed another
    /// one: the worker loop tries them again on its cold path (never the
    /// submit path itself, so a run of refusals cannot recurse).
    pub retry: Vec<usize>,
}

/// A job: a queue pair (any transport: one match per poll, not per I/O,
/// each transport's poll monomorphised) and what drives it. Not boxed:
/// jobs sit in a worker's vector and never move while it runs.
pub struct Job {
    pub qp: QueuePair,
    pub ctx: JobCtx,
}

/// What the worker loop drives: a job on one queue pair ([`Job`]) or on
/// a multipath namespace ([`MpJob`]). The loop is monomorphised per
/// kind: a plain run's is what it was before multipath.
pub trait WorkerJob: Send {
    fn poll(&mut self) -> u32;
    fn start(&mut self);
    fn retry_failed(&mut self);
    fn ctx(&self) -> &JobCtx;
    fn ctx_mut(&mut self) -> &mut JobCtx;
    fn in_flight(&self) -> usize;
    /// See `QueuePair::arm` (no interrupts: `Ok(false)`, poll instead).
    fn arm(&mut self) -> Result<bool, pollux_host::Error>;
    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>>;
    fn into_result(self) -> JobResult;
}

impl WorkerJob for Job {
    #[inline(always)]
    fn poll(&mut self) -> u32 {
        // One loop per kind (each monomorphised): the plain run's tests
        // neither -L nor --verify per I/O, and random reads (the common
        // benchmark) test neither the read/write mix nor the order.
        if self.ctx.slow {
            self.qp
                .poll_with(u32::MAX, &mut Measured::<true, false>(&mut self.ctx))
        } else if self.ctx.pat.random_reads() {
            self.qp
                .poll_with(u32::MAX, &mut Measured::<false, true>(&mut self.ctx))
        } else {
            self.qp
                .poll_with(u32::MAX, &mut Measured::<false, false>(&mut self.ctx))
        }
    }

    fn start(&mut self) {
        let Job { qp, ctx } = self;
        ctx.fill(qp);
    }

    fn retry_failed(&mut self) {
        self.ctx.retry_failed(&mut self.qp)
    }

    #[inline(always)]
    fn ctx(&self) -> &JobCtx {
        &self.ctx
    }

    #[inline(always)]
    fn ctx_mut(&mut self) -> &mut JobCtx {
        &mut self.ctx
    }

    fn in_flight(&self) -> usize {
        self.qp.in_flight()
    }

    fn arm(&mut self) -> Result<bool, pollux_host::Error> {
        self.qp.arm()
    }

    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.qp.interrupt_fd()
    }

    /// Out of line: the run's loop stays as small as before -L's figures.
    #[cold]
    #[inline(never)]
    fn into_result(self) -> JobResult {
        let doorbells = matches!(self.qp, QueuePair::Pcie(_));
        let qp = self.qp.stats();
        self.ctx.into_result(doorbells, qp, None)
    }
}

/// A job on a multipath namespace: its queue pair on every path, and the
/// longest time between two polls that found completions (the failover
/// gap: one clock read per poll that finds completions, multipath runs
/// only).
pub struct MpJob {
    pub mp: MpQueuePair,
    pub ctx: JobCtx,
    pub clock: crate::common::clock::LatClock,
    /// Clock of the last poll that found completions, and the longest
    /// interval between two such polls, in clock ticks.
    pub last: u64,
    pub max_gap: u64,
}

impl WorkerJob for MpJob {
    #[inline(always)]
    fn poll(&mut self) -> u32 {
        let ctx = &mut self.ctx;
        let n = if ctx.slow {
            self.mp
                .poll(|mp, c| ctx.on_complete::<_, true, false>(mp, c))
        } else {
            self.mp
                .poll(|mp, c| ctx.on_complete::<_, false, false>(mp, c))
        };
        if n > 0 {
            let now = self.clock.now();
            self.max_gap = self.max_gap.max(now.wrapping_sub(self.last));
            self.last = now;
        }
        n
    }

    fn start(&mut self) {
        self.last = self.clock.now();
        self.ctx.fill(&mut self.mp);
    }

    fn retry_failed(&mut self) {
        self.ctx.retry_failed(&mut self.mp)
    }

    #[inline(always)]
    fn ctx(&self) -> &JobCtx {
        &self.ctx
    }

    #[inline(always)]
    fn ctx_mut(&mut self) -> &mut JobCtx {
        &mut self.ctx
    }

    fn in_flight(&self) -> usize {
        self.mp.in_flight()
    }

    fn arm(&mut self) -> Result<bool, pollux_host::Error> {
        Ok(false)
    }

    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    #[cold]
    #[inline(never)]
    fn into_result(self) -> JobResult {
        let mut qp = QpairStats::default();
        for i in 0..self.mp.path_stats().len() {
            if let Some(q) = self.mp.path_qpair(i) {
                let s = q.stats();
                qp.submitted += s.submitted;
                qp.completed += s.completed;
                qp.polls += s.polls;
                qp.queued += s.queued;
                qp.timeouts += s.timeouts;
            }
        }
        let mp = MpResult {
            max_gap_ticks: self.max_gap,
            paths: self.mp.path_stats(),
        };
        self.ctx.into_result(false, qp, Some(mp))
    }
}

/// Where a job's requests go: a queue pair (or its submitter, inside a
/// poll) or a multipath queue pair (which ignores the namespace: each
/// path has its own).
pub trait Sink {
    fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused>;
    fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused>;
    fn flush(&mut self);
    fn in_flight(&self) -> usize;
}

impl Sink for Submitter<'_> {
    #[inline(always)]
    fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        Submitter::read(self, ns, lba, nlb, buf, ud)
    }
    #[inline(always)]
    fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        Submitter::write(self, ns, lba, nlb, buf, ud)
    }
    fn flush(&mut self) {
        Submitter::flush(self)
    }
    fn in_flight(&self) -> usize {
        Submitter::in_flight(self)
    }
}

impl Sink for QueuePair {
    #[inline(always)]
    fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        QueuePair::read(self, ns, lba, nlb, buf, ud)
    }
    #[inline(always)]
    fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        QueuePair::write(self, ns, lba, nlb, buf, ud)
    }
    fn flush(&mut self) {
        QueuePair::flush(self)
    }
    fn in_flight(&self) -> usize {
        QueuePair::in_flight(self)
    }
}

impl Sink for MpQueuePair {
    #[inline(always)]
    fn read(
        &mut self,
        _: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        MpQueuePair::read(self, lba, nlb, buf, ud)
    }
    #[inline(always)]
    fn write(
        &mut self,
        _: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        ud: u64,
    ) -> Result<(), Refused> {
        MpQueuePair::write(self, lba, nlb, buf, ud)
    }
    fn flush(&mut self) {
        MpQueuePair::flush(self)
    }
    fn in_flight(&self) -> usize {
        MpQueuePair::in_flight(self)
    }
}

/// A job's completion handler; constants of each loop: `SLOW` is
/// `JobCtx::slow` (-L or --verify), `RR` `Pattern::random_reads`.
struct Measured<'a, const SLOW: bool, const RR: bool>(&'a mut JobCtx);

impl<const SLOW: bool, const RR: bool> Handler for Measured<'_, SLOW, RR> {
    #[inline(always)]
    fn complete(&mut self, sub: &mut Submitter<'_>, c: Completion) {
        self.0.on_complete::<_, SLOW, RR>(sub, c)
    }
}

impl JobCtx {
    /// One I/O per slot (-q of them): what the queue cannot hold waits in
    /// the queue pair's backlog.
    fn fill<S: Sink>(&mut self, sink: &mut S) {
        let fill = (self.bufs.len() as u64).min(self.total);
        // Completion k resubmits while fill + k - 1 < total. Set before
        // the first submission: a refused one decides by it too.
        self.stop_at = self.total - fill;
        for slot in 0..fill as usize {
            self.submit_waiting(sink, slot);
        }
        sink.flush();
    }

    #[cold]
    #[inline(never)]
    fn into_result(
        mut self,
        doorbells: bool,
        qp: QpairStats,
        multipath: Option<MpResult>,
    ) -> JobResult {
        self.errlog.finish(&self.label, &mut self.first_errors);
        let hists = self.latency.map(|l| l.hist).unwrap_or_default();
        JobResult {
            doorbells,
            label: self.label,
            ios: self.ios,
            errors: self.errors,
            first_errors: self.first_errors,
            io_size: self.io_size,
            hist: latency::merged(&hists),
            read_write: <[Histogram<u64>; 2]>::try_from(hists).ok(),
            qp,
            multipath,
        }
    }

    /// Submits slot `slot`'s next I/O with its buffer, taken from where it
    /// waits (the first submission of a slot, and retries).
    #[cold]
    pub fn submit_waiting<S: Sink>(&mut self, sub: &mut S, slot: usize) {
        match self.bufs[slot].take() {
            Some(buf) if self.slow => self.submit::<_, true, false>(sub, slot, buf),
            Some(buf) => self.submit::<_, false, false>(sub, slot, buf),
            None => self.error(format!("slot {slot} has no buffer")),
        }
    }

    #[inline(always)]
    pub fn submit<S: Sink, const SLOW: bool, const RR: bool>(
        &mut self,
        sub: &mut S,
        slot: usize,
        mut buf: IoBuf,
    ) {
        let (unit, is_read) = if RR {
            (self.pat.next_random_read(), true)
        } else {
            self.pat.next()
        };
        let lba = unit * self.nlb as u64;
        if SLOW {
            self.before_submit(slot, unit, lba, is_read, &mut buf);
        }
        let r = if is_read {
            sub.read(&self.ns, lba, self.nlb, buf, slot as u64)
        } else {
            sub.write(&self.ns, lba, self.nlb, buf, slot as u64)
        };
        if let Err(e) = r {
            self.submit_failed(slot, lba, e);
        }
    }

    /// A refused submission is a finished I/O with an error: it advances
    /// the count like a completion (so `--io-count` still ends the run) and,
    /// like a completion, earns its slot another submission while the count
    /// allows, made later by `retry_failed`.
    #[cold]
    fn submit_failed(&mut self, slot: usize, lba: u64, e: Refused) {
        self.bufs[slot] = e.buf;
        let e: SubmitError = e.error;
        self.ios += 1;
        self.error(format!("submit at LBA {lba} failed: {e}"));
        if self.ios <= self.stop_at {
            self.retry.push(slot);
        }
    }

    /// Submits the slots whose last submission was refused, once each.
    /// If all of them are refused again while nothing is in flight, no
    /// completion can ever come to change that: the job gives up (its I/O
    /// count stops) instead of spinning or waiting forever.
    #[cold]
    fn retry_failed<S: Sink>(&mut self, qp: &mut S) {
        let slots = std::mem::take(&mut self.retry);
        if self.stop_at == 0 {
            return; // stopped: nothing more is submitted
        }
        for &slot in &slots {
            self.submit_waiting(qp, slot);
        }
        qp.flush();
        if !self.retry.is_empty() && qp.in_flight() == 0 {
            // Reported (always: it explains a short run), not counted: the
            // refusals themselves were.
            let msg = format!(
                "giving up: all {} remaining slots had their submissions refused twice with no I/O in flight",
                self.retry.len()
            );
            tracing::error!("{}: {msg}", self.label);
            self.first_errors.push(msg);
            self.retry.clear();
            self.stop_at = 0;
        }
    }

    #[cold]
    fn before_submit(&mut self, slot: usize, unit: u64, lba: u64, is_read: bool, buf: &mut IoBuf) {
        if let Some(v) = &mut self.verify {
            self.slot_lba[slot] = lba;
            v.prepare(slot, unit, lba, is_read, buf.as_mut_slice());
        }
        if let Some(l) = &mut self.latency {
            l.submit[slot] = l.clock.now() << 1 | (u64::from(!is_read) & l.mixed);
        }
    }

    #[cold]
    fn after_complete(&mut self, slot: usize, ok: bool, buf: Option<IoBuf>) -> Option<IoBuf> {
        if let Some(l) = &mut self.latency {
            let at = l.submit[slot];
            let ticks = l.clock.now().wrapping_sub(at >> 1);
            if let Some(h) = l.hist.get_mut((at & 1) as usize) {
                let _ = h.record(ticks.max(1));
            }
        }
        if let (true, Some(b)) = (ok && self.verify.is_some(), &buf) {
            self.check(slot, b);
        }
        buf
    }

    /// Counts an error; the first of its kind is logged and kept for the
    /// report, repeats are counted and summarised (`ErrorLog`).
    #[cold]
    #[inline(never)]
    fn error(&mut self, msg: String) {
        self.errors += 1;
        self.errlog.error(&self.label, msg, &mut self.first_errors);
    }

    #[inline(always)]
    pub fn on_complete<S: Sink, const SLOW: bool, const RR: bool>(
        &mut self,
        sub: &mut S,
        c: Completion,
    ) {
        let Completion {
            user_data,
            result,
            mut buf,
        } = c;
        let slot = user_data as usize;
        self.ios += 1;
        if SLOW {
            // By value, in and out: a reference would make the completion
            // live in memory on the fast path too.
            buf = self.after_complete(slot, result.is_ok(), buf);
        }
        if let Err(e) = result {
            self.error(format!("I/O failed: {e}"));
        }
        match buf {
            Some(buf) if self.ios <= self.stop_at => self.submit::<_, SLOW, RR>(sub, slot, buf),
            buf => self.park(slot, buf),
        }
    }

    /// The run is over for this slot (or its buffer did not come back):
    /// keep the buffer for the end of the run.
    #[cold]
    fn park(&mut self, slot: usize, buf: Option<IoBuf>) {
        if buf.is_none() {
            self.error(format!("slot {slot}: completion without its buffer"));
        }
        self.bufs[slot] = buf;
    }

    #[cold]
    fn check(&mut self, slot: usize, buf: &IoBuf) {
        let lba = self.slot_lba[slot];
        let Some(v) = &mut self.verify else { return };
        if let Err(m) = v.complete(slot, lba, buf.as_slice()) {
            self.error(format!("verify: LBA {}: {}", m.lba, m.what));
        }
    }
}

/// Shared between the main thread and one worker.
pub struct WorkerCtl {
    pub stop: AtomicBool,
    /// Completed I/Os, published every few hundred loop iterations.
    pub progress: AtomicU64,
}

pub struct JobResult {
    pub label: String,
    pub ios: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub io_size: usize,
    /// Latencies of all I/Os (-L).
    pub hist: Option<Histogram<u64>>,
    /// Reads and writes apart (-L with rw or randrw).
    pub read_write: Option<[Histogram<u64>; 2]>,
    pub qp: QpairStats,
    /// The queue pair rings doorbells (PCIe, emulated or not): its
    /// doorbell counts mean something.
    pub doorbells: bool,
    /// A multipath job's figures.
    pub multipath: Option<MpResult>,
}

/// What a multipath job measured.
pub struct MpResult {
    /// The longest interval between two polls that found completions, in
    /// latency clock ticks.
    pub max_gap_ticks: u64,
    /// Per path: its name and what the job's queue pair did on it.
    pub paths: Vec<(String, PathStats)>,
}

pub struct WorkerResult {
    pub core: Option<usize>,
    /// CPU time the worker thread used (getrusage), and the wall time it
    /// ran, the drain included.
    pub cpu: Duration,
    pub wall: Duration,
    /// Time from the first submission to the stop signal (or to the last
    /// completion with --io-count).
    pub elapsed: Duration,
    /// I/Os completed within `elapsed`.
    pub ios_in_window: u64,
    pub jobs: Vec<JobResult>,
    /// Set when outstanding I/Os did not finish after the stop.
    pub drain_error: Option<String>,
    /// With --poll-mode hybrid: its sleeps and estimates.
    pub hybrid: Option<HybridStats>,
}

/// With interrupts: after a round of polls that found nothing, sleep on
/// the queue pairs' interrupts (at most `nap`, so the stop flag is seen).
/// Arms each first: a completion already posted means no sleep.
#[cold]
fn sleep_on_interrupts<J: WorkerJob>(jobs: &mut [J], nap: Duration) {
    let mut ready = false;
    for j in jobs.iter_mut() {
        match j.arm() {
            Ok(armed) => ready |= !armed,
            Err(e) => {
                j.ctx_mut().error(format!("interrupt: {e}"));
                return;
            }
        }
    }
    if ready {
        return;
    }
    let fds: Vec<_> = jobs.iter().filter_map(|j| j.interrupt_fd()).collect();
    if let Err(e) = pollux_host::wait_readable(&fds, Some(nap)) {
        tracing::error!("waiting for interrupts: {e}");
    }
}

/// Runs one worker until stopped (or its I/O count is done), then drains.
/// `mode`: what a round of polls that finds nothing does: spin on
/// (polled), sleep on the queue pairs' interrupts, or (hybrid) sleep once
/// for about half the mean time between completions.
pub fn run<J: WorkerJob>(
    core: Option<usize>,
    mut jobs: Vec<J>,
    inline: Vec<Arc<SoftDevice>>,
    ctl: &WorkerCtl,
    drain_timeout: Duration,
    mode: PollMode,
) -> WorkerResult {
    if let Some(c) = core {
        if let Err(e) = pollux_runtime::pin_to_core(c) {
            tracing::warn!(core = c, "could not pin thread: {e}");
        }
    }
    let interrupts = mode == PollMode::Interrupts;
    // Before the clock starts: it times a few sleeps.
    let mut hybrid = (mode == PollMode::Hybrid).then(Hybrid::new);
    let cpu0 = thread_cpu_time();
    let t0 = Instant::now();
    for job in &mut jobs {
        job.start();
    }
    let mut iter: u64 = 0;
    let mut stopped_at: Option<(Instant, u64)> = None;
    let mut by_count = false;
    let mut drain_error = None;
    loop {
        let mut n = 0;
        for job in jobs.iter_mut() {
            n += job.poll();
        }
        for d in &inline {
            d.step();
        }
        if interrupts && n == 0 {
            sleep_on_interrupts(&mut jobs, Duration::from_millis(10));
            iter |= 255; // check the stop flag after every sleep
        }
        if let Some(h) = &mut hybrid {
            h.completed(n);
            if n == 0 {
                h.idle();
            }
        }
        iter += 1;
        if iter & 255 != 0 {
            continue;
        }
        for job in jobs.iter_mut() {
            if !job.ctx().retry.is_empty() {
                job.retry_failed();
            }
        }
        let ios: u64 = jobs.iter().map(|j| j.ctx().ios).sum();
        ctl.progress.store(ios, Ordering::Relaxed);
        match stopped_at {
            None => {
                // A slot owed a retry still has a submission to make.
                let all_submitted = jobs
                    .iter()
                    .all(|j| j.ctx().ios >= j.ctx().stop_at && j.ctx().retry.is_empty());
                let stop = ctl.stop.load(Ordering::Relaxed);
                if stop || all_submitted {
                    by_count = !stop;
                    for j in jobs.iter_mut() {
                        j.ctx_mut().stop_at = 0;
                    }
                    stopped_at = Some((Instant::now(), ios));
                }
            }
            Some((at, _)) => {
                if jobs.iter().all(|j| j.in_flight() == 0) {
                    break;
                }
                if at.elapsed() > drain_timeout {
                    let n: usize = jobs.iter().map(|j| j.in_flight()).sum();
                    drain_error = Some(format!(
                        "{n} I/Os still outstanding {drain_timeout:?} after the stop"
                    ));
                    break;
                }
            }
        }
    }
    let (stop_time, stop_ios) = stopped_at.unwrap_or((Instant::now(), 0));
    // With --io-count the window ends at the last completion.
    let count_mode = by_count;
    let end = if count_mode {
        Instant::now()
    } else {
        stop_time
    };
    let total: u64 = jobs.iter().map(|j| j.ctx().ios).sum();
    let cpu = thread_cpu_time().saturating_sub(cpu0);
    WorkerResult {
        core,
        cpu,
        wall: t0.elapsed(),
        elapsed: end.duration_since(t0),
        ios_in_window: if count_mode { total } else { stop_ios },
        jobs: jobs.into_iter().map(J::into_result).collect(),
        drain_error,
        hybrid: hybrid.map(|h| h.stats()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::pattern::Mix;
    use crate::emulator::SoftEmulator;
    use pollux_host::{ControllerOptions, SoftTrid, Trid};
    use std::sync::mpsc;

    /// Blocks in the namespace the tests use (512-byte LBAs).
    const NSZE: u64 = 64;

    /// Runs one worker with one job of `total` I/Os at `depth` on an inline
    /// null-backend controller; `units`/`seq` may point beyond the
    /// namespace, so the driver refuses those submissions (LBA out of
    /// range), a refusal that never turns into a success. Fails the test
    /// instead of hanging if the worker does not return within 60 s.
    fn run_job(depth: u16, total: u64, random: bool, units: u64, seq: u64) -> WorkerResult {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut emu = SoftEmulator::new(true, None);
            let t = Trid::Soft(SoftTrid {
                size: NSZE << 9,
                ..SoftTrid::default()
            });
            let ctrl =
                pollux_host::connect_with(&t, &ControllerOptions::default(), &mut emu).unwrap();
            let dev = emu.devices()[0].clone();
            let ns = ctrl.namespaces()[0];
            assert_eq!(ns.nsze(), NSZE);
            let qp = ctrl
                .alloc_qpair(pollux_host::QpairOptions {
                    depth,
                    ..Default::default()
                })
                .unwrap();
            let bufs = IoBuf::new(ctrl.alloc_dma(depth as usize * 512).unwrap())
                .chunks(512)
                .into_iter()
                .map(Some)
                .collect();
            let ctx = JobCtx {
                label: "test".into(),
                ns,
                bufs,
                io_size: 512,
                nlb: 1,
                pat: Pattern {
                    units,
                    rng: 12345,
                    random,
                    mix: Mix::AllRead,
                    seq,
                },
                total,
                stop_at: 0,
                ios: 0,
                errors: 0,
                first_errors: Vec::new(),
                errlog: ErrorLog::default(),
                latency: None,
                verify: None,
                slow: false,
                slot_lba: Vec::new(),
                retry: Vec::new(),
            };
            let ctl = WorkerCtl {
                stop: AtomicBool::new(false),
                progress: AtomicU64::new(0),
            };
            let r = run(
                None,
                vec![Job { qp, ctx }],
                vec![dev],
                &ctl,
                Duration::from_secs(10),
                PollMode::Polled,
            );
            drop(ctrl);
            let _ = tx.send(r);
        });
        rx.recv_timeout(Duration::from_secs(60))
            .expect("worker did not finish within 60 s (hang)")
    }

    /// Every submission is refused: the job counts each refusal as a failed
    /// I/O and gives up once nothing is in flight, instead of waiting
    /// forever for a completion that cannot come.
    #[test]
    fn all_submissions_refused_ends_the_job() {
        // Sequential from the first unit past the end: every LBA is out of range.
        let r = run_job(4, 1000, false, NSZE * 1000, NSZE);
        let j = &r.jobs[0];
        assert!(j.ios > 0 && j.ios < 1000, "ios {}", j.ios);
        assert_eq!(j.errors, j.ios, "every counted I/O is a failure");
        assert_eq!(j.qp.submitted, 0);
        assert!(
            j.first_errors[0].contains("submit at LBA") && j.first_errors[0].contains("outside"),
            "{:?}",
            j.first_errors
        );
        assert!(
            j.first_errors.iter().any(|e| e.contains("giving up")),
            "{:?}",
            j.first_errors
        );
        assert!(r.drain_error.is_none());
    }

    /// Some submissions are refused, some succeed: refusals count towards
    /// the I/O count, their slots are submitted again, and the count comes
    /// out exact.
    #[test]
    fn refused_submissions_count_and_the_count_is_exact() {
        // Sequential over NSZE + 1 units: attempt i (retries included) gets
        // unit i mod 65, and unit 64 lies past the end. Of 2000 attempts,
        // i = 64, 129, .., 1949 are refused: 30.
        let r = run_job(4, 2000, false, NSZE + 1, 0);
        let j = &r.jobs[0];
        assert_eq!(j.ios, 2000);
        assert_eq!(j.errors, 30);
        assert_eq!(j.qp.submitted, 1970, "every I/O not refused was submitted");
        assert!(!j.first_errors.iter().any(|e| e.contains("giving up")));
    }

    /// A depth larger than the count and every submission refused: nothing
    /// is owed a retry, the job ends at once.
    #[test]
    fn refusals_while_filling_a_short_count() {
        let r = run_job(8, 3, false, NSZE * 1000, NSZE);
        let j = &r.jobs[0];
        assert_eq!((j.ios, j.errors, j.qp.submitted), (3, 3, 0));
    }
}
