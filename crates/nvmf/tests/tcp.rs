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
        Digests {
            header: true,
            data: false,
        },
        Digests {
            header: false,
            data: true,
        },
    ] {
        let mut c = Client::connect(addr);
        let r = c.ic(dg);
        r.check().unwrap();
        assert_eq!(r.pfv, 0);
        assert_eq!(r.cpda, 0);
        assert_eq!(r.digests(), dg);
        assert!(r.maxh2cdata >= 4096 && r.maxh2cdata.is_multiple_of(4));
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
    assert!(c
        .prop_get(0x00, PropertySize::Four)
        .status()
        .is(sct::GENERIC, generic::INVALID_FIELD));
    let (_, cq) = c.data_cmd(Sqe::identify(cns::CONTROLLER, 0, 0), 4096);
    assert!(cq
        .unwrap()
        .status()
        .is(sct::GENERIC, generic::COMMAND_SEQUENCE_ERROR));
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
    assert_eq!(
        id.sgls & 0x30_0001,
        0x30_0001,
        "SGLS: offsets and transport data blocks"
    );
    assert_eq!(id.kas, 1);
    assert_eq!(id.nn, 1024); // the most namespaces (live add)
    assert_eq!(id.mdts, 5, "128 KiB");
    assert!(String::from_utf8_lossy(&id.subnqn).starts_with(SUB1));
    let (data, cq) = c.data_cmd(Sqe::identify(cns::NAMESPACE, 1, 0), 4096);
    assert!(cq.unwrap().status().is_success());
    let ns = IdentifyNamespace::read_from_bytes(&data).unwrap();
    assert_eq!(ns.nsze, 2048);
    // An inactive NSID: zeros; beyond NN: Invalid Namespace.
    let (data, cq) = c.data_cmd(Sqe::identify(cns::NAMESPACE, 2, 0), 4096);
    assert!(cq.is_none_or(|c| c.status().is_success()));
    assert!(data.iter().all(|&b| b == 0));
    let (_, cq) = c.data_cmd(Sqe::identify(cns::NAMESPACE, 1025, 0), 4096);
    assert!(cq
        .unwrap()
        .status()
        .is(sct::GENERIC, generic::INVALID_NAMESPACE));
}

fn io_round_trip(dg: Digests, flow_off: bool) {
    for si in SOCK_IMPLS {
        eprintln!("sock_impl {si:?}");
        io_round_trip_on(ram_target_on(4096, si), dg, flow_off);
    }
}

