//! [`MpQueuePair`]: one thread's queue pairs on every path of a multipath
//! namespace, the path choice per request, and failover (see the module
//! docs of `multipath` for the rule).
//!
//! Per request: a tag from a free list (the request's LBA, length,
//! and direction are kept under it, so it can be sent again), the
//! path choice, and the path's queue pair. Completions are collected
//! while the paths are polled and handed to the caller after, so a
//! caller submitting from its handler submits through this queue pair
//! and the path choice. Every vector is sized at creation for the most
//! requests in flight: nothing is allocated per request.
use std::sync::Arc;
use std::time::Instant;

use pollux_nvme::{Completion, IoBuf, IoError, Namespace, Refused, SubmitError};

use super::failover::{classify, fence, Fence, PathView, Verdict, MAX_RESENDS};
use super::paths::{Paths, Policy, Selector, DOWN, PROBE_INTERVAL, UNUSABLE};
use crate::qpair::QueuePair;

/// What one queue pair did on one path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Requests sent on it (first sendings and sendings again).
    pub submitted: u64,
    /// Requests that failed on it and were sent again (on another path,
    /// or on it once back).
    pub failed_over: u64,
    /// Times it went down, and came back.
    pub downs: u64,
    pub ups: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pick {
    First,
    RoundRobin,
    QueueDepth,
}

/// A request in flight: what it takes to send it again.
#[derive(Clone, Copy, Default)]
struct Tag {
    user_data: u64,
    lba: u64,
    nlb: u32,
    write: bool,
    /// Times it was sent again.
    resent: u8,
}

/// A write waiting for its path's fence.
struct Parked {
    tag: u32,
    buf: IoBuf,
    path: usize,
    /// The path's controller's completed resets when it was parked.
    resets: u32,
}

struct PathQp {
    qp: QueuePair,
    ns: Namespace,
    /// `DOWN`, or the path's ANA rank.
    rank: u8,
    /// Requests of this queue pair sent on the path and not completed.
    outstanding: u32,
    /// The controller's completed resets when the path went down.
    down_resets: u32,
    /// Submitted to since the last flush.
    dirty: bool,
    stats: PathStats,
}

/// The bookkeeping the completion handlers of every path share.
struct Books {
    tags: Vec<Tag>,
    free: Vec<u32>,
    /// Completions for the caller, collected during a poll.
    done: Vec<Completion>,
    /// Requests to send (again) on the next path available.
    again: Vec<(u32, IoBuf)>,
    /// `again`'s twin, swapped in while `again` is worked through.
    spare: Vec<(u32, IoBuf)>,
    parked: Vec<Parked>,
    /// Paths that failed (bit per path) and paths whose ANA state is to
    /// be read, found during a poll.
    down: u64,
    ana: u64,
    /// Something for `cold` to do.
    cold: bool,
    failed_over: Vec<u64>,
}

impl Books {
    /// A completion on path `p`.
    #[inline(always)]
    fn complete(&mut self, paths: &Paths, p: usize, c: Completion) {
        let tag = c.user_data as u32;
        let Some(t) = self.tags.get(tag as usize).copied() else {
            tracing::error!(tag, "multipath: completion for an unknown tag");
            return;
        };
        match c.result {
            Ok(_) => self.deliver(tag, t.user_data, c.result, c.buf),
            Err(e) => self.failed(paths, p, tag, t, e, c.buf),
        }
    }

    #[inline(always)]
    fn deliver(
        &mut self,
        tag: u32,
        user_data: u64,
        result: Result<u32, IoError>,
        buf: Option<IoBuf>,
    ) {
        self.free.push(tag);
        self.done.push(Completion {
            user_data,
            result,
            buf,
        });
    }

