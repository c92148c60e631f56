//! The driver against a real PCIe NVMe controller (QEMU's `-device nvme` in
//! tests/guest), through whichever of vfio-pci / uio_pci_generic it is bound
//! to. Runs only when `POLLUX_PCIE_BDF` names the controller; otherwise
//! every test returns at once (and says so). tests/guest/run-tests.sh runs
//! it in the guest, once per binding, with `--test-threads=1`.
//!
//! `POLLUX_HANDOFF=write:FILE:LBA` / `verify:FILE:LBA` makes
//! `kernel_handoff` write FILE's bytes at LBA / check that the namespace
//! holds them there (the other side is done with `dd` through the kernel
//! nvme driver).
mod common;
use common::Borrowed;
use std::sync::Mutex;
use std::time::Duration;

use pollux_pcie::platform::open_pcie;
use pollux_pcie::{
    Completion, Controller, ControllerOptions, IoError, QpairOptions, QueuePair, SubmitError,
};

/// One controller, one user at a time.
static DEVICE: Mutex<()> = Mutex::new(());

fn bdf() -> Option<String> {
    match std::env::var("POLLUX_PCIE_BDF") {
        Ok(b) if !b.is_empty() => Some(b),
        _ => {
            eprintln!("POLLUX_PCIE_BDF not set: skipping (runs in tests/guest)");
            None
        }
    }
}

fn open(bdf: &str, opts: ControllerOptions) -> Controller {
    let p = open_pcie(bdf).unwrap_or_else(|e| panic!("open {bdf}: {e}"));
    pollux_pcie::open(p, opts).unwrap_or_else(|e| panic!("bring-up of {bdf}: {e}"))
}

fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    qp.drain(Duration::from_secs(60), |_, c| out.push(c))
        .expect("drain");
    out
}

fn pattern(buf: &mut [u8], seed: u64) {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let b = x.to_le_bytes();
        chunk.copy_from_slice(&b[..chunk.len()]);
    }
}

fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

#[test]
fn identify_and_features() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let id = ctrl.identify();
    let mn = pollux_spec::identify::ascii_str(&id.mn);
    let sn = pollux_spec::identify::ascii_str(&id.sn);
    println!(
        "{}: model '{mn}', serial '{sn}', {} I/O queues, max transfer {} KiB, shadow doorbells {}, namespaces {:?}",
        ctrl.describe(),
        ctrl.io_queues(),
        ctrl.max_transfer() >> 10,
        ctrl.transport().shadow_doorbells(),
        ctrl.namespaces()
    );
    assert!(!mn.is_empty());
    if let Ok(want) = std::env::var("POLLUX_PCIE_SERIAL") {
        assert_eq!(sn, want);
    }
    assert!(!ctrl.namespaces().is_empty(), "no active namespace");
    assert!(ctrl.io_queues() >= 4, "want several I/O queues");
    // QEMU's controller offers Doorbell Buffer Config (OACS bit 8).
    assert!(
        ctrl.transport().shadow_doorbells(),
        "Doorbell Buffer Config offered but not configured"
    );
    // SMART / health log through the admin queue.
    let log = ctrl
        .get_log_page(0x02, 0xffff_ffff, 512)
        .expect("SMART log");
    assert_eq!(log.len(), 512);
}

