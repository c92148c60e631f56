//! The TCP transport on the runtime: listeners (bound at start, or live
//! by `live`: thread 0 is told to accept on them or to close them), what
//! its threads share ([`TcpShared`]: the connection count, the data
//! buffer pool, the threads' cores), placement of connections on
//! threads, each thread's connection table and poller, idle sleep in
//! epoll on the sockets, Keep Alive expiry, handshake timeouts (a
//! connection without ICReq, or whose queue is not connected, in time is
//! closed, freeing its `max_connections` slot) and shutdown.
//!
//! Each runtime thread keeps its connections in its own table (its
//! poller, timers and the messages sent to it are the only code touching
//! it): the pollers and timers hold it, messages find it in a
//! thread-local slot (one downcast per message, none per poll). Thread 0 also accepts: a new connection is sent to the
//! thread whose core receives its packets (`SO_INCOMING_CPU`, when on)
//! or to the next thread round robin.
use std::any::Any;
use std::cell::RefCell;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_runtime::{Poll, ThreadCtx};

use crate::auth::state::DhDone;
use crate::config::{SockImpl as SockImplKind, TransportOptions};
use crate::pool::{Cache, Pool};
use crate::shared::Shared;
use crate::tcp::conn::Conn;
use crate::tcp::sock::{self, PosixSock};
use crate::tcp::sockimpl::SockImpl;
use crate::tcp::uring::UringSock;

/// What every runtime thread of the TCP transport shares.
pub(crate) struct TcpShared {
    /// Open connections (accept refuses beyond `opts.max_connections +
    /// opts.max_unbound_connections`).
    pub conns: AtomicUsize,
    /// The data buffers' budget (the transport's resource: each thread
    /// takes from it through its cache).
    pub pool: Arc<Pool>,
    /// Core of each runtime thread.
    pub cores: Vec<usize>,
}

impl TcpShared {
    pub fn new(o: &TransportOptions, cores: &[usize]) -> TcpShared {
        let pool_bytes = usize::try_from(o.pool_bytes()).unwrap_or(usize::MAX);
        TcpShared {
            conns: AtomicUsize::new(0),
            pool: Arc::new(Pool::new(pool_bytes)),
            cores: cores.to_vec(),
        }
    }
}

/// The listeners of a target being started: each distinct configured
/// address bound once (a port 0 becomes a real port).
pub(crate) struct Listeners {
    /// (configured address, bound address, listener)
    bound: Vec<(SocketAddr, SocketAddr, TcpListener)>,
}

impl Listeners {
    /// Binds `addrs` (non-blocking), after raising the descriptor limit
    /// (each connection is a descriptor). The address that failed, and
    /// why.
    pub fn bind(
        addrs: impl IntoIterator<Item = SocketAddr>,
        o: &TransportOptions,
    ) -> Result<Listeners, (SocketAddr, std::io::Error)> {
        // Each connection is a descriptor: take what the hard limit allows.
        match sock::raise_nofile() {
            Ok((before, after)) => {
                let want = (o.max_connections as u64).saturating_add(64);
                if after < want {
                    tracing::warn!(
                        limit = after,
                        max_connections = o.max_connections,
                        "the descriptor limit (RLIMIT_NOFILE hard limit) is below max_connections + 64: accept will back off when it is reached"
                    );
                } else if before != after {
                    tracing::debug!(before, after, "descriptor limit raised to the hard limit");
                }
            }
            Err(e) => tracing::warn!("raising the descriptor limit (RLIMIT_NOFILE): {e}"),
        }
        // Bind each distinct address once; port 0 becomes a real port.
        let mut bound: Vec<(SocketAddr, SocketAddr, TcpListener)> = Vec::new();
        for addr in addrs {
            if bound.iter().any(|(a, _, _)| *a == addr) {
                continue;
            }
            let l = TcpListener::bind(addr)
                .and_then(|l| l.set_nonblocking(true).map(|()| l))
                .map_err(|e| (addr, e))?;
            let real = l.local_addr().map_err(|e| (addr, e))?;
            bound.push((addr, real, l));
        }
        Ok(Listeners { bound })
    }

