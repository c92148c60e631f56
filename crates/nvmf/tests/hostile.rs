//! Thousands of hostile connections against a target on loopback while a
//! well-behaved host runs a verified workload on another connection: the
//! workload must finish with zero errors, every hostile connection must
//! be closed in the end, and a fresh host must still get through.
//!
//! `POLLUX_HOSTILE_CONNS` sets the number of hostile connections (default
//! 3000; `HOSTILE=1 bench/fuzz_target.sh` runs 20000 in release).
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use pollux_spec::fabrics::{ConnectCmd, ConnectData, SglDescriptor, CNTLID_DYNAMIC};
use pollux_spec::features::fid;
use pollux_spec::tcp::{CapsuleCmd, Digests, H2CData, IcReq};
use pollux_spec::Sqe;
use zerocopy::IntoBytes;

/// Hostile connections open at once per thread.
const BATCH: usize = 100;
const THREADS: usize = 4;

/// Raises the soft descriptor limit to the hard one.
fn raise_nofile() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit to fill, then to pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn capsule(sqe: &Sqe, icd: &[u8]) -> Vec<u8> {
    let (h, l) = CapsuleCmd::new(sqe, icd.len() as u32, Digests::NONE, 0).unwrap();
    let mut out = vec![0u8; l.plen as usize];
    let n = pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut out).unwrap();
    out[n..n + icd.len()].copy_from_slice(icd);
    out
}

fn icreq() -> Vec<u8> {
    IcReq::new(0, Digests::NONE, 0).as_bytes().to_vec()
}

fn garbage(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Writes without blocking as much of `b` as the socket takes.
fn push(s: &mut TcpStream, b: &[u8]) {
    let _ = s.set_nonblocking(true);
    let mut at = 0;
    while at < b.len() {
        match s.write(&b[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
}

/// Opens hostile connection number `k` and misbehaves on it; returns the
/// socket to be held open until the batch ends (some behaviours need the
/// target to wait on them).
fn hostile(addr: SocketAddr, k: u64) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    let _ = s.set_nodelay(true);
    let flush = Sqe::flush(1);
    match k % 10 {
        // A truncated PDU, then close.
        0 => {
            let mut b = icreq();
            let c = capsule(&flush, &[7; 512]);
            b.extend_from_slice(&c[..(k as usize % c.len()).max(1)]);
            push(&mut s, &b);
            return None;
        }
        // Oversized PLEN.
        1 => {
            let mut c = capsule(&flush, &[]);
            c[4..8].copy_from_slice(&(0x7FFF_0000u32 + k as u32).to_le_bytes());
            c[3] = 72;
            let mut b = icreq();
            b.extend_from_slice(&c);
            push(&mut s, &b);
        }
        // Out of order: a capsule, then H2CData, before ICReq.
        2 => {
            let mut b = capsule(&flush, &[]);
            let (h, l) = H2CData::new(1, 0, 0, 512, true, Digests::NONE, 0).unwrap();
            let mut d = vec![0u8; l.plen as usize];
            pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut d).unwrap();
            b.extend_from_slice(&d);
            push(&mut s, &b);
        }
        // H2CData for a transfer that does not exist, after ICReq.
        3 => {
            let (h, l) =
                H2CData::new(9, (k % 300) as u16, 0, 4096, true, Digests::NONE, 0).unwrap();
            let mut d = vec![0u8; l.plen as usize];
            pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut d).unwrap();
            let mut b = icreq();
            b.extend_from_slice(&d);
            push(&mut s, &b);
        }
        // Garbage.
        4 => push(&mut s, &garbage(k, 1 + (k as usize * 7919) % 3000)),
        // Half an ICReq, then nothing (held open).
        5 => push(&mut s, &icreq()[..(k as usize % 127).max(1)]),
        // Valid ICReq, then garbage.
        6 => {
            let mut b = icreq();
            b.extend_from_slice(&garbage(k, 64 + (k as usize % 2000)));
            push(&mut s, &b);
        }
        // Never reads: ICReq, then capsules on a queue never connected
        // (each answered) until the socket takes no more.
        7 => {
            let mut b = icreq();
            let one = capsule(&Sqe::new(0x18, 0), &[]);
            for _ in 0..20_000 {
                b.extend_from_slice(&one);
            }
            push(&mut s, &b);
        }
        // Never reads: a connected admin queue and Identify commands whose
        // data it never takes (beyond the queue's size: a TermReq that
        // cannot be sent either).
        8 => {
            let mut b = icreq();
            let c = ConnectCmd::new(0, 15, 0, 0);
            let d = ConnectData::new([1; 16], CNTLID_DYNAMIC, SUB1, HOST_B).unwrap();
            b.extend(capsule(&c.to_sqe(), d.as_bytes()));
            let mut id = Sqe::identify(1, 0, 0);
            SglDescriptor::tcp_transport(4096).write_to_sqe(&mut id);
            for i in 0..40u16 {
                id.cid = i + 2;
                b.extend(capsule(&id, &[]));
            }
            push(&mut s, &b);
        }
        // A second ICReq, and an abrupt reset.
        _ => {
            let mut b = icreq();
            b.extend(icreq());
            push(&mut s, &b);
            // SO_LINGER 0: close sends RST.
            let l = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            // SAFETY: `l` is a valid linger for the call's duration.
            unsafe {
                use std::os::fd::AsRawFd;
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_LINGER,
                    (&l as *const libc::linger).cast(),
                    std::mem::size_of::<libc::linger>() as libc::socklen_t,
                );
            }
            return None;
        }
    }
    // Sometimes read a little of the answer before the batch ends.
    if k.is_multiple_of(3) && k % 10 != 7 && k % 10 != 8 {
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
        let mut b = [0u8; 256];
        let _ = s.read(&mut b);
    }
    Some(s)
}

