//! Structured fuzzing of the NVMe/TCP connection machine (`tcp::conn`),
//! over memory, through the crate's hidden test surface
//! (`pollux_nvmf::testing`).
//!
//! Each case is one connection: a [`TestConn`] over a [`MemWire`] (bytes in,
//! bytes out, a send buffer of limited room, end of stream, reset) on a
//! runtime thread of a real target with a
//! RAM namespace. A host model ([`Host`]) drives it with a structured
//! sequence: usually a valid ICReq and Connect (admin, or I/O queue 1 of a
//! controller kept up for the whole run), then a mix of valid capsules
//! (Property Get/Set, Identify, Keep Alive, in-capsule and R2T/H2CData
//! writes, reads, Flush, Disconnect) and mutations: truncation, oversized
//! PLEN, capsules before ICReq, a second ICReq, H2CData for an unknown,
//! finished or mismatched transfer, out of range or out of order, bit
//! flips in headers and SQEs, wrong header/data digests, garbage, more
//! commands than the queue has entries, a host TermReq, a host that never
//! reads, an abrupt reset; bytes arrive in random pieces.
//!
//! Checked on every case:
//! - nothing panics, and the connection is closed within a bounded number
//!   of polls once the host has closed;
//! - every PDU the target sends passes the host-side header checker and
//!   parser (digests verified), nothing follows a C2HTermReq and nothing
//!   is sent after the target's FIN;
//! - while the stream is predictable (no mutation whose effect on PDU
//!   boundaries is unknown): each mutated PDU gets exactly the TermReq
//!   FES/FEI the spec's checker (plus the target's H2CData and queue-size
//!   rules) predicts, or none; every command gets one completion (or an
//!   R2T it waits on, or the connection was terminated); data read back
//!   equals what was written (a shadow of the namespace);
//! - a C2HTermReq's data is bytes the host sent;
//! - the connection's memory stays bounded (send queue, segments, Connect
//!   buffer, slots) even when the host never reads.
//!
//! `POLLUX_FUZZ_CASES` (default 2000) and `POLLUX_FUZZ_SEED` set the run;
//! `bench/fuzz_target.sh` runs a million cases in release.
use std::cell::Cell;
use std::collections::HashMap;
use std::io;
use std::net::{Shutdown, SocketAddr};

use pollux_bdev::Bdev;
use pollux_runtime::ThreadCtx;
use pollux_spec::cmd::cns;
use pollux_spec::fabrics::{
    ConnectCmd, ConnectData, DisconnectCmd, PropertyGetCmd, PropertySetCmd, PropertySize,
    SglDescriptor, CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC,
};
use pollux_spec::features::fid;
use pollux_spec::status::{generic, sct};
use pollux_spec::tcp::{
    check_data_range, write_header, CapsuleCmd, CommonHeader, DataDigest, Digests, Fes, Field,
    H2CData, IcReq, PduError, PduHeader, PduLayout, PduType, Role, RxConfig, TermReq,
};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe, Status};
use proptest::prelude::Rng as _;
use proptest::test_runner::{RngAlgorithm, TestRng};
use zerocopy::IntoBytes;

use pollux_nvmf::testing::{self, Buffers, TestConn, Wire};
use pollux_nvmf::{NamespaceConfig, RuntimeOptions, SubsystemConfig, Target, TargetConfig};

const SUB: &str = "nqn.2024-01.io.pollux:fuzz";
const HOST: &str = "nqn.2014-08.org.nvmexpress:uuid:ffffffff-0000-0000-0000-00000000f022";
const BLOCKS: u64 = 2048;
/// Bytes the send queue may hold (and segments) before a case fails.
const TX_BYTES_MAX: usize = 128 << 10;
const TX_SEGS_MAX: usize = 4096;
/// Polls after the host's end of stream before the connection must be
/// closed.
const CLOSE_POLLS: usize = 10_000;

// ----------------------------------------------------------------------
// The wire
// ----------------------------------------------------------------------

/// A socket in memory.
struct MemWire {
    inp: Vec<u8>,
    pos: usize,
    /// The host closed its side (after `inp`).
    eof: bool,
    /// The host reset the connection.
    reset: bool,
    out: Vec<u8>,
    /// Most bytes `out` holds (the host's unread data): the send buffer.
    room: usize,
    /// The target shut down its sending side (FIN) / both sides.
    shut_wr: Cell<bool>,
    shut_rd: Cell<bool>,
    /// Send calls after our FIN (must stay 0).
    after_fin: u32,
}