/// Four queue pairs on four threads, sizes 512 B..1 MiB (PRP1 only, PRP2,
/// PRP lists, MDTS splitting), buffers at in-page offsets too; every byte
/// read back and compared.
#[test]
fn read_write_verify_queue_pairs_and_sizes() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let shadow = std::env::var("POLLUX_SHADOW").map_or(true, |v| v != "0");
    let ctrl = open(
        &bdf,
        ControllerOptions {
            shadow_doorbells: shadow,
            ..ControllerOptions::default()
        },
    );
    let ns = ctrl.namespaces()[0];
    let lbs = ns.lba_size() as usize;
    let sizes = [
        512usize,
        4096,
        8192,
        12288,
        64 << 10,
        128 << 10,
        132 << 10,
        512 << 10,
        (512 << 10) + 4096,
        1 << 20,
    ];
    let region = 8u64 << 20; // bytes per thread
    assert!(ns.size_bytes() >= 4 * region + (8 << 20));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let ctrl = &ctrl;
            s.spawn(move || {
                let mut qp = ctrl
                    .alloc_qpair(QpairOptions {
                        depth: 64,
                        ..QpairOptions::default()
                    })
                    .expect("qpair");
                let base_lba = (t * region) / lbs as u64;
                let mut lba = base_lba;
                for (i, &size) in sizes.iter().enumerate() {
                    if size % lbs != 0 {
                        continue;
                    }
                    let nlb = (size / lbs) as u32;
                    // Offset 512 into the page: PRP1 with an offset.
                    for off in [0usize, 512] {
                        let mut w = ctrl.alloc_dma(size + off).unwrap();
                        let seed = t << 32 | (i as u64) << 8 | off as u64;
                        pattern(&mut w.as_mut_slice()[off..], seed);
                        qp.write_b(&ns, lba, nlb, w.slice(off..off + size), 1)
                            .unwrap();
                        let c = drain(&mut qp);
                        assert_eq!(c.len(), 1);
                        assert_eq!(c[0].result, Ok(0), "write {size} B at +{off}");
                        let r = ctrl.alloc_dma(size + off).unwrap();
                        qp.read_b(&ns, lba, nlb, r.slice(off..off + size), 2)
                            .unwrap();
                        let c = drain(&mut qp);
                        assert_eq!(c[0].result, Ok(0), "read {size} B at +{off}");
                        let span = off..off + size;
                        if let Some(d) =
                            first_diff(&r.as_slice()[span.clone()], &w.as_slice()[span])
                        {
                            panic!("qpair {t}: {size} B at +{off}: first difference at byte {d}");
                        }
                        lba += nlb as u64;
                    }
                }
                assert!(lba - base_lba <= region / lbs as u64);
                let st = qp.stats();
                println!("qpair {} (thread {t}): {st:?}", qp.qid());
            });
        }
    });
}

/// More requests than the queue depth: the rest wait in software and all
/// complete; the software queue's bound is reported; oversized requests
/// are refused.
#[test]
fn queue_full() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let lbs = ns.lba_size() as usize;
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = ctrl.alloc_dma(100 * 4096).unwrap();
    pattern(w.as_mut_slice(), 77);
    let per = (4096 / lbs) as u32;
    for i in 0..100u64 {
        let b = w.slice(i as usize * 4096..(i as usize + 1) * 4096);
        qp.write_b(&ns, i * per as u64, per, b, i).unwrap();
    }
    assert_eq!(qp.outstanding(), 4);
    assert_eq!(qp.queued(), 96);
    let c = drain(&mut qp);
    assert_eq!(c.len(), 100);
    let mut ids: Vec<u64> = c.iter().map(|c| c.user_data).collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..100).collect::<Vec<_>>());
    assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
    let r = ctrl.alloc_dma(100 * 4096).unwrap();
    qp.read_b(&ns, 0, 100 * per, r.full(), 1).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    assert!(
        r.as_slice() == w.as_slice(),
        "data written through a full queue differs"
    );

    let mut qp1 = ctrl
        .alloc_qpair(QpairOptions {
            depth: 1,
            max_queued: 2,
            ..QpairOptions::default()
        })
        .unwrap();
    for i in 0..3 {
        qp1.read_b(&ns, 0, per, r.slice(0..4096), i).unwrap();
    }
    assert_eq!(
        qp1.read_b(&ns, 0, per, r.slice(0..4096), 9),
        Err(SubmitError::QueueFull { limit: 2 })
    );
    assert_eq!(drain(&mut qp1).len(), 3);
}

