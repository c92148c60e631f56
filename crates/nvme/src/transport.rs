//! The seam between the host core and a transport (PCIe today, TCP next).
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
use pollux_spec::identify::IdentifyController;
use pollux_spec::{Cqe, Sqe};

use crate::dma::DmaBuffer;
use crate::error::{Result, SubmitError};

/// Controller registers: MMIO on PCIe, Property Get/Set over fabrics.
/// Offsets are the NVMe register map's (`pollux_spec::regs::off`).
pub trait Registers {
    fn read32(&self, off: usize) -> Result<u32>;
    fn write32(&self, off: usize, v: u32) -> Result<()>;
    /// 64-bit registers (CAP, ASQ, ACQ).
    fn read64(&self, off: usize) -> Result<u64>;
    fn write64(&self, off: usize, v: u64) -> Result<()>;
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
    fn push(
        &mut self,
        cid: u16,
        sqe: Sqe,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError>;
    /// Dataset Management, deallocate one range, for tracker `cid` (the
    /// transport places the range descriptor).
    fn push_dealloc(&mut self, cid: u16, nsid: u32, lba: u64, nlb: u32);
    /// End of a poll: tell the controller about new commands, by the
    /// transport's batching rule (`outstanding`: commands it holds, new
    /// ones included).
    fn publish(&mut self, outstanding: u32);
    /// Tell the controller about new commands now.
    fn flush(&mut self);
    /// The queue was re-created empty (after a controller reset).
    fn restart(&mut self);
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
    /// The queue was re-created empty (after a controller reset).
    fn restart(&mut self);
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
    fn admin_queues(&self, entries: u16) -> Result<(Self::Sq, Self::Cq)>;
    /// Makes the admin queue known to the controller: before CC.EN=1 on
    /// PCIe (AQA/ASQ/ACQ); after every reset too.
    fn attach_admin(&self, sq: &Self::Sq, cq: &Self::Cq) -> Result<()>;
    /// Transport setup once the controller is enabled and identified, and
    /// again after every reset (PCIe: shadow doorbells).
    fn configure(&self, admin: &mut AdminExec<'_>, ident: &IdentifyController) -> Result<()>;
    /// Creates I/O queue pair `spec.qid` and tells the controller.
    fn create_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        spec: &QueueSpec,
    ) -> Result<(Self::Sq, Self::Cq)>;
    /// Re-creates an existing queue pair after a controller reset (the
    /// queues were restarted empty; unless the transport `reconnects`: then
    /// the halves still hold the commands outstanding at the reset, and
    /// the transport sends them again on the new queues).
    fn recreate_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        qid: u16,
        sq: &mut Self::Sq,
        cq: &mut Self::Cq,
    ) -> Result<()>;
    /// Deletes I/O queue pair `qid` at the controller.
    fn delete_io_queues(&self, admin: &mut AdminExec<'_>, qid: u16) -> Result<()>;

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

    /// Asked by queue pairs while a reset is in progress: the I/O held
    /// meanwhile (outstanding at the reset, or submitted since) should fail
    /// now with `IoError::FastFail` instead of waiting for the reset to end
    /// (NVMe/TCP: `fast_io_fail_tmo` has passed).
    fn fail_held_io(&self) -> bool {
        false
    }
}
