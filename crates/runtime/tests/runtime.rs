//! Behaviour of the runtime: messages, ordering, timers, pollers, stats,
//! idle sleep and wake-ups, shutdown, bursts. Time bounds here only detect
//! hangs; nothing asserts how fast anything is.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_runtime::{Error, EventFd, Poll, Runtime, RuntimeHandle, RuntimeOptions};

const HANG: Duration = Duration::from_secs(30);

fn opts() -> RuntimeOptions {
    RuntimeOptions {
        idle_threshold: Duration::from_micros(200),
        ..Default::default()
    }
}

fn start(cores: &[usize]) -> RuntimeHandle {
    Runtime::start(cores, opts()).expect("start runtime")
}

fn recv<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(HANG)
        .unwrap_or_else(|e| panic!("{what}: nothing within {HANG:?}: {e}"))
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < HANG, "{what}: not within {HANG:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn bad_core_lists_and_targets_are_refused() {
    assert!(matches!(Runtime::start(&[], opts()), Err(Error::NoCores)));
    assert!(matches!(
        Runtime::start(&[0, 1, 0], opts()),
        Err(Error::DuplicateCore { core: 0 })
    ));
    let zero = RuntimeOptions {
        inbox_capacity: 0,
        ..opts()
    };
    assert!(matches!(
        Runtime::start(&[0], zero),
        Err(Error::ZeroCapacity)
    ));
    let rt = start(&[0]);
    let e = rt.send(3, |_| {}).unwrap_err();
    assert!(
        matches!(e, Error::NoSuchThread { index: 3, count: 1 }),
        "{e}"
    );
    let e = rt.call(0, |ctx| ctx.send(7, |_| {}).unwrap_err()).unwrap();
    assert!(
        matches!(e, Error::NoSuchThread { index: 7, count: 1 }),
        "{e}"
    );
    rt.shutdown().unwrap();
}

#[test]
fn messages_round_trip_with_replies() {
    let rt = start(&[0, 1]);
    assert_eq!(
        rt.call(1, |ctx| (ctx.index(), ctx.core(), ctx.thread_count()))
            .unwrap(),
        (1, 1, 2)
    );
    let (tx, rx) = mpsc::channel();
    rt.send(0, move |ctx| {
        ctx.call(
            1,
            |ctx| ctx.index() * 10 + 7,
            move |ctx, r| tx.send((ctx.index(), r)).unwrap(),
        )
        .unwrap();
    })
    .unwrap();
    assert_eq!(recv(&rx, "reply from thread 1 on thread 0"), (0, 17));
    // A thread can message itself, reply included.
    let (tx, rx) = mpsc::channel();
    rt.send(1, move |ctx| {
        ctx.call(1, |ctx| ctx.index() + 5, move |_, r| tx.send(r).unwrap())
            .unwrap()
    })
    .unwrap();
    assert_eq!(recv(&rx, "reply to itself"), 6);
    rt.shutdown().unwrap();
}

#[test]
fn messages_from_one_sender_run_in_order() {
    // A tiny ring forces the sender's backlog path.
    let rt = Runtime::start(
        &[0, 1],
        RuntimeOptions {
            inbox_capacity: 4,
            ..opts()
        },
    )
    .unwrap();
    const N: u64 = 20_000;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let s = seen.clone();
    rt.send(0, move |ctx| {
        for i in 0..N {
            let s = s.clone();
            ctx.send(1, move |_| s.lock().unwrap().push(i)).unwrap();
        }
        ctx.send(1, move |_| tx.send(()).unwrap()).unwrap();
    })
    .unwrap();
    recv(&rx, "last message");
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got, (0..N).collect::<Vec<_>>());

    // From outside the runtime too.
    for i in 0..1000u64 {
        let s = seen.clone();
        rt.send(1, move |_| s.lock().unwrap().push(i)).unwrap();
    }
    rt.call(1, |_| ()).unwrap();
    assert_eq!(*seen.lock().unwrap(), (0..1000).collect::<Vec<_>>());
    rt.shutdown().unwrap();
}

