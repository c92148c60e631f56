//! Receive: as much as the socket has, handed to the engine
//! ([`TargetQueue::next`]: headers checked and parsed, data with its
//! digest, H2CData checked against its R2T), and what its events mean
//! here: ICReq, command capsules (a slot, a buffer, then the core),
//! H2CData, each PDU's data put where it belongs.
//!
//! [`TargetQueue::next`]: pollux_tcp::engine::target::TargetQueue::next
use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::FcType;
use pollux_spec::status::generic;
use pollux_spec::tcp::Fes;
use pollux_spec::Sqe;
use pollux_tcp::engine::target::{self, Ended, TargetError, TargetEvent};

use crate::qpair::{gen, Bound, Qpair};
use crate::tcp::conn::{Dest, Fatal, Phase, Sink, Tcp, READS_PER_POLL};
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
            if self.eng.tx.own_len() >= TX_BACKLOG_MAX {
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
        let d = self.arriving?;
        let Sink::Slot(i) = d.sink else {
            return None;
        };
        // (None while padding is still to come.)
        let (off, left) = self.eng.data_window()?;
        if left < DIRECT_MIN {
            return None;
        }
        let buf = qp.slots.get_mut(i as usize)?.buf.as_mut()?;
        let at = (d.base + off) as usize;
        let dst = buf.as_mut_slice().get_mut(at..at + left as usize)?;
        let r = self.sock.recv2(dst, &mut self.rx[..]);
        Some(r.map(|o| {
            o.map(|n| {
                let n1 = n.min(left as usize);
                self.eng.data_taken(&dst[..n1]);
                self.rs = 0;
                self.re = 0;
                (n, n - n1)
            })
        }))
    }

    /// Hands the receive buffer to the engine and handles what it finds,
    /// until it needs more bytes (or the connection stops taking them).
    fn process(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair) {
        while matches!(self.phase, Phase::Init | Phase::Ready) {
            let at = self.rs;
            let (used, ev) = match self.eng.next(&self.rx[at..self.re]) {
                Ok(x) => x,
                Err(TargetError::TermReqLength { plen }) => {
                    self.close_now(ctx, qp, &format!("host TermReq with PLEN {plen}"));
                    return;
                }
                Err(TargetError::Fatal {
                    fes,
                    fei,
                    why,
                    header,
                }) => return self.fatal(ctx, qp, Fatal { fes, fei, why }, &header),
            };
            self.rs += used;
            let Some(ev) = ev else {
                return;
            };
            match ev {
                TargetEvent::Capsule {
                    sqe,
                    data_len,
                    data,
                    end,
                } => {
                    let sqe = target::sqe_of(sqe);
                    let d = match capsule_dest(qp, &sqe, data_len) {
                        Ok(d) => d,
                        Err(f) => {
                            // The header (HLEN bytes) starts where the
                            // engine began.
                            let hlen = self.rx[at + 2] as usize;
                            let hb = self.rx[at..at + hlen].to_vec();
                            return self.fatal(ctx, qp, f, &hb);
                        }
                    };
                    match (data, end) {
                        (Some(bytes), Some(e)) => {
                            put(qp, &d, 0, bytes);
                            self.ended(ctx, qp, d, e, &sqe);
                        }
                        _ => {
                            if d.slot.is_none() {
                                self.unbound_sqe = sqe;
                            }
                            self.arriving = Some(d);
                        }
                    }
                }
                TargetEvent::H2CData {
                    ttag,
                    datao,
                    data,
                    end,
                    ..
                } => {
                    let d = Dest {
                        sink: Sink::Slot(ttag),
                        slot: Some(ttag),
                        base: datao,
                        data_len: 0,
                    };
                    match (data, end) {
                        (Some(bytes), Some(e)) => {
                            put(qp, &d, 0, bytes);
                            self.h2c_ended(qp, e);
                        }
                        _ => self.arriving = Some(d),
                    }
                }
                TargetEvent::Data { offset, bytes, end } => {
                    if let Some(d) = self.arriving {
                        put(qp, &d, offset, bytes);
                        if let Some(e) = end {
                            self.arriving = None;
                            let sqe = self.unbound_sqe;
                            self.ended(ctx, qp, d, e, &sqe);
                        }
                    }
                }
                TargetEvent::End(e) => {
                    if let Some(d) = self.arriving.take() {
                        let sqe = self.unbound_sqe;
                        self.ended(ctx, qp, d, e, &sqe);
                    }
                }
                TargetEvent::Initialized(p) => {
                    self.phase = Phase::Ready;
                    self.stage_since = qp.now;
                    tracing::debug!(peer = %qp.peer, digests = ?p.digests, hpda = p.hpda, maxr2t = p.maxr2t, "connection initialized");
                }
                TargetEvent::TermReq(t) => {
                    tracing::warn!(peer = %qp.peer, fes = %t.fes(), fei = t.fei(), "host terminated the connection (H2CTermReq)");
                    self.begin_close(ctx, qp, "H2CTermReq");
                }
            }
        }
    }

    /// A PDU whose data went to `d` is complete (`sqe`: a command
    /// capsule's, if it has no slot).
    #[inline(always)]
    fn ended(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, d: Dest, e: Ended, sqe: &Sqe) {
        match e {
            Ended::Capsule { digest_ok } => {
                if !digest_ok {
                    tracing::warn!(peer = %qp.peer, "data digest error");
                }
                self.capsule_in(ctx, qp, &d, sqe, digest_ok);
            }
            _ => self.h2c_ended(qp, e),
        }
    }

    /// An H2CData PDU is complete.
    #[inline(always)]
    fn h2c_ended(&mut self, qp: &mut Qpair, e: Ended) {
        match e {
            Ended::H2C {
                ttag,
                digest_ok,
                complete,
            } => {
                let s = &mut qp.slots[ttag as usize];
                if !digest_ok {
                    tracing::warn!(peer = %qp.peer, "data digest error");
                    s.err = Some(gen(generic::TRANSIENT_TRANSPORT_ERROR));
                }
                if complete {
                    self.r2t_out = self.r2t_out.saturating_sub(1);
                    qp.data_in(self, ttag);
                }
            }
            Ended::Capsule { .. } | Ended::Other => {}
        }
    }

    /// A command capsule is in, with its in-capsule data (`ok`: their
    /// digest matched, or there was none).
    #[inline(always)]
    fn capsule_in(&mut self, ctx: &mut ThreadCtx, qp: &mut Qpair, d: &Dest, sqe: &Sqe, ok: bool) {
        match (d.sink, d.slot) {
            (Sink::Slot(i), _) => qp.capsule(ctx, self, i, d.data_len, ok),
            // A command whose data was refused (its slot holds the
            // status).
            (Sink::Discard, Some(i)) => qp.capsule(ctx, self, i, 0, true),
            _ => {
                qp.unbound_command(ctx, self, sqe, ok);
                // A Connect accepted gave the queue its slots.
                if self.eng.transfers() != qp.slots.len() {
                    self.eng.set_transfers(qp.slots.len());
                    self.r2t_at = vec![None; qp.slots.len()];
                }
            }
        }
    }
}

