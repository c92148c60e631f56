//! I/O queue pair: the hot path.
//!
//! A `QueuePair` is owned by one thread: `Send`, not `Sync`, every operation
//! takes `&mut self`, and nothing on the I/O path locks or does an atomic
//! read-modify-write. Per I/O the host writes one SQE (into the ring slot,
//! or a non-temporal copy of it) and one 16-byte tracker; per poll it rings
//! the SQ doorbell at most once and the CQ doorbell at most once, and with
//! the lazy CQ doorbell only when the controller could otherwise run out of
//! CQ slots. A completion reaches the user's handler through one indexed
//! load: `trackers[cqe.cid].user_data`.
//!
//! Each technique has a switch in `QpairOptions` so its effect can be
//! measured A/B: delayed SQ doorbell, SQ doorbell batching, lazy CQ
//! doorbell, tracker prefetch, non-temporal SQE copy, shadow doorbells.
//!
//! Caveats: timeouts are checked every 4096 polls (one clock read then), so
//! a queue pair that is not polled does not time out; the software queue
//! for requests beyond the queue depth is bounded by `max_queued`.
use std::collections::VecDeque;
use std::ptr::{self, NonNull};
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_spec::cmd::{DsmRange, NvmOpcode, DSM_ATTR_DEALLOCATE};
use pollux_spec::{regs, Sqe, Status};

use crate::ctrl::{Namespace, Shared};
use crate::dma::{DmaBuffer, DmaSlice, SliceRef};
use crate::error::{Error, IoError, Result, SubmitError};
use crate::mmio::Doorbell;
use crate::prp;

/// Options of one queue pair. `Default` turns on every technique that
/// measured as a gain (see each field).
#[derive(Clone, Debug)]
pub struct QpairOptions {
    /// Most commands outstanding at once (trackers). SQ entries = depth + 1.
    pub depth: u16,
    /// CQ entries; default `min(4 * depth, MQES + 1)` (room for the lazy CQ
    /// doorbell). Must be > depth.
    pub cq_entries: Option<u16>,
    /// Ring the SQ doorbell once per poll (or `flush`) instead of per command.
    pub delayed_sq_doorbell: bool,
    /// With the delayed doorbell: ring only once this many new commands are
    /// waiting, or when the controller holds fewer than this many (so it
    /// never starves). 1 = ring every poll that has new commands.
    pub sq_doorbell_batch: u16,
    /// Ring the CQ head doorbell only when the controller could otherwise
    /// run out of CQ slots; else once per poll that consumed entries.
    pub lazy_cq_doorbell: bool,
    /// Prefetch the next completion's tracker while handling this one. Off
    /// by default: trackers are 16 bytes, so a queue pair's whole tracker
    /// array (2 KiB at depth 128) stays in L1 and the prefetch only costs
    /// instructions (measured: 0.92x IOPS at QD 128 with it on).
    pub prefetch: bool,
    /// Copy SQEs into the ring with non-temporal stores. Off by default:
    /// with a consumer on another CPU (the emulated controller) it sends
    /// each SQE through memory instead of cache to cache (measured: no
    /// IOPS gain at QD 128, +16% QD 1 latency); for PCIe devices it saves
    /// the read-for-ownership of SQ lines, so try it there.
    pub nt_sqe_copy: bool,
    /// Abort commands outstanding longer than this (None: never).
    pub timeout: Option<Duration>,
    /// Requests that may wait in software when all trackers are busy.
    pub max_queued: usize,
}

impl Default for QpairOptions {
    fn default() -> Self {
        QpairOptions {
            depth: 128,
            cq_entries: None,
            delayed_sq_doorbell: true,
            sq_doorbell_batch: 1,
            lazy_cq_doorbell: true,
            prefetch: false,
            nt_sqe_copy: false,
            timeout: Some(Duration::from_secs(30)),
            max_queued: 1 << 16,
        }
    }
}

/// A finished request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The value given at submission.
    pub user_data: u64,
    /// Completion dword 0 on success.
    pub result: Result<u32, IoError>,
}

/// Receives completions from `QueuePair::poll`, with the submission half
/// of the queue pair to submit follow-up requests.
///
/// Closures `FnMut(&mut Submitter, Completion)` implement it. A type that
/// implements it directly with an `#[inline(always)]` method gets inlined
/// into the completion loop even when its body is large (a closure's call
/// cannot be forced inline on stable Rust); `pollux perf` does that.
pub trait Handler {
    fn complete(&mut self, sub: &mut Submitter, c: Completion);
}

impl<F: FnMut(&mut Submitter, Completion)> Handler for F {
    #[inline(always)]
    fn complete(&mut self, sub: &mut Submitter, c: Completion) {
        self(sub, c)
    }
}

/// Counters of one queue pair (plain integers: the queue pair has one owner).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QpairStats {
    /// Commands written to the SQ.
    pub submitted: u64,
    /// Completion queue entries consumed.
    pub completed: u64,
    /// MMIO writes to the SQ tail doorbell.
    pub sq_doorbells: u64,
    /// MMIO writes to the CQ head doorbell.
    pub cq_doorbells: u64,
    /// Shadow doorbell updates (memory writes instead of MMIO).
    pub shadow_updates: u64,
    pub polls: u64,
    /// Requests that had to wait in the software queue.
    pub queued: u64,
    pub timeouts: u64,
    pub aborts_sent: u64,
    pub resets_seen: u64,
    /// Completions the controller posted for a CID that was not outstanding.
    pub bogus_completions: u64,
}

// Tracker flags.
const T_BUSY: u32 = 1;
const T_CHILD: u32 = 2;
const T_TIMED_OUT: u32 = 4;

/// Per-command state. The hot part is 16 bytes, four to a cache line; the
/// cold part (the PRP list) is found by index from the CID, not stored.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
struct Tracker {
    /// User data, or the split index for a child of a split request.
    user_data: u64,
    /// Timeout epoch at submission.
    epoch: u32,
    flags: u32,
}

/// A request split into several commands (larger than the max transfer).
struct Split {
    user_data: u64,
    remaining: u32,
    error: Option<IoError>,
}

