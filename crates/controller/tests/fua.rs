//! Force Unit Access in the NVM command set (the emulator's and the
//! target's): a Write with CDW12 bit 30 completes only once its data is
//! durable, a Read with it commits cached writes of its blocks first, on
//! the synchronous path (the emulator's), the asynchronous one (the
//! target's), and through the bounce buffer (segments not of whole
//! blocks), and so is a Write Zeroes with it. The namespace is a RAM disk
//! with a simulated volatile write cache, so "durable" is "survives
//! `lose_volatile_cache`".
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions, Limits, Namespace, Personality,
    Subsystem,
};
use pollux_spec::cmd::RwFlags;
use pollux_spec::{NvmOpcode, Sqe, Status};

const BLOCKS: u64 = 1024;

/// A controller over one namespace (512-byte blocks) on `bdev`.
fn controller(bdev: Bdev) -> Controller {
    let id = Identity {
        serial: "FUA0001".into(),
        model: "pollux FUA test".into(),
        firmware: "1.0".into(),
        vid: 0,
        ssvid: 0,
        ieee: [0; 3],
        subnqn: "nqn.2024-01.io.pollux:fua".into(),
    };
    let lim = Limits {
        mqes: 127,
        max_io_queues: 2,
        mdts: 5,
        abort_limit: 3,
        aer_limit: 1,
        cap_to: 20,
    };
    let p = Personality::Fabrics(FabricsTraits {
        in_capsule_data: 8192,
        kas: 0,
    });
    let ns = vec![Namespace::new(bdev, 0).unwrap()];
    let s: Arc<Subsystem> = Subsystem::new(id, lim, p, ns).unwrap();
    Controller::new(s, 1)
}

fn cached() -> Bdev {
    Bdev::ram_with_volatile_cache("c0", 512, BLOCKS).unwrap()
}

fn rw(opc: NvmOpcode, slba: u64, nlb: u32, fua: bool) -> Sqe {
    let f = if fua { RwFlags::FUA } else { RwFlags::NONE };
    Sqe::rw(opc, 1, slba, nlb).with_rw_flags(f)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| seed ^ (i * 13 % 251) as u8).collect()
}

fn one(buf: &mut [u8]) -> Vec<RawSeg> {
    vec![RawSeg {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    }]
}

/// `buf` as two segments, the first `cut` bytes long (not whole blocks:
/// the command goes through the bounce buffer).
fn two(buf: &mut [u8], cut: usize) -> Vec<RawSeg> {
    let n = buf.len();
    let p = buf.as_mut_ptr();
    vec![
        RawSeg { ptr: p, len: cut },
        RawSeg {
            // SAFETY: within `buf`.
            ptr: unsafe { p.add(cut) },
            len: n - cut,
        },
    ]
}

/// Runs `sqe` synchronously on `segs`.
fn exec(q: &mut IoQueue, sqe: &Sqe, segs: &[RawSeg]) -> Status {
    let cmd = q.check(sqe).unwrap();
    // SAFETY: the segments' memory is the caller's, untouched meanwhile.
    unsafe { q.exec(&cmd, segs) }
}

/// Submits `sqe` on `segs` and polls until it is delivered.
fn submit(q: &mut IoQueue, tag: u32, sqe: &Sqe, segs: &[RawSeg]) -> Status {
    let cmd = q.check(sqe).unwrap();
    // SAFETY: the segments stay valid and untouched until delivered below.
    unsafe { q.submit(tag, &cmd, segs) }.unwrap();
    let mut got = None;
    while got.is_none() {
        q.poll(&mut |t, st| {
            assert_eq!(t, tag);
            got = Some(st);
        });
    }
    got.unwrap()
}

#[test]
fn check_reads_the_fua_bit() {
    let c = controller(cached());
    let q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    for opc in [NvmOpcode::Write, NvmOpcode::Read] {
        let cmd = q.check(&rw(opc, 8, 16, true)).unwrap();
        assert_eq!(cmd.flags, RwFlags::FUA);
        assert_eq!((cmd.slba, cmd.nlb, cmd.xfer_len), (8, 16, 16 * 512));
        assert_eq!(
            q.check(&rw(opc, 8, 16, false)).unwrap().flags,
            RwFlags::NONE
        );
        // Limited Retry (bit 31) is not FUA.
        let mut s = Sqe::rw(opc, 1, 8, 16);
        s.cdw12 |= 1 << 31;
        assert_eq!(q.check(&s).unwrap().flags, RwFlags::NONE);
    }
}

