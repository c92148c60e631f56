//! NVM I/O conformance: data paths on RAM/null/file backends, PRP rules,
//! MDTS, LBA ranges, Write Zeroes / DSM, IOMMU enforcement, invalid
//! doorbells and CQ-full back-pressure.
mod common;

use common::*;
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig};
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::features::aer;
use pollux_spec::log::lid;
use pollux_spec::regs::{cq_head_doorbell, sq_tail_doorbell};
use pollux_spec::status::{generic, sct};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::IntoBytes;

#[track_caller]
fn check(st: Status, sc: u8) {
    assert!(st.is(sct::GENERIC, sc), "got {st}, want generic {sc:#x}");
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

#[test]
fn ram_round_trip_both_formats() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 32);
    for (nsid, lba) in [(1u32, 512usize), (2, 4096)] {
        let len = 8192;
        let nlb = (len / lba) as u32;
        let (w, _) = h.alloc(len);
        let (r, _) = h.alloc(len);
        let data = pattern(len, nsid as u8);
        h.write_mem(w, &data);
        check(
            h.io_status(&mut q, rw(NvmOpcode::Write, nsid, 10, nlb, w, w + 4096)),
            generic::SUCCESS,
        );
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, nsid, 10, nlb, r, r + 4096)),
            generic::SUCCESS,
        );
        assert_eq!(h.read_mem(r, len), data, "nsid {nsid}");
        // Unwritten blocks read as zeroes.
        h.write_mem(r, &[0xFF; 4096]);
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, nsid, 1000, 1, r, 0)),
            generic::SUCCESS,
        );
        assert!(h.read_mem(r, lba).iter().all(|&b| b == 0));
    }
    // PRP1 with an offset: 512-byte read into the middle of a page.
    let (b, _) = h.alloc(4096);
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 10, 1, b + 1024, 0)),
        generic::SUCCESS,
    );
    assert_eq!(h.read_mem(b + 1024, 512), pattern(8192, 1)[..512]);
    let st = h.dev.stats();
    assert_eq!((st.writes, st.bytes_written), (2, 16384));
    assert_eq!(st.reads, 5);
}

#[test]
fn prp_errors() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    let (b, _) = h.alloc(8192);
    // PRP1 outside every mapping.
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, 0x7000_0000_0000, 0)),
        generic::DATA_TRANSFER_ERROR,
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Write, 2, 0, 1, 0x1000, 0)),
        generic::DATA_TRANSFER_ERROR,
    );
    // A buffer running off the end of the mapping.
    let end = IOVA_BASE + h.mem_len as u64;
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 2, end - 4096, end)),
        generic::DATA_TRANSFER_ERROR,
    );
    // PRP1 not dword aligned.
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b + 2, 0)),
        generic::PRP_OFFSET_INVALID,
    );
    // Misaligned PRP2 (second page).
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 2, b, b + 4096 + 512)),
        generic::PRP_OFFSET_INVALID,
    );
    // PRP list with a misaligned entry.
    let (list, _) = h.alloc(4096);
    h.write_mem(list, [b + 4096, b + 100].as_bytes());
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 3, b, list)),
        generic::PRP_OFFSET_INVALID,
    );
    // PRP list pointer outside the mappings.
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 3, b, 0x7000_0000_0000)),
        generic::DATA_TRANSFER_ERROR,
    );
    // Nothing was read into the host buffer on failure paths.
    assert!(h.read_mem(b, 8192).iter().all(|&x| x == 0));
}

