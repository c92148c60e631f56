//! NVMe/TCP PDU formats: sizes and offsets, builders round-tripped through
//! the checker and parser, each check failure with its field and FES/FEI,
//! CRC32C vectors, and property/fuzz tests of the checker.
use std::mem::{offset_of, size_of};

use pollux_spec::tcp::*;
use pollux_spec::{Cqe, NvmOpcode, Sqe};
use proptest::prelude::*;
use zerocopy::{FromBytes, IntoBytes};

fn cfg(receiver: Role, digests: Digests, pda: u8) -> RxConfig {
    RxConfig {
        receiver,
        established: true,
        digests,
        pda,
        max_plen: 1 << 20,
        maxh2cdata: 64 * 1024,
    }
}

/// A full PDU: header (+digest, padding), `data` and its digest.
fn assemble(header: &[u8], layout: &PduLayout, data: &[u8]) -> Vec<u8> {
    let mut out = vec![0xEE; layout.plen as usize];
    let n = write_header(header, layout, &mut out).expect("buffer fits the header");
    assert_eq!(n, layout.data_range().start);
    out[layout.data_range()].copy_from_slice(data);
    if let Some(r) = layout.data_digest_range() {
        out[r].copy_from_slice(&digest_bytes(data_digest([data])));
    }
    out
}

/// Receives `pdu` as `cfg` would: check, parse, verify the data digest.
fn receive(pdu: &[u8], cfg: &RxConfig) -> Result<(PduLayout, PduHeader), PduError> {
    let ch = CommonHeader::read(pdu).expect("8 bytes");
    let layout = ch.check(cfg)?;
    assert_eq!(layout.plen as usize, pdu.len());
    let h = PduHeader::parse(pdu, &layout, cfg)?;
    if let Some(r) = layout.data_digest_range() {
        let computed = data_digest([&pdu[layout.data_range()]]);
        verify_data_digest(computed, pdu[r].try_into().unwrap())?;
    }
    Ok((layout, h))
}

#[test]
fn sizes_and_offsets() {
    assert_eq!(size_of::<CommonHeader>(), 8);
    assert_eq!(offset_of!(CommonHeader, pdu_type), 0);
    assert_eq!(offset_of!(CommonHeader, flags), 1);
    assert_eq!(offset_of!(CommonHeader, hlen), 2);
    assert_eq!(offset_of!(CommonHeader, pdo), 3);
    assert_eq!(offset_of!(CommonHeader, plen), 4);
    assert_eq!(size_of::<IcReq>(), 128);
    assert_eq!(offset_of!(IcReq, pfv), 8);
    assert_eq!(offset_of!(IcReq, hpda), 10);
    assert_eq!(offset_of!(IcReq, dgst), 11);
    assert_eq!(offset_of!(IcReq, maxr2t), 12);
    assert_eq!(size_of::<IcResp>(), 128);
    assert_eq!(offset_of!(IcResp, cpda), 10);
    assert_eq!(offset_of!(IcResp, maxh2cdata), 12);
    assert_eq!(size_of::<TermReq>(), 24);
    assert_eq!(offset_of!(TermReq, fes), 8);
    assert_eq!(offset_of!(TermReq, fei), 10);
    assert_eq!(size_of::<CapsuleCmd>(), 72);
    assert_eq!(offset_of!(CapsuleCmd, sqe), 8);
    assert_eq!(size_of::<CapsuleResp>(), 24);
    assert_eq!(offset_of!(CapsuleResp, cqe), 8);
    for (size, cccid, datao, datal) in [
        (
            size_of::<H2CData>(),
            offset_of!(H2CData, cccid),
            offset_of!(H2CData, datao),
            offset_of!(H2CData, datal),
        ),
        (
            size_of::<C2HData>(),
            offset_of!(C2HData, cccid),
            offset_of!(C2HData, datao),
            offset_of!(C2HData, datal),
        ),
        (
            size_of::<R2T>(),
            offset_of!(R2T, cccid),
            offset_of!(R2T, r2to),
            offset_of!(R2T, r2tl),
        ),
    ] {
        assert_eq!((size, cccid, datao, datal), (24, 8, 12, 16));
    }
    assert_eq!(offset_of!(H2CData, ttag), 10);
    assert_eq!(offset_of!(R2T, ttag), 10);
    // Field::offset agrees with the structures.
    assert_eq!(Field::Datal.offset() as usize, offset_of!(H2CData, datal));
    assert_eq!(
        Field::Maxh2cdata.offset() as usize,
        offset_of!(IcResp, maxh2cdata)
    );
    assert_eq!(Field::Pda.offset() as usize, offset_of!(IcReq, hpda));
    assert_eq!(Field::R2tl.offset() as usize, offset_of!(R2T, r2tl));
}

