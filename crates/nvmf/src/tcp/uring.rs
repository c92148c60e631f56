//! `sock_impl` `uring`: the target's sockets through one io_uring per
//! runtime thread (SPDK's `sock uring`).
//!
//! - Receive: each connection has a multishot receive armed, which picks
//!   buffers from the thread's provided-buffer ring (`uring_rx_buffers`
//!   of `uring_rx_buffer_size` bytes); the completions are reaped at the
//!   start of the thread's poll and queued per connection, and
//!   [`Wire::recv2`] copies from them (then gives them back). That is one
//!   copy more than `posix`: data arrives in a provided buffer, then goes
//!   to the receive buffer (or, large H2CData, straight to the command's
//!   buffer, where `posix` has the kernel put it directly).
//! - Send: [`Wire::send_iov`] queues one `SENDMSG` (`MSG_DONTWAIT`) per
//!   connection and pass; the sends of all connections go to the kernel
//!   in one `io_uring_enter` at the end of the thread's poll, which also
//!   waits for their completions (a non-blocking send completes at
//!   submission): the memory a send names is never read by the kernel
//!   after the poll, so the send queue's own buffer and the lent slot
//!   buffers keep the rules of the copying sends. The bytes a send took
//!   are reported by the connection's next `send_iov` (the send queue
//!   advances then, its slots released then).
//! - Zero-copy sends (`uring_zcopy_threshold`, off by default): a send
//!   of at least that many bytes is a `SENDMSG_ZC`; the kernel pins the
//!   pages and sends from them, posting the send's result (flagged
//!   `MORE`) and later a notification once it no longer reads them.
//!   `Ring::end` waits for those notifications too, so the rule above
//!   holds for them as well: nothing reads the memory after the poll.
//!   The price: a notification comes when the last socket buffer naming
//!   the pages is freed, which for TCP is when the peer acknowledged the
//!   data (the retransmit queue holds it until then), on loopback too
//!   (where the kernel also copies the pages when it delivers them to
//!   the local socket, `skb_orphan_frags_rx`): the thread waits about a
//!   round trip per poll that sent zero-copy. Data a host leaves in the
//!   socket (it reads nothing: its window is closed) would hold the
//!   thread for good: after 100 ms (`ZC_WAIT`) such connections are
//!   reset (`connect(AF_UNSPEC)` purges their unsent data, which frees
//!   the buffers), and the wait goes on until every notification came.
//!   (Not waiting would need the send queue to keep its own bytes and the
//!   lent slot buffers until the notification: marks released, and its
//!   buffer cleared or grown, only then.)
//! - Registered buffers (`uring_registered_buffers`, off by default,
//!   needs the zero-copy sends): the thread's data buffers are carved from
//!   one region ([`Arena`]) registered with the ring, and a zero-copy send
//!   whose pieces all lie in it names it (`IORING_RECVSEND_FIXED_BUF`,
//!   Linux 6.15+): the kernel takes the pages from the registration
//!   instead of pinning them per send. The kernel wants every iovec of
//!   such a send within the one buffer, and a send's headers are in the
//!   send queue's own memory: they are copied into the region's staging
//!   bytes (a poll's sends share them; every send and notification has
//!   come when the poll ends, and the staging starts over). A send whose
//!   other pieces would not fit, or whose data buffers came from the heap
//!   (the region used up), goes as before.
//! - Files: the sockets are registered files of the ring
//!   (`uring_fixed_files`). The ring's own descriptor is not registered:
//!   io-uring 0.7 keeps that registration in the `Submitter` that made it,
//!   and `IoUring::submitter` makes a new one per call, so the enters
//!   would not use it.
//! - Idle: the ring runs its task work only when asked
//!   (`DEFER_TASKRUN`); an eventfd registered with it is signalled when
//!   work arrives and is in the thread's epoll set, so the thread sleeps
//!   in epoll as with `posix` and wakes on data.
use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use pollux_runtime::ThreadCtx;
use pollux_tcp::bufring::BufRing;

use crate::buf::Arena;
use crate::config::TransportOptions;
use crate::pool::Cache;
use crate::shared::Shared;
use crate::tcp::conn::Conn;
use crate::tcp::sock::{Wire, MAX_IOV};
use crate::tcp::sockimpl::SockImpl;

/// Submission queue entries of a thread's ring (one send per connection
/// per poll, receives re-armed, cancels; more are submitted as it fills).
const SQ_ENTRIES: u32 = 1024;
/// Completion queue entries (multishot receives post many).
const CQ_ENTRIES: u32 = 8192;
/// Registered file slots of a ring (connections beyond use plain
/// descriptors).
const FIXED_FILES: u32 = 4096;
/// The provided-buffer group of the receives.
const BGID: u16 = 0;