fn io_round_trip_on(t: pollux_nvmf::Target, dg: Digests, flow_off: bool) {
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

fn subsystem(nqn: &str, bdev: &str, hosts: &[&str]) -> pollux_nvmf::SubsystemConfig {
    let mut s = pollux_nvmf::SubsystemConfig::new(nqn);
    s.allow_any_host = hosts.is_empty();
    s.hosts = hosts.iter().map(|h| h.to_string()).collect();
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: bdev.into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    s
}

/// sub1: host A only; sub2: host B only; sub3: anyone.
fn three_subsystems() -> pollux_nvmf::Target {
    let mut cfg = pollux_nvmf::TargetConfig::default();
    for n in ["M1", "M2", "M3"] {
        cfg.bdevs
            .push(pollux_bdev::Bdev::ram(n, 512, 1024).unwrap());
    }
    cfg.subsystems.push(subsystem(SUB1, "M1", &[HOST_A]));
    cfg.subsystems
        .push(subsystem("nqn.2024-01.io.pollux:sub2", "M2", &[HOST_B]));
    cfg.subsystems
        .push(subsystem("nqn.2024-01.io.pollux:sub3", "M3", &[]));
    start(cfg)
}

#[test]
fn discovery_lists_only_the_subsystems_the_host_may_reach() {
    use pollux_spec::fabrics::{DiscoveryLogEntry, DiscoveryLogHeader, DISCOVERY_NQN};
    use pollux_spec::identify::CNTRLTYPE_DISCOVERY;
    let t = three_subsystems();
    let addr = t.listen_addrs()[0];
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    c.bring_up(DISCOVERY_NQN, HOST_A, 0);
    let (data, cq) = c.data_cmd(Sqe::identify(cns::CONTROLLER, 0, 0), 4096);
    assert!(cq.unwrap().status().is_success());
    let id = IdentifyController::read_from_bytes(&data).unwrap();
    assert_eq!(id.cntrltype, CNTRLTYPE_DISCOVERY);
    // Header first (as nvme-cli), then the whole page.
    let (h, _) = c.data_cmd(Sqe::get_log_page(0x70, 0, 1024, 0, 0, 0), 1024);
    let hdr = DiscoveryLogHeader::read_from_bytes(&h).unwrap();
    assert_eq!(hdr.numrec, 2, "sub1 (host A allowed) and sub3 (any host)");
    let len = 1024 * (1 + hdr.numrec as u32);
    let (page, cq) = c.data_cmd(Sqe::get_log_page(0x70, 0, len, 0, 0, 0), len);
    assert!(cq.unwrap().status().is_success());
    let nqns: Vec<String> = page[1024..]
        .chunks(1024)
        .map(|e| DiscoveryLogEntry::read_from_bytes(e).unwrap())
        .map(|e| {
            assert_eq!(e.trtype, 3);
            assert_eq!(e.traddr_str(), "127.0.0.1");
            assert_eq!(e.trsvcid_str(), addr.port().to_string());
            e.subnqn().unwrap().to_string()
        })
        .collect();
    assert_eq!(nqns, [SUB1, "nqn.2024-01.io.pollux:sub3"]);
    // A discovery controller has no I/O queues.
    let mut q = Client::connect(addr);
    q.ic(Digests::NONE);
    let r = q.connect_cmd(1, 31, 0, 1, DISCOVERY_NQN, HOST_A, false);
    assert!(r
        .status()
        .is(sct::COMMAND_SPECIFIC, fabrics_sc::INVALID_QUEUE_TYPE));
}

#[test]
fn a_host_not_on_the_list_is_refused_at_connect() {
    let t = three_subsystems();
    let addr = t.listen_addrs()[0];
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let r = c.admin_connect(SUB1, HOST_B, 0);
    assert!(r
        .status()
        .is(sct::COMMAND_SPECIFIC, fabrics_sc::CONNECT_INVALID_HOST));
    assert_eq!(t.controllers(), 0);
    // The same connection may still connect as an allowed host.
    assert!(c.admin_connect(SUB1, HOST_A, 0).status().is_success());
    // An unknown subsystem: Connect Invalid Parameters at SUBNQN (data).
    let mut d = Client::connect(addr);
    d.ic(Digests::NONE);
    let r = d.admin_connect("nqn.2024-01.io.pollux:nope", HOST_A, 0);
    assert!(r.status().is(
        sct::COMMAND_SPECIFIC,
        fabrics_sc::CONNECT_INVALID_PARAMETERS
    ));
    assert_eq!(r.dw0, 1 << 16 | 256);
}

/// SPDK's host sends an empty HOSTNQN unless given one: like SPDK's
/// nvmf_tgt and Linux's nvmet, a subsystem open to any host takes it
/// (admin and I/O queues, the discovery controller too); one with an
/// allow list refuses it with Connect Invalid Host. Before, every empty
/// HOSTNQN was Connect Invalid Parameters at byte 512 of the data.
#[test]
fn an_empty_host_nqn_connects_where_any_host_may() {
    use pollux_spec::fabrics::{DiscoveryLogHeader, DISCOVERY_NQN};
    let t = three_subsystems();
    let addr = t.listen_addrs()[0];
    // sub1 lists host A only.
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let r = c.admin_connect(SUB1, "", 0);
    assert!(
        r.status()
            .is(sct::COMMAND_SPECIFIC, fabrics_sc::CONNECT_INVALID_HOST),
        "empty HOSTNQN on an allow list: {:#x}",
        r.status().0
    );
    assert_eq!(t.controllers(), 0);
    // sub3 allows any host: admin queue, I/O queue, data.
    let sub3 = "nqn.2024-01.io.pollux:sub3";
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(sub3, "", 0);
    let mut q = Client::connect(addr);
    q.ic(Digests::NONE);
    let r = q.connect_cmd(1, 31, 0, cntlid, sub3, "", false);
    assert!(r.status().is_success(), "I/O connect: {:#x}", r.status().0);
    let d = pattern(4096, 9);
    assert!(q.write(1, 8, &d, true).status().is_success());
    assert_eq!(q.read(1, 8, 4096).0, d);
    // An I/O queue must come from the same (empty) host NQN.
    let mut other = Client::connect(addr);
    other.ic(Digests::NONE);
    let r = other.connect_cmd(2, 31, 0, cntlid, sub3, HOST_A, false);
    assert!(!r.status().is_success(), "I/O queue of another host");
    // Discovery: only the subsystems open to any host.
    let mut disc = Client::connect(addr);
    disc.ic(Digests::NONE);
    disc.bring_up(DISCOVERY_NQN, "", 0);
    let (h, _) = disc.data_cmd(Sqe::get_log_page(0x70, 0, 1024, 0, 0, 0), 1024);
    let hdr = DiscoveryLogHeader::read_from_bytes(&h).unwrap();
    assert_eq!(hdr.numrec, 1, "sub3 only");
}

/// Get Log Page asking for more than the log holds: the target sends the
/// whole length asked for, the log then zeros (as Linux's nvmet does), for
/// the NVM controller's logs (SMART 512 B, Commands Supported and Effects
/// 4 KiB) and the discovery log. Before, it sent only the log's bytes and
/// a host expecting NUMD's length saw a short transfer.
#[test]
fn get_log_page_sends_the_length_asked_for() {
    use pollux_spec::fabrics::{DiscoveryLogHeader, DISCOVERY_NQN};
    use pollux_spec::log::lid;
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    c.bring_up(SUB1, HOST_A, 0);
    for (l, size, ask) in [
        (lid::SMART, 512, 4096),
        (lid::FIRMWARE_SLOT, 512, 1024),
        (lid::COMMANDS_SUPPORTED, 4096, 8192),
    ] {
        let (data, cq) = c.data_cmd(Sqe::get_log_page(l, 0xFFFF_FFFF, ask, 0, 0, 0), ask);
        if let Some(cq) = cq {
            assert!(cq.status().is_success(), "LID {l:#x}: {:#x}", cq.status().0);
        }
        assert_eq!(data.len(), ask as usize, "LID {l:#x}: bytes sent");
        assert!(
            data[size..].iter().all(|&b| b == 0),
            "LID {l:#x}: zeros past the log"
        );
    }
    // The discovery log: one subsystem, one listener (2 KiB), 4 KiB asked.
    let mut d = Client::connect(addr);
    d.ic(Digests::NONE);
    d.bring_up(DISCOVERY_NQN, HOST_A, 0);
    let (data, cq) = d.data_cmd(Sqe::get_log_page(0x70, 0, 4096, 0, 0, 0), 4096);
    assert!(cq.unwrap().status().is_success());
    assert_eq!(data.len(), 4096);
    let hdr = DiscoveryLogHeader::read_from_bytes(&data[..1024]).unwrap();
    assert_eq!(hdr.numrec, 1);
    assert!(data[2048..].iter().all(|&b| b == 0));
}

#[test]
fn io_connect_checks_controller_host_qid_and_sqsize() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let try_io = |cntlid: u16, qid: u16, sqsize: u16, host: &str| {
        let mut c = Client::connect(addr);
        c.ic(Digests::NONE);
        c.connect_cmd(qid, sqsize, 0, cntlid, SUB1, host, false)
    };
    let bad = |r: pollux_spec::Cqe, ipo: u32| {
        assert!(r.status().is(
            sct::COMMAND_SPECIFIC,
            fabrics_sc::CONNECT_INVALID_PARAMETERS
        ));
        assert_eq!(r.dw0 & 0xFFFF, ipo);
    };
    bad(try_io(cntlid + 1, 1, 31, HOST_A), 16);
    bad(try_io(cntlid, 1, 31, HOST_B), 16);
    bad(try_io(cntlid, 1, 0, HOST_A), 44);
    bad(try_io(cntlid, 1, 128, HOST_A), 44);
    bad(try_io(cntlid, 128, 31, HOST_A), 42);
    let _q1 = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    bad(try_io(cntlid, 1, 31, HOST_A), 42);
}