/// With shadow doorbells (Doorbell Buffer Config) the queue pair updates
/// memory instead of ringing MMIO doorbells; without them it rings MMIO.
/// Data is verified both ways. Shadow doorbells are switched per
/// controller: QEMU takes SQ tails and CQ heads from the shadow buffer once
/// it is configured, so a queue pair that skipped the shadow would stall.
#[test]
fn shadow_doorbells_on_and_off() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    for shadow in [true, false] {
        let ctrl = open(
            &bdf,
            ControllerOptions {
                shadow_doorbells: shadow,
                ..ControllerOptions::default()
            },
        );
        assert_eq!(ctrl.transport().shadow_doorbells(), shadow);
        let ns = ctrl.namespaces()[0];
        let per = (4096 / ns.lba_size()) as u64;
        let base = ns.nsze() / 2;
        let mut qp = ctrl
            .alloc_qpair(QpairOptions {
                depth: 16,
                ..QpairOptions::default()
            })
            .unwrap();
        let mut w = ctrl.alloc_dma(64 * 4096).unwrap();
        pattern(w.as_mut_slice(), 5 + shadow as u64);
        for i in 0..64u64 {
            let b = w.slice(i as usize * 4096..(i as usize + 1) * 4096);
            qp.write_b(&ns, base + i * per, per as u32, b, i).unwrap();
        }
        assert!(drain(&mut qp).iter().all(|c| c.result.is_ok()));
        let r = ctrl.alloc_dma(64 * 4096).unwrap();
        for i in 0..64u64 {
            let b = r.slice(i as usize * 4096..(i as usize + 1) * 4096);
            qp.read_b(&ns, base + i * per, per as u32, b, i).unwrap();
        }
        assert!(drain(&mut qp).iter().all(|c| c.result.is_ok()));
        assert!(
            r.as_slice() == w.as_slice(),
            "shadow={shadow}: data differs"
        );
        let st = qp.stats();
        println!("shadow doorbells {shadow}: {st:?}");
        if shadow {
            assert!(st.shadow_updates > 0, "{st:?}");
        } else {
            assert_eq!(st.shadow_updates, 0, "{st:?}");
            assert!(st.sq_doorbells > 0, "{st:?}");
        }
    }
}

/// A controller reset with commands in flight: each completes (done, or
/// failed with ControllerReset), the queue pair re-creates its queues, I/O
/// works again and earlier data is intact. Twice, to cover a reset after
/// recovery.
#[test]
fn controller_reset_and_recovery() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let per = (4096 / ns.lba_size()) as u64;
    let base = ns.nsze() * 3 / 4;
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 32,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut w = ctrl.alloc_dma(32 * 4096).unwrap();
    pattern(w.as_mut_slice(), 99);
    qp.write_b(&ns, base, 32 * per as u32, w.full(), 0).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    let r = ctrl.alloc_dma(32 * 4096).unwrap();
    for round in 1..=2u32 {
        for i in 0..32u64 {
            let b = r.slice(i as usize * 4096..(i as usize + 1) * 4096);
            qp.read_b(&ns, base + i * per, per as u32, b, i).unwrap();
        }
        qp.flush();
        ctrl.reset().expect("reset");
        assert_eq!(ctrl.resets(), round);
        assert!(!ctrl.is_failed());
        let c = drain(&mut qp);
        assert_eq!(c.len(), 32, "every request completes");
        assert!(
            c.iter()
                .all(|c| c.result.is_ok() || c.result == Err(IoError::ControllerReset)),
            "{c:?}"
        );
        let failed = c.iter().filter(|c| c.result.is_err()).count();
        println!("reset {round}: {failed} of 32 in-flight reads failed with ControllerReset");
        // Recovered: the same queue pair works and the data is intact.
        let r2 = ctrl.alloc_dma(32 * 4096).unwrap();
        qp.read_b(&ns, base, 32 * per as u32, r2.full(), 7).unwrap();
        let c = drain(&mut qp);
        assert_eq!(c[0].result, Ok(0));
        assert!(
            r2.as_slice() == w.as_slice(),
            "data differs after reset {round}"
        );
    }
    assert!(qp.stats().resets_seen >= 1);
    // A fresh queue pair after the resets works too.
    let mut qp2 = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let r3 = ctrl.alloc_dma(4096).unwrap();
    qp2.read_b(&ns, base, per as u32, r3.full(), 1).unwrap();
    assert_eq!(drain(&mut qp2)[0].result, Ok(0));
    assert!(r3.as_slice() == &w.as_slice()[..4096]);
}

