//! Submission and completion queue state, doorbell polling, SQE fetch and
//! CQE posting — the shared-memory heart of the device.
//!
//! Memory ordering contract with the host:
//! * SQ: the host writes the SQE, then stores the tail doorbell (Release);
//!   the device loads the doorbell (Acquire), then copies the whole 64-byte
//!   SQE with one `read_volatile` and decodes only the copy.
//! * CQ: the device writes CQE dwords 0-2, then stores dword 3 (CID, status,
//!   phase) as one `AtomicU32` Release store; the host polls the phase.
//! * Shadow doorbells: values loaded with Acquire; event indices stored
//!   (Release) once, at 0xFFFF, so a host using the standard `need_event`
//!   check writes the MMIO doorbell only when its index wraps the ring
//!   (see `Doorbell::set_event`).
//!
//! The CQ never overflows: a completion that finds no free slot (per the
//! head last published by the host) goes to a bounded backlog (see
//! [`BACKLOG_LIMIT`] for why the bound holds), and the owner stops fetching
//! for SQs bound to that CQ until it drains. Invalid
//! doorbell values are ignored, counted once per distinct value, and flagged
//! (`db_error`) for the controller to report as an asynchronous event.
use std::collections::VecDeque;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use pollux_spec::{Sqe, Status};

use crate::config::{DEFERRED_LIMIT, MAX_IO_QUEUES};

/// Most completions a CQ's backlog can hold; never reached.
///
/// Why: a completion enters a backlog only when its CQ is full, and SQs
/// bound to a CQ with a backlog fetch nothing until it has drained (also
/// the admin SQ). So while a backlog is non-empty it can only grow by
/// completions that already existed when it was empty: at most one just
/// fetched, plus ones held elsewhere that move into it — deferred commands
/// (at most [`DEFERRED_LIMIT`] per controller), completions held back for
/// reordering ([`HELD_LIMIT`] per CQ) and, for the admin CQ, outstanding
/// Asynchronous Event Requests (at most 16) and Delete I/O SQ commands
/// waiting for their SQ (at most [`MAX_IO_QUEUES`]). An SQ deletion never
/// puts the SQ's unfetched commands in a backlog: it completes them only
/// as the CQ has room (`Controller::run_deletions`). Reaching the limit is
/// therefore an emulator bug (logged as an error, asserted in debug
/// builds).
pub const BACKLOG_LIMIT: usize = DEFERRED_LIMIT + HELD_LIMIT + AER_MAX + MAX_IO_QUEUES as usize + 1;
/// Most outstanding Asynchronous Event Requests (AERL + 1, AERL <= 15).
const AER_MAX: usize = 16;
/// Event index this polling controller publishes (see `Doorbell::set_event`).
pub const EVENT_IDX_POLLED: u32 = 0xFFFF;
/// Most completions held back for out-of-order posting per CQ.
pub const HELD_LIMIT: usize = 64;

/// A completion before it is written to a CQ (the phase is added then).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Completion {
    pub dw0: u32,
    pub sqhd: u16,
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
}

/// Where a queue's doorbell value comes from.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Doorbell {
    /// BAR0 doorbell register or shadow doorbell slot.
    pub value: NonNull<AtomicU32>,
    /// Shadow event index slot, when shadow doorbells are enabled.
    pub event_idx: Option<NonNull<AtomicU32>>,
}

impl Doorbell {
    #[inline(always)]
    fn load(&self) -> u32 {
        // SAFETY: `value` points into BAR0 (alive as long as the device) or
        // into a shadow page inside an IOMMU mapping; unmapping that memory
        // makes the controller fatal, and a fatal controller polls no
        // doorbell until a reset drops this queue. Access is atomic.
        unsafe { self.value.as_ref() }.load(Ordering::Acquire)
    }