/// Each response carries the SQ head: one past the command, wrapping at
/// the queue's size (the Connect counts as the first command).
#[test]
fn responses_carry_the_sq_head_wrapping_at_the_queue_size() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut q = Client::connect(addr);
    q.ic(Digests::NONE);
    // SQSIZE 3: four entries.
    let r = q.connect_cmd(1, 3, 0, cntlid, SUB1, HOST_A, false);
    assert!(r.status().is_success());
    assert_eq!(r.sqhd, 1);
    let mut heads = Vec::new();
    for _ in 0..9 {
        let mut sqe = Sqe::flush(1);
        sqe.cid = q.next_cid();
        q.capsule(&sqe, &[]);
        let c = q.resp();
        assert!(c.status().is_success());
        assert_eq!(c.sqid, 1);
        heads.push(c.sqhd);
    }
    assert_eq!(heads, [2, 3, 0, 1, 2, 3, 0, 1, 2]);
}

#[test]
fn keep_alive_timeout_tears_the_controller_down() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 300);
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    // No Keep Alive: both connections close.
    a.expect_eof();
    q.expect_eof();
    assert_eq!(t.controllers(), 0);
}

#[test]
fn keep_alive_commands_keep_the_controller() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    a.bring_up(SUB1, HOST_A, 300);
    // Keep alive for 1.5 KATOs; the controller stays.
    for _ in 0..9 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let mut sqe = Sqe::new(0x18, 0);
        sqe.cid = a.next_cid();
        a.capsule(&sqe, &[]);
        assert!(a.resp().status().is_success());
    }
    assert_eq!(t.controllers(), 1);
}

