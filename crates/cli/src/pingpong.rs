//! `pollux pingpong`: the cross-core cache-line round trip, the floor under
//! any QD 1 latency between a host thread and a device thread on another
//! core (each command is one round trip: SQ doorbell there, CQE back).
//! Two pinned threads bounce a counter in one cache line; the figure is the
//! median of several batches, in nanoseconds per round trip.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;

#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// Two cores: the pinging and the answering thread.
    #[arg(short = 'c', long = "cores", default_value = "0,1")]
    pub cores: String,
    /// Round trips per batch.
    #[arg(long, default_value_t = 200_000)]
    pub trips: u64,
    /// Batches (the median is reported).
    #[arg(long, default_value_t = 7)]
    pub batches: usize,
    #[arg(long)]
    pub json: bool,
}

#[repr(align(128))]
struct Line(AtomicU64);

pub fn run(a: PingpongArgs) -> Result<(), String> {
    let cores = crate::perf::parse_cores(&a.cores)?;
    if cores.len() != 2 {
        return Err("pingpong needs exactly two cores".into());
    }
    if a.trips == 0 || a.batches == 0 {
        return Err("--trips and --batches must be at least 1".into());
    }
    let line = Line(AtomicU64::new(0));
    let total = a.trips * a.batches as u64;
    let mut results = Vec::with_capacity(a.batches);
    std::thread::scope(|s| {
        let l = &line;
        let c1 = cores[1];
        s.spawn(move || {
            crate::perf::pin_to(c1);
            // Answer every odd value with the next even one.
            let mut want = 1u64;
            while want < 2 * total {
                while l.0.load(Ordering::Acquire) != want {
                    std::hint::spin_loop();
                }
                l.0.store(want + 1, Ordering::Release);
                want += 2;
            }
        });
        crate::perf::pin_to(cores[0]);
        let mut v = 0u64;
        for _ in 0..a.batches {
            let t = Instant::now();
            for _ in 0..a.trips {
                l.0.store(v + 1, Ordering::Release);
                while l.0.load(Ordering::Acquire) != v + 2 {
                    std::hint::spin_loop();
                }
                v += 2;
            }
            results.push(t.elapsed().as_nanos() as f64 / a.trips as f64);
        }
    });
    results.sort_by(f64::total_cmp);
    let med = results[results.len() / 2];
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "round_trip_ns": med, "min_ns": results[0], "max_ns": results[results.len() - 1], "batches": results })
        );
    } else {
        println!("cross-core cache-line round trip (cores {}): median {med:.1} ns, range {:.1}..{:.1} ns over {} batches", a.cores, results[0], results[results.len() - 1], a.batches);
    }
    Ok(())
}
