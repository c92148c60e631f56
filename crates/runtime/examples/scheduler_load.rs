//! The dynamic scheduler's effect: cores in use at low and high load.
//!
//! Starts one runtime thread per core given (default 0 1) with the
//! scheduler on (period 100 ms, default limits), registers N movable
//! pollers (default 4) round-robin on the threads, and runs three phases
//! of SECS seconds each (default 3):
//!
//! - `low`: each poller finds a little work (2 µs of spinning) every
//!   100 µs and reports Busy then, Idle otherwise: a thread holding any
//!   poller keeps polling (the idle threshold is 200 µs) at a low busy
//!   share;
//! - `high`: each poller spins 50 µs on every run and reports Busy;
//! - `low` again.
//!
//! For each phase it prints the cores in use (threads asleep less than
//! half of the phase), each thread's busy/idle/asleep share of the phase
//! (wall time), its CPU time (`CLOCK_THREAD_CPUTIME_ID`, read on the
//! thread), its sleeps, the moves in and out during the phase (moves
//! take a few scheduler periods after the load changes, so a thread that
//! is emptied still polls at the start of a phase) and the pollers it runs
//! at the end, and the process's CPU time over the phase (getrusage). On a
//! machine shared with other work the CPU times show what the threads got,
//! not what they asked for; the shares and cores in use are wall-time and
//! do not depend on it. Run with `--no-scheduler` for the same load
//! without the scheduler.
//!
//! `cargo run --release -p pollux-runtime --example scheduler_load -- [--secs SECS] [--pollers N] [--no-scheduler] [CORE...]`

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pollux_runtime::{Poll, Runtime, RuntimeHandle, RuntimeOptions, SchedulerOptions, ThreadStats};

const LOW: u8 = 0;
const HIGH: u8 = 1;
/// At low load a poller finds `LOW_WORK` of work every `LOW_INTERVAL`.
const LOW_INTERVAL: Duration = Duration::from_micros(100);
const LOW_WORK: Duration = Duration::from_micros(2);
/// At high load a poller spins this long on every run.
const HIGH_WORK: Duration = Duration::from_micros(50);

fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live rusage the kernel fills in.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(r, 0, "getrusage: {}", std::io::Error::last_os_error());
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    // SAFETY: timespec is plain data; all-zero is a valid value to overwrite.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a live timespec the kernel fills in.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime: {}", std::io::Error::last_os_error());
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Each runtime thread's CPU time, read on the thread.
fn threads_cpu(rt: &RuntimeHandle) -> Result<Vec<Duration>, pollux_runtime::Error> {
    (0..rt.thread_count())
        .map(|i| rt.call(i, |_| thread_cpu_time()))
        .collect()
}

fn spin(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

struct Args {
    secs: f64,
    pollers: usize,
    scheduler: bool,
    cores: Vec<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        secs: 3.0,
        pollers: 4,
        scheduler: true,
        cores: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--secs" => {
                let v = it.next().ok_or("--secs needs a value")?;
                a.secs = v.parse().map_err(|e| format!("--secs {v:?}: {e}"))?;
                if !(a.secs > 0.0 && a.secs.is_finite()) {
                    return Err(format!("--secs {v:?}: must be a positive number"));
                }
            }
            "--pollers" => {
                let v = it.next().ok_or("--pollers needs a value")?;
                a.pollers = v.parse().map_err(|e| format!("--pollers {v:?}: {e}"))?;
                if a.pollers == 0 {
                    return Err("--pollers 0: at least one poller".into());
                }
            }
            "--no-scheduler" => a.scheduler = false,
            core => a
                .cores
                .push(core.parse().map_err(|e| format!("CORE {core:?}: {e}"))?),
        }
    }
    if a.cores.is_empty() {
        a.cores = vec![0, 1];
    }
    Ok(a)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = parse_args()?;
    let opts = RuntimeOptions {
        scheduler: args.scheduler.then(SchedulerOptions::default),
        ..Default::default()
    };
    let rt = Runtime::start(&args.cores, opts)?;
    let threads = rt.thread_count();
    let mode = Arc::new(AtomicU8::new(LOW));
    for k in 0..args.pollers {
        let mode = mode.clone();
        let home = k % threads;
        rt.call(home, move |ctx| {
            let mut next = ctx.now();
            ctx.register_movable_poller(format!("p{k}"), move |ctx| {
                if mode.load(Ordering::Relaxed) == HIGH {
                    spin(HIGH_WORK);
                    return Poll::Busy;
                }
                let now = ctx.now();
                if now < next {
                    return Poll::Idle;
                }
                next = now + LOW_INTERVAL;
                spin(LOW_WORK);
                Poll::Busy
            })
        })?;
    }
    println!(
        "{threads} threads on cores {:?}, {} movable pollers, scheduler {}, {:.1} s per phase",
        args.cores,
        args.pollers,
        if args.scheduler { "on" } else { "off" },
        args.secs
    );
    for (name, m) in [("low", LOW), ("high", HIGH), ("low", LOW)] {
        mode.store(m, Ordering::Relaxed);
        let before = rt.stats()?;
        let tcpu0 = threads_cpu(&rt)?;
        let (cpu0, wall0) = (cpu_time(), Instant::now());
        std::thread::sleep(Duration::from_secs_f64(args.secs));
        let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
        let tcpu: Vec<Duration> = threads_cpu(&rt)?
            .iter()
            .zip(&tcpu0)
            .map(|(a, b)| a.saturating_sub(*b))
            .collect();
        let after = rt.stats()?;
        report(name, &before, &after, &tcpu, cpu, wall);
    }
    rt.shutdown()?;
    Ok(())
}

fn report(
    phase: &str,
    before: &[ThreadStats],
    after: &[ThreadStats],
    tcpu: &[Duration],
    cpu: Duration,
    wall: Duration,
) {
    let mut in_use = 0;
    let mut lines = Vec::new();
    for ((b, a), tcpu) in before.iter().zip(after).zip(tcpu) {
        let busy = a.busy.saturating_sub(b.busy).as_secs_f64();
        let idle = a.idle.saturating_sub(b.idle).as_secs_f64();
        let asleep = a.asleep.saturating_sub(b.asleep).as_secs_f64();
        let total = (busy + idle + asleep).max(f64::MIN_POSITIVE);
        if asleep / total < 0.5 {
            in_use += 1;
        }
        let pollers: Vec<&str> = a
            .pollers
            .iter()
            .filter(|p| p.movable)
            .map(|p| p.name.as_str())
            .collect();
        lines.push(format!(
            "  thread {} (core {}): busy {:5.1}%  idle {:5.1}%  asleep {:5.1}%  CPU {:.3} s  sleeps {}  moved in {} out {}  runs {:?}",
            a.index,
            a.core,
            100.0 * busy / total,
            100.0 * idle / total,
            100.0 * asleep / total,
            tcpu.as_secs_f64(),
            a.sleeps - b.sleeps,
            a.pollers_moved_in - b.pollers_moved_in,
            a.pollers_moved_out - b.pollers_moved_out,
            pollers,
        ));
    }
    println!(
        "phase {phase:<4} {:.2} s: cores in use {in_use} of {}; process CPU {:.3} s = {:.2} cores",
        wall.as_secs_f64(),
        after.len(),
        cpu.as_secs_f64(),
        cpu.as_secs_f64() / wall.as_secs_f64(),
    );
    for l in lines {
        println!("{l}");
    }
}