#[test]
fn sgl_descriptors_other_than_offset_and_transport_are_refused() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    let data = pattern(512, 3);
    let send = |q: &mut Client, d: SglDescriptor, icd: &[u8]| {
        let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 1);
        sqe.cid = q.next_cid();
        d.write_to_sqe(&mut sqe);
        q.capsule(&sqe, icd);
        q.resp().status()
    };
    // Keyed (RDMA) data block.
    let mut keyed = SglDescriptor::tcp_transport(512);
    keyed.id = 0x40;
    assert!(send(&mut q, keyed, &[]).is(sct::GENERIC, generic::SGL_TYPE_INVALID));
    // In-capsule at offset 16.
    assert!(send(&mut q, SglDescriptor::in_capsule(16, 512), &data)
        .is(sct::GENERIC, generic::SGL_OFFSET_INVALID));
    // In-capsule shorter than the command.
    assert!(
        send(&mut q, SglDescriptor::in_capsule(0, 256), &data[..256])
            .is(sct::GENERIC, generic::DATA_SGL_LENGTH_INVALID)
    );
    // A read with in-capsule data.
    let mut sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 1);
    sqe.cid = q.next_cid();
    SglDescriptor::in_capsule(0, 512).write_to_sqe(&mut sqe);
    q.capsule(&sqe, &data);
    assert!(q.resp().status().is(sct::GENERIC, generic::INVALID_FIELD));
    // In-capsule data beyond the I/O queue's 4 KiB.
    let big = pattern(8192, 4);
    assert!(q
        .write(1, 0, &big, true)
        .status()
        .is(sct::GENERIC, generic::SGL_OFFSET_INVALID));
    // The queue still works.
    assert!(q.write(1, 0, &data, true).status().is_success());
    assert_eq!(q.read(1, 0, 512).0, data);
}

#[test]
fn a_data_digest_error_fails_the_command_not_the_connection() {
    let t = ram_target(1024);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::BOTH);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut q = Client::io_queue(addr, Digests::BOTH, cntlid, 1, HOST_A, true);
    let data = pattern(1024, 5);
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 2);
    sqe.cid = q.next_cid();
    SglDescriptor::in_capsule(0, 1024).write_to_sqe(&mut sqe);
    let (h, l) = pollux_spec::tcp::CapsuleCmd::new(&sqe, 1024, q.dg, 0).unwrap();
    let mut pdu = vec![0u8; l.plen as usize];
    let n =
        pollux_spec::tcp::write_header(zerocopy::IntoBytes::as_bytes(&h), &l, &mut pdu).unwrap();
    pdu[n..n + 1024].copy_from_slice(&data);
    pdu[n + 1024..].copy_from_slice(&[1, 2, 3, 4]); // wrong digest
    std::io::Write::write_all(&mut q.s, &pdu).unwrap();
    let r = q.resp();
    assert!(r
        .status()
        .is(sct::GENERIC, generic::TRANSIENT_TRANSPORT_ERROR));
    // Nothing was written; the connection goes on.
    assert_eq!(q.read(1, 0, 1024).0, vec![0u8; 1024]);
    assert!(q.write(1, 0, &data, true).status().is_success());
    assert_eq!(q.read(1, 0, 1024).0, data);
    let _ = Status::SUCCESS;
}

