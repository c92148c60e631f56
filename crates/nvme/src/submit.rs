//! The submit path: trackers and CIDs, request splitting, the software
//! backlog. Transport-free: each command goes to the transport's
//! `SubmissionQueue::push`, which writes it (on PCIe: into the SQ ring slot,
//! PRPs in the tracker's list slice).
//!
//! Per I/O on the fast path: one bounds test, one state test, one pop from
//! the free list, one tracker store, the transport's push, and (for
//! an owned buffer) one pointer store into the tracker.
//!
//! # Buffers
//!
//! A buffer under DMA must not be reachable through a safe `&`/`&mut`
//! slice while the device may write it. Two ways in, one model:
//! - `read`, `write`, `raw` take an owned [`IoBuf`] and hand it back in the
//!   request's `Completion` (or in `Refused` if the request was refused):
//!   while the request is in flight, only the queue pair holds it. Safe.
//! - `read_dma`, `write_dma`, `raw_dma` take a `DmaSlice` borrow and are
//!   `unsafe`: the caller promises what the owned layer guarantees (the
//!   buffer stays allocated and untouched until the completion). For
//!   callers that manage buffers themselves (a C API, an fio engine).
use std::collections::VecDeque;
use std::marker::PhantomData;

use pollux_spec::cmd::{NvmOpcode, RwFlags};
use pollux_spec::{Sqe, Status};

use crate::completion::{Completion, QpairStats};
use crate::dma::{DmaSlice, IoBuf, SliceRef};
use crate::error::{IoError, SubmitError};
use crate::namespace::Namespace;
use crate::transport::{SubmissionQueue, Transport};

// Tracker flags.
pub(crate) const T_BUSY: u32 = 1;
pub(crate) const T_CHILD: u32 = 2;
pub(crate) const T_TIMED_OUT: u32 = 4;

/// `Core::spare` holds no CID.
pub(crate) const NO_CID: u32 = u32::MAX;

/// Per-command state: 32 bytes, two to a cache line, everything the
/// completion needs in one line. Anything colder (the transport's PRP list
/// slice) is found by index from the CID.
#[derive(Default)]
#[repr(C, align(32))]
pub(crate) struct Tracker {
    /// User data, or the split index for a child of a split request.
    pub(crate) user_data: u64,
    /// The owned buffer of a single-command request (a split request
    /// keeps it in its `Split`, a waiting one in its `Pending`).
    pub(crate) buf: Option<IoBuf>,
    /// Timeout epoch at submission.
    pub(crate) epoch: u32,
    pub(crate) flags: u32,
}

/// A request split into several commands (larger than the max transfer).
pub(crate) struct Split {
    pub(crate) user_data: u64,
    /// The request's owned buffer, handed back when it completes.
    pub(crate) buf: Option<IoBuf>,
    /// Pieces not completed yet (issued or not).
    pub(crate) remaining: u32,
    pub(crate) error: Option<IoError>,
}

/// A read or write that waits in the backlog, perhaps partly issued.
pub(crate) struct PendingRw {
    opc: NvmOpcode,
    /// CDW12 flags of every piece (FUA).
    flags: RwFlags,
    ns: Namespace,
    lba: u64,
    nlb: u32,
    data: SliceRef,
    /// Blocks already issued.
    done: u32,
    /// Split slot once the first piece of a multi-command request is out.
    split: Option<u32>,
}

impl PendingRw {
    /// Its split slot, once a piece of it has been issued.
    pub(crate) fn split_slot(&self) -> Option<u32> {
        self.split
    }
}

/// What a request waiting in the software queue will do.
pub(crate) enum PendingOp {
    Rw(PendingRw),
    Raw {
        sqe: Sqe,
        data: Option<SliceRef>,
    },
    /// Deallocate one range (the transport places the descriptor).
    Dealloc {
        nsid: u32,
        lba: u64,
        nlb: u32,
    },
}

