//! A queue pair as the transport-independent core sees it (SPDK's
//! `spdk_nvmf_qpair`): its command slots and their data buffers (from the
//! transport's pool, or waiting for it), the submission queue head, the
//! controller it is bound to by Connect, Keep Alive, completions, and
//! leaving the controller table.
//!
//! The core handles every command (`fabrics`, `admin`, `io`) against a
//! [`Qpair`] and asks its transport connection, through
//! [`QueueTransport`], for what only the transport can do: send a
//! response or data, get the data of a write from the host, close. Each
//! transport's connection owns one `Qpair` and implements the trait; the
//! core's functions are generic over it (monomorphised per transport, no
//! `dyn` call per I/O).
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{CONNECT_DATA_LEN, FABRICS_OPCODE};
use pollux_spec::status::generic;
use pollux_spec::{Cqe, Sqe, Status};

use crate::buf::{AlignedBuf, Lent};
use crate::model::{Ctrl, IoCmd, IoQ};
use crate::pool::{self, Cache};
use crate::shared::{Shared, SubsysId};

/// Keep Alive Timeout of a discovery controller whose host asked for none
/// (KATO 0), so an idle one does not stay forever: Linux's nvmet's
/// `NVMET_DISC_KATO_MS`.
pub(crate) const DISCOVERY_KATO_MS: u32 = 120_000;

#[inline(always)]
pub(crate) fn gen(sc: u8) -> Status {
    Status::generic(sc)
}

/// What the core asks of a transport's connection (one queue). The
/// transport's connection holds the [`Qpair`] beside what implements
/// this, and hands both to the core; the core hands the `Qpair` back in
/// each call.
pub(crate) trait QueueTransport {
    /// Queues `cqe`, the completion of the command in `slot` (`None`: a
    /// command answered without a slot, as Connect is); the slot is given
    /// back ([`Qpair::release`]) once it is sent.
    fn respond(&mut self, qp: &mut Qpair, slot: Option<u16>, cqe: &Cqe);

    /// Sends the first `len` bytes of `slot`'s buffer to the host, then
    /// the command's successful completion ([`Qpair::cqe`]); the slot is
    /// given back once they are sent.
    fn send_data(&mut self, qp: &mut Qpair, slot: u16, len: u32);

    /// Gets `slot`'s data (its `xfer` bytes, into its buffer) from the
    /// host; once all of it is in, the transport calls
    /// [`Qpair::data_in`].
    fn receive_data(&mut self, qp: &mut Qpair, slot: u16);

    /// Closes the connection once what is queued is sent (Disconnect).
    fn close(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, why: &str);

    /// The connection still takes responses and data (up, and no fatal
    /// error sent).
    fn can_send(&self) -> bool;

    /// Closes connection `conn` of this thread, a queue of a controller
    /// going away (the controller table keeps it in a [`ConnRef`]).
    ///
    /// [`ConnRef`]: crate::shared::ConnRef
    fn close_queue(ctx: &mut ThreadCtx, conn: u64);

    /// Completes the held Asynchronous Event Requests of connection
    /// `conn` of this thread, an admin queue, with the events its
    /// controller has (a namespace changed: `Qpair::deliver_events`).
    fn queue_events(ctx: &mut ThreadCtx, conn: u64);

    /// Hands the DH pool's result `done` to connection `conn` of this
    /// thread (`Qpair::auth_done`); dropped if it is gone.
    fn auth_done(ctx: &mut ThreadCtx, conn: u64, done: crate::auth::state::DhDone);
}

/// A command slot's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum St {
    Free,
    /// Capsule data arriving.
    Recv,
    /// Waiting for a data buffer from the pool (in `Qpair::waiting`).
    WaitBuf,
    /// The transport is getting the data from the host (R2T sent, for
    /// TCP).
    AwaitData,
    /// Lent to the I/O queue.
    Bdev,
    /// Data (and response) queued for the host.
    Tx,
    /// An Asynchronous Event Request held by the controller.
    Held,
    /// An Authentication Send whose step is at the DH pool.
    Auth,
}

