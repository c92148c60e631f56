//! `pollux pingpong`: the cross-core cache-line round trip, the floor under
//! any QD 1 latency between a host thread and a device thread on another
//! core (each command is one round trip: SQ doorbell there, CQE back).
//! Two pinned threads bounce a counter in one cache line; the figure is the
//! median of several batches, in nanoseconds per round trip.
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::Args;

use crate::common::cores::online_cpus;
use crate::common::opts::cores_option;

#[derive(Args, Debug)]
pub struct PingpongArgs {
    /// Two cores: the pinging and the answering thread (a list, a range or a
    /// hex mask).
    #[arg(short = 'c', long = "cores", default_value = "0,1")]
    pub cores: String,
    /// Round trips per batch.
    #[arg(long, default_value_t = 200_000)]
    pub trips: u64,
    /// Batches (the median is reported; at most 1000000).
    #[arg(long, default_value_t = 7)]
    pub batches: usize,
    /// One JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Most batches: one figure each is kept and printed.
pub const MAX_BATCHES: usize = 1_000_000;

#[repr(align(128))]
struct Line(AtomicU64);

/// The counter value after the last round trip: each trip adds 2, so
/// `2 x trips x batches` must fit in the 64-bit counter.
fn final_count(a: &PingpongArgs) -> Result<u64, String> {
    if a.trips == 0 {
        return Err(format!("--trips {}: must be at least 1", a.trips));
    }
    if a.batches == 0 {
        return Err(format!("--batches {}: must be at least 1", a.batches));
    }
    if a.batches > MAX_BATCHES {
        return Err(format!(
            "--batches {}: at most {MAX_BATCHES} (one figure is kept per batch)",
            a.batches
        ));
    }
    a.trips
        .checked_mul(a.batches as u64)
        .and_then(|n| n.checked_mul(2))
        .ok_or_else(|| {
            format!(
                "--trips {} x --batches {} round trips overflow the 64-bit counter (at most {} in total)",
                a.trips,
                a.batches,
                u64::MAX / 2
            )
        })
}

/// Pins the calling thread to `core`; unpinned (with a warning) if refused.
fn pin(core: usize) {
    if let Err(e) = pollux_runtime::pin_to_core(core) {
        tracing::warn!(core, "could not pin thread: {e}");
    }
}

pub fn run(a: PingpongArgs) -> Result<(), String> {
    let end = final_count(&a)?;
    let cores = cores_option("-c", &a.cores, &online_cpus()).map_err(|e| e.to_string())?;
    if cores.len() != 2 {
        return Err(format!(
            "-c {}: pingpong needs exactly two cores (got {})",
            a.cores,
            cores.len()
        ));
    }
    let line = Line(AtomicU64::new(0));
    let mut results = Vec::with_capacity(a.batches);
    std::thread::scope(|s| {
        let l = &line;
        let c1 = cores[1];
        s.spawn(move || {
            pin(c1);
            // Answer every odd value with the next even one. `want` stays
            // below `end` (even, at most u64::MAX - 1) before each answer.
            let mut want = 1u64;
            while want < end {
                while l.0.load(Ordering::Acquire) != want {
                    std::hint::spin_loop();
                }
                l.0.store(want + 1, Ordering::Release);
                want += 2;
            }
        });
        pin(cores[0]);
        // `v` reaches `end` after the last trip: no step overflows.
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
    // batches >= 1: the slice has a middle, a first and a last.
    let (Some(&min), Some(&max)) = (results.first(), results.last()) else {
        return Err("no batches ran".into());
    };
    let med = results[results.len() / 2];
    if a.json {
        println!(
            "{}",
            serde_json::json!({ "round_trip_ns": med, "min_ns": min, "max_ns": max, "batches": results })
        );
    } else {
        println!("cross-core cache-line round trip (cores {}): median {med:.1} ns, range {min:.1}..{max:.1} ns over {} batches", a.cores, a.batches);
    }
    Ok(())
}
