//! Force Unit Access through the target: a Write with CDW12 bit 30 is
//! durable when its response leaves, whether its data came in the capsule
//! or through R2T, from a PDU-level host, from the pollux TCP host's API
//! (straight and through a bdev), onto a RAM disk with a simulated
//! volatile write cache (durable: survives `lose_volatile_cache`), onto a
//! buffered io_uring file (durable: no page of it dirty or under
//! writeback, seen with cachestat(2)), and onto an NVMe namespace (the
//! controller model's DMA staging: every piece carries FUA). While a
//! controller's volatile write cache is disabled (Set Features Volatile
//! Write Cache, WCE = 0), its plain writes are durable when answered too.
mod common;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use pollux_bdev::{Bdev, ChannelOptions, Completion, Io, IoBuf, RawSeg, RwFlags, UringOptions};
use pollux_controller::{
    Controller, FabricsTraits, Identity, IoQueue, IoQueueOptions, Limits, Namespace, Personality,
    Subsystem,
};
use pollux_nvmf::{RuntimeOptions, SubsystemConfig, Target, TargetConfig};
use pollux_pcie::{ControllerOptions, QpairOptions};
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::fabrics::SglDescriptor;
use pollux_spec::features::fid;
use pollux_spec::tcp::{Digests, H2CData};
use pollux_spec::{NvmOpcode, Sqe, Status};
use pollux_tcp::TcpOptions;
use zerocopy::IntoBytes;

/// A target serving `bdev` as namespace 1 of `SUB1`, on a free port.
fn target_on(bdev: Bdev) -> Target {
    let mut cfg = TargetConfig::default();
    let name = bdev.name().to_string();
    cfg.bdevs.push(bdev);
    let mut s = SubsystemConfig::new(SUB1);
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: name,
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    Target::start(cfg, &[0], RuntimeOptions::default()).unwrap()
}

/// Writes `data` at `slba` of namespace 1, with FUA or not, in the
/// capsule or through R2T; the response's status.
fn write_flags(c: &mut Client, slba: u64, data: &[u8], fua: bool, in_capsule: bool) -> Status {
    let mut sqe = Sqe::rw(NvmOpcode::Write, 1, slba, (data.len() / 512) as u32);
    if fua {
        sqe = sqe.with_rw_flags(RwFlags::FUA);
    }
    sqe.cid = c.next_cid();
    if in_capsule {
        SglDescriptor::in_capsule(0, data.len() as u32).write_to_sqe(&mut sqe);
        c.capsule(&sqe, data);
        return c.resp().status();
    }
    SglDescriptor::tcp_transport(data.len() as u32).write_to_sqe(&mut sqe);
    c.capsule(&sqe, &[]);
    let ttag = match c.recv() {
        Pdu::R2T { ttag, r2tl, .. } => {
            assert_eq!(r2tl as usize, data.len());
            ttag
        }
        Pdu::Resp(r) => return r.status(),
        _ => panic!("expected R2T"),
    };
    let (h, l) = H2CData::new(sqe.cid, ttag, 0, data.len() as u32, true, c.dg, 0).unwrap();
    c.send_pdu(h.as_bytes(), &l, data);
    c.resp().status()
}

/// An admin connection brought up and an I/O queue on it.
fn io_client(t: &Target) -> (Client, Client) {
    let addr = t.listen_addrs()[0];
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, HOST_A, 0);
    let q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, true);
    (a, q)
}

#[test]
fn fua_write_over_tcp_is_durable_when_answered() {
    let bdev = Bdev::ram_with_volatile_cache("Cache0", 512, 4096).unwrap();
    let t = target_on(bdev.clone());
    let (_a, mut c) = io_client(&t);
    // In the capsule (4 KiB), and through R2T (16 KiB, beyond the
    // in-capsule size).
    let small = pattern(4096, 1);
    let big = pattern(16384, 2);
    assert!(write_flags(&mut c, 0, &small, true, true).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(0), "in-capsule FUA write");
    assert!(write_flags(&mut c, 100, &big, true, false).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(0), "R2T FUA write");
    assert!(write_flags(&mut c, 200, &small, false, true).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(8), "a plain write is lost");
    for (lba, want) in [(0u64, &small), (100, &big)] {
        let (d, cq) = c.read(1, lba, want.len());
        assert!(cq.is_none_or(|q| q.status().is_success()));
        assert_eq!(&d, want, "LBA {lba}");
    }
    let (d, _) = c.read(1, 200, 4096);
    assert!(d.iter().all(|&x| x == 0));
}