#[test]
fn synchronous_fua_write_is_durable_at_completion() {
    let bdev = cached();
    let c = controller(bdev.clone());
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let mut a = pattern(4096, 1);
    let mut b = pattern(4096, 2);
    let mut odd = pattern(8192, 3);
    let mut plain = pattern(4096, 4);
    let ok = Status::SUCCESS;
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 0, 8, true), &one(&mut a)),
        ok
    );
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 8, 8, true),
            &two(&mut b, 4000)
        ),
        ok
    );
    // Through the bounce buffer in several requests: larger than it.
    let mut big = pattern(96 << 10, 5);
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 100, 192, true),
            &two(&mut big, 700)
        ),
        ok
    );
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 16, 16, true),
            &two(&mut odd, 512)
        ),
        ok
    );
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 40, 8, false),
            &one(&mut plain)
        ),
        ok
    );
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(8),
        "only the plain write is lost"
    );
    let mut r = vec![0u8; 4096];
    for (lba, want) in [(0, &a), (8, &b)] {
        assert_eq!(
            exec(&mut q, &rw(NvmOpcode::Read, lba, 8, false), &one(&mut r)),
            ok
        );
        assert_eq!(&r, want);
    }
    let mut r = vec![0u8; 96 << 10];
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Read, 100, 192, false), &one(&mut r)),
        ok
    );
    assert_eq!(r, big);
    let mut r = vec![0u8; 8192];
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Read, 16, 16, false), &one(&mut r)),
        ok
    );
    assert_eq!(r, odd);
    let mut r = vec![1u8; 4096];
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Read, 40, 8, false), &one(&mut r)),
        ok
    );
    assert!(r.iter().all(|&x| x == 0));
    // A FUA read commits the cached writes of its blocks.
    let mut w = pattern(4096, 6);
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 50, 8, false), &one(&mut w)),
        ok
    );
    let mut r = vec![0u8; 4096];
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Read, 50, 8, true), &one(&mut r)),
        ok
    );
    assert_eq!(r, w);
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
}

#[test]
fn asynchronous_fua_write_is_durable_when_delivered() {
    let bdev = cached();
    let c = controller(bdev.clone());
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    let ok = Status::SUCCESS;
    let mut a = pattern(4096, 1);
    let mut odd = pattern(8192, 2);
    let mut plain = pattern(4096, 3);
    assert_eq!(
        submit(&mut q, 1, &rw(NvmOpcode::Write, 0, 8, true), &one(&mut a)),
        ok
    );
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "durable when delivered"
    );
    assert_eq!(
        submit(
            &mut q,
            2,
            &rw(NvmOpcode::Write, 8, 16, true),
            &two(&mut odd, 100)
        ),
        ok
    );
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "bounced: durable when delivered"
    );
    assert_eq!(
        submit(
            &mut q,
            3,
            &rw(NvmOpcode::Write, 40, 8, false),
            &one(&mut plain)
        ),
        ok
    );
    assert_eq!(bdev.lose_volatile_cache(), Some(8), "a plain write is not");
    let mut r = vec![0u8; 4096];
    assert_eq!(
        submit(&mut q, 4, &rw(NvmOpcode::Read, 0, 8, false), &one(&mut r)),
        ok
    );
    assert_eq!(r, a);
    let mut r = vec![0u8; 8192];
    assert_eq!(
        submit(&mut q, 5, &rw(NvmOpcode::Read, 8, 16, false), &one(&mut r)),
        ok
    );
    assert_eq!(r, odd);
    // A FUA read, asynchronously.
    let mut w = pattern(4096, 7);
    assert_eq!(
        submit(&mut q, 6, &rw(NvmOpcode::Write, 60, 8, false), &one(&mut w)),
        ok
    );
    let mut r = vec![0u8; 4096];
    assert_eq!(
        submit(&mut q, 7, &rw(NvmOpcode::Read, 60, 8, true), &one(&mut r)),
        ok
    );
    assert_eq!(r, w);
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
}

// ---------------------------------------------------------------------
// Write Zeroes.

fn wz(slba: u64, nlb: u32, dealloc: bool) -> Sqe {
    Sqe::write_zeroes(1, slba, nlb, dealloc)
}

/// Reads `len` bytes at `slba` synchronously.
fn read_back(q: &mut IoQueue, slba: u64, len: usize) -> Vec<u8> {
    let mut r = vec![0xEEu8; len];
    let st = exec(
        q,
        &rw(NvmOpcode::Read, slba, (len / 512) as u32, false),
        &one(&mut r),
    );
    assert!(st.is_success(), "read at {slba}: {st}");
    r
}

#[test]
fn write_zeroes_honours_its_fua_bit() {
    let bdev = cached();
    let c = controller(bdev.clone());
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let mut qa = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    let ok = Status::SUCCESS;
    let mut base = pattern(8192, 9);
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 300, 16, true),
            &one(&mut base)
        ),
        ok
    );
    let fua = |s: Sqe| s.with_rw_flags(RwFlags::FUA);
    assert_eq!(exec(&mut q, &fua(wz(300, 4, false)), &[]), ok);
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
    assert_eq!(submit(&mut qa, 1, &fua(wz(304, 4, true)), &[]), ok);
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
    // Without FUA, it is cached (the test can tell).
    assert_eq!(exec(&mut q, &wz(308, 4, false), &[]), ok);
    assert_eq!(bdev.lose_volatile_cache(), Some(4));
    let got = read_back(&mut q, 300, 8192);
    assert!(got[..4096].iter().all(|&x| x == 0));
    assert_eq!(got[4096..], base[4096..]);
    assert_eq!(
        q.check(&fua(wz(300, 4, false))).unwrap().flags,
        RwFlags::FUA
    );
    assert_eq!(q.check(&wz(300, 4, false)).unwrap().flags, RwFlags::NONE);
}