pub(crate) struct Pending {
    pub(crate) op: PendingOp,
    pub(crate) user_data: u64,
    /// The request's owned buffer, if it came with one.
    pub(crate) buf: Option<IoBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpState {
    Ready,
    /// The controller is being reset, or was reset and this queue pair has
    /// not re-created its queues yet: requests wait in the backlog.
    Resetting,
    /// The controller failed: requests are refused.
    Failed,
}

/// The transport-free state of a queue pair.
pub(crate) struct Core {
    // --- hot: touched per command ---
    pub(crate) epoch: u32,
    pub(crate) trackers: Box<[Tracker]>,
    pub(crate) free: Vec<u16>,
    /// A free CID kept out of `free` (`NO_CID`: none): the completion
    /// loop leaves the CID it just released here, and the handler's next
    /// submission takes it back, so the common complete-then-resubmit
    /// costs a store and a test instead of a push and a pop. Returned to
    /// `free` at the end of the reap; counted as free meanwhile.
    pub(crate) spare: u32,
    pub(crate) state: QpState,
    /// `state == Ready && queue.is_empty()`: the one test the fast submit
    /// path makes. Kept by `set_state` and the queue operations.
    pub(crate) fast: bool,
    /// The controller's ID: namespaces of other controllers are refused.
    pub(crate) ctrl: u64,
    pub(crate) stats: QpairStats,
    // --- colder ---
    pub(crate) splits: Vec<Split>,
    pub(crate) free_splits: Vec<u32>,
    pub(crate) queue: VecDeque<Pending>,
    pub(crate) max_queued: usize,
    /// Most data bytes one raw command may carry.
    pub(crate) max_raw: usize,
    /// The controller's active namespaces: their block sizes give the
    /// transfer length of a raw Read, Write or Compare.
    pub(crate) namespaces: Box<[Namespace]>,
    /// Results decided on the submit side after a request was accepted,
    /// delivered by the next poll.
    pub(crate) deferred: Vec<Completion>,
    /// Commands failed without a completion entry (controller reset), and
    /// the outstanding count when the stats were last reset: with
    /// `completed` and `outstanding()` they give `submitted` exactly.
    pub(crate) failed_outstanding: u64,
    pub(crate) outstanding_at_reset: u64,
}

impl Core {
    pub(crate) fn new(
        depth: u16,
        max_queued: usize,
        max_raw: usize,
        namespaces: Box<[Namespace]>,
        ctrl: u64,
    ) -> Core {
        Core {
            epoch: 0,
            trackers: (0..depth).map(|_| Tracker::default()).collect(),
            free: (0..depth).rev().collect(),
            spare: NO_CID,
            state: QpState::Ready,
            fast: true,
            ctrl,
            stats: QpairStats::default(),
            splits: Vec::new(),
            free_splits: Vec::new(),
            queue: VecDeque::new(),
            max_queued,
            max_raw,
            namespaces,
            deferred: Vec::new(),
            failed_outstanding: 0,
            outstanding_at_reset: 0,
        }
    }

    pub(crate) fn set_state(&mut self, s: QpState) {
        self.state = s;
        self.fast = s == QpState::Ready && self.queue.is_empty();
    }

    /// Claims a tracker for one command.
    #[inline(always)]
    pub(crate) fn claim(&mut self, cid: u16, user_data: u64, flags: u32) {
        let t = &mut self.trackers[cid as usize];
        debug_assert_eq!(t.flags & T_BUSY, 0);
        debug_assert!(t.buf.is_none());
        t.user_data = user_data;
        t.epoch = self.epoch;
        t.flags = T_BUSY | flags;
    }

    /// Claims a tracker for one command of a request with an owned buffer.
    /// The buffer goes in with a plain store: the slot is empty (completion
    /// and failure always take the buffer out), so there is nothing to drop.
    #[inline(always)]
    pub(crate) fn claim_with_buf(&mut self, cid: u16, user_data: u64, buf: IoBuf) {
        let epoch = self.epoch;
        let t = &mut self.trackers[cid as usize];
        debug_assert_eq!(t.flags & T_BUSY, 0);
        t.user_data = user_data;
        t.epoch = epoch;
        t.flags = T_BUSY;
        let old = t.buf.replace(buf);
        debug_assert!(old.is_none(), "tracker {cid} still held a buffer");
        // Never Some (see above); forgetting rather than dropping keeps the
        // drop test off the hot path, and a bug would leak, not free.
        std::mem::forget(old);
    }

    /// Commands outstanding at the controller.
    #[inline]
    pub(crate) fn outstanding(&self) -> u32 {
        (self.trackers.len() - self.free_count()) as u32
    }

    /// Free trackers.
    #[inline]
    pub(crate) fn free_count(&self) -> usize {
        self.free.len() + usize::from(self.spare != NO_CID)
    }

    /// A free CID: the spare one first.
    #[inline(always)]
    pub(crate) fn pop_free(&mut self) -> Option<u16> {
        if self.spare != NO_CID {
            let cid = self.spare as u16;
            self.spare = NO_CID;
            return Some(cid);
        }
        self.free.pop()
    }

    /// Releases `cid` as the spare (the one the next submission takes);
    /// a spare not taken since goes back to `free`.
    #[inline(always)]
    pub(crate) fn release_spare(&mut self, cid: u16) {
        let old = self.spare;
        self.spare = cid as u32;
        if old != NO_CID {
            self.free.push(old as u16);
        }
    }

