//! Interrupts: per-vector eventfds signalled by CQs created with IEN,
//! Interrupt Coalescing (FID 08h) and Interrupt Vector Configuration
//! (FID 09h). No timing assertions: the aggregation time is only checked
//! to fire "eventually" (within a generous bound), and "not yet" is checked
//! within the very step that posted the entries.
mod common;

use std::io::Read;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

use common::*;
use pollux_softnvme::{DeviceThread, SoftConfig, SoftDevice, SoftError, MAX_IRQ_VECTORS};
use pollux_spec::features::{
    fid, get_features_cdw10, sel, InterruptCoalescing, InterruptVectorConfig,
};
use pollux_spec::status::{generic, sct, specific};
use pollux_spec::{Sqe, Status};

/// Reads (and so clears) an eventfd's counter; 0 if not signalled.
fn count(fd: &OwnedFd) -> u64 {
    let mut f = std::fs::File::from(fd.try_clone().expect("dup eventfd"));
    let mut b = [0u8; 8];
    match f.read(&mut b) {
        Ok(8) => u64::from_ne_bytes(b),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => 0,
        other => panic!("eventfd read: {other:?}"),
    }
}

/// Submits `n` flushes, lets the device run them in one step, consumes
/// their completions.
fn burst(h: &mut Host, q: &mut IoQ, n: usize) {
    for _ in 0..n {
        h.submit(q, Sqe::flush(1));
    }
    h.step();
    let old = q.cq.head;
    let mut got = 0;
    while let Some(c) = Host::take(&mut q.cq) {
        assert!(c.status().is_success(), "{c:?}");
        got += 1;
    }
    h.ring_cq(&q.cq, old);
    assert_eq!(got, n, "all {n} commands complete in one step");
}

#[track_caller]
fn check(st: Status, sct_v: u8, sc: u8) {
    assert!(st.is(sct_v, sc), "got {st}, want sct {sct_v:#x} sc {sc:#x}");
}

fn set_coalescing(h: &mut Host, thr: u8, time: u8) {
    let cdw11 = InterruptCoalescing { thr, time }.to_cdw11();
    let st = h.admin_status(Sqe::set_features(fid::INTERRUPT_COALESCING, 0, cdw11));
    assert!(st.is_success(), "{st}");
}

fn set_cd(h: &mut Host, iv: u16, cd: bool) -> Status {
    let cdw11 = InterruptVectorConfig { iv, cd }.to_cdw11();
    h.admin_status(Sqe::set_features(fid::INTERRUPT_VECTOR_CONFIG, 0, cdw11))
}

fn get_feature(h: &mut Host, f: u8, selv: u8, cdw11: u32) -> (Status, u32) {
    let mut s = Sqe::get_features(f, 0);
    s.cdw10 = get_features_cdw10(f, selv);
    s.cdw11 = cdw11;
    let c = h.admin(s);
    (c.status(), c.dw0)
}

#[test]
fn ien_cq_signals_its_vector() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq_irq(1, 16, Some(3));
    // The fd is asked for after the CQ exists: same eventfd.
    let fd = h.dev.irq_eventfd(3).unwrap();
    let other = h.dev.irq_eventfd(4).unwrap();
    assert_eq!(count(&fd), 0);
    burst(&mut h, &mut q, 1);
    assert_eq!(count(&fd), 1, "one completion, one interrupt");
    assert_eq!(count(&fd), 0, "reading cleared it");
    // No coalescing by default: one interrupt per entry.
    burst(&mut h, &mut q, 5);
    assert_eq!(count(&fd), 5);
    assert_eq!(count(&other), 0, "another vector was signalled");
    assert_eq!(h.dev.stats().interrupts, 6);
    // Idle steps raise nothing.
    h.steps(10);
    assert_eq!(count(&fd), 0);

    // A controller reset keeps the eventfd: the host's copy still works.
    h.set_enable(false);
    assert!(h.set_enable(true).rdy());
    let mut q = h.create_ioq_irq(1, 16, Some(3));
    burst(&mut h, &mut q, 2);
    assert_eq!(count(&fd), 2);
}

#[test]
fn cq_without_ien_never_signals() {
    let mut h = Host::enabled(cfg_ram());
    let fd = h.dev.irq_eventfd(3).unwrap();
    // IEN clear, IV 3 (valid but unused).
    let (cq_iova, cq_ptr) = h.alloc(16 * 16);
    let (sq_iova, sq_ptr) = h.alloc(16 * 64);
    let mut create = Sqe::create_io_cq(1, 16, cq_iova);
    create.cdw11 |= 3 << 16;
    assert!(h.admin_status(create).is_success());
    assert!(h
        .admin_status(Sqe::create_io_sq(1, 16, 1, sq_iova))
        .is_success());
    let mut q = IoQ {
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
    };
    for _ in 0..10 {
        burst(&mut h, &mut q, 5);
    }
    h.steps(10);
    assert_eq!(count(&fd), 0);
    assert_eq!(h.dev.stats().interrupts, 0);
}