    /// A request failed on path `p`: the rule of the module docs.
    #[cold]
    #[inline(never)]
    fn failed(
        &mut self,
        paths: &Paths,
        p: usize,
        tag: u32,
        t: Tag,
        e: IoError,
        buf: Option<IoBuf>,
    ) {
        let ctrl = &paths.list[p].ctrl;
        let verdict = if t.resent >= MAX_RESENDS {
            Verdict::Deliver
        } else {
            classify(e, t.write, ctrl.may_still_transfer(), buf.is_some())
        };
        if matches!(verdict, Verdict::Now { .. } | Verdict::AfterFence) {
            self.tags[tag as usize].resent += 1;
        }
        match (verdict, buf) {
            (Verdict::Now { down, ana }, Some(buf)) => {
                self.down |= u64::from(down) << p;
                self.ana |= u64::from(ana) << p;
                self.failed_over[p] += 1;
                self.again.push((tag, buf));
                self.cold = true;
            }
            (Verdict::AfterFence, Some(buf)) => {
                self.down |= 1 << p;
                self.failed_over[p] += 1;
                self.parked.push(Parked {
                    tag,
                    buf,
                    path: p,
                    resets: ctrl.resets(),
                });
                self.cold = true;
            }
            (Verdict::Fail, buf) => {
                tracing::error!(
                    path = %paths.list[p].name,
                    lba = t.lba,
                    "multipath: a write outstanding on a controller that failed without stopping is not sent again"
                );
                self.deliver(tag, t.user_data, Err(IoError::ControllerFailed), buf)
            }
            (_, buf) => self.deliver(tag, t.user_data, Err(e), buf),
        }
    }
}

/// One thread's queue pairs on every path of a multipath namespace: from
/// [`super::Multipath::alloc_qpair`]. Requests name no namespace (each
/// path's queue pair takes its own controller's).
pub struct MpQueuePair {
    paths: Arc<Paths>,
    qps: Vec<PathQp>,
    b: Books,
    pick: Pick,
    /// Round robin: the path chosen last.
    rr: usize,
    /// The best rank of a path now, and the first path of that rank.
    best: u8,
    active: usize,
    /// `Paths::ana_gen` when the ranks were last read.
    ana_gen: u32,
    ndown: usize,
    /// Some path's ANA state makes it unusable: its ANA log is read again
    /// at most every `PROBE_INTERVAL` (no ANA Change notices: see the
    /// module docs).
    unusable: bool,
    polls: u32,
    next_probe: Option<Instant>,
}

/// Polls between two looks at the ANA states (`cold`): an unusable
/// path's is read again at most every `PROBE_INTERVAL`, the usable
/// paths' at most every `ANA_REFRESH` (by one queue pair of the paths).
const ANA_POLLS: u32 = 1 << 16;

impl MpQueuePair {
    pub(crate) fn new(paths: Arc<Paths>, qps: Vec<(QueuePair, Namespace)>, slots: usize) -> Self {
        let n = qps.len();
        let ana_gen = paths.ana_gen.load(std::sync::atomic::Ordering::Acquire);
        let qps = qps
            .into_iter()
            .zip(&paths.list)
            .map(|((qp, ns), p)| PathQp {
                qp,
                ns,
                rank: p.rank.load(std::sync::atomic::Ordering::Acquire),
                outstanding: 0,
                down_resets: 0,
                dirty: false,
                stats: PathStats::default(),
            })
            .collect();
        let pick = match (paths.policy, paths.selector) {
            (Policy::ActivePassive, _) => Pick::First,
            (Policy::ActiveActive, Selector::RoundRobin) => Pick::RoundRobin,
            (Policy::ActiveActive, Selector::QueueDepth) => Pick::QueueDepth,
        };
        let mut me = MpQueuePair {
            paths,
            qps,
            b: Books {
                tags: vec![Tag::default(); slots],
                free: (0..slots as u32).rev().collect(),
                done: Vec::with_capacity(slots),
                again: Vec::with_capacity(slots),
                spare: Vec::with_capacity(slots),
                parked: Vec::with_capacity(slots),
                down: 0,
                ana: 0,
                cold: false,
                failed_over: vec![0; n],
            },
            pick,
            rr: n - 1,
            best: 0,
            active: 0,
            ana_gen,
            ndown: 0,
            unusable: false,
            polls: 0,
            next_probe: None,
        };
        me.recompute();
        me
    }