/// Each malformed PDU gets a C2HTermReq with its FES/FEI and a closed
/// connection; a healthy connection's verified I/O goes on in between.
#[test]
fn malformed_pdus_terminate_only_their_connection() {
    for si in SOCK_IMPLS {
        eprintln!("sock_impl {si:?}");
        malformed_pdus_terminate_only_their_connection_on(si);
    }
}

fn malformed_pdus_terminate_only_their_connection_on(si: pollux_nvmf::SockImpl) {
    use pollux_spec::tcp::{CapsuleCmd, Fes, H2CData, PduLayout};
    use zerocopy::IntoBytes;
    let t = ram_target_on(4096, si);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut healthy = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    let mut round = 0u8;
    let mut check_healthy = |h: &mut Client| {
        round += 1;
        let d = pattern(64 << 10, round);
        assert!(h.write(1, 256, &d, false).status().is_success());
        assert_eq!(h.read(1, 256, d.len()).0, d);
    };
    check_healthy(&mut healthy);

    let fresh = |dg: Digests| {
        let mut c = Client::connect(addr);
        c.ic(dg);
        c
    };
    let capsule_bytes = |c: &Client, icd: u32| {
        let mut sqe = Sqe::new(0x06, 0);
        sqe.cid = 9;
        let (h, l) = CapsuleCmd::new(&sqe, icd, c.dg, 0).unwrap();
        let mut v = vec![0u8; l.plen as usize];
        pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut v).unwrap();
        v
    };

    // Bad HLEN (71 instead of 72): Invalid PDU Header Field at byte 2.
    let mut c = fresh(Digests::NONE);
    let mut p = capsule_bytes(&c, 0);
    p[2] = 71;
    std::io::Write::write_all(&mut c.s, &p).unwrap();
    let tr = c.expect_term();
    assert_eq!((tr.fes(), tr.fei()), (Fes::INVALID_HEADER_FIELD, 2));
    check_healthy(&mut healthy);

    // Bad PDO (not a multiple of 4 with CPDA 0): field at byte 3.
    let mut c = fresh(Digests::NONE);
    let mut p = capsule_bytes(&c, 16);
    p[3] = 73;
    std::io::Write::write_all(&mut c.s, &p).unwrap();
    let tr = c.expect_term();
    assert_eq!((tr.fes(), tr.fei()), (Fes::INVALID_HEADER_FIELD, 3));
    assert_eq!(tr.data_len(), 72, "the offending header comes back");
    check_healthy(&mut healthy);

    // Wrong header digest: FEI is the digest received.
    let mut c = fresh(Digests::BOTH);
    let mut p = capsule_bytes(&c, 0);
    p[72..76].copy_from_slice(&0xDEAD_BEEFu32.to_le_bytes());
    std::io::Write::write_all(&mut c.s, &p).unwrap();
    let tr = c.expect_term();
    assert_eq!(
        (tr.fes(), tr.fei()),
        (Fes::HEADER_DIGEST_ERROR, 0xDEAD_BEEF)
    );
    check_healthy(&mut healthy);

    // H2CData beyond the command's data: Data Transfer Out of Range.
    let mut q2 = Client::io_queue(addr, Digests::NONE, cntlid, 2, HOST_A, true);
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 8);
    sqe.cid = 77;
    SglDescriptor::tcp_transport(4096).write_to_sqe(&mut sqe);
    q2.capsule(&sqe, &[]);
    let ttag = match q2.recv() {
        Pdu::R2T { ttag, r2tl, .. } => {
            assert_eq!(r2tl, 4096);
            ttag
        }
        _ => panic!("expected R2T"),
    };
    let (h, l) = H2CData::new(77, ttag, 0, 8192, true, q2.dg, 0).unwrap();
    q2.send_pdu(h.as_bytes(), &l, &pattern(8192, 9));
    let tr = q2.expect_term();
    assert_eq!(tr.fes(), Fes::DATA_TRANSFER_OUT_OF_RANGE);
    check_healthy(&mut healthy);

    // H2CData for a transfer tag with no R2T outstanding: TTAG (byte 10).
    let mut q3 = Client::io_queue(addr, Digests::NONE, cntlid, 3, HOST_A, true);
    let (h, l) = H2CData::new(5, 3, 0, 512, true, q3.dg, 0).unwrap();
    q3.send_pdu(h.as_bytes(), &l, &pattern(512, 1));
    let tr = q3.expect_term();
    assert_eq!((tr.fes(), tr.fei()), (Fes::INVALID_HEADER_FIELD, 10));
    check_healthy(&mut healthy);

    // A PDU type a controller never receives (C2HData): PDU-Type, byte 0.
    let mut c = fresh(Digests::NONE);
    let l = PduLayout::new(pollux_spec::tcp::PduType::C2HData, Digests::NONE, 0, 4).unwrap();
    let h = pollux_spec::tcp::C2HData::new(1, 0, 4, true, false, Digests::NONE, 0)
        .unwrap()
        .0;
    c.send_pdu(h.as_bytes(), &l, &[0; 4]);
    let tr = c.expect_term();
    assert_eq!((tr.fes(), tr.fei()), (Fes::INVALID_HEADER_FIELD, 0));

    // A command before ICReq: PDU Sequence Error.
    let mut c = Client::connect(addr);
    let p = capsule_bytes(&c, 0);
    std::io::Write::write_all(&mut c.s, &p).unwrap();
    let tr = c.expect_term();
    assert_eq!(tr.fes(), Fes::PDU_SEQUENCE_ERROR);

    // More commands than SQSIZE + 1 at once: PDU Sequence Error.
    let mut q4 = Client::io_queue(addr, Digests::NONE, cntlid, 4, HOST_A, true);
    for k in 0..65u16 {
        let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 8);
        sqe.cid = k;
        SglDescriptor::tcp_transport(4096).write_to_sqe(&mut sqe);
        q4.capsule(&sqe, &[]);
    }
    loop {
        match q4.recv() {
            Pdu::R2T { .. } => continue,
            Pdu::Term(t) => {
                assert_eq!(t.fes(), Fes::PDU_SEQUENCE_ERROR);
                break;
            }
            _ => panic!("expected R2Ts then a TermReq"),
        }
    }
    q4.expect_eof();
    check_healthy(&mut healthy);
    assert_eq!(t.controllers(), 1);
}

