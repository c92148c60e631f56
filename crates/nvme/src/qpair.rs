//! An I/O queue pair: its options, counters, creation, timeouts, recovery
//! after a controller reset, and deletion. The submit path is in
//! `submit.rs`, the poll path in `poll.rs`; the transport's halves
//! (`T::Sq`, `T::Cq`) write and read the wire.
//!
//! A `QueuePair` is owned by one thread: `Send`, not `Sync`, every operation
//! takes `&mut self`, and nothing on the I/O path locks or does an atomic
//! read-modify-write.
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_spec::cmd::RwFlags;

use crate::completion::Completion;
use crate::completion::QpairStats;
use crate::ctrl::{Controller, Shared};
use crate::dma::{DmaSlice, IoBuf};
use crate::error::{Error, Result, SubmitError};
use crate::namespace::Namespace;
use crate::submit::{Core, QpState, Refused, Submitter, T_BUSY, T_TIMED_OUT};
use crate::transport::{CompletionQueue, QueueSpec, SubmissionQueue, Transport, Tuning};

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
    /// by default: trackers are 32 bytes, so a queue pair's whole tracker
    /// array (4 KiB at depth 128) stays in L1 and the prefetch only costs
    /// instructions (measured with 16-byte trackers: 0.92x IOPS at QD 128).
    pub prefetch: bool,
    /// Copy SQEs into the ring with non-temporal stores. Off by default:
    /// with a consumer on another CPU (the emulated controller) it sends
    /// each SQE through memory instead of cache to cache (measured: no
    /// IOPS gain at QD 128, +16% QD 1 latency); for PCIe devices it saves
    /// the read-for-ownership of SQ lines, so try it there.
    pub nt_sqe_copy: bool,
    /// Read the CQ a cache line (four entries) at a time onto the stack
    /// and handle them before touching the line again.
    pub cq_line_batch: bool,
    /// Abort commands outstanding longer than this (None: never).
    pub timeout: Option<Duration>,
    /// Requests that may wait in software when all trackers are busy.
    pub max_queued: usize,
    /// Completions raise an interrupt (`QueuePair::wait` blocks on it;
    /// `interrupt_fd` hands it to an event loop). Off: polled only.
    pub interrupts: bool,
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
            cq_line_batch: false,
            timeout: Some(Duration::from_secs(30)),
            max_queued: 1 << 16,
            interrupts: false,
        }
    }
}

/// An I/O queue pair. See the module docs.
pub struct QueuePair<T: Transport> {
    pub(crate) core: Core,
    pub(crate) sq: T::Sq,
    pub(crate) cq: T::Cq,
    pub(crate) shared: Arc<Shared<T>>,
    pub(crate) qid: u16,
    /// Controller generation this queue pair's queues belong to.
    pub(crate) generation: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) next_tick: Instant,
}

// Queue pairs are made here rather than in `ctrl`, so the controller
// module does not depend on the queue pair's (no import cycle).
impl<T: Transport> Controller<T> {
    /// Allocates an I/O queue pair.
    pub fn alloc_qpair(&self, opts: QpairOptions) -> Result<QueuePair<T>> {
        let shared = &self.shared;
        if shared.failed.load(Ordering::Acquire) {
            return Err(Error::ControllerFatal);
        }
        let qid = shared.claim_qid()?;
        QueuePair::new(shared.clone(), qid, opts).inspect_err(|_| shared.release_qid(qid))
    }
}

impl<T: Transport> QueuePair<T> {
    pub(crate) fn new(shared: Arc<Shared<T>>, qid: u16, opts: QpairOptions) -> Result<Self> {
        let max_entries = shared.transport.max_queue_entries();
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
        let spec = QueueSpec {
            qid,
            depth: opts.depth,
            sq_entries: sq_entries as u16,
            cq_entries: cq_entries as u16,
            max_transfer: shared.max_transfer,
            tuning: Tuning {
                delayed_sq_doorbell: opts.delayed_sq_doorbell,
                sq_doorbell_batch: opts.sq_doorbell_batch,
                lazy_cq_doorbell: opts.lazy_cq_doorbell,
                prefetch: opts.prefetch,
                nt_sqe_copy: opts.nt_sqe_copy,
                cq_line_batch: opts.cq_line_batch,
            },
            interrupts: opts.interrupts,
        };
        // The generation is read under the admin lock that creates the
        // queues: a reset cannot slip in between.
        let (generation, sq, cq) = {
            let mut st = shared.lock_admin();
            let g = shared.generation.load(Ordering::Acquire);
            if g & 1 == 1 {
                return Err(Error::Resetting);
            }
            // SAFETY: `exec` runs admin commands on this controller; `qid`
            // was claimed just now (no other queue pair has it); the halves
            // go into this queue pair, whose core drives them.
            let (sq, cq) = shared.with_admin(&mut st, |exec| unsafe {
                shared.transport.create_io_queues(exec, &spec)
            })?;
            (g, sq, cq)
        };
        let max_raw = sq.max_data();
        Ok(QueuePair {
            core: Core::new(
                opts.depth,
                opts.max_queued,
                max_raw,
                shared.namespaces.as_slice().into(),
                shared.id,
            ),
            sq,
            cq,
            generation,
            qid,
            timeout: opts.timeout,
            next_tick: Instant::now() + opts.timeout.map_or(Duration::ZERO, |t| t / 2),
            shared,
        })
    }

    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// CQ entries.
    pub fn cq_entries(&self) -> u16 {
        self.cq.entries()
    }