const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;
const OP_CANCEL: u64 = 3;
/// A zero-copy send (its result, then its notification).
const OP_SEND_ZC: u64 = 4;
/// How long a poll waits for zero-copy notifications before it
/// disconnects the connections whose data has not left (see
/// `Ring::wait_notifs`).
const ZC_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// The staging bytes of a registered region (headers copied there:
/// about 64 zero-copy sends per poll with the most each may stage).
const STAGING: usize = 256 << 10;
/// The most bytes one send stages: headers, not data (a send with more
/// outside the region goes unregistered).
const STAGE_MAX: usize = 4096;

/// `IORING_SEND_ZC_REPORT_USAGE`: the notification says whether the
/// kernel copied after all (`IORING_NOTIF_USAGE_ZC_COPIED` in its result).
const SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const NOTIF_USAGE_ZC_COPIED: i32 = 1 << 31;

/// A completion's tag: the connection's key, the key's generation (a
/// key is reused only once its receive has ended), the operation.
#[inline(always)]
fn tag(key: u32, gen: u32, op: u64) -> u64 {
    (key as u64) << 32 | ((gen & 0xff_ffff) as u64) << 8 | op
}

#[inline(always)]
fn untag(t: u64) -> (u32, u32, u64) {
    ((t >> 32) as u32, ((t >> 8) & 0xff_ffff) as u32, t & 0xff)
}

/// A received piece: buffer, first byte not yet taken, end.
#[derive(Clone, Copy)]
struct Piece {
    bid: u16,
    at: u32,
    end: u32,
}

/// What the ring keeps for one connection.
struct Slot {
    gen: u32,
    /// The connection still owns this key.
    live: bool,
    fd: RawFd,
    fixed: Option<u32>,
    /// Received and not yet taken.
    rx: VecDeque<Piece>,
    eof: bool,
    err: Option<i32>,
    /// The multishot receive is armed (its last completion not seen).
    armed: bool,
    /// The receive ended for want of buffers: armed again once there are.
    rearm: bool,
    /// A send was queued and has not completed.
    sending: bool,
    /// Zero-copy sends whose notification has not come (the kernel may
    /// still read their memory).
    notifs: u32,
    /// The result of the last send, not yet reported.
    sent: Option<i32>,
    /// The send's message and iovecs (in place until it completes).
    msg: Box<libc::msghdr>,
    iov: Vec<libc::iovec>,
}

/// One thread's ring.
pub(crate) struct Ring {
    ring: IoUring,
    bufs: BufRing,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Sends queued, not completed.
    sending: u32,
    /// Zero-copy notifications outstanding, all connections.
    notifs: u32,
    /// `uring_zcopy_threshold` (0: off).
    zc_threshold: usize,
    /// Zero-copy sends, and those the kernel copied after all (told by
    /// their notification): logged at the first copy.
    zc_sends: u64,
    zc_copied: u64,
    /// The data buffers' region registered with the ring (buffer 0).
    reg: Option<Registered>,
    /// Keys whose receive waits for buffers.
    rearm: Vec<u32>,
    fixed_files: bool,
    fixed_free: Vec<u32>,
    /// Signalled by the ring when task work arrives (in the thread's
    /// epoll set).
    event: OwnedFd,
}

/// A thread's ring, shared by its connections' sockets.
pub(crate) type RingRef = Rc<RefCell<Ring>>;

