//! What the host model does: the valid operations and the mutations.

use pollux_runtime::ThreadCtx;
use pollux_spec::cmd::cns;
use pollux_spec::fabrics::{
    ConnectCmd, ConnectData, DisconnectCmd, PropertyGetCmd, PropertySetCmd, PropertySize,
    SglDescriptor, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
};
use pollux_spec::features::fid;
use pollux_spec::tcp::{CapsuleCmd, Digests, Fes, H2CData, IcReq, PduType, Role, TermReq};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe};
use zerocopy::IntoBytes;

use crate::cases::*;
use crate::host::*;
use crate::{BLOCKS, CLOSE_POLLS, HOST, SUB};

impl<'a> Host<'a> {
    // --- the operations ---

    pub(crate) fn icreq(&mut self, ctx: &mut ThreadCtx, dg: Digests, mutate: bool) {
        self.dg = dg;
        let mut r = IcReq::new(0, self.dg, 0);
        let mut b = r.as_bytes().to_vec();
        if mutate && self.chance(3) {
            // A bad field (PFV, HPDA, digest bits, MAXR2T, HLEN, PLEN).
            match self.r(4) {
                0 => r.pfv = 1,
                1 => r.hpda = 32 + self.r(200) as u8,
                2 => r.ch.hlen ^= 1 << self.r(8),
                _ => r.ch.plen = self.r(1 << 20) as u32,
            }
            b = r.as_bytes().to_vec();
        }
        if mutate && self.chance(3) {
            // Half an ICReq, then the host goes away.
            let n = self.r(b.len() as u64) as usize;
            let p = self.predict(&b[..n]);
            trace(|| format!("half ICReq {n} -> {p:?}"));
            self.note(p);
            self.feed(ctx, &b[..n]);
            self.closed_by_host = true;
            return;
        }
        let p = self.send_pdu(ctx, &b);
        if p == Pred::Accept {
            self.tgt.established = true;
            self.tgt.digests = self.dg;
            let o = self.env.tgt.opts();
            self.tgt.maxh2cdata = o.max_h2c_data;
            let icd = o.admin_in_capsule_data_size.max(o.in_capsule_data_size);
            self.tgt.max_plen = self
                .tgt
                .plen_for(PduType::CapsuleCmd, icd)
                .max(self.tgt.plen_for(PduType::H2CData, o.max_h2c_data));
            if self.reading && !self.rx.established && self.strict {
                fail("no ICResp".into());
            }
        }
    }

    pub(crate) fn connect(&mut self, ctx: &mut ThreadCtx, admin: bool) {
        let qid = if admin { 0 } else { 1 };
        let sqsize = 1 + self.r(63) as u16;
        self.flow_off = self.chance(50);
        let cattr = if self.flow_off {
            CATTR_DISABLE_SQ_FLOW
        } else {
            0
        };
        let c = ConnectCmd::new(qid, sqsize, cattr, 0);
        let cntlid = if admin {
            CNTLID_DYNAMIC
        } else {
            self.env.cntlid
        };
        let mut sub = SUB;
        if self.chance(3) {
            sub = "nqn.2024-01.io.pollux:nobody";
        }
        let Ok(d) = ConnectData::new([7; 16], cntlid, sub, HOST) else {
            return;
        };
        let kind = Kind::Connect {
            admin,
            entries: sqsize + 1,
        };
        self.command(ctx, c.to_sqe(), d.as_bytes(), kind, 2);
    }

