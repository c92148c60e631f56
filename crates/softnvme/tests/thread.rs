//! DeviceThread: two attached devices both make progress; detach stops
//! stepping; drop joins.
mod common;

use std::time::{Duration, Instant};

use common::*;
use pollux_softnvme::DeviceThread;
use pollux_spec::regs::{off, Aqa, Cc};
use pollux_spec::{NvmOpcode, Sqe};

/// Waits (without stepping: the thread does) for a CQE.
fn wait(cq: &mut CqRing) -> pollux_spec::Cqe {
    let t0 = Instant::now();
    loop {
        if let Some(c) = Host::take(cq) {
            return c;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "device thread made no progress"
        );
        std::thread::yield_now();
    }
}

#[test]
fn two_devices_progress_on_one_thread() {
    let t = DeviceThread::spawn(None).unwrap();
    let mut hosts: Vec<Host> = (0..2).map(|_| Host::new(cfg_ram())).collect();
    for h in &mut hosts {
        t.attach(h.dev.clone());
        t.attach(h.dev.clone()); // idempotent
        h.setup_admin(16, 16);
        h.w32(off::AQA, Aqa::new(16, 16).0);
        h.w32(off::CC, Cc::standard(0).with_en(true).0);
    }
    let t0 = Instant::now();
    while !hosts.iter().all(|h| h.csts().rdy()) {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::yield_now();
    }
    // Create an I/O queue pair on each (by hand: Host::admin steps itself,
    // which is harmless but we want the thread to do the work here).
    let mut qs = vec![];
    for h in &mut hosts {
        let (cq_iova, cq_ptr) = h.alloc(4096);
        let (sq_iova, sq_ptr) = h.alloc(4096);
        for sqe in [
            Sqe::create_io_cq(1, 16, cq_iova),
            Sqe::create_io_sq(1, 16, 1, sq_iova),
        ] {
            let old = h.asq.tail;
            let mut s = sqe;
            s.cid = h.cid();
            let mut sq = std::mem::replace(
                &mut h.asq,
                SqRing {
                    qid: 0,
                    iova: 0,
                    ptr: std::ptr::null_mut(),
                    size: 0,
                    tail: 0,
                },
            );
            Host::push(&mut sq, s);
            h.ring_sq(&sq, old);
            h.asq = sq;
            let mut acq = std::mem::replace(
                &mut h.acq,
                CqRing {
                    qid: 0,
                    iova: 0,
                    ptr: std::ptr::null_mut(),
                    size: 0,
                    head: 0,
                    phase: true,
                },
            );
            let old = acq.head;
            let c = wait(&mut acq);
            h.ring_cq(&acq, old);
            h.acq = acq;
            assert!(c.status().is_success());
        }
        qs.push(IoQ {
            sq: SqRing {
                qid: 1,
                iova: sq_iova,
                ptr: sq_ptr.cast(),
                size: 16,
                tail: 0,
            },
            cq: CqRing {
                qid: 1,
                iova: cq_iova,
                ptr: cq_ptr.cast(),
                size: 16,
                head: 0,
                phase: true,
            },
        });
    }
    for round in 0..200u64 {
        for (h, q) in hosts.iter_mut().zip(qs.iter_mut()) {
            let (b, _) = (0x10_0000u64 + 3 * 4096, ());
            let mut s = rw(NvmOpcode::Write, 1, round, 1, b, 0);
            s.cid = round as u16;
            let old = q.sq.tail;
            Host::push(&mut q.sq, s);
            h.ring_sq(&q.sq, old);
        }
        for (h, q) in hosts.iter_mut().zip(qs.iter_mut()) {
            let old = q.cq.head;
            let c = wait(&mut q.cq);
            h.ring_cq(&q.cq, old);
            assert_eq!(c.cid, round as u16);
            assert!(c.status().is_success());
        }
    }
    for h in &hosts {
        assert!(h.dev.stats().writes >= 200);
    }
    // Detach one: it stops being stepped.
    t.detach(&hosts[0].dev);
    let before = hosts[0].dev.stats().io_commands;
    let (h0, q0) = (&mut hosts[0], &mut qs[0]);
    let old = q0.sq.tail;
    Host::push(
        &mut q0.sq,
        rw(NvmOpcode::Write, 1, 0, 1, 0x10_0000 + 3 * 4096, 0),
    );
    h0.ring_sq(&q0.sq, old);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(h0.dev.stats().io_commands, before);
    // Stepping it by hand still works.
    h0.step();
    assert!(Host::take(&mut q0.cq).is_some());
    drop(t);
}

#[test]
fn pinned_thread_starts() {
    match DeviceThread::spawn(Some(0)) {
        Ok(t) => drop(t),
        Err(e) => panic!("pinning to CPU 0 failed: {e}"),
    }
    assert!(DeviceThread::spawn(Some(100_000)).is_err());
}