    /// Reads `nlb` blocks at `lba` into `buf`; `user_data` comes back in
    /// the completion (from [`MpQueuePair::poll`]).
    #[inline]
    pub fn read(&mut self, lba: u64, nlb: u32, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.submit(lba, nlb, buf, false, user_data)
    }

    /// Writes `buf` to `nlb` blocks at `lba`.
    #[inline]
    pub fn write(&mut self, lba: u64, nlb: u32, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.submit(lba, nlb, buf, true, user_data)
    }

    #[inline(always)]
    fn submit(
        &mut self,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        write: bool,
        user_data: u64,
    ) -> Result<(), Refused> {
        let Some(tag) = self.b.free.pop() else {
            return Err(Refused {
                error: SubmitError::QueueFull {
                    limit: self.b.tags.len(),
                },
                buf: Some(buf),
            });
        };
        self.b.tags[tag as usize] = Tag {
            user_data,
            lba,
            nlb,
            write,
            resent: 0,
        };
        let r = self.issue(tag, buf);
        if r.is_err() {
            self.b.free.push(tag);
        }
        r
    }

    /// Sends request `tag` on the path chosen now (or holds it until a
    /// path is usable).
    #[inline(always)]
    fn issue(&mut self, tag: u32, buf: IoBuf) -> Result<(), Refused> {
        let Some(p) = self.choose() else {
            return self.hold(tag, buf);
        };
        let pq = &mut self.qps[p];
        let t = &self.b.tags[tag as usize];
        let r = if t.write {
            pq.qp.write(&pq.ns, t.lba, t.nlb, buf, tag as u64)
        } else {
            pq.qp.read(&pq.ns, t.lba, t.nlb, buf, tag as u64)
        };
        match r {
            Ok(()) => {
                pq.outstanding += 1;
                pq.dirty = true;
                pq.stats.submitted += 1;
                Ok(())
            }
            Err(r) => self.refused(p, tag, r),
        }
    }

    /// The path for the next request, by rank then policy.
    #[inline(always)]
    fn choose(&mut self) -> Option<usize> {
        let best = self.best;
        if best >= UNUSABLE {
            return None;
        }
        match self.pick {
            Pick::First => Some(self.active),
            Pick::RoundRobin => {
                let n = self.qps.len();
                let mut i = self.rr;
                // Ends: some path has rank `best`.
                loop {
                    i += 1;
                    if i >= n {
                        i = 0;
                    }
                    if self.qps[i].rank == best {
                        self.rr = i;
                        return Some(i);
                    }
                }
            }
            Pick::QueueDepth => {
                let (mut sel, mut min) = (self.active, u32::MAX);
                for (i, q) in self.qps.iter().enumerate() {
                    if q.rank == best && q.outstanding < min {
                        (sel, min) = (i, q.outstanding);
                    }
                }
                Some(sel)
            }
        }
    }

    /// The path refused the request: if because its controller is
    /// resetting or failed, the path is down and the request goes on
    /// another (on the next poll); otherwise the refusal is the caller's.
    #[cold]
    #[inline(never)]
    fn refused(&mut self, p: usize, tag: u32, r: Refused) -> Result<(), Refused> {
        match (r.error, r.buf) {
            (SubmitError::ControllerFailed | SubmitError::Resetting, Some(buf)) => {
                self.mark_down(p);
                self.b.again.push((tag, buf));
                self.b.cold = true;
                Ok(())
            }
            (error, buf) => Err(Refused { error, buf }),
        }
    }

    /// No path is usable now: the request waits for one, unless every
    /// controller has failed for good.
    #[cold]
    #[inline(never)]
    fn hold(&mut self, tag: u32, buf: IoBuf) -> Result<(), Refused> {
        if self.paths.list.iter().all(|p| p.ctrl.is_failed()) {
            return Err(Refused {
                error: SubmitError::ControllerFailed,
                buf: Some(buf),
            });
        }
        self.b.again.push((tag, buf));
        self.b.cold = true;
        Ok(())
    }