    /// The address a configured one is bound to.
    pub fn real(&self, a: &SocketAddr) -> SocketAddr {
        self.bound
            .iter()
            .find(|(c, _, _)| c == a)
            .map_or(*a, |(_, r, _)| *r)
    }

    /// Every bound address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.bound.iter().map(|(_, r, _)| *r).collect()
    }

    /// Every (configured, bound) address.
    pub fn pairs(&self) -> Vec<(SocketAddr, SocketAddr)> {
        self.bound.iter().map(|(c, r, _)| (*c, *r)).collect()
    }

    /// The sockets.
    pub fn into_sockets(self) -> Vec<TcpListener> {
        self.bound.into_iter().map(|(_, _, l)| l).collect()
    }
}

/// `$body` with `$t` this thread's table (of whichever socket
/// implementation it has), or `$none` if it has none.
macro_rules! on_this_table {
    ($t:ident => $body:expr, $none:expr) => {
        if let Some($t) = this_table::<PosixSock>() {
            $body
        } else if let Some($t) = this_table::<UringSock>() {
            $body
        } else {
            $none
        }
    };
}

/// Thread 0 (a message): accepts on `l` too, bound live.
pub(crate) fn start_listening(ctx: &mut ThreadCtx, l: TcpListener) {
    on_this_table!(tab => start_listening_in(ctx, &tab, l), ())
}

fn start_listening_in<W: SockImpl>(ctx: &mut ThreadCtx, tab: &TableRef<W>, l: TcpListener) {
    with(tab, |t| {
        if t.accept_resume.is_none() {
            if let Err(e) = ctx.register_wake_fd(l.as_fd()) {
                tracing::error!("listener wake-up: {e}");
            }
        }
        t.listeners.push(l);
    });
}

/// Thread 0 (a message): stops accepting on `addr` and closes its
/// socket; whether there was one.
pub(crate) fn stop_listening(ctx: &mut ThreadCtx, addr: SocketAddr) -> bool {
    on_this_table!(tab => stop_listening_in(ctx, &tab, addr), false)
}

fn stop_listening_in<W: SockImpl>(
    ctx: &mut ThreadCtx,
    tab: &TableRef<W>,
    addr: SocketAddr,
) -> bool {
    with(tab, |t| {
        let Some(k) = t
            .listeners
            .iter()
            .position(|l| l.local_addr().is_ok_and(|a| a == addr))
        else {
            return false;
        };
        let l = t.listeners.swap_remove(k);
        let _ = ctx.unregister_wake_fd(l.as_fd());
        true
    })
    .unwrap_or(false)
}

/// Each thread (a message): what the threads share is replaced (the
/// transport created live, before any connection: there is none to move).
pub(crate) fn replace_shared(ctx: &mut ThreadCtx, shared: Arc<Shared>, tcp: Arc<TcpShared>) {
    on_this_table!(tab => replace_shared_in(ctx, &tab, shared, tcp), ())
}

fn replace_shared_in<W: SockImpl>(
    ctx: &mut ThreadCtx,
    tab: &TableRef<W>,
    shared: Arc<Shared>,
    tcp: Arc<TcpShared>,
) {
    let cache_bytes = shared.opts.cache_bytes(ctx.thread_count());
    with(tab, |t| {
        t.cache = Rc::new(
            Cache::new(
                tcp.pool.clone(),
                usize::try_from(cache_bytes).unwrap_or(usize::MAX),
            )
            .with_arena(W::arena(&t.io)),
        );
        t.shared = shared;
        t.tcp = tcp;
    });
}

