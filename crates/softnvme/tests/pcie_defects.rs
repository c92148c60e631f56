//! Regression tests for defects found when the driver was used as a hostile
//! user would (issue "One host core for every transport"). Each failed
//! before its fix. Inline (deterministic) emulated controller.
// The borrowed-buffer helpers, shared with pollux-pcie's hardware tests.
#[path = "../../pcie/tests/common/mod.rs"]
mod borrowed;
use borrowed::Borrowed;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pollux_pcie::{Completion, Controller, ControllerOptions, IoError, QpairOptions, QueuePair};
use pollux_softnvme::{
    BackendConfig, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig, SoftDevice,
};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::{AdminOpcode, NvmOpcode};

fn cfg(mdts: u8, size: u64) -> SoftConfig {
    SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: 9,
            size_bytes: size,
        }],
        mdts,
        ..SoftConfig::default()
    }
}

fn open(cfg: SoftConfig) -> (Arc<SoftDevice>, Controller) {
    open_with(cfg, Duration::from_millis(300))
}

fn open_with(cfg: SoftConfig, admin_timeout: Duration) -> (Arc<SoftDevice>, Controller) {
    let dev = SoftDevice::new(cfg).expect("soft device");
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions {
            admin_timeout,
            ..ControllerOptions::default()
        },
    )
    .expect("bring-up");
    (dev, ctrl)
}

fn fill(buf: &mut [u8], seed: u64) {
    let mut x = seed | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    qp.drain(Duration::from_secs(20), |_, c| out.push(c))
        .expect("drain");
    out
}

/// A 1 MiB request on a controller with an 8 KiB MDTS (128 commands) at
/// queue depth 1 and 4: the pieces wait for trackers and the request
/// completes once, with the data. Before: refused with "request needs 128
/// commands but the queue pair only has 1 slots".
#[test]
fn split_larger_than_depth_waits_and_moves_the_data() {
    let (_dev, ctrl) = open(cfg(1, 8 << 20));
    let ns = ctrl.namespaces()[0];
    assert_eq!(ctrl.max_transfer(), 8192);
    let mut w = ctrl.alloc_dma(1 << 20).unwrap();
    fill(w.as_mut_slice(), 42);
    let nlb = (1u32 << 20) >> ns.lba_shift();
    for depth in [1u16, 4] {
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth,
                ..QpairOptions::default()
            })
            .unwrap();
        let lba = depth as u64 * 2048;
        qp.write_b(&ns, lba, nlb, w.full(), 1).unwrap();
        // A second request behind it waits its turn and keeps its order.
        let r = ctrl.alloc_dma(1 << 20).unwrap();
        qp.read_b(&ns, lba, nlb, r.full(), 2).unwrap();
        let done = drain(&mut qp);
        assert_eq!(
            done,
            vec![Completion::new(1, Ok(0)), Completion::new(2, Ok(0))],
            "depth {depth}"
        );
        assert!(r.as_slice() == w.as_slice(), "depth {depth}: data differs");
        assert_eq!(qp.stats().submitted, 256, "two requests of 128 commands");
    }
}

