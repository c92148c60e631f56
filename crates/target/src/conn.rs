//! One NVMe/TCP connection (one queue), owned by one runtime thread.
//!
//! Receive: as much as the socket has goes into the connection's receive
//! buffer in one `read` (large data straight into the command's buffer
//! with one `readv` when `direct_receive` is on), and PDUs are parsed out
//! of it: the common header is checked ([`CommonHeader::check`]), the
//! header parsed ([`PduHeader::parse`], header digest included), then the
//! PDU's data streams to where it belongs (a command's buffer, the
//! Connect data, or nowhere) with its data digest computed on the way.
//! A PDU never has to fit the receive buffer.
//!
//! Commands: each queue has SQSIZE + 1 command slots; a slot's index is
//! the R2T transfer tag. Writes arrive in the capsule or through one R2T
//! covering the whole transfer (H2CData PDUs must arrive in order, within
//! the command's data); reads go out as one C2HData PDU, with the SUCCESS
//! flag and no response capsule when the host disabled SQ flow control.
//!
//! Send: PDU headers (and response capsules, digests, padding) are copied
//! into one byte buffer, data is referenced in place, and everything
//! queued goes out in one `sendmsg` per poll.
//!
//! Errors: a PDU that breaks the protocol gets a C2HTermReq with the
//! Fatal Error Status and Information of the spec and the connection
//! closes (after our FIN, reading what the host still sends); nothing is
//! sent after the TermReq (commands still at the bdev complete silently).
//! A command that is merely wrong completes with an NVMe status. A data
//! digest error completes its command with Transient Transport Error.
//!
//! Backpressure: nothing more is read while 64 KiB are queued to send, so
//! a host that does not read cannot grow the connection's memory.
//!
//! Data buffers come from the target's pool (`pool`) through the thread's
//! cache and go back when the command ends. A command whose data needs a
//! buffer the pool cannot give now (an R2T write or a read) waits, in
//! order, and its R2T goes out (or its read starts) once one is there.
//! The thread's timer completes a command whose R2T data has not arrived
//! within `data_timeout` (Transient Transport Error) and closes a
//! connection whose host has taken none of its queued data for as long,
//! so such hosts cannot keep buffers.
//!
//! Handshake: a connection must send its ICReq within `icreq_timeout` of
//! being accepted, and get its queue connected (a Fabrics Connect
//! accepted) within `connect_timeout` of ICResp, or it is closed
//! ([`Conn::handshake_expired`], checked by the thread's periodic timer
//! with Keep Alive expiry: no clock read on the I/O path), so a peer
//! cannot hold a connection slot without becoming a queue.
//!
//! The socket is reached through [`Wire`] only; the tests (`fuzz`) drive
//! the same machine over memory.
use std::collections::VecDeque;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{
    fabrics_sc, fabrics_status, ConnectCmd, ConnectData, ConnectResponse, DisconnectCmd, FcType,
    ParamIn, PropertyGetCmd, PropertySetCmd, Sgl, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
    CONNECT_DATA_LEN, FABRICS_OPCODE, LID_DISCOVERY,
};
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    append_header, check_data_range, flags, C2HData, CapsuleResp, CheckMemo, CommonHeader,
    DataDigest, Digests, Fes, Field, IcResp, PduError, PduHeader, PduLayout, PduType, Role,
    RxConfig, TermReq, R2T, TERM_REQ_MAX_DATA,
};
use pollux_spec::{AdminOpcode, Cqe, Sqe, Status};
use zerocopy::{FromBytes, IntoBytes};

use crate::buf::{AlignedBuf, Lent};
use crate::model::{self, Admin, Ctrl, IoCmd, IoQ};
use crate::pool::{self, Cache};
use crate::shared::{lock, ConnRef, CtrlEntry, Shared, SubsysId};
use crate::sock::{self, Wire};

/// How long a closing connection waits for the host's FIN.
const LINGER: Duration = Duration::from_secs(2);
/// Keep Alive Timeout of a discovery controller whose host asked for none
/// (KATO 0), so an idle one does not stay forever: Linux's nvmet's
/// `NVMET_DISC_KATO_MS`.
pub(crate) const DISCOVERY_KATO_MS: u32 = 120_000;
/// Data at least this large is received straight into its buffer.
const DIRECT_MIN: u32 = 8 << 10;
/// Reads per poll at most (then other connections get their turn).
const READS_PER_POLL: usize = 4;
/// Empty receives in a row after which a connection is read only every
/// [`QUIET_STRIDE`]-th poll: an idle admin queue would otherwise cost a
/// failed `readv` on every pass of its thread (an active I/O queue, even
/// at queue depth 1, never goes this long without data).
const QUIET_AFTER: u32 = 1024;
const QUIET_STRIDE: u32 = 16;
/// Bytes queued to send (PDU headers, responses) beyond which nothing
/// more is read until the host has taken them: a host that does not read
/// cannot make the queue grow (commands on a bound queue are limited by
/// its slots, but a queue not yet connected answers without a slot).
const TX_BACKLOG_MAX: usize = 64 << 10;

#[inline(always)]
fn gen(sc: u8) -> Status {
    Status::generic(sc)
}

/// Where a PDU's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sink {
    Discard,
    /// The Connect data (`Conn::scratch`).
    Scratch,
    Slot(u16),
}

/// The part of a PDU after its header, being received.
#[derive(Clone, Copy, Debug)]
struct Body {
    pdu: PduHeader,
    pad: u32,
    left: u32,
    data_len: u32,
    sink: Sink,
    /// The command slot the PDU belongs to (also when its data is
    /// discarded).
    slot: Option<u16>,
    /// Where the next byte goes in the sink.
    off: u32,
    dg: DataDigest,
    want_dd: bool,
    dd: [u8; 4],
    dd_have: u8,
}

#[derive(Clone, Copy, Debug)]
enum RxState {
    Header,
    Body(Body),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for ICReq.
    Init,
    Ready,
    /// Sending what is queued (a TermReq, a Disconnect's response), then
    /// FIN, then reading to the host's FIN (or the linger deadline).
    Closing,
    Closed,
}

/// A handshake stage a connection can time out in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Accepted, no ICReq yet (`icreq_timeout`).
    IcReq,
    /// ICResp sent, the queue not connected yet: no Connect, or only
    /// refused ones, whatever else the host sends (`connect_timeout`).
    Connect,
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stage::IcReq => "no ICReq since accept",
            Stage::Connect => "queue not connected (no Fabrics Connect accepted) since ICResp",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Free,
    /// Capsule data arriving.
    Recv,
    /// Waiting for a data buffer from the pool (in `Conn::waiting`).
    WaitBuf,
    /// R2T sent, H2CData arriving.
    AwaitH2C,
    /// Lent to the I/O queue.
    Bdev,
    /// Data (and response) queued for the socket.
    Tx,
    /// An Asynchronous Event Request held by the controller.
    Held,
}

struct Slot {
    st: St,
    cid: u16,
    sqe: Sqe,
    buf: Option<AlignedBuf>,
    lent: Option<Lent>,
    /// Bytes of data the command moves.
    xfer: u32,
    /// H2C bytes received.
    got: u32,
    io: Option<IoCmd>,
    /// A transport error seen while receiving the data.
    err: Option<Status>,
    /// When its R2T was queued (data timeout).
    r2t_at: Option<Instant>,
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
            got: 0,
            io: None,
            err: None,
            r2t_at: None,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Seg {
    Bytes { start: usize, len: usize },
    Data { ptr: *const u8, len: usize },
    Release { slot: u16 },
}

/// What is queued for the socket.
#[derive(Default)]
struct Tx {
    bytes: Vec<u8>,
    /// Segments; those before `head` are sent. Emptied (and `head` reset)
    /// when the last one is: a queue that drains, as this one does, needs
    /// no ring.
    segs: Vec<Seg>,
    head: usize,
    /// Bytes of the front segment already sent.
    front: usize,
}

impl Tx {
    fn push(&mut self, seg: Seg) {
        self.segs.push(seg);
    }

    /// The segments not yet sent.
    fn pending(&self) -> &[Seg] {
        &self.segs[self.head..]
    }

    fn front(&self) -> Option<Seg> {
        self.segs.get(self.head).copied()
    }

    fn pop_front(&mut self) {
        self.head += 1;
        if self.head >= self.segs.len() {
            self.segs.clear();
            self.head = 0;
        }
    }

    fn push_bytes(&mut self, b: &[u8]) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(b);
        self.push_range(start, b.len());
    }

    /// Queues `bytes[start..start + len]`, just appended.
    fn push_range(&mut self, start: usize, len: usize) {
        // Only a pending segment is ever last (`pop_front` empties a
        // drained queue).
        if let Some(Seg::Bytes { start: s, len: l }) = self.segs.last_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
        self.push(Seg::Bytes { start, len });
    }

    /// A PDU header with its digest and padding per `layout`.
    fn push_header(&mut self, header: &[u8], layout: &PduLayout) {
        let start = self.bytes.len();
        if let Some(n) = append_header(header, layout, &mut self.bytes) {
            self.push_range(start, n);
        }
    }

