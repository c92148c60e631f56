//! `DeviceThread`: one OS thread stepping many controllers, optionally
//! pinned to a CPU.
//!
//! The loop busy-polls. After ~1 ms without work on any controller it sleeps
//! between rounds (50 µs, backing off to 1 ms), and goes back to busy
//! polling as soon as a round finds work. A sleep never runs past the
//! earliest deadline a controller reports (a coalesced interrupt's
//! aggregation time, a delayed completion), so those fire on time even when
//! the host is idle. Attach/detach go through a Mutex<Vec<..>> plus an AtomicBool
//! "changed" flag checked once per round (no lock per round); `detach`
//! waits until the thread has picked up the change, so once it returns the
//! thread no longer steps (or holds) that device. Drop stops and joins.
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::SoftDevice;

/// Idle rounds between clock reads (the idle-to-sleep check).
const IDLE_CLOCK_ROUNDS: u32 = 1024;
const IDLE_BEFORE_SLEEP: Duration = Duration::from_millis(1);
const IDLE_SLEEP: Duration = Duration::from_micros(50);
/// Longest idle sleep (the back-off's cap): the most an idle controller
/// adds to the first command after a pause.
const IDLE_SLEEP_MAX: Duration = Duration::from_millis(1);
/// Most steps of one device under one lock while it finds no work (see
/// `SoftDevice::step_burst`): when the thread steps one device only. A
/// caller of the device's locked API (DMA maps, statistics, faults) waits
/// at most this many idle steps (about a microsecond) more.
/// `POLLUX_SOFT_STEP_BURST=1` turns it off.
const STEP_BURST: u32 = 32;

struct Shared {
    devices: Mutex<Vec<Arc<SoftDevice>>>,
    changed: AtomicBool,
    stop: AtomicBool,
    /// Bumped on every attach/detach.
    generation: AtomicU64,
    /// Last generation the thread has applied.
    applied: AtomicU64,
}

/// A thread that steps attached devices.
pub struct DeviceThread {
    shared: Arc<Shared>,
    handle: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for DeviceThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceThread").finish_non_exhaustive()
    }
}

impl DeviceThread {
    /// Starts the thread, pinned to `cpu` if given.
    pub fn spawn(cpu: Option<usize>) -> std::io::Result<DeviceThread> {
        let shared = Arc::new(Shared {
            devices: Mutex::new(Vec::new()),
            changed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            generation: AtomicU64::new(0),
            applied: AtomicU64::new(0),
        });
        let (tx, rx) = mpsc::channel();
        let sh = shared.clone();
        let handle = std::thread::Builder::new()
            .name("softnvme".into())
            .spawn(move || {
                let r = cpu.map_or(Ok(()), |c| Ok(pollux_runtime::pin_to_core(c)?));
                let ok = r.is_ok();
                let _ = tx.send(r);
                if ok {
                    run(&sh);
                }
            })?;
        match rx.recv() {
            Ok(Ok(())) => Ok(DeviceThread {
                shared,
                handle: Some(handle),
            }),
            Ok(Err(e)) => {
                let _ = handle.join();
                Err(e)
            }
            Err(_) => {
                let _ = handle.join();
                Err(std::io::Error::other("device thread died at start"))
            }
        }
    }

    /// Starts stepping `dev` (attaching twice is a no-op).
    pub fn attach(&self, dev: Arc<SoftDevice>) {
        {
            let mut v = self
                .shared
                .devices
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if v.iter().any(|d| Arc::ptr_eq(d, &dev)) {
                return;
            }
            v.push(dev);
        }
        self.changed();
    }

