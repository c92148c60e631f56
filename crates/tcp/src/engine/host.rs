//! The host end of one NVMe/TCP connection (one queue), I/O-free: command
//! capsules with their data (in-capsule, or R2T/H2CData) queued for the
//! wire; received PDUs handled: C2HData copied into the command's buffer
//! after its offset and length are checked against the command (never
//! trusting the controller), R2T answered with H2CData PDUs of at most
//! MAXH2CDATA, completions (CapsuleResp, or C2HData with SUCCESS) handed
//! to the caller per CID slot. The caller moves the bytes: it feeds
//! [`HostQueue::receive`] what the socket gave and sends what
//! [`HostQueue::tx`] holds.
//!
//! Data buffers are named by address and reached through [`Memory`]. A
//! command's buffer is read or written only while the command is
//! outstanding: its slot is active from [`HostQueue::submit`] until its
//! completion is handed out (or it is forgotten), and queued send segments
//! pointing at it (in-capsule data, H2CData) are copied out before its
//! completion is handed out (a controller may answer before it has read
//! the data).
use std::net::SocketAddr;

use pollux_spec::fabrics::SglDescriptor;
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    check_data_range, data_digest, digest_bytes, C2HData, CapsuleCmd, H2CData, PduError, PduHeader,
    PduLayout, PduType, Role, TermReq,
};
use pollux_spec::{Cqe, Sqe, Status};
use zerocopy::{FromBytes, IntoBytes};

use crate::engine::ic::{host_rx_config, HostParams};
use crate::engine::memory::Memory;
use crate::engine::rx::{Event, Reassembler};
use crate::engine::tx::SendQueue;

/// Data of a command, as [`HostQueue::submit`] takes it.
#[derive(Clone, Copy, Debug)]
pub enum Data<'a> {
    None,
    /// Bytes copied into the capsule at once (Connect data, a Dataset
    /// Management range). Must fit in-capsule.
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
#[derive(Debug)]
pub struct Slot {
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

/// What ended a connection, as the engine saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostErrorKind {
    /// The controller sent a PDU that fails the checks: the Termination
    /// Request to send is in the error.
    BadPdu,
    /// The controller sent a Termination Request.
    TermReq,
    /// The controller broke the protocol otherwise (data or a completion
    /// for a command that is not outstanding, ...), or the caller asked
    /// for what cannot be sent.
    Protocol,
}

/// An error that ends the connection.
#[derive(Clone, Debug)]
pub struct HostError {
    pub kind: HostErrorKind,
    pub what: String,
    /// A Termination Request to send before closing (with the offending
    /// header), for [`HostErrorKind::BadPdu`].
    pub term: Option<Vec<u8>>,
}

impl HostError {
    fn protocol(what: String) -> HostError {
        HostError {
            kind: HostErrorKind::Protocol,
            what,
            term: None,
        }
    }

    /// A received PDU failed a check: the Termination Request it calls for
    /// (with the offending header).
    #[cold]
    fn bad_pdu(e: PduError, offending: &[u8]) -> HostError {
        let term = e.term_req(Role::Host, offending.len()).map(|t| {
            let mut pdu = t.as_bytes().to_vec();
            pdu.extend_from_slice(&offending[..t.data_len() as usize]);
            pdu
        });
        let fes = e
            .fes()
            .map_or("none".to_string(), |f| format!("{f} ({:#x})", f.0));
        HostError {
            kind: HostErrorKind::BadPdu,
            what: format!("bad PDU from the controller: {e}; sent Termination Request (FES {fes})"),
            term,
        }
    }

    #[cold]
    fn term_req(t: TermReq) -> HostError {
        HostError {
            kind: HostErrorKind::TermReq,
            what: format!(
                "controller terminated the connection: {} (FES {:#x}, FEI {:#x})",
                t.fes(),
                t.fes().0,
                t.fei()
            ),
            term: None,
        }
    }
}

/// What [`HostQueue::receive`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes of the input consumed.
    pub consumed: usize,
    /// Completions handed out.
    pub completed: u32,
    /// An error ended the connection (the completions before it were
    /// handed out): [`HostQueue::take_error`] has it.
    pub failed: bool,
}