#[test]
fn one_mib_transfer_with_chained_prp_lists() {
    let mut h = Host::enabled(SoftConfig {
        mdts: 8,
        ..cfg_ram()
    });
    let mut q = h.create_ioq(1, 16);
    const PAGES: usize = 256;
    // Scattered data pages: every other page of a region, in reverse order.
    let (region, _) = h.alloc(PAGES * 2 * 4096);
    let pages: Vec<u64> = (0..PAGES)
        .rev()
        .map(|i| region + (i as u64) * 2 * 4096)
        .collect();
    let (l1, _) = h.alloc(4096);
    let (l2, _) = h.alloc(4096);
    // First list starts 16 bytes before the end of its page: one data
    // entry, then a chain pointer to l2 holding the remaining 254.
    let first = l1 + 4096 - 16;
    h.write_mem(first, [pages[1], l2].as_bytes());
    h.write_mem(l2, pages[2..].as_bytes());
    let data = pattern(PAGES * 4096, 7);
    for (i, p) in pages.iter().enumerate() {
        h.write_mem(*p, &data[i * 4096..(i + 1) * 4096]);
    }
    let nlb = (PAGES * 4096 / 512) as u32;
    check(
        h.io_status(&mut q, rw(NvmOpcode::Write, 1, 64, nlb, pages[0], first)),
        generic::SUCCESS,
    );
    // Read it back contiguously (PRP list of consecutive pages).
    let (dst, _) = h.alloc(PAGES * 4096);
    let (l3, _) = h.alloc(4096);
    let entries: Vec<u64> = (1..PAGES as u64).map(|i| dst + i * 4096).collect();
    h.write_mem(l3, entries.as_bytes());
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 64, nlb, dst, l3)),
        generic::SUCCESS,
    );
    assert!(h.read_mem(dst, PAGES * 4096) == data, "data mismatch");
    // One block more than MDTS.
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 64, nlb + 1, dst, l3)),
        generic::INVALID_FIELD,
    );
}

#[test]
fn mdts_and_lba_range_and_namespace_checks() {
    let mut h = Host::enabled(cfg_ram()); // mdts 5: 128 KiB
    let mut q = h.create_ioq(1, 16);
    let (b, _) = h.alloc(4096);
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 33, b, 0)),
        generic::INVALID_FIELD,
    );
    let blocks = (64u64 << 20) / 4096;
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, blocks, 1, b, 0)),
        generic::LBA_OUT_OF_RANGE,
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, blocks - 1, 2, b, 0)),
        generic::LBA_OUT_OF_RANGE,
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, u64::MAX, 1, b, 0)),
        generic::LBA_OUT_OF_RANGE,
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, blocks - 1, 1, b, 0)),
        generic::SUCCESS,
    );
    for nsid in [0u32, 3, 0xFFFF_FFFF] {
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, nsid, 0, 1, b, 0)),
            generic::INVALID_NAMESPACE,
        );
    }
    check(
        h.io_status(&mut q, Sqe::new(0x7F, 1)),
        generic::INVALID_OPCODE,
    );
    check(
        h.io_status(&mut q, Sqe::new(NvmOpcode::Compare as u8, 1)),
        generic::INVALID_OPCODE,
    );
    let mut fused = rw(NvmOpcode::Read, 1, 0, 1, b, 0);
    fused.flags = 1;
    check(h.io_status(&mut q, fused), generic::INVALID_FIELD);
    check(h.io_status(&mut q, Sqe::flush(1)), generic::SUCCESS);
    check(
        h.io_status(&mut q, Sqe::flush(0xFFFF_FFFF)),
        generic::SUCCESS,
    );
    check(
        h.io_status(&mut q, Sqe::flush(0)),
        generic::INVALID_NAMESPACE,
    );
}

