//! The I/O pattern of a job, shared by `perf` and `bdevperf`: where the
//! next I/O goes and whether it reads.
//!
//! Budget per I/O: one LCG step (two with a read/write mix), one
//! multiply-shift for a random unit (no division), one comparison for the
//! read/write decision.

#[derive(Clone, Copy, Debug)]
pub enum Mix {
    AllRead,
    AllWrite,
    /// Read when the high 32 random bits are below this threshold.
    Reads(u64),
}

impl Mix {
    /// The mix of `-M rwmixread` (percent of reads).
    pub fn from_percent(rwmixread: u8) -> Mix {
        match rwmixread {
            100 => Mix::AllRead,
            0 => Mix::AllWrite,
            m => Mix::Reads(((m.min(100) as u64) << 32) / 100),
        }
    }
}

/// The pattern state of one job.
#[derive(Clone, Debug)]
pub struct Pattern {
    pub rng: u64,
    /// Random units; else sequential from `seq`, wrapping at `units`.
    pub random: bool,
    pub mix: Mix,
    pub seq: u64,
    /// I/O-sized units in the job's range (at least 1).
    pub units: u64,
}

impl Pattern {
    /// A 64-bit LCG step (Knuth's MMIX constants): one multiply and one add.
    /// Its high bits are what the multiply-shift range reduction and the
    /// read/write decision use; the weak low bits are not used alone.
    #[inline(always)]
    fn next_rand(&mut self) -> u64 {
        self.rng = self
            .rng
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.rng
    }

    /// Random units, reads only: [`next_random_read`](Self::next_random_read)
    /// gives the same units as [`next`](Self::next).
    pub fn random_reads(&self) -> bool {
        self.random && matches!(self.mix, Mix::AllRead)
    }

    /// The next I/O's unit when [`random_reads`](Self::random_reads)
    /// (the same draw as `next`, without its tests of the mix and order).
    #[inline(always)]
    pub fn next_random_read(&mut self) -> u64 {
        debug_assert!(self.random_reads());
        let r = self.next_rand();
        ((r as u128 * self.units as u128) >> 64) as u64
    }

    /// The next I/O: its unit (`0..units`) and whether it reads.
    #[inline(always)]
    pub fn next(&mut self) -> (u64, bool) {
        let r = self.next_rand();
        let is_read = match self.mix {
            Mix::AllRead => true,
            Mix::AllWrite => false,
            // A draw of its own: the unit below also comes from the high
            // bits, and sharing them would send reads to low units only.
            Mix::Reads(t) => (self.next_rand() >> 32) < t,
        };
        let unit = if self.random {
            ((r as u128 * self.units as u128) >> 64) as u64
        } else {
            let u = self.seq;
            self.seq += 1;
            if self.seq == self.units {
                self.seq = 0;
            }
            u
        };
        (unit, is_read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_stay_in_range_and_mix_is_honoured() {
        let mut p = Pattern {
            rng: 7,
            random: true,
            mix: Mix::from_percent(30),
            seq: 0,
            units: 1000,
        };
        let mut reads = 0;
        let mut seen = vec![false; 1000];
        for _ in 0..100_000 {
            let (u, r) = p.next();
            assert!(u < 1000);
            seen[u as usize] = true;
            reads += r as u32;
        }
        assert!((27_000..33_000).contains(&reads), "reads {reads}");
        assert!(seen.iter().all(|&s| s), "every unit reached");
        let mut s = Pattern {
            rng: 1,
            random: false,
            mix: Mix::AllWrite,
            seq: 2,
            units: 3,
        };
        let got: Vec<_> = (0..4).map(|_| s.next()).collect();
        assert_eq!(got, [(2, false), (0, false), (1, false), (2, false)]);
        assert!(matches!(Mix::from_percent(100), Mix::AllRead));
        assert!(matches!(Mix::from_percent(0), Mix::AllWrite));
    }

    /// The random-read loop's draw is `next`'s: the same units in the
    /// same order, all reads; only random all-read patterns qualify.
    #[test]
    fn random_read_draw_is_nexts() {
        let p = |random, mix| Pattern {
            rng: 99,
            random,
            mix,
            seq: 0,
            units: 12_345,
        };
        let (mut a, mut b) = (p(true, Mix::AllRead), p(true, Mix::AllRead));
        assert!(a.random_reads());
        for _ in 0..10_000 {
            assert_eq!(a.next(), (b.next_random_read(), true));
        }
        assert!(!p(false, Mix::AllRead).random_reads());
        assert!(!p(true, Mix::AllWrite).random_reads());
        assert!(!p(true, Mix::from_percent(70)).random_reads());
    }
}
