//! The seam between the host core and a transport (PCIe, TCP).
//!
//! The core (`ctrl`, `qpair`, `submit`, `poll`) owns everything about
//! commands that does not depend on how they travel: trackers and CIDs,
//! splitting, the software backlog, timeouts, abort and reset recovery. A
//! transport owns how they travel: for PCIe the SQ/CQ rings, doorbells and
//! PRP lists; over fabrics a connection, capsules and SGLs.
//!
//! The I/O path is split in two halves so a completion handler can submit
//! while the completion queue is being reaped: `SubmissionQueue` and
//! `CompletionQueue`. Both are type parameters of the queue pair, so every
//! call is monomorphised and inlined: no `dyn` call per I/O. The control
//! path (`Transport`) is generic too, but nothing there is hot.
//!
//! # What only the core and the transports may do
//!
//! Everything here that can make the controller transfer data or run
//! commands is an `unsafe fn`, called by the core (and by a transport on
//! its own queues) and by nobody else: register writes (a doorbell makes
//! the controller fetch the commands in its ring up to the value written,
//! old ones too, into buffers long handed back; AQA/ASQ/ACQ and CC
//! reprogram or reset it), making, attaching, configuring, re-creating and
//! deleting queues, and pushing commands with bus addresses. Each says in
//! `# Safety` what the caller must own. Reading registers (CAP, VS, CSTS)
//! is safe. Each of these no longer compiles in safe code:
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
//! use pollux_nvme::{Registers, Transport};
//! // I/O queue 1's SQ tail doorbell: the controller would run the
//! // commands in its ring again, into buffers handed back to their owners.
//! ctrl.transport().regs().write32(0x1008, 5).unwrap(); // error[E0133]: call to unsafe function
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
//! use pollux_nvme::{Registers, Transport};
//! // The admin submission queue (ASQ) pointed elsewhere.
//! ctrl.transport().regs().write64(0x28, 0x1000).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
//! use pollux_nvme::Transport;
//! // A second admin queue pair on the live admin doorbells (PCIe) or the
//! // live admin connection (TCP).
//! let (sq, cq) = ctrl.transport().admin_queues(2).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(t: &T, sq: &T::Sq, cq: &T::Cq) {
//! use pollux_nvme::Transport;
//! // AQA/ASQ/ACQ rewritten under a running controller.
//! t.attach_admin(sq, cq).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
//! use pollux_nvme::Transport;
//! // Shadow doorbells cleared under running queues (PCIe).
//! let mut fake = |_: pollux_spec::Sqe, _: &'static str| Ok(pollux_spec::Cqe::default());
//! ctrl.transport().configure(&mut fake, ctrl.identify()).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>, spec: &pollux_nvme::QueueSpec) {
//! use pollux_nvme::Transport;
//! // Halves on the doorbells of a queue pair in use.
//! let mut fake = |_: pollux_spec::Sqe, _: &'static str| Ok(pollux_spec::Cqe::default());
//! let q = ctrl.transport().create_io_queues(&mut fake, spec); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(t: &T, sq: &mut T::Sq, cq: &mut T::Cq) {
//! use pollux_nvme::Transport;
//! let mut fake = |_: pollux_spec::Sqe, _: &'static str| Ok(pollux_spec::Cqe::default());
//! t.recreate_io_queues(&mut fake, 1, sq, cq).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<T: pollux_nvme::Transport>(t: &T) {
//! use pollux_nvme::Transport;
//! let mut fake = |_: pollux_spec::Sqe, _: &'static str| Ok(pollux_spec::Cqe::default());
//! t.delete_io_queues(&mut fake, 1).unwrap(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<S: pollux_nvme::SubmissionQueue>(sq: &mut S) {
//! use pollux_nvme::SubmissionQueue;
//! // A Read into bus address 0x1000, whatever is there.
//! let read = pollux_spec::Sqe::rw(pollux_spec::NvmOpcode::Read, 1, 0, 8);
//! sq.push(0, read, 4096, 0x1000, |i| 0x1000 + i as u64).unwrap(); // error[E0133]
//! sq.flush();
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<S: pollux_nvme::SubmissionQueue>(sq: &mut S) {
//! use pollux_nvme::SubmissionQueue;
//! // Over the PRP list of command 0, which may be outstanding.
//! sq.push_dealloc(0, 1, 0, 1); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<S: pollux_nvme::SubmissionQueue>(sq: &mut S) {
//! use pollux_nvme::SubmissionQueue;
//! // Tail 0 under a running queue: the next doorbell re-runs the ring.
//! sq.restart(); // error[E0133]
//! # }
//! ```
//!
//! ```compile_fail
//! # fn f<C: pollux_nvme::CompletionQueue>(cq: &mut C) {
//! use pollux_nvme::CompletionQueue;
//! // Old entries reaped as new completions: their buffers handed back
//! // while the commands they name still run.
//! cq.restart(); // error[E0133]
//! # }
//! ```
use pollux_spec::identify::IdentifyController;
use pollux_spec::{Cqe, NvmOpcode, RwFlags, Sqe};

use crate::dma::DmaBuffer;
use crate::error::{Result, SubmitError};

/// Controller registers: MMIO on PCIe, Property Get/Set over fabrics.
/// Offsets are the NVMe register map's (`pollux_spec::regs::off`).
/// Reads are safe; writes are `unsafe` (see the module docs).
pub trait Registers {
    fn read32(&self, off: usize) -> Result<u32>;
    /// Writes a 32-bit register.
    ///
    /// # Safety
    /// A register write can make the controller transfer data or run
    /// commands: a doorbell makes it fetch the commands in its ring up to
    /// the value written (again, if they ran before) and transfer into the
    /// buffers they name; AQA, ASQ and ACQ name host memory it then reads
    /// and writes; CC enables, disables or shuts it down (over fabrics,
    /// clearing CC.EN ends the association). The caller must own what the
    /// write changes, as the core does: it writes CC only in bring-up,
    /// reset and shutdown, with every command it sent tracked; and a
    /// transport writes only its own queues' doorbells and, in
    /// `attach_admin`, its own admin queue's registers.
    unsafe fn write32(&self, off: usize, v: u32) -> Result<()>;
    /// 64-bit registers (CAP, ASQ, ACQ).
    fn read64(&self, off: usize) -> Result<u64>;
    /// Writes a 64-bit register (ASQ, ACQ).
    ///
    /// # Safety
    /// As for [`write32`](Self::write32).
    unsafe fn write64(&self, off: usize, v: u64) -> Result<()>;
}

/// Runs one admin command on the controller and checks its status: what a
/// transport gets to create and delete its queues.
pub type AdminExec<'a> = dyn FnMut(Sqe, &'static str) -> Result<Cqe> + 'a;