    /// The best rank and the first path of it.
    fn recompute(&mut self) {
        self.best = self.qps.iter().map(|q| q.rank).min().unwrap_or(DOWN);
        self.unusable = self.qps.iter().any(|q| q.rank == UNUSABLE);
        self.active = self
            .qps
            .iter()
            .position(|q| q.rank == self.best)
            .unwrap_or(0);
    }

    #[cold]
    fn mark_down(&mut self, p: usize) {
        let q = &mut self.qps[p];
        if q.rank == DOWN {
            return;
        }
        let path = &self.paths.list[p];
        q.rank = DOWN;
        q.down_resets = path.ctrl.resets();
        q.stats.downs += 1;
        self.ndown += 1;
        tracing::warn!(path = %path.name, "multipath: path down");
        self.recompute();
    }

    /// Polls every path, then (if a path failed or is down, or requests
    /// wait) does the failover work, then hands each completion to `f`,
    /// which may submit through the queue pair it is given; then sends
    /// what was submitted. Returns the completions handed to `f`.
    #[inline]
    pub fn poll<F: FnMut(&mut MpQueuePair, Completion)>(&mut self, mut f: F) -> u32 {
        {
            let paths = &*self.paths;
            let b = &mut self.b;
            for (p, q) in self.qps.iter_mut().enumerate() {
                let out = &mut q.outstanding;
                q.qp.poll(u32::MAX, |_, c| {
                    *out -= 1;
                    b.complete(paths, p, c)
                });
            }
        }
        self.polls = self.polls.wrapping_add(1);
        if self.b.cold
            || self.ndown > 0
            || self.polls & (ANA_POLLS - 1) == 0
            || !self.b.again.is_empty()
            || !self.b.parked.is_empty()
            || self
                .paths
                .ana_gen
                .load(std::sync::atomic::Ordering::Relaxed)
                != self.ana_gen
        {
            self.cold();
        }
        let mut done = std::mem::take(&mut self.b.done);
        let n = done.len() as u32;
        for c in done.drain(..) {
            f(self, c);
        }
        self.b.done = done;
        self.flush();
        n
    }

    /// Sends what was submitted since the last poll.
    #[inline]
    pub fn flush(&mut self) {
        for q in self.qps.iter_mut() {
            if q.dirty {
                q.dirty = false;
                q.qp.flush();
            }
        }
    }

    /// Failover: paths that failed go down, ANA states are read again,
    /// down paths are probed, parked writes whose fence passed and
    /// requests waiting for a path are sent.
    #[cold]
    #[inline(never)]
    fn cold(&mut self) {
        self.b.cold = false;
        let down = std::mem::take(&mut self.b.down);
        for p in 0..self.qps.len() {
            if down & (1 << p) != 0 {
                self.mark_down(p);
            }
        }
        let ana = std::mem::take(&mut self.b.ana);
        for p in 0..self.qps.len() {
            if ana & (1 << p) != 0 {
                self.paths.refresh_ana(p);
            }
        }
        self.probe();
        if self.polls & (ANA_POLLS - 1) == 0 {
            let qps = &self.qps;
            self.paths
                .refresh_due(Instant::now(), |p| qps[p].rank < UNUSABLE);
        }
        self.reload_ranks();
        for (p, n) in self.b.failed_over.iter_mut().enumerate() {
            self.qps[p].stats.failed_over += std::mem::take(n);
        }
        self.release_parked();
        std::mem::swap(&mut self.b.again, &mut self.b.spare);
        let mut spare = std::mem::take(&mut self.b.spare);
        for (tag, buf) in spare.drain(..) {
            if let Err(r) = self.issue(tag, buf) {
                let t = self.b.tags[tag as usize];
                let e = match r.error {
                    SubmitError::ControllerFailed => IoError::ControllerFailed,
                    e => {
                        tracing::error!(lba = t.lba, "multipath: sending again refused: {e}");
                        IoError::Failed
                    }
                };
                self.b.deliver(tag, t.user_data, Err(e), r.buf);
            }
        }
        self.b.spare = spare;
    }