#[test]
fn write_zeroes_and_deallocate_read_zero() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    let (b, _) = h.alloc(32 * 1024);
    for nsid in [1u32, 2] {
        let lba = if nsid == 1 { 512 } else { 4096 };
        let nlb = (32 * 1024 / lba) as u32;
        let fill = |h: &mut Host, q: &mut IoQ| {
            h.write_mem(b, &[0xAB; 32 * 1024]);
            let (list, _) = h.alloc(4096);
            let e: Vec<u64> = (1..8u64).map(|i| b + i * 4096).collect();
            h.write_mem(list, e.as_bytes());
            check(
                h.io_status(q, rw(NvmOpcode::Write, nsid, 0, nlb, b, list)),
                generic::SUCCESS,
            );
            list
        };
        let read_blk = |h: &mut Host, q: &mut IoQ, lba_i: u64| {
            h.write_mem(b, &[0x11; 4096]);
            check(
                h.io_status(q, rw(NvmOpcode::Read, nsid, lba_i, 1, b, 0)),
                generic::SUCCESS,
            );
            h.read_mem(b, lba)
        };
        // Write Zeroes without and with DEAC.
        for deac in [false, true] {
            fill(&mut h, &mut q);
            check(
                h.io_status(&mut q, Sqe::write_zeroes(nsid, 2, 3, deac)),
                generic::SUCCESS,
            );
            assert!(read_blk(&mut h, &mut q, 1).iter().all(|&x| x == 0xAB));
            for i in 2..5 {
                assert!(
                    read_blk(&mut h, &mut q, i).iter().all(|&x| x == 0),
                    "nsid {nsid} lba {i}"
                );
            }
            assert!(read_blk(&mut h, &mut q, 5).iter().all(|&x| x == 0xAB));
        }
        // DSM deallocate of two ranges.
        fill(&mut h, &mut q);
        let (rb, _) = h.alloc(4096);
        let ranges = [
            DsmRange {
                cattr: 0,
                nlb: 1,
                slba: 0,
            },
            DsmRange {
                cattr: 0,
                nlb: 2,
                slba: 4,
            },
        ];
        h.write_mem(rb, ranges.as_bytes());
        check(
            h.io_status(&mut q, Sqe::dsm(nsid, 2, DSM_ATTR_DEALLOCATE, rb)),
            generic::SUCCESS,
        );
        let zero: Vec<bool> = (0..7)
            .map(|i| read_blk(&mut h, &mut q, i).iter().all(|&x| x == 0))
            .collect();
        assert_eq!(
            zero,
            [true, false, false, false, true, true, false],
            "nsid {nsid}"
        );
        // DSM without the deallocate attribute changes nothing.
        fill(&mut h, &mut q);
        check(
            h.io_status(&mut q, Sqe::dsm(nsid, 2, 0, rb)),
            generic::SUCCESS,
        );
        assert!(read_blk(&mut h, &mut q, 0).iter().all(|&x| x == 0xAB));
    }
    // Out-of-range DSM range: nothing deallocated.
    let (rb, _) = h.alloc(4096);
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 0,
        },
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: u64::MAX,
        },
    ];
    h.write_mem(rb, ranges.as_bytes());
    check(
        h.io_status(&mut q, Sqe::dsm(1, 2, DSM_ATTR_DEALLOCATE, rb)),
        generic::LBA_OUT_OF_RANGE,
    );
    check(
        h.io_status(&mut q, Sqe::write_zeroes(1, u64::MAX - 1, 4, false)),
        generic::LBA_OUT_OF_RANGE,
    );
    check(
        h.io_status(
            &mut q,
            Sqe::dsm(1, 256, DSM_ATTR_DEALLOCATE, 0x7000_0000_0000),
        ),
        generic::DATA_TRANSFER_ERROR,
    );
}