/// Sizes and switches of one I/O queue pair, decided by the core.
#[derive(Clone, Debug)]
pub struct QueueSpec {
    pub qid: u16,
    /// Trackers (commands outstanding at once).
    pub depth: u16,
    /// SQ entries (> depth).
    pub sq_entries: u16,
    /// CQ entries (> depth).
    pub cq_entries: u16,
    /// Most data bytes one command carries (the controller's MDTS).
    pub max_transfer: u32,
    /// Transport switches (doorbells, prefetch, copies), as given.
    pub tuning: Tuning,
    /// Completions raise an interrupt the queue pair can block on.
    pub interrupts: bool,
}

/// The hot-path techniques a transport may offer, each with a switch so
/// its effect can be measured on and off. A transport ignores what does
/// not apply to it.
#[derive(Clone, Debug)]
pub struct Tuning {
    pub delayed_sq_doorbell: bool,
    pub sq_doorbell_batch: u16,
    pub lazy_cq_doorbell: bool,
    pub prefetch: bool,
    pub nt_sqe_copy: bool,
    pub cq_line_batch: bool,
}

/// Counters a transport keeps for its queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WireCounters {
    /// Doorbell (MMIO) writes, or sends over fabrics.
    pub doorbells: u64,
    /// Shadow doorbell updates (memory writes instead of MMIO).
    pub shadow_updates: u64,
}