/// What a request waiting in the software queue will do.
enum PendingOp {
    Rw {
        opc: NvmOpcode,
        ns: Namespace,
        lba: u64,
        nlb: u32,
        data: SliceRef,
    },
    Raw {
        sqe: Sqe,
        data: Option<SliceRef>,
    },
    /// Deallocate one range (its descriptor is built in the tracker's PRP
    /// list slice when issued).
    Dealloc {
        nsid: u32,
        lba: u64,
        nlb: u32,
    },
}

struct Pending {
    op: PendingOp,
    user_data: u64,
}

/// Where the SQ tail goes: an MMIO doorbell, optionally behind a shadow.
struct SqBell {
    mmio: Doorbell,
    shadow: Option<Shadow>,
}

/// Shadow doorbell and event index slots of one queue (in host memory).
#[derive(Clone, Copy)]
struct Shadow {
    value: NonNull<AtomicU32>,
    event: NonNull<AtomicU32>,
}

/// NVMe's (and Linux's `nvme_dbbuf_need_event`) rule: an MMIO write is
/// needed iff the event index lies in [old, new).
#[inline(always)]
fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Shadow {
    /// Zeroes the shadow value and event index (before the queue exists).
    fn clear(&self) {
        // SAFETY: see `publish`.
        let (v, e) = unsafe { (self.value.as_ref(), self.event.as_ref()) };
        v.store(0, Ordering::Release);
        e.store(0, Ordering::Release);
    }

    /// Publishes `new` (the previous value was `old`); true if the MMIO
    /// doorbell must be written too.
    #[inline(always)]
    fn publish(&self, new: u32, old: u32) -> bool {
        // SAFETY: both point into the controller's shadow/event pages, kept
        // alive by `Shared` (the queue pair holds an Arc to it).
        let (v, e) = unsafe { (self.value.as_ref(), self.event.as_ref()) };
        v.store(new, Ordering::Release);
        // The device must see the new value before we read its event index
        // (Linux: mb() in nvme_dbbuf_update_and_check_event).
        fence(Ordering::SeqCst);
        need_event(e.load(Ordering::Acquire) as u16, new as u16, old as u16)
    }
}

/// The submission half of a queue pair. `QueuePair` derefs to it, and the
/// completion handler given to `poll` gets it, so a handler can submit the
/// next request while its tracker is still in cache.
pub struct Submitter {
    // --- hot: touched per command ---
    sq: NonNull<Sqe>,
    sq_tail: u16,
    sq_entries: u16,
    nt: bool,
    delayed: bool,
    sq_batch: u16,
    epoch: u32,
    trackers: Box<[Tracker]>,
    free: Vec<u16>,
    prp_pool: NonNull<u64>,
    prp_pool_iova: u64,
    /// log2 of the PRP list slice entries per tracker.
    prp_shift: u32,
    state: QpState,
    /// `state == Ready && queue.is_empty()`: the one test the fast submit
    /// path makes. Kept by `set_state` and the queue operations.
    fast: bool,
    stats: QpairStats,
    // --- colder ---
    sq_bell: SqBell,
    /// SQ tail the controller was last told about.
    sq_rung: u16,
    splits: Vec<Split>,
    free_splits: Vec<u32>,
    queue: VecDeque<Pending>,
    max_queued: usize,
    /// Results decided on the submit side after a request was accepted,
    /// delivered by the next poll.
    deferred: Vec<Completion>,
    /// Commands failed without a completion entry (controller reset), and
    /// the outstanding count when the stats were last reset: with
    /// `completed` and `outstanding()` they give `submitted` exactly.
    failed_outstanding: u64,
    outstanding_at_reset: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum QpState {
    Ready,
    /// The controller is resetting (or was reset and the queues are not
    /// re-created yet): submissions are refused.
    Resetting,
    Failed,
}

struct CqState {
    ring: NonNull<u8>,
    head: u16,
    entries: u16,
    phase: u32,
    /// Entries consumed since the last CQ doorbell.
    unacked: u32,
    /// Ring the CQ doorbell when `unacked` exceeds this (0: every poll).
    unacked_limit: u32,
    bell: Doorbell,
    shadow: Option<Shadow>,
    /// CQ head the controller was last told about (for the shadow rule).
    rung_head: u16,
    prefetch: bool,
}

/// An I/O queue pair. See the module docs.
pub struct QueuePair {
    sub: Submitter,
    cq: CqState,
    shared: Arc<Shared>,
    qid: u16,
    generation: u32,
    timeout: Option<Duration>,
    next_tick: Instant,
    // DMA memory: keep alive as long as the rings are in use.
    sq_mem: DmaBuffer,
    cq_mem: DmaBuffer,
    _prp_mem: DmaBuffer,
}

// The raw pointers in Submitter/CqState point into DMA memory owned by the
// QueuePair (or the controller it holds an Arc to). Moving the whole queue
// pair to another thread is fine; sharing it is not (no Sync).
// SAFETY: see above; all access goes through &mut self.
unsafe impl Send for QueuePair {}
// SAFETY: a Submitter only exists inside a QueuePair (or borrowed from one).
unsafe impl Send for Submitter {}

impl std::ops::Deref for QueuePair {
    type Target = Submitter;
    fn deref(&self) -> &Submitter {
        &self.sub
    }
}

impl std::ops::DerefMut for QueuePair {
    fn deref_mut(&mut self) -> &mut Submitter {
        &mut self.sub
    }
}

/// Copies one SQE into its ring slot with non-temporal stores.
#[inline(always)]
fn nt_copy(dst: *mut Sqe, src: &Sqe) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        let s = (src as *const Sqe).cast::<__m128i>();
        let d = dst.cast::<__m128i>();
        // SAFETY: both are 64-byte aligned Sqe locations (Sqe is
        // align(64)); four 16-byte loads/stores cover it exactly. SSE2 is
        // part of the x86-64 baseline.
        unsafe {
            _mm_stream_si128(d, _mm_load_si128(s));
            _mm_stream_si128(d.add(1), _mm_load_si128(s.add(1)));
            _mm_stream_si128(d.add(2), _mm_load_si128(s.add(2)));
            _mm_stream_si128(d.add(3), _mm_load_si128(s.add(3)));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: dst is a valid, aligned SQ slot.
    unsafe {
        ptr::write(dst, *src)
    }
}

#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch is a hint and never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

impl Submitter {
    /// Writes `sqe` (CID already set) into the next SQ slot.
    #[inline(always)]
    fn push_sqe(&mut self, sqe: &Sqe) {
        // SAFETY: sq_tail < sq_entries, the ring holds sq_entries slots, and
        // the slot is free: at most depth = sq_entries - 1 commands are
        // outstanding, so the controller has consumed it.
        let slot = unsafe { self.sq.as_ptr().add(self.sq_tail as usize) };
        if self.nt {
            nt_copy(slot, sqe);
        } else {
            // SAFETY: as above.
            unsafe { ptr::write(slot, *sqe) };
        }
        self.sq_tail = if self.sq_tail + 1 == self.sq_entries {
            0
        } else {
            self.sq_tail + 1
        };
        if !self.delayed {
            self.ring_sq();
        }
    }