    /// Publishes the event index. This controller polls the shadow
    /// doorbells, so it never needs an MMIO write; but the index must be a
    /// ring position, so it says "ring me when you pass 0xFFFF". Under the
    /// host's `nvme_dbbuf_need_event` rule (u16 arithmetic) that asks for an
    /// MMIO write only when the host's index wraps around the ring: once per
    /// ring cycle. The value is constant, so the cache line holding it stays
    /// clean in both CPUs' caches: the host's load of it after every shadow
    /// update hits instead of missing across cores (writing `seen - 1` on
    /// every move cost the host one cross-core miss per doorbell).
    #[inline(always)]
    fn set_event(&self, _seen: u32) {
        if let Some(ei) = self.event_idx {
            // SAFETY: as for `value` (same shadow mapping rules).
            let ei = unsafe { ei.as_ref() };
            if ei.load(Ordering::Relaxed) != EVENT_IDX_POLLED {
                ei.store(EVENT_IDX_POLLED, Ordering::Release);
            }
        }
    }

    /// Zeroes the doorbell and (if any) publishes the event index;
    /// used when a queue is created, before its completion is posted.
    pub fn reset(&self) {
        // SAFETY: as for `load`.
        unsafe { self.value.as_ref() }.store(0, Ordering::Release);
        self.set_event(0);
    }
}

/// An invalid doorbell value: reported (`db_error`) once per distinct value,
/// so a host that keeps writing the same bad value is not reported forever.
#[cold]
fn reject(bad_db: &mut Option<u32>, db_error: &mut bool, v: u32) -> DbPoll {
    if *bad_db == Some(v) {
        return DbPoll::Same;
    }
    *bad_db = Some(v);
    *db_error = true;
    DbPoll::Invalid(v)
}

/// Outcome of polling a doorbell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DbPoll {
    Same,
    Moved,
    /// A new invalid value (ignored; report it).
    Invalid(u32),
}

pub(crate) struct Sq {
    pub cqid: u16,
    pub iova: u64,
    base: NonNull<Sqe>,
    pub size: u32,
    pub head: u32,
    pub tail: u32,
    pub db: Doorbell,
    bad_db: Option<u32>,
    /// Set by `poll_tail` on an invalid value; taken by the controller.
    pub db_error: bool,
}

impl Sq {
    /// # Safety
    /// `base` must point to `size` SQEs inside an IOMMU mapping, and `db` to
    /// a live doorbell (see [`Doorbell::load`]).
    pub unsafe fn new(cqid: u16, iova: u64, base: NonNull<Sqe>, size: u32, db: Doorbell) -> Sq {
        debug_assert!((2..=65536).contains(&size));
        Sq {
            cqid,
            iova,
            base,
            size,
            head: 0,
            tail: 0,
            db,
            bad_db: None,
            db_error: false,
        }
    }

    /// Reads the tail doorbell; a valid new value becomes the tail.
    #[inline]
    pub fn poll_tail(&mut self) -> DbPoll {
        let v = self.db.load();
        if v == self.tail {
            return DbPoll::Same;
        }
        if v >= self.size {
            return reject(&mut self.bad_db, &mut self.db_error, v);
        }
        self.bad_db = None;
        self.tail = v;
        self.db.set_event(v);
        DbPoll::Moved
    }

