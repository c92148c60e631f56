//! Queue pairs over any transport: [`QueuePair`] and its borrowed
//! submission half [`Submitter`], enums over the transports' own (each
//! monomorphised in `pollux-nvme`), and the [`Handler`] a poll hands
//! completions to.
//!
//! Dispatch is static: a request is one `match` on the transport (a poll
//! is one `match`, and inside it every completion's handler gets a
//! `Submitter` whose transport the compiler knows, so the follow-up
//! requests a handler makes cost no `match` at all once inlined). No
//! `dyn` call anywhere.
use std::os::fd::BorrowedFd;
use std::time::Duration;

use pollux_nvme::{
    Completion, DmaSlice, IoBuf, Namespace, QpairStats, Refused, RwFlags, SubmitError,
};
use pollux_pcie::Pcie;
use pollux_spec::Sqe;
use pollux_tcp::TcpTransport;

/// `$body` with `$x` bound to the transport's own value, whatever the
/// transport (`Self` is the enum).
macro_rules! each {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            Self::Pcie($x) => $body,
            Self::Tcp($x) => $body,
        }
    };
}

/// An I/O queue pair on any transport: from [`crate::Controller::alloc_qpair`].
/// `Send`, not `Sync`, as the transports' own.
// Not boxed: a box would add a pointer chase to every request.
#[allow(clippy::large_enum_variant)]
pub enum QueuePair {
    Pcie(pollux_pcie::QueuePair),
    Tcp(pollux_tcp::QueuePair),
}

