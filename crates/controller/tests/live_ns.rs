//! Namespaces added and removed while controllers run: Identify and the
//! I/O queues see the live set, in-flight commands of a removed
//! namespace finish, the Changed Namespace List (log page 04h) and the
//! Namespace Attribute Changed event.
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, Controller, ControllerError, FabricsTraits, Identity, IoQueue,
    IoQueueOptions, Limits, Namespace, Personality, Subsystem, MAX_NAMESPACES,
};
use pollux_spec::cmd::cns;
use pollux_spec::features::{aer, fid};
use pollux_spec::identify::{IdentifyController, IdentifyNamespace, NsIdList, OAES_NS_ATTR};
use pollux_spec::log::lid;
use pollux_spec::status::generic;
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

fn subsystem(n: usize) -> Arc<Subsystem> {
    let ns = (0..n)
        .map(|i| Namespace::new(Bdev::ram(&format!("r{i}"), 512, 64).unwrap(), 0).unwrap())
        .collect();
    Subsystem::new(
        Identity {
            serial: "LIVE0001".into(),
            model: "live".into(),
            firmware: "1.0".into(),
            vid: 0,
            ssvid: 0,
            ieee: [0; 3],
            subnqn: "nqn.2024-01.io.pollux:live".into(),
        },
        Limits {
            mqes: 127,
            max_io_queues: 4,
            mdts: 5,
            abort_limit: 3,
            aer_limit: 3,
            cap_to: 20,
        },
        Personality::Fabrics(FabricsTraits {
            in_capsule_data: 8192,
            kas: 0,
        }),
        ns,
    )
    .unwrap()
}

fn ram(name: &str) -> Namespace {
    Namespace::new(Bdev::ram(name, 512, 64).unwrap(), 0).unwrap()
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

fn active(c: &mut Controller) -> Vec<u32> {
    let d = admin_data(c, Sqe::identify(cns::ACTIVE_NS_LIST, 0, 0)).unwrap();
    let l = NsIdList::read_from_bytes(&d).unwrap();
    l.ids.iter().copied().take_while(|&i| i != 0).collect()
}

fn changed(c: &mut Controller, rae: bool) -> Vec<u32> {
    let mut sqe = Sqe::get_log_page(lid::CHANGED_NS_LIST, 0, 4096, 0, 0, 0);
    if rae {
        sqe.cdw10 |= 1 << 15;
    }
    let d = admin_data(c, sqe).unwrap();
    d.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .take_while(|&i| i != 0)
        .collect()
}

fn seg(buf: &mut [u8]) -> [RawSeg; 1] {
    [RawSeg {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    }]
}

fn poll_all(q: &mut IoQueue) -> Vec<(u32, Status)> {
    let mut got = Vec::new();
    q.sync_namespaces();
    for _ in 0..1000 {
        q.poll(&mut |t, st| got.push((t, st)));
        if q.outstanding() == 0 {
            break;
        }
    }
    got
}

#[test]
fn add_and_remove_check_nsids() {
    let s = subsystem(2);
    let e = s.add_namespace(ram("x"), Some(2)).unwrap_err();
    assert!(matches!(e, ControllerError::NsidTaken { nsid: 2 }), "{e}");
    assert!(e.to_string().contains("namespace ID 2"), "{e}");
    for bad in [0, u32::MAX, MAX_NAMESPACES as u32 + 1] {
        let e = s.add_namespace(ram("x"), Some(bad)).unwrap_err();
        assert!(
            matches!(e, ControllerError::Nsid { nsid, .. } if nsid == bad),
            "{e}"
        );
    }
    assert_eq!(s.add_namespace(ram("a"), None).unwrap(), 3);
    assert_eq!(s.add_namespace(ram("b"), Some(10)).unwrap(), 10);
    assert_eq!(s.remove_namespace(1).unwrap().bdev().name(), "r0");
    assert!(matches!(
        s.remove_namespace(1),
        Err(ControllerError::NoNamespace { nsid: 1 })
    ));
    // The lowest free NSID.
    assert_eq!(s.add_namespace(ram("c"), None).unwrap(), 1);
    assert_eq!(
        s.namespaces().iter().map(|n| n.0).collect::<Vec<_>>(),
        [1, 2, 3, 10]
    );
}

#[test]
fn identify_and_io_queues_follow_the_live_set() {
    let s = subsystem(1);
    let mut c = Controller::new(s.clone(), 1);
    let id = IdentifyController::read_from_bytes(
        &admin_data(&mut c, Sqe::identify(cns::CONTROLLER, 0, 0)).unwrap(),
    )
    .unwrap();
    assert_eq!(id.oaes & OAES_NS_ATTR, OAES_NS_ATTR);
    assert_eq!(id.nn, MAX_NAMESPACES as u32);
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    let w3 = Sqe::rw(NvmOpcode::Write, 3, 0, 1);
    assert_eq!(
        q.check(&w3).unwrap_err(),
        Status::generic(generic::INVALID_NAMESPACE)
    );
    // Inactive NSID of the range: zeros; beyond NN: Invalid Namespace.
    let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 3, 0)).unwrap();
    assert!(d.iter().all(|&b| b == 0));
    assert_eq!(
        admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 2000, 0)).unwrap_err(),
        Status::generic(generic::INVALID_NAMESPACE)
    );

    assert_eq!(s.add_namespace(ram("n3"), Some(3)).unwrap(), 3);
    assert_eq!(active(&mut c), [1, 3]);
    let d = admin_data(&mut c, Sqe::identify(cns::NAMESPACE, 3, 0)).unwrap();
    assert_eq!(IdentifyNamespace::read_from_bytes(&d).unwrap().nsze, 64);
    // The queue opens its channel at its next poll.
    poll_all(&mut q);
    let mut wbuf = vec![0xA5u8; 512];
    let cmd = q.check(&w3).unwrap();
    let sg = seg(&mut wbuf);
    // SAFETY: `wbuf` lives untouched until polled.
    unsafe { q.submit(1, &cmd, &sg) }.unwrap();
    assert_eq!(poll_all(&mut q), [(1, Status::SUCCESS)]);
    let mut rbuf = vec![0u8; 512];
    let cmd = q.check(&Sqe::rw(NvmOpcode::Read, 3, 0, 1)).unwrap();
    let sg = seg(&mut rbuf);
    // SAFETY: as above.
    unsafe { q.submit(2, &cmd, &sg) }.unwrap();
    assert_eq!(poll_all(&mut q), [(2, Status::SUCCESS)]);
    assert_eq!(rbuf, wbuf);

    // Removed with a write in flight: it finishes, then the NSID is
    // refused.
    let cmd = q.check(&w3).unwrap();
    let sg = seg(&mut wbuf);
    // SAFETY: as above.
    unsafe { q.submit(3, &cmd, &sg) }.unwrap();
    assert_eq!(q.bdev_requests(), 1);
    let gone = s.remove_namespace(3).unwrap();
    assert_eq!(poll_all(&mut q), [(3, Status::SUCCESS)]);
    assert_eq!(q.bdev_requests(), 0);
    assert_eq!(
        q.check(&w3).unwrap_err(),
        Status::generic(generic::INVALID_NAMESPACE)
    );
    assert_eq!(active(&mut c), [1]);
    // A Flush of every namespace skips it.
    let cmd = q.check(&Sqe::flush(u32::MAX)).unwrap();
    // SAFETY: no data.
    unsafe { q.submit(4, &cmd, &[]) }.unwrap();
    assert_eq!(poll_all(&mut q), [(4, Status::SUCCESS)]);
    // The same NSID for another bdev: a new channel, to the new bdev.
    s.add_namespace(ram("n3b"), Some(3)).unwrap();
    poll_all(&mut q);
    let mut rbuf = vec![1u8; 512];
    let cmd = q.check(&Sqe::rw(NvmOpcode::Read, 3, 0, 1)).unwrap();
    let sg = seg(&mut rbuf);
    // SAFETY: as above.
    unsafe { q.submit(5, &cmd, &sg) }.unwrap();
    assert_eq!(poll_all(&mut q), [(5, Status::SUCCESS)]);
    assert!(rbuf.iter().all(|&b| b == 0), "read the old bdev");
    drop(gone);
}