impl Ring {
    fn new(o: &TransportOptions) -> io::Result<Ring> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(CQ_ENTRIES)
            .build(SQ_ENTRIES)?;
        let bufs = BufRing::new(o.uring_rx_buffers, o.uring_rx_buffer_size)?;
        // SAFETY: the ring mapping lives as long as the ring (it is
        // dropped after it, `Ring::drop`), and holds `count` entries.
        unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.ring_addr(),
                o.uring_rx_buffers,
                BGID,
                0,
            )?
        };
        if o.uring_zcopy_threshold != 0 {
            let mut p = io_uring::Probe::new();
            ring.submitter().register_probe(&mut p)?;
            if !p.is_supported(opcode::SendMsgZc::CODE) {
                return Err(io::Error::other(
                    "uring_zcopy_threshold: this kernel has no zero-copy sendmsg (IORING_OP_SENDMSG_ZC, Linux 6.1+): set it to 0",
                ));
            }
        }
        let reg = match o.uring_registered_buffers {
            0 => None,
            n => Some(Registered::new(&ring, n as usize)?),
        };
        let mut fixed_free = Vec::new();
        if o.uring_fixed_files {
            ring.submitter().register_files_sparse(FIXED_FILES)?;
            fixed_free = (0..FIXED_FILES).rev().collect();
        }
        // SAFETY: eventfd creates a new descriptor, owned here.
        let efd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `efd` is a new descriptor nothing else owns.
        let event = unsafe { OwnedFd::from_raw_fd(efd) };
        ring.submitter().register_eventfd(efd)?;
        Ok(Ring {
            ring,
            bufs,
            slots: Vec::new(),
            free: Vec::new(),
            sending: 0,
            notifs: 0,
            zc_threshold: o.uring_zcopy_threshold as usize,
            zc_sends: 0,
            zc_copied: 0,
            reg,
            rearm: Vec::new(),
            fixed_files: o.uring_fixed_files,
            fixed_free,
            event,
        })
    }

    /// Queues `e`, submitting what is queued first if the queue is full.
    fn push(&mut self, e: &squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every entry pushed names memory that stays valid
            // until its completion (see the callers).
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return Ok(());
            }
            self.ring.submit()?;
        }
    }

    /// Arms the multishot receive of `key`.
    fn arm(&mut self, key: u32) -> io::Result<()> {
        let s = &self.slots[key as usize];
        let t = tag(key, s.gen, OP_RECV);
        let e = match s.fixed {
            Some(f) => opcode::RecvMulti::new(types::Fixed(f), BGID).build(),
            None => opcode::RecvMulti::new(types::Fd(s.fd), BGID).build(),
        }
        .user_data(t);
        self.push(&e)?;
        let s = &mut self.slots[key as usize];
        s.armed = true;
        s.rearm = false;
        Ok(())
    }

    /// A new connection's socket `fd`: its key.
    fn add(&mut self, fd: RawFd) -> io::Result<u32> {
        let key = match self.free.pop() {
            Some(k) => k,
            None => {
                self.slots.push(Slot {
                    gen: 0,
                    live: false,
                    fd: -1,
                    fixed: None,
                    rx: VecDeque::new(),
                    eof: false,
                    err: None,
                    armed: false,
                    rearm: false,
                    sending: false,
                    notifs: 0,
                    sent: None,
                    // SAFETY: a zeroed msghdr is valid (no name, no
                    // control, no iovecs).
                    msg: Box::new(unsafe { std::mem::zeroed() }),
                    iov: Vec::new(),
                });
                (self.slots.len() - 1) as u32
            }
        };
        let mut fixed = None;
        if self.fixed_files {
            if let Some(f) = self.fixed_free.pop() {
                match self.ring.submitter().register_files_update(f, &[fd]) {
                    Ok(_) => fixed = Some(f),
                    Err(e) => {
                        self.fixed_free.push(f);
                        tracing::debug!("registering a socket with the ring: {e}");
                    }
                }
            }
        }
        let s = &mut self.slots[key as usize];
        s.gen = s.gen.wrapping_add(1);
        s.live = true;
        s.fd = fd;
        s.fixed = fixed;
        s.rx.clear();
        s.eof = false;
        s.err = None;
        s.sent = None;
        s.sending = false;
        if let Err(e) = self.arm(key) {
            self.remove(key);
            return Err(e);
        }
        Ok(key)
    }

    /// The connection of `key` is gone: its receive cancelled, its
    /// buffers given back; the key is reused once the receive ended.
    ///
    /// Connections are dropped only after the thread's poll ended
    /// (`Ring::end`), which waited for every send and zero-copy
    /// notification: none is outstanding here, the memory the key's sends
    /// named may go.
    fn remove(&mut self, key: u32) {
        let s = &mut self.slots[key as usize];
        debug_assert!(!s.sending && s.notifs == 0, "send outstanding at remove");
        s.live = false;
        let pieces: Vec<Piece> = s.rx.drain(..).collect();
        let (armed, fixed, t) = (s.armed, s.fixed.take(), tag(key, s.gen, OP_RECV));
        for p in pieces {
            self.bufs.give(p.bid);
        }
        if let Some(f) = fixed {
            // The receive holds its own reference to the file.
            if self
                .ring
                .submitter()
                .register_files_update(f, &[-1])
                .is_ok()
            {
                self.fixed_free.push(f);
            }
        }
        if armed {
            let e = opcode::AsyncCancel::new(t)
                .build()
                .user_data(tag(key, 0, OP_CANCEL));
            if self.push(&e).is_err() {
                tracing::warn!("cancelling a receive: the ring refused it");
            }
        } else {
            self.free.push(key);
        }
    }

    /// The bytes of buffer `bid` from `at` to `end`.
    #[inline(always)]
    fn buf(&self, p: Piece) -> &[u8] {
        // SAFETY: buffer `bid` was handed to us by a receive's completion
        // (it is in a connection's queue) and is not in the ring: the
        // kernel does not write it until it is given back; `at <= end`,
        // and `end` is within it (the completion's length).
        unsafe { self.bufs.bytes(p.bid, p.at, p.end) }
    }

    /// Reaps the completion queue.
    fn reap(&mut self) -> bool {
        let mut any = false;
        loop {
            let mut cq = self.ring.completion();
            let Some(c) = cq.next() else {
                break;
            };
            drop(cq);
            any = true;
            self.complete(c.user_data(), c.result(), c.flags());
        }
        any
    }

    fn complete(&mut self, t: u64, res: i32, flags: u32) {
        let (key, gen, op) = untag(t);
        match op {
            OP_RECV => {
                let bid = cqueue::buffer_select(flags);
                let s = &mut self.slots[key as usize];
                let current = s.live && (s.gen & 0xff_ffff) == gen;
                if !cqueue::more(flags) {
                    s.armed = false;
                }
                if let Some(bid) = bid {
                    self.bufs.hold();
                    if current && res > 0 {
                        s.rx.push_back(Piece {
                            bid,
                            at: 0,
                            end: res as u32,
                        });
                    } else {
                        self.bufs.give(bid);
                    }
                }
                let s = &mut self.slots[key as usize];
                if current {
                    match res {
                        0 => s.eof = true,
                        r if r == -libc::ENOBUFS => {
                            if !s.armed && !s.rearm {
                                s.rearm = true;
                                self.rearm.push(key);
                            }
                        }
                        r if r < 0 => s.err = Some(-r),
                        _ => {
                            if !s.armed && !s.rearm {
                                // (Ended without error: armed again.)
                                s.rearm = true;
                                self.rearm.push(key);
                            }
                        }
                    }
                } else if !s.armed && !s.live {
                    self.free.push(key);
                }
            }
            OP_SEND => {
                let s = &mut self.slots[key as usize];
                if s.sending {
                    s.sending = false;
                    s.sent = Some(res);
                    self.sending -= 1;
                }
            }
            OP_SEND_ZC => self.zc_complete(key, res, flags),
            _ => {}
        }
    }

    /// A zero-copy send's completion: its result (as a copying send's,
    /// `MORE` set if a notification follows), or its notification.
    #[cold]
    fn zc_complete(&mut self, key: u32, res: i32, flags: u32) {
        let s = &mut self.slots[key as usize];
        if cqueue::notif(flags) {
            // The send's memory is the kernel's no more.
            if s.notifs > 0 {
                s.notifs -= 1;
                self.notifs -= 1;
                if res & NOTIF_USAGE_ZC_COPIED != 0 {
                    self.zc_copied += 1;
                    if self.zc_copied == 1 {
                        tracing::debug!(
                            zero_copy_sends = self.zc_sends,
                            "the kernel copied a zero-copy send's data after all (a local peer: loopback)"
                        );
                    }
                }
            }
            return;
        }
        if cqueue::more(flags) {
            s.notifs += 1;
            self.notifs += 1;
        }
        if s.sending {
            s.sending = false;
            s.sent = Some(res);
            self.sending -= 1;
        }
    }

    /// Runs what the kernel has for us and reaps it.
    fn begin(&mut self) {
        self.bufs.publish();
        if self.ring.submission().taskrun() {
            if let Err(e) = self.ring.submit() {
                tracing::warn!("io_uring_enter: {e}");
            }
        }
        self.reap();
    }

    /// Submits what the connections queued (their sends, in one
    /// `io_uring_enter`) and waits until every send completed and every
    /// zero-copy send's notification came.
    fn end(&mut self) -> bool {
        let mut any = false;
        if !self.rearm.is_empty() && self.bufs.held() < self.bufs.count() / 2 {
            for key in std::mem::take(&mut self.rearm) {
                let s = &self.slots[key as usize];
                if s.live && s.rearm && !s.armed && !s.eof && s.err.is_none() {
                    if let Err(e) = self.arm(key) {
                        self.slots[key as usize].err = e.raw_os_error();
                    }
                }
            }
        }
        self.bufs.publish();
        let queued = !self.ring.submission().is_empty();
        if queued || self.ring.submission().taskrun() {
            any = true;
            if let Err(e) = self.ring.submit() {
                tracing::warn!("io_uring_enter: {e}");
            }
        }
        self.reap();
        // The sends' memory must not be read by the kernel after this
        // poll: a non-blocking send completes at submission, this waits
        // only if one did not.
        while self.sending > 0 {
            self.wait(1);
        }
        if self.notifs > 0 {
            self.wait_notifs();
        }
        if let Some(g) = self.reg.as_mut() {
            // No send names the staging bytes any more.
            g.staged = 0;
        }
        any
    }

    /// Submits and waits for `n` completions, then reaps.
    fn wait(&mut self, n: usize) {
        if let Err(e) = self.ring.submit_and_wait(n) {
            if e.raw_os_error() != Some(libc::EINTR) {
                tracing::warn!("io_uring_enter: {e}");
            }
        }
        self.reap();
    }

    /// Waits for the notifications of the zero-copy sends. One comes once
    /// the kernel frees the last socket buffer naming the send's pages:
    /// after the peer acknowledged the data, or never while the data waits
    /// in the socket for a window a host that reads nothing keeps closed.
    /// So after [`ZC_WAIT`] the connections still waiting are disconnected
    /// (`connect(AF_UNSPEC)`: a reset, their unsent data purged, which
    /// frees those buffers), and the wait goes on until every notification
    /// came: only then may the memory be touched.
    #[cold]
    fn wait_notifs(&mut self) {
        let deadline = Instant::now() + ZC_WAIT;
        while self.notifs > 0 {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let ts = types::Timespec::from(deadline - now);
            let args = types::SubmitArgs::new().timespec(&ts);
            if let Err(e) = self.ring.submitter().submit_with_args(1, &args) {
                if !matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) {
                    tracing::warn!("io_uring_enter: {e}");
                }
            }
            self.reap();
        }
        if self.notifs == 0 {
            return;
        }
        for s in self.slots.iter().filter(|s| s.notifs > 0) {
            tracing::warn!(
                fd = s.fd,
                wait_ms = ZC_WAIT.as_millis() as u64,
                "a zero-copy send's data has not left the socket in time (the host reads nothing): connection reset"
            );
            let a = libc::sockaddr {
                sa_family: libc::AF_UNSPEC as libc::sa_family_t,
                sa_data: [0; 14],
            };
            // SAFETY: `a` is a valid sockaddr for the call's duration;
            // `fd` is the connection's socket, open while its key is live
            // (the connection is dropped only after this poll).
            let r = unsafe {
                libc::connect(
                    s.fd,
                    &a,
                    std::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
                )
            };
            if r != 0 {
                tracing::warn!(fd = s.fd, "disconnecting: {}", io::Error::last_os_error());
            }
        }
        while self.notifs > 0 {
            self.wait(1);
        }
    }

    /// Whether the thread may sleep: nothing received waits to be taken,
    /// no receive waits to be armed, no task work pending (the eventfd is
    /// read here: its next signal is work that came after).
    fn may_sleep(&mut self) -> bool {
        let mut v = 0u64;
        // SAFETY: reads 8 bytes into `v` from our non-blocking eventfd.
        unsafe {
            libc::read(
                self.event.as_raw_fd(),
                (&mut v as *mut u64).cast(),
                std::mem::size_of::<u64>(),
            )
        };
        if !self.rearm.is_empty() || self.ring.submission().taskrun() {
            return false;
        }
        if !self.ring.completion().is_empty() {
            return false;
        }
        !self.slots.iter().any(|s| s.live && !s.rx.is_empty())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel must be done with the buffers before they are
        // unmapped: every receive cancelled and ended (the connections,
        // dropped before, asked for it), then the buffer ring
        // unregistered.
        let armed: Vec<u64> = (0..self.slots.len())
            .filter(|&k| self.slots[k].armed)
            .map(|k| tag(k as u32, self.slots[k].gen, OP_RECV))
            .collect();
        for t in armed {
            let e = opcode::AsyncCancel::new(t)
                .build()
                .user_data(tag(0, 0, OP_CANCEL));
            let _ = self.push(&e);
        }
        let mut rounds = 0;
        // (Sends and notifications end with each poll: none is expected.)
        while (self.slots.iter().any(|s| s.armed) || self.sending > 0 || self.notifs > 0)
            && rounds < 1000
        {
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            self.reap();
            rounds += 1;
        }
        if self.slots.iter().any(|s| s.armed)
            || self.ring.submitter().unregister_buf_ring(BGID).is_err()
        {
            // Never unmap memory the kernel may still write.
            tracing::warn!("io_uring receives still armed at exit: their buffers are leaked");
            self.bufs.leak();
        }
    }
}

