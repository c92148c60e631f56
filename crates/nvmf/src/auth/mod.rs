//! DH-HMAC-CHAP in-band authentication, the controller's side (NVMe
//! Base 2.x, 8.3.4.5; as Linux's `nvmet` and SPDK's `lib/nvmf/auth.c`):
//! Authentication Send and Receive on a queue whose host has a key, and
//! the gate that keeps every other command out until the exchange
//! succeeds. The messages and the cryptography are `pollux-auth`'s
//! (`CtrlAuth`, in `state`); this module moves them over the queue.
//!
//! - Connect of a host with a key answers AUTHREQ.ATR, and the queue
//!   (admin or I/O) gets a [`QueueAuth`]. Until the exchange succeeds,
//!   any command but Authentication Send/Receive completes with
//!   Authentication Required (an I/O queue's `io` waits inside the
//!   `QueueAuth`, so the I/O path tests nothing: `Qpair::nvm` finds no
//!   `io` and asks why here).
//! - A failed exchange (wrong secret, protocol error, Failure2 from the
//!   host) is logged at WARN with the peer and the NQNs; the Failure1
//!   goes out and the controller is torn down (as Linux's
//!   `nvmet_ctrl_fatal_error`): this queue closes, and an I/O queue's
//!   failure closes the admin queue too.
//! - An exchange not done within `auth_timeout` of Connect closes the
//!   connection (the transport's timer, as its handshake timeouts).
//! - A new AUTH_Negotiate on an authenticated queue starts a
//!   re-authentication; the queue keeps working meanwhile, and its
//!   failure tears the controller down as a first one's does.
use std::time::Instant;

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{fabrics_sc, fabrics_status, AuthCmd, FcType, Sgl};
use pollux_spec::status::generic;
use pollux_spec::{Sqe, Status};

use crate::qpair::{gen, Bound, Qpair, QueueTransport, St};

pub(crate) mod pool;
pub(crate) mod state;
use pool::{HostKey, Refused};
use state::{DhDone, Phase, QueueAuth, Step};

/// The largest Authentication Send (TL) or Receive (AL) transfer taken.
/// (The largest message, a Reply with an ffdhe8192 value and SHA-512,
/// is under 1.2 KiB; Linux's host asks 4 KiB.)
pub(crate) const MAX_AUTH_XFER: u32 = 8192;

impl Qpair {
    /// The status of a command refused on a queue not authenticated yet
    /// (Authentication Required), or, on a queue with no I/O queue at
    /// all, Command Sequence Error (as before authentication existed).
    #[cold]
    pub(crate) fn refusal_before_auth(&self) -> Status {
        if self.auth.as_ref().is_some_and(|a| a.gated()) {
            fabrics_status(fabrics_sc::AUTHENTICATION_REQUIRED)
        } else {
            gen(generic::COMMAND_SEQUENCE_ERROR)
        }
    }

    /// The queue waits for authentication: commands other than
    /// Authentication Send/Receive are refused.
    #[inline]
    pub(crate) fn auth_gated(&self) -> bool {
        self.auth.as_ref().is_some_and(|a| a.gated())
    }