struct Table<W: SockImpl> {
    shared: Arc<Shared>,
    tcp: Arc<TcpShared>,
    /// This thread's free data buffers.
    cache: Rc<Cache>,
    /// What the socket implementation keeps for this thread.
    io: W::Thread,
    conns: Vec<Conn<W>>,
    next_id: u64,
    rr: usize,
    listeners: Vec<TcpListener>,
    /// When the listeners were last asked for connections.
    last_accept: Option<Instant>,
    /// Out of descriptors (or memory) at `accept`: the listeners are left
    /// alone (and out of the epoll set) until then.
    accept_resume: Option<Instant>,
    /// The current back-off (doubling up to [`ACCEPT_BACKOFF_MAX`]).
    accept_backoff: Duration,
    /// The exhaustion was logged (once, until an accept succeeds).
    accept_warned: bool,
    /// Unbound connections evicted since the last warning about it, and
    /// when that was (one warning per [`EVICT_LOG_EVERY`]).
    evicted: u64,
    evict_logged: Option<Instant>,
}

/// Least time between two warnings about evicted unbound connections.
const EVICT_LOG_EVERY: Duration = Duration::from_secs(10);

type TableRef<W> = Rc<RefCell<Table<W>>>;

thread_local! {
    /// This thread's table, for messages: weak, so the table (and with
    /// `uring` its ring) goes with the thread's pollers, while the thread
    /// still runs; a strong one here was dropped among the thread-local
    /// destructors, where a log event aborts the process.
    static TABLE: RefCell<Option<Box<dyn Any>>> = const { RefCell::new(None) };
}

/// `f` on the table, unless it is in use (a re-entrant call).
fn with<W: SockImpl, R>(t: &TableRef<W>, f: impl FnOnce(&mut Table<W>) -> R) -> Option<R> {
    t.try_borrow_mut().ok().map(|mut g| f(&mut g))
}

/// This thread's table (messages; pollers and timers hold theirs).
fn this_table<W: SockImpl>() -> Option<TableRef<W>> {
    TABLE.with(|t| {
        t.try_borrow()
            .ok()?
            .as_ref()?
            .downcast_ref::<std::rc::Weak<RefCell<Table<W>>>>()?
            .upgrade()
    })
}

/// Closes connection `id` of this thread (its controller went away).
pub(crate) fn close_conn(ctx: &mut ThreadCtx, id: u64) {
    on_this_table!(tab => close_conn_in(ctx, &tab, id), ())
}

fn close_conn_in<W: SockImpl>(ctx: &mut ThreadCtx, tab: &TableRef<W>, id: u64) {
    with(tab, |t| {
        if let Some(c) = t.conns.iter_mut().find(|c| c.id() == id) {
            c.close_now(ctx, "controller torn down");
        }
    });
}

/// Delivers the asynchronous events of connection `id` of this thread,
/// an admin queue (a namespace of its subsystem changed).
pub(crate) fn events_conn(_ctx: &mut ThreadCtx, id: u64) {
    on_this_table!(tab => events_conn_in(&tab, id), ())
}

fn events_conn_in<W: SockImpl>(tab: &TableRef<W>, id: u64) {
    let found = with(tab, |t| {
        t.conns
            .iter_mut()
            .find(|c| c.id() == id)
            .map(|c| c.deliver_events())
            .is_some()
    });
    if found != Some(true) {
        tracing::debug!(conn = id, "asynchronous events for a connection gone");
    }
}

/// Hands the DH pool's result `done` to connection `id` of this thread
/// (dropped, its keys zeroised, if the connection is gone).
pub(crate) fn auth_done_conn(ctx: &mut ThreadCtx, id: u64, done: DhDone) {
    on_this_table!(tab => auth_done_in(ctx, &tab, id, done), ())
}

fn auth_done_in<W: SockImpl>(ctx: &mut ThreadCtx, tab: &TableRef<W>, id: u64, done: DhDone) {
    with(tab, |t| {
        if let Some(c) = t.conns.iter_mut().find(|c| c.id() == id) {
            c.auth_done(ctx, done);
        }
    });
}

