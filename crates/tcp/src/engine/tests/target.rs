//! The controller end's checks of what the host sends, and its send
//! queue.
use super::*;

/// The controller's checks of H2CData.
fn ctl_awaiting_write() -> (Ctl, Digests) {
    let d = Digests::NONE;
    let mut ctl = Ctl::new(4096, 4096, false);
    ctl.feed(ic::host_icreq(d).as_bytes()).unwrap();
    ctl.out();
    ctl.q.r2t(3, 9, 2048);
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 0, 4);
    sqe.cid = 9;
    ctl.writes.insert(3, (sqe, vec![0; 2048]));
    let r2t = ctl.out();
    let r = R2T::read_from_prefix(&r2t).unwrap().0;
    assert_eq!((r.cccid, r.ttag, r.r2to, r.r2tl), (9, 3, 0, 2048));
    (ctl, d)
}

fn h2c(cccid: u16, ttag: u16, datao: u32, len: u32, d: Digests) -> Vec<u8> {
    let (h, l) = pollux_spec::tcp::H2CData::new(cccid, ttag, datao, len, true, d, 0).unwrap();
    let mut v = h.as_bytes().to_vec();
    v.resize(l.plen as usize, 0x42);
    v
}

#[test]
fn h2c_data_for_no_transfer_or_another_command_is_fatal() {
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 4, 0, 512, d)).unwrap_err();
    let TargetError::Fatal {
        fes, fei, header, ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!(
        (fes, fei),
        (Fes::INVALID_HEADER_FIELD, Field::Ttag.offset())
    );
    assert_eq!(header.len(), 24);
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(8, 3, 0, 512, d)).unwrap_err();
    assert!(matches!(e, TargetError::Fatal { fei, .. } if fei == Field::Cccid.offset()));
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 3, 512, 512, d)).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Fatal {
            fes: Fes::DATA_TRANSFER_OUT_OF_RANGE,
            ..
        }
    ));
    let (mut ctl, d) = ctl_awaiting_write();
    let e = ctl.feed(&h2c(9, 3, 0, 4096, d)).unwrap_err();
    assert!(matches!(
        e,
        TargetError::Fatal {
            fes: Fes::DATA_TRANSFER_OUT_OF_RANGE,
            ..
        }
    ));
}

#[test]
fn h2c_data_completes_its_transfer_once_all_of_it_is_in() {
    let (mut ctl, d) = ctl_awaiting_write();
    ctl.feed(&h2c(9, 3, 0, 1024, d)).unwrap();
    assert!(ctl.q.awaiting(3));
    ctl.feed(&h2c(9, 3, 1024, 1024, d)).unwrap();
    assert!(!ctl.q.awaiting(3));
    // A response went out for CID 9.
    let out = ctl.out();
    let r = CapsuleResp::read_from_prefix(&out).unwrap().0;
    assert_eq!(r.cqe.cid, 9);
    // More data for it now is fatal.
    assert!(ctl.feed(&h2c(9, 3, 2048, 512, d)).is_err());
}

#[test]
fn a_cancelled_transfer_takes_no_more_data() {
    let (mut ctl, d) = ctl_awaiting_write();
    ctl.q.cancel(3);
    assert!(ctl.feed(&h2c(9, 3, 0, 512, d)).is_err());
}

#[test]
fn pdus_before_icreq_are_sequence_errors_and_a_bad_term_req_length_closes() {
    let mut ctl = Ctl::new(4096, 4096, false);
    let (cmd, _) = pollux_spec::tcp::CapsuleCmd::new(&Sqe::new(0, 0), 0, Digests::NONE, 0).unwrap();
    let e = ctl.feed(cmd.as_bytes()).unwrap_err();
    assert!(
        matches!(
            e,
            TargetError::Fatal {
                fes: Fes::PDU_SEQUENCE_ERROR,
                ..
            }
        ),
        "{e:?}"
    );
    let mut ctl = Ctl::new(4096, 4096, false);
    let mut t = TermReq::new(Role::Host, Fes::PDU_SEQUENCE_ERROR, 0, 0);
    t.ch.plen = 4000;
    let e = ctl.feed(t.as_bytes()).unwrap_err();
    assert_eq!(e, TargetError::TermReqLength { plen: 4000 });
}

