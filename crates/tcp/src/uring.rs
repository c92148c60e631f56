//! `sock_impl:uring`: an I/O queue's connection through an io_uring of
//! its own (SPDK's `sock uring`, the host side; the target's is
//! `pollux_nvmf`'s `tcp::uring`).
//!
//! - **A ring per connection.** The host has no per-thread context: a
//!   queue pair belongs to the thread that polls it, and its connection
//!   is its only socket, so the natural unit is a small ring (a few SQ
//!   entries) per I/O connection. The admin connection stays on plain
//!   sockets (several threads use it under the admin link's lock).
//! - **Created disabled, enabled by the poller.** The connection is made
//!   (ICReq/ICResp, fabrics Connect) with plain blocking calls on
//!   whichever thread creates the queue pair or reconnects it; then
//!   [`HostRing::new`] sets the ring up disabled (`R_DISABLED`: buffers
//!   and file registered, nothing submitted), and the first flush or
//!   receive of the connection enables it: the thread that polls the
//!   queue pair becomes the ring's only issuer (`SINGLE_ISSUER`), its
//!   task runs the ring's work only when it enters the ring
//!   (`DEFER_TASKRUN`, with `TASKRUN_FLAG` telling it when there is some).
//!   A queue pair moved to another thread after its first poll fails its
//!   connection with a clear error (the kernel refuses that thread:
//!   `EEXIST`); the controller reset that follows makes a new connection,
//!   whose ring the new thread enables.
//! - **Receive**: one multishot receive, armed at enable, picks buffers
//!   from the connection's provided-buffer ring (`uring_rx_buffers`,
//!   default [`RX_BUFFERS`], of `uring_rx_buffer_size` bytes, default
//!   [`RX_BUFFER_SIZE`]). With `uring_direct` (the default) the engine
//!   parses PDUs where they lie in those buffers ([`HostRing::front`],
//!   [`HostRing::consume`]; `Conn::poll_direct`): C2HData is copied
//!   once, from the provided buffer to the command's, as `posix` copies
//!   it once from its receive buffer; only a header cut by the end of a
//!   buffer is stitched together in the connection's receive buffer.
//!   Without it, what came is copied into the receive buffer first
//!   ([`HostRing::recv`]; the target's way, one copy more). Buffers go
//!   back to the kernel as soon as they are parsed; a receive that ran
//!   out of them (`ENOBUFS`) is armed again once one is back.
//! - **Send**: the send queue's iovecs go as one `SENDMSG`
//!   (`MSG_DONTWAIT`), submitted with the same `io_uring_enter` that runs
//!   the deferred receive work (`GETEVENTS`): one system call per flush
//!   for both. A non-blocking send completes at submission; the flush
//!   still waits for its completion before returning, so the kernel never
//!   reads the send queue's bytes or a command's buffer after the flush.
//! - **No system call when there is nothing**: a receive with no
//!   completion queued and no deferred work flagged (`IORING_SQ_TASKRUN`,
//!   read from the shared ring) returns at once; `posix` makes a `read`
//!   that fails with `EAGAIN` there.
//! - **Files**: the socket is the ring's registered file 0.
//! - **Teardown**: dropping the ring on the thread that enabled it
//!   cancels the receive and waits for its last completion before the
//!   buffers are unmapped. Anywhere else (or after a failed
//!   `io_uring_enter`) it cannot enter the ring: it closes it and leaks
//!   the buffers rather than unmap memory the kernel might still write.
//!
//! The provided-buffer ring is [`crate::bufring`], shared with the
//! target's io_uring path.
use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::thread::ThreadId;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::bufring::BufRing;

/// Most segments per send, `writev` or `SENDMSG` (here: the iovecs'
/// capacity; the connection's plain sockets take as many).
pub(crate) const IOV_MAX: usize = 64;