/// Queue pairs created and deleted on some threads while others do I/O:
/// queue creation/deletion through the admin queue must not disturb the
/// I/O queues that stay.
#[test]
fn queue_pair_churn_alongside_io() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let per = 4096 / ns.lba_size();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let ctrl = &ctrl;
            s.spawn(move || {
                let mut w = ctrl.alloc_dma(4096).unwrap();
                let r = ctrl.alloc_dma(4096).unwrap();
                for round in 0..20u64 {
                    let mut qp = ctrl
                        .alloc_qpair(QpairOptions {
                            depth: 8,
                            timeout: Some(Duration::from_secs(10)),
                            ..QpairOptions::default()
                        })
                        .expect("qpair");
                    for k in 0..(1 + t * 3) {
                        let lba = (t * 1000 + k) * per as u64;
                        pattern(w.as_mut_slice(), t << 16 | round << 8 | k);
                        qp.write_b(&ns, lba, per, w.full(), 1).unwrap();
                        let c = drain(&mut qp);
                        assert_eq!(c[0].result, Ok(0), "thread {t} round {round} write {k}");
                        qp.read_b(&ns, lba, per, r.full(), 2).unwrap();
                        let c = drain(&mut qp);
                        assert_eq!(c[0].result, Ok(0), "thread {t} round {round} read {k}");
                        assert!(
                            r.as_slice() == w.as_slice(),
                            "thread {t} round {round}: data differs"
                        );
                    }
                }
            });
        }
    });
}

/// Write Zeroes commands `wipe_namespace` keeps in flight.
const WIPE_IN_FLIGHT: usize = 4;

/// `POLLUX_WIPE=1`: Write Zeroes over the whole namespace (what `perf
/// --verify` needs: blocks it has not written must read as zeros), then
/// reads a block of every 64 MiB back as zeros.
#[test]
fn wipe_namespace() {
    let Some(bdf) = bdf() else { return };
    if std::env::var("POLLUX_WIPE").as_deref() != Ok("1") {
        eprintln!("POLLUX_WIPE not set: skipping");
        return;
    }
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    // At most WIPE_IN_FLIGHT commands at once. QEMU does a Write Zeroes as
    // fallocate(FALLOC_FL_ZERO_RANGE) on its image file, and the host file
    // system runs those one after another (the first also waits for the
    // file's dirty pages to be written back): with all 32 submitted at
    // once, the last one's latency was the whole wipe's, which on a busy
    // host after the suite's writes passed the 30 s command timeout.
    let mut lba = 0u64;
    let mut n = 0u64;
    let mut c = Vec::new();
    while lba < ns.nsze() || qp.in_flight() > 0 {
        while lba < ns.nsze() && qp.in_flight() < WIPE_IN_FLIGHT {
            let nlb = (ns.nsze() - lba).min(65536) as u32;
            qp.write_zeroes(&ns, lba, nlb, false, n).unwrap();
            lba += nlb as u64;
            n += 1;
        }
        // Every command completes or times out (QpairOptions::timeout).
        qp.poll(u32::MAX, |_, x| c.push(x));
    }
    assert_eq!(c.len() as u64, n);
    assert!(c.iter().all(|c| c.result.is_ok()), "{c:?}");
    let mut buf = ctrl.alloc_dma(4096).unwrap();
    let per = 4096 / ns.lba_size();
    let step = (64u64 << 20) >> ns.lba_shift();
    for lba in (0..ns.nsze()).step_by(step as usize) {
        buf.as_mut_slice().fill(0xa5);
        qp.read_b(&ns, lba, per, buf.full(), 0).unwrap();
        assert_eq!(drain(&mut qp)[0].result, Ok(0));
        assert!(
            buf.as_slice().iter().all(|&b| b == 0),
            "LBA {lba} not zero after Write Zeroes"
        );
    }
    println!("wrote zeroes over {} blocks in {n} commands", ns.nsze());
}

