//! The latency clock behind `-L`: TSC ticks where the TSC is invariant
//! (`constant_tsc` and `nonstop_tsc` in /proc/cpuinfo), else nanoseconds
//! from `Instant`. On these VMs an `Instant::now()` costs ~43 ns and a TSC
//! read ~18 ns, and -L reads the clock twice per I/O (as SPDK's perf does
//! with its tick counter). Ticks are converted to nanoseconds once, at the
//! end, with a calibration taken over the whole run against `Instant`.
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
pub struct LatClock {
    tsc: bool,
    base: Instant,
    base_ticks: u64,
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn rdtsc() -> u64 {
    // SAFETY: RDTSC has no memory-safety preconditions; only used where
    // /proc/cpuinfo says the TSC is invariant.
    unsafe { std::arch::x86_64::_rdtsc() }
}

#[cfg(not(target_arch = "x86_64"))]
fn rdtsc() -> u64 {
    0
}

fn invariant_tsc() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else {
        return false;
    };
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("constant_tsc") && has("nonstop_tsc")
}

impl LatClock {
    pub fn new() -> LatClock {
        let tsc = invariant_tsc() && std::env::var_os("POLLUX_NO_TSC").is_none();
        LatClock {
            tsc,
            base: Instant::now(),
            base_ticks: if tsc { rdtsc() } else { 0 },
        }
    }

    #[inline(always)]
    pub fn now(&self) -> u64 {
        if self.tsc {
            rdtsc()
        } else {
            self.base.elapsed().as_nanos() as u64
        }
    }

    /// Nanoseconds per tick, measured from creation until now.
    pub fn ns_per_tick(&self) -> f64 {
        if !self.tsc {
            return 1.0;
        }
        let ns = self.base.elapsed().as_nanos() as f64;
        let ticks = rdtsc().wrapping_sub(self.base_ticks) as f64;
        if ticks > 0.0 {
            ns / ticks
        } else {
            1.0
        }
    }

    pub fn source(&self) -> &'static str {
        if self.tsc {
            "tsc"
        } else {
            "clock_gettime"
        }
    }
}

/// CPU time (user + system) this thread has used.
pub fn thread_cpu_time() -> Duration {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_convert_to_elapsed_time() {
        let c = LatClock::new();
        let a = c.now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let b = c.now();
        let ns = (b - a) as f64 * c.ns_per_tick();
        assert!(
            (15e6..2e9).contains(&ns),
            "20 ms sleep measured as {ns} ns with {}",
            c.source()
        );
    }
}
