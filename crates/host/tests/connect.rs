//! The host library over its transports: `connect` from a transport ID,
//! the emulated controller through a caller's `Emulator`, an NVMe/TCP
//! controller of a `pollux-nvmf`, and queue pairs of both driven by one
//! handler type in one loop, with the data checked.
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_host::{
    connect, connect_with, Completion, ConnectError, Controller, ControllerOptions, Emulator,
    EmulatorError, Handler, IoBuf, Namespace, QpairOptions, QueuePair, SoftTrid, Submitter, Trid,
};
use pollux_pcie::platform::Platform;
use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

const NQN: &str = "nqn.2024-01.io.pollux:host";

/// Emulated controllers stepped inline by the test (through `relax` and
/// the loop below).
#[derive(Default)]
struct Inline {
    made: Vec<Arc<SoftDevice>>,
}

impl Emulator for Inline {
    fn platform(&mut self, t: &SoftTrid) -> Result<Box<dyn Platform>, EmulatorError> {
        let backend = match t.backend {
            pollux_host::trid::Backend::Ram => BackendConfig::Ram,
            _ => BackendConfig::Null,
        };
        let mut cfg = SoftConfig {
            namespaces: vec![NamespaceConfig {
                backend,
                lba_shift: t.lba_shift,
                size_bytes: t.size,
            }],
            ..SoftConfig::default()
        };
        if let Some(m) = t.limits.mdts {
            cfg.mdts = m;
        }
        let dev = SoftDevice::new(cfg)?;
        self.made.push(dev.clone());
        Ok(Box::new(SoftPlatform::new(dev, SoftMode::Inline)))
    }
}

fn ram_target() -> pollux_nvmf::Target {
    let mut cfg = pollux_nvmf::TargetConfig::default();
    cfg.bdevs
        .push(pollux_bdev::Bdev::ram("Malloc0", 512, 2048).unwrap());
    let mut s = pollux_nvmf::SubsystemConfig::new(NQN);
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push("127.0.0.1:0".parse().unwrap());
    cfg.subsystems.push(s);
    pollux_nvmf::Target::start(cfg, &[0], pollux_nvmf::RuntimeOptions::default()).unwrap()
}

/// Writes then reads back `n` blocks per queue pair, one request in
/// flight per queue pair, a tag per block. One handler type for every
/// transport: it never names one.
struct Check {
    ns: Vec<Namespace>,
    /// Per queue pair: the next block, and whether it is being read back.
    next: Vec<(u64, bool)>,
    n: u64,
    done: usize,
    errors: Vec<String>,
}

fn tag(q: usize, lba: u64) -> u8 {
    (q as u8).wrapping_mul(31) ^ (lba as u8) ^ 0x5a
}

impl Check {
    fn submit(&mut self, sub: &mut Submitter<'_>, q: usize, mut buf: IoBuf) {
        let (lba, reading) = self.next[q];
        let ns = self.ns[q];
        let r = if reading {
            sub.read(&ns, lba, 1, buf, q as u64)
        } else {
            buf.as_mut_slice().fill(tag(q, lba));
            sub.write(&ns, lba, 1, buf, q as u64)
        };
        if let Err(e) = r {
            self.errors.push(format!("queue pair {q}: {e}"));
        }
    }
}

impl Handler for Check {
    fn complete(&mut self, sub: &mut Submitter<'_>, c: Completion) {
        let q = c.user_data as usize;
        let Some(buf) = c.buf else {
            self.errors.push(format!("queue pair {q}: no buffer back"));
            return;
        };
        if let Err(e) = c.result {
            self.errors.push(format!("queue pair {q}: {e}"));
            return;
        }
        let (lba, reading) = self.next[q];
        if reading {
            if buf.as_slice().iter().any(|&b| b != tag(q, lba)) {
                self.errors
                    .push(format!("queue pair {q}: LBA {lba} read back wrong"));
            }
            if lba + 1 == self.n {
                self.done += 1;
                return;
            }
            self.next[q] = (lba + 1, true);
        } else if lba + 1 == self.n {
            self.next[q] = (0, true);
        } else {
            self.next[q] = (lba + 1, false);
        }
        self.submit(sub, q, buf);
    }
}