    pub(crate) fn admin_op(&mut self, ctx: &mut ThreadCtx) {
        // Admin opcodes mean other things on an I/O queue (09h is Dataset
        // Management): any outcome.
        let plain = if self.io { Kind::Unknown } else { Kind::Plain };
        match self.r(5) {
            0 => {
                let cc = pollux_spec::regs::Cc::standard(0).with_en(self.chance(80));
                let c = PropertySetCmd::new(0x14, PropertySize::Four, cc.0 as u64);
                self.command(ctx, c.to_sqe(), &[], plain.clone(), 5);
            }
            1 => {
                let ofst = [0x00, 0x08, 0x14, 0x1C, 0x20, 0x44][self.r(6) as usize];
                let size = if self.chance(50) {
                    PropertySize::Four
                } else {
                    PropertySize::Eight
                };
                let c = PropertyGetCmd::new(ofst, size);
                self.command(ctx, c.to_sqe(), &[], plain.clone(), 5);
            }
            2 => {
                let mut sqe =
                    Sqe::identify([cns::CONTROLLER, cns::NAMESPACE][self.r(2) as usize], 1, 0);
                SglDescriptor::tcp_transport(4096).write_to_sqe(&mut sqe);
                let k = if self.io {
                    Kind::Unknown
                } else {
                    Kind::Read {
                        slba: None,
                        got: Vec::new(),
                    }
                };
                self.command(ctx, sqe, &[], k, 5);
            }
            3 => {
                let sqe = Sqe::new(AdminOpcode::KeepAlive as u8, 0);
                self.command(ctx, sqe, &[], plain, 5);
            }
            _ => {
                let sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
                self.command(ctx, sqe, &[], plain, 5);
            }
        }
    }

    pub(crate) fn lba_for(&mut self, len: usize) -> u64 {
        self.r(BLOCKS - (len / 512) as u64 + 1)
    }

    pub(crate) fn write(&mut self, ctx: &mut ThreadCtx, in_capsule: bool) {
        let len = if in_capsule {
            512 * (1 + self.r(8) as usize)
        } else {
            512 * (1 + self.r(256) as usize)
        };
        let slba = self.lba_for(len);
        let data = self.bytes(len);
        let bad_digest = self.dg.data && self.chance(5);
        let mut sqe = Sqe::rw(NvmOpcode::Write, 1, slba, (len / 512) as u32);
        if in_capsule {
            SglDescriptor::in_capsule(0, len as u32).write_to_sqe(&mut sqe);
            let k = Kind::Write {
                slba,
                data: data.clone(),
                bad_digest,
            };
            return self.command(ctx, sqe, &data, k, 3);
        }
        SglDescriptor::tcp_transport(len as u32).write_to_sqe(&mut sqe);
        let k = Kind::Write {
            slba,
            data: data.clone(),
            bad_digest,
        };
        self.command(ctx, sqe, &[], k, 3);
        let cid = self.cid;
        let Some((&ttag, _)) = self.r2t.iter().find(|(_, v)| v.0 == cid) else {
            return;
        };
        // The data, in order, in pieces of at most MAXH2CDATA; maybe one
        // broken H2CData on the way.
        let mut off = 0usize;
        while off < len && !self.done() {
            let n = (1 + self.r(self.maxh2c.min(32 << 10) as u64) as usize).min(len - off);
            let last = off + n == len;
            let (mut cccid, mut tt, mut datao, mut datal) = (cid, ttag, off as u32, n as u32);
            if self.chance(2) {
                match self.r(4) {
                    0 => tt = tt.wrapping_add(1 + self.r(200) as u16),
                    1 => cccid = cccid.wrapping_add(1),
                    2 => datao = datao.wrapping_add(1 + self.r(4096) as u32),
                    _ => datal = datal.wrapping_add(1 + self.r(1 << 20) as u32),
                }
            }
            let Some((mut h, l)) = H2CData::new(cccid, tt, datao, n as u32, last, self.dg, 0)
            else {
                return;
            };
            h.datal = datal;
            let b = self.build(h.as_bytes(), &l, &data[off..off + n], bad_digest && last);
            let p = self.predict(&b);
            trace(|| {
                format!("h2c ttag {tt} cccid {cccid} datao {datao} datal {datal} n {n} -> {p:?}")
            });
            self.note(p);
            if p == Pred::Accept {
                if let Some(v) = self.r2t.get_mut(&ttag) {
                    v.1 += n as u32;
                    if v.1 == v.2 {
                        self.r2t.remove(&ttag);
                        self.stale.push((ttag, cid));
                    }
                }
            }
            self.feed(ctx, &b);
            off += n;
        }
        self.check_settled();
    }