#[test]
fn null_backend_validates_prps() {
    let mut h = Host::enabled(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Null,
            lba_shift: 12,
            size_bytes: 1 << 40,
        }],
        ..Default::default()
    });
    let mut q = h.create_ioq(1, 64);
    let (b, _) = h.alloc(4096);
    h.write_mem(b, &[0x77; 4096]);
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 12345, 1, b, 0)),
        generic::SUCCESS,
    );
    assert!(
        h.read_mem(b, 4096).iter().all(|&x| x == 0x77),
        "null reads move no data"
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Write, 1, 0, 1, b, 0)),
        generic::SUCCESS,
    );
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, 0x9000_0000, 0)),
        generic::DATA_TRANSFER_ERROR,
    );
    // A batch of 60 in one go.
    let mut cids = vec![];
    for i in 0..60u64 {
        let mut s = rw(NvmOpcode::Read, 1, i, 1, b, 0);
        s.cid = h.cid();
        cids.push(s.cid);
        Host::push(&mut q.sq, s);
    }
    h.w32(sq_tail_doorbell(1, 0), q.sq.tail);
    assert_eq!(h.step(), 60);
    for cid in cids {
        let c = Host::take(&mut q.cq).unwrap();
        assert_eq!(c.cid, cid);
        assert!(c.status().is_success());
    }
}

#[test]
fn file_backend_persists() {
    let dir = std::env::temp_dir().join(format!("softnvme-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns1.img");
    let _ = std::fs::remove_file(&path);
    let cfg = |size| SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::File { path: path.clone() },
            lba_shift: 12,
            size_bytes: size,
        }],
        ..Default::default()
    };
    let data = pattern(8192, 3);
    {
        let mut h = Host::enabled(cfg(8 << 20));
        let mut q = h.create_ioq(1, 16);
        let (b, _) = h.alloc(8192);
        h.write_mem(b, &data);
        check(
            h.io_status(&mut q, rw(NvmOpcode::Write, 1, 100, 2, b, b + 4096)),
            generic::SUCCESS,
        );
        check(h.io_status(&mut q, Sqe::flush(1)), generic::SUCCESS);
        check(
            h.io_status(&mut q, Sqe::write_zeroes(1, 200, 1, true)),
            generic::SUCCESS,
        );
    }
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 8 << 20);
    {
        // size 0: use the file's size.
        let mut h = Host::enabled(cfg(0));
        let mut q = h.create_ioq(1, 16);
        let (b, _) = h.alloc(8192);
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, 1, 100, 2, b, b + 4096)),
            generic::SUCCESS,
        );
        assert_eq!(h.read_mem(b, 8192), data);
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, 1, 2048, 1, b, 0)),
            generic::LBA_OUT_OF_RANGE,
        );
        check(
            h.io_status(&mut q, rw(NvmOpcode::Read, 1, 2047, 1, b, 0)),
            generic::SUCCESS,
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dma_unmap_then_command_fails() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    // A second mapping for a data buffer.
    // SAFETY: (test) a fresh anonymous mapping.
    let buf = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            8192,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    let iova = 0x40_0000_0000u64;
    // SAFETY: (test) `buf` is our live 8 KiB mapping; it is unmapped from the device before munmap.
    unsafe {
        h.dev
            .dma_map(iova, std::ptr::NonNull::new(buf.cast()).unwrap(), 8192)
            .unwrap()
    };
    check(
        h.io_status(&mut q, rw(NvmOpcode::Write, 2, 0, 1, iova, 0)),
        generic::SUCCESS,
    );
    h.dev.dma_unmap(iova).unwrap();
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 2, 0, 1, iova, 0)),
        generic::DATA_TRANSFER_ERROR,
    );
    assert!(h.dev.dma_unmap(iova).is_err());
    // SAFETY: (test) unmapped from the device above; nothing else uses it.
    unsafe { libc::munmap(buf, 8192) };
    // Unmapping queue memory is an IOMMU fault: the controller goes fatal.
    h.dev.dma_unmap(IOVA_BASE).unwrap();
    h.step();
    assert!(h.csts().cfs());
}

#[test]
fn dma_map_rejects_bad_ranges() {
    let h = Host::new(cfg_ram());
    let p = std::ptr::NonNull::new(h.mem).unwrap();
    // SAFETY: (test) `h.mem` is the host's live mapping; the ranges below are refused before any access.
    unsafe {
        assert!(h.dev.dma_map(0x1_0000_0000, p, 100).is_err());
        assert!(h.dev.dma_map(0x1_0000_0100, p, 4096).is_err());
        assert!(h.dev.dma_map(IOVA_BASE + 4096, p, 4096).is_err(), "overlap");
        assert!(h.dev.dma_map(u64::MAX - 4095, p, 8192).is_err(), "wraps");
    }
}

