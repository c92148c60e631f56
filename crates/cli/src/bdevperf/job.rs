//! One bdevperf job: a bdev's channel on one runtime thread, `-q` slots
//! each with its own buffer, and the poller that drives it.
//!
//! The hot path is perf's: a completion resubmits its slot's next I/O
//! through the `Io` it is handed (the pattern's step, one multiply for the
//! LBA, no division), no allocation, no clock read unless `-L`. Latency,
//! `--verify` and `-w verify` sit behind one test of `slow` per I/O side.
//! Time, progress, retries of refused submissions and the end of the run
//! are checked by the poller once every [`CHECK_EVERY`] polls, never per
//! I/O.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use pollux_bdev::{Channel, Completion, Data, Handler, Io, IoBuf, IoError, Refused};
use pollux_runtime::{Poll, ThreadCtx};

use crate::common::clock::{thread_cpu_time, LatClock};
use crate::common::errlog::ErrorLog;
use crate::common::pattern::Pattern;
use crate::common::verify::Verify;

/// Polls between checks of the clock, the stop request and progress.
pub const CHECK_EVERY: u64 = 256;

pub struct Latency {
    pub clock: LatClock,
    /// Submission time per slot, in clock ticks.
    pub submit: Vec<u64>,
    /// Latencies in clock ticks (converted to ns in the report).
    pub hist: Histogram<u64>,
}

/// `-w verify`: each slot writes a unit, reads it back and checks it.
pub struct WriteRead {
    /// Per slot: the write in flight is to be read back (set at submission).
    pub read_back: Vec<bool>,
}

/// Everything the completion handler needs.
pub struct JobCtx {
    pub pat: Pattern,
    /// Blocks per I/O.
    pub io_blocks: u64,
    /// First LBA of the job's range (`-C` gives each core a slice).
    pub base_lba: u64,
    /// Completed I/Os (refused submissions included).
    pub ios: u64,
    /// A completion resubmits its slot while `ios <= stop_at`; 0 stops.
    pub stop_at: u64,
    /// `latency || verify || write_read`: one test per I/O side.
    pub slow: bool,
    /// Each slot's buffer while it is not in flight.
    pub bufs: Vec<Option<IoBuf>>,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// Logs each kind of error once and counts its repeats.
    pub errlog: ErrorLog,
    pub latency: Option<Latency>,
    pub verify: Option<Verify>,
    pub write_read: Option<WriteRead>,
    /// Per slot: LBA of the I/O in flight (kept on the slow path only).
    pub slot_lba: Vec<u64>,
    /// Per slot: its unit (kept on the slow path only).
    pub slot_unit: Vec<u64>,
    /// Slots owed a submission after a refusal (retried on the cold path).
    pub retry: Vec<usize>,
    pub label: String,
    /// Testing aid: fail the bdev once this many I/Os completed.
    pub fail_at: Option<u64>,
}

/// What a completion on the slow path leads to.
enum Next {
    /// Nothing more for this slot (stopped, failed, or no buffer).
    Park,
    /// The slot's next I/O, from the pattern.
    Pattern(IoBuf),
    /// `-w verify`: read back the unit just written, at this LBA.
    ReadBack(IoBuf, u64),
}

/// The completion handler, made twice: with the slow path compiled out
/// (`SLOW` false: no test of it per I/O) and with it.
pub struct Hot<'a, const SLOW: bool>(pub &'a mut JobCtx);

impl<const SLOW: bool> Handler for Hot<'_, SLOW> {
    #[inline(always)]
    fn complete(&mut self, io: &mut Io<'_>, c: Completion) {
        self.0.complete::<SLOW>(io, c)
    }
}

impl JobCtx {
    /// Polls `ch` with the handler this job needs.
    #[inline(always)]
    pub fn poll(&mut self, ch: &mut Channel, max: u32) -> u32 {
        if self.slow {
            ch.poll(max, &mut Hot::<true>(self))
        } else {
            ch.poll(max, &mut Hot::<false>(self))
        }
    }

