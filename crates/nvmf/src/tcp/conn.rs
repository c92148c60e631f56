//! One NVMe/TCP connection (one queue), owned by one runtime thread: a
//! [`Conn`] is the core's queue pair ([`Qpair`]: slots, buffers,
//! commands) and its TCP half ([`Tcp`]: socket, PDUs, send queue), which
//! implements what the core asks of a transport ([`QueueTransport`](crate::qpair::QueueTransport)).
//!
//! Receive: as much as the socket has goes into the connection's receive
//! buffer in one `read` (large data straight into the command's buffer
//! with one `readv` when `direct_receive` is on), and the engine
//! ([`TargetQueue`]) takes PDUs out of it: the common header checked, the
//! header parsed (header digest included), H2CData checked against its
//! R2T, then the PDU's data, with its data digest computed on the way,
//! which goes where it belongs (a command's buffer, the Connect data, or
//! nowhere). A PDU never has to fit the receive buffer.
//!
//! Commands: each queue has SQSIZE + 1 command slots (the core's); a
//! slot's index is the R2T transfer tag. Writes arrive in the capsule or through one R2T
//! covering the whole transfer (H2CData PDUs must arrive in order, within
//! the command's data); reads go out as one C2HData PDU, with the SUCCESS
//! flag and no response capsule when the host disabled SQ flow control.
//!
//! Send: the engine's send queue: PDU headers (and response capsules,
//! digests, padding) are copied into one byte buffer, data is referenced
//! in place (the slot's buffer lent until its mark is reached), and
//! everything queued goes out in one `sendmsg` per poll.
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
//! Data buffers come from the transport's pool (`pool`) through the
//! thread's cache and go back when the command ends (the core's
//! `Qpair` takes and gives them). A command whose data needs a
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
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_runtime::ThreadCtx;
use pollux_spec::status::generic;
use pollux_spec::tcp::Fes;
use pollux_spec::{Sqe, Status};
use pollux_tcp::engine::ic::TargetLimits;
use pollux_tcp::engine::target::TargetQueue;

use crate::pool::Cache;
use crate::qpair::{Bound, Qpair, St};
use crate::shared::Shared;
use crate::tcp::sock::{PosixSock, RecvGates, Wire};

/// How long a closing connection waits for the host's FIN.
pub(crate) const LINGER: Duration = Duration::from_secs(2);
/// Reads per poll at most (then other connections get their turn).
pub(crate) const READS_PER_POLL: usize = 4;
/// Empty receives in a row after which a connection is read only every
/// [`QUIET_STRIDE`]-th poll: an idle admin queue would otherwise cost a
/// failed `readv` on every pass of its thread (an active I/O queue, even
/// at queue depth 1, never goes this long without data).
pub(crate) const QUIET_AFTER: u32 = 1024;
pub(crate) const QUIET_STRIDE: u32 = 16;

/// Where a PDU's data goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sink {
    Discard,
    /// The Connect data (`Qpair::scratch`).
    Scratch,
    Slot(u16),
}

