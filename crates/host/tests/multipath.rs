//! Multipath over two NVMe/TCP targets of this process exporting one RAM
//! block device under one subsystem NQN: paths to the same namespace are
//! taken and others refused (naming the path), both selectors spread I/O
//! over both paths, and a target that stops while I/O is in flight loses
//! nothing (every write read back) and its path comes back when it
//! serves again.
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pollux_host::multipath::PathStats;
use pollux_host::{
    ControllerOptions, IoBuf, MpQueuePair, Multipath, MultipathError, Policy, QpairOptions,
    Selector, Trid,
};
use pollux_spec::log::AnaState;

const NQN: &str = "nqn.2024-01.io.pollux:multipath";
const BLOCKS: u64 = 2048;

fn target(
    bdev: &pollux_bdev::Bdev,
    nqn: &str,
    serial: Option<&str>,
    port: u16,
) -> pollux_nvmf::Target {
    target_with(bdev, nqn, serial, port, |_| {})
}

/// A target reporting ANA, its listener in `state`, giving controller IDs
/// `cntlid` (disjoint per target: one host, two controllers).
fn ana_target(
    bdev: &pollux_bdev::Bdev,
    state: AnaState,
    cntlid: (u16, u16),
) -> pollux_nvmf::Target {
    target_with(bdev, NQN, None, 0, |s| {
        s.ana_reporting = true;
        (s.min_cntlid, s.max_cntlid) = cntlid;
        if state != AnaState::Optimized {
            let l = s.listeners[0];
            s.ana_states.push((l, None, state));
        }
    })
}

fn target_with(
    bdev: &pollux_bdev::Bdev,
    nqn: &str,
    serial: Option<&str>,
    port: u16,
    more: impl FnOnce(&mut pollux_nvmf::SubsystemConfig),
) -> pollux_nvmf::Target {
    let mut cfg = pollux_nvmf::TargetConfig::default();
    cfg.bdevs.push(bdev.clone());
    let mut s = pollux_nvmf::SubsystemConfig::new(nqn);
    s.serial = serial.map(str::to_string);
    s.namespaces.push(pollux_nvmf::NamespaceConfig {
        bdev: "Malloc0".into(),
        nsid: None,
        ..Default::default()
    });
    s.listeners.push(SocketAddr::from(([127, 0, 0, 1], port)));
    more(&mut s);
    cfg.subsystems.push(s);
    pollux_nvmf::Target::start(cfg, &[0], pollux_nvmf::RuntimeOptions::default()).unwrap()
}

fn trid(t: &pollux_nvmf::Target, nqn: &str) -> Trid {
    let a = t.listen_addrs()[0];
    format!(
        "trtype:tcp traddr:{} trsvcid:{} subnqn:{nqn} reconnect_delay:1 ctrl_loss_tmo:60",
        a.ip(),
        a.port()
    )
    .parse()
    .unwrap()
}

fn ram() -> pollux_bdev::Bdev {
    pollux_bdev::Bdev::ram("Malloc0", 512, BLOCKS).unwrap()
}

/// Each slot owns blocks `slot, slot + depth, ...`: writes one with a
/// stamp (slot, generation), reads it back, checks it, moves on.
struct Verify {
    depth: u64,
    /// Per slot: block, generation, reading.
    state: Vec<(u64, u8, bool)>,
    ios: u64,
    errors: Vec<String>,
    stop: bool,
}

impl Verify {
    fn new(depth: u64) -> Verify {
        Verify {
            depth,
            state: (0..depth).map(|s| (s, 1, false)).collect(),
            ios: 0,
            errors: Vec::new(),
            stop: false,
        }
    }

    fn stamp(slot: u64, gen: u8, lba: u64) -> u8 {
        (slot as u8).wrapping_mul(7) ^ gen ^ (lba as u8)
    }

