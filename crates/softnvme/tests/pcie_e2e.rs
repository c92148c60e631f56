//! Driver + emulated controller, end to end, in inline (deterministic) mode:
//! the device is stepped by the test thread whenever the driver waits, so
//! every result here is reproducible.
// The borrowed-buffer helpers, shared with pollux-pcie's hardware tests.
#[path = "../../pcie/tests/common/mod.rs"]
mod borrowed;
use borrowed::Borrowed;
use std::sync::Arc;
use std::time::Duration;

use pollux_pcie::{
    Completion, Controller, ControllerOptions, IoError, QpairOptions, QueuePair, SubmitError,
};
use pollux_softnvme::{
    BackendConfig, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig, SoftDevice,
};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::status::{generic, media};
use pollux_spec::{AdminOpcode, NvmOpcode, Status};

fn ram_cfg(lba_shift: u8, size: u64, namespaces: usize) -> SoftConfig {
    SoftConfig {
        namespaces: (0..namespaces)
            .map(|_| NamespaceConfig {
                backend: BackendConfig::Ram,
                lba_shift,
                size_bytes: size,
            })
            .collect(),
        ..SoftConfig::default()
    }
}

fn open(cfg: SoftConfig, copts: ControllerOptions) -> (Arc<SoftDevice>, Controller) {
    let dev = SoftDevice::new(cfg).expect("soft device");
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        copts,
    )
    .expect("bring-up");
    (dev, ctrl)
}

fn quick_opts() -> ControllerOptions {
    ControllerOptions {
        admin_timeout: Duration::from_millis(300),
        ..ControllerOptions::default()
    }
}

/// Polls until nothing is in flight; returns completions in arrival order.
fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    qp.drain(Duration::from_secs(20), |_, c| out.push(c))
        .expect("drain");
    out
}

/// Submits `n` one-block (512 B) reads of LBAs 0..n, each into its own
/// 512-byte slice of `buf`, with the LBA as user data.
fn submit_reads(
    qp: &mut QueuePair,
    ns: &pollux_pcie::Namespace,
    buf: &pollux_pcie::DmaBuffer,
    n: u64,
) {
    for i in 0..n {
        let s = i as usize * 512;
        qp.read_b(ns, i, 1, buf.slice(s..s + 512), i).unwrap();
    }
}

fn pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

#[test]
fn bring_up_identify_and_namespaces() {
    let (_dev, ctrl) = open(ram_cfg(12, 64 << 20, 2), ControllerOptions::default());
    let id = ctrl.identify();
    assert_eq!(pollux_spec::identify::ascii_str(&id.sn), "SOFT0001");
    assert_eq!(ctrl.namespaces().len(), 2);
    let ns = ctrl.namespaces()[1];
    assert_eq!(ns.nsid(), 2);
    assert_eq!(ns.lba_shift(), 12);
    assert_eq!(ns.nsze(), (64 << 20) >> 12);
    assert_eq!(ctrl.max_transfer(), 128 << 10);
    assert!(ctrl.io_queues() >= 1);
    assert!(ctrl.transport().shadow_doorbells());
}

/// Every size from 512 B to 1 MiB (PRP1 only, PRP2, PRP lists, MDTS
/// splitting) on both LBA formats, data checked byte for byte.
#[test]
fn read_write_sizes_and_formats() {
    for lba_shift in [9u8, 12] {
        let (_dev, ctrl) = open(
            ram_cfg(lba_shift, 16 << 20, 1),
            ControllerOptions::default(),
        );
        let ns = ctrl.namespaces()[0];
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth: 32,
                ..QpairOptions::default()
            })
            .unwrap();
        let sizes = [
            512usize,
            4096,
            8192,
            12288,
            64 << 10,
            128 << 10,
            132 << 10,
            512 << 10,
            1 << 20,
        ];
        let mut lba = 0u64;
        for (i, &size) in sizes.iter().enumerate() {
            if size < ns.lba_size() as usize {
                continue;
            }
            let nlb = (size >> lba_shift) as u32;
            let mut w = ctrl.alloc_dma(size).unwrap();
            pattern(w.as_mut_slice(), i as u64 + 1);
            qp.write_b(&ns, lba, nlb, w.slice(0..size), 1).unwrap();
            let c = drain(&mut qp);
            assert_eq!(
                c,
                vec![Completion::new(1, Ok(0))],
                "write {size} B, lba_shift {lba_shift}"
            );
            let r = ctrl.alloc_dma(size).unwrap();
            qp.read_b(&ns, lba, nlb, r.slice(0..size), 2).unwrap();
            let c = drain(&mut qp);
            assert_eq!(c.len(), 1);
            assert!(c[0].result.is_ok(), "read {size}: {:?}", c[0]);
            assert!(
                r.as_slice()[..size] == w.as_slice()[..size],
                "data mismatch at {size} B, lba_shift {lba_shift}"
            );
            lba += nlb as u64;
        }
        // A 1 MiB request with a 128 KiB MDTS is 8 commands, one completion.
        assert!(qp.stats().submitted >= 16);
    }
}