/// An admin command without data on `a`: its completion.
fn admin(a: &mut Client, mut sqe: Sqe) -> pollux_spec::Cqe {
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    a.resp()
}

fn set_wce(a: &mut Client, wce: bool) {
    let r = admin(
        a,
        Sqe::set_features(fid::VOLATILE_WRITE_CACHE, 0, wce as u32),
    );
    assert!(r.status().is_success(), "Set Features VWC: {}", r.status());
}

fn get_wce(a: &mut Client) -> u32 {
    let r = admin(a, Sqe::get_features(fid::VOLATILE_WRITE_CACHE, 0));
    assert!(r.status().is_success(), "Get Features VWC: {}", r.status());
    r.dw0
}

#[test]
fn write_cache_disabled_over_tcp_makes_plain_writes_durable() {
    let bdev = Bdev::ram_with_volatile_cache("Cache0", 512, 4096).unwrap();
    let t = target_on(bdev.clone());
    let (mut a, mut c) = io_client(&t);
    let small = pattern(4096, 1);
    let big = pattern(16384, 2);
    assert_eq!(get_wce(&mut a), 1, "enabled by default");
    assert!(write_flags(&mut c, 0, &small, false, true).is_success());
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(8),
        "WCE 1: a plain write is lost"
    );
    // WCE = 0 on this controller: plain writes in the capsule, through
    // R2T, and a write zeroes are durable when answered.
    set_wce(&mut a, false);
    assert_eq!(get_wce(&mut a), 0);
    assert!(write_flags(&mut c, 0, &small, false, true).is_success());
    assert!(write_flags(&mut c, 100, &big, false, false).is_success());
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "a completed write was lost"
    );
    let mut wz = Sqe::write_zeroes(1, 104, 8, false);
    wz.cid = c.next_cid();
    c.capsule(&wz, &[]);
    assert!(c.resp().status().is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(0), "write zeroes lost");
    let (d, _) = c.read(1, 0, 4096);
    assert_eq!(d, small);
    let (d, _) = c.read(1, 100, 16384);
    let mut want = big.clone();
    want[2048..6144].fill(0);
    assert_eq!(d, want);
    // The setting is the controller's: another association's writes are
    // still cached.
    let (_a2, mut c2) = io_client(&t);
    assert!(write_flags(&mut c2, 300, &small, false, true).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(8), "another controller");
    assert!(write_flags(&mut c, 300, &small, false, true).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
    // WCE = 1 again: cached again.
    set_wce(&mut a, true);
    assert!(write_flags(&mut c, 400, &small, false, true).is_success());
    assert_eq!(bdev.lose_volatile_cache(), Some(8), "WCE 1 again");
}