/// Each technique switched away from its default moves the same data.
#[test]
fn every_technique_switch_moves_data_intact() {
    use pollux_nvmf::TransportOptions;
    let base = TransportOptions::default();
    let cores: Vec<usize> = if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        vec![0, 1]
    } else {
        vec![0]
    };
    for (what, o) in [
        (
            "no direct receive",
            TransportOptions {
                direct_receive: false,
                ..base.clone()
            },
        ),
        (
            "no epoll idle sleep",
            TransportOptions {
                epoll_idle: false,
                ..base.clone()
            },
        ),
        (
            "epoll-gated receives",
            TransportOptions {
                epoll_receive: true,
                ..base.clone()
            },
        ),
        (
            "epoll-gated receives, no epoll idle sleep, 4 KiB receive buffer",
            TransportOptions {
                epoll_receive: true,
                epoll_idle: false,
                rx_buffer: 4096,
                ..base.clone()
            },
        ),
        (
            "a 192 KiB send buffer",
            TransportOptions {
                send_buffer: 192 << 10,
                ..base.clone()
            },
        ),
        (
            "a 4 KiB send buffer (a 128 KiB read takes many sends)",
            TransportOptions {
                send_buffer: 4096,
                ..base.clone()
            },
        ),
        (
            "SO_INCOMING_CPU placement",
            TransportOptions {
                incoming_cpu: true,
                ..base.clone()
            },
        ),
        (
            "4 KiB receive buffer",
            TransportOptions {
                rx_buffer: 4096,
                ..base.clone()
            },
        ),
        (
            "one iovec per sendmsg",
            TransportOptions {
                send_iov: 1,
                ..base.clone()
            },
        ),
        (
            "64 iovecs per sendmsg",
            TransportOptions {
                send_iov: 64,
                ..base.clone()
            },
        ),
        (
            "io_uring sockets",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                ..base.clone()
            },
        ),
        (
            "io_uring without registered files, 8 provided buffers of 512 bytes",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                uring_fixed_files: false,
                uring_rx_buffers: 8,
                uring_rx_buffer_size: 512,
                ..base.clone()
            },
        ),
        (
            "io_uring, zero-copy sends of 64 KiB and more (the 4 KiB read copies)",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                uring_zcopy_threshold: 64 << 10,
                ..base.clone()
            },
        ),
        (
            "io_uring, every send zero-copy, no registered files",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                uring_zcopy_threshold: 1,
                uring_fixed_files: false,
                ..base.clone()
            },
        ),
        (
            "io_uring, zero-copy sends from registered buffers (1 MiB region: most data from the heap)",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                uring_zcopy_threshold: 4096,
                uring_registered_buffers: 1 << 20,
                ..base.clone()
            },
        ),
        (
            "io_uring, every send zero-copy from 64 MiB of registered buffers",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                uring_zcopy_threshold: 1,
                uring_registered_buffers: 64 << 20,
                ..base.clone()
            },
        ),
        (
            "io_uring, no epoll idle sleep",
            TransportOptions {
                sock_impl: pollux_nvmf::SockImpl::Uring,
                epoll_idle: false,
                ..base.clone()
            },
        ),
    ] {
        eprintln!("CASE {what}");
        io_round_trip_on(
            ram_target_with(4096, o.clone(), &cores),
            Digests::BOTH,
            true,
        );
        io_round_trip_on(ram_target_with(4096, o, &cores), Digests::NONE, false);
    }
}