/// Data through a buffer that starts 512 bytes into a page (PRP1 offset).
#[test]
fn unaligned_in_page_buffer_offset() {
    let (_dev, ctrl) = open(ram_cfg(9, 8 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = ctrl.alloc_dma(3 * 4096).unwrap();
    pattern(w.as_mut_slice(), 9);
    qp.write_b(&ns, 100, 16, w.slice(512..512 + 8192), 1)
        .unwrap();
    assert!(drain(&mut qp)[0].result.is_ok());
    let r = ctrl.alloc_dma(8192).unwrap();
    qp.read_b(&ns, 100, 16, r.full(), 2).unwrap();
    assert!(drain(&mut qp)[0].result.is_ok());
    assert!(r.as_slice() == &w.as_slice()[512..512 + 8192]);
}

#[test]
fn bad_input_is_refused_before_submission() {
    let (_dev, ctrl) = open(ram_cfg(9, 1 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let buf = ctrl.alloc_dma(8192).unwrap();
    let end = ns.nsze();
    assert_eq!(
        qp.read_b(&ns, end - 1, 2, buf.slice(0..1024), 0),
        Err(SubmitError::LbaOutOfRange {
            lba: end - 1,
            nlb: 2,
            nsze: end
        })
    );
    assert!(matches!(
        qp.read_b(&ns, u64::MAX, 1, buf.slice(0..512), 0),
        Err(SubmitError::LbaOutOfRange { .. })
    ));
    assert_eq!(
        qp.read_b(&ns, 0, 0, buf.slice(0..0), 0),
        Err(SubmitError::ZeroLength)
    );
    assert_eq!(
        qp.read_b(&ns, 0, 2, buf.slice(0..512), 0),
        Err(SubmitError::BufferLength {
            expected: 1024,
            got: 512
        })
    );
    assert!(matches!(
        qp.write_b(&ns, 0, 1, buf.slice(2..514), 0),
        Err(SubmitError::Unaligned { .. })
    ));
    assert_eq!(qp.outstanding(), 0, "nothing was sent");
    assert_eq!(qp.stats().submitted, 0);
    // The device refuses a range past the namespace that slipped past the
    // driver (passthrough checks the transfer length, not the range; a
    // Namespace with a wrong size cannot be made any more).
    let b = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(512);
    let sqe = pollux_spec::Sqe::rw(NvmOpcode::Read, ns.nsid(), ns.nsze(), 1);
    qp.raw(sqe, Some(b), 5).unwrap();
    let c = drain(&mut qp);
    assert_eq!(
        c[0].result,
        Err(IoError::Nvme(Status::generic(generic::LBA_OUT_OF_RANGE)))
    );
}

/// More requests than the queue holds wait in software and all complete.
#[test]
fn queue_full_requests_wait_in_software() {
    let (_dev, ctrl) = open(ram_cfg(9, 8 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = ctrl.alloc_dma(100 * 4096).unwrap();
    pattern(w.as_mut_slice(), 3);
    for i in 0..100u64 {
        qp.write_b(
            &ns,
            i * 8,
            8,
            w.slice(i as usize * 4096..(i as usize + 1) * 4096),
            i,
        )
        .unwrap();
    }
    assert_eq!(qp.outstanding(), 4);
    assert_eq!(qp.queued(), 96);
    let c = drain(&mut qp);
    assert_eq!(c.len(), 100);
    let mut ids: Vec<u64> = c.iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert!(c.iter().all(|c| c.result.is_ok()));
    // Split requests wait too: 1 MiB = 8 commands needs 8 trackers.
    let mut qp8 = ctrl
        .alloc_qpair(QpairOptions {
            depth: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let big = ctrl.alloc_dma(1 << 20).unwrap();
    qp8.read_b(&ns, 0, 2048, big.full(), 1).unwrap();
    qp8.read_b(&ns, 0, 2048, big.full(), 2).unwrap();
    assert_eq!(qp8.queued(), 1);
    assert_eq!(drain(&mut qp8).len(), 2);
    // More pieces than the queue pair has trackers: they wait and the
    // request completes once (see `split_larger_than_depth_*`).
    let mut qp2 = ctrl
        .alloc_qpair(QpairOptions {
            depth: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    qp2.read_b(&ns, 0, 2048, big.full(), 1).unwrap();
    let done = drain(&mut qp2);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(0));
    // Software queue bound.
    let mut qp3 = ctrl
        .alloc_qpair(QpairOptions {
            depth: 1,
            max_queued: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    for i in 0..3 {
        qp3.read_b(&ns, 0, 1, w.slice(0..512), i).unwrap();
    }
    assert_eq!(
        qp3.read_b(&ns, 0, 1, w.slice(0..512), 9),
        Err(SubmitError::QueueFull { limit: 2 })
    );
    assert_eq!(drain(&mut qp3).len(), 3);
}

/// Several queue pairs interleaved on one namespace, data verified.
#[test]
fn several_queue_pairs() {
    let (_dev, ctrl) = open(ram_cfg(12, 32 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qps: Vec<QueuePair> = (0..4)
        .map(|_| {
            ctrl.alloc_qpair(QpairOptions {
                depth: 16,
                ..QpairOptions::default()
            })
            .unwrap()
        })
        .collect();
    let qids: Vec<u16> = qps.iter().map(|q| q.qid()).collect();
    assert_eq!(qids, vec![1, 2, 3, 4]);
    let mut bufs = Vec::new();
    for (q, qp) in qps.iter_mut().enumerate() {
        let mut b = ctrl.alloc_dma(16 * 4096).unwrap();
        pattern(b.as_mut_slice(), 100 + q as u64);
        for i in 0..16 {
            qp.write_b(
                &ns,
                (q * 16 + i) as u64,
                1,
                b.slice(i * 4096..(i + 1) * 4096),
                i as u64,
            )
            .unwrap();
        }
        bufs.push(b);
    }
    for qp in qps.iter_mut() {
        assert!(drain(qp).iter().all(|c| c.result.is_ok()));
    }
    let r = ctrl.alloc_dma(64 * 4096).unwrap();
    qps[2].read_b(&ns, 0, 64, r.full(), 0).unwrap();
    assert!(drain(&mut qps[2])[0].result.is_ok());
    for (q, b) in bufs.iter().enumerate() {
        assert!(
            r.as_slice()[q * 65536..(q + 1) * 65536] == *b.as_slice(),
            "queue pair {q}'s data"
        );
    }
    drop(qps);
    // Queue ids are given back on drop.
    let qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    assert_eq!(qp.qid(), 1);
}

#[test]
fn write_zeroes_deallocate_flush_and_raw() {
    let (_dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = ctrl.alloc_dma(8192).unwrap();
    w.as_mut_slice().fill(0xAB);
    qp.write_b(&ns, 0, 16, w.full(), 1).unwrap();
    qp.write_b(&ns, 64, 16, w.full(), 2).unwrap();
    assert!(drain(&mut qp).iter().all(|c| c.result.is_ok()));
    qp.write_zeroes(&ns, 0, 8, false, 3).unwrap();
    qp.deallocate(&ns, 64, 16, 4).unwrap();
    qp.flush_cache(&ns, 5).unwrap();
    assert!(drain(&mut qp).iter().all(|c| c.result.is_ok()));
    // Raw passthrough read of both ranges.
    let r = ctrl.alloc_dma(8192).unwrap();
    let sqe = pollux_spec::Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 16);
    qp.raw_b(sqe, Some(r.full()), 6).unwrap();
    assert!(drain(&mut qp)[0].result.is_ok());
    assert!(r.as_slice()[..4096].iter().all(|&b| b == 0), "write zeroes");
    assert!(
        r.as_slice()[4096..].iter().all(|&b| b == 0xAB),
        "beyond write zeroes untouched"
    );
    qp.read_b(&ns, 64, 16, r.full(), 7).unwrap();
    assert!(drain(&mut qp)[0].result.is_ok());
    assert!(
        r.as_slice().iter().all(|&b| b == 0),
        "deallocated blocks read zero"
    );
}

/// Delayed doorbell: 64 commands written, one SQ doorbell at the poll.
/// Without it: one per command. Counts, not timings.
#[test]
fn doorbell_counts() {
    for (delayed, expect) in [(true, 1u64), (false, 64)] {
        let (_dev, ctrl) = open(
            ram_cfg(9, 4 << 20, 1),
            ControllerOptions {
                shadow_doorbells: false,
                ..ControllerOptions::default()
            },
        );
        let ns = ctrl.namespaces()[0];
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth: 64,
                delayed_sq_doorbell: delayed,
                ..QpairOptions::default()
            })
            .unwrap();
        let b = ctrl.alloc_dma(64 * 512).unwrap();
        submit_reads(&mut qp, &ns, &b, 64);
        qp.poll(0, |_, _| {});
        assert_eq!(qp.stats().sq_doorbells, expect, "delayed={delayed}");
        assert_eq!(drain(&mut qp).len(), 64);
    }
}

/// Runs `total` 512 B reads through a depth-16 queue pair with the given CQ
/// size, consuming at most `per_poll` entries per poll (partial polls make
/// unacknowledged entries pile up, which is where an off-by-one in the lazy
/// rule would let the controller find the CQ full). Returns (CQ doorbells,
/// times the controller found the CQ full).
fn cq_run(cq_entries: u16, lazy: bool, per_poll: u32, total: u64) -> (u64, u64) {
    let (dev, ctrl) = open(
        ram_cfg(9, 4 << 20, 1),
        ControllerOptions {
            shadow_doorbells: false,
            ..ControllerOptions::default()
        },
    );
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 16,
            cq_entries: Some(cq_entries),
            lazy_cq_doorbell: lazy,
            ..QpairOptions::default()
        })
        .unwrap();
    let b = ctrl.alloc_dma(16 * 512).unwrap();
    submit_reads(&mut qp, &ns, &b, 16u64);
    let (mut submitted, mut done) = (16u64, 0u64);
    while done < total {
        qp.poll(per_poll, |sub, c| {
            assert!(c.result.is_ok());
            done += 1;
            if submitted < total {
                submitted += 1;
                let s = c.user_data as usize;
                sub.read_b(
                    &ns,
                    s as u64,
                    1,
                    b.slice(s * 512..(s + 1) * 512),
                    c.user_data,
                )
                .unwrap();
            }
        });
        dev.step();
    }
    assert_eq!(qp.stats().completed, total);
    (qp.stats().cq_doorbells, dev.stats().cq_full_waits)
}

/// The lazy CQ doorbell never lets the controller find the CQ full — with
/// the CQ just one entry larger than needed, or roomy — and rings less than
/// the eager one when there is room to be lazy.
#[test]
fn lazy_cq_doorbell_never_overflows() {
    for cq in [17u16, 24, 64] {
        for per_poll in [1u32, 3, u32::MAX] {
            let (lazy_db, lazy_full) = cq_run(cq, true, per_poll, 5_000);
            let (eager_db, eager_full) = cq_run(cq, false, per_poll, 5_000);
            assert_eq!(
                lazy_full, 0,
                "lazy, CQ {cq}, {per_poll}/poll: controller found the CQ full"
            );
            assert_eq!(eager_full, 0, "eager, CQ {cq}, {per_poll}/poll");
            assert!(
                lazy_db <= eager_db,
                "CQ {cq}, {per_poll}/poll: lazy {lazy_db} > eager {eager_db}"
            );
            if cq == 64 {
                // 47 entries of slack: one doorbell per 48 completions at most.
                assert!(
                    lazy_db * 40 <= 5_000,
                    "CQ 64, {per_poll}/poll: {lazy_db} lazy doorbells"
                );
                assert!(
                    eager_db >= 5_000 / 16,
                    "eager rings every poll that consumed entries"
                );
            }
        }
    }
}

/// Shadow doorbells: with the polling emulated controller, no MMIO doorbell
/// writes at all after setup; without them, MMIO per poll.
#[test]
fn shadow_doorbells_replace_mmio() {
    for shadow in [true, false] {
        let (dev, ctrl) = open(
            ram_cfg(9, 4 << 20, 1),
            ControllerOptions {
                shadow_doorbells: shadow,
                ..ControllerOptions::default()
            },
        );
        assert_eq!(ctrl.transport().shadow_doorbells(), shadow);
        let ns = ctrl.namespaces()[0];
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth: 8,
                ..QpairOptions::default()
            })
            .unwrap();
        let mut w = ctrl.alloc_dma(4096).unwrap();
        pattern(w.as_mut_slice(), 5);
        for round in 0..50u64 {
            qp.write_b(&ns, round * 8, 8, w.full(), round).unwrap();
            assert!(drain(&mut qp)[0].result.is_ok());
        }
        let r = ctrl.alloc_dma(4096).unwrap();
        qp.read_b(&ns, 49 * 8, 8, r.full(), 0).unwrap();
        assert!(drain(&mut qp)[0].result.is_ok());
        assert!(r.as_slice() == w.as_slice());
        let st = qp.stats();
        assert_eq!(dev.stats().shadow_doorbell_enabled, shadow);
        if shadow {
            // The polling controller publishes event index 0xFFFF: MMIO only
            // when an index wraps the ring. 51 commands through a 9-entry SQ
            // wrap it 5 times; the CQ (32 entries) once.
            let sq_wraps = st.submitted / 9;
            assert_eq!(st.sq_doorbells, sq_wraps, "SQ MMIO once per ring wrap");
            assert!(
                st.cq_doorbells <= st.completed / qp.cq_entries() as u64 + 1,
                "CQ MMIO at most once per wrap"
            );
            assert!(st.shadow_updates >= 51);
        } else {
            assert!(st.sq_doorbells >= 51);
            assert_eq!(st.shadow_updates, 0);
        }
    }
}

fn rule(queue: QueueSel, opcode: Option<u8>, action: FaultAction) -> FaultRule {
    FaultRule {
        queue,
        opcode,
        nsid: None,
        lba: None,
        skip: 0,
        count: Some(1),
        action,
    }
}

fn short_timeout_qp(ctrl: &Controller) -> QueuePair {
    ctrl.alloc_qpair(QpairOptions {
        depth: 8,
        timeout: Some(Duration::from_millis(100)),
        ..QpairOptions::default()
    })
    .unwrap()
}

#[test]
fn fault_error_status_reaches_the_user() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let st = Status::media(media::UNRECOVERED_READ_ERROR);
    dev.add_fault(FaultRule {
        lba: Some(10..20),
        count: None,
        ..rule(
            QueueSel::Io,
            Some(NvmOpcode::Read as u8),
            FaultAction::Status(st),
        )
    });
    let b = ctrl.alloc_dma(4096).unwrap();
    qp.read_b(&ns, 0, 8, b.full(), 1).unwrap();
    qp.read_b(&ns, 12, 1, b.slice(0..512), 2).unwrap();
    qp.write_b(&ns, 12, 1, b.slice(0..512), 3).unwrap();
    let mut c = drain(&mut qp);
    c.sort_by_key(|c| c.user_data);
    assert_eq!(c[0].result, Ok(0));
    assert_eq!(c[1].result, Err(IoError::Nvme(st)));
    assert_eq!(c[2].result, Ok(0), "writes are not matched by a read rule");
}

#[test]
fn fault_delay_and_reorder_complete_correctly() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    dev.add_fault(rule(
        QueueSel::Io,
        None,
        FaultAction::Delay(Duration::from_millis(30)),
    ));
    dev.add_fault(FaultRule {
        skip: 1,
        ..rule(QueueSel::Io, None, FaultAction::Reorder)
    });
    let b = ctrl.alloc_dma(8 * 512).unwrap();
    submit_reads(&mut qp, &ns, &b, 8u64);
    let c = drain(&mut qp);
    assert_eq!(c.len(), 8);
    assert!(c.iter().all(|c| c.result.is_ok()));
    let order: Vec<u64> = c.iter().map(|c| c.user_data).collect();
    assert_ne!(
        order,
        (0..8).collect::<Vec<_>>(),
        "delay/reorder changed the completion order"
    );
    assert_eq!(
        *order.last().unwrap(),
        0,
        "the delayed command completes last"
    );
}

/// A completion that never comes: the command times out, is aborted, and
/// completes with IoError::Timeout; no reset needed; the queue keeps working.
#[test]
fn fault_lost_completion_timeout_and_abort() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), quick_opts());
    let ns = ctrl.namespaces()[0];
    let mut qp = short_timeout_qp(&ctrl);
    dev.add_fault(rule(
        QueueSel::Io,
        Some(NvmOpcode::Read as u8),
        FaultAction::Drop,
    ));
    let b = ctrl.alloc_dma(4096).unwrap();
    qp.read_b(&ns, 0, 1, b.slice(0..512), 1).unwrap();
    qp.write_b(&ns, 1, 1, b.slice(512..1024), 2).unwrap();
    let mut c = drain(&mut qp);
    c.sort_by_key(|c| c.user_data);
    assert_eq!(c[0], Completion::new(1, Err(IoError::Timeout)));
    assert_eq!(c[1].result, Ok(0));
    assert_eq!(qp.stats().timeouts, 1);
    assert_eq!(qp.stats().aborts_sent, 1);
    assert_eq!(ctrl.resets(), 0);
    qp.read_b(&ns, 0, 1, b.slice(0..512), 3).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
}

/// The abort itself is never answered: the controller is reset, every
/// outstanding request completes with an error, and the queue pairs work
/// again afterwards (including another queue pair that did nothing wrong).
#[test]
fn fault_abort_lost_resets_controller() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), quick_opts());
    let ns = ctrl.namespaces()[0];
    let mut qp = short_timeout_qp(&ctrl);
    let mut other = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    dev.add_fault(rule(
        QueueSel::Io,
        Some(NvmOpcode::Read as u8),
        FaultAction::Drop,
    ));
    dev.add_fault(rule(
        QueueSel::Admin,
        Some(AdminOpcode::Abort as u8),
        FaultAction::Drop,
    ));
    // Keep one command of the other queue pair outstanding across the reset.
    dev.add_fault(FaultRule {
        nsid: None,
        lba: Some(100..101),
        ..rule(
            QueueSel::Io,
            Some(NvmOpcode::Write as u8),
            FaultAction::Drop,
        )
    });
    let b = ctrl.alloc_dma(4096).unwrap();
    qp.read_b(&ns, 0, 1, b.slice(0..512), 1).unwrap();
    other.write_b(&ns, 100, 1, b.slice(512..1024), 7).unwrap();
    other.flush();
    let c = drain(&mut qp);
    assert_eq!(c, vec![Completion::new(1, Err(IoError::Timeout))]);
    assert_eq!(ctrl.resets(), 1);
    let c = drain(&mut other);
    assert_eq!(c, vec![Completion::new(7, Err(IoError::ControllerReset))]);
    assert_eq!(dev.stats().resets, 1);
    for q in [&mut qp, &mut other] {
        q.read_b(&ns, 0, 1, b.slice(0..512), 9).unwrap();
        assert_eq!(drain(q)[0].result, Ok(0), "queue pair works after reset");
    }
}