    #[inline(always)]
    fn complete<const SLOW: bool>(&mut self, io: &mut Io<'_>, c: Completion) {
        let Completion {
            user_data,
            result,
            data,
        } = c;
        let slot = user_data as usize;
        self.ios += 1;
        let ok = result.is_ok();
        if let Err(e) = result {
            self.io_failed(slot, e);
        }
        let Data::One(buf) = data else {
            return self.park(slot, data);
        };
        if SLOW {
            // The slow path never sees `io` or the completion (they would
            // have to live in memory for every I/O): it says what to do.
            return match self.complete_slow(slot, ok, buf) {
                Next::Park => {}
                Next::Pattern(buf) => self.submit(io, slot, buf),
                Next::ReadBack(buf, lba) => self.send(io, slot, lba, true, buf),
            };
        }
        if self.ios <= self.stop_at {
            self.submit_fast(io, slot, buf)
        } else {
            self.park(slot, Data::One(buf))
        }
    }
}

impl JobCtx {
    /// Submits slot `slot`'s next I/O from the pattern.
    #[inline(always)]
    pub fn submit(&mut self, io: &mut Io<'_>, slot: usize, buf: IoBuf) {
        if self.slow {
            let (unit, is_read) = self.pat.next();
            let lba = self.base_lba + unit * self.io_blocks;
            // By value, in and out: a reference would put the buffer in
            // memory on the fast path too.
            let buf = self.prepare(slot, unit, lba, is_read, true, buf);
            return self.send(io, slot, lba, is_read, buf);
        }
        self.submit_fast(io, slot, buf)
    }

    /// `submit` without the slow path (the caller knows it is off).
    #[inline(always)]
    fn submit_fast(&mut self, io: &mut Io<'_>, slot: usize, buf: IoBuf) {
        let (unit, is_read) = self.pat.next();
        let lba = self.base_lba + unit * self.io_blocks;
        self.send(io, slot, lba, is_read, buf)
    }

    #[inline(always)]
    fn send(&mut self, io: &mut Io<'_>, slot: usize, lba: u64, is_read: bool, buf: IoBuf) {
        let r = if is_read {
            io.read(lba, buf, slot as u64)
        } else {
            io.write(lba, buf, slot as u64)
        };
        if let Err(e) = r {
            self.submit_failed(slot, lba, e);
        }
    }

    /// Submits slot `slot`'s next I/O with the buffer parked for it (the
    /// first submission of a slot, and retries).
    #[cold]
    pub fn submit_waiting(&mut self, io: &mut Io<'_>, slot: usize) {
        match self.bufs[slot].take() {
            Some(buf) => self.submit(io, slot, buf),
            None => self.error(format!("slot {slot} has no buffer")),
        }
    }

    /// The slow path before a submission: remembers the slot's I/O, tags
    /// a write or clears a read's tag area (--verify), reads the clock
    /// (-L). `fresh`: the I/O comes from the pattern (with -w verify, a
    /// write of it is to be read back).
    #[cold]
    #[inline(never)]
    fn prepare(
        &mut self,
        slot: usize,
        unit: u64,
        lba: u64,
        is_read: bool,
        fresh: bool,
        mut buf: IoBuf,
    ) -> IoBuf {
        self.slot_lba[slot] = lba;
        self.slot_unit[slot] = unit;
        if let Some(w) = &mut self.write_read {
            w.read_back[slot] = fresh && !is_read;
        }
        if let Some(v) = &mut self.verify {
            v.prepare(slot, unit, lba, is_read, buf.as_mut_slice());
        }
        if let Some(l) = &mut self.latency {
            l.submit[slot] = l.clock.now();
        }
        buf
    }

    /// The slow path after a completion (its error, if any, already
    /// reported): latency, verification, and what the slot does next.
    #[cold]
    #[inline(never)]
    fn complete_slow(&mut self, slot: usize, ok: bool, buf: IoBuf) -> Next {
        if let Some(l) = &mut self.latency {
            let ticks = l.clock.now().wrapping_sub(l.submit[slot]);
            let _ = l.hist.record(ticks.max(1));
        }
        if ok && self.verify.is_some() {
            let lba = self.slot_lba[slot];
            if let Some(v) = &mut self.verify {
                if let Err(m) = v.complete(slot, lba, buf.as_slice()) {
                    self.error(format!("verify: LBA {}: {}", m.lba, m.what));
                }
            }
        }
        if self.ios > self.stop_at {
            self.park(slot, Data::One(buf));
            return Next::Park;
        }
        // -w verify: a write that succeeded is read back from its unit.
        let read_back = match &mut self.write_read {
            Some(w) => std::mem::take(&mut w.read_back[slot]) && ok,
            None => false,
        };
        if read_back {
            let (lba, unit) = (self.slot_lba[slot], self.slot_unit[slot]);
            let buf = self.prepare(slot, unit, lba, true, false, buf);
            Next::ReadBack(buf, lba)
        } else {
            Next::Pattern(buf)
        }
    }

