//! Admin command conformance: Identify, queue creation/deletion checks,
//! features, log pages, AER, Abort limits, Doorbell Buffer Config.
mod common;

use common::*;
use pollux_softnvme::consts::{CNTLID, VID};
use pollux_softnvme::SoftConfig;
use pollux_spec::cmd::cns;
use pollux_spec::features::{fid, NumberOfQueues};
use pollux_spec::identify::{
    parse_ns_descriptors, IdentifyController, IdentifyNamespace, NsDescriptor, NsIdList,
    OACS_DBBUF_CONFIG, ONCS_DSM, ONCS_WRITE_ZEROES, VWC_PRESENT,
};
use pollux_spec::log::{lid, ErrorLogEntry, FirmwareSlotLog, SmartLog};
use pollux_spec::regs::{off, Cc};
use pollux_spec::status::{generic, sct, specific};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

fn g(sc: u8) -> (u8, u8) {
    (sct::GENERIC, sc)
}
fn s(sc: u8) -> (u8, u8) {
    (sct::COMMAND_SPECIFIC, sc)
}
#[track_caller]
fn check(st: Status, want: (u8, u8)) {
    assert!(
        st.is(want.0, want.1),
        "got {st}, want sct {:#x} sc {:#x}",
        want.0,
        want.1
    );
}

fn identify(h: &mut Host, cns_v: u8, nsid: u32) -> (Status, Vec<u8>) {
    let (buf, _) = h.alloc(4096);
    let st = h.admin_status(Sqe::identify(cns_v, nsid, buf));
    (st, h.read_mem(buf, 4096))
}

#[test]
fn identify_controller() {
    let mut h = Host::enabled(SoftConfig {
        serial: "SERIAL42".into(),
        model: "model x".into(),
        firmware: "1.2".into(),
        mdts: 6,
        abort_limit: 2,
        aer_limit: 5,
        ..cfg_ram()
    });
    let (st, d) = identify(&mut h, cns::CONTROLLER, 0);
    check(st, g(generic::SUCCESS));
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_eq!(id.vid, VID);
    assert_eq!(id.cntlid, CNTLID);
    assert_eq!(id.serial(), "SERIAL42");
    assert_eq!(id.model(), "model x");
    assert_eq!(id.firmware_rev(), "1.2");
    assert_eq!(id.mdts, 6);
    assert_eq!(id.ver, 0x0002_0000);
    assert_ne!(id.oacs & OACS_DBBUF_CONFIG, 0);
    assert_eq!(id.acl, 2);
    assert_eq!(id.aerl, 5);
    assert_eq!(id.frmw, 0x03);
    assert_eq!(id.elpe, 63);
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.nn, 1024); // the most namespaces (live add)
    assert_eq!(
        id.oncs & (ONCS_DSM | ONCS_WRITE_ZEROES),
        ONCS_DSM | ONCS_WRITE_ZEROES
    );
    assert_ne!(id.vwc & VWC_PRESENT, 0);
    assert_eq!(id.subnqn_str(), "nqn.2024-01.io.pollux:softnvme:SERIAL42");
    assert_eq!(id.max_transfer_bytes(4096), Some(256 * 1024));

    let mut h = Host::enabled(SoftConfig {
        shadow_doorbells: false,
        ..cfg_ram()
    });
    let (_, d) = identify(&mut h, cns::CONTROLLER, 0);
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_eq!(id.oacs & OACS_DBBUF_CONFIG, 0);
    // And the command is then unknown.
    check(
        h.admin_status(Sqe::doorbell_buffer_config(0x100000, 0x101000)),
        g(generic::INVALID_OPCODE),
    );
}