    fn is_empty(&self) -> bool {
        self.head == self.segs.len()
    }
}

enum Bound {
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

/// One connection, over a socket (`W`: a `TcpStream`, or any [`Wire`]).
pub(crate) struct Conn<W: Wire = TcpStream> {
    pub id: u64,
    /// Dropped first (a bdev may still hold slot buffers).
    io: Option<IoQ>,
    sock: W,
    local: SocketAddr,
    peer: SocketAddr,
    shared: Arc<Shared>,
    thread: usize,
    phase: Phase,
    now: Instant,
    /// When the current handshake stage began: accepted (waiting for
    /// ICReq), then ICResp queued (waiting for the queue's Connect).
    stage_since: Instant,
    /// Polls since the last receive that got data (see [`QUIET_AFTER`]).
    quiet: u32,
    /// When data last arrived (or the connection was accepted): the
    /// longest idle unbound connection is evicted first.
    last_rx: Instant,
    /// The connection holds a place among those bound to an NVM
    /// subsystem (`Shared::data_conns`).
    data_slot: bool,
    /// This thread's free data buffers (and through it, the pool).
    cache: Rc<Cache>,
    /// Bytes of data buffers the connection holds.
    held: usize,
    /// Counted among the pool's active connections (fair share).
    pool_active: bool,
    /// Slots waiting for a data buffer, in arrival order.
    waiting: VecDeque<u16>,
    /// Counted among the pool's waiting connections.
    wait_counted: bool,
    /// Slots with an R2T out (data timeout).
    r2t_out: u32,
    /// Since when the socket has taken nothing of a non-empty send queue.
    tx_stalled_since: Option<Instant>,
    rxcfg: RxConfig,
    /// The last header that passed its check (most PDUs are alike).
    memo: CheckMemo,
    digests: Digests,
    hpda: u8,
    rx: Vec<u8>,
    rs: usize,
    re: usize,
    rxst: RxState,
    tx: Tx,
    /// The iovecs of one `sendmsg`, rebuilt per call (kept to spare a
    /// zeroed array of `MAX_IOV` on every flush; grows on first use).
    iov: Vec<libc::iovec>,
    bound: Bound,
    slots: Vec<Slot>,
    free: Vec<u16>,
    done: Vec<(u32, Status)>,
    sqhd: u16,
    entries: u16,
    qid: u16,
    flow_off: bool,
    icd_max: u32,
    scratch: Vec<u8>,
    kato: Duration,
    last_admin: Instant,
    linger_until: Option<Instant>,
    fin_sent: bool,
    draining: bool,
    /// A C2HTermReq is queued: nothing more is sent after it (commands
    /// still completing are dropped).
    terminated: bool,
}

impl<W: Wire> Drop for Conn<W> {
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
                // requests), and the socket copied what it was sent (the
                // rest is never sent).
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

/// A fatal protocol error: the TermReq's FES and FEI.
struct Fatal {
    fes: Fes,
    fei: u32,
    why: String,
}

impl From<PduError> for Fatal {
    fn from(e: PduError) -> Fatal {
        Fatal {
            fes: e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD),
            fei: e.fei(),
            why: e.to_string(),
        }
    }
}

impl Conn<TcpStream> {
    pub fn new(
        id: u64,
        sock: TcpStream,
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> std::io::Result<Conn<TcpStream>> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        let local = sock.local_addr()?;
        let peer = sock.peer_addr()?;
        Ok(Conn::with_wire(
            id,
            sock,
            (local, peer),
            shared,
            cache,
            thread,
            now,
        ))
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.sock.as_fd()
    }
}

impl<W: Wire> Conn<W> {
    /// A connection over `sock` (non-blocking, set up), between the
    /// addresses `(local, peer)`, its data buffers from `cache`.
    pub(crate) fn with_wire(
        id: u64,
        sock: W,
        (local, peer): (SocketAddr, SocketAddr),
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> Conn<W> {
        let rx = vec![0u8; shared.opts.rx_buffer];
        let icd_max = shared.opts.admin_in_capsule_data_size;
        let mut c = Conn {
            id,
            io: None,
            sock,
            local,
            peer,
            thread,
            phase: Phase::Init,
            now,
            stage_since: now,
            quiet: 0,
            last_rx: now,
            data_slot: false,
            cache,
            held: 0,
            pool_active: false,
            waiting: VecDeque::new(),
            wait_counted: false,
            r2t_out: 0,
            tx_stalled_since: None,
            rxcfg: RxConfig::initial(Role::Controller),
            memo: CheckMemo::default(),
            digests: Digests::NONE,
            hpda: 0,
            rx,
            rs: 0,
            re: 0,
            rxst: RxState::Header,
            tx: Tx::default(),
            iov: Vec::new(),
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
            linger_until: None,
            fin_sent: false,
            draining: false,
            terminated: false,
            shared,
        };
        c.rxcfg.max_plen = 128;
        c
    }

    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Nothing of this connection is at a bdev any more: dropping it does
    /// not wait. A closed connection stays in its thread's table (polled
    /// by [`Conn::poll`], which then only reaps) until it is, so a slow
    /// backend never holds the thread, and the other connections on it,
    /// while a connection goes away.
    pub fn is_settled(&self) -> bool {
        self.io.as_ref().is_none_or(|q| q.outstanding() == 0)
    }

    /// The socket (tests drive the machine over memory through it).
    #[cfg(test)]
    pub(crate) fn wire(&mut self) -> &mut W {
        &mut self.sock
    }

    /// What the connection holds that a peer's bytes could grow: bytes
    /// queued to send, send segments, the Connect data buffer, command
    /// slots, the receive buffer, data buffer bytes.
    #[cfg(test)]
    pub(crate) fn footprint(&self) -> [usize; 6] {
        [
            self.tx.bytes.len(),
            self.tx.pending().len(),
            self.scratch.capacity(),
            self.slots.len(),
            self.rx.len(),
            self.held,
        ]
    }

    /// Commands wait for data buffers.
    #[cfg(test)]
    pub(crate) fn is_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// Work is pending that no socket readiness will announce: the
    /// thread must not sleep.
    pub fn needs_poll(&self) -> bool {
        !self.tx.is_empty()
            || self.io.as_ref().is_some_and(|q| q.outstanding() > 0)
            || !self.waiting.is_empty()
    }

    /// One pass: completions, receive (then the completions of what it
    /// received, if any finished at once), send.
    pub fn poll(&mut self, ctx: &mut ThreadCtx) -> bool {
        if self.phase == Phase::Closed {
            return self.settle();
        }
        self.now = ctx.now();
        let mut busy = false;
        if self.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
            busy |= self.poll_io();
        }
        if !self.waiting.is_empty() {
            busy |= self.serve_waiting();
        }
        if matches!(self.phase, Phase::Init | Phase::Ready) && !self.draining {
            if self.quiet <= QUIET_AFTER {
                let got = self.receive(ctx);
                busy |= got;
                self.quiet = if got { 0 } else { self.quiet + 1 };
                // What the commands just received finished at once (null,
                // RAM) goes out with this pass's send, not the next one's:
                // at QD 1 that saves a pass and an empty receive per I/O.
                if got && self.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
                    self.poll_io();
                }
            } else if self.quiet == QUIET_AFTER + QUIET_STRIDE {
                self.quiet = QUIET_AFTER;
            } else {
                self.quiet += 1;
            }
        }
        if !self.tx.is_empty() {
            busy |= self.flush(ctx);
        }
        match self.phase {
            Phase::Closing => busy |= self.closing(ctx),
            // Shutdown: finish what is in flight, then close.
            Phase::Ready | Phase::Init if self.draining && !self.needs_poll() => {
                self.begin_close(ctx, "target shutting down");
            }
            _ => {}
        }
        busy
    }

    /// Shutdown of the target: stop taking commands.
    pub fn drain(&mut self) {
        self.draining = true;
        // Commands still waiting for a data buffer are not started.
        self.abandon_waiting();
    }

    /// Keep Alive Timeout expired on an admin queue.
    pub fn kato_expired(&self, now: Instant) -> bool {
        matches!(self.bound, Bound::Admin { .. })
            && self.phase == Phase::Ready
            && !self.kato.is_zero()
            && now.saturating_duration_since(self.last_admin) > self.kato
    }

    /// The handshake stage this connection has spent longer in than the
    /// transport options allow, if any, and that limit.
    pub fn handshake_expired(&self, now: Instant) -> Option<(Stage, Duration)> {
        let o = &self.shared.opts;
        let (stage, limit) = match self.phase {
            Phase::Init => (Stage::IcReq, o.icreq_timeout),
            Phase::Ready if matches!(self.bound, Bound::None) => {
                (Stage::Connect, o.connect_timeout)
            }
            _ => return None,
        };
        (now.saturating_duration_since(self.stage_since) > limit).then_some((stage, limit))
    }

    /// The host's address.
    pub fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// Open and not bound to an NVM subsystem: in its handshake, a
    /// discovery controller's queue, or closing. These have their own
    /// budget (`max_unbound_connections`).
    pub fn is_unbound(&self) -> bool {
        self.phase != Phase::Closed && !self.data_slot
    }