    /// Stops stepping `dev`; returns once the thread has let go of it.
    pub fn detach(&self, dev: &Arc<SoftDevice>) {
        {
            let mut v = self
                .shared
                .devices
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            v.retain(|d| !Arc::ptr_eq(d, dev));
        }
        let gen = self.changed();
        while self.shared.applied.load(Ordering::Acquire) < gen {
            if self.handle.as_ref().is_none_or(|h| h.is_finished()) {
                break;
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn changed(&self) -> u64 {
        let gen = self.shared.generation.fetch_add(1, Ordering::AcqRel) + 1;
        self.shared.changed.store(true, Ordering::Release);
        gen
    }
}

/// `STEP_BURST`, or `POLLUX_SOFT_STEP_BURST` (1..=1024) if set.
fn step_burst() -> u32 {
    match std::env::var("POLLUX_SOFT_STEP_BURST") {
        Ok(v) => match v.parse::<u32>() {
            Ok(n @ 1..=1024) => n,
            _ => {
                tracing::warn!("POLLUX_SOFT_STEP_BURST={v}: not 1..=1024, using {STEP_BURST}");
                STEP_BURST
            }
        },
        Err(_) => STEP_BURST,
    }
}

fn run(sh: &Shared) {
    let burst = step_burst();
    let mut devs: Vec<Arc<SoftDevice>> = Vec::new();
    let mut idle_since: Option<Instant> = None;
    let mut idle_rounds: u32 = 0;
    let mut sleeping = false;
    let mut sleep_for = IDLE_SLEEP;
    while !sh.stop.load(Ordering::Relaxed) {
        // A plain load first: the swap (a locked read-modify-write) only
        // when something changed.
        if sh.changed.load(Ordering::Relaxed) && sh.changed.swap(false, Ordering::AcqRel) {
            let gen = sh.generation.load(Ordering::Acquire);
            devs = sh.devices.lock().unwrap_or_else(|e| e.into_inner()).clone();
            sh.applied.store(gen, Ordering::Release);
        }
        let mut work = 0;
        let mut wake: Option<Instant> = None;
        // Several devices take turns each step; one steps in bursts.
        let rounds = if devs.len() == 1 { burst } else { 1 };
        for d in &devs {
            let (n, due) = d.step_burst(rounds);
            work += n;
            if let Some(t) = due {
                wake = Some(wake.map_or(t, |w| w.min(t)));
            }
        }
        if work > 0 {
            idle_rounds = 0;
            idle_since = None;
            sleeping = false;
            sleep_for = IDLE_SLEEP;
            continue;
        }
        // Idle for a while: sleep between rounds (an idle device thread
        // costs ~nothing) until work appears.
        if sleeping {
            // Back off from IDLE_SLEEP to IDLE_SLEEP_MAX while nothing
            // happens: an idle controller thread should cost ~nothing.
            let nap = nap(
                sleep_for,
                wake.map(|t| t.saturating_duration_since(Instant::now())),
            );
            if !nap.is_zero() {
                std::thread::sleep(nap);
            }
            sleep_for = (sleep_for * 2).min(IDLE_SLEEP_MAX);
            continue;
        }
        // Recently busy: spin without `pause` (it costs ~140 cycles on
        // recent x86 cores, which a QD 1 command would wait out), reading
        // the clock only every IDLE_CLOCK_ROUNDS rounds, and start sleeping
        // after IDLE_BEFORE_SLEEP without work.
        idle_rounds = idle_rounds.wrapping_add(1);
        if !idle_rounds.is_multiple_of(IDLE_CLOCK_ROUNDS) {
            continue;
        }
        let now = Instant::now();
        match idle_since {
            None => idle_since = Some(now),
            Some(t) => sleeping = now.duration_since(t) >= IDLE_BEFORE_SLEEP,
        }
    }
    // Let go of the devices before exiting.
    drop(devs);
    sh.applied.store(u64::MAX, Ordering::Release);
}

/// How long an idle round sleeps: the back-off step, but never past the
/// earliest deadline a controller reported (`until_deadline` from now).
fn nap(backoff: Duration, until_deadline: Option<Duration>) -> Duration {
    match until_deadline {
        Some(d) => backoff.min(d),
        None => backoff,
    }
}

impl Drop for DeviceThread {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_sleep_stops_at_the_next_deadline() {
        let ms = Duration::from_millis;
        assert_eq!(nap(ms(1), None), ms(1));
        assert_eq!(
            nap(ms(1), Some(Duration::from_micros(300))),
            Duration::from_micros(300)
        );
        assert_eq!(nap(ms(1), Some(ms(5))), ms(1));
        assert_eq!(nap(ms(1), Some(Duration::ZERO)), Duration::ZERO);
    }
}