/// The abort fails with an error status: reset as well.
#[test]
fn fault_abort_error_resets_controller() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), quick_opts());
    let ns = ctrl.namespaces()[0];
    let mut qp = short_timeout_qp(&ctrl);
    dev.add_fault(rule(
        QueueSel::Io,
        Some(NvmOpcode::Read as u8),
        FaultAction::Drop,
    ));
    dev.add_fault(rule(
        QueueSel::Admin,
        Some(AdminOpcode::Abort as u8),
        FaultAction::Status(Status::generic(generic::INTERNAL_ERROR)),
    ));
    let b = ctrl.alloc_dma(512).unwrap();
    qp.read_b(&ns, 0, 1, b.slice(0..512), 1).unwrap();
    assert_eq!(
        drain(&mut qp),
        vec![Completion::new(1, Err(IoError::Timeout))]
    );
    assert_eq!(ctrl.resets(), 1);
    qp.read_b(&ns, 0, 1, b.slice(0..512), 2).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
}

/// Controller fatal status (CSTS.CFS): noticed by the queue pair, reset,
/// outstanding requests fail with ControllerReset, then I/O works.
#[test]
fn fault_controller_fatal_resets() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), quick_opts());
    let ns = ctrl.namespaces()[0];
    let mut qp = short_timeout_qp(&ctrl);
    dev.add_fault(FaultRule {
        skip: 2,
        ..rule(QueueSel::Io, None, FaultAction::Fatal)
    });
    let b = ctrl.alloc_dma(8 * 512).unwrap();
    submit_reads(&mut qp, &ns, &b, 6u64);
    let c = drain(&mut qp);
    assert_eq!(c.len(), 6, "every request completes");
    let ok = c.iter().filter(|c| c.result.is_ok()).count();
    let reset = c
        .iter()
        .filter(|c| c.result == Err(IoError::ControllerReset))
        .count();
    assert_eq!(ok, 2);
    assert_eq!(reset, 4);
    assert_eq!(ctrl.resets(), 1);
    qp.read_b(&ns, 0, 1, b.slice(0..512), 9).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
}