    /// The submission half, borrowed.
    #[inline(always)]
    pub fn submitter(&mut self) -> Submitter<'_, T> {
        Submitter {
            core: &mut self.core,
            sq: &mut self.sq,
            _invariant: std::marker::PhantomData,
        }
    }

    /// See `Submitter::read`.
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

    /// See `Submitter::write`.
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

    /// See `Submitter::read_dma`.
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

    /// See `Submitter::write_dma`.
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

    /// See `Submitter::read_with` (command flags: Force Unit Access).
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

    /// See `Submitter::write_with` (command flags: Force Unit Access).
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

    /// See `Submitter::flush_cache`.
    pub fn flush_cache(&mut self, ns: &Namespace, user_data: u64) -> Result<(), SubmitError> {
        self.submitter().flush_cache(ns, user_data)
    }

    /// See `Submitter::write_zeroes`.
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

    /// See `Submitter::deallocate`.
    pub fn deallocate(
        &mut self,
        ns: &Namespace,
        lba: u64,
        nlb: u32,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        self.submitter().deallocate(ns, lba, nlb, user_data)
    }

    /// See `Submitter::raw`.
    pub fn raw(
        &mut self,
        sqe: pollux_spec::Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.submitter().raw(sqe, data, user_data)
    }

    /// See `Submitter::raw_unchecked`.
    ///
    /// # Safety
    /// As for `Submitter::raw_unchecked`.
    pub unsafe fn raw_unchecked(
        &mut self,
        sqe: pollux_spec::Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().raw_unchecked(sqe, data, user_data) }
    }

    /// See `Submitter::raw_dma`.
    ///
    /// # Safety
    /// As for `Submitter::raw_dma`.
    pub unsafe fn raw_dma(
        &mut self,
        sqe: pollux_spec::Sqe,
        data: Option<DmaSlice<'_>>,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: the caller's contract is the same.
        unsafe { self.submitter().raw_dma(sqe, data, user_data) }
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

    pub fn stats(&self) -> QpairStats {
        let c = &self.core;
        let mut s = c.stats;
        // Every command sent is either still outstanding, has completed, or
        // was failed by a reset: no per-I/O counter needed.
        s.submitted =
            (s.completed - s.bogus_completions + c.failed_outstanding + c.outstanding() as u64)
                .saturating_sub(c.outstanding_at_reset);
        let (sq, cq) = (self.sq.counters(), self.cq.counters());
        s.sq_doorbells = sq.doorbells;
        s.cq_doorbells = cq.doorbells;
        s.shadow_updates = sq.shadow_updates + cq.shadow_updates;
        s
    }

    /// Restarts the counters (the transport's doorbell counts too).
    pub fn reset_stats(&mut self) {
        self.core.stats = QpairStats::default();
        self.core.failed_outstanding = 0;
        self.core.outstanding_at_reset = self.core.outstanding() as u64;
        self.sq.reset_counters();
        self.cq.reset_counters();
    }

    /// Timeout bookkeeping, every 4096 polls: advance the epoch every
    /// timeout/2, abort commands at least two epochs old (so a command times
    /// out after between 1x and 1.5x the timeout), and notice a controller
    /// that reports fatal status.
    #[cold]
    pub(crate) fn tick(&mut self) {
        let Some(timeout) = self.timeout else { return };
        if self.shared.generation.load(Ordering::Acquire) != self.generation {
            // A reset is under way (or done, and `recover` not yet run):
            // the registers belong to it, and this queue's commands are
            // not at the controller meanwhile.
            return;
        }
        let now = Instant::now();
        if now < self.next_tick {
            return;
        }
        self.next_tick = now + timeout / 2;
        self.core.epoch = self.core.epoch.wrapping_add(1);
        match self.shared.csts() {
            Ok(csts) if !csts.cfs() && !csts.is_dead() => {}
            Ok(csts) => {
                tracing::error!(
                    qid = self.qid,
                    csts = csts.0,
                    "controller fatal status; resetting"
                );
                return self.reset_controller();
            }
            Err(e) => {
                tracing::error!(qid = self.qid, "reading CSTS: {e}; resetting");
                return self.reset_controller();
            }
        }
        let epoch = self.core.epoch;
        let mut need_reset = false;
        for cid in 0..self.core.trackers.len() {
            let t = &self.core.trackers[cid];
            if t.flags & T_BUSY == 0 || epoch.wrapping_sub(t.epoch) < 3 {
                continue;
            }
            if t.flags & T_TIMED_OUT != 0 {
                // Aborted earlier but its completion never came.
                need_reset = true;
                continue;
            }
            self.core.stats.timeouts += 1;
            self.core.trackers[cid].flags |= T_TIMED_OUT;
            self.core.trackers[cid].epoch = epoch;
            tracing::warn!(qid = self.qid, cid, "command timed out; aborting");
            self.core.stats.aborts_sent += 1;
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
        if self.shared.transport.reconnects() {
            self.shared.reset_in_background(self.generation);
            return;
        }
        if let Err(e) = self.shared.reset(self.generation) {
            tracing::error!(qid = self.qid, "controller reset failed: {e}");
        }
    }

    /// The descriptor that becomes readable when a completion arrives, for
    /// an event loop (epoll): None unless created with `interrupts`. Before
    /// sleeping on it, call `arm`; after waking, `poll`.
    pub fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.cq.interrupt_fd()
    }

    /// Prepares to sleep on the interrupt: tells the controller about new
    /// commands, consumes signals already pending, and returns false if a
    /// completion is already posted (then poll instead of sleeping).
    pub fn arm(&mut self) -> Result<bool> {
        self.sq.flush();
        self.cq.ack_interrupt()?;
        Ok(!self.cq.ready() && self.core.deferred.is_empty())
    }

    /// Blocks until a completion is posted or `timeout` passes (None:
    /// forever); true if one is. With `interrupts`, sleeps on the
    /// interrupt (no CPU used meanwhile); without, returns at once whether
    /// one is posted.
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<bool> {
        if !self.arm()? {
            return Ok(true);
        }
        let Some(fd) = self.cq.interrupt_fd() else {
            return Ok(false);
        };
        let woke = wait_readable(&[fd], timeout)?;
        Ok(woke || self.cq.ready())
    }

    /// Polls until nothing is outstanding or queued, or `timeout` passes
    /// (relaxing the transport in between). Returns completions seen.
    pub fn drain<F: FnMut(&mut Submitter<'_, T>, Completion)>(
        &mut self,
        timeout: Duration,
        mut f: F,
    ) -> Result<u64> {
        let start = Instant::now();
        let mut total = 0u64;
        while self.core.in_flight() > 0 {
            self.sq.flush();
            total += self.poll_with(u32::MAX, &mut f) as u64;
            if self.core.state == QpState::Failed && self.core.in_flight() == 0 {
                break;
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: "draining queue pair",
                    ms: timeout.as_millis() as u64,
                });
            }
            self.shared.transport.relax();
        }
        Ok(total)
    }
}

