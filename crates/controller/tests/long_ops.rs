//! Commands whose work grows with what the host asks for — Dataset
//! Management over a whole namespace, Write Zeroes larger than one
//! request of the namespace, Flush of every namespace — on an
//! asynchronous queue: they go out a bounded piece at a time, one per
//! poll (never run to completion within `submit` or one `poll`), complete
//! once with the right status, and a failure is reported once with the
//! command's CID.
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions, Limits,
    Namespace, Personality, Subsystem,
};
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::log::{lid, ErrorLogEntry};
use pollux_spec::status::{generic, media};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::{FromBytes, IntoBytes};

/// Bytes a RAM namespace zeroes per request (`store::RAM_ZERO_PIECE`).
const PIECE: u64 = 16 << 20;

/// Namespace 1: 64 MiB of 512 B blocks (4 pieces); namespace 2: 256 MiB
/// of 4 KiB blocks (the largest Write Zeroes, 16 pieces).
fn controller() -> (Arc<Subsystem>, Controller) {
    let ns = vec![
        Namespace::new(Bdev::ram("r0", 512, (64 << 20) / 512).unwrap(), 0).unwrap(),
        Namespace::new(Bdev::ram("r1", 4096, 65536).unwrap(), 0).unwrap(),
    ];
    let sub = Subsystem::new(
        Identity {
            serial: "LONG0001".into(),
            model: "pollux long operations test".into(),
            firmware: "1.0".into(),
            vid: 0,
            ssvid: 0,
            ieee: [0; 3],
            subnqn: "nqn.2024-01.io.pollux:long".into(),
        },
        Limits {
            mqes: 127,
            max_io_queues: 8,
            mdts: 5,
            abort_limit: 3,
            aer_limit: 1,
            cap_to: 20,
        },
        Personality::Fabrics(FabricsTraits {
            in_capsule_data: 8192,
            kas: 0,
        }),
        ns,
    )
    .unwrap();
    let c = Controller::new(sub.clone(), 1);
    (sub, c)
}

fn seg(buf: &mut [u8]) -> [RawSeg; 1] {
    [RawSeg {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    }]
}

/// Runs `sqe` on `data` asynchronously (tag 7); returns its status and
/// how many polls it took to come out.
fn run(q: &mut IoQueue, sqe: &Sqe, data: &mut [u8]) -> (Status, usize) {
    let cmd = q.check_reported(sqe).unwrap();
    assert!(cmd.xfer_len <= data.len());
    let s = seg(&mut data[..cmd.xfer_len]);
    let segs: &[RawSeg] = if cmd.xfer_len == 0 { &[] } else { &s };
    // SAFETY: `data` is untouched until the command is polled back below.
    unsafe { q.submit(7, &cmd, segs) }.unwrap();
    let mut got = Vec::new();
    let mut polls = 0;
    while got.is_empty() {
        polls += 1;
        assert!(polls < 10_000, "command never completed");
        q.poll(&mut |t, st| got.push((t, st)));
    }
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, 7);
    assert_eq!(q.outstanding(), 0);
    (got[0].1, polls)
}

/// Writes `fill` over `nlb` blocks of `nsid` at `slba` (512 B blocks on
/// namespace 1, 4 KiB on 2), synchronously.
fn fill(q: &mut IoQueue, nsid: u32, slba: u64, nlb: u32, fill: u8) {
    let bs = if nsid == 1 { 512 } else { 4096 };
    let mut b = vec![fill; nlb as usize * bs];
    let cmd = q
        .check(&Sqe::rw(NvmOpcode::Write, nsid, slba, nlb))
        .unwrap();
    let s = seg(&mut b);
    // SAFETY: `b` is ours for the call.
    assert!(unsafe { q.exec(&cmd, &s) }.is_success());
}

fn read(q: &mut IoQueue, nsid: u32, slba: u64, nlb: u32) -> Vec<u8> {
    let bs = if nsid == 1 { 512 } else { 4096 };
    let mut b = vec![0xEE; nlb as usize * bs];
    let cmd = q.check(&Sqe::rw(NvmOpcode::Read, nsid, slba, nlb)).unwrap();
    let s = seg(&mut b);
    // SAFETY: as above.
    assert!(unsafe { q.exec(&cmd, &s) }.is_success());
    b
}

fn dsm_data(ranges: &[(u64, u32)]) -> Vec<u8> {
    let mut d = Vec::new();
    for &(slba, nlb) in ranges {
        d.extend_from_slice(
            DsmRange {
                cattr: 0,
                nlb,
                slba,
            }
            .as_bytes(),
        );
    }
    d
}