/// One command slot; a queue has SQSIZE + 1 of them.
pub(crate) struct Slot {
    pub st: St,
    pub cid: u16,
    pub sqe: Sqe,
    pub buf: Option<AlignedBuf>,
    pub lent: Option<Lent>,
    /// Bytes of data the command moves.
    pub xfer: u32,
    pub io: Option<IoCmd>,
    /// A transport error seen while receiving the data.
    pub err: Option<Status>,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            st: St::Free,
            cid: 0,
            sqe: Sqe::default(),
            buf: None,
            lent: None,
            xfer: 0,
            io: None,
            err: None,
        }
    }
}

/// What Connect bound the queue to.
pub(crate) enum Bound {
    None,
    Admin {
        cntlid: u16,
        ctrl: Arc<Mutex<Ctrl>>,
        subsys: SubsysId,
    },
    Io {
        cntlid: u16,
        qid: u16,
    },
}

/// One queue pair.
///
/// Owned by its transport's connection, which drops it together with
/// whatever points into its lent buffers (the send queue) and sends
/// nothing after: dropping it takes back every buffer.
pub(crate) struct Qpair {
    pub id: u64,
    /// Dropped first (a bdev may still hold slot buffers).
    pub io: Option<IoQ>,
    /// The listener's address the host connected to, and the host's.
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub shared: Arc<Shared>,
    pub thread: usize,
    /// The time of this poll (no clock read on the I/O path).
    pub now: Instant,
    /// The queue holds a place among those bound to an NVM subsystem
    /// (`Shared::data_conns`).
    pub data_slot: bool,
    /// This thread's free data buffers (and through it, the pool).
    pub cache: Rc<Cache>,
    /// Bytes of data buffers the queue holds.
    pub held: usize,
    /// Counted among the pool's active connections (fair share).
    pub pool_active: bool,
    /// Slots waiting for a data buffer, in arrival order.
    pub waiting: VecDeque<u16>,
    /// Counted among the pool's waiting connections.
    pub wait_counted: bool,
    pub bound: Bound,
    pub slots: Vec<Slot>,
    pub free: Vec<u16>,
    pub done: Vec<(u32, Status)>,
    pub sqhd: u16,
    pub entries: u16,
    pub qid: u16,
    /// The host disabled SQ flow control (Connect's CATTR).
    pub flow_off: bool,
    /// In-capsule data the queue takes at most.
    pub icd_max: u32,
    /// The Connect data.
    pub scratch: Vec<u8>,
    pub kato: Duration,
    pub last_admin: Instant,
    /// DH-HMAC-CHAP (the host has a key): the exchange's state, and
    /// until it succeeds the queue takes only Authentication Send and
    /// Receive (an I/O queue's `io` waits in it meanwhile).
    pub auth: Option<Box<crate::auth::state::QueueAuth>>,
}

impl Drop for Qpair {
    fn drop(&mut self) {
        // The I/O queue waits for (or completes) its requests before the
        // slot buffers they use are freed.
        self.io.take();
        self.give_back_data_slot();
        self.abandon_waiting();
        for i in 0..self.slots.len() {
            let s = &mut self.slots[i];
            let lent = s.lent.take();
            let mut buf = s.buf.take();
            if let Some(l) = lent {
                // SAFETY: the I/O queue is gone (it waited for its
                // requests), and the transport's connection, which drops
                // this queue pair, copied what it sent (the rest is never
                // sent).
                buf = Some(unsafe { l.reclaim() });
            }
            if let Some(b) = buf {
                self.give_buf(b);
            }
        }
        if std::mem::take(&mut self.pool_active) {
            self.cache.pool().set_active(false);
        }
    }
}

