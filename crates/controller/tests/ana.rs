//! Asymmetric Namespace Access in the controller model: Identify with ANA
//! reporting and multipath, the ANA log page per port (RGO, offset), the
//! ANA Change notice raised once per change, I/O refused with the path
//! status while a group is inaccessible, and configured namespace
//! identifiers.
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, AnaPort, Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions,
    Limits, Namespace, NsIds, Personality, Subsystem,
};
use pollux_spec::cmd::cns;
use pollux_spec::features::{aer, fid};
use pollux_spec::identify::{
    parse_ns_descriptors, IdentifyController, IdentifyNamespace, NsDescriptor, CMIC_ANA,
    CMIC_MULTI_CONTROLLER, CMIC_MULTI_PORT, OAES_ANA_CHANGE,
};
use pollux_spec::log::{lid, AnaLog, AnaState};
use pollux_spec::status::{path, sct, specific};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

fn subsystem(ana: bool) -> Arc<Subsystem> {
    let ns = vec![
        Namespace::new(Bdev::ram("a0", 512, 64).unwrap(), 0).unwrap(),
        Namespace::new(Bdev::ram("a1", 512, 64).unwrap(), 0)
            .unwrap()
            .with_anagrpid(7),
        Namespace::new(Bdev::ram("a2", 512, 64).unwrap(), 0)
            .unwrap()
            .with_anagrpid(7),
    ];
    let s = Subsystem::new(
        Identity {
            serial: "ANA0001".into(),
            model: "ana test".into(),
            firmware: "1.0".into(),
            vid: 0,
            ssvid: 0,
            ieee: [0; 3],
            subnqn: "nqn.2024-01.io.pollux:ana".into(),
        },
        Limits {
            mqes: 31,
            max_io_queues: 2,
            mdts: 5,
            abort_limit: 3,
            aer_limit: 3,
            cap_to: 20,
        },
        Personality::Fabrics(FabricsTraits {
            in_capsule_data: 8192,
            kas: 10,
        }),
        ns,
    )
    .unwrap();
    s.set_ana_reporting(ana);
    s
}

fn admin_data(c: &mut Controller, sqe: Sqe) -> Result<Vec<u8>, Status> {
    match c.exec_admin(&sqe, AdminEnv::default()) {
        AdminOutcome::Data { data, then, .. } => {
            c.data_sent(then);
            Ok(data)
        }
        AdminOutcome::Complete { status, .. } => Err(status),
        other => panic!("unexpected {other:?}"),
    }
}

fn ana_log(c: &mut Controller, rgo: bool, offset: u64, len: u32) -> Result<Vec<u8>, Status> {
    let mut sqe = Sqe::get_log_page(lid::ANA, 0, len, offset, 0, 0);
    if rgo {
        sqe.cdw10 |= 1 << 8;
    }
    admin_data(c, sqe)
}

fn ctrl(s: &Arc<Subsystem>, cntlid: u16, port: &Arc<AnaPort>) -> Controller {
    let mut c = Controller::new(s.clone(), cntlid);
    c.set_ana_port(port.clone());
    c
}

#[test]
fn identify_with_and_without_ana() {
    let port = Arc::new(AnaPort::new(AnaState::Optimized));
    let off = subsystem(false);
    let mut c = ctrl(&off, 1, &port);
    let d = admin_data(&mut c, Sqe::identify(cns::CONTROLLER, 0, 0)).unwrap();
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_eq!((id.cmic, id.anacap, id.nanagrpid), (0, 0, 0));
    assert_eq!(id.oaes & OAES_ANA_CHANGE, 0);
    let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 2, 0)).unwrap();
    let ns = IdentifyNamespace::read_from_bytes(&d).unwrap();
    assert_eq!((ns.anagrpid, ns.nmic), (0, 0));
    // Without ANA reporting there is no ANA log page.
    assert_eq!(
        ana_log(&mut c, false, 0, 4096),
        Err(Status::specific(specific::INVALID_LOG_PAGE))
    );

    let on = subsystem(true);
    let mut c = ctrl(&on, 1, &port);
    let d = admin_data(&mut c, Sqe::identify(cns::CONTROLLER, 0, 0)).unwrap();
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_eq!(id.cmic, CMIC_MULTI_PORT | CMIC_MULTI_CONTROLLER | CMIC_ANA);
    assert_ne!(id.oaes & OAES_ANA_CHANGE, 0);
    assert_eq!(id.anacap, 0x47);
    assert_eq!((id.anagrpmax, id.nanagrpid, id.mnan), (1024, 1024, 1024));
    assert_eq!(id.anatt, 10);
    for (nsid, grp) in [(1, 1), (2, 7), (3, 7)] {
        let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, nsid, 0)).unwrap();
        let ns = IdentifyNamespace::read_from_bytes(&d).unwrap();
        assert_eq!((ns.anagrpid, ns.nmic), (grp, 1), "nsid {nsid}");
        assert_eq!(ns.nuse, 64);
    }
    // Multipath without ANA: CMIC bits 0 and 1, shared namespaces.
    let mp = subsystem(false);
    mp.set_multipath(true);
    let mut c = ctrl(&mp, 1, &port);
    let d = admin_data(&mut c, Sqe::identify(cns::CONTROLLER, 0, 0)).unwrap();
    let id = IdentifyController::read_from_bytes(&d).unwrap();
    assert_eq!(id.cmic, CMIC_MULTI_PORT | CMIC_MULTI_CONTROLLER);
    let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 1, 0)).unwrap();
    assert_eq!(IdentifyNamespace::read_from_bytes(&d).unwrap().nmic, 1);
}