    /// A refused submission is a finished I/O with an error: it counts like
    /// a completion (so `--io-count` still ends the run) and earns its slot
    /// another try, made later on the cold path.
    #[cold]
    fn submit_failed(&mut self, slot: usize, lba: u64, e: Refused) {
        self.bufs[slot] = e.data.into_one();
        self.ios += 1;
        self.error(format!("submit at LBA {lba} failed: {}", e.error));
        if self.ios <= self.stop_at {
            self.retry.push(slot);
        }
    }

    #[cold]
    fn io_failed(&mut self, slot: usize, e: IoError) {
        let at = if self.slow {
            format!(" at LBA {}", self.slot_lba[slot])
        } else {
            String::new()
        };
        self.error(format!("I/O failed{at}: {e}"));
    }

    #[cold]
    pub fn error(&mut self, msg: String) {
        self.errors += 1;
        self.errlog.error(&self.label, msg, &mut self.first_errors);
    }

    /// The run is over for this slot (or its buffer did not come back).
    #[cold]
    fn park(&mut self, slot: usize, d: Data) {
        match d {
            Data::One(b) => self.bufs[slot] = Some(b),
            _ => self.error(format!("slot {slot}: completion without its buffer")),
        }
    }
}

/// What a finished job reports.
pub struct JobResult {
    pub index: usize,
    pub ios: u64,
    pub errors: u64,
    pub first_errors: Vec<String>,
    /// From the first submission to the stop (or, with `--io-count`, the
    /// last completion).
    pub elapsed: Duration,
    /// I/Os completed within `elapsed`.
    pub ios_in_window: u64,
    pub hist: Option<Histogram<u64>>,
    /// NVMe command timeouts on the job's queue pair.
    pub timeouts: u64,
    /// Times the job's poller ran (one channel poll each).
    pub polls: u64,
    /// CPU time of the job's thread while it ran (shared by the jobs of
    /// that thread).
    pub cpu: Duration,
    pub wall: Duration,
}

/// A job with its channel and run state: the poller's closure owns it.
pub struct Job {
    pub index: usize,
    pub ch: Channel,
    pub ctx: JobCtx,
    /// I/Os this job does in total (`u64::MAX`: until stopped).
    pub total: u64,
    pub time: Option<Duration>,
    pub drain_timeout: Duration,
    pub progress: Arc<AtomicU64>,
    pub results: Sender<JobResult>,
}

/// The state the poller keeps between polls.
struct Run {
    job: Job,
    /// Completions delivered per poll at most (the queue depth).
    max: u32,
    polls: u64,
    t0: Instant,
    cpu0: Duration,
    deadline: Option<Instant>,
    stopped: Option<(Instant, u64)>,
    by_count: bool,
}

impl Job {
    /// Registers the job on this thread: fills its queue, then polls it
    /// until it is done, reports its result and unregisters itself. A
    /// shutdown request (signal) stops it early, after draining.
    pub fn start(self, ctx: &mut ThreadCtx) {
        let done = std::rc::Rc::new(std::cell::Cell::new(false));
        let id = std::rc::Rc::new(std::cell::Cell::new(None));
        let mut run = Some(Run::new(self, ctx.now()));
        let (d, me) = (done.clone(), id.clone());
        let pid = ctx.register_poller(
            format!("bdevperf job {}", run.as_ref().map_or(0, |r| r.job.index)),
            move |ctx: &mut ThreadCtx| {
                let Some(r) = &mut run else {
                    return Poll::Idle;
                };
                // At most a queue's worth: a null or RAM channel completes
                // what the handler resubmits within the same poll.
                r.job.ctx.poll(&mut r.job.ch, r.max);
                r.polls += 1;
                if r.polls % CHECK_EVERY == 0 && r.check(ctx) {
                    if let Some(r) = run.take() {
                        r.finish(ctx.now());
                    }
                    d.set(true);
                    if let Some(id) = me.get() {
                        ctx.unregister_poller(id);
                    }
                    return Poll::Idle;
                }
                // Busy while the run lasts: the thread never sleeps on it.
                Poll::Busy
            },
        );
        id.set(Some(pid));
        ctx.register_drain("bdevperf job", move |_| done.get());
    }
}