/// The submission half of a queue pair, borrowed: from
/// [`QueuePair::submitter`] and in every completion handler. A view, as
/// `pollux_nvme::Submitter` (invariant in `'a`, so a handler cannot put
/// another queue pair's submitter in place of its own).
pub enum Submitter<'a> {
    Pcie(pollux_nvme::Submitter<'a, Pcie>),
    Tcp(pollux_nvme::Submitter<'a, TcpTransport>),
}

/// Receives completions from [`QueuePair::poll_with`], with the queue
/// pair's submission half to submit follow-up requests. Closures
/// `FnMut(&mut Submitter, Completion)` implement it; a type implementing it
/// with an `#[inline(always)]` method is inlined into the completion loop
/// of each transport (`pollux perf` does that).
pub trait Handler {
    fn complete(&mut self, sub: &mut Submitter<'_>, c: Completion);
}

impl<F: FnMut(&mut Submitter<'_>, Completion)> Handler for F {
    #[inline(always)]
    fn complete(&mut self, sub: &mut Submitter<'_>, c: Completion) {
        self(sub, c)
    }
}

/// A transport of this library: its submitter as the enum's variant.
trait Wrap: pollux_nvme::Transport {
    fn wrap(s: pollux_nvme::Submitter<'_, Self>) -> Submitter<'_>;
}

impl Wrap for Pcie {
    #[inline(always)]
    fn wrap(s: pollux_nvme::Submitter<'_, Pcie>) -> Submitter<'_> {
        Submitter::Pcie(s)
    }
}

impl Wrap for TcpTransport {
    #[inline(always)]
    fn wrap(s: pollux_nvme::Submitter<'_, TcpTransport>) -> Submitter<'_> {
        Submitter::Tcp(s)
    }
}

/// A [`Handler`] as the core's handler of one transport: each completion
/// gets a fresh view of the submitter it was handed (so whatever the
/// handler does to its view, the loop keeps its own).
struct Shim<'h, H>(&'h mut H);

impl<T: Wrap, H: Handler> pollux_nvme::Handler<T> for Shim<'_, H> {
    #[inline(always)]
    fn complete(&mut self, sub: &mut pollux_nvme::Submitter<'_, T>, c: Completion) {
        self.0.complete(&mut T::wrap(sub.reborrow()), c)
    }
}

/// A [`Handler`] moved into the poll (see [`QueuePair::poll_owned`]).
struct Owned<H>(H);

impl<T: Wrap, H: Handler> pollux_nvme::Handler<T> for Owned<H> {
    #[inline(always)]
    fn complete(&mut self, sub: &mut pollux_nvme::Submitter<'_, T>, c: Completion) {
        self.0.complete(&mut T::wrap(sub.reborrow()), c)
    }
}

impl From<pollux_pcie::QueuePair> for QueuePair {
    fn from(q: pollux_pcie::QueuePair) -> QueuePair {
        QueuePair::Pcie(q)
    }
}

impl From<pollux_tcp::QueuePair> for QueuePair {
    fn from(q: pollux_tcp::QueuePair) -> QueuePair {
        QueuePair::Tcp(q)
    }
}

impl QueuePair {
    /// Processes up to `max` completions, handing each finished request to
    /// `f` (which may submit more through the `Submitter` it gets); then
    /// issues waiting requests and rings the doorbells once. Returns the
    /// completions consumed. See `pollux_nvme::QueuePair::poll`.
    #[inline(always)]
    pub fn poll<F: FnMut(&mut Submitter<'_>, Completion)>(&mut self, max: u32, mut f: F) -> u32 {
        self.poll_with(max, &mut f)
    }

    /// `poll` with a borrowed handler (e.g. a struct that lives on across
    /// polls). One `match` per poll.
    #[inline(always)]
    pub fn poll_with<H: Handler>(&mut self, max: u32, h: &mut H) -> u32 {
        each!(self, q => q.poll_with(max, &mut Shim(h)))
    }

    /// `poll_with` with the handler moved in: for a handler made for one
    /// poll (a layer's view of its own state, as the bdev layer's NVMe
    /// sink). Each transport's loop gets a copy of its own, so the
    /// compiler sees where each of its fields points (a handler shared by
    /// the two loops through one `&mut` stays in memory, its fields loaded
    /// per completion: +3 instructions per I/O in `pollux bdevperf`).
    #[inline(always)]
    pub fn poll_owned<H: Handler>(&mut self, max: u32, h: H) -> u32 {
        each!(self, q => q.poll_with(max, &mut Owned(h)))
    }

    /// Polls until nothing is outstanding or queued, or `timeout` passes.
    /// Returns the completions seen.
    pub fn drain<F: FnMut(&mut Submitter<'_>, Completion)>(
        &mut self,
        timeout: Duration,
        mut f: F,
    ) -> pollux_nvme::error::Result<u64> {
        let mut s = Shim(&mut f);
        each!(self, q => q.drain(timeout, |sub: &mut pollux_nvme::Submitter<'_, _>, c| {
            pollux_nvme::Handler::complete(&mut s, sub, c)
        }))
    }

    /// The submission half, borrowed.
    #[inline(always)]
    pub fn submitter(&mut self) -> Submitter<'_> {
        match self {
            QueuePair::Pcie(q) => Submitter::Pcie(q.submitter()),
            QueuePair::Tcp(q) => Submitter::Tcp(q.submitter()),
        }
    }

    /// See [`Submitter::read`].
    #[inline]
    pub fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.submitter().read(ns, lba, nlb, buf, user_data)
    }

    /// See [`Submitter::write`].
    #[inline]
    pub fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.submitter().write(ns, lba, nlb, buf, user_data)
    }

    /// See [`Submitter::read_with`].
    #[inline]
    pub fn read_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.submitter()
            .read_with(ns, lba, nlb, buf, flags, user_data)
    }

    /// See [`Submitter::write_with`].
    #[inline]
    pub fn write_with(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.submitter()
            .write_with(ns, lba, nlb, buf, flags, user_data)
    }

    /// See [`Submitter::read_dma`].
    ///
    /// # Safety
    /// As for `Submitter::read_dma`.
    #[inline]
    pub unsafe fn read_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().read_dma(ns, lba, nlb, buf, user_data) }
    }

    /// See [`Submitter::write_dma`].
    ///
    /// # Safety
    /// As for `Submitter::write_dma`.
    #[inline]
    pub unsafe fn write_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().write_dma(ns, lba, nlb, buf, user_data) }
    }

    /// See [`Submitter::flush_cache`].
    pub fn flush_cache(&mut self, ns: &Namespace, user_data: u64) -> Result<(), SubmitError> {
        self.submitter().flush_cache(ns, user_data)
    }

    /// See [`Submitter::write_zeroes`].
    pub fn write_zeroes(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        deallocate: bool,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.submitter()
            .write_zeroes(ns, lba, nlb, deallocate, user_data)
    }

    /// See [`Submitter::deallocate`].
    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.submitter().deallocate(ns, lba, nlb, user_data)
    }

    /// See [`Submitter::raw`].
    pub fn raw(&mut self, sqe: Sqe, data: Option<IoBuf>, user_data: u64) -> Result<(), Refused> {
        self.submitter().raw(sqe, data, user_data)
    }

    /// See [`Submitter::raw_unchecked`].
    ///
    /// # Safety
    /// As for `Submitter::raw_unchecked`.
    pub unsafe fn raw_unchecked(
        &mut self,
        sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().raw_unchecked(sqe, data, user_data) }
    }

    /// See [`Submitter::raw_dma`].
    ///
    /// # Safety
    /// As for `Submitter::raw_dma`.
    pub unsafe fn raw_dma(
        &mut self,
        sqe: Sqe,
        data: Option<DmaSlice<'_>>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().raw_dma(sqe, data, user_data) }
    }

    /// Tells the controller about new commands now.
    pub fn flush(&mut self) {
        each!(self, q => q.flush())
    }

    pub fn qid(&self) -> u16 {
        each!(self, q => q.qid())
    }

    /// CQ entries.
    pub fn cq_entries(&self) -> u16 {
        each!(self, q => q.cq_entries())
    }

    /// Commands outstanding at the controller.
    pub fn outstanding(&self) -> u32 {
        each!(self, q => q.outstanding())
    }

    /// Requests waiting in software for a free tracker.
    pub fn queued(&self) -> usize {
        each!(self, q => q.queued())
    }

    /// Outstanding + queued + decided but not yet delivered.
    pub fn in_flight(&self) -> usize {
        each!(self, q => q.in_flight())
    }

    /// Trackers (the most commands outstanding at once).
    pub fn depth(&self) -> u32 {
        each!(self, q => q.depth())
    }

    pub fn stats(&self) -> QpairStats {
        each!(self, q => q.stats())
    }

    /// Restarts the counters.
    pub fn reset_stats(&mut self) {
        each!(self, q => q.reset_stats())
    }

    /// The descriptor that becomes readable when a completion arrives
    /// (None unless created with `interrupts`); `arm` before sleeping on it.
    pub fn interrupt_fd(&self) -> Option<BorrowedFd<'_>> {
        each!(self, q => q.interrupt_fd())
    }

    /// Prepares to sleep on the interrupt; false if a completion is
    /// already posted (poll instead of sleeping).
    pub fn arm(&mut self) -> pollux_nvme::error::Result<bool> {
        each!(self, q => q.arm())
    }

    /// Blocks until a completion is posted or `timeout` passes.
    pub fn wait(&mut self, timeout: Option<Duration>) -> pollux_nvme::error::Result<bool> {
        each!(self, q => q.wait(timeout))
    }
}