/// Where the data of a PDU goes (a command capsule's or an H2CData's).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dest {
    pub sink: Sink,
    /// The command slot the PDU belongs to (also when its data is
    /// discarded).
    pub slot: Option<u16>,
    /// Where its first data byte goes in the sink.
    pub base: u32,
    /// A command capsule's in-capsule data length.
    pub data_len: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
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
pub enum Stage {
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

/// The TCP half of a connection: the socket, the receive buffer, the
/// NVMe/TCP engine's controller end ([`TargetQueue`]: PDU reassembly and
/// checks, H2CData bookkeeping, the send queue). Its methods take the
/// connection's [`Qpair`] beside it.
pub(crate) struct Tcp<W: Wire> {
    pub sock: W,
    pub phase: Phase,
    /// When the current handshake stage began: accepted (waiting for
    /// ICReq), then ICResp queued (waiting for the queue's Connect).
    pub stage_since: Instant,
    /// Polls since the last receive that got data (see [`QUIET_AFTER`]).
    pub quiet: u32,
    /// When data last arrived (or the connection was accepted): the
    /// longest idle unbound connection is evicted first.
    pub last_rx: Instant,
    /// Slots with an R2T out (data timeout).
    pub r2t_out: u32,
    /// When each slot's R2T was queued (data timeout; as many as the
    /// queue's slots; the slot's index is its TTAG).
    pub r2t_at: Vec<Option<Instant>>,
    /// Since when the socket has taken nothing of a non-empty send queue.
    pub tx_stalled_since: Option<Instant>,
    /// The engine: what arrives is checked and reassembled by it, what
    /// goes out is queued in it (`eng.tx`).
    pub eng: TargetQueue,
    pub rx: Vec<u8>,
    pub rs: usize,
    pub re: usize,
    /// Where the data of the PDU arriving in pieces goes (between its
    /// header and its end).
    pub arriving: Option<Dest>,
    /// The SQE of a command capsule arriving in pieces on a queue not
    /// connected yet (no slot holds it).
    pub unbound_sqe: Sqe,
    /// The iovecs of one `sendmsg`, rebuilt per call (kept to spare a
    /// zeroed array of `MAX_IOV` on every flush; grows on first use).
    pub iov: Vec<libc::iovec>,
    pub linger_until: Option<Instant>,
    pub fin_sent: bool,
    pub draining: bool,
    /// A C2HTermReq is queued: nothing more is sent after it (commands
    /// still completing are dropped).
    pub terminated: bool,
}

/// One connection, over a socket (`W`: a [`PosixSock`], a `uring` socket,
/// or any [`Wire`]).
///
/// The queue pair is dropped first (its bdev requests waited for, its
/// buffers taken back), then the TCP half, which sends nothing more: the
/// two are private to this file and never part.
pub(crate) struct Conn<W: Wire = PosixSock> {
    qp: Qpair,
    tcp: Tcp<W>,
}

/// A fatal protocol error: the TermReq's FES and FEI.
pub(crate) struct Fatal {
    pub fes: Fes,
    pub fei: u32,
    pub why: String,
}

impl Conn<PosixSock> {
    pub fn new(
        id: u64,
        sock: TcpStream,
        gates: Option<&Rc<RecvGates>>,
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> std::io::Result<Conn<PosixSock>> {
        sock.set_nonblocking(true)?;
        sock.set_nodelay(true)?;
        if shared.opts.busy_poll_us > 0 {
            use std::os::fd::AsFd;
            // (Without CAP_NET_ADMIN the kernel refuses values above
            // net.core.busy_read: the connection goes on without.)
            if let Err(e) =
                pollux_tcp::sockopt::set_busy_poll(sock.as_fd(), shared.opts.busy_poll_us)
            {
                tracing::warn!("SO_BUSY_POLL {} us: {e}", shared.opts.busy_poll_us);
            }
        }
        if shared.opts.send_buffer > 0 {
            set_send_buffer(&sock, shared.opts.send_buffer);
        }
        let local = sock.local_addr()?;
        let peer = sock.peer_addr()?;
        Ok(Conn::with_wire(
            id,
            PosixSock::new(sock, gates)?,
            (local, peer),
            shared,
            cache,
            thread,
            now,
        ))
    }

    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.tcp.sock.as_fd()
    }
}

/// Fixes `sock`'s send buffer at `bytes` (`send_buffer`); a kernel that
/// refuses, or grants less (`net.core.wmem_max`), is logged and the
/// connection goes on with what it has.
fn set_send_buffer(sock: &TcpStream, bytes: u32) {
    use pollux_tcp::sockopt;
    use std::os::fd::AsFd;
    if let Err(e) = sockopt::set_send_buffer(sock.as_fd(), bytes) {
        tracing::warn!("send_buffer {bytes}: SO_SNDBUF: {e}");
        return;
    }
    // (The kernel doubles what it grants.)
    match sockopt::send_buffer(sock.as_fd()) {
        Ok(got) if u64::from(got) < 2 * u64::from(bytes) => tracing::warn!(
            "send_buffer {bytes}: the kernel granted {} (net.core.wmem_max caps it)",
            got / 2
        ),
        _ => {}
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
        let o = &shared.opts;
        let limits = TargetLimits {
            maxh2cdata: o.max_h2c_data,
            // The queue type is not known until Connect.
            icd: o.admin_in_capsule_data_size.max(o.in_capsule_data_size),
        };
        let tcp = Tcp {
            sock,
            phase: Phase::Init,
            stage_since: now,
            quiet: 0,
            last_rx: now,
            r2t_out: 0,
            r2t_at: Vec::new(),
            tx_stalled_since: None,
            // No transfer tags until Connect gives the queue its slots.
            eng: TargetQueue::new(limits, 0),
            rx,
            rs: 0,
            re: 0,
            arriving: None,
            unbound_sqe: Sqe::default(),
            iov: Vec::new(),
            linger_until: None,
            fin_sent: false,
            draining: false,
            terminated: false,
        };
        Conn {
            qp: Qpair::new(id, (local, peer), shared, cache, thread, now),
            tcp,
        }
    }

    /// The connection's id (unique on its thread).
    pub fn id(&self) -> u64 {
        self.qp.id
    }

    pub fn is_closed(&self) -> bool {
        self.tcp.phase == Phase::Closed
    }

    /// Nothing of this connection is at a bdev any more: dropping it does
    /// not wait. A closed connection stays in its thread's table (polled
    /// by [`Conn::poll`], which then only reaps) until it is, so a slow
    /// backend never holds the thread, and the other connections on it,
    /// while a connection goes away.
    pub fn is_settled(&self) -> bool {
        self.qp.is_settled()
    }

    /// The socket (tests drive the machine over memory through it).
    pub(crate) fn wire(&mut self) -> &mut W {
        &mut self.tcp.sock
    }

    /// What the connection holds that a peer's bytes could grow: bytes
    /// queued to send, send segments, the Connect data buffer, command
    /// slots, the receive buffer, data buffer bytes.
    pub(crate) fn footprint(&self) -> [usize; 6] {
        [
            self.tcp.eng.tx.own_len(),
            self.tcp.eng.tx.segments().count(),
            self.qp.scratch.capacity(),
            self.qp.slots.len(),
            self.tcp.rx.len(),
            self.qp.held,
        ]
    }

    /// Commands wait for data buffers.
    pub(crate) fn is_waiting(&self) -> bool {
        !self.qp.waiting.is_empty()
    }

    /// Work is pending that no socket readiness will announce: the
    /// thread must not sleep.
    pub fn needs_poll(&self) -> bool {
        self.tcp.needs_poll(&self.qp)
    }

    /// One pass: completions, receive (then the completions of what it
    /// received, if any finished at once), send.
    #[inline]
    pub fn poll(&mut self, ctx: &mut ThreadCtx) -> bool {
        self.tcp.poll(ctx, &mut self.qp)
    }

    /// Shutdown of the target: stop taking commands.
    pub fn drain(&mut self) {
        self.tcp.draining = true;
        // Commands still waiting for a data buffer are not started.
        self.qp.abandon_waiting();
    }

    /// Keep Alive Timeout expired on an admin queue.
    pub fn kato_expired(&self, now: Instant) -> bool {
        self.tcp.phase == Phase::Ready && self.qp.kato_expired(now)
    }

    /// DH-HMAC-CHAP failed (its last response out) or was not done
    /// within `auth_timeout`: the connection is to close now (logged,
    /// and an I/O queue's controller told to go, by `Qpair::auth_expired`).
    pub fn auth_expired(&mut self, ctx: &mut ThreadCtx, now: Instant) -> bool {
        let limit = self.qp.shared.opts.auth_timeout;
        self.tcp.phase == Phase::Ready
            && self.qp.auth.is_some()
            && self.qp.auth_expired(ctx, now, limit)
    }

    /// The DH pool's result for this queue's exchange (dropped if the
    /// connection is closing).
    pub fn auth_done(&mut self, ctx: &mut ThreadCtx, done: crate::auth::state::DhDone) {
        if self.tcp.phase == Phase::Ready {
            self.qp.auth_done(ctx, &mut self.tcp, done);
        }
    }

    /// The handshake stage this connection has spent longer in than the
    /// transport options allow, if any, and that limit.
    pub fn handshake_expired(&self, now: Instant) -> Option<(Stage, Duration)> {
        let o = &self.qp.shared.opts;
        let (stage, limit) = match self.tcp.phase {
            Phase::Init => (Stage::IcReq, o.icreq_timeout),
            Phase::Ready if matches!(self.qp.bound, Bound::None) => {
                (Stage::Connect, o.connect_timeout)
            }
            _ => return None,
        };
        (now.saturating_duration_since(self.tcp.stage_since) > limit).then_some((stage, limit))
    }

    /// The host's address.
    pub fn peer(&self) -> SocketAddr {
        self.qp.peer
    }

    /// Open and not bound to an NVM subsystem: in its handshake, a
    /// discovery controller's queue, or closing. These have their own
    /// budget (`max_unbound_connections`).
    pub fn is_unbound(&self) -> bool {
        self.tcp.phase != Phase::Closed && !self.qp.data_slot
    }

    /// Closing (its last bytes going out, or waiting for the host's FIN).
    pub fn is_closing(&self) -> bool {
        self.tcp.phase == Phase::Closing
    }

    /// When data last arrived (or the connection was accepted).
    pub fn last_rx(&self) -> Instant {
        self.tcp.last_rx
    }

    /// The thread's timer (every 100 ms): see [`Tcp::tick`].
    pub fn tick(&mut self, ctx: &mut ThreadCtx, now: Instant) {
        self.tcp.tick(ctx, &mut self.qp, now);
    }

    /// Linger deadline passed.
    pub fn linger_over(&self, now: Instant) -> bool {
        self.tcp.linger_over(now)
    }

    /// Closes at once (controller torn down elsewhere, or linger over).
    pub fn close_now(&mut self, ctx: &mut ThreadCtx, why: &str) {
        self.tcp.close_now(ctx, &mut self.qp, why);
    }

    /// Completes held Asynchronous Event Requests with the events of the
    /// controller (an admin queue; see `Qpair::deliver_events`). The
    /// responses go out at the connection's next poll.
    pub fn deliver_events(&mut self) {
        self.qp.deliver_events(&mut self.tcp);
    }
}

impl<W: Wire> Tcp<W> {
    /// Work is pending that no socket readiness will announce.
    #[inline]
    pub(crate) fn needs_poll(&self, qp: &Qpair) -> bool {
        !self.eng.tx.is_empty() || qp.has_work()
    }

