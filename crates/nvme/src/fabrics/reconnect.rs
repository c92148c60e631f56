//! The reconnect policy of a lost association, Linux's host's: an attempt
//! at once, then one every `reconnect_delay` while that is within
//! `ctrl_loss_tmo` of the start; `fast_io_fail_tmo` after the start, the
//! I/O held meanwhile fails. A schedule in time since the reconnect began,
//! with no clock of its own: the link reads the clock and sleeps.
use std::time::Duration;

use crate::fabrics::options::FabricsOptions;

/// Longer than any reconnect waits (a bound on durations from the options).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 86400);

/// What follows a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Try again this long after the start of the reconnect.
    At(Duration),
    /// `ctrl_loss_tmo` (given) has passed: the controller is given up.
    GiveUp(Duration),
}

/// What to do while waiting for the next attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Sleep this long, then ask again.
    Sleep(Duration),
    /// `fast_io_fail_tmo` has just passed: fail the I/O held, then ask
    /// again.
    FailFast,
    /// Time for the next attempt.
    Attempt,
}

/// One reconnect's schedule.
#[derive(Clone, Debug)]
pub(crate) struct Schedule {
    delay: Duration,
    ctrl_loss_tmo: Option<Duration>,
    fast_io_fail_tmo: Option<Duration>,
    attempt: u32,
    fail_fast: bool,
}

impl Schedule {
    pub fn new(opts: &FabricsOptions) -> Schedule {
        Schedule {
            delay: opts.reconnect_delay,
            ctrl_loss_tmo: opts.ctrl_loss_tmo,
            fast_io_fail_tmo: opts.fast_io_fail_tmo,
            attempt: 0,
            fail_fast: false,
        }
    }

    /// An attempt begins: its number, from 1.
    pub fn attempt(&mut self) -> u32 {
        self.attempt += 1;
        self.attempt
    }

    /// The attempt made failed, `elapsed` after the start: the next on the
    /// schedule (none missed if one took long), or giving up.
    pub fn next(&self, elapsed: Duration) -> Next {
        let next = self
            .delay
            .saturating_mul(self.attempt)
            .max(elapsed)
            .min(FOREVER);
        match self.ctrl_loss_tmo {
            Some(tmo) if next > tmo => Next::GiveUp(tmo),
            _ => Next::At(next),
        }
    }

    /// Waiting for the attempt at `at`, `elapsed` after the start.
    pub fn wait(&mut self, elapsed: Duration, at: Duration) -> Wait {
        let mut wake = at;
        if let Some(ff) = self.fast_io_fail_tmo.map(|d| d.min(FOREVER)) {
            if !self.fail_fast {
                if elapsed >= ff {
                    self.fail_fast = true;
                    return Wait::FailFast;
                }
                wake = wake.min(ff);
            }
        }
        if elapsed >= at {
            return Wait::Attempt;
        }
        Wait::Sleep(wake.saturating_sub(elapsed))
    }

    /// `fast_io_fail_tmo`, bounded as the schedule uses it.
    pub fn fast_io_fail_tmo(&self) -> Option<Duration> {
        self.fast_io_fail_tmo.map(|d| d.min(FOREVER))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(delay: u64, loss: Option<u64>, ff: Option<u64>) -> FabricsOptions {
        FabricsOptions {
            subnqn: String::new(),
            hostnqn: String::new(),
            hostid: [0; 16],
            kato_ms: 0,
            ctrl_loss_tmo: loss.map(Duration::from_secs),
            reconnect_delay: Duration::from_secs(delay),
            fast_io_fail_tmo: ff.map(Duration::from_secs),
            admin_timeout: Duration::from_secs(1),
            sq_flow: false,
            auth: Default::default(),
        }
    }

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn attempts_every_delay_until_ctrl_loss_tmo() {
        // Linux's defaults: every 10 s for 600 s.
        let mut s = Schedule::new(&opts(10, Some(600), None));
        let mut at = Vec::new();
        loop {
            s.attempt();
            match s.next(at.last().copied().unwrap_or_default()) {
                Next::At(t) => at.push(t),
                Next::GiveUp(tmo) => {
                    assert_eq!(tmo, S(600));
                    break;
                }
            }
        }
        // The first attempt at 0, then 10, 20, ... 600: 61 attempts.
        assert_eq!(at.len(), 60);
        assert_eq!(at[0], S(10));
        assert_eq!(at[59], S(600));
        assert_eq!(s.attempt, 61);
    }

    #[test]
    fn a_slow_attempt_moves_the_next_one_no_earlier_than_now() {
        let mut s = Schedule::new(&opts(1, Some(30), None));
        s.attempt();
        // The attempt took 5 s: the next is due at once, not at 1 s.
        assert_eq!(s.next(S(5)), Next::At(S(5)));
        assert_eq!(s.wait(S(5), S(5)), Wait::Attempt);
        s.attempt();
        assert_eq!(s.next(S(6)), Next::At(S(6)));
        s.attempt();
        assert_eq!(s.next(S(6)), Next::At(S(6)));
        // Past ctrl_loss_tmo: give up.
        assert_eq!(s.next(S(31)), Next::GiveUp(S(30)));
    }

    #[test]
    fn no_ctrl_loss_tmo_reconnects_forever() {
        let mut s = Schedule::new(&opts(10, None, None));
        for _ in 0..10_000 {
            s.attempt();
        }
        assert_eq!(s.next(S(0)), Next::At(S(100_000)));
        // Bounded: no overflow however long it runs.
        s.attempt = u32::MAX;
        assert!(matches!(s.next(Duration::MAX), Next::At(_)));
    }

    #[test]
    fn waits_wake_for_fast_io_fail_once_then_for_the_attempt() {
        let mut s = Schedule::new(&opts(10, Some(600), Some(3)));
        s.attempt();
        let Next::At(at) = s.next(S(0)) else {
            panic!("gave up")
        };
        assert_eq!(at, S(10));
        // Woken at fast_io_fail_tmo first.
        assert_eq!(s.wait(S(1), at), Wait::Sleep(S(2)));
        assert_eq!(s.wait(S(3), at), Wait::FailFast);
        // Once only; then the attempt.
        assert_eq!(s.wait(S(3), at), Wait::Sleep(S(7)));
        assert_eq!(s.wait(S(10), at), Wait::Attempt);
        assert_eq!(s.fast_io_fail_tmo(), Some(S(3)));
    }

    #[test]
    fn without_fast_io_fail_tmo_io_is_held_throughout() {
        let mut s = Schedule::new(&opts(10, Some(600), None));
        s.attempt();
        assert_eq!(s.wait(S(0), S(10)), Wait::Sleep(S(10)));
        assert_eq!(s.wait(S(10), S(10)), Wait::Attempt);
    }
}