impl MemWire {
    fn new(room: usize) -> MemWire {
        MemWire {
            inp: Vec::new(),
            pos: 0,
            eof: false,
            reset: false,
            out: Vec::new(),
            room,
            shut_wr: Cell::new(false),
            shut_rd: Cell::new(false),
            after_fin: 0,
        }
    }

    fn push(&mut self, b: &[u8]) {
        if self.pos == self.inp.len() {
            self.inp.clear();
            self.pos = 0;
        }
        self.inp.extend_from_slice(b);
    }
}

impl Wire for MemWire {
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
        if self.reset {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if self.shut_rd.get() {
            return Ok(Some(0));
        }
        let avail = self.inp.len() - self.pos;
        if avail == 0 {
            return Ok(if self.eof { Some(0) } else { None });
        }
        let n1 = avail.min(first.len());
        first[..n1].copy_from_slice(&self.inp[self.pos..self.pos + n1]);
        self.pos += n1;
        let n2 = (avail - n1).min(second.len());
        second[..n2].copy_from_slice(&self.inp[self.pos..self.pos + n2]);
        self.pos += n2;
        Ok(Some(n1 + n2))
    }

    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        if self.reset {
            return Err(io::ErrorKind::ConnectionReset.into());
        }
        if self.shut_wr.get() {
            self.after_fin += 1;
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut sent = 0;
        for v in iov {
            let room = self.room.saturating_sub(self.out.len());
            let n = v.iov_len.min(room);
            if n == 0 {
                break;
            }
            // SAFETY: the caller's contract (`Wire::send_iov`): the iovec
            // describes `iov_len >= n` readable bytes valid for the call.
            let b = unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, n) };
            self.out.extend_from_slice(b);
            sent += n;
            if n < v.iov_len {
                break;
            }
        }
        Ok(sent)
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.shut_wr.set(true);
        if how == Shutdown::Both {
            self.shut_rd.set(true);
        }
        Ok(())
    }
}

// ----------------------------------------------------------------------
// The environment
// ----------------------------------------------------------------------

/// One target variant: its shared state, the admin controller kept up for
/// I/O-queue cases, a shadow of its namespace.
struct Env {
    /// The target's state its connections share.
    tgt: testing::Env,
    /// The data buffers' cache of this environment's connections.
    cache: Buffers,
    cntlid: u16,
    /// The admin connection of `cntlid` (kept open).
    admin: Option<TestConn<MemWire>>,
    shadow: Vec<u8>,
    known: Vec<bool>,
}

fn target(opts: pollux_nvmf::TransportOptions) -> Target {
    let mut cfg = TargetConfig {
        transport: opts,
        ..Default::default()
    };
    cfg.bdevs
        .push(Bdev::ram("Fuzz0", 512, BLOCKS).expect("RAM bdev"));
    let mut s = SubsystemConfig::new(SUB);
    s.namespaces.push(NamespaceConfig {
        bdev: "Fuzz0".into(),
        nsid: None,
    });
    s.listeners.push("127.0.0.1:0".parse().expect("address"));
    cfg.subsystems.push(s);
    Target::start(cfg, &[0], RuntimeOptions::default()).expect("target")
}

#[derive(Default, Debug, Clone, Copy)]
struct Stats {
    cases: u64,
    /// Cases whose connection ended without a C2HTermReq.
    accepted: u64,
    /// Cases the target terminated with a C2HTermReq.
    terminated: u64,
    /// TermReqs whose FES/FEI was predicted and matched.
    predicted: u64,
    commands: u64,
    pdus_out: u64,
    bytes_in: u64,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.cases += o.cases;
        self.accepted += o.accepted;
        self.terminated += o.terminated;
        self.predicted += o.predicted;
        self.commands += o.commands;
        self.pdus_out += o.pdus_out;
        self.bytes_in += o.bytes_in;
    }
}

// ----------------------------------------------------------------------
// The host model
// ----------------------------------------------------------------------