/// The well-behaved host: admin + I/O queue with digests, in-capsule 4 KiB
/// and R2T 64-128 KiB writes read back, until `stop` (at least `min` I/Os).
fn workload(addr: SocketAddr, stop: &AtomicBool, min: u64, ios: &AtomicU64) {
    let mut a = Client::connect(addr);
    a.ic(Digests::BOTH);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    let mut q = Client::io_queue(addr, Digests::BOTH, cntlid, 1, HOST_A, false);
    let mut n = 0u64;
    while n < min || !stop.load(Relaxed) {
        let big = n % 2 == 1;
        let len = if big {
            (64 << 10) + ((n as usize * 4096) % (64 << 10) + 4096).min(64 << 10)
        } else {
            4096
        };
        let slba = (n * 264) % (8192 - 256);
        let data = garbage(n + 1, len);
        let w = q.write(1, slba, &data, !big);
        assert!(
            w.status().is_success(),
            "write {n} at LBA {slba}: {:#x}",
            w.status().0
        );
        let (back, cq) = q.read(1, slba, len);
        if let Some(cq) = cq {
            assert!(cq.status().is_success(), "read {n}: {:#x}", cq.status().0);
        }
        assert!(
            back == data,
            "read {n} at LBA {slba}: other data than written"
        );
        n += 1;
        ios.store(n, Relaxed);
    }
    // Keep Alive on the admin queue still answers.
    let mut ka = Sqe::new(0x18, 0);
    ka.cid = a.next_cid();
    a.capsule(&ka, &[]);
    assert!(a.resp().status().is_success());
}

#[test]
fn hostile_connections_do_not_disturb_a_verified_workload() {
    for si in SOCK_IMPLS {
        eprintln!("sock_impl {si:?}");
        hostile_connections_do_not_disturb_a_verified_workload_on(si);
    }
}

