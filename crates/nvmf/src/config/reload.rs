//! What a reload of the configuration file changes ([`plan`]): no I/O,
//! the caller reads the file ([`ConfigFile`]), the running target
//! ([`Running`]) and applies the plan (`Target::apply_reload`).
//!
//! The rules:
//! - Applied live, making the running target what the file says (JSON-RPC
//!   changes to them undone): each subsystem's listeners (added,
//!   removed), the ANA states through them, its host list and
//!   `allow_any_host`; the discovery subsystem's own listeners.
//! - Not applied (a restart applies them), each named in
//!   [`ReloadPlan::not_applied`]: what changed in the file since the
//!   target started in the transport, the keyring, `nvmf_set_config`, the
//!   bdevs, subsystems added or removed, and a subsystem's serial or
//!   model number, `max_namespaces`, `ana_reporting`, controller ID
//!   range, namespaces, a host's DH-HMAC-CHAP keys, or a host added with
//!   a key the target did not start with.
//! - A listener whose `sock_impl` (SPDK's per-listener key) is not the
//!   running target's is refused as a restart refuses it: its subsystem
//!   gets no live change (named as the second kind).
//! - A subsystem is never half changed: one with a change of the second
//!   kind gets none of the first applied either (both are named).
//! - A listener of port 0 (any free port) is the running listener asked
//!   for with port 0 on that address.
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;

use pollux_bdev::config::Entry;
use pollux_spec::fabrics::DISCOVERY_NQN;
use pollux_spec::log::AnaState;

use super::error::ConfigError;
use super::target::{SubsystemConfig, TargetConfig};
use super::transport::SockImpl;

/// A configuration file as a reload reads it: checked completely, no bdev
/// made (`target.bdevs` empty), with its bdev subsystem's entries.
#[derive(Clone, Debug, Default)]
pub struct ConfigFile {
    pub target: TargetConfig,
    pub bdevs: Vec<Entry>,
}

impl ConfigFile {
    /// Reads SPDK's JSON configuration (see
    /// [`TargetConfig::from_json_unmade`]).
    pub fn parse(json: &str) -> Result<ConfigFile, ConfigError> {
        let (target, bdevs) = TargetConfig::from_json_unmade(json)?;
        Ok(ConfigFile { target, bdevs })
    }
}

/// A running subsystem as a reload compares it with the file.
#[derive(Clone, Debug, PartialEq)]
pub struct RunningSubsystem {
    pub nqn: String,
    pub allow_any_host: bool,
    pub hosts: Vec<String>,
    /// Its listeners: (address asked for, address bound).
    pub listeners: Vec<(SocketAddr, SocketAddr)>,
    /// The ANA states through each bound listener.
    pub ana: Vec<RunningAna>,
}

/// The ANA states through a bound listener: the default state and the
/// groups set apart from it (`AnaPort::snapshot`).
pub type RunningAna = (SocketAddr, AnaState, Vec<(u32, AnaState)>);

/// The running target as a reload compares it with the file.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Running {
    pub subsystems: Vec<RunningSubsystem>,
    /// The discovery subsystem's own listeners: (asked for, bound).
    pub discovery: Vec<(SocketAddr, SocketAddr)>,
    /// The socket implementation of the target's threads.
    pub sock_impl: SockImpl,
}

/// One change a reload makes live, through the method of the JSON-RPC
/// method of the same effect. A listener's address is the bound one if it
/// runs, else the file's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveChange {
    /// `nvmf_subsystem_add_listener`.
    AddListener(SocketAddr),
    /// `nvmf_subsystem_listener_set_ana_state` (group None: every group).
    SetAnaState {
        listener: SocketAddr,
        anagrpid: Option<u32>,
        state: AnaState,
    },
    /// `nvmf_subsystem_add_host`, with its keys' keyring names.
    AddHost {
        host: String,
        key: Option<String>,
        ctrlr_key: Option<String>,
    },
    /// `nvmf_subsystem_allow_any_host`.
    AllowAnyHost(bool),
    /// `nvmf_subsystem_remove_host` (its controllers are closed).
    RemoveHost(String),
    /// `nvmf_subsystem_remove_listener` (its queues are closed).
    RemoveListener(SocketAddr),
}

impl fmt::Display for LiveChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiveChange::AddListener(a) => write!(f, "listener {a} added"),
            LiveChange::SetAnaState {
                listener,
                anagrpid,
                state,
            } => match anagrpid {
                None => write!(f, "ANA state through {listener}: {}", state.name()),
                Some(g) => write!(
                    f,
                    "ANA state of group {g} through {listener}: {}",
                    state.name()
                ),
            },
            LiveChange::AddHost { host, .. } => write!(f, "host {host} added"),
            LiveChange::AllowAnyHost(a) => write!(f, "allow_any_host {a}"),
            LiveChange::RemoveHost(h) => write!(f, "host {h} removed"),
            LiveChange::RemoveListener(a) => write!(f, "listener {a} removed"),
        }
    }
}