#[derive(Clone)]
enum Kind {
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
enum Pred {
    /// The PDU is accepted.
    Accept,
    /// Not all of the header is there.
    Incomplete,
    /// C2HTermReq with this FES and FEI, then close.
    Fatal(Fes, u32),
    /// Closed without a TermReq (a host TermReq).
    Quiet,
}

struct Host<'a> {
    env: &'a mut Env,
    rng: &'a mut TestRng,
    c: TestConn<MemWire>,
    /// Parse configuration of the target's PDUs.
    rx: RxConfig,
    /// The target's receive configuration, mirrored.
    tgt: RxConfig,
    dg: Digests,
    maxh2c: u32,
    icd: u32,
    io: bool,
    bound: bool,
    entries: u16,
    flow_off: bool,
    cid: u16,
    /// The CNTLID an admin Connect returned.
    cntlid: u16,
    pending: HashMap<u16, Kind>,
    /// R2Ts not answered: ttag -> (cid, got, xfer).
    r2t: HashMap<u16, (u16, u32, u32)>,
    /// Finished transfer tags (for stale H2CData).
    stale: Vec<(u16, u16)>,
    /// The stream is predictable.
    strict: bool,
    /// The host reads what the target sends.
    reading: bool,
    closed_by_host: bool,
    term: Option<TermReq>,
    /// A predicted TermReq not seen yet.
    expect: Option<(Fes, u32)>,
    /// The target closes (Disconnect, host TermReq, predicted fatal).
    ending: bool,
    obuf: Vec<u8>,
    sent: Vec<u8>,
    stats: Stats,
}

