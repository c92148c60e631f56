//! Passthrough (`raw`, `Controller::admin`) never lets the controller
//! transfer to memory the caller chose: the transport owns the data
//! pointer fields, and a buffer must be exactly as long as the transfer
//! the command asks for. Each test aims the command at a "victim" buffer
//! (through PRP1/PRP2, or by making the transfer longer than the buffer)
//! and checks the victim is untouched. Inline (deterministic) emulated
//! controller.
use std::sync::Arc;
use std::time::Duration;

use pollux_pcie::{
    Completion, Controller, ControllerOptions, DmaBuffer, Error, IoBuf, QpairOptions, QueuePair,
    SubmitError,
};
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe};

const VICTIM: u8 = 0xEE;
const DATA: u8 = 0x5A;

fn open() -> (Arc<SoftDevice>, Controller) {
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: 9,
            size_bytes: 8 << 20,
        }],
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

fn drain(qp: &mut QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    qp.drain(Duration::from_secs(20), |_, c| out.push(c))
        .expect("drain");
    out
}

/// A queue pair over a namespace whose first 16 blocks hold `DATA`.
fn setup(ctrl: &Controller) -> QueuePair {
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    let mut w = IoBuf::new(ctrl.alloc_dma(8192).unwrap()).truncate(8192);
    w.as_mut_slice().fill(DATA);
    qp.write(&ns, 0, 16, w, 1).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    qp
}

fn victim(ctrl: &Controller) -> DmaBuffer {
    let mut v = ctrl.alloc_dma(4096).unwrap();
    v.as_mut_slice().fill(VICTIM);
    v
}

fn untouched(b: &[u8]) -> bool {
    b.iter().all(|&x| x == VICTIM)
}

/// Lets the inline controller run whatever was submitted.
fn settle(ctrl: &Controller, qp: &mut QueuePair) -> Vec<Completion> {
    for _ in 0..100 {
        ctrl.relax();
    }
    drain(qp)
}

/// A raw Read with no buffer and the caller's PRP1 aimed at another
/// buffer: refused (the Read moves 4 KiB, the request has no buffer).
/// Before, it went as given and the controller wrote the victim.
#[test]
fn raw_without_a_buffer_cannot_aim_the_controller() {
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let v = victim(&ctrl);
    let mut sqe = Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 8);
    sqe.prp1 = v.iova_at(0);
    let r = qp.raw(sqe, None, 2).unwrap_err();
    assert_eq!(
        r.error,
        SubmitError::PassthroughLength {
            opc: NvmOpcode::Read as u8,
            admin: false,
            expected: 4096,
            got: 0
        }
    );
    assert_eq!(
        r.error.to_string(),
        "Read (opcode 0x02) transfers 4096 bytes but the buffer is 0 bytes"
    );
    assert!(settle(&ctrl, &mut qp).is_empty());
    assert!(untouched(v.as_slice()), "the controller wrote the victim");
}

/// The unchecked path too leaves the data pointer to the transport: the
/// caller's PRP1 is cleared, so a Read sent without a buffer fails at the
/// controller (bus address 0 is not mapped) instead of writing the
/// victim. Before, the controller wrote the victim and the Read
/// succeeded.
#[test]
fn unchecked_raw_without_a_buffer_goes_with_the_pointers_cleared() {
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let v = victim(&ctrl);
    let mut sqe = Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 8);
    sqe.prp1 = v.iova_at(0);
    sqe.mptr = v.iova_at(0);
    // SAFETY: breaks the contract on purpose (a 4 KiB Read without a
    // buffer): the test checks the transport sends it with no data
    // pointer, which the emulated controller's IOMMU refuses.
    unsafe { qp.raw_dma(sqe, None, 2) }.unwrap();
    let c = settle(&ctrl, &mut qp);
    assert_eq!(c.len(), 1);
    assert!(c[0].result.is_err(), "{c:?}");
    assert!(untouched(v.as_slice()), "the controller wrote the victim");
}

/// A buffer shorter than the Read: refused. Before, the controller
/// wrote 4 KiB from the start of a 512-byte piece, over the next piece of
/// the same allocation.
#[test]
fn raw_with_a_short_buffer_is_refused() {
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let (small, mut next) = IoBuf::new(ctrl.alloc_dma(4096).unwrap())
        .truncate(4096)
        .split_at(512);
    next.as_mut_slice().fill(VICTIM);
    let r = qp
        .raw(Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 8), Some(small), 2)
        .unwrap_err();
    assert!(
        matches!(
            r.error,
            SubmitError::PassthroughLength {
                expected: 4096,
                got: 512,
                ..
            }
        ),
        "{}",
        r.error
    );
    assert_eq!(r.buf.map(|b| b.len()), Some(512), "the buffer comes back");
    assert!(settle(&ctrl, &mut qp).is_empty());
    assert!(
        untouched(next.as_slice()),
        "the controller wrote past the buffer"
    );
}