#[test]
fn the_host_terminating_is_an_event() {
    let mut ctl = Ctl::new(4096, 4096, false);
    ctl.feed(ic::host_icreq(Digests::NONE).as_bytes()).unwrap();
    let t = TermReq::new(Role::Host, Fes::HEADER_DIGEST_ERROR, 0x1234, 0);
    ctl.feed(t.as_bytes()).unwrap();
    assert_eq!(ctl.terminated, Some((Fes::HEADER_DIGEST_ERROR, 0x1234)));
}

#[test]
fn a_termination_request_carries_the_offending_header() {
    let mut q = TargetQueue::new(
        TargetLimits {
            maxh2cdata: 4096,
            icd: 0,
        },
        1,
    );
    q.terminate(Fes::INVALID_HEADER_FIELD, 4, &[0xCD; 200]);
    let out = drain(&mut q.tx, &mut Vec::new());
    assert_eq!(out.len(), 24 + 128);
    let t = TermReq::read_from_prefix(&out).unwrap().0;
    assert_eq!(
        (t.fes(), t.fei(), t.data_len()),
        (Fes::INVALID_HEADER_FIELD, 4, 128)
    );
}

#[test]
fn send_data_marks_come_after_the_data_and_the_response() {
    let mut q = TargetQueue::new(
        TargetLimits {
            maxh2cdata: 4096,
            icd: 0,
        },
        2,
    );
    let data = vec![7u8; 3000];
    let resp = Cqe {
        cid: 4,
        ..Cqe::default()
    };
    // SAFETY: `data` outlives the drain below.
    assert!(unsafe { q.send_data(4, &data, 1024, Some(resp), 1) });
    let mut marks = Vec::new();
    let out = drain(&mut q.tx, &mut marks);
    assert_eq!(marks, vec![1]);
    // Three C2HData PDUs (none with SUCCESS), then the response.
    let l = PduLayout::new(PduType::C2HData, Digests::NONE, 0, 1024).unwrap();
    assert_eq!(out.len(), 2 * l.plen as usize + 24 + 952 + 24);
    let first = C2HData::read_from_prefix(&out).unwrap().0;
    assert_eq!(first.ch.flags & (flags::LAST_PDU | flags::SUCCESS), 0);
}

#[test]
fn the_send_queue_resumes_mid_segment_and_reports_marks_in_order() {
    let mut q = SendQueue::default();
    let ext = [9u8; 10];
    q.push_bytes(b"abc");
    q.push_bytes(b"def");
    q.push_ext(ext.as_ptr() as usize as u64, ext.len(), 1);
    q.push_mark(1);
    q.push_bytes(b"xyz");
    q.push_mark(2);
    assert_eq!(q.segments().count(), 5, "abc and def merge");
    let mut marks = Vec::new();
    q.advance(4, |m| marks.push(m));
    let mut iov = [IoSlice::new(&[]); 4];
    // SAFETY: `ext` lives through the test.
    let n = unsafe { q.iovecs(&Pointers, &mut iov) };
    assert_eq!(n, 3);
    assert_eq!(&*iov[0], b"ef");
    assert_eq!(iov[1].len(), 10);
    q.advance(2 + 10, |m| marks.push(m));
    assert_eq!(marks, vec![1]);
    q.advance(3, |m| marks.push(m));
    assert_eq!(marks, vec![1, 2]);
    assert!(q.is_empty());
    assert_eq!(q.own_len(), 0);
}