    fn submit(&mut self, mp: &mut MpQueuePair, slot: u64, mut buf: IoBuf) {
        let (lba, gen, reading) = self.state[slot as usize];
        let r = if reading {
            mp.read(lba, 1, buf, slot)
        } else {
            buf.as_mut_slice().fill(Self::stamp(slot, gen, lba));
            mp.write(lba, 1, buf, slot)
        };
        if let Err(e) = r {
            self.errors
                .push(format!("slot {slot}: refused: {}", e.error));
        }
    }

    fn complete(&mut self, mp: &mut MpQueuePair, c: pollux_host::Completion) {
        let slot = c.user_data;
        self.ios += 1;
        let Some(buf) = c.buf else {
            self.errors.push(format!("slot {slot}: no buffer back"));
            return;
        };
        if let Err(e) = c.result {
            self.errors.push(format!("slot {slot}: {e}"));
        }
        let (lba, gen, reading) = self.state[slot as usize];
        if reading {
            let want = Self::stamp(slot, gen, lba);
            if buf.as_slice().iter().any(|&b| b != want) {
                self.errors.push(format!(
                    "slot {slot}: LBA {lba} generation {gen}: read back {:#x}, wrote {want:#x}",
                    buf.as_slice()[0]
                ));
            }
            let mut next = lba + self.depth;
            let mut gen = gen;
            if next >= BLOCKS {
                next = slot;
                gen = gen.wrapping_add(1);
            }
            self.state[slot as usize] = (next, gen, false);
        } else {
            self.state[slot as usize] = (lba, gen, true);
        }
        if !self.stop {
            self.submit(mp, slot, buf);
        }
    }

    fn start(&mut self, mp: &mut MpQueuePair, m: &Multipath) {
        let c = m.controller(0).unwrap();
        for slot in 0..self.depth {
            let buf = IoBuf::new(c.alloc_dma(4096).unwrap()).truncate(512);
            self.submit(mp, slot, buf);
        }
        mp.flush();
    }

    /// Polls until `until` says stop (or 30 s pass).
    fn run(&mut self, mp: &mut MpQueuePair, mut until: impl FnMut(&MpQueuePair, &Verify) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !until(mp, self) {
            mp.poll(|mp, c| self.complete(mp, c));
            assert!(Instant::now() < deadline, "stuck: {:?}", mp.path_stats());
        }
    }

    /// Stops submitting and waits for everything in flight.
    fn drain(&mut self, mp: &mut MpQueuePair) {
        self.stop = true;
        self.run(mp, |mp, _| mp.in_flight() == 0);
    }
}

fn stats(mp: &MpQueuePair) -> Vec<PathStats> {
    mp.path_stats().into_iter().map(|(_, s)| s).collect()
}

fn two_paths(policy: Policy, selector: Selector) -> (Vec<pollux_nvmf::Target>, Multipath) {
    let b = ram();
    let t = vec![target(&b, NQN, None, 0), target(&b, NQN, None, 0)];
    let m = Multipath::connect(
        &[trid(&t[0], NQN), trid(&t[1], NQN)],
        &ControllerOptions::default(),
        None,
        policy,
        selector,
    )
    .unwrap();
    (t, m)
}

#[test]
fn both_selectors_spread_io_over_both_paths() {
    for sel in [Selector::RoundRobin, Selector::QueueDepth] {
        let (_t, m) = two_paths(Policy::ActiveActive, sel);
        assert_eq!(m.len(), 2);
        let mut mp = m
            .alloc_qpair(QpairOptions {
                depth: 16,
                ..QpairOptions::default()
            })
            .unwrap();
        let mut v = Verify::new(16);
        v.start(&mut mp, &m);
        v.run(&mut mp, |_, v| v.ios >= 4000);
        v.drain(&mut mp);
        assert!(v.errors.is_empty(), "{sel:?}: {:?}", v.errors);
        let s = stats(&mp);
        let total = s[0].submitted + s[1].submitted;
        assert_eq!(total, v.ios, "{sel:?}: one sending per I/O");
        for p in &s {
            assert!(
                p.submitted * 5 > total,
                "{sel:?}: a path took under a fifth of the I/O: {s:?}"
            );
        }
        if sel == Selector::RoundRobin {
            assert!(s[0].submitted.abs_diff(s[1].submitted) <= 1, "{s:?}");
        }
    }
}