#[test]
fn one_shot_fires_once_periodic_repeats_until_cancelled() {
    let rt = start(&[0]);
    let once = Arc::new(AtomicUsize::new(0));
    let periodic = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel();
    let (o, p) = (once.clone(), periodic.clone());
    rt.send(0, move |ctx| {
        ctx.add_timer(Duration::from_millis(1), move |_| {
            o.fetch_add(1, Ordering::SeqCst);
        });
        let mut n = 0;
        ctx.add_periodic(Duration::from_millis(1), move |ctx| {
            n += 1;
            p.fetch_add(1, Ordering::SeqCst);
            if n == 20 {
                // Report a while later, without cancelling.
                let tx = tx.clone();
                ctx.add_timer(Duration::from_millis(30), move |_| tx.send(()).unwrap());
            }
        });
    })
    .unwrap();
    recv(&rx, "periodic timer's 20th run");
    // The periodic one was not cancelled: it keeps going.
    let at_report = periodic.load(Ordering::SeqCst);
    assert!(at_report > 20, "periodic timer stopped at {at_report} runs");
    assert_eq!(once.load(Ordering::SeqCst), 1);

    // Cancelling from inside stops it; cancelling a pending one-shot
    // prevents it; a second cancel reports false.
    let (tx, rx) = mpsc::channel();
    let p = Arc::new(AtomicUsize::new(0));
    let p2 = p.clone();
    rt.send(0, move |ctx| {
        let fired = Arc::new(AtomicUsize::new(0));
        let f = fired.clone();
        let t = ctx.add_timer(Duration::from_millis(5), move |_| {
            f.fetch_add(1, Ordering::SeqCst);
        });
        assert!(ctx.cancel_timer(t));
        assert!(!ctx.cancel_timer(t));
        let mut n = 0;
        let me = Arc::new(Mutex::new(None));
        let me2 = me.clone();
        let id = ctx.add_periodic(Duration::from_millis(1), move |ctx| {
            n += 1;
            p2.fetch_add(1, Ordering::SeqCst);
            if n == 3 {
                let id = me2.lock().unwrap().expect("id stored");
                assert!(ctx.cancel_timer(id));
            }
        });
        *me.lock().unwrap() = Some(id);
        ctx.add_timer(Duration::from_millis(40), move |ctx| {
            tx.send((fired.load(Ordering::SeqCst), ctx.cancel_timer(id)))
                .unwrap()
        });
    })
    .unwrap();
    let (fired, cancel_again) = recv(&rx, "report after cancellations");
    assert_eq!(fired, 0, "a cancelled one-shot fired");
    assert!(
        !cancel_again,
        "a self-cancelled periodic timer was still live"
    );
    assert_eq!(p.load(Ordering::SeqCst), 3);
    rt.shutdown().unwrap();
}

/// Spins for at least `d`.
fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