fn hostile_connections_do_not_disturb_a_verified_workload_on(si: pollux_nvmf::SockImpl) {
    raise_nofile();
    let total: u64 = std::env::var("POLLUX_HOSTILE_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let opts = pollux_nvmf::TransportOptions {
        max_connections: 4096,
        sock_impl: si,
        ..Default::default()
    };
    let t = ram_target_with(8192, opts, &[0]);
    let addr = t.listen_addrs()[0];
    let start = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let ios = Arc::new(AtomicU64::new(0));
    let good = {
        let (stop, ios) = (stop.clone(), ios.clone());
        std::thread::spawn(move || workload(addr, &stop, 20, &ios))
    };
    let opened = Arc::new(AtomicU64::new(0));
    let per = total.div_ceil(THREADS as u64);
    let bad: Vec<_> = (0..THREADS as u64)
        .map(|th| {
            let opened = opened.clone();
            std::thread::spawn(move || {
                let mut k = th * per;
                let end = ((th + 1) * per).min(total);
                while k < end {
                    let mut held = Vec::with_capacity(BATCH);
                    for _ in 0..BATCH {
                        if k >= end {
                            break;
                        }
                        if let Some(s) = hostile(addr, k) {
                            held.push(s);
                        }
                        opened.fetch_add(1, Relaxed);
                        k += 1;
                    }
                    drop(held);
                }
            })
        })
        .collect();
    for h in bad {
        h.join().expect("hostile thread");
    }
    stop.store(true, Relaxed);
    good.join().expect("the verified workload failed");
    let hostile_done = start.elapsed();
    // Every connection goes away (the good host closed its two).
    let deadline = Instant::now() + Duration::from_secs(60);
    while t.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        t.connections() == 0,
        "{} connections still open",
        t.connections()
    );
    // A fresh host gets through.
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let cntlid = c.bring_up(SUB1, HOST_B, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
    sqe.cid = c.next_cid();
    c.capsule(&sqe, &[]);
    assert!(c.resp().status().is_success());
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_B, false);
    let d = pattern(8192, 9);
    assert!(q.write(1, 100, &d, false).status().is_success());
    assert_eq!(q.read(1, 100, 8192).0, d);
    println!(
        "hostile: {} hostile connections, {} verified write+read pairs on the good connection, {:.1} s",
        opened.load(Relaxed),
        ios.load(Relaxed),
        hostile_done.as_secs_f64()
    );
    assert_eq!(opened.load(Relaxed), total);
}