#[test]
fn identify_namespace_and_lists() {
    let mut h = Host::enabled(cfg_ram());
    for (nsid, shift, idx) in [(1u32, 9u8, 0u8), (2, 12, 1)] {
        let (st, d) = identify(&mut h, cns::NAMESPACE, nsid);
        check(st, g(generic::SUCCESS));
        let ns = IdentifyNamespace::read_from_bytes(&d).unwrap();
        let blocks = (64u64 << 20) >> shift;
        assert_eq!((ns.nsze, ns.ncap, ns.nuse), (blocks, blocks, blocks));
        assert_eq!(ns.nlbaf, 1);
        assert_eq!(ns.lbaf[0].lbads, 9);
        assert_eq!(ns.lbaf[1].lbads, 12);
        assert_eq!(ns.lba_format_index(), idx);
        assert_eq!(ns.lba_size(), 1 << shift);
        assert_eq!(ns.dlfeat & 0x7, 1, "deallocated blocks read zeroes");
    }
    // An inactive NSID (up to NN): zeros, as the spec says; else Invalid
    // Namespace.
    let (st, d) = identify(&mut h, cns::NAMESPACE, 3);
    check(st, g(generic::SUCCESS));
    assert!(d.iter().all(|&b| b == 0));
    for bad in [0u32, 1025, 0xFFFF_FFFF] {
        check(
            identify(&mut h, cns::NAMESPACE, bad).0,
            g(generic::INVALID_NAMESPACE),
        );
    }
    // Active namespace list.
    let (st, d) = identify(&mut h, cns::ACTIVE_NS_LIST, 0);
    check(st, g(generic::SUCCESS));
    let l = NsIdList::read_from_bytes(&d).unwrap();
    assert_eq!(l.iter().collect::<Vec<_>>(), vec![1, 2]);
    let (_, d) = identify(&mut h, cns::ACTIVE_NS_LIST, 1);
    assert_eq!(
        NsIdList::read_from_bytes(&d)
            .unwrap()
            .iter()
            .collect::<Vec<_>>(),
        vec![2]
    );
    let (_, d) = identify(&mut h, cns::ACTIVE_NS_LIST, 2);
    assert!(NsIdList::read_from_bytes(&d).unwrap().is_empty());
    check(
        identify(&mut h, cns::ACTIVE_NS_LIST, 0xFFFF_FFFE).0,
        g(generic::INVALID_NAMESPACE),
    );
    // Descriptors: deterministic, distinct per namespace, CSI = NVM.
    let (st, d1) = identify(&mut h, cns::NS_DESCRIPTORS, 1);
    check(st, g(generic::SUCCESS));
    let l1 = parse_ns_descriptors(&d1).unwrap();
    assert_eq!(l1.len(), 4);
    assert!(l1.contains(&NsDescriptor::Csi(0)));
    assert!(l1.iter().any(|d| matches!(d, NsDescriptor::Eui64(_))));
    assert!(l1.iter().any(|d| matches!(d, NsDescriptor::Nguid(_))));
    assert!(l1.iter().any(|d| matches!(d, NsDescriptor::Uuid(_))));
    let (_, d2) = identify(&mut h, cns::NS_DESCRIPTORS, 2);
    assert_ne!(parse_ns_descriptors(&d2).unwrap(), l1);
    let mut h2 = Host::enabled(cfg_ram());
    let (_, again) = identify(&mut h2, cns::NS_DESCRIPTORS, 1);
    assert_eq!(parse_ns_descriptors(&again).unwrap(), l1);
    check(
        identify(&mut h, cns::NS_DESCRIPTORS, 9).0,
        g(generic::INVALID_NAMESPACE),
    );
    // Unknown CNS.
    check(identify(&mut h, 0x1F, 0).0, g(generic::INVALID_FIELD));
}

