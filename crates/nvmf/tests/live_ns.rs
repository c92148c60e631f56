//! Namespaces added and removed on a running target while a host is
//! connected over TCP: the Namespace Attribute Changed event completes
//! the held Asynchronous Event Request, the Changed Namespace List and
//! Identify show the change, and the I/O queue (on another thread) serves
//! the new namespace and refuses the removed one.
mod common;

use std::time::Duration;

use common::*;
use pollux_bdev::Bdev;
use pollux_nvmf::{LiveError, TransportOptions};
use pollux_spec::cmd::cns;
use pollux_spec::fabrics::SglDescriptor;
use pollux_spec::features::{aer, fid};
use pollux_spec::identify::NsIdList;
use pollux_spec::log::lid;
use pollux_spec::status::{generic, sct};
use pollux_spec::tcp::Digests;
use pollux_spec::{NvmOpcode, Sqe};
use zerocopy::FromBytes;

fn active(c: &mut Client) -> Vec<u32> {
    let (d, cq) = c.data_cmd(Sqe::identify(cns::ACTIVE_NS_LIST, 0, 0), 4096);
    assert!(cq.is_none_or(|c| c.status().is_success()));
    let l = NsIdList::read_from_bytes(&d).unwrap();
    l.ids.iter().copied().take_while(|&i| i != 0).collect()
}

fn changed(c: &mut Client) -> Vec<u32> {
    let (d, cq) = c.data_cmd(
        Sqe::get_log_page(lid::CHANGED_NS_LIST, 0, 4096, 0, 0, 0),
        4096,
    );
    assert!(cq.is_none_or(|c| c.status().is_success()));
    d.chunks_exact(4)
        .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
        .take_while(|&i| i != 0)
        .collect()
}

fn aer(c: &mut Client) -> u16 {
    let mut sqe = Sqe::async_event_request();
    sqe.cid = c.next_cid();
    c.capsule(&sqe, &[]);
    sqe.cid
}

#[test]
fn namespace_added_and_removed_while_connected() {
    let cores: Vec<usize> = (0..2).collect();
    let t = ram_target_with(2048, TransportOptions::default(), &cores);
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let mut en = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, 0, 1 << 8);
    en.cid = a.next_cid();
    a.capsule(&en, &[]);
    assert!(a.resp().status().is_success());
    let held = aer(&mut a);
    let mut io = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, false);
    let data = pattern(4096, 3);
    assert!(io
        .write(2, 0, &data, true)
        .status()
        .is(sct::GENERIC, generic::INVALID_NAMESPACE));

    // Refusals name the subsystem and the NSID.
    let e = t
        .add_namespace(SUB1, Bdev::ram("x", 512, 64).unwrap(), Some(1))
        .unwrap_err();
    assert!(matches!(e, LiveError::NsidTaken { nsid: 1, .. }), "{e}");
    assert!(
        e.to_string().contains(SUB1) && e.to_string().contains(" 1 "),
        "{e}"
    );
    let e = t
        .add_namespace("nqn.none", Bdev::ram("x", 512, 64).unwrap(), None)
        .unwrap_err();
    assert!(matches!(e, LiveError::NoSubsystem { .. }), "{e}");
    let Err(e) = t.remove_namespace(SUB1, 9) else {
        panic!("removed namespace 9");
    };
    assert!(matches!(e, LiveError::NoNamespace { nsid: 9, .. }), "{e}");

    // Added: the held AER completes with Notice / NS Attribute Changed /
    // log page 04h.
    let nsid = t
        .add_namespace(SUB1, Bdev::ram("Malloc1", 512, 256).unwrap(), None)
        .unwrap();
    assert_eq!(nsid, 2);
    let ev = a.resp();
    assert_eq!(ev.cid, held);
    assert!(ev.status().is_success());
    assert_eq!(
        ev.dw0,
        aer::encode(
            aer::NOTICE,
            aer::NOTICE_NS_ATTR_CHANGED,
            lid::CHANGED_NS_LIST
        )
    );
    assert_eq!(changed(&mut a), [2]);
    assert_eq!(active(&mut a), [1, 2]);
    assert_eq!(
        t.namespaces(SUB1)
            .unwrap()
            .iter()
            .map(|(n, b)| (*n, b.name().to_string()))
            .collect::<Vec<_>>(),
        [(1, "Malloc0".to_string()), (2, "Malloc1".to_string())]
    );
    // I/O to it, on the I/O queue's thread.
    assert!(io.write(2, 8, &data, false).status().is_success());
    let (back, cq) = io.read(2, 8, data.len());
    assert!(cq.is_none_or(|c| c.status().is_success()));
    assert_eq!(back, data);

    // Removed, with a write waiting for its data: it completes (Invalid
    // Namespace: it reaches the queue after the change), nothing hangs;
    // then the NSID is refused.
    let held = aer(&mut a);
    let mut w = Sqe::rw(NvmOpcode::Write, 2, 0, 8);
    w.cid = io.next_cid();
    SglDescriptor::tcp_transport(4096).write_to_sqe(&mut w);
    io.capsule(&w, &[]);
    let common::Pdu::R2T { ttag, .. } = io.recv() else {
        panic!("expected R2T");
    };
    let bdev = t.remove_namespace(SUB1, 2).unwrap();
    assert_eq!(bdev.name(), "Malloc1");
    let ev = a.resp();
    assert_eq!(ev.cid, held);
    assert_eq!(
        ev.dw0,
        aer::encode(
            aer::NOTICE,
            aer::NOTICE_NS_ATTR_CHANGED,
            lid::CHANGED_NS_LIST
        )
    );
    std::thread::sleep(Duration::from_millis(50));
    let (h, l) = pollux_spec::tcp::H2CData::new(w.cid, ttag, 0, 4096, true, io.dg, 0).unwrap();
    io.send_pdu(zerocopy::IntoBytes::as_bytes(&h), &l, &data);
    let cq = io.resp();
    assert_eq!(cq.cid, w.cid);
    assert!(
        cq.status().is_success() || cq.status().is(sct::GENERIC, generic::INVALID_NAMESPACE),
        "{:#x}",
        cq.status().0
    );
    assert!(io
        .write(2, 0, &data, true)
        .status()
        .is(sct::GENERIC, generic::INVALID_NAMESPACE));
    assert_eq!(changed(&mut a), [2]);
    assert_eq!(active(&mut a), [1]);
    // Namespace 1 still works.
    assert!(io.write(1, 0, &data, true).status().is_success());
}