/// The AER `aer_cid` completes with Invalid Doorbell Write Value (error
/// log), the device having counted `count` such writes.
fn expect_invalid_doorbell_aer(h: &mut Host, aer_cid: u16, count: u64) {
    let c = h.wait_admin(10).expect("AER completion");
    assert_eq!(c.cid, aer_cid);
    let ev = aer::decode(c.dw0);
    assert_eq!(
        (ev.event_type, ev.info, ev.log_page),
        (aer::ERROR, aer::ERROR_INVALID_DOORBELL_WRITE, lid::ERROR)
    );
    assert_eq!(h.dev.stats().invalid_doorbell_writes, count);
}

#[test]
fn invalid_doorbell_writes_raise_aer() {
    let mut h = Host::enabled(cfg_ram());
    let mut q = h.create_ioq(1, 16);
    let aer_cid = h.admin_submit(Sqe::async_event_request());
    h.steps(2);
    // Tail beyond the queue size.
    h.w32(sq_tail_doorbell(1, 0), 100);
    expect_invalid_doorbell_aer(&mut h, aer_cid, 1);
    // The queue still works after a valid tail.
    let (b, _) = h.alloc(4096);
    check(
        h.io_status(&mut q, rw(NvmOpcode::Read, 1, 0, 1, b, 0)),
        generic::SUCCESS,
    );
    // Events of the same type stay masked until the error log is read.
    let aer2 = h.admin_submit(Sqe::async_event_request());
    h.w32(cq_head_doorbell(1, 0), 7); // pops entries never posted
    assert!(h.wait_admin(5).is_none());
    assert_eq!(h.dev.stats().invalid_doorbell_writes, 2);
    let (lb, _) = h.alloc(4096);
    let s = h.admin_status(Sqe::get_log_page(lid::ERROR, 0, 4096, 0, lb, 0));
    assert!(s.is_success());
    // A doorbell for a queue that does not exist.
    h.w32(sq_tail_doorbell(5, 0), 3);
    let c = h
        .wait_admin(600)
        .expect("AER for invalid doorbell register");
    assert_eq!(c.cid, aer2);
    let ev = aer::decode(c.dw0);
    assert_eq!(
        (ev.event_type, ev.info),
        (aer::ERROR, aer::ERROR_INVALID_DOORBELL_REGISTER)
    );
    assert_eq!(h.dev.stats().invalid_doorbell_writes, 3);
    assert_eq!(h.r32(sq_tail_doorbell(5, 0)), 0);
}

