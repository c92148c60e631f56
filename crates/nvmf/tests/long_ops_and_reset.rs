//! A controller's long operations do not stall the other hosts of its
//! thread, and a reset or shutdown (Property Set of CC) stops its I/O
//! queues.
//!
//! The slow backend is an NVMe namespace of the emulated controller whose
//! device thread the test detaches: nothing sent to it completes until it
//! is attached again, so "host A's command is still outstanding while
//! host B completes N commands" holds without any timing. Before the
//! target ran these commands asynchronously, its only thread spun in the
//! command and host B's I/O never came back (B's read times out; the
//! device is attached again on the way out so the target can stop).
//! `POLLUX_LONG_OPS_IOS` sets N (default 64).
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use pollux_bdev::Bdev;
use pollux_nvmf::{RuntimeOptions, SubsystemConfig, Target, TargetConfig};
use pollux_pcie::{ControllerOptions, QpairOptions};
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::fabrics::{PropertySize, SglDescriptor};
use pollux_spec::features::fid;
use pollux_spec::regs::{shn, shst, Cc, Csts};
use pollux_spec::tcp::{CapsuleCmd, Digests};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::IntoBytes;

/// Blocks (512 B) of the emulated namespace (NSID 1) and of the RAM one
/// (NSID 2).
const NVME_BLOCKS: u64 = (64 << 20) / 512;
const RAM_BLOCKS: u64 = 8192;

fn ios() -> usize {
    std::env::var("POLLUX_LONG_OPS_IOS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// A one-thread target whose subsystem `SUB1` has an NVMe namespace of
/// an emulated controller (NSID 1) and a RAM one (NSID 2). Fields drop in
/// order: the target (its queues), then the device and its thread.
struct Rig {
    target: Target,
    dev: Arc<SoftDevice>,
    thread: DeviceThread,
}

fn rig() -> Rig {
    let thread = DeviceThread::spawn(None).expect("device thread");
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: 9,
            size_bytes: NVME_BLOCKS * 512,
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
    let mut cfg = TargetConfig::default();
    cfg.bdevs
        .push(Bdev::nvme("Nvme0n1", Arc::new(nvme.into()), 1, QpairOptions::default()).unwrap());
    cfg.bdevs
        .push(Bdev::ram("Malloc0", 512, RAM_BLOCKS).unwrap());
    let mut s = SubsystemConfig::new(SUB1);
    for b in ["Nvme0n1", "Malloc0"] {
        s.namespaces.push(pollux_nvmf::NamespaceConfig {
            bdev: b.into(),
            nsid: None,
            ..Default::default()
        });
    }
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    let target = Target::start(cfg, &[0], RuntimeOptions::default()).unwrap();
    Rig {
        target,
        dev,
        thread,
    }
}

/// The emulated controller stopped (its thread no longer steps it) until
/// this is dropped.
struct Stopped<'a>(&'a Rig);

impl Rig {
    fn stop_device(&self) -> Stopped<'_> {
        self.thread.detach(&self.dev);
        Stopped(self)
    }
}

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.thread.attach(self.0.dev.clone());
    }
}

/// Admin queue brought up with Number of Queues set, and I/O queue 1.
fn host(addr: SocketAddr, hostnqn: &str) -> (Client, Client, u16) {
    let mut a = Client::connect(addr);
    a.ic(Digests::NONE);
    let cntlid = a.bring_up(SUB1, hostnqn, 0);
    set_queues(&mut a);
    let q = Client::io_queue(addr, Digests::NONE, cntlid, 1, hostnqn, false);
    (a, q, cntlid)
}

fn set_queues(a: &mut Client) {
    let mut sqe = Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, (3 << 16) | 3);
    sqe.cid = a.next_cid();
    a.capsule(&sqe, &[]);
    assert!(a.resp().status().is_success());
}

