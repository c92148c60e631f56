//! NVMe over Fabrics formats: sizes and offsets, command views round-tripped
//! through an SQE, Connect data and response, NQN validation, SGL parsing
//! and the Discovery Log Page.
use std::mem::{offset_of, size_of};

use pollux_spec::fabrics::*;
use pollux_spec::status::sct;
use pollux_spec::{Cqe, Sqe};
use proptest::prelude::*;
use zerocopy::IntoBytes;

#[test]
fn sizes_and_offsets() {
    assert_eq!(size_of::<SglDescriptor>(), 16);
    assert_eq!(offset_of!(SglDescriptor, len), 8);
    assert_eq!(offset_of!(SglDescriptor, id), 15);
    assert_eq!(size_of::<FabricsCmd>(), 64);
    assert_eq!(offset_of!(FabricsCmd, fctype), 4);
    assert_eq!(offset_of!(FabricsCmd, sgl1), 24);
    assert_eq!(size_of::<ConnectCmd>(), 64);
    assert_eq!(offset_of!(ConnectCmd, recfmt), 40);
    assert_eq!(offset_of!(ConnectCmd, qid), 42);
    assert_eq!(offset_of!(ConnectCmd, sqsize), 44);
    assert_eq!(offset_of!(ConnectCmd, cattr), 46);
    assert_eq!(offset_of!(ConnectCmd, kato), 48);
    assert_eq!(size_of::<PropertyGetCmd>(), 64);
    assert_eq!(offset_of!(PropertyGetCmd, attrib), 40);
    assert_eq!(offset_of!(PropertyGetCmd, ofst), 44);
    assert_eq!(size_of::<PropertySetCmd>(), 64);
    assert_eq!(offset_of!(PropertySetCmd, value), 48);
    assert_eq!(size_of::<DisconnectCmd>(), 64);
    assert_eq!(offset_of!(DisconnectCmd, recfmt), 40);
    assert_eq!(size_of::<ConnectData>(), 1024);
    assert_eq!(offset_of!(ConnectData, cntlid), 16);
    assert_eq!(offset_of!(ConnectData, subnqn), 256);
    assert_eq!(offset_of!(ConnectData, hostnqn), 512);
    assert_eq!(size_of::<DiscoveryLogHeader>(), 1024);
    assert_eq!(offset_of!(DiscoveryLogHeader, numrec), 8);
    assert_eq!(offset_of!(DiscoveryLogHeader, recfmt), 16);
    assert_eq!(size_of::<DiscoveryLogEntry>(), 1024);
    assert_eq!(offset_of!(DiscoveryLogEntry, portid), 4);
    assert_eq!(offset_of!(DiscoveryLogEntry, cntlid), 6);
    assert_eq!(offset_of!(DiscoveryLogEntry, asqsz), 8);
    assert_eq!(offset_of!(DiscoveryLogEntry, eflags), 10);
    assert_eq!(offset_of!(DiscoveryLogEntry, trsvcid), 32);
    assert_eq!(offset_of!(DiscoveryLogEntry, subnqn), 256);
    assert_eq!(offset_of!(DiscoveryLogEntry, traddr), 512);
    assert_eq!(offset_of!(DiscoveryLogEntry, tsas), 768);
    // IPO constants agree with the structures.
    assert_eq!(connect_ipo::SQSIZE as usize, offset_of!(ConnectCmd, sqsize));
    assert_eq!(connect_ipo::KATO as usize, offset_of!(ConnectCmd, kato));
    assert_eq!(
        connect_ipo::DATA_HOSTNQN as usize,
        offset_of!(ConnectData, hostnqn)
    );
}

#[test]
fn connect_command_bytes_and_round_trip() {
    let mut c = ConnectCmd::new(3, 127, CATTR_DISABLE_SQ_FLOW, 0);
    c.cid = 0x10;
    let sqe = c.to_sqe();
    let b = sqe.as_bytes();
    assert_eq!(b[0], 0x7F);
    assert_eq!(b[1] >> 6, PSDT_SGL);
    assert_eq!(b[4], 0x01);
    assert_eq!(&b[42..44], &3u16.to_le_bytes());
    assert_eq!(&b[44..46], &127u16.to_le_bytes());
    assert_eq!(b[46], 1 << 2);
    // SGL1: in-capsule data block, offset 0, 1024 bytes.
    assert_eq!(&b[24..32], &[0; 8]);
    assert_eq!(&b[32..36], &1024u32.to_le_bytes());
    assert_eq!(b[39], 0x01);
    assert_eq!(FcType::of(&sqe), Some(FcType::Connect));
    assert_eq!(ConnectCmd::from_sqe(&sqe), c);
    assert_eq!(c.queue_entries(), 128);
    assert_eq!(
        Sgl::from_sqe(&sqe),
        Ok(Sgl::InCapsule {
            offset: 0,
            len: 1024
        })
    );
    assert_eq!(FcType::of(&Sqe::flush(1)), None);
}

