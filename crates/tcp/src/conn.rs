//! One NVMe/TCP connection (one queue) of the host: a socket driving the
//! I/O-free host engine (`crate::engine::host`). Connection setup
//! (ICReq/ICResp, `engine::ic`) blocks on the socket; afterwards the
//! socket is non-blocking: what the engine queues goes out in one
//! `writev` per flush, and what the socket has is read into a
//! per-connection buffer and handed to the engine, which parses PDUs,
//! copies C2HData into the commands' buffers and hands completions out
//! per CID slot.
//!
//! Data buffers are addressed by the "bus addresses" the core hands the
//! transport, which for this transport are virtual addresses (see
//! `crate::mem`). The core guarantees a command's buffer stays allocated
//! and unreachable by safe code from the push until the completion is
//! delivered (or until the queue is restarted); the engine only reads or
//! writes it inside that window (see its module docs), and dropping or
//! restarting the connection drops everything that points at buffers.
use std::io::{IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

use pollux_spec::tcp::Digests;
use pollux_spec::{Cqe, Sqe};
use zerocopy::IntoBytes;

pub(crate) use crate::engine::host::{Data, Slot};
use crate::engine::host::{HostError, HostErrorKind, HostQueue};
use crate::engine::ic;
use crate::mem::TcpMem;
use crate::uring::{HostRing, RingError, UringOptions, IOV_MAX};

/// What went wrong on a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnErrorKind {
    /// TCP connect or connection setup (ICReq/ICResp) failed.
    Connect,
    /// The controller closed the connection.
    Closed,
    /// A socket call failed.
    Io,
    /// The controller sent a PDU that fails the checks; the host sent a
    /// Termination Request and closed the connection.
    BadPdu,
    /// The controller sent a Termination Request.
    TermReq,
    /// The controller broke the protocol otherwise (data or a completion
    /// for a command that is not outstanding, ...).
    Protocol,
    /// No answer in time.
    Timeout,
    /// The connection was torn down by the host.
    Shutdown,
}

/// An error of one connection: where (controller address, queue) and why.
#[derive(Clone, Debug, thiserror::Error)]
#[error("NVMe/TCP {addr} qid {qid}: {what}")]
pub struct ConnError {
    pub addr: SocketAddr,
    pub qid: u16,
    pub kind: ConnErrorKind,
    pub what: String,
}

/// Most bytes one receive call reads.
const RX_BUF: usize = 256 << 10;
/// Most bytes of the next provided buffer copied after a cut header
/// (`poll_direct`): more than any header with its digest.
const STITCH: usize = 256;

/// How a connection's socket is driven once it is set up.
pub(crate) enum Wire {
    /// Non-blocking `writev`/`read` (`sock_impl:posix`).
    Posix,
    /// Its own io_uring (`sock_impl:uring`; see `crate::uring`).
    Uring(Box<HostRing>),
}

pub(crate) struct Conn {
    // (Before `sock`: the ring, which may hold the socket as a registered
    // file, ends before the socket closes.)
    wire: Wire,
    sock: TcpStream,
    pub addr: SocketAddr,
    pub qid: u16,
    eng: HostQueue<TcpMem>,
    rx: Vec<u8>,
    rs: usize,
    re: usize,
    /// Set once the connection failed: every later call returns it.
    pub dead: Option<ConnError>,
    /// writev calls made (the "doorbells" of this transport).
    pub sends: u64,
}

impl Conn {
    fn err(&self, kind: ConnErrorKind, what: impl Into<String>) -> ConnError {
        ConnError {
            addr: self.addr,
            qid: self.qid,
            kind,
            what: what.into(),
        }
    }