/// A one-page buffer for an 8 KiB Read with the caller's PRP2 aimed at
/// the victim: refused. Before, the transport kept the caller's PRP2 and
/// the controller wrote the second page into the victim.
#[test]
fn raw_cannot_borrow_the_callers_prp2() {
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let v = victim(&ctrl);
    let mut sqe = Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 16);
    sqe.prp2 = v.iova_at(0);
    let b = IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(4096);
    let r = qp.raw(sqe, Some(b), 2).unwrap_err();
    assert!(
        matches!(
            r.error,
            SubmitError::PassthroughLength {
                expected: 8192,
                got: 4096,
                ..
            }
        ),
        "{}",
        r.error
    );
    assert!(settle(&ctrl, &mut qp).is_empty());
    assert!(untouched(v.as_slice()), "the controller wrote the victim");
}

/// The checked passthrough still does its job: a Read with the right
/// buffer, a Flush without one, a Dataset Management with its ranges.
#[test]
fn raw_with_the_right_buffer_runs() {
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let b = IoBuf::new(ctrl.alloc_dma(8192).unwrap()).truncate(8192);
    qp.raw(Sqe::rw(NvmOpcode::Read, ns.nsid(), 0, 16), Some(b), 2)
        .unwrap();
    qp.raw(Sqe::flush(ns.nsid()), None, 3).unwrap();
    let mut c = drain(&mut qp);
    c.sort_by_key(|c| c.user_data);
    assert_eq!((c[0].result, c[1].result), (Ok(0), Ok(0)));
    assert!(c[0]
        .buf
        .as_ref()
        .unwrap()
        .as_slice()
        .iter()
        .all(|&x| x == DATA));
    // Deallocate blocks 0..8 through a raw DSM with its one range.
    let mut r = IoBuf::new(ctrl.alloc_dma(16).unwrap()).truncate(16);
    r.as_mut_slice()[4..8].copy_from_slice(&8u32.to_le_bytes());
    let dsm = Sqe::dsm(ns.nsid(), 1, pollux_spec::cmd::DSM_ATTR_DEALLOCATE, 0);
    qp.raw(dsm, Some(r), 4).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
    let b = IoBuf::new(ctrl.alloc_dma(8192).unwrap()).truncate(8192);
    qp.read(&ns, 0, 16, b, 5).unwrap();
    let c = drain(&mut qp);
    let got = c[0].buf.as_ref().unwrap().as_slice();
    assert!(got[..4096].iter().all(|&x| x == 0), "deallocated");
    assert!(got[4096..].iter().all(|&x| x == DATA), "kept");
    // A vendor-specific opcode needs the unchecked path.
    let e = qp.raw(Sqe::new(0x81, ns.nsid()), None, 6).unwrap_err();
    assert!(
        matches!(e.error, SubmitError::PassthroughUnchecked { opc: 0x81, .. }),
        "{}",
        e.error
    );
}

/// An admin Identify with no buffer and the caller's PRP1 aimed at the
/// victim: refused. Before, it went as given and the controller wrote
/// its Identify data into the victim.
#[test]
fn admin_without_a_buffer_cannot_aim_the_controller() {
    let (_dev, ctrl) = open();
    let v = victim(&ctrl);
    let sqe = Sqe::identify(1, 0, v.iova_at(0));
    let e = ctrl.admin(sqe, None).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Passthrough(SubmitError::PassthroughLength {
                opc: 0x06,
                admin: true,
                expected: 4096,
                got: 0,
                ..
            })
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "admin passthrough: Identify (opcode 0x06) transfers 4096 bytes but the buffer is 0 bytes"
    );
    // Unchecked: the caller's PRP1 is cleared, the controller cannot
    // reach bus address 0 and the victim stays as it was.
    // SAFETY: breaks the contract on purpose (Identify without a buffer):
    // the test checks the transport sends no data pointer.
    let (cqe, _) = unsafe { ctrl.admin_unchecked(sqe, None) }.unwrap();
    assert!(!cqe.status().is_success());
    assert!(untouched(v.as_slice()), "the controller wrote the victim");
}

