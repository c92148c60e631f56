//! The safe buffer model: an `IoBuf` goes to the queue pair with its
//! request and comes back in the completion (or with the refusal), on
//! every path: one command, split, waiting in the backlog, failed by a
//! controller reset. Inline (deterministic) emulated controller.
use std::sync::Arc;
use std::time::Duration;

use pollux_pcie::{
    Completion, Controller, ControllerOptions, IoBuf, IoError, QpairOptions, QueuePair, SubmitError,
};
use pollux_softnvme::{
    BackendConfig, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig, SoftDevice,
};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::NvmOpcode;

fn open(mdts: u8) -> (Arc<SoftDevice>, Controller) {
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: 9,
            size_bytes: 8 << 20,
        }],
        mdts,
        ..SoftConfig::default()
    })
    .expect("soft device");
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions {
            admin_timeout: Duration::from_millis(300),
            ..ControllerOptions::default()
        },
    )
    .expect("bring-up");
    (dev, ctrl)
}

fn buf(ctrl: &Controller, len: usize) -> IoBuf {
    IoBuf::new(ctrl.alloc_dma(len).unwrap()).truncate(len)
}

fn fill(b: &mut [u8], seed: u8) {
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(31).wrapping_add(seed);
    }
}

fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    qp.drain(Duration::from_secs(20), |_, c| out.push(c))
        .expect("drain");
    out.sort_by_key(|c| c.user_data);
    out
}

#[test]
fn write_then_read_hands_each_buffer_back_with_its_data() {
    let (_dev, ctrl) = open(5);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = buf(&ctrl, 4096);
    fill(w.as_mut_slice(), 7);
    qp.write(&ns, 8, 8, w, 1).unwrap();
    let done = drain(&mut qp);
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].result, Ok(0));
    let w = done
        .into_iter()
        .next()
        .unwrap()
        .buf
        .expect("write buffer back");
    let r = buf(&ctrl, 4096);
    qp.read(&ns, 8, 8, r, 2).unwrap();
    let done = drain(&mut qp);
    let r = done
        .into_iter()
        .next()
        .unwrap()
        .buf
        .expect("read buffer back");
    assert_eq!(r.len(), 4096);
    assert!(r.as_slice() == w.as_slice());
}

/// One allocation cut into disjoint pieces, all in flight at once, some
/// waiting in the backlog (depth 2): every piece comes back, once, with
/// the data of its own LBAs.
#[test]
fn pieces_of_one_allocation_in_flight_together() {
    let (_dev, ctrl) = open(5);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut pieces = IoBuf::new(ctrl.alloc_dma(8 * 512).unwrap()).chunks(512);
    assert_eq!(pieces.len(), 8);
    for (i, p) in pieces.iter_mut().enumerate() {
        fill(p.as_mut_slice(), i as u8);
    }
    for (i, p) in pieces.into_iter().enumerate() {
        qp.write(&ns, 100 + i as u64, 1, p, i as u64).unwrap();
    }
    assert!(qp.queued() > 0, "depth 2: the rest wait");
    let back = drain(&mut qp);
    assert_eq!(back.len(), 8);
    let reads = IoBuf::new(ctrl.alloc_dma(8 * 512).unwrap()).chunks(512);
    for (i, p) in reads.into_iter().enumerate() {
        qp.read(&ns, 100 + i as u64, 1, p, i as u64).unwrap();
    }
    for (i, c) in drain(&mut qp).into_iter().enumerate() {
        assert_eq!(c.user_data, i as u64);
        let mut want = vec![0u8; 512];
        fill(&mut want, i as u8);
        assert!(
            c.buf.expect("buffer back").as_slice() == want.as_slice(),
            "LBA {}",
            100 + i
        );
    }
}

/// A refused request hands its buffer back with the error.
#[test]
fn refused_request_returns_the_buffer() {
    let (_dev, ctrl) = open(5);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let b = buf(&ctrl, 1024);
    let probe = b.dma_slice().iova0();
    let r = qp.read(&ns, 0, 1, b, 1).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::BufferLength {
            expected: 512,
            got: 1024
        }
    );
    let b = r.buf.expect("buffer back");
    assert_eq!(b.dma_slice().iova0(), probe);
    let r = qp
        .write(&ns, ns.nsze(), 2, b.truncate(1024), 2)
        .unwrap_err();
    assert!(
        matches!(r.error, SubmitError::LbaOutOfRange { .. }),
        "{}",
        r.error
    );
    assert!(r.buf.is_some());
}

/// A split request (1 MiB over an 8 KiB MDTS at depth 2) hands its buffer
/// back once, when its last piece completes.
#[test]
fn split_request_hands_back_its_buffer_once() {
    let (_dev, ctrl) = open(1);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = buf(&ctrl, 1 << 20);
    fill(w.as_mut_slice(), 3);
    qp.write(&ns, 0, 2048, w, 1).unwrap();
    qp.read(&ns, 0, 2048, buf(&ctrl, 1 << 20), 2).unwrap();
    let done = drain(&mut qp);
    assert_eq!(done.len(), 2);
    let w = done[0].buf.as_ref().expect("write buffer back");
    let r = done[1].buf.as_ref().expect("read buffer back");
    assert!(done.iter().all(|c| c.result == Ok(0)));
    assert!(r.as_slice() == w.as_slice());
}

