//! The environment (a target variant, its admin controller, a shadow of
//! its namespace), one case, and the statistics of a run.

use pollux_bdev::Bdev;
use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{ConnectCmd, ConnectData, PropertySetCmd, PropertySize, CNTLID_DYNAMIC};
use pollux_spec::features::fid;
use pollux_spec::tcp::Digests;
use pollux_spec::{AdminOpcode, Sqe};
use proptest::prelude::Rng as _;
use proptest::test_runner::TestRng;
use zerocopy::IntoBytes;

use pollux_nvmf::testing::{self, Buffers, TestConn};
use pollux_nvmf::{NamespaceConfig, RuntimeOptions, SubsystemConfig, Target, TargetConfig};

use crate::host::*;
use crate::wire::*;
use crate::{BLOCKS, HOST, SUB};

// ----------------------------------------------------------------------
// The environment
// ----------------------------------------------------------------------

/// One target variant: its shared state, the admin controller kept up for
/// I/O-queue cases, a shadow of its namespace.
pub(crate) struct Env {
    /// The target's state its connections share.
    pub(crate) tgt: testing::Env,
    /// The data buffers' cache of this environment's connections.
    pub(crate) cache: Buffers,
    pub(crate) cntlid: u16,
    /// The admin connection of `cntlid` (kept open).
    pub(crate) admin: Option<TestConn<MemWire>>,
    pub(crate) shadow: Vec<u8>,
    pub(crate) known: Vec<bool>,
}

pub(crate) fn target(opts: pollux_nvmf::TransportOptions) -> Target {
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
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().expect("address"));
    cfg.subsystems.push(s);
    Target::start(cfg, &[0], RuntimeOptions::default()).expect("target")
}

#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct Stats {
    pub(crate) cases: u64,
    /// Cases whose connection ended without a C2HTermReq.
    pub(crate) accepted: u64,
    /// Cases the target terminated with a C2HTermReq.
    pub(crate) terminated: u64,
    /// TermReqs whose FES/FEI was predicted and matched.
    pub(crate) predicted: u64,
    pub(crate) commands: u64,
    pub(crate) pdus_out: u64,
    pub(crate) bytes_in: u64,
}

impl Stats {
    pub(crate) fn add(&mut self, o: &Stats) {
        self.cases += o.cases;
        self.accepted += o.accepted;
        self.terminated += o.terminated;
        self.predicted += o.predicted;
        self.commands += o.commands;
        self.pdus_out += o.pdus_out;
        self.bytes_in += o.bytes_in;
    }
}

/// One case.
pub(crate) fn case(ctx: &mut ThreadCtx, env: &mut Env, rng: &mut TestRng) -> Stats {
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
pub(crate) fn bring_up(ctx: &mut ThreadCtx, env: &mut Env, rng: &mut TestRng) {
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

pub(crate) fn env_for(tgt: testing::Env) -> Env {
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