/// A controller that stops answering altogether (no CFS): commands time
/// out, the abort times out, reset brings it back.
#[test]
fn fault_frozen_controller_recovers() {
    let (dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), quick_opts());
    let ns = ctrl.namespaces()[0];
    let mut qp = short_timeout_qp(&ctrl);
    let b = ctrl.alloc_dma(4 * 512).unwrap();
    dev.add_fault(rule(QueueSel::Io, None, FaultAction::Freeze));
    submit_reads(&mut qp, &ns, &b, 4u64);
    let c = drain(&mut qp);
    assert_eq!(c.len(), 4);
    assert!(c.iter().all(|c| c.result.is_err()));
    assert!(c.iter().any(|c| c.result == Err(IoError::Timeout)));
    assert_eq!(ctrl.resets(), 1);
    qp.read_b(&ns, 0, 1, b.slice(0..512), 9).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
}

/// Bring-up against a controller that never answers an admin command: a
/// clear timeout error, bounded by the admin timeout.
#[test]
fn bring_up_against_silent_controller_fails_cleanly() {
    let dev = SoftDevice::new(ram_cfg(9, 1 << 20, 1)).unwrap();
    dev.add_fault(FaultRule {
        count: None,
        ..rule(
            QueueSel::Admin,
            Some(AdminOpcode::Identify as u8),
            FaultAction::Drop,
        )
    });
    let err = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev, SoftMode::Inline)),
        quick_opts(),
    )
    .err()
    .expect("must fail");
    assert!(matches!(err, pollux_pcie::Error::Timeout { .. }), "{err}");
}

