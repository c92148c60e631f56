//! Interrupts as well as polling: a queue pair created with `interrupts`
//! has its CQ raise an interrupt (the emulated controller signals an
//! eventfd per vector), which `wait` sleeps on and `interrupt_fd` hands to
//! an event loop. The device runs on its own thread here.
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_pcie::{Controller, ControllerOptions, IoBuf, QpairOptions};
use pollux_softnvme::{BackendConfig, DeviceThread, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_softnvme::{SoftMode, SoftPlatform};

fn open() -> (DeviceThread, Arc<SoftDevice>, Controller) {
    let dev = SoftDevice::new(SoftConfig {
        namespaces: vec![NamespaceConfig {
            backend: BackendConfig::Ram,
            lba_shift: 9,
            size_bytes: 4 << 20,
        }],
        ..SoftConfig::default()
    })
    .unwrap();
    let th = DeviceThread::spawn(None).unwrap();
    th.attach(dev.clone());
    let ctrl = pollux_pcie::open(
        Box::new(SoftPlatform::new(dev.clone(), SoftMode::Threaded)),
        ControllerOptions::default(),
    )
    .unwrap();
    (th, dev, ctrl)
}

/// Every request is completed by sleeping on the interrupt and then
/// polling: `wait` returns only once a completion is posted, and the
/// controller counted interrupts for them.
#[test]
fn wait_sleeps_until_the_completion_interrupt() {
    let (_th, dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            depth: 4,
            interrupts: true,
            ..QpairOptions::default()
        })
        .unwrap();
    assert!(qp.interrupt_fd().is_some());
    let before = dev.stats().interrupts;
    let mut buf = Some(IoBuf::new(ctrl.alloc_dma(4096).unwrap()));
    for i in 0..200u64 {
        qp.read(&ns, i, 8, buf.take().unwrap(), i).unwrap();
        let mut got = None;
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.is_none() {
            assert!(Instant::now() < deadline, "request {i} never completed");
            if qp.wait(Some(Duration::from_secs(5))).unwrap() {
                qp.poll(u32::MAX, |_, c| got = Some(c));
            }
        }
        let c = got.unwrap();
        assert_eq!((c.user_data, c.result), (i, Ok(0)));
        buf = c.buf;
    }
    assert!(
        dev.stats().interrupts > before,
        "the controller raised interrupts"
    );
}

/// With nothing outstanding there is nothing to wake for: `wait` times out
/// (false) rather than returning early; a polled queue pair has no
/// interrupt descriptor and `wait` does not block.
#[test]
fn wait_times_out_when_idle_and_polled_queues_have_no_interrupt() {
    let (_th, _dev, ctrl) = open();
    let mut qp = ctrl
        .alloc_qpair(QpairOptions {
            interrupts: true,
            ..QpairOptions::default()
        })
        .unwrap();
    assert!(!qp.wait(Some(Duration::from_millis(30))).unwrap());
    let mut polled = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
    assert!(polled.interrupt_fd().is_none());
    let t = Instant::now();
    assert!(!polled.wait(Some(Duration::from_secs(60))).unwrap());
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "a polled queue pair does not sleep"
    );
}

/// Queue pairs spread over the vectors, each with its own descriptor.
#[test]
fn queue_pairs_get_their_own_vectors() {
    let (_th, _dev, ctrl) = open();
    let ns = ctrl.namespaces()[0];
    let mut qps: Vec<_> = (0..3)
        .map(|_| {
            ctrl.alloc_qpair(QpairOptions {
                depth: 2,
                interrupts: true,
                ..QpairOptions::default()
            })
            .unwrap()
        })
        .collect();
    // A completion on queue pair 1 wakes its descriptor only.
    let b = IoBuf::new(ctrl.alloc_dma(512).unwrap()).truncate(512);
    qps[1].read(&ns, 0, 1, b, 1).unwrap();
    assert!(qps[1].wait(Some(Duration::from_secs(10))).unwrap());
    for (i, qp) in qps.iter_mut().enumerate() {
        if i != 1 {
            assert!(
                !qp.wait(Some(Duration::from_millis(20))).unwrap(),
                "qpair {i}"
            );
        }
    }
    let mut n = 0;
    qps[1].poll(u32::MAX, |_, _| n += 1);
    assert_eq!(n, 1);
}