/// A handler that resubmits every completion (as `pollux perf` does) across
/// a controller reset: every request completes exactly once, the reset
/// happens once, and the queue pair goes on working. Before: the
/// resubmissions were written into queues about to be re-created, were lost,
/// timed out, and reset the controller again, forever.
#[test]
fn reset_with_resubmitting_handler_loses_nothing() {
    let (dev, ctrl) = open(cfg(5, 4 << 20));
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 8,
            timeout: Some(Duration::from_millis(100)),
            ..QpairOptions::default()
        })
        .unwrap();
    let buf = ctrl.alloc_dma(8 * 512).unwrap();
    // One read is lost and its abort too: timeout, abort, reset.
    dev.add_fault(FaultRule {
        queue: QueueSel::Io,
        opcode: Some(NvmOpcode::Read as u8),
        nsid: None,
        lba: Some(3..4),
        skip: 0,
        count: Some(1),
        action: FaultAction::Drop,
    });
    dev.add_fault(FaultRule {
        queue: QueueSel::Admin,
        opcode: Some(AdminOpcode::Abort as u8),
        nsid: None,
        lba: None,
        skip: 0,
        count: Some(1),
        action: FaultAction::Drop,
    });
    let mut next = 0u64;
    for slot in 0..8u64 {
        let s = slot as usize * 512;
        qp.read_b(&ns, next % 64, 1, buf.slice(s..s + 512), next)
            .unwrap();
        next += 1;
    }
    // Resubmit until 2000 completions after the reset (so requests are
    // being resubmitted while the reset is recovered from), then drain.
    let mut seen: HashMap<u64, Result<u32, IoError>> = HashMap::new();
    let mut dup = 0;
    let mut after_reset = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while (seen.len() as u64) < next && std::time::Instant::now() < deadline {
        let resets = ctrl.resets();
        qp.poll(u32::MAX, |sub, c| {
            if seen.insert(c.user_data, c.result).is_some() {
                dup += 1;
            }
            if resets > 0 {
                after_reset += 1;
            }
            if after_reset < 2000 {
                let slot = (c.user_data % 8) as usize * 512;
                // Each request reads into the slot it came from.
                sub.read_b(&ns, next % 64, 1, buf.slice(slot..slot + 512), next)
                    .unwrap();
                next += 1;
            }
        });
        ctrl.relax();
    }
    let total = next;
    assert_eq!(dup, 0, "a request completed twice");
    assert_eq!(seen.len() as u64, total, "requests lost");
    assert_eq!(ctrl.resets(), 1, "one lost command, one reset");
    let failed: Vec<_> = seen.iter().filter(|(_, r)| r.is_err()).collect();
    assert!(
        failed
            .iter()
            .all(|(_, r)| matches!(r, Err(IoError::Timeout) | Err(IoError::ControllerReset))),
        "{failed:?}"
    );
    assert!(
        seen.values().filter(|r| r.is_ok()).count() as u64 >= total - 8,
        "at most the requests outstanding at the reset fail"
    );
    assert_eq!(qp.in_flight(), 0);
}

/// `mem::swap` of two submitters exchanges two borrows; both queue pairs
/// keep working and dropping one leaves the other sound. Before,
/// `QueuePair: DerefMut<Target = Submitter>` let `mem::swap(&mut *a, &mut
/// *b)` move one queue pair's ring pointers into the other: dropping `a`
/// then left `b` writing freed ring memory (a segfault).
#[test]
fn swapping_submitters_is_harmless() {
    let (_dev, ctrl) = open(cfg(5, 4 << 20));
    let ns = ctrl.namespaces()[0];
    let mut a = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut b = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let buf = ctrl.alloc_dma(4096).unwrap();
    {
        let mut sa = a.submitter();
        let mut sb = b.submitter();
        std::mem::swap(&mut sa, &mut sb);
        // `sa` now submits to b, `sb` to a.
        sa.read_b(&ns, 0, 1, buf.slice(0..512), 1).unwrap();
        sb.read_b(&ns, 1, 1, buf.slice(512..1024), 2).unwrap();
    }
    assert_eq!(drain(&mut a)[0].user_data, 2);
    drop(a);
    b.read_b(&ns, 2, 1, buf.slice(1024..1536), 3).unwrap();
    let done = drain(&mut b);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|c| c.result == Ok(0)));
}

/// A handler that swaps the submitter it was handed for one of another
/// queue pair (leaked inside the call, so of exactly the handler's
/// lifetime: invariance cannot refuse it) changes only its own view: the
/// completion loop still applies this queue's CIDs to this queue's
/// trackers. Before, the rest of the poll completed the other queue
/// pair's trackers (here: none busy, so bogus completions) and this queue
/// pair's requests were never delivered.
#[test]
fn handler_swapping_its_submitter_keeps_cids_on_their_queue() {
    let (_dev, ctrl) = open(cfg(5, 4 << 20));
    let ns = ctrl.namespaces()[0];
    let mut a = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut b = Some(ctrl.alloc_qpair(QpairOptions::default()).unwrap());
    for i in 0..4u64 {
        let buf = pollux_pcie::IoBuf::new(ctrl.alloc_dma(512).unwrap()).truncate(512);
        a.read(&ns, i, 1, buf, i).unwrap();
    }
    let mut got = Vec::new();
    let r = a.drain(Duration::from_secs(2), |sub, c| {
        if let Some(q) = b.take() {
            let q: &'static mut QueuePair = Box::leak(Box::new(q));
            let mut other = q.submitter();
            std::mem::swap(sub, &mut other);
        }
        assert!(c.buf.is_some(), "a read's buffer comes back");
        got.push((c.user_data, c.result));
    });
    got.sort_by_key(|g| g.0);
    assert_eq!(got, (0..4).map(|i| (i, Ok(0))).collect::<Vec<_>>());
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(a.stats().bogus_completions, 0);
}