/// The live changes of one subsystem (the discovery subsystem's NQN: its
/// own listeners), in the order they are made: listeners added first
/// (what may fail: then none is made), hosts removed and listeners
/// removed last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubsystemPlan {
    pub nqn: String,
    pub changes: Vec<LiveChange>,
}

/// What a reload does.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Subsystems with live changes.
    pub subsystems: Vec<SubsystemPlan>,
    /// What differs but is not applied, each a sentence naming it (a
    /// restart applies it).
    pub not_applied: Vec<String>,
}

impl ReloadPlan {
    /// Nothing to do, nothing refused.
    pub fn is_empty(&self) -> bool {
        self.subsystems.is_empty() && self.not_applied.is_empty()
    }
}

/// What a reload of `new` does to a target started from `started` and
/// now `running` (see the module docs).
pub fn plan(started: &ConfigFile, new: &ConfigFile, running: &Running) -> ReloadPlan {
    let mut out = ReloadPlan::default();
    let (o, n) = (&started.target, &new.target);
    if o.transport != n.transport || o.transport_created != n.transport_created {
        out.not_applied
            .push("the transport's options (nvmf_create_transport) changed".into());
    }
    if o.auth != n.auth {
        out.not_applied.push(
            "nvmf_set_config's dhchap_* options (digests, DH groups, DH pool) changed".into(),
        );
    }
    for (what, names) in named_diff(
        o.keyring.keys.iter().map(|k| (k.name.as_str(), k)),
        n.keyring.keys.iter().map(|k| (k.name.as_str(), k)),
    ) {
        out.not_applied
            .push(format!("keyring: key {} {what}", names.join(", ")));
    }
    for (what, names) in named_diff(
        started.bdevs.iter().map(|e| (e.name(), e)),
        new.bdevs.iter().map(|e| (e.name(), e)),
    ) {
        out.not_applied
            .push(format!("bdev {} {what}", names.join(", ")));
    }
    // A listener's sock_impl that is not the running target's (one
    // serves the whole target) is refused as a restart would refuse it.
    let other_sock_impl = |nqn: &str| -> Vec<String> {
        n.listener_sock_impls
            .iter()
            .filter(|(q, _, s)| q == nqn && *s != running.sock_impl)
            .map(|(_, a, s)| {
                format!(
                    "listener {a}: sock_impl '{}' is not the target's '{}'",
                    s.name(),
                    running.sock_impl.name()
                )
            })
            .collect()
    };
    // The discovery subsystem's own listeners.
    let (add, remove) = listener_diff(&n.discovery_listeners, &running.discovery);
    let changes: Vec<LiveChange> = add
        .into_iter()
        .map(LiveChange::AddListener)
        .chain(remove.into_iter().map(LiveChange::RemoveListener))
        .collect();
    let fixed = other_sock_impl(DISCOVERY_NQN);
    if !fixed.is_empty() {
        out.not_applied
            .push(not_made(DISCOVERY_NQN, &fixed, &changes));
    } else if !changes.is_empty() {
        out.subsystems.push(SubsystemPlan {
            nqn: DISCOVERY_NQN.into(),
            changes,
        });
    }
    for s in &n.subsystems {
        let nqn = &s.nqn;
        let Some(old) = o.subsystems.iter().find(|x| x.nqn == *nqn) else {
            out.not_applied
                .push(format!("subsystem '{nqn}' is new in the file"));
            continue;
        };
        let Some(run) = running.subsystems.iter().find(|x| x.nqn == *nqn) else {
            out.not_applied.push(format!(
                "subsystem '{nqn}' is not running (deleted over JSON-RPC?)"
            ));
            continue;
        };
        let mut fixed = restart_only(started, old, new, s);
        fixed.extend(other_sock_impl(nqn));
        let changes = live_changes(s, run);
        if fixed.is_empty() {
            if !changes.is_empty() {
                out.subsystems.push(SubsystemPlan {
                    nqn: nqn.clone(),
                    changes,
                });
            }
        } else {
            out.not_applied.push(not_made(nqn, &fixed, &changes));
        }
    }
    for s in &o.subsystems {
        if !n.subsystems.iter().any(|x| x.nqn == s.nqn) {
            out.not_applied
                .push(format!("subsystem '{}' is no longer in the file", s.nqn));
        }
    }
    out
}