    /// The data of slot `i` is in, and it is not an I/O command's (or the
    /// queue has no I/O queue): an Authentication Send's data, or what
    /// `submit` did before such commands existed.
    #[cold]
    pub(crate) fn data_in_other<X: QueueTransport>(&mut self, x: &mut X, i: u16) {
        let Some(s) = self.slots.get(i as usize) else {
            return;
        };
        if FcType::of(&s.sqe) == Some(FcType::AuthenticationSend) {
            let len = s.xfer as usize;
            let msg = s
                .buf
                .as_ref()
                .map(|b| b.as_slice()[..len.min(b.as_slice().len())].to_vec())
                .unwrap_or_default();
            self.auth_time(true);
            self.auth_message(None, x, i, &msg);
            return self.auth_time(false);
        }
        if self.io.is_some() {
            self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0);
        }
    }

    /// The reactor's time on the exchange: a command (or result) begins
    /// (`true`) or ends.
    fn auth_time(&mut self, begin: bool) {
        if let Some(a) = self.auth.as_mut() {
            if begin {
                a.reactor.begin();
            } else {
                a.reactor.end();
            }
        }
    }

    /// Authentication Send or Receive (`send`) in slot `i`, with `icd`
    /// bytes of in-capsule data.
    pub(crate) fn auth_command<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        sqe: &Sqe,
        icd: u32,
        send: bool,
    ) {
        self.auth_time(true);
        self.auth_command_timed(ctx, x, i, sqe, icd, send);
        self.auth_time(false);
    }

    fn auth_command_timed<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        sqe: &Sqe,
        icd: u32,
        send: bool,
    ) {
        let cmd = AuthCmd::from_sqe(sqe);
        let len = cmd.len;
        if matches!(self.bound, Bound::Admin { .. }) {
            // (The exchange is the host's traffic: Keep Alive waits.)
            self.last_admin = self.now;
        }
        if !cmd.is_dhchap_protocol() || len == 0 || len > MAX_AUTH_XFER {
            return self.finish(x, i, gen(generic::INVALID_FIELD), 0, 0);
        }
        if self.auth.is_none() {
            // The host has no key here: nothing to authenticate against.
            tracing::warn!(peer = %self.peer, qid = self.qid, "authentication command from a host without a DH-HMAC-CHAP key");
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        }
        if self.auth.as_ref().is_some_and(|a| a.job.is_some()) {
            // One step at a time: a host waits for its Authentication
            // Send to complete before its next command of the exchange
            // (as Linux's and SPDK's do).
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        }
        let sgl = match Self::data_sgl(sqe, len, !send, self.icd_max.min(icd)) {
            Ok(s) => s,
            Err(st) => return self.finish(x, i, st, 0, 0),
        };
        if !send {
            return self.auth_receive(ctx, x, i, len);
        }
        match sgl {
            Sgl::InCapsule { .. } => {
                let msg = self.slots[i as usize]
                    .buf
                    .as_ref()
                    .map(|b| b.as_slice()[..(len as usize).min(b.as_slice().len())].to_vec())
                    .unwrap_or_default();
                self.auth_message(Some(ctx), x, i, &msg);
            }
            _ => {
                // Its data from the host (R2T): `data_in_other` then.
                if !self.slot_buf(i, len as usize, false) {
                    return self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0);
                }
                let s = &mut self.slots[i as usize];
                s.xfer = len;
                s.io = None;
                s.st = St::AwaitData;
                x.receive_data(self, i);
            }
        }
    }

    /// An Authentication Send's message `msg` (slot `i`); `ctx`: at hand
    /// (else a failure closes the queue at the transport's next tick).
    fn auth_message<X: QueueTransport>(
        &mut self,
        ctx: Option<&mut ThreadCtx>,
        x: &mut X,
        i: u16,
        msg: &[u8],
    ) {
        let (peer, qid, now) = (self.peer, self.qid, self.now);
        let Some(a) = self.auth.as_mut() else {
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        };
        if matches!(a.phase, Phase::Running | Phase::Done) && QueueAuth::is_negotiate(msg) {
            // A Negotiate starts the exchange over (Linux's "reset
            // negotiation"); on an authenticated queue it is a
            // re-authentication, with a deadline of its own (a restart
            // keeps the first exchange's).
            if a.phase == Phase::Done {
                tracing::info!(%peer, qid, host = a.host(), "re-authentication asked");
                a.since = now;
            }
            a.restart();
        }
        if a.needs_worker(msg) {
            return self.auth_offload(x, i, msg);
        }
        let step = a.on_send(msg);
        self.auth_step(step);
        // (Linux completes the command; the host learns of a failure
        // from the AUTH_Failure1 its Authentication Receive returns.)
        self.finish(x, i, Status::SUCCESS, 0, 0);
        if let Some(ctx) = ctx {
            self.auth_close_if_failed(ctx, x);
        }
    }

    /// Sends the step of `msg` (an Authentication Send in slot `i`) to
    /// the DH pool: the command completes when the result is back
    /// ([`auth_done`](Self::auth_done)), and the reactor serves the other
    /// queues meanwhile. Refused by the pool's bounds: the exchange fails
    /// (the pool warns, once per burst), and the host's Authentication
    /// Receive gets the AUTH_Failure1.
    #[cold]
    fn auth_offload<X: QueueTransport>(&mut self, x: &mut X, i: u16, msg: &[u8]) {
        let (peer, thread, conn, qid) = (self.peer, self.thread, self.id, self.qid);
        let pool = self.shared.dh.clone();
        let Some(a) = self.auth.as_mut() else {
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        };
        let host = HostKey {
            addr: peer.ip(),
            hostnqn: a.host().to_string(),
        };
        let (work, cancel) = a.lend(msg, i);
        let deliver: fn(&mut ThreadCtx, u64, DhDone) = X::auth_done;
        let r = match pool.remote().cloned() {
            Some(remote) => pool.submit(
                host,
                peer,
                cancel,
                Box::new(move || {
                    let done = work.run();
                    Box::new(move || {
                        // (The runtime shutting down: the result is dropped.)
                        let _ = remote.send(thread, move |ctx| deliver(ctx, conn, done));
                    })
                }),
            ),
            None => Err(Refused::Stopped),
        };
        match r {
            Ok(()) => self.slots[i as usize].st = St::Auth,
            Err(why) => {
                if let Some(a) = self.auth.as_mut() {
                    tracing::debug!(%peer, qid, hostnqn = a.host(), "DH-HMAC-CHAP exchange refused: {why}");
                    a.refuse(msg);
                }
                self.finish(x, i, Status::SUCCESS, 0, 0);
            }
        }
    }

    /// A DH pool's result for this queue: the step is taken, and the
    /// Authentication Send that asked for it completes. (A result for a
    /// job of an exchange started over or ended is dropped.)
    #[cold]
    pub(crate) fn auth_done<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        done: DhDone,
    ) {
        let Some(a) = self.auth.as_mut() else {
            return;
        };
        if a.job.as_ref().is_none_or(|j| j.ticket != done.ticket) {
            return;
        }
        a.reactor.begin();
        let job = a.job.take();
        let step = a.on_done(done);
        if let Some(step) = step {
            self.auth_step(step);
        }
        if let Some(j) = job {
            if self
                .slots
                .get(j.slot as usize)
                .is_some_and(|s| s.st == St::Auth)
            {
                self.finish(x, j.slot, Status::SUCCESS, 0, 0);
            }
        }
        self.auth_close_if_failed(ctx, x);
        self.auth_time(false);
    }

    /// Authentication Receive of `al` bytes (slot `i`): the message the
    /// exchange has for the host, zero-filled to `al` (as Linux sends).
    fn auth_receive<X: QueueTransport>(&mut self, ctx: &mut ThreadCtx, x: &mut X, i: u16, al: u32) {
        let Some(a) = self.auth.as_mut() else {
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        };
        let (msg, failed) = a.on_receive();
        if let Some(why) = failed {
            if !why.is_empty() {
                self.auth_step(Step::Failed(why));
            }
            if let Some(a) = self.auth.as_mut() {
                a.phase = Phase::Failed;
            }
        }
        if msg.len() > al as usize {
            // (Linux: "buffer too small", an internal error.)
            if let Some(a) = self.auth.as_mut() {
                a.phase = Phase::Failed;
            }
            self.finish(x, i, gen(generic::INVALID_FIELD), 0, 0);
            return self.auth_close_if_failed(ctx, x);
        }
        if !self.slot_buf(i, al as usize, false) {
            return self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0);
        }
        if let Some(b) = self.slots[i as usize].buf.as_mut() {
            let (head, tail) = b.as_mut_slice().split_at_mut(msg.len());
            head.copy_from_slice(&msg);
            tail.fill(0);
        }
        x.send_data(self, i, al);
        self.auth_close_if_failed(ctx, x);
    }

    /// What a message did: the gate opens, or the failure is logged (at
    /// WARN, with the peer and the NQNs; never a key).
    fn auth_step(&mut self, step: Step) {
        let (peer, local, qid) = (self.peer, self.local, self.qid);
        let cntlid = match self.bound {
            Bound::Admin { cntlid, .. } | Bound::Io { cntlid, .. } => cntlid,
            Bound::None => 0,
        };
        let Some(a) = self.auth.as_mut() else {
            return;
        };
        match step {
            Step::Continue => {}
            Step::Authenticated => {
                tracing::info!(%peer, qid, cntlid, host = a.host(), subnqn = a.subnqn(), reactor_us = a.reactor.micros(), "host authenticated (DH-HMAC-CHAP)");
                if let Some(io) = a.parked_io.take() {
                    self.io = Some(io);
                }
            }
            Step::Failed(why) => {
                tracing::warn!(%peer, %local, qid, cntlid, hostnqn = a.host(), subnqn = a.subnqn(), "DH-HMAC-CHAP authentication failed: {why}; closing the controller");
            }
        }
    }

    /// After a failed exchange: this queue closes (once its last response
    /// is out), and the controller with it (an I/O queue's failure closes
    /// the admin queue, which takes the other I/O queues down).
    pub(crate) fn auth_close_if_failed<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
    ) {
        if !self.auth.as_ref().is_some_and(|a| a.phase == Phase::Failed) {
            return;
        }
        self.auth_teardown(ctx);
        if let Some(a) = self.auth.as_mut() {
            a.phase = Phase::Closed;
        }
        x.close(ctx, self, "authentication failed");
    }

    /// The controller of a queue whose authentication failed goes away:
    /// an I/O queue's admin queue is closed on its thread.
    pub(crate) fn auth_teardown(&mut self, ctx: &mut ThreadCtx) {
        if let Bound::Io { cntlid, .. } = self.bound {
            let admin = self.shared.table().map.get(&cntlid).map(|e| e.admin);
            if let Some(r) = admin {
                let (conn, close) = (r.conn, r.close);
                if let Err(err) = ctx.send(r.thread, move |ctx| close(ctx, conn)) {
                    tracing::warn!(
                        cntlid,
                        "closing the admin queue after a failed authentication: {err}"
                    );
                }
            }
        }
    }

    /// The transport's timer: the exchange failed (its last response is
    /// out) or ran out of time (`limit`); true if the connection is to
    /// close now. A re-authentication that runs out of time only ends
    /// (the queue stays authenticated), as SPDK's.
    pub(crate) fn auth_expired(
        &mut self,
        ctx: &mut ThreadCtx,
        now: Instant,
        limit: std::time::Duration,
    ) -> bool {
        let (peer, qid) = (self.peer, self.qid);
        let Some(a) = self.auth.as_mut() else {
            return false;
        };
        match a.phase {
            Phase::Failed => {
                a.phase = Phase::Closed;
                self.auth_teardown(ctx);
                true
            }
            Phase::Running | Phase::Failing if now.saturating_duration_since(a.since) > limit => {
                if a.authenticated && a.phase == Phase::Running {
                    tracing::warn!(%peer, qid, host = a.host(), "re-authentication timed out; the queue stays authenticated");
                    a.phase = Phase::Done;
                    return false;
                }
                tracing::warn!(%peer, qid, hostnqn = a.host(), subnqn = a.subnqn(), timeout_ms = limit.as_millis() as u64, "authentication not done in time; closing the controller");
                a.phase = Phase::Closed;
                self.auth_teardown(ctx);
                true
            }
            _ => false,
        }
    }
}