/// The data buffers' region, registered with a ring as its buffer 0,
/// and how much of its staging bytes this poll's sends took.
struct Registered {
    arena: Arc<Arena>,
    staging: (*mut u8, usize),
    staged: usize,
    /// Zero-copy sends that named the registration, and those that could
    /// not (a piece outside the region too large to stage, or the
    /// staging bytes used up).
    sends: u64,
    unregistered: u64,
}

impl Registered {
    /// A region of `len` bytes registered with `ring`, after checking that
    /// the kernel takes it in a zero-copy `sendmsg` (Linux 6.15+).
    fn new(ring: &IoUring, len: usize) -> io::Result<Registered> {
        let arena = Arena::new(len, STAGING)?;
        let (base, n) = arena.region();
        let iov = libc::iovec {
            iov_base: base.cast(),
            iov_len: n,
        };
        // SAFETY: the region stays mapped while registered: the arena is
        // kept here until the ring is dropped (`Ring::drop` unregisters
        // nothing: the kernel keeps its pages pinned until the ring goes),
        // and by every buffer carved from it.
        unsafe { ring.submitter().register_buffers(&[iov]) }.map_err(|e| {
            // The pinned pages count against RLIMIT_MEMLOCK (root with
            // CAP_IPC_LOCK is exempt).
            let hint = match e.raw_os_error() {
                Some(libc::ENOMEM | libc::EPERM) => {
                    " (each thread pins its region: within the locked-memory limit, `ulimit -l`?)"
                }
                _ => "",
            };
            io::Error::new(
                e.kind(),
                format!("uring_registered_buffers: registering {n} bytes with the ring: {e}{hint}"),
            )
        })?;
        let reg = Registered {
            staging: arena.staging(),
            arena,
            staged: 0,
            sends: 0,
            unregistered: 0,
        };
        reg.probe(ring)?;
        Ok(reg)
    }