/// Requests failed by a controller reset hand their buffers back too, and
/// so does one waiting in the backlog once it is issued after the reset.
#[test]
fn buffers_come_back_across_a_reset() {
    let (dev, ctrl) = open(5);
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    // Both reads are lost: only a reset gets them back.
    dev.add_fault(FaultRule {
        queue: QueueSel::Io,
        opcode: Some(NvmOpcode::Read as u8),
        nsid: None,
        lba: None,
        skip: 0,
        count: Some(2),
        action: FaultAction::Drop,
    });
    for i in 0..3u64 {
        qp.read(&ns, i, 1, buf(&ctrl, 512), i).unwrap();
    }
    qp.flush();
    for _ in 0..100 {
        qp.poll(u32::MAX, |_, _| {
            panic!("nothing completes before the reset")
        });
        ctrl.relax();
    }
    ctrl.reset().unwrap();
    let done = drain(&mut qp);
    assert_eq!(done.len(), 3);
    assert_eq!(done[0].result, Err(IoError::ControllerReset));
    assert_eq!(done[1].result, Err(IoError::ControllerReset));
    assert_eq!(done[2].result, Ok(0), "the waiting one ran after the reset");
    assert!(done
        .iter()
        .all(|c| c.buf.as_ref().is_some_and(|b| b.len() == 512)));
}

/// Reads and Writes are written into the SQ field by field
/// (`SubmissionQueue::push_rw`) when neither non-temporal SQE copies nor
/// a doorbell per command is on, and as a built `Sqe` otherwise: in each
/// mode every command reaches the controller as sent (its LBA, length,
/// PRPs over one, two and many pages, and FUA in CDW12), and each
/// buffer comes back with its own data.
#[test]
fn reads_and_writes_arrive_whole_in_every_sq_store_mode() {
    let cache = pollux_bdev::Bdev::ram_with_volatile_cache("c0", 512, 16384).unwrap();
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Bdev(cache.clone()),
            lba_shift: 9,
            size_bytes: 16384 * 512,
        }],
        mdts: 5,
        ..SoftConfig::default()
    })
    .expect("soft device");
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions::default(),
    )
    .expect("bring-up");
    let ns = ctrl.namespaces()[0];
    let modes = [
        ("field by field", QpairOptions::default()),
        (
            "non-temporal copy",
            QpairOptions {
                nt_sqe_copy: true,
                ..QpairOptions::default()
            },
        ),
        (
            "doorbell per command",
            QpairOptions {
                delayed_sq_doorbell: false,
                ..QpairOptions::default()
            },
        ),
    ];
    let mut qps: Vec<_> = modes
        .iter()
        .map(|(_, o)| ctrl.alloc_qpair(o.clone()).unwrap())
        .collect();
    // 512 B, one page, two pages (PRP2), 16 pages (a PRP list).
    let sizes = [512usize, 4096, 8192, 65536];
    let lba = |m: usize, k: usize| 4096 * m as u64 + 256 * k as u64 + 3;
    for (m, (mode, _)) in modes.iter().enumerate() {
        let qp = &mut qps[m];
        for (k, &len) in sizes.iter().enumerate() {
            let mut w = buf(&ctrl, len);
            fill(w.as_mut_slice(), (m * 16 + k) as u8);
            let nlb = (len / 512) as u32;
            let flags = if k % 2 == 1 {
                pollux_spec::RwFlags::FUA
            } else {
                pollux_spec::RwFlags::NONE
            };
            qp.write_with(&ns, lba(m, k), nlb, w, flags, k as u64)
                .unwrap();
            let done = drain(qp);
            assert_eq!(done.len(), 1, "{mode}");
            assert_eq!(done[0].result, Ok(0), "{mode}");
            // FUA reached the controller: nothing of it is lost with the
            // volatile cache; a plain write's blocks are.
            let lost = cache.lose_volatile_cache().unwrap();
            let want = if k % 2 == 1 { 0 } else { nlb as u64 };
            assert_eq!(lost, want, "{mode}: {len} B write, FUA {}", k % 2 == 1);
        }
    }
    // Each mode reads what the next one wrote: a field both a mode's
    // reads and its writes got wrong the same way shows too.
    for (m, (mode, _)) in modes.iter().enumerate() {
        let from = (m + 1) % modes.len();
        for (k, &len) in sizes.iter().enumerate() {
            let r = buf(&ctrl, len);
            qps[m]
                .read(&ns, lba(from, k), (len / 512) as u32, r, k as u64)
                .unwrap();
            let done = drain(&mut qps[m]);
            let r = done.into_iter().next().unwrap().buf.expect("buffer back");
            let mut want = vec![0u8; len];
            if k % 2 == 1 {
                fill(&mut want, (from * 16 + k) as u8);
            }
            assert!(r.as_slice() == want.as_slice(), "{mode}: {len} B read");
        }
    }
}