/// Sets up runtime thread `ctx` (its connection table, pollers, timer
/// and drain); `listeners` (thread 0's) are accepted from here.
pub(crate) fn init(
    ctx: &mut ThreadCtx,
    shared: Arc<Shared>,
    tcp: Arc<TcpShared>,
    listeners: Option<Listeners>,
) {
    let name = shared.opts.sock_impl.name();
    let r = match shared.opts.sock_impl {
        SockImplKind::Posix => init_with::<PosixSock>(ctx, shared, tcp, listeners),
        SockImplKind::Uring => init_with::<UringSock>(ctx, shared, tcp, listeners),
    };
    if let Err(e) = r {
        // (`Target::start` probed the implementation: this is unlikely.)
        tracing::error!(
            thread = ctx.index(),
            sock_impl = name,
            "socket implementation: {e}; this thread serves no connection"
        );
    }
}

fn init_with<W: SockImpl>(
    ctx: &mut ThreadCtx,
    shared: Arc<Shared>,
    tcp: Arc<TcpShared>,
    listeners: Option<Listeners>,
) -> std::io::Result<()> {
    let io = W::thread(ctx, &shared.opts)?;
    shared.dh.set_remote(ctx.remote());
    let listeners: Vec<TcpListener> = listeners.map(Listeners::into_sockets).unwrap_or_default();
    for l in &listeners {
        if let Err(e) = ctx.register_wake_fd(l.as_fd()) {
            tracing::error!("listener wake-up: {e}");
        }
    }
    // Thread 0 accepts, on the listeners bound at start and live.
    let accepting = ctx.index() == 0;
    let cache_bytes = shared.opts.cache_bytes(ctx.thread_count());
    let cache = Rc::new(
        Cache::new(
            tcp.pool.clone(),
            usize::try_from(cache_bytes).unwrap_or(usize::MAX),
        )
        .with_arena(W::arena(&io)),
    );
    let tab: TableRef<W> = Rc::new(RefCell::new(Table {
        shared,
        tcp,
        cache,
        io,
        conns: Vec::new(),
        next_id: 0,
        rr: 0,
        listeners,
        last_accept: None,
        accept_resume: None,
        accept_backoff: Duration::ZERO,
        accept_warned: false,
        evicted: 0,
        evict_logged: None,
    }));
    TABLE.with(|t| *t.borrow_mut() = Some(Box::new(Rc::downgrade(&tab))));
    let t = tab.clone();
    ctx.register_poller("nvmf-tcp", move |ctx| poll(ctx, &t));
    if accepting {
        let t = tab.clone();
        ctx.register_poller("nvmf-tcp-accept", move |ctx| accept(ctx, &t));
    }
    let t = tab.clone();
    ctx.on_sleep(move || {
        t.try_borrow()
            .map(|t| {
                t.shared.opts.epoll_idle
                    && W::may_sleep(&t.io)
                    && !t.conns.iter().any(Conn::needs_poll)
            })
            .unwrap_or(false)
    });
    let t = tab.clone();
    ctx.add_periodic(Duration::from_millis(100), move |ctx| {
        let now = ctx.now();
        with(&t, |t| {
            // Others wait for buffers: give back what this thread caches.
            if t.tcp.pool.pressed() {
                t.cache.trim();
            }
            for c in t.conns.iter_mut() {
                c.tick(ctx, now);
                if c.kato_expired(now) {
                    tracing::warn!(conn = c.id(), "keep alive timeout expired");
                    c.close_now(ctx, "keep alive timeout");
                } else if let Some((stage, limit)) = c.handshake_expired(now) {
                    tracing::warn!(
                        peer = %c.peer(),
                        conn = c.id(),
                        stage = ?stage,
                        timeout_ms = limit.as_millis() as u64,
                        "handshake timeout: {stage}; closing the connection"
                    );
                    c.close_now(ctx, "handshake timeout");
                } else if c.auth_expired(ctx, now) {
                    c.close_now(ctx, "authentication failed or timed out");
                } else if c.linger_over(now) {
                    c.close_now(ctx, "linger time over");
                }
            }
        });
    });
    ctx.register_drain("nvmf-tcp", move |ctx| {
        with(&tab, |t| {
            for l in t.listeners.drain(..) {
                let _ = ctx.unregister_wake_fd(l.as_fd());
            }
            for c in t.conns.iter_mut() {
                c.drain();
            }
            t.conns.is_empty()
        })
        .unwrap_or(true)
    });
    Ok(())
}

