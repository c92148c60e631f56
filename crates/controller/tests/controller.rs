//! The controller model without a transport: admin commands in both
//! personalities, SMART over several I/O queues, asynchronous events,
//! Keep Alive, features, the CC state machine, and I/O (synchronous and
//! asynchronous) over RAM bdevs, including every refusal and a bdev
//! failing under outstanding commands.
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, Controller, ControllerError, FabricsTraits, Identity, IoQueue,
    IoQueueOptions, Limits, Namespace, PcieTraits, Personality, Subsystem, FABRICS_SGLS,
};
use pollux_spec::cmd::cns;
use pollux_spec::features::{aer, fid, NumberOfQueues};
use pollux_spec::identify::{
    IdentifyController, IdentifyNamespace, CNTRLTYPE_IO, OACS_DBBUF_CONFIG,
};
use pollux_spec::log::{lid, ErrorLogEntry, SmartLog, ERROR_LOG_NOT_SPECIFIC};
use pollux_spec::regs::{shst, Cc, Csts};
use pollux_spec::status::{generic, media, sct, specific};
use pollux_spec::{AdminOpcode, NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

const BLOCKS: u64 = 1024;

fn identity() -> Identity {
    Identity {
        serial: "CTRL0001".into(),
        model: "pollux controller test".into(),
        firmware: "1.0".into(),
        vid: 0x1b36,
        ssvid: 0x1af4,
        ieee: [1, 2, 3],
        subnqn: "nqn.2024-01.io.pollux:test".into(),
    }
}

fn limits(mdts: u8) -> Limits {
    Limits {
        mqes: 127,
        max_io_queues: 8,
        mdts,
        abort_limit: 3,
        aer_limit: 1,
        cap_to: 20,
    }
}

fn pcie() -> Personality {
    Personality::Pcie(PcieTraits {
        dstrd: 0,
        irq_vectors: 4,
        shadow_doorbells: true,
    })
}

fn fabrics(kas: u16) -> Personality {
    Personality::Fabrics(FabricsTraits {
        in_capsule_data: 8192,
        kas,
    })
}

/// A subsystem with two RAM namespaces (512 B and 4 KiB blocks).
fn subsystem(p: Personality, mdts: u8) -> Arc<Subsystem> {
    let ns = vec![
        Namespace::new(Bdev::ram("r0", 512, BLOCKS).unwrap(), 0).unwrap(),
        Namespace::new(Bdev::ram("r1", 4096, BLOCKS).unwrap(), 0).unwrap(),
    ];
    Subsystem::new(identity(), limits(mdts), p, ns).unwrap()
}

fn status(o: &AdminOutcome) -> Status {
    match o {
        AdminOutcome::Complete { status, .. } => *status,
        AdminOutcome::Data { .. } => Status::SUCCESS,
        other => panic!("no status: {other:?}"),
    }
}

/// Runs an admin command that returns data; hands the result back as
/// the host would see it (the transfer always succeeds here).
fn admin_data(c: &mut Controller, sqe: Sqe) -> Result<Vec<u8>, Status> {
    match c.exec_admin(&sqe, AdminEnv::default()) {
        AdminOutcome::Data {
            data,
            xfer_len,
            then,
        } => {
            assert!(data.len() <= xfer_len);
            c.data_sent(then);
            Ok(data)
        }
        AdminOutcome::Complete { status, .. } => Err(status),
        other => panic!("unexpected {other:?}"),
    }
}

fn identify_ctrl(c: &mut Controller) -> IdentifyController {
    let d = admin_data(c, Sqe::identify(cns::CONTROLLER, 0, 0)).unwrap();
    IdentifyController::read_from_bytes(&d).unwrap()
}

fn g(sc: u8) -> Status {
    Status::generic(sc)
}

#[test]
fn identify_in_both_personalities() {
    let mut c = Controller::new(subsystem(pcie(), 5), 1);
    let id = identify_ctrl(&mut c);
    assert_eq!(id.cntlid, 1);
    assert_eq!(id.serial(), "CTRL0001");
    assert_eq!(id.subnqn_str(), "nqn.2024-01.io.pollux:test");
    assert_eq!(id.ieee, [1, 2, 3]);
    assert_eq!(id.mdts, 5);
    // NN: the most namespaces (they come and go live).
    assert_eq!(id.nn, 1024);
    assert_eq!(id.cntrltype, CNTRLTYPE_IO);
    assert_eq!(id.oacs & OACS_DBBUF_CONFIG, OACS_DBBUF_CONFIG);
    assert_eq!(
        (id.sgls, id.ioccsz, id.iorcsz, id.kas, id.msdbd),
        (0, 0, 0, 0, 0)
    );
    // PCIe: SGLs are refused.
    let mut sgl = Sqe::identify(cns::CONTROLLER, 0, 0);
    sgl.flags = 1 << 6;
    assert_eq!(
        status(&c.exec_admin(&sgl, AdminEnv::default())),
        g(generic::INVALID_FIELD)
    );

    let mut f = Controller::new(subsystem(fabrics(50), 5), 0x2a);
    let id = identify_ctrl(&mut f);
    assert_eq!(id.cntlid, 0x2a);
    assert_eq!(id.cntrltype, CNTRLTYPE_IO);
    assert_eq!(id.ioccsz, (64 + 8192) / 16);
    assert_eq!(id.iorcsz, 1);
    assert_eq!(id.icdoff, 0);
    assert_eq!(id.fcatt, 0);
    assert_eq!(id.msdbd, 1);
    assert_eq!(id.kas, 50);
    assert_eq!(id.sgls, FABRICS_SGLS);
    assert_eq!(id.sgls & 3, 1, "SGLs supported");
    assert_eq!(id.sgls & (1 << 2), 0, "keyed SGL data blocks are not");
    assert_ne!(id.sgls & (1 << 20), 0, "offsets");
    assert_ne!(id.sgls & (1 << 21), 0, "transport SGL data blocks");
    assert_eq!(id.oacs & OACS_DBBUF_CONFIG, 0);
    assert_eq!((id.cmic, id.anacap), (0, 0));
    assert_eq!(id.subnqn_str(), "nqn.2024-01.io.pollux:test");
    // Fabrics: the SGL is the transport's; the command runs.
    let mut sgl = Sqe::identify(cns::CONTROLLER, 0, 0);
    sgl.flags = 1 << 6;
    assert!(matches!(
        f.exec_admin(&sgl, AdminEnv::default()),
        AdminOutcome::Data { .. }
    ));
    // DBBC is not a fabrics command; Fabrics commands are the transport's.
    for (opc, want) in [
        (AdminOpcode::DoorbellBufferConfig as u8, None),
        (
            AdminOpcode::FabricsCommand as u8,
            Some(AdminOutcome::NotMine),
        ),
    ] {
        let o = f.exec_admin(&Sqe::new(opc, 0), AdminEnv::default());
        match want {
            Some(w) => assert_eq!(o, w),
            None => assert_eq!(status(&o), g(generic::INVALID_OPCODE)),
        }
    }
    assert_eq!(
        c.exec_admin(
            &Sqe::new(AdminOpcode::FabricsCommand as u8, 0),
            AdminEnv::default()
        ),
        AdminOutcome::Complete {
            dw0: 0,
            status: g(generic::INVALID_OPCODE)
        }
    );
    assert_eq!(
        c.exec_admin(
            &Sqe::new(AdminOpcode::DoorbellBufferConfig as u8, 0),
            AdminEnv::default()
        ),
        AdminOutcome::NotMine
    );

    // Namespaces: geometry, an inactive NSID (zeros, as the spec says)
    // and one beyond NN.
    let d = admin_data(&mut f, Sqe::identify(cns::NAMESPACE, 2, 0)).unwrap();
    let ns = IdentifyNamespace::read_from_bytes(&d).unwrap();
    assert_eq!(ns.nsze, BLOCKS);
    let d = admin_data(&mut f, Sqe::identify(cns::NAMESPACE, 3, 0)).unwrap();
    assert!(d.iter().all(|&b| b == 0));
    assert_eq!(
        admin_data(&mut f, Sqe::identify(cns::NAMESPACE, 1025, 0)),
        Err(g(generic::INVALID_NAMESPACE))
    );
}

/// Get Log Page SMART of `c`.
fn smart(c: &mut Controller) -> SmartLog {
    let d = admin_data(c, Sqe::get_log_page(lid::SMART, 0, 512, 0, 0, 0)).unwrap();
    SmartLog::read_from_bytes(&d).unwrap()
}

fn seg(buf: &mut [u8]) -> [RawSeg; 1] {
    [RawSeg {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    }]
}

/// Checks and runs `sqe` synchronously on `buf`.
fn exec(q: &mut IoQueue, sqe: &Sqe, buf: &mut [u8]) -> Status {
    let cmd = match q.check(sqe) {
        Ok(c) => c,
        Err(s) => return s,
    };
    assert!(cmd.xfer_len <= buf.len());
    let s = seg(&mut buf[..cmd.xfer_len]);
    // SAFETY: `buf` is ours and untouched during the call.
    unsafe { q.exec(&cmd, if cmd.xfer_len == 0 { &[] } else { &s }) }
}

#[test]
fn subsystem_refuses_what_identify_cannot_report() {
    let odd = Personality::Fabrics(FabricsTraits {
        in_capsule_data: 100,
        kas: 0,
    });
    let e = Subsystem::new(identity(), limits(5), odd, Vec::<Namespace>::new()).unwrap_err();
    assert!(e.to_string().contains("in-capsule data size 100"), "{e}");
    let mut id = identity();
    id.serial = String::new();
    let e = Subsystem::new(id, limits(5), pcie(), Vec::<Namespace>::new()).unwrap_err();
    assert!(e.to_string().contains("serial"), "{e}");
    let e = Namespace::new(Bdev::ram("r2", 1024, 8).unwrap(), 0).unwrap_err();
    assert!(
        e.to_string().contains("r2") && e.to_string().contains("1024"),
        "{e}"
    );
    let e = Namespace::new(Bdev::ram("r3", 512, 8).unwrap(), 9).unwrap_err();
    assert!(e.to_string().contains("r3"), "{e}");
}

#[test]
fn smart_counts_io_of_every_queue() {
    let mut c = Controller::new(subsystem(fabrics(0), 5), 1);
    let mut q1 = IoQueue::for_controller(&c, IoQueueOptions { depth: 4 }).unwrap();
    let mut q2 = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let mut buf = vec![7u8; 64 << 10];
    // Queue 1: three 8 KiB writes on namespace 1 (512 B blocks).
    for i in 0..3 {
        let st = exec(&mut q1, &Sqe::rw(NvmOpcode::Write, 1, i * 16, 16), &mut buf);
        assert!(st.is_success(), "{st:?}");
    }
    // Queue 2: two 4 KiB reads on namespace 2, one failing check.
    for i in 0..2 {
        let st = exec(&mut q2, &Sqe::rw(NvmOpcode::Read, 2, i, 1), &mut buf);
        assert!(st.is_success(), "{st:?}");
    }
    assert!(!exec(&mut q2, &Sqe::rw(NvmOpcode::Read, 2, BLOCKS, 1), &mut buf).is_success());
    // Not published yet: SMART sees nothing.
    assert_eq!(smart(&mut c).host_write_commands(), 0);
    q1.publish();
    q2.publish();
    let s = smart(&mut c);
    assert_eq!(s.host_write_commands(), 3);
    assert_eq!(s.host_read_commands(), 2);
    // 24 KiB written, 8 KiB read: one 512 000-byte unit each (rounded up).
    assert_eq!(s.data_units_written(), 1);
    assert_eq!(s.data_units_read(), 1);
    assert_eq!(q1.stats().bytes_written, 24 << 10);
    assert_eq!(q2.stats().bytes_read, 8 << 10);
    // An asynchronous read on queue 1 counts too; a closed queue's counts
    // stay.
    let cmd = q1.check(&Sqe::rw(NvmOpcode::Read, 1, 0, 8)).unwrap();
    let s1 = seg(&mut buf[..4096]);
    // SAFETY: `buf` is not touched until the poll below delivered the tag.
    unsafe { q1.submit(9, &cmd, &s1) }.unwrap();
    let mut got = Vec::new();
    q1.poll(&mut |t, st| got.push((t, st)));
    assert_eq!(got, [(9, Status::SUCCESS)]);
    drop(q1); // publishes
    q2.publish();
    let s = smart(&mut c);
    assert_eq!(s.host_read_commands(), 3);
    assert_eq!(s.host_write_commands(), 3);
    assert_eq!(c.io_stats().bytes_read, 12 << 10);
}

#[test]
fn aer_held_then_completed_by_an_event() {
    let mut c = Controller::new(subsystem(pcie(), 5), 1);
    let mut aer_sqe = Sqe::async_event_request();
    aer_sqe.cid = 77;
    assert_eq!(
        c.exec_admin(&aer_sqe, AdminEnv::default()),
        AdminOutcome::Held
    );
    assert_eq!(c.next_event(), None);
    c.error_event(aer::ERROR_INVALID_DOORBELL_WRITE);
    assert_eq!(
        c.next_event(),
        Some((
            77,
            aer::encode(aer::ERROR, aer::ERROR_INVALID_DOORBELL_WRITE, lid::ERROR)
        ))
    );
    assert_eq!(c.next_event(), None);
    // AERL 1: two may be outstanding, the third is refused.
    for cid in [1, 2] {
        aer_sqe.cid = cid;
        assert_eq!(
            c.exec_admin(&aer_sqe, AdminEnv::default()),
            AdminOutcome::Held
        );
    }
    assert_eq!(
        status(&c.exec_admin(&aer_sqe, AdminEnv::default())),
        Status::specific(specific::AER_LIMIT_EXCEEDED)
    );
    // A second error event is masked until the Error log is read with RAE
    // clear.
    c.error_event(aer::ERROR_INVALID_DOORBELL_REGISTER);
    assert_eq!(c.next_event(), None);
    let mut rae = Sqe::get_log_page(lid::ERROR, 0, 64, 0, 0, 0);
    rae.cdw10 |= 1 << 15;
    admin_data(&mut c, rae).unwrap();
    c.error_event(aer::ERROR_INVALID_DOORBELL_REGISTER);
    assert_eq!(c.next_event(), None, "RAE set: still masked");
    admin_data(&mut c, Sqe::get_log_page(lid::ERROR, 0, 64, 0, 0, 0)).unwrap();
    c.error_event(aer::ERROR_INVALID_DOORBELL_REGISTER);
    assert_eq!(
        c.next_event(),
        Some((
            1,
            aer::encode(aer::ERROR, aer::ERROR_INVALID_DOORBELL_REGISTER, lid::ERROR)
        ))
    );
    // Abort of the other one.
    assert!(c.abort_aer(2));
    assert!(!c.abort_aer(2));
}

#[test]
fn keep_alive_only_with_kas() {
    let ka = Sqe::new(AdminOpcode::KeepAlive as u8, 0);
    let mut f = Controller::new(subsystem(fabrics(10), 5), 1);
    for n in 1..=2 {
        assert_eq!(
            status(&f.exec_admin(&ka, AdminEnv::default())),
            Status::SUCCESS
        );
        assert_eq!(f.keep_alives(), n);
    }
    for p in [pcie(), fabrics(0)] {
        let mut c = Controller::new(subsystem(p, 5), 1);
        assert_eq!(
            status(&c.exec_admin(&ka, AdminEnv::default())),
            g(generic::INVALID_OPCODE)
        );
        assert_eq!(c.keep_alives(), 0);
    }
}

fn dw0(o: AdminOutcome) -> (u32, Status) {
    match o {
        AdminOutcome::Complete { dw0, status } => (dw0, status),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn features_number_of_queues_and_kato() {
    let mut f = Controller::new(subsystem(fabrics(10), 5), 1);
    let env = AdminEnv::default();
    // Number of Queues: granted at most max_io_queues (8), 0's based.
    let set = Sqe::set_features(
        fid::NUMBER_OF_QUEUES,
        0,
        NumberOfQueues::new(3, 20).to_cdw11(),
    );
    let (d, st) = dw0(f.exec_admin(&set, env));
    assert!(st.is_success());
    assert_eq!(d, NumberOfQueues::new(3, 8).to_cdw11());
    assert_eq!(f.queues_granted(), NumberOfQueues::new(3, 8));
    let get = Sqe::get_features(fid::NUMBER_OF_QUEUES, 0);
    assert_eq!(dw0(f.exec_admin(&get, env)).0, d);
    // Not once I/O queues exist; 0xFFFF (65536 queues) is invalid.
    let busy = AdminEnv {
        io_queues_exist: true,
    };
    assert_eq!(
        dw0(f.exec_admin(&set, busy)).1,
        g(generic::COMMAND_SEQUENCE_ERROR)
    );
    let bad = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0xFFFF);
    assert_eq!(dw0(f.exec_admin(&bad, env)).1, g(generic::INVALID_FIELD));
    // KATO.
    assert_eq!(f.kato_ms(), 0);
    let (_, st) = dw0(f.exec_admin(&Sqe::set_features(fid::KEEP_ALIVE, 0, 15_000), env));
    assert!(st.is_success());
    assert_eq!(f.kato_ms(), 15_000);
    assert_eq!(
        dw0(f.exec_admin(&Sqe::get_features(fid::KEEP_ALIVE, 0), env)),
        (15_000, Status::SUCCESS)
    );
    // PCIe-only features are not fabrics features, and the reverse.
    for fid_v in [fid::INTERRUPT_COALESCING, fid::INTERRUPT_VECTOR_CONFIG] {
        assert_eq!(
            dw0(f.exec_admin(&Sqe::get_features(fid_v, 0), env)).1,
            g(generic::INVALID_FIELD)
        );
    }
    let mut p = Controller::new(subsystem(pcie(), 5), 1);
    assert_eq!(
        dw0(p.exec_admin(&Sqe::set_features(fid::KEEP_ALIVE, 0, 1000), env)).1,
        g(generic::INVALID_FIELD)
    );
    assert!(
        dw0(p.exec_admin(&Sqe::get_features(fid::INTERRUPT_COALESCING, 0), env))
            .1
            .is_success()
    );
    // A reset restores the defaults.
    f.write_cc(Cc::standard(0).with_en(true).0);
    f.enable_done(Ok(()));
    f.write_cc(0);
    f.reset();
    assert_eq!(f.queues_granted(), NumberOfQueues::new(8, 8));
    assert_eq!(f.kato_ms(), 0);
}

/// The features an I/O controller must support (NVMe Base 1.3/1.4's
/// Feature Identifiers figure, 2.0 with the NVM Command Set's: Arbitration,
/// Power Management, Temperature Threshold, Error Recovery, Number of
/// Queues, Write Atomicity Normal, Asynchronous Event Configuration;
/// Volatile Write Cache because VWC is reported present; Interrupt
/// Coalescing and Interrupt Vector Configuration on PCIe only; Keep Alive
/// Timer over fabrics), read with Get Features in each personality, and
/// the newly supported ones set and read back. Before, Power Management,
/// Error Recovery and Write Atomicity Normal were Invalid Field (SPDK's
/// spdk_nvme_identify printed "get_feature(0x02) failed").
#[test]
fn every_mandatory_feature_can_be_read() {
    let env = AdminEnv::default();
    let common = [
        fid::ARBITRATION,
        fid::POWER_MANAGEMENT,
        fid::TEMPERATURE_THRESHOLD,
        fid::ERROR_RECOVERY,
        fid::VOLATILE_WRITE_CACHE,
        fid::NUMBER_OF_QUEUES,
        fid::WRITE_ATOMICITY,
        fid::ASYNC_EVENT_CONFIG,
    ];
    let pcie_only = [fid::INTERRUPT_COALESCING, fid::INTERRUPT_VECTOR_CONFIG];
    for (name, p, extra) in [
        ("pcie", pcie(), &pcie_only[..]),
        ("fabrics", fabrics(10), &[fid::KEEP_ALIVE][..]),
    ] {
        let mut c = Controller::new(subsystem(p, 5), 1);
        for &f in common.iter().chain(extra) {
            // Error Recovery is namespace specific: SPDK asks with NSID 1.
            for nsid in [0, 1] {
                let (_, st) = dw0(c.exec_admin(&Sqe::get_features(f, nsid), env));
                assert!(
                    st.is_success(),
                    "{name}: Get Features {f:#04x} NSID {nsid}: {st:?}"
                );
            }
        }
    }
    let mut c = Controller::new(subsystem(fabrics(10), 5), 1);
    let set = |c: &mut Controller, f: u8, nsid: u32, v: u32| {
        dw0(c.exec_admin(&Sqe::set_features(f, nsid, v), env)).1
    };
    let get =
        |c: &mut Controller, f: u8, nsid: u32| dw0(c.exec_admin(&Sqe::get_features(f, nsid), env));
    // Power Management: one power state; the workload hint is kept.
    assert!(set(&mut c, fid::POWER_MANAGEMENT, 0, 2 << 5).is_success());
    assert_eq!(
        get(&mut c, fid::POWER_MANAGEMENT, 0),
        (2 << 5, Status::SUCCESS)
    );
    assert_eq!(
        set(&mut c, fid::POWER_MANAGEMENT, 0, 1),
        g(generic::INVALID_FIELD)
    );
    // Error Recovery: TLER kept; DULBE unsupported; an unknown NSID.
    assert!(set(&mut c, fid::ERROR_RECOVERY, 1, 30).is_success());
    assert_eq!(get(&mut c, fid::ERROR_RECOVERY, 2), (30, Status::SUCCESS));
    assert_eq!(
        set(&mut c, fid::ERROR_RECOVERY, 1, 1 << 16),
        g(generic::INVALID_FIELD)
    );
    assert_eq!(
        get(&mut c, fid::ERROR_RECOVERY, 3).1,
        g(generic::INVALID_NAMESPACE)
    );
    // Write Atomicity Normal: DN.
    assert!(set(&mut c, fid::WRITE_ATOMICITY, 0, 1).is_success());
    assert_eq!(get(&mut c, fid::WRITE_ATOMICITY, 0), (1, Status::SUCCESS));
}

/// Commands Supported and Effects (LID 05h), advertised in LPA bit 1:
/// what each personality executes, with LBCC on the commands that change
/// blocks. Before, Invalid Log Page (Linux's `nvme get-log --log-id=0x05`
/// failed against pollux target).
#[test]
fn commands_supported_and_effects_log() {
    use pollux_spec::identify::LPA_COMMANDS_EFFECTS;
    use pollux_spec::log::{effects, CommandEffectsLog};
    for (name, p, kas) in [("pcie", pcie(), false), ("fabrics", fabrics(10), true)] {
        let mut c = Controller::new(subsystem(p, 5), 1);
        assert_ne!(
            identify_ctrl(&mut c).lpa & LPA_COMMANDS_EFFECTS,
            0,
            "{name}"
        );
        let d = admin_data(
            &mut c,
            Sqe::get_log_page(lid::COMMANDS_SUPPORTED, 0, 4096, 0, 0, 0),
        )
        .unwrap();
        let l = CommandEffectsLog::read_from_bytes(&d).unwrap();
        use AdminOpcode::*;
        for op in [
            GetLogPage,
            Identify,
            Abort,
            SetFeatures,
            GetFeatures,
            AsyncEventRequest,
        ] {
            assert_eq!(l.acs[op as usize], effects::CSUPP, "{name} {op:?}");
        }
        assert_eq!(l.acs[KeepAlive as usize] != 0, kas, "{name}");
        assert_eq!(l.acs[CreateIoSq as usize] != 0, !kas, "{name}");
        assert_eq!(l.acs[FormatNvm as usize], 0, "{name}");
        assert_eq!(l.iocs[NvmOpcode::Read as usize], effects::CSUPP);
        assert_eq!(l.iocs[NvmOpcode::Flush as usize], effects::CSUPP);
        for op in [
            NvmOpcode::Write,
            NvmOpcode::WriteZeroes,
            NvmOpcode::DatasetManagement,
        ] {
            assert_eq!(
                l.iocs[op as usize],
                effects::CSUPP | effects::LBCC,
                "{op:?}"
            );
        }
        assert_eq!(l.iocs[NvmOpcode::Compare as usize], 0);
    }
}

/// A log shorter than NUMD asks for comes back at the length asked for,
/// zero past its end (as Linux's nvmet sends it); an offset into it
/// shifts the data. Before, only the log's bytes were handed over, and
/// pollux target sent a short transfer that pollux's host failed.
#[test]
fn log_pages_are_zero_filled_to_the_length_asked_for() {
    let mut c = Controller::new(subsystem(fabrics(10), 5), 1);
    for (l, size) in [
        (lid::SMART, 512),
        (lid::FIRMWARE_SLOT, 512),
        (lid::ERROR, 64 * 64),
        (lid::COMMANDS_SUPPORTED, 4096),
    ] {
        let want = admin_data(&mut c, Sqe::get_log_page(l, 0, size as u32, 0, 0, 0)).unwrap();
        let d = admin_data(&mut c, Sqe::get_log_page(l, 0, 8192, 0, 0, 0)).unwrap();
        assert_eq!(d.len(), 8192, "LID {l:#x}");
        if l != lid::SMART {
            // (SMART's power-on hours may tick between two reads.)
            assert_eq!(&d[..size], &want[..], "LID {l:#x}");
        }
        assert!(
            d[size..].iter().all(|&b| b == 0),
            "LID {l:#x}: zeros past the log"
        );
        // 16 bytes in: the log's tail, then zeros.
        let d = admin_data(&mut c, Sqe::get_log_page(l, 0, 1024, 16, 0, 0)).unwrap();
        assert_eq!(d.len(), 1024);
        let n = (size - 16).min(1024);
        if l != lid::SMART {
            assert_eq!(&d[..n], &want[16..16 + n], "LID {l:#x}");
        }
        assert!(d[n..].iter().all(|&b| b == 0), "LID {l:#x}");
    }
}

#[test]
fn cc_enable_shutdown_reset() {
    let mut c = Controller::new(subsystem(fabrics(10), 5), 1);
    assert!(!c.is_running());
    assert_eq!(c.registers().csts(), 0);
    assert_eq!(c.registers().cap().mqes(), 127);
    let cc = Cc::standard(0).with_en(true);
    let ch = c.write_cc(cc.0);
    assert!(ch.enable && !ch.reset && ch.shutdown.is_none());
    assert_eq!(c.write_cc(cc.0), Default::default(), "no change, no event");
    assert_eq!(c.registers().check_enable(), Ok(4096));
    c.enable_done(Ok(()));
    assert!(c.is_running());
    assert_eq!(c.registers().csts(), Csts::RDY);
    // Shutdown notification.
    let ch = c.write_cc(cc.with_shn(1).0);
    assert_eq!(ch.shutdown, Some(1));
    assert!(!ch.enable && !ch.reset);
    c.shutdown_complete();
    assert_eq!(Csts(c.registers().csts()).shst(), shst::COMPLETE);
    assert!(!c.is_running());
    // Disable: reset, CSTS 0.
    let ch = c.write_cc(0);
    assert!(ch.reset);
    c.reset();
    assert_eq!(c.registers().csts(), 0);
    // A bad memory page size: CFS.
    let bad = Cc::standard(15).with_en(true);
    assert!(c.write_cc(bad.0).enable);
    let r = c.registers().check_enable();
    assert!(r.as_ref().is_err_and(|e| e.contains("MPS")), "{r:?}");
    c.enable_done(r.map(drop));
    assert!(Csts(c.registers().csts()).cfs());
    assert!(!c.is_running());
}

#[test]
fn async_io_over_ram() {
    let c = Controller::new(subsystem(fabrics(0), 1), 1); // MDTS 8 KiB
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    // Write 8 distinct 4 KiB units (namespace 2, 4 KiB blocks), tags 100+.
    let mut wbufs: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i ^ 0x5a; 4096]).collect();
    for (i, b) in wbufs.iter_mut().enumerate() {
        let cmd = q.check(&Sqe::rw(NvmOpcode::Write, 2, i as u64, 1)).unwrap();
        assert_eq!(cmd.xfer_len, 4096);
        let s = seg(b);
        // SAFETY: the buffers live (untouched) until polled below.
        unsafe { q.submit(100 + i as u32, &cmd, &s) }.unwrap();
    }
    assert_eq!(q.outstanding(), 8);
    // A ninth is beyond the depth.
    let cmd = q.check(&Sqe::flush(2)).unwrap();
    // SAFETY: no data.
    let full = unsafe { q.submit(1, &cmd, &[]) };
    assert!(
        matches!(full, Err(ControllerError::QueueFull { depth: 8 })),
        "{full:?}"
    );
    let mut got = Vec::new();
    while got.len() < 8 {
        q.poll(&mut |t, st| got.push((t, st)));
    }
    got.sort_by_key(|g| g.0);
    assert_eq!(
        got,
        (100..108).map(|t| (t, Status::SUCCESS)).collect::<Vec<_>>()
    );
    assert_eq!(q.outstanding(), 0);
    // Read them back as one 8 KiB command and one per unit, plus flush,
    // write zeroes and DSM.
    let mut rbufs: Vec<Vec<u8>> = (0..8).map(|_| vec![0u8; 4096]).collect();
    for (i, b) in rbufs.iter_mut().enumerate() {
        let cmd = q.check(&Sqe::rw(NvmOpcode::Read, 2, i as u64, 1)).unwrap();
        let s = seg(b);
        // SAFETY: as above.
        unsafe { q.submit(i as u32, &cmd, &s) }.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 8 {
        q.poll(&mut |t, st| got.push((t, st)));
    }
    assert!(got.iter().all(|g| g.1.is_success()), "{got:?}");
    assert_eq!(rbufs, wbufs);
    // Write zeroes of unit 3, then flush; read unit 3: zeroes.
    for (tag, sqe) in [
        (1u32, Sqe::write_zeroes(2, 3, 1, false)),
        (2, Sqe::flush(2)),
    ] {
        let cmd = q.check(&sqe).unwrap();
        // SAFETY: no data.
        unsafe { q.submit(tag, &cmd, &[]) }.unwrap();
        let mut got = Vec::new();
        while got.is_empty() {
            q.poll(&mut |t, st| got.push((t, st)));
        }
        assert_eq!(got, [(tag, Status::SUCCESS)]);
    }
    let mut b = vec![1u8; 4096];
    assert!(exec(&mut q, &Sqe::rw(NvmOpcode::Read, 2, 3, 1), &mut b).is_success());
    assert!(b.iter().all(|&x| x == 0));
    // A misaligned buffer (not whole blocks per segment) goes through the
    // bounce buffer, asynchronously all the same.
    let mut odd = vec![0u8; 8192 + 100];
    let segs = [
        RawSeg {
            ptr: odd.as_mut_ptr(),
            len: 100,
        },
        RawSeg {
            // SAFETY: within `odd`.
            ptr: unsafe { odd.as_mut_ptr().add(100) },
            len: 8192 - 100,
        },
    ];
    let cmd = q.check(&Sqe::rw(NvmOpcode::Read, 2, 4, 2)).unwrap();
    // SAFETY: `odd` untouched until polled.
    unsafe { q.submit(55, &cmd, &segs) }.unwrap();
    let mut got = Vec::new();
    q.poll(&mut |t, st| got.push((t, st)));
    assert_eq!(got, [(55, Status::SUCCESS)]);
    assert_eq!(&odd[..4096], &wbufs[4][..]);
    assert_eq!(&odd[4096..8192], &wbufs[5][..]);
}

/// `exec` on a queue with asynchronous commands outstanding: its own
/// status comes back from the call; the others' completions met while it
/// waited come out of the next `poll`, counted once.
#[test]
fn exec_among_outstanding_async_commands() {
    let c = Controller::new(subsystem(fabrics(0), 1), 1);
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 4 }).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..4u8).map(|i| vec![i + 1; 4096]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let cmd = q.check(&Sqe::rw(NvmOpcode::Write, 2, i as u64, 1)).unwrap();
        let s = seg(b);
        // SAFETY: the buffers live (untouched) until polled below.
        unsafe { q.submit(10 + i as u32, &cmd, &s) }.unwrap();
    }
    // A flush and a Write Zeroes with FUA (several requests) on the same
    // namespace: polled for within `exec`, which meets the writes.
    assert_eq!(exec(&mut q, &Sqe::flush(2), &mut []), Status::SUCCESS);
    let mut wz = Sqe::write_zeroes(2, 8, 4, false);
    wz.cdw12 |= 1 << 30;
    assert_eq!(exec(&mut q, &wz, &mut []), Status::SUCCESS);
    assert_eq!(q.outstanding(), 4);
    let mut b = vec![0u8; 4096];
    assert!(exec(&mut q, &Sqe::rw(NvmOpcode::Read, 2, 2, 1), &mut b).is_success());
    assert!(b.iter().all(|&x| x == 3));
    let mut got = Vec::new();
    while q.outstanding() > 0 {
        q.poll(&mut |t, st| got.push((t, st)));
    }
    got.sort_by_key(|g| g.0);
    assert_eq!(
        got,
        (10..14).map(|t| (t, Status::SUCCESS)).collect::<Vec<_>>()
    );
    let s = q.stats();
    assert_eq!((s.writes, s.bytes_written), (4, 4 * 4096));
    assert_eq!((s.reads, s.bytes_read), (1, 4096));
    assert_eq!(q.poll(&mut |_, _| panic!("delivered twice")), 0);
}