/// Closes `s` with a reset (SO_LINGER 0).
fn reset(s: std::net::TcpStream) {
    use std::os::fd::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: `l` is a valid linger for the call's duration.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&l as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    drop(s);
}

/// Hosts that vanish in the middle of a transfer (a reset after half the
/// H2CData of a 128 KiB write; 128 KiB reads asked for, then a reset
/// without reading them; a close after half a command capsule) leave
/// nothing behind: their connections go, and another host's verified
/// I/O goes on, on every socket implementation.
#[test]
fn hosts_vanishing_mid_transfer_leave_nothing_behind() {
    for si in SOCK_IMPLS {
        eprintln!("sock_impl {si:?}");
        hosts_vanishing_on(&ram_target_on(4096, si));
    }
}

/// As [`hosts_vanishing_mid_transfer_leave_nothing_behind`], with
/// io_uring zero-copy sends (every send of 4 KiB and more), from the heap
/// and from a registered region: the reads reset mid-transfer go out
/// zero-copy; and no data buffer is left held (the threads cache none:
/// every buffer alive is a command's).
#[test]
fn hosts_vanishing_mid_zero_copy_sends_leave_no_buffer_behind() {
    for registered in [0, 8 << 20] {
        eprintln!("uring_registered_buffers {registered}");
        vanishing_under_zero_copy(registered);
    }
}

fn vanishing_under_zero_copy(registered: u32) {
    let o = pollux_nvmf::TransportOptions {
        sock_impl: pollux_nvmf::SockImpl::Uring,
        uring_zcopy_threshold: 4096,
        uring_registered_buffers: registered,
        buf_cache_size: Some(0),
        ..Default::default()
    };
    let t = ram_target_with(4096, o, &[0]);
    let (mut held, limit) = hosts_vanishing_on(&t);
    // (The healthy queue's last read gives its buffer back at the
    // target's next poll after the send.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while held > 64 << 10 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        held = t.buffer_bytes().0;
    }
    // The admin and the healthy queue keep a page per slot at most; the
    // 32 reads of a vanished host held 4 MiB.
    assert!(
        held <= 64 << 10,
        "{held} bytes of data buffers still held (of {limit})"
    );
}

/// An admin queue of host A on `addr` asking for `queues` I/O queues
/// (0's based), and I/O queue 1, checked once (`check`): the admin
/// connection, the controller ID, the I/O queue.
fn admin_and_healthy(addr: std::net::SocketAddr, queues: u32) -> (Client, u16, Client) {
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (queues << 16) | queues);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
    let mut healthy = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    check(&mut healthy, 1);
    (a, cntlid, healthy)
}

/// 128 KiB of `seed`'s pattern written to and read back from LBA 512 of
/// namespace 1 through `h`.
fn check(h: &mut Client, seed: u8) {
    let d = pattern(128 << 10, seed);
    assert!(h.write(1, 512, &d, false).status().is_success());
    assert_eq!(h.read(1, 512, d.len()).0, d);
}

