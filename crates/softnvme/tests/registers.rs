//! Register conformance: reset values, read-only registers, enable
//! validation (CFS), enable/disable cycles, reset semantics and shutdown.
mod common;

use common::*;
use pollux_softnvme::SoftConfig;
use pollux_spec::regs::{self, off, shn, shst, Cap, Cc, Vs};
use pollux_spec::status::{generic, sct, specific};
use pollux_spec::{NvmOpcode, Sqe};

#[test]
fn reset_values() {
    let h = Host::new(SoftConfig {
        mqes: 1023,
        dstrd: 1,
        cap_to: 15,
        ..cfg_ram()
    });
    let cap = Cap(h.r64(off::CAP));
    assert_eq!(cap.mqes(), 1023);
    assert!(cap.cqr());
    assert_eq!(cap.ams(), 0);
    assert_eq!(cap.to(), 15);
    assert_eq!(cap.dstrd(), 1);
    assert!(!cap.nssrs());
    assert_eq!(cap.css(), 1, "NVM command set only (bit 37)");
    assert_eq!(cap.0 >> 37 & 1, 1);
    assert_eq!(cap.mpsmin(), 0);
    assert_eq!(cap.mpsmax(), 4);
    assert!(!cap.cmbs() && !cap.pmrs());
    assert_eq!(Vs(h.r32(off::VS)), Vs::NVME_2_0);
    assert_eq!(h.r32(off::CC), 0);
    assert_eq!(h.r32(off::CSTS), 0);
    assert_eq!(h.r32(off::AQA), 0);
    assert_eq!(h.r64(off::ASQ), 0);
    assert_eq!(h.r64(off::ACQ), 0);
    assert_eq!(h.r32(off::CMBLOC), 0);
    assert_eq!(h.r32(off::CMBSZ), 0);
    // BAR covers doorbells of 65 queues at stride 8 and is page aligned.
    let (p, len) = h.dev.bar0();
    assert_eq!(p.as_ptr() as usize % 4096, 0);
    assert!(len >= 0x1000 + 65 * 2 * 8);
    assert_eq!(len % 4096, 0);
}

#[test]
fn read_only_registers_ignore_writes() {
    let h = Host::new(cfg_ram());
    let cap = h.r64(off::CAP);
    h.w64(off::CAP, 0xdead_beef_dead_beef);
    h.w32(off::VS, 0x1234);
    h.w32(off::CSTS, 0xF);
    h.w32(off::CMBSZ, 0xFFFF);
    h.steps(300); // includes a housekeeping pass
    assert_eq!(h.r64(off::CAP), cap);
    assert_eq!(Vs(h.r32(off::VS)), Vs::NVME_2_0);
    assert_eq!(h.r32(off::CSTS), 0);
    assert_eq!(h.r32(off::CMBSZ), 0);
}

#[test]
fn enable_with_unmapped_asq_sets_cfs() {
    let mut h = Host::new(cfg_ram());
    h.setup_admin(32, 32);
    h.w64(off::ASQ, 0x4000_0000_0000); // outside every mapping
    let c = h.set_enable(true);
    assert!(c.cfs() && !c.rdy());
    // Disabling clears CFS; a good configuration then works.
    let c = h.set_enable(false);
    assert!(!c.cfs() && !c.rdy());
    h.setup_admin(32, 32);
    let c = h.set_enable(true);
    assert!(c.rdy() && !c.cfs());
}

#[test]
fn enable_rejects_bad_configs() {
    type Tweak = fn(&mut Host) -> u32;
    let cases: [(&str, Tweak); 6] = [
        ("misaligned ASQ", |h| {
            h.w64(off::ASQ, h.asq.iova + 64);
            Cc::standard(0).with_en(true).0
        }),
        ("misaligned ACQ for 16K pages", |h| {
            h.w64(off::ACQ, h.acq.iova | 0x1000);
            Cc::standard(2).with_en(true).0
        }),
        ("AQA of 1 entry", |h| {
            h.w32(off::AQA, 0);
            Cc::standard(0).with_en(true).0
        }),
        ("MPS above MPSMAX", |_| Cc::standard(5).with_en(true).0),
        ("CSS not NVM", |_| Cc::standard(0).with_en(true).0 | 1 << 4),
        ("AMS not round robin", |_| {
            Cc::standard(0).with_en(true).0 | 1 << 11
        }),
    ];
    for (what, tweak) in cases {
        let mut h = Host::new(cfg_ram());
        h.setup_admin(32, 32);
        let cc = tweak(&mut h);
        h.w32(off::CC, cc);
        h.steps(3);
        let c = h.csts();
        assert!(c.cfs() && !c.rdy(), "{what}: {c:?}");
    }
}

