//! The target's socket implementations, as its threads see them: a
//! connection's [`Wire`] plus what each thread keeps for its sockets
//! (nothing for `posix`; the ring for `uring`), chosen once per target
//! (`TransportOptions::sock_impl`), so the thread's table, pollers and
//! connections are monomorphised per implementation (no `dyn`, no
//! `match` per I/O).
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use pollux_runtime::ThreadCtx;

use crate::config::TransportOptions;
use crate::pool::Cache;
use crate::shared::Shared;
use crate::tcp::conn::Conn;
use crate::tcp::sock::{PosixSock, RecvGates, Wire};

/// A socket implementation of the target's threads.
pub(crate) trait SockImpl: Wire + Sized + 'static {
    /// What a thread keeps for its sockets.
    type Thread: 'static;

    /// The thread's state (`ctx`'s wake-up descriptors set up).
    fn thread(ctx: &mut ThreadCtx, o: &TransportOptions) -> std::io::Result<Self::Thread>;

    /// A connection over the accepted socket `s`, set up (non-blocking,
    /// `TCP_NODELAY`) and able to wake its sleeping thread.
    #[allow(clippy::too_many_arguments)]
    fn conn(
        t: &mut Self::Thread,
        ctx: &mut ThreadCtx,
        id: u64,
        s: TcpStream,
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> std::io::Result<Conn<Self>>;

    /// Connection `c` is about to be dropped (its wake-up undone).
    fn forget(t: &mut Self::Thread, ctx: &mut ThreadCtx, c: &mut Conn<Self>);

    /// The region the thread's data buffers are carved from, if any (see
    /// `uring_registered_buffers`).
    fn arena(_t: &Self::Thread) -> Option<Arc<crate::buf::Arena>> {
        None
    }

    /// Before the thread's connections are polled.
    #[inline(always)]
    fn begin_poll(_t: &mut Self::Thread) {}

    /// After the thread's connections are polled: true if anything
    /// happened.
    #[inline(always)]
    fn end_poll(_t: &mut Self::Thread) -> bool {
        false
    }

    /// Nothing is pending that the thread's wake-up descriptors will not
    /// announce.
    #[inline(always)]
    fn may_sleep(_t: &Self::Thread) -> bool {
        true
    }
}

/// `posix`: each connection's socket is in the thread's epoll set, and,
/// with `epoll_receive`, in the thread's [`RecvGates`].
impl SockImpl for PosixSock {
    type Thread = Option<Rc<RecvGates>>;

    fn thread(_ctx: &mut ThreadCtx, o: &TransportOptions) -> std::io::Result<Self::Thread> {
        if o.epoll_receive {
            RecvGates::new().map(Some)
        } else {
            Ok(None)
        }
    }

    fn conn(
        t: &mut Self::Thread,
        ctx: &mut ThreadCtx,
        id: u64,
        s: TcpStream,
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> std::io::Result<Conn<PosixSock>> {
        let c = Conn::new(id, s, t.as_ref(), shared, cache, thread, now)?;
        if let Err(e) = ctx.register_wake_fd(c.as_fd()) {
            tracing::warn!("connection wake-up: {e}");
        }
        Ok(c)
    }

    fn forget(_t: &mut Self::Thread, ctx: &mut ThreadCtx, c: &mut Conn<PosixSock>) {
        let _ = ctx.unregister_wake_fd(c.wire().as_fd());
    }

    #[inline(always)]
    fn begin_poll(t: &mut Self::Thread) {
        if let Some(g) = t {
            g.poll();
        }
    }
}