/// Data handed over between pollux and the kernel nvme driver: see the
/// module docs.
#[test]
fn kernel_handoff() {
    let Some(bdf) = bdf() else { return };
    let Ok(spec) = std::env::var("POLLUX_HANDOFF") else {
        eprintln!("POLLUX_HANDOFF not set: skipping");
        return;
    };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let mut it = spec.splitn(3, ':');
    let (Some(mode), Some(file), Some(lba)) = (it.next(), it.next(), it.next()) else {
        panic!("POLLUX_HANDOFF wants write:FILE:LBA or verify:FILE:LBA, got {spec}");
    };
    let lba: u64 = lba.parse().expect("LBA");
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    assert_eq!(data.len() % ns.lba_size() as usize, 0);
    let nlb = (data.len() / ns.lba_size() as usize) as u32;
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut buf = ctrl.alloc_dma(data.len()).unwrap();
    match mode {
        "write" => {
            buf.as_mut_slice()[..data.len()].copy_from_slice(&data);
            qp.write_b(&ns, lba, nlb, buf.slice(0..data.len()), 1)
                .unwrap();
            assert_eq!(drain(&mut qp)[0].result, Ok(0));
            qp.flush_cache(&ns, 2).unwrap();
            assert_eq!(drain(&mut qp)[0].result, Ok(0));
            println!("pollux wrote {} bytes at LBA {lba}", data.len());
        }
        "verify" => {
            qp.read_b(&ns, lba, nlb, buf.slice(0..data.len()), 1)
                .unwrap();
            assert_eq!(drain(&mut qp)[0].result, Ok(0));
            if let Some(d) = first_diff(&buf.as_slice()[..data.len()], &data) {
                panic!("pollux read differs from {file} at byte {d}");
            }
            println!("pollux read {} bytes at LBA {lba}: match", data.len());
        }
        m => panic!("unknown POLLUX_HANDOFF mode {m}"),
    }
}

