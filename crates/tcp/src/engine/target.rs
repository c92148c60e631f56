//! The controller end of one NVMe/TCP connection, I/O-free: ICReq
//! answered, command capsules and H2CData received (H2CData checked
//! against the transfer its R2T asked for: TTAG outstanding, CCCID its
//! command's, data in order and within the transfer), and R2T, C2HData,
//! response capsules and Termination Requests queued to send. What a
//! command means, and where its data goes, is the caller's: it gets the
//! capsule's SQE and then its data as slices of its own input.
//!
//! Transfers are indexed by their R2T transfer tag (TTAG), which the
//! caller picks (pollux's target uses the command's slot index).
use pollux_spec::tcp::{
    check_data_range, verify_header_digest, C2HData, CapsuleResp, DataDigest, Digests, Fes, Field,
    H2CData, IcReq, PduError, PduHeader, PduLayout, PduType, Role, RxConfig, TermReq, R2T,
    TERM_REQ_MAX_DATA,
};
use pollux_spec::{Cqe, Sqe};
use zerocopy::{FromBytes, IntoBytes};

use crate::engine::ic::{target_icresp, TargetLimits, TargetParams};
use crate::engine::rx::{Event, Reassembler, RxError};
use crate::engine::tx::SendQueue;

/// A PDU whose body ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// A command capsule's in-capsule data is in.
    Capsule { digest_ok: bool },
    /// An H2CData PDU of transfer `ttag` is in; `complete`: all the data
    /// its R2T asked for is (the transfer is over).
    H2C {
        ttag: u16,
        digest_ok: bool,
        complete: bool,
    },
    /// Anything else (a Termination Request's data).
    Other,
}

/// What [`TargetQueue::next`] found.
#[derive(Clone, Copy, Debug)]
pub enum TargetEvent<'a> {
    /// An ICReq, answered (the ICResp is queued).
    Initialized(TargetParams),
    /// The host terminated the connection (H2CTermReq).
    TermReq(TermReq),
    /// A command capsule with `data_len` bytes of in-capsule data. When
    /// the whole PDU was there, `data` holds them and `end` says how the
    /// PDU ended; otherwise (`None`, `None`) they follow as
    /// [`TargetEvent::Data`]. `sqe`: the SQE's bytes where they were
    /// received ([`sqe_of`] makes the `Sqe`, which is 64-byte aligned in
    /// memory: an event carrying one would be copied at that size).
    Capsule {
        sqe: &'a [u8; 64],
        data_len: u32,
        data: Option<&'a [u8]>,
        end: Option<Ended>,
    },
    /// Data for transfer `ttag` at `datao` (checked), `datal` bytes: in
    /// `data` (and `end`) when the whole PDU was there, else following as
    /// [`TargetEvent::Data`].
    H2CData {
        ttag: u16,
        datao: u32,
        datal: u32,
        data: Option<&'a [u8]>,
        end: Option<Ended>,
    },
    /// `bytes` of the current PDU's data, `offset` bytes into it; `end`:
    /// the PDU is complete with them.
    Data {
        offset: u32,
        bytes: &'a [u8],
        end: Option<Ended>,
    },
    /// The current PDU is complete (its data digest came after its data).
    End(Ended),
}

/// The SQE whose bytes a [`TargetEvent::Capsule`] carries.
#[inline(always)]
pub fn sqe_of(bytes: &[u8; 64]) -> Sqe {
    zerocopy::transmute!(*bytes)
}

/// A protocol error that ends the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetError {
    /// Answer with a C2HTermReq carrying `fes`, `fei` and `header` (the
    /// offending header), then close ([`TargetQueue::terminate`]).
    Fatal {
        fes: Fes,
        fei: u32,
        why: String,
        header: Vec<u8>,
    },
    /// A Termination Request with an impossible length: close without one
    /// of our own.
    TermReqLength { plen: u32 },
}