#[test]
fn pdu_types_and_directions() {
    for v in 0..=255u8 {
        if let Some(t) = PduType::from_u8(v) {
            assert_eq!(t as u8, v);
            let want = if v & 1 == 0 {
                Role::Host
            } else {
                Role::Controller
            };
            assert_eq!(t.sender(), want, "{t}");
        }
    }
    assert_eq!(PduType::from_u8(0x08), None);
    assert_eq!(PduType::from_u8(0x0A), None);
    assert_eq!(PduType::IcReq.hlen(), 128);
    assert_eq!(PduType::CapsuleCmd.hlen(), 72);
    assert_eq!(PduType::R2T.hlen(), 24);
}

#[test]
fn header_bytes_are_little_endian() {
    let (h, l) = C2HData::new(0x1234, 0x1000, 0x200, true, true, Digests::NONE, 0).unwrap();
    let b = h.as_bytes();
    assert_eq!(b[0], 0x07);
    assert_eq!(b[1], flags::LAST_PDU | flags::SUCCESS);
    assert_eq!(b[2], 24);
    assert_eq!(b[3], 24);
    assert_eq!(&b[4..8], &(24u32 + 0x200).to_le_bytes());
    assert_eq!(&b[8..10], &0x1234u16.to_le_bytes());
    assert_eq!(&b[12..16], &0x1000u32.to_le_bytes());
    assert_eq!(&b[16..20], &0x200u32.to_le_bytes());
    assert_eq!(l.data_range(), 24..24 + 0x200);
}

#[test]
fn icreq_icresp_round_trip() {
    let req = IcReq::new(0, Digests::BOTH, 3);
    let mut c = RxConfig::initial(Role::Controller);
    let (l, h) = receive(req.as_bytes(), &c).unwrap();
    assert_eq!(l.plen, 128);
    assert_eq!(l.data_len, 0);
    let PduHeader::IcReq(r) = h else {
        panic!("{h:?}")
    };
    assert_eq!(r.digests(), Digests::BOTH);
    assert_eq!(r.maxr2t, 3);

    let resp = IcResp::new(1, Digests::BOTH, 128 * 1024);
    let hc = RxConfig::initial(Role::Host);
    let (_, h) = receive(resp.as_bytes(), &hc).unwrap();
    let PduHeader::IcResp(r) = h else {
        panic!("{h:?}")
    };
    assert_eq!(r.cpda, 1);
    assert_eq!(r.maxh2cdata, 128 * 1024);

    // After initialization an ICReq is a PDU sequence error.
    c.established = true;
    let e = req.ch.check(&c).unwrap_err();
    assert_eq!(e.fes(), Some(Fes::PDU_SEQUENCE_ERROR));
    // Before it, a CapsuleCmd is.
    let (cmd, _) = CapsuleCmd::new(&Sqe::flush(1), 0, Digests::NONE, 0).unwrap();
    let e = cmd
        .ch
        .check(&RxConfig::initial(Role::Controller))
        .unwrap_err();
    assert!(matches!(
        e,
        PduError::Sequence {
            pdu_type: PduType::CapsuleCmd,
            ..
        }
    ));
    assert_eq!(e.fes(), Some(Fes::PDU_SEQUENCE_ERROR));
}

#[test]
fn icreq_icresp_parameter_errors() {
    let c = RxConfig::initial(Role::Controller);
    let mut req = IcReq::new(0, Digests::NONE, 0);
    req.pfv = 1;
    let e = receive(req.as_bytes(), &c).unwrap_err();
    assert_eq!(e.fes(), Some(Fes::UNSUPPORTED_PARAMETER));
    assert_eq!(e.fei(), 8);
    assert!(e.to_string().contains("PFV"), "{e}");

    let req = IcReq::new(32, Digests::NONE, 0);
    let e = receive(req.as_bytes(), &c).unwrap_err();
    assert_eq!(
        (e.fes(), e.fei(), e.field()),
        (Some(Fes::INVALID_HEADER_FIELD), 10, Some(Field::Pda))
    );

    let mut req = IcReq::new(0, Digests::NONE, 0);
    req.dgst = 0x04;
    let e = receive(req.as_bytes(), &c).unwrap_err();
    assert_eq!((e.fei(), e.field()), (11, Some(Field::Dgst)));

    let h = RxConfig::initial(Role::Host);
    let resp = IcResp::new(0, Digests::NONE, 4092);
    let e = receive(resp.as_bytes(), &h).unwrap_err();
    assert_eq!((e.fei(), e.field()), (12, Some(Field::Maxh2cdata)));
    assert!(e.to_string().contains("4096"), "{e}");
    let resp = IcResp::new(0, Digests::NONE, 4098 + 4096);
    let e = receive(resp.as_bytes(), &h).unwrap_err();
    assert!(
        matches!(
            e,
            PduError::InvalidField {
                problem: Problem::Misaligned { align: 4 },
                ..
            }
        ),
        "{e:?}"
    );

    // ICReq plen must be 128.
    let mut req = IcReq::new(0, Digests::NONE, 0);
    req.ch.plen = 132;
    let e = req.ch.check(&c).unwrap_err();
    assert_eq!((e.fei(), e.field()), (4, Some(Field::Plen)));
}

