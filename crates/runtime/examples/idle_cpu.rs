//! Measures the CPU a runtime with nothing to do uses: starts one thread
//! per core given (default 0 1), lets it idle for a few seconds, and prints
//! user+system CPU time over wall time (getrusage) and per-thread stats.
//!
//! `cargo run --release -p pollux-runtime --example idle_cpu -- [SECONDS] [CORE...]`

use std::time::{Duration, Instant};

use pollux_runtime::{Runtime, RuntimeOptions};

fn cpu_time() -> Duration {
    // SAFETY: rusage is plain data; all-zero is a valid value to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live rusage the kernel fills in.
    let r = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    assert_eq!(r, 0, "getrusage: {}", std::io::Error::last_os_error());
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let secs: f64 = match args.next() {
        Some(s) => s.parse().map_err(|e| format!("SECONDS {s:?}: {e}"))?,
        None => 3.0,
    };
    let mut cores = Vec::new();
    for a in args {
        cores.push(a.parse::<usize>().map_err(|e| format!("CORE {a:?}: {e}"))?);
    }
    if cores.is_empty() {
        cores = vec![0, 1];
    }
    let rt = Runtime::start(&cores, RuntimeOptions::default())?;
    // Let start-up settle, then measure.
    std::thread::sleep(Duration::from_millis(100));
    let (cpu0, wall0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(secs));
    let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
    println!(
        "{} idle runtime threads over {:.2} s: {:.3} ms CPU = {:.4}% of one core",
        cores.len(),
        wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e3,
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
    for s in rt.stats()? {
        println!(
            "thread {} core {}: loops {} sleeps {} busy {:?} idle {:?} asleep {:?}",
            s.index, s.core, s.loops, s.sleeps, s.busy, s.idle, s.asleep
        );
    }
    rt.shutdown()?;
    Ok(())
}
