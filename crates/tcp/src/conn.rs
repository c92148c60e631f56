//! One NVMe/TCP connection (one queue): connection setup (ICReq/ICResp),
//! command capsules with their data (in-capsule, or R2T/H2CData), and the
//! receive side: a per-connection buffer parsed into PDUs with
//! `pollux_spec::tcp`'s validating checker, C2HData copied into the
//! command's buffer after its offset and length are checked against the
//! command (never trusting the controller), completions handed to the
//! caller per CID slot.
//!
//! Data buffers are addressed by the "bus addresses" the core hands the
//! transport, which for this transport are virtual addresses (see
//! `crate::mem`). The core guarantees a command's buffer stays allocated
//! and unreachable by safe code from the push until the completion is
//! delivered (or until the queue is restarted); this connection only reads
//! or writes it inside that window: a slot is active from `submit` until
//! its completion is handed out, queued send segments pointing at a buffer
//! (in-capsule data or H2CData) are copied out before its completion is
//! delivered (`detach_segments`: a controller may answer before it has
//! read the data), and dropping or restarting the connection drops
//! everything that points at buffers.
use std::collections::VecDeque;
use std::io::{IoSlice, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use pollux_spec::fabrics::SglDescriptor;
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    append_header, check_data_range, data_digest, digest_bytes, CapsuleCmd, CheckMemo,
    CommonHeader, DataDigest, Digests, H2CData, IcReq, PduError, PduHeader, PduLayout, PduType,
    Role, RxConfig, TermReq,
};
use pollux_spec::{Cqe, Sqe, Status};
use zerocopy::IntoBytes;

use crate::mem;

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

/// Data of a command, as `Conn::submit` takes it.
pub(crate) enum Data<'a> {
    None,
    /// Bytes the connection copies into the capsule at once (Connect data,
    /// a Dataset Management range). Must fit in-capsule.
    Bytes(&'a [u8]),
    /// Host to controller: `len` bytes at address `addr`.
    Out {
        addr: u64,
        len: u32,
    },
    /// Controller to host: into `len` bytes at address `addr`.
    In {
        addr: u64,
        len: u32,
    },
    /// Controller to host into the slot's own bounce buffer.
    InBounce {
        len: u32,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    None,
    /// Data to send when the controller asks (R2T).
    Out,
    /// Data the controller sends (C2HData) into `addr`.
    In,
    /// Data the controller sends into `bounce`.
    InBounce,
}

/// One command slot, indexed by the CID on the wire.
pub(crate) struct Slot {
    pub active: bool,
    /// The caller's tag (the core's CID).
    pub tag: u16,
    /// A command of the transport itself (not the core's).
    pub internal: bool,
    dir: Dir,
    addr: u64,
    len: u32,
    /// Bytes received (In) or requested by R2Ts (Out) so far.
    done: u32,
    /// Received data of an `InBounce` command.
    pub bounce: Vec<u8>,
    ddgst_error: bool,
    /// The command as sent (to send it again on a new connection).
    sqe: Sqe,
    /// Times it was sent again on a new connection.
    pub tries: u8,
}

impl Slot {
    /// The command's data comes back in `bounce`.
    pub fn has_bounce(&self) -> bool {
        self.dir == Dir::InBounce
    }

    /// The command and its data's address and length, to send it again on
    /// another connection (`addr` 0 with a length: data that was copied
    /// into the capsule, which the caller keeps).
    pub fn resend(&self) -> (Sqe, u64, u32) {
        (self.sqe, self.addr, self.len)
    }

    fn empty() -> Slot {
        Slot {
            active: false,
            tag: 0,
            internal: false,
            dir: Dir::None,
            addr: 0,
            len: 0,
            done: 0,
            bounce: Vec::new(),
            ddgst_error: false,
            sqe: Sqe::new(0, 0),
            tries: 0,
        }
    }
}

/// A piece of the send stream: bytes of `tx`, or a command's buffer.
#[derive(Clone, Copy, Debug)]
enum Seg {
    Own { start: usize, len: usize },
    User { addr: u64, len: usize, slot: u16 },
}

enum Body {
    C2H {
        slot: u16,
        datao: u32,
        last: bool,
        success: bool,
    },
    Term(TermReq),
}

enum Rx {
    Header,
    Body {
        body: Body,
        layout: PduLayout,
        /// Bytes of the PDU consumed so far.
        pos: u32,
        digest: DataDigest,
        ddgst: [u8; 4],
    },
}

/// Most bytes one receive call reads.
const RX_BUF: usize = 256 << 10;
/// Largest PDU accepted (a C2HData of the largest transfer, and more).
const MAX_PLEN: u32 = 16 << 20;
/// Most segments per writev.
const IOV_MAX: usize = 64;

/// Negotiated parameters of a connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConnParams {
    pub digests: Digests,
    pub cpda: u8,
    pub maxh2cdata: u32,
}