impl Run {
    fn new(mut job: Job, now: Instant) -> Run {
        let cpu0 = thread_cpu_time();
        let depth = job.ctx.bufs.len() as u64;
        let fill = depth.min(job.total);
        // Completion k resubmits while fill + k - 1 < total; set before the
        // first submission, since a refused one decides by it too.
        job.ctx.stop_at = job.total - fill;
        {
            let mut io = job.ch.io();
            for slot in 0..fill as usize {
                job.ctx.submit_waiting(&mut io, slot);
            }
        }
        job.ch.flush();
        let t0 = Instant::now();
        Run {
            deadline: job.time.map(|t| now + t),
            max: depth.max(1) as u32,
            job,
            polls: 0,
            t0,
            cpu0,
            stopped: None,
            by_count: false,
        }
    }

    /// The cold check every `CHECK_EVERY` polls; true once the job is over.
    #[cold]
    fn check(&mut self, ctx: &ThreadCtx) -> bool {
        let now = ctx.now();
        let c = &mut self.job.ctx;
        self.job.progress.store(c.ios, Ordering::Relaxed);
        if let Some(n) = c.fail_at {
            if c.ios >= n {
                c.fail_at = None;
                tracing::warn!(
                    "{}: failing the bdev (test aid) after {} I/Os",
                    c.label,
                    c.ios
                );
                self.job.ch.bdev().inject_failure();
            }
        }
        if !c.retry.is_empty() {
            self.retry_failed();
        }
        let c = &mut self.job.ctx;
        match self.stopped {
            None => {
                let all_submitted = c.ios >= c.stop_at && c.retry.is_empty();
                let timed_out = self.deadline.is_some_and(|d| now >= d);
                if all_submitted || timed_out || ctx.is_shutting_down() {
                    self.by_count = all_submitted && !timed_out;
                    c.stop_at = 0;
                    self.stopped = Some((now, c.ios));
                }
                false
            }
            Some((at, _)) => {
                if self.job.ch.outstanding() == 0 {
                    return true;
                }
                if now.duration_since(at) > self.job.drain_timeout {
                    let n = self.job.ch.outstanding();
                    c.error(format!(
                        "{n} I/Os still outstanding {:?} after the stop",
                        self.job.drain_timeout
                    ));
                    return true;
                }
                false
            }
        }
    }

    /// Submits the slots whose last submission was refused, once each. If
    /// all are refused again while nothing is in flight, no completion can
    /// change that: the job gives up instead of spinning.
    #[cold]
    fn retry_failed(&mut self) {
        let c = &mut self.job.ctx;
        let slots = std::mem::take(&mut c.retry);
        if c.stop_at == 0 {
            return;
        }
        {
            let mut io = self.job.ch.io();
            for &slot in &slots {
                c.submit_waiting(&mut io, slot);
            }
        }
        self.job.ch.flush();
        let c = &mut self.job.ctx;
        if !c.retry.is_empty() && self.job.ch.outstanding() == 0 {
            let msg = format!(
                "giving up: all {} remaining slots had their submissions refused twice with no I/O in flight",
                c.retry.len()
            );
            tracing::error!("{}: {msg}", c.label);
            c.first_errors.push(msg);
            c.retry.clear();
            c.stop_at = 0;
        }
    }

