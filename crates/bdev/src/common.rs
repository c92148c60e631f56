//! What every backend's channel shares: the checks every request passes,
//! the channel's counts, latency slots and split parents.
use std::sync::Arc;

use crate::error::SubmitError;
use crate::info::BdevInfo;
use crate::latency::Latency;
use crate::split::{Parents, CHILD};
use crate::stats::{ChanCounters, Registry};

/// What every backend's channel shares: the checks' inputs, counters,
/// latency slots and split parents.
pub(crate) struct Common {
    pub shift: u32,
    pub num_blocks: u64,
    pub writable: bool,
    /// `CHILD` when latency is tracked, else 0: OR-ed into the user data so
    /// one test sends both a reserved bit and latency tracking to the slow
    /// path, at submission and completion.
    pub slow_bit: u64,
    /// This channel's counts, plain: published to `ctr` once per poll.
    pub n: Counts,
    pub ctr: Arc<ChanCounters>,
    pub lat: Option<Box<Latency>>,
    pub parents: Parents,
    pub reg: Arc<Registry>,
    pub backend: &'static str,
}

/// Per-channel counts (one writer).
#[derive(Clone, Copy, Default)]
pub(crate) struct Counts {
    pub reads: u64,
    pub writes: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub others: u64,
    pub errors: u64,
}

impl Common {
    pub fn new(info: &BdevInfo, writable: bool, reg: Arc<Registry>, latency: bool) -> Common {
        let lat = if latency {
            Latency::new().map(Box::new)
        } else {
            None
        };
        Common {
            shift: info.block_shift(),
            num_blocks: info.num_blocks,
            writable,
            slow_bit: if lat.is_some() { CHILD } else { 0 },
            n: Counts::default(),
            ctr: reg.register(),
            lat,
            parents: Parents::default(),
            reg,
            backend: info.backend,
        }
    }

    /// Makes the counts visible to `Bdev::stats` (relaxed stores; this
    /// thread is the only writer).
    #[inline(always)]
    pub fn publish(&self) {
        self.publish_rw(false);
        self.publish_rw(true);
        let (c, n) = (&*self.ctr, &self.n);
        set(&c.others, n.others);
        set(&c.errors, n.errors);
    }

    /// Publishes the read (or write) counts and the error count.
    #[inline(always)]
    pub fn publish_rw(&self, write: bool) {
        let (c, n) = (&*self.ctr, &self.n);
        if write {
            set(&c.writes, n.writes);
            set(&c.write_bytes, n.write_bytes);
        } else {
            set(&c.reads, n.reads);
            set(&c.read_bytes, n.read_bytes);
        }
    }

    /// `[lba, lba + nlb)` inside the bdev.
    #[inline(always)]
    pub(crate) fn range(&self, lba: u64, nlb: u64) -> Result<(), SubmitError> {
        match lba.checked_add(nlb) {
            Some(end) if end <= self.num_blocks && nlb > 0 => Ok(()),
            _ if nlb == 0 => Err(SubmitError::ZeroLength),
            _ => Err(SubmitError::OutOfRange {
                lba,
                nlb,
                num_blocks: self.num_blocks,
            }),
        }
    }

    /// Blocks in `len` bytes, which must be whole blocks.
    #[inline(always)]
    pub(crate) fn blocks(&self, len: usize) -> Result<u64, SubmitError> {
        if len & ((1usize << self.shift) - 1) != 0 {
            return Err(SubmitError::NotBlockMultiple {
                len,
                block_size: 1 << self.shift,
            });
        }
        Ok((len >> self.shift) as u64)
    }

    /// Checks common to every request; returns the user data to carry.
    #[inline(always)]
    pub(crate) fn admit(&mut self, user_data: u64, writes: bool) -> Result<u64, SubmitError> {
        if (user_data | self.slow_bit) & CHILD != 0 {
            return self.admit_slow(user_data, writes);
        }
        if writes && !self.writable {
            return Err(SubmitError::ReadOnly);
        }
        Ok(user_data)
    }

    #[cold]
    #[inline(never)]
    fn admit_slow(&mut self, user_data: u64, writes: bool) -> Result<u64, SubmitError> {
        if user_data & CHILD != 0 {
            return Err(SubmitError::ReservedUserData(user_data));
        }
        if writes && !self.writable {
            return Err(SubmitError::ReadOnly);
        }
        Ok(match &mut self.lat {
            None => user_data,
            Some(l) => l.start(user_data),
        })
    }

    /// The request carrying `carried` was refused after `admit`.
    #[cold]
    pub(crate) fn unadmit(&mut self, carried: u64) {
        if let Some(l) = &mut self.lat {
            l.cancel(carried);
        }
    }

    #[inline(always)]
    pub(crate) fn count(&mut self, write: bool, len: usize) {
        let n = &mut self.n;
        if write {
            n.writes += 1;
            n.write_bytes += len as u64;
        } else {
            n.reads += 1;
            n.read_bytes += len as u64;
        }
    }

    #[inline(always)]
    pub(crate) fn count_other(&mut self) {
        self.n.others += 1;
    }
}

#[inline(always)]
fn set(c: &std::sync::atomic::AtomicU64, v: u64) {
    c.store(v, std::sync::atomic::Ordering::Relaxed);
}