    /// Sends a byte of the staging bytes over UDP on loopback with a
    /// zero-copy `sendmsg` naming the registration: kernels before 6.15
    /// refuse it (`EINVAL`), which is better said at start than by every
    /// connection's first large read failing.
    fn probe(&self, ring: &IoUring) -> io::Result<()> {
        let to = std::net::UdpSocket::bind("127.0.0.1:0")?;
        let from = std::net::UdpSocket::bind("127.0.0.1:0")?;
        from.connect(to.local_addr()?)?;
        let mut iov = [libc::iovec {
            iov_base: self.staging.0.cast(),
            iov_len: 1,
        }];
        // SAFETY: a zeroed msghdr is valid; it names `iov` below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = iov.as_mut_ptr();
        msg.msg_iovlen = 1;
        let e = opcode::SendMsgZc::new(types::Fd(from.as_raw_fd()), &msg)
            .buf_index(Some(0))
            .build()
            .user_data(u64::MAX);
        // SAFETY: `msg`, `iov` and the byte they name live until both
        // completions (the result and the notification) were reaped
        // below; the ring has no other work yet.
        unsafe { ring.submission_shared().push(&e) }
            .map_err(|_| io::Error::other("the ring's submission queue is full"))?;
        let mut res = None;
        let mut notif = false;
        while res.is_none() || (res.is_some_and(|r: i32| r >= 0) && !notif) {
            if let Err(e) = ring.submit_and_wait(1) {
                // (Submitted or not, the message was read at submission;
                // an interrupted wait is waited again.)
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
            // SAFETY: this thread is the ring's only user.
            for c in unsafe { ring.completion_shared() } {
                if cqueue::notif(c.flags()) {
                    notif = true;
                } else {
                    res = Some(c.result());
                    notif |= !cqueue::more(c.flags());
                }
            }
        }
        match res {
            Some(r) if r >= 0 => Ok(()),
            Some(r) => Err(io::Error::new(
                io::Error::from_raw_os_error(-r).kind(),
                format!(
                    "uring_registered_buffers: this kernel refuses a zero-copy sendmsg from a registered buffer (Linux 6.15+): {}; set it to 0",
                    io::Error::from_raw_os_error(-r)
                ),
            )),
            None => Err(io::Error::other("uring_registered_buffers: no completion")),
        }
    }

    /// Copies the pieces of `iov` outside the region into the staging
    /// bytes (pointing the iovecs there): `Some(0)`, the registered
    /// buffer's index, if every piece then lies within the region; `None`
    /// (nothing changed) if the pieces outside are more than
    /// [`STAGE_MAX`] bytes or do not fit.
    ///
    /// # Safety
    /// The iovecs name readable memory; no send in flight names the
    /// staging bytes past `staged` (they are reset only when every send
    /// and notification of the poll has come).
    unsafe fn stage(&mut self, iov: &mut [libc::iovec]) -> Option<u16> {
        let outside = |v: &libc::iovec| !self.arena.contains(v.iov_base as usize, v.iov_len);
        let need: usize = iov.iter().filter(|v| outside(v)).map(|v| v.iov_len).sum();
        if need > STAGE_MAX || need > self.staging.1 - self.staged {
            self.unregistered += 1;
            return None;
        }
        for v in iov.iter_mut() {
            if self.arena.contains(v.iov_base as usize, v.iov_len) {
                continue;
            }
            // SAFETY: `staged + len <= staging` (checked above): within
            // the mapping.
            let dst = unsafe { self.staging.0.add(self.staged) };
            // SAFETY: the source is readable (the caller's contract) and
            // does not overlap the staging bytes (it lies outside the
            // region); no send in flight names these staging bytes.
            unsafe { std::ptr::copy_nonoverlapping(v.iov_base as *const u8, dst, v.iov_len) };
            v.iov_base = dst.cast();
            self.staged += v.iov_len;
        }
        self.sends += 1;
        Some(0)
    }
}

/// A connection's socket on its thread's ring.
pub(crate) struct UringSock {
    stream: TcpStream,
    ring: RingRef,
    key: u32,
}

impl Drop for UringSock {
    fn drop(&mut self) {
        if let Ok(mut r) = self.ring.try_borrow_mut() {
            r.remove(self.key);
        }
    }
}

impl Wire for UringSock {
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
        let mut r = self.ring.borrow_mut();
        let r = &mut *r;
        let key = self.key as usize;
        if r.slots[key].rx.is_empty() {
            let s = &r.slots[key];
            return match (s.err, s.eof) {
                (Some(e), _) => Err(io::Error::from_raw_os_error(e)),
                (None, true) => Ok(Some(0)),
                (None, false) => Ok(None),
            };
        }
        let mut n = 0;
        for dst in [first, second] {
            let mut at = 0;
            while at < dst.len() {
                let Some(&p) = r.slots[key].rx.front() else {
                    break;
                };
                let src = r.buf(p);
                let k = src.len().min(dst.len() - at);
                dst[at..at + k].copy_from_slice(&src[..k]);
                at += k;
                let front = r.slots[key].rx.front_mut().expect("just seen");
                front.at += k as u32;
                if front.at == front.end {
                    r.slots[key].rx.pop_front();
                    r.bufs.give(p.bid);
                }
            }
            n += at;
        }
        Ok(Some(n))
    }