    /// Reports the result; the channel is closed here, on its thread.
    #[cold]
    fn finish(mut self, now: Instant) {
        let c = &self.job.ctx;
        self.job.progress.store(c.ios, Ordering::Relaxed);
        let (stop_time, stop_ios) = self.stopped.unwrap_or((now, c.ios));
        let (end, in_window) = if self.by_count {
            (now, c.ios)
        } else {
            (stop_time, stop_ios)
        };
        let timeouts = self.job.ch.nvme_qpair().map_or(0, |q| q.stats().timeouts);
        let Job {
            index,
            ch,
            mut ctx,
            results,
            ..
        } = self.job;
        ctx.errlog.finish(&ctx.label, &mut ctx.first_errors);
        drop(ch);
        let r = JobResult {
            index,
            ios: ctx.ios,
            errors: ctx.errors,
            first_errors: ctx.first_errors,
            elapsed: end.saturating_duration_since(self.t0),
            ios_in_window: in_window,
            hist: ctx.latency.map(|l| l.hist),
            timeouts,
            polls: self.polls,
            cpu: thread_cpu_time().saturating_sub(self.cpu0),
            wall: now.saturating_duration_since(self.t0),
        };
        if results.send(r).is_err() {
            tracing::warn!(job = index, "bdevperf: nobody waits for the job's result");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::pattern::Mix;
    use crate::common::verify::Written;
    use pollux_bdev::{Bdev, ChannelOptions};

    /// Runs a `-w verify` job (write each unit, read it back) of `total`
    /// I/Os on `bdev` without a runtime; returns the finished context.
    fn write_read_job(bdev: &Bdev, total: u64) -> JobCtx {
        let depth = 4usize;
        let io = 4096usize;
        let units = bdev.info().num_blocks * bdev.info().block_size as u64 / io as u64;
        let mut ch = bdev
            .open(true)
            .channel(&ChannelOptions {
                depth: depth as u32,
                ..Default::default()
            })
            .unwrap();
        let mut ctx = JobCtx {
            pat: Pattern {
                rng: 1,
                random: false,
                mix: Mix::AllWrite,
                seq: 0,
                units,
            },
            io_blocks: io as u64 / bdev.info().block_size as u64,
            base_lba: 0,
            ios: 0,
            stop_at: total - depth as u64,
            slow: true,
            bufs: bdev
                .alloc_buf(depth * io)
                .unwrap()
                .chunks(io)
                .into_iter()
                .map(Some)
                .collect(),
            errors: 0,
            first_errors: Vec::new(),
            errlog: ErrorLog::default(),
            latency: None,
            verify: Some(Verify::new(
                Written::new(units),
                bdev.info().block_shift() as u8,
                depth,
            )),
            write_read: Some(WriteRead {
                read_back: vec![false; depth],
            }),
            slot_lba: vec![0; depth],
            slot_unit: vec![0; depth],
            retry: Vec::new(),
            label: "test".into(),
            fail_at: None,
        };
        {
            let mut io = ch.io();
            for slot in 0..depth {
                ctx.submit_waiting(&mut io, slot);
            }
        }
        let mut polls = 0;
        while ch.outstanding() > 0 {
            ctx.poll(&mut ch, depth as u32);
            polls += 1;
            assert!(polls < 1_000_000, "the job does not end");
        }
        ctx
    }

    /// On RAM every write reads back: no error, and half the I/Os are the
    /// reads that checked the writes.
    #[test]
    fn write_then_read_back_passes_on_ram() {
        let b: Bdev = Bdev::ram("r", 512, 256).unwrap();
        let ctx = write_read_job(&b, 1000);
        assert_eq!((ctx.ios, ctx.errors), (1000, 0), "{:?}", ctx.first_errors);
        let s = b.stats();
        assert_eq!(s.reads + s.writes, 1000);
        assert_eq!(s.reads, 500, "each write is read back once");
        assert!(ctx.bufs.iter().all(Option::is_some), "every buffer parked");
    }

    /// A device that drops writes (the null bdev) is caught: every read
    /// back of a written unit fails the check, and names its LBA.
    #[test]
    fn write_then_read_back_catches_lost_writes() {
        let b: Bdev = Bdev::null("n", 512, 256).unwrap();
        let ctx = write_read_job(&b, 1000);
        assert_eq!(ctx.ios, 1000);
        assert_eq!(ctx.errors, 500, "{:?}", ctx.first_errors);
        assert!(
            ctx.first_errors[0].starts_with("verify: LBA ")
                && ctx.first_errors[0].contains("read zeros from a block that was written"),
            "{}",
            ctx.first_errors[0]
        );
    }
}