/// Submission queue entries (a send, a receive armed again, a cancel).
const SQ_ENTRIES: u32 = 8;
/// Completion queue entries: a multishot receive posts one per buffer.
const CQ_ENTRIES: u32 = 256;
/// Provided receive buffers per connection by default (a power of two).
pub const RX_BUFFERS: u16 = 64;
/// Bytes of each provided receive buffer by default.
pub const RX_BUFFER_SIZE: u32 = 16 << 10;
/// Most bytes of a provided receive buffer (a buffer's bytes must fit in
/// the connection's receive buffer: `Conn::poll_direct`).
pub const RX_BUFFER_SIZE_MAX: u32 = 256 << 10;
/// The provided-buffer group of the receive.
const BGID: u16 = 0;

const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
const OP_CANCEL: u64 = 3;

/// A received piece: buffer, first byte not yet taken, end.
#[derive(Clone, Copy)]
struct Piece {
    bid: u16,
    at: u32,
    end: u32,
}

/// How a connection's ring is set up (`TcpOptions::uring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Parse PDUs in the provided buffers the receive filled rather than
    /// copy them into the connection's receive buffer first
    /// (`uring_direct:0|1`; default 1).
    pub direct: bool,
    /// Provided receive buffers, a power of two (`uring_rx_buffers:N`).
    pub rx_buffers: u16,
    /// Bytes of each, at most [`RX_BUFFER_SIZE_MAX`]
    /// (`uring_rx_buffer_size:BYTES`).
    pub rx_buffer_size: u32,
}

impl Default for UringOptions {
    fn default() -> UringOptions {
        UringOptions {
            direct: true,
            rx_buffers: RX_BUFFERS,
            rx_buffer_size: RX_BUFFER_SIZE,
        }
    }
}

/// What a send or a receive found.
pub(crate) enum RingError {
    /// The peer closed the connection.
    Closed,
    /// A call or an operation failed.
    Io(io::Error),
}

/// One connection's ring. See the module docs.
pub(crate) struct HostRing {
    // (Declared first: the ring closes before the buffers unmap.)
    ring: IoUring,
    bufs: BufRing,
    fd: RawFd,
    /// The socket is the ring's registered file 0.
    fixed: bool,
    /// PDUs are parsed in the provided buffers (`uring_direct`), not
    /// copied into the connection's receive buffer first.
    pub direct: bool,
    /// The thread that enabled the ring (its only issuer).
    enabled: Option<ThreadId>,
    /// The multishot receive is armed (its last completion not seen).
    armed: bool,
    /// Received and not taken yet.
    pieces: VecDeque<Piece>,
    eof: bool,
    err: Option<i32>,
    /// The result of the send in flight, once it completed.
    sent: Option<i32>,
    /// An `io_uring_enter` failed: what was queued may not have gone to
    /// the kernel, so the ring is never entered again.
    poisoned: bool,
    /// The send's message and iovecs (in place until it completes).
    msg: libc::msghdr,
    iov: Vec<libc::iovec>,
}

// SAFETY: the raw pointers in `msg`/`iov` name memory of this value (or,
// during a flush only, the send queue's): nothing is shared with another
// thread. The ring itself refuses to be entered from a thread other than
// the one that enabled it.
unsafe impl Send for HostRing {}

