//! The paths of a multipath namespace, shared by its queue pairs: each
//! path's controller and namespace, its ANA state, and the policy that
//! chooses among them.
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use pollux_nvme::Namespace;
use pollux_spec::identify::CMIC_ANA;
use pollux_spec::log::{lid, AnaLog, AnaState};

use crate::ctrl::Controller;

/// How often a queue pair asks a down path's controller whether it is
/// back.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(10);

/// How often the ANA states of usable paths are read again (the host
/// core runs no Asynchronous Event Requests, so ANA Change notices are
/// not seen: a usable path learns of a better or worse state this way).
pub const ANA_REFRESH: Duration = Duration::from_secs(1);

/// SPDK's `bdev_nvme_set_multipath_policy` `policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// All I/O on the first usable path (in the order given) of the best
    /// ANA state; the next one when it fails.
    ActivePassive,
    /// I/O spread over every usable path of the best ANA state, by the
    /// [`Selector`].
    #[default]
    ActiveActive,
}

/// SPDK's `bdev_nvme_set_multipath_policy` `selector` (active-active).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Selector {
    /// Each I/O on the next path.
    #[default]
    RoundRobin,
    /// Each I/O on the path with the fewest commands outstanding from this
    /// queue pair (the first of them on a tie).
    QueueDepth,
}

impl Policy {
    /// SPDK's name.
    pub fn name(self) -> &'static str {
        match self {
            Policy::ActivePassive => "active_passive",
            Policy::ActiveActive => "active_active",
        }
    }
}

impl Selector {
    /// SPDK's name.
    pub fn name(self) -> &'static str {
        match self {
            Selector::RoundRobin => "round_robin",
            Selector::QueueDepth => "queue_depth",
        }
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "active_passive" => Ok(Policy::ActivePassive),
            "active_active" => Ok(Policy::ActiveActive),
            _ => Err(format!(
                "multipath policy '{s}': expected active_passive or active_active"
            )),
        }
    }
}

impl std::str::FromStr for Selector {
    type Err = String;
    fn from_str(s: &str) -> Result<Selector, String> {
        match s {
            "round_robin" => Ok(Selector::RoundRobin),
            "queue_depth" => Ok(Selector::QueueDepth),
            _ => Err(format!(
                "multipath selector '{s}': expected round_robin or queue_depth"
            )),
        }
    }
}

/// A path's rank by ANA state: lower is better; [`UNUSABLE`] and above
/// take no I/O.
pub(crate) const OPTIMIZED: u8 = 0;
pub(crate) const NON_OPTIMIZED: u8 = 1;
pub(crate) const UNUSABLE: u8 = 2;
/// A queue pair's own rank for a path whose controller is down.
pub(crate) const DOWN: u8 = 3;

fn rank(s: AnaState) -> u8 {
    match s {
        AnaState::Optimized => OPTIMIZED,
        AnaState::NonOptimized => NON_OPTIMIZED,
        AnaState::Inaccessible | AnaState::PersistentLoss | AnaState::Change => UNUSABLE,
    }
}

/// One path.
pub(crate) struct Path {
    /// How the path was given (its transport ID), for messages.
    pub name: String,
    pub ctrl: Controller,
    /// The namespace as this controller made it (a queue pair takes only
    /// its own controller's).
    pub ns: Namespace,
    pub anagrpid: u32,
    /// ANA rank (`OPTIMIZED`, `NON_OPTIMIZED`, `UNUSABLE`).
    pub rank: AtomicU8,
}

/// The paths and the policy: shared by the queue pairs of a multipath
/// namespace.
pub(crate) struct Paths {
    pub list: Vec<Path>,
    pub policy: Policy,
    pub selector: Selector,
    /// Bumped whenever a path's ANA rank changes: queue pairs compare it
    /// once per poll.
    pub ana_gen: AtomicU32,
    /// Time base of `ana_due`.
    pub epoch: Instant,
    /// When the usable paths' ANA states are read again (ms since
    /// `epoch`): the queue pair that finds it due first claims the
    /// reading.
    pub ana_due: AtomicU64,
}

impl Path {
    /// The ANA state of this path's namespace, from its controller's ANA
    /// log page (optimized when the controller does not report ANA).
    pub fn read_ana(&self) -> Result<AnaState, String> {
        if self.ctrl.identify().cmic & CMIC_ANA == 0 {
            return Ok(AnaState::Optimized);
        }
        let raw = self
            .ctrl
            .get_log_page(lid::ANA, 0, 4096)
            .map_err(|e| format!("ANA log page: {e}"))?;
        let log = AnaLog::parse(&raw).map_err(|e| format!("ANA log page: {e}"))?;
        let nsid = self.ns.nsid();
        log.groups
            .iter()
            .find(|g| {
                (self.anagrpid != 0 && g.anagrpid == self.anagrpid) || g.nsids.contains(&nsid)
            })
            .map(|g| g.state)
            .ok_or_else(|| {
                format!(
                    "ANA log page has no group for NSID {nsid} (ANAGRPID {})",
                    self.anagrpid
                )
            })
    }
}

impl Paths {
    /// Reads path `i`'s ANA state again and publishes its rank; an
    /// unreadable log leaves the rank as it was. Returns the rank.
    pub fn refresh_ana(&self, i: usize) -> u8 {
        let p = &self.list[i];
        let old = p.rank.load(Ordering::Acquire);
        let new = match p.read_ana() {
            Ok(s) => rank(s),
            Err(e) => {
                tracing::warn!(path = %p.name, "{e}");
                return old;
            }
        };
        if new != old {
            p.rank.store(new, Ordering::Release);
            self.ana_gen.fetch_add(1, Ordering::AcqRel);
            tracing::info!(path = %p.name, rank = new, "ANA state changed");
        }
        new
    }

    /// Reads every path's ANA state (at connect).
    pub fn read_all_ana(&self) {
        for i in 0..self.list.len() {
            self.refresh_ana(i);
        }
    }

    /// Reads again the ANA state of each path `usable` names, if
    /// `ANA_REFRESH` passed since the last such reading by any queue
    /// pair of these paths (the first to find it due claims it, so the
    /// controllers see one Get Log Page per path per interval).
    pub fn refresh_due(&self, now: Instant, usable: impl Fn(usize) -> bool) {
        let ms = now.saturating_duration_since(self.epoch).as_millis() as u64;
        let due = self.ana_due.load(Ordering::Relaxed);
        if ms < due {
            return;
        }
        let next = ms + ANA_REFRESH.as_millis() as u64;
        if self
            .ana_due
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        for i in 0..self.list.len() {
            if usable(i) {
                self.refresh_ana(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [Policy::ActivePassive, Policy::ActiveActive] {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
        for s in [Selector::RoundRobin, Selector::QueueDepth] {
            assert_eq!(s.name().parse::<Selector>(), Ok(s));
        }
        assert!("numa".parse::<Policy>().is_err());
    }

    #[test]
    fn ana_ranks() {
        assert!(rank(AnaState::Optimized) < rank(AnaState::NonOptimized));
        for s in [
            AnaState::Inaccessible,
            AnaState::PersistentLoss,
            AnaState::Change,
        ] {
            assert!(rank(s) >= UNUSABLE);
        }
    }
}