    /// Several reads in one piece: with a small data buffer pool, those
    /// beyond it wait for buffers and are served as others end.
    pub(crate) fn read_burst(&mut self, ctx: &mut ThreadCtx) {
        let mut all = Vec::new();
        for _ in 0..2 + self.r(5) {
            if self.pending.len() + 1 >= self.entries as usize {
                break;
            }
            let len = 512 * (1 + self.r(256) as usize);
            let slba = self.lba_for(len);
            let mut sqe = Sqe::rw(NvmOpcode::Read, 1, slba, (len / 512) as u32);
            SglDescriptor::tcp_transport(len as u32).write_to_sqe(&mut sqe);
            sqe.cid = self.next_cid();
            let Some(b) = self.capsule_bytes(&sqe, &[], false) else {
                return;
            };
            let p = self.predict(&b);
            if p == Pred::Accept {
                let k = Kind::Read {
                    slba: Some(slba),
                    got: Vec::new(),
                };
                self.pending.insert(sqe.cid, k);
            }
            self.note(p);
            all.extend_from_slice(&b);
        }
        trace(|| format!("read burst of {} bytes", all.len()));
        self.feed(ctx, &all);
        self.check_settled();
    }

    pub(crate) fn read(&mut self, ctx: &mut ThreadCtx) {
        let len = 512 * (1 + self.r(256) as usize);
        let slba = self.lba_for(len);
        let mut sqe = Sqe::rw(NvmOpcode::Read, 1, slba, (len / 512) as u32);
        SglDescriptor::tcp_transport(len as u32).write_to_sqe(&mut sqe);
        let k = Kind::Read {
            slba: Some(slba),
            got: Vec::new(),
        };
        self.command(ctx, sqe, &[], k, 3);
    }

    /// H2CData for a transfer that finished, or that never was.
    pub(crate) fn stray_h2c(&mut self, ctx: &mut ThreadCtx) {
        let coin = self.chance(50);
        let (tt, cid) = match self.stale.last() {
            Some(&s) if coin => s,
            _ => (self.r(256) as u16, self.cid),
        };
        let n = 1 + self.r(4096) as u32;
        let Some((h, l)) = H2CData::new(cid, tt, 0, n, true, self.dg, 0) else {
            return;
        };
        let data = vec![0xA5u8; n as usize];
        let b = self.build(h.as_bytes(), &l, &data, false);
        self.send_pdu(ctx, &b);
    }

    /// A capsule whose PLEN is beyond what the target takes (or lies).
    pub(crate) fn oversized(&mut self, ctx: &mut ThreadCtx) {
        let mut sqe = Sqe::flush(1);
        sqe.cid = self.next_cid();
        let Some((mut h, l)) = CapsuleCmd::new(&sqe, 0, self.dg, 0) else {
            return;
        };
        h.ch.plen = self.tgt.max_plen + 1 + self.r(1 << 30) as u32;
        h.ch.pdo = h.ch.hlen + if self.dg.header { 4 } else { 0 };
        if self.dg.data {
            h.ch.flags |= pollux_spec::tcp::flags::DDGSTF;
        }
        let b = self.build(h.as_bytes(), &l, &[], false);
        self.send_pdu(ctx, &b);
    }