/// `n` verified write/read pairs on the RAM namespace.
fn busy_io(q: &mut Client, n: usize, seed: u8) {
    for i in 0..n {
        let slba = (i as u64 * 8) % RAM_BLOCKS;
        let data = pattern(4096, seed.wrapping_add(i as u8));
        let w = q.write(2, slba, &data, true);
        assert!(w.status().is_success(), "write {i}: {:#x}", w.status().0);
        let (back, cqe) = q.read(2, slba, 4096);
        assert!(cqe.is_none_or(|c| c.status().is_success()), "read {i}");
        assert!(back == data, "read {i}: data differs");
    }
}

/// Nothing has arrived on `c` yet (its command is still outstanding).
fn silent(c: &mut Client) -> bool {
    c.s.set_nonblocking(true).unwrap();
    let r = c.s.peek(&mut [0u8; 1]);
    c.s.set_nonblocking(false).unwrap();
    matches!(r, Err(e) if e.kind() == ErrorKind::WouldBlock)
}

/// Sends `sqe` with in-capsule data `icd` and does not wait.
fn send(c: &mut Client, mut sqe: Sqe, icd: &[u8]) -> u16 {
    sqe.cid = c.next_cid();
    if !icd.is_empty() {
        SglDescriptor::in_capsule(0, icd.len() as u32).write_to_sqe(&mut sqe);
    }
    c.capsule(&sqe, icd);
    sqe.cid
}

fn csts(a: &mut Client) -> Csts {
    let r = a.prop_get(0x1C, PropertySize::Four);
    assert!(r.status().is_success());
    Csts(r.dw0)
}