fn error_log(c: &mut Controller) -> Vec<ErrorLogEntry> {
    let sqe = Sqe::get_log_page(lid::ERROR, 0, 64 * 64, 0, 0, 0);
    let AdminOutcome::Data { data, then, .. } = c.exec_admin(&sqe, AdminEnv::default()) else {
        panic!("no error log");
    };
    c.data_sent(then);
    data.chunks_exact(64)
        .map(|e| ErrorLogEntry::read_from_bytes(e).unwrap())
        .take_while(|e| e.error_count != 0)
        .collect()
}

#[test]
fn whole_namespace_deallocate_goes_a_piece_per_poll() {
    let (_sub, c) = controller();
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    let blocks = (64 << 20) / 512u64;
    let pieces = ((64 << 20) / PIECE) as usize;
    for slba in [0, blocks / 2 - 1, blocks - 8] {
        fill(&mut q, 1, slba, 8, 0xA5);
    }
    // One range over the whole namespace.
    let mut d = dsm_data(&[(0, blocks as u32)]);
    let (st, polls) = run(&mut q, &Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, 0), &mut d);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(polls, pieces, "one piece per poll");
    for slba in [0, blocks / 2 - 1, blocks - 8] {
        assert!(
            read(&mut q, 1, slba, 8).iter().all(|&b| b == 0),
            "LBA {slba}"
        );
    }
    // Many ranges, some empty, one larger than a piece: one request per
    // poll, in order; blocks outside them keep their data.
    fill(&mut q, 1, 0, 64, 0x11);
    fill(&mut q, 1, 40_000, 8, 0x22);
    let ranges = [(0u64, 8u32), (16, 0), (32, 8), (100, 40_000)];
    let mut d = dsm_data(&ranges);
    let (st, polls) = run(&mut q, &Sqe::dsm(1, 4, DSM_ATTR_DEALLOCATE, 0), &mut d);
    assert_eq!(st, Status::SUCCESS);
    assert_eq!(
        polls,
        2 + 2,
        "two small ranges, then 40000 blocks in two pieces"
    );
    let back = read(&mut q, 1, 0, 64);
    for (blk, chunk) in back.chunks(512).enumerate() {
        let zero = blk < 8 || (32..40).contains(&blk);
        assert!(
            chunk.iter().all(|&b| b == if zero { 0 } else { 0x11 }),
            "block {blk}"
        );
    }
    assert!(read(&mut q, 1, 40_000, 8).iter().all(|&b| b == 0));
    // Hints only (no AD): nothing deallocated, done at the first poll.
    fill(&mut q, 1, 0, 8, 0x33);
    let mut d = dsm_data(&[(0, blocks as u32)]);
    assert_eq!(
        run(&mut q, &Sqe::dsm(1, 1, 0, 0), &mut d),
        (Status::SUCCESS, 1)
    );
    assert!(read(&mut q, 1, 0, 8).iter().all(|&b| b == 0x33));
    // A range past the end: LBA Out of Range, nothing touched.
    let mut d = dsm_data(&[(0, 8), (blocks - 4, 8)]);
    let (st, _) = run(&mut q, &Sqe::dsm(1, 2, DSM_ATTR_DEALLOCATE, 0), &mut d);
    assert_eq!(st, Status::generic(generic::LBA_OUT_OF_RANGE));
    assert!(read(&mut q, 1, 0, 8).iter().all(|&b| b == 0x33));
}

#[test]
fn large_write_zeroes_and_flush_of_every_namespace() {
    let (_sub, c) = controller();
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    // The largest Write Zeroes on 4 KiB blocks: 256 MiB, 16 pieces.
    for slba in [0, 30_000, 65_535] {
        fill(&mut q, 2, slba, 1, 0x5A);
    }
    for dealloc in [false, true] {
        let (st, polls) = run(&mut q, &Sqe::write_zeroes(2, 0, 65536, dealloc), &mut []);
        assert_eq!(st, Status::SUCCESS);
        assert_eq!(polls, (256 << 20) / PIECE as usize);
        for slba in [0, 30_000, 65_535] {
            assert!(read(&mut q, 2, slba, 1).iter().all(|&b| b == 0));
        }
    }
    // One piece or less: one request, as before.
    assert_eq!(
        run(&mut q, &Sqe::write_zeroes(2, 0, 4096, false), &mut []),
        (Status::SUCCESS, 1)
    );
    // Flush of every namespace: both flushed at once.
    assert_eq!(
        run(&mut q, &Sqe::flush(0xFFFF_FFFF), &mut []),
        (Status::SUCCESS, 1)
    );
}

