//! Receive: as much as the socket has, PDUs parsed out of it (common
//! header checked, header parsed, data streamed to where it belongs with
//! its digest computed on the way), ICReq, command capsules and H2CData.
use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::FcType;
use pollux_spec::status::generic;
use pollux_spec::tcp::{
    check_data_range, CommonHeader, DataDigest, Digests, Fes, Field, IcResp, PduError, PduHeader,
    PduLayout, PduType,
};
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

use crate::qpair::{gen, Bound, Qpair, St};
use crate::tcp::conn::{internal, Body, Fatal, H2c, Phase, RxState, Sink, Tcp, READS_PER_POLL};
use crate::tcp::sock::Wire;

/// Data at least this large is received straight into its buffer.
pub(crate) const DIRECT_MIN: u32 = 8 << 10;
/// Bytes queued to send (PDU headers, responses) beyond which nothing
/// more is read until the host has taken them: a host that does not read
/// cannot make the queue grow (commands on a bound queue are limited by
/// its slots, but a queue not yet connected answers without a slot).
pub(crate) const TX_BACKLOG_MAX: usize = 64 << 10;

impl<W: Wire> Tcp<W> {
    /// Reads what the socket has (a few reads at most) and handles the
    /// PDUs in it; true if anything arrived.
    pub(crate) fn receive(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) -> bool {
        let mut busy = false;
        for _ in 0..READS_PER_POLL {
            if self.tx.bytes.len() >= TX_BACKLOG_MAX {
                break;
            }
            if self.rs == self.re {
                self.rs = 0;
                self.re = 0;
            } else if self.rs > 0 && self.rx.len() - self.re < 4096 {
                self.rx.copy_within(self.rs..self.re, 0);
                self.re -= self.rs;
                self.rs = 0;
            }
            // (bytes read in all, of them into the receive buffer)
            let r = if let Some(r) = self.direct_receive(qp) {
                r
            } else if self.re == self.rx.len() {
                break;
            } else {
                let (_, tail) = self.rx.split_at_mut(self.re);
                self.sock.recv2(tail, &mut []).map(|o| o.map(|n| (n, n)))
            };
            match r {
                Ok(Some((0, _))) => {
                    self.close_now(ctx, qp, "host closed the connection");
                    return true;
                }
                Ok(Some((_, n))) => {
                    self.re += n;
                    self.last_rx = qp.now;
                    busy = true;
                    self.process(ctx, qp);
                    if self.phase != Phase::Ready && self.phase != Phase::Init {
                        break;
                    }
                    if self.re < self.rx.len() {
                        // The socket had less than the room: it is empty.
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.close_now(ctx, qp, &format!("receive failed: {e}"));
                    return true;
                }
            }
        }
        busy
    }

    /// One `readv` into the buffer of a large data PDU being received and
    /// the receive buffer; the bytes for the data are taken in here.
    /// Returns the bytes read in all and those that went to the receive
    /// buffer (which starts empty).
    #[allow(clippy::type_complexity)]
    fn direct_receive(
        &mut self,
        qp: &mut Qpair,
    ) -> Option<std::io::Result<Option<(usize, usize)>>> {
        if !qp.shared.opts.direct_receive || self.rs != self.re {
            return None;
        }
        let RxState::Body(b) = &mut self.rxst else {
            return None;
        };
        let Sink::Slot(i) = b.sink else {
            return None;
        };
        if b.pad != 0 || b.left < DIRECT_MIN {
            return None;
        }
        let buf = qp.slots.get_mut(i as usize)?.buf.as_mut()?;
        let dst = buf
            .as_mut_slice()
            .get_mut(b.off as usize..(b.off + b.left) as usize)?;
        let r = self.sock.recv2(dst, &mut self.rx[..]);
        Some(r.map(|o| {
            o.map(|n| {
                let n1 = n.min(b.left as usize);
                if b.want_dd {
                    b.dg.update(&dst[..n1]);
                }
                b.off += n1 as u32;
                b.left -= n1 as u32;
                self.rs = 0;
                self.re = 0;
                (n, n - n1)
            })
        }))
    }

    /// Parses and handles every complete piece in the receive buffer.
    fn process(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) {
        while matches!(self.phase, Phase::Init | Phase::Ready) {
            match self.rxst {
                RxState::Header => {
                    let avail = self.re - self.rs;
                    if avail < 8 {
                        return;
                    }
                    let at = self.rs;
                    let Some(ch) = CommonHeader::read(&self.rx[at..self.re]) else {
                        return;
                    };
                    let layout = match self.memo.check(&ch, &self.rxcfg) {
                        Ok(l) => l,
                        Err(PduError::TermReqLength { plen, .. }) => {
                            self.close_now(ctx, qp, &format!("host TermReq with PLEN {plen}"));
                            return;
                        }
                        Err(e) => {
                            let n = avail.min(ch.hlen.max(8) as usize);
                            let hb = self.rx[at..at + n].to_vec();
                            return self.fatal(ctx, qp, e.into(), &hb);
                        }
                    };
                    let hl = layout.header_len() as usize;
                    if avail < hl {
                        return;
                    }
                    // Parsed where it lies (the parsed header owns its
                    // fields); the bytes are copied only for a TermReq.
                    let pdu = match PduHeader::parse(&self.rx[at..at + hl], &layout, &self.rxcfg) {
                        Ok(p) => p,
                        Err(e) => {
                            let hb = self.rx[at..at + hl].to_vec();
                            return self.fatal(ctx, qp, e.into(), &hb);
                        }
                    };
                    self.rs += hl;
                    if let Err(f) = self.on_header(ctx, qp, pdu, &layout) {
                        // Handling a header never writes the receive
                        // buffer (only `receive` and `closing` do).
                        let end = at + layout.hlen as usize;
                        let hb = self.rx.get(at..end).map(<[u8]>::to_vec).unwrap_or_default();
                        return self.fatal(ctx, qp, f, &hb);
                    }
                }
                RxState::Body(mut b) => {
                    let done = self.consume_body(qp, &mut b);
                    if !done {
                        self.rxst = RxState::Body(b);
                        return;
                    }
                    self.rxst = RxState::Header;
                    let ok = !b.want_dd || b.dg.value() == u32::from_le_bytes(b.dd);
                    if !ok {
                        tracing::warn!(peer = %qp.peer, "data digest error");
                    }
                    self.on_body(ctx, qp, &b, ok);
                }
            }
        }
    }

    /// Takes what the receive buffer has of a PDU's padding, data and
    /// data digest; true once all of it is in.
    fn consume_body(&mut self, qp: &mut Qpair, b: &mut Body) -> bool {
        let avail = self.re - self.rs;
        let n = (b.pad as usize).min(avail);
        self.rs += n;
        b.pad -= n as u32;
        if b.pad > 0 {
            return false;
        }
        if b.left > 0 {
            let n = (b.left as usize).min(self.re - self.rs);
            let src = &self.rx[self.rs..self.rs + n];
            if b.want_dd {
                b.dg.update(src);
            }
            match b.sink {
                Sink::Discard => {}
                Sink::Scratch => qp.scratch.extend_from_slice(src),
                Sink::Slot(i) => {
                    let dst = qp.slots[i as usize]
                        .buf
                        .as_mut()
                        .and_then(|d| d.as_mut_slice().get_mut(b.off as usize..b.off as usize + n));
                    if let Some(dst) = dst {
                        dst.copy_from_slice(src);
                    }
                }
            }
            self.rs += n;
            b.off += n as u32;
            b.left -= n as u32;
            if b.left > 0 {
                return false;
            }
        }
        if b.want_dd {
            while b.dd_have < 4 && self.rs < self.re {
                b.dd[b.dd_have as usize] = self.rx[self.rs];
                b.dd_have += 1;
                self.rs += 1;
            }
            if b.dd_have < 4 {
                return false;
            }
        }
        true
    }

    fn body(pdu: PduHeader, layout: &PduLayout, sink: Sink, slot: Option<u16>, off: u32) -> Body {
        Body {
            pdu,
            slot,
            pad: layout.pad_len(),
            left: layout.data_len,
            data_len: layout.data_len,
            sink,
            off,
            dg: DataDigest::new(),
            want_dd: layout.ddgst,
            dd: [0; 4],
            dd_have: 0,
        }
    }

    fn on_header(
        &mut self,
        ctx: &mut ThreadCtx,
        qp: &mut Qpair,
        pdu: PduHeader,
        layout: &PduLayout,
    ) -> Result<(), Fatal> {
        match pdu {
            PduHeader::IcReq(r) => {
                self.digests = r.digests();
                self.hpda = r.hpda;
                let o = &qp.shared.opts;
                let resp = IcResp::new(0, self.digests, o.max_h2c_data);
                let l = PduLayout::new(PduType::IcResp, Digests::NONE, 0, 0)
                    .ok_or_else(|| internal("ICResp layout"))?;
                self.tx.push_header(resp.as_bytes(), &l);
                self.rxcfg.established = true;
                self.rxcfg.digests = self.digests;
                self.rxcfg.maxh2cdata = o.max_h2c_data;
                let icd = o.admin_in_capsule_data_size.max(o.in_capsule_data_size);
                self.rxcfg.max_plen = self
                    .rxcfg
                    .plen_for(PduType::CapsuleCmd, icd)
                    .max(self.rxcfg.plen_for(PduType::H2CData, o.max_h2c_data));
                self.phase = Phase::Ready;
                self.stage_since = qp.now;
                tracing::debug!(peer = %qp.peer, digests = ?self.digests, hpda = r.hpda, maxr2t = r.maxr2t, "connection initialized");
                Ok(())
            }
            PduHeader::TermReq(t) => {
                tracing::warn!(peer = %qp.peer, fes = %t.fes(), fei = t.fei(), "host terminated the connection (H2CTermReq)");
                self.begin_close(ctx, qp, "H2CTermReq");
                Ok(())
            }
            PduHeader::CapsuleCmd(c) => {
                let sqe = c.sqe();
                let dl = layout.data_len;
                let sink = if matches!(qp.bound, Bound::None) {
                    if FcType::of(&sqe) == Some(FcType::Connect) && dl <= qp.icd_max {
                        qp.scratch.clear();
                        Sink::Scratch
                    } else {
                        Sink::Discard
                    }
                } else {
                    let Some(i) = qp.take_slot(&sqe) else {
                        return Err(Fatal {
                            fes: Fes::PDU_SEQUENCE_ERROR,
                            fei: 0,
                            why: format!(
                                "command capsule beyond the queue's {} entries",
                                qp.entries
                            ),
                        });
                    };
                    // In-capsule data is arriving: its buffer does not
                    // wait for the pool's budget (bounded by the slots).
                    let err = if dl == 0 {
                        None
                    } else if dl > qp.icd_max {
                        Some(gen(generic::SGL_OFFSET_INVALID))
                    } else if qp.slot_buf(i, dl as usize, false) {
                        None
                    } else {
                        Some(gen(generic::INTERNAL_ERROR))
                    };
                    if let Some(e) = err {
                        qp.slots[i as usize].err = Some(e);
                        self.rxst =
                            RxState::Body(Self::body(pdu, layout, Sink::Discard, Some(i), 0));
                        return Ok(());
                    }
                    Sink::Slot(i)
                };
                let slot = match sink {
                    Sink::Slot(i) => Some(i),
                    _ => None,
                };
                if layout.data_len == 0 && layout.pad_len() == 0 {
                    // Nothing follows the header: the command is in.
                    self.capsule_in(ctx, qp, &sqe, sink, slot, 0, true);
                } else {
                    self.rxst = RxState::Body(Self::body(pdu, layout, sink, slot, 0));
                }
                Ok(())
            }
            PduHeader::H2CData(h) => {
                let i = h.ttag as usize;
                let bad = |field: Field, why: String| Fatal {
                    fes: Fes::INVALID_HEADER_FIELD,
                    fei: field.offset(),
                    why,
                };
                let Some(s) = qp.slots.get(i).filter(|s| s.st == St::AwaitData) else {
                    return Err(bad(
                        Field::Ttag,
                        format!("H2CData for TTAG {} with no transfer outstanding", h.ttag),
                    ));
                };
                if s.cid != h.cccid {
                    return Err(bad(
                        Field::Cccid,
                        format!(
                            "H2CData CCCID {} does not match TTAG {}'s command {}",
                            h.cccid, h.ttag, s.cid
                        ),
                    ));
                }
                check_data_range(PduType::H2CData, h.datao, h.datal, self.h2c[i].got, s.xfer)?;
                self.rxst = RxState::Body(Self::body(
                    pdu,
                    layout,
                    Sink::Slot(i as u16),
                    Some(i as u16),
                    h.datao,
                ));
                Ok(())
            }
            other => Err(internal(&format!("unexpected PDU {other:?}"))),
        }
    }

    /// A PDU is complete (`ok`: its data digest matched, or it had none).
    fn on_body(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, b: &Body, ok: bool) {
        match b.pdu {
            PduHeader::CapsuleCmd(c) => {
                self.capsule_in(ctx, qp, &c.sqe(), b.sink, b.slot, b.data_len, ok);
            }
            PduHeader::H2CData(h) => {
                let i = h.ttag;
                let t = &mut self.h2c[i as usize];
                t.got += h.datal;
                let s = &mut qp.slots[i as usize];
                if !ok {
                    s.err = Some(gen(generic::TRANSIENT_TRANSPORT_ERROR));
                }
                if t.got == s.xfer {
                    self.r2t_out = self.r2t_out.saturating_sub(1);
                    qp.data_in(self, i);
                }
            }
            _ => {}
        }
    }

    /// A command capsule is in, with its `data_len` bytes of in-capsule
    /// data (`ok`: their digest matched, or there was none).
    #[allow(clippy::too_many_arguments)]
    fn capsule_in(
        &mut self,
        ctx: &mut ThreadCtx,
        qp: &mut Qpair,
        sqe: &Sqe,
        sink: Sink,
        slot: Option<u16>,
        data_len: u32,
        ok: bool,
    ) {
        match (sink, slot) {
            (Sink::Slot(i), _) => qp.capsule(ctx, self, i, data_len, ok),
            // A command whose data was refused (its slot holds the
            // status).
            (Sink::Discard, Some(i)) => qp.capsule(ctx, self, i, 0, true),
            _ => {
                qp.unbound_command(ctx, self, sqe, ok);
                // A Connect accepted gave the queue its slots.
                if self.h2c.len() != qp.slots.len() {
                    self.h2c = vec![H2c::default(); qp.slots.len()];
                }
            }
        }
    }
}