    /// Tells the controller about new SQ entries.
    #[inline]
    fn ring_sq(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if self.nt {
            // Non-temporal stores are not ordered by the Release store below.
            // SAFETY: sfence has no memory-safety preconditions.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
        let tail = self.sq_tail as u32;
        let mmio = match &self.sq_bell.shadow {
            None => true,
            Some(s) => {
                self.stats.shadow_updates += 1;
                s.publish(tail, self.sq_rung as u32)
            }
        };
        if mmio {
            self.sq_bell.mmio.write(tail);
            self.stats.sq_doorbells += 1;
        }
        self.sq_rung = self.sq_tail;
    }

    /// With SQ doorbell batching: at least `batch` new commands are waiting,
    /// or the controller holds fewer than `batch` (so it never starves).
    #[cold]
    fn batch_ready(&self, batch: u32) -> bool {
        let (tail, rung) = (self.sq_tail as u32, self.sq_rung as u32);
        let pending = if tail >= rung {
            tail - rung
        } else {
            tail + self.sq_entries as u32 - rung
        };
        pending >= batch || self.outstanding() - pending < batch
    }

    /// Rings the SQ doorbell now if commands are waiting for it.
    pub fn flush(&mut self) {
        if self.sq_tail != self.sq_rung {
            self.ring_sq();
        }
    }

    fn set_state(&mut self, s: QpState) {
        self.state = s;
        self.fast = s == QpState::Ready && self.queue.is_empty();
    }

    #[inline(always)]
    fn check_state(&self) -> Result<(), SubmitError> {
        match self.state {
            QpState::Ready => Ok(()),
            QpState::Resetting => Err(SubmitError::Resetting),
            QpState::Failed => Err(SubmitError::ControllerFailed),
        }
    }

    /// Claims a tracker for one command.
    #[inline(always)]
    fn claim(&mut self, cid: u16, user_data: u64, flags: u32) {
        let t = &mut self.trackers[cid as usize];
        debug_assert_eq!(t.flags & T_BUSY, 0);
        *t = Tracker {
            user_data,
            epoch: self.epoch,
            flags: T_BUSY | flags,
        };
    }

    /// The PRP list slice of tracker `cid` and its bus address.
    #[inline(always)]
    fn prp_list(&mut self, cid: u16) -> (&mut [u64], u64) {
        let n = 1usize << self.prp_shift;
        let off = (cid as usize) << self.prp_shift;
        // SAFETY: the pool holds trackers.len() << prp_shift entries and
        // cid < trackers.len(); a tracker's slice is used only by its command.
        let list = unsafe { std::slice::from_raw_parts_mut(self.prp_pool.as_ptr().add(off), n) };
        (list, self.prp_pool_iova + (off as u64) * 8)
    }

    /// Issues one command on tracker `cid` with data at `iova_at`.
    /// On error the tracker is returned to the free list and nothing is sent.
    // Primitive arguments on purpose: this is the hot path's core.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn issue(
        &mut self,
        cid: u16,
        mut sqe: Sqe,
        len: usize,
        prp1: u64,
        iova_at: impl Fn(usize) -> u64,
        user_data: u64,
        flags: u32,
    ) -> Result<(), SubmitError> {
        // Callers have checked that PRP1 is dword aligned.
        debug_assert_eq!(prp1 & 3, 0);
        sqe.prp1 = prp1;
        if len > 0 && len as u64 > prp::PAGE - (prp1 & (prp::PAGE - 1)) {
            // Beyond the first page: PRP2 or a list in this tracker's slice.
            let (list, list_iova) = self.prp_list(cid);
            match prp::build(len, prp1, iova_at, list, list_iova) {
                Ok(p) => sqe.prp2 = p.prp2,
                Err(e) => return Err(self.prp_failed(cid, e)),
            }
        }
        sqe.cid = cid;
        self.claim(cid, user_data, flags);
        self.push_sqe(&sqe);
        Ok(())
    }

    #[cold]
    fn prp_failed(&mut self, cid: u16, e: prp::PrpError) -> SubmitError {
        self.free.push(cid);
        match e {
            prp::PrpError::Unaligned => SubmitError::Unaligned { iova: 0 },
            prp::PrpError::NotPageAligned | prp::PrpError::ListTooSmall { .. } => {
                SubmitError::BadBuffer
            }
        }
    }

    #[inline(always)]
    fn check_rw(
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        len: usize,
        iova0: u64,
    ) -> Result<(), SubmitError> {
        // nlb == 0 passes these checks (with an empty buffer) and is refused
        // on the slow path: the fast-path test `nlb - 1 < max_lbas` excludes
        // it at no extra cost.
        Self::check_lbas(ns, lba, nlb)?;
        let expected = (nlb as usize) << ns.lba_shift;
        if len != expected {
            return Err(SubmitError::BufferLength { expected, got: len });
        }
        if iova0 & 3 != 0 {
            return Err(SubmitError::Unaligned { iova: iova0 });
        }
        Ok(())
    }

    /// Reads `nlb` blocks at `lba` into `buf` (exactly `nlb` blocks long).
    #[inline]
    pub fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw(NvmOpcode::Read, ns, lba, nlb, buf, user_data)
    }