/// Admin passthrough and log pages through the controller handle.
#[test]
fn admin_passthrough_and_smart_log() {
    let (_dev, ctrl) = open(ram_cfg(9, 4 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let b = ctrl.alloc_dma(4096).unwrap();
    for i in 0..10 {
        qp.write_b(&ns, i * 8, 8, b.full(), i).unwrap();
    }
    drain(&mut qp);
    let smart = ctrl
        .get_log_page(pollux_spec::log::lid::SMART, 0xFFFF_FFFF, 512)
        .unwrap();
    let host_writes = u128::from_le_bytes(smart[80..96].try_into().unwrap());
    assert_eq!(host_writes, 10);
    let nq = ctrl
        .get_features(pollux_spec::features::fid::NUMBER_OF_QUEUES, 0)
        .unwrap();
    assert_eq!((nq & 0xFFFF) + 1, ctrl.io_queues() as u32);
    // A vendor-specific opcode: refused by the checked passthrough, and
    // the emulated controller does not know it.
    let e = ctrl
        .admin(pollux_spec::Sqe::new(0xC5, 0), None)
        .unwrap_err();
    assert!(e.to_string().contains("vendor-specific"), "{e}");
    // SAFETY: no data, and the emulated controller moves none for an
    // opcode it does not know.
    let (bad, _) = unsafe { ctrl.admin_unchecked(pollux_spec::Sqe::new(0xC5, 0), None) }.unwrap();
    assert!(bad.status().is(0, generic::INVALID_OPCODE));
}

/// Threaded mode: the controller on its own device thread, many I/Os.
#[test]
fn threaded_device_many_ios() {
    let dev = SoftDevice::new(ram_cfg(9, 8 << 20, 1)).unwrap();
    let th = pollux_softnvme::DeviceThread::spawn(None).unwrap();
    th.attach(dev.clone());
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Threaded)),
        ControllerOptions::default(),
    )
    .unwrap();
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 32,
            ..QpairOptions::default()
        })
        .unwrap();
    let b = ctrl.alloc_dma(32 * 4096).unwrap();
    let total = 20_000u64;
    let mut submitted = 0u64;
    for s in 0..32u64 {
        qp.read_b(
            &ns,
            s * 8,
            8,
            b.slice(s as usize * 4096..(s as usize + 1) * 4096),
            s,
        )
        .unwrap();
        submitted += 1;
    }
    let mut done = 0u64;
    while done < total {
        qp.poll(u32::MAX, |sub, c| {
            assert_eq!(c.result, Ok(0));
            done += 1;
            if submitted < total {
                submitted += 1;
                let s = c.user_data as usize;
                sub.read_b(
                    &ns,
                    (submitted % 1000) * 8,
                    8,
                    b.slice(s * 4096..(s + 1) * 4096),
                    c.user_data,
                )
                .unwrap();
            }
        });
    }
    assert_eq!(dev.stats().reads, total);
    drop(qp);
    drop(ctrl);
    th.detach(&dev);
}