#[test]
fn pollers_are_charged_their_busy_and_idle_time() {
    const BUSY_RUNS: u64 = 200;
    const SPIN: Duration = Duration::from_micros(20);
    let rt = start(&[0, 1]);
    // Thread 0: an idle poller first, then one that always reports Busy
    // (spinning in its first runs): time between pollers and the last
    // poller's deferred charge. Thread 1: a lone poller, busy then idle:
    // charged from the loop's own clock reads.
    rt.call(0, |ctx| {
        ctx.register_poller("idle", |_| Poll::Idle);
        let mut n = 0;
        ctx.register_poller("busy", move |_| {
            if n < BUSY_RUNS {
                n += 1;
                spin(SPIN);
            }
            Poll::Busy
        });
    })
    .unwrap();
    rt.call(1, |ctx| {
        let mut n = 0;
        ctx.register_poller("solo", move |_| {
            if n < BUSY_RUNS {
                n += 1;
                spin(SPIN);
                Poll::Busy
            } else {
                Poll::Idle
            }
        });
    })
    .unwrap();
    let find = |s: &pollux_runtime::ThreadStats, name: &str| {
        s.pollers
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no poller {name} in {s:?}"))
            .clone()
    };
    let mut stats = Vec::new();
    wait_until("the pollers' time to show", || {
        stats = rt.stats().unwrap();
        find(&stats[0], "busy").busy_runs >= BUSY_RUNS
            && !find(&stats[0], "idle").idle.is_zero()
            && !find(&stats[1], "solo").idle.is_zero()
    });
    let min_busy = SPIN * BUSY_RUNS as u32;
    let idle = find(&stats[0], "idle");
    assert_eq!(idle.busy, Duration::ZERO, "{idle:?}");
    assert_eq!(idle.busy_runs, 0, "{idle:?}");
    let busy = find(&stats[0], "busy");
    assert!(busy.busy >= min_busy, "{busy:?}");
    assert_eq!(busy.idle, Duration::ZERO, "{busy:?}");
    assert!(
        !busy.movable && busy.home == 0 && busy.moves == 0,
        "{busy:?}"
    );
    let solo = find(&stats[1], "solo");
    assert_eq!(solo.busy_runs, BUSY_RUNS, "{solo:?}");
    assert!(solo.busy >= min_busy, "{solo:?}");
    // Within the thread's own time, which counts more than the pollers.
    let t = &stats[1];
    assert!(solo.busy + solo.idle <= t.busy + t.idle + t.asleep, "{t:?}");
    rt.shutdown().unwrap();
}

#[test]
fn pollers_run_and_their_stats_count() {
    let rt = start(&[0, 1]);
    let (tx, rx) = mpsc::channel();
    rt.send(1, move |ctx| {
        let mut n = 0u64;
        ctx.register_poller("counter", move |_| {
            if n < 100 {
                n += 1;
                if n == 100 {
                    tx.send(()).unwrap();
                }
                Poll::Busy
            } else {
                Poll::Idle
            }
        });
    })
    .unwrap();
    recv(&rx, "poller's 100th busy run");
    let stats = rt.stats().unwrap();
    assert_eq!(stats.len(), 2);
    let s = &stats[1];
    assert_eq!((s.index, s.core), (1, 1));
    assert_eq!(s.pollers.len(), 1);
    let p = &s.pollers[0];
    assert_eq!(p.name, "counter");
    assert_eq!(p.busy_runs, 100);
    assert!(p.runs >= 100, "{p:?}");
    assert!(s.loops >= 100, "{s:?}");
    assert!(!s.busy.is_zero(), "{s:?}");
    assert!(s.messages >= 1, "{s:?}");
    assert!(stats[0].pollers.is_empty());

    // Unregistering from the poller itself.
    let (tx, rx) = mpsc::channel();
    rt.send(0, move |ctx| {
        let id = Arc::new(Mutex::new(None));
        let id2 = id.clone();
        let mut runs = 0;
        let pid = ctx.register_poller("once-then-gone", move |ctx| {
            runs += 1;
            let me = id2.lock().unwrap().expect("id stored");
            assert!(ctx.unregister_poller(me));
            tx.send(runs).unwrap();
            Poll::Idle
        });
        *id.lock().unwrap() = Some(pid);
    })
    .unwrap();
    assert_eq!(recv(&rx, "poller ran"), 1);
    rt.call(0, |_| ()).unwrap();
    assert!(rx.try_recv().is_err(), "an unregistered poller ran again");
    assert!(rt.stats().unwrap()[0].pollers.is_empty());
    rt.shutdown().unwrap();
}

#[test]
fn idle_threads_sleep_and_messages_wake_them() {
    let rt = start(&[0, 1]);
    wait_until("both threads asleep", || rt.is_asleep(0) && rt.is_asleep(1));
    // From thread 1 (woken by an outside message) to sleeping thread 0:
    // the runtime-thread path must wake it.
    let (tx, rx) = mpsc::channel();
    rt.send(1, move |ctx| {
        ctx.call(
            0,
            |ctx| ctx.stats().sleeps,
            move |_, sleeps| tx.send(sleeps).unwrap(),
        )
        .unwrap();
    })
    .unwrap();
    let sleeps = recv(&rx, "reply from woken thread 0");
    assert!(sleeps >= 1, "thread 0 never slept: {sleeps}");
    // A sleeping thread wakes for its next timer.
    wait_until("thread 0 asleep again", || rt.is_asleep(0));
    let (tx, rx) = mpsc::channel();
    rt.call(0, move |ctx| {
        ctx.add_timer(Duration::from_millis(20), move |_| tx.send(()).unwrap());
    })
    .unwrap();
    recv(&rx, "timer on a sleeping thread");
    rt.shutdown().unwrap();
}