#[test]
fn create_queue_checks() {
    let mut h = Host::enabled(SoftConfig {
        mqes: 255,
        max_io_queues: 4,
        ..cfg_ram()
    });
    let (b, _) = h.alloc(256 * 64);
    // Create CQ.
    check(
        h.admin_status(Sqe::create_io_cq(0, 16, b)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::create_io_cq(5, 16, b)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::create_io_cq(1, 1, b)),
        s(specific::INVALID_QUEUE_SIZE),
    );
    check(
        h.admin_status(Sqe::create_io_cq(1, 257, b)),
        s(specific::INVALID_QUEUE_SIZE),
    );
    let mut nopc = Sqe::create_io_cq(1, 16, b);
    nopc.cdw11 = 0;
    check(h.admin_status(nopc), g(generic::INVALID_FIELD));
    check(
        h.admin_status(Sqe::create_io_cq(1, 16, 0x7000_0000_0000)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::create_io_cq(1, 16, b + 512)),
        g(generic::PRP_OFFSET_INVALID),
    );
    check(
        h.admin_status(Sqe::create_io_cq(1, 256, b)),
        g(generic::SUCCESS),
    );
    check(
        h.admin_status(Sqe::create_io_cq(1, 16, b)),
        s(specific::INVALID_QID),
    );
    // Create SQ.
    let (sb, _) = h.alloc(256 * 64);
    check(
        h.admin_status(Sqe::create_io_sq(0, 16, 1, sb)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::create_io_sq(5, 16, 1, sb)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 16, 0, sb)),
        s(specific::INVALID_CQ),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 16, 2, sb)),
        s(specific::INVALID_CQ),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 1, 1, sb)),
        s(specific::INVALID_QUEUE_SIZE),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 300, 1, sb)),
        s(specific::INVALID_QUEUE_SIZE),
    );
    let mut nopc = Sqe::create_io_sq(1, 16, 1, sb);
    nopc.cdw11 &= !1;
    check(h.admin_status(nopc), g(generic::INVALID_FIELD));
    check(
        h.admin_status(Sqe::create_io_sq(1, 16, 1, 0x7000_0000_0000)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 256, 1, sb)),
        g(generic::SUCCESS),
    );
    check(
        h.admin_status(Sqe::create_io_sq(1, 16, 1, sb)),
        s(specific::INVALID_QID),
    );
    // Two SQs on one CQ.
    let (sb2, _) = h.alloc(16 * 64);
    check(
        h.admin_status(Sqe::create_io_sq(2, 16, 1, sb2)),
        g(generic::SUCCESS),
    );
    // Delete: CQ with SQs bound, then the right order.
    check(
        h.admin_status(Sqe::delete_io_cq(1)),
        s(specific::INVALID_QUEUE_DELETION),
    );
    check(
        h.admin_status(Sqe::delete_io_cq(0)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::delete_io_sq(0)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::delete_io_sq(3)),
        s(specific::INVALID_QID),
    );
    check(h.admin_status(Sqe::delete_io_sq(1)), g(generic::SUCCESS));
    check(
        h.admin_status(Sqe::delete_io_sq(1)),
        s(specific::INVALID_QID),
    );
    check(
        h.admin_status(Sqe::delete_io_cq(1)),
        s(specific::INVALID_QUEUE_DELETION),
    );
    check(h.admin_status(Sqe::delete_io_sq(2)), g(generic::SUCCESS));
    check(h.admin_status(Sqe::delete_io_cq(1)), g(generic::SUCCESS));
    check(
        h.admin_status(Sqe::delete_io_cq(1)),
        s(specific::INVALID_QID),
    );
}

#[test]
fn create_queue_requires_entry_sizes() {
    let mut h = Host::new(cfg_ram());
    h.setup_admin(16, 16);
    // Enable without IOSQES/IOCQES.
    h.w32(off::CC, Cc(1).0);
    h.steps(2);
    assert!(h.csts().rdy());
    let (b, _) = h.alloc(4096);
    check(
        h.admin_status(Sqe::create_io_cq(1, 16, b)),
        g(generic::INVALID_FIELD),
    );
}

#[test]
fn delete_sq_aborts_unfetched_commands() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(4096);
    // Submit without letting the device step, then delete the SQ.
    let mut cids = vec![];
    for i in 0..3 {
        let mut sqe = rw(NvmOpcode::Read, 1, i, 1, buf, 0);
        sqe.cid = h.cid();
        cids.push(sqe.cid);
        Host::push(&mut q.sq, sqe);
    }
    h.w32(pollux_spec::regs::sq_tail_doorbell(1, 0), q.sq.tail);
    h.admin_submit(Sqe::delete_io_sq(1));
    let c = h.wait_admin(10).unwrap();
    assert!(c.status().is_success());
    for cid in cids {
        let c = Host::take(&mut q.cq).expect("aborted completion");
        assert_eq!(c.cid, cid);
        check(c.status(), g(generic::ABORTED_SQ_DELETION));
    }
}

