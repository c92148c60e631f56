//! The host model: its state, moving bytes to and from the connection,
//! checking what the target sends, and predicting its C2HTermReq.
use std::collections::HashMap;
use std::net::SocketAddr;

use pollux_runtime::ThreadCtx;
use pollux_spec::status::{generic, sct};
use pollux_spec::tcp::{
    check_data_range, write_header, CapsuleCmd, CommonHeader, DataDigest, Digests, Fes, Field,
    PduError, PduHeader, PduLayout, PduType, Role, RxConfig, TermReq,
};
use pollux_spec::{Sqe, Status};
use proptest::prelude::Rng as _;
use proptest::test_runner::TestRng;
use zerocopy::IntoBytes;

use pollux_nvmf::testing::TestConn;

use crate::cases::*;
use crate::wire::*;
use crate::{TX_BYTES_MAX, TX_SEGS_MAX};

// ----------------------------------------------------------------------
// The host model
// ----------------------------------------------------------------------

#[derive(Clone)]
pub(crate) enum Kind {
    /// A response capsule.
    Plain,
    Connect {
        admin: bool,
        entries: u16,
    },
    /// Data to the host (checked against the shadow when `slba` is
    /// set), then SUCCESS or a response.
    Read {
        slba: Option<u64>,
        got: Vec<u8>,
    },
    Write {
        slba: u64,
        data: Vec<u8>,
        /// Data digest deliberately wrong: must fail.
        bad_digest: bool,
    },
    /// A mutated command: any single outcome (or none).
    Unknown,
}

impl std::fmt::Debug for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Kind::Plain => write!(f, "Plain"),
            Kind::Connect { admin, entries } => write!(f, "Connect(admin {admin}, {entries})"),
            Kind::Read { slba, got } => write!(f, "Read({slba:?}, got {})", got.len()),
            Kind::Write {
                slba,
                data,
                bad_digest,
            } => write!(
                f,
                "Write({slba}, {} bytes, bad digest {bad_digest})",
                data.len()
            ),
            Kind::Unknown => write!(f, "Unknown"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pred {
    /// The PDU is accepted.
    Accept,
    /// Not all of the header is there.
    Incomplete,
    /// C2HTermReq with this FES and FEI, then close.
    Fatal(Fes, u32),
    /// Closed without a TermReq (a host TermReq).
    Quiet,
}

pub(crate) struct Host<'a> {
    pub(crate) env: &'a mut Env,
    pub(crate) rng: &'a mut TestRng,
    pub(crate) c: TestConn<MemWire>,
    /// Parse configuration of the target's PDUs.
    pub(crate) rx: RxConfig,
    /// The target's receive configuration, mirrored.
    pub(crate) tgt: RxConfig,
    pub(crate) dg: Digests,
    pub(crate) maxh2c: u32,
    pub(crate) icd: u32,
    pub(crate) io: bool,
    pub(crate) bound: bool,
    pub(crate) entries: u16,
    pub(crate) flow_off: bool,
    pub(crate) cid: u16,
    /// The CNTLID an admin Connect returned.
    pub(crate) cntlid: u16,
    pub(crate) pending: HashMap<u16, Kind>,
    /// R2Ts not answered: ttag -> (cid, got, xfer).
    pub(crate) r2t: HashMap<u16, (u16, u32, u32)>,
    /// Finished transfer tags (for stale H2CData).
    pub(crate) stale: Vec<(u16, u16)>,
    /// The stream is predictable.
    pub(crate) strict: bool,
    /// The host reads what the target sends.
    pub(crate) reading: bool,
    pub(crate) closed_by_host: bool,
    pub(crate) term: Option<TermReq>,
    /// A predicted TermReq not seen yet.
    pub(crate) expect: Option<(Fes, u32)>,
    /// The target closes (Disconnect, host TermReq, predicted fatal).
    pub(crate) ending: bool,
    pub(crate) obuf: Vec<u8>,
    pub(crate) sent: Vec<u8>,
    pub(crate) stats: Stats,
}

thread_local! {
    /// What the current case did (shown when it fails).
    pub(crate) static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(crate) fn trace(what: impl FnOnce() -> String) {
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < 200 {
            t.push(what());
        }
    });
}

pub(crate) fn fail(msg: String) -> ! {
    let ops = TRACE.with(|t| t.borrow().join("; "));
    panic!("{msg}\n  case: {ops}")
}