#[test]
fn io_refusals() {
    let c = Controller::new(subsystem(pcie(), 1), 1); // MDTS 8 KiB
    let q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let cases = [
        (
            Sqe::rw(NvmOpcode::Read, 3, 0, 1),
            g(generic::INVALID_NAMESPACE),
        ),
        (
            Sqe::rw(NvmOpcode::Read, 0, 0, 1),
            g(generic::INVALID_NAMESPACE),
        ),
        (Sqe::flush(9), g(generic::INVALID_NAMESPACE)),
        (
            Sqe::write_zeroes(0, 0, 1, false),
            g(generic::INVALID_NAMESPACE),
        ),
        (Sqe::dsm(5, 1, 0, 0), g(generic::INVALID_NAMESPACE)),
        (
            Sqe::rw(NvmOpcode::Write, 2, BLOCKS, 1),
            g(generic::LBA_OUT_OF_RANGE),
        ),
        (
            Sqe::rw(NvmOpcode::Read, 2, u64::MAX, 1),
            g(generic::LBA_OUT_OF_RANGE),
        ),
        (
            Sqe::write_zeroes(1, BLOCKS - 1, 2, false),
            g(generic::LBA_OUT_OF_RANGE),
        ),
        // 12 KiB > MDTS (8 KiB): checked before the range.
        (
            Sqe::rw(NvmOpcode::Read, 2, BLOCKS, 3),
            g(generic::INVALID_FIELD),
        ),
        (Sqe::new(0x7E, 1), g(generic::INVALID_OPCODE)),
    ];
    for (sqe, want) in cases {
        assert_eq!(q.check(&sqe), Err(want), "{sqe:?}");
    }
    // Fused commands; PCIe SGLs.
    let mut s = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
    s.flags = 1;
    assert_eq!(q.check(&s), Err(g(generic::INVALID_FIELD)));
    let mut s = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
    s.flags = 1 << 6;
    assert_eq!(q.check(&s), Err(g(generic::INVALID_FIELD)));
    // Synchronous-only queue: submit refuses.
    let mut q = q;
    let cmd = q.check(&Sqe::flush(1)).unwrap();
    // SAFETY: no data.
    let r = unsafe { q.submit(0, &cmd, &[]) };
    assert!(matches!(r, Err(ControllerError::QueueFull { depth: 0 })));
    // DSM ranges out of range: checked on the data.
    let mut r = [0u8; 16];
    r[4..8].copy_from_slice(&2u32.to_le_bytes()); // nlb
    r[8..16].copy_from_slice(&(BLOCKS - 1).to_le_bytes()); // slba
    assert_eq!(
        exec(&mut q, &Sqe::dsm(1, 1, 1 << 2, 0), &mut r),
        g(generic::LBA_OUT_OF_RANGE)
    );
}