/// Interrupts: the admin CQ always interrupts on vector 0 (MSI-X with
/// vfio-pci, the INTx pin with uio_pci_generic). Vector 0 is enabled
/// before bring-up, so bring-up's admin commands must raise it. With
/// MSI-X, after an ack every further admin command must raise it again.
/// With INTx the admin queue is polled and releases each entry at once,
/// which withdraws a level interrupt that may not have been delivered yet
/// (seen in the guest), so per-command delivery is checked on an I/O queue
/// pair instead (`io_completion_interrupts`), whose entries stay unreleased
/// until it sleeps. Out-of-range vectors are refused by number.
#[test]
fn admin_completion_interrupts() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let p = open_pcie(&bdf).unwrap_or_else(|e| panic!("open {bdf}: {e}"));
    let n = p.irq_vectors();
    println!("{}: {n} interrupt vectors", p.describe());
    assert!(n >= 1, "{} offers no interrupt vectors", p.describe());
    let e = p.enable_irq(n).expect_err("vector past the last accepted");
    assert!(
        e.to_string()
            .contains(&format!("interrupt vector {n} out of range")),
        "{e}"
    );
    let irq = p.enable_irq(0).expect("enable vector 0");
    // A second handle on the same vector works alongside.
    let irq2 = p.enable_irq(0).expect("enable vector 0 again");
    // Vectors no queue uses (pollux's I/O CQs poll) stay silent.
    let quiet = (n > 1).then(|| p.enable_irq(n - 1).expect("last vector"));
    assert_eq!(p.irq_vectors(), n);

    let ctrl = pollux_pcie::open(p, ControllerOptions::default())
        .unwrap_or_else(|e| panic!("bring-up of {bdf}: {e}"));
    let got = |irq: &pollux_pcie::platform::irq::IrqFd, what: &str| {
        let seen = irq.ack().expect("ack");
        let woke = seen > 0 || irq.wait(Some(Duration::from_secs(5))).expect("wait");
        println!("{what}: {seen} interrupts pending, woke {woke}");
        assert!(woke, "{what}: no admin CQ interrupt on vector 0");
    };
    if n > 1 {
        got(&irq, "bring-up");
    } else {
        // INTx: bring-up's admin commands are polled and each CQ entry is
        // released at once, which withdraws the level interrupt; whether
        // one was delivered first depends on timing (a fresh-clone CI dry
        // run saw none, 1 in 5 runs). Delivery over INTx is checked by
        // `io_completion_interrupts`, whose entries stay unreleased.
        let seen = irq.ack().expect("ack");
        println!("bring-up (INTx, not asserted): {seen} interrupts pending");
    }
    // Both handles share one source: whatever the first consumed is gone
    // for the second (eventfd counter / UIO file), it must not error.
    irq2.ack().expect("ack through the second handle");
    for round in 0..3 {
        let log = ctrl
            .get_log_page(0x02, 0xffff_ffff, 512)
            .expect("SMART log");
        assert_eq!(log.len(), 512);
        if n > 1 {
            got(&irq, &format!("SMART log {round}"));
        }
    }
    if let Some(q) = quiet {
        assert_eq!(q.ack().expect("ack"), 0, "vector {} fired", n - 1);
    }
}

/// An I/O queue pair in interrupt mode: every read is completed by
/// sleeping on the queue pair's interrupt (MSI-X vector with vfio-pci, the
/// INTx line with uio_pci_generic) and then polling, with the data checked.
#[test]
fn io_completion_interrupts() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let ns = ctrl.namespaces()[0];
    let per = 4096 >> ns.lba_shift();
    let base = 3 * ns.nsze() / 4 + 8192;
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            interrupts: true,
            ..QpairOptions::default()
        })
        .unwrap();
    assert!(qp.interrupt_fd().is_some());
    let mut w = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap());
    pattern(w.as_mut_slice(), 7);
    qp.write(&ns, base, per as u32, w, 1).unwrap();
    // Sleep on the interrupt until the completion is there. A wait that
    // times out (5 s) with nothing posted is a lost interrupt; a wake with
    // nothing posted (a spurious or shared one) just waits again.
    let complete = |qp: &mut QueuePair, what: &str| -> Completion {
        let mut got = None;
        let mut timeouts = 0;
        for _ in 0..1_000_000 {
            if qp.wait(Some(Duration::from_secs(5))).unwrap() {
                qp.poll(u32::MAX, |_, c| got = Some(c));
            } else {
                timeouts += 1;
                assert!(timeouts < 2, "{what}: no interrupt within 5 s");
            }
            if let Some(c) = got.take() {
                return c;
            }
        }
        panic!("{what}: a million wake-ups without the completion");
    };
    let w = complete(&mut qp, "write").buf.unwrap();
    let mut r = Some(pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap()));
    for i in 0..50u64 {
        qp.read(&ns, base, per as u32, r.take().unwrap(), i)
            .unwrap();
        let c = complete(&mut qp, &format!("read {i}"));
        assert_eq!((c.user_data, c.result), (i, Ok(0)));
        let b = c.buf.unwrap();
        assert!(b.as_slice() == w.as_slice(), "read {i}: data differs");
        r = Some(b);
    }
}