#[test]
fn a_failing_piece_fails_the_command_once() {
    let (sub, mut c) = controller();
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 8 }).unwrap();
    q.report_errors(2);
    let blocks = (64 << 20) / 512u64;
    let mut d = dsm_data(&[(0, blocks as u32)]);
    let mut sqe = Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, 0);
    sqe.cid = 0x77;
    let cmd = q.check_reported(&sqe).unwrap();
    let s = seg(&mut d);
    // SAFETY: `d` is untouched until polled back below.
    unsafe { q.submit(3, &cmd, &s) }.unwrap();
    let mut got = Vec::new();
    q.poll(&mut |t, st| got.push((t, st)));
    assert!(got.is_empty(), "the first piece done, the second out");
    assert!(sub.namespace(1).unwrap().bdev().inject_failure());
    for _ in 0..100 {
        q.poll(&mut |t, st| got.push((t, st)));
        if q.outstanding() == 0 {
            break;
        }
    }
    assert_eq!(got, [(3, Status::generic(generic::INTERNAL_ERROR))]);
    let log = error_log(&mut c);
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!((log[0].sqid, log[0].cid, log[0].nsid), (2, 0x77, 1));
    // Write Zeroes and Flush fail with Write Fault.
    let wf = Status::media(media::WRITE_FAULT);
    let (st, _) = run(&mut q, &Sqe::write_zeroes(1, 0, 65536, false), &mut []);
    assert_eq!(st, wf);
    let (st, _) = run(&mut q, &Sqe::flush(0xFFFF_FFFF), &mut []);
    assert_eq!(st, wf);
}

/// The same commands through `exec` (the emulator's synchronous queue,
/// depth 0): one call runs them to completion, with the same statuses.
#[test]
fn synchronous_long_commands_complete_within_exec() {
    let (sub, c) = controller();
    let mut q = IoQueue::for_controller(&c, IoQueueOptions { depth: 0 }).unwrap();
    let exec = |q: &mut IoQueue, sqe: &Sqe, data: &mut [u8]| {
        let cmd = q.check(sqe).unwrap();
        let s = seg(&mut data[..cmd.xfer_len]);
        let segs: &[RawSeg] = if cmd.xfer_len == 0 { &[] } else { &s };
        // SAFETY: `data` is ours for the call.
        unsafe { q.exec(&cmd, segs) }
    };
    let blocks = (64 << 20) / 512u64;
    for slba in [0, blocks - 8] {
        fill(&mut q, 1, slba, 8, 0xA5);
    }
    let mut d = dsm_data(&[(0, blocks as u32)]);
    let dsm = Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, 0);
    assert_eq!(exec(&mut q, &dsm, &mut d), Status::SUCCESS);
    for slba in [0, blocks - 8] {
        assert!(read(&mut q, 1, slba, 8).iter().all(|&b| b == 0));
    }
    let mut d = dsm_data(&[(0, 8), (blocks - 4, 8)]);
    assert_eq!(
        exec(&mut q, &Sqe::dsm(1, 2, DSM_ATTR_DEALLOCATE, 0), &mut d),
        Status::generic(generic::LBA_OUT_OF_RANGE)
    );
    for slba in [0, 30_000, 65_535] {
        fill(&mut q, 2, slba, 1, 0x5A);
    }
    let mut wz = Sqe::write_zeroes(2, 0, 65536, false);
    wz.cdw12 |= 1 << 30; // FUA: a flush follows the pieces
    assert_eq!(exec(&mut q, &wz, &mut []), Status::SUCCESS);
    for slba in [0, 30_000, 65_535] {
        assert!(read(&mut q, 2, slba, 1).iter().all(|&b| b == 0));
    }
    let all = Sqe::flush(0xFFFF_FFFF);
    assert_eq!(exec(&mut q, &all, &mut []), Status::SUCCESS);
    assert_eq!(q.outstanding(), 0);
    assert_eq!(q.bdev_requests(), 0);
    // A failed namespace: each fails with its kind's status.
    assert!(sub.namespace(1).unwrap().bdev().inject_failure());
    let mut d = dsm_data(&[(0, blocks as u32)]);
    assert_eq!(
        exec(&mut q, &dsm, &mut d),
        Status::generic(generic::INTERNAL_ERROR)
    );
    let wf = Status::media(media::WRITE_FAULT);
    let wz = Sqe::write_zeroes(1, 0, 65536, false);
    assert_eq!(exec(&mut q, &wz, &mut []), wf);
    assert_eq!(exec(&mut q, &all, &mut []), wf);
    assert_eq!(exec(&mut q, &Sqe::flush(2), &mut []), Status::SUCCESS);
}
