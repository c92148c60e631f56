use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::*;

#[test]
fn controller_field_offsets_in_bytes() {
    let mut c = IdentifyController::new_zeroed();
    c.vid = 0x1B36;
    c.mdts = 5;
    c.cntlid = 0x0102;
    c.ver = 0x0002_0000;
    c.oacs = OACS_DBBUF_CONFIG | OACS_FORMAT_NVM;
    c.lpa = LPA_SMART_PER_NS;
    c.wctemp = 343;
    c.sqes = 0x66;
    c.cqes = 0x44;
    c.nn = 0xA1B2_C3D4;
    c.oncs = ONCS_DSM | ONCS_WRITE_ZEROES;
    c.vwc = VWC_PRESENT;
    c.sgls = 0x0010_0001;
    c.ioccsz = 0x1122_3344;
    c.ofcs = 0xBEEF;
    c.set_tnvmcap(0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10);
    c.set_serial("SN123");
    c.set_model("pollux softnvme");
    c.set_firmware_rev("0.1");
    c.set_subnqn("nqn.2024-01.io.pollux:soft");
    c.psd[0].mp = 0x09C4;
    c.psd[1].enlat = 0x55;
    c.vs[0] = 0xAB;

    let b = c.as_bytes();
    assert_eq!(b.len(), 4096);
    assert_eq!(&b[0..2], &0x1B36u16.to_le_bytes());
    assert_eq!(&b[4..9], b"SN123");
    assert_eq!(&b[9..24], &[b' '; 15]);
    assert_eq!(&b[24..39], b"pollux softnvme");
    assert_eq!(&b[64..72], b"0.1     ");
    assert_eq!(b[77], 5);
    assert_eq!(&b[78..80], &[0x02, 0x01]);
    assert_eq!(&b[80..84], &0x0002_0000u32.to_le_bytes());
    assert_eq!(&b[256..258], &0x0102u16.to_le_bytes());
    assert_eq!(b[261], 1);
    assert_eq!(&b[266..268], &343u16.to_le_bytes());
    assert_eq!(b[280], 0x10);
    assert_eq!(b[295], 0x01);
    assert_eq!(b[512], 0x66);
    assert_eq!(b[513], 0x44);
    assert_eq!(&b[516..520], &[0xD4, 0xC3, 0xB2, 0xA1]);
    assert_eq!(&b[520..522], &[0x0C, 0x00]);
    assert_eq!(b[525], 1);
    assert_eq!(&b[536..540], &0x0010_0001u32.to_le_bytes());
    assert_eq!(&b[768..794], b"nqn.2024-01.io.pollux:soft");
    assert_eq!(b[794], 0);
    assert_eq!(&b[1792..1796], &0x1122_3344u32.to_le_bytes());
    assert_eq!(&b[1804..1806], &0xBEEFu16.to_le_bytes());
    assert_eq!(&b[2048..2050], &0x09C4u16.to_le_bytes());
    assert_eq!(&b[2048 + 32 + 4..2048 + 32 + 8], &0x55u32.to_le_bytes());
    assert_eq!(b[3072], 0xAB);

    let back = IdentifyController::read_from_bytes(b).unwrap();
    assert_eq!(back, c);
    assert_eq!(back.serial(), "SN123");
    assert_eq!(back.model(), "pollux softnvme");
    assert_eq!(back.firmware_rev(), "0.1");
    assert_eq!(back.subnqn_str(), "nqn.2024-01.io.pollux:soft");
    assert_eq!(back.tnvmcap(), 0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10);
    assert_eq!(back.max_transfer_bytes(4096), Some(128 * 1024));
    assert_eq!(back.sqe_size_required(), 64);
    assert_eq!(back.cqe_size_required(), 16);
}

#[test]
fn mdts_zero_is_unlimited() {
    let c = IdentifyController::default();
    assert_eq!(c.max_transfer_bytes(4096), None);
}