/// Dropping the controller shuts it down in order: CC.SHN = normal,
/// CSTS.SHST = complete observed, then disabled (CSTS.RDY = 0).
#[test]
fn orderly_shutdown_on_drop() {
    let (dev, ctrl) = open(ram_cfg(9, 1 << 20, 1), ControllerOptions::default());
    let qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let (bar, _) = dev.bar0();
    let rd = |off: usize| {
        // SAFETY: test reads of the emulated BAR0, 4-byte aligned, in range.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(bar.as_ptr().add(off).cast()) }
            .load(std::sync::atomic::Ordering::Acquire)
    };
    let csts = pollux_spec::regs::Csts(rd(pollux_spec::regs::off::CSTS));
    assert!(csts.rdy());
    drop(qp);
    drop(ctrl);
    let cc = pollux_spec::regs::Cc(rd(pollux_spec::regs::off::CC));
    let csts = pollux_spec::regs::Csts(rd(pollux_spec::regs::off::CSTS));
    assert!(!cc.en(), "disabled after shutdown");
    assert_eq!(
        cc.shn(),
        pollux_spec::regs::shn::NORMAL,
        "normal shutdown was requested"
    );
    assert!(!csts.rdy());
    assert!(!csts.cfs());
}

/// SQ doorbell batching (batch 8): ring when 8 new commands wait, or when
/// the controller holds fewer than 8 (so it never starves). The inline
/// device is not stepped here, so what it holds stays put.
#[test]
fn sq_doorbell_batching() {
    let (_dev, ctrl) = open(
        ram_cfg(9, 1 << 20, 1),
        ControllerOptions {
            shadow_doorbells: false,
            ..ControllerOptions::default()
        },
    );
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 32,
            sq_doorbell_batch: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let b = ctrl.alloc_dma(32 * 512).unwrap();
    let mut next = 0u64;
    let mut submit = |qp: &mut QueuePair, n: u64| {
        for _ in 0..n {
            let s = next as usize;
            qp.read_b(&ns, next, 1, b.slice(s * 512..(s + 1) * 512), next)
                .unwrap();
            next += 1;
        }
    };
    let rings = |qp: &QueuePair| qp.stats().sq_doorbells;
    submit(&mut qp, 4);
    qp.poll(0, |_, _| {});
    assert_eq!(rings(&qp), 1, "controller holds 0 < 8: ring");
    submit(&mut qp, 4);
    qp.poll(0, |_, _| {});
    assert_eq!(rings(&qp), 2, "controller holds 4 < 8: ring");
    submit(&mut qp, 4);
    qp.poll(0, |_, _| {});
    assert_eq!(rings(&qp), 2, "holds 8, only 4 waiting: wait");
    submit(&mut qp, 4);
    qp.poll(0, |_, _| {});
    assert_eq!(rings(&qp), 3, "8 waiting: ring");
    assert_eq!(drain(&mut qp).len(), 16);
}