#[test]
fn registered_fd_wakes_a_sleeping_thread() {
    let rt = start(&[0]);
    let efd = Arc::new(EventFd::new().unwrap());
    let (tx, rx) = mpsc::channel();
    let e = efd.clone();
    rt.call(0, move |ctx| {
        ctx.register_wake_fd(e.as_fd()).unwrap();
        ctx.register_poller("eventfd", move |_| {
            let n = e.drain().unwrap();
            if n > 0 {
                tx.send(n).unwrap();
                Poll::Busy
            } else {
                Poll::Idle
            }
        });
    })
    .unwrap();
    wait_until("thread asleep", || rt.is_asleep(0));
    efd.signal().unwrap();
    assert_eq!(recv(&rx, "poller seeing the eventfd"), 1);
    let s = &rt.stats().unwrap()[0];
    assert!(s.fd_wakeups >= 1, "{s:?}");
    // Unregistered, it no longer counts as a wake-up source.
    let e = efd.clone();
    rt.call(0, move |ctx| ctx.unregister_wake_fd(e.as_fd()))
        .unwrap()
        .unwrap();
    let e = efd.clone();
    let err = rt
        .call(0, move |ctx| ctx.unregister_wake_fd(e.as_fd()))
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::NotRegistered { .. }), "{err}");
    rt.shutdown().unwrap();
}

#[test]
fn sleep_hook_veto_keeps_the_thread_polling() {
    let rt = start(&[0]);
    let hook_runs = Arc::new(AtomicU64::new(0));
    let h = hook_runs.clone();
    rt.call(0, move |ctx| {
        ctx.on_sleep(move || {
            // Veto the first 50 attempts.
            h.fetch_add(1, Ordering::SeqCst) >= 50
        })
    })
    .unwrap();
    wait_until("thread asleep after vetoes", || rt.is_asleep(0));
    assert!(hook_runs.load(Ordering::SeqCst) > 50);
    rt.shutdown().unwrap();
}

#[test]
fn shutdown_runs_drains_refuses_messages_and_joins() {
    let rt = start(&[0, 1]);
    let drain_calls = Arc::new(AtomicUsize::new(0));
    let d = drain_calls.clone();
    rt.call(1, move |ctx| {
        // A poller that always finds work must not keep shutdown waiting.
        ctx.register_poller("spinner", |_| Poll::Busy);
        ctx.register_drain("five-calls", move |ctx| {
            assert!(ctx.is_shutting_down());
            d.fetch_add(1, Ordering::SeqCst) + 1 >= 5
        });
    })
    .unwrap();
    let trigger = rt.shutdown_trigger();
    assert!(!trigger.is_triggered());
    let (tx, rx) = mpsc::channel();
    let joiner = std::thread::spawn(move || {
        let r = rt.shutdown();
        let refused = rt.send(0, |_| {});
        tx.send(()).unwrap();
        (r, refused)
    });
    recv(&rx, "shutdown to join");
    let (r, refused) = joiner.join().unwrap();
    r.unwrap();
    assert!(trigger.is_triggered());
    assert_eq!(drain_calls.load(Ordering::SeqCst), 5);
    assert!(refused.is_err());
}

#[test]
fn a_drain_that_never_finishes_times_out() {
    let rt = Runtime::start(
        &[0],
        RuntimeOptions {
            drain_timeout: Duration::from_millis(50),
            ..opts()
        },
    )
    .unwrap();
    rt.call(0, |ctx| ctx.register_drain("stuck", |_| false))
        .unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(rt.shutdown()).unwrap());
    recv(&rx, "shutdown despite a stuck drain").unwrap();
}