/// Where the data of a command capsule with `data_len` bytes of
/// in-capsule data goes: its slot's buffer (a slot taken, a buffer given),
/// the Connect data on a queue not connected yet, or nowhere (the command
/// then completes with the status its slot holds).
#[inline(always)]
fn capsule_dest(qp: &mut Qpair, sqe: &Sqe, dl: u32) -> Result<Dest, Fatal> {
    let mut d = Dest {
        sink: Sink::Discard,
        slot: None,
        base: 0,
        data_len: dl,
    };
    if matches!(qp.bound, Bound::None) {
        if FcType::of(sqe) == Some(FcType::Connect) && dl <= qp.icd_max {
            qp.scratch.clear();
            d.sink = Sink::Scratch;
        }
        return Ok(d);
    }
    let Some(i) = qp.take_slot(sqe) else {
        return Err(Fatal {
            fes: Fes::PDU_SEQUENCE_ERROR,
            fei: 0,
            why: format!("command capsule beyond the queue's {} entries", qp.entries),
        });
    };
    d.slot = Some(i);
    // In-capsule data is arriving: its buffer does not wait for the
    // pool's budget (bounded by the slots).
    let err = if dl == 0 {
        None
    } else if dl > qp.icd_max {
        Some(gen(generic::SGL_OFFSET_INVALID))
    } else if qp.slot_buf(i, dl as usize, false) {
        None
    } else {
        Some(gen(generic::INTERNAL_ERROR))
    };
    match err {
        Some(e) => qp.slots[i as usize].err = Some(e),
        None => d.sink = Sink::Slot(i),
    }
    Ok(d)
}

/// Puts `bytes`, `offset` bytes into a PDU's data, where `d` says.
#[inline(always)]
fn put(qp: &mut Qpair, d: &Dest, offset: u32, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    match d.sink {
        Sink::Discard => {}
        Sink::Scratch => qp.scratch.extend_from_slice(bytes),
        Sink::Slot(i) => {
            let at = (d.base + offset) as usize;
            let dst = qp.slots[i as usize]
                .buf
                .as_mut()
                .and_then(|b| b.as_mut_slice().get_mut(at..at + bytes.len()));
            if let Some(dst) = dst {
                dst.copy_from_slice(bytes);
            }
        }
    }
}