impl<'a> Host<'a> {
    pub(crate) fn new(
        env: &'a mut Env,
        rng: &'a mut TestRng,
        ctx: &ThreadCtx,
        room: usize,
    ) -> Host<'a> {
        let peer: SocketAddr = "127.0.0.1:9".parse().expect("address");
        let c = env
            .tgt
            .conn(ctx, &env.cache, MemWire::new(room), peer, ctx.now());
        let mut tgt = RxConfig::initial(Role::Controller);
        tgt.max_plen = 128;
        Host {
            env,
            rng,
            c,
            rx: RxConfig::initial(Role::Host),
            tgt,
            dg: Digests::NONE,
            maxh2c: 4096,
            icd: 0,
            io: false,
            bound: false,
            entries: 1,
            flow_off: false,
            cid: 0,
            cntlid: 0,
            pending: HashMap::new(),
            r2t: HashMap::new(),
            stale: Vec::new(),
            strict: true,
            reading: true,
            closed_by_host: false,
            term: None,
            expect: None,
            ending: false,
            obuf: Vec::new(),
            sent: Vec::new(),
            stats: Stats::default(),
        }
    }

    pub(crate) fn r(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    pub(crate) fn chance(&mut self, pct: u64) -> bool {
        self.r(100) < pct
    }

    pub(crate) fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    pub(crate) fn done(&mut self) -> bool {
        self.ending
            || self.term.is_some()
            || self.closed_by_host
            || self.c.is_closed()
            || self.c.wire().shut_wr.get()
    }

    /// `n` bytes of data.
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut x = self.rng.next_u64() | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    // --- moving bytes ---

    pub(crate) fn check_bounds(&mut self) {
        let f = self.c.footprint();
        // Data buffers: at most one of the largest transfer per slot.
        let bufs_max = f[3] * (128 << 10);
        if f[0] > TX_BYTES_MAX || f[1] > TX_SEGS_MAX || f[2] > 8192 || f[3] > 128 || f[5] > bufs_max
        {
            fail(format!(
                "connection memory unbounded: tx bytes {}, segments {}, Connect buffer {}, slots {}, data buffers {}",
                f[0], f[1], f[2], f[3], f[5]
            ));
        }
        if self.c.wire().after_fin > 0 {
            fail("target sent after its FIN".into());
        }
    }

    pub(crate) fn poll(&mut self, ctx: &mut ThreadCtx) -> bool {
        let busy = self.c.poll(ctx);
        self.check_bounds();
        if self.reading {
            self.absorb();
        }
        busy
    }

    /// Polls until nothing moves.
    pub(crate) fn settle(&mut self, ctx: &mut ThreadCtx) {
        let mut idle = 0;
        let mut stuck = 0;
        for _ in 0..100_000 {
            let busy = self.poll(ctx);
            if !busy && (!self.c.needs_poll() || !self.reading) {
                idle += 1;
                if idle >= 2 {
                    return;
                }
            } else {
                idle = 0;
            }
            // Commands wait for data buffers that transfers whose data
            // the host will never send hold (a mutated write's R2T): time
            // passes, the data timeout ends those (the thread's timer).
            stuck = if !busy && self.c.is_waiting() {
                stuck + 1
            } else {
                0
            };
            if stuck == 100 {
                let late = ctx.now() + self.env.tgt.opts().data_timeout * 2;
                trace(|| "data timeout".into());
                self.c.tick(ctx, late);
            }
        }
        fail("connection never settled".into());
    }

    /// Sends `b` in random pieces, polling between them.
    pub(crate) fn feed(&mut self, ctx: &mut ThreadCtx, b: &[u8]) {
        if self.c.is_closed() || self.closed_by_host {
            return;
        }
        self.sent.extend_from_slice(b);
        self.stats.bytes_in += b.len() as u64;
        if self.chance(50) {
            self.c.wire().push(b);
        } else {
            let mut at = 0;
            while at < b.len() {
                let n = 1 + self.r((b.len() - at) as u64) as usize;
                self.c.wire().push(&b[at..at + n]);
                at += n;
                self.poll(ctx);
            }
        }
        self.settle(ctx);
    }

    /// Parses what the target sent.
    pub(crate) fn absorb(&mut self) {
        let w = self.c.wire();
        if !w.out.is_empty() {
            let out = std::mem::take(&mut w.out);
            self.obuf.extend_from_slice(&out);
        }
        loop {
            let Some(ch) = CommonHeader::read(&self.obuf) else {
                return;
            };
            let l = ch
                .check(&self.rx)
                .unwrap_or_else(|e| fail(format!("target sent a bad PDU header: {e}")));
            let plen = l.plen as usize;
            if self.obuf.len() < plen {
                return;
            }
            let h = PduHeader::parse(&self.obuf[..plen], &l, &self.rx)
                .unwrap_or_else(|e| fail(format!("target sent a bad PDU: {e}")));
            let data = self.obuf[l.data_range()].to_vec();
            if let Some(r) = l.data_digest_range() {
                let mut d = DataDigest::new();
                d.update(&data);
                if self.obuf[r] != d.value().to_le_bytes() {
                    fail("target sent a wrong data digest".into());
                }
            }
            self.obuf.drain(..plen);
            if self.term.is_some() {
                fail(format!("target sent {h:?} after its C2HTermReq"));
            }
            self.stats.pdus_out += 1;
            self.on_pdu(h, data);
        }
    }

    pub(crate) fn on_pdu(&mut self, h: PduHeader, data: Vec<u8>) {
        match h {
            PduHeader::IcResp(r) => {
                if r.digests() != self.dg {
                    fail(format!(
                        "ICResp digests {:?}, asked {:?}",
                        r.digests(),
                        self.dg
                    ));
                }
                self.rx.established = true;
                self.rx.digests = self.dg;
                self.rx.max_plen = 1 << 24;
                self.maxh2c = r.maxh2cdata;
            }
            PduHeader::TermReq(t) => {
                let d = &data[..];
                if !d.is_empty() && !self.sent.windows(d.len()).any(|w| w == d) {
                    fail(format!("TermReq data {d:02x?} is not bytes the host sent"));
                }
                if !(1..=6).contains(&t.fes().0) {
                    fail(format!("TermReq FES {:?}", t.fes()));
                }
                if let Some((fes, fei)) = self.expect.take() {
                    if (t.fes(), t.fei()) != (fes, fei) {
                        fail(format!(
                            "TermReq FES {:?} FEI {}, predicted {:?} {}",
                            t.fes(),
                            t.fei(),
                            fes,
                            fei
                        ));
                    }
                    self.stats.predicted += 1;
                } else if self.strict {
                    fail(format!(
                        "unpredicted TermReq FES {:?} FEI {}",
                        t.fes(),
                        t.fei()
                    ));
                }
                self.term = Some(t);
            }
            PduHeader::CapsuleResp(r) => {
                let cqe = r.cqe;
                self.complete(cqe.cid, Some(cqe.status()), cqe.dw0);
            }
            PduHeader::C2HData(d) => {
                let strict = self.strict;
                match self.pending.get_mut(&d.cccid) {
                    Some(Kind::Read { got, .. }) => {
                        if d.datao as usize != got.len() {
                            fail(format!("C2HData DATAO {} after {}", d.datao, got.len()));
                        }
                        got.extend_from_slice(&data);
                    }
                    Some(Kind::Unknown) => {}
                    other => {
                        if strict {
                            fail(format!("C2HData for CID {} ({other:?})", d.cccid));
                        }
                    }
                }
                if d.success() {
                    self.complete(d.cccid, None, 0);
                }
            }
            PduHeader::R2T(t) => match self.pending.get(&t.cccid) {
                Some(Kind::Write { data, .. }) => {
                    if t.r2to != 0 || t.r2tl as usize != data.len() {
                        fail(format!(
                            "R2T {}+{} for {} bytes",
                            t.r2to,
                            t.r2tl,
                            data.len()
                        ));
                    }
                    self.r2t.insert(t.ttag, (t.cccid, 0, t.r2tl));
                }
                Some(Kind::Unknown) => {
                    self.r2t.insert(t.ttag, (t.cccid, 0, t.r2tl));
                }
                other => {
                    if self.strict {
                        fail(format!("R2T for CID {} ({other:?})", t.cccid));
                    }
                }
            },
            other => fail(format!("target sent {other:?}")),
        }
    }

    /// Command `cid` completed (`st`: None for C2HData SUCCESS).
    pub(crate) fn complete(&mut self, cid: u16, st: Option<Status>, dw0: u32) {
        self.stats.commands += 1;
        let Some(k) = self.pending.remove(&cid) else {
            if self.strict {
                fail(format!("completion for CID {cid} not outstanding"));
            }
            return;
        };
        self.r2t.retain(|_, v| v.0 != cid);
        let ok = st.is_none_or(|s| s.is_success());
        if st.is_none() && !self.flow_off && self.strict {
            fail(format!(
                "SUCCESS flag for CID {cid} with SQ flow control on"
            ));
        }
        match k {
            Kind::Connect { admin, entries } => {
                if ok {
                    self.bound = true;
                    self.io = !admin;
                    self.entries = entries;
                    let o = self.env.tgt.opts();
                    self.icd = if admin {
                        o.admin_in_capsule_data_size
                    } else {
                        o.in_capsule_data_size
                    };
                    if admin {
                        self.cntlid = dw0 as u16;
                    }
                }
            }
            Kind::Write {
                slba,
                data,
                bad_digest,
            } => {
                if bad_digest {
                    if !st.is_some_and(|s| s.is(sct::GENERIC, generic::TRANSIENT_TRANSPORT_ERROR)) {
                        fail(format!("write with a bad data digest completed {st:?}"));
                    }
                } else if ok {
                    let at = slba as usize * 512;
                    self.env.shadow[at..at + data.len()].copy_from_slice(&data);
                    for b in &mut self.env.known[slba as usize..slba as usize + data.len() / 512] {
                        *b = true;
                    }
                } else if self.strict {
                    fail(format!("write of LBA {slba} failed: {st:?}"));
                }
            }
            Kind::Read { slba, got } => {
                if let (true, Some(slba)) = (ok, slba) {
                    for (k, blk) in got.chunks(512).enumerate() {
                        let lba = slba as usize + k;
                        if self.env.known[lba]
                            && blk != &self.env.shadow[lba * 512..(lba + 1) * 512]
                        {
                            fail(format!(
                                "read of LBA {lba} returned other data than written"
                            ));
                        }
                    }
                }
            }
            Kind::Unknown => {
                if ok && self.io {
                    // It may have written anywhere.
                    self.env.known.iter_mut().for_each(|b| *b = false);
                }
            }
            Kind::Plain => {}
        }
    }

    /// What the target will do with `pdu` (its first bytes), per the spec's
    /// checker and the target's rules.
    pub(crate) fn predict(&self, pdu: &[u8]) -> Pred {
        let Some(ch) = CommonHeader::read(pdu) else {
            return Pred::Incomplete;
        };
        let l = match ch.check(&self.tgt) {
            Ok(l) => l,
            Err(PduError::TermReqLength { .. }) => return Pred::Quiet,
            Err(e) => return Pred::Fatal(e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD), e.fei()),
        };
        let hl = l.header_len() as usize;
        if pdu.len() < hl {
            return Pred::Incomplete;
        }
        match PduHeader::parse(&pdu[..hl], &l, &self.tgt) {
            Err(e) => Pred::Fatal(e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD), e.fei()),
            Ok(PduHeader::TermReq(_)) => Pred::Quiet,
            Ok(PduHeader::H2CData(h)) => {
                let Some(&(cid, got, xfer)) = self.r2t.get(&h.ttag) else {
                    return Pred::Fatal(Fes::INVALID_HEADER_FIELD, Field::Ttag.offset());
                };
                if cid != h.cccid {
                    return Pred::Fatal(Fes::INVALID_HEADER_FIELD, Field::Cccid.offset());
                }
                match check_data_range(PduType::H2CData, h.datao, h.datal, got, xfer) {
                    Ok(()) => Pred::Accept,
                    Err(e) => Pred::Fatal(e.fes().unwrap_or(Fes::INVALID_HEADER_FIELD), e.fei()),
                }
            }
            Ok(PduHeader::CapsuleCmd(_)) => {
                if self.bound && self.pending.len() >= self.entries as usize {
                    Pred::Fatal(Fes::PDU_SEQUENCE_ERROR, 0)
                } else {
                    Pred::Accept
                }
            }
            Ok(_) => Pred::Accept,
        }
    }

    /// Sends one PDU (maybe mutated): predicts its fate, feeds it.
    pub(crate) fn send_pdu(&mut self, ctx: &mut ThreadCtx, pdu: &[u8]) -> Pred {
        let p = self.predict(pdu);
        trace(|| {
            format!(
                "pdu type {:#x} len {} -> {p:?}",
                pdu.first().copied().unwrap_or(0),
                pdu.len()
            )
        });
        self.note(p);
        self.feed(ctx, pdu);
        p
    }

    pub(crate) fn note(&mut self, p: Pred) {
        match p {
            Pred::Fatal(fes, fei) => {
                if self.strict {
                    self.expect = Some((fes, fei));
                }
                self.ending = true;
            }
            Pred::Quiet => self.ending = true,
            Pred::Accept | Pred::Incomplete => {}
        }
    }

    pub(crate) fn build(&self, header: &[u8], l: &PduLayout, data: &[u8], bad_dd: bool) -> Vec<u8> {
        let mut out = vec![0u8; l.plen as usize];
        let n = write_header(header, l, &mut out).unwrap_or(0);
        out[n..n + data.len()].copy_from_slice(data);
        if l.ddgst {
            let mut d = DataDigest::new();
            d.update(data);
            let mut v = d.value();
            if bad_dd {
                v ^= 1;
            }
            let e = n + data.len();
            out[e..e + 4].copy_from_slice(&v.to_le_bytes());
        }
        out
    }

    pub(crate) fn capsule_bytes(&self, sqe: &Sqe, icd: &[u8], bad_dd: bool) -> Option<Vec<u8>> {
        let (h, l) = CapsuleCmd::new(sqe, icd.len() as u32, self.dg, 0)?;
        Some(self.build(h.as_bytes(), &l, icd, bad_dd))
    }

    /// Sends a command capsule: with probability `mutate_pct` its header
    /// or SQE is mutated first.
    pub(crate) fn command(
        &mut self,
        ctx: &mut ThreadCtx,
        mut sqe: Sqe,
        icd: &[u8],
        kind: Kind,
        mutate_pct: u64,
    ) {
        sqe.cid = self.next_cid();
        let bad_dd = matches!(
            kind,
            Kind::Write {
                bad_digest: true,
                ..
            }
        );
        let Some(mut b) = self.capsule_bytes(&sqe, icd, bad_dd) else {
            return;
        };
        let mut kind = kind;
        if self.chance(mutate_pct) {
            let hlen = 72 + if self.dg.header { 4 } else { 0 };
            if self.chance(50) {
                // SQE bits (not the CID): the PDU keeps its shape.
                for _ in 0..1 + self.r(3) {
                    let mut at = 8 + self.r(64) as usize;
                    if at == 10 || at == 11 {
                        at = 8;
                    }
                    b[at] ^= 1 << self.r(8);
                }
                if !self.dg.header {
                    // (A mutated Connect may connect with other values.)
                    if !self.bound || matches!(kind, Kind::Connect { .. }) {
                        self.strict = false;
                    }
                    kind = Kind::Unknown;
                }
            } else {
                // Anywhere in the header (digest included).
                for _ in 0..1 + self.r(3) {
                    let at = self.r(hlen as u64) as usize;
                    b[at] ^= 1 << self.r(8);
                }
                if self.predict(&b) == Pred::Accept {
                    // The PDU's boundaries may have moved.
                    self.strict = false;
                    kind = Kind::Unknown;
                }
            }
        }
        let p = self.predict(&b);
        trace(|| {
            format!(
                "cmd opc {:#x} cid {} {kind:?} -> {p:?} strict {}",
                sqe.opc, sqe.cid, self.strict
            )
        });
        if p == Pred::Accept {
            self.pending.insert(sqe.cid, kind);
        }
        self.note(p);
        self.feed(ctx, &b);
        self.check_settled();
    }

    /// After a settle, in a predictable stream: only R2T waits, mutated
    /// commands and held events are outstanding.
    pub(crate) fn check_settled(&mut self) {
        if !self.strict || !self.reading || self.done() {
            return;
        }
        for (cid, k) in &self.pending {
            let waits = self.r2t.values().any(|v| v.0 == *cid);
            if !waits && !matches!(k, Kind::Unknown) {
                fail(format!("command CID {cid} ({k:?}) got no completion"));
            }
        }
    }
}