/// Why subsystem `nqn`'s `changes` are not made: `fixed`, what a
/// restart only applies.
fn not_made(nqn: &str, fixed: &[String], changes: &[LiveChange]) -> String {
    let mut why = format!("subsystem '{nqn}': {}", fixed.join("; "));
    if !changes.is_empty() {
        let c: Vec<String> = changes.iter().map(ToString::to_string).collect();
        why.push_str(&format!(
            " (so its live changes are not made either: {})",
            c.join("; ")
        ));
    }
    why
}

/// Names of `old` and `new` (name, value) grouped as "added", "removed",
/// "changed" (only the non-empty groups).
fn named_diff<'a, T: PartialEq + 'a>(
    old: impl Iterator<Item = (&'a str, T)>,
    new: impl Iterator<Item = (&'a str, T)>,
) -> Vec<(&'static str, Vec<String>)> {
    let old: Vec<(&str, T)> = old.collect();
    let new: Vec<(&str, T)> = new.collect();
    let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    for (name, v) in &new {
        match old.iter().find(|(n, _)| n == name) {
            None => added.push(format!("'{name}'")),
            Some((_, w)) if w != v => changed.push(format!("'{name}'")),
            Some(_) => {}
        }
    }
    for (name, _) in &old {
        if !new.iter().any(|(n, _)| n == name) {
            removed.push(format!("'{name}'"));
        }
    }
    [("added", added), ("removed", removed), ("changed", changed)]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// What differs between subsystem `old` of the file the target started
/// from and `new` of the new file that a reload does not change live.
fn restart_only(
    started: &ConfigFile,
    old: &SubsystemConfig,
    new_file: &ConfigFile,
    new: &SubsystemConfig,
) -> Vec<String> {
    let mut v = Vec::new();
    let mut field = |name: &str, differs: bool| {
        if differs {
            v.push(format!("{name} changed"));
        }
    };
    field("serial_number", old.serial != new.serial);
    field("model_number", old.model != new.model);
    field("max_namespaces", old.max_namespaces != new.max_namespaces);
    field("ana_reporting", old.ana_reporting != new.ana_reporting);
    field(
        "min_cntlid/max_cntlid",
        (old.min_cntlid, old.max_cntlid) != (new.min_cntlid, new.max_cntlid),
    );
    let ns = |f: &ConfigFile, s: &SubsystemConfig| {
        let mut v: Vec<_> = s
            .namespaces
            .iter()
            .enumerate()
            .map(|(k, n)| {
                let nsid = n.nsid.unwrap_or(k as u32 + 1);
                // The bdev's own entry is part of the namespace.
                let entry = f.bdevs.iter().find(|e| bdev_of(e, &n.bdev)).cloned();
                (nsid, (n.clone(), entry))
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v
    };
    let (a, b) = (ns(started, old), ns(new_file, new));
    let ids = |v: &[(u32, _)]| -> Vec<String> { v.iter().map(|x| x.0.to_string()).collect() };
    let (a_ids, b_ids) = (ids(&a), ids(&b));
    let added: Vec<String> = b_ids
        .iter()
        .filter(|i| !a_ids.contains(i))
        .cloned()
        .collect();
    let removed: Vec<String> = a_ids
        .iter()
        .filter(|i| !b_ids.contains(i))
        .cloned()
        .collect();
    let changed: Vec<String> = b
        .iter()
        .filter(|(id, x)| a.iter().any(|(j, y)| j == id && y != x))
        .map(|(id, _)| id.to_string())
        .collect();
    for (what, list) in [("added", added), ("removed", removed), ("changed", changed)] {
        if !list.is_empty() {
            v.push(format!("namespace {} {what}", list.join(", ")));
        }
    }
    // A host kept keeps its keys; one added may only name keys the
    // target started with (the keyring is not reloaded).
    let keys = |s: &SubsystemConfig, h: &str| s.host_keys.iter().find(|k| k.host == h).cloned();
    for h in &new.hosts {
        let k = keys(new, h);
        if old.hosts.contains(h) {
            if keys(old, h) != k {
                v.push(format!("host {h}'s DH-HMAC-CHAP keys changed"));
            }
            continue;
        }
        let names = k
            .iter()
            .flat_map(|k| std::iter::once(&k.key).chain(&k.ctrlr_key));
        for n in names {
            let had = started.target.keyring.get(n);
            if had.is_none() || had != new_file.target.keyring.get(n) {
                v.push(format!(
                    "host {h} added with key '{n}', which the target did not start with"
                ));
            }
        }
    }
    v
}

/// Entry `e` makes bdev `bdev`.
fn bdev_of(e: &Entry, bdev: &str) -> bool {
    match e {
        Entry::NvmeAttach(a) => bdev
            .strip_prefix(a.name.as_str())
            .and_then(|r| r.strip_prefix('n'))
            .is_some_and(|n| n.parse::<u32>().is_ok()),
        e => e.name() == bdev,
    }
}

/// The running listener of `running` (asked for, bound) that file
/// address `f` is: the bound one, or for port 0 the one asked for so.
fn matches(f: SocketAddr, (asked, bound): (SocketAddr, SocketAddr)) -> bool {
    f == bound || (f.port() == 0 && f == asked)
}

/// The file's listeners `file` not running (to add), and the running ones
/// not in the file (bound addresses, to remove).
fn listener_diff(
    file: &[SocketAddr],
    running: &[(SocketAddr, SocketAddr)],
) -> (Vec<SocketAddr>, Vec<SocketAddr>) {
    let mut taken = vec![false; running.len()];
    let mut add = Vec::new();
    for &f in file {
        match (0..running.len()).find(|&k| !taken[k] && matches(f, running[k])) {
            Some(k) => taken[k] = true,
            None => add.push(f),
        }
    }
    let remove = running
        .iter()
        .zip(taken)
        .filter(|(_, t)| !t)
        .map(|(r, _)| r.1)
        .collect();
    (add, remove)
}

/// A listener's ANA states: the default and the groups apart from it.
type AnaStates = (AnaState, BTreeMap<u32, AnaState>);

/// The ANA states listener `l` gets from the ordered `(listener, group,
/// state)` list of a configuration (as `Target::start` applies it).
fn file_ana(list: &[(SocketAddr, Option<u32>, AnaState)], l: SocketAddr) -> AnaStates {
    let mut default = AnaState::Optimized;
    let mut groups = BTreeMap::new();
    for (_, g, st) in list.iter().filter(|(a, _, _)| *a == l) {
        match g {
            None => {
                default = *st;
                groups.clear();
            }
            Some(g) => {
                groups.insert(*g, *st);
            }
        }
    }
    groups.retain(|_, st| *st != default);
    (default, groups)
}

/// The `set_ana_state` calls (group, state) that make `from` into `to`.
fn ana_steps(from: &AnaStates, to: &AnaStates) -> Vec<(Option<u32>, AnaState)> {
    let state = |s: &AnaStates, g: u32| s.1.get(&g).copied().unwrap_or(s.0);
    if from.0 != to.0 {
        // The whole port, then the groups apart from it.
        return std::iter::once((None, to.0))
            .chain(to.1.iter().map(|(&g, &st)| (Some(g), st)))
            .collect();
    }
    let mut groups: Vec<u32> = from.1.keys().chain(to.1.keys()).copied().collect();
    groups.sort_unstable();
    groups.dedup();
    groups
        .into_iter()
        .filter(|&g| state(from, g) != state(to, g))
        .map(|g| (Some(g), state(to, g)))
        .collect()
}

/// The live changes that make running subsystem `run` what `s` says.
fn live_changes(s: &SubsystemConfig, run: &RunningSubsystem) -> Vec<LiveChange> {
    let mut out = Vec::new();
    let (add, remove) = listener_diff(&s.listeners, &run.listeners);
    out.extend(add.iter().map(|&a| LiveChange::AddListener(a)));
    if s.ana_reporting {
        for &f in &s.listeners {
            let bound = run.listeners.iter().find(|&&r| matches(f, r)).map(|r| r.1);
            let now: AnaStates = bound
                .and_then(|b| run.ana.iter().find(|x| x.0 == b))
                .map(|(_, d, g)| (*d, g.iter().copied().filter(|x| x.1 != *d).collect()))
                // A listener added now: every group optimized.
                .unwrap_or((AnaState::Optimized, BTreeMap::new()));
            for (anagrpid, state) in ana_steps(&now, &file_ana(&s.ana_states, f)) {
                out.push(LiveChange::SetAnaState {
                    listener: bound.unwrap_or(f),
                    anagrpid,
                    state,
                });
            }
        }
    }
    for h in s.hosts.iter().filter(|h| !run.hosts.contains(h)) {
        let k = s.host_keys.iter().find(|k| k.host == *h);
        out.push(LiveChange::AddHost {
            host: h.clone(),
            key: k.map(|k| k.key.clone()),
            ctrlr_key: k.and_then(|k| k.ctrlr_key.clone()),
        });
    }
    if s.allow_any_host != run.allow_any_host {
        out.push(LiveChange::AllowAnyHost(s.allow_any_host));
    }
    for h in run.hosts.iter().filter(|h| !s.hosts.contains(h)) {
        out.push(LiveChange::RemoveHost(h.clone()));
    }
    out.extend(remove.into_iter().map(LiveChange::RemoveListener));
    out
}

#[cfg(test)]
#[path = "reload_tests.rs"]
mod tests;