#[test]
fn interrupt_vector_is_validated() {
    let mut h = Host::enabled(SoftConfig {
        irq_vectors: 8,
        ..cfg_ram()
    });
    let (b, _) = h.alloc(4096);
    for ien in [true, false] {
        let mut s = Sqe::create_io_cq(1, 16, b);
        s.cdw11 |= 8 << 16 | if ien { pollux_spec::cmd::CQ_IEN } else { 0 };
        check(
            h.admin_status(s),
            sct::COMMAND_SPECIFIC,
            specific::INVALID_INTERRUPT_VECTOR,
        );
    }
    let mut s = Sqe::create_io_cq(1, 16, b);
    s.cdw11 |= pollux_spec::cmd::CQ_IEN | 7 << 16;
    assert!(h.admin_status(s).is_success());
    assert!(matches!(
        h.dev.irq_eventfd(8),
        Err(SoftError::InvalidVector {
            vector: 8,
            vectors: 8
        })
    ));
    assert!(h.dev.irq_eventfd(7).is_ok());
    for bad in [0, MAX_IRQ_VECTORS + 1] {
        let e = SoftDevice::new(SoftConfig {
            irq_vectors: bad,
            ..Default::default()
        })
        .expect_err("invalid irq_vectors accepted");
        assert!(e.to_string().contains("irq_vectors"), "{e}");
    }
}

#[test]
fn coalescing_threshold() {
    let mut h = Host::enabled(cfg_ram());
    // THR 3: an interrupt per 4 entries; TIME 25.5 ms, which cannot run
    // out within the step that posted the entries.
    set_coalescing(&mut h, 3, 255);
    let mut q = h.create_ioq_irq(1, 32, Some(1));
    let fd = h.dev.irq_eventfd(1).unwrap();
    burst(&mut h, &mut q, 8);
    assert_eq!(count(&fd), 2, "8 entries, THR 3: two interrupts");
    burst(&mut h, &mut q, 3);
    assert_eq!(count(&fd), 0, "3 entries are below the threshold");
    // The fourth reaches it, however long the pause was.
    burst(&mut h, &mut q, 1);
    assert_eq!(count(&fd), 1);
    burst(&mut h, &mut q, 4 * 5 + 3);
    assert_eq!(count(&fd), 5);
}

#[test]
fn aggregation_time_fires() {
    let mut h = Host::enabled(cfg_ram());
    // THR 255 (256 entries) is never reached here; TIME 10 (1 ms).
    set_coalescing(&mut h, 255, 10);
    let mut q = h.create_ioq_irq(1, 16, Some(2));
    let fd = h.dev.irq_eventfd(2).unwrap();
    burst(&mut h, &mut q, 3);
    assert_eq!(count(&fd), 0, "not in the step that posted the entries");
    let t0 = Instant::now();
    let mut n = 0;
    while n == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(200));
        h.step();
        n = count(&fd);
    }
    assert_eq!(n, 1, "the aggregation time raised one interrupt");
    // Nothing more is pending.
    std::thread::sleep(Duration::from_millis(2));
    h.steps(10);
    assert_eq!(count(&fd), 0);
}

#[test]
fn aggregation_time_fires_on_an_idle_device_thread() {
    let mut h = Host::enabled(cfg_ram());
    set_coalescing(&mut h, 255, 20);
    let mut q = h.create_ioq_irq(1, 16, Some(1));
    let fd = h.dev.irq_eventfd(1).unwrap();
    let t = DeviceThread::spawn(None).unwrap();
    t.attach(h.dev.clone());
    // Let the thread go idle (it sleeps after ~1 ms without work).
    std::thread::sleep(Duration::from_millis(20));
    h.submit(&mut q, Sqe::flush(1));
    let t0 = Instant::now();
    let mut n = 0;
    while n == 0 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_micros(500));
        n = count(&fd);
    }
    assert_eq!(n, 1, "coalesced interrupt never fired");
    let c = Host::take(&mut q.cq).expect("completion before its interrupt");
    assert!(c.status().is_success());
    t.detach(&h.dev);
}