    /// Prefetches the SQE slot at the head: the next command the host will
    /// write. Issued in the same poll as the tail load, it lets the SQE's
    /// cache miss overlap the doorbell's instead of following it (QD 1
    /// latency). Only a hint: the SQE is read for real after the Acquire
    /// load of the tail, so a stale prefetch can only cost a second miss.
    #[inline(always)]
    pub fn prefetch_head(&self) {
        let p = self.base.as_ptr().wrapping_add(self.head as usize);
        #[cfg(target_arch = "x86_64")]
        // SAFETY: _mm_prefetch is a hint with no memory-safety requirement.
        unsafe {
            std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let _ = p;
    }

    /// Prefetches the SQEs between head and tail (at most `max`), so that a
    /// batch's cache misses overlap instead of following one another: each
    /// SQE is its own cache line, written by the host on another core.
    #[inline]
    pub fn prefetch_batch(&self, max: u32) {
        let mut i = self.head;
        let mut n = 0;
        while i != self.tail && n < max {
            // A prefetch never faults; `i < size` keeps the address inside
            // the ring anyway.
            let p = self.base.as_ptr().wrapping_add(i as usize);
            #[cfg(target_arch = "x86_64")]
            // SAFETY: _mm_prefetch is a hint with no memory-safety requirement.
            unsafe {
                std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let _ = p;
            i += 1;
            if i == self.size {
                i = 0;
            }
            n += 1;
        }
    }

    /// Copies the SQE at the head and advances the head.
    #[inline(always)]
    pub fn fetch(&mut self) -> Sqe {
        debug_assert!(self.head != self.tail && self.head < self.size);
        // One copy, as eight relaxed 64-bit loads: the host may scribble on
        // the slot, we decode only the copy (an atomic load is never
        // repeated by the compiler). Eight qword loads where a volatile
        // copy of the struct loaded field by field (sixteen loads).
        let p = self
            .base
            .as_ptr()
            .wrapping_add(self.head as usize)
            .cast::<u64>();
        let mut q = [0u64; 8];
        for (i, w) in q.iter_mut().enumerate() {
            // SAFETY: `head < size` and the queue memory (`size` entries
            // from a 64-byte aligned base) was translated at creation; it
            // stays mapped while the controller is not fatal (see
            // `Doorbell::load`), so each qword is in bounds and 8-byte
            // aligned. The host wrote the entry before the tail doorbell
            // store we loaded with Acquire; the device only reads it.
            *w = unsafe { AtomicU64::from_ptr(p.add(i)) }.load(Ordering::Relaxed);
        }
        let sqe: Sqe = zerocopy::transmute!(q);
        self.head += 1;
        if self.head == self.size {
            self.head = 0;
        }
        sqe
    }

    /// Memory range of the queue.
    pub fn range(&self) -> (u64, u64) {
        (self.iova, self.size as u64 * 64)
    }
}

pub(crate) struct Cq {
    pub qid: u16,
    pub iova: u64,
    base: NonNull<u8>,
    pub size: u32,
    /// Next slot the device writes.
    pub tail: u32,
    /// Last head the host published.
    pub head: u32,
    phase: bool,
    pub db: Doorbell,
    bad_db: Option<u32>,
    pub db_error: bool,
    /// SQs bound to this CQ.
    pub sq_count: u32,
    /// Interrupts enabled: count written entries in `irq_new`.
    pub ien: bool,
    pub iv: u16,
    /// Entries written since the controller last collected them for the
    /// interrupt vector (only counted with `ien`).
    pub irq_new: u32,
    /// Completions ready but not yet posted (CQ full), in order.
    pub backlog: VecDeque<Completion>,
    /// Completions held back by a Reorder fault; posted after the next one.
    pub held: Vec<Completion>,
}

impl Cq {
    /// # Safety
    /// `base` must point to `size` 16-byte CQEs inside an IOMMU mapping and
    /// `db` to a live doorbell.
    pub unsafe fn new(qid: u16, iova: u64, base: NonNull<u8>, size: u32, db: Doorbell) -> Cq {
        debug_assert!((2..=65536).contains(&size));
        Cq {
            qid,
            iova,
            base,
            size,
            tail: 0,
            head: 0,
            phase: true,
            db,
            bad_db: None,
            db_error: false,
            sq_count: 0,
            ien: false,
            iv: 0,
            irq_new: 0,
            backlog: VecDeque::new(),
            held: Vec::new(),
        }
    }

    /// Entries posted and not yet consumed by the host.
    #[inline(always)]
    fn used(&self) -> u32 {
        if self.tail >= self.head {
            self.tail - self.head
        } else {
            self.tail + self.size - self.head
        }
    }

    /// No free slot: the slot after the tail is the host's head.
    #[inline(always)]
    pub fn full(&self) -> bool {
        let next = self.tail + 1;
        (if next == self.size { 0 } else { next }) == self.head
    }

    /// Reads the head doorbell. A value is invalid if it is not a slot
    /// index or would consume entries that were never posted.
    #[inline]
    pub fn poll_head(&mut self) -> DbPoll {
        let v = self.db.load();
        if v == self.head {
            return DbPoll::Same;
        }
        let valid = v < self.size && {
            let adv = if v >= self.head {
                v - self.head
            } else {
                v + self.size - self.head
            };
            adv <= self.used()
        };
        if !valid {
            return reject(&mut self.bad_db, &mut self.db_error, v);
        }
        self.bad_db = None;
        self.head = v;
        self.db.set_event(v);
        DbPoll::Moved
    }

    /// True if a completion posted now would be written, not backlogged.
    #[inline]
    pub fn can_post(&mut self) -> bool {
        self.backlog.is_empty() && self.room()
    }

    /// True if a completion can be written now (refreshing the head once
    /// if the queue looks full).
    #[inline(always)]
    fn room(&mut self) -> bool {
        !self.full() || {
            self.poll_head();
            !self.full()
        }
    }

    /// Posts `c` now if the CQ has room and nothing is queued before it;
    /// otherwise appends it to the backlog. Returns whether it was written.
    /// The common case (no backlog, a free slot) is inlined; a queue that
    /// looks full (its head refreshed) or has a backlog goes out of line.
    #[inline(always)]
    pub fn post(&mut self, c: Completion) -> bool {
        if self.backlog.is_empty() && !self.full() {
            self.write(&c);
            true
        } else {
            self.post_slow(c)
        }
    }

    #[inline(never)]
    fn post_slow(&mut self, c: Completion) -> bool {
        if self.backlog.is_empty() && self.room() {
            self.write(&c);
            true
        } else {
            if self.backlog.len() >= BACKLOG_LIMIT {
                tracing::error!(
                    cq = self.qid,
                    cid = c.cid,
                    "CQ backlog limit reached; completion lost"
                );
                debug_assert!(false, "CQ backlog limit");
                return false;
            }
            self.backlog.push_back(c);
            false
        }
    }

    /// Writes as much of the backlog as fits. Returns the number written.
    pub fn drain(&mut self) -> usize {
        let mut n = 0;
        while !self.backlog.is_empty() && self.room() {
            if let Some(c) = self.backlog.pop_front() {
                self.write(&c);
                n += 1;
            }
        }
        n
    }

    /// Stalled: SQs bound here must not fetch.
    #[inline(always)]
    pub fn stalled(&self) -> bool {
        !self.backlog.is_empty()
    }

    #[inline(always)]
    fn write(&mut self, c: &Completion) {
        debug_assert!(!self.full() && self.tail < self.size);
        let dw3 = c.cid as u32 | (((c.status.0 << 1) | self.phase as u16) as u32) << 16;
        // SAFETY: `tail < size`; the CQ memory (`size` 16-byte entries from
        // a page-aligned base) was translated at creation and stays mapped
        // while the controller is not fatal. Dwords 0-2 are plain volatile
        // stores; the Release store of dword 3 publishes them together.
        unsafe {
            let p = self
                .base
                .as_ptr()
                .add(self.tail as usize * 16)
                .cast::<u32>();
            ptr::write_volatile(p, c.dw0);
            ptr::write_volatile(p.add(1), 0);
            ptr::write_volatile(p.add(2), c.sqhd as u32 | (c.sqid as u32) << 16);
            AtomicU32::from_ptr(p.add(3)).store(dw3, Ordering::Release);
        }
        self.tail += 1;
        if self.tail == self.size {
            self.tail = 0;
            self.phase = !self.phase;
        }
        // The only interrupt cost on the posting path: one predictable
        // branch for a CQ without interrupts.
        if self.ien {
            self.irq_new += 1;
        }
    }

    pub fn range(&self) -> (u64, u64) {
        (self.iova, self.size as u64 * 16)
    }
}
