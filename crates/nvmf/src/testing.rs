//! What the connection tests (`tests/fuzz/`) need to drive a TCP
//! connection over memory on a running target's thread: hidden, not part
//! of the crate's API, and free to change with the tests.
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_runtime::{RuntimeHandle, ThreadCtx};

use crate::config::TransportOptions;
use crate::pool::{Cache, Pool};
use crate::shared::Shared;
use crate::tcp::conn::Conn;
use crate::tgt::Target;

pub use crate::tcp::conn::Stage;
pub use crate::tcp::sock::Wire;

/// The runtime of `t` (connections are made and polled on its threads).
pub fn runtime(t: &Target) -> &RuntimeHandle {
    t.runtime()
}

/// What connections of a target share, for connections made by hand:
/// its subsystems and controller table, its data buffer pool, and the
/// listener they pretend to have arrived on (its first).
#[derive(Clone)]
pub struct Env {
    shared: Arc<Shared>,
    pool: Arc<Pool>,
    local: SocketAddr,
}

impl Env {
    pub fn of(t: &Target) -> Env {
        Env {
            shared: t.shared(),
            pool: t.pool(),
            local: t.listen_addrs()[0],
        }
    }

    pub fn opts(&self) -> &TransportOptions {
        &self.shared.opts
    }

    /// Bytes of data buffers charged to the pool (cached ones included).
    pub fn pool_used(&self) -> usize {
        self.pool.used()
    }

    /// A thread's cache of free data buffers of at most `bytes`.
    pub fn cache(&self, bytes: usize) -> Buffers {
        Buffers(Rc::new(Cache::new(self.pool.clone(), bytes)))
    }

    /// A connection over `wire` from `peer`, accepted at `accepted`, on
    /// the runtime thread of `ctx`, its buffers from `cache`.
    pub fn conn<W: Wire>(
        &self,
        ctx: &ThreadCtx,
        cache: &Buffers,
        wire: W,
        peer: SocketAddr,
        accepted: Instant,
    ) -> TestConn<W> {
        TestConn(Conn::with_wire(
            1,
            wire,
            (self.local, peer),
            self.shared.clone(),
            cache.0.clone(),
            ctx.index(),
            accepted,
        ))
    }
}

/// A thread's cache of free data buffers.
pub struct Buffers(Rc<Cache>);

impl Buffers {
    /// Bytes of free buffers held.
    pub fn bytes(&self) -> usize {
        self.0.bytes()
    }
}

/// A connection over any [`Wire`], with what the thread's table does to
/// it.
pub struct TestConn<W: Wire>(Conn<W>);

impl<W: Wire> TestConn<W> {
    pub fn poll(&mut self, ctx: &mut ThreadCtx) -> bool {
        self.0.poll(ctx)
    }

    /// The thread's timer, at `now`.
    pub fn tick(&mut self, ctx: &mut ThreadCtx, now: Instant) {
        self.0.tick(ctx, now);
    }

    pub fn needs_poll(&self) -> bool {
        self.0.needs_poll()
    }

    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }

    /// Commands wait for data buffers.
    pub fn is_waiting(&self) -> bool {
        self.0.is_waiting()
    }

    pub fn kato_expired(&self, now: Instant) -> bool {
        self.0.kato_expired(now)
    }

    pub fn handshake_expired(&self, now: Instant) -> Option<(Stage, Duration)> {
        self.0.handshake_expired(now)
    }

    pub fn wire(&mut self) -> &mut W {
        self.0.wire()
    }

    /// What the connection holds that a peer's bytes could grow: bytes
    /// queued to send, send segments, the Connect data buffer, command
    /// slots, the receive buffer, data buffer bytes.
    pub fn footprint(&self) -> [usize; 6] {
        self.0.footprint()
    }
}

/// The DH worker pool of `t` holds (`on`) each job it takes, counted as
/// running, until called again with `false`.
pub fn hold_dh(t: &Target, on: bool) {
    t.shared().dh.hold(on);
}

/// The DH worker pool's (waiting, running) jobs.
pub fn dh_jobs(t: &Target) -> (usize, usize) {
    t.shared().dh.counts()
}