/// A deallocate that has to wait in the software queue still deallocates;
/// a raw DSM command that waits is sent exactly as given (the queue must
/// not confuse the two, whatever the raw command's dwords hold).
#[test]
fn queued_deallocate_and_raw_dsm_stay_distinct() {
    let (_dev, ctrl) = open(ram_cfg(9, 1 << 20, 1), ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 1,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = ctrl.alloc_dma(8192).unwrap();
    w.as_mut_slice().fill(0x5A);
    qp.write_b(&ns, 64, 16, w.full(), 1).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    // Occupy the only tracker, then queue both.
    qp.read_b(&ns, 0, 1, w.slice(0..512), 2).unwrap();
    qp.deallocate(&ns, 64, 16, 3).unwrap();
    let mut raw = pollux_spec::Sqe::dsm(ns.nsid(), 1, pollux_spec::cmd::DSM_ATTR_DEALLOCATE, 0);
    raw.cdw15 = u32::MAX;
    qp.raw_b(raw, None, 4).unwrap();
    assert_eq!(qp.queued(), 2);
    let mut c = drain(&mut qp);
    c.sort_by_key(|c| c.user_data);
    assert_eq!(c[0].result, Ok(0));
    assert_eq!(c[1].result, Ok(0), "queued deallocate");
    assert!(
        c[2].result.is_err(),
        "raw DSM without a range buffer must fail at the controller: {:?}",
        c[2]
    );
    let r = ctrl.alloc_dma(8192).unwrap();
    qp.read_b(&ns, 64, 16, r.full(), 5).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    assert!(
        r.as_slice().iter().all(|&b| b == 0),
        "deallocated blocks read zero"
    );
}