    /// Connects to `addr` and initializes the connection (ICReq/ICResp)
    /// asking for `digests`; `slots` command slots; `busy_poll_us`: the
    /// socket's `SO_BUSY_POLL` (0: left alone).
    pub fn connect(
        addr: SocketAddr,
        qid: u16,
        digests: Digests,
        slots: usize,
        timeout: Duration,
        busy_poll_us: u32,
    ) -> Result<Conn, ConnError> {
        let cerr = |what: String| ConnError {
            addr,
            qid,
            kind: ConnErrorKind::Connect,
            what,
        };
        let sock = TcpStream::connect_timeout(&addr, timeout)
            .map_err(|e| cerr(format!("TCP connect: {e}")))?;
        sock.set_nodelay(true)
            .map_err(|e| cerr(format!("TCP_NODELAY: {e}")))?;
        if busy_poll_us > 0 {
            crate::sockopt::set_busy_poll(sock.as_fd(), busy_poll_us)
                .map_err(|e| cerr(format!("SO_BUSY_POLL: {e}")))?;
        }
        sock.set_read_timeout(Some(timeout))
            .map_err(|e| cerr(format!("socket timeout: {e}")))?;
        let req = ic::host_icreq(digests);
        (&sock)
            .write_all(req.as_bytes())
            .map_err(|e| cerr(format!("sending ICReq: {e}")))?;
        let mut hdr = [0u8; 8];
        (&sock)
            .read_exact(&mut hdr)
            .map_err(|e| cerr(format!("waiting for ICResp: {e}")))?;
        let plen = ic::host_first_pdu_len(&hdr).map_err(cerr)?;
        let mut pdu = vec![0u8; plen as usize];
        pdu[..8].copy_from_slice(&hdr);
        (&sock)
            .read_exact(&mut pdu[8..])
            .map_err(|e| cerr(format!("reading ICResp: {e}")))?;
        let params = ic::host_icresp(&pdu, digests).map_err(cerr)?;
        sock.set_nonblocking(true)
            .map_err(|e| cerr(format!("non-blocking socket: {e}")))?;
        tracing::debug!(%addr, qid, ?params, "NVMe/TCP connection initialized");
        Ok(Conn {
            wire: Wire::Posix,
            sock,
            addr,
            qid,
            eng: HostQueue::new(TcpMem, addr, qid, params, slots),
            rx: vec![0; RX_BUF],
            rs: 0,
            re: 0,
            dead: None,
            sends: 0,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// True if received bytes wait to be parsed (or, on io_uring,
    /// wait in the ring).
    pub fn has_rx(&self) -> bool {
        self.re > self.rs
            || match &self.wire {
                Wire::Posix => false,
                Wire::Uring(r) => r.has_rx(),
            }
    }

    /// From now on, the socket goes through an io_uring of its own
    /// (`sock_impl:uring`), which the thread that next flushes or polls
    /// the connection enables (see `crate::uring`). For I/O queues, once
    /// they are connected: the setup exchanges are over.
    pub fn use_uring(&mut self, o: &UringOptions) -> Result<(), ConnError> {
        let ring = HostRing::new(self.sock.as_raw_fd(), true, o).map_err(|e| {
            self.err(
                ConnErrorKind::Connect,
                format!("sock_impl:uring: setting up an io_uring: {e}"),
            )
        })?;
        self.wire = Wire::Uring(ring);
        Ok(())
    }

    /// The command slots, by wire CID.
    pub fn slots(&self) -> &[Slot] {
        &self.eng.slots
    }

    pub fn slots_mut(&mut self) -> &mut [Slot] {
        &mut self.eng.slots
    }

    /// Most in-capsule data bytes for a write.
    pub fn set_icd_max(&mut self, bytes: u32) {
        self.eng.icd_max = bytes;
    }

    fn fail(&mut self, e: ConnError) -> ConnError {
        if self.dead.is_none() {
            tracing::error!("{e}");
            self.dead = Some(e.clone());
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            // Nothing may point at command buffers any more.
            self.eng.tx.clear();
        }
        self.dead.clone().unwrap_or(e)
    }

    fn check_alive(&self) -> Result<(), ConnError> {
        match &self.dead {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Forgets every command (the queue is restarted or torn down).
    pub fn forget_all(&mut self) {
        self.eng.forget_all();
    }

    /// Queues a command capsule (and in-capsule data) for slot `wcid`.
    ///
    /// # Safety
    /// As for `HostQueue::submit`: with `Data::Out` or `Data::In`, the
    /// buffer at `addr` is one of this transport's that stays allocated
    /// and untouched by anyone else until the command's completion is
    /// handed out or the connection forgets it (`forget_all`, dropped).
    #[inline]
    pub unsafe fn submit(
        &mut self,
        wcid: u16,
        sqe: Sqe,
        data: Data<'_>,
        tag: u16,
        internal: bool,
    ) -> Result<(), ConnError> {
        self.check_alive()?;
        // SAFETY: the caller's contract.
        unsafe { self.eng.submit(wcid, sqe, data, tag, internal) }
            .map_err(|e| self.err(ConnErrorKind::Protocol, e.what))
    }

    /// Sends what is queued, as far as the socket takes it.
    #[inline]
    pub fn flush_tx(&mut self) -> Result<(), ConnError> {
        self.check_alive()?;
        match self.wire {
            Wire::Posix => self.flush_posix(),
            Wire::Uring(_) => self.flush_uring(),
        }
    }

    #[inline]
    fn flush_posix(&mut self) -> Result<(), ConnError> {
        while !self.eng.tx.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV_MAX];
            // SAFETY: a queued segment of a command's buffer belongs to an
            // outstanding command (the engine detaches it before the
            // completion), so the buffer is valid and unwritten.
            let k = unsafe { self.eng.tx.iovecs(&TcpMem, &mut iov) };
            self.sends += 1;
            match (&self.sock).write_vectored(&iov[..k]) {
                Ok(0) => {
                    let e = self.err(ConnErrorKind::Closed, "connection closed while sending");
                    return Err(self.fail(e));
                }
                Ok(w) => self.eng.tx.advance(w, |_| {}),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = self.err(ConnErrorKind::Io, format!("send: {e}"));
                    return Err(self.fail(e));
                }
            }
        }
        Ok(())
    }

    /// True if queued bytes wait to be sent.
    #[inline]
    pub fn tx_pending(&self) -> bool {
        !self.eng.tx.is_empty()
    }

    /// Reads what the socket has; false if nothing new.
    fn fill(&mut self) -> Result<bool, ConnError> {
        if self.rs == self.re {
            self.rs = 0;
            self.re = 0;
        } else if self.re == self.rx.len() {
            self.rx.copy_within(self.rs..self.re, 0);
            self.re -= self.rs;
            self.rs = 0;
        }
        if let Wire::Uring(_) = self.wire {
            return self.fill_uring();
        }
        loop {
            match (&self.sock).read(&mut self.rx[self.re..]) {
                Ok(0) => {
                    let e = self.err(ConnErrorKind::Closed, "connection closed by the controller");
                    return Err(self.fail(e));
                }
                Ok(k) => {
                    self.re += k;
                    return Ok(true);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = self.err(ConnErrorKind::Io, format!("receive: {e}"));
                    return Err(self.fail(e));
                }
            }
        }
    }

    /// Enables the ring of a `Wire::Uring` connection on the calling
    /// thread if it is not yet.
    #[inline]
    fn ensure_ring(&mut self) -> Result<(), ConnError> {
        if let Wire::Uring(r) = &mut self.wire {
            if !r.is_enabled() {
                if let Err(e) = r.enable() {
                    let e = self.err(ConnErrorKind::Io, format!("enabling the io_uring: {e}"));
                    return Err(self.fail(e));
                }
                tracing::debug!(addr = %self.addr, qid = self.qid, "I/O queue on io_uring");
            }
        }
        Ok(())
    }

    #[cold]
    fn ring_error(&mut self, e: RingError, what: &str) -> ConnError {
        let e = match e {
            RingError::Closed => self.err(
                ConnErrorKind::Closed,
                format!("connection closed while {what} (io_uring)"),
            ),
            RingError::Io(e) => self.err(ConnErrorKind::Io, format!("{what} (io_uring): {e}")),
        };
        self.fail(e)
    }

    /// `flush_tx` on io_uring: each batch of iovecs as one `SENDMSG`,
    /// waited for (see `crate::uring`).
    #[inline]
    fn flush_uring(&mut self) -> Result<(), ConnError> {
        self.ensure_ring()?;
        while !self.eng.tx.is_empty() {
            let Wire::Uring(r) = &mut self.wire else {
                return Ok(());
            };
            // SAFETY: a queued segment of a command's buffer belongs to an
            // outstanding command (the engine detaches it before the
            // completion), so the buffer is valid and unwritten until the
            // send below returns, which waits for the kernel to be done;
            // the send queue is not changed meanwhile either.
            let k = unsafe { self.eng.tx.iovecs_raw(&TcpMem, r.iov_mut(), IOV_MAX) };
            let total = r.iov_bytes();
            self.sends += 1;
            // SAFETY: as above: the ring's iovecs name the send queue's
            // bytes and outstanding commands' buffers, valid until `send`
            // returns.
            let res = if k == 0 { Ok(0) } else { unsafe { r.send() } };
            match res {
                Ok(0) => break,
                Ok(w) => {
                    self.eng.tx.advance(w, |_| {});
                    if w < total {
                        break;
                    }
                }
                Err(e) => return Err(self.ring_error(e, "sending")),
            }
        }
        Ok(())
    }

    /// `fill` on io_uring: what the receive put in the provided buffers,
    /// copied into the receive buffer.
    #[inline]
    fn fill_uring(&mut self) -> Result<bool, ConnError> {
        self.ensure_ring()?;
        let Wire::Uring(r) = &mut self.wire else {
            return Ok(false);
        };
        match r.recv(&mut self.rx[self.re..]) {
            Ok(0) => Ok(false),
            Ok(k) => {
                self.re += k;
                Ok(true)
            }
            Err(e) => Err(self.ring_error(e, "receiving")),
        }
    }

    /// The engine found the connection broken: send the Termination
    /// Request it calls for, if any, and close.
    #[cold]
    fn engine_error(&mut self) -> ConnError {
        let e = self.eng.take_error().unwrap_or_else(|| HostError {
            kind: HostErrorKind::Protocol,
            what: "connection failed".into(),
            term: None,
        });
        if let Some(pdu) = &e.term {
            // Best effort, blocking briefly: the connection ends anyway.
            self.eng.tx.clear();
            let _ = self.sock.set_nonblocking(false);
            let _ = self
                .sock
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = (&self.sock).write_all(pdu);
        }
        let kind = match e.kind {
            HostErrorKind::BadPdu => ConnErrorKind::BadPdu,
            HostErrorKind::TermReq => ConnErrorKind::TermReq,
            HostErrorKind::Protocol => ConnErrorKind::Protocol,
        };
        let ce = self.err(kind, e.what);
        self.fail(ce)
    }

    /// Receives and handles PDUs until `budget` completions were handed to
    /// `f` or the socket has nothing more; sends what R2Ts asked for.
    /// `f(wcid, slot, cqe)` gets each completion; the slot is released after.
    /// Returns the completions handed out, and the error that ended the
    /// connection, if one did (completions before it were still handed out).
    #[inline]
    pub fn poll(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> (u32, Result<(), ConnError>) {
        let mut n = 0;
        let r = self.poll_inner(budget, f, &mut n);
        (n, r)
    }

    #[inline]
    fn poll_inner(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
        n: &mut u32,
    ) -> Result<(), ConnError> {
        self.check_alive()?;
        if let Wire::Uring(r) = &self.wire {
            if r.direct {
                return self.poll_direct(budget, f, n);
            }
        }
        while *n < budget {
            // (Nothing buffered, nothing to hand the engine: the host's
            // engine needs bytes to move on. An empty poll goes straight
            // to the socket.)
            if self.re > self.rs {
                let r = self.eng.receive(&self.rx[self.rs..self.re], budget - *n, f);
                self.rs += r.consumed;
                *n += r.completed;
                if r.failed {
                    return Err(self.engine_error());
                }
                if *n >= budget {
                    break;
                }
            }
            // Completions were handed out and nothing is left buffered:
            // return, so the caller acts on them (and sends what it
            // submits) before another receive, which would most often find
            // nothing (at QD 1, one empty receive in every round trip).
            if *n > 0 && self.rs == self.re {
                break;
            }
            if !self.fill()? {
                break;
            }
        }
        if self.tx_pending() {
            self.flush_tx()?;
        }
        Ok(())
    }

    /// `poll_inner` on io_uring with `uring_direct`: PDUs are parsed
    /// where the receive put them (the provided buffers), not copied into
    /// the receive buffer first. Only a header cut by the end of a buffer
    /// is: its start goes to the receive buffer, followed by the first
    /// bytes of the next buffer ([`STITCH`] at most), and once the engine
    /// is past the cut it goes on in the buffer itself.
    #[inline]
    fn poll_direct(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
        n: &mut u32,
    ) -> Result<(), ConnError> {
        self.ensure_ring()?;
        let r = self.direct_inner(budget, f, n);
        match r {
            Ok(()) => {}
            Err(Some(e)) => return Err(self.ring_error(e, "receiving")),
            Err(None) => return Err(self.engine_error()),
        }
        if self.tx_pending() {
            self.flush_tx()?;
        }
        Ok(())
    }

    /// The loop of `poll_direct`; `Err(None)`: the engine failed.
    #[inline]
    fn direct_inner(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
        n: &mut u32,
    ) -> Result<(), Option<RingError>> {
        let Wire::Uring(ring) = &mut self.wire else {
            return Ok(());
        };
        while *n < budget {
            if self.re > self.rs {
                // A cut header (or bytes left from the setup exchanges):
                // the next buffer's first bytes after it.
                let Some(src) = ring.front() else {
                    if !ring.collect().map_err(Some)? {
                        break;
                    }
                    continue;
                };
                if self.rs > 0 {
                    self.rx.copy_within(self.rs..self.re, 0);
                    self.re -= self.rs;
                    self.rs = 0;
                }
                let l = self.re;
                let c = src.len().min(STITCH).min(self.rx.len() - l);
                if c == 0 {
                    // (The receive buffer is full of an unfinished
                    // header: cannot happen, headers are small.)
                    break;
                }
                self.rx[l..l + c].copy_from_slice(&src[..c]);
                self.re = l + c;
                let r = self.eng.receive(&self.rx[..self.re], budget - *n, f);
                *n += r.completed;
                if r.failed {
                    return Err(None);
                }
                if r.consumed >= l {
                    // Past the cut: what is left of the copy is still in
                    // the buffer, which goes on from there.
                    ring.consume(r.consumed - l);
                    self.rs = 0;
                    self.re = 0;
                } else {
                    // Still short of a whole header: the copied bytes
                    // live on in the receive buffer.
                    ring.consume(c);
                    self.rs = r.consumed;
                }
            } else if let Some(src) = ring.front() {
                let len = src.len();
                let r = self.eng.receive(src, budget - *n, f);
                *n += r.completed;
                if r.failed {
                    return Err(None);
                }
                ring.consume(r.consumed);
                if r.consumed < len && *n < budget {
                    // The engine needs more than the buffer has: a header
                    // cut by its end. Its start goes to the receive buffer.
                    if let Some(rest) = ring.front() {
                        let k = rest.len();
                        self.rx[..k].copy_from_slice(rest);
                        self.rs = 0;
                        self.re = k;
                        ring.consume(k);
                    }
                }
            } else {
                // Completions were handed out and nothing is left
                // received: return (as `poll_inner` does).
                if *n > 0 {
                    break;
                }
                if !ring.collect().map_err(Some)? {
                    break;
                }
            }
        }
        ring.publish();
        Ok(())
    }

    /// Runs one command on an otherwise idle connection and waits for it
    /// (connection setup: Connect; the admin link's own commands).
    pub fn exec_sync(
        &mut self,
        wcid: u16,
        sqe: Sqe,
        data: Data<'_>,
        timeout: Duration,
        what: &str,
    ) -> Result<(Cqe, Vec<u8>), ConnError> {
        if matches!(data, Data::Out { .. } | Data::In { .. }) {
            return Err(self.err(
                ConnErrorKind::Protocol,
                format!("{what}: only in-capsule or bounce data here"),
            ));
        }
        // SAFETY: no buffer address: the data is copied into the capsule
        // or comes back in the slot's bounce buffer.
        unsafe { self.submit(wcid, sqe, data, wcid, true) }?;
        let start = Instant::now();
        loop {
            self.flush_tx()?;
            let mut got = None;
            self.poll(u32::MAX, &mut |c, s: &mut Slot, cqe| {
                if c == wcid {
                    got = Some((cqe, std::mem::take(&mut s.bounce)));
                }
            })
            .1?;
            if let Some(g) = got {
                return Ok(g);
            }
            let el = start.elapsed();
            if el >= timeout {
                if let Some(s) = self.eng.slots.get_mut(wcid as usize) {
                    s.active = false;
                }
                return Err(self.err(
                    ConnErrorKind::Timeout,
                    format!("no answer to {what} within {} ms", timeout.as_millis()),
                ));
            }
            let _ = pollux_nvme::wait_readable(
                &[self.fd()],
                Some((timeout - el).min(Duration::from_millis(10))),
            );
        }
    }
}
