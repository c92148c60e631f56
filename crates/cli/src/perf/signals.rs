//! SIGINT and SIGTERM during a perf run stop it, as `pollux bdevperf`
//! does: the workers stop submitting, drain what is in flight (bounded by
//! the drain timeout), and the summary is printed, marked interrupted.
//! Later signals change nothing (`timeout -s INT` sends its signal twice:
//! to the process and to its process group).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::SigId;

/// Watches for SIGINT/SIGTERM while it lives (the process no longer dies
/// of the first one). Dropping it removes its actions; signal-hook keeps
/// its handler, so the signals are then ignored: drop it when the run's
/// output is written, just before the process exits.
pub struct StopOnSignals {
    flag: Arc<AtomicBool>,
    ids: Vec<SigId>,
}

impl StopOnSignals {
    pub fn install() -> std::io::Result<StopOnSignals> {
        let flag = Arc::new(AtomicBool::new(false));
        let mut s = StopOnSignals {
            flag,
            ids: Vec::new(),
        };
        for sig in [SIGINT, SIGTERM] {
            s.ids
                .push(signal_hook::flag::register(sig, Arc::clone(&s.flag))?);
        }
        Ok(s)
    }

    /// Whether a signal asked the run to stop.
    pub fn triggered(&self) -> bool {
        self.flag.load(Ordering::Relaxed)
    }
}

impl Drop for StopOnSignals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