#[test]
fn failing_bdev_completes_every_outstanding_command() {
    let sub = subsystem(fabrics(0), 5);
    let c = Controller::new(sub.clone(), 1);
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 16 }).unwrap();
    let mut bufs: Vec<Vec<u8>> = (0..12).map(|_| vec![3u8; 4096]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let op = if i % 2 == 0 {
            NvmOpcode::Read
        } else {
            NvmOpcode::Write
        };
        let cmd = q.check(&Sqe::rw(op, 2, i as u64, 1)).unwrap();
        let s = seg(b);
        // SAFETY: the buffers outlive the polls below.
        unsafe { q.submit(i as u32, &cmd, &s) }.unwrap();
    }
    for sqe in [Sqe::flush(2), Sqe::write_zeroes(2, 0, 1, true)] {
        let cmd = q.check(&sqe).unwrap();
        // SAFETY: no data.
        unsafe { q.submit(90 + sqe.opc as u32, &cmd, &[]) }.unwrap();
    }
    assert!(sub.namespace(2).unwrap().bdev().inject_failure());
    // Submitted after the failure: refused, still delivered.
    let cmd = q.check(&Sqe::rw(NvmOpcode::Read, 2, 0, 1)).unwrap();
    let mut late = vec![0u8; 4096];
    let s = seg(&mut late);
    // SAFETY: as above.
    unsafe { q.submit(50, &cmd, &s) }.unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        q.poll(&mut |t, st| got.push((t, st)));
        if q.outstanding() == 0 {
            break;
        }
    }
    assert_eq!(q.outstanding(), 0);
    got.sort_by_key(|g| g.0);
    let ure = Status::media(media::UNRECOVERED_READ_ERROR);
    let wf = Status::media(media::WRITE_FAULT);
    let mut want: Vec<(u32, Status)> = (0..12)
        .map(|i| (i, if i % 2 == 0 { ure } else { wf }))
        .collect();
    want.push((50, ure));
    want.push((90 + NvmOpcode::Flush as u32, wf));
    want.push((90 + NvmOpcode::WriteZeroes as u32, wf));
    want.sort_by_key(|g| g.0);
    assert_eq!(got, want);
    // Nothing counted as read or written.
    assert_eq!(q.stats().reads + q.stats().writes, 0);
}