#[test]
fn capsule_cmd_round_trip_all_digest_and_pda_combinations() {
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, 77, 8);
    sqe.cid = 0x42;
    for digests in [
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
        for cpda in [0u8, 1, 3, 7, 31] {
            for len in [0u32, 1, 5, 4096] {
                let (cmd, l) = CapsuleCmd::new(&sqe, len, digests, cpda).unwrap();
                let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
                let pdu = assemble(cmd.as_bytes(), &l, &data);
                let c = cfg(Role::Controller, digests, cpda);
                let (rl, h) = receive(&pdu, &c)
                    .unwrap_or_else(|e| panic!("{digests:?} cpda {cpda} len {len}: {e}"));
                assert_eq!(rl, l);
                let PduHeader::CapsuleCmd(got) = h else {
                    panic!("{h:?}")
                };
                assert_eq!(got.sqe(), sqe);
                assert_eq!(&pdu[rl.data_range()], &data[..]);
                if len > 0 {
                    assert_eq!(rl.data_offset % pda_alignment(cpda), 0);
                    assert!(rl.data_offset >= rl.header_len());
                    assert_eq!(rl.ddgst, digests.data);
                } else {
                    assert_eq!(cmd.ch.pdo, 0);
                    assert!(!rl.ddgst);
                }
                assert_eq!(rl.hdgst, digests.header);
            }
        }
    }
}

#[test]
fn responses_r2t_and_data_round_trip() {
    for digests in [Digests::NONE, Digests::BOTH] {
        let host = cfg(Role::Host, digests, 2);
        let ctrl = cfg(Role::Controller, digests, 1);
        let cqe = Cqe {
            dw0: 7,
            cid: 9,
            status: 0x0004,
            ..Default::default()
        };
        let r = CapsuleResp::new(cqe, digests.header);
        let l = PduLayout::new(PduType::CapsuleResp, digests, 0, 0).unwrap();
        let pdu = assemble(r.as_bytes(), &l, &[]);
        let (_, h) = receive(&pdu, &host).unwrap();
        assert_eq!(h, PduHeader::CapsuleResp(r));

        let r2t = R2T::new(9, 3, 8192, 4096, digests.header);
        let l = PduLayout::new(PduType::R2T, digests, 0, 0).unwrap();
        assert_eq!(r2t.ch, l.common_header(0));
        let (_, h) = receive(&assemble(r2t.as_bytes(), &l, &[]), &host).unwrap();
        assert_eq!(h, PduHeader::R2T(r2t));

        let data = vec![0x5Au8; 1000];
        let (c2h, l) = C2HData::new(9, 4096, 1000, true, false, digests, 2).unwrap();
        let (rl, h) = receive(&assemble(c2h.as_bytes(), &l, &data), &host).unwrap();
        assert_eq!(h, PduHeader::C2HData(c2h));
        assert_eq!(rl.data_len, 1000);
        assert_eq!(rl.data_offset % 12, 0);

        let (h2c, l) = H2CData::new(9, 3, 8192, 1000, true, digests, 1).unwrap();
        let (rl, h) = receive(&assemble(h2c.as_bytes(), &l, &data), &ctrl).unwrap();
        assert_eq!(h, PduHeader::H2CData(h2c));
        assert!(matches!(h, PduHeader::H2CData(d) if d.last() && d.ttag == 3));
        assert_eq!(rl.data_offset % 8, 0);
    }
    // Builders refuse nonsense.
    assert!(C2HData::new(1, 0, 10, false, true, Digests::NONE, 0).is_none());
    assert!(C2HData::new(1, 0, 0, true, false, Digests::NONE, 0).is_none());
    assert!(H2CData::new(1, 0, 0, 0, true, Digests::NONE, 0).is_none());
    assert!(CapsuleCmd::new(&Sqe::default(), u32::MAX, Digests::NONE, 0).is_none());
}