#[test]
fn enable_disable_cycles_and_reset_deletes_io_queues() {
    let mut h = Host::enabled(cfg_ram());
    for round in 0..3 {
        let mut q = h.create_ioq(1, 16);
        let (buf, _) = h.alloc(4096);
        let s = h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 8, buf, 0));
        assert!(s.is_success(), "round {round}: {s}");
        let before = h.dev.stats().resets;
        let c = h.set_enable(false);
        assert!(!c.rdy() && !c.cfs());
        h.step();
        assert_eq!(h.dev.stats().resets, before + 1);
        let c = h.set_enable(true);
        assert!(c.rdy(), "round {round}");
        // The old queue is gone: deleting it fails, creating it again works.
        let s = h.admin_status(Sqe::delete_io_sq(1));
        assert!(s.is(sct::COMMAND_SPECIFIC, specific::INVALID_QID), "{s}");
        let s = h.admin_status(Sqe::delete_io_cq(1));
        assert!(s.is(sct::COMMAND_SPECIFIC, specific::INVALID_QID), "{s}");
    }
}

#[test]
fn shutdown_reports_complete() {
    let mut h = Host::enabled(cfg_ram());
    let cc = Cc::standard(0).with_en(true).with_shn(shn::NORMAL);
    h.w32(off::CC, cc.0);
    h.step();
    assert_eq!(h.csts().shst(), shst::COMPLETE);
    assert!(h.csts().rdy());
    // Abrupt shutdown after re-enable too.
    h.set_enable(false);
    assert_eq!(h.csts().shst(), shst::NORMAL);
    h.set_enable(true);
    h.w32(
        off::CC,
        Cc::standard(0).with_en(true).with_shn(shn::ABRUPT).0,
    );
    h.step();
    assert_eq!(h.csts().shst(), shst::COMPLETE);
}

#[test]
fn no_processing_after_shutdown() {
    let mut h = Host::enabled(cfg_ram());
    h.w32(
        off::CC,
        Cc::standard(0).with_en(true).with_shn(shn::NORMAL).0,
    );
    h.step();
    h.admin_submit(Sqe::identify(1, 0, h.asq.iova));
    assert!(h.wait_admin(20).is_none());
    // A reset brings the controller back.
    h.set_enable(false);
    h.set_enable(true);
    let (b, _) = h.alloc(4096);
    let s = h.admin_status(Sqe::identify(1, 0, b));
    assert!(s.is(sct::GENERIC, generic::SUCCESS));
}

#[test]
fn unmapping_queues_after_shutdown_is_not_fatal() {
    let mut h = Host::enabled(cfg_ram());
    let _q = h.create_ioq(1, 16);
    h.w32(
        off::CC,
        Cc::standard(0).with_en(true).with_shn(shn::NORMAL).0,
    );
    h.step();
    assert_eq!(h.csts().shst(), shst::COMPLETE);
    h.dev.dma_unmap(IOVA_BASE).unwrap();
    h.steps(300);
    assert!(!h.csts().cfs());
    // While running it is an IOMMU fault.
    let h = Host::enabled(cfg_ram());
    h.dev.dma_unmap(IOVA_BASE).unwrap();
    h.step();
    assert!(h.csts().cfs());
}

#[test]
fn housekeeping_clears_reserved_registers_and_stray_doorbells() {
    // Stride 4 registers: the doorbells of queue q are 16 bytes apart.
    let h = Host::enabled(SoftConfig {
        dstrd: 2,
        max_io_queues: 8,
        ..cfg_ram()
    });
    // Reserved registers anywhere in 0x38..0x1000, the first and the last.
    for o in [off::CMBLOC, 0x800, 0xE40, 0xFFC] {
        h.w32(o, 0xA5A5_0001);
    }
    // Doorbells of the last queue (8), which does not exist.
    h.w32(regs::sq_tail_doorbell(8, 2), 3);
    h.w32(regs::cq_head_doorbell(8, 2), 5);
    h.steps(300); // includes a housekeeping pass
    for o in [off::CMBLOC, 0x800, 0xE40, 0xFFC] {
        assert_eq!(h.r32(o), 0, "reserved register {o:#x}");
    }
    assert_eq!(h.r32(regs::sq_tail_doorbell(8, 2)), 0);
    assert_eq!(h.r32(regs::cq_head_doorbell(8, 2)), 0);
    assert_eq!(h.dev.stats().invalid_doorbell_writes, 2);
}