#[test]
fn tcp_host_api_disables_the_write_cache() {
    let bdev = Bdev::ram_with_volatile_cache("Cache0", 512, 4096).unwrap();
    let t = target_on(bdev.clone());
    let ctrl = tcp_host(&t);
    let ns = ctrl.namespace(1).unwrap();
    let mut qp = ctrl
        .alloc_qpair(pollux_nvme::QpairOptions {
            depth: 32,
            ..Default::default()
        })
        .unwrap();
    let buf = |seed: u8, len: usize| {
        let mut b = IoBuf::new(ctrl.alloc_dma(len).unwrap()).truncate(len);
        b.as_mut_slice().copy_from_slice(&pattern(len, seed));
        b
    };
    let run = |qp: &mut pollux_host::QueuePair, lba: u64, seed: u8| {
        qp.write(&ns, lba, 8, buf(seed, 4096), 1).unwrap();
        qp.write(&ns, lba + 8, 64, buf(seed + 1, 32768), 2).unwrap();
        let mut n = 0;
        qp.drain(Duration::from_secs(20), |_, c: pollux_nvme::Completion| {
            assert!(c.result.is_ok(), "{:?}", c.result);
            n += 1;
        })
        .unwrap();
        assert_eq!(n, 2);
    };
    run(&mut qp, 0, 1);
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(72),
        "WCE 1: plain writes are lost"
    );
    ctrl.set_features(fid::VOLATILE_WRITE_CACHE, 0, 0).unwrap();
    assert_eq!(ctrl.get_features(fid::VOLATILE_WRITE_CACHE, 0).unwrap(), 0);
    run(&mut qp, 100, 3);
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(0),
        "a completed write was lost"
    );
    ctrl.set_features(fid::VOLATILE_WRITE_CACHE, 0, 1).unwrap();
    assert_eq!(ctrl.get_features(fid::VOLATILE_WRITE_CACHE, 0).unwrap(), 1);
    run(&mut qp, 200, 5);
    assert_eq!(bdev.lose_volatile_cache(), Some(72));
}

fn tcp_host(t: &Target) -> Arc<pollux_host::Controller> {
    let mut o = TcpOptions::new(t.listen_addrs()[0], SUB1);
    o.hostnqn = HOST_A.into();
    o.kato_ms = 0;
    Arc::new(
        pollux_tcp::open(o, pollux_nvme::ControllerOptions::default())
            .expect("connect")
            .into(),
    )
}

#[test]
fn tcp_host_api_sends_fua() {
    let bdev = Bdev::ram_with_volatile_cache("Cache0", 512, 4096).unwrap();
    let t = target_on(bdev.clone());
    let ctrl = tcp_host(&t);
    let ns = ctrl.namespace(1).unwrap();
    let qo = pollux_nvme::QpairOptions {
        depth: 32,
        ..Default::default()
    };
    let mut qp = ctrl.alloc_qpair(qo.clone()).unwrap();
    let buf = |seed: u8, len: usize| {
        let mut b = IoBuf::new(ctrl.alloc_dma(len).unwrap()).truncate(len);
        b.as_mut_slice().copy_from_slice(&pattern(len, seed));
        b
    };
    // The driver's API: a FUA write in the capsule, a larger one through
    // R2T, and a plain one.
    qp.submitter()
        .write_with(&ns, 0, 8, buf(1, 4096), RwFlags::FUA, 1)
        .unwrap();
    qp.submitter()
        .write_with(&ns, 100, 64, buf(2, 32768), RwFlags::FUA, 2)
        .unwrap();
    qp.write(&ns, 300, 8, buf(3, 4096), 3).unwrap();
    let mut n = 0;
    qp.drain(Duration::from_secs(20), |_, c: pollux_nvme::Completion| {
        assert!(c.result.is_ok(), "{:?}", c.result);
        n += 1;
    })
    .unwrap();
    assert_eq!(n, 3);
    assert_eq!(
        bdev.lose_volatile_cache(),
        Some(8),
        "only the plain write is lost"
    );
    // Through a bdev over the TCP controller.
    let nb = Bdev::nvme("tcp0n1", ctrl.clone(), 1, qo).unwrap();
    let co = ChannelOptions {
        depth: 32,
        ..Default::default()
    };
    let mut ch = nb.open(true).channel(&co).unwrap();
    let mut w = nb.alloc_buf(8192).unwrap();
    w.as_mut_slice().copy_from_slice(&pattern(8192, 4));
    ch.write_with(500, w, RwFlags::FUA, 7).unwrap();
    let mut h = |_: &mut Io<'_>, c: Completion| assert!(c.result.is_ok());
    assert!(ch.drain(&mut h, 50_000_000));
    assert_eq!(bdev.lose_volatile_cache(), Some(0));
    // What the FUA writes stored.
    let mut rc = bdev
        .open(false)
        .channel(&ChannelOptions::default())
        .unwrap();
    for (lba, want) in [
        (0u64, pattern(4096, 1)),
        (100, pattern(32768, 2)),
        (500, pattern(8192, 4)),
    ] {
        rc.read(lba, bdev.alloc_buf(want.len()).unwrap(), 0)
            .unwrap();
        let mut got = Vec::new();
        let mut h =
            |_: &mut Io<'_>, c: Completion| got = c.data.into_one().unwrap().as_slice().to_vec();
        assert!(rc.drain(&mut h, 1_000_000));
        assert_eq!(got, want, "LBA {lba}");
    }
}