    /// Puts the spare CID, if any, back into `free`.
    #[inline(always)]
    pub(crate) fn return_spare(&mut self) {
        if self.spare != NO_CID {
            self.free.push(self.spare as u16);
            self.spare = NO_CID;
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.outstanding() as usize + self.queue.len() + self.deferred.len()
    }

    fn enqueue(&mut self, p: Pending) -> Result<(), (SubmitError, Option<IoBuf>)> {
        if self.queue.len() >= self.max_queued {
            let e = SubmitError::QueueFull {
                limit: self.max_queued,
            };
            return Err((e, p.buf));
        }
        self.stats.queued += 1;
        self.queue.push_back(p);
        self.fast = false;
        Ok(())
    }

    fn check_open(&self) -> Result<(), SubmitError> {
        match self.state {
            QpState::Ready | QpState::Resetting => Ok(()),
            QpState::Failed => Err(SubmitError::ControllerFailed),
        }
    }

    /// A slot for a split request.
    fn new_split(&mut self, user_data: u64, pieces: u32, buf: Option<IoBuf>) -> u32 {
        let split = Split {
            user_data,
            buf,
            remaining: pieces,
            error: None,
        };
        match self.free_splits.pop() {
            Some(i) => {
                self.splits[i as usize] = split;
                i
            }
            None => {
                self.splits.push(split);
                (self.splits.len() - 1) as u32
            }
        }
    }
}

/// Receives completions from `QueuePair::poll`, with the submission half
/// of the queue pair to submit follow-up requests.
///
/// Closures `FnMut(&mut Submitter<T>, Completion)` implement it. A type
/// that implements it directly with an `#[inline(always)]` method gets
/// inlined into the completion loop even when its body is large (a
/// closure's call cannot be forced inline on stable Rust); `pollux perf`
/// does that.
pub trait Handler<T: Transport> {
    fn complete(&mut self, sub: &mut Submitter<'_, T>, c: Completion);
}

impl<T: Transport, F: FnMut(&mut Submitter<'_, T>, Completion)> Handler<T> for F {
    #[inline(always)]
    fn complete(&mut self, sub: &mut Submitter<'_, T>, c: Completion) {
        self(sub, c)
    }
}

/// The submission half of a queue pair, borrowed: `QueuePair::submitter`
/// and every completion handler get one. A view, not the queue pair's
/// state: exchanging two of them (`mem::swap`) exchanges two borrows, each
/// still valid, never the rings behind them.
///
/// Invariant in `'a`: a handler cannot put a longer-lived submitter (of
/// another, leaked queue pair) in place of the one it was handed, so the
/// completion loop keeps applying its CIDs to its own trackers:
///
/// ```compile_fail
/// use pollux_nvme::{Completion, QueuePair, Submitter, Transport};
///
/// fn hijack<T: Transport>(qp: &mut QueuePair<T>, other: Submitter<'static, T>) {
///     let mut other = Some(other);
///     qp.poll(16, |sub: &mut Submitter<'_, T>, _c: Completion| {
///         if let Some(mut o) = other.take() {
///             std::mem::swap(sub, &mut o); // error[E0521]: borrowed data escapes the closure
///         }
///     });
/// }
/// ```
///
/// Nor does the loop rely on it: each handler call gets a fresh view
/// (`reborrow`), so a handler that swaps in a submitter of exactly its
/// own lifetime (made from a queue pair leaked inside the call) only
/// changes that view.
pub struct Submitter<'a, T: Transport> {
    pub(crate) core: &'a mut Core,
    pub(crate) sq: &'a mut T::Sq,
    pub(crate) _invariant: PhantomData<fn(&'a ()) -> &'a ()>,
}

/// `[lba, lba + nlb)` lies inside the namespace.
#[inline(always)]
fn check_lbas(ns: &Namespace, lba: u64, nlb: u32) -> Result<(), SubmitError> {
    // Two compares without a sum that could overflow (`checked_add`
    // tested the carry and the end apart, and in `pollux bdevperf` merged
    // the two tests with set and or instructions).
    if lba <= ns.nsze && nlb as u64 <= ns.nsze - lba {
        return Ok(());
    }
    Err(out_of_range(ns, lba, nlb))
}

/// Out of line, as `foreign`: built where the test fails, the error's
/// variant was loaded ahead of the tests on the path that passes them.
#[cold]
fn out_of_range(ns: &Namespace, lba: u64, nlb: u32) -> SubmitError {
    SubmitError::LbaOutOfRange {
        lba,
        nlb,
        nsze: ns.nsze,
    }
}

/// `ns` is a namespace of this queue pair's controller (`ctrl`): its block
/// size is the one the controller transfers by.
#[inline(always)]
fn check_ns(ns: &Namespace, ctrl: u64) -> Result<(), SubmitError> {
    if ns.ctrl != ctrl {
        return Err(foreign(ns));
    }
    Ok(())
}

#[cold]
fn foreign(ns: &Namespace) -> SubmitError {
    SubmitError::ForeignNamespace { nsid: ns.nsid }
}

fn check_range(ns: &Namespace, ctrl: u64, lba: u64, nlb: u32) -> Result<(), SubmitError> {
    check_ns(ns, ctrl)?;
    if nlb == 0 {
        return Err(SubmitError::ZeroLength);
    }
    check_lbas(ns, lba, nlb)
}

#[inline(always)]
fn check_rw(
    ns: &Namespace,
    ctrl: u64,
    lba: u64,
    nlb: u32,
    len: usize,
    iova0: u64,
) -> Result<(), SubmitError> {
    check_ns(ns, ctrl)?;
    // nlb == 0 passes these checks (with an empty buffer) and is refused
    // on the slow path: the fast-path test `nlb - 1 < max_lbas` excludes
    // it at no extra cost.
    check_lbas(ns, lba, nlb)?;
    let expected = (nlb as usize) << ns.lba_shift;
    if len != expected {
        return Err(bad_length(expected, len));
    }
    if iova0 & 3 != 0 {
        return Err(unaligned(iova0));
    }
    Ok(())
}

/// Out of line, as `out_of_range`: built inline, each error's variant was
/// set ahead of its test on the path that passes it.
#[cold]
fn bad_length(expected: usize, got: usize) -> SubmitError {
    SubmitError::BufferLength { expected, got }
}

#[cold]
fn unaligned(iova: u64) -> SubmitError {
    SubmitError::Unaligned { iova }
}

/// A request refused at submission: nothing was queued or sent, and the
/// buffer it came with comes back (always, for `read` and `write`).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Refused {
    pub error: SubmitError,
    pub buf: Option<IoBuf>,
}

/// Where the fast path put a request.
enum Fast {
    /// Sent as one command.
    Issued,
    /// Split or waiting: the slow path takes it, with these bus addresses.
    Slow(SliceRef),
}

fn refused(r: Result<(), (SubmitError, Option<IoBuf>)>) -> Result<(), SubmitError> {
    r.map_err(|(e, _)| e)
}

fn refused_owned(r: Result<(), (SubmitError, Option<IoBuf>)>) -> Result<(), Refused> {
    r.map_err(|(error, buf)| Refused { error, buf })
}

impl<'a, T: Transport> Submitter<'a, T> {
    /// A shorter-lived view of the same queue pair, for handing on (a
    /// layer above wraps it in its own view).
    #[inline(always)]
    pub fn reborrow(&mut self) -> Submitter<'_, T> {
        Submitter {
            core: &mut *self.core,
            sq: &mut *self.sq,
            _invariant: PhantomData,
        }
    }

