//! Asymmetric Namespace Access: the ANA state of each ANA group through
//! one port ([`AnaPort`]: a fabrics listener of a subsystem), which every
//! controller whose admin queue connected through that port reports
//! (Get Log Page 0Ch) and enforces on its I/O queues.
//!
//! A port holds a default state (optimized unless configured otherwise)
//! and per-group exceptions, and a change count bumped at every change:
//! a controller compares it with the count it last announced and raises
//! the ANA Change notice when they differ (`Controller::namespace_events`).
//! The I/O queues learn of a change through the subsystem's namespace
//! generation, which [`crate::Subsystem::ana_changed`] bumps: the queue
//! recomputes, off the I/O path, which of its namespaces it must refuse
//! (see `io`).
use std::collections::BTreeMap;
use std::sync::Mutex;

use pollux_spec::log::AnaState;

#[derive(Clone, Debug)]
struct PortStates {
    default: AnaState,
    /// Groups whose state differs from (or was set apart from) the
    /// default: ANAGRPID → (state, the group's change count).
    groups: BTreeMap<u32, (AnaState, u64)>,
    /// Change count of the port's ANA information.
    chgcnt: u64,
}

/// The ANA states of every group through one port.
#[derive(Debug)]
pub struct AnaPort {
    states: Mutex<PortStates>,
}

impl AnaPort {
    /// A port where every group is in `default`.
    pub fn new(default: AnaState) -> AnaPort {
        AnaPort {
            states: Mutex::new(PortStates {
                default,
                groups: BTreeMap::new(),
                chgcnt: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PortStates> {
        self.states.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The state of group `anagrpid` through this port.
    pub fn state(&self, anagrpid: u32) -> AnaState {
        let s = self.lock();
        s.groups.get(&anagrpid).map_or(s.default, |g| g.0)
    }

    /// The state and change count of group `anagrpid`.
    pub(crate) fn group(&self, anagrpid: u32) -> (AnaState, u64) {
        let s = self.lock();
        s.groups.get(&anagrpid).copied().unwrap_or((s.default, 0))
    }

    /// The default state and the groups set apart from it: what a
    /// configuration must say to make this port again.
    pub fn snapshot(&self) -> (AnaState, Vec<(u32, AnaState)>) {
        let s = self.lock();
        let groups = s
            .groups
            .iter()
            .filter(|(_, g)| g.0 != s.default)
            .map(|(&id, g)| (id, g.0))
            .collect();
        (s.default, groups)
    }

    /// The port's change count (bumped by every change).
    pub fn change_count(&self) -> u64 {
        self.lock().chgcnt
    }

    /// Sets group `anagrpid`'s state (None: every group, as SPDK's
    /// `nvmf_subsystem_listener_set_ana_state` without `anagrpid`).
    /// Returns whether anything changed.
    pub fn set(&self, anagrpid: Option<u32>, state: AnaState) -> bool {
        let mut s = self.lock();
        let changed = match anagrpid {
            Some(g) => {
                let old = s.groups.get(&g).map_or(s.default, |x| x.0);
                let chg = s.groups.get(&g).map_or(0, |x| x.1);
                if old != state {
                    s.groups.insert(g, (state, chg + 1));
                }
                old != state
            }
            None => {
                let changed = s.default != state || s.groups.values().any(|&(st, _)| st != state);
                if changed {
                    s.default = state;
                    // Each group's own count moves on with the change.
                    for g in s.groups.values_mut() {
                        *g = (state, g.1 + 1);
                    }
                }
                changed
            }
        };
        if changed {
            s.chgcnt += 1;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_group_and_whole_port_changes() {
        let p = AnaPort::new(AnaState::Optimized);
        assert_eq!(p.state(7), AnaState::Optimized);
        assert!(!p.set(Some(7), AnaState::Optimized));
        assert_eq!(p.change_count(), 0);
        assert!(p.set(Some(7), AnaState::Inaccessible));
        assert_eq!(
            (p.state(7), p.state(1)),
            (AnaState::Inaccessible, AnaState::Optimized)
        );
        assert_eq!(p.group(7), (AnaState::Inaccessible, 1));
        assert_eq!(p.change_count(), 1);
        assert!(p.set(None, AnaState::NonOptimized));
        assert_eq!(
            (p.state(7), p.state(1)),
            (AnaState::NonOptimized, AnaState::NonOptimized)
        );
        assert_eq!(p.group(7).1, 2);
        assert!(!p.set(None, AnaState::NonOptimized));
        assert_eq!(p.change_count(), 2);
    }
}