pub(crate) struct Conn {
    sock: TcpStream,
    pub addr: SocketAddr,
    pub qid: u16,
    pub params: ConnParams,
    /// Most in-capsule data bytes for a write.
    pub icd_max: u32,
    rx_cfg: RxConfig,
    /// The last header that passed its check (most PDUs are alike).
    memo: CheckMemo,
    rx: Vec<u8>,
    rs: usize,
    re: usize,
    state: Rx,
    tx: Vec<u8>,
    segs: VecDeque<Seg>,
    /// Bytes of the first segment already sent.
    head: usize,
    pub slots: Vec<Slot>,
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
    /// asking for `digests`; `slots` command slots.
    pub fn connect(
        addr: SocketAddr,
        qid: u16,
        digests: Digests,
        slots: usize,
        timeout: Duration,
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
        sock.set_read_timeout(Some(timeout))
            .map_err(|e| cerr(format!("socket timeout: {e}")))?;
        // MAXR2T 0: one R2T outstanding per command (0's based).
        let req = IcReq::new(0, digests, 0);
        (&sock)
            .write_all(req.as_bytes())
            .map_err(|e| cerr(format!("sending ICReq: {e}")))?;
        let mut hdr = [0u8; 8];
        (&sock)
            .read_exact(&mut hdr)
            .map_err(|e| cerr(format!("waiting for ICResp: {e}")))?;
        let cfg = RxConfig::initial(Role::Host);
        let ch = CommonHeader::read(&hdr).ok_or_else(|| cerr("short ICResp".into()))?;
        let layout = ch
            .check(&cfg)
            .map_err(|e| cerr(format!("bad ICResp: {e}")))?;
        let mut pdu = vec![0u8; layout.plen as usize];
        pdu[..8].copy_from_slice(&hdr);
        (&sock)
            .read_exact(&mut pdu[8..])
            .map_err(|e| cerr(format!("reading ICResp: {e}")))?;
        let resp = match PduHeader::parse(&pdu, &layout, &cfg) {
            Ok(PduHeader::IcResp(r)) => r,
            Ok(PduHeader::TermReq(t)) => {
                return Err(cerr(format!(
                    "controller refused the connection: Termination Request {} (FEI {:#x})",
                    t.fes(),
                    t.fei()
                )))
            }
            Ok(other) => return Err(cerr(format!("expected ICResp, got {other:?}"))),
            Err(e) => return Err(cerr(format!("bad ICResp: {e}"))),
        };
        let got = resp.digests();
        if got != digests {
            return Err(cerr(format!(
                "asked for header digest {} / data digest {}, controller enabled {} / {}",
                on(digests.header),
                on(digests.data),
                on(got.header),
                on(got.data)
            )));
        }
        sock.set_nonblocking(true)
            .map_err(|e| cerr(format!("non-blocking socket: {e}")))?;
        let params = ConnParams {
            digests,
            cpda: resp.cpda,
            maxh2cdata: resp.maxh2cdata,
        };
        let rx_cfg = RxConfig {
            receiver: Role::Host,
            established: true,
            digests,
            pda: 0,
            max_plen: MAX_PLEN,
            maxh2cdata: resp.maxh2cdata,
        };
        tracing::debug!(%addr, qid, ?params, "NVMe/TCP connection initialized");
        Ok(Conn {
            sock,
            addr,
            qid,
            params,
            icd_max: 0,
            rx_cfg,
            memo: CheckMemo::default(),
            rx: vec![0; RX_BUF],
            rs: 0,
            re: 0,
            state: Rx::Header,
            tx: Vec::with_capacity(64 << 10),
            segs: VecDeque::new(),
            head: 0,
            slots: (0..slots).map(|_| Slot::empty()).collect(),
            dead: None,
            sends: 0,
        })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }

    /// True if received bytes wait to be parsed.
    pub fn has_rx(&self) -> bool {
        self.re > self.rs
    }

    fn fail(&mut self, e: ConnError) -> ConnError {
        if self.dead.is_none() {
            tracing::error!("{e}");
            self.dead = Some(e.clone());
            let _ = self.sock.shutdown(std::net::Shutdown::Both);
            // Nothing may point at command buffers any more.
            self.segs.clear();
            self.tx.clear();
            self.head = 0;
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
        self.segs.clear();
        self.tx.clear();
        self.head = 0;
        for s in &mut self.slots {
            s.active = false;
        }
    }

    fn push_own(&mut self, bytes: &[u8]) {
        let start = self.tx.len();
        self.tx.extend_from_slice(bytes);
        self.push_own_range(start, bytes.len());
    }

    fn push_own_range(&mut self, start: usize, len: usize) {
        if let Some(Seg::Own { start: s, len: l }) = self.segs.back_mut() {
            if *s + *l == start {
                *l += len;
                return;
            }
        }
        self.segs.push_back(Seg::Own { start, len });
    }

    fn push_header(&mut self, header: &[u8], layout: &PduLayout) {
        let start = self.tx.len();
        if let Some(n) = append_header(header, layout, &mut self.tx) {
            self.push_own_range(start, n);
        }
    }

    /// Queues a command capsule (and in-capsule data) for slot `wcid`.
    pub fn submit(
        &mut self,
        wcid: u16,
        mut sqe: Sqe,
        data: Data<'_>,
        tag: u16,
        internal: bool,
    ) -> Result<(), ConnError> {
        self.check_alive()?;
        let Some(slot) = self.slots.get(wcid as usize) else {
            return Err(self.err(
                ConnErrorKind::Protocol,
                format!("CID {wcid} beyond the {} slots", self.slots.len()),
            ));
        };
        if slot.active {
            return Err(self.err(
                ConnErrorKind::Protocol,
                format!("CID {wcid} is already outstanding"),
            ));
        }
        sqe.cid = wcid;
        let (desc, dir, addr, len, icd): (SglDescriptor, Dir, u64, u32, Option<Icd<'_>>) =
            match data {
                Data::None => (SglDescriptor::tcp_transport(0), Dir::None, 0, 0, None),
                Data::Bytes(b) => (
                    SglDescriptor::in_capsule(0, b.len() as u32),
                    Dir::None,
                    0,
                    b.len() as u32,
                    Some(Icd::Bytes(b)),
                ),
                Data::Out { addr, len } if len <= self.icd_max => (
                    SglDescriptor::in_capsule(0, len),
                    Dir::None,
                    addr,
                    len,
                    Some(Icd::User(addr, len)),
                ),
                Data::Out { addr, len } => {
                    (SglDescriptor::tcp_transport(len), Dir::Out, addr, len, None)
                }
                Data::In { addr, len } => {
                    (SglDescriptor::tcp_transport(len), Dir::In, addr, len, None)
                }
                Data::InBounce { len } => (
                    SglDescriptor::tcp_transport(len),
                    Dir::InBounce,
                    0,
                    len,
                    None,
                ),
            };
        desc.write_to_sqe(&mut sqe);
        let icd_len = match &icd {
            Some(Icd::Bytes(b)) => b.len() as u32,
            Some(Icd::User(_, l)) => *l,
            None => 0,
        };
        let p = self.params;
        let Some((cmd, layout)) = CapsuleCmd::new(&sqe, icd_len, p.digests, p.cpda) else {
            return Err(self.err(
                ConnErrorKind::Protocol,
                format!("capsule with {icd_len} bytes of data does not fit a PDU"),
            ));
        };
        self.push_header(cmd.as_bytes(), &layout);
        match icd {
            Some(Icd::Bytes(b)) => {
                self.push_own(b);
                if layout.ddgst {
                    self.push_own(&digest_bytes(data_digest([b])));
                }
            }
            Some(Icd::User(a, l)) => {
                self.segs.push_back(Seg::User {
                    addr: a,
                    len: l as usize,
                    slot: wcid,
                });
                if layout.ddgst {
                    // SAFETY: `a..a+l` is the command's buffer, which the
                    // core keeps allocated and untouched while the command
                    // is outstanding (see the module docs).
                    let d = data_digest([unsafe { mem::slice(a, l as usize) }]);
                    self.push_own(&digest_bytes(d));
                }
            }
            None => {}
        }
        let s = &mut self.slots[wcid as usize];
        s.active = true;
        s.sqe = sqe;
        s.tag = tag;
        s.internal = internal;
        s.dir = dir;
        s.addr = addr;
        s.len = len;
        s.done = 0;
        s.ddgst_error = false;
        s.tries = 0;
        if dir == Dir::InBounce {
            s.bounce.clear();
            s.bounce.resize(len as usize, 0);
        }
        Ok(())
    }

    /// Sends what is queued, as far as the socket takes it.
    pub fn flush_tx(&mut self) -> Result<(), ConnError> {
        self.check_alive()?;
        while !self.segs.is_empty() {
            let mut iov = [IoSlice::new(&[]); IOV_MAX];
            let mut k = 0;
            for (i, s) in self.segs.iter().enumerate().take(IOV_MAX) {
                let skip = if i == 0 { self.head } else { 0 };
                iov[k] = match *s {
                    Seg::Own { start, len } => IoSlice::new(&self.tx[start + skip..start + len]),
                    Seg::User { addr, len, .. } => {
                        // SAFETY: a queued user segment is a buffer of an
                        // outstanding command (see the module docs).
                        IoSlice::new(unsafe { mem::slice(addr + skip as u64, len - skip) })
                    }
                };
                k += 1;
            }
            self.sends += 1;
            match (&self.sock).write_vectored(&iov[..k]) {
                Ok(0) => {
                    let e = self.err(ConnErrorKind::Closed, "connection closed while sending");
                    return Err(self.fail(e));
                }
                Ok(mut w) => {
                    while w > 0 {
                        let len = match self.segs.front() {
                            Some(Seg::Own { len, .. }) | Some(Seg::User { len, .. }) => *len,
                            None => break,
                        };
                        let left = len - self.head;
                        if w >= left {
                            w -= left;
                            self.head = 0;
                            self.segs.pop_front();
                        } else {
                            self.head += w;
                            w = 0;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let e = self.err(ConnErrorKind::Io, format!("send: {e}"));
                    return Err(self.fail(e));
                }
            }
        }
        if self.segs.is_empty() {
            self.tx.clear();
            self.head = 0;
        }
        Ok(())
    }

    /// True if queued bytes wait to be sent.
    pub fn tx_pending(&self) -> bool {
        !self.segs.is_empty()
    }

    /// Copies the queued, unsent bytes of slot `wcid`'s buffer into the
    /// connection's own send buffer, so nothing points at the buffer once
    /// its completion is delivered.
    fn detach_segments(&mut self, wcid: u16) {
        if self.segs.is_empty() {
            return;
        }
        for i in 0..self.segs.len() {
            if let Seg::User { addr, len, slot } = self.segs[i] {
                if slot != wcid {
                    continue;
                }
                let skip = if i == 0 { self.head } else { 0 };
                let start = self.tx.len();
                // SAFETY: the command is still outstanding (its completion
                // is being delivered after this), so its buffer is valid.
                self.tx
                    .extend_from_slice(unsafe { mem::slice(addr + skip as u64, len - skip) });
                self.segs[i] = Seg::Own {
                    start,
                    len: len - skip,
                };
                if i == 0 {
                    self.head = 0;
                }
            }
        }
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

    /// A received PDU failed a check: send the Termination Request it
    /// calls for (with the offending header) and close.
    #[cold]
    fn bad_pdu(&mut self, e: PduError, offending: usize) -> ConnError {
        let off = &self.rx[self.rs..self.rs + offending.min(self.re - self.rs)];
        if let Some(t) = e.term_req(Role::Host, off.len()) {
            let mut pdu = t.as_bytes().to_vec();
            pdu.extend_from_slice(&off[..t.data_len() as usize]);
            // Best effort, blocking briefly: the connection ends anyway.
            self.segs.clear();
            self.tx.clear();
            self.head = 0;
            let _ = self.sock.set_nonblocking(false);
            let _ = self
                .sock
                .set_write_timeout(Some(Duration::from_millis(100)));
            let _ = (&self.sock).write_all(&pdu);
        }
        let fes = e
            .fes()
            .map_or("none".to_string(), |f| format!("{f} ({:#x})", f.0));
        let ce = self.err(
            ConnErrorKind::BadPdu,
            format!("bad PDU from the controller: {e}; sent Termination Request (FES {fes})"),
        );
        self.fail(ce)
    }

    #[cold]
    fn protocol(&mut self, what: String) -> ConnError {
        let e = self.err(ConnErrorKind::Protocol, what);
        self.fail(e)
    }

    /// Receives and handles PDUs until `budget` completions were handed to
    /// `f` or the socket has nothing more; sends what R2Ts asked for.
    /// `f(wcid, slot, cqe)` gets each completion; the slot is released after.
    /// Returns the completions handed out, and the error that ended the
    /// connection, if one did (completions before it were still handed out).
    pub fn poll(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> (u32, Result<(), ConnError>) {
        let mut n = 0;
        let r = self.poll_inner(budget, f, &mut n);
        (n, r)
    }

    fn poll_inner(
        &mut self,
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
        n: &mut u32,
    ) -> Result<(), ConnError> {
        self.check_alive()?;
        'outer: while *n < budget {
            loop {
                match self.step(f)? {
                    Step::NeedMore => break,
                    Step::Completed => {
                        *n += 1;
                        if *n >= budget {
                            break 'outer;
                        }
                    }
                    Step::Progress => {}
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
        if !self.segs.is_empty() {
            self.flush_tx()?;
        }
        Ok(())
    }

    fn step(&mut self, f: &mut impl FnMut(u16, &mut Slot, Cqe)) -> Result<Step, ConnError> {
        let avail = self.re - self.rs;
        match &mut self.state {
            Rx::Header => {
                if avail < 8 {
                    return Ok(Step::NeedMore);
                }
                let ch = CommonHeader::read(&self.rx[self.rs..self.re])
                    .ok_or_else(|| self.err(ConnErrorKind::Protocol, "short header"))?;
                let layout = match self.memo.check(&ch, &self.rx_cfg) {
                    Ok(l) => l,
                    Err(e) => return Err(self.bad_pdu(e, ch.hlen as usize)),
                };
                let need = layout.header_len() as usize;
                if avail < need {
                    return Ok(Step::NeedMore);
                }
                let hdr = match PduHeader::parse(
                    &self.rx[self.rs..self.rs + need],
                    &layout,
                    &self.rx_cfg,
                ) {
                    Ok(h) => h,
                    Err(e) => return Err(self.bad_pdu(e, layout.hlen as usize)),
                };
                let start = self.rs;
                self.rs += need;
                match hdr {
                    PduHeader::CapsuleResp(r) => {
                        let mut cqe = r.cqe;
                        let cid = cqe.cid;
                        // The status field as the core reads it (the phase
                        // bit has no meaning over fabrics).
                        cqe.status &= !1;
                        self.complete(cid, cqe, f)?;
                        Ok(Step::Completed)
                    }
                    PduHeader::C2HData(d) => {
                        let cid = d.cccid;
                        let bad = match self.slots.get(cid as usize) {
                            None => Some(format!("C2HData for CID {cid}, beyond the queue")),
                            Some(s) if !s.active => {
                                Some(format!("C2HData for CID {cid}, which is not outstanding"))
                            }
                            Some(s) if !matches!(s.dir, Dir::In | Dir::InBounce) => Some(format!(
                                "C2HData for CID {cid}, which transfers no data to the host"
                            )),
                            Some(_) => None,
                        };
                        if let Some(w) = bad {
                            return Err(self.protocol(w));
                        }
                        let s = &self.slots[cid as usize];
                        if let Err(e) =
                            check_data_range(PduType::C2HData, d.datao, d.datal, s.done, s.len)
                        {
                            self.rs = start;
                            return Err(self.bad_pdu(e, layout.hlen as usize));
                        }
                        self.state = Rx::Body {
                            body: Body::C2H {
                                slot: cid,
                                datao: d.datao,
                                last: d.last(),
                                success: d.success(),
                            },
                            layout,
                            pos: need as u32,
                            digest: DataDigest::new(),
                            ddgst: [0; 4],
                        };
                        Ok(Step::Progress)
                    }
                    PduHeader::R2T(r) => {
                        self.r2t(r.cccid, r.ttag, r.r2to, r.r2tl, start, layout.hlen)?;
                        Ok(Step::Progress)
                    }
                    PduHeader::TermReq(t) => {
                        if layout.plen as usize == need {
                            return Err(self.term_req(t));
                        }
                        self.state = Rx::Body {
                            body: Body::Term(t),
                            layout,
                            pos: need as u32,
                            digest: DataDigest::new(),
                            ddgst: [0; 4],
                        };
                        Ok(Step::Progress)
                    }
                    other => Err(self.protocol(format!("unexpected PDU {other:?}"))),
                }
            }
            Rx::Body {
                body,
                layout,
                pos,
                digest,
                ddgst,
            } => {
                if avail == 0 {
                    return Ok(Step::NeedMore);
                }
                let dr = layout.data_range();
                let (dstart, dend) = (dr.start as u32, dr.end as u32);
                let mut take;
                if *pos < dstart {
                    take = (dstart - *pos).min(avail as u32);
                } else if *pos < dend {
                    take = (dend - *pos).min(avail as u32);
                    let src = &self.rx[self.rs..self.rs + take as usize];
                    if layout.ddgst {
                        digest.update(src);
                    }
                    if let Body::C2H { slot, datao, .. } = body {
                        let s = &mut self.slots[*slot as usize];
                        let off = (*datao + (*pos - dstart)) as usize;
                        match s.dir {
                            Dir::In => {
                                // SAFETY: `off + take <= s.len` (checked
                                // against the command by check_data_range),
                                // and the buffer belongs to an outstanding
                                // command (module docs); `src` is ours.
                                unsafe {
                                    std::ptr::copy_nonoverlapping(
                                        src.as_ptr(),
                                        mem::ptr(s.addr + off as u64),
                                        take as usize,
                                    )
                                }
                            }
                            _ => s.bounce[off..off + take as usize].copy_from_slice(src),
                        }
                    }
                } else {
                    take = (layout.plen - *pos).min(avail as u32);
                    let at = (*pos - dend) as usize;
                    ddgst[at..at + take as usize]
                        .copy_from_slice(&self.rx[self.rs..self.rs + take as usize]);
                }
                if matches!(body, Body::Term(_)) && *pos >= dstart && *pos < dend {
                    // Termination data: the offending header, only logged.
                    take = take.min(dend - *pos);
                }
                *pos += take;
                self.rs += take as usize;
                if *pos < layout.plen {
                    return Ok(Step::Progress);
                }
                let Rx::Body {
                    body,
                    layout,
                    digest,
                    ddgst,
                    ..
                } = std::mem::replace(&mut self.state, Rx::Header)
                else {
                    return Ok(Step::Progress);
                };
                match body {
                    Body::Term(t) => Err(self.term_req(t)),
                    Body::C2H {
                        slot,
                        last,
                        success,
                        ..
                    } => {
                        let s = &mut self.slots[slot as usize];
                        s.done += layout.data_len;
                        if layout.ddgst && digest.value() != u32::from_le_bytes(ddgst) {
                            tracing::warn!(
                                addr = %self.addr,
                                qid = self.qid,
                                cid = slot,
                                "data digest mismatch in C2HData: the command fails with Transient Transport Error"
                            );
                            s.ddgst_error = true;
                        }
                        if success {
                            if !last {
                                return Err(
                                    self.protocol("C2HData SUCCESS without LAST_PDU".into())
                                );
                            }
                            let cqe = Cqe {
                                dw0: 0,
                                dw1: 0,
                                sqhd: 0,
                                sqid: self.qid,
                                cid: slot,
                                status: 0,
                            };
                            self.complete(slot, cqe, f)?;
                            return Ok(Step::Completed);
                        }
                        Ok(Step::Progress)
                    }
                }
            }
        }
    }

    #[cold]
    fn term_req(&mut self, t: TermReq) -> ConnError {
        let e = self.err(
            ConnErrorKind::TermReq,
            format!(
                "controller terminated the connection: {} (FES {:#x}, FEI {:#x})",
                t.fes(),
                t.fes().0,
                t.fei()
            ),
        );
        self.fail(e)
    }

    fn r2t(
        &mut self,
        cid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
        start: usize,
        hlen: u32,
    ) -> Result<(), ConnError> {
        let bad = match self.slots.get(cid as usize) {
            None => Some(format!("R2T for CID {cid}, beyond the queue")),
            Some(s) if !s.active => Some(format!("R2T for CID {cid}, which is not outstanding")),
            Some(s) if s.dir != Dir::Out => Some(format!(
                "R2T for CID {cid}, which has no data to send (or sent it in the capsule)"
            )),
            Some(_) => None,
        };
        if let Some(w) = bad {
            return Err(self.protocol(w));
        }
        let (addr, len, done) = {
            let s = &self.slots[cid as usize];
            (s.addr, s.len, s.done)
        };
        if let Err(e) = check_data_range(PduType::R2T, r2to, r2tl, done, len) {
            self.rs = start;
            return Err(self.bad_pdu(e, hlen as usize));
        }
        let p = self.params;
        let end = r2to + r2tl;
        let mut off = r2to;
        while off < end {
            let l = (end - off).min(p.maxh2cdata);
            let last = off + l == end;
            let Some((h, layout)) = H2CData::new(cid, ttag, off, l, last, p.digests, p.cpda) else {
                return Err(self.protocol(format!("H2CData of {l} bytes does not fit a PDU")));
            };
            self.push_header(h.as_bytes(), &layout);
            let a = addr + off as u64;
            self.segs.push_back(Seg::User {
                addr: a,
                len: l as usize,
                slot: cid,
            });
            if layout.ddgst {
                // SAFETY: within the command's buffer (checked above), which
                // is valid while the command is outstanding.
                let d = data_digest([unsafe { mem::slice(a, l as usize) }]);
                self.push_own(&digest_bytes(d));
            }
            off += l;
        }
        self.slots[cid as usize].done = end;
        Ok(())
    }

    /// Releases slot `cid` and hands its completion to `f`.
    fn complete(
        &mut self,
        cid: u16,
        mut cqe: Cqe,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Result<(), ConnError> {
        match self.slots.get(cid as usize) {
            Some(s) if s.active => {}
            _ => {
                return Err(self.protocol(format!(
                    "completion for CID {cid}, which is not outstanding"
                )))
            }
        }
        let s = &self.slots[cid as usize];
        // Data sent from the command's buffer (after R2T, or in the
        // capsule: `addr` is set) may not all have left yet when a
        // controller answers early.
        if s.dir == Dir::Out || (s.dir == Dir::None && s.addr != 0) {
            self.detach_segments(cid);
        }
        let s = &mut self.slots[cid as usize];
        s.active = false;
        if cqe.status >> 1 == 0 {
            if s.ddgst_error {
                cqe.status = Status::generic(generic::TRANSIENT_TRANSPORT_ERROR).0 << 1;
            } else if matches!(s.dir, Dir::In | Dir::InBounce) && s.done != s.len {
                Self::short_transfer(self.addr, self.qid, cid, s, &mut cqe);
            }
        }
        f(cid, s, cqe);
        Ok(())
    }

    /// A command with data for the host completed with success before
    /// all of it came. An admin structure (a log page) shorter than the
    /// length asked for: the spec leaves the bytes past its end undefined,
    /// so a controller that sends only what exists loses nothing; they
    /// read as zeros here (what Linux's nvmet sends). Data of I/O
    /// commands must be complete: Data Transfer Error.
    #[cold]
    fn short_transfer(addr: SocketAddr, qid: u16, cid: u16, s: &mut Slot, cqe: &mut Cqe) {
        if qid == 0 && s.done < s.len {
            tracing::debug!(
                %addr,
                cid,
                got = s.done,
                expected = s.len,
                "admin data shorter than asked for: the rest reads as zeros"
            );
            if s.dir == Dir::In {
                // SAFETY: `done..len` lies in the command's buffer, which
                // stays valid while the command is outstanding (module
                // docs); nothing else writes it meanwhile.
                unsafe {
                    std::ptr::write_bytes(
                        mem::ptr(s.addr + s.done as u64),
                        0,
                        (s.len - s.done) as usize,
                    )
                }
            }
            return;
        }
        tracing::error!(
            %addr,
            qid,
            cid,
            got = s.done,
            expected = s.len,
            "controller reported success with data missing"
        );
        cqe.status = Status::generic(generic::DATA_TRANSFER_ERROR).0 << 1;
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
        self.submit(wcid, sqe, data, wcid, true)?;
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
                self.slots[wcid as usize].active = false;
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

enum Icd<'a> {
    Bytes(&'a [u8]),
    User(u64, u32),
}

enum Step {
    NeedMore,
    Progress,
    Completed,
}

fn on(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}