    /// Closing (its last bytes going out, or waiting for the host's FIN).
    pub fn is_closing(&self) -> bool {
        self.phase == Phase::Closing
    }

    /// When data last arrived (or the connection was accepted).
    pub fn last_rx(&self) -> Instant {
        self.last_rx
    }

    fn give_back_data_slot(&mut self) {
        if std::mem::take(&mut self.data_slot) {
            crate::shared::DataSlot::give_back(&self.shared.data_conns);
        }
    }

    /// The thread's timer (every 100 ms): completes commands whose R2T
    /// data has not arrived within `data_timeout` (Transient Transport
    /// Error: the transfer failed, a retry may succeed; their buffers come
    /// back once the response is sent), closes the connection if its host
    /// has taken nothing of the send queue for as long, and leaves the
    /// pool's active connections when it holds no buffer.
    pub fn tick(&mut self, ctx: &mut ThreadCtx, now: Instant) {
        let limit = self.shared.opts.data_timeout;
        if self.r2t_out > 0 && self.phase == Phase::Ready && !self.terminated {
            // (Not the transfer whose data is arriving right now.)
            let arriving = match self.rxst {
                RxState::Body(b) => b.slot,
                RxState::Header => None,
            };
            let mut expired = 0u32;
            for i in 0..self.slots.len() as u16 {
                let s = &self.slots[i as usize];
                let late = s.st == St::AwaitH2C
                    && arriving != Some(i)
                    && s.r2t_at
                        .is_some_and(|at| now.saturating_duration_since(at) > limit);
                if late {
                    self.r2t_out -= 1;
                    expired += 1;
                    // DNR clear: the transfer failed, a retry may succeed.
                    let st = Status::new(
                        pollux_spec::status::sct::GENERIC,
                        generic::TRANSIENT_TRANSPORT_ERROR,
                        false,
                    );
                    self.finish(i, st, 0, 0);
                }
            }
            if expired > 0 {
                tracing::warn!(
                    peer = %self.peer,
                    conn = self.id,
                    commands = expired,
                    timeout_ms = limit.as_millis() as u64,
                    "the data asked for with R2T did not arrive in time: commands completed with Transient Transport Error"
                );
            }
        }
        let stalled = self
            .tx_stalled_since
            .is_some_and(|at| now.saturating_duration_since(at) > limit);
        if stalled && !self.tx.is_empty() && self.phase == Phase::Ready {
            tracing::warn!(
                peer = %self.peer,
                conn = self.id,
                timeout_ms = limit.as_millis() as u64,
                "the host has taken nothing of what is queued for it in time; closing the connection"
            );
            self.close_now(ctx, "send queue stalled");
        }
        if self.cache.pool().pressed() {
            // Others wait: the pages idle slots keep go back.
            self.give_back_kept();
        }
        if self.pool_active && self.held == 0 && self.waiting.is_empty() {
            self.pool_active = false;
            self.cache.pool().set_active(false);
        }
    }