/// A command whose abort loses the race and that then completes
/// successfully did its work: it is reported as a success, not a timeout,
/// even when the controller is reset afterwards (completions posted before
/// a reset are reaped, as Linux does, before the rest fail).
#[test]
fn success_after_timeout_is_a_success() {
    // The read's delay is 20 timeouts long, and the Abort's wait longer
    // still, so a test thread descheduled for a while on a loaded machine
    // still sees the timeout before the read's completion.
    let (dev, ctrl) = open_with(cfg(5, 4 << 20), Duration::from_secs(3));
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            timeout: Some(Duration::from_millis(50)),
            ..QpairOptions::default()
        })
        .unwrap();
    // The read completes (successfully) after its timeout, while the Abort
    // sent for it is lost: the admin command times out and the queue pair
    // resets the controller, with the read's completion already posted.
    dev.add_fault(FaultRule {
        queue: QueueSel::Io,
        opcode: Some(NvmOpcode::Read as u8),
        nsid: None,
        lba: None,
        skip: 0,
        count: Some(1),
        action: FaultAction::Delay(Duration::from_millis(1000)),
    });
    dev.add_fault(FaultRule {
        queue: QueueSel::Admin,
        opcode: Some(AdminOpcode::Abort as u8),
        nsid: None,
        lba: None,
        skip: 0,
        count: Some(1),
        action: FaultAction::Drop,
    });
    let buf = ctrl.alloc_dma(4096).unwrap();
    qp.read_b(&ns, 0, 1, buf.slice(0..512), 5).unwrap();
    let done = drain(&mut qp);
    assert_eq!(qp.stats().timeouts, 1, "it did time out");
    assert_eq!(ctrl.resets(), 1);
    assert_eq!(
        done,
        vec![Completion::new(5, Ok(0))],
        "completed successfully after the timeout"
    );
}

/// A queue pair that submits after another thread reset the controller but
/// before it noticed: the command it wrote fails with `ControllerReset`
/// once it recovers, and its re-created queue starts clean (its shadow
/// doorbell slot cleared again), so nothing stale is executed and later
/// I/O moves the right data. Before, recovery kept the shadow tail that the
/// late submission had published after the controller cleared the page,
/// and the controller fetched entries that were never written.
#[test]
fn submission_between_reset_and_recovery_is_failed_not_replayed() {
    let (dev, ctrl) = open(cfg(5, 4 << 20));
    assert!(ctrl.transport().shadow_doorbells());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = ctrl.alloc_dma(4096).unwrap();
    fill(w.as_mut_slice(), 9);
    let r = ctrl.alloc_dma(4096).unwrap();
    // Move the SQ tail away from 0 first.
    for i in 0..3 {
        qp.write_b(&ns, 0, 8, w.full(), i).unwrap();
    }
    assert_eq!(drain(&mut qp).len(), 3);
    ctrl.reset().unwrap();
    // Submitted before this queue pair polls (and so recovers).
    for i in 10..13 {
        qp.read_b(&ns, 0, 8, r.full(), i).unwrap();
    }
    qp.flush();
    let done = drain(&mut qp);
    assert_eq!(done.len(), 3);
    assert!(
        done.iter()
            .all(|c| c.result == Err(IoError::ControllerReset)),
        "{done:?}"
    );
    // Let the controller look at the re-created queue before anything new
    // is submitted: it must find it empty.
    for _ in 0..100 {
        ctrl.relax();
    }
    qp.poll(u32::MAX, |_, c| panic!("nothing is outstanding, yet {c:?}"));
    qp.read_b(&ns, 0, 8, r.full(), 20).unwrap();
    let done = drain(&mut qp);
    assert_eq!(done, vec![Completion::new(20, Ok(0))]);
    assert!(r.as_slice() == w.as_slice());
    assert_eq!(qp.stats().bogus_completions, 0);
    assert_eq!(dev.stats().errors, 0, "the controller saw nothing invalid");
}