/// Runs the vanishing hosts against `t`; returns its data buffer bytes
/// held at the end, and the pool's limit.
fn hosts_vanishing_on(t: &pollux_nvmf::Target) -> (usize, usize) {
    use pollux_spec::tcp::H2CData;
    use zerocopy::IntoBytes;
    {
        let si = t.sock_impl();
        let addr = t.listen_addrs()[0];
        let (_a, cntlid, mut healthy) = admin_and_healthy(addr, 15);
        for round in 0..3u8 {
            // Half the data of an R2T write, then a reset.
            let mut w = Client::connect(addr);
            w.ic(Digests::NONE);
            w.maxh2c = 4096;
            let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 256);
            sqe.cid = w.next_cid();
            SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut sqe);
            let c = w.connect_cmd(2 + 2 * round as u16, 63, 0, cntlid, SUB1, HOST_A, true);
            assert!(c.status().is_success(), "I/O connect");
            w.capsule(&sqe, &[]);
            let Pdu::R2T { ttag, .. } = w.recv() else {
                panic!("expected R2T");
            };
            let half = pattern(64 << 10, 7);
            let (h, l) = H2CData::new(sqe.cid, ttag, 0, 64 << 10, false, w.dg, 0).unwrap();
            w.send_pdu(h.as_bytes(), &l, &half);
            reset(w.s);
            // Reads asked for, never read, then a reset.
            let mut r = Client::connect(addr);
            r.ic(Digests::NONE);
            let c = r.connect_cmd(3 + 2 * round as u16, 63, 0, cntlid, SUB1, HOST_A, true);
            assert!(c.status().is_success(), "I/O connect");
            for _ in 0..32 {
                let mut sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 256);
                sqe.cid = r.next_cid();
                SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut sqe);
                r.capsule(&sqe, &[]);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            reset(r.s);
            // Half a capsule, then a close.
            let mut h = Client::connect(addr);
            h.ic(Digests::NONE);
            use std::io::Write;
            h.s.write_all(&[4, 0, 72, 0]).unwrap();
            drop(h);
            check(&mut healthy, round + 2);
        }
        // Only the admin and the healthy queue stay.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while t.connections() > 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(t.connections(), 2, "{si:?}: connections left behind");
        check(&mut healthy, 9);
    }
    t.buffer_bytes()
}

/// With io_uring zero-copy sends, a host that asks for reads and then
/// reads nothing (its window closed: the zero-copy sends stay queued in
/// the socket, their notifications never come) is disconnected after a
/// bounded wait instead of holding the thread (which waits for the
/// notifications before it may touch the memory again): another host on
/// the same thread goes on being served. Before, the thread waited for
/// good and the other host's read timed out. The same with the data in a
/// registered region.
#[test]
fn a_host_that_stops_reading_under_zero_copy_sends_is_cut_off_not_the_thread() {
    for registered in [0, 8 << 20] {
        eprintln!("uring_registered_buffers {registered}");
        stops_reading_under_zero_copy(registered);
    }
}

fn stops_reading_under_zero_copy(registered: u32) {
    let o = pollux_nvmf::TransportOptions {
        sock_impl: pollux_nvmf::SockImpl::Uring,
        uring_zcopy_threshold: 4096,
        uring_registered_buffers: registered,
        ..Default::default()
    };
    let t = ram_target_with(4096, o, &[0]);
    let addr = t.listen_addrs()[0];
    let (_a, cntlid, mut healthy) = admin_and_healthy(addr, 3);
    // 6 MiB of reads asked for, none read.
    let mut r = Client::connect(addr);
    r.ic(Digests::NONE);
    let c = r.connect_cmd(2, 63, 0, cntlid, SUB1, HOST_A, true);
    assert!(c.status().is_success(), "I/O connect");
    for _ in 0..48 {
        let mut sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 256);
        sqe.cid = r.next_cid();
        SglDescriptor::tcp_transport(128 << 10).write_to_sqe(&mut sqe);
        r.capsule(&sqe, &[]);
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    for seed in 2..5 {
        check(&mut healthy, seed);
    }
    // The silent host's connection goes (the admin and the healthy
    // queue stay).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while t.connections() > 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(t.connections(), 2, "the silent host's connection stays");
    check(&mut healthy, 9);
    drop(r);
}