/// Item 5 of issue 18: connections that send ICReq and a Connect to the
/// discovery NQN with KATO 0, then stay silent, all from 127.0.0.1 (as
/// hosts behind one NAT address are), one more than `max_connections`
/// (they filled it: the next host was reset at accept). With the
/// defaults, the flood now lives within `max_unbound_connections` (the
/// longest idle evicted) and a new host's verified workload succeeds.
/// `POLLUX_FLOOD_CONNS` sets the flood's size (default 1100).
#[test]
fn a_discovery_flood_does_not_lock_data_hosts_out() {
    raise_nofile();
    let total: usize = std::env::var("POLLUX_FLOOD_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1100);
    let opts = pollux_nvmf::TransportOptions::default();
    let (max_data, max_unbound) = (opts.max_connections, opts.max_unbound_connections);
    let t = ram_target_with(8192, opts, &[0]);
    let addr = t.listen_addrs()[0];
    let mut one = icreq();
    let c = ConnectCmd::new(0, 31, 0, 0);
    let d = ConnectData::new(
        [2; 16],
        CNTLID_DYNAMIC,
        pollux_spec::fabrics::DISCOVERY_NQN,
        HOST_B,
    )
    .unwrap();
    one.extend(capsule(&c.to_sqe(), d.as_bytes()));
    let one = Arc::new(one);
    let per = total.div_ceil(THREADS);
    let flood: Vec<_> = (0..THREADS)
        .map(|th| {
            let one = one.clone();
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for _ in th * per..((th + 1) * per).min(total) {
                    if let Ok(mut s) = TcpStream::connect(addr) {
                        push(&mut s, &one);
                        held.push(s);
                    }
                }
                held
            })
        })
        .collect();
    let mut held: Vec<TcpStream> = flood
        .into_iter()
        .flat_map(|h| h.join().expect("flood thread"))
        .collect();
    assert_eq!(held.len(), total, "flood connections made");
    // The last ones are discovery controllers (ICResp, then Connect's
    // success).
    for s in held.iter_mut().rev().take(4) {
        let _ = s.set_nonblocking(false);
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut r = [0u8; 128 + 24];
        s.read_exact(&mut r).expect("ICResp and Connect response");
        assert_eq!(r[0], 0x01, "ICResp");
        let status = u16::from_le_bytes([r[128 + 8 + 14], r[128 + 8 + 15]]) >> 1;
        assert_eq!(status, 0, "discovery Connect");
    }
    // Wait until the target has taken in the whole flood.
    let mut last = usize::MAX;
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let n = t.connections();
        if n == last {
            break;
        }
        last = n;
    }
    let during = t.connections();
    println!(
        "discovery flood: {total} connections (ICReq + discovery Connect KATO 0, silent), {during} held by the target"
    );
    // A new host gets its queues and a verified workload through.
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, false);
    for n in 0..32u64 {
        let len = if n % 2 == 1 { 128 << 10 } else { 4096 };
        let data = garbage(n + 7, len);
        let slba = (n * 300) % (8192 - 256);
        let w = q.write(1, slba, &data, len == 4096);
        assert!(w.status().is_success(), "write {n}: {:#x}", w.status().0);
        assert!(q.read(1, slba, len).0 == data, "read {n}: other data");
    }
    println!("discovery flood: a new host's 32 verified write+read pairs passed");
    assert!(
        during <= max_unbound,
        "{during} flood connections held (max_unbound_connections {max_unbound}, max_connections {max_data})"
    );
    drop(held);
}

/// The process's resident set, bytes.
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = s.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

/// PDU types in what `s` has received so far (without blocking).
fn pdu_types(s: &mut TcpStream, buf: &mut Vec<u8>) -> Vec<u8> {
    let _ = s.set_nonblocking(true);
    let mut b = vec![0u8; 1 << 16];
    loop {
        match s.read(&mut b) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&b[..n]),
        }
    }
    let mut types = Vec::new();
    let mut at = 0;
    while buf.len() - at >= 8 {
        let plen = u32::from_le_bytes(buf[at + 4..at + 8].try_into().unwrap()) as usize;
        if plen < 8 || buf.len() - at < plen {
            break;
        }
        types.push(buf[at]);
        if buf[at] == 0x05 {
            // A response capsule: its status (CQE DW3 bits 31:17).
            let st = u16::from_le_bytes([buf[at + 8 + 14], buf[at + 8 + 15]]) >> 1;
            types.push(0x80 | (st & 0x7F) as u8);
        }
        at += plen;
    }
    buf.drain(..at);
    types
}