#[test]
fn term_req_from_error_round_trips() {
    // The controller refuses a CapsuleCmd whose HLEN is wrong.
    let (mut cmd, _) = CapsuleCmd::new(&Sqe::flush(1), 0, Digests::NONE, 0).unwrap();
    cmd.ch.hlen = 70;
    let c = cfg(Role::Controller, Digests::NONE, 0);
    let e = cmd.ch.check(&c).unwrap_err();
    let t = e.term_req(Role::Controller, cmd.as_bytes().len()).unwrap();
    assert_eq!(t.ch.pdu_type, PduType::C2HTermReq as u8);
    assert_eq!(t.fes(), Fes::INVALID_HEADER_FIELD);
    assert_eq!(t.fei(), 2);
    assert_eq!(t.data_len(), 72);
    let layout = PduLayout::new(PduType::C2HTermReq, Digests::NONE, 0, t.data_len()).unwrap();
    let pdu = assemble(t.as_bytes(), &layout, &cmd.as_bytes()[..72]);
    let (rl, h) = receive(&pdu, &cfg(Role::Host, Digests::BOTH, 0)).unwrap();
    assert_eq!(h, PduHeader::TermReq(t));
    assert_eq!(&pdu[rl.data_range()], cmd.as_bytes());

    // A TermReq carries at most 128 bytes of the offending header.
    let t = TermReq::new(Role::Host, Fes::UNSUPPORTED_PARAMETER, 8, 200);
    assert_eq!(t.ch.plen, 152);
    assert_eq!(t.ch.pdu_type, PduType::H2CTermReq as u8);
    // A received TermReq longer than 152 bytes means: close, no TermReq.
    let mut bad = t;
    bad.ch.plen = 153;
    let e = bad
        .ch
        .check(&cfg(Role::Controller, Digests::NONE, 0))
        .unwrap_err();
    assert_eq!(
        e,
        PduError::TermReqLength {
            pdu_type: PduType::H2CTermReq,
            plen: 153
        }
    );
    assert_eq!(e.fes(), None);
    assert!(e.term_req(Role::Controller, 24).is_none());
    // A TermReq is accepted before initialization too.
    let t = TermReq::new(Role::Controller, Fes::UNSUPPORTED_PARAMETER, 8, 128);
    assert!(t.ch.check(&RxConfig::initial(Role::Host)).is_ok());
}

/// One case of a refused common header: bytes, config, field, FES.
fn refused(ch: CommonHeader, c: &RxConfig, field: Field, fes: Fes) -> PduError {
    let e = ch.check(c).expect_err("header must be refused");
    assert_eq!(e.field(), Some(field), "{e}");
    assert_eq!(e.fes(), Some(fes), "{e}");
    if fes == Fes::INVALID_HEADER_FIELD {
        assert_eq!(e.fei(), field.offset(), "{e}");
    }
    assert!(e.to_string().contains(&field.to_string()), "{e}");
    e
}

#[test]
fn check_failures_name_field_and_fes() {
    let none = cfg(Role::Controller, Digests::NONE, 0);
    let both = cfg(Role::Controller, Digests::BOTH, 0);
    let host = cfg(Role::Host, Digests::NONE, 0);
    let (cmd, _) = CapsuleCmd::new(&Sqe::flush(1), 16, Digests::NONE, 0).unwrap();
    let good = cmd.ch;
    assert!(good.check(&none).is_ok());
    let ifld = Fes::INVALID_HEADER_FIELD;

    // Unknown type and wrong direction.
    let e = refused(
        CommonHeader {
            pdu_type: 0x08,
            ..good
        },
        &none,
        Field::PduType,
        ifld,
    );
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::UnknownType,
            ..
        }
    ));
    let e = refused(good, &host, Field::PduType, ifld);
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::WrongDirection {
                receiver: Role::Host
            },
            ..
        }
    ));
    let (c2h, _) = C2HData::new(1, 0, 4, true, false, Digests::NONE, 0).unwrap();
    refused(c2h.ch, &none, Field::PduType, ifld);

    // Flags: not allowed, HDGSTF mismatch, DDGSTF without negotiation,
    // DDGSTF missing with data, SUCCESS without LAST.
    let e = refused(
        CommonHeader {
            flags: flags::LAST_PDU,
            ..good
        },
        &none,
        Field::Flags,
        ifld,
    );
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::FlagsNotAllowed { allowed: 3 },
            ..
        }
    ));
    refused(
        CommonHeader {
            flags: flags::HDGSTF,
            ..good
        },
        &none,
        Field::Flags,
        ifld,
    );
    refused(
        good,
        &cfg(
            Role::Controller,
            Digests {
                header: true,
                data: false,
            },
            0,
        ),
        Field::Flags,
        ifld,
    );
    refused(
        CommonHeader {
            flags: flags::DDGSTF,
            ..good
        },
        &none,
        Field::Flags,
        ifld,
    );
    let e = refused(
        CommonHeader {
            flags: flags::HDGSTF,
            plen: good.plen + 4,
            pdo: 76,
            ..good
        },
        &both,
        Field::Flags,
        ifld,
    );
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::DataDigestFlag {
                negotiated: true,
                has_data: true
            },
            ..
        }
    ));
    let (mut c2h, _) = C2HData::new(1, 0, 4, true, true, Digests::NONE, 0).unwrap();
    c2h.ch.flags = flags::SUCCESS;
    let e = refused(c2h.ch, &host, Field::Flags, ifld);
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::SuccessWithoutLast,
            ..
        }
    ));

    // HLEN.
    let e = refused(CommonHeader { hlen: 24, ..good }, &none, Field::Hlen, ifld);
    assert!(e.to_string().contains("must be 72"), "{e}");

    // PDO: below the header, misaligned, beyond PLEN, set without data
    // on an R2T, missing on a data PDU.
    refused(CommonHeader { pdo: 64, ..good }, &none, Field::Pdo, ifld);
    let e = refused(
        CommonHeader {
            pdo: 76,
            plen: 76 + 16,
            ..good
        },
        &cfg(Role::Controller, Digests::NONE, 1),
        Field::Pdo,
        ifld,
    );
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::Misaligned { align: 8 },
            ..
        }
    ));
    refused(
        CommonHeader {
            pdo: 200,
            plen: 100,
            ..good
        },
        &none,
        Field::Pdo,
        ifld,
    );
    let r2t = R2T::new(1, 1, 0, 10, false);
    refused(
        CommonHeader {
            pdo: 24,
            plen: 28,
            ..r2t.ch
        },
        &host,
        Field::Pdo,
        ifld,
    );
    let (c2h, _) = C2HData::new(1, 0, 4, true, false, Digests::NONE, 0).unwrap();
    refused(
        CommonHeader {
            pdo: 0,
            plen: 24,
            ..c2h.ch
        },
        &host,
        Field::Pdo,
        ifld,
    );

    // PLEN: below the header, data missing, above the maximum, data on an
    // R2T, data digest without room.
    refused(CommonHeader { plen: 72, ..good }, &none, Field::Plen, ifld);
    refused(
        CommonHeader {
            pdo: 0,
            plen: 80,
            ..good
        },
        &none,
        Field::Plen,
        ifld,
    );
    let small = RxConfig {
        max_plen: 80,
        ..none
    };
    let e = refused(good, &small, Field::Plen, ifld);
    assert!(matches!(
        e,
        PduError::InvalidField {
            problem: Problem::Above { max: 80 },
            ..
        }
    ));
    refused(
        CommonHeader { plen: 28, ..r2t.ch },
        &host,
        Field::Plen,
        ifld,
    );
    refused(
        CommonHeader {
            flags: flags::DDGSTF,
            pdo: 72,
            plen: 76,
            ..good
        },
        &cfg(
            Role::Controller,
            Digests {
                header: false,
                data: true,
            },
            0,
        ),
        Field::Plen,
        ifld,
    );
}