#[test]
fn ana_log_per_port_rgo_and_offset() {
    let s = subsystem(true);
    let p1 = Arc::new(AnaPort::new(AnaState::Optimized));
    let p2 = Arc::new(AnaPort::new(AnaState::NonOptimized));
    let mut c1 = ctrl(&s, 1, &p1);
    let mut c2 = ctrl(&s, 2, &p2);
    p1.set(Some(7), AnaState::Inaccessible);

    let l1 = AnaLog::parse(&ana_log(&mut c1, false, 0, 4096).unwrap()).unwrap();
    assert_eq!(l1.chgcnt, 1);
    let g: Vec<_> = l1
        .groups
        .iter()
        .map(|g| (g.anagrpid, g.state, g.nsids.clone()))
        .collect();
    assert_eq!(
        g,
        vec![
            (1, AnaState::Optimized, vec![1]),
            (7, AnaState::Inaccessible, vec![2, 3]),
        ]
    );
    let l2 = AnaLog::parse(&ana_log(&mut c2, false, 0, 4096).unwrap()).unwrap();
    assert!(l2.groups.iter().all(|g| g.state == AnaState::NonOptimized));
    assert_eq!(l2.groups[1].nsids, vec![2, 3]);

    // RGO: no NSID lists.
    let b = ana_log(&mut c1, true, 0, 4096).unwrap();
    let r = AnaLog::parse(&b).unwrap();
    assert_eq!(r.groups.len(), 2);
    assert!(r.groups.iter().all(|g| g.nsids.is_empty()));
    assert_eq!(r.groups[1].state, AnaState::Inaccessible);
    assert!(b[16 + 64..].iter().all(|&x| x == 0));

    // Offset and length: the second descriptor alone.
    let full = ana_log(&mut c1, false, 0, 4096).unwrap();
    let part = ana_log(&mut c1, false, 16 + 36, 32).unwrap();
    assert_eq!(&part[..32], &full[52..84]);
    assert_eq!(part[16], AnaState::Inaccessible as u8);
}

#[test]
fn ana_change_notice_once_per_change_and_masked_until_read() {
    let s = subsystem(true);
    let port = Arc::new(AnaPort::new(AnaState::Optimized));
    let mut c = ctrl(&s, 1, &port);
    let set = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 1 << 11 | 1 << 8);
    assert!(matches!(
        c.exec_admin(&set, AdminEnv::default()),
        AdminOutcome::Complete { status, .. } if status.is_success()
    ));
    for cid in [10, 11] {
        let mut a = Sqe::async_event_request();
        a.cid = cid;
        assert_eq!(c.exec_admin(&a, AdminEnv::default()), AdminOutcome::Held);
    }
    let want = aer::encode(aer::NOTICE, aer::NOTICE_ANA_CHANGE, lid::ANA);
    c.namespace_events();
    assert_eq!(c.next_event(), None, "no change yet");
    assert!(port.set(Some(1), AnaState::Inaccessible));
    c.namespace_events();
    assert_eq!(c.next_event(), Some((10, want)));
    c.namespace_events();
    assert_eq!(c.next_event(), None, "fired once");
    // A second change before the log is read: masked.
    assert!(port.set(Some(1), AnaState::Optimized));
    c.namespace_events();
    assert_eq!(c.next_event(), None, "masked until the log is read");
    ana_log(&mut c, false, 0, 4096).unwrap();
    assert!(port.set(Some(1), AnaState::NonOptimized));
    c.namespace_events();
    assert_eq!(c.next_event(), Some((11, want)));
    // A controller of another port hears nothing of this port's changes.
    let other = Arc::new(AnaPort::new(AnaState::Optimized));
    let mut c2 = ctrl(&s, 2, &other);
    c2.exec_admin(&set, AdminEnv::default());
    let mut a = Sqe::async_event_request();
    a.cid = 5;
    c2.exec_admin(&a, AdminEnv::default());
    port.set(None, AnaState::Inaccessible);
    c2.namespace_events();
    assert_eq!(c2.next_event(), None);
    // Without AEC bit 11: the change is noted, no event.
    let mut c3 = ctrl(&s, 3, &port);
    c3.exec_admin(&a, AdminEnv::default());
    port.set(None, AnaState::Optimized);
    c3.namespace_events();
    assert_eq!(c3.next_event(), None);
}