#[test]
fn property_and_disconnect_commands() {
    let g = PropertyGetCmd::new(0x1C, PropertySize::Four);
    let sqe = g.to_sqe();
    assert_eq!(FcType::of(&sqe), Some(FcType::PropertyGet));
    assert_eq!(sqe.as_bytes()[40], 0);
    assert_eq!(&sqe.as_bytes()[44..48], &0x1Cu32.to_le_bytes());
    assert_eq!(
        PropertyGetCmd::from_sqe(&sqe).size(),
        Some(PropertySize::Four)
    );

    let s = PropertySetCmd::new(0x14, PropertySize::Eight, 0x1122_3344_5566_7788);
    let sqe = s.to_sqe();
    assert_eq!(FcType::of(&sqe), Some(FcType::PropertySet));
    assert_eq!(sqe.as_bytes()[40], 1);
    assert_eq!(
        &sqe.as_bytes()[48..56],
        &0x1122_3344_5566_7788u64.to_le_bytes()
    );
    // A 4-byte set keeps only the low 4 bytes.
    assert_eq!(
        PropertySetCmd::new(0x14, PropertySize::Four, u64::MAX).value,
        0xFFFF_FFFF
    );
    let mut bad = s;
    bad.attrib = 2;
    assert_eq!(bad.size(), None);

    let mut cqe = Cqe::default();
    set_property_value(&mut cqe, 0xAABB_CCDD_0011_2233);
    assert_eq!(
        property_value(&cqe, PropertySize::Eight),
        0xAABB_CCDD_0011_2233
    );
    assert_eq!(property_value(&cqe, PropertySize::Four), 0x0011_2233);

    let d = DisconnectCmd::new().to_sqe();
    assert_eq!(FcType::of(&d), Some(FcType::Disconnect));
    assert_eq!(&d.as_bytes()[40..42], &[0, 0]);
}

#[test]
fn connect_data_round_trip_and_errors() {
    let hostid = [7u8; 16];
    let d = ConnectData::new(
        hostid,
        CNTLID_DYNAMIC,
        "nqn.2024-01.io.pollux:sub1",
        "nqn.2014-08.org.nvmexpress:uuid:0",
    )
    .unwrap();
    let b = d.as_bytes();
    assert_eq!(&b[..16], &hostid);
    assert_eq!(&b[16..18], &[0xFF, 0xFF]);
    assert_eq!(&b[256..256 + 26], b"nqn.2024-01.io.pollux:sub1");
    assert_eq!(b[256 + 26], 0);
    assert_eq!(d.subnqn(), Ok("nqn.2024-01.io.pollux:sub1"));
    assert_eq!(d.hostnqn(), Ok("nqn.2014-08.org.nvmexpress:uuid:0"));

    let long = "n".repeat(224);
    assert_eq!(
        ConnectData::new(hostid, 0, &long, "h"),
        Err(NqnError::TooLong { len: 224 })
    );
    assert!(ConnectData::new(hostid, 0, &long[..223], "h").is_ok());
    assert_eq!(ConnectData::new(hostid, 0, "", "h"), Err(NqnError::Empty));
    assert_eq!(
        ConnectData::new(hostid, 0, "a\nb", "h"),
        Err(NqnError::ControlChar { at: 1, byte: b'\n' })
    );
    let e = ConnectData::new(hostid, 0, "s", &long).unwrap_err();
    assert!(e.to_string().contains("224"), "{e}");

    // Reading a field without NUL, or with invalid UTF-8.
    let mut raw = d;
    raw.subnqn = [b'a'; 256];
    assert_eq!(raw.subnqn(), Err(NqnError::NotTerminated));
    raw.subnqn[0] = 0xFF;
    raw.subnqn[1] = 0;
    assert_eq!(raw.subnqn(), Err(NqnError::NotUtf8 { at: 0 }));
}