#[test]
fn transfer_tags_can_be_given_later_and_start_idle() {
    let mut ctl = Ctl::new(4096, 4096, false);
    ctl.q.set_transfers(0);
    assert_eq!(ctl.q.transfers(), 0);
    ctl.feed(ic::host_icreq(Digests::NONE).as_bytes()).unwrap();
    ctl.out();
    // No tags yet: an R2T asks for nothing and H2CData is fatal.
    ctl.q.r2t(0, 9, 512);
    assert!(!ctl.q.awaiting(0));
    ctl.out();
    assert!(ctl.feed(&h2c(9, 0, 0, 512, Digests::NONE)).is_err());
    let (mut ctl, _) = ctl_awaiting_write();
    assert!(ctl.q.awaiting(3));
    ctl.q.set_transfers(8);
    assert_eq!(ctl.q.transfers(), 8);
    assert!((0..8).all(|t| !ctl.q.awaiting(t)));
}

#[test]
fn raw_iovecs_are_the_iovecs() {
    let mut q = SendQueue::default();
    let ext = [9u8; 10];
    q.push_bytes(b"abc");
    q.push_ext(ext.as_ptr() as usize as u64, ext.len(), 1);
    q.push_mark(1);
    q.push_bytes(b"xyz");
    q.advance(1, |_| {});
    let mut iov = [IoSlice::new(&[]); 4];
    let mut raw = vec![libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 99,
    }];
    // SAFETY: `ext` lives through the test.
    let n = unsafe { q.iovecs(&Pointers, &mut iov) };
    // SAFETY: as above.
    let m = unsafe { q.iovecs_raw(&Pointers, &mut raw, 8) };
    assert_eq!((n, m, raw.len()), (3, 3, 3));
    for (a, b) in iov[..n].iter().zip(&raw) {
        assert_eq!(
            (a.as_ptr() as usize, a.len()),
            (b.iov_base as usize, b.iov_len)
        );
    }
    // At most `max`.
    // SAFETY: as above.
    assert_eq!(unsafe { q.iovecs_raw(&Pointers, &mut raw, 2) }, 2);
    assert_eq!(raw.len(), 2);
}

/// What the send queue queues for a header is what `write_header`
/// writes, with and without digests and padding (moved from the target's
/// own send queue, which this one replaced).
#[test]
fn queued_header_bytes_match_write_header() {
    use pollux_spec::tcp::write_header;
    for dgst in 0..4 {
        let digests = Digests::from_dgst(dgst);
        for pda in [0, 1, 3, 31] {
            for len in [0, 1, 4096] {
                let (h, l) = C2HData::new(7, 0, len.max(1), true, true, digests, pda).unwrap();
                let r = CapsuleResp::new(Cqe::default(), digests.header);
                let lr = PduLayout::new(PduType::CapsuleResp, digests, pda, 0).unwrap();
                for (hdr, lay) in [(h.as_bytes(), l), (r.as_bytes(), lr)] {
                    let mut tx = SendQueue::default();
                    tx.push_header(hdr, &lay);
                    let mut want = [0u8; 256];
                    let n = write_header(hdr, &lay, &mut want).unwrap();
                    assert_eq!(tx.own_len(), n, "{lay:?}");
                    assert_eq!(tx.segments().count(), 1);
                    assert_eq!(drain(&mut tx, &mut Vec::new()), &want[..n], "{lay:?}");
                }
            }
        }
    }
    // A header of the wrong length is refused.
    let l = PduLayout::new(PduType::CapsuleResp, Digests::NONE, 0, 0).unwrap();
    let mut tx = SendQueue::default();
    tx.push_header(&[0u8; 8], &l);
    assert!(tx.is_empty() && tx.own_len() == 0);
}