/// Resets from another thread while a queue pair keeps doing I/O: however
/// the resets fall against the queue pair's recovery, it ends up working
/// (never failed for good) and every request completes exactly once.
/// Before, recovery recorded the new generation before it took the admin
/// lock: a second reset in that window made the queue pair re-create its
/// queues twice, the second time against queues that existed, and fail
/// for good ("controller has failed").
#[test]
fn resets_racing_recovery_never_fail_the_queue_pair() {
    let dev = SoftDevice::new(cfg(5, 4 << 20)).expect("soft device");
    let th = pollux_softnvme::DeviceThread::spawn(None).unwrap();
    th.attach(dev.clone());
    let ctrl = std::sync::Arc::new(
        pollux_pcie::open(
            Box::new(SoftPlatform::new(dev.clone(), SoftMode::Threaded)),
            ControllerOptions::default(),
        )
        .expect("bring-up"),
    );
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let buf = ctrl.alloc_dma(8 * 512).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resetter = {
        let (ctrl, stop) = (ctrl.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200 {
                ctrl.reset().expect("reset");
                n += 1;
                std::thread::yield_now();
            }
            n
        })
    };
    let mut next = 0u64;
    let mut seen = HashMap::new();
    let mut dup = 0;
    for slot in 0..8usize {
        qp.read_b(
            &ns,
            slot as u64,
            1,
            buf.slice(slot * 512..slot * 512 + 512),
            next,
        )
        .unwrap();
        next += 1;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while (seen.len() as u64) < next && std::time::Instant::now() < deadline {
        let resetting = !resetter.is_finished();
        qp.poll(u32::MAX, |sub, c| {
            if seen.insert(c.user_data, c.result).is_some() {
                dup += 1;
            }
            assert_ne!(c.result, Err(IoError::ControllerFailed), "failed for good");
            if resetting {
                let slot = (c.user_data % 8) as usize * 512;
                sub.read_b(&ns, next % 64, 1, buf.slice(slot..slot + 512), next)
                    .unwrap();
                next += 1;
            }
        });
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let resets = resetter.join().unwrap();
    assert_eq!(dup, 0);
    assert_eq!(seen.len() as u64, next, "requests lost");
    assert!(!ctrl.is_failed());
    // Still working after the storm of resets.
    qp.read_b(&ns, 0, 1, buf.slice(0..512), 999).unwrap();
    let done = drain(&mut qp);
    assert_eq!(
        done,
        vec![Completion::new(999, Ok(0))],
        "after {resets} resets"
    );
}

/// A namespace of one controller used on a queue pair of another is
/// refused: the transfer length comes from the namespace's block size,
/// and the other controller's namespace of the same NSID has its own.
/// Here controller A's namespace 1 has 512-byte blocks and B's 4 KiB: a
/// one-block read into a 512-byte buffer made B transfer 4 KiB, over the
/// seven 512-byte buffers after it. Before: accepted, and the controller
/// wrote all seven (which safe code owned).
#[test]
fn namespace_of_another_controller_is_refused() {
    let ram = |lba_shift: u8| SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift,
            size_bytes: 1 << 20,
        }],
        ..SoftConfig::default()
    };
    let (_dev_a, a) = open(ram(9));
    let (_dev_b, b) = open(ram(12));
    let ns_a = a.namespaces()[0];
    let ns_b = b.namespaces()[0];
    assert_eq!((ns_a.nsid(), ns_a.lba_size()), (1, 512));
    assert_eq!((ns_b.nsid(), ns_b.lba_size()), (1, 4096));
    let mut qp = b.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = pollux_pcie::IoBuf::new(b.alloc_dma(4096).unwrap()).truncate(4096);
    w.as_mut_slice().fill(0x5A);
    qp.write(&ns_b, 0, 1, w, 1).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));

    let mut pieces = pollux_pcie::IoBuf::new(b.alloc_dma(4096).unwrap()).chunks(512);
    for p in pieces.iter_mut() {
        p.as_mut_slice().fill(0xEE);
    }
    let first = pieces.remove(0);
    let r = qp.read(&ns_a, 0, 1, first, 2);
    for _ in 0..100 {
        b.relax();
    }
    let done = drain(&mut qp);
    for (i, p) in pieces.iter().enumerate() {
        assert!(
            p.as_slice().iter().all(|&x| x == 0xEE),
            "buffer {} after the 512-byte one was written by the controller",
            i + 1
        );
    }
    let e = r.expect_err("a namespace of another controller is refused");
    assert_eq!(
        e.error,
        pollux_pcie::SubmitError::ForeignNamespace { nsid: 1 }
    );
    assert!(e.buf.is_some(), "the buffer comes back");
    assert!(done.is_empty(), "nothing was sent");
    // Each controller's own namespace still works on its own queue pairs,
    // and B's namespace is refused on A's.
    let mut qa = a.alloc_qpair(QpairOptions::default()).unwrap();
    let buf = pollux_pcie::IoBuf::new(a.alloc_dma(4096).unwrap()).truncate(512);
    let e = qa.read(&ns_b, 0, 1, buf, 3).unwrap_err();
    assert!(
        e.to_string()
            .contains("namespace 1 is not a namespace of this"),
        "{e}"
    );
    qa.read(&ns_a, 0, 1, e.buf.unwrap(), 4).unwrap();
    assert_eq!(drain(&mut qa)[0].result, Ok(0));
    assert_eq!(
        qa.deallocate(&ns_b, 0, 1, 5),
        Err(pollux_pcie::SubmitError::ForeignNamespace { nsid: 1 })
    );
}

