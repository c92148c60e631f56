//! NVMe namespaces (a `Bdev` over the emulated controller on its
//! device thread) served by the controller model's asynchronous I/O
//! queue: many commands in flight at once through the queue's DMA
//! staging pool, data verified both ways at several sizes (one piece,
//! several pieces, more than the pool holds at once), odd segment lists,
//! and failures of the backend (every command delivered once, with the
//! right status).
use std::collections::BTreeMap;
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions, Limits,
    Namespace, Personality, Subsystem,
};
use pollux_pcie::{ControllerOptions, QpairOptions};
use pollux_softnvme::{
    BackendConfig, DeviceThread, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig,
    SoftDevice,
};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::log::{lid, ErrorLogEntry, SmartLog};
use pollux_spec::status::{media, sct};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

/// Namespace size.
const NS_BYTES: u64 = 32 << 20;

/// The model's controller over one namespace of an emulated controller.
/// Fields drop in order: the model (its queues first, in the tests), the
/// driver's controller, then the device and the thread that steps it.
struct Rig {
    ctrl: Controller,
    dev: Arc<SoftDevice>,
    _thread: DeviceThread,
}

/// `lbads`: the namespace's LBA size (log2); `mdts`: the model's MDTS
/// (largest transfer `4 KiB << mdts`).
fn rig(lbads: u8, mdts: u8) -> Rig {
    let thread = DeviceThread::spawn(None).expect("device thread");
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: lbads,
            size_bytes: NS_BYTES,
        }],
        ..SoftConfig::default()
    })
    .expect("emulated controller");
    thread.attach(dev.clone());
    let nvme = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Threaded)),
        ControllerOptions::default(),
    )
    .expect("bring-up");
    let bdev = Bdev::nvme("Nvme0n1", Arc::new(nvme.into()), 1, QpairOptions::default()).unwrap();
    let subsys = Subsystem::new(
        Identity {
            serial: "NVME0001".into(),
            model: "pollux nvme namespace test".into(),
            firmware: "1.0".into(),
            vid: 0,
            ssvid: 0,
            ieee: [0; 3],
            subnqn: "nqn.2024-01.io.pollux:nvme".into(),
        },
        Limits {
            mqes: 127,
            max_io_queues: 4,
            mdts,
            abort_limit: 3,
            aer_limit: 3,
            cap_to: 15,
        },
        Personality::Fabrics(FabricsTraits {
            in_capsule_data: 4096,
            kas: 0,
        }),
        vec![Namespace::new(bdev, 0).unwrap()],
    )
    .unwrap();
    Rig {
        ctrl: Controller::new(subsys, 1),
        dev,
        _thread: thread,
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13 ^ seed.wrapping_mul(97)) as u8)
        .collect()
}

/// A command's data: one buffer, lent as `cuts` segments (lengths; the
/// last takes the rest).
struct Cmd {
    tag: u32,
    sqe: Sqe,
    buf: Vec<u8>,
    cuts: Vec<usize>,
}

impl Cmd {
    fn new(tag: u32, opc: NvmOpcode, slba: u64, nlb: u32, buf: Vec<u8>) -> Cmd {
        let mut sqe = Sqe::rw(opc, 1, slba, nlb);
        sqe.cid = 0x1000 + tag as u16;
        Cmd {
            tag,
            sqe,
            buf,
            cuts: Vec::new(),
        }
    }

    fn cut(mut self, cuts: &[usize]) -> Cmd {
        self.cuts = cuts.to_vec();
        self
    }

    fn segs(&mut self) -> Vec<RawSeg> {
        let mut out = Vec::new();
        let mut at = 0;
        let base = self.buf.as_mut_ptr();
        for &c in &self.cuts {
            // SAFETY: within `buf` (the cuts are shorter than it).
            let ptr = unsafe { base.add(at) };
            out.push(RawSeg { ptr, len: c });
            at += c;
        }
        // SAFETY: as above.
        let ptr = unsafe { base.add(at) };
        out.push(RawSeg {
            ptr,
            len: self.buf.len() - at,
        });
        out
    }
}

/// Submits every command before polling any, checks that the bdev holds
/// several at once when `concurrent`, then polls until each is delivered
/// (exactly once); returns the statuses by tag.
fn run(q: &mut IoQueue, cmds: &mut [Cmd], concurrent: bool) -> BTreeMap<u32, Status> {
    for c in cmds.iter_mut() {
        let cmd = q.check_reported(&c.sqe).expect("valid command");
        assert_eq!(cmd.xfer_len, c.buf.len());
        let segs = c.segs();
        // SAFETY: every buffer lives, untouched, until all are delivered
        // below (the segment list itself may go: the queue copies it).
        unsafe { q.submit(c.tag, &cmd, &segs) }.expect("room in the queue");
    }
    assert_eq!(q.outstanding() as usize, cmds.len());
    if concurrent {
        // Submission returned with the requests still in the bdev: they
        // run concurrently (the synchronous path held one at a time).
        assert!(
            q.bdev_requests() > 1,
            "{} bdev requests in flight after submitting {} commands",
            q.bdev_requests(),
            cmds.len()
        );
    }
    let mut got = BTreeMap::new();
    while q.outstanding() > 0 {
        q.poll(&mut |tag, st| {
            assert!(got.insert(tag, st).is_none(), "tag {tag} delivered twice");
        });
    }
    assert_eq!(got.len(), cmds.len(), "every command delivered");
    assert_eq!(q.bdev_requests(), 0);
    got
}