/// Admin buffers are owned and must match the transfer: a Get Log Page
/// of 1 KiB into a 512-byte piece is refused, the one of 512 bytes runs
/// and hands its buffer back with the log.
#[test]
fn admin_buffer_length_must_match() {
    let (_dev, ctrl) = open();
    let (small, mut next) = IoBuf::new(ctrl.alloc_dma(4096).unwrap())
        .truncate(4096)
        .split_at(512);
    next.as_mut_slice().fill(VICTIM);
    let smart = pollux_spec::log::lid::SMART;
    let e = ctrl
        .admin(
            Sqe::get_log_page(smart, u32::MAX, 1024, 0, 0, 0),
            Some(small),
        )
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Passthrough(SubmitError::PassthroughLength {
                opc: 0x02,
                expected: 1024,
                got: 512,
                ..
            })
        ),
        "{e}"
    );
    assert!(untouched(next.as_slice()));
    let b = IoBuf::new(ctrl.alloc_dma(512).unwrap()).truncate(512);
    let (cqe, b) = ctrl
        .admin(Sqe::get_log_page(smart, u32::MAX, 512, 0, 0, 0), Some(b))
        .unwrap();
    assert!(cqe.status().is_success());
    assert_eq!(b.map(|b| b.len()), Some(512));
    // Commands that hand the controller memory by address, or change the
    // namespaces, are the unchecked path's.
    let e = ctrl.admin(Sqe::create_io_cq(9, 16, 0), None).unwrap_err();
    assert!(e.to_string().contains("queue management"), "{e}");
    let e = ctrl
        .admin(Sqe::new(AdminOpcode::FormatNvm as u8, 1), None)
        .unwrap_err();
    assert!(e.to_string().contains("namespaces"), "{e}");
}

/// Admin commands get CIDs below the admin queue's depth, which the
/// transport's memory per command is sized by (PCIe: a PRP list slice per
/// CID). Before, the CID counted on through all of u16: after 200 admin
/// commands, a 12 KiB Get Log Page (three pages: a PRP list) had its list
/// written 200 slices into a pool of 31, 2 KiB past the pool's page, into
/// whatever host memory lay there, and the controller could not read it.
#[test]
fn admin_cids_stay_within_the_admin_queue() {
    let (_dev, ctrl) = open();
    for _ in 0..200 {
        ctrl.get_features(pollux_spec::features::fid::NUMBER_OF_QUEUES, 0)
            .unwrap();
    }
    let mut b = IoBuf::new(ctrl.alloc_dma(12288).unwrap()).truncate(12288);
    b.as_mut_slice().fill(VICTIM);
    let error_log = pollux_spec::log::lid::ERROR;
    let (cqe, b) = ctrl
        .admin(Sqe::get_log_page(error_log, 0, 12288, 0, 0, 0), Some(b))
        .unwrap();
    assert!(cqe.status().is_success(), "{}", cqe.status());
    let b = b.expect("the buffer comes back");
    assert!(
        b.as_slice().iter().all(|&x| x != VICTIM),
        "the whole 12 KiB was transferred"
    );
}

/// The status of an error completion reaches the handler whole: the
/// success test reads SCT and SC in place in the entry's dword 3, and the
/// status is taken from there only on the error path. Status codes of
/// one bit, the lowest (dword 3 bit 17), several bits, and a high one,
/// from commands the emulated controller refuses: an opcode it does not
/// know, a Flush of a namespace it does not have, and a Read past the end
/// of the namespace (raw: the driver's own range check would refuse it
/// first).
#[test]
fn error_statuses_reach_the_handler_whole() {
    use pollux_pcie::IoError;
    use pollux_spec::status::generic;
    let (_dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = setup(&ctrl);
    let past_end = (8 << 20) / 512;
    let cases = [
        (Sqe::new(0x7E, ns.nsid()), None, generic::INVALID_OPCODE),
        (
            Sqe::new(NvmOpcode::Flush as u8, 99),
            None,
            generic::INVALID_NAMESPACE,
        ),
        (
            Sqe::rw(NvmOpcode::Read, ns.nsid(), past_end, 8),
            Some(IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(4096)),
            generic::LBA_OUT_OF_RANGE,
        ),
    ];
    for (k, (sqe, buf, sc)) in cases.into_iter().enumerate() {
        if sqe.opc == 0x7E {
            // SAFETY: no data and no address in its dwords (the pointer
            // fields are cleared): the controller can transfer nothing.
            unsafe { qp.raw_unchecked(sqe, buf, k as u64) }.unwrap();
        } else {
            qp.raw(sqe, buf, k as u64).unwrap();
        }
        let c = drain(&mut qp);
        assert_eq!(c.len(), 1);
        match c[0].result {
            Err(IoError::Nvme(st)) => {
                assert_eq!((st.sct(), st.sc()), (0, sc), "case {k}: {st}");
            }
            ref r => panic!("case {k}: {r:?}"),
        }
    }
    // And success still reads as success.
    let r = IoBuf::new(ctrl.alloc_dma(4096).unwrap()).truncate(4096);
    qp.read(&ns, 0, 8, r, 9).unwrap();
    assert_eq!(drain(&mut qp)[0].result, Ok(0));
}