fn poll<W: SockImpl>(ctx: &mut ThreadCtx, tab: &TableRef<W>) -> Poll {
    let busy = with(tab, |t| {
        let mut busy = false;
        W::begin_poll(&mut t.io);
        for c in t.conns.iter_mut() {
            busy |= c.poll(ctx);
        }
        // (Before any connection is dropped: the ring's sends end here.)
        busy |= W::end_poll(&mut t.io);
        let mut k = 0;
        while k < t.conns.len() {
            // A closed connection with requests still at a bdev is kept
            // (its poll reaps them): dropping it would wait on the bdev.
            if t.conns[k].is_closed() && t.conns[k].is_settled() {
                let mut c = t.conns.swap_remove(k);
                W::forget(&mut t.io, ctx, &mut c);
                t.tcp.conns.fetch_sub(1, Relaxed);
                drop(c);
            } else {
                k += 1;
            }
        }
        busy
    })
    .unwrap_or(false);
    if busy {
        Poll::Busy
    } else {
        Poll::Idle
    }
}

/// How often a polling thread asks its listeners for new connections
/// (an `accept4` that fails on every pass would cost the I/O path; a
/// thread asleep in epoll is woken by a listener and asks at once).
const ACCEPT_EVERY: Duration = Duration::from_micros(200);
/// First and longest wait before asking the listeners again after
/// `accept` ran out of descriptors (EMFILE, ENFILE) or memory.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

fn accept<W: SockImpl>(ctx: &mut ThreadCtx, tab: &TableRef<W>) -> Poll {
    let mut got: Vec<TcpStream> = Vec::new();
    let now = ctx.now();
    let shared = with(tab, |t| {
        if let Some(at) = t.accept_resume {
            if now < at {
                return None;
            }
            t.accept_resume = None;
            for l in &t.listeners {
                if let Err(e) = ctx.register_wake_fd(l.as_fd()) {
                    tracing::error!("listener wake-up: {e}");
                }
            }
        }
        if t.last_accept
            .is_some_and(|a| now.saturating_duration_since(a) < ACCEPT_EVERY)
        {
            return None;
        }
        t.last_accept = Some(now);
        let mut exhausted = None;
        'listeners: for l in &t.listeners {
            for _ in 0..16 {
                match l.accept() {
                    Ok((s, _)) => got.push(s),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if sock::is_resource_exhaustion(&e) => {
                        exhausted = Some(e);
                        break 'listeners;
                    }
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        break;
                    }
                }
            }
        }
        if let Some(e) = exhausted {
            // The pending connections stay in the listen backlog; asking
            // again at once would fail again (and a readable listener
            // would keep the thread from sleeping).
            t.accept_backoff = (t.accept_backoff * 2).clamp(ACCEPT_BACKOFF_MIN, ACCEPT_BACKOFF_MAX);
            t.accept_resume = Some(now + t.accept_backoff);
            for l in &t.listeners {
                let _ = ctx.unregister_wake_fd(l.as_fd());
            }
            if !t.accept_warned {
                t.accept_warned = true;
                tracing::warn!(
                    max_connections = t.shared.opts.max_connections,
                    "accept: {e}: new connections wait in the listen backlog; retrying after {} ms, backing off to {} ms (raise the descriptor limit, ulimit -n, or lower max_connections)",
                    t.accept_backoff.as_millis(),
                    ACCEPT_BACKOFF_MAX.as_millis()
                );
            }
        } else if !got.is_empty() {
            if t.accept_warned {
                tracing::info!("accept: taking connections again");
            }
            t.accept_warned = false;
            t.accept_backoff = Duration::ZERO;
        }
        Some((t.shared.clone(), t.tcp.clone()))
    })
    .flatten();
    let Some((shared, tcp)) = shared else {
        return Poll::Idle;
    };
    if got.is_empty() {
        return Poll::Idle;
    }
    // Unbound connections beyond their budget are evicted where they live
    // (`adopt`); this is the bound on descriptors.
    let max = shared.opts.max_connections + shared.opts.max_unbound_connections;
    for s in got {
        let peer = s.peer_addr().ok();
        if tcp.conns.load(Relaxed) >= max {
            tracing::warn!(
                ?peer,
                max,
                "connection refused: too many connections (max_connections + max_unbound_connections)"
            );
            continue;
        }
        tcp.conns.fetch_add(1, Relaxed);
        let n = ctx.thread_count();
        let by_cpu = if shared.opts.incoming_cpu {
            pollux_tcp::sockopt::incoming_cpu(s.as_fd())
                .and_then(|cpu| tcp.cores.iter().position(|&c| c == cpu))
        } else {
            None
        };
        let thread = by_cpu.unwrap_or_else(|| {
            with(tab, |t| {
                t.rr = (t.rr + 1) % n;
                t.rr
            })
            .unwrap_or(0)
        });
        tracing::debug!(?peer, thread, "connection accepted");
        if let Err(e) = ctx.send(thread, move |ctx| adopt::<W>(ctx, s)) {
            tracing::warn!(thread, "connection dropped: {e}");
            tcp.conns.fetch_sub(1, Relaxed);
        }
    }
    Poll::Busy
}