thread_local! {
    /// What the current case did (shown when it fails).
    static TRACE: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn trace(what: impl FnOnce() -> String) {
    TRACE.with(|t| {
        let mut t = t.borrow_mut();
        if t.len() < 200 {
            t.push(what());
        }
    });
}

fn fail(msg: String) -> ! {
    let ops = TRACE.with(|t| t.borrow().join("; "));
    panic!("{msg}\n  case: {ops}")
}

impl<'a> Host<'a> {
    fn new(env: &'a mut Env, rng: &'a mut TestRng, ctx: &ThreadCtx, room: usize) -> Host<'a> {
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

    fn r(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    fn chance(&mut self, pct: u64) -> bool {
        self.r(100) < pct
    }

    fn next_cid(&mut self) -> u16 {
        self.cid = self.cid.wrapping_add(1);
        self.cid
    }

    fn done(&mut self) -> bool {
        self.ending
            || self.term.is_some()
            || self.closed_by_host
            || self.c.is_closed()
            || self.c.wire().shut_wr.get()
    }

    /// `n` bytes of data.
    fn bytes(&mut self, n: usize) -> Vec<u8> {
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

    fn check_bounds(&mut self) {
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

    fn poll(&mut self, ctx: &mut ThreadCtx) -> bool {
        let busy = self.c.poll(ctx);
        self.check_bounds();
        if self.reading {
            self.absorb();
        }
        busy
    }

    /// Polls until nothing moves.
    fn settle(&mut self, ctx: &mut ThreadCtx) {
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
    fn feed(&mut self, ctx: &mut ThreadCtx, b: &[u8]) {
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
    fn absorb(&mut self) {
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

    fn on_pdu(&mut self, h: PduHeader, data: Vec<u8>) {
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
    fn complete(&mut self, cid: u16, st: Option<Status>, dw0: u32) {
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
    fn predict(&self, pdu: &[u8]) -> Pred {
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
    fn send_pdu(&mut self, ctx: &mut ThreadCtx, pdu: &[u8]) -> Pred {
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

    fn note(&mut self, p: Pred) {
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

    fn build(&self, header: &[u8], l: &PduLayout, data: &[u8], bad_dd: bool) -> Vec<u8> {
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

    fn capsule_bytes(&self, sqe: &Sqe, icd: &[u8], bad_dd: bool) -> Option<Vec<u8>> {
        let (h, l) = CapsuleCmd::new(sqe, icd.len() as u32, self.dg, 0)?;
        Some(self.build(h.as_bytes(), &l, icd, bad_dd))
    }

    /// Sends a command capsule: with probability `mutate_pct` its header
    /// or SQE is mutated first.
    fn command(
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
    fn check_settled(&mut self) {
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

    // --- the operations ---

    fn icreq(&mut self, ctx: &mut ThreadCtx, dg: Digests, mutate: bool) {
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

    fn connect(&mut self, ctx: &mut ThreadCtx, admin: bool) {
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

    fn admin_op(&mut self, ctx: &mut ThreadCtx) {
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

    fn lba_for(&mut self, len: usize) -> u64 {
        self.r(BLOCKS - (len / 512) as u64 + 1)
    }

    fn write(&mut self, ctx: &mut ThreadCtx, in_capsule: bool) {
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
    fn read_burst(&mut self, ctx: &mut ThreadCtx) {
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

    fn read(&mut self, ctx: &mut ThreadCtx) {
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
    fn stray_h2c(&mut self, ctx: &mut ThreadCtx) {
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
    fn oversized(&mut self, ctx: &mut ThreadCtx) {
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
    fn burst(&mut self, ctx: &mut ThreadCtx) {
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

    fn garbage(&mut self, ctx: &mut ThreadCtx) {
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

    fn host_term(&mut self, ctx: &mut ThreadCtx) {
        let t = TermReq::new(Role::Host, Fes::PDU_SEQUENCE_ERROR, 0, 0);
        self.send_pdu(ctx, t.as_bytes());
    }

    fn second_icreq(&mut self, ctx: &mut ThreadCtx) {
        let r = IcReq::new(0, self.dg, 0);
        self.send_pdu(ctx, r.as_bytes());
    }

    fn disconnect(&mut self, ctx: &mut ThreadCtx) {
        let d = DisconnectCmd::new();
        self.command(ctx, d.to_sqe(), &[], Kind::Plain, 0);
        if self.bound {
            self.ending = true;
        }
    }

    /// A valid PDU cut short, then the host goes away.
    fn truncated(&mut self, ctx: &mut ThreadCtx) {
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
    fn finish(mut self, ctx: &mut ThreadCtx, reset: bool) -> Stats {
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

/// One case.
fn case(ctx: &mut ThreadCtx, env: &mut Env, rng: &mut TestRng) -> Stats {
    let sel = rng.next_u64();
    let never_read = sel.is_multiple_of(20);
    let room = if never_read {
        (sel >> 8) as usize % 4096
    } else {
        usize::MAX
    };
    let mut h = Host::new(env, rng, ctx, room);
    h.reading = !never_read;
    if never_read {
        h.strict = false;
    }
    // Before ICReq.
    match h.r(25) {
        0 => h.garbage(ctx),
        1 => {
            let sqe = Sqe::flush(1);
            if let Some(b) = h.capsule_bytes(&sqe, &[], false) {
                h.send_pdu(ctx, &b);
            }
        }
        2 => h.host_term(ctx),
        _ => {}
    }
    if !h.done() {
        let dg = Digests::from_dgst(h.r(4) as u8);
        h.icreq(ctx, dg, true);
    }
    let admin = h.chance(40);
    if !h.done() && h.chance(95) {
        h.connect(ctx, admin);
    }
    let ops = h.r(12);
    for _ in 0..ops {
        if h.done() {
            break;
        }
        match h.r(100) {
            0..=14 if h.io => h.write(ctx, true),
            15..=29 if h.io => h.write(ctx, false),
            30..=44 if h.io => h.read(ctx),
            0..=44 => h.admin_op(ctx),
            45..=54 => h.admin_op(ctx),
            55..=59 => h.stray_h2c(ctx),
            60..=63 => h.oversized(ctx),
            64..=69 => h.burst(ctx),
            70..=72 => h.garbage(ctx),
            73..=74 => h.second_icreq(ctx),
            75 => h.host_term(ctx),
            76..=78 => h.disconnect(ctx),
            79..=81 => h.truncated(ctx),
            86..=88 if h.io => h.read_burst(ctx),
            82..=85 => {
                // A flood of commands on a queue never connected (or
                // connected), the host not reading meanwhile.
                let was = h.reading;
                let room = h.c.wire().room;
                h.reading = false;
                h.c.wire().room = h.r(2048) as usize;
                h.strict = false;
                for _ in 0..1 + h.r(150) {
                    if h.c.is_closed() {
                        break;
                    }
                    let mut all = Vec::new();
                    for _ in 0..50 {
                        let mut sqe = Sqe::new(AdminOpcode::KeepAlive as u8, 0);
                        sqe.cid = h.next_cid();
                        if let Some(b) = h.capsule_bytes(&sqe, &[], false) {
                            all.extend_from_slice(&b);
                        }
                    }
                    h.sent.extend_from_slice(&all);
                    h.c.wire().push(&all);
                    h.poll(ctx);
                }
                // Then it reads again (or goes on not reading).
                h.reading = was;
                h.c.wire().room = room;
            }
            _ if h.io => {
                let icd = h.chance(50);
                h.write(ctx, icd)
            }
            _ => h.admin_op(ctx),
        }
    }
    let reset = h.chance(5);
    h.finish(ctx, reset)
}

/// Brings up the admin controller I/O-queue cases connect to (kept open
/// in `env.admin`).
fn bring_up(ctx: &mut ThreadCtx, env: &mut Env, rng: &mut TestRng) {
    let mut h = Host::new(env, rng, ctx, usize::MAX);
    h.icreq(ctx, Digests::NONE, false);
    let c = ConnectCmd::new(0, 31, 0, 0);
    let d = ConnectData::new([7; 16], CNTLID_DYNAMIC, SUB, HOST).expect("connect data");
    let k = Kind::Connect {
        admin: true,
        entries: 32,
    };
    h.command(ctx, c.to_sqe(), d.as_bytes(), k, 0);
    let cc = pollux_spec::regs::Cc::standard(0).with_en(true);
    let p = PropertySetCmd::new(0x14, PropertySize::Four, cc.0 as u64);
    h.command(ctx, p.to_sqe(), &[], Kind::Plain, 0);
    let sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
    h.command(ctx, sqe, &[], Kind::Plain, 0);
    assert!(h.pending.is_empty() && h.bound && h.cntlid != 0, "bring-up");
    let cntlid = h.cntlid;
    let conn = h.c;
    env.cntlid = cntlid;
    env.admin = Some(conn);
}

fn env_for(tgt: testing::Env) -> Env {
    let cache = tgt.cache(1 << 20);
    Env {
        tgt,
        cache,
        cntlid: 0,
        admin: None,
        shadow: vec![0; BLOCKS as usize * 512],
        known: vec![false; BLOCKS as usize],
    }
}

#[test]
fn fuzz_conn() {
    let cases: u64 = std::env::var("POLLUX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let seed: u64 = std::env::var("POLLUX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED_0F7A_76E7);
    // Two variants: defaults (64 KiB receive buffer, direct receive), and
    // a 4 KiB receive buffer without direct receive, with a data buffer
    // pool of one 128 KiB transfer (commands wait for buffers).
    let a = target(pollux_nvmf::TransportOptions::default());
    let b = target(pollux_nvmf::TransportOptions {
        rx_buffer: 4096,
        direct_receive: false,
        num_shared_buffers: 2,
        io_unit_size: 64 << 10,
        ..Default::default()
    });
    let (sa, sb) = (testing::Env::of(&a), testing::Env::of(&b));
    let start = std::time::Instant::now();
    // All cases on the target's runtime thread (connections are not Send).
    let r = testing::runtime(&a)
        .call(0, move |ctx| {
            let mut envs = [env_for(sa), env_for(sb)];
            let mut st = Stats::default();
            for i in 0..cases {
                let mut s = [0u8; 32];
                s[..8].copy_from_slice(&seed.to_le_bytes());
                s[8..16].copy_from_slice(&i.to_le_bytes());
                let mut rng = TestRng::from_seed(RngAlgorithm::ChaCha, &s);
                let e = &mut envs[(i % 2) as usize];
                TRACE.with(|t| t.borrow_mut().clear());
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    if e.admin.is_none() {
                        bring_up(ctx, e, &mut rng);
                    }
                    let s = case(ctx, e, &mut rng);
                    // The case's connection is gone: every data buffer it
                    // took is back (cached or freed), and the strict ones
                    // stayed within the pool.
                    let (used, cached) = (e.tgt.pool_used(), e.cache.bytes());
                    if used != cached {
                        fail(format!(
                            "data buffers leaked: {used} bytes charged, {cached} cached"
                        ));
                    }
                    s
                }));
                match r {
                    Ok(s) => st.add(&s),
                    Err(p) => {
                        let msg = p
                            .downcast_ref::<String>()
                            .cloned()
                            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                            .unwrap_or_default();
                        return Err(format!("case {i} (seed {seed}): {msg}"));
                    }
                }
            }
            Ok(st)
        })
        .expect("runtime call");
    let total = match r {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    };
    let el = start.elapsed();
    println!(
        "fuzz_conn: {} cases in {:.2} s ({:.0} cases/s): {} accepted, {} terminated with C2HTermReq ({} of them predicted FES/FEI matched); {} commands completed, {} PDUs from the target, {} bytes to it; seed {}",
        total.cases,
        el.as_secs_f64(),
        total.cases as f64 / el.as_secs_f64(),
        total.accepted,
        total.terminated,
        total.predicted,
        total.commands,
        total.pdus_out,
        total.bytes_in,
        seed
    );
    assert_eq!(total.cases, cases);
    assert!(total.terminated > 0 && total.accepted > 0);
    assert!(total.predicted > 0);
}

/// Runs `f` on a target's runtime thread with one environment (its admin
/// controller up).
fn on_target(f: impl FnOnce(&mut ThreadCtx, &mut Env, &mut TestRng) + Send + 'static) {
    let t = target(pollux_nvmf::TransportOptions::default());
    let e = testing::Env::of(&t);
    testing::runtime(&t)
        .call(0, move |ctx| {
            let mut env = env_for(e);
            let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
            bring_up(ctx, &mut env, &mut rng);
            f(ctx, &mut env, &mut rng);
        })
        .expect("runtime call");
}

/// An I/O queue (qid 1) of the environment's controller, no digests.
fn io_host<'a>(ctx: &mut ThreadCtx, env: &'a mut Env, rng: &'a mut TestRng) -> Host<'a> {
    let mut h = Host::new(env, rng, ctx, usize::MAX);
    h.icreq(ctx, Digests::NONE, false);
    let c = ConnectCmd::new(1, 31, 0, 0);
    let cntlid = h.env.cntlid;
    let d = ConnectData::new([7; 16], cntlid, SUB, HOST).expect("connect data");
    let k = Kind::Connect {
        admin: false,
        entries: 32,
    };
    h.command(ctx, c.to_sqe(), d.as_bytes(), k, 0);
    assert!(h.bound && h.io, "I/O connect");
    h
}

/// A write whose data went to the bdev, then a fatal PDU in the same
/// bytes: the write completes after the C2HTermReq was queued. Nothing
/// may follow the TermReq (its response was sent after it before).
#[test]
fn nothing_follows_a_termreq() {
    on_target(|ctx, env, rng| {
        let mut h = io_host(ctx, env, rng);
        let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 8);
        sqe.cid = h.next_cid();
        SglDescriptor::in_capsule(0, 4096).write_to_sqe(&mut sqe);
        let mut b = h
            .capsule_bytes(&sqe, &[0x5A; 4096], false)
            .expect("capsule");
        let (stray, l) = H2CData::new(sqe.cid, 77, 0, 512, true, Digests::NONE, 0).expect("H2C");
        b.extend(h.build(stray.as_bytes(), &l, &[0; 512], false));
        h.c.wire().push(&b);
        for _ in 0..16 {
            h.c.poll(ctx);
        }
        let out = std::mem::take(&mut h.c.wire().out);
        // The TermReq is the last PDU: 24 bytes + 24 of offending header.
        assert!(out.len() >= 48, "{} bytes out", out.len());
        let last = &out[out.len() - 48..];
        assert_eq!(
            last[0],
            PduType::C2HTermReq as u8,
            "the last PDU is not the C2HTermReq: {:02x?}",
            &out
        );
        // Its data is the offending header as it was received.
        assert_eq!(&last[24..], stray.as_bytes());
    });
}

/// A host that sends capsules on a queue it never connected and never
/// reads: each gets a response capsule (Command Sequence Error) that
/// cannot be sent. The target must stop reading rather than queue
/// responses without bound (it queued all of them before).
#[test]
fn a_host_that_never_reads_cannot_grow_the_send_queue() {
    on_target(|ctx, env, rng| {
        let mut h = Host::new(env, rng, ctx, usize::MAX);
        h.icreq(ctx, Digests::NONE, false);
        h.reading = false;
        h.strict = false;
        h.c.wire().room = 0;
        let mut sqe = Sqe::new(AdminOpcode::KeepAlive as u8, 0);
        let one = h.capsule_bytes(&sqe, &[], false).expect("capsule");
        for _ in 0..400 {
            let mut all = Vec::with_capacity(50 * one.len());
            for _ in 0..50 {
                sqe.cid = h.next_cid();
                all.extend(h.capsule_bytes(&sqe, &[], false).expect("capsule"));
            }
            h.c.wire().push(&all);
            // (`poll` fails the test when the send queue passes its bound.)
            h.poll(ctx);
        }
        // It stopped taking bytes; once the host reads, it goes on.
        let w = h.c.wire();
        assert!(w.inp.len() - w.pos > 0, "the target read everything");
        h.reading = true;
        h.c.wire().room = usize::MAX;
        h.settle(ctx);
        let w = h.c.wire();
        assert_eq!(w.inp.len() - w.pos, 0, "the target did not resume reading");
        assert_eq!(h.stats.pdus_out, 20_000 + 1, "responses (and ICResp)");
    });
}

/// The handshake deadlines over memory, at chosen instants (the clock is
/// the thread's loop time, constant within this call): ICReq is due
/// `icreq_timeout` after accept; after ICResp the queue's Connect is due
/// `connect_timeout` later (the clock restarts at ICResp); Keep Alive or
/// a refused Connect do not count; an accepted Connect ends the deadline.
#[test]
fn handshake_deadlines_follow_the_stages() {
    use pollux_nvmf::testing::Stage;
    use std::time::Duration;
    let two = Duration::from_secs(2);
    let t = target(pollux_nvmf::TransportOptions {
        icreq_timeout: two,
        connect_timeout: two,
        ..Default::default()
    });
    let e = testing::Env::of(&t);
    testing::runtime(&t)
        .call(0, move |ctx| {
            let mut env = env_for(e);
            let mut rng = TestRng::deterministic_rng(RngAlgorithm::ChaCha);
            let t0 = ctx.now();
            let accepted = t0.checked_sub(Duration::from_secs(3)).expect("instant");
            let mut h = Host::new(&mut env, &mut rng, ctx, usize::MAX);
            let peer: SocketAddr = "127.0.0.1:9".parse().expect("address");
            h.c = h
                .env
                .tgt
                .conn(ctx, &h.env.cache, MemWire::new(usize::MAX), peer, accepted);
            assert_eq!(h.c.handshake_expired(accepted + two), None, "not yet due");
            assert_eq!(h.c.handshake_expired(t0), Some((Stage::IcReq, two)));
            h.icreq(ctx, Digests::NONE, false);
            let late = t0 + two + Duration::from_millis(1);
            // ICResp went out at t0 (3 s after accept): Connect is due 2 s
            // from then.
            assert_eq!(h.c.handshake_expired(t0), None, "measured from accept");
            assert_eq!(h.c.handshake_expired(t0 + two), None);
            assert_eq!(h.c.handshake_expired(late), Some((Stage::Connect, two)));
            // Commands on the unconnected queue (answered with an error)
            // and a refused Connect do not connect it.
            let ka = Sqe::new(AdminOpcode::KeepAlive as u8, 0);
            h.command(ctx, ka, &[], Kind::Unknown, 0);
            let c = ConnectCmd::new(0, 31, 0, 0);
            let d = ConnectData::new(
                [7; 16],
                CNTLID_DYNAMIC,
                "nqn.2024-01.io.pollux:nobody",
                HOST,
            )
            .expect("connect data");
            let k = || Kind::Connect {
                admin: true,
                entries: 32,
            };
            h.command(ctx, c.to_sqe(), d.as_bytes(), k(), 0);
            assert!(!h.bound && !h.c.is_closed());
            assert_eq!(h.c.handshake_expired(late), Some((Stage::Connect, two)));
            // Connected: no handshake deadline any more.
            let d = ConnectData::new([7; 16], CNTLID_DYNAMIC, SUB, HOST).expect("connect data");
            h.command(ctx, c.to_sqe(), d.as_bytes(), k(), 0);
            assert!(h.bound, "admin Connect");
            assert_eq!(h.c.handshake_expired(t0 + Duration::from_secs(3600)), None);
        })
        .expect("runtime call");
}

/// A closing connection reads (and drops) what the host still sends until
/// its FIN, but no more per poll than the receive path reads: a host
/// that keeps sending after a Disconnect must not hold the thread (the
/// loop read until EAGAIN: 2 MiB in one poll here).
#[test]
fn a_closing_connection_reads_a_bounded_amount_per_poll() {
    on_target(|ctx, env, rng| {
        let mut h = io_host(ctx, env, rng);
        let mut d = DisconnectCmd::new().to_sqe();
        d.cid = h.next_cid();
        let mut b = h.capsule_bytes(&d, &[], false).expect("capsule");
        let flood = 2 << 20;
        b.extend(std::iter::repeat_n(0x5Au8, flood));
        h.c.wire().push(&b);
        // Receive (the Disconnect: closing), send its response, FIN, then
        // the closing reads.
        h.c.poll(ctx);
        assert!(h.c.wire().shut_wr.get(), "FIN not sent");
        let w = h.c.wire();
        let left = w.inp.len() - w.pos;
        assert!(
            left > 0,
            "one poll of a closing connection read all {flood} bytes the host sent after its Disconnect"
        );
        // It goes on reading on the next polls, and closes at the FIN.
        h.c.wire().eof = true;
        for _ in 0..CLOSE_POLLS {
            h.c.poll(ctx);
            if h.c.is_closed() {
                break;
            }
        }
        assert!(h.c.is_closed());
        let w = h.c.wire();
        assert_eq!(w.inp.len() - w.pos, 0);
    });
}

/// A discovery controller whose host asks for no Keep Alive (KATO 0) gets
/// Linux nvmet's 120 s, so an idle one does not hold its connection
/// forever; an NVM subsystem's controller keeps KATO 0 (none).
#[test]
fn a_discovery_controller_without_kato_expires_after_120_s() {
    use pollux_spec::fabrics::DISCOVERY_NQN;
    use std::time::Duration;
    on_target(|ctx, env, rng| {
        let t0 = ctx.now();
        for (nqn, expires) in [(DISCOVERY_NQN, true), (SUB, false)] {
            let mut h = Host::new(env, rng, ctx, usize::MAX);
            h.icreq(ctx, Digests::NONE, false);
            let c = ConnectCmd::new(0, 31, 0, 0);
            let d = ConnectData::new([7; 16], CNTLID_DYNAMIC, nqn, HOST).expect("connect data");
            let k = Kind::Connect {
                admin: true,
                entries: 32,
            };
            h.command(ctx, c.to_sqe(), d.as_bytes(), k, 0);
            assert!(h.bound, "{nqn}: admin Connect");
            assert!(!h.c.kato_expired(t0 + Duration::from_secs(119)), "{nqn}");
            assert_eq!(
                h.c.kato_expired(t0 + Duration::from_secs(121)),
                expires,
                "{nqn}: Keep Alive expiry 121 s after Connect with KATO 0"
            );
            h.finish(ctx, false);
        }
    });
}

/// A host that stops reading while read data is queued for it keeps that
/// data's buffers: once the socket has taken nothing for `data_timeout`
/// (30 s by default), the connection is closed and they come back. An
/// R2T whose data never comes completes with Transient Transport Error
/// after as long. (The thread's timer calls `tick`; here at chosen
/// instants.)
#[test]
fn stalled_transfers_end_after_the_data_timeout() {
    use std::time::Duration;
    on_target(|ctx, env, rng| {
        let t0 = ctx.now();
        let late = t0 + Duration::from_secs(31);
        // R2T, then no data (the host model does not read: the test
        // parses what is sent).
        let mut h = io_host(ctx, env, rng);
        h.reading = false;
        let mut w = Sqe::rw(NvmOpcode::Write, 1, 0, 256);
        w.cid = h.next_cid();
        SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut w);
        let b = h.capsule_bytes(&w, &[], false).expect("capsule");
        h.c.wire().push(&b);
        for _ in 0..8 {
            h.c.poll(ctx);
        }
        assert_eq!(h.c.footprint()[5], 128 << 10, "R2T buffer");
        h.c.tick(ctx, t0 + Duration::from_secs(29));
        for _ in 0..8 {
            h.c.poll(ctx);
        }
        assert_eq!(h.c.footprint()[5], 128 << 10, "expired early");
        h.c.tick(ctx, late);
        for _ in 0..8 {
            h.c.poll(ctx);
        }
        let out = std::mem::take(&mut h.c.wire().out);
        // R2T (24 bytes), then the response capsule with 22h.
        assert_eq!(out.len(), 24 + 24, "{out:02x?}");
        assert_eq!(out[24], PduType::CapsuleResp as u8);
        let st = u16::from_le_bytes([out[24 + 8 + 14], out[24 + 8 + 15]]) >> 1;
        // Transient Transport Error, Do Not Retry clear.
        assert_eq!(st, generic::TRANSIENT_TRANSPORT_ERROR as u16);
        assert_eq!(h.c.footprint()[5], 0, "buffer not given back");
        // A read whose data the host does not take.
        h.c.wire().room = 0;
        let mut r = Sqe::rw(NvmOpcode::Read, 1, 0, 256);
        r.cid = h.next_cid();
        SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut r);
        let b = h.capsule_bytes(&r, &[], false).expect("capsule");
        h.c.wire().push(&b);
        for _ in 0..8 {
            h.c.poll(ctx);
        }
        assert_eq!(h.c.footprint()[5], 128 << 10, "read buffer");
        // (The thread's clock stands still in this call: the stall began
        // at t0.)
        h.c.tick(ctx, t0 + Duration::from_secs(29));
        assert!(!h.c.is_closed(), "closed early");
        h.c.tick(ctx, late);
        assert!(
            h.c.is_closed(),
            "a connection whose host reads nothing stayed"
        );
    });
}