/// A second controller on an emulated device that a first one drives is
/// refused before it touches the device, and the first goes on working;
/// once the first is gone the device opens again. Before: the second
/// bring-up disabled the device under the first (then failed on
/// overlapping IOVAs, or succeeded and left the first running on queues
/// the device no longer had).
#[test]
fn second_controller_on_one_emulated_device_is_refused() {
    let (dev, ctrl) = open(cfg(5, 4 << 20));
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = ctrl.alloc_dma(4096).unwrap();
    fill(w.as_mut_slice(), 11);
    qp.write_b(&ns, 0, 8, w.full(), 1).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));

    let err = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Inline)),
        ControllerOptions::default(),
    )
    .err()
    .expect("a second controller on the same device is refused");
    assert!(
        err.to_string()
            .contains("already driven by another host controller"),
        "{err}"
    );
    // The first controller was not disturbed.
    let r = ctrl.alloc_dma(4096).unwrap();
    qp.read_b(&ns, 0, 8, r.full(), 2).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    assert!(r.as_slice() == w.as_slice());
    assert_eq!(ctrl.resets(), 0);
    assert_eq!(dev.stats().resets, 0, "the device was not reset");

    drop((qp, ctrl));
    let again = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev, SoftMode::Inline)),
        ControllerOptions::default(),
    )
    .expect("the device opens again once its controller is gone");
    assert_eq!(again.namespaces().len(), 1);
}

/// An emulated controller whose CC.EN=0 can time out (CAP.TO 500 ms).
fn hang_cfg() -> SoftConfig {
    SoftConfig {
        cap_to: 1,
        ..cfg(5, 4 << 20)
    }
}

/// A read sent to the controller (written to its SQ, doorbell rung) that
/// the inline device has not run yet, of 4 KiB at LBA 0, where `seed`'s
/// pattern was written first.
fn pending_read(ctrl: &Controller, qp: &mut QueuePair, seed: u64) {
    let ns = ctrl.namespaces()[0];
    let mut w = ctrl.alloc_dma(4096).unwrap();
    fill(w.as_mut_slice(), seed);
    qp.write_b(&ns, 0, 8, w.full(), 1).unwrap();
    assert_eq!(drain(qp)[0].result, Ok(0));
    let buf = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap());
    qp.read(&ns, 0, 8, buf, 2).unwrap();
    qp.flush();
}

/// A controller that fails without stopping: it hangs with a read
/// outstanding and never answers the reset's CC.EN=0 (CSTS.RDY stays 1),
/// so the reset fails and the read fails with `ControllerFailed` — but
/// the controller may still run it. Its buffer must not come back with
/// that completion: the controller, back from its hang, would write the
/// data into memory its owner holds through a safe slice. Before: the
/// buffer came back, and the resumed controller overwrote what its owner
/// had written there.
#[test]
fn controller_failed_without_stopping_keeps_buffers_from_their_owners() {
    let (dev, ctrl) = open(hang_cfg());
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            ..QpairOptions::default()
        })
        .unwrap();
    pending_read(&ctrl, &mut qp, 21);
    dev.hang();
    let e = ctrl
        .reset()
        .expect_err("a hung controller cannot be disabled");
    assert!(e.to_string().contains("CSTS.RDY=0"), "{e}");
    assert!(ctrl.is_failed());
    assert!(ctrl.may_still_transfer());
    let mut got = Vec::new();
    qp.poll(u32::MAX, |_, c| got.push(c));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].result, Err(IoError::ControllerFailed));
    let held = got.pop().and_then(|c| c.buf).map(|mut b| {
        b.as_mut_slice().fill(0xEE);
        b
    });
    // Back from its hang, the controller runs the read it had.
    dev.resume();
    for _ in 0..64 {
        dev.step();
    }
    if let Some(b) = &held {
        assert!(
            b.as_slice().iter().all(|&x| x == 0xEE),
            "the controller wrote into a buffer its owner holds"
        );
    }
    assert!(held.is_none(), "buffer handed back to its owner");
    let st = qp.stats();
    assert_eq!((st.withheld_buffers, st.withheld_bytes), (1, 4096));
    // With an IOMMU the buffer was unmapped before it was freed: the read
    // found no memory there.
    assert_eq!(dev.stats().bytes_read, 0, "the read moved no data");
}