    /// Issues one command on tracker `cid`. On error the tracker is returned
    /// to the free list and nothing is sent.
    ///
    /// Every caller passes a `cid` just taken from the free list and the
    /// bus addresses of the request's own data (the rule this module keeps,
    /// see the module docs): an owned buffer that goes into the tracker,
    /// split slot or backlog entry of this request and comes back only
    /// with its completion, or a borrowed one whose submitter promised the
    /// same (`read_dma`, `write_dma`, `raw_dma`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn issue(
        &mut self,
        cid: u16,
        sqe: Sqe,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
        user_data: u64,
        flags: u32,
    ) -> Result<(), SubmitError> {
        // SAFETY: `cid` is free (below the depth, not outstanding) and the
        // addresses are the request's own data, held until its completion
        // (see above); the command moves that data and no other memory
        // (built by the core, or a passthrough command whose pointer fields
        // were cleared and whose length was checked or promised).
        match unsafe { self.sq.push(cid, sqe, len, addr0, addr_at) } {
            Ok(()) => {
                self.core.claim(cid, user_data, flags);
                Ok(())
            }
            Err(e) => Err(self.push_failed(cid, e)),
        }
    }

    #[cold]
    fn push_failed(&mut self, cid: u16, e: SubmitError) -> SubmitError {
        self.core.free.push(cid);
        e
    }