    /// Writes `buf` (exactly `nlb` blocks long) to `nlb` blocks at `lba`.
    #[inline]
    pub fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw(NvmOpcode::Write, ns, lba, nlb, buf, user_data)
    }

    #[inline(always)]
    fn rw(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        Self::check_rw(ns, lba, nlb, buf.len(), buf.iova0())?;
        // `fast` implies the queue pair is ready and nothing waits ahead.
        if nlb.wrapping_sub(1) < ns.max_lbas && self.fast {
            if let Some(cid) = self.free.pop() {
                let sqe = Sqe::rw(opc, ns.nsid, lba, nlb);
                return self.issue(
                    cid,
                    sqe,
                    buf.len(),
                    buf.iova0(),
                    |i| buf.iova_at(i),
                    user_data,
                    0,
                );
            }
        }
        self.check_state()?;
        self.rw_slow(opc, ns, lba, nlb, buf.to_owned_ref(), user_data)
    }

    /// A request that is split, or has to wait for trackers.
    #[cold]
    fn rw_slow(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        data: SliceRef,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        if nlb == 0 {
            return Err(SubmitError::ZeroLength);
        }
        let needed = nlb.div_ceil(ns.max_lbas);
        if needed as usize > self.trackers.len() {
            return Err(SubmitError::TooLarge {
                needed,
                depth: self.trackers.len() as u32,
            });
        }
        if self.queue.is_empty() && self.free.len() >= needed as usize {
            return self.issue_split(opc, ns, lba, nlb, &data, user_data);
        }
        self.enqueue(Pending {
            op: PendingOp::Rw {
                opc,
                ns: *ns,
                lba,
                nlb,
                data,
            },
            user_data,
        })
    }

    fn enqueue(&mut self, p: Pending) -> Result<(), SubmitError> {
        if self.queue.len() >= self.max_queued {
            return Err(SubmitError::QueueFull {
                limit: self.max_queued,
            });
        }
        self.stats.queued += 1;
        self.queue.push_back(p);
        self.fast = false;
        Ok(())
    }

    /// Issues a read/write as `ceil(nlb / max_lbas)` commands (the caller
    /// checked that enough trackers are free). A single-command request
    /// takes no split slot. If a later piece cannot be built (a broken
    /// buffer page table), the pieces already sent finish and the request
    /// completes with the error: never silently lost.
    fn issue_split(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        data: &SliceRef,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        let needed = nlb.div_ceil(ns.max_lbas);
        if self.free.len() < needed as usize {
            return Err(SubmitError::TooLarge {
                needed,
                depth: self.free.len() as u32,
            });
        }
        if needed == 1 {
            let Some(cid) = self.free.pop() else {
                return Err(SubmitError::TooLarge { needed, depth: 0 });
            };
            let sqe = Sqe::rw(opc, ns.nsid, lba, nlb);
            return self.issue(
                cid,
                sqe,
                data.len,
                data.iova_at(0),
                |i| data.iova_at(i),
                user_data,
                0,
            );
        }
        let split = Split {
            user_data,
            remaining: needed,
            error: None,
        };
        let idx = match self.free_splits.pop() {
            Some(i) => {
                self.splits[i as usize] = split;
                i
            }
            None => {
                self.splits.push(split);
                (self.splits.len() - 1) as u32
            }
        };
        let mut done = 0u32;
        let mut sent = 0u32;
        let mut failed = None;
        while done < nlb {
            let n = (nlb - done).min(ns.max_lbas);
            let Some(cid) = self.free.pop() else { break };
            let off = (done as usize) << ns.lba_shift;
            let sqe = Sqe::rw(opc, ns.nsid, lba + done as u64, n);
            if let Err(e) = self.issue(
                cid,
                sqe,
                (n as usize) << ns.lba_shift,
                data.iova_at(off),
                |i| data.iova_at(off + i),
                idx as u64,
                T_CHILD,
            ) {
                failed = Some(e);
                break;
            }
            sent += 1;
            done += n;
        }
        if let Some(e) = failed {
            if sent == 0 {
                self.free_splits.push(idx);
                return Err(e);
            }
            tracing::error!("split request: piece {sent} of {needed} could not be built ({e}); failing the request");
            let s = &mut self.splits[idx as usize];
            s.remaining = sent;
            s.error = Some(IoError::Nvme(Status::generic(
                pollux_spec::status::generic::DATA_TRANSFER_ERROR,
            )));
        }
        Ok(())
    }

    /// Flushes the namespace's volatile write cache.
    pub fn flush_cache(&mut self, ns: &Namespace, user_data: u64) -> Result<(), SubmitError> {
        self.raw(Sqe::flush(ns.nsid), None, user_data)
    }

    /// Write Zeroes over `nlb` blocks at `lba` (at most `max_lbas` and
    /// 65536 per command); `deallocate` lets the controller deallocate them.
    pub fn write_zeroes(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        deallocate: bool,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        Self::check_range(ns, lba, nlb)?;
        if nlb > 65536 {
            return Err(SubmitError::TooLarge {
                needed: nlb.div_ceil(65536),
                depth: 1,
            });
        }
        self.raw(
            Sqe::write_zeroes(ns.nsid, lba, nlb, deallocate),
            None,
            user_data,
        )
    }

    /// Dataset Management, deallocate one range. The range descriptor lives
    /// in the tracker's PRP list slice, so no buffer is needed.
    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.check_state()?;
        Self::check_range(ns, lba, nlb)?;
        let Some(cid) = (if self.queue.is_empty() {
            self.free.pop()
        } else {
            None
        }) else {
            return self.enqueue(Pending {
                op: PendingOp::Dealloc {
                    nsid: ns.nsid,
                    lba,
                    nlb,
                },
                user_data,
            });
        };
        self.issue_dealloc(cid, ns.nsid, lba, nlb, user_data);
        Ok(())
    }

    fn issue_dealloc(&mut self, cid: u16, nsid: u32, lba: u64, nlb: u32, user_data: u64) {
        let (list, iova) = self.prp_list(cid);
        let r = DsmRange {
            cattr: 0,
            nlb,
            slba: lba,
        };
        // One 16-byte range in the (≥ 16-byte, 8-byte aligned) list slice.
        list[0] = (r.cattr as u64) | ((r.nlb as u64) << 32);
        list[1] = r.slba;
        let mut sqe = Sqe::dsm(nsid, 1, DSM_ATTR_DEALLOCATE, iova);
        sqe.cid = cid;
        self.claim(cid, user_data, 0);
        self.push_sqe(&sqe);
    }

    fn check_range(ns: &Namespace, lba: u64, nlb: u32) -> Result<(), SubmitError> {
        if nlb == 0 {
            return Err(SubmitError::ZeroLength);
        }
        Self::check_lbas(ns, lba, nlb)
    }

    /// `[lba, lba + nlb)` lies inside the namespace.
    #[inline(always)]
    fn check_lbas(ns: &Namespace, lba: u64, nlb: u32) -> Result<(), SubmitError> {
        match lba.checked_add(nlb as u64) {
            Some(end) if end <= ns.nsze => Ok(()),
            _ => Err(SubmitError::LbaOutOfRange {
                lba,
                nlb,
                nsze: ns.nsze,
            }),
        }
    }

    /// Raw command passthrough. The driver sets CID and, if `data` is
    /// given, PRP1/PRP2 (data at most the queue pair's max transfer).
    pub fn raw(
        &mut self,
        sqe: Sqe,
        data: Option<DmaSlice<'_>>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.check_state()?;
        if let Some(d) = &data {
            if d.is_empty() {
                return Err(SubmitError::ZeroLength);
            }
            let iova0 = d.iova_at(0);
            if iova0 & 3 != 0 {
                return Err(SubmitError::Unaligned { iova: iova0 });
            }
            let cap = (1usize << self.prp_shift).saturating_sub(1) * prp::PAGE as usize;
            if d.len() > cap {
                return Err(SubmitError::BufferLength {
                    expected: cap,
                    got: d.len(),
                });
            }
        }
        if self.queue.is_empty() {
            if let Some(cid) = self.free.pop() {
                return match data {
                    Some(d) => {
                        self.issue(cid, sqe, d.len(), d.iova0(), |i| d.iova_at(i), user_data, 0)
                    }
                    None => self.issue(cid, sqe, 0, 0, |_| 0, user_data, 0),
                };
            }
        }
        self.enqueue(Pending {
            op: PendingOp::Raw {
                sqe,
                data: data.map(|d| d.to_owned_ref()),
            },
            user_data,
        })
    }

    /// Submits waiting requests while trackers are free.
    #[cold]
    fn drain_queue(&mut self) {
        while let Some(p) = self.queue.front() {
            let needed = match &p.op {
                PendingOp::Rw { ns, nlb, .. } => nlb.div_ceil(ns.max_lbas) as usize,
                PendingOp::Raw { .. } | PendingOp::Dealloc { .. } => 1,
            };
            if self.free.len() < needed || self.state != QpState::Ready {
                return;
            }
            let p = self.queue.pop_front();
            self.fast = self.state == QpState::Ready && self.queue.is_empty();
            let Some(p) = p else {
                return;
            };
            let r = match p.op {
                PendingOp::Rw {
                    opc,
                    ns,
                    lba,
                    nlb,
                    data,
                } => self.issue_split(opc, &ns, lba, nlb, &data, p.user_data),
                PendingOp::Dealloc { nsid, lba, nlb } => {
                    let Some(cid) = self.free.pop() else { return };
                    self.issue_dealloc(cid, nsid, lba, nlb, p.user_data);
                    Ok(())
                }
                PendingOp::Raw { sqe, data } => {
                    let Some(cid) = self.free.pop() else { return };
                    match &data {
                        Some(d) => self.issue(
                            cid,
                            sqe,
                            d.len,
                            d.iova_at(0),
                            |i| d.iova_at(i),
                            p.user_data,
                            0,
                        ),
                        None => self.issue(cid, sqe, 0, 0, |_| 0, p.user_data, 0),
                    }
                }
            };
            if let Err(e) = r {
                // Accepted earlier, so it must complete: with an error, on
                // the next poll.
                tracing::error!("queued request could not be issued: {e}");
                let st = Status::generic(pollux_spec::status::generic::DATA_TRANSFER_ERROR);
                self.deferred.push(Completion {
                    user_data: p.user_data,
                    result: Err(IoError::Nvme(st)),
                });
            }
        }
    }

    /// Commands outstanding at the controller (written to the SQ).
    pub fn outstanding(&self) -> u32 {
        (self.trackers.len() - self.free.len()) as u32
    }

    /// Requests waiting in software for a free tracker.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Outstanding + queued.
    pub fn in_flight(&self) -> usize {
        self.outstanding() as usize + self.queue.len() + self.deferred.len()
    }

    /// Trackers (the most commands outstanding at once).
    pub fn depth(&self) -> u32 {
        self.trackers.len() as u32
    }

    pub fn stats(&self) -> QpairStats {
        // Every command written to the SQ is either still outstanding or has
        // completed: no per-I/O counter needed.
        let mut s = self.stats;
        s.submitted = (s.completed - s.bogus_completions
            + self.failed_outstanding
            + self.outstanding() as u64)
            .saturating_sub(self.outstanding_at_reset);
        s
    }

    pub fn reset_stats(&mut self) {
        self.stats = QpairStats::default();
        self.failed_outstanding = 0;
        self.outstanding_at_reset = self.outstanding() as u64;
    }

    /// Releases tracker `cid` and delivers its completion.
    #[inline(always)]
    fn complete<F: Handler>(&mut self, cid: u16, status: u16, dw0: u32, f: &mut F) {
        let Some(t) = self.trackers.get_mut(cid as usize) else {
            return self.bogus(cid);
        };
        let flags = t.flags;
        let user_data = t.user_data;
        // One test for the common case: outstanding, not split, not timed out.
        if flags == T_BUSY {
            t.flags = 0;
            self.free.push(cid);
            let st = Status(status);
            let result = if st.is_success() {
                Ok(dw0)
            } else {
                Err(IoError::Nvme(st))
            };
            f.complete(self, Completion { user_data, result });
        } else {
            self.complete_other(cid, flags, user_data, status, dw0, f);
        }
    }

    /// A completion for a split or timed-out command, or a bogus one.
    #[cold]
    fn complete_other<F: Handler>(
        &mut self,
        cid: u16,
        flags: u32,
        user_data: u64,
        status: u16,
        dw0: u32,
        f: &mut F,
    ) {
        if flags & T_BUSY == 0 {
            return self.bogus(cid);
        }
        self.trackers[cid as usize].flags = 0;
        self.free.push(cid);
        self.complete_slow(flags, user_data, status, dw0, f);
    }

    #[cold]
    fn bogus(&mut self, cid: u16) {
        self.stats.bogus_completions += 1;
        tracing::error!(
            cid,
            "controller completed a command that is not outstanding; ignored"
        );
    }

    #[cold]
    fn complete_slow<F: Handler>(
        &mut self,
        flags: u32,
        user_data: u64,
        status: u16,
        dw0: u32,
        f: &mut F,
    ) {
        let st = Status(status);
        let result = if flags & T_TIMED_OUT != 0 {
            Err(IoError::Timeout)
        } else if st.is_success() {
            Ok(dw0)
        } else {
            Err(IoError::Nvme(st))
        };
        self.finish(flags, user_data, result, f);
    }

    /// Delivers a result for a tracker that has already been released.
    fn finish<F: Handler>(
        &mut self,
        flags: u32,
        user_data: u64,
        result: Result<u32, IoError>,
        f: &mut F,
    ) {
        if flags & T_CHILD == 0 {
            f.complete(self, Completion { user_data, result });
            return;
        }
        let idx = user_data as usize;
        let Some(s) = self.splits.get_mut(idx) else {
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
            };
            self.free_splits.push(idx as u32);
            f.complete(self, c);
        }
    }

    /// Fails every outstanding command with `err` (controller reset or
    /// failure). Waiting requests stay queued (they are resubmitted once the
    /// queue pair works again) unless the controller failed.
    fn fail_all<F: Handler>(&mut self, err: IoError, f: &mut F) {
        for cid in 0..self.trackers.len() {
            let t = self.trackers[cid];
            if t.flags & T_BUSY == 0 {
                continue;
            }
            self.trackers[cid].flags = 0;
            self.free.push(cid as u16);
            self.failed_outstanding += 1;
            let e = if t.flags & T_TIMED_OUT != 0 {
                IoError::Timeout
            } else {
                err
            };
            self.finish(t.flags, t.user_data, Err(e), f);
        }
        if err == IoError::ControllerFailed {
            self.fast = false;
            while let Some(p) = self.queue.pop_front() {
                let flags = 0;
                self.finish(flags, p.user_data, Err(err), f);
            }
        }
        debug_assert_eq!(self.outstanding(), 0);
    }
}