#[test]
fn coalescing_disable_per_vector() {
    let mut h = Host::enabled(cfg_ram());
    set_coalescing(&mut h, 255, 255);
    assert!(set_cd(&mut h, 2, true).is_success());
    let mut q1 = h.create_ioq_irq(1, 16, Some(1));
    let mut q2 = h.create_ioq_irq(2, 16, Some(2));
    let fd1 = h.dev.irq_eventfd(1).unwrap();
    let fd2 = h.dev.irq_eventfd(2).unwrap();
    burst(&mut h, &mut q1, 3);
    burst(&mut h, &mut q2, 3);
    assert_eq!(count(&fd1), 0, "vector 1 is coalesced");
    assert_eq!(count(&fd2), 3, "CD=1: one interrupt per entry");
    // Clearing CD coalesces vector 2 again.
    assert!(set_cd(&mut h, 2, false).is_success());
    burst(&mut h, &mut q2, 3);
    assert_eq!(count(&fd2), 0);
    // Two CQs sharing a vector count together.
    set_coalescing(&mut h, 1, 255);
    let mut q3 = h.create_ioq_irq(3, 16, Some(3));
    let mut q4 = h.create_ioq_irq(4, 16, Some(3));
    let fd3 = h.dev.irq_eventfd(3).unwrap();
    burst(&mut h, &mut q3, 1);
    burst(&mut h, &mut q4, 1);
    assert_eq!(count(&fd3), 1, "THR 1: two entries on one vector");
}

#[test]
fn admin_vector_is_never_coalesced_and_opt_in() {
    let mut h = Host::enabled(cfg_ram());
    set_coalescing(&mut h, 255, 255);
    // Polled admin queue: nothing signalled.
    assert_eq!(h.dev.stats().interrupts, 0);
    let fd = h.dev.irq_eventfd(0).unwrap();
    let (st, _) = get_feature(&mut h, fid::INTERRUPT_COALESCING, sel::CURRENT, 0);
    assert!(st.is_success());
    assert_eq!(count(&fd), 1, "admin completion on vector 0, uncoalesced");
    // An I/O CQ may share vector 0; it is not coalesced either.
    let mut q = h.create_ioq_irq(1, 16, Some(0));
    count(&fd);
    burst(&mut h, &mut q, 2);
    assert_eq!(count(&fd), 2);
    // Vector 0 cannot be coalesced.
    check(
        set_cd(&mut h, 0, false),
        sct::GENERIC,
        generic::INVALID_FIELD,
    );
    count(&fd);
    burst(&mut h, &mut q, 1);
    assert_eq!(count(&fd), 1);
}

#[test]
fn get_features_returns_what_set_stored() {
    let mut h = Host::enabled(SoftConfig {
        irq_vectors: 16,
        ..cfg_ram()
    });
    let ic = |h: &mut Host, s| get_feature(h, fid::INTERRUPT_COALESCING, s, 0);
    assert_eq!(ic(&mut h, sel::CURRENT), (Status::SUCCESS, 0));
    set_coalescing(&mut h, 7, 10);
    assert_eq!(ic(&mut h, sel::CURRENT), (Status::SUCCESS, 0x0A07));
    assert_eq!(ic(&mut h, sel::DEFAULT), (Status::SUCCESS, 0));

    let ivc = |h: &mut Host, s, iv: u16| get_feature(h, fid::INTERRUPT_VECTOR_CONFIG, s, iv as u32);
    let cfg = |iv, cd| InterruptVectorConfig { iv, cd }.to_cdw11();
    assert_eq!(
        ivc(&mut h, sel::CURRENT, 0),
        (Status::SUCCESS, cfg(0, true))
    );
    assert_eq!(
        ivc(&mut h, sel::CURRENT, 5),
        (Status::SUCCESS, cfg(5, false))
    );
    assert!(set_cd(&mut h, 5, true).is_success());
    assert_eq!(
        ivc(&mut h, sel::CURRENT, 5),
        (Status::SUCCESS, cfg(5, true))
    );
    assert_eq!(
        ivc(&mut h, sel::CURRENT, 6),
        (Status::SUCCESS, cfg(6, false))
    );
    assert_eq!(
        ivc(&mut h, sel::DEFAULT, 5),
        (Status::SUCCESS, cfg(5, false))
    );
    // Out-of-range vectors.
    check(
        ivc(&mut h, sel::CURRENT, 16).0,
        sct::GENERIC,
        generic::INVALID_FIELD,
    );
    check(
        set_cd(&mut h, 16, true),
        sct::GENERIC,
        generic::INVALID_FIELD,
    );
    // Both are changeable, neither saveable.
    let (st, caps) = ic(&mut h, sel::SUPPORTED);
    assert!(st.is_success());
    assert_eq!(caps, pollux_spec::features::CAP_CHANGEABLE);
    let mut save = Sqe::set_features(fid::INTERRUPT_COALESCING, 0, 0);
    save.cdw10 |= pollux_spec::features::SET_FEATURES_SAVE;
    check(
        h.admin_status(save),
        sct::COMMAND_SPECIFIC,
        specific::FEATURE_NOT_SAVEABLE,
    );
    // A controller reset restores the defaults.
    h.set_enable(false);
    assert!(h.set_enable(true).rdy());
    assert_eq!(ic(&mut h, sel::CURRENT), (Status::SUCCESS, 0));
    assert_eq!(
        ivc(&mut h, sel::CURRENT, 5),
        (Status::SUCCESS, cfg(5, false))
    );
}