#[track_caller]
fn all_ok(got: &BTreeMap<u32, Status>) {
    for (tag, st) in got {
        assert!(st.is_success(), "tag {tag}: {st}");
    }
}

/// Host segments a command may have to be staged (more: it runs
/// synchronously, within `submit`).
const STAGED_SEGS: usize = 4;

/// Writes `n` commands of `len` bytes (cut as `cuts`) at once, reads them
/// back at once into other buffers (cut the same way) and compares.
fn write_read(q: &mut IoQueue, lbads: u8, len: usize, n: u32, cuts: &[usize], seed: u32) {
    let concurrent = n > 1 && cuts.len() < STAGED_SEGS;
    let nlb = (len >> lbads) as u32;
    let lba = |i: u32| (i * nlb) as u64 + 7;
    let mut w: Vec<Cmd> = (0..n)
        .map(|i| Cmd::new(i, NvmOpcode::Write, lba(i), nlb, pattern(len, seed + i)).cut(cuts))
        .collect();
    all_ok(&run(q, &mut w, concurrent));
    let mut r: Vec<Cmd> = (0..n)
        .map(|i| Cmd::new(1000 + i, NvmOpcode::Read, lba(i), nlb, vec![0xEE; len]).cut(cuts))
        .collect();
    all_ok(&run(q, &mut r, concurrent));
    for (a, b) in w.iter().zip(&r) {
        assert!(
            a.buf == b.buf,
            "{len} bytes at LBA {}: read differs from what was written",
            a.sqe.slba()
        );
    }
    let s = q.stats();
    assert!(s.reads >= n as u64 && s.writes >= n as u64, "{s:?}");
}

#[test]
fn many_4k_commands_at_once_both_ways() {
    for lbads in [9u8, 12] {
        let r = rig(lbads, 5);
        let mut q = IoQueue::for_controller(&r.ctrl, IoQueueOptions { depth: 128 }).unwrap();
        write_read(&mut q, lbads, 4096, 128, &[], lbads as u32);
        let s = q.stats();
        assert_eq!((s.reads, s.writes), (128, 128));
        assert_eq!((s.bytes_read, s.bytes_written), (128 * 4096, 128 * 4096));
    }
}

#[test]
fn large_transfers_several_pieces_and_more_than_the_pool() {
    for lbads in [9u8, 12] {
        // MDTS 8: 1 MiB transfers; pieces are 128 KiB at most.
        let r = rig(lbads, 8);
        let mut q = IoQueue::for_controller(&r.ctrl, IoQueueOptions { depth: 32 }).unwrap();
        // One piece each, as long as 128 KiB pieces last (8 of them).
        write_read(&mut q, lbads, 128 << 10, 8, &[], 1);
        assert_eq!(q.staged_waits(), 0);
        // Several pieces per command (128 + 8 + 4 KiB), 32 at once: more
        // than the pool holds (about 4 MiB), so some wait for pieces.
        write_read(&mut q, lbads, 140 << 10, 32, &[], 2);
        assert!(q.staged_waits() > 0, "the pool covered 32 x 140 KiB");
        // Larger than one piece: 1 MiB (eight 128 KiB pieces), 8 at once.
        write_read(&mut q, lbads, 1 << 20, 8, &[], 3);
        // A single odd-sized one.
        write_read(&mut q, lbads, (1 << 20) - (4 << 10), 1, &[], 4);
    }
}

#[test]
fn odd_segment_lists() {
    let lbads = 9;
    let r = rig(lbads, 8);
    let mut q = IoQueue::for_controller(&r.ctrl, IoQueueOptions { depth: 16 }).unwrap();
    // Segments that are not whole blocks, across piece boundaries.
    write_read(&mut q, lbads, 8192, 16, &[100, 4000, 3], 5);
    write_read(&mut q, lbads, 140 << 10, 16, &[1, 70 << 10, 511], 6);
    // More segments than a staged command keeps: run synchronously
    // (while others are in flight), same data.
    let cuts: Vec<usize> = (1..12).map(|i| i * 97).collect();
    write_read(&mut q, lbads, 16 << 10, 8, &cuts, 7);
    // A mix in one batch: staged and synchronous side by side.
    let mut w = vec![
        Cmd::new(1, NvmOpcode::Write, 4000, 8, pattern(4096, 11)).cut(&[7]),
        Cmd::new(2, NvmOpcode::Write, 4008, 8, pattern(4096, 12)).cut(&cuts[..6]),
        Cmd::new(3, NvmOpcode::Write, 4016, 280, pattern(140 << 10, 13)),
    ];
    all_ok(&run(&mut q, &mut w, false));
    let mut rd = vec![
        Cmd::new(4, NvmOpcode::Read, 4000, 8, vec![0; 4096]).cut(&cuts[..6]),
        Cmd::new(5, NvmOpcode::Read, 4008, 8, vec![0; 4096]),
        Cmd::new(6, NvmOpcode::Read, 4016, 280, vec![0; 140 << 10]).cut(&[3, 5]),
    ];
    all_ok(&run(&mut q, &mut rd, false));
    for (a, b) in w.iter().zip(&rd) {
        assert!(a.buf == b.buf, "tag {} differs", a.tag);
    }
}