#[test]
fn ascii_helpers() {
    let mut f = [0u8; 8];
    set_ascii(&mut f, "abcdefghijk");
    assert_eq!(&f, b"abcdefgh");
    set_ascii(&mut f, "x\u{e9}y");
    assert_eq!(&f, b"x?y     ");
    assert_eq!(ascii_str(b"  ab cd   "), "ab cd");
    assert_eq!(ascii_str(b"ab\0\0\0"), "ab");
    assert_eq!(ascii_str(b""), "");
    // Invalid UTF-8 never panics.
    assert_eq!(ascii_str(&[0xFF, b'a', b' ']), "\u{FFFD}a");

    let mut n = [0xAAu8; 4];
    set_nul_terminated(&mut n, "abcdef");
    assert_eq!(&n, b"abc\0");
    // Multi-byte characters are not split.
    set_nul_terminated(&mut n, "a\u{e9}\u{e9}");
    assert_eq!(&n, &[b'a', 0xC3, 0xA9, 0]);
    set_nul_terminated(&mut [], "abc");
}

#[test]
fn power_state_descriptor_bits() {
    let p = PowerStateDescriptor {
        flags: PSD_NOPS,
        ips: 0b10 << 6,
        apw_aps: 0b01 << 6 | 0b010,
        ..Default::default()
    };
    assert!(p.nops());
    assert!(!p.mxps());
    assert_eq!(p.idle_power_scale(), 2);
    assert_eq!(p.active_power_scale(), 1);
    assert_eq!(p.active_power_workload(), 2);
}

#[test]
fn namespace_offsets_and_format() {
    let mut ns = IdentifyNamespace::new_zeroed();
    ns.nsze = 0x1122_3344_5566_7788;
    ns.ncap = 2;
    ns.nuse = 3;
    ns.nlbaf = 1;
    ns.lbaf[0] = LbaFormat::new(0, 9, 2);
    ns.lbaf[1] = LbaFormat::new(8, 12, 0);
    ns.set_lba_format_index(1);
    ns.anagrpid = 0xCAFE_F00D;
    ns.nsattr = 1;
    ns.nulbaf = 7;
    ns.nguid = [0x11; 16];
    ns.eui64 = [0x22; 8];
    ns.set_nvmcap(1 << 40);

    let b = ns.as_bytes();
    assert_eq!(b.len(), 4096);
    assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
    assert_eq!(b[8], 2);
    assert_eq!(b[16], 3);
    assert_eq!(b[25], 1);
    assert_eq!(b[26], 1);
    assert_eq!(&b[48..64], &(1u128 << 40).to_le_bytes());
    assert_eq!(b[82], 7);
    assert_eq!(&b[92..96], &0xCAFE_F00Du32.to_le_bytes());
    assert_eq!(b[99], 1);
    assert_eq!(&b[104..120], &[0x11; 16]);
    assert_eq!(&b[120..128], &[0x22; 8]);
    assert_eq!(b[128 + 2], 9);
    assert_eq!(b[128 + 3], 2);
    assert_eq!(&b[128 + 4..128 + 6], &8u16.to_le_bytes());
    assert_eq!(b[128 + 4 + 2], 12);

    assert_eq!(ns.lba_format(), LbaFormat::new(8, 12, 0));
    assert_eq!(ns.lba_size(), 4096);
    assert_eq!(ns.nvmcap(), 1 << 40);
}

#[test]
fn flbas_high_index_bits() {
    let mut ns = IdentifyNamespace::new_zeroed();
    ns.lbaf[37] = LbaFormat::new(0, 13, 0);
    ns.flbas = FLBAS_EXTENDED_METADATA;
    ns.set_lba_format_index(37);
    // 37 = 0b10_0101: low nibble 5 in bits 3:0, high bits 10b in 6:5.
    assert_eq!(ns.flbas, 0b0101_0101);
    assert!(ns.extended_metadata());
    assert_eq!(ns.lba_format_index(), 37);
    assert_eq!(ns.lba_size(), 8192);
    ns.flbas = 0xFF;
    assert_eq!(ns.lba_format_index(), 63);
    assert_eq!(ns.lba_size(), 0);
}

#[test]
fn ns_id_list() {
    let l = NsIdList::from_ids([1, 2, 0, 5]);
    assert_eq!(l.iter().collect::<Vec<_>>(), vec![1, 2, 5]);
    assert_eq!(l.len(), 3);
    assert!(!l.is_empty());
    assert_eq!(&l.as_bytes()[8..12], &5u32.to_le_bytes());
    assert!(NsIdList::default().is_empty());
    let full = NsIdList::from_ids(1..=5000);
    assert_eq!(full.len(), 1024);
    assert_eq!(full.ids[1023], 1024);
}