/// Reads CSTS until `done` (as a host waits for a reset or a shutdown).
fn wait_csts(a: &mut Client, what: &str, done: impl Fn(Csts) -> bool) -> Csts {
    let start = Instant::now();
    loop {
        let c = csts(a);
        if done(c) {
            return c;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "CSTS {:#x}: still not {what}",
            c.0
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_whole_namespace_deallocate_does_not_stall_other_hosts() {
    let r = rig();
    let addr = r.target.listen_addrs()[0];
    let (_a_admin, mut a, _) = host(addr, HOST_A);
    let (_b_admin, mut b, _) = host(addr, HOST_B);
    b.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // Data at both ends of the emulated namespace.
    for slba in [0, NVME_BLOCKS - 8] {
        assert!(a
            .write(1, slba, &pattern(4096, 9), true)
            .status()
            .is_success());
    }
    let stopped = r.stop_device();
    // A: Dataset Management, deallocate, the whole namespace.
    let ranges = DsmRange {
        cattr: 0,
        nlb: NVME_BLOCKS as u32,
        slba: 0,
    };
    let cid = send(
        &mut a,
        Sqe::dsm(1, 1, DSM_ATTR_DEALLOCATE, 0),
        ranges.as_bytes(),
    );
    // B's I/O on the same thread completes meanwhile.
    busy_io(&mut b, ios(), 1);
    assert!(
        silent(&mut a),
        "the deallocate completed with the device stopped"
    );
    drop(stopped);
    let c = a.resp();
    assert_eq!((c.cid, c.status()), (cid, Status::SUCCESS));
    for slba in [0, NVME_BLOCKS - 8] {
        let (back, _) = a.read(1, slba, 4096);
        assert!(back.iter().all(|&x| x == 0), "LBA {slba} not deallocated");
    }
}

#[test]
fn a_flush_of_every_namespace_does_not_stall_other_hosts() {
    let r = rig();
    let addr = r.target.listen_addrs()[0];
    let (_a_admin, mut a, _) = host(addr, HOST_A);
    let (_b_admin, mut b, _) = host(addr, HOST_B);
    b.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let stopped = r.stop_device();
    let cid = send(&mut a, Sqe::flush(0xFFFF_FFFF), &[]);
    busy_io(&mut b, ios(), 2);
    assert!(
        silent(&mut a),
        "the flush completed with the device stopped"
    );
    drop(stopped);
    let c = a.resp();
    assert_eq!((c.cid, c.status()), (cid, Status::SUCCESS));
}

#[test]
fn a_shutdown_does_not_stall_other_hosts_and_flushes_once() {
    let r = rig();
    let addr = r.target.listen_addrs()[0];
    let (mut a, _a_io, _) = host(addr, HOST_A);
    let (_b_admin, mut b, _) = host(addr, HOST_B);
    b.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let en = Cc::standard(0).with_en(true);
    let shut = |s| Cc(en.0 | (s as u32) << 14);
    // A first shutdown with the device running; repeated notifications
    // after it do nothing (no flush each).
    assert!(a
        .prop_set(0x14, shut(shn::NORMAL).0 as u64)
        .status()
        .is_success());
    wait_csts(&mut a, "shut down", |c| c.shst() == shst::COMPLETE);
    let flushes = others(&r);
    for _ in 0..10 {
        for s in [shn::ABRUPT, shn::NORMAL] {
            assert!(a.prop_set(0x14, shut(s).0 as u64).status().is_success());
        }
    }
    assert_eq!(csts(&mut a).shst(), shst::COMPLETE);
    assert_eq!(others(&r), flushes, "repeated CC.SHN flushed again");
    // Reset, enable, shut down again with the device stopped: B's I/O
    // completes while the shutdown waits for its flush.
    assert!(a
        .prop_set(0x14, Cc::standard(0).0 as u64)
        .status()
        .is_success());
    wait_csts(&mut a, "reset", |c| c.0 == 0);
    assert!(a.prop_set(0x14, en.0 as u64).status().is_success());
    wait_csts(&mut a, "ready", |c| c.rdy());
    let stopped = r.stop_device();
    let cid = send(&mut a, PropSet::cc(shut(shn::NORMAL)), &[]);
    busy_io(&mut b, ios(), 3);
    let c = a.resp();
    assert_eq!((c.cid, c.status()), (cid, Status::SUCCESS));
    assert_eq!(
        csts(&mut a).shst(),
        shst::OCCURRING,
        "shut down with the device stopped"
    );
    drop(stopped);
    wait_csts(&mut a, "shut down", |c| c.shst() == shst::COMPLETE);
    assert_eq!(others(&r), flushes + 1, "one flush per shutdown");
}

/// I/O commands of the emulated controller other than reads and writes
/// (here: flushes).
fn others(r: &Rig) -> u64 {
    let s = r.dev.stats();
    s.io_commands - s.reads - s.writes
}

/// Property Set of CC, as an SQE.
struct PropSet;

impl PropSet {
    fn cc(cc: Cc) -> Sqe {
        pollux_spec::fabrics::PropertySetCmd::new(0x14, PropertySize::Four, cc.0 as u64).to_sqe()
    }
}

/// Whether `q`'s connection still answers an I/O command (false: the
/// target closed it).
fn answers(q: &mut Client) -> bool {
    let mut sqe = Sqe::rw(NvmOpcode::Read, 2, 0, 1);
    sqe.cid = q.next_cid();
    SglDescriptor::tcp_transport(512).write_to_sqe(&mut sqe);
    let (h, l) = CapsuleCmd::new(&sqe, 0, q.dg, 0).unwrap();
    let mut out = vec![0u8; l.plen as usize];
    pollux_spec::tcp::write_header(h.as_bytes(), &l, &mut out).unwrap();
    if q.s.write_all(&out).is_err() {
        return false;
    }
    match q.s.read(&mut [0u8; 64]) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => false,
        Err(e) => panic!("reading the I/O queue: {e}"),
    }
}

#[test]
fn cc_en_0_closes_the_io_queues_before_ready_clears() {
    let t = ram_target(4096);
    let addr = t.listen_addrs()[0];
    let (mut a, mut q, cntlid) = host(addr, HOST_A);
    let mut q2 = Client::io_queue(addr, Digests::NONE, cntlid, 2, HOST_A, true);
    assert!(q.write(1, 0, &pattern(4096, 1), true).status().is_success());
    assert!(q2
        .write(1, 8, &pattern(4096, 2), true)
        .status()
        .is_success());
    // Another host's controller is untouched.
    let (_b_admin, mut b, _) = host(addr, HOST_B);
    // Reset: CC.EN 1 -> 0; a host waits for CSTS.RDY to clear.
    let cc = Cc::standard(0);
    assert!(a.prop_set(0x14, cc.0 as u64).status().is_success());
    wait_csts(&mut a, "reset", |c| !c.rdy());
    assert!(
        !answers(&mut q),
        "I/O queue 1 still served I/O after the reset"
    );
    assert!(
        !answers(&mut q2),
        "I/O queue 2 still served I/O after the reset"
    );
    assert!(b
        .write(1, 16, &pattern(4096, 3), true)
        .status()
        .is_success());
    // Enabled again, the host connects its I/O queues anew.
    assert!(a
        .prop_set(0x14, cc.with_en(true).0 as u64)
        .status()
        .is_success());
    wait_csts(&mut a, "ready", |c| c.rdy());
    set_queues(&mut a);
    let mut q = Client::io_queue(addr, Digests::NONE, cntlid, 1, HOST_A, false);
    let (back, _) = q.read(1, 0, 4096);
    assert!(back == pattern(4096, 1));
}

#[test]
fn a_shutdown_closes_the_io_queues() {
    let t = ram_target(4096);
    let addr = t.listen_addrs()[0];
    let (mut a, mut q, cntlid) = host(addr, HOST_A);
    assert!(q.write(1, 0, &pattern(4096, 1), true).status().is_success());
    let cc = Cc(Cc::standard(0).with_en(true).0 | (shn::NORMAL as u32) << 14);
    assert!(a.prop_set(0x14, cc.0 as u64).status().is_success());
    wait_csts(&mut a, "shut down", |c| c.shst() == shst::COMPLETE);
    assert!(
        !answers(&mut q),
        "the I/O queue still served I/O after the shutdown"
    );
    // No new I/O queue until a reset.
    let mut c = Client::connect(addr);
    c.ic(Digests::NONE);
    let r = c.connect_cmd(1, 63, 0, cntlid, SUB1, HOST_A, false);
    assert!(!r.status().is_success());
}

/// Host A's read is at the stopped device when A goes away (both its
/// connections closed). The target keeps A's closed I/O queue connection,
/// reaping, until the device gives the read back, and only then drops it.
/// Before, it dropped it at once: the thread (every host's) waited on the
/// deletion of A's NVMe queue pair at the stopped device (two 5 s admin
/// timeouts), then freed memory the device was still using, which made
/// the controller fatal and failed host B's next command on NSID 1.
#[test]
fn a_host_leaving_with_io_at_a_stopped_backend_does_not_stall_other_hosts() {
    let r = rig();
    let addr = r.target.listen_addrs()[0];
    let (a_admin, mut a, _) = host(addr, HOST_A);
    let (_b_admin, mut b, _) = host(addr, HOST_B);
    b.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let stopped = r.stop_device();
    let mut read = Sqe::rw(NvmOpcode::Read, 1, 0, 8);
    read.cid = a.next_cid();
    SglDescriptor::tcp_transport(4096).write_to_sqe(&mut read);
    a.capsule(&read, &[]);
    // The read is at the device: nothing has come back.
    assert!(silent(&mut a), "the read completed with the device stopped");
    drop(a);
    drop(a_admin);
    busy_io(&mut b, ios(), 3);
    drop(stopped);
    // The device is back: B goes on, on NSID 1 too.
    let data = pattern(4096, 4);
    let w = b.write(1, 8, &data, true);
    assert!(w.status().is_success(), "write after: {:#x}", w.status().0);
    assert_eq!(b.read(1, 8, 4096).0, data);
}