/// Item 6 of issue 18: associations that each fill a 128-entry I/O queue
/// with 127 writes of 128 KiB and never send the data. Each R2T used to
/// come with a buffer (12,700 R2Ts, +1,884 MiB of RSS for 100); now
/// buffers come from a pool of `num_shared_buffers` x `io_unit_size`
/// (64 MiB by default), an R2T goes out only with one, and a command
/// whose data has not come within `data_timeout` completes with
/// Transient Transport Error, giving its buffer back. Meanwhile another
/// host's verified I/O goes on. `POLLUX_POOL_ASSOCS` sets the number of
/// associations (default 20).
#[test]
fn hosts_that_never_send_r2t_data_cannot_grow_the_target() {
    raise_nofile();
    let assocs: usize = std::env::var("POLLUX_POOL_ASSOCS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let opts = pollux_nvmf::TransportOptions {
        data_timeout: Duration::from_secs(1),
        ..Default::default()
    };
    let limit = opts.pool_bytes();
    // R2Ts outstanding at most: one per 128 KiB of the pool.
    let pool_bufs = (limit >> 17) as usize;
    let t = ram_target_with(8192, opts, &[0]);
    let addr = t.listen_addrs()[0];
    let rss0 = rss();
    let mut hostile = Vec::new();
    for _ in 0..assocs {
        let mut a = Client::connect(addr);
        a.ic(Digests::NONE);
        let cntlid = a.bring_up(SUB1, HOST_B, 0);
        let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0);
        sqe.cid = a.next_cid();
        a.capsule(&sqe, &[]);
        assert!(a.resp().status().is_success());
        let mut q = Client::connect(addr);
        q.ic(Digests::NONE);
        let r = q.connect_cmd(1, 127, 0, cntlid, SUB1, HOST_B, false);
        assert!(r.status().is_success(), "I/O connect");
        let mut all = Vec::new();
        for cid in 1..=127u16 {
            let mut w = Sqe::rw(pollux_spec::NvmOpcode::Write, 1, 0, 256);
            w.cid = cid;
            SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut w);
            all.extend(capsule(&w, &[]));
        }
        q.s.write_all(&all).unwrap();
        hostile.push((a, q, Vec::new()));
    }
    // Let the target take them all in.
    std::thread::sleep(Duration::from_millis(500));
    let rss1 = rss();
    let (held, _) = t.buffer_bytes();
    // Another host: verified 128 KiB writes (R2T) and reads, 4 KiB ones
    // in the capsule.
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, false);
    for n in 0..24u64 {
        let len = if n % 3 == 0 { 4096 } else { 128 << 10 };
        let data = garbage(n + 99, len);
        let slba = (n * 256) % (8192 - 256);
        let w = q.write(1, slba, &data, len == 4096);
        assert!(w.status().is_success(), "write {n}: {:#x}", w.status().0);
        assert!(q.read(1, slba, len).0 == data, "read {n}: other data");
    }
    let rss2 = rss();
    // The hostile commands complete with Transient Transport Error (22h)
    // as their data times out (a pool's worth of them, at least, by
    // now), and the target sent R2Ts only for the buffers it had.
    let (mut r2ts, mut timed_out) = (0usize, 0usize);
    let deadline = Instant::now() + Duration::from_secs(30);
    while timed_out < pool_bufs && Instant::now() < deadline {
        for (_, q, buf) in hostile.iter_mut() {
            for ty in pdu_types(&mut q.s, buf) {
                match ty {
                    0x09 => r2ts += 1,
                    0xA2 => timed_out += 1,
                    _ => {}
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "never-sent R2T data: {assocs} associations x 127 x 128 KiB; RSS +{:.0} MiB after they were taken in, +{:.0} MiB after another host's 24 verified pairs; data buffers {:.0} MiB (pool {:.0} MiB); R2Ts {r2ts}, completed with Transient Transport Error {timed_out}",
        mib(rss1.saturating_sub(rss0)),
        mib(rss2.saturating_sub(rss0)),
        mib(held as u64),
        mib(limit)
    );
    let slack = 64 << 20;
    assert!(
        rss1.saturating_sub(rss0) < limit + slack,
        "RSS grew by {:.0} MiB (pool {:.0} MiB)",
        mib(rss1 - rss0),
        mib(limit)
    );
    assert!(held as u64 <= limit, "data buffers past the pool");
    assert!(
        timed_out >= pool_bufs,
        "{timed_out} hostile commands timed out"
    );
    assert!(
        r2ts <= timed_out + pool_bufs,
        "{r2ts} R2Ts for {timed_out} commands ended: more outstanding than the pool's {pool_bufs} buffers"
    );
}
