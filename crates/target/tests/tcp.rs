//! The target over loopback, driven by a PDU-level test host.
mod common;

use common::*;
use pollux_spec::cmd::cns;
use pollux_spec::fabrics::{fabrics_sc, PropertySize, SglDescriptor};
use pollux_spec::features::fid;
use pollux_spec::identify::{IdentifyController, IdentifyNamespace, CNTRLTYPE_IO};
use pollux_spec::status::{generic, sct};
use pollux_spec::tcp::Digests;
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

#[test]
fn icresp_agrees_with_the_hosts_digests() {
    let t = ram_target(2048);
    let addr = t.listen_addrs()[0];
    for dg in [
        Digests::NONE,
        Digests::BOTH,
        Digests { header: true, data: false },
        Digests { header: false, data: true },
    ] {
        let mut c = Client::connect(addr);
        let r = c.ic(dg);
        r.check().unwrap();
        assert_eq!(r.pfv, 0);
        assert_eq!(r.cpda, 0);
        assert_eq!(r.digests(), dg);
        assert!(r.maxh2cdata >= 4096 && r.maxh2cdata % 4 == 0);
        // The connection works with those digests.
        let cq = c.admin_connect(SUB1, HOST_A, 0);
        assert!(cq.status().is_success());
    }
}

#[test]
fn admin_bring_up_properties_and_identify() {
    let t = ram_target(2048);
    let addr = t.listen_addrs()[0];
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let r = c.admin_connect(SUB1, HOST_A, 0);
    assert!(r.status().is_success());
    let cntlid = r.dw0 as u16;
    assert!(cntlid != 0 && cntlid < 0xFFF0, "dynamic cntlid {cntlid}");
    // Before CC.EN: not ready, admin commands are a sequence error.
    let cap = c.prop_get(0x00, PropertySize::Eight);
    assert!(cap.status().is_success());
    let cap = cap.dw0 as u64 | (cap.dw1 as u64) << 32;
    assert_eq!(cap & 0xFFFF, 127, "CAP.MQES");
    let vs = c.prop_get(0x08, PropertySize::Four);
    assert_eq!(vs.dw0, 0x0002_0000);
    assert_eq!(c.prop_get(0x1C, PropertySize::Four).dw0 & 1, 0);
    // CAP read as 4 bytes, an unknown property: Invalid Field.
    assert!(c.prop_get(0x00, PropertySize::Four).status().is(sct::GENERIC, generic::INVALID_FIELD));
    let (_, cq) = c.data_cmd(Sqe::identify(cns::CONTROLLER, 0, 0), 4096);
    assert!(cq.unwrap().status().is(sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR));
    let cc = pollux_spec::regs::Cc::standard(0).with_en(true);
    assert!(c.prop_set(0x14, cc.0 as u64).status().is_success());
    assert_eq!(c.prop_get(0x14, PropertySize::Four).dw0, cc.0);
    assert_eq!(c.prop_get(0x1C, PropertySize::Four).dw0 & 1, 1, "CSTS.RDY");

    let (data, cq) = c.data_cmd(Sqe::identify(cns::CONTROLLER, 0, 0), 4096);
    assert!(cq.unwrap().status().is_success());
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!(id.cntrltype, CNTRLTYPE_IO);
    assert_eq!(id.cntlid, cntlid);
    assert_eq!(id.ioccsz, (64 + 4096) / 16);
    assert_eq!(id.iorcsz, 1);
    assert_eq!(id.sgls & 0x30_0001, 0x30_0001, "SGLS: offsets and transport data blocks");
    assert_eq!(id.kas, 1);
    assert_eq!(id.nn, 1);
    assert_eq!(id.mdts, 5, "128 KiB");
    assert!(String::from_utf8_lossy(&id.subnqn).starts_with(SUB1));
    let (data, cq) = c.data_cmd(Sqe::identify(cns::NAMESPACE, 1, 0), 4096);
    assert!(cq.unwrap().status().is_success());
    let ns = IdentifyNamespace::read_from_bytes(&data).unwrap();
    assert_eq!(ns.nsze, 2048);
    let (_, cq) = c.data_cmd(Sqe::identify(cns::NAMESPACE, 2, 0), 4096);
    assert!(cq.unwrap().status().is(sct::GENERIC, generic::INVALID_NAMESPACE));
}

fn io_round_trip(dg: Digests, flow_off: bool) {
    let t = ram_target(4096);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(dg);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    let r = a.resp();
    assert!(r.status().is_success());
    let mut q = Client::io_queue(addr, dg, cntlid, 1, HOST_A, flow_off);
    let small = pattern(4096, 1);
    assert!(q.write(1, 8, &small, true).status().is_success());
    let big = pattern(128 << 10, 2);
    assert!(q.write(1, 100, &big, false).status().is_success());
    for (slba, want) in [(8u64, &small), (100, &big)] {
        let (data, cq) = q.read(1, slba, want.len());
        assert_eq!(&data, want, "data read back at LBA {slba}");
        match cq {
            None => assert!(flow_off, "SUCCESS only with SQ flow control disabled"),
            Some(c) => {
                assert!(!flow_off, "a response capsule after SUCCESS");
                assert!(c.status().is_success());
            }
        }
    }
}

#[test]
fn write_and_read_back_without_digests() {
    io_round_trip(Digests::NONE, true);
}

#[test]
fn write_and_read_back_with_digests() {
    io_round_trip(Digests::BOTH, true);
}

#[test]
fn reads_end_in_a_response_capsule_with_sq_flow_control() {
    io_round_trip(Digests::NONE, false);
}
