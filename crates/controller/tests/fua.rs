//! Force Unit Access in the NVM command set (the emulator's and the
//! target's): a Write with CDW12 bit 30 completes only once its data is
//! durable, a Read with it commits cached writes of its blocks first, on
//! the synchronous path (the emulator's), the asynchronous one (the
//! target's), and through the bounce buffer (segments not of whole
//! blocks), and so is a Write Zeroes with it. While the volatile write
//! cache is disabled (Set Features Volatile Write Cache, WCE = 0), every
//! Write and Write Zeroes is. The namespace is a RAM disk with a simulated
//! volatile write cache, so "durable" is "survives `lose_volatile_cache`".
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions, Limits,
    Namespace, Personality, Subsystem,
};
use pollux_spec::cmd::RwFlags;
use pollux_spec::features::{fid, get_features_cdw10, sel, set_features_cdw10};
use pollux_spec::status::specific;
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

// ---------------------------------------------------------------------
// Volatile Write Cache Enable.

fn admin(c: &mut Controller, sqe: Sqe) -> (Status, u32) {
    match c.exec_admin(&sqe, AdminEnv::default()) {
        AdminOutcome::Complete { dw0, status } => (status, dw0),
        o => panic!("unexpected admin outcome {o:?}"),
    }
}

fn set_wce(c: &mut Controller, wce: bool) {
    let sqe = Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0, wce as u32);
    let (st, _) = admin(c, sqe);
    assert!(st.is_success(), "Set Features VWC: {st}");
}

/// Get Features Volatile Write Cache with `sel`: DW0.
fn get_wce(c: &mut Controller, s: u8) -> u32 {
    let mut sqe = Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0);
    sqe.cdw10 = get_features_cdw10(fid::VOLATILE_WRITE_CACHE, s);
    let (st, dw0) = admin(c, sqe);
    assert!(st.is_success(), "Get Features VWC: {st}");
    dw0
}

#[test]
fn write_cache_disabled_makes_every_write_durable_at_completion() {
    let bdev = cached();
    let mut c = controller(bdev.clone());
    // Queues made before the switch: they see it.
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let mut qa = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    let ok = Status::SUCCESS;
    assert_eq!(get_wce(&mut c, sel::CURRENT), 1, "enabled by default");

    // WCE = 1: plain writes and write zeroes are lost (the test can tell).
    let mut a = pattern(4096, 1);
    let mut b = pattern(4096, 2);
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 0, 8, false), &one(&mut a)),
        ok
    );
    assert_eq!(
        submit(&mut qa, 1, &rw(NvmOpcode::Write, 8, 8, false), &one(&mut b)),
        ok
    );
    assert_eq!(bdev.lose_volatile_cache(), Some(16));
    let mut base = pattern(16384, 3);
    assert_eq!(
        exec(
            &mut q,
            &rw(NvmOpcode::Write, 200, 32, true),
            &one(&mut base)
        ),
        ok
    );
    assert_eq!(exec(&mut q, &wz(200, 8, false), &[]), ok);
    assert_eq!(submit(&mut qa, 2, &wz(208, 8, true), &[]), ok);
    assert_eq!(bdev.lose_volatile_cache(), Some(16));
    assert_eq!(read_back(&mut q, 200, 16384), base, "zeroes lost");

    // WCE = 0.
    set_wce(&mut c, false);
    assert_eq!(get_wce(&mut c, sel::CURRENT), 0);
    // Not saveable: "saved" is the default.
    assert_eq!(get_wce(&mut c, sel::SAVED), 1);
    let mut save = Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0, 0);
    save.cdw10 = set_features_cdw10(fid::VOLATILE_WRITE_CACHE, true);
    assert_eq!(
        admin(&mut c, save).0,
        Status::specific(specific::FEATURE_NOT_SAVEABLE)
    );
    // Plain writes: synchronous, bounced, asynchronous, asynchronous
    // bounced (every path of `store` and `io`).
    let mut w = [
        pattern(4096, 4),
        pattern(8192, 5),
        pattern(4096, 6),
        pattern(8192, 7),
    ];
    let [w0, w1, w2, w3] = &mut w;
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 0, 8, false), &one(w0)),
        ok
    );
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 16, 16, false), &two(w1, 1000)),
        ok
    );
    assert_eq!(
        submit(&mut qa, 3, &rw(NvmOpcode::Write, 40, 8, false), &one(w2)),
        ok
    );
    assert_eq!(
        submit(
            &mut qa,
            4,
            &rw(NvmOpcode::Write, 56, 16, false),
            &two(w3, 100)
        ),
        ok
    );
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "a completed write was lost"
    );
    for (lba, d) in [(0u64, &w[0]), (16, &w[1]), (40, &w[2]), (56, &w[3])] {
        assert_eq!(&read_back(&mut q, lba, d.len()), d, "LBA {lba}");
    }
    // Write zeroes, synchronous and asynchronous, deallocating or not.
    assert_eq!(exec(&mut q, &wz(200, 4, false), &[]), ok);
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "synchronous write zeroes lost"
    );
    assert_eq!(submit(&mut qa, 5, &wz(208, 4, false), &[]), ok);
    assert_eq!(bdev.lose_volatile_cache(), Some(0), "write zeroes lost");
    assert_eq!(submit(&mut qa, 6, &wz(216, 4, true), &[]), ok);
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "deallocating write zeroes lost"
    );
    let got = read_back(&mut q, 200, 16384);
    for (i, blk) in got.chunks(512).enumerate() {
        let zero = matches!(i, 0..4 | 8..12 | 16..20);
        let want = if zero {
            vec![0; 512]
        } else {
            base[i * 512..][..512].to_vec()
        };
        assert_eq!(blk, want.as_slice(), "block {}", 200 + i);
    }

    // The queues made every write FUA, no read.
    assert_eq!(
        q.check(&rw(NvmOpcode::Write, 0, 8, false)).unwrap().flags,
        RwFlags::FUA
    );
    assert_eq!(qa.check(&wz(0, 8, false)).unwrap().flags, RwFlags::FUA);
    assert_eq!(
        q.check(&rw(NvmOpcode::Read, 0, 8, false)).unwrap().flags,
        RwFlags::NONE
    );

    // WCE = 1 again: plain writes are cached again.
    set_wce(&mut c, true);
    assert_eq!(get_wce(&mut c, sel::CURRENT), 1);
    let mut p = pattern(4096, 8);
    assert_eq!(
        submit(
            &mut qa,
            7,
            &rw(NvmOpcode::Write, 80, 8, false),
            &one(&mut p)
        ),
        ok
    );
    assert_eq!(bdev.lose_volatile_cache(), Some(8));

    // A controller reset enables the cache (its default).
    set_wce(&mut c, false);
    drop((q, qa));
    c.reset();
    assert_eq!(get_wce(&mut c, sel::CURRENT), 1, "reset to the default");
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    assert_eq!(
        exec(&mut q, &rw(NvmOpcode::Write, 80, 8, false), &one(&mut p)),
        ok
    );
    assert_eq!(bdev.lose_volatile_cache(), Some(8));
}