impl Qpair {
    /// A queue not connected yet, of connection `id` on runtime thread
    /// `thread`, between the addresses `(local, peer)`, its data buffers
    /// from `cache`.
    pub fn new(
        id: u64,
        (local, peer): (SocketAddr, SocketAddr),
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> Qpair {
        let icd_max = shared.opts.admin_in_capsule_data_size;
        Qpair {
            id,
            io: None,
            local,
            peer,
            shared,
            thread,
            now,
            data_slot: false,
            cache,
            held: 0,
            pool_active: false,
            waiting: VecDeque::new(),
            wait_counted: false,
            bound: Bound::None,
            slots: Vec::new(),
            free: Vec::new(),
            done: Vec::new(),
            sqhd: 0,
            entries: 1,
            qid: 0,
            flow_off: false,
            icd_max,
            scratch: Vec::with_capacity(CONNECT_DATA_LEN as usize),
            kato: Duration::ZERO,
            last_admin: now,
            auth: None,
        }
    }

    /// Nothing of this queue is at a bdev any more: dropping it does not
    /// wait.
    pub fn is_settled(&self) -> bool {
        self.io.as_ref().is_none_or(|q| q.outstanding() == 0)
    }

    /// Work is pending that the host will not announce: completions to
    /// reap, commands waiting for a buffer.
    #[inline]
    pub fn has_work(&self) -> bool {
        self.io.as_ref().is_some_and(|q| q.outstanding() > 0) || !self.waiting.is_empty()
    }

    /// Keep Alive Timeout expired (an admin queue).
    pub fn kato_expired(&self, now: Instant) -> bool {
        matches!(self.bound, Bound::Admin { .. })
            && !self.kato.is_zero()
            && now.saturating_duration_since(self.last_admin) > self.kato
            // (A step of the exchange at the DH pool is the host's
            // traffic too; `auth_timeout` bounds the exchange.)
            && self.auth.as_ref().is_none_or(|a| a.job.is_none())
    }

    /// Slots for the `entries` commands of a queue just connected.
    pub(crate) fn make_slots(&mut self, entries: u32) {
        self.slots = (0..entries).map(|_| Slot::new()).collect();
        self.free = (0..entries as u16).rev().collect();
        self.done = Vec::with_capacity(entries as usize);
    }

    /// A free slot for a command capsule arriving (`None`: more commands
    /// than the queue has entries).
    #[inline]
    pub fn take_slot(&mut self, sqe: &Sqe) -> Option<u16> {
        let i = self.free.pop()?;
        let s = &mut self.slots[i as usize];
        s.st = St::Recv;
        s.cid = sqe.cid;
        s.sqe = *sqe;
        s.err = None;
        s.xfer = 0;
        s.io = None;
        Some(i)
    }

    pub(crate) fn give_back_data_slot(&mut self) {
        if std::mem::take(&mut self.data_slot) {
            crate::shared::DataSlot::give_back(&self.shared.data_conns);
        }
    }

    /// A data buffer of `len` bytes from the pool: `strict`, within the
    /// budget (and, while others wait, this connection's fair share);
    /// else charged in any case (in-capsule and admin data).
    #[inline]
    pub(crate) fn take_buf(&mut self, len: usize, strict: bool) -> Option<AlignedBuf> {
        let (k, cap) = pool::class(len);
        let pool = self.cache.pool();
        if strict && self.held > 0 && pool.pressed() && self.held + cap > pool.fair_share() {
            return None;
        }
        let mut b = self.cache.take(k, cap, strict)?;
        b.set_len(len);
        self.held += cap;
        if !self.pool_active {
            self.pool_active = true;
            pool.set_active(true);
        }
        Some(b)
    }

    /// Gives slot `i` a data buffer of `len` bytes: the page it kept (see
    /// `release`), or one from the pool (`take_buf`). False if none.
    /// (The kept page, the common case, inlined into the I/O path; the
    /// pool out of line.)
    #[inline(always)]
    pub(crate) fn slot_buf(&mut self, i: u16, len: usize, strict: bool) -> bool {
        if let Some(b) = self.slots[i as usize].buf.as_mut() {
            if b.set_len(len) {
                return true;
            }
        }
        self.slot_buf_from_pool(i, len, strict)
    }

    /// [`slot_buf`](Self::slot_buf) when the slot keeps no page large
    /// enough.
    #[inline(never)]
    fn slot_buf_from_pool(&mut self, i: u16, len: usize, strict: bool) -> bool {
        if let Some(b) = self.slots[i as usize].buf.take() {
            self.give_buf(b);
        }
        let mut b = self.take_buf(len, strict);
        if b.is_none() && strict && self.give_back_kept() {
            b = self.take_buf(len, strict);
        }
        match b {
            Some(b) => {
                self.slots[i as usize].buf = Some(b);
                true
            }
            None => false,
        }
    }

    /// Gives back the pages free slots keep; true if there were any.
    #[cold]
    pub(crate) fn give_back_kept(&mut self) -> bool {
        let mut any = false;
        for k in 0..self.slots.len() {
            if self.slots[k].st == St::Free {
                if let Some(b) = self.slots[k].buf.take() {
                    self.give_buf(b);
                    any = true;
                }
            }
        }
        any
    }

    /// Gives a data buffer back to the pool.
    #[inline]
    pub(crate) fn give_buf(&mut self, b: AlignedBuf) {
        self.held = self.held.saturating_sub(b.capacity());
        self.cache.give(b);
    }

    /// Slot `i` waits for a data buffer.
    #[cold]
    pub(crate) fn wait_buf(&mut self, i: u16) {
        self.slots[i as usize].st = St::WaitBuf;
        self.waiting.push_back(i);
        if !self.wait_counted {
            self.wait_counted = true;
            self.cache.pool().set_waiting(true);
        }
    }

    /// Gives the waiting slots their buffers, in order, while the pool
    /// has them (and the connection can send); true if any got one.
    pub(crate) fn serve_waiting<X: QueueTransport>(&mut self, x: &mut X) -> bool {
        let mut any = false;
        if x.can_send() {
            while let Some(&i) = self.waiting.front() {
                let len = self.slots[i as usize].xfer as usize;
                if !self.slot_buf(i, len, true) {
                    break;
                }
                self.waiting.pop_front();
                self.transfer(x, i);
                any = true;
            }
        }
        if self.waiting.is_empty() && std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
        any
    }

    /// Closing: the waiting slots will not be served.
    pub(crate) fn abandon_waiting(&mut self) {
        self.waiting.clear();
        if std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
    }

    /// The thread's timer: while others wait for buffers, the pages idle
    /// slots keep go back; the queue leaves the pool's active connections
    /// when it holds no buffer.
    pub(crate) fn tick_buffers(&mut self) {
        if self.cache.pool().pressed() {
            self.give_back_kept();
        }
        if self.pool_active && self.held == 0 && self.waiting.is_empty() {
            self.pool_active = false;
            self.cache.pool().set_active(false);
        }
    }

    /// The Keep Alive Timeout of `kato_ms` on this queue's controller: a
    /// discovery controller has one even when the host asks for none.
    pub(crate) fn kato_for(&self, kato_ms: u32) -> Duration {
        let discovery = matches!(
            self.bound,
            Bound::Admin {
                subsys: SubsysId::Discovery,
                ..
            }
        );
        let ms = if discovery && kato_ms == 0 {
            DISCOVERY_KATO_MS
        } else {
            kato_ms
        };
        Duration::from_millis(ms as u64)
    }

    /// Leaves the controller table: an admin queue takes its controller
    /// (and that controller's I/O queues) down, an I/O queue leaves it.
    pub(crate) fn detach(&mut self, ctx: &mut ThreadCtx) {
        self.give_back_data_slot();
        self.abandon_waiting();
        match std::mem::replace(&mut self.bound, Bound::None) {
            Bound::None => {}
            Bound::Admin { cntlid, .. } => self.shared.teardown(ctx, cntlid),
            Bound::Io { cntlid, qid } => {
                let mut t = self.shared.table();
                if let Some(e) = t.map.get_mut(&cntlid) {
                    e.io.retain(|(q, _)| *q != qid);
                }
            }
        }
    }

    /// Closed: reaps what the bdevs give back (nothing is sent; the slots'
    /// buffers go back when the queue pair is dropped).
    #[cold]
    pub(crate) fn settle(&mut self) -> bool {
        self.io
            .as_mut()
            .is_some_and(|q| q.outstanding() > 0 && q.poll(&mut |_, _| {}) > 0)
    }

    pub(crate) fn advance_sqhd(&mut self) {
        // (No division per command.)
        let next = self.sqhd.wrapping_add(1);
        self.sqhd = if next >= self.entries { 0 } else { next };
    }

    /// The capsule of the command in slot `i` is in, with `icd` bytes of
    /// in-capsule data (`ok`: their digest matched, or there was none).
    /// (Inlined into the transport's receive path, which then calls
    /// `command`: fewer registers spilled than the other way round.)
    #[inline(always)]
    pub(crate) fn capsule<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        icd: u32,
        ok: bool,
    ) {
        if !ok {
            self.slots[i as usize].err = Some(gen(generic::TRANSIENT_TRANSPORT_ERROR));
        }
        self.advance_sqhd();
        self.command(ctx, x, i, icd);
    }