    /// A data buffer of `len` bytes from the pool: `strict`, within the
    /// budget (and, while others wait, this connection's fair share);
    /// else charged in any case (in-capsule and admin data).
    #[inline]
    fn take_buf(&mut self, len: usize, strict: bool) -> Option<AlignedBuf> {
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
    #[inline]
    fn slot_buf(&mut self, i: u16, len: usize, strict: bool) -> bool {
        if let Some(b) = self.slots[i as usize].buf.as_mut() {
            if b.set_len(len) {
                return true;
            }
        }
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
    fn give_back_kept(&mut self) -> bool {
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
    fn give_buf(&mut self, b: AlignedBuf) {
        self.held = self.held.saturating_sub(b.capacity());
        self.cache.give(b);
    }

    /// Slot `i` waits for a data buffer.
    #[cold]
    fn wait_buf(&mut self, i: u16) {
        self.slots[i as usize].st = St::WaitBuf;
        self.waiting.push_back(i);
        if !self.wait_counted {
            self.wait_counted = true;
            self.cache.pool().set_waiting(true);
        }
    }

    /// Gives the waiting slots their buffers, in order, while the pool
    /// has them; true if any got one.
    fn serve_waiting(&mut self) -> bool {
        let mut any = false;
        if self.phase == Phase::Ready && !self.terminated {
            while let Some(&i) = self.waiting.front() {
                let len = self.slots[i as usize].xfer as usize;
                if !self.slot_buf(i, len, true) {
                    break;
                }
                self.waiting.pop_front();
                self.transfer(i);
                any = true;
            }
        }
        if self.waiting.is_empty() && std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
        any
    }

    /// Closing: the waiting slots will not be served.
    fn abandon_waiting(&mut self) {
        self.waiting.clear();
        if std::mem::take(&mut self.wait_counted) {
            self.cache.pool().set_waiting(false);
        }
    }

    /// The Keep Alive Timeout of `kato_ms` on this queue's controller: a
    /// discovery controller has one even when the host asks for none.
    fn kato_for(&self, kato_ms: u32) -> Duration {
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

    /// Linger deadline passed.
    pub fn linger_over(&self, now: Instant) -> bool {
        self.linger_until.is_some_and(|d| now >= d)
    }

    /// Closes at once (controller torn down elsewhere, or linger over).
    pub fn close_now(&mut self, ctx: &mut ThreadCtx, why: &str) {
        if self.phase != Phase::Closed {
            tracing::debug!(peer = %self.peer, conn = self.id, why, "connection closed");
            self.detach(ctx);
            let _ = self.sock.shutdown(Shutdown::Both);
            self.phase = Phase::Closed;
        }
    }

    /// Graceful close: send what is queued, FIN, wait for the host's FIN.
    pub fn begin_close(&mut self, ctx: &mut ThreadCtx, why: &str) {
        if matches!(self.phase, Phase::Closing | Phase::Closed) {
            return;
        }
        tracing::debug!(peer = %self.peer, conn = self.id, why, "closing connection");
        self.detach(ctx);
        self.phase = Phase::Closing;
        self.linger_until = Some(self.now + LINGER);
    }

    /// Leaves the controller table: an admin queue takes its controller
    /// (and that controller's I/O queues) down, an I/O queue leaves it.
    fn detach(&mut self, ctx: &mut ThreadCtx) {
        self.give_back_data_slot();
        self.abandon_waiting();
        match std::mem::replace(&mut self.bound, Bound::None) {
            Bound::None => {}
            Bound::Admin { cntlid, .. } => teardown(ctx, &self.shared, cntlid),
            Bound::Io { cntlid, qid } => {
                let mut t = self.shared.table();
                if let Some(e) = t.map.get_mut(&cntlid) {
                    e.io.retain(|(q, _)| *q != qid);
                }
            }
        }
    }

    /// Closed: reaps what the bdevs give back (nothing is sent; the slots'
    /// buffers go back when the connection is dropped).
    #[cold]
    fn settle(&mut self) -> bool {
        self.io
            .as_mut()
            .is_some_and(|q| q.outstanding() > 0 && q.poll(&mut |_, _| {}) > 0)
    }

    fn closing(&mut self, ctx: &mut ThreadCtx) -> bool {
        if !self.tx.is_empty() || self.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
            return false;
        }
        if !self.fin_sent {
            let _ = self.sock.shutdown(Shutdown::Write);
            self.fin_sent = true;
        }
        // Read (and drop) until the host's FIN, so our last bytes are not
        // lost to a reset; as many reads per poll as the receive path
        // (a host that keeps sending does not hold the thread).
        let mut busy = false;
        for _ in 0..READS_PER_POLL {
            match self.sock.recv2(&mut self.rx[..], &mut []) {
                Ok(Some(0)) | Err(_) => {
                    self.close_now(ctx, "closed");
                    return true;
                }
                Ok(Some(_)) => busy = true,
                Ok(None) => break,
            }
        }
        if self.linger_over(self.now) {
            self.close_now(ctx, "linger time over");
        }
        busy
    }

    // ------------------------------------------------------------------
    // Receive
    // ------------------------------------------------------------------

    fn receive(&mut self, ctx: &mut ThreadCtx) -> bool {
        let mut busy = false;
        for _ in 0..READS_PER_POLL {
            if self.tx.bytes.len() >= TX_BACKLOG_MAX {
                break;
            }
            if self.rs == self.re {
                self.rs = 0;
                self.re = 0;
            } else if self.rs > 0 && self.rx.len() - self.re < 4096 {
                self.rx.copy_within(self.rs..self.re, 0);
                self.re -= self.rs;
                self.rs = 0;
            }
            // (bytes read in all, of them into the receive buffer)
            let r = if let Some(r) = self.direct_receive() {
                r
            } else if self.re == self.rx.len() {
                break;
            } else {
                let (_, tail) = self.rx.split_at_mut(self.re);
                self.sock.recv2(tail, &mut []).map(|o| o.map(|n| (n, n)))
            };
            match r {
                Ok(Some((0, _))) => {
                    self.close_now(ctx, "host closed the connection");
                    return true;
                }
                Ok(Some((_, n))) => {
                    self.re += n;
                    self.last_rx = self.now;
                    busy = true;
                    self.process(ctx);
                    if self.phase != Phase::Ready && self.phase != Phase::Init {
                        break;
                    }
                    if self.re < self.rx.len() {
                        // The socket had less than the room: it is empty.
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.close_now(ctx, &format!("receive failed: {e}"));
                    return true;
                }
            }
        }
        busy
    }

    /// One `readv` into the buffer of a large data PDU being received and
    /// the receive buffer; the bytes for the data are taken in here.
    /// Returns the bytes read in all and those that went to the receive
    /// buffer (which starts empty).
    #[allow(clippy::type_complexity)]
    fn direct_receive(&mut self) -> Option<std::io::Result<Option<(usize, usize)>>> {
        if !self.shared.opts.direct_receive || self.rs != self.re {
            return None;
        }
        let RxState::Body(b) = &mut self.rxst else {
            return None;
        };
        let Sink::Slot(i) = b.sink else {
            return None;
        };
        if b.pad != 0 || b.left < DIRECT_MIN {
            return None;
        }
        let buf = self.slots.get_mut(i as usize)?.buf.as_mut()?;
        let dst = buf
            .as_mut_slice()
            .get_mut(b.off as usize..(b.off + b.left) as usize)?;
        let r = self.sock.recv2(dst, &mut self.rx[..]);
        Some(r.map(|o| {
            o.map(|n| {
                let n1 = n.min(b.left as usize);
                if b.want_dd {
                    b.dg.update(&dst[..n1]);
                }
                b.off += n1 as u32;
                b.left -= n1 as u32;
                self.rs = 0;
                self.re = 0;
                (n, n - n1)
            })
        }))
    }

    /// Parses and handles every complete piece in the receive buffer.
    fn process(&mut self, ctx: &mut ThreadCtx) {
        while matches!(self.phase, Phase::Init | Phase::Ready) {
            match self.rxst {
                RxState::Header => {
                    let avail = self.re - self.rs;
                    if avail < 8 {
                        return;
                    }
                    let at = self.rs;
                    let Some(ch) = CommonHeader::read(&self.rx[at..self.re]) else {
                        return;
                    };
                    let layout = match self.memo.check(&ch, &self.rxcfg) {
                        Ok(l) => l,
                        Err(PduError::TermReqLength { plen, .. }) => {
                            self.close_now(ctx, &format!("host TermReq with PLEN {plen}"));
                            return;
                        }
                        Err(e) => {
                            let n = avail.min(ch.hlen.max(8) as usize);
                            let hb = self.rx[at..at + n].to_vec();
                            return self.fatal(ctx, e.into(), &hb);
                        }
                    };
                    let hl = layout.header_len() as usize;
                    if avail < hl {
                        return;
                    }
                    // Parsed where it lies (the parsed header owns its
                    // fields); the bytes are copied only for a TermReq.
                    let pdu = match PduHeader::parse(&self.rx[at..at + hl], &layout, &self.rxcfg) {
                        Ok(p) => p,
                        Err(e) => {
                            let hb = self.rx[at..at + hl].to_vec();
                            return self.fatal(ctx, e.into(), &hb);
                        }
                    };
                    self.rs += hl;
                    if let Err(f) = self.on_header(ctx, pdu, &layout) {
                        // Handling a header never writes the receive
                        // buffer (only `receive` and `closing` do).
                        let end = at + layout.hlen as usize;
                        let hb = self.rx.get(at..end).map(<[u8]>::to_vec).unwrap_or_default();
                        return self.fatal(ctx, f, &hb);
                    }
                }
                RxState::Body(mut b) => {
                    let done = self.consume_body(&mut b);
                    if !done {
                        self.rxst = RxState::Body(b);
                        return;
                    }
                    self.rxst = RxState::Header;
                    let ok = !b.want_dd || b.dg.value() == u32::from_le_bytes(b.dd);
                    if !ok {
                        tracing::warn!(peer = %self.peer, "data digest error");
                    }
                    self.on_body(ctx, &b, ok);
                }
            }
        }
    }

    /// Takes what the receive buffer has of a PDU's padding, data and
    /// data digest; true once all of it is in.
    fn consume_body(&mut self, b: &mut Body) -> bool {
        let avail = self.re - self.rs;
        let n = (b.pad as usize).min(avail);
        self.rs += n;
        b.pad -= n as u32;
        if b.pad > 0 {
            return false;
        }
        if b.left > 0 {
            let n = (b.left as usize).min(self.re - self.rs);
            let src = &self.rx[self.rs..self.rs + n];
            if b.want_dd {
                b.dg.update(src);
            }
            match b.sink {
                Sink::Discard => {}
                Sink::Scratch => self.scratch.extend_from_slice(src),
                Sink::Slot(i) => {
                    let dst = self.slots[i as usize]
                        .buf
                        .as_mut()
                        .and_then(|d| d.as_mut_slice().get_mut(b.off as usize..b.off as usize + n));
                    if let Some(dst) = dst {
                        dst.copy_from_slice(src);
                    }
                }
            }
            self.rs += n;
            b.off += n as u32;
            b.left -= n as u32;
            if b.left > 0 {
                return false;
            }
        }
        if b.want_dd {
            while b.dd_have < 4 && self.rs < self.re {
                b.dd[b.dd_have as usize] = self.rx[self.rs];
                b.dd_have += 1;
                self.rs += 1;
            }
            if b.dd_have < 4 {
                return false;
            }
        }
        true
    }

    fn body(pdu: PduHeader, layout: &PduLayout, sink: Sink, slot: Option<u16>, off: u32) -> Body {
        Body {
            pdu,
            slot,
            pad: layout.pad_len(),
            left: layout.data_len,
            data_len: layout.data_len,
            sink,
            off,
            dg: DataDigest::new(),
            want_dd: layout.ddgst,
            dd: [0; 4],
            dd_have: 0,
        }
    }

    fn on_header(
        &mut self,
        ctx: &mut ThreadCtx,
        pdu: PduHeader,
        layout: &PduLayout,
    ) -> Result<(), Fatal> {
        match pdu {
            PduHeader::IcReq(r) => {
                self.digests = r.digests();
                self.hpda = r.hpda;
                let o = &self.shared.opts;
                let resp = IcResp::new(0, self.digests, o.max_h2c_data);
                let l = PduLayout::new(PduType::IcResp, Digests::NONE, 0, 0)
                    .ok_or_else(|| internal("ICResp layout"))?;
                self.tx.push_header(resp.as_bytes(), &l);
                self.rxcfg.established = true;
                self.rxcfg.digests = self.digests;
                self.rxcfg.maxh2cdata = o.max_h2c_data;
                let icd = o.admin_in_capsule_data_size.max(o.in_capsule_data_size);
                self.rxcfg.max_plen = self
                    .rxcfg
                    .plen_for(PduType::CapsuleCmd, icd)
                    .max(self.rxcfg.plen_for(PduType::H2CData, o.max_h2c_data));
                self.phase = Phase::Ready;
                self.stage_since = self.now;
                tracing::debug!(peer = %self.peer, digests = ?self.digests, hpda = r.hpda, maxr2t = r.maxr2t, "connection initialized");
                Ok(())
            }
            PduHeader::TermReq(t) => {
                tracing::warn!(peer = %self.peer, fes = %t.fes(), fei = t.fei(), "host terminated the connection (H2CTermReq)");
                self.begin_close(ctx, "H2CTermReq");
                Ok(())
            }
            PduHeader::CapsuleCmd(c) => {
                let sqe = c.sqe();
                let dl = layout.data_len;
                let sink = if matches!(self.bound, Bound::None) {
                    if FcType::of(&sqe) == Some(FcType::Connect) && dl <= self.icd_max {
                        self.scratch.clear();
                        Sink::Scratch
                    } else {
                        Sink::Discard
                    }
                } else {
                    let Some(i) = self.free.pop() else {
                        return Err(Fatal {
                            fes: Fes::PDU_SEQUENCE_ERROR,
                            fei: 0,
                            why: format!(
                                "command capsule beyond the queue's {} entries",
                                self.entries
                            ),
                        });
                    };
                    let s = &mut self.slots[i as usize];
                    s.st = St::Recv;
                    s.cid = sqe.cid;
                    s.sqe = sqe;
                    s.err = None;
                    s.got = 0;
                    s.xfer = 0;
                    s.io = None;
                    // In-capsule data is arriving: its buffer does not
                    // wait for the pool's budget (bounded by the slots).
                    let err = if dl == 0 {
                        None
                    } else if dl > self.icd_max {
                        Some(gen(generic::SGL_OFFSET_INVALID))
                    } else if self.slot_buf(i, dl as usize, false) {
                        None
                    } else {
                        Some(gen(generic::INTERNAL_ERROR))
                    };
                    if let Some(e) = err {
                        self.slots[i as usize].err = Some(e);
                        self.rxst =
                            RxState::Body(Self::body(pdu, layout, Sink::Discard, Some(i), 0));
                        return Ok(());
                    }
                    Sink::Slot(i)
                };
                let slot = match sink {
                    Sink::Slot(i) => Some(i),
                    _ => None,
                };
                if layout.data_len == 0 && layout.pad_len() == 0 {
                    // Nothing follows the header: the command is in.
                    self.capsule_in(ctx, &sqe, sink, slot, 0, true);
                } else {
                    self.rxst = RxState::Body(Self::body(pdu, layout, sink, slot, 0));
                }
                Ok(())
            }
            PduHeader::H2CData(h) => {
                let i = h.ttag as usize;
                let bad = |field: Field, why: String| Fatal {
                    fes: Fes::INVALID_HEADER_FIELD,
                    fei: field.offset(),
                    why,
                };
                let Some(s) = self.slots.get(i).filter(|s| s.st == St::AwaitH2C) else {
                    return Err(bad(
                        Field::Ttag,
                        format!("H2CData for TTAG {} with no transfer outstanding", h.ttag),
                    ));
                };
                if s.cid != h.cccid {
                    return Err(bad(
                        Field::Cccid,
                        format!(
                            "H2CData CCCID {} does not match TTAG {}'s command {}",
                            h.cccid, h.ttag, s.cid
                        ),
                    ));
                }
                check_data_range(PduType::H2CData, h.datao, h.datal, s.got, s.xfer)?;
                self.rxst = RxState::Body(Self::body(
                    pdu,
                    layout,
                    Sink::Slot(i as u16),
                    Some(i as u16),
                    h.datao,
                ));
                Ok(())
            }
            other => Err(internal(&format!("unexpected PDU {other:?}"))),
        }
    }

    /// A PDU is complete (`ok`: its data digest matched, or it had none).
    fn on_body(&mut self, ctx: &mut ThreadCtx, b: &Body, ok: bool) {
        match b.pdu {
            PduHeader::CapsuleCmd(c) => {
                self.capsule_in(ctx, &c.sqe(), b.sink, b.slot, b.data_len, ok);
            }
            PduHeader::H2CData(h) => {
                let i = h.ttag;
                let s = &mut self.slots[i as usize];
                s.got += h.datal;
                if !ok {
                    s.err = Some(gen(generic::TRANSIENT_TRANSPORT_ERROR));
                }
                if s.got == s.xfer {
                    self.write_data_in(i);
                }
            }
            _ => {}
        }
    }

    /// A command capsule is in, with its `data_len` bytes of in-capsule
    /// data (`ok`: their digest matched, or there was none).
    fn capsule_in(
        &mut self,
        ctx: &mut ThreadCtx,
        sqe: &Sqe,
        sink: Sink,
        slot: Option<u16>,
        data_len: u32,
        ok: bool,
    ) {
        match (sink, slot) {
            (Sink::Slot(i), _) => {
                if !ok {
                    self.slots[i as usize].err = Some(gen(generic::TRANSIENT_TRANSPORT_ERROR));
                }
                self.advance_sqhd();
                self.command(ctx, i, data_len);
            }
            (Sink::Discard, Some(i)) => {
                // A command whose data was refused (its slot holds the
                // status).
                self.advance_sqhd();
                self.command(ctx, i, 0);
            }
            _ => self.unbound_command(ctx, sqe, ok),
        }
    }

    fn advance_sqhd(&mut self) {
        // (No division per command.)
        let next = self.sqhd.wrapping_add(1);
        self.sqhd = if next >= self.entries { 0 } else { next };
    }

    // ------------------------------------------------------------------
    // Commands
    // ------------------------------------------------------------------

    /// A command on a queue not yet connected: only Connect.
    fn unbound_command(&mut self, ctx: &mut ThreadCtx, sqe: &Sqe, ok: bool) {
        if FcType::of(sqe) != Some(FcType::Connect) {
            return self.respond(None, sqe.cid, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        }
        if !ok {
            return self.respond(None, sqe.cid, gen(generic::TRANSIENT_TRANSPORT_ERROR), 0, 0);
        }
        match self.connect(ctx, sqe) {
            Ok(cntlid) => {
                let dw0 = ConnectResponse::Success { cntlid, authreq: 0 }.dw0();
                self.advance_sqhd();
                self.respond(None, sqe.cid, Status::SUCCESS, dw0, 0);
            }
            Err((status, dw0)) => self.respond(None, sqe.cid, status, dw0, 0),
        }
    }

    fn connect(&mut self, ctx: &mut ThreadCtx, sqe: &Sqe) -> Result<u16, (Status, u32)> {
        let cmd = ConnectCmd::from_sqe(sqe);
        let invalid = |iattr, ipo| {
            (
                fabrics_status(fabrics_sc::CONNECT_INVALID_PARAMETERS),
                ConnectResponse::InvalidParam { iattr, ipo }.dw0(),
            )
        };
        use pollux_spec::fabrics::connect_ipo as ipo;
        match Sgl::from_sqe(sqe) {
            Ok(Sgl::InCapsule { offset: 0, len }) if len == CONNECT_DATA_LEN => {}
            Ok(Sgl::InCapsule { offset: 0, .. }) => {
                return Err((gen(generic::DATA_SGL_LENGTH_INVALID), 0))
            }
            Ok(Sgl::InCapsule { .. }) => return Err((gen(generic::SGL_OFFSET_INVALID), 0)),
            Ok(_) => return Err((gen(generic::SGL_TYPE_INVALID), 0)),
            Err(e) => return Err((e.status(), 0)),
        }
        if self.scratch.len() < CONNECT_DATA_LEN as usize {
            return Err((gen(generic::DATA_SGL_LENGTH_INVALID), 0));
        }
        if cmd.recfmt != 0 {
            return Err((fabrics_status(fabrics_sc::INCOMPATIBLE_FORMAT), 0));
        }
        let Ok(data) = ConnectData::read_from_bytes(&self.scratch[..CONNECT_DATA_LEN as usize])
        else {
            return Err((gen(generic::DATA_SGL_LENGTH_INVALID), 0));
        };
        let Ok(subnqn) = data.subnqn() else {
            return Err(invalid(ParamIn::Data, ipo::DATA_SUBNQN));
        };
        // An empty HOSTNQN (SPDK's host sends one unless told a host NQN)
        // is a host without a name: accepted where any host may connect,
        // as SPDK's nvmf_tgt and Linux's nvmet do, refused by allow lists.
        let hostnqn = match data.hostnqn() {
            Ok(h) => h,
            Err(pollux_spec::fabrics::NqnError::Empty) => "",
            Err(_) => return Err(invalid(ParamIn::Data, ipo::DATA_HOSTNQN)),
        };
        let shared = self.shared.clone();
        let Some(sid) = shared.find(subnqn) else {
            tracing::info!(peer = %self.peer, subnqn, "Connect to an unknown subsystem");
            return Err(invalid(ParamIn::Data, ipo::DATA_SUBNQN));
        };
        if let SubsysId::Nvm(k) = sid {
            let e = &shared.subsystems[k];
            if !e.listeners.contains(&self.local) {
                tracing::info!(peer = %self.peer, subnqn, local = %self.local, "Connect on a listener of another subsystem");
                return Err(invalid(ParamIn::Data, ipo::DATA_SUBNQN));
            }
            if hostnqn.is_empty() && !e.allow_any_host {
                tracing::warn!(peer = %self.peer, subnqn, "Connect with an empty host NQN refused: the subsystem allows only listed hosts");
                return Err((fabrics_status(fabrics_sc::CONNECT_INVALID_HOST), 0));
            }
            if !e.allows(hostnqn) {
                tracing::warn!(peer = %self.peer, subnqn, hostnqn, "Connect refused: host not allowed by the subsystem");
                return Err((fabrics_status(fabrics_sc::CONNECT_INVALID_HOST), 0));
            }
        }
        if cmd.sqsize == 0 {
            return Err(invalid(ParamIn::Command, ipo::SQSIZE));
        }
        // A queue of an NVM subsystem takes a place among the data hosts'
        // connections (discovery and handshakes have their own budget).
        let data_slot = match sid {
            SubsysId::Discovery => None,
            SubsysId::Nvm(_) => {
                let max = shared.opts.max_connections;
                match crate::shared::DataSlot::take(&shared.data_conns, max) {
                    Some(d) => Some(d),
                    None => {
                        tracing::warn!(peer = %self.peer, subnqn, hostnqn, max_connections = max, "Connect refused: max_connections queues of NVM subsystems are connected");
                        return Err((fabrics_status(fabrics_sc::CONTROLLER_BUSY), 0));
                    }
                }
            }
        };
        let entries = cmd.queue_entries();
        let me = ConnRef {
            thread: self.thread,
            conn: self.id,
        };
        let cntlid;
        if cmd.qid == 0 {
            if entries > shared.opts.max_aq_depth as u32 {
                return Err(invalid(ParamIn::Command, ipo::SQSIZE));
            }
            if data.cntlid != CNTLID_DYNAMIC {
                return Err(invalid(ParamIn::Data, ipo::DATA_CNTLID));
            }
            let model = shared.subsys(sid);
            let host = hostnqn.to_string();
            let mut slot_ctrl = None;
            let kato = if sid == SubsysId::Discovery && cmd.kato == 0 {
                DISCOVERY_KATO_MS
            } else {
                cmd.kato
            };
            let id = shared.table().insert(|id| {
                let mut c = Ctrl::new(model, id);
                c.set_kato(kato);
                let c = Arc::new(Mutex::new(c));
                slot_ctrl = Some(c.clone());
                CtrlEntry {
                    subsys: sid,
                    hostnqn: host,
                    ctrl: c,
                    io: Vec::new(),
                }
            });
            let (Some(id), Some(ctrl)) = (id, slot_ctrl) else {
                return Err((fabrics_status(fabrics_sc::CONTROLLER_BUSY), 0));
            };
            cntlid = id;
            self.kato = Duration::from_millis(kato as u64);
            self.last_admin = self.now;
            self.icd_max = shared.opts.admin_in_capsule_data_size;
            self.bound = Bound::Admin {
                cntlid,
                ctrl,
                subsys: sid,
            };
            tracing::info!(peer = %self.peer, subnqn, hostnqn, cntlid, kato_ms = kato, "admin queue connected");
        } else {
            if sid == SubsysId::Discovery {
                return Err((fabrics_status(fabrics_sc::INVALID_QUEUE_TYPE), 0));
            }
            let mut t = shared.table();
            let Some(e) = t
                .map
                .get_mut(&data.cntlid)
                .filter(|e| e.subsys == sid && e.hostnqn == hostnqn)
            else {
                return Err(invalid(ParamIn::Data, ipo::DATA_CNTLID));
            };
            let ctrl = lock(&e.ctrl);
            if !ctrl.is_running() {
                return Err((gen(generic::COMMAND_SEQUENCE_ERROR), 0));
            }
            if cmd.qid > ctrl.io_queues_granted() || e.io.iter().any(|(q, _)| *q == cmd.qid) {
                return Err(invalid(ParamIn::Command, ipo::QID));
            }
            if entries > shared.subsys(sid).mqes() as u32 + 1 {
                return Err(invalid(ParamIn::Command, ipo::SQSIZE));
            }
            let q = match ctrl.new_io_queue(cmd.qid, entries) {
                Ok(q) => q,
                Err(err) => {
                    tracing::error!(error = %err, "I/O queue not created");
                    return Err((gen(generic::INTERNAL_ERROR), 0));
                }
            };
            drop(ctrl);
            e.io.push((cmd.qid, me));
            cntlid = data.cntlid;
            self.io = Some(q);
            self.icd_max = shared.opts.in_capsule_data_size;
            self.bound = Bound::Io {
                cntlid,
                qid: cmd.qid,
            };
            tracing::debug!(peer = %self.peer, cntlid, qid = cmd.qid, entries, "I/O queue connected");
        }
        let _ = ctx;
        if let Some(d) = data_slot {
            d.keep();
            self.data_slot = true;
        }
        self.qid = cmd.qid;
        self.entries = entries as u16;
        self.flow_off = cmd.cattr & CATTR_DISABLE_SQ_FLOW != 0;
        self.slots = (0..entries).map(|_| Slot::new()).collect();
        self.free = (0..entries as u16).rev().collect();
        self.done = Vec::with_capacity(entries as usize);
        self.sqhd = 0;
        Ok(cntlid)
    }

    /// A command in slot `i` whose capsule (with `icd` bytes of data) is
    /// in.
    fn command(&mut self, ctx: &mut ThreadCtx, i: u16, icd: u32) {
        let s = &self.slots[i as usize];
        let sqe = s.sqe;
        if let Some(st) = s.err {
            return self.finish(i, st, 0, 0);
        }
        if sqe.opc == FABRICS_OPCODE {
            return self.fabrics(ctx, i, &sqe);
        }
        match self.bound {
            Bound::Admin { .. } => self.admin(ctx, i, &sqe, icd),
            Bound::Io { .. } => self.nvm(i, &sqe, icd),
            Bound::None => self.finish(i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0),
        }
    }

    fn fabrics(&mut self, ctx: &mut ThreadCtx, i: u16, sqe: &Sqe) {
        let Bound::Admin { ctrl, .. } = &self.bound else {
            // Only Connect goes on an I/O queue, and only once.
            let st = match FcType::of(sqe) {
                Some(FcType::Disconnect) => {
                    let _ = DisconnectCmd::from_sqe(sqe);
                    self.finish(i, Status::SUCCESS, 0, 0);
                    return self.begin_close(ctx, "Disconnect");
                }
                Some(FcType::Connect) => gen(generic::COMMAND_SEQUENCE_ERROR),
                _ => gen(generic::INVALID_OPCODE),
            };
            return self.finish(i, st, 0, 0);
        };
        let ctrl = ctrl.clone();
        self.last_admin = self.now;
        // The controller's I/O queues still connected (a reset or shutdown
        // waits for them to close).
        let io_queues = |c: &Self| match c.bound {
            Bound::Admin { cntlid, .. } => {
                c.shared.table().map.get(&cntlid).map_or(0, |e| e.io.len())
            }
            _ => 0,
        };
        match FcType::of(sqe) {
            Some(FcType::PropertyGet) => {
                let c = PropertyGetCmd::from_sqe(sqe);
                let r = match c.size() {
                    Some(sz) => {
                        let n = io_queues(self);
                        lock(&ctrl).property_get(c.ofst, sz, n)
                    }
                    None => Err(gen(generic::INVALID_FIELD)),
                };
                match r {
                    Ok(v) => self.finish(i, Status::SUCCESS, v as u32, (v >> 32) as u32),
                    Err(st) => self.finish(i, st, 0, 0),
                }
            }
            Some(FcType::PropertySet) => {
                let c = PropertySetCmd::from_sqe(sqe);
                let r = match c.size() {
                    Some(sz) => {
                        let n = io_queues(self);
                        lock(&ctrl).property_set(c.ofst, sz, c.value, n)
                    }
                    None => Err(gen(generic::INVALID_FIELD)),
                };
                if let (Ok(true), Bound::Admin { cntlid, .. }) = (r, &self.bound) {
                    stop_io_queues(ctx, &self.shared, *cntlid);
                }
                self.finish(i, r.err().unwrap_or(Status::SUCCESS), 0, 0);
            }
            Some(FcType::Disconnect) => {
                self.finish(i, Status::SUCCESS, 0, 0);
                self.begin_close(ctx, "Disconnect");
            }
            Some(FcType::Connect) => self.finish(i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0),
            _ => self.finish(i, gen(generic::INVALID_OPCODE), 0, 0),
        }
    }

    /// The SGL of a command moving `want` bytes; `to_host`: its data goes
    /// to the host. In-capsule data (`icd` bytes) is only for writes.
    fn data_sgl(sqe: &Sqe, want: u32, to_host: bool, icd: u32) -> Result<Sgl, Status> {
        let sgl = Sgl::from_sqe(sqe).map_err(|e| e.status())?;
        match sgl {
            Sgl::InCapsule { .. } if to_host => Err(gen(generic::INVALID_FIELD)),
            Sgl::InCapsule { offset, .. } if offset != 0 => Err(gen(generic::SGL_OFFSET_INVALID)),
            Sgl::InCapsule { len, .. } if len < want || len > icd => {
                Err(gen(generic::DATA_SGL_LENGTH_INVALID))
            }
            Sgl::Transport { len } if len < want => Err(gen(generic::DATA_SGL_LENGTH_INVALID)),
            Sgl::Address { .. } => Err(gen(generic::SGL_TYPE_INVALID)),
            ok => Ok(ok),
        }
    }

    fn admin(&mut self, ctx: &mut ThreadCtx, i: u16, sqe: &Sqe, icd: u32) {
        let Bound::Admin { ctrl, subsys, .. } = &self.bound else {
            return;
        };
        let (ctrl, subsys) = (ctrl.clone(), *subsys);
        self.last_admin = self.now;
        // Data direction from the opcode's low bits (01b: to the
        // controller, 10b: to the host).
        let dir = sqe.opc & 3;
        if dir == 1 {
            // No admin command of the model takes data from the host; the
            // capsule's data (if any) is ignored, data that would need an
            // R2T is refused.
            if let Ok(Sgl::Transport { len }) = Sgl::from_sqe(sqe) {
                if len > 0 {
                    return self.finish(i, gen(generic::INVALID_FIELD), 0, 0);
                }
            }
            let _ = icd;
        }
        // The table before the controller (the order Connect takes them).
        let (io_exist, hostnqn) = {
            let Bound::Admin { cntlid, .. } = &self.bound else {
                return;
            };
            let t = self.shared.table();
            let e = t.map.get(cntlid);
            (
                e.is_some_and(|e| !e.io.is_empty()),
                e.map(|e| e.hostnqn.clone()).unwrap_or_default(),
            )
        };
        let mut c = lock(&ctrl);
        if !c.is_running() {
            drop(c);
            return self.finish(i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        }
        let outcome =
            if sqe.opc == AdminOpcode::GetLogPage as u8 && sqe.cdw10 as u8 == LID_DISCOVERY {
                if subsys == SubsysId::Discovery {
                    crate::discovery::log_page(&self.shared, &hostnqn, sqe)
                } else {
                    Admin::Complete {
                        dw0: 0,
                        status: Status::specific(pollux_spec::status::specific::INVALID_LOG_PAGE),
                    }
                }
            } else {
                c.exec_admin(sqe, io_exist)
            };
        match outcome {
            Admin::Complete { dw0, status } => {
                // Set Features may have changed the Keep Alive Timeout.
                self.kato = self.kato_for(c.kato_ms());
                drop(c);
                self.finish(i, status, dw0, 0);
            }
            Admin::Data {
                data,
                xfer_len,
                then,
            } => {
                // The whole length the command asks for: what the log
                // (or structure) has, then zeros. Sending less made a
                // host see a short transfer (pollux's failed the command).
                let len = xfer_len as u32;
                let sgl = match Self::data_sgl(sqe, len, true, 0) {
                    Ok(s) => s,
                    Err(st) => {
                        drop(c);
                        return self.finish(i, st, 0, 0);
                    }
                };
                let _ = sgl;
                if let Some(t) = then {
                    c.data_sent(t);
                }
                drop(c);
                if len == 0 {
                    return self.finish(i, Status::SUCCESS, 0, 0);
                }
                if !self.slot_buf(i, xfer_len, false) {
                    return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
                }
                if let Some(b) = self.slots[i as usize].buf.as_mut() {
                    let n = data.len().min(xfer_len);
                    let (head, tail) = b.as_mut_slice().split_at_mut(n);
                    head.copy_from_slice(&data[..n]);
                    tail.fill(0);
                }
                self.send_data(i, len);
            }
            Admin::Held => {
                drop(c);
                self.slots[i as usize].st = St::Held;
            }
            Admin::NotAborted => {
                drop(c);
                self.finish(i, Status::SUCCESS, 1, 0);
            }
            Admin::Unsupported => {
                drop(c);
                self.finish(i, gen(generic::INVALID_OPCODE), 0, 0);
            }
        }
        // Events the command may have released (e.g. a log page read).
        while let Some((cid, dw0)) = lock(&ctrl).next_event() {
            if let Some(k) = self
                .slots
                .iter()
                .position(|s| s.st == St::Held && s.cid == cid)
            {
                self.finish(k as u16, Status::SUCCESS, dw0, 0);
            }
        }
        let _ = ctx;
    }

    fn nvm(&mut self, i: u16, sqe: &Sqe, icd: u32) {
        let Some(q) = self.io.as_ref() else {
            return self.finish(i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        };
        let cmd = match q.check(sqe) {
            Ok(c) => c,
            Err(st) => return self.finish(i, st, 0, 0),
        };
        let xfer = model::io_xfer_len(&cmd) as u32;
        let to_host = model::io_to_host(&cmd);
        let s = &mut self.slots[i as usize];
        s.io = Some(cmd);
        s.xfer = xfer;
        if xfer == 0 {
            return self.submit(i, None);
        }
        let sgl = match Self::data_sgl(sqe, xfer, to_host, self.icd_max.min(icd)) {
            Ok(s) => s,
            Err(st) => return self.finish(i, st, 0, 0),
        };
        match sgl {
            Sgl::InCapsule { .. } => {
                // The data is in the slot's buffer already.
                if let Some(b) = s.buf.as_mut() {
                    b.set_len(xfer as usize);
                }
                self.submit(i, Some(xfer));
            }
            Sgl::Transport { .. } => {
                // A buffer from the pool, or wait for one (after those
                // already waiting).
                if !self.waiting.is_empty() || !self.slot_buf(i, xfer as usize, true) {
                    self.wait_buf(i);
                } else if to_host {
                    self.submit(i, Some(xfer));
                } else {
                    self.transfer(i);
                }
            }
            Sgl::Address { .. } => self.finish(i, gen(generic::SGL_TYPE_INVALID), 0, 0),
        }
    }

    /// Slot `i` has its data buffer: a read goes to the bdev, a write
    /// asks for its data (R2T).
    fn transfer(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        let xfer = s.xfer;
        if s.io.is_some_and(|c| model::io_to_host(&c)) {
            return self.submit(i, Some(xfer));
        }
        s.st = St::AwaitH2C;
        s.got = 0;
        s.r2t_at = Some(self.now);
        self.r2t_out += 1;
        let r = R2T::new(s.cid, i, 0, xfer, self.digests.header);
        let l = PduLayout::new(PduType::R2T, self.digests, 0, 0);
        if let Some(l) = l {
            self.tx.push_header(r.as_bytes(), &l);
        }
    }

    /// All H2C data of slot `i` is in.
    fn write_data_in(&mut self, i: u16) {
        self.r2t_out = self.r2t_out.saturating_sub(1);
        let s = &self.slots[i as usize];
        if let Some(st) = s.err {
            return self.finish(i, st, 0, 0);
        }
        let xfer = s.xfer;
        self.submit(i, Some(xfer));
    }

    /// Hands slot `i`'s command (with its first `len` buffer bytes as
    /// data) to the I/O queue.
    fn submit(&mut self, i: u16, len: Option<u32>) {
        let (Some(q), Some(s)) = (self.io.as_mut(), self.slots.get_mut(i as usize)) else {
            return;
        };
        let Some(cmd) = s.io else {
            return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let seg = match len {
            Some(n) => match s.buf.take() {
                Some(b) => {
                    let (lent, seg) = b.lend(n as usize);
                    s.lent = Some(lent);
                    Some(seg)
                }
                None => return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0),
            },
            None => None,
        };
        s.st = St::Bdev;
        // SAFETY: the segment is the slot's buffer, now `Lent`: nothing
        // touches it until `poll` delivers tag `i` (then it is reclaimed)
        // or the queue is dropped (first, in `Drop for Conn`).
        let r = unsafe { q.submit(i as u32, &cmd, seg) };
        if r.is_err() {
            // Refused before it started: the buffer is ours again.
            if let Some(l) = s.lent.take() {
                // SAFETY: the queue refused the command: it never saw the
                // segment.
                s.buf = Some(unsafe { l.reclaim() });
            }
            self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
        }
    }

    fn poll_io(&mut self) -> bool {
        let Some(q) = self.io.as_mut() else {
            return false;
        };
        let mut done = std::mem::take(&mut self.done);
        let n = q.poll(&mut |tag, st| done.push((tag, st)));
        if n > 0 {
            q.publish();
        }
        for &(tag, st) in &done {
            let i = tag as u16;
            let Some(s) = self.slots.get_mut(i as usize) else {
                continue;
            };
            if let Some(l) = s.lent.take() {
                // SAFETY: the I/O queue delivered this tag: the bdev is
                // done with the buffer.
                s.buf = Some(unsafe { l.reclaim() });
            }
            let read = s.io.is_some_and(|c| model::io_to_host(&c));
            if st.is_success() && read && s.xfer > 0 {
                let len = s.xfer;
                self.send_data(i, len);
            } else {
                self.finish(i, st, 0, 0);
            }
        }
        done.clear();
        self.done = done;
        n > 0
    }

    // ------------------------------------------------------------------
    // Responses
    // ------------------------------------------------------------------

    fn cqe(&self, cid: u16, status: Status, dw0: u32, dw1: u32) -> Cqe {
        Cqe {
            dw0,
            dw1,
            sqhd: self.sqhd,
            sqid: self.qid,
            cid,
            status: status.0 << 1,
        }
    }

    /// Queues a response capsule; frees slot `slot` (if any) once sent.
    fn respond(&mut self, slot: Option<u16>, cid: u16, status: Status, dw0: u32, dw1: u32) {
        if self.terminated {
            if let Some(i) = slot {
                self.release(i);
            }
            return;
        }
        let r = CapsuleResp::new(self.cqe(cid, status, dw0, dw1), self.digests.header);
        if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
            self.tx.push_header(r.as_bytes(), &l);
        }
        if let Some(i) = slot {
            self.slots[i as usize].st = St::Tx;
            self.tx.push(Seg::Release { slot: i });
        }
    }

    /// Completes slot `i`'s command with `status`.
    fn finish(&mut self, i: u16, status: Status, dw0: u32, dw1: u32) {
        let cid = self.slots[i as usize].cid;
        self.respond(Some(i), cid, status, dw0, dw1);
    }

    /// Sends the first `len` bytes of slot `i`'s buffer as the command's
    /// data, then its successful completion (SUCCESS flag without SQ
    /// flow control, else a response capsule).
    fn send_data(&mut self, i: u16, len: u32) {
        if self.terminated {
            return self.release(i);
        }
        let success = self.flow_off;
        let cid = self.slots[i as usize].cid;
        let Some((h, l)) = C2HData::new(cid, 0, len, true, success, self.digests, self.hpda) else {
            return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let s = &mut self.slots[i as usize];
        let Some(b) = s.buf.take() else {
            return self.finish(i, gen(generic::INTERNAL_ERROR), 0, 0);
        };
        let dd = l.ddgst.then(|| {
            let mut d = DataDigest::new();
            d.update(&b.as_slice()[..len as usize]);
            d.value()
        });
        let (lent, seg) = b.lend(len as usize);
        s.lent = Some(lent);
        s.st = St::Tx;
        self.tx.push_header(h.as_bytes(), &l);
        self.tx.push(Seg::Data {
            ptr: seg.ptr,
            len: seg.len,
        });
        if let Some(d) = dd {
            self.tx.push_bytes(&d.to_le_bytes());
        }
        if !success {
            let r = CapsuleResp::new(self.cqe(cid, Status::SUCCESS, 0, 0), self.digests.header);
            if let Some(l) = PduLayout::new(PduType::CapsuleResp, self.digests, 0, 0) {
                self.tx.push_header(r.as_bytes(), &l);
            }
        }
        self.tx.push(Seg::Release { slot: i });
        debug_assert!(h.ch.flags & flags::LAST_PDU != 0);
    }

    /// Queues a C2HTermReq for a protocol error and closes.
    fn fatal(&mut self, ctx: &mut ThreadCtx, f: Fatal, header: &[u8]) {
        tracing::warn!(peer = %self.peer, fes = %f.fes, fei = f.fei, "protocol error: {}; terminating the connection", f.why);
        let n = header.len().min(TERM_REQ_MAX_DATA as usize);
        let t = TermReq::new(Role::Controller, f.fes, f.fei, n);
        self.tx.push_bytes(t.as_bytes());
        self.tx.push_bytes(&header[..n]);
        self.terminated = true;
        self.begin_close(ctx, "protocol error");
    }

    // ------------------------------------------------------------------
    // Send
    // ------------------------------------------------------------------

    #[inline]
    fn release(&mut self, i: u16) {
        let s = &mut self.slots[i as usize];
        if let Some(l) = s.lent.take() {
            // SAFETY: every byte of the buffer queued for the socket was
            // handed to the kernel by a copying send, which has returned.
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

    fn flush(&mut self, ctx: &mut ThreadCtx) -> bool {
        let mut busy = false;
        let max_iov = self.shared.opts.send_iov.clamp(1, sock::MAX_IOV);
        loop {
            while let Some(Seg::Release { slot }) = self.tx.front() {
                self.tx.pop_front();
                self.release(slot);
            }
            if self.tx.is_empty() {
                self.tx.bytes.clear();
                self.tx.front = 0;
                break;
            }
            self.iov.clear();
            for (k, seg) in self.tx.pending().iter().enumerate() {
                let skip = if k == 0 { self.tx.front } else { 0 };
                match *seg {
                    Seg::Bytes { start, len } => {
                        self.iov.push(libc::iovec {
                            iov_base: self.tx.bytes[start + skip..].as_ptr() as *mut _,
                            iov_len: len - skip,
                        });
                    }
                    Seg::Data { ptr, len, .. } => {
                        // SAFETY: `ptr` starts a lent slot buffer of at
                        // least `len` bytes, and `skip <= len`.
                        let base = unsafe { ptr.add(skip) };
                        self.iov.push(libc::iovec {
                            iov_base: base as *mut _,
                            iov_len: len - skip,
                        });
                    }
                    Seg::Release { .. } => {}
                }
                if self.iov.len() == max_iov {
                    break;
                }
            }
            // SAFETY: the iovecs point into `tx.bytes` (not modified until
            // the call returns) and into lent slot buffers (released only
            // once sent).
            let r = unsafe { self.sock.send_iov(&self.iov) };
            let sent = match r {
                Ok(0) => {
                    // (The data timeout closes a queue stalled too long.)
                    if self.tx_stalled_since.is_none() {
                        self.tx_stalled_since = Some(self.now);
                    }
                    break;
                }
                Ok(k) => {
                    self.tx_stalled_since = None;
                    k
                }
                Err(e) => {
                    self.close_now(ctx, &format!("send failed: {e}"));
                    return true;
                }
            };
            busy = true;
            self.advance(sent);
        }
        busy
    }

    /// `sent` bytes of the queue went out.
    fn advance(&mut self, mut sent: usize) {
        while sent > 0 {
            let Some(seg) = self.tx.front() else {
                break;
            };
            let len = match seg {
                Seg::Bytes { len, .. } | Seg::Data { len, .. } => len,
                Seg::Release { slot } => {
                    self.tx.pop_front();
                    self.release(slot);
                    continue;
                }
            };
            let left = len - self.tx.front;
            if sent >= left {
                sent -= left;
                self.tx.front = 0;
                self.tx.pop_front();
            } else {
                self.tx.front += sent;
                sent = 0;
            }
        }
    }
}

fn internal(what: &str) -> Fatal {
    Fatal {
        fes: Fes::INVALID_HEADER_FIELD,
        fei: 0,
        why: format!("internal: {what}"),
    }
}

/// Removes controller `cntlid` and closes its I/O queues' connections
/// (on their threads).
pub(crate) fn teardown(ctx: &mut ThreadCtx, shared: &Shared, cntlid: u16) {
    let entry = shared.table().map.remove(&cntlid);
    let Some(e) = entry else {
        return;
    };
    tracing::info!(cntlid, host = %e.hostnqn, io_queues = e.io.len(), "controller torn down");
    for (_, r) in e.io {
        let conn = r.conn;
        if let Err(err) = ctx.send(r.thread, move |ctx| crate::server::close_conn(ctx, conn)) {
            tracing::warn!(
                thread = r.thread,
                "closing an I/O queue of controller {cntlid}: {err}"
            );
        }
    }
}

/// Closes the I/O queues' connections of controller `cntlid` (on their
/// threads), which a reset or shutdown stops: each leaves the controller's
/// entry as it closes (`Conn::detach`), and the controller completes the
/// reset or shutdown once none is left (see `model::Ctrl`).
pub(crate) fn stop_io_queues(ctx: &mut ThreadCtx, shared: &Shared, cntlid: u16) {
    let queues = match shared.table().map.get(&cntlid) {
        Some(e) => e.io.clone(),
        None => return,
    };
    tracing::info!(
        cntlid,
        io_queues = queues.len(),
        "controller reset or shut down: closing its I/O queues"
    );
    for (qid, r) in queues {
        let conn = r.conn;
        if let Err(err) = ctx.send(r.thread, move |ctx| crate::server::close_conn(ctx, conn)) {
            tracing::warn!(
                cntlid,
                qid,
                thread = r.thread,
                "closing an I/O queue: {err}"
            );
            if let Some(e) = shared.table().map.get_mut(&cntlid) {
                e.io.retain(|(q, _)| *q != qid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pollux_spec::tcp::write_header;

    /// What `Tx` queues for a header is what `write_header` writes, with
    /// and without digests and padding.
    #[test]
    fn queued_header_bytes_match_write_header() {
        for dgst in 0..4 {
            let digests = Digests::from_dgst(dgst);
            for pda in [0, 1, 3, 31] {
                for len in [0, 1, 4096] {
                    let (h, l) = C2HData::new(7, 0, len.max(1), true, true, digests, pda).unwrap();
                    let r = CapsuleResp::new(Cqe::default(), digests.header);
                    let lr = PduLayout::new(PduType::CapsuleResp, digests, pda, 0).unwrap();
                    for (hdr, lay) in [(h.as_bytes(), l), (r.as_bytes(), lr)] {
                        let mut tx = Tx::default();
                        tx.push_header(hdr, &lay);
                        let mut want = [0u8; 256];
                        let n = write_header(hdr, &lay, &mut want).unwrap();
                        assert_eq!(tx.bytes, &want[..n], "{lay:?}");
                        assert_eq!(tx.pending().len(), 1);
                    }
                }
            }
        }
        // A header of the wrong length is refused.
        let l = PduLayout::new(PduType::CapsuleResp, Digests::NONE, 0, 0).unwrap();
        let mut tx = Tx::default();
        tx.push_header(&[0u8; 8], &l);
        assert!(tx.is_empty() && tx.bytes.is_empty());
    }

    /// The segment queue: bytes merge only into a pending segment; a
    /// drained queue starts over.
    #[test]
    fn tx_queue_merges_pending_bytes_and_restarts_when_drained() {
        let mut tx = Tx::default();
        tx.push_bytes(b"ab");
        tx.push_bytes(b"cd");
        assert_eq!(tx.pending().len(), 1);
        tx.push(Seg::Release { slot: 3 });
        tx.push_bytes(b"ef");
        assert_eq!(tx.pending().len(), 3);
        tx.pop_front();
        assert!(matches!(tx.front(), Some(Seg::Release { slot: 3 })));
        tx.pop_front();
        assert!(matches!(tx.front(), Some(Seg::Bytes { start: 4, len: 2 })));
        tx.pop_front();
        assert!(tx.is_empty() && tx.front().is_none());
        assert_eq!((tx.segs.len(), tx.head), (0, 0));
        // The sent "ef" is not extended: the new bytes are a new segment.
        tx.push_bytes(b"gh");
        assert_eq!(tx.pending().len(), 1);
        assert!(matches!(tx.front(), Some(Seg::Bytes { start: 6, len: 2 })));
    }
}