fn rw(q: &mut IoQueue, opc: NvmOpcode, nsid: u32, buf: &mut [u8]) -> Status {
    let sqe = Sqe::rw(opc, nsid, 0, 1);
    let cmd = match q.check(&sqe) {
        Ok(c) => c,
        Err(s) => return s,
    };
    let seg = [RawSeg {
        ptr: buf.as_mut_ptr(),
        len: cmd.xfer_len,
    }];
    // SAFETY: `buf` is ours and untouched during the call.
    unsafe { q.exec(&cmd, &seg) }
}

#[test]
fn io_refused_with_the_path_status_while_inaccessible() {
    let s = subsystem(true);
    let port = Arc::new(AnaPort::new(AnaState::Optimized));
    let c = ctrl(&s, 1, &port);
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 4 }).unwrap();
    let mut buf = vec![0u8; 512];
    assert!(rw(&mut q, NvmOpcode::Write, 2, &mut buf).is_success());

    port.set(Some(7), AnaState::Inaccessible);
    s.ana_changed();
    q.sync_namespaces();
    let st = rw(&mut q, NvmOpcode::Read, 2, &mut buf);
    assert!(st.is(sct::PATH, path::ANA_INACCESSIBLE), "{st}");
    assert!(!st.dnr(), "a multipath host must be allowed to retry");
    assert!(rw(&mut q, NvmOpcode::Write, 3, &mut buf).is(sct::PATH, path::ANA_INACCESSIBLE));
    // Another group, and another port's queue, are unaffected.
    assert!(rw(&mut q, NvmOpcode::Read, 1, &mut buf).is_success());
    let other = Arc::new(AnaPort::new(AnaState::Optimized));
    let c2 = ctrl(&s, 2, &other);
    let mut q2 = IoQueue::for_controller(&c2, IoQueueOptions { depth: 4 }).unwrap();
    assert!(rw(&mut q2, NvmOpcode::Read, 2, &mut buf).is_success());
    // A queue made while inaccessible refuses from the start.
    let mut q3 = IoQueue::for_controller(&c, IoQueueOptions { depth: 4 }).unwrap();
    assert!(rw(&mut q3, NvmOpcode::Read, 2, &mut buf).is(sct::PATH, path::ANA_INACCESSIBLE));
    // Non-optimized serves I/O.
    port.set(Some(7), AnaState::NonOptimized);
    s.ana_changed();
    q.sync_namespaces();
    assert!(rw(&mut q, NvmOpcode::Read, 2, &mut buf).is_success());
    // Inaccessible namespaces report NUSE 0 in Identify.
    port.set(None, AnaState::Inaccessible);
    let mut c = c;
    let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 1, 0)).unwrap();
    assert_eq!(IdentifyNamespace::read_from_bytes(&d).unwrap().nuse, 0);
}

#[test]
fn configured_identifiers_in_identify_and_descriptors() {
    let uuid = *b"0123456789abcdef";
    let mk = |serial: &str| {
        let s = Subsystem::new(
            Identity {
                serial: serial.into(),
                model: "m".into(),
                firmware: "1".into(),
                vid: 0,
                ssvid: 0,
                ieee: [0; 3],
                subnqn: "nqn.2024-01.io.pollux:ids".into(),
            },
            Limits {
                mqes: 31,
                max_io_queues: 2,
                mdts: 5,
                abort_limit: 3,
                aer_limit: 3,
                cap_to: 20,
            },
            Personality::Fabrics(FabricsTraits {
                in_capsule_data: 0,
                kas: 10,
            }),
            vec![],
        )
        .unwrap();
        let ns = Namespace::new(Bdev::ram("i0", 512, 64).unwrap(), 0)
            .unwrap()
            .with_ids(NsIds {
                uuid: Some(uuid),
                ..Default::default()
            });
        s.add_namespace(ns, Some(1)).unwrap();
        let mut c = Controller::new(s, 1);
        let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 1, 0)).unwrap();
        let id = IdentifyNamespace::read_from_bytes(&d).unwrap();
        let d = admin_data(&mut c, Sqe::identify(cns::NS_DESCRIPTORS, 1, 0)).unwrap();
        (id.nguid, id.eui64, parse_ns_descriptors(&d).unwrap())
    };
    // Two targets of different serial numbers: the same identifiers.
    let a = mk("SERIAL-A");
    let b = mk("SERIAL-B");
    assert_eq!(a, b);
    assert_eq!(a.0, uuid, "NGUID = the UUID given");
    assert_eq!(a.1, [0; 8], "no EUI-64 unless given");
    assert!(a.2.contains(&NsDescriptor::Uuid(uuid)));
    assert!(a.2.contains(&NsDescriptor::Nguid(uuid)));
    assert!(!a.2.iter().any(|d| matches!(d, NsDescriptor::Eui64(_))));
    // An ANA group beyond ANAGRPMAX is refused, naming it.
    let s = subsystem(true);
    let ns = Namespace::new(Bdev::ram("big", 512, 64).unwrap(), 0)
        .unwrap()
        .with_anagrpid(1025);
    let e = s.add_namespace(ns, None).unwrap_err().to_string();
    assert!(e.contains("ANA group ID 1025"), "{e}");
}