#[test]
fn number_of_queues_feature() {
    let mut h = Host::enabled(SoftConfig {
        max_io_queues: 8,
        ..cfg_ram()
    });
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES, 0));
    assert_eq!(NumberOfQueues::from_dw0(c.dw0), NumberOfQueues::new(8, 8));
    check(
        h.admin_status(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0xFFFF)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0xFFFF_0000)),
        g(generic::INVALID_FIELD),
    );
    let c = h.admin(Sqe::set_features(
        fid::NUMBER_OF_QUEUES,
        0,
        NumberOfQueues::new(100, 2).to_cdw11(),
    ));
    assert!(c.status().is_success());
    assert_eq!(NumberOfQueues::from_dw0(c.dw0), NumberOfQueues::new(8, 2));
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES, 0));
    assert_eq!(NumberOfQueues::from_dw0(c.dw0), NumberOfQueues::new(8, 2));
    // Only 2 CQs granted now.
    let (b, _) = h.alloc(4096);
    check(
        h.admin_status(Sqe::create_io_cq(3, 16, b)),
        s(specific::INVALID_QID),
    );
    let _q = h.create_ioq(1, 16);
    check(
        h.admin_status(Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, 0)),
        g(generic::COMMAND_SEQUENCE_ERROR),
    );
    // Reset restores the default.
    h.set_enable(false);
    h.set_enable(true);
    let c = h.admin(Sqe::get_features(fid::NUMBER_OF_QUEUES, 0));
    assert_eq!(NumberOfQueues::from_dw0(c.dw0), NumberOfQueues::new(8, 8));
}

#[test]
fn other_features() {
    let mut h = Host::enabled(cfg_ram());
    // VWC on by default, can be turned off.
    assert_eq!(
        h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0)).dw0 & 1,
        1
    );
    check(
        h.admin_status(Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0, 0)),
        g(generic::SUCCESS),
    );
    assert_eq!(
        h.admin(Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0)).dw0 & 1,
        0
    );
    // Default SEL still reports enabled.
    let mut get_default = Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0);
    get_default.cdw10 |= 1 << 8;
    assert_eq!(h.admin(get_default).dw0 & 1, 1);
    // Arbitration, AEC, temperature threshold round trip.
    h.admin_status(Sqe::set_features(fid::ARBITRATION, 0, 0x0102_0303));
    assert_eq!(
        h.admin(Sqe::get_features(fid::ARBITRATION, 0)).dw0,
        0x0102_0303
    );
    h.admin_status(Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 0xFF));
    assert_eq!(
        h.admin(Sqe::get_features(fid::ASYNC_EVENT_CONFIG, 0)).dw0,
        0xFF
    );
    h.admin_status(Sqe::set_features(fid::TEMPERATURE_THRESHOLD, 0, 350));
    assert_eq!(
        h.admin(Sqe::get_features(fid::TEMPERATURE_THRESHOLD, 0))
            .dw0
            & 0xFFFF,
        350
    );
    check(
        h.admin_status(Sqe::set_features(
            fid::TEMPERATURE_THRESHOLD,
            0,
            350 | 3 << 20,
        )),
        g(generic::INVALID_FIELD),
    );
    // Unsupported feature, saving.
    check(
        h.admin_status(Sqe::get_features(fid::KEEP_ALIVE, 0)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::set_features(fid::AUTONOMOUS_POWER_STATE, 0, 0)),
        g(generic::INVALID_FIELD),
    );
    // Power Management: power state 0 only (NPSS 0).
    check(
        h.admin_status(Sqe::set_features(fid::POWER_MANAGEMENT, 0, 0)),
        g(generic::SUCCESS),
    );
    check(
        h.admin_status(Sqe::set_features(fid::POWER_MANAGEMENT, 0, 1)),
        g(generic::INVALID_FIELD),
    );
    let mut save = Sqe::set_features(fid::ARBITRATION, 0, 0);
    save.cdw10 |= 1 << 31;
    check(h.admin_status(save), s(specific::FEATURE_NOT_SAVEABLE));
}

fn get_log(h: &mut Host, id: u8, len: u32, offset: u64, rae: bool) -> (Status, Vec<u8>) {
    let (buf, _) = h.alloc(len as usize);
    let mut sqe = Sqe::get_log_page(id, 0xFFFF_FFFF, len, offset, buf, 0);
    if rae {
        sqe.cdw10 |= 1 << 15;
    }
    let st = h.admin_status(sqe);
    (st, h.read_mem(buf, len as usize))
}