    /// # Safety
    /// As the trait's, and the memory stays valid and unwritten until
    /// the thread's poll ends (`Ring::end` waits for the send, and for a
    /// zero-copy send's notification).
    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        let mut r = self.ring.borrow_mut();
        let r = &mut *r;
        let key = self.key as usize;
        let s = &mut r.slots[key];
        if let Some(res) = s.sent.take() {
            return match res {
                n if n >= 0 => Ok(n as usize),
                e if e == -libc::EAGAIN => Ok(0),
                e => Err(io::Error::from_raw_os_error(-e)),
            };
        }
        if s.sending || iov.is_empty() {
            return Ok(0);
        }
        s.iov.clear();
        s.iov.extend_from_slice(&iov[..iov.len().min(MAX_IOV)]);
        s.msg.msg_iov = s.iov.as_mut_ptr();
        s.msg.msg_iovlen = s.iov.len() as _;
        let flags = (libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) as u32;
        let msg: *const libc::msghdr = &*s.msg;
        let e = if r.zc_threshold != 0 && zc_worth(&s.iov, r.zc_threshold) {
            r.zc_sends += 1;
            let t = tag(self.key, s.gen, OP_SEND_ZC);
            let buf = match r.reg.as_mut() {
                // SAFETY: the iovecs name readable memory (the caller's
                // contract); the staging bytes past `staged` are named by
                // no send (reset only when the poll's sends and
                // notifications have all come, `Ring::end`).
                Some(g) => unsafe { g.stage(&mut s.iov) },
                None => None,
            };
            match s.fixed {
                Some(f) => opcode::SendMsgZc::new(types::Fixed(f), msg)
                    .flags(flags)
                    .ioprio(SEND_ZC_REPORT_USAGE)
                    .buf_index(buf)
                    .build(),
                None => opcode::SendMsgZc::new(types::Fd(s.fd), msg)
                    .flags(flags)
                    .ioprio(SEND_ZC_REPORT_USAGE)
                    .buf_index(buf)
                    .build(),
            }
            .user_data(t)
        } else {
            let t = tag(self.key, s.gen, OP_SEND);
            match s.fixed {
                Some(f) => opcode::SendMsg::new(types::Fixed(f), msg)
                    .flags(flags)
                    .build(),
                None => opcode::SendMsg::new(types::Fd(s.fd), msg)
                    .flags(flags)
                    .build(),
            }
            .user_data(t)
        };
        // The message and iovecs stay in the slot, unchanged, until the
        // send completes (`sending`); the memory they name per the
        // caller's contract.
        r.push(&e)?;
        let s = &mut r.slots[key];
        s.sending = true;
        r.sending += 1;
        Ok(0)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.stream.shutdown(how)
    }

    #[inline]
    fn sent(&mut self) -> Option<io::Result<usize>> {
        let mut r = self.ring.borrow_mut();
        let res = r.slots[self.key as usize].sent.take()?;
        Some(match res {
            n if n >= 0 => Ok(n as usize),
            e if e == -libc::EAGAIN => Ok(0),
            e => Err(io::Error::from_raw_os_error(-e)),
        })
    }
}