/// `POLLUX_HOLD=FILE`: brings the controller up, writes FILE once it is
/// up, and holds the controller (one queue pair) until FILE is removed or
/// 300 s pass. The other process of `one_driver_per_controller` and of
/// suite.sh's `pollux perf` refusal.
#[test]
fn hold_device() {
    let Some(bdf) = bdf() else { return };
    let Ok(file) = std::env::var("POLLUX_HOLD") else {
        eprintln!("POLLUX_HOLD not set: skipping");
        return;
    };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let ctrl = open(&bdf, ControllerOptions::default());
    let _qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    std::fs::write(&file, std::process::id().to_string()).expect("ready file");
    let start = std::time::Instant::now();
    while std::path::Path::new(&file).exists() && start.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One driver per controller: while a controller of this process is up, or
/// another process holds the device, a second open is refused, naming the
/// device (under uio_pci_generic also the holder), and the first is left
/// alone (a second bring-up would disable it and reprogram its queues).
/// Once the holder is killed (SIGKILL: the controller stays enabled) the
/// device opens again; under uio_pci_generic the platform has disabled
/// the controller before switching bus mastering on (it could have been
/// running the dead process's queues).
#[test]
fn one_driver_per_controller() {
    let Some(bdf) = bdf() else { return };
    let _g = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let read0 = |ctrl: &Controller| -> Vec<u8> {
        let ns = ctrl.namespaces()[0];
        let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
        let buf = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap());
        qp.read(&ns, 0, 4096 >> ns.lba_shift(), buf, 1).unwrap();
        let c = drain(&mut qp).pop().expect("completion");
        assert_eq!(c.result, Ok(0));
        c.buf.expect("buffer").as_slice().to_vec()
    };
    let refused = |what: &str| -> String {
        let e = open_pcie(&bdf)
            .err()
            .unwrap_or_else(|| panic!("{what}: a second open of {bdf} was accepted"));
        let m = e.to_string();
        println!("{what}: {m}");
        assert!(m.contains(&bdf) && m.contains("in use"), "{what}: {m}");
        m
    };

    let ctrl = open(&bdf, ControllerOptions::default());
    let uio = ctrl.describe().starts_with("uio");
    let data = read0(&ctrl);
    let m = refused("same process");
    if uio {
        assert!(m.contains("another controller of this process"), "{m}");
    }
    assert_eq!(read0(&ctrl), data, "the first controller still reads");
    assert_eq!(ctrl.resets(), 0);
    drop(ctrl);

    let ready = format!("/tmp/pollux-hold.{}", std::process::id());
    let _ = std::fs::remove_file(&ready);
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = std::process::Command::new(exe)
        .args(["--exact", "hold_device", "--nocapture", "--test-threads=1"])
        .env("POLLUX_HOLD", &ready)
        .env("POLLUX_PCIE_BDF", &bdf)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the holder");
    let start = std::time::Instant::now();
    while !std::path::Path::new(&ready).exists() {
        if let Some(st) = child.try_wait().expect("try_wait") {
            panic!("the holder exited before it was up: {st}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "holder not up in 120 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let m = refused("another process");
    if uio {
        assert!(m.contains(&format!("process {}", child.id())), "{m}");
    }
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("reap the holder");
    let _ = std::fs::remove_file(&ready);

    let p = open_pcie(&bdf).unwrap_or_else(|e| panic!("open {bdf} after the holder died: {e}"));
    if uio {
        let cc = p.bar0().read32(0x14).unwrap();
        let csts = p.bar0().read32(0x1c).unwrap();
        assert!(
            cc & 1 == 0 && csts & 1 == 0,
            "the controller the killed holder left enabled is still enabled once the platform \
             is open, bus mastering on (CC {cc:#x}, CSTS {csts:#x})"
        );
    }
    let ctrl = pollux_pcie::open(p, ControllerOptions::default())
        .unwrap_or_else(|e| panic!("bring-up of {bdf}: {e}"));
    assert_eq!(read0(&ctrl), data, "data read again after the takeover");
}