// ---------------------------------------------------------------------
// A buffered io_uring file, observed through cachestat(2).

/// cachestat(2)'s syscall number (the same on every architecture).
const SYS_CACHESTAT: libc::c_long = 451;

#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Pages of `[off, off + len)` of `f` dirty or under writeback; None
/// without cachestat.
fn undurable(f: &std::fs::File, off: u64, len: u64) -> Option<u64> {
    let range = [off, len];
    let mut cs = Cachestat::default();
    // SAFETY: cachestat reads the range (two u64: offset, length) and
    // writes `cs`, both live and of the kernel's layout.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            f.as_raw_fd(),
            range.as_ptr(),
            &mut cs as *mut Cachestat,
            0u32,
        )
    };
    (rc == 0).then_some(cs.nr_dirty + cs.nr_writeback)
}

/// A directory on a file system with writeback (not tmpfs).
fn writeback_dir() -> Option<PathBuf> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")),
    ]
    .into_iter()
    .find(|d| {
        let Ok(p) = std::ffi::CString::new(d.as_os_str().as_encoded_bytes()) else {
            return false;
        };
        // SAFETY: statfs writes one struct statfs (all zeroes is valid);
        // `p` is a NUL-terminated path.
        let (rc, st) = unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            (libc::statfs(p.as_ptr(), &mut st), st)
        };
        rc == 0 && (st.f_type as u64) & 0xFFFF_FFFF != TMPFS_MAGIC
    })
}

struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn fua_write_to_a_buffered_file_is_on_disk_when_answered() {
    let Some(dir) = writeback_dir() else {
        eprintln!("skipped: no directory on a file system with writeback");
        return;
    };
    let path = dir.join(format!("pollux-nvmf-fua-{}", std::process::id()));
    std::fs::File::create(&path).unwrap();
    let _rm = TempFile(path.clone());
    let o = UringOptions {
        direct: false,
        size: Some(1 << 20),
        ..Default::default()
    };
    let f = std::fs::File::open(&path).unwrap();
    if undurable(&f, 0, 1 << 20).is_none() {
        eprintln!("skipped: the kernel has no cachestat(2) (Linux 6.5+)");
        return;
    }
    let t = target_on(Bdev::uring("File0", &path, o).unwrap());
    let (_a, mut c) = io_client(&t);
    let plain = pattern(4096, 1);
    assert!(write_flags(&mut c, 0, &plain, false, true).is_success());
    eprintln!(
        "plain write: {:?} of 1 page not durable when answered",
        undurable(&f, 0, 4096)
    );
    for (i, (lba, len, in_capsule)) in [(64u64, 4096usize, true), (128, 65536, false)]
        .into_iter()
        .enumerate()
    {
        let d = pattern(len, 2 + i as u8);
        assert!(write_flags(&mut c, lba, &d, true, in_capsule).is_success());
        assert_eq!(
            undurable(&f, lba * 512, len as u64),
            Some(0),
            "FUA write {i} answered before its pages were durable"
        );
        let (got, _) = c.read(1, lba, len);
        assert_eq!(got, d);
    }
}

// ---------------------------------------------------------------------
// An NVMe namespace: the controller model's DMA staging (asynchronous)
// and DMA bounce pieces (synchronous).

/// The model's controller over an NVMe namespace, and the device thread
/// stepping the emulated controller behind it. Fields drop in order: the
/// thread outlives the driver's controller (its shutdown needs the
/// device).
struct Rig {
    ctrl: Controller,
    _thread: DeviceThread,
}