impl TargetError {
    #[cold]
    #[inline(never)]
    fn fatal(e: PduError, header: &[u8]) -> TargetError {
        TargetError::Fatal {
            fes: e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD),
            fei: e.fei(),
            why: e.to_string(),
            header: header.to_vec(),
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Xfer {
    active: bool,
    cccid: u16,
    /// Bytes received so far.
    got: u32,
    len: u32,
}

#[derive(Clone, Copy, Debug)]
enum Body {
    Capsule,
    H2C { ttag: u16, datal: u32 },
    Other,
}

/// The controller end of one connection. See the module docs.
pub struct TargetQueue {
    limits: TargetLimits,
    rx: Reassembler,
    params: Option<TargetParams>,
    /// The digests and HPDA agreed (none and 0 before ICReq), kept apart
    /// from `params` for the PDUs sent.
    digests: Digests,
    hpda: u8,
    /// What is queued for the wire.
    pub tx: SendQueue,
    xfers: Vec<Xfer>,
    body: Body,
}

impl TargetQueue {
    /// A new connection (waiting for ICReq) that offers `limits`, with
    /// `ttags` transfer tags (0..ttags).
    pub fn new(limits: TargetLimits, ttags: usize) -> TargetQueue {
        TargetQueue {
            limits,
            rx: Reassembler::new(RxConfig::initial(Role::Controller)),
            params: None,
            digests: Digests::NONE,
            hpda: 0,
            tx: SendQueue::with_capacity(4096),
            xfers: vec![Xfer::default(); ttags],
            body: Body::Other,
        }
    }

    /// Gives the queue `ttags` transfer tags (0..ttags), none outstanding
    /// (a target learns how many commands a queue holds only at Connect).
    pub fn set_transfers(&mut self, ttags: usize) {
        self.xfers.clear();
        self.xfers.resize(ttags, Xfer::default());
    }

    /// How many transfer tags the queue has.
    pub fn transfers(&self) -> usize {
        self.xfers.len()
    }

    /// What received headers are checked against now.
    pub fn rx_config(&self) -> &RxConfig {
        self.rx.config()
    }

    /// What was agreed in ICReq/ICResp (None before).
    pub fn params(&self) -> Option<TargetParams> {
        self.params
    }

    /// Inside a PDU's data (see `Reassembler::data_window`).
    #[inline]
    pub fn data_window(&self) -> Option<(u32, u32)> {
        self.rx.data_window()
    }

    /// Data received straight into place (see `Reassembler::data_taken`).
    #[inline]
    pub fn data_taken(&mut self, bytes: &[u8]) {
        self.rx.data_taken(bytes)
    }

    /// Consumes what it can of `input` (bytes received, not yet consumed):
    /// how many bytes it took and the event they made (`None`: more bytes
    /// needed).
    #[inline(always)]
    pub fn next<'a>(
        &mut self,
        input: &'a [u8],
    ) -> Result<(usize, Option<TargetEvent<'a>>), TargetError> {
        let (used, ev) = match self.rx.next(input) {
            Ok(x) => x,
            Err(e) => return Err(Self::rx_error(&e)),
        };
        let Some(ev) = ev else {
            return Ok((used, None));
        };
        let out = match ev {
            // Header and data in one event.
            Event::Pdu {
                layout,
                raw,
                data,
                digest_ok,
            } => self.header(&layout, raw, Some((data, digest_ok)))?,
            Event::Header { layout, raw } => self.header(&layout, raw, None)?,
            Event::Data { offset, bytes, end } => TargetEvent::Data {
                offset,
                bytes,
                end: end.map(|ok| self.end(ok)),
            },
            Event::End { digest_ok } => TargetEvent::End(self.end(digest_ok)),
        };
        Ok((used, Some(out)))
    }

    /// A received header that failed the reassembler's checks.
    #[cold]
    #[inline(never)]
    fn rx_error(e: &RxError<'_>) -> TargetError {
        match e.error {
            PduError::TermReqLength { plen, .. } => TargetError::TermReqLength { plen },
            // The header up to its HLEN (at least the 8 bytes of the
            // common header), with its digest if it has one.
            err => {
                let n = e.input.len().min(e.header_len.max(8));
                TargetError::fatal(err, &e.input[..n])
            }
        }
    }

    /// A header (`raw`, laid out as `layout`), and with `whole` the PDU's
    /// data and whether its digest matched, when all of it was there.
    ///
    /// A command capsule and H2CData are read where they lie, checked as
    /// `PduHeader::parse` checks them (header digest; H2CData's DATAL
    /// against the layout and MAXH2CDATA), without making a `PduHeader`
    /// (as large as an ICReq: moving one costs more than the rest of a
    /// capsule's header); the other types go through `PduHeader::parse`.
    #[inline(always)]
    fn header<'a>(
        &mut self,
        layout: &PduLayout,
        raw: &'a [u8],
        whole: Option<(&'a [u8], bool)>,
    ) -> Result<TargetEvent<'a>, TargetError> {
        let hlen = layout.hlen as usize;
        match layout.pdu_type {
            PduType::CapsuleCmd => {
                let Some(sqe) = raw.get(8..hlen).and_then(|b| <&[u8; 64]>::try_from(b).ok()) else {
                    return self.other_header(layout, raw);
                };
                if layout.hdgst {
                    Self::verify_hdgst(layout, raw)?;
                }
                self.body = Body::Capsule;
                let (data, end) = match whole {
                    Some((d, ok)) => (Some(d), Some(self.end(ok))),
                    None => (None, None),
                };
                Ok(TargetEvent::Capsule {
                    sqe,
                    data_len: layout.data_len,
                    data,
                    end,
                })
            }
            PduType::H2CData => {
                let Ok(h) = H2CData::read_from_bytes(&raw[..hlen.min(raw.len())]) else {
                    return self.other_header(layout, raw);
                };
                if layout.hdgst {
                    Self::verify_hdgst(layout, raw)?;
                }
                // (With its digest, as from `PduHeader::parse`.)
                if let Err(e) = h.check(layout, self.rx.config().maxh2cdata) {
                    return Err(TargetError::fatal(e, raw));
                }
                let header = &raw[..hlen];
                let Some(x) = self.xfers.get(h.ttag as usize).filter(|x| x.active) else {
                    return Err(Self::bad_h2c(Field::Ttag, &h, 0, header));
                };
                if x.cccid != h.cccid {
                    return Err(Self::bad_h2c(Field::Cccid, &h, x.cccid, header));
                }
                if let Err(e) = check_data_range(PduType::H2CData, h.datao, h.datal, x.got, x.len) {
                    return Err(TargetError::fatal(e, header));
                }
                self.body = Body::H2C {
                    ttag: h.ttag,
                    datal: h.datal,
                };
                let (data, end) = match whole {
                    Some((d, ok)) => (Some(d), Some(self.end(ok))),
                    None => (None, None),
                };
                Ok(TargetEvent::H2CData {
                    ttag: h.ttag,
                    datao: h.datao,
                    datal: h.datal,
                    data,
                    end,
                })
            }
            _ => self.other_header(layout, raw),
        }
    }