/// The segment queue: bytes merge only into a segment not yet sent; a
/// drained queue starts over.
#[test]
fn the_send_queue_merges_unsent_bytes_and_restarts_when_drained() {
    let mut tx = SendQueue::default();
    tx.push_bytes(b"ab");
    tx.push_bytes(b"cd");
    assert_eq!(tx.segments().count(), 1);
    tx.push_mark(3);
    tx.push_bytes(b"ef");
    assert_eq!(tx.segments().count(), 3);
    let mut marks = Vec::new();
    tx.advance(4, |m| marks.push(m));
    assert_eq!(marks, vec![3]);
    assert_eq!(
        tx.segments().copied().collect::<Vec<_>>(),
        vec![Seg::Own { start: 4, len: 2 }]
    );
    tx.advance(2, |m| marks.push(m));
    assert!(tx.is_empty() && tx.own_len() == 0);
    // The sent "ef" is not extended: the new bytes start over.
    tx.push_bytes(b"gh");
    assert_eq!(
        tx.segments().copied().collect::<Vec<_>>(),
        vec![Seg::Own { start: 0, len: 2 }]
    );
}

/// A marked data segment reports its mark once its last byte is sent,
/// not before; detached, its mark follows the copy.
#[test]
fn a_marked_data_segment_reports_its_mark_once_sent() {
    let ext = [5u8; 10];
    let mut q = SendQueue::default();
    q.push_bytes(b"hd");
    q.push_ext_marked(ext.as_ptr() as usize as u64, ext.len(), 7);
    q.push_bytes(b"next");
    assert_eq!(q.segments().count(), 3);
    let mut marks = Vec::new();
    q.advance(2 + 9, |m| marks.push(m));
    assert!(marks.is_empty());
    q.advance(1, |m| marks.push(m));
    assert_eq!(marks, vec![7]);
    q.advance(4, |m| marks.push(m));
    assert!(q.is_empty());

    let mut q = SendQueue::default();
    q.push_ext_marked(ext.as_ptr() as usize as u64, ext.len(), 7);
    q.push_bytes(b"x");
    q.advance(3, |m| marks.push(m));
    // SAFETY: `ext` lives through the test.
    unsafe { q.detach(7, &Pointers) };
    assert_eq!(
        q.segments().copied().collect::<Vec<_>>(),
        vec![
            Seg::Own { start: 1, len: 7 },
            Seg::Mark { slot: 7 },
            Seg::Own { start: 0, len: 1 }
        ]
    );
    let mut marks = Vec::new();
    assert_eq!(drain(&mut q, &mut marks), [&[5u8; 7][..], b"x"].concat());
    assert_eq!(marks, vec![7]);
}

/// Without a response capsule (SUCCESS in the last C2HData), the mark
/// comes with the last data byte, with or without data digests.
#[test]
fn send_data_without_a_response_marks_after_the_last_byte() {
    for dgst in [0, 2] {
        let mut q = TargetQueue::new(
            TargetLimits {
                maxh2cdata: 4096,
                icd: 0,
            },
            2,
        );
        let d = Digests::from_dgst(dgst);
        let mut ctl_in = ic::host_icreq(d).as_bytes().to_vec();
        let (n, _) = q.next(&ctl_in).unwrap();
        ctl_in.drain(..n);
        drain(&mut q.tx, &mut Vec::new());
        let data = vec![3u8; 3000];
        // SAFETY: `data` outlives the drain below.
        assert!(unsafe { q.send_data(4, &data, 1024, None, 1) });
        let mut marks = Vec::new();
        let segs = q.tx.segments().count();
        let out = drain(&mut q.tx, &mut marks);
        assert_eq!(marks, vec![1]);
        let l = PduLayout::new(PduType::C2HData, d, 0, 1024).unwrap();
        let last = PduLayout::new(PduType::C2HData, d, 0, 952).unwrap();
        assert_eq!(out.len(), 2 * l.plen as usize + last.plen as usize);
        // Header and data per PDU; with digests, each digest and the next
        // header share a segment, and a mark ends them.
        assert_eq!(segs, if dgst == 0 { 6 } else { 8 });
    }
}