/// Get Log Page Error Information of `c`: its entries, newest first.
fn error_log(c: &mut Controller) -> Vec<ErrorLogEntry> {
    let d = admin_data(c, Sqe::get_log_page(lid::ERROR, 0, 64 * 64, 0, 0, 0)).unwrap();
    d.chunks_exact(64)
        .map(|e| ErrorLogEntry::read_from_bytes(e).unwrap())
        .take_while(|e| e.error_count != 0)
        .collect()
}

#[test]
fn io_queue_failures_reach_the_error_log_and_smart() {
    let sub = subsystem(fabrics(0), 5);
    let mut c = Controller::new(sub.clone(), 1);
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 16 }).unwrap();
    q.report_errors(3);
    // A queue that does not report (the emulator's kind): its failures
    // are its transport's to account.
    let mut quiet = IoQueue::for_controller(&c, IoQueueOptions { depth: 4 }).unwrap();
    assert_eq!(smart(&mut c).media_errors(), 0);
    assert!(error_log(&mut c).is_empty());

    // A command the checks refuse: a generic error, with its CID and LBA.
    let mut bad = Sqe::rw(NvmOpcode::Read, 2, BLOCKS, 1);
    bad.cid = 0x42;
    assert_eq!(q.check_reported(&bad), Err(g(generic::LBA_OUT_OF_RANGE)));
    assert!(quiet.check_reported(&bad).is_err());
    // Reads and a write in flight when the namespace's bdev fails, and a
    // read submitted after (refused at submission).
    let mut bufs: Vec<Vec<u8>> = (0..5).map(|_| vec![0u8; 4096]).collect();
    for (i, b) in bufs.iter_mut().enumerate() {
        let op = if i == 4 {
            NvmOpcode::Write
        } else {
            NvmOpcode::Read
        };
        let mut sqe = Sqe::rw(op, 2, 10 + i as u64, 1);
        sqe.cid = 0x100 + i as u16;
        let cmd = q.check_reported(&sqe).unwrap();
        let s = seg(b);
        // SAFETY: the buffers outlive the polls below.
        unsafe { q.submit(i as u32, &cmd, &s) }.unwrap();
    }
    assert!(sub.namespace(2).unwrap().bdev().inject_failure());
    let mut late = vec![0u8; 4096];
    let mut sqe = Sqe::rw(NvmOpcode::Read, 2, 30, 1);
    sqe.cid = 0x200;
    let cmd = q.check_reported(&sqe).unwrap();
    let s = seg(&mut late);
    // SAFETY: as above.
    unsafe { q.submit(7, &cmd, &s) }.unwrap();
    let mut quiet_buf = vec![0u8; 4096];
    assert!(!exec(
        &mut quiet,
        &Sqe::rw(NvmOpcode::Read, 2, 0, 1),
        &mut quiet_buf
    )
    .is_success());
    let mut got = Vec::new();
    while q.outstanding() > 0 {
        q.poll(&mut |t, st| got.push((t, st)));
    }
    assert_eq!(got.len(), 6);

    // Newest first: the five in flight (failed at the poll, in completion
    // order), the late read (refused at submission), the check failure.
    let log = error_log(&mut c);
    assert_eq!(log.len(), 7, "{log:?}");
    let ure = Status::media(media::UNRECOVERED_READ_ERROR);
    let wf = Status::media(media::WRITE_FAULT);
    assert_eq!((log[5].cid, log[5].lba, log[5].status()), (0x200, 30, ure));
    let mut inflight: Vec<(u16, u64, Status)> = log[..5]
        .iter()
        .map(|e| (e.cid, e.lba, e.status()))
        .collect();
    inflight.sort_by_key(|e| e.0);
    let want: Vec<(u16, u64, Status)> = (0..5)
        .map(|i| (0x100 + i, 10 + i as u64, if i == 4 { wf } else { ure }))
        .collect();
    assert_eq!(inflight, want);
    assert_eq!((log[6].cid, log[6].lba), (0x42, BLOCKS));
    assert!(log[6].status().is(sct::GENERIC, generic::LBA_OUT_OF_RANGE));
    for (i, e) in log.iter().enumerate() {
        assert_eq!((e.sqid, e.nsid), (3, 2), "entry {i}");
        assert_eq!(e.error_count, 7 - i as u64, "entry {i}");
    }
    let s = smart(&mut c);
    assert_eq!(s.media_errors(), 6, "the check failure is no media error");
    assert_eq!(s.num_err_log_entries(), 7);

    // More failures than the log holds between two reads: the newest are
    // kept, every one is counted.
    for cid in 0..100u16 {
        let mut bad = Sqe::rw(NvmOpcode::Write, 1, BLOCKS + 5, 1);
        bad.cid = cid;
        assert!(q.check_reported(&bad).is_err());
    }
    let s = smart(&mut c);
    assert_eq!(s.num_err_log_entries(), 107);
    assert_eq!(s.media_errors(), 6);
    let log = error_log(&mut c);
    assert_eq!(log.len(), 64);
    assert_eq!((log[0].error_count, log[0].cid), (107, 99));
    assert_eq!((log[63].error_count, log[63].cid), (44, 36));
    assert!(log.iter().all(|e| e.sqid == 3 && e.nsid == 1));
    // Reported without a known SQID: FFFFh.
    let mut anon = IoQueue::for_controller(&c, IoQueueOptions { depth: 1 }).unwrap();
    anon.report_errors(ERROR_LOG_NOT_SPECIFIC);
    assert!(anon
        .check_reported(&Sqe::rw(NvmOpcode::Read, 9, 0, 1))
        .is_err());
    let log = error_log(&mut c);
    assert_eq!(
        (log[0].sqid, log[0].nsid, log[0].error_count),
        (0xFFFF, 9, 108)
    );
}