    /// Reads `nlb` blocks at `lba` into `buf` (exactly `nlb` blocks long).
    /// The buffer comes back in the completion.
    #[inline(always)]
    pub fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw_owned(NvmOpcode::Read, ns, lba, nlb, buf, RwFlags::NONE, user_data)
    }

    /// Writes `buf` (exactly `nlb` blocks long) to `nlb` blocks at `lba`.
    /// The buffer comes back in the completion.
    #[inline(always)]
    pub fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw_owned(
            NvmOpcode::Write,
            ns,
            lba,
            nlb,
            buf,
            RwFlags::NONE,
            user_data,
        )
    }

    /// `read` with command flags: [`RwFlags::FUA`] reads data committed to
    /// non-volatile media. A request split into several commands sets
    /// them on each.
    #[inline(always)]
    pub fn read_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw_owned(NvmOpcode::Read, ns, lba, nlb, buf, flags, user_data)
    }

    /// `write` with command flags: with [`RwFlags::FUA`] the controller
    /// completes it only once the data is on non-volatile media (each
    /// command of a split request: the request completes after all).
    #[inline(always)]
    pub fn write_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw_owned(NvmOpcode::Write, ns, lba, nlb, buf, flags, user_data)
    }

    /// `read` with a borrowed buffer.
    ///
    /// # Safety
    /// The memory `buf` describes must stay allocated (its `DmaBuffer`
    /// alive) and must be neither read nor written by the host until the
    /// completion for `user_data` has been delivered: the controller writes
    /// it meanwhile. If the queue pair is dropped before that, or the
    /// completion comes after the controller failed without stopping
    /// (`Controller::may_still_transfer`), the controller may still write
    /// it: it must not be read or written again (dropping its `DmaBuffer`
    /// is fine: the platform unmaps it from the device, or keeps it until
    /// the device can no longer reach it).
    #[inline(always)]
    pub unsafe fn read_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw_borrowed(NvmOpcode::Read, ns, lba, nlb, buf, RwFlags::NONE, user_data)
    }

    /// `write` with a borrowed buffer.
    ///
    /// # Safety
    /// The memory `buf` describes must stay allocated (its `DmaBuffer`
    /// alive) and must not be written by the host until the completion for
    /// `user_data` has been delivered: the controller reads it meanwhile.
    /// If the queue pair is dropped before that, or the completion comes
    /// after the controller failed without stopping
    /// (`Controller::may_still_transfer`), the controller may still read
    /// it: it must not be written again (dropping its `DmaBuffer` is fine,
    /// as for `read_dma`).
    #[inline(always)]
    pub unsafe fn write_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw_borrowed(
            NvmOpcode::Write,
            ns,
            lba,
            nlb,
            buf,
            RwFlags::NONE,
            user_data,
        )
    }

    /// `read_dma` with command flags (see `read_with`).
    ///
    /// # Safety
    /// As `read_dma`.
    #[inline(always)]
    pub unsafe fn read_dma_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw_borrowed(NvmOpcode::Read, ns, lba, nlb, buf, flags, user_data)
    }

    /// `write_dma` with command flags (see `write_with`).
    ///
    /// # Safety
    /// As `write_dma`.
    #[inline(always)]
    pub unsafe fn write_dma_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.rw_borrowed(NvmOpcode::Write, ns, lba, nlb, buf, flags, user_data)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn rw_owned(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        let (len, iova0) = (buf.len(), buf.iova0());
        if let Err(error) = check_rw(ns, self.core.ctrl, lba, nlb, len, iova0) {
            return Err(Refused {
                error,
                buf: Some(buf),
            });
        }
        // The fast path of `rw_fast`, with the buffer going into the
        // tracker in the same store sequence as its other fields.
        if nlb.wrapping_sub(1) < ns.max_lbas && self.core.fast {
            if let Some(cid) = self.core.pop_free() {
                // The buffer's page table is looked up only past the first
                // page (`iova`); `move`: the closure holds the reference,
                // so nothing need live in memory on the one-page path (a
                // slice by reference was spilled to the stack every I/O).
                let at = buf.iova();
                // SAFETY: `cid` was free; `at` describes `buf`, which goes
                // into the tracker and comes back only with the completion;
                // the Read or Write moves exactly `len` bytes (checked:
                // NLB blocks of this controller's namespace).
                let r = unsafe {
                    self.sq
                        .push_rw(cid, opc, ns.nsid, lba, nlb, flags, len, iova0, move |i| {
                            at.at(i)
                        })
                };
                return match r {
                    Ok(()) => {
                        self.core.claim_with_buf(cid, user_data, buf);
                        Ok(())
                    }
                    Err(error) => Err(Refused {
                        error: self.push_failed(cid, error),
                        buf: Some(buf),
                    }),
                };
            }
        }
        let data = buf.dma_slice().to_owned_ref();
        let r = self.rw_slow(opc, ns, lba, nlb, data, Some(buf), flags, user_data);
        refused_owned(r)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn rw_borrowed(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        match self.rw_fast(opc, ns, lba, nlb, buf, flags, user_data)? {
            Fast::Issued => Ok(()),
            Fast::Slow(data) => {
                refused(self.rw_slow(opc, ns, lba, nlb, data, None, flags, user_data))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn rw_fast(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<Fast, SubmitError> {
        check_rw(ns, self.core.ctrl, lba, nlb, buf.len(), buf.iova0())?;
        // `fast` implies the queue pair is ready and nothing waits ahead.
        if nlb.wrapping_sub(1) < ns.max_lbas && self.core.fast {
            if let Some(cid) = self.core.pop_free() {
                let sqe = Sqe::rw(opc, ns.nsid, lba, nlb).with_rw_flags(flags);
                self.issue(
                    cid,
                    sqe,
                    buf.len(),
                    buf.iova0(),
                    |i| buf.iova_at(i),
                    user_data,
                    0,
                )?;
                return Ok(Fast::Issued);
            }
        }
        Ok(Fast::Slow(buf.to_owned_ref()))
    }

    /// A request that is split, or has to wait for trackers. On refusal the
    /// buffer comes back with the error.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    fn rw_slow(
        &mut self,
        opc: NvmOpcode,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        data: SliceRef,
        mut buf: Option<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), (SubmitError, Option<IoBuf>)> {
        if let Err(e) = self.core.check_open() {
            return Err((e, buf));
        }
        if nlb == 0 {
            return Err((SubmitError::ZeroLength, buf));
        }
        let mut p = PendingRw {
            opc,
            flags,
            ns: *ns,
            lba,
            nlb,
            data,
            done: 0,
            split: None,
        };
        let pieces = nlb.div_ceil(ns.max_lbas);
        if self.core.queue.len() >= self.core.max_queued && self.core.free_count() < pieces as usize
        {
            // It could not wait for the rest: refuse before issuing any.
            let e = SubmitError::QueueFull {
                limit: self.core.max_queued,
            };
            return Err((e, buf));
        }
        if self.core.fast {
            match self.issue_rw(&mut p, &mut buf, user_data) {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err((e, buf)),
            }
        }
        self.core.enqueue(Pending {
            op: PendingOp::Rw(p),
            user_data,
            buf,
        })
    }

    /// Issues as many pieces of `p` (`max_lbas` blocks each) as there are
    /// free trackers; `buf` (the request's owned buffer) goes with the
    /// first: to the tracker for one command, to the split slot otherwise.
    /// `Ok(true)` when every piece is out (or the request has already been
    /// completed with an error), `Ok(false)` when it must wait for
    /// trackers, `Err` when nothing was issued and it never will be (`buf`
    /// is left in place). If a later piece cannot be built (a broken buffer
    /// page table), the pieces already sent finish and the request
    /// completes with the error: never silently lost.
    fn issue_rw(
        &mut self,
        p: &mut PendingRw,
        buf: &mut Option<IoBuf>,
        user_data: u64,
    ) -> Result<bool, SubmitError> {
        let max = p.ns.max_lbas;
        if p.done == 0 && p.nlb <= max {
            let Some(cid) = self.core.pop_free() else {
                return Ok(false);
            };
            let sqe = Sqe::rw(p.opc, p.ns.nsid, p.lba, p.nlb).with_rw_flags(p.flags);
            let d = &p.data;
            self.issue(
                cid,
                sqe,
                d.len,
                d.iova_at(0),
                |i| d.iova_at(i),
                user_data,
                0,
            )?;
            self.core.trackers[cid as usize].buf = buf.take();
            p.done = p.nlb;
            return Ok(true);
        }
        while p.done < p.nlb {
            let Some(cid) = self.core.pop_free() else {
                return Ok(false);
            };
            let idx = match p.split {
                Some(i) => i,
                None => {
                    let i = self.core.new_split(user_data, p.nlb.div_ceil(max), None);
                    p.split = Some(i);
                    i
                }
            };
            let n = (p.nlb - p.done).min(max);
            let off = (p.done as usize) << p.ns.lba_shift;
            let sqe = Sqe::rw(p.opc, p.ns.nsid, p.lba + p.done as u64, n).with_rw_flags(p.flags);
            let d = &p.data;
            if let Err(e) = self.issue(
                cid,
                sqe,
                (n as usize) << p.ns.lba_shift,
                d.iova_at(off),
                |i| d.iova_at(off + i),
                idx as u64,
                T_CHILD,
            ) {
                if p.done == 0 {
                    self.core.free_splits.push(idx);
                    p.split = None;
                    return Err(e);
                }
                self.fail_unissued(p, idx, e);
                return Ok(true);
            }
            if p.done == 0 {
                self.core.splits[idx as usize].buf = buf.take();
            }
            p.done += n;
        }
        Ok(true)
    }

    /// A piece of a split request could not be built: the pieces not
    /// issued will never complete, so the request finishes with an error
    /// once the issued ones have.
    #[cold]
    fn fail_unissued(&mut self, p: &mut PendingRw, idx: u32, e: SubmitError) {
        let unissued = (p.nlb - p.done).div_ceil(p.ns.max_lbas);
        tracing::error!("split request: a piece could not be built ({e}); failing the request");
        let s = &mut self.core.splits[idx as usize];
        let err = *s.error.get_or_insert(IoError::Nvme(Status::generic(
            pollux_spec::status::generic::DATA_TRANSFER_ERROR,
        )));
        s.remaining -= unissued;
        if s.remaining == 0 {
            let c = Completion {
                user_data: s.user_data,
                result: Err(err),
                buf: s.buf.take(),
            };
            self.core.free_splits.push(idx);
            self.core.deferred.push(c);
        }
        p.done = p.nlb;
    }

    /// An accepted request that could not be issued: it completes with an
    /// error on the next poll.
    #[cold]
    fn defer_error(&mut self, user_data: u64, e: SubmitError, buf: Option<IoBuf>) {
        tracing::error!("queued request could not be issued: {e}");
        let st = Status::generic(pollux_spec::status::generic::DATA_TRANSFER_ERROR);
        self.core.deferred.push(Completion {
            user_data,
            result: Err(IoError::Nvme(st)),
            buf,
        });
    }

    /// Flushes the namespace's volatile write cache.
    pub fn flush_cache(&mut self, ns: &Namespace, user_data: u64) -> Result<(), SubmitError> {
        check_ns(ns, self.core.ctrl)?;
        refused(self.raw_inner(Sqe::flush(ns.nsid), None, None, user_data))
    }

    /// Write Zeroes over `nlb` blocks at `lba` (at most 65536 per command);
    /// `deallocate` lets the controller deallocate them.
    pub fn write_zeroes(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        deallocate: bool,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        check_range(ns, self.core.ctrl, lba, nlb)?;
        if nlb > 65536 {
            return Err(SubmitError::TooLarge {
                needed: nlb.div_ceil(65536),
                depth: 1,
            });
        }
        let sqe = Sqe::write_zeroes(ns.nsid, lba, nlb, deallocate);
        refused(self.raw_inner(sqe, None, None, user_data))
    }

    /// Dataset Management, deallocate one range. The transport places the
    /// range descriptor, so no buffer is needed.
    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.core.check_open()?;
        check_range(ns, self.core.ctrl, lba, nlb)?;
        if self.core.fast {
            if let Some(cid) = self.core.pop_free() {
                // SAFETY: `cid` was free: below the depth, not outstanding.
                unsafe { self.sq.push_dealloc(cid, ns.nsid, lba, nlb) };
                self.core.claim(cid, user_data, 0);
                return Ok(());
            }
        }
        refused(self.core.enqueue(Pending {
            op: PendingOp::Dealloc {
                nsid: ns.nsid,
                lba,
                nlb,
            },
            user_data,
            buf: None,
        }))
    }

    /// Raw command passthrough, checked. The driver sets the CID and owns
    /// the data pointer fields: the caller's PRP1/PRP2 (or SGL), MPTR and
    /// PSDT are cleared and the transport describes `data` there (nothing
    /// without data). The command must be one whose transfer length the
    /// driver reads from the command (Read, Write and Compare from NLB and
    /// the namespace's block size, Dataset Management from NR, Flush,
    /// Write Zeroes, reservations, ...: see `passthru`), and `data` exactly
    /// that long (none for a command that moves no data); anything else is
    /// refused (`PassthroughLength`, `PassthroughUnchecked`) and needs
    /// [`raw_unchecked`](Self::raw_unchecked). The buffer comes back in
    /// the completion.
    pub fn raw(
        &mut self,
        mut sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        crate::passthru::clear_pointers(&mut sqe);
        let got = data.as_ref().map_or(0, |b| b.len());
        if let Err(error) = crate::passthru::check_io(&sqe, got, &self.core.namespaces) {
            return Err(Refused { error, buf: data });
        }
        self.raw_owned(sqe, data, user_data)
    }

    /// `raw` for any command: the transfer length is not checked. The
    /// data pointer fields are still the transport's (cleared, then filled
    /// from `data`).
    ///
    /// # Safety
    /// The command must make the controller transfer no more than
    /// `data.len()` bytes (nothing without data), and must not hand it any
    /// other host memory (addresses in command dwords) or change what the
    /// driver relies on: the namespaces' block size and size, the queues.
    pub unsafe fn raw_unchecked(
        &mut self,
        mut sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        crate::passthru::clear_pointers(&mut sqe);
        self.raw_owned(sqe, data, user_data)
    }

    fn raw_owned(&mut self, sqe: Sqe, data: Option<IoBuf>, user_data: u64) -> Result<(), Refused> {
        let Some(buf) = data else {
            return refused_owned(self.raw_inner(sqe, None, None, user_data));
        };
        let slice = buf.dma_slice();
        match self.raw_check(&slice) {
            Err(error) => Err(Refused {
                error,
                buf: Some(buf),
            }),
            Ok(()) => {
                let owned = slice.to_owned_ref();
                refused_owned(self.raw_inner(sqe, Some(owned), Some(buf), user_data))
            }
        }
    }

    /// `raw_unchecked` with a borrowed buffer (the data pointer fields
    /// are the transport's, the length is not checked).
    ///
    /// # Safety
    /// As for `read_dma`: the memory `data` describes must stay allocated
    /// and untouched by the host until the completion for `user_data` has
    /// been delivered, and for good if the queue pair is dropped first or
    /// the controller failed without stopping. And as for
    /// `raw_unchecked`: the command transfers at most `data.len()` bytes,
    /// reaches no other host memory, and leaves the namespaces and queues
    /// as they are.
    pub unsafe fn raw_dma(
        &mut self,
        mut sqe: Sqe,
        data: Option<DmaSlice<'_>>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        crate::passthru::clear_pointers(&mut sqe);
        if let Some(d) = &data {
            self.raw_check(d)?;
        }
        refused(self.raw_inner(sqe, data.map(|d| d.to_owned_ref()), None, user_data))
    }

    fn raw_check(&self, d: &DmaSlice<'_>) -> Result<(), SubmitError> {
        self.core.check_open()?;
        if d.is_empty() {
            return Err(SubmitError::ZeroLength);
        }
        let iova0 = d.iova_at(0);
        if iova0 & 3 != 0 {
            return Err(SubmitError::Unaligned { iova: iova0 });
        }
        let cap = self.core.max_raw;
        if d.len() > cap {
            return Err(SubmitError::BufferLength {
                expected: cap,
                got: d.len(),
            });
        }
        Ok(())
    }

    fn raw_inner(
        &mut self,
        sqe: Sqe,
        data: Option<SliceRef>,
        buf: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), (SubmitError, Option<IoBuf>)> {
        if let Err(e) = self.core.check_open() {
            return Err((e, buf));
        }
        if self.core.fast {
            if let Some(cid) = self.core.pop_free() {
                let r = match &data {
                    Some(d) => self.issue(
                        cid,
                        sqe,
                        d.len,
                        d.iova_at(0),
                        |i| d.iova_at(i),
                        user_data,
                        0,
                    ),
                    None => self.issue(cid, sqe, 0, 0, |_| 0, user_data, 0),
                };
                return match r {
                    Ok(()) => {
                        self.core.trackers[cid as usize].buf = buf;
                        Ok(())
                    }
                    Err(e) => Err((e, buf)),
                };
            }
        }
        self.core.enqueue(Pending {
            op: PendingOp::Raw { sqe, data },
            user_data,
            buf,
        })
    }

    /// Submits waiting requests while trackers are free (the front one
    /// first: a large split request is issued piece by piece as trackers
    /// free up, and nothing overtakes it).
    #[cold]
    pub(crate) fn drain_queue(&mut self) {
        while self.core.state == QpState::Ready && self.core.free_count() > 0 {
            let Some(mut p) = self.core.queue.pop_front() else {
                break;
            };
            let user_data = p.user_data;
            let finished = match &mut p.op {
                PendingOp::Rw(rw) => match self.issue_rw(rw, &mut p.buf, user_data) {
                    Ok(done) => done,
                    Err(e) => {
                        self.defer_error(user_data, e, p.buf.take());
                        true
                    }
                },
                PendingOp::Dealloc { nsid, lba, nlb } => {
                    let Some(cid) = self.core.pop_free() else {
                        self.core.queue.push_front(p);
                        break;
                    };
                    // SAFETY: `cid` was free: below the depth, not outstanding.
                    unsafe { self.sq.push_dealloc(cid, *nsid, *lba, *nlb) };
                    self.core.claim(cid, user_data, 0);
                    true
                }
                PendingOp::Raw { sqe, data } => {
                    let Some(cid) = self.core.pop_free() else {
                        self.core.queue.push_front(p);
                        break;
                    };
                    let r = match data {
                        Some(d) => self.issue(
                            cid,
                            *sqe,
                            d.len,
                            d.iova_at(0),
                            |i| d.iova_at(i),
                            user_data,
                            0,
                        ),
                        None => self.issue(cid, *sqe, 0, 0, |_| 0, user_data, 0),
                    };
                    match r {
                        Ok(()) => self.core.trackers[cid as usize].buf = p.buf.take(),
                        Err(e) => self.defer_error(user_data, e, p.buf.take()),
                    }
                    true
                }
            };
            if !finished {
                self.core.queue.push_front(p);
                break;
            }
        }
        self.core.fast = self.core.state == QpState::Ready && self.core.queue.is_empty();
    }

    /// Tells the controller about new commands now.
    pub fn flush(&mut self) {
        self.sq.flush();
    }

    /// Commands outstanding at the controller.
    pub fn outstanding(&self) -> u32 {
        self.core.outstanding()
    }

    /// Requests waiting in software for a free tracker.
    pub fn queued(&self) -> usize {
        self.core.queue.len()
    }

    /// Outstanding + queued + decided but not yet delivered.
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// Trackers (the most commands outstanding at once).
    pub fn depth(&self) -> u32 {
        self.core.trackers.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The range test at its edges: the last block, one past it, a sum
    /// that overflows, and a namespace smaller than the count.
    #[test]
    fn lba_range_edges() {
        let ns = Namespace {
            nsid: 1,
            lba_shift: 9,
            nsze: 1000,
            max_lbas: 256,
            ctrl: 7,
        };
        assert!(check_lbas(&ns, 999, 1).is_ok());
        assert!(check_lbas(&ns, 0, 1000).is_ok());
        assert!(check_lbas(&ns, 1000, 0).is_ok()); // nlb 0 is refused elsewhere
        for (lba, nlb) in [
            (999, 2),
            (1000, 1),
            (0, 1001),
            (u64::MAX, 1),
            (u64::MAX - 3, 8),
        ] {
            assert!(
                matches!(
                    check_lbas(&ns, lba, nlb),
                    Err(SubmitError::LbaOutOfRange { lba: l, nlb: n, nsze: 1000 }) if l == lba && n == nlb
                ),
                "{lba}+{nlb}"
            );
        }
    }

    /// The spare CID: taken first, counted as free, never lost when a
    /// second one is released or the reap ends, never handed out twice.
    #[test]
    fn spare_cid_is_free_and_not_lost() {
        let mut c = Core::new(4, 0, 0, Box::new([]), 0);
        let a = c.pop_free().unwrap();
        let b = c.pop_free().unwrap();
        assert_eq!((c.outstanding(), c.free_count()), (2, 2));
        c.release_spare(a);
        assert_eq!((c.outstanding(), c.free_count()), (1, 3));
        // Taken back by the next submission, before anything in `free`.
        assert_eq!(c.pop_free(), Some(a));
        assert_eq!(c.outstanding(), 2);
        // A spare not taken goes to `free` when the next one comes.
        c.release_spare(a);
        c.release_spare(b);
        assert_eq!((c.outstanding(), c.free_count()), (0, 4));
        c.return_spare();
        assert_eq!((c.spare, c.free.len()), (NO_CID, 4));
        let mut got: Vec<u16> = std::iter::from_fn(|| c.pop_free()).collect();
        got.sort_unstable();
        assert_eq!(got, [0, 1, 2, 3]);
    }

    #[test]
    fn tracker_is_half_a_cache_line() {
        assert_eq!(std::mem::size_of::<Tracker>(), 32);
        assert_eq!(std::mem::align_of::<Tracker>(), 32);
    }
}