impl QueuePair {
    pub(crate) fn new(shared: Arc<Shared>, qid: u16, opts: QpairOptions) -> Result<QueuePair> {
        let max_entries = shared.cap.mqes() as u32 + 1;
        let depth = opts.depth as u32;
        if depth == 0 || depth + 1 > max_entries {
            return Err(Error::InvalidArgument(format!(
                "queue depth {depth} not in 1..={}",
                max_entries - 1
            )));
        }
        let sq_entries = depth + 1;
        let cq_entries = match opts.cq_entries {
            Some(n) => n as u32,
            None => (4 * depth).clamp(sq_entries, max_entries),
        };
        if cq_entries <= depth || cq_entries > max_entries {
            return Err(Error::InvalidArgument(format!(
                "CQ entries {cq_entries} must be in {}..={max_entries}",
                depth + 1
            )));
        }
        if opts.sq_doorbell_batch == 0 {
            return Err(Error::InvalidArgument(
                "sq_doorbell_batch must be at least 1".into(),
            ));
        }
        // PRP list slice: entries for the largest transfer (+1 for an
        // unaligned start), a power of two, at least 2 (a DSM range), at
        // most one page.
        let list_entries = ((shared.max_transfer as usize).div_ceil(4096) + 1)
            .next_power_of_two()
            .clamp(2, 512);
        let prp_shift = list_entries.trailing_zeros();
        let p = &*shared.platform;
        let sq_mem = p.alloc_dma(sq_entries as usize * 64)?;
        let cq_mem = p.alloc_dma(cq_entries as usize * 16)?;
        let prp_mem = p.alloc_dma((depth as usize) << (prp_shift + 3))?;
        // Rings are described to the controller by one base address, and
        // PRP list slices by base + offset: their bus addresses must be
        // contiguous.
        for (what, m) in [
            ("SQ", &sq_mem),
            ("CQ", &cq_mem),
            ("PRP list pool", &prp_mem),
        ] {
            if !m.is_iova_contiguous() {
                return Err(Error::Dma(format!(
                    "{what} memory ({} bytes) is not contiguous in bus address space; reserve hugepages",
                    m.len()
                )));
            }
        }

        let dstrd = shared.cap.dstrd();
        let bar = p.bar0();
        // Shadow doorbells are a controller-wide setting: once Doorbell
        // Buffer Config succeeded, some controllers (QEMU) read doorbell
        // values only from the shadow buffer, so every queue must use it.
        let (sq_shadow, cq_shadow) = match &shared.dbbuf {
            Some(db) => {
                let slot = |off: usize| -> Result<Shadow> {
                    let rel = off - regs::off::DOORBELL_BASE;
                    if rel + 4 > 4096 {
                        return Err(Error::Unsupported(format!(
                            "queue {qid} doorbell outside the shadow page"
                        )));
                    }
                    // SAFETY: rel + 4 <= 4096 and both buffers are 4 KiB pages
                    // owned by Shared, which this queue pair keeps alive.
                    let (v, e) =
                        unsafe { (db.shadow.as_ptr().add(rel), db.eventidx.as_ptr().add(rel)) };
                    Ok(Shadow {
                        value: NonNull::new(v.cast())
                            .ok_or_else(|| Error::Platform("null shadow page".into()))?,
                        event: NonNull::new(e.cast())
                            .ok_or_else(|| Error::Platform("null event page".into()))?,
                    })
                };
                (
                    Some(slot(regs::sq_tail_doorbell(qid, dstrd))?),
                    Some(slot(regs::cq_head_doorbell(qid, dstrd))?),
                )
            }
            None => (None, None),
        };
        // A reused queue id's shadow slots still hold the previous queue's
        // values; a new queue starts at 0 (else the host's event-index rule
        // compares against stale values and may never ring).
        for s in [&sq_shadow, &cq_shadow].into_iter().flatten() {
            s.clear();
        }
        shared.create_io_queues(qid, &sq_mem, sq_entries as u16, &cq_mem, cq_entries as u16)?;
        let sq = NonNull::new(sq_mem.as_ptr().cast::<Sqe>())
            .ok_or_else(|| Error::Platform("null SQ".into()))?;
        let cq_ring =
            NonNull::new(cq_mem.as_ptr()).ok_or_else(|| Error::Platform("null CQ".into()))?;
        let prp_pool = NonNull::new(prp_mem.as_ptr().cast::<u64>())
            .ok_or_else(|| Error::Platform("null PRP pool".into()))?;
        let free: Vec<u16> = (0..depth as u16).rev().collect();
        let sub = Submitter {
            sq,
            sq_tail: 0,
            sq_entries: sq_entries as u16,
            nt: opts.nt_sqe_copy && cfg!(target_arch = "x86_64"),
            delayed: opts.delayed_sq_doorbell,
            sq_batch: opts.sq_doorbell_batch,
            epoch: 0,
            trackers: vec![Tracker::default(); depth as usize].into_boxed_slice(),
            free,
            prp_pool,
            prp_pool_iova: prp_mem.iova_at(0),
            prp_shift,
            state: QpState::Ready,
            fast: true,
            stats: QpairStats::default(),
            sq_bell: SqBell {
                mmio: bar.doorbell(regs::sq_tail_doorbell(qid, dstrd)),
                shadow: sq_shadow,
            },
            sq_rung: 0,
            splits: Vec::new(),
            free_splits: Vec::new(),
            queue: VecDeque::new(),
            max_queued: opts.max_queued,
            deferred: Vec::new(),
            failed_outstanding: 0,
            outstanding_at_reset: 0,
        };
        // Lazy CQ doorbell: the controller may post at most `depth` entries
        // we have not consumed yet (one per outstanding command). Keeping
        // unacked + depth <= cq_entries - 1 after every poll means it always
        // has room. Without the lazy doorbell, ring whenever anything was
        // consumed.
        let unacked_limit = if opts.lazy_cq_doorbell {
            cq_entries - 1 - depth
        } else {
            0
        };
        let cq = CqState {
            ring: cq_ring,
            head: 0,
            entries: cq_entries as u16,
            phase: 1,
            unacked: 0,
            unacked_limit,
            bell: bar.doorbell(regs::cq_head_doorbell(qid, dstrd)),
            shadow: cq_shadow,
            rung_head: 0,
            prefetch: opts.prefetch,
        };
        let generation = shared.generation.load(Ordering::Acquire);
        Ok(QueuePair {
            sub,
            cq,
            generation,
            qid,
            timeout: opts.timeout,
            next_tick: Instant::now() + opts.timeout.map_or(Duration::ZERO, |t| t / 2),
            shared,
            sq_mem,
            cq_mem,
            _prp_mem: prp_mem,
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// CQ entries.
    pub fn cq_entries(&self) -> u16 {
        self.cq.entries
    }

    /// Processes up to `max` completions, calling `f` for each finished
    /// request (a split request finishes once). `f` may submit new requests
    /// through the `Submitter` it is given. Then submits waiting requests,
    /// rings the SQ doorbell once if anything new was written, and the CQ
    /// doorbell if needed. Returns the number of CQ entries consumed.
    #[inline(always)]
    pub fn poll<F: FnMut(&mut Submitter, Completion)>(&mut self, max: u32, mut f: F) -> u32 {
        self.poll_with(max, &mut f)
    }

    /// `poll` with a borrowed handler (e.g. a struct implementing `Handler`
    /// that lives on across polls).
    #[inline(always)]
    pub fn poll_with<F: Handler>(&mut self, max: u32, f: &mut F) -> u32 {
        if self.shared.generation.load(Ordering::Relaxed) != self.generation {
            self.recover(f);
        }
        if !self.sub.deferred.is_empty() {
            self.deliver_deferred(f);
        }
        let n = self.reap(max, f);
        self.finish_poll(n);
        n
    }

    #[cold]
    fn deliver_deferred<F: Handler>(&mut self, f: &mut F) {
        let d = std::mem::take(&mut self.sub.deferred);
        for c in d {
            f.complete(&mut self.sub, c);
        }
    }

    /// The completion loop (Linux `nvme_poll_cq`): load the status word
    /// with Acquire (phase check = `dma_rmb`), handle, advance.
    #[inline(always)]
    fn reap<F: Handler>(&mut self, max: u32, f: &mut F) -> u32 {
        let cq = &mut self.cq;
        let sub = &mut self.sub;
        let mut n = 0;
        while n < max {
            // SAFETY: head < entries; the ring holds `entries` 16-byte CQEs
            // and dword 3 is 4-byte aligned. The controller stores dword 3
            // last, with Release.
            let e = unsafe { cq.ring.as_ptr().add(cq.head as usize * 16) };
            // SAFETY: as above.
            let w3 = unsafe { AtomicU32::from_ptr(e.add(12).cast()) }.load(Ordering::Acquire);
            if (w3 >> 16) & 1 != cq.phase {
                break;
            }
            // SAFETY: the entry is ours until we release it via the CQ head
            // doorbell; dword 0 was written before dword 3 was published.
            let dw0 = unsafe { ptr::read_volatile(e.cast::<u32>()) };
            cq.head += 1;
            if cq.head == cq.entries {
                cq.head = 0;
                cq.phase ^= 1;
            }
            if cq.prefetch {
                // SAFETY: as above for the next entry; a relaxed peek only
                // chooses what to prefetch.
                let nw = unsafe {
                    AtomicU32::from_ptr(cq.ring.as_ptr().add(cq.head as usize * 16 + 12).cast())
                }
                .load(Ordering::Relaxed);
                // No phase check and no bounds check: if the entry is not
                // posted yet its CID is stale, and prefetching a stale or
                // bogus tracker address is harmless (prefetch never faults;
                // the CID is checked where it is used).
                prefetch(sub.trackers.as_ptr().wrapping_add((nw & 0xFFFF) as usize));
            }
            n += 1;
            sub.complete((w3 & 0xFFFF) as u16, (w3 >> 17) as u16, dw0, f);
        }
        sub.stats.completed += n as u64;
        n
    }

    /// Doorbells and queued work at the end of a poll.
    #[inline(always)]
    fn finish_poll(&mut self, n: u32) {
        let sub = &mut self.sub;
        sub.stats.polls += 1;
        if n > 0 {
            let cq = &mut self.cq;
            cq.unacked += n;
            if cq.unacked > cq.unacked_limit {
                let head = cq.head as u32;
                let mmio = match &cq.shadow {
                    None => true,
                    Some(s) => {
                        sub.stats.shadow_updates += 1;
                        s.publish(head, cq.rung_head as u32)
                    }
                };
                if mmio {
                    cq.bell.write(head);
                    sub.stats.cq_doorbells += 1;
                }
                cq.rung_head = cq.head;
                cq.unacked = 0;
            }
        }
        if !sub.queue.is_empty() {
            sub.drain_queue();
        }
        if sub.sq_tail != sub.sq_rung {
            // New commands since the last doorbell, and commands the
            // controller already knows about.
            let batch = sub.sq_batch as u32;
            if batch == 1 || sub.batch_ready(batch) {
                sub.ring_sq();
            }
        }
        if self.timeout.is_some() && sub.stats.polls & 4095 == 0 {
            self.tick();
        }
    }

    /// Timeout bookkeeping, every 4096 polls: advance the epoch every
    /// timeout/2, abort commands at least two epochs old (so a command times
    /// out after between 1x and 1.5x the timeout), and notice a controller
    /// that reports fatal status.
    #[cold]
    fn tick(&mut self) {
        let Some(timeout) = self.timeout else { return };
        let now = Instant::now();
        if now < self.next_tick {
            return;
        }
        self.next_tick = now + timeout / 2;
        self.sub.epoch = self.sub.epoch.wrapping_add(1);
        let csts = self.shared.csts();
        if csts.cfs() || csts.is_dead() {
            tracing::error!(
                qid = self.qid,
                csts = csts.0,
                "controller fatal status; resetting"
            );
            self.reset_controller();
            return;
        }
        let epoch = self.sub.epoch;
        let mut need_reset = false;
        for cid in 0..self.sub.trackers.len() {
            let t = self.sub.trackers[cid];
            if t.flags & T_BUSY == 0 || epoch.wrapping_sub(t.epoch) < 3 {
                continue;
            }
            if t.flags & T_TIMED_OUT != 0 {
                // Aborted earlier but its completion never came.
                need_reset = true;
                continue;
            }
            self.sub.stats.timeouts += 1;
            self.sub.trackers[cid].flags |= T_TIMED_OUT;
            self.sub.trackers[cid].epoch = epoch;
            tracing::warn!(qid = self.qid, cid, "command timed out; aborting");
            self.sub.stats.aborts_sent += 1;
            match self.shared.abort(self.qid, cid as u16) {
                Ok(true) => {}
                Ok(false) => {
                    tracing::warn!(qid = self.qid, cid, "controller did not abort the command");
                    need_reset = true;
                }
                Err(e) => {
                    tracing::warn!(qid = self.qid, cid, "abort failed: {e}");
                    need_reset = true;
                    break;
                }
            }
        }
        if need_reset {
            self.reset_controller();
        }
    }

    #[cold]
    fn reset_controller(&mut self) {
        if let Err(e) = self.shared.reset(self.generation) {
            tracing::error!(qid = self.qid, "controller reset failed: {e}");
        }
    }

    /// The controller was reset (by this or another queue pair): fail what
    /// was outstanding, re-create the queues with the same memory.
    #[cold]
    fn recover<F: Handler>(&mut self, f: &mut F) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g & 1 == 1 {
            // Reset in progress elsewhere: refuse submissions until it ends.
            self.sub.set_state(QpState::Resetting);
            return;
        }
        self.sub.stats.resets_seen += 1;
        let failed = self.shared.failed.load(Ordering::Acquire);
        self.sub.fail_all(
            if failed {
                IoError::ControllerFailed
            } else {
                IoError::ControllerReset
            },
            f,
        );
        self.generation = g;
        if failed {
            self.sub.set_state(QpState::Failed);
            return;
        }
        self.cq_mem.as_mut_slice().fill(0);
        self.cq.head = 0;
        self.cq.phase = 1;
        self.cq.unacked = 0;
        self.cq.rung_head = 0;
        self.sub.sq_tail = 0;
        self.sub.sq_rung = 0;
        match self.shared.create_io_queues(
            self.qid,
            &self.sq_mem,
            self.sub.sq_entries,
            &self.cq_mem,
            self.cq.entries,
        ) {
            Ok(()) => {
                tracing::info!(
                    qid = self.qid,
                    "queue pair re-created after controller reset"
                );
                self.sub.set_state(QpState::Ready);
            }
            Err(e) => {
                tracing::error!(qid = self.qid, "re-creating queues after reset failed: {e}");
                self.sub.set_state(QpState::Failed);
                self.sub.fail_all(IoError::ControllerFailed, f);
            }
        }
    }

    /// Polls until nothing is outstanding or queued, or `timeout` passes
    /// (relaxing the platform in between). Returns completions seen.
    pub fn drain<F: FnMut(&mut Submitter, Completion)>(
        &mut self,
        timeout: Duration,
        mut f: F,
    ) -> Result<u64> {
        let start = Instant::now();
        let mut total = 0u64;
        while self.sub.in_flight() > 0 || !self.sub.deferred.is_empty() {
            self.sub.flush();
            total += self.poll_with(u32::MAX, &mut f) as u64;
            if self.sub.state == QpState::Failed && self.sub.in_flight() == 0 {
                break;
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: "draining queue pair",
                    ms: timeout.as_millis() as u64,
                });
            }
            self.shared.platform.relax();
        }
        Ok(total)
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let g = self.shared.generation.load(Ordering::Acquire);
        if g == self.generation && !self.shared.failed.load(Ordering::Acquire) {
            if let Err(e) = self.shared.delete_io_queues(self.qid) {
                tracing::warn!(qid = self.qid, "deleting I/O queues: {e}");
            }
        }
        self.shared.release_qid(self.qid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_event_matches_linux() {
        // Event index inside [old, new): MMIO needed.
        assert!(need_event(5, 6, 5));
        assert!(need_event(5, 10, 3));
        // Event index behind old (device polls): not needed.
        assert!(!need_event(4, 10, 5));
        assert!(!need_event(u16::MAX, 3, 0));
        // Event index at or past new: not needed.
        assert!(!need_event(10, 10, 5));
    }

    #[test]
    fn tracker_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Tracker>(), 16);
        assert_eq!(std::mem::align_of::<Tracker>(), 16);
    }
}
