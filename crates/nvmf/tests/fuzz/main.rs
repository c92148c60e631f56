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
//!
//! `wire`: the socket in memory; `host`: the host model (its state, the
//! bytes both ways, the checks of what the target sends, the predicted
//! C2HTermReq); `ops`: its operations and mutations; `cases`: the
//! environment, one case, the run's statistics; the tests are here.
use std::net::SocketAddr;

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{ConnectCmd, ConnectData, DisconnectCmd, SglDescriptor, CNTLID_DYNAMIC};
use pollux_spec::status::generic;
use pollux_spec::tcp::{Digests, H2CData, PduType};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe};
use proptest::test_runner::{RngAlgorithm, TestRng};
use zerocopy::IntoBytes;

use pollux_nvmf::testing;

mod cases;
mod host;
mod ops;
mod wire;

use cases::*;
use host::*;
use wire::*;

pub(crate) const SUB: &str = "nqn.2024-01.io.pollux:fuzz";
pub(crate) const HOST: &str =
    "nqn.2014-08.org.nvmexpress:uuid:ffffffff-0000-0000-0000-00000000f022";
pub(crate) const BLOCKS: u64 = 2048;
/// Bytes the send queue may hold (and segments) before a case fails.
pub(crate) const TX_BYTES_MAX: usize = 128 << 10;
pub(crate) const TX_SEGS_MAX: usize = 4096;
/// Polls after the host's end of stream before the connection must be
/// closed.
pub(crate) const CLOSE_POLLS: usize = 10_000;

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