impl HostRing {
    /// A disabled ring for socket `fd` (which outlives it): buffers and
    /// the file registered, nothing submitted until [`enable`](Self::enable).
    pub(crate) fn new(fd: RawFd, fixed_file: bool, o: &UringOptions) -> io::Result<Box<HostRing>> {
        let ring = IoUring::builder()
            .setup_r_disabled()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)?;
        if o.rx_buffer_size > RX_BUFFER_SIZE_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "receive buffers of {} bytes: at most {RX_BUFFER_SIZE_MAX}",
                    o.rx_buffer_size
                ),
            ));
        }
        let bufs = BufRing::new(o.rx_buffers, o.rx_buffer_size)?;
        // SAFETY: the entries' mapping lives as long as the ring (it is
        // dropped after it, or leaked: `Drop`) and holds `rx_buffers`
        // entries.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring_addr(),
                o.rx_buffers,
                BGID,
                0,
            )?
        };
        if fixed_file {
            ring.submitter().register_files(&[fd])?;
        }
        Ok(Box::new(HostRing {
            ring,
            bufs,
            fd,
            fixed: fixed_file,
            direct: o.direct,
            enabled: None,
            armed: false,
            pieces: VecDeque::with_capacity(o.rx_buffers as usize),
            eof: false,
            err: None,
            sent: None,
            poisoned: false,
            // SAFETY: a zeroed msghdr is valid (no name, no control, no
            // iovecs).
            msg: unsafe { std::mem::zeroed() },
            iov: Vec::with_capacity(IOV_MAX),
        }))
    }

    /// True once the polling thread enabled the ring.
    #[inline(always)]
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled.is_some()
    }

    /// Makes the calling thread the ring's issuer and arms the receive.
    #[cold]
    pub(crate) fn enable(&mut self) -> io::Result<()> {
        self.ring.submitter().register_enable_rings()?;
        self.enabled = Some(std::thread::current().id());
        // (No `register_ring_fd`: io-uring 0.7 remembers that registration
        // in the `Submitter` that made it, and `IoUring::submitter` makes
        // a new one per call, so it would never be used.)
        self.arm()?;
        self.enter(0)
    }

    fn recv_entry(&self) -> squeue::Entry {
        if self.fixed {
            opcode::RecvMulti::new(types::Fixed(0), BGID).build()
        } else {
            opcode::RecvMulti::new(types::Fd(self.fd), BGID).build()
        }
        .user_data(OP_RECV)
    }

    /// Queues `e` (the queue has room: at most a send, a receive and a
    /// cancel are ever queued, each submitted before the next call).
    fn push(&mut self, e: &squeue::Entry) -> io::Result<()> {
        // SAFETY: every entry pushed names memory that stays valid until
        // its completion (see the callers).
        unsafe { self.ring.submission().push(e) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))
    }

    fn arm(&mut self) -> io::Result<()> {
        let e = self.recv_entry();
        // The receive writes only provided buffers, which stay mapped
        // until its last completion (`Drop`).
        self.push(&e)?;
        self.armed = true;
        Ok(())
    }

    /// Submits what is queued and runs the deferred work (the receive's
    /// completions come with it), waiting for `want` completions.
    fn enter(&mut self, want: usize) -> io::Result<()> {
        if self.poisoned {
            return Err(io::Error::other(
                "io_uring ring unusable after an earlier error",
            ));
        }
        loop {
            match self.ring.submitter().submit_and_wait(want) {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    self.poisoned = true;
                    return Err(if e.raw_os_error() == Some(libc::EEXIST) {
                        io::Error::other(
                            "io_uring: the queue pair is polled by another thread than the one that first polled it (sock_impl:uring needs one thread per queue pair)",
                        )
                    } else {
                        e
                    });
                }
            }
        }
    }

    /// Takes the completions queued.
    fn reap(&mut self) {
        loop {
            let mut cq = self.ring.completion();
            let Some(c) = cq.next() else { break };
            drop(cq);
            self.complete(c.user_data(), c.result(), c.flags());
        }
    }

    fn complete(&mut self, op: u64, res: i32, flags: u32) {
        match op {
            OP_RECV => {
                if !cqueue::more(flags) {
                    self.armed = false;
                }
                if let Some(bid) = cqueue::buffer_select(flags) {
                    self.bufs.hold();
                    if res > 0 && (bid as u32) < self.bufs.count() {
                        self.pieces.push_back(Piece {
                            bid,
                            at: 0,
                            end: (res as u32).min(self.bufs.size()),
                        });
                    } else {
                        self.bufs.give(bid);
                    }
                }
                match res {
                    0 => self.eof = true,
                    r if r == -libc::ENOBUFS || r == -libc::ECANCELED => {}
                    r if r < 0 => self.err = Some(-r),
                    _ => {}
                }
            }
            OP_SEND => self.sent = Some(res),
            _ => {}
        }
    }

    /// True if received bytes or completions wait here.
    pub(crate) fn has_rx(&self) -> bool {
        !self.pieces.is_empty()
            || self.eof
            || self.err.is_some()
            || (self.is_enabled() && !self.poisoned && self.work_pending())
    }

    fn work_pending(&self) -> bool {
        // SAFETY: `completion_shared`/`submission_shared` read the shared
        // ring; nothing else holds a queue of this ring meanwhile (`&self`
        // here, every other use takes `&mut self`).
        unsafe {
            !self.ring.completion_shared().is_empty() || self.ring.submission_shared().taskrun()
        }
    }

    /// The received bytes not taken yet of the oldest buffer held. The
    /// kernel does not write it until [`consume`](Self::consume) gives it
    /// back, which the borrow rules keep after the slice's last use.
    #[inline]
    pub(crate) fn front(&self) -> Option<&[u8]> {
        let p = self.pieces.front()?;
        // SAFETY: buffer `bid` was handed to us by a receive's completion
        // and is not in the ring: the kernel does not write it until it
        // is given back (`consume`, which takes `&mut self`); `at..end`
        // lies within it (the completion's length, at most its size).
        Some(unsafe { self.bufs.bytes(p.bid, p.at, p.end) })
    }

    /// `k` bytes of the oldest buffer held are taken (at most what
    /// `front` showed); the buffer goes back to the kernel once all are
    /// (seen at the next `publish`).
    #[inline]
    pub(crate) fn consume(&mut self, k: usize) {
        let Some(p) = self.pieces.front_mut() else {
            return;
        };
        debug_assert!(k <= (p.end - p.at) as usize, "consumed beyond the buffer");
        p.at = (p.at + k as u32).min(p.end);
        if p.at == p.end {
            let bid = p.bid;
            self.pieces.pop_front();
            self.bufs.give(bid);
        }
    }

    /// Tells the kernel of the buffers given back.
    #[inline]
    pub(crate) fn publish(&mut self) {
        self.bufs.publish();
    }

    /// Takes what the kernel received meanwhile (entering the ring only
    /// when it flagged deferred work) and arms the receive again if it
    /// ended for want of buffers: whether there is something to take.
    #[inline]
    pub(crate) fn collect(&mut self) -> Result<bool, RingError> {
        if self.ring.submission().taskrun() {
            self.enter(0).map_err(RingError::Io)?;
        }
        self.reap();
        if !self.pieces.is_empty() {
            return Ok(true);
        }
        self.bufs.publish();
        if !self.armed && !self.eof && self.err.is_none() {
            self.arm().map_err(RingError::Io)?;
            self.enter(0).map_err(RingError::Io)?;
            self.reap();
            if !self.pieces.is_empty() {
                return Ok(true);
            }
        }
        match (self.err, self.eof) {
            (Some(e), _) => Err(RingError::Io(io::Error::from_raw_os_error(e))),
            (None, true) => Err(RingError::Closed),
            (None, false) => Ok(false),
        }
    }

    /// Copies what was received into `dst`; how many bytes (0: nothing).
    /// Enters the ring only when the kernel flagged deferred work (data
    /// came); arms the receive again if it ended for want of buffers.
    #[inline]
    pub(crate) fn recv(&mut self, dst: &mut [u8]) -> Result<usize, RingError> {
        if self.pieces.is_empty() {
            if self.ring.submission().taskrun() {
                self.enter(0).map_err(RingError::Io)?;
            }
            self.reap();
        }
        let mut at = 0;
        while at < dst.len() {
            let Some(p) = self.pieces.front_mut() else {
                break;
            };
            let k = ((p.end - p.at) as usize).min(dst.len() - at);
            // SAFETY: buffer `bid` was handed to us by a receive's
            // completion and is not in the ring: the kernel does not write
            // it until it is given back; `at..end` lies within it (the
            // completion's length, at most the buffer's size).
            let src = unsafe { self.bufs.bytes(p.bid, p.at, p.at + k as u32) };
            dst[at..at + k].copy_from_slice(src);
            at += k;
            p.at += k as u32;
            if p.at == p.end {
                let bid = p.bid;
                self.pieces.pop_front();
                self.bufs.give(bid);
            }
        }
        self.bufs.publish();
        if !self.armed && !self.eof && self.err.is_none() && self.bufs.held() < self.bufs.count() {
            // Ended for want of buffers (or without error): armed again as
            // soon as one is back (waiting for half of them, as the
            // target's shared ring does, left the socket unread for
            // whole polls at QD 128).
            self.arm().map_err(RingError::Io)?;
            self.enter(0).map_err(RingError::Io)?;
            if at == 0 {
                self.reap();
            }
        }
        if at > 0 {
            return Ok(at);
        }
        match (self.err, self.eof) {
            (Some(e), _) => Err(RingError::Io(io::Error::from_raw_os_error(e))),
            (None, true) => Err(RingError::Closed),
            (None, false) => Ok(0),
        }
    }

    /// The iovecs of the next [`send`](Self::send), to fill (at most
    /// [`IOV_MAX`]: the capacity reserved).
    #[inline(always)]
    pub(crate) fn iov_mut(&mut self) -> &mut Vec<libc::iovec> {
        &mut self.iov
    }

    /// The bytes the iovecs name.
    #[inline(always)]
    pub(crate) fn iov_bytes(&self) -> usize {
        self.iov.iter().map(|v| v.iov_len).sum()
    }

    /// Sends the iovecs (`iov_mut`) as one `SENDMSG` and waits for its
    /// completion: the bytes sent (0: the socket is full).
    ///
    /// # Safety
    /// Every iovec names memory valid for reads, and unwritten, until this
    /// returns.
    #[inline]
    pub(crate) unsafe fn send(&mut self) -> Result<usize, RingError> {
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len() as _;
        let flags = (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32;
        let msg: *const libc::msghdr = &self.msg;
        let e = if self.fixed {
            opcode::SendMsg::new(types::Fixed(0), msg)
        } else {
            opcode::SendMsg::new(types::Fd(self.fd), msg)
        }
        .flags(flags)
        .build()
        .user_data(OP_SEND);
        // The message and iovecs stay in place, unchanged, until the send
        // completed (below); the memory they name per the caller's
        // contract.
        self.push(&e).map_err(RingError::Io)?;
        self.sent = None;
        // One enter: the send, and the deferred receive work.
        self.enter(1).map_err(RingError::Io)?;
        self.reap();
        // A non-blocking send completes at submission; wait if it did not.
        // (An `io_uring_enter` that submitted something returns how many,
        // whatever its wait then does: an error means nothing was
        // submitted, so the send either is still in the submission queue,
        // never to be read (the ring is poisoned, never entered again,
        // and closed with the connection), or completed at an earlier
        // enter.)
        while self.sent.is_none() {
            self.enter(1).map_err(RingError::Io)?;
            self.reap();
        }
        match self.sent.take() {
            Some(n) if n > 0 => Ok(n as usize),
            Some(0) => Err(RingError::Closed),
            Some(e) if e == -libc::EAGAIN => Ok(0),
            Some(e) if e == -libc::EPIPE || e == -libc::ECONNRESET => Err(RingError::Closed),
            Some(e) => Err(RingError::Io(io::Error::from_raw_os_error(-e))),
            None => Ok(0),
        }
    }
}

impl Drop for HostRing {
    fn drop(&mut self) {
        let here = std::thread::current().id();
        if self.armed && !self.poisoned && self.enabled == Some(here) {
            // The kernel must be done with the buffers before they are
            // unmapped: the receive cancelled and its last completion seen.
            let e = opcode::AsyncCancel::new(OP_RECV)
                .build()
                .user_data(OP_CANCEL);
            if self.push(&e).is_ok() {
                for _ in 0..1000 {
                    if self.enter(1).is_err() {
                        break;
                    }
                    self.reap();
                    if !self.armed {
                        break;
                    }
                }
            }
        }
        if self.armed {
            // Never unmap memory the kernel may still write: the ring
            // closes (ending the receive), the buffers are leaked.
            let kib = self.bufs.leak() >> 10;
            tracing::warn!(
                "io_uring receive of a closed NVMe/TCP connection not seen to end (ring dropped by another thread than its poller, or after an error): its {kib} KiB of receive buffers are leaked",
            );
        }
    }
}