#[test]
fn data_pdu_checks() {
    let ctrl = cfg(Role::Controller, Digests::NONE, 0);
    // DATAL disagreeing with PLEN.
    let (mut h2c, l) = H2CData::new(1, 2, 0, 100, false, Digests::NONE, 0).unwrap();
    h2c.datal = 99;
    let e = receive(&assemble(h2c.as_bytes(), &l, &[0; 100]), &ctrl).unwrap_err();
    assert_eq!(
        (e.field(), e.fei(), e.fes()),
        (Some(Field::Datal), 16, Some(Fes::INVALID_HEADER_FIELD))
    );
    // DATAL above MAXH2CDATA.
    let small = RxConfig {
        maxh2cdata: 64,
        ..ctrl
    };
    let (h2c, l) = H2CData::new(1, 2, 0, 100, false, Digests::NONE, 0).unwrap();
    let e = receive(&assemble(h2c.as_bytes(), &l, &[0; 100]), &small).unwrap_err();
    assert_eq!(
        e,
        PduError::DataLimitExceeded {
            datal: 100,
            maxh2cdata: 64
        }
    );
    assert_eq!(e.fes(), Some(Fes::DATA_TRANSFER_LIMIT_EXCEEDED));
    // R2TL of 0.
    let r2t = R2T::new(1, 1, 0, 0, false);
    let e = receive(r2t.as_bytes(), &cfg(Role::Host, Digests::NONE, 0)).unwrap_err();
    assert_eq!((e.field(), e.fei()), (Some(Field::R2tl), 16));
    // Ranges.
    assert!(check_data_range(PduType::H2CData, 4096, 4096, 4096, 8192).is_ok());
    let e = check_data_range(PduType::H2CData, 0, 4096, 4096, 8192).unwrap_err();
    assert_eq!(
        (e.field(), e.fes()),
        (Some(Field::Datao), Some(Fes::DATA_TRANSFER_OUT_OF_RANGE))
    );
    let e = check_data_range(PduType::C2HData, 4096, 4097, 4096, 8192).unwrap_err();
    assert_eq!(
        (e.field(), e.fes()),
        (Some(Field::Datal), Some(Fes::DATA_TRANSFER_OUT_OF_RANGE))
    );
}

