//! Latency figures of `-L` (perf and bdevperf): the histograms the jobs
//! record into (clock ticks, allocated once per job: recording never
//! allocates), and what the reports make of them, in microseconds:
//! average, min, max and the percentiles SPDK users look at, and with
//! `-LL` a histogram of buckets (as SPDK's perf prints with -LL).
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};

/// `-L` given twice or more: the report adds a histogram.
pub const HISTOGRAM_LEVEL: u8 = 2;

/// The percentiles reported, with their names in the table and the JSON.
pub const PERCENTILES: [(f64, &str, &str); 5] = [
    (0.50, "p50", "p50_lat_us"),
    (0.90, "p90", "p90_lat_us"),
    (0.99, "p99", "p99_lat_us"),
    (0.999, "p99.9", "p99_9_lat_us"),
    (0.9999, "p99.99", "p99_99_lat_us"),
];

/// Buckets per power of two in the `-LL` histogram (each about 9% wide).
const BUCKETS_PER_OCTAVE: f64 = 8.0;

/// An empty histogram of latencies in clock ticks, 1 tick up to an hour at
/// a few GHz, 3 significant digits. Fixed bounds: recording never
/// allocates.
pub fn histogram() -> Result<Histogram<u64>, hdrhistogram::CreationError> {
    Histogram::new_with_bounds(1, 36_000_000_000_000, 3)
}

/// The sum of `hs` (`None` if empty).
pub fn merged<'a>(hs: impl IntoIterator<Item = &'a Histogram<u64>>) -> Option<Histogram<u64>> {
    let mut out: Option<Histogram<u64>> = None;
    for h in hs {
        match &mut out {
            None => out = Some(h.clone()),
            Some(t) => {
                // Same bounds everywhere: adding cannot fail.
                let _ = t.add(h);
            }
        }
    }
    out
}

/// Average, min, percentiles and max of `h`, in microseconds.
pub struct Stats {
    pub avg: f64,
    pub min: f64,
    pub pct: [f64; PERCENTILES.len()],
    pub max: f64,
}

impl Stats {
    pub fn of(h: &Histogram<u64>, ns_per_tick: f64) -> Stats {
        let us = |ticks: f64| ticks * ns_per_tick / 1000.0;
        Stats {
            avg: us(h.mean()),
            min: us(h.min() as f64),
            pct: PERCENTILES.map(|(q, _, _)| us(h.value_at_quantile(q) as f64)),
            max: us(h.max() as f64),
        }
    }
}

/// The JSON fields of `h` (all null without one): `avg_lat_us`,
/// `min_lat_us`, `max_lat_us` and the percentiles (`p50_lat_us` ..
/// `p99_99_lat_us`); with `-LL` also `histogram`, its buckets.
pub fn json_fields(h: Option<&Histogram<u64>>, ns_per_tick: f64, level: u8) -> Map<String, Value> {
    let s = h
        .filter(|h| !h.is_empty())
        .map(|h| Stats::of(h, ns_per_tick));
    let mut m = Map::new();
    m.insert("avg_lat_us".into(), json!(s.as_ref().map(|s| s.avg)));
    m.insert("min_lat_us".into(), json!(s.as_ref().map(|s| s.min)));
    for (i, (_, _, key)) in PERCENTILES.iter().enumerate() {
        m.insert((*key).into(), json!(s.as_ref().map(|s| s.pct[i])));
    }
    m.insert("max_lat_us".into(), json!(s.as_ref().map(|s| s.max)));
    if let (Some(h), true) = (h, level >= HISTOGRAM_LEVEL) {
        let b: Vec<Value> = buckets(h, ns_per_tick)
            .iter()
            .map(|b| json!({"from_us": b.from_us, "to_us": b.to_us, "count": b.count, "cumulative_pct": b.cumulative_pct}))
            .collect();
        m.insert("histogram".into(), Value::Array(b));
    }
    m
}

/// Adds `fields` to the JSON object `v`.
pub fn extend(v: &mut Value, fields: Map<String, Value>) {
    if let Value::Object(o) = v {
        o.extend(fields);
    }
}