/// The submission half of a queue pair.
pub trait SubmissionQueue: Send {
    /// Writes one command for tracker `cid` with `len` bytes of data whose
    /// byte `i` is at bus address `addr_at(i)` (`addr0 == addr_at(0)`,
    /// passed so the one-page case needs no lookup; `len == 0`: no data).
    /// The transport fills the CID and, with data, the data pointer from
    /// `addr_at` (PRP1, and PRP2 when the data crosses a page; the SGL over
    /// fabrics); fields it does not fill go as given: zero in every
    /// command the core builds, and in a passthrough command, whose
    /// pointer fields the core clears (`passthru`); the driver's own queue
    /// commands carry ring addresses there. On error nothing was written.
    ///
    /// # Safety
    /// The controller transfers to or from the bus addresses given: for
    /// every `i < len`, `addr_at(i)` (`addr0` for 0) must be the address of
    /// byte `i` of memory that stays allocated, and that the host neither
    /// reads nor writes (nor gives to another command), for as long as the
    /// controller may transfer: until the completion of `cid` has been
    /// reaped from the paired completion queue, or the controller has been
    /// disabled (or, over fabrics, the connection closed) and the queue
    /// restarted. `cid` must be below the queue pair's depth and not
    /// outstanding (pushed and not yet completed or forgotten by
    /// `restart`). The command itself must move no other memory than that
    /// (the core clears a passthrough command's pointer fields and checks
    /// its length, or has its caller promise it).
    unsafe fn push(
        &mut self,
        cid: u16,
        sqe: Sqe,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError>;
    /// A Read or Write (`opc`) for tracker `cid`: `push` of
    /// `Sqe::rw(opc, nsid, slba, nlb).with_rw_flags(flags)`, which a
    /// transport may store field by field (PCIe: a built `Sqe` went
    /// through vector registers).
    ///
    /// # Safety
    /// As for [`push`](Self::push).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn push_rw(
        &mut self,
        cid: u16,
        opc: NvmOpcode,
        nsid: u32,
        slba: u64,
        nlb: u32,
        flags: RwFlags,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError> {
        let sqe = Sqe::rw(opc, nsid, slba, nlb).with_rw_flags(flags);
        // SAFETY: the caller's contract is `push`'s.
        unsafe { self.push(cid, sqe, len, addr0, addr_at) }
    }
    /// Dataset Management, deallocate one range, for tracker `cid` (the
    /// transport places the range descriptor).
    ///
    /// # Safety
    /// `cid` must be below the queue pair's depth and not outstanding: the
    /// range goes into memory the transport keeps for `cid` (on PCIe, its
    /// PRP list), which an outstanding command's transfer may still read.
    unsafe fn push_dealloc(&mut self, cid: u16, nsid: u32, lba: u64, nlb: u32);
    /// End of a poll: tell the controller about new commands, by the
    /// transport's batching rule (`outstanding`: commands it holds, new
    /// ones included).
    fn publish(&mut self, outstanding: u32);
    /// Tell the controller about new commands now.
    fn flush(&mut self);
    /// The queue was re-created empty (after a controller reset): the
    /// transport forgets its commands and starts again at index 0.
    ///
    /// # Safety
    /// The controller must no longer run this queue's commands: it has
    /// been disabled since they were pushed (or, over fabrics, their
    /// connection closed), or has failed for good. Otherwise the next
    /// doorbell (tail from 0 again) makes it fetch old entries of the
    /// ring, and their memory may have been reused.
    unsafe fn restart(&mut self);
    /// Most data bytes one command can describe.
    fn max_data(&self) -> usize;
    fn counters(&self) -> WireCounters;
    fn reset_counters(&mut self);
}

/// Where a completion queue hands its entries. A trait with
/// `#[inline(always)]` methods rather than a closure, so the whole
/// completion path inlines into the transport's loop.
pub trait CqeSink {
    /// One completion: command `cid` ended with `status` (the status field
    /// without the phase bit) and dword 0.
    fn cqe(&mut self, cid: u16, status: u16, dw0: u32);
    /// One completion as its dword 3 says (CID in bits 15:0, phase bit
    /// 16, status field 31:17) and dword 0: `cqe`'s, for a transport that
    /// holds the entry's dword 3 (the success test then needs no shift).
    #[inline(always)]
    fn cqe_dw3(&mut self, dw3: u32, dw0: u32) {
        self.cqe(dw3 as u16, (dw3 >> 17) as u16, dw0)
    }
    /// The CID of the entry after the current one, for prefetching (it may
    /// be stale).
    fn peek(&mut self, _cid: u16) {}
}

/// The completion half of a queue pair.
pub trait CompletionQueue: Send {
    /// Hands up to `max` new completions to `sink` in order and returns
    /// how many.
    fn reap<S: CqeSink>(&mut self, max: u32, sink: &mut S) -> u32;
    /// `n` entries were consumed in this poll: release them to the
    /// controller (by the transport's doorbell rule).
    fn release(&mut self, n: u32);
    /// The queue was re-created empty (after a controller reset): the
    /// transport forgets what it held and starts again at index 0.
    ///
    /// # Safety
    /// As for [`SubmissionQueue::restart`]: the controller no longer runs
    /// this queue's commands. Otherwise old entries of the ring are reaped
    /// as new completions, and the core hands back the buffers of commands
    /// still running.
    unsafe fn restart(&mut self);
    fn entries(&self) -> u16;
    fn counters(&self) -> WireCounters;
    fn reset_counters(&mut self);
    /// True if a completion is posted and not yet reaped.
    fn ready(&self) -> bool;
    /// The descriptor that becomes readable when this queue's interrupt
    /// fires (None: the queue was created without interrupts).
    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Consumes the interrupt's pending signals (and re-arms it where the
    /// transport needs that).
    fn ack_interrupt(&mut self) -> Result<()> {
        Ok(())
    }
    /// True when the queue can never complete its outstanding commands by
    /// itself: over fabrics, its connection dropped or was terminated
    /// (PCIe queues never are). Asked only after a poll that found
    /// nothing; the core then resets the controller, which fails what was
    /// outstanding (`ControllerReset`) and re-creates the queues
    /// (`recreate_io_queues`: a reconnect), or fails the queue pair for
    /// good (`ControllerFailed`) if that is impossible.
    #[inline(always)]
    fn broken(&self) -> bool {
        false
    }
}

/// A way to reach one controller: the control path.
pub trait Transport: Send + Sync + Sized + 'static {
    type Sq: SubmissionQueue;
    type Cq: CompletionQueue;
    type Regs: Registers + ?Sized;