#[test]
fn full_cq_holds_completions() {
    let mut h = Host::enabled(cfg_ram());
    let (cq_iova, cq_ptr) = h.alloc(4096);
    let (sq_iova, sq_ptr) = h.alloc(4096);
    assert!(h
        .admin_status(Sqe::create_io_cq(1, 4, cq_iova))
        .is_success());
    assert!(h
        .admin_status(Sqe::create_io_sq(1, 16, 1, sq_iova))
        .is_success());
    let mut q = IoQ {
        sq: SqRing {
            qid: 1,
            iova: sq_iova,
            ptr: sq_ptr.cast(),
            size: 16,
            tail: 0,
        },
        cq: CqRing {
            qid: 1,
            iova: cq_iova,
            ptr: cq_ptr.cast(),
            size: 4,
            head: 0,
            phase: true,
        },
    };
    let (b, _) = h.alloc(4096);
    let mut cids = vec![];
    for i in 0..10u64 {
        let mut s = rw(NvmOpcode::Read, 1, i, 1, b, 0);
        s.cid = h.cid();
        cids.push(s.cid);
        Host::push(&mut q.sq, s);
    }
    h.w32(sq_tail_doorbell(1, 0), q.sq.tail);
    h.steps(20);
    // Three slots usable; the fourth is never written while full.
    let slot3 = h.read_mem(cq_iova + 48, 16);
    assert!(slot3.iter().all(|&x| x == 0), "CQE overwritten");
    assert!(h.dev.stats().cq_full_waits > 0);
    let mut got = vec![];
    while got.len() < 10 {
        let old = q.cq.head;
        let mut n = 0;
        while let Some(c) = Host::take(&mut q.cq) {
            got.push(c);
            n += 1;
        }
        assert!(n <= 3, "more than the free slots were posted");
        h.ring_cq(&q.cq, old);
        h.steps(3);
        assert!(h.dev.stats().io_commands <= 10);
    }
    assert_eq!(got.iter().map(|c| c.cid).collect::<Vec<_>>(), cids);
    assert!(got.iter().all(|c| c.status().is_success()));
    // SQHD advances and never exceeds what was fetched.
    assert_eq!(got.last().unwrap().sqhd, 10);
    assert!(Host::take(&mut q.cq).is_none());
}

#[test]
fn two_sqs_share_one_cq() {
    let mut h = Host::enabled(cfg_ram());
    let (cq_iova, cq_ptr) = h.alloc(4096);
    assert!(h
        .admin_status(Sqe::create_io_cq(1, 64, cq_iova))
        .is_success());
    let mut cq = CqRing {
        qid: 1,
        iova: cq_iova,
        ptr: cq_ptr.cast(),
        size: 64,
        head: 0,
        phase: true,
    };
    let mut sqs = vec![];
    for qid in [1u16, 2] {
        let (sq_iova, sq_ptr) = h.alloc(4096);
        assert!(h
            .admin_status(Sqe::create_io_sq(qid, 32, 1, sq_iova))
            .is_success());
        sqs.push(SqRing {
            qid,
            iova: sq_iova,
            ptr: sq_ptr.cast(),
            size: 32,
            tail: 0,
        });
    }
    let (b, _) = h.alloc(4096);
    for sq in &mut sqs {
        for i in 0..5 {
            Host::push(sq, rw(NvmOpcode::Read, 2, i, 1, b, 0));
        }
        h.w32(sq_tail_doorbell(sq.qid, 0), sq.tail);
    }
    h.step();
    let mut per_sq = [0, 0];
    while let Some(c) = Host::take(&mut cq) {
        per_sq[c.sqid as usize - 1] += 1;
    }
    assert_eq!(per_sq, [5, 5]);
}

#[test]
fn invalid_admin_and_second_io_sq_doorbells_raise_aer() {
    let mut h = Host::enabled(cfg_ram());
    let mut q1 = h.create_ioq(1, 16);
    let _q2 = h.create_ioq(2, 16);
    let aer_cid = h.admin_submit(Sqe::async_event_request());
    h.steps(2);
    // The admin SQ's tail beyond its size, while it is idle.
    h.w32(sq_tail_doorbell(0, 0), 4000);
    expect_invalid_doorbell_aer(&mut h, aer_cid, 1);
    // Reading the error log unmasks the event type.
    let (lb, _) = h.alloc(4096);
    let s = h.admin_status(Sqe::get_log_page(lid::ERROR, 0, 4096, 0, lb, 0));
    assert!(s.is_success());
    let aer2 = h.admin_submit(Sqe::async_event_request());
    h.steps(2);
    // The second I/O SQ's tail beyond its size.
    h.w32(sq_tail_doorbell(2, 0), 999);
    expect_invalid_doorbell_aer(&mut h, aer2, 2);
    // The first I/O queue still works.
    let (b, _) = h.alloc(4096);
    check(
        h.io_status(&mut q1, rw(NvmOpcode::Read, 1, 0, 1, b, 0)),
        generic::SUCCESS,
    );
}