/// Blocks in poll(2) until one of `fds` is readable or `timeout` passes;
/// true if one is.
pub fn wait_readable(
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: Option<Duration>,
) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| {
        // Round up: a sub-millisecond wait must not become a busy loop.
        t.as_nanos()
            .div_ceil(1_000_000)
            .min(libc::c_int::MAX as u128) as libc::c_int
    });
    loop {
        // SAFETY: `p` holds `p.len()` initialised pollfds and lives across
        // the call.
        let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
        if n >= 0 {
            return Ok(n > 0);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(Error::Io(e));
        }
    }
}

impl<T: Transport> Drop for QueuePair<T> {
    fn drop(&mut self) {
        // Under the admin lock: a reset cannot start between the generation
        // check and the deletion. Not taken when a reset is under way (it
        // holds the lock for as long as it runs; the queues belong to the
        // association it ends).
        if self.shared.generation.load(Ordering::Acquire) == self.generation {
            let mut st = self.shared.lock_admin();
            let g = self.shared.generation.load(Ordering::Acquire);
            if g == self.generation && !self.shared.failed.load(Ordering::Acquire) {
                let qid = self.qid;
                let t = &self.shared.transport;
                let r = self.shared.with_admin(&mut st, |exec| {
                    // SAFETY: this queue pair's own queues, whose halves
                    // drop with it; `exec` runs on this controller. Buffers
                    // of commands still outstanding are dropped after the
                    // deletion, which aborts those commands first; if it
                    // fails, dropping them is still safe (`DmaRelease`).
                    unsafe { t.delete_io_queues(exec, qid) }
                });
                if let Err(e) = r {
                    tracing::warn!(
                        qid,
                        outstanding = self.core.outstanding(),
                        "deleting I/O queues: {e}; the controller may still use the queues' \
                         memory and that of their outstanding commands, which goes back to the \
                         platform (unmapped from the device's IOMMU, or kept until the device \
                         can no longer reach it)"
                    );
                }
            }
        }
        self.shared.release_qid(self.qid);
    }
}
