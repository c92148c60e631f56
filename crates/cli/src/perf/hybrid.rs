//! Hybrid polling (`--poll-mode hybrid`), as Linux's block layer once did
//! it: after a poll that finds nothing, the worker sleeps once for about
//! half the mean time between completions, then spins until the next one.
//!
//! The mean is taken without a clock read per I/O: one read every
//! [`WINDOW`] completions, on the idle path, gives the time per completion
//! over that window (the sleeps included, as Linux's per-request times
//! included them: a sleep that overshoots lengthens the mean by at most
//! half of itself, so the estimate settles instead of running away).
//! The worker's timer slack is set to 1 ns (`PR_SET_TIMERSLACK`; the
//! default 50 µs would dwarf any sleep here), and what the shortest sleep
//! costs on this machine is measured at start: a sleep is asked for half
//! the mean minus that cost, and skipped when that is not positive (then
//! hybrid is polled mode). Each sleep is timed (two clock reads per sleep,
//! next to a sleep of microseconds) and its overshoot kept as a moving
//! average of the cost: on a loaded core a wake-up can take milliseconds,
//! and a mean lengthened by such sleeps would otherwise keep the worker
//! sleeping (and losing its core) for good. Each skipped sleep moves
//! that cost 1/256 of the way back to the shortest sleep's.
use std::time::{Duration, Instant};

/// Completions between two clock reads of the mean's estimate.
const WINDOW: u64 = 64;
/// Sleeps timed to find the shortest sleep's cost (the median is kept).
const CALIBRATION_SLEEPS: usize = 31;

/// What a hybrid worker reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct HybridStats {
    /// What a sleep of 1 ns took (median at start), in ns.
    pub min_sleep_ns: u64,
    /// What a sleep cost beyond the time asked for, in ns: `min_sleep_ns`
    /// at start, then a moving average over the sleeps taken (1/8 each),
    /// decaying towards `min_sleep_ns` by 1/256 per skipped sleep.
    pub cost_ns: u64,
    /// The last estimate of the mean time between completions, in ns.
    pub mean_ns: u64,
    /// Sleeps taken.
    pub sleeps: u64,
    /// Idle rounds that would have slept but found half the mean too
    /// short to sleep.
    pub skipped: u64,
}

pub struct Hybrid {
    stats: HybridStats,
    /// Completions since the window started.
    window_ios: u64,
    window_start: Instant,
    /// A completion came since the last idle round's decision: the next
    /// idle round may sleep (once per completion, then it spins).
    armed: bool,
}

/// Sets the calling thread's timer slack to 1 ns (sleeps end when asked,
/// not up to 50 µs later).
fn set_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes an integer and touches no memory of
    // ours.
    let r = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0) };
    if r != 0 {
        tracing::warn!(
            "PR_SET_TIMERSLACK: {}: hybrid sleeps may end late",
            std::io::Error::last_os_error()
        );
    }
}

/// The median time a sleep of 1 ns takes on this thread, in ns.
pub fn min_sleep_ns() -> u64 {
    let mut t: Vec<u64> = (0..CALIBRATION_SLEEPS)
        .map(|_| {
            let t0 = Instant::now();
            std::thread::sleep(Duration::from_nanos(1));
            t0.elapsed().as_nanos() as u64
        })
        .collect();
    t.sort_unstable();
    t[t.len() / 2]
}

impl Hybrid {
    /// Sets this thread's timer slack and measures the shortest sleep.
    pub fn new() -> Hybrid {
        set_timer_slack();
        let min = min_sleep_ns();
        Hybrid {
            stats: HybridStats {
                min_sleep_ns: min,
                cost_ns: min,
                ..HybridStats::default()
            },
            window_ios: 0,
            window_start: Instant::now(),
            armed: false,
        }
    }

    /// A round of polls completed `n` I/Os.
    #[inline(always)]
    pub fn completed(&mut self, n: u32) {
        if n != 0 {
            self.window_ios += n as u64;
            self.armed = true;
        }
    }

    /// A round of polls found nothing: the first such round after a
    /// completion sleeps about half the mean time between completions.
    #[inline]
    pub fn idle(&mut self) {
        if self.armed {
            self.sleep();
        }
    }

    #[cold]
    fn sleep(&mut self) {
        self.armed = false;
        if self.window_ios >= WINDOW {
            let now = Instant::now();
            let ns = now.duration_since(self.window_start).as_nanos() as u64;
            self.stats.mean_ns = ns / self.window_ios;
            self.window_ios = 0;
            self.window_start = now;
        }
        match nap(self.stats.mean_ns, self.stats.cost_ns) {
            Some(d) => {
                self.stats.sleeps += 1;
                let t0 = Instant::now();
                std::thread::sleep(d);
                let over = (t0.elapsed().as_nanos() as u64).saturating_sub(d.as_nanos() as u64);
                self.stats.cost_ns = (self.stats.cost_ns * 7 + over) / 8;
            }
            None => {
                self.stats.skipped += 1;
                // Forget a slow wake-up slowly (1/256 of the excess per
                // skip): one preemption must not turn sleeping off for
                // the rest of the run.
                let s = &mut self.stats;
                s.cost_ns -= s.cost_ns.saturating_sub(s.min_sleep_ns) / 256;
            }
        }
    }

    pub fn stats(&self) -> HybridStats {
        self.stats
    }
}

/// How long to ask to sleep to wake after about half of `mean_ns`, when
/// the shortest sleep takes `min_sleep_ns`: None when that is too short to
/// sleep at all (or no mean is known yet).
pub fn nap(mean_ns: u64, min_sleep_ns: u64) -> Option<Duration> {
    let half = mean_ns / 2;
    (half > min_sleep_ns).then(|| Duration::from_nanos(half - min_sleep_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_half_the_mean_less_the_cost_of_a_sleep() {
        assert_eq!(nap(0, 0), None, "no mean yet: no sleep");
        assert_eq!(nap(100_000, 5_000), Some(Duration::from_nanos(45_000)));
        assert_eq!(nap(10_000, 5_000), None, "half the mean is a sleep's cost");
        assert_eq!(nap(400, 3_000), None);
    }

    #[test]
    fn sleeps_once_per_completion_and_tracks_the_mean() {
        let mut h = Hybrid::new();
        assert!(h.stats().min_sleep_ns > 0);
        h.idle();
        assert_eq!(
            (h.stats().sleeps, h.stats().skipped),
            (0, 0),
            "nothing completed yet"
        );
        // A window of completions over >= 64 ms: a mean of >= 1 ms.
        std::thread::sleep(Duration::from_millis(64));
        h.completed(WINDOW as u32);
        h.idle();
        let s = h.stats();
        assert!(s.mean_ns >= 1_000_000, "{s:?}");
        assert_eq!(s.sleeps + s.skipped, 1, "{s:?}");
        h.idle();
        assert_eq!(
            h.stats().sleeps + h.stats().skipped,
            1,
            "once per completion"
        );
    }

    #[test]
    fn a_slow_wake_up_is_forgotten_over_skipped_sleeps() {
        let mut h = Hybrid::new();
        let min = h.stats.min_sleep_ns;
        // One wake-up took a second; the mean (1 us) is too short to sleep.
        h.stats.cost_ns = min + 1_000_000_000;
        h.stats.mean_ns = 1_000;
        for _ in 0..4096 {
            h.completed(1);
            h.idle();
        }
        let s = h.stats();
        assert_eq!((s.sleeps, s.skipped), (0, 4096), "{s:?}");
        assert!(s.cost_ns < min + 1_000_000_000 / 1000, "{s:?}");
        assert!(s.cost_ns >= min, "{s:?}");
    }
}