#[test]
fn smart_log_counts_io() {
    let mut h = Host::enabled(cfg_ram());
    let (st, d) = get_log(&mut h, lid::SMART, 512, 0, false);
    check(st, g(generic::SUCCESS));
    let before = SmartLog::read_from_bytes(&d).unwrap();
    assert_eq!(before.host_read_commands(), 0);
    assert_eq!(before.power_cycles(), 1);
    assert!(before.temperature() > 273);
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(8192);
    for i in 0..3 {
        assert!(h
            .io_status(&mut q, rw(NvmOpcode::Write, 2, i, 2, buf, buf + 4096))
            .is_success());
    }
    assert!(h
        .io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, buf, 0))
        .is_success());
    let (_, d) = get_log(&mut h, lid::SMART, 512, 0, false);
    let after = SmartLog::read_from_bytes(&d).unwrap();
    assert_eq!(after.host_write_commands(), 3);
    assert_eq!(after.host_read_commands(), 1);
    assert_eq!(after.data_units_written(), 1); // 24 KiB -> 1 unit (rounded up)
    assert_eq!(after.data_units_read(), 1);
    // Offset and partial length.
    let (st, part) = get_log(&mut h, lid::SMART, 16, 32, false);
    check(st, g(generic::SUCCESS));
    assert_eq!(part, d[32..48]);
    check(
        get_log(&mut h, lid::SMART, 4, 2, false).0,
        g(generic::INVALID_FIELD),
    );
    check(
        get_log(&mut h, lid::SMART, 4, 516, false).0,
        g(generic::INVALID_FIELD),
    );
    // Per-namespace SMART is not supported.
    let (b, _) = h.alloc(512);
    check(
        h.admin_status(Sqe::get_log_page(lid::SMART, 1, 512, 0, b, 0)),
        g(generic::INVALID_FIELD),
    );
    // Unknown log.
    check(
        get_log(&mut h, 0x7E, 512, 0, false).0,
        s(specific::INVALID_LOG_PAGE),
    );
    // Too large for MDTS (128 KiB).
    check(
        get_log(&mut h, lid::ERROR, 256 * 1024, 0, false).0,
        g(generic::INVALID_FIELD),
    );
}

#[test]
fn error_log_records_failed_command() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    let (buf, _) = h.alloc(4096);
    let cid = h.submit(&mut q, rw(NvmOpcode::Read, 1, u64::MAX - 2, 1, buf, 0));
    let c = h.wait_io(&mut q, 10).unwrap();
    check(c.status(), g(generic::LBA_OUT_OF_RANGE));
    let (st, d) = get_log(&mut h, lid::ERROR, 4096, 0, false);
    check(st, g(generic::SUCCESS));
    let e = ErrorLogEntry::read_from_bytes(&d[..64]).unwrap();
    assert_eq!(e.error_count, 1);
    assert_eq!(e.sqid, 1);
    assert_eq!(e.cid, cid);
    assert!(e.status().is(sct::GENERIC, generic::LBA_OUT_OF_RANGE));
    assert_eq!(e.nsid, 1);
    assert_eq!(e.lba, u64::MAX - 2);
    assert!(d[64..].iter().all(|&b| b == 0));
    // A second error becomes the newest entry.
    check(
        h.admin_status(Sqe::new(0xC3, 0)),
        g(generic::INVALID_OPCODE),
    );
    let (_, d) = get_log(&mut h, lid::ERROR, 128, 0, false);
    let e0 = ErrorLogEntry::read_from_bytes(&d[..64]).unwrap();
    let e1 = ErrorLogEntry::read_from_bytes(&d[64..128]).unwrap();
    assert_eq!((e0.error_count, e0.sqid), (2, 0));
    assert_eq!(e1.error_count, 1);
    let (_, d) = get_log(&mut h, lid::SMART, 512, 0, false);
    assert_eq!(
        SmartLog::read_from_bytes(&d).unwrap().num_err_log_entries(),
        2
    );
    assert_eq!(h.dev.stats().errors, 2);
}

#[test]
fn firmware_slot_log() {
    let mut h = Host::enabled(SoftConfig {
        firmware: "FW9".into(),
        ..cfg_ram()
    });
    let (st, d) = get_log(&mut h, lid::FIRMWARE_SLOT, 512, 0, false);
    check(st, g(generic::SUCCESS));
    let fw = FirmwareSlotLog::read_from_bytes(&d).unwrap();
    assert_eq!(fw.active_slot(), 1);
    assert_eq!(fw.revision(1).unwrap(), "FW9");
}

#[test]
fn unknown_admin_opcode_and_fields() {
    let mut h = Host::enabled(cfg_ram());
    check(
        h.admin_status(Sqe::new(0xEE, 0)),
        g(generic::INVALID_OPCODE),
    );
    // Unsupported but defined opcodes too.
    check(
        h.admin_status(Sqe::new(0x80, 0)),
        g(generic::INVALID_OPCODE),
    );
    // SGLs are not supported.
    let (b, _) = h.alloc(4096);
    let mut sgl = Sqe::identify(cns::CONTROLLER, 0, b);
    sgl.flags = 1 << 6;
    check(h.admin_status(sgl), g(generic::INVALID_FIELD));
}