    /// Capsules in one burst: more than the queue's entries is fatal.
    pub(crate) fn burst(&mut self, ctx: &mut ThreadCtx) {
        let n = 1 + self.r(self.entries as u64 + 2) as usize;
        let mut all = Vec::new();
        let mut fatal = None;
        for _ in 0..n {
            let mut sqe = if self.io {
                Sqe::flush(1)
            } else {
                Sqe::new(AdminOpcode::KeepAlive as u8, 0)
            };
            sqe.cid = self.next_cid();
            let Some(b) = self.capsule_bytes(&sqe, &[], false) else {
                return;
            };
            all.extend_from_slice(&b);
            if self.bound && self.pending.len() >= self.entries as usize {
                fatal = Some(Pred::Fatal(Fes::PDU_SEQUENCE_ERROR, 0));
                break;
            }
            self.pending.insert(sqe.cid, Kind::Plain);
        }
        if let Some(p) = fatal {
            self.note(p);
        }
        // One piece: nothing is sent back (no slot freed) before all of it
        // is parsed.
        self.sent.extend_from_slice(&all);
        self.stats.bytes_in += all.len() as u64;
        self.c.wire().push(&all);
        self.settle(ctx);
        self.check_settled();
    }

    pub(crate) fn garbage(&mut self, ctx: &mut ThreadCtx) {
        let n = 1 + self.r(300) as usize;
        let b = self.bytes(n);
        let p = self.predict(&b);
        trace(|| format!("garbage {n} -> {p:?}"));
        if matches!(p, Pred::Accept | Pred::Incomplete) {
            // What follows is read from inside the garbage.
            self.strict = false;
        }
        self.note(p);
        self.feed(ctx, &b);
    }

    pub(crate) fn host_term(&mut self, ctx: &mut ThreadCtx) {
        let t = TermReq::new(Role::Host, Fes::PDU_SEQUENCE_ERROR, 0, 0);
        self.send_pdu(ctx, t.as_bytes());
    }

    pub(crate) fn second_icreq(&mut self, ctx: &mut ThreadCtx) {
        let r = IcReq::new(0, self.dg, 0);
        self.send_pdu(ctx, r.as_bytes());
    }

    pub(crate) fn disconnect(&mut self, ctx: &mut ThreadCtx) {
        let d = DisconnectCmd::new();
        self.command(ctx, d.to_sqe(), &[], Kind::Plain, 0);
        if self.bound {
            self.ending = true;
        }
    }

    /// A valid PDU cut short, then the host goes away.
    pub(crate) fn truncated(&mut self, ctx: &mut ThreadCtx) {
        let mut sqe = Sqe::flush(1);
        sqe.cid = self.next_cid();
        let data = vec![1u8; self.r(self.icd.max(1) as u64) as usize];
        let Some(b) = self.capsule_bytes(&sqe, &data, false) else {
            return;
        };
        let n = self.r(b.len() as u64) as usize;
        let p = self.predict(&b[..n]);
        if matches!(p, Pred::Fatal(..) | Pred::Quiet) {
            self.note(p);
        }
        self.feed(ctx, &b[..n]);
        self.closed_by_host = true;
    }

    /// Ends the case: the host reads everything, checks, closes; the
    /// connection must close.
    pub(crate) fn finish(mut self, ctx: &mut ThreadCtx, reset: bool) -> Stats {
        self.reading = true;
        self.c.wire().room = usize::MAX;
        self.settle(ctx);
        if self.expect.is_some() && self.strict {
            fail(format!("predicted TermReq {:?} not sent", self.expect));
        }
        if self.strict && !self.closed_by_host {
            self.check_settled();
        }
        {
            let w = self.c.wire();
            if reset {
                w.reset = true;
            } else {
                w.eof = true;
            }
        }
        for _ in 0..CLOSE_POLLS {
            self.poll(ctx);
            if self.c.is_closed() {
                break;
            }
        }
        if !self.c.is_closed() {
            fail("connection not closed after the host closed".into());
        }
        // Commands whose outcome the host never learnt (their response
        // dropped after a TermReq, or never sent): what they may have
        // written is unknown.
        for k in self.pending.values() {
            match k {
                Kind::Write { slba, data, .. } => {
                    let a = *slba as usize;
                    self.env.known[a..a + data.len() / 512].fill(false);
                }
                Kind::Unknown if self.io => self.env.known.fill(false),
                _ => {}
            }
        }
        self.stats.cases = 1;
        if self.term.is_some() {
            self.stats.terminated = 1;
        } else {
            self.stats.accepted = 1;
        }
        self.stats
    }
}