    /// A command in slot `i` whose capsule (with `icd` bytes of data) is
    /// in.
    #[inline(never)]
    pub(crate) fn command<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        icd: u32,
    ) {
        let s = &self.slots[i as usize];
        let sqe = s.sqe;
        if let Some(st) = s.err {
            return self.finish(x, i, st, 0, 0);
        }
        if sqe.opc == FABRICS_OPCODE {
            return self.fabrics(ctx, x, i, &sqe, icd);
        }
        match self.bound {
            Bound::Admin { .. } => self.admin(ctx, x, i, &sqe, icd),
            Bound::Io { .. } => self.nvm(x, i, &sqe, icd),
            Bound::None => self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0),
        }
    }

    // ------------------------------------------------------------------
    // Responses
    // ------------------------------------------------------------------

    #[inline]
    pub(crate) fn cqe(&self, cid: u16, status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sqhd: self.sqhd,
            sqid: self.qid,
            cid,
            status: status.0 << 1,
        }
    }

    /// Completes slot `i`'s command with `status`.
    #[inline]
    pub(crate) fn finish<X: QueueTransport>(
        &mut self,
        x: &mut X,
        i: u16,
        status: Status,
        dw0: u32,
        dw1: u32,
    ) {
        let cqe = self.cqe(self.slots[i as usize].cid, status, dw0, dw1);
        x.respond(self, Some(i), &cqe);
    }

    /// Answers a command that has no slot (on a queue not connected yet).
    pub(crate) fn answer<X: QueueTransport>(
        &mut self,
        x: &mut X,
        cid: u16,
        status: Status,
        dw0: u32,
    ) {
        let cqe = self.cqe(cid, status, dw0, 0);
        x.respond(self, None, &cqe);
    }

    /// Slot `i`'s response (and data) went out: its buffer comes back (from
    /// the transport's send queue, if it was lent there) and the slot is
    /// free again. (Out of line, as it always was: inlined into the
    /// transport's flush loops it costs them registers, about 25
    /// instructions per I/O.)
    ///
    /// # Safety
    /// Whatever the slot's buffer is lent to no longer reads it: the
    /// transport handed every byte it queued to a copying send that has
    /// returned (or queued none). The core takes back what it lends to the
    /// bdev before it completes a command.
    #[inline(never)]
    pub(crate) unsafe fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if let Some(l) = s.lent.take() {
            // SAFETY: the caller's contract: nothing reads the buffer any
            // more.
            s.buf = Some(unsafe { l.reclaim() });
        }
        s.st = St::Free;
        s.io = None;
        // The buffer goes back to the pool; only a page-sized one stays
        // with the slot for its next command (still counted in `held`,
        // and given back when others wait).
        let keep = s
            .buf
            .as_ref()
            .is_none_or(|b| b.capacity() == crate::buf::ALIGN && !self.cache.pool().pressed());
        if !keep {
            if let Some(b) = self.slots[i as usize].buf.take() {
                self.give_buf(b);
            }
        }
        self.free.push(i);
    }
}