/// The same without an IOMMU (as under uio_pci_generic): the withheld
/// buffer stays allocated and mapped, handed out to nobody, so the read
/// the resumed controller runs lands in memory nobody uses.
#[test]
fn without_iommu_a_withheld_buffer_stays_allocated_for_the_device() {
    let dev = SoftDevice::new(hang_cfg()).unwrap();
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new_without_iommu(
            dev.clone(),
            SoftMode::Inline,
        )),
        ControllerOptions {
            admin_timeout: Duration::from_millis(300),
            ..ControllerOptions::default()
        },
    )
    .unwrap();
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            ..QpairOptions::default()
        })
        .unwrap();
    pending_read(&ctrl, &mut qp, 22);
    let platform = ctrl.transport().platform().clone();
    let before = platform.quarantined_bytes();
    dev.hang();
    ctrl.reset()
        .expect_err("a hung controller cannot be disabled");
    let mut got = Vec::new();
    qp.poll(u32::MAX, |_, c| got.push(c));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].result, Err(IoError::ControllerFailed));
    assert!(got[0].buf.is_none(), "buffer handed back to its owner");
    assert_eq!(platform.quarantined_bytes() - before, 4096);
    dev.resume();
    for _ in 0..64 {
        dev.step();
    }
    assert_eq!(
        dev.stats().bytes_read,
        4096,
        "the resumed controller ran the read into the quarantined buffer"
    );
}

/// A queue pair dropped while its controller hangs with a read
/// outstanding: the deletion fails (the admin commands time out; the
/// controller drops them when it comes back), so the queue pair's memory
/// — the read's buffer, its rings — goes while the controller may still
/// use it. Without an IOMMU that memory stays allocated (quarantined) and
/// the resumed controller runs its queue in it; with an IOMMU it was
/// unmapped, and the resumed controller goes fatal instead of touching it.
#[test]
fn queue_pair_dropped_after_failed_deletion_leaves_nothing_freed_under_the_device() {
    for iommu in [false, true] {
        let dev = SoftDevice::new(hang_cfg()).unwrap();
        let platform = if iommu {
            SoftPlatform::new(dev.clone(), SoftMode::Inline)
        } else {
            SoftPlatform::new_without_iommu(dev.clone(), SoftMode::Inline)
        };
        let ctrl = pollux_pcie::open(
            Box::new(platform),
            ControllerOptions {
                admin_timeout: Duration::from_millis(200),
                ..ControllerOptions::default()
            },
        )
        .unwrap();
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth: 4,
                ..QpairOptions::default()
            })
            .unwrap();
        pending_read(&ctrl, &mut qp, 23);
        let platform = ctrl.transport().platform().clone();
        let before = platform.quarantined_bytes();
        for opc in [AdminOpcode::DeleteIoSq, AdminOpcode::DeleteIoCq] {
            dev.add_fault(FaultRule {
                opcode: Some(opc as u8),
                ..FaultRule::new(QueueSel::Admin, FaultAction::Drop)
            });
        }
        dev.hang();
        drop(qp); // Delete I/O SQ and CQ time out
        let kept = platform.quarantined_bytes() - before;
        dev.resume();
        for _ in 0..64 {
            dev.step();
        }
        let st = dev.stats();
        if iommu {
            assert_eq!(kept, 0);
            assert_eq!(st.bytes_read, 0, "iommu: the read did not run");
            let csts = ctrl.csts().unwrap();
            assert!(csts.cfs(), "iommu: resumed on unmapped queues: fatal");
        } else {
            // The read's buffer, the SQ and CQ rings and the PRP lists.
            assert!(kept >= 4 * 4096, "no iommu: {kept} bytes quarantined");
            assert_eq!(st.bytes_read, 4096, "no iommu: the read ran");
            assert!(!ctrl.csts().unwrap().cfs());
        }
    }
}