    /// Short human-readable description ("vfio 0000:00:01.0").
    fn describe(&self) -> String;
    /// The controller's registers.
    fn regs(&self) -> &Self::Regs;
    /// Memory the controller can transfer to and from.
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer>;
    /// Called in every busy-wait of the control path (a pause; or a step
    /// of an inline emulated controller).
    fn relax(&self) {
        std::hint::spin_loop();
    }
    /// Microseconds to wait after CC.EN=1 before polling CSTS.RDY.
    fn ready_delay_us(&self) -> u32 {
        0
    }
    /// Most entries an I/O queue may have (CAP.MQES + 1 on PCIe).
    fn max_queue_entries(&self) -> u32;
    /// Most data bytes per command the transport adds to the controller's
    /// own limit (MDTS); `u32::MAX` when it adds none.
    fn max_transfer(&self) -> u32 {
        u32::MAX
    }

    /// The admin queue pair, created once (rings allocated, not yet known
    /// to the controller).
    ///
    /// # Safety
    /// Once per controller, by the core that brings it up: the halves act
    /// on the controller's admin doorbells (PCIe) or admin connection
    /// (TCP), so a second pair would ring the live admin queue's doorbells
    /// or take its completions.
    unsafe fn admin_queues(&self, entries: u16) -> Result<(Self::Sq, Self::Cq)>;
    /// Makes the admin queue known to the controller: before CC.EN=1 on
    /// PCIe (AQA/ASQ/ACQ); after every reset too.
    ///
    /// # Safety
    /// `sq` and `cq` must be this transport's admin pair (`admin_queues`),
    /// empty (new or restarted), and the controller disabled (CSTS.RDY=0):
    /// once enabled, it reads commands from `sq`'s ring and writes
    /// completions into `cq`'s.
    unsafe fn attach_admin(&self, sq: &Self::Sq, cq: &Self::Cq) -> Result<()>;
    /// Transport setup once the controller is enabled and identified, and
    /// again after every reset (PCIe: shadow doorbells).
    ///
    /// # Safety
    /// `admin` must run admin commands on this controller (the core's
    /// admin queue), and no I/O queue may be running: on PCIe this hands
    /// the controller the shadow doorbell pages and zeroes them, which
    /// under running queues makes the controller read their tails as 0
    /// and fetch old commands again. The core calls it at bring-up and in
    /// a reset, before the I/O queues are re-created.
    unsafe fn configure(&self, admin: &mut AdminExec<'_>, ident: &IdentifyController)
        -> Result<()>;
    /// Creates I/O queue pair `spec.qid` and tells the controller.
    ///
    /// # Safety
    /// `admin` must run admin commands on this controller, and `spec.qid`
    /// must be an I/O queue ID not in use (the core claims it): the halves
    /// act on that queue's doorbells (or connection). They must then be
    /// driven as [`SubmissionQueue`] and [`CompletionQueue`] say.
    unsafe fn create_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        spec: &QueueSpec,
    ) -> Result<(Self::Sq, Self::Cq)>;
    /// Re-creates an existing queue pair after a controller reset (the
    /// queues were restarted empty; unless the transport `reconnects`: then
    /// the halves still hold the commands outstanding at the reset, and
    /// the transport sends them again on the new queues).
    ///
    /// # Safety
    /// After a controller reset (the controller was disabled, or the
    /// association ended, since the queues last ran), with `admin` running
    /// admin commands on this controller: `sq` and `cq` must be this
    /// transport's halves of queue `qid`, restarted empty, or (a transport
    /// that `reconnects`) holding the commands whose memory the core still
    /// keeps for them, which go out again.
    unsafe fn recreate_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        qid: u16,
        sq: &mut Self::Sq,
        cq: &mut Self::Cq,
    ) -> Result<()>;
    /// Deletes I/O queue pair `qid` at the controller.
    ///
    /// # Safety
    /// `qid` must be a queue pair of the caller's (`create_io_queues`)
    /// whose halves it drops after this without using them again, and
    /// `admin` must run admin commands on this controller. The memory of
    /// commands still outstanding on it must stay allocated: the
    /// controller may transfer until it has deleted the queue.
    unsafe fn delete_io_queues(&self, admin: &mut AdminExec<'_>, qid: u16) -> Result<()>;

    /// A reset is a reconnect (fabrics: a new association, retried for as
    /// long as the transport's policy says), which may take long. Queue
    /// pairs then start resets on a thread of their own instead of in
    /// their poll, so no I/O thread waits for one; and the commands
    /// outstanding at the reset are not failed with `ControllerReset` but
    /// kept (trackers and buffers) and sent again by `recreate_io_queues`,
    /// as Linux's and SPDK's fabrics hosts retry them.
    fn reconnects(&self) -> bool {
        false
    }

    /// Restarting a queue's halves (`SubmissionQueue::restart`,
    /// `CompletionQueue::restart`) by itself ends every transfer for the
    /// commands they held, whatever the controller does: over fabrics the
    /// connection closes, and the host copies nothing more into their
    /// buffers. False (the default, and PCIe): only a disable that
    /// completed (CSTS.RDY=0 after CC.EN=0) stops a controller's DMA, so
    /// when a reset fails before that, the core hands the buffers of the
    /// commands then outstanding back to nobody (see
    /// `Controller::may_still_transfer`).
    fn restart_stops_transfers(&self) -> bool {
        false
    }

    /// Asked by queue pairs while a reset is in progress: the I/O held
    /// meanwhile (outstanding at the reset, or submitted since) should fail
    /// now with `IoError::FastFail` instead of waiting for the reset to end
    /// (NVMe/TCP: `fast_io_fail_tmo` has passed).
    fn fail_held_io(&self) -> bool {
        false
    }
}
