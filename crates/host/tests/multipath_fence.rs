//! The write rule of multipath, on emulated controllers: a write that
//! fails on a path with a status that does not prove it over (Host
//! Pathing Error: the host gave up on it) is not sent on another path
//! while the first path still has commands in flight or has not been
//! reset since; once it has, the write goes, once.
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_host::{
    connect_with, Completion, ControllerOptions, Emulator, EmulatorError, IoBuf, MpQueuePair,
    Multipath, Policy, QpairOptions, Selector, SoftTrid, Trid,
};
use pollux_pcie::platform::Platform;
use pollux_softnvme::{
    BackendConfig, FaultAction, FaultRule, NamespaceConfig, QueueSel, SoftConfig, SoftDevice,
    SoftMode, SoftPlatform,
};
use pollux_spec::status::{path, sct};
use pollux_spec::{NvmOpcode, Status};

#[derive(Default)]
struct Inline {
    made: Vec<Arc<SoftDevice>>,
}

impl Emulator for Inline {
    fn platform(&mut self, t: &SoftTrid) -> Result<Box<dyn Platform>, EmulatorError> {
        let cfg = SoftConfig {
            namespaces: vec![NamespaceConfig {
                backend: BackendConfig::Ram,
                lba_shift: t.lba_shift,
                size_bytes: t.size,
            }],
            ..SoftConfig::default()
        };
        let dev = SoftDevice::new(cfg)?;
        self.made.push(dev.clone());
        Ok(Box::new(SoftPlatform::new(dev, SoftMode::Inline)))
    }
}

fn rule(opc: NvmOpcode, action: FaultAction, count: Option<u32>) -> FaultRule {
    FaultRule {
        opcode: Some(opc as u8),
        count,
        ..FaultRule::new(QueueSel::Io, action)
    }
}

/// Polls (stepping the devices) for `d`, collecting completions.
fn spin(mp: &mut MpQueuePair, devs: &[Arc<SoftDevice>], d: Duration, got: &mut Vec<Completion>) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        mp.poll(|_, c| got.push(c));
        for x in devs {
            x.step();
        }
    }
}

#[test]
fn a_write_the_host_gave_up_on_waits_for_its_path_to_be_fenced() {
    let mut emu = Inline::default();
    let t: Trid = "trtype:soft backend:ram size:1MiB".parse().unwrap();
    let opts = ControllerOptions::default();
    let a = connect_with(&t, &opts, &mut emu).unwrap();
    let b = connect_with(&t, &opts, &mut emu).unwrap();
    let devs = emu.made.clone();
    let m = Multipath::new(
        vec![("A".into(), a), ("B".into(), b)],
        None,
        Policy::ActivePassive,
        Selector::RoundRobin,
    )
    .unwrap();
    let mut mp = m.alloc_qpair(QpairOptions::default()).unwrap();
    let ctrl_a = m.controller(0).unwrap();
    // On A: a read that stays in flight for a while, and a write the
    // host gives up on (as it would after losing the command).
    devs[0].add_fault(rule(
        NvmOpcode::Read,
        FaultAction::Delay(Duration::from_millis(300)),
        Some(1),
    ));
    let hpe = Status::new(sct::PATH, path::HOST_PATHING_ERROR, false);
    devs[0].add_fault(rule(NvmOpcode::Write, FaultAction::Status(hpe), Some(1)));
    let buf = |n: u8| {
        let mut b = IoBuf::new(ctrl_a.alloc_dma(4096).unwrap()).truncate(512);
        b.as_mut_slice().fill(n);
        b
    };
    mp.read(0, 1, buf(0), 1).unwrap();
    mp.write(8, 1, buf(0xab), 2).unwrap();
    mp.flush();
    let mut got = Vec::new();
    let sent = |mp: &MpQueuePair| -> Vec<u64> {
        mp.path_stats().iter().map(|(_, s)| s.submitted).collect()
    };
    // The write failed on A while the read is still in flight there: it
    // waits, sent nowhere else.
    spin(&mut mp, &devs, Duration::from_millis(100), &mut got);
    assert!(got.is_empty(), "{got:?}");
    assert_eq!(mp.parked_writes(), 1);
    assert_eq!(sent(&mp), vec![2, 0]);
    // The read completes: A has nothing in flight, but was not reset
    // since, so the write may still be there: it keeps waiting.
    spin(&mut mp, &devs, Duration::from_millis(400), &mut got);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].user_data, got[0].result), (1, Ok(0)));
    assert_eq!(mp.parked_writes(), 1);
    assert_eq!(sent(&mp), vec![2, 0], "a write sent again too early");
    // A is reset (a new association would be the same over fabrics): the
    // write goes, once, and succeeds.
    ctrl_a.reset().unwrap();
    spin(&mut mp, &devs, Duration::from_millis(100), &mut got);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!((got[1].user_data, got[1].result), (2, Ok(0)));
    assert_eq!(mp.parked_writes(), 0);
    assert_eq!(mp.in_flight(), 0);
    let s = sent(&mp);
    assert_eq!(
        s.iter().sum::<u64>(),
        3,
        "the write sent exactly twice: {s:?}"
    );
    // A came back with its reset (active-passive: the first path): the
    // write went there, and the data is there.
    assert_eq!(s, vec![3, 0]);
    mp.read(8, 1, buf(0), 3).unwrap();
    mp.flush();
    got.clear();
    spin(&mut mp, &devs, Duration::from_millis(50), &mut got);
    let d = got[0].buf.as_ref().unwrap();
    assert!(
        d.as_slice().iter().all(|&x| x == 0xab),
        "{:?}",
        &d.as_slice()[..4]
    );
}

/// A path status every path returns for a request is the caller's after
/// five sendings again (Linux's nvme_max_retries): it cannot loop.
#[test]
fn a_path_error_every_path_returns_ends_after_five_resends() {
    let mut emu = Inline::default();
    let t: Trid = "trtype:soft backend:ram size:1MiB".parse().unwrap();
    let opts = ControllerOptions::default();
    let a = connect_with(&t, &opts, &mut emu).unwrap();
    let b = connect_with(&t, &opts, &mut emu).unwrap();
    let devs = emu.made.clone();
    let m = Multipath::new(
        vec![("A".into(), a), ("B".into(), b)],
        None,
        Policy::ActiveActive,
        Selector::RoundRobin,
    )
    .unwrap();
    let mut mp = m.alloc_qpair(QpairOptions::default()).unwrap();
    let cpe = Status::new(sct::PATH, path::CONTROLLER_PATHING_ERROR, false);
    for d in &devs {
        d.add_fault(rule(NvmOpcode::Read, FaultAction::Status(cpe), None));
    }
    let buf = IoBuf::new(m.controller(0).unwrap().alloc_dma(4096).unwrap()).truncate(512);
    mp.read(0, 1, buf, 9).unwrap();
    mp.flush();
    let mut got = Vec::new();
    spin(&mut mp, &devs, Duration::from_millis(100), &mut got);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].result, Err(pollux_host::IoError::Nvme(cpe)));
    let sent: u64 = mp.path_stats().iter().map(|(_, s)| s.submitted).sum();
    assert_eq!(sent, 6, "sent once and again five times");
    assert_eq!(mp.in_flight(), 0);
}