#[test]
fn changed_namespace_list_and_event() {
    let s = subsystem(1);
    let mut c = Controller::new(s.clone(), 1);
    let mut other = Controller::new(s.clone(), 2);
    let mut aer_sqe = Sqe::async_event_request();
    aer_sqe.cid = 9;
    assert_eq!(
        c.exec_admin(&aer_sqe, AdminEnv::default()),
        AdminOutcome::Held
    );
    // Notices not enabled: the list is kept, no event.
    s.add_namespace(ram("a"), None).unwrap();
    c.namespace_events();
    assert_eq!(c.next_event(), None);
    assert_eq!(changed(&mut c, false), [2]);
    assert_eq!(changed(&mut c, false), Vec::<u32>::new(), "cleared on read");

    let en = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 1 << 8);
    assert!(matches!(
        c.exec_admin(&en, AdminEnv::default()),
        AdminOutcome::Complete { status, .. } if status.is_success()
    ));
    s.add_namespace(ram("b"), Some(7)).unwrap();
    s.remove_namespace(2).unwrap();
    c.namespace_events();
    let ev = aer::encode(
        aer::NOTICE,
        aer::NOTICE_NS_ATTR_CHANGED,
        lid::CHANGED_NS_LIST,
    );
    assert_eq!(c.next_event(), Some((9, ev)));
    // Masked until the log is read with RAE clear.
    aer_sqe.cid = 10;
    assert_eq!(
        c.exec_admin(&aer_sqe, AdminEnv::default()),
        AdminOutcome::Held
    );
    s.add_namespace(ram("c"), Some(8)).unwrap();
    c.namespace_events();
    assert_eq!(c.next_event(), None);
    assert_eq!(changed(&mut c, true), [2, 7, 8]);
    s.remove_namespace(8).unwrap();
    c.namespace_events();
    assert_eq!(c.next_event(), None, "RAE set: still masked");
    assert_eq!(changed(&mut c, false), [8]);
    s.remove_namespace(7).unwrap();
    c.namespace_events();
    assert_eq!(c.next_event(), Some((10, ev)));
    // The other controller saw every change in its own list.
    assert_eq!(changed(&mut other, false), [2, 7, 8]);
}