/// Runs `Check` over every controller at once, one queue pair each.
fn run_all(ctrls: &[&Controller], inline: &[Arc<SoftDevice>]) {
    let n = 64;
    let mut qps: Vec<QueuePair> = ctrls
        .iter()
        .map(|c| {
            let depth = c.cap().mqes().min(32);
            c.alloc_qpair(QpairOptions {
                depth,
                ..QpairOptions::default()
            })
            .unwrap()
        })
        .collect();
    let mut h = Check {
        ns: ctrls.iter().map(|c| c.namespaces()[0]).collect(),
        next: vec![(0, false); ctrls.len()],
        n,
        done: 0,
        errors: Vec::new(),
    };
    for (q, (qp, c)) in qps.iter_mut().zip(ctrls).enumerate() {
        let buf = IoBuf::new(c.alloc_dma(4096).unwrap()).truncate(512);
        h.submit(&mut qp.submitter(), q, buf);
        qp.flush();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while h.done < ctrls.len() && h.errors.is_empty() {
        for qp in qps.iter_mut() {
            qp.poll_with(u32::MAX, &mut h);
        }
        for d in inline {
            d.step();
        }
        assert!(Instant::now() < deadline, "stuck: {:?}", h.next);
    }
    assert!(h.errors.is_empty(), "{:?}", h.errors);
    for qp in &qps {
        assert_eq!(qp.in_flight(), 0);
        assert_eq!(qp.stats().submitted, 2 * n);
    }
}

#[test]
fn an_emulated_controller_through_the_callers_emulator() {
    let t: Trid = "trtype:soft backend:ram size:1MiB mdts:1".parse().unwrap();
    let mut emu = Inline::default();
    let c = connect_with(&t, &ControllerOptions::default(), &mut emu).unwrap();
    assert_eq!(emu.made.len(), 1);
    assert_eq!(c.trtype(), "pcie");
    assert_eq!(c.max_transfer(), 8 << 10, "the limit in the TRID applied");
    assert_eq!(c.namespaces()[0].size_bytes(), 1 << 20);
    run_all(&[&c], &emu.made);
}

#[test]
fn an_emulated_controller_needs_an_emulator() {
    let t: Trid = "trtype:soft".parse().unwrap();
    match connect(&t, &ControllerOptions::default()) {
        Err(e @ ConnectError::NoEmulator) => assert!(e.to_string().contains("trtype:soft")),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("connected without an emulator"),
    }
}

/// PCIe (emulated) and TCP controllers in one process, their queue pairs
/// in one vector, polled by one handler.
#[test]
fn pcie_and_tcp_queue_pairs_side_by_side() {
    let target = ram_target();
    let addr = target.listen_addrs()[0];
    let t: Trid = format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:{NQN}",
        addr.ip(),
        addr.port()
    )
    .parse()
    .unwrap();
    let tcp = connect(&t, &ControllerOptions::default()).unwrap();
    assert_eq!(tcp.trtype(), "tcp");
    assert!(tcp.describe().contains(NQN), "{}", tcp.describe());
    let mut emu = Inline::default();
    let soft = connect_with(
        &"trtype:soft backend:ram size:1MiB".parse().unwrap(),
        &ControllerOptions::default(),
        &mut emu,
    )
    .unwrap();
    run_all(&[&soft, &tcp], &emu.made);
    // A namespace of one controller is refused by the other's queue pair.
    let mut qp = tcp
        .alloc_qpair(QpairOptions {
            depth: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let buf = IoBuf::new(soft.alloc_dma(4096).unwrap()).truncate(512);
    let e = qp.read(&soft.namespaces()[0], 0, 1, buf, 0).unwrap_err();
    assert!(
        matches!(e.error, pollux_host::SubmitError::ForeignNamespace { .. }),
        "{e}"
    );
    drop(qp);
    drop(tcp);
    target.shutdown().unwrap();
}

/// A TCP controller that is not there: the error says it could not be
/// reached.
#[test]
fn an_unreachable_tcp_controller_is_named_so() {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let t: Trid = format!("trtype:tcp traddr:127.0.0.1 trsvcid:{port} subnqn:{NQN}")
        .parse()
        .unwrap();
    let o = ControllerOptions {
        admin_timeout: Duration::from_secs(2),
        ..ControllerOptions::default()
    };
    match connect(&t, &o) {
        Err(e) => assert!(e.is_unreachable(), "{e}"),
        Ok(_) => panic!("connected to a closed port"),
    }
}

/// `sock_impl:uring`: a queue pair's ring belongs to the thread that first
/// polled it. Moved to another thread, the queue pair's connection fails
/// there (the kernel refuses that thread), the controller is reset and the
/// I/O queue reconnected on a ring of the new thread; the commands run on,
/// every block read back as written.
#[test]
fn a_uring_queue_pair_moved_to_another_thread_goes_on() {
    let target = ram_target();
    let addr = target.listen_addrs()[0];
    let t: Trid = format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:{NQN} sock_impl:uring reconnect_delay:1 ctrl_loss_tmo:20",
        addr.ip(),
        addr.port()
    )
    .parse()
    .unwrap();
    let tcp = connect(&t, &ControllerOptions::default()).unwrap();
    let mut qp = tcp
        .alloc_qpair(QpairOptions {
            depth: 8,
            ..QpairOptions::default()
        })
        .unwrap();
    let n = 64;
    let mut h = Check {
        ns: vec![tcp.namespaces()[0]],
        next: vec![(0, false)],
        n,
        done: 0,
        errors: Vec::new(),
    };
    let buf = IoBuf::new(tcp.alloc_dma(4096).unwrap()).truncate(512);
    h.submit(&mut qp.submitter(), 0, buf);
    qp.flush();
    // Half the writes on this thread...
    let deadline = Instant::now() + Duration::from_secs(30);
    while h.next[0].0 < n / 2 && h.errors.is_empty() {
        qp.poll_with(u32::MAX, &mut h);
        assert!(Instant::now() < deadline, "stuck: {:?}", h.next);
    }
    // ... the rest, and every read, on another.
    let (qp, h) = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while h.done < 1 && h.errors.is_empty() {
            qp.poll_with(u32::MAX, &mut h);
            assert!(Instant::now() < deadline, "stuck: {:?}", h.next);
        }
        (qp, h)
    })
    .join()
    .unwrap();
    assert!(h.errors.is_empty(), "{:?}", h.errors);
    assert_eq!(qp.in_flight(), 0);
    assert!(qp.stats().resets_seen >= 1, "{:?}", qp.stats());
    drop(qp);
    drop(tcp);
    target.shutdown().unwrap();
}