fn adopt<W: SockImpl>(ctx: &mut ThreadCtx, s: TcpStream) {
    let now = ctx.now();
    let thread = ctx.index();
    let Some(tab) = this_table::<W>() else {
        tracing::warn!("connection dropped: this thread serves no target");
        return;
    };
    with(&tab, |t| {
        if ctx.is_shutting_down() {
            t.tcp.conns.fetch_sub(1, Relaxed);
            return;
        }
        evict_unbound(ctx, t, now);
        t.next_id += 1;
        let id = (thread as u64) << 48 | t.next_id;
        let (shared, cache) = (t.shared.clone(), t.cache.clone());
        match W::conn(&mut t.io, ctx, id, s, shared, cache, thread, now) {
            Ok(c) => t.conns.push(c),
            Err(e) => {
                tracing::warn!("connection set-up: {e}");
                t.tcp.conns.fetch_sub(1, Relaxed);
            }
        }
    });
}

/// Makes room for one more unbound connection on this thread: beyond its
/// share of `max_unbound_connections`, the unbound connection (handshake,
/// discovery, closing) that has received nothing for longest is closed,
/// a closing one first. Data hosts' connections are never evicted.
fn evict_unbound<W: SockImpl>(ctx: &mut ThreadCtx, t: &mut Table<W>, now: Instant) {
    let share = t
        .shared
        .opts
        .max_unbound_connections
        .div_ceil(ctx.thread_count().max(1));
    if t.conns.iter().filter(|c| c.is_unbound()).count() < share {
        return;
    }
    let Some(c) = t
        .conns
        .iter_mut()
        .filter(|c| c.is_unbound())
        .min_by_key(|c| (!c.is_closing(), c.last_rx()))
    else {
        return;
    };
    let (peer, idle) = (c.peer(), now.saturating_duration_since(c.last_rx()));
    tracing::debug!(%peer, conn = c.id(), idle_ms = idle.as_millis() as u64, "unbound connection evicted");
    c.close_now(ctx, "evicted: unbound connection budget full");
    t.evicted += 1;
    if t.evict_logged
        .is_none_or(|at| now.saturating_duration_since(at) >= EVICT_LOG_EVERY)
    {
        tracing::warn!(
            evicted = t.evicted,
            last_peer = %peer,
            idle_ms = idle.as_millis() as u64,
            share,
            "unbound connections (handshake or discovery) beyond this thread's share of max_unbound_connections: the longest idle closed"
        );
        t.evicted = 0;
        t.evict_logged = Some(now);
    }
}