/// Whether a send of `iov` carries at least `threshold` bytes (a
/// zero-copy send's pinning and notification cost more than copying a
/// few bytes).
#[cold]
fn zc_worth(iov: &[libc::iovec], threshold: usize) -> bool {
    let mut n = 0;
    for v in iov {
        n += v.iov_len;
        if n >= threshold {
            return true;
        }
    }
    false
}

/// What a thread keeps for `uring`: its ring.
pub(crate) struct UringThread {
    ring: RingRef,
}

impl SockImpl for UringSock {
    type Thread = UringThread;

    fn thread(ctx: &mut ThreadCtx, o: &TransportOptions) -> io::Result<UringThread> {
        let ring = Ring::new(o)?;
        ctx.register_wake_fd(ring.event.as_fd())
            .map_err(|e| io::Error::other(e.to_string()))?;
        Ok(UringThread {
            ring: Rc::new(RefCell::new(ring)),
        })
    }

    fn conn(
        t: &mut UringThread,
        _ctx: &mut ThreadCtx,
        id: u64,
        s: TcpStream,
        shared: Arc<Shared>,
        cache: Rc<Cache>,
        thread: usize,
        now: Instant,
    ) -> io::Result<Conn<UringSock>> {
        s.set_nonblocking(true)?;
        s.set_nodelay(true)?;
        let addrs = (s.local_addr()?, s.peer_addr()?);
        let key = t.ring.borrow_mut().add(s.as_raw_fd())?;
        let w = UringSock {
            stream: s,
            ring: t.ring.clone(),
            key,
        };
        Ok(Conn::with_wire(id, w, addrs, shared, cache, thread, now))
    }

    fn forget(_t: &mut UringThread, _ctx: &mut ThreadCtx, _c: &mut Conn<UringSock>) {}