fn fault(lba: Option<std::ops::Range<u64>>, opcode: NvmOpcode, sc: u8) -> FaultRule {
    let mut f = FaultRule::new(QueueSel::Io, FaultAction::Status(Status::media(sc)));
    f.lba = lba;
    f.opcode = Some(opcode as u8);
    f
}

#[test]
fn failing_backend_fails_each_command_once() {
    let lbads = 9;
    let r = rig(lbads, 8);
    let mut q = IoQueue::for_controller(&r.ctrl, IoQueueOptions { depth: 32 }).unwrap();
    q.report_errors(5);
    // Reads of blocks 2000..2001 fail in the device: a command with a
    // piece there fails as a whole; the others succeed.
    r.dev.add_fault(fault(
        Some(2000..2001),
        NvmOpcode::Read,
        media::UNRECOVERED_READ_ERROR,
    ));
    // 32 commands of 140 KiB (280 blocks: pieces of 256, 16 and 8) from
    // block 0: command 7 (1960..2240) holds block 2000 in its first piece.
    let nlb = 280u32;
    let mut rd: Vec<Cmd> = (0..32)
        .map(|i| {
            Cmd::new(
                i,
                NvmOpcode::Read,
                (i * nlb) as u64,
                nlb,
                vec![0; 140 << 10],
            )
        })
        .collect();
    let got = run(&mut q, &mut rd, true);
    for (tag, st) in &got {
        if *tag == 7 {
            assert!(st.is(sct::MEDIA, media::UNRECOVERED_READ_ERROR), "{st}");
        } else {
            assert!(st.is_success(), "tag {tag}: {st}");
        }
    }
    // Every write fails now: all 32 commands (some waiting for pieces)
    // get Write Fault, none is lost, and the pool is whole again after.
    r.dev.clear_faults();
    r.dev
        .add_fault(fault(None, NvmOpcode::Write, media::WRITE_FAULT));
    let mut w: Vec<Cmd> = (0..32)
        .map(|i| {
            Cmd::new(
                i,
                NvmOpcode::Write,
                (i * nlb) as u64,
                nlb,
                pattern(140 << 10, i),
            )
        })
        .collect();
    let waits = q.staged_waits();
    let got = run(&mut q, &mut w, true);
    for (tag, st) in &got {
        assert!(st.is(sct::MEDIA, media::WRITE_FAULT), "tag {tag}: {st}");
    }
    assert!(q.staged_waits() > waits, "no command waited for pieces");
    let before = q.stats();
    r.dev.clear_faults();
    write_read(&mut q, lbads, 140 << 10, 32, &[], 9);
    assert_eq!(q.stats().writes, before.writes + 32);
    // The controller's logs show the 33 failed commands.
    let mut ctrl = r.ctrl;
    let d = log_page(&mut ctrl, lid::SMART, 512);
    let smart = SmartLog::read_from_bytes(&d).unwrap();
    assert_eq!(smart.media_errors(), 33);
    assert_eq!(smart.num_err_log_entries(), 33);
    let d = log_page(&mut ctrl, lid::ERROR, 64 * 64);
    let log: Vec<ErrorLogEntry> = d
        .chunks_exact(64)
        .map(|e| ErrorLogEntry::read_from_bytes(e).unwrap())
        .take_while(|e| e.error_count != 0)
        .collect();
    assert_eq!(log.len(), 33);
    let read = &log[32];
    assert_eq!(
        (read.sqid, read.cid, read.nsid, read.lba),
        (5, 0x1007, 1, 7 * 280)
    );
    assert!(read.status().is(sct::MEDIA, media::UNRECOVERED_READ_ERROR));
    let mut writes: Vec<(u16, u64)> = log[..32].iter().map(|e| (e.cid, e.lba)).collect();
    writes.sort();
    let want: Vec<(u16, u64)> = (0..32).map(|i| (0x1000 + i, i as u64 * 280)).collect();
    assert_eq!(writes, want);
    assert!(log[..32]
        .iter()
        .all(|e| e.sqid == 5 && e.status().is(sct::MEDIA, media::WRITE_FAULT)));
}

/// Get Log Page `lid` of `len` bytes.
fn log_page(c: &mut Controller, lid: u8, len: u32) -> Vec<u8> {
    match c.exec_admin(
        &Sqe::get_log_page(lid, 0, len, 0, 0, 0),
        AdminEnv::default(),
    ) {
        AdminOutcome::Data { data, then, .. } => {
            c.data_sent(then);
            data
        }
        other => panic!("Get Log Page {lid}: {other:?}"),
    }
}