fn nvme_controller(cache: &Bdev) -> Rig {
    let thread = DeviceThread::spawn(None).expect("device thread");
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Bdev(cache.clone()),
            lba_shift: 9,
            size_bytes: cache.info().size_bytes(),
        }],
        ..SoftConfig::default()
    })
    .expect("emulated controller");
    thread.attach(dev.clone());
    let nvme = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev, SoftMode::Threaded)),
        ControllerOptions::default(),
    )
    .expect("bring-up");
    let bdev = Bdev::nvme("Nvme0n1", Arc::new(nvme.into()), 1, QpairOptions::default()).unwrap();
    let subsys = Subsystem::new(
        Identity {
            serial: "FUA0001".into(),
            model: "pollux FUA over NVMe".into(),
            firmware: "1.0".into(),
            vid: 0,
            ssvid: 0,
            ieee: [0; 3],
            subnqn: "nqn.2024-01.io.pollux:fua-nvme".into(),
        },
        Limits {
            mqes: 127,
            max_io_queues: 4,
            mdts: 8,
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
        _thread: thread,
    }
}

#[test]
fn fua_reaches_an_nvme_namespace_in_every_piece() {
    let cache = Bdev::ram_with_volatile_cache("Cache0", 512, 8192).unwrap();
    let rig = nvme_controller(&cache);
    let ctrl = &rig.ctrl;
    {
        let mut q = IoQueue::for_controller(ctrl, IoQueueOptions { depth: 16 }).unwrap();
        // 384 KiB: several staged pieces (128 KiB at most each); 4 KiB;
        // and a plain write.
        let mut big = pattern(384 << 10, 1);
        let mut small = pattern(4096, 2);
        let mut plain = pattern(4096, 3);
        let cmds = [
            (1u32, 0u64, true, &mut big),
            (2, 2000, true, &mut small),
            (3, 3000, false, &mut plain),
        ];
        for (tag, lba, fua, buf) in cmds {
            let mut sqe = Sqe::rw(NvmOpcode::Write, 1, lba, (buf.len() / 512) as u32);
            if fua {
                sqe = sqe.with_rw_flags(RwFlags::FUA);
            }
            let cmd = q.check(&sqe).unwrap();
            let s = [RawSeg {
                ptr: buf.as_mut_ptr(),
                len: buf.len(),
            }];
            // SAFETY: the buffers live, untouched, until delivered below.
            unsafe { q.submit(tag, &cmd, &s) }.unwrap();
        }
        let mut got = Vec::new();
        while q.outstanding() > 0 {
            q.poll(&mut |t, st| got.push((t, st)));
        }
        assert!(got.iter().all(|g| g.1.is_success()), "{got:?}");
        assert_eq!(
            cache.lose_volatile_cache(),
            Some(8),
            "only the plain write is lost"
        );
    }
    // Synchronously (the DMA bounce pieces): a FUA write of 96 KiB.
    let mut q = IoQueue::for_controller(ctrl, IoQueueOptions { depth: 0 }).unwrap();
    let mut d = pattern(96 << 10, 4);
    let sqe = Sqe::rw(NvmOpcode::Write, 1, 4000, 192).with_rw_flags(RwFlags::FUA);
    let cmd = q.check(&sqe).unwrap();
    let s = [RawSeg {
        ptr: d.as_mut_ptr(),
        len: d.len(),
    }];
    // SAFETY: `d` is ours, untouched during the call.
    assert!(unsafe { q.exec(&cmd, &s) }.is_success());
    assert_eq!(cache.lose_volatile_cache(), Some(0));
    let mut rc = cache
        .open(false)
        .channel(&ChannelOptions::default())
        .unwrap();
    for (lba, want) in [
        (0u64, pattern(384 << 10, 1)),
        (2000, pattern(4096, 2)),
        (4000, d),
    ] {
        rc.read(lba, cache.alloc_buf(want.len()).unwrap(), 0)
            .unwrap();
        let mut got = Vec::new();
        let mut h =
            |_: &mut Io<'_>, c: Completion| got = c.data.into_one().unwrap().as_slice().to_vec();
        assert!(rc.drain(&mut h, 1_000_000));
        assert_eq!(got, want, "LBA {lba}");
    }
}