    fn arena(t: &UringThread) -> Option<Arc<Arena>> {
        t.ring.borrow().reg.as_ref().map(|g| g.arena.clone())
    }

    #[inline]
    fn begin_poll(t: &mut UringThread) {
        t.ring.borrow_mut().begin();
    }

    #[inline]
    fn end_poll(t: &mut UringThread) -> bool {
        t.ring.borrow_mut().end()
    }

    fn may_sleep(t: &UringThread) -> bool {
        t.ring.try_borrow_mut().is_ok_and(|mut r| r.may_sleep())
    }
}

/// Whether this kernel gives what `uring` needs (a ring as the threads
/// set it up): checked before the target starts.
pub(crate) fn probe(o: &TransportOptions) -> io::Result<()> {
    Ring::new(o).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::{class, Pool};
    use std::io::Read;

    /// A ring with registered buffers, and a connected pair: our end on
    /// the ring, the peer's plain.
    fn setup() -> (RingRef, UringSock, TcpStream, Cache) {
        let o = TransportOptions {
            uring_zcopy_threshold: 1,
            uring_registered_buffers: 1 << 20,
            ..TransportOptions::default()
        };
        let ring = Rc::new(RefCell::new(Ring::new(&o).unwrap()));
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        let key = ring.borrow_mut().add(s.as_raw_fd()).unwrap();
        let sock = UringSock {
            stream: s,
            ring: ring.clone(),
            key,
        };
        let arena = ring.borrow().reg.as_ref().map(|g| g.arena.clone());
        let cache = Cache::new(Arc::new(Pool::new(1 << 20)), 0).with_arena(arena);
        (ring, sock, peer, cache)
    }

    /// Sends `pieces` as one send, ends the poll, and returns what the
    /// send took and what the peer read.
    fn send(
        ring: &RingRef,
        sock: &mut UringSock,
        peer: &mut TcpStream,
        pieces: &[&[u8]],
    ) -> (usize, Vec<u8>) {
        let iov: Vec<libc::iovec> = pieces
            .iter()
            .map(|p| libc::iovec {
                iov_base: p.as_ptr() as *mut _,
                iov_len: p.len(),
            })
            .collect();
        // SAFETY: the pieces outlive the poll, which ends below and waits
        // for the send and its notification.
        assert_eq!(unsafe { sock.send_iov(&iov) }.unwrap(), 0, "queued");
        ring.borrow_mut().end();
        let n = sock.sent().expect("completed").unwrap();
        let mut got = vec![0; n];
        peer.read_exact(&mut got).unwrap();
        (n, got)
    }

    #[test]
    fn a_zero_copy_send_from_the_region_names_the_registration_and_stages_its_headers() {
        let (ring, mut sock, mut peer, cache) = setup();
        let (k, cap) = class(64 << 10);
        let mut data = cache.take(k, cap, true).unwrap();
        assert!(data.in_arena());
        for (i, b) in data.as_mut_slice().iter_mut().enumerate() {
            *b = (i * 7 % 251) as u8;
        }
        let head = [0xA5u8; 24];
        let tail = [0x5Au8; 16];
        let want: Vec<u8> = [&head[..], data.as_slice(), &tail[..]].concat();
        let (n, got) = send(
            &ring,
            &mut sock,
            &mut peer,
            &[&head, data.as_slice(), &tail],
        );
        assert_eq!(n, want.len());
        assert!(got == want, "the bytes, in order");
        let r = ring.borrow();
        let g = r.reg.as_ref().unwrap();
        assert_eq!((g.sends, g.unregistered, r.zc_sends), (1, 0, 1));
        assert_eq!(g.staged, 0, "the staging starts over when the poll ends");
    }

    #[test]
    fn a_send_from_the_heap_or_with_too_much_outside_goes_unregistered() {
        let (ring, mut sock, mut peer, cache) = setup();
        // Data from the heap: copying it would be no zero-copy.
        let heap = crate::buf::AlignedBuf::new(64 << 10).unwrap();
        let (n, got) = send(&ring, &mut sock, &mut peer, &[&[1; 8], heap.as_slice()]);
        assert_eq!((n, got.len()), ((64 << 10) + 8, (64 << 10) + 8));
        {
            let r = ring.borrow();
            let g = r.reg.as_ref().unwrap();
            assert_eq!((g.sends, g.unregistered), (0, 1));
        }
        // From the region, with more than a header's worth beside it.
        let (k, cap) = class(4096);
        let data = cache.take(k, cap, true).unwrap();
        let big = vec![3u8; STAGE_MAX + 1];
        let (n, got) = send(&ring, &mut sock, &mut peer, &[data.as_slice(), &big]);
        assert_eq!(n, 4096 + STAGE_MAX + 1);
        assert!(got[4096..].iter().all(|&b| b == 3));
        let r = ring.borrow();
        let g = r.reg.as_ref().unwrap();
        assert_eq!((g.sends, g.unregistered, r.zc_sends), (0, 2, 2));
    }
}
