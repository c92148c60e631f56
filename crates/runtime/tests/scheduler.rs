//! The dynamic scheduler: movable pollers leave lightly loaded threads
//! for thread 0 (keeping id and counters; local pollers stay), spread back
//! out when the thread holding them is heavily loaded, and gather again
//! when the load drops. Time bounds only detect hangs: the tests wait for
//! a placement and assert it, never how fast it came.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use pollux_runtime::{
    Error, Poll, PollerStats, Runtime, RuntimeHandle, RuntimeOptions, SchedulerOptions, ThreadStats,
};

const HANG: Duration = Duration::from_secs(30);
/// How long a test waits for the scheduler to reach a placement.
const PLACEMENT: Duration = Duration::from_secs(20);

fn sched_opts() -> RuntimeOptions {
    RuntimeOptions {
        scheduler: Some(SchedulerOptions {
            period: Duration::from_millis(5),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Spins for at least `d`.
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Polls the stats until `done` holds for them; returns them.
fn wait_for(
    rt: &RuntimeHandle,
    what: &str,
    mut done: impl FnMut(&[ThreadStats]) -> bool,
) -> Vec<ThreadStats> {
    let start = Instant::now();
    loop {
        let stats = rt.stats().unwrap();
        if done(&stats) {
            return stats;
        }
        assert!(
            start.elapsed() < PLACEMENT,
            "{what}: not within {PLACEMENT:?}; last stats: {stats:#?}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// How many movable pollers each thread runs.
fn movable_per_thread(stats: &[ThreadStats]) -> Vec<usize> {
    stats
        .iter()
        .map(|s| s.pollers.iter().filter(|p| p.movable).count())
        .collect()
}

#[test]
fn movable_pollers_of_a_light_thread_move_to_thread_0() {
    let rt = Runtime::start(&[0, 1], sched_opts()).unwrap();
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

    // The move has landed once thread 0 reports it.
    let stats = wait_for(&rt, "move counted", |s| s[0].pollers_moved_in == 1);
    assert_eq!(stats[1].pollers_moved_out, 1, "{:?}", stats[1]);
    assert_eq!(
        (stats[0].pollers_moved_out, stats[1].pollers_moved_in),
        (0, 0)
    );
    let on0: Vec<_> = stats[0]
        .pollers
        .iter()
        .map(|p| (p.id, p.name.as_str()))
        .collect();
    let on1: Vec<_> = stats[1].pollers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(on0, vec![(id, "movable")]);
    assert_eq!(on1, vec!["local"]);
    // Counters came along: it ran on thread 1 before (at least once).
    let p = &stats[0].pollers[0];
    assert!(p.runs >= 2, "{p:?}");
    assert!(p.movable && p.home == 1 && p.moves == 1, "{p:?}");
    assert!(stats[1].pollers.iter().all(|p| !p.movable && p.home == 1));

    // It can still remove itself on its new thread by its old id.
    assert!(rt.call(0, move |ctx| ctx.unregister_poller(id)).unwrap());
    let start = Instant::now();
    while !(rt.is_asleep(1)) {
        assert!(start.elapsed() < HANG, "thread 1 never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    rt.shutdown().unwrap();
}

#[test]
fn heavy_load_spreads_pollers_out_and_light_load_gathers_them_again() {
    let rt = Runtime::start(&[0, 1], sched_opts()).unwrap();
    // Four movable pollers, two registered on each thread: idle while
    // `high` is false, busy (spinning 50 µs a run) while it is true.
    let high = Arc::new(AtomicBool::new(false));
    for home in [0, 1] {
        for k in 0..2 {
            let high = high.clone();
            rt.call(home, move |ctx| {
                ctx.register_movable_poller(format!("p{home}.{k}"), move |_| {
                    if high.load(Ordering::Relaxed) {
                        spin(Duration::from_micros(50));
                        Poll::Busy
                    } else {
                        Poll::Idle
                    }
                })
            })
            .unwrap();
        }
    }

    // Low load: all gather on thread 0, and thread 1 sleeps.
    let low = wait_for(&rt, "consolidation at low load", |s| {
        movable_per_thread(s) == [4, 0]
    });
    assert!(low[0].pollers_moved_in >= 2 && low[1].pollers_moved_out >= 2);
    let start = Instant::now();
    while !rt.is_asleep(1) {
        assert!(start.elapsed() < PLACEMENT, "thread 1 never slept");
        std::thread::sleep(Duration::from_millis(1));
    }

    // High load: thread 0 is saturated and hands pollers out.
    high.store(true, Ordering::Relaxed);
    // Per-thread stats are snapshots taken one thread after the other: a
    // poller moving between the two reads shows on both (or neither), so
    // wait for a snapshot that saw each poller once.
    let spread = wait_for(&rt, "spreading at high load", |s| {
        let n = movable_per_thread(s);
        n[0] >= 1 && n[1] >= 1 && n.iter().sum::<usize>() == 4
    });
    assert_eq!(movable_per_thread(&spread).iter().sum::<usize>(), 4);
    assert!(spread[0].pollers_moved_out > low[0].pollers_moved_out);
    assert!(spread[1].pollers_moved_in > low[1].pollers_moved_in);
    // The pollers now on thread 1 were busy there or on thread 0.
    for p in spread[1].pollers.iter().filter(|p| p.movable) {
        assert!(p.moves >= 1, "{p:?}");
    }
    let busy: Vec<&PollerStats> = spread.iter().flat_map(|s| &s.pollers).collect();
    assert!(busy.iter().any(|p| !p.busy.is_zero()), "{busy:?}");

    // Load drops: they gather on thread 0 again.
    high.store(false, Ordering::Relaxed);
    let again = wait_for(&rt, "consolidation after the load dropped", |s| {
        movable_per_thread(s) == [4, 0]
    });
    assert!(again[1].pollers_moved_out > spread[1].pollers_moved_out);
    assert!(again[0].pollers_moved_in > spread[0].pollers_moved_in);
    rt.shutdown().unwrap();
}

#[test]
fn a_moved_poller_keeps_its_busy_and_idle_time() {
    const BUSY_RUNS: u64 = 200;
    const SPIN: Duration = Duration::from_micros(20);
    let rt = Runtime::start(&[0, 1], sched_opts()).unwrap();
    // Busy (spinning) in its first runs, only on thread 1; idle after and
    // anywhere else. The scheduler moves it to thread 0 once idle.
    let busy_on_1 = Arc::new(AtomicU64::new(0));
    let counted = busy_on_1.clone();
    let id = rt
        .call(1, move |ctx| {
            let mut n = 0;
            ctx.register_movable_poller("worker", move |ctx| {
                if ctx.index() == 1 && n < BUSY_RUNS {
                    n += 1;
                    counted.store(n, Ordering::Relaxed);
                    spin(SPIN);
                    Poll::Busy
                } else {
                    Poll::Idle
                }
            })
        })
        .unwrap();
    let stats = wait_for(&rt, "the worker on thread 0, idle there", |s| {
        s[0].pollers
            .iter()
            .any(|p| p.id == id && p.runs > p.busy_runs)
    });
    let busy_runs = busy_on_1.load(Ordering::Relaxed);
    assert!(busy_runs >= 1);
    let p = stats[0].pollers.iter().find(|p| p.id == id).unwrap();
    assert_eq!(
        (p.name.as_str(), p.home, p.moves),
        ("worker", 1, 1),
        "{p:?}"
    );
    // All its busy runs and busy time were on thread 1, before the move.
    assert_eq!(p.busy_runs, busy_runs, "{p:?}");
    assert!(p.busy >= SPIN * busy_runs as u32, "{p:?}");
    assert!(!p.idle.is_zero(), "{p:?}");
    assert!(stats[1].pollers.iter().all(|p| p.id != id));
    rt.shutdown().unwrap();
}

#[test]
fn bad_scheduler_options_are_refused_at_start() {
    let opts = RuntimeOptions {
        scheduler: Some(SchedulerOptions {
            heavy_load: 0.5,
            ..Default::default()
        }),
        ..Default::default()
    };
    match Runtime::start(&[0], opts) {
        Err(e @ Error::SchedulerOption { option, .. }) => {
            assert_eq!(option, "fit_load");
            assert!(e.to_string().contains("fit_load = 0.8"), "{e}");
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("started with fit_load above heavy_load"),
    }
}

#[test]
fn a_running_movable_poller_sees_itself_movable_in_the_stats() {
    let rt = Runtime::start(&[0], RuntimeOptions::default()).unwrap();
    let (tx, rx) = mpsc::channel();
    let id = rt
        .call(0, move |ctx| {
            let mut sent = false;
            ctx.register_movable_poller("self-aware", move |ctx| {
                if !sent {
                    sent = true;
                    let _ = tx.send(ctx.stats().pollers);
                }
                Poll::Idle
            })
        })
        .unwrap();
    let seen = rx.recv_timeout(HANG).expect("the poller ran");
    let me = seen
        .iter()
        .find(|p| p.id == id)
        .expect("itself in the stats");
    assert!(me.movable, "{me:?}");
    rt.shutdown().unwrap();
}