    /// Down paths whose controller is ready again come back; the ANA
    /// states of unusable paths are read again. At most every
    /// `PROBE_INTERVAL`.
    fn probe(&mut self) {
        if self.ndown == 0 && !self.unusable {
            return;
        }
        let now = Instant::now();
        if self.next_probe.is_some_and(|t| now < t) {
            return;
        }
        self.next_probe = Some(now + PROBE_INTERVAL);
        for p in 0..self.qps.len() {
            let path = &self.paths.list[p];
            let q = &mut self.qps[p];
            if q.rank != DOWN {
                if q.rank >= UNUSABLE {
                    self.paths.refresh_ana(p);
                }
                continue;
            }
            if path.ctrl.is_failed() {
                continue;
            }
            let ready = path.ctrl.resets() > q.down_resets
                || path
                    .ctrl
                    .csts()
                    .is_ok_and(|c| c.rdy() && !c.cfs() && !c.is_dead());
            if !ready {
                continue;
            }
            q.rank = self.paths.refresh_ana(p);
            q.stats.ups += 1;
            self.ndown -= 1;
            tracing::info!(path = %path.name, "multipath: path back");
        }
        self.recompute();
    }

    /// Up paths take the ANA ranks published.
    fn reload_ranks(&mut self) {
        let g = self
            .paths
            .ana_gen
            .load(std::sync::atomic::Ordering::Acquire);
        if g == self.ana_gen {
            return;
        }
        self.ana_gen = g;
        for (q, p) in self.qps.iter_mut().zip(&self.paths.list) {
            if q.rank != DOWN {
                q.rank = p.rank.load(std::sync::atomic::Ordering::Acquire);
            }
        }
        self.recompute();
    }

    /// Parked writes whose fence passed go to `again`; those whose path
    /// failed without stopping fail.
    fn release_parked(&mut self) {
        let mut i = 0;
        while i < self.b.parked.len() {
            let k = &self.b.parked[i];
            let ctrl = &self.paths.list[k.path].ctrl;
            let v = PathView {
                in_flight: self.qps[k.path].qp.in_flight(),
                resets: ctrl.resets(),
                failed: ctrl.is_failed(),
                may_still_transfer: ctrl.may_still_transfer(),
            };
            match fence(k.resets, v) {
                Fence::Wait => i += 1,
                Fence::Go => {
                    let k = self.b.parked.swap_remove(i);
                    self.b.again.push((k.tag, k.buf));
                }
                Fence::Fail => {
                    let k = self.b.parked.swap_remove(i);
                    let t = self.b.tags[k.tag as usize];
                    self.b.deliver(
                        k.tag,
                        t.user_data,
                        Err(IoError::ControllerFailed),
                        Some(k.buf),
                    );
                }
            }
        }
    }

    /// Requests submitted and not yet handed back: on the paths, waiting
    /// for a path, and writes waiting for a fence.
    pub fn in_flight(&self) -> usize {
        self.qps.iter().map(|q| q.qp.in_flight()).sum::<usize>()
            + self.b.again.len()
            + self.b.parked.len()
    }

    /// Writes waiting for their failed path's fence.
    pub fn parked_writes(&self) -> usize {
        self.b.parked.len()
    }

    /// Requests this queue pair can hold in flight.
    pub fn slots(&self) -> usize {
        self.b.tags.len()
    }

    /// Each path's name and what this queue pair did on it.
    pub fn path_stats(&self) -> Vec<(String, PathStats)> {
        self.qps
            .iter()
            .zip(&self.paths.list)
            .map(|(q, p)| (p.name.clone(), q.stats))
            .collect()
    }

    /// Whether path `i` takes I/O now (up and of a usable ANA state).
    pub fn path_usable(&self, i: usize) -> bool {
        self.qps.get(i).is_some_and(|q| q.rank < UNUSABLE)
    }

    /// The namespace as the first path's controller made it (block size
    /// and size are the same on every path).
    pub fn namespace(&self) -> Namespace {
        self.qps[0].ns
    }

    /// The queue pair of path `i` (its counters, for reports).
    pub fn path_qpair(&self, i: usize) -> Option<&QueuePair> {
        self.qps.get(i).map(|q| &q.qp)
    }
}