/// A C2HData PDU being received, its header checked.
#[derive(Clone, Copy, Debug)]
struct C2h {
    slot: u16,
    datao: u32,
    data_len: u32,
    last: bool,
    success: bool,
}

/// The PDU whose data is being received.
#[derive(Clone, Copy, Debug)]
enum Body {
    None,
    C2h(C2h),
    Term(TermReq),
}

/// The host end of one connection. See the module docs.
pub struct HostQueue<M: Memory> {
    mem: M,
    /// For logs.
    addr: SocketAddr,
    qid: u16,
    params: HostParams,
    /// Most in-capsule data bytes for a write.
    pub icd_max: u32,
    rx: Reassembler,
    body: Body,
    /// The error `receive` stopped at (kept here, out of the hot return
    /// value).
    error: Option<Box<HostError>>,
    /// What is queued for the wire.
    pub tx: SendQueue,
    pub slots: Vec<Slot>,
}

impl<M: Memory> HostQueue<M> {
    /// The engine of an initialized connection (`params` from ICResp) to
    /// `addr` for queue `qid`, with `slots` command slots.
    pub fn new(mem: M, addr: SocketAddr, qid: u16, params: HostParams, slots: usize) -> Self {
        HostQueue {
            mem,
            addr,
            qid,
            params,
            icd_max: 0,
            rx: Reassembler::new(host_rx_config(&params)),
            body: Body::None,
            error: None,
            tx: SendQueue::with_capacity(64 << 10),
            slots: (0..slots).map(|_| Slot::empty()).collect(),
        }
    }

    pub fn params(&self) -> HostParams {
        self.params
    }

    /// The error [`receive`](Self::receive) reported (`failed`).
    pub fn take_error(&mut self) -> Option<HostError> {
        self.error.take().map(|e| *e)
    }

    /// True between a PDU header and the end of its data.
    pub fn mid_pdu(&self) -> bool {
        self.rx.in_body()
    }

    /// Forgets every command (the queue is restarted or torn down) and
    /// what was queued to send.
    pub fn forget_all(&mut self) {
        self.tx.clear();
        for s in &mut self.slots {
            s.active = false;
        }
    }