    /// One pass of the connection whose queue pair is `qp`.
    pub(crate) fn poll(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) -> bool {
        if self.phase == Phase::Closed {
            return qp.settle();
        }
        qp.now = ctx.now();
        let mut busy = false;
        // (A wire whose sends complete later: their slots freed before
        // the commands that may reuse them arrive.)
        if let Some(r) = self.sock.sent() {
            busy |= self.sent(ctx, qp, r);
        }
        if qp.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
            busy |= qp.poll_io(self);
        }
        if !qp.waiting.is_empty() {
            busy |= qp.serve_waiting(self);
        }
        if matches!(self.phase, Phase::Init | Phase::Ready) && !self.draining {
            if self.quiet <= QUIET_AFTER {
                // Namespaces added or removed live: seen before the
                // commands that may name them.
                if let Some(q) = qp.io.as_mut() {
                    q.sync_namespaces();
                }
                let got = self.receive(ctx, qp);
                busy |= got;
                self.quiet = if got { 0 } else { self.quiet + 1 };
                // What the commands just received finished at once (null,
                // RAM) goes out with this pass's send, not the next one's:
                // at QD 1 that saves a pass and an empty receive per I/O.
                if got && qp.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
                    qp.poll_io(self);
                }
            } else if self.quiet == QUIET_AFTER + QUIET_STRIDE {
                self.quiet = QUIET_AFTER;
            } else {
                self.quiet += 1;
            }
        }
        if !self.eng.tx.is_empty() {
            busy |= self.flush(ctx, qp);
        }
        match self.phase {
            Phase::Closing => busy |= self.closing(ctx, qp),
            // Shutdown: finish what is in flight, then close.
            Phase::Ready | Phase::Init if self.draining && !self.needs_poll(qp) => {
                self.begin_close(ctx, qp, "target shutting down");
            }
            _ => {}
        }
        busy
    }

    /// The thread's timer (every 100 ms): completes commands whose R2T
    /// data has not arrived within `data_timeout` (Transient Transport
    /// Error: the transfer failed, a retry may succeed; their buffers come
    /// back once the response is sent), closes the connection if its host
    /// has taken nothing of the send queue for as long, and leaves the
    /// pool's active connections when it holds no buffer.
    pub(crate) fn tick(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, now: Instant) {
        let limit = qp.shared.opts.data_timeout;
        if self.r2t_out > 0 && self.phase == Phase::Ready && !self.terminated {
            // (Not the transfer whose data is arriving right now.)
            let arriving = self.arriving.and_then(|d| d.slot);
            let mut expired = 0u32;
            for i in 0..qp.slots.len() as u16 {
                let late = qp.slots[i as usize].st == St::AwaitData
                    && arriving != Some(i)
                    && self.r2t_at[i as usize]
                        .is_some_and(|at| now.saturating_duration_since(at) > limit);
                if late {
                    self.r2t_out -= 1;
                    // H2CData for it is a protocol error from now on (the
                    // engine's transfer ends as the slot leaves AwaitData).
                    self.eng.cancel(i);
                    expired += 1;
                    // DNR clear: the transfer failed, a retry may succeed.
                    let st = Status::new(
                        pollux_spec::status::sct::GENERIC,
                        generic::TRANSIENT_TRANSPORT_ERROR,
                        false,
                    );
                    qp.finish(self, i, st, 0, 0);
                }
            }
            if expired > 0 {
                tracing::warn!(
                    peer = %qp.peer,
                    conn = qp.id,
                    commands = expired,
                    timeout_ms = limit.as_millis() as u64,
                    "the data asked for with R2T did not arrive in time: commands completed with Transient Transport Error"
                );
            }
        }
        let stalled = self
            .tx_stalled_since
            .is_some_and(|at| now.saturating_duration_since(at) > limit);
        if stalled && !self.eng.tx.is_empty() && self.phase == Phase::Ready {
            tracing::warn!(
                peer = %qp.peer,
                conn = qp.id,
                timeout_ms = limit.as_millis() as u64,
                "the host has taken nothing of what is queued for it in time; closing the connection"
            );
            self.close_now(ctx, qp, "send queue stalled");
        }
        qp.tick_buffers();
    }

    /// Linger deadline passed.
    pub(crate) fn linger_over(&self, now: Instant) -> bool {
        self.linger_until.is_some_and(|d| now >= d)
    }

    /// Closes at once (controller torn down elsewhere, or linger over).
    pub(crate) fn close_now(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, why: &str) {
        if self.phase != Phase::Closed {
            tracing::debug!(peer = %qp.peer, conn = qp.id, why, "connection closed");
            qp.detach(ctx);
            let _ = self.sock.shutdown(Shutdown::Both);
            self.phase = Phase::Closed;
        }
    }

    /// Graceful close: send what is queued, FIN, wait for the host's FIN.
    pub(crate) fn begin_close(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, why: &str) {
        if matches!(self.phase, Phase::Closing | Phase::Closed) {
            return;
        }
        tracing::debug!(peer = %qp.peer, conn = qp.id, why, "closing connection");
        qp.detach(ctx);
        self.phase = Phase::Closing;
        self.linger_until = Some(qp.now + LINGER);
    }

    fn closing(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) -> bool {
        if !self.eng.tx.is_empty() || qp.io.as_ref().is_some_and(|q| q.outstanding() > 0) {
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
                    self.close_now(ctx, qp, "closed");
                    return true;
                }
                Ok(Some(_)) => busy = true,
                Ok(None) => break,
            }
        }
        if self.linger_over(qp.now) {
            self.close_now(ctx, qp, "linger time over");
        }
        busy
    }
}