#[test]
fn active_passive_keeps_to_the_first_path() {
    let (_t, m) = two_paths(Policy::ActivePassive, Selector::RoundRobin);
    let mut mp = m.alloc_qpair(QpairOptions::default()).unwrap();
    let mut v = Verify::new(8);
    v.start(&mut mp, &m);
    v.run(&mut mp, |_, v| v.ios >= 1000);
    v.drain(&mut mp);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    let s = stats(&mp);
    assert_eq!((s[0].submitted, s[1].submitted), (v.ios, 0));
}

#[test]
fn paths_to_other_namespaces_are_refused_by_name() {
    let b = ram();
    let a = target(&b, NQN, None, 0);
    let other_nqn = "nqn.2024-01.io.pollux:elsewhere";
    let c = target(&b, other_nqn, None, 0);
    // Same NQN, another serial number: another NGUID, EUI-64 and UUID.
    let d = target(&ram(), NQN, Some("other-serial"), 0);
    let opts = ControllerOptions::default();
    let (ta, tc, td) = (trid(&a, NQN), trid(&c, other_nqn), trid(&d, NQN));
    match Multipath::connect(
        &[ta.clone(), tc],
        &opts,
        None,
        Policy::default(),
        Selector::default(),
    ) {
        Err(MultipathError::Mismatch { path, what, .. }) => {
            assert!(
                path.contains(&c.listen_addrs()[0].port().to_string()),
                "{path}"
            );
            assert!(
                what.contains("subsystem NQN") && what.contains(other_nqn),
                "{what}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("another subsystem's namespace taken as a path"),
    }
    match Multipath::connect(
        &[ta, td],
        &opts,
        None,
        Policy::default(),
        Selector::default(),
    ) {
        Err(e @ MultipathError::Mismatch { .. }) => {
            let s = e.to_string();
            assert!(s.contains("NGUID"), "{s}");
            assert!(s.contains(&d.listen_addrs()[0].port().to_string()), "{s}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("another namespace taken as a path"),
    }
}

/// A target stops (its connections close) with I/O in flight on it: the
/// I/O goes on the other path, nothing is lost or read back wrong; the
/// target serves again on the same port and its path comes back.
#[test]
fn a_path_that_dies_fails_over_and_comes_back() {
    let b = ram();
    let keep = target(&b, NQN, None, 0);
    let dying = target(&b, NQN, None, 0);
    let port = dying.listen_addrs()[0].port();
    let m = Multipath::connect(
        &[trid(&dying, NQN), trid(&keep, NQN)],
        &ControllerOptions::default(),
        None,
        Policy::ActiveActive,
        Selector::RoundRobin,
    )
    .unwrap();
    let mut mp = m
        .alloc_qpair(QpairOptions {
            depth: 32,
            ..QpairOptions::default()
        })
        .unwrap();
    let mut v = Verify::new(32);
    v.start(&mut mp, &m);
    v.run(&mut mp, |_, v| v.ios >= 2000);
    dying.shutdown().unwrap();
    drop(dying);
    // Down, and I/O goes on through the other path.
    v.run(&mut mp, |mp, _| !mp.path_usable(0));
    let at_down = v.ios;
    v.run(&mut mp, |_, v| v.ios >= at_down + 3000);
    assert!(!mp.path_usable(0), "back without a target");
    // Serves again: the path comes back and takes I/O.
    let again = target(&b, NQN, None, port);
    v.run(&mut mp, |mp, _| mp.path_usable(0));
    let before = stats(&mp)[0].submitted;
    v.run(&mut mp, |mp, _| stats(mp)[0].submitted >= before + 500);
    v.drain(&mut mp);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    let s = stats(&mp);
    assert!(
        s[0].failed_over > 0,
        "no I/O was in flight on the path that died: {s:?}"
    );
    assert_eq!((s[0].downs, s[0].ups), (1, 1), "{s:?}");
    assert!(s[1].downs == 0, "{s:?}");
    drop(again);
}

/// One namespace over `non` (path 0) and `opt` (path 1), round robin
/// under `policy`, and a queue pair of depth 16.
fn over_non_and_opt(
    non: &pollux_nvmf::Target,
    opt: &pollux_nvmf::Target,
    policy: Policy,
) -> (Multipath, MpQueuePair) {
    let m = Multipath::connect(
        &[trid(non, NQN), trid(opt, NQN)],
        &ControllerOptions::default(),
        None,
        policy,
        Selector::RoundRobin,
    )
    .unwrap();
    let mp = m
        .alloc_qpair(QpairOptions {
            depth: 16,
            ..QpairOptions::default()
        })
        .unwrap();
    (m, mp)
}

/// ANA states choose the path: the optimized one over the non-optimized
/// one; when it turns inaccessible (live, as
/// nvmf_subsystem_listener_set_ana_state does), the I/O it refuses goes
/// on the other path with no error; when it is optimized again, a later
/// reading of its ANA log brings it back.
#[test]
fn ana_states_choose_the_path_and_follow_changes() {
    let b = ram();
    let opt = ana_target(&b, AnaState::Optimized, (1, 99));
    let non = ana_target(&b, AnaState::NonOptimized, (100, 199));
    let (m, mut mp) = over_non_and_opt(&non, &opt, Policy::ActiveActive);
    let mut v = Verify::new(16);
    v.start(&mut mp, &m);
    v.run(&mut mp, |_, v| v.ios >= 1000);
    assert_eq!(
        stats(&mp)[0].submitted,
        0,
        "non-optimized path used: {:?}",
        stats(&mp)
    );
    let addr = opt.listen_addrs()[0];
    opt.set_ana_state(NQN, addr, AnaState::Inaccessible, None)
        .unwrap();
    v.run(&mut mp, |mp, _| !mp.path_usable(1));
    let at = v.ios;
    v.run(&mut mp, |_, v| v.ios >= at + 1000);
    let s = stats(&mp);
    assert!(s[0].submitted >= 1000, "{s:?}");
    assert_eq!(s[1].downs, 0, "an ANA state is not a path failure: {s:?}");
    opt.set_ana_state(NQN, addr, AnaState::Optimized, None)
        .unwrap();
    v.run(&mut mp, |mp, _| mp.path_usable(1));
    let before = stats(&mp)[1].submitted;
    v.run(&mut mp, |mp, _| stats(mp)[1].submitted >= before + 500);
    v.drain(&mut mp);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
}

/// A usable path learns of a better state with no I/O error to tell it
/// (no ANA Change notice either: the host runs no AERs): the optimized
/// path turns non-optimized and the non-optimized one optimized, both
/// still usable; the periodic reading of the ANA logs moves the I/O.
#[test]
fn usable_paths_follow_ana_changes_without_an_io_error() {
    let b = ram();
    let non = ana_target(&b, AnaState::NonOptimized, (1, 99));
    let opt = ana_target(&b, AnaState::Optimized, (100, 199));
    let (m, mut mp) = over_non_and_opt(&non, &opt, Policy::ActivePassive);
    let mut v = Verify::new(16);
    v.start(&mut mp, &m);
    v.run(&mut mp, |_, v| v.ios >= 1000);
    assert_eq!(stats(&mp)[0].submitted, 0, "{:?}", stats(&mp));
    opt.set_ana_state(NQN, opt.listen_addrs()[0], AnaState::NonOptimized, None)
        .unwrap();
    non.set_ana_state(NQN, non.listen_addrs()[0], AnaState::Optimized, None)
        .unwrap();
    v.run(&mut mp, |mp, _| stats(mp)[0].submitted >= 1000);
    let before = stats(&mp)[1].submitted;
    let at = v.ios;
    v.run(&mut mp, |_, v| v.ios >= at + 1000);
    let s = stats(&mp);
    assert!(
        s[1].submitted - before <= 16,
        "the now non-optimized path still gets I/O: {s:?}"
    );
    v.drain(&mut mp);
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(s[0].downs + s[1].downs, 0, "{s:?}");
}