    /// The header digest of `raw` (laid out as `layout`, with one).
    #[cold]
    #[inline(never)]
    fn verify_hdgst(layout: &PduLayout, raw: &[u8]) -> Result<(), TargetError> {
        let hlen = layout.hlen as usize;
        let mut d = [0u8; 4];
        if let Some(r) = layout.header_digest_range() {
            if let Some(b) = raw.get(r) {
                d.copy_from_slice(b);
            }
        }
        verify_header_digest(&raw[..hlen], d).map_err(|e| TargetError::fatal(e, raw))
    }

    /// Any other header: ICReq, Termination Requests, and what a
    /// controller never gets.
    #[cold]
    #[inline(never)]
    fn other_header<'a>(
        &mut self,
        layout: &PduLayout,
        raw: &[u8],
    ) -> Result<TargetEvent<'a>, TargetError> {
        // (The header with its digest goes into a TermReq.)
        let pdu = match self.rx.parse(layout, raw) {
            Ok(p) => p,
            Err(e) => return Err(TargetError::fatal(e.error, e.input)),
        };
        self.body = Body::Other;
        match pdu {
            PduHeader::IcReq(r) => Ok(self.icreq(&r)),
            PduHeader::TermReq(t) => Ok(TargetEvent::TermReq(t)),
            other => Err(Self::unexpected(&other, &raw[..layout.hlen as usize])),
        }
    }

    /// An ICReq: answered, and what is checked from now on set.
    #[cold]
    fn icreq<'a>(&mut self, r: &IcReq) -> TargetEvent<'a> {
        let (resp, params, cfg) = target_icresp(r, &self.limits);
        if let Some(l) = PduLayout::new(PduType::IcResp, Digests::NONE, 0, 0) {
            self.tx.push_header(resp.as_bytes(), &l);
        }
        self.rx.set_config(cfg);
        self.params = Some(params);
        self.digests = params.digests;
        self.hpda = params.hpda;
        TargetEvent::Initialized(params)
    }

    /// H2CData whose TTAG has no transfer outstanding, or whose CCCID is
    /// not the transfer's command's (`cccid`).
    #[cold]
    #[inline(never)]
    fn bad_h2c(field: Field, h: &H2CData, cccid: u16, header: &[u8]) -> TargetError {
        let why = if field == Field::Ttag {
            format!("H2CData for TTAG {} with no transfer outstanding", h.ttag)
        } else {
            format!(
                "H2CData CCCID {} does not match TTAG {}'s command {}",
                h.cccid, h.ttag, cccid
            )
        };
        TargetError::Fatal {
            fes: Fes::INVALID_HEADER_FIELD,
            fei: field.offset(),
            why,
            header: header.to_vec(),
        }
    }

    /// A PDU the reassembler let through that a controller never gets.
    #[cold]
    #[inline(never)]
    fn unexpected(pdu: &PduHeader, header: &[u8]) -> TargetError {
        TargetError::Fatal {
            fes: Fes::INVALID_HEADER_FIELD,
            fei: 0,
            why: format!("internal: unexpected PDU {pdu:?}"),
            header: header.to_vec(),
        }
    }

    #[inline]
    fn end(&mut self, digest_ok: bool) -> Ended {
        match std::mem::replace(&mut self.body, Body::Other) {
            Body::Capsule => Ended::Capsule { digest_ok },
            Body::H2C { ttag, datal } => {
                let x = &mut self.xfers[ttag as usize];
                x.got += datal;
                let complete = x.got >= x.len;
                if complete {
                    x.active = false;
                }
                Ended::H2C {
                    ttag,
                    digest_ok,
                    complete,
                }
            }
            Body::Other => Ended::Other,
        }
    }

    /// Asks for the `len` bytes of command `cccid`'s data with an R2T
    /// tagged `ttag`, which must not have a transfer outstanding.
    #[inline]
    pub fn r2t(&mut self, ttag: u16, cccid: u16, len: u32) {
        let digests = self.digests;
        if let Some(x) = self.xfers.get_mut(ttag as usize) {
            *x = Xfer {
                active: true,
                cccid,
                got: 0,
                len,
            };
        }
        let r = R2T::new(cccid, ttag, 0, len, digests.header);
        if let Some(l) = PduLayout::new(PduType::R2T, digests, 0, 0) {
            self.tx.push_header(r.as_bytes(), &l);
        }
    }

    /// Gives up transfer `ttag` (its data did not come in time): H2CData
    /// for it is a protocol error from now on.
    #[inline]
    pub fn cancel(&mut self, ttag: u16) {
        if let Some(x) = self.xfers.get_mut(ttag as usize) {
            x.active = false;
        }
    }

    /// True while transfer `ttag` waits for data.
    pub fn awaiting(&self, ttag: u16) -> bool {
        self.xfers.get(ttag as usize).is_some_and(|x| x.active)
    }

    /// Queues a response capsule, then a mark for `release` (if any).
    #[inline]
    pub fn respond(&mut self, cqe: Cqe, release: Option<u16>) {
        let digests = self.digests;
        let r = CapsuleResp::new(cqe, digests.header);
        if let Some(l) = PduLayout::new(PduType::CapsuleResp, digests, 0, 0) {
            self.tx.push_header(r.as_bytes(), &l);
        }
        if let Some(i) = release {
            self.tx.push_mark(i);
        }
    }

    /// Queues `data` as command `cid`'s data for the host, in C2HData PDUs
    /// of at most `max_pdu` bytes, referenced where it lies (see
    /// `SendQueue`); the last with SUCCESS when `success` is `None` (no
    /// response capsule), else followed by the response capsule `success`
    /// holds. Then a mark for `release`. False (nothing queued) if a PDU
    /// cannot be built.
    ///
    /// # Safety
    /// `data` must stay allocated, and nothing may write it, until the
    /// mark for `release` is reached or the queue is cleared.
    #[inline]
    pub unsafe fn send_data(
        &mut self,
        cid: u16,
        data: &[u8],
        max_pdu: u32,
        response: Option<Cqe>,
        release: u16,
    ) -> bool {
        let digests = self.digests;
        let hpda = self.hpda;
        let len = data.len() as u32;
        let max = max_pdu.max(1);
        let mut off = 0;
        while off < len {
            let l = (len - off).min(max);
            let last = off + l == len;
            let success = last && response.is_none();
            let Some((h, layout)) = C2HData::new(cid, off, l, last, success, digests, hpda) else {
                return false;
            };
            let piece = &data[off as usize..(off + l) as usize];
            let addr = piece.as_ptr() as usize as u64;
            self.tx.push_header(h.as_bytes(), &layout);
            if layout.ddgst {
                self.tx.push_ext(addr, piece.len(), release);
                let mut d = DataDigest::new();
                d.update(piece);
                self.tx.push_bytes(&d.value().to_le_bytes());
            } else if success {
                // Nothing follows: the mark goes with the data.
                self.tx.push_ext_marked(addr, piece.len(), release);
                return true;
            } else {
                self.tx.push_ext(addr, piece.len(), release);
            }
            off += l;
        }
        if let Some(cqe) = response {
            self.respond(cqe, None);
        }
        self.tx.push_mark(release);
        true
    }

    /// Queues a C2HTermReq with `fes`, `fei` and (up to 128 bytes of) the
    /// offending `header`. Nothing should be queued after it.
    pub fn terminate(&mut self, fes: Fes, fei: u32, header: &[u8]) {
        let n = header.len().min(TERM_REQ_MAX_DATA as usize);
        let t = TermReq::new(Role::Controller, fes, fei, n);
        self.tx.push_bytes(t.as_bytes());
        self.tx.push_bytes(&header[..n]);
    }
}