/// One bucket of the `-LL` histogram: latencies in `[from_us, to_us)`.
pub struct Bucket {
    pub from_us: f64,
    pub to_us: f64,
    pub count: u64,
    /// Share of all I/Os at or below this bucket, in percent.
    pub cumulative_pct: f64,
}

/// The non-empty buckets of `h`: powers of two of nanoseconds, each cut
/// into [`BUCKETS_PER_OCTAVE`], so a few dozen lines cover any spread.
pub fn buckets(h: &Histogram<u64>, ns_per_tick: f64) -> Vec<Bucket> {
    let total = h.len().max(1) as f64;
    let mut out: Vec<(i64, u64)> = Vec::new();
    for v in h.iter_recorded() {
        let ns = (v.value_iterated_to() as f64 * ns_per_tick).max(1.0);
        let i = (ns.log2() * BUCKETS_PER_OCTAVE).floor() as i64;
        match out.last_mut() {
            Some((last, n)) if *last == i => *n += v.count_at_value(),
            _ => out.push((i, v.count_at_value())),
        }
    }
    let edge = |i: i64| (i as f64 / BUCKETS_PER_OCTAVE).exp2() / 1000.0;
    let mut so_far = 0u64;
    out.into_iter()
        .map(|(i, count)| {
            so_far += count;
            Bucket {
                from_us: edge(i),
                to_us: edge(i + 1),
                count,
                cumulative_pct: so_far as f64 * 100.0 / total,
            }
        })
        .collect()
}

/// Prints the percentile table: one row per `(name, histogram)`, the name
/// column `width` wide.
pub fn print_table(rows: &[(String, &Histogram<u64>)], ns_per_tick: f64, width: usize) {
    let mut head = format!("{:<width$}: {:>10} {:>10}", "Latency(us)", "Average", "min");
    for (_, name, _) in PERCENTILES {
        head += &format!(" {name:>10}");
    }
    head += &format!(" {:>10}", "max");
    println!("{head}");
    for (name, h) in rows {
        if h.is_empty() {
            println!("{name:<width$}: no I/O completed");
            continue;
        }
        let s = Stats::of(h, ns_per_tick);
        let mut line = format!("{name:<width$}: {:>10.2} {:>10.2}", s.avg, s.min);
        for p in s.pct {
            line += &format!(" {p:>10.2}");
        }
        line += &format!(" {:>10.2}", s.max);
        println!("{line}");
    }
}

/// Prints `h`'s histogram as SPDK's perf does with -LL: each non-empty
/// bucket's range, the cumulative share and the count.
pub fn print_histogram(title: &str, h: &Histogram<u64>, ns_per_tick: f64) {
    println!("Latency histogram for {title}:");
    println!("{}", "=".repeat(78));
    println!("       Range in us     Cumulative    IO count");
    for b in buckets(h, ns_per_tick) {
        println!(
            "{:9.3} - {:9.3}: {:9.4}%  ({:9})",
            b.from_us, b.to_us, b.cumulative_pct, b.count
        );
    }
    println!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_io_in_order() {
        let mut h = histogram().unwrap();
        for ns in [900u64, 1000, 1100, 5000, 5000, 80_000] {
            h.record(ns).unwrap();
        }
        let b = buckets(&h, 1.0);
        assert_eq!(b.iter().map(|b| b.count).sum::<u64>(), 6);
        assert!(b.windows(2).all(|w| w[0].to_us <= w[1].from_us));
        assert!(b.iter().all(|b| b.from_us < b.to_us));
        assert!((b.last().unwrap().cumulative_pct - 100.0).abs() < 1e-9);
        // 5 us falls in a bucket around it.
        assert!(b
            .iter()
            .any(|b| b.count == 2 && b.from_us <= 5.0 && 5.0 < b.to_us));
        let s = Stats::of(&h, 1.0);
        assert!(s.min <= s.pct[0] && s.pct.windows(2).all(|w| w[0] <= w[1]) && s.pct[4] <= s.max);
    }
}