#[test]
fn aer_limit_and_abort() {
    let mut h = Host::enabled(SoftConfig {
        aer_limit: 1,
        ..cfg_ram()
    });
    let a1 = h.admin_submit(Sqe::async_event_request());
    let a2 = h.admin_submit(Sqe::async_event_request());
    let c = h.admin(Sqe::async_event_request()); // third: over AERL + 1
    check(c.status(), s(specific::AER_LIMIT_EXCEEDED));
    // Abort an outstanding AER.
    let abort_cid = h.admin_submit(Sqe::abort(0, a2));
    let mut got = vec![];
    for _ in 0..2 {
        got.push(h.wait_admin(10).unwrap());
    }
    let aborted = got.iter().find(|c| c.cid == a2).expect("AER completion");
    check(aborted.status(), g(generic::ABORT_REQUESTED));
    let ab = got.iter().find(|c| c.cid == abort_cid).unwrap();
    assert!(ab.status().is_success());
    assert_eq!(ab.dw0 & 1, 0, "command was aborted");
    // Abort of something unknown: dw0 bit 0 = 1.
    let c = h.admin(Sqe::abort(1, 0x777));
    assert!(c.status().is_success());
    assert_eq!(c.dw0 & 1, 1);
    let _ = a1;
}

#[test]
fn shadow_doorbells_carry_io_without_mmio() {
    let mut h = Host::enabled(cfg_ram());
    let (db_iova, db) = h.alloc(4096);
    let (ei_iova, ei) = h.alloc(4096);
    check(
        h.admin_status(Sqe::doorbell_buffer_config(db_iova + 8, ei_iova)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::doorbell_buffer_config(db_iova, 0x7000_0000_0000)),
        g(generic::INVALID_FIELD),
    );
    check(
        h.admin_status(Sqe::doorbell_buffer_config(db_iova, ei_iova)),
        g(generic::SUCCESS),
    );
    assert!(h.dev.stats().shadow_doorbell_enabled);
    h.shadow = Some(Shadow {
        db,
        ei,
        db_iova,
        ei_iova,
    });
    let mut q = h.create_ioq(1, 8);
    let (buf, _) = h.alloc(4096);
    h.write_mem(buf, &[0x5A; 4096]);
    let before = h.mmio_io_doorbells;
    // Several wraps of an 8-entry queue, one command at a time and batches.
    for i in 0..40u64 {
        let s = h.io_status(&mut q, rw(NvmOpcode::Write, 2, i, 1, buf, 0));
        assert!(s.is_success());
    }
    for _ in 0..5 {
        let mut cids = vec![];
        for i in 0..7u64 {
            cids.push(h.submit(&mut q, rw(NvmOpcode::Read, 2, i, 1, buf, 0)));
        }
        for _ in 0..7 {
            let c = h
                .wait_io(&mut q, 20)
                .expect("completion via shadow doorbells");
            assert!(c.status().is_success());
        }
    }
    // The controller polls the shadow values and publishes event index
    // 0xFFFF: the host's need_event rule asks for an MMIO write only when
    // an index wraps the ring. 75 commands through 8-entry queues wrap the
    // SQ 9 times and the CQ 9 times (the test host rings the CQ head after
    // every completion).
    let wraps = 75 / 8;
    let mmio = h.mmio_io_doorbells - before;
    assert!(
        mmio <= 2 * wraps,
        "{mmio} MMIO doorbell writes for {wraps} wraps per queue"
    );
    assert!(mmio >= wraps, "the need_event rule fires at wraps ({mmio})");
    for (name, off) in [
        ("SQ", pollux_spec::regs::sq_tail_doorbell(1, 0)),
        ("CQ", pollux_spec::regs::cq_head_doorbell(1, 0)),
    ] {
        let rel = (off - pollux_spec::regs::off::DOORBELL_BASE) as u64;
        let ei_iova = h.shadow.as_ref().map(|s| s.ei_iova).unwrap_or(0);
        let b = h.read_mem(ei_iova + rel, 4);
        let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(v, 0xFFFF, "{name} event index");
    }
    // Reset disables the shadow buffer.
    h.set_enable(false);
    h.step();
    assert!(!h.dev.stats().shadow_doorbell_enabled);
}
