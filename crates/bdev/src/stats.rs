//! Per-bdev statistics, readable while I/O runs.
//!
//! Each channel counts into its own cache line with plain relaxed
//! load-and-store pairs (one writer: no atomic read-modify-write, no
//! shared line on the I/O path); `Bdev::stats` sums the live channels and
//! what closed channels left behind. Latency, when a channel tracks it,
//! goes into the channel's own histogram and is merged into the bdev's
//! every `MERGE_EVERY` completions and when the channel closes, so a
//! reader sees it at most that many completions late.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use hdrhistogram::Histogram;

/// Counters one channel writes.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct ChanCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    /// Flush, write zeroes, unmap, reset, passthrough.
    pub others: AtomicU64,
    pub errors: AtomicU64,
}

/// A snapshot of a bdev's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BdevStats {
    /// Read requests submitted (a vector counts once).
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub others: u64,
    /// Requests completed with an error.
    pub errors: u64,
    /// Latency from submission to completion, when some channel tracks it.
    pub latency: Option<LatencySummary>,
}

/// Latency percentiles in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySummary {
    pub count: u64,
    pub min_ns: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

impl LatencySummary {
    pub fn of(h: &Histogram<u64>) -> Option<LatencySummary> {
        (!h.is_empty()).then(|| LatencySummary {
            count: h.len(),
            min_ns: h.min(),
            mean_ns: h.mean(),
            p50_ns: h.value_at_quantile(0.5),
            p99_ns: h.value_at_quantile(0.99),
            max_ns: h.max(),
        })
    }
}

/// A new latency histogram: 1 ns to 100 s, 3 significant digits (the
/// bounds are valid, so it does not fail; callers still handle it).
pub(crate) fn new_histogram() -> Result<Histogram<u64>, hdrhistogram::CreationError> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3)
}

/// The bdev's view of all its channels.
#[derive(Default)]
pub(crate) struct Registry {
    live: Mutex<Vec<Arc<ChanCounters>>>,
    retired: Mutex<BdevStats>,
    latency: Mutex<Option<Histogram<u64>>>,
}

fn add(s: &mut BdevStats, c: &ChanCounters) {
    s.reads += c.reads.load(Relaxed);
    s.writes += c.writes.load(Relaxed);
    s.read_bytes += c.read_bytes.load(Relaxed);
    s.write_bytes += c.write_bytes.load(Relaxed);
    s.others += c.others.load(Relaxed);
    s.errors += c.errors.load(Relaxed);
}

impl Registry {
    pub fn register(&self) -> Arc<ChanCounters> {
        let c = Arc::new(ChanCounters::default());
        lock(&self.live).push(c.clone());
        c
    }

    /// A channel closes: its counts move to the retired totals.
    pub fn retire(&self, c: &Arc<ChanCounters>) {
        let mut live = lock(&self.live);
        live.retain(|x| !Arc::ptr_eq(x, c));
        add(&mut lock(&self.retired), c);
    }

    pub fn merge_latency(&self, h: &Histogram<u64>) {
        let mut g = lock(&self.latency);
        match &mut *g {
            Some(total) => {
                // Both come from new_histogram(): same bounds.
                if total.add(h).is_err() {
                    tracing::warn!("latency histogram merge failed (values out of range)");
                }
            }
            None => *g = Some(h.clone()),
        }
    }

    pub fn snapshot(&self) -> BdevStats {
        let mut s = lock(&self.retired).clone();
        for c in lock(&self.live).iter() {
            add(&mut s, c);
        }
        s.latency = lock(&self.latency).as_ref().and_then(LatencySummary::of);
        s
    }

    pub fn reset_latency(&self) {
        *lock(&self.latency) = None;
    }
}

/// A poisoned lock only means a panic elsewhere; the counters are plain
/// numbers, still usable.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