#[test]
fn connect_response_dw0() {
    let ok = ConnectResponse::Success {
        cntlid: 0x0102,
        authreq: 0,
    };
    let cqe = Cqe {
        dw0: ok.dw0(),
        ..Default::default()
    };
    assert_eq!(cqe.dw0, 0x0102);
    assert_eq!(ConnectResponse::from_cqe(&cqe), Some(ok));

    let bad = ConnectResponse::InvalidParam {
        iattr: ParamIn::Data,
        ipo: connect_ipo::DATA_SUBNQN,
    };
    assert_eq!(bad.dw0(), 1 << 16 | 256);
    let st = bad.status();
    assert_eq!(st.sct(), sct::COMMAND_SPECIFIC);
    assert_eq!(st.sc(), fabrics_sc::CONNECT_INVALID_PARAMETERS);
    let cqe = Cqe {
        dw0: bad.dw0(),
        status: st.0 << 1,
        ..Default::default()
    };
    assert_eq!(ConnectResponse::from_cqe(&cqe), Some(bad));
    let busy = Cqe {
        status: fabrics_status(fabrics_sc::CONTROLLER_BUSY).0 << 1,
        ..Default::default()
    };
    assert_eq!(ConnectResponse::from_cqe(&busy), None);
    assert_eq!(fabrics_sc::INCOMPATIBLE_FORMAT, 0x80);
    assert_eq!(fabrics_sc::CONNECT_INVALID_HOST, 0x84);
}

#[test]
fn sgl_descriptors() {
    assert_eq!(SGL_ID_IN_CAPSULE, 0x01);
    assert_eq!(SGL_ID_TCP_TRANSPORT, 0x5A);
    let mut sqe = Sqe::flush(1);
    SglDescriptor::tcp_transport(8192).write_to_sqe(&mut sqe);
    assert_eq!(sqe.psdt(), PSDT_SGL);
    assert_eq!(sqe.as_bytes()[39], 0x5A);
    assert_eq!(Sgl::from_sqe(&sqe), Ok(Sgl::Transport { len: 8192 }));

    let mut prp = Sqe::flush(1);
    prp.prp2 = SglDescriptor::tcp_transport(1).len as u64;
    assert_eq!(Sgl::from_sqe(&prp), Err(SglError::NotSgl { psdt: 0 }));

    let keyed = SglDescriptor {
        id: 0x40,
        ..Default::default()
    };
    let e = Sgl::parse(&keyed).unwrap_err();
    assert_eq!(e, SglError::Keyed { id: 0x40 });
    assert_eq!(
        e.status().sc(),
        pollux_spec::status::generic::SGL_TYPE_INVALID
    );
    let seg = SglDescriptor {
        id: 0x20,
        ..Default::default()
    };
    assert_eq!(
        Sgl::parse(&seg),
        Err(SglError::Unsupported {
            sgl_type: 2,
            subtype: 0
        })
    );
    let mut rsvd = SglDescriptor::in_capsule(0, 10);
    rsvd.rsvd12[1] = 1;
    assert_eq!(Sgl::parse(&rsvd), Err(SglError::Reserved { id: 0x01 }));
    for sgl in [
        Sgl::Address {
            addr: 0x1000,
            len: 4,
        },
        Sgl::InCapsule { offset: 16, len: 5 },
        Sgl::Transport { len: 0 },
    ] {
        let mut s = Sqe::default();
        sgl.descriptor().write_to_sqe(&mut s);
        assert_eq!(Sgl::from_sqe(&s), Ok(sgl));
        assert_eq!(SglDescriptor::from_sqe(&s), sgl.descriptor());
    }
}

#[test]
fn discovery_log() {
    let h = DiscoveryLogHeader::new(5, 2);
    assert_eq!(&h.as_bytes()[..8], &5u64.to_le_bytes());
    assert_eq!(&h.as_bytes()[8..16], &2u64.to_le_bytes());
    assert_eq!(DISCOVERY_NQN, "nqn.2014-08.org.nvmexpress.discovery");
    assert_eq!(LID_DISCOVERY, 0x70);

    let ep = TcpEndpoint {
        adrfam: adrfam::IPV4,
        traddr: "127.0.0.1",
        trsvcid: "4420",
    };
    let e = DiscoveryLogEntry::tcp(subtype::NVM, 1, ep, "nqn.2024-01.io.pollux:s", 32).unwrap();
    let b = e.as_bytes();
    assert_eq!(
        &b[..4],
        &[
            trtype::TCP,
            adrfam::IPV4,
            subtype::NVM,
            treq::SECURE_CHANNEL_NOT_REQUIRED
        ]
    );
    assert_eq!(&b[32..36], b"4420");
    assert_eq!(b[36], b' ');
    assert_eq!(&b[512..521], b"127.0.0.1");
    assert_eq!(e.trsvcid_str(), "4420");
    assert_eq!(e.traddr_str(), "127.0.0.1");
    assert_eq!(e.subnqn(), Ok("nqn.2024-01.io.pollux:s"));
    assert_eq!(e.tcp_sectype(), tcp_sectype::NONE);
    assert_eq!(e.cntlid, CNTLID_DYNAMIC);
    let shown = e.to_string();
    assert!(
        shown.contains("127.0.0.1") && shown.contains("4420"),
        "{shown}"
    );

    // NUL-padded fields (Linux's style) read the same.
    let mut linux = e;
    linux.trsvcid = [0; 32];
    linux.trsvcid[..4].copy_from_slice(b"8009");
    assert_eq!(linux.trsvcid_str(), "8009");

    let long = "9".repeat(33);
    let err = DiscoveryLogEntry::tcp(
        subtype::NVM,
        1,
        TcpEndpoint {
            trsvcid: &long,
            ..ep
        },
        "n",
        32,
    )
    .unwrap_err();
    assert!(err.to_string().contains("TRSVCID"), "{err}");
    let err = DiscoveryLogEntry::tcp(
        subtype::NVM,
        1,
        TcpEndpoint {
            traddr: "fe80::1%é",
            ..ep
        },
        "n",
        32,
    )
    .unwrap_err();
    assert!(err.to_string().contains("TRADDR"), "{err}");
    let err = DiscoveryLogEntry::tcp(subtype::NVM, 1, ep, "", 32).unwrap_err();
    assert_eq!(err, DiscoveryError::Nqn(NqnError::Empty));
}