impl<'a> Submitter<'a> {
    /// A shorter-lived view of the same queue pair.
    #[inline(always)]
    pub fn reborrow(&mut self) -> Submitter<'_> {
        match self {
            Submitter::Pcie(s) => Submitter::Pcie(s.reborrow()),
            Submitter::Tcp(s) => Submitter::Tcp(s.reborrow()),
        }
    }

    /// Reads `nlb` blocks at `lba` into `buf` (exactly `nlb` blocks long),
    /// which comes back in the completion.
    #[inline(always)]
    pub fn read(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        each!(self, s => s.read(ns, lba, nlb, buf, user_data))
    }

    /// Writes `buf` (exactly `nlb` blocks long) to `nlb` blocks at `lba`.
    #[inline(always)]
    pub fn write(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: IoBuf,
        user_data: u64,
    ) -> Result<(), Refused> {
        each!(self, s => s.write(ns, lba, nlb, buf, user_data))
    }

    /// `read` with command flags ([`RwFlags::FUA`]).
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
        each!(self, s => s.read_with(ns, lba, nlb, buf, flags, user_data))
    }

    /// `write` with command flags ([`RwFlags::FUA`]).
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
        each!(self, s => s.write_with(ns, lba, nlb, buf, flags, user_data))
    }

    /// `read` with a borrowed buffer.
    ///
    /// # Safety
    /// As `pollux_nvme::Submitter::read_dma`: the memory stays allocated and
    /// untouched by the host until the completion for `user_data`.
    #[inline(always)]
    pub unsafe fn read_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.read_dma(ns, lba, nlb, buf, user_data) })
    }

    /// `write` with a borrowed buffer.
    ///
    /// # Safety
    /// As `pollux_nvme::Submitter::write_dma`: the memory stays allocated and
    /// unwritten by the host until the completion for `user_data`.
    #[inline(always)]
    pub unsafe fn write_dma(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        buf: DmaSlice<'_>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.write_dma(ns, lba, nlb, buf, user_data) })
    }

    /// `read_dma` with command flags.
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
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.read_dma_with(ns, lba, nlb, buf, flags, user_data) })
    }

    /// `write_dma` with command flags.
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
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.write_dma_with(ns, lba, nlb, buf, flags, user_data) })
    }

    pub fn flush_cache(&mut self, ns: &Namespace, user_data: u64) -> Result<(), SubmitError> {
        each!(self, s => s.flush_cache(ns, user_data))
    }

    pub fn write_zeroes(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        deallocate: bool,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        each!(self, s => s.write_zeroes(ns, lba, nlb, deallocate, user_data))
    }

    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        each!(self, s => s.deallocate(ns, lba, nlb, user_data))
    }

    /// An I/O command of the caller's, checked (see
    /// `pollux_nvme::Submitter::raw`).
    pub fn raw(&mut self, sqe: Sqe, data: Option<IoBuf>, user_data: u64) -> Result<(), Refused> {
        each!(self, s => s.raw(sqe, data, user_data))
    }

    /// `raw` without the transfer length check.
    ///
    /// # Safety
    /// As `pollux_nvme::Submitter::raw_unchecked`.
    pub unsafe fn raw_unchecked(
        &mut self,
        sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.raw_unchecked(sqe, data, user_data) })
    }

    /// `raw` with a borrowed buffer.
    ///
    /// # Safety
    /// As `pollux_nvme::Submitter::raw_dma`.
    pub unsafe fn raw_dma(
        &mut self,
        sqe: Sqe,
        data: Option<DmaSlice<'_>>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the core's.
        each!(self, s => unsafe { s.raw_dma(sqe, data, user_data) })
    }

    /// Tells the controller about new commands now.
    pub fn flush(&mut self) {
        each!(self, s => s.flush())
    }

    /// Commands outstanding at the controller.
    pub fn outstanding(&self) -> u32 {
        each!(self, s => s.outstanding())
    }

    /// Requests waiting in software for a free tracker.
    pub fn queued(&self) -> usize {
        each!(self, s => s.queued())
    }

    /// Outstanding + queued + decided but not yet delivered.
    pub fn in_flight(&self) -> usize {
        each!(self, s => s.in_flight())
    }

    /// Trackers (the most commands outstanding at once).
    pub fn depth(&self) -> u32 {
        each!(self, s => s.depth())
    }
}