#[test]
fn digest_errors() {
    let c = cfg(Role::Host, Digests::BOTH, 0);
    let data = b"some data".to_vec();
    let (c2h, l) = C2HData::new(1, 0, data.len() as u32, true, false, Digests::BOTH, 0).unwrap();
    let pdu = assemble(c2h.as_bytes(), &l, &data);
    assert!(receive(&pdu, &c).is_ok());

    let mut bad = pdu.clone();
    bad[8] ^= 1; // CCCID: header digest no longer matches
    let e = receive(&bad, &c).unwrap_err();
    let PduError::HeaderDigest { received, computed } = e else {
        panic!("{e:?}")
    };
    assert_ne!(received, computed);
    assert_eq!(e.fes(), Some(Fes::HEADER_DIGEST_ERROR));
    assert_eq!(e.fei(), u32::from_le_bytes(pdu[24..28].try_into().unwrap()));

    let mut bad = pdu.clone();
    let d = l.data_range().start;
    bad[d] ^= 0x80;
    let e = receive(&bad, &c).unwrap_err();
    assert!(matches!(e, PduError::DataDigest { .. }));
    assert_eq!(e.fes(), None, "a data digest error is not fatal");
}

#[test]
fn crc32c_known_vectors() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c(b""), 0);
    // RFC 3720 B.4 vectors, given there as the bytes on the wire, which
    // are the little-endian digest NVMe/TCP stores.
    let asc: Vec<u8> = (0..32).collect();
    let desc: Vec<u8> = (0..32).rev().collect();
    assert_eq!(digest_bytes(crc32c(&[0; 32])), [0xAA, 0x36, 0x91, 0x8A]);
    assert_eq!(digest_bytes(crc32c(&[0xFF; 32])), [0x43, 0xAB, 0xA8, 0x62]);
    assert_eq!(digest_bytes(crc32c(&asc)), [0x4E, 0x79, 0xDD, 0x46]);
    assert_eq!(digest_bytes(crc32c(&desc)), [0x5C, 0xDB, 0x3F, 0x11]);
    // Incremental equals one-shot.
    let mut d = DataDigest::new();
    d.update(b"1234");
    d.update(b"");
    d.update(b"56789");
    assert_eq!(d.value(), 0xE306_9283);
    assert_eq!(data_digest([&b"12"[..], b"3456789"]), 0xE306_9283);
    assert!(verify_data_digest(0xE306_9283, [0x83, 0x92, 0x06, 0xE3]).is_ok());
    assert!(verify_header_digest(b"123456789", [0x83, 0x92, 0x06, 0xE3]).is_ok());
    assert!(verify_header_digest(b"123456788", [0x83, 0x92, 0x06, 0xE3]).is_err());
    assert_eq!(
        digest_from_bytes(&[0x83, 0x92, 0x06, 0xE3]),
        Some(0xE306_9283)
    );
    assert_eq!(digest_from_bytes(&[1, 2, 3]), None);
}

#[test]
fn parse_refuses_short_buffer() {
    let (c2h, l) = C2HData::new(1, 0, 4, true, false, Digests::BOTH, 0).unwrap();
    let c = cfg(Role::Host, Digests::BOTH, 0);
    let e = PduHeader::parse(&c2h.as_bytes()[..24], &l, &c).unwrap_err();
    assert_eq!(e, PduError::ShortBuffer { need: 28, got: 24 });
}

