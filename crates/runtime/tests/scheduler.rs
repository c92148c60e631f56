//! The consolidating scheduler: movable pollers leave a lightly loaded
//! thread for thread 0, keeping id and counters; local pollers stay.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use pollux_runtime::{Poll, Runtime, RuntimeOptions, SchedulerOptions};

const HANG: Duration = Duration::from_secs(30);

#[test]
fn movable_pollers_of_a_light_thread_move_to_thread_0() {
    let opts = RuntimeOptions {
        scheduler: Some(SchedulerOptions {
            period: Duration::from_millis(5),
            ..Default::default()
        }),
        ..Default::default()
    };
    let rt = Runtime::start(&[0, 1], opts).unwrap();
    let (tx, rx) = mpsc::channel();
    let id = rt
        .call(1, move |ctx| {
            ctx.register_poller("local", |_| Poll::Idle);
            let mut last = usize::MAX;
            ctx.register_movable_poller("movable", move |ctx| {
                if ctx.index() != last {
                    last = ctx.index();
                    let _ = tx.send(last);
                }
                Poll::Idle
            })
        })
        .unwrap();
    assert_eq!(rx.recv_timeout(HANG).unwrap(), 1, "first runs on thread 1");
    assert_eq!(
        rx.recv_timeout(HANG).expect("poller moved"),
        0,
        "moved to thread 0"
    );

    let stats = rt.stats().unwrap();
    let on0: Vec<_> = stats[0]
        .pollers
        .iter()
        .map(|p| (p.id, p.name.as_str()))
        .collect();
    let on1: Vec<_> = stats[1].pollers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(on0, vec![(id, "movable")]);
    assert_eq!(on1, vec!["local"]);
    // Counters came along: it ran on thread 1 before (at least once).
    assert!(stats[0].pollers[0].runs >= 2, "{:?}", stats[0].pollers[0]);

    // It can still remove itself on its new thread by its old id.
    assert!(rt.call(0, move |ctx| ctx.unregister_poller(id)).unwrap());
    let start = Instant::now();
    while !(rt.is_asleep(1)) {
        assert!(start.elapsed() < HANG, "thread 1 never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    rt.shutdown().unwrap();
}
