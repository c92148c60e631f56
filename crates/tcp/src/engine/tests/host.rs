//! The host end's refusals: what ends a connection, what fails only a
//! command.
use super::*;

/// A host queue with one read outstanding (CID 0, 1 KiB into `buf`).
fn host_with_read(digests: Digests, buf: &mut [u8]) -> HostQueue<Pointers> {
    let params = HostParams {
        digests,
        cpda: 0,
        maxh2cdata: 4096,
    };
    let mut h = HostQueue::new(Pointers, addr(), 1, params, 4);
    let sqe = Sqe::rw(NvmOpcode::Read, 1, 0, 2);
    let a = buf.as_mut_ptr() as usize as u64;
    // SAFETY: `buf` outlives the queue in every test and is not touched
    // while the read is outstanding.
    unsafe { h.submit(0, sqe, Data::In { addr: a, len: 1024 }, 0, false) }.unwrap();
    h.tx.clear();
    h
}

fn c2h(cid: u16, datao: u32, data: &[u8], digests: Digests) -> Vec<u8> {
    let (h, l) = C2HData::new(cid, datao, data.len() as u32, true, true, digests, 0).unwrap();
    let mut q = SendQueue::default();
    q.push_header(h.as_bytes(), &l);
    q.push_bytes(data);
    if l.ddgst {
        q.push_bytes(&pollux_spec::tcp::data_digest([data]).to_le_bytes());
    }
    drain(&mut q, &mut Vec::new())
}

#[test]
fn c2h_data_beyond_the_buffer_is_refused_before_a_byte_is_copied() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let pdu = c2h(0, 0, &[0xEE; 1536], Digests::NONE);
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, _| panic!("completed"));
    assert!(r.failed);
    let e = h.take_error().expect("refused");
    assert_eq!(e.kind, HostErrorKind::BadPdu);
    let term = e.term.expect("a Termination Request to send");
    let t = TermReq::read_from_prefix(&term).unwrap().0;
    assert_eq!(t.fes(), Fes::DATA_TRANSFER_OUT_OF_RANGE);
    // It carries the offending header.
    assert_eq!(&term[24..48], &pdu[..24]);
    assert!(buf.iter().all(|&b| b == 0));
}

#[test]
fn a_bad_data_digest_fails_the_command_not_the_connection() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::BOTH, &mut buf);
    let mut pdu = c2h(0, 0, &[0x11; 1024], Digests::BOTH);
    let n = pdu.len();
    pdu[n - 1] ^= 0xFF;
    let mut got = Vec::new();
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, c| got.push(c.status >> 1));
    assert!(!r.failed);
    assert_eq!(r.consumed, pdu.len());
    assert_eq!(
        got,
        vec![Status::generic(generic::TRANSIENT_TRANSPORT_ERROR).0]
    );
}

#[test]
fn a_bad_header_digest_is_fatal_with_fes_3() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::BOTH, &mut buf);
    let mut pdu = c2h(0, 0, &[0x11; 1024], Digests::BOTH);
    pdu[24] ^= 1;
    let r = h.receive(&pdu, u32::MAX, &mut |_, _, _| panic!("completed"));
    assert!(r.failed);
    let e = h.take_error().unwrap();
    let t = TermReq::read_from_prefix(&e.term.unwrap()).unwrap().0;
    assert_eq!(t.fes(), Fes::HEADER_DIGEST_ERROR);
}

#[test]
fn answers_for_commands_not_outstanding_end_the_connection() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let resp = CapsuleResp::new(
        Cqe {
            cid: 3,
            ..Cqe::default()
        },
        false,
    );
    let r = h.receive(resp.as_bytes(), u32::MAX, &mut |_, _, _| panic!());
    assert!(r.failed);
    assert_eq!(h.take_error().unwrap().kind, HostErrorKind::Protocol);
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let r2t = R2T::new(0, 0, 0, 512, false);
    let r = h.receive(r2t.as_bytes(), u32::MAX, &mut |_, _, _| panic!());
    assert!(r.failed);
    let e = h.take_error().unwrap();
    assert_eq!(e.kind, HostErrorKind::Protocol);
    assert!(e.what.contains("no data to send"), "{}", e.what);
}

#[test]
fn a_termination_request_ends_the_connection_after_its_data() {
    let mut buf = vec![0u8; 1024];
    let mut h = host_with_read(Digests::NONE, &mut buf);
    let t = TermReq::new(Role::Controller, Fes::PDU_SEQUENCE_ERROR, 0, 24);
    let mut pdu = t.as_bytes().to_vec();
    pdu.extend_from_slice(&[0xAB; 24]);
    // The header alone: nothing yet.
    let r = h.receive(&pdu[..30], u32::MAX, &mut |_, _, _| panic!());
    assert!(!r.failed);
    let r2 = h.receive(&pdu[r.consumed..], u32::MAX, &mut |_, _, _| panic!());
    assert!(r2.failed);
    let e = h.take_error().unwrap();
    assert_eq!(e.kind, HostErrorKind::TermReq);
}

#[test]
fn a_completion_arriving_before_the_write_data_left_leaves_a_copy() {
    let params = HostParams {
        digests: Digests::NONE,
        cpda: 0,
        maxh2cdata: 4096,
    };
    let mut h = HostQueue::new(Pointers, addr(), 1, params, 4);
    h.icd_max = 8192;
    let mut buf = vec![0x5Au8; 1024];
    let a = buf.as_ptr() as usize as u64;
    let sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 2);
    // SAFETY: `buf` is written only after the completion below.
    unsafe { h.submit(2, sqe, Data::Out { addr: a, len: 1024 }, 2, false) }.unwrap();
    let resp = CapsuleResp::new(
        Cqe {
            cid: 2,
            ..Cqe::default()
        },
        false,
    );
    let mut n = 0;
    h.receive(resp.as_bytes(), u32::MAX, &mut |_, _, _| n += 1);
    assert_eq!(n, 1);
    buf.fill(0);
    let wire = drain(&mut h.tx, &mut Vec::new());
    assert_eq!(wire.len(), 72 + 1024);
    assert!(wire[72..].iter().all(|&b| b == 0x5A));
}