proptest! {
    /// `Sgl::from_sqe` (with its one-word path for a Transport SGL Data
    /// Block) answers exactly as the PSDT check and `Sgl::parse` of the
    /// SQE's descriptor.
    #[test]
    fn prop_sgl_from_sqe_equals_parse(
        flags in prop_oneof![Just(SQE_FLAGS_SGL), any::<u8>()],
        prp1 in any::<u64>(), len in any::<u32>(),
        id in prop_oneof![Just(SGL_ID_TCP_TRANSPORT), Just(SGL_ID_IN_CAPSULE), any::<u8>()],
        rsvd in prop_oneof![Just([0u8; 3]), any::<[u8; 3]>()],
    ) {
        let sqe = Sqe {
            flags,
            prp1,
            prp2: u64::from_le_bytes([
                len as u8, (len >> 8) as u8, (len >> 16) as u8, (len >> 24) as u8,
                rsvd[0], rsvd[1], rsvd[2], id,
            ]),
            ..Default::default()
        };
        let want = if sqe.psdt() != PSDT_SGL {
            Err(SglError::NotSgl { psdt: sqe.psdt() })
        } else {
            Sgl::parse(&SglDescriptor::from_sqe(&sqe))
        };
        prop_assert_eq!(Sgl::from_sqe(&sqe), want);
    }

    #[test]
    fn prop_sgl_parse_never_panics_and_round_trips(bytes in any::<[u8; 16]>()) {
        let d: SglDescriptor = zerocopy::transmute!(bytes);
        if let Ok(sgl) = Sgl::parse(&d) {
            prop_assert_eq!(Sgl::parse(&sgl.descriptor()), Ok(sgl));
            prop_assert_eq!(sgl.len(), d.len);
        }
    }

    #[test]
    fn prop_nqn_read_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        if let Ok(s) = read_nqn(&bytes) {
            prop_assert!(!s.is_empty() && s.len() <= NQN_MAX_LEN);
            let mut f = [0u8; NQN_FIELD_LEN];
            write_nqn(&mut f, s).unwrap();
            prop_assert_eq!(read_nqn(&f), Ok(s));
        }
    }
}

/// NQNs a user gives: the "nqn." prefix (every NQN form, the UUID and
/// discovery ones included) and at most 223 bytes.
#[test]
fn user_nqns_are_checked_for_prefix_and_length() {
    use pollux_spec::fabrics::{check_nqn, DISCOVERY_NQN, NQN_UUID_PREFIX};
    assert_eq!(check_nqn("nqn.2016-06.io.spdk:cnode1"), Ok(()));
    assert_eq!(check_nqn(DISCOVERY_NQN), Ok(()));
    let uuid = format!("{NQN_UUID_PREFIX}3d1219c7-c4c5-404a-aa1f-6d2a48adfda4");
    assert_eq!(check_nqn(&uuid), Ok(()));
    assert_eq!(check_nqn("cnode1"), Err(NqnError::NoPrefix));
    assert_eq!(check_nqn("NQN.2016-06.io.spdk:x"), Err(NqnError::NoPrefix));
    assert_eq!(check_nqn(""), Err(NqnError::Empty));
    let long = format!("nqn.2016-06.io.spdk:{}", "x".repeat(223 - 20));
    assert_eq!(long.len(), 223);
    assert_eq!(check_nqn(&long), Ok(()));
    let longer = format!("{long}x");
    assert_eq!(check_nqn(&longer), Err(NqnError::TooLong { len: 224 }));
    let e = check_nqn("cnode1").unwrap_err().to_string();
    assert!(e.contains("nqn."), "{e}");
}