    /// Queues a command capsule (and in-capsule data) for slot `wcid`.
    ///
    /// # Safety
    /// With `Data::Out` or `Data::In`, `addr..addr + len` must be a buffer
    /// [`Memory`] reaches that stays allocated, and that nothing else
    /// reads or writes, until the command's completion has been handed out
    /// by [`receive`](Self::receive), or it is forgotten
    /// ([`forget_all`](Self::forget_all), its slot made inactive) and
    /// nothing queued points at it (the send queue cleared or sent).
    #[inline]
    pub unsafe fn submit(
        &mut self,
        wcid: u16,
        mut sqe: Sqe,
        data: Data<'_>,
        tag: u16,
        internal: bool,
    ) -> Result<(), HostError> {
        let Some(slot) = self.slots.get(wcid as usize) else {
            return Err(HostError::protocol(format!(
                "CID {wcid} beyond the {} slots",
                self.slots.len()
            )));
        };
        if slot.active {
            return Err(HostError::protocol(format!(
                "CID {wcid} is already outstanding"
            )));
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
            return Err(HostError::protocol(format!(
                "capsule with {icd_len} bytes of data does not fit a PDU"
            )));
        };
        self.tx.push_header(cmd.as_bytes(), &layout);
        match icd {
            Some(Icd::Bytes(b)) => {
                self.tx.push_bytes(b);
                if layout.ddgst {
                    self.tx.push_bytes(&digest_bytes(data_digest([b])));
                }
            }
            Some(Icd::User(a, l)) => {
                self.tx.push_ext(a, l as usize, wcid);
                if layout.ddgst {
                    // SAFETY: `a..a+l` is the command's buffer, which the
                    // caller keeps allocated and untouched while the
                    // command is outstanding (this function's contract).
                    let d = data_digest([unsafe { self.mem.bytes(a, l as usize) }]);
                    self.tx.push_bytes(&digest_bytes(d));
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

    /// Handles what `input` (bytes received, not yet consumed) holds until
    /// `budget` completions were handed to `f` or it needs more bytes.
    /// `f(wcid, slot, cqe)` gets each completion; the slot is released
    /// after. What R2Ts ask for is queued to send.
    #[inline(always)]
    pub fn receive(
        &mut self,
        input: &[u8],
        budget: u32,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Received {
        let mut r = Received {
            consumed: 0,
            completed: 0,
            failed: false,
        };
        while r.completed < budget {
            let (used, ev) = match self.rx.next(&input[r.consumed..]) {
                Ok(x) => x,
                Err(e) => {
                    self.fail(HostError::bad_pdu(e.error, e.header()));
                    r.failed = true;
                    break;
                }
            };
            r.consumed += used;
            let Some(ev) = ev else { break };
            match self.event(ev, f) {
                Ok(done) => r.completed += done as u32,
                Err(e) => {
                    self.fail(e);
                    r.failed = true;
                    break;
                }
            }
        }
        r
    }

    #[cold]
    fn fail(&mut self, e: HostError) {
        self.error = Some(Box::new(e));
    }

    /// Handles one event; true if it completed a command.
    #[inline(always)]
    fn event(
        &mut self,
        ev: Event<'_>,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Result<bool, HostError> {
        match ev {
            Event::Pdu {
                layout,
                raw,
                data,
                digest_ok,
            } => {
                // A C2HData without header digest, the common case, is
                // read where it lies and checked as `PduHeader::parse`
                // checks it (DATAL against the layout), without making a
                // `PduHeader` (as large as an ICReq: moving one costs more
                // than the rest of the header's handling).
                if layout.pdu_type == PduType::C2HData && !layout.hdgst {
                    if let Some(d) = raw
                        .get(..layout.hlen as usize)
                        .and_then(|b| C2HData::read_from_bytes(b).ok())
                    {
                        if let Err(e) = d.check(&layout) {
                            return Err(HostError::bad_pdu(e, &raw[..layout.hlen as usize]));
                        }
                        let c = self.c2h(&d, &layout, raw)?;
                        self.c2h_data(&c, 0, data);
                        return self.c2h_end(c, digest_ok, f);
                    }
                }
                let pdu = self
                    .rx
                    .parse(&layout, raw)
                    .map_err(|e| HostError::bad_pdu(e.error, e.header()))?;
                match pdu {
                    PduHeader::CapsuleResp(r) => {
                        let mut cqe = r.cqe;
                        let cid = cqe.cid;
                        // The status field as the core reads it (the phase
                        // bit has no meaning over fabrics).
                        cqe.status &= !1;
                        self.complete(cid, cqe, f)?;
                        Ok(true)
                    }
                    PduHeader::C2HData(d) => {
                        let c = self.c2h(&d, &layout, raw)?;
                        self.c2h_data(&c, 0, data);
                        self.c2h_end(c, digest_ok, f)
                    }
                    PduHeader::R2T(r) => {
                        self.r2t(
                            r.cccid,
                            r.ttag,
                            r.r2to,
                            r.r2tl,
                            &raw[..layout.hlen as usize],
                        )?;
                        Ok(false)
                    }
                    PduHeader::TermReq(t) => Err(HostError::term_req(t)),
                    other => Err(HostError::protocol(format!("unexpected PDU {other:?}"))),
                }
            }
            Event::Header { layout, raw } => {
                let pdu = self
                    .rx
                    .parse(&layout, raw)
                    .map_err(|e| HostError::bad_pdu(e.error, e.header()))?;
                self.body = match pdu {
                    PduHeader::C2HData(d) => Body::C2h(self.c2h(&d, &layout, raw)?),
                    // Its data (the offending header) is only skipped.
                    PduHeader::TermReq(t) => Body::Term(t),
                    other => return Err(HostError::protocol(format!("unexpected PDU {other:?}"))),
                };
                Ok(false)
            }
            Event::Data { offset, bytes, end } => {
                if let Body::C2h(c) = self.body {
                    self.c2h_data(&c, offset, bytes);
                }
                match end {
                    Some(digest_ok) => self.end(digest_ok, f),
                    None => Ok(false),
                }
            }
            Event::End { digest_ok } => self.end(digest_ok, f),
        }
    }

    /// Checks a C2HData header against its command: outstanding, taking
    /// data, the data in order and within the command's buffer.
    #[inline(always)]
    fn c2h(&self, d: &C2HData, layout: &PduLayout, raw: &[u8]) -> Result<C2h, HostError> {
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
            return Err(HostError::protocol(w));
        }
        let s = &self.slots[cid as usize];
        if let Err(e) = check_data_range(PduType::C2HData, d.datao, d.datal, s.done, s.len) {
            return Err(HostError::bad_pdu(e, &raw[..layout.hlen as usize]));
        }
        Ok(C2h {
            slot: cid,
            datao: d.datao,
            data_len: layout.data_len,
            last: d.last(),
            success: d.success(),
        })
    }

    /// Copies `bytes` of a checked C2HData's data, `offset` into it, to
    /// where they belong.
    #[inline(always)]
    fn c2h_data(&mut self, c: &C2h, offset: u32, bytes: &[u8]) {
        let s = &mut self.slots[c.slot as usize];
        let off = (c.datao + offset) as usize;
        match s.dir {
            Dir::In => {
                // SAFETY: `off + bytes.len() <= s.len` (checked against the
                // command by check_data_range at the header), and the buffer
                // belongs to an outstanding command (module docs).
                unsafe { self.mem.write(s.addr + off as u64, bytes) }
            }
            _ => s.bounce[off..off + bytes.len()].copy_from_slice(bytes),
        }
    }

    /// The PDU whose data was being received is complete.
    #[inline(always)]
    fn end(
        &mut self,
        digest_ok: bool,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Result<bool, HostError> {
        match std::mem::replace(&mut self.body, Body::None) {
            Body::None => Ok(false),
            Body::Term(t) => Err(HostError::term_req(t)),
            Body::C2h(c) => self.c2h_end(c, digest_ok, f),
        }
    }

    /// All of a C2HData's data is in: with SUCCESS, its command completes.
    #[inline(always)]
    fn c2h_end(
        &mut self,
        c: C2h,
        digest_ok: bool,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Result<bool, HostError> {
        let s = &mut self.slots[c.slot as usize];
        s.done += c.data_len;
        if !digest_ok {
            tracing::warn!(
                addr = %self.addr,
                qid = self.qid,
                cid = c.slot,
                "data digest mismatch in C2HData: the command fails with Transient Transport Error"
            );
            s.ddgst_error = true;
        }
        if !c.success {
            return Ok(false);
        }
        if !c.last {
            return Err(HostError::protocol(
                "C2HData SUCCESS without LAST_PDU".into(),
            ));
        }
        let cqe = Cqe {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid: self.qid,
            cid: c.slot,
            status: 0,
        };
        self.complete(c.slot, cqe, f)?;
        Ok(true)
    }

    /// An R2T for command `cid`: queues H2CData PDUs of at most MAXH2CDATA
    /// for `[r2to, r2to + r2tl)` of its buffer.
    fn r2t(
        &mut self,
        cid: u16,
        ttag: u16,
        r2to: u32,
        r2tl: u32,
        header: &[u8],
    ) -> Result<(), HostError> {
        let bad = match self.slots.get(cid as usize) {
            None => Some(format!("R2T for CID {cid}, beyond the queue")),
            Some(s) if !s.active => Some(format!("R2T for CID {cid}, which is not outstanding")),
            Some(s) if s.dir != Dir::Out => Some(format!(
                "R2T for CID {cid}, which has no data to send (or sent it in the capsule)"
            )),
            Some(_) => None,
        };
        if let Some(w) = bad {
            return Err(HostError::protocol(w));
        }
        let (addr, len, done) = {
            let s = &self.slots[cid as usize];
            (s.addr, s.len, s.done)
        };
        if let Err(e) = check_data_range(PduType::R2T, r2to, r2tl, done, len) {
            return Err(HostError::bad_pdu(e, header));
        }
        let p = self.params;
        let end = r2to + r2tl;
        let mut off = r2to;
        while off < end {
            let l = (end - off).min(p.maxh2cdata);
            let last = off + l == end;
            let Some((h, layout)) = H2CData::new(cid, ttag, off, l, last, p.digests, p.cpda) else {
                return Err(HostError::protocol(format!(
                    "H2CData of {l} bytes does not fit a PDU"
                )));
            };
            self.tx.push_header(h.as_bytes(), &layout);
            let a = addr + off as u64;
            self.tx.push_ext(a, l as usize, cid);
            if layout.ddgst {
                // SAFETY: within the command's buffer (checked above), which
                // is valid while the command is outstanding.
                let d = data_digest([unsafe { self.mem.bytes(a, l as usize) }]);
                self.tx.push_bytes(&digest_bytes(d));
            }
            off += l;
        }
        self.slots[cid as usize].done = end;
        Ok(())
    }

    /// Releases slot `cid` and hands its completion to `f`.
    #[inline]
    fn complete(
        &mut self,
        cid: u16,
        mut cqe: Cqe,
        f: &mut impl FnMut(u16, &mut Slot, Cqe),
    ) -> Result<(), HostError> {
        match self.slots.get(cid as usize) {
            Some(s) if s.active => {}
            _ => {
                return Err(HostError::protocol(format!(
                    "completion for CID {cid}, which is not outstanding"
                )))
            }
        }
        let s = &self.slots[cid as usize];
        // Data sent from the command's buffer (after R2T, or in the
        // capsule: `addr` is set) may not all have left yet when a
        // controller answers early.
        if s.dir == Dir::Out || (s.dir == Dir::None && s.addr != 0) {
            // SAFETY: the command is still outstanding (its completion is
            // handed out after this), so its buffer is valid.
            unsafe { self.tx.detach(cid, &self.mem) };
        }
        let s = &mut self.slots[cid as usize];
        s.active = false;
        if cqe.status >> 1 == 0 {
            if s.ddgst_error {
                cqe.status = Status::generic(generic::TRANSIENT_TRANSPORT_ERROR).0 << 1;
            } else if matches!(s.dir, Dir::In | Dir::InBounce) && s.done != s.len {
                Self::short_transfer(&self.mem, self.addr, self.qid, cid, s, &mut cqe);
            }
        }
        f(cid, s, cqe);
        Ok(())
    }

    /// A command with data for the host completed with success before
    /// all of it came. An admin structure (a log page) shorter than the
    /// length asked for: the spec leaves the bytes past its end undefined,
    /// so a controller that sends only what exists loses nothing; they
    /// read as zeros here (what Linux's nvmet sends). The same for a
    /// fabrics command on any queue (Authentication Receive: SPDK's target
    /// sends only the AUTH message, shorter than the allocation length).
    /// Data of I/O commands must be complete: Data Transfer Error.
    #[cold]
    fn short_transfer(mem: &M, addr: SocketAddr, qid: u16, cid: u16, s: &mut Slot, cqe: &mut Cqe) {
        let lenient = qid == 0 || s.sqe.opc == pollux_spec::fabrics::FABRICS_OPCODE;
        if lenient && s.done < s.len {
            tracing::debug!(
                %addr,
                cid,
                got = s.done,
                expected = s.len,
                "admin or fabrics data shorter than asked for: the rest reads as zeros"
            );
            if s.dir == Dir::In {
                // SAFETY: `done..len` lies in the command's buffer, which
                // stays valid while the command is outstanding (module
                // docs); nothing else writes it meanwhile.
                unsafe { mem.zero(s.addr + s.done as u64, (s.len - s.done) as usize) }
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
}

enum Icd<'a> {
    Bytes(&'a [u8]),
    User(u64, u32),
}