#[test]
fn no_message_lost_under_a_burst_from_many_senders() {
    // Small rings: the burst overflows them.
    let rt = Arc::new(
        Runtime::start(
            &[0, 1],
            RuntimeOptions {
                inbox_capacity: 64,
                ..opts()
            },
        )
        .unwrap(),
    );
    const RT_N: u64 = 50_000;
    const EXT: usize = 3;
    const EXT_N: u64 = 20_000;
    // Per sender (0, 1: runtime threads; 2..: outside), the last sequence
    // number seen on thread 0: each message checks it follows.
    let last = Arc::new(Mutex::new(vec![0u64; 2 + EXT]));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let total = Arc::new(AtomicU64::new(0));
    let msg = {
        let (last, ooo, total) = (last.clone(), out_of_order.clone(), total.clone());
        move |sender: usize, seq: u64| {
            let (last, ooo, total) = (last.clone(), ooo.clone(), total.clone());
            move |_: &mut pollux_runtime::ThreadCtx| {
                let mut l = last.lock().unwrap();
                if l[sender] + 1 != seq {
                    ooo.fetch_add(1, Ordering::SeqCst);
                }
                l[sender] = seq;
                total.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    for from in 0..2 {
        let msg = msg.clone();
        rt.send(from, move |ctx| {
            for seq in 1..=RT_N {
                ctx.send(0, msg(from, seq)).unwrap();
            }
        })
        .unwrap();
    }
    let senders: Vec<_> = (0..EXT)
        .map(|k| {
            let (rt, msg) = (rt.clone(), msg.clone());
            std::thread::spawn(move || {
                for seq in 1..=EXT_N {
                    rt.send(0, msg(2 + k, seq)).unwrap();
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    let expected = 2 * RT_N + EXT as u64 * EXT_N;
    wait_until("every message run", || {
        total.load(Ordering::SeqCst) >= expected
    });
    // Give strays a chance to show, then check exact counts.
    rt.call(0, |_| ()).unwrap();
    assert_eq!(total.load(Ordering::SeqCst), expected);
    assert_eq!(out_of_order.load(Ordering::SeqCst), 0);
    assert_eq!(*last.lock().unwrap(), vec![RT_N, RT_N, EXT_N, EXT_N, EXT_N]);
    rt.shutdown().unwrap();
}

/// The cores the calling thread may run on, as the kernel lists them
/// (`Cpus_allowed_list` of /proc/thread-self/status: `0-1`, `3`, ...).
fn allowed_list() -> String {
    let s = std::fs::read_to_string("/proc/thread-self/status").expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

/// `pin_to_core` pins the calling thread (only it) to exactly that core,
/// and a refusal says which core and why, leaving the thread as it was.
#[test]
fn pin_to_core_pins_the_calling_thread_or_says_why_not() {
    use pollux_runtime::{pin_to_core, PinError};
    let before = allowed_list();
    let first: usize = before
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a core");
    std::thread::spawn(move || {
        pin_to_core(first).expect("pin to an allowed core");
        assert_eq!(allowed_list(), first.to_string());
        match pin_to_core(100_000) {
            Err(e @ PinError::OutOfRange { core: 100_000, .. }) => {
                assert!(e.to_string().contains("100000"), "{e}")
            }
            other => panic!("core 100000: {other:?}"),
        }
        // A core no machine this small has: the kernel refuses (EINVAL).
        if std::thread::available_parallelism().map_or(1, |n| n.get()) < 1000 {
            match pin_to_core(1023) {
                Err(e @ PinError::Affinity { core: 1023, .. }) => {
                    assert!(e.to_string().contains("core 1023"), "{e}");
                    assert_eq!(
                        std::io::Error::from(e).kind(),
                        std::io::ErrorKind::InvalidInput
                    );
                }
                other => panic!("core 1023: {other:?}"),
            }
        }
        assert_eq!(allowed_list(), first.to_string(), "unchanged by refusals");
    })
    .join()
    .expect("pinned thread");
    assert_eq!(allowed_list(), before, "other threads stay unpinned");
}