fn arb_cfg() -> impl Strategy<Value = RxConfig> {
    (
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        0u8..40,
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(
            |(host, established, header, data, pda, max_plen, maxh2cdata)| RxConfig {
                receiver: if host { Role::Host } else { Role::Controller },
                established,
                digests: Digests { header, data },
                pda,
                max_plen,
                maxh2cdata,
            },
        )
}

/// Invariants of a layout `check` accepted.
fn assert_layout_sane(ch: &CommonHeader, l: &PduLayout, c: &RxConfig) {
    let plen = l.plen as usize;
    assert_eq!(l.plen, ch.plen);
    assert_eq!(l.hlen, ch.hlen as u32);
    assert!(l.header_len() as usize <= plen);
    if let Some(r) = l.header_digest_range() {
        assert!(r.end <= plen);
    }
    let d = l.data_range();
    assert!(d.start >= l.header_len() as usize && d.end <= plen);
    assert_eq!(d.len(), l.data_len as usize);
    let end = l.data_digest_range().map_or(d.end, |r| r.end);
    if l.data_len > 0 || l.ddgst {
        assert_eq!(end, plen, "{ch:?} {l:?}");
    } else {
        assert_eq!(l.header_len() as usize, plen, "{ch:?} {l:?}");
    }
    if l.data_len > 0 && l.pdu_type.carries_data() {
        assert_eq!(l.data_offset % pda_alignment(c.pda.min(MAX_PDA)), 0);
    }
}

proptest! {
    #[test]
    fn prop_checker_never_panics_and_layout_fits(bytes in any::<[u8; 8]>(), c in arb_cfg()) {
        let ch = CommonHeader::read_from_bytes(&bytes).unwrap();
        match ch.check(&c) {
            Ok(l) => assert_layout_sane(&ch, &l, &c),
            Err(e) => {
                let _ = e.to_string();
                let _ = e.term_req(c.receiver, 8);
            }
        }
    }

    #[test]
    fn prop_builders_pass_their_own_checker(
        digests_bits in 0u8..4, pda in 0u8..=31, len in 1u32..100_000, cid in any::<u16>(),
        off in any::<u32>(), last in any::<bool>(),
    ) {
        let digests = Digests::from_dgst(digests_bits);
        let ctrl = RxConfig { maxh2cdata: u32::MAX, ..cfg(Role::Controller, digests, pda) };
        let host = cfg(Role::Host, digests, pda);
        let (h, l) = H2CData::new(cid, 1, off, len, last, digests, pda).unwrap();
        prop_assert_eq!(h.ch.check(&ctrl).unwrap(), l);
        let (h, l) = C2HData::new(cid, off, len, last, last, digests, pda).unwrap();
        prop_assert_eq!(h.ch.check(&host).unwrap(), l);
        let (h, l) = CapsuleCmd::new(&Sqe::flush(1), len, digests, pda).unwrap();
        prop_assert_eq!(h.ch.check(&ctrl).unwrap(), l);
        assert_layout_sane(&h.ch, &l, &ctrl);
    }
}

/// `append_header` appends exactly what `write_header` writes, for every
/// digest and PDA combination, and nothing for a header of the wrong
/// length.
#[test]
fn append_header_matches_write_header() {
    for dgst in 0..4 {
        let digests = Digests::from_dgst(dgst);
        for pda in [0, 1, 3, 31] {
            for len in [0u32, 1, 4096] {
                let (c, lc) = CapsuleCmd::new(&Sqe::flush(1), len, digests, pda).unwrap();
                let (d, ld) = C2HData::new(7, 0, len.max(1), true, true, digests, pda).unwrap();
                for (h, l) in [(c.as_bytes(), lc), (d.as_bytes(), ld)] {
                    let mut want = [0xAAu8; 256];
                    let n = write_header(h, &l, &mut want).unwrap();
                    assert_eq!(n, l.data_range().start, "the data follows the prefix");
                    assert_eq!(n as u32, l.header_len() + l.pad_len());
                    let mut out = vec![9u8; 3];
                    assert_eq!(append_header(h, &l, &mut out), Some(n));
                    assert_eq!(&out[..3], &[9, 9, 9]);
                    assert_eq!(&out[3..], &want[..n], "{l:?}");
                }
            }
        }
    }
    let (c, l) = CapsuleCmd::new(&Sqe::flush(1), 0, Digests::NONE, 0).unwrap();
    let mut out = Vec::new();
    assert_eq!(append_header(&c.as_bytes()[..8], &l, &mut out), None);
    assert!(out.is_empty());
}

/// The memo answers exactly as the check, for any order of headers and
/// configurations: a header that passed under one configuration is
/// checked again under another (here a smaller `max_plen`, or digests).
#[test]
fn check_memo_follows_the_configuration() {
    let c = RxConfig {
        max_plen: 8192,
        ..cfg(Role::Controller, Digests::NONE, 0)
    };
    let mut m = CheckMemo::new(c);
    assert_eq!(m.config(), &c);
    let (h, l) = CapsuleCmd::new(&Sqe::flush(1), 4096, Digests::NONE, 0).unwrap();
    assert_eq!(m.check(&h.ch), Ok(l));
    assert_eq!(m.check(&h.ch), Ok(l));
    let small = RxConfig {
        max_plen: 1024,
        ..c
    };
    m.set_config(small);
    assert_eq!(m.config(), &small);
    assert!(matches!(
        m.check(&h.ch),
        Err(PduError::InvalidField {
            field: Field::Plen,
            ..
        })
    ));
    let digests = RxConfig {
        digests: Digests::BOTH,
        ..c
    };
    m.set_config(digests);
    assert!(m.check(&h.ch).is_err());
    m.set_config(c);
    assert_eq!(m.check(&h.ch), Ok(l));
    // A header differing in any byte is checked again, not taken for the
    // remembered one.
    let mut other = h.ch;
    other.plen = c.max_plen + 1;
    assert!(m.check(&other).is_err());
    assert_eq!(m.check(&h.ch), Ok(l));
}

proptest! {
    #[test]
    fn prop_check_memo_equals_check(
        picks in proptest::collection::vec((0usize..4, 0usize..3), 1..40),
        junk in any::<[u8; 8]>(), c0 in arb_cfg(),
    ) {
        let ctrl = RxConfig { max_plen: 9000, ..cfg(Role::Controller, Digests::NONE, 0) };
        let cfgs = [ctrl, RxConfig { max_plen: 100, ..ctrl }, c0];
        let heads = [
            CapsuleCmd::new(&Sqe::flush(1), 0, Digests::NONE, 0).unwrap().0.ch,
            CapsuleCmd::new(&Sqe::flush(1), 4096, Digests::NONE, 0).unwrap().0.ch,
            C2HData::new(1, 0, 4096, true, true, Digests::NONE, 0).unwrap().0.ch,
            CommonHeader::read_from_bytes(&junk).unwrap(),
        ];
        let mut m = CheckMemo::new(cfgs[picks[0].1]);
        for (h, c) in picks {
            // The configuration changes only when the pick names another
            // one, so like headers in a row are answered from the memo.
            if *m.config() != cfgs[c] {
                m.set_config(cfgs[c]);
            }
            prop_assert_eq!(m.check(&heads[h]), heads[h].check(&cfgs[c]));
        }
    }
}

/// xorshift64*: a fast deterministic generator for the fuzz loop.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Runs the checker and parser over `POLLUX_FUZZ_CASES` (default 20000)
/// random and mutated PDUs; bench/fuzz_pdu.sh runs it with a million.
#[test]
fn fuzz_pdus() {
    let cases: u64 = std::env::var("POLLUX_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("POLLUX_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x9E37_79B9_7F4A_7C15);
    let mut rng = Rng(seed | 1);
    let start = std::time::Instant::now();
    let (mut accepted, mut refused) = (0u64, 0u64);
    let mut buf = vec![0u8; 4096];
    for i in 0..cases {
        let r = rng.next();
        let c = RxConfig {
            receiver: if r & 1 == 0 {
                Role::Host
            } else {
                Role::Controller
            },
            established: r & 2 != 0,
            digests: Digests::from_dgst((r >> 2) as u8),
            pda: ((r >> 4) % 34) as u8,
            max_plen: if r & (1 << 10) != 0 {
                4096
            } else {
                (r >> 32) as u32
            },
            maxh2cdata: 1024 + ((r >> 11) & 0xFFF) as u32,
        };
        // Even cases: a valid PDU from a builder, then mutated; odd: random.
        let len = if i % 2 == 0 {
            let dlen = 1 + (rng.next() % 1500) as u32;
            let (hdr, layout): (Vec<u8>, PduLayout) = match rng.next() % 5 {
                0 => {
                    let (h, l) = CapsuleCmd::new(&Sqe::flush(1), dlen, c.digests, c.pda).unwrap();
                    (h.as_bytes().to_vec(), l)
                }
                1 => {
                    let (h, l) = H2CData::new(1, 2, 0, dlen, true, c.digests, c.pda).unwrap();
                    (h.as_bytes().to_vec(), l)
                }
                2 => {
                    let (h, l) = C2HData::new(1, 0, dlen, true, true, c.digests, c.pda).unwrap();
                    (h.as_bytes().to_vec(), l)
                }
                3 => {
                    let h = R2T::new(1, 2, 0, dlen, c.digests.header);
                    let l = PduLayout::new(PduType::R2T, c.digests, 0, 0).unwrap();
                    (h.as_bytes().to_vec(), l)
                }
                _ => {
                    let t = TermReq::new(Role::Host, Fes::PDU_SEQUENCE_ERROR, 0, 24);
                    let l = PduLayout::new(PduType::H2CTermReq, Digests::NONE, 0, 24).unwrap();
                    (t.as_bytes().to_vec(), l)
                }
            };
            let n = layout.plen as usize;
            if n > buf.len() {
                buf.resize(n, 0);
            }
            write_header(&hdr, &layout, &mut buf[..n]).unwrap();
            // Flip 0 to 3 random bits in the header.
            for _ in 0..rng.next() % 4 {
                let b = rng.next();
                let at = (b % layout.header_len() as u64) as usize;
                buf[at] ^= 1 << ((b >> 32) % 8);
            }
            n
        } else {
            for chunk in buf[..160].chunks_mut(8) {
                chunk.copy_from_slice(&rng.next().to_le_bytes());
            }
            160
        };
        let ch = CommonHeader::read(&buf[..len]).unwrap();
        match ch.check(&c) {
            Ok(l) => {
                assert_layout_sane(&ch, &l, &c);
                let avail = (l.header_len() as usize).min(len);
                match PduHeader::parse(&buf[..avail], &l, &c) {
                    Ok(_) => accepted += 1,
                    Err(e) => {
                        let _ = e.term_req(c.receiver, avail);
                        refused += 1;
                    }
                }
            }
            Err(e) => {
                let _ = e.term_req(c.receiver, len);
                refused += 1;
            }
        }
    }
    let el = start.elapsed();
    println!(
        "fuzz_pdus: {cases} cases ({accepted} accepted, {refused} refused) in {:.3} s, seed {seed:#x}",
        el.as_secs_f64()
    );
    assert_eq!(accepted + refused, cases);
    assert!(
        accepted > 0 && refused > 0,
        "the fuzz mix exercises both outcomes"
    );
}
