//! The host is untrusted: random SQEs, doorbell values and register writes
//! must never panic the device, and every fetched command (other than an
//! Asynchronous Event Request) must complete.
mod common;

use common::*;
use pollux_softnvme::SoftConfig;
use pollux_spec::regs::{cq_head_doorbell, off, sq_tail_doorbell};
use pollux_spec::{AdminOpcode, Sqe};
use proptest::prelude::*;
use zerocopy::FromBytes;

fn arb_sqe(mapped: u64, len: u64) -> impl Strategy<Value = Sqe> {
    let addr = prop_oneof![
        any::<u64>(),
        (0..len).prop_map(move |o| mapped + o),
        (0..len / 4096).prop_map(move |p| mapped + p * 4096),
        Just(0u64),
    ];
    (
        proptest::collection::vec(any::<u8>(), 64),
        0u8..0x20,
        addr.clone(),
        addr,
        prop_oneof![
            Just(0u32),
            Just(1),
            Just(2),
            Just(0xFFFF_FFFF),
            any::<u32>()
        ],
        any::<bool>(),
    )
        .prop_map(|(bytes, opc, prp1, prp2, nsid, small)| {
            let mut s = Sqe::read_from_bytes(&bytes).unwrap();
            s.opc = opc;
            s.flags &= if small { 0 } else { 0xFF };
            s.nsid = nsid;
            s.prp1 = prp1;
            s.prp2 = prp2;
            if small {
                // Keep lengths plausible so transfers actually happen.
                s.cdw12 &= 0xFFFF_00FF;
                s.cdw10 &= 0x00FF_FFFF;
                s.cdw11 &= 0xFFFF_00FF;
            }
            s
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn random_commands_never_panic(
        admin in proptest::collection::vec(arb_sqe(IOVA_BASE, 4 << 20), 1..20),
        io in proptest::collection::vec(arb_sqe(IOVA_BASE, 4 << 20), 1..40),
        dbs in proptest::collection::vec((0u16..70, any::<bool>(), any::<u32>()), 0..6),
        regs_w in proptest::collection::vec((0usize..0x40, any::<u32>()), 0..4),
    ) {
        let mut h = Host::with_mem(SoftConfig { mdts: 6, ..cfg_ram() }, 4 << 20);
        h.setup_admin(64, 64);
        assert!(h.set_enable(true).rdy());
        let mut q = h.create_ioq(1, 64);
        let mut expected_admin = 0;
        for mut s in admin {
            if s.opc == AdminOpcode::AsyncEventRequest as u8
                || s.opc == AdminOpcode::DeleteIoSq as u8
                || s.opc == AdminOpcode::DeleteIoCq as u8
                || s.opc == AdminOpcode::DoorbellBufferConfig as u8
            {
                s.opc = AdminOpcode::GetFeatures as u8;
            }
            s.cid = h.cid();
            Host::push(&mut h.asq, s);
            expected_admin += 1;
        }
        h.w32(sq_tail_doorbell(0, 0), h.asq.tail);
        let mut expected_io = 0;
        for mut s in io {
            s.cid = h.cid();
            Host::push(&mut q.sq, s);
            expected_io += 1;
        }
        h.w32(sq_tail_doorbell(1, 0), q.sq.tail);
        let mut got_admin = 0;
        let mut got_io = 0;
        for _ in 0..50 {
            h.step();
            let old = h.acq.head;
            while Host::take(&mut h.acq).is_some() {
                got_admin += 1;
            }
            h.w32(cq_head_doorbell(0, 0), h.acq.head);
            let _ = old;
            while Host::take(&mut q.cq).is_some() {
                got_io += 1;
            }
            h.w32(cq_head_doorbell(1, 0), q.cq.head);
        }
        prop_assert_eq!(got_admin, expected_admin);
        prop_assert_eq!(got_io, expected_io);
        // Now garbage doorbells and register writes.
        for (qid, sq, v) in dbs {
            let o = if sq { sq_tail_doorbell(qid, 0) } else { cq_head_doorbell(qid, 0) };
            h.w32(o, v);
        }
        for (o, v) in regs_w {
            h.w32(o * 4 % off::CMBLOC, v);
        }
        h.steps(600);
        let _ = h.dev.stats();
    }
}