#[test]
fn ns_descriptors_round_trip() {
    let list = vec![
        NsDescriptor::Eui64([1, 2, 3, 4, 5, 6, 7, 8]),
        NsDescriptor::Nguid([0xAA; 16]),
        NsDescriptor::Uuid([0x55; 16]),
        NsDescriptor::Csi(CSI_NVM),
        NsDescriptor::Unknown {
            nidt: 0x7F,
            data: vec![9, 9, 9],
        },
    ];
    let mut buf = [0xEEu8; 4096];
    let n = write_ns_descriptors(&list, &mut buf);
    assert_eq!(n, 12 + 20 + 20 + 5 + 7);
    assert_eq!(&buf[0..4], &[NIDT_EUI64, 8, 0, 0]);
    assert_eq!(&buf[4..12], &[1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(&buf[12..14], &[NIDT_NGUID, 16]);
    assert_eq!(&buf[52..57], &[NIDT_CSI, 1, 0, 0, 0]);
    assert!(buf[n..].iter().all(|&b| b == 0));
    assert_eq!(parse_ns_descriptors(&buf).unwrap(), list);
    // Exactly-filled buffer with no terminator.
    assert_eq!(parse_ns_descriptors(&buf[..n]).unwrap(), list);
}

#[test]
fn ns_descriptors_errors() {
    assert_eq!(parse_ns_descriptors(&[]).unwrap(), vec![]);
    assert_eq!(parse_ns_descriptors(&[0; 16]).unwrap(), vec![]);
    assert_eq!(
        parse_ns_descriptors(&[NIDT_EUI64, 16, 0, 0]),
        Err(DescriptorError::Truncated {
            offset: 0,
            nidt: NIDT_EUI64
        })
    );
    let mut b = [0u8; 32];
    b[0] = NIDT_NGUID;
    b[1] = 8;
    let e = parse_ns_descriptors(&b).unwrap_err();
    assert_eq!(
        e,
        DescriptorError::BadLength {
            offset: 0,
            nidt: NIDT_NGUID,
            nidl: 8,
            expected: 16
        }
    );
    assert!(e.to_string().contains("expected 16"));
    assert!(matches!(
        parse_ns_descriptors(&[NIDT_CSI, 1]),
        Err(DescriptorError::Truncated { offset: 0, .. })
    ));
}

#[test]
fn ns_descriptor_writer_limits() {
    // Does not fit: list ends, buffer zeroed.
    let mut small = [0xFFu8; 10];
    assert_eq!(
        write_ns_descriptors(&[NsDescriptor::Eui64([1; 8])], &mut small),
        0
    );
    assert_eq!(small, [0; 10]);
    // Unencodable descriptors are skipped.
    let mut buf = [0u8; 64];
    let list = [
        NsDescriptor::Unknown {
            nidt: 0,
            data: vec![1],
        },
        NsDescriptor::Unknown {
            nidt: 9,
            data: vec![0; 300],
        },
        NsDescriptor::Csi(2),
    ];
    assert_eq!(write_ns_descriptors(&list, &mut buf), 5);
    assert_eq!(
        parse_ns_descriptors(&buf).unwrap(),
        vec![NsDescriptor::Csi(2)]
    );
}

#[test]
fn ns_descriptor_parser_never_panics() {
    // Deterministic xorshift fuzzing over short buffers biased towards
    // small NIDT/NIDL values.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let buf: Vec<u8> = (0..len)
            .map(|_| {
                let r = next();
                if r % 3 == 0 {
                    (r >> 8) as u8
                } else {
                    ((r >> 8) % 20) as u8
                }
            })
            .collect();
        if let Ok(list) = parse_ns_descriptors(&buf) {
            let mut out = vec![0u8; buf.len()];
            write_ns_descriptors(&list, &mut out);
            assert_eq!(parse_ns_descriptors(&out).unwrap(), list);
        }
    }
}
