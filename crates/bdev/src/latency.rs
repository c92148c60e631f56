//! Optional per-channel latency tracking: the request's user data is
//! swapped for a slot that keeps it with the submission time. Off by
//! default; only then is the clock read per I/O.
use std::time::Instant;

use hdrhistogram::Histogram;

use crate::stats::new_histogram;

/// Completions recorded between merges into the bdev's histogram.
pub(crate) const MERGE_EVERY: u32 = 4096;

pub(crate) struct Latency {
    slots: Vec<(u64, Instant)>,
    free: Vec<u32>,
    pub hist: Histogram<u64>,
    since_merge: u32,
}

impl Latency {
    /// None (latency not tracked, with a warning) if the histogram
    /// cannot be made.
    pub fn new() -> Option<Latency> {
        let hist = new_histogram()
            .inspect_err(|e| tracing::warn!("latency histogram: {e}; latency not tracked"))
            .ok()?;
        Some(Latency {
            slots: Vec::new(),
            free: Vec::new(),
            hist,
            since_merge: 0,
        })
    }

    /// Remembers `user_data` and now; returns the slot to carry instead.
    #[inline]
    pub fn start(&mut self, user_data: u64) -> u64 {
        let now = Instant::now();
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = (user_data, now);
                i as u64
            }
            None => {
                self.slots.push((user_data, now));
                (self.slots.len() - 1) as u64
            }
        }
    }

    /// A request refused after `start`: forget the slot, give back the
    /// user data.
    pub fn cancel(&mut self, slot: u64) -> u64 {
        self.free.push(slot as u32);
        self.slots[slot as usize].0
    }

    /// Records the latency of `slot`; returns the user data and whether
    /// the histogram is due to be merged.
    #[inline]
    pub fn finish(&mut self, slot: u64) -> (u64, bool) {
        let Some(&(ud, t0)) = self.slots.get(slot as usize) else {
            // Not ours: cannot happen (the layer made every slot).
            tracing::error!(slot, "latency slot out of range");
            return (slot, false);
        };
        self.free.push(slot as u32);
        let ns = t0.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.hist.saturating_record(ns.max(1));
        self.since_merge += 1;
        let due = self.since_merge >= MERGE_EVERY;
        if due {
            self.since_merge = 0;
        }
        (ud, due)
    }
}
