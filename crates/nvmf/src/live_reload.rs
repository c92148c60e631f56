//! A reload of the configuration file, applied to a running target: what
//! it runs now ([`Target::running`], compared with the file by
//! `config::plan`) and the plan's live changes made
//! ([`Target::apply_reload`]) through the methods the JSON-RPC methods
//! use (`add_listener`, `set_ana_state`: the same ANA Change notices,
//! `add_host_with_keys`, ...).
use std::net::SocketAddr;

use pollux_spec::fabrics::DISCOVERY_NQN;

use crate::config::{LiveChange, ReloadPlan, Running, RunningSubsystem, SubsystemPlan};
use crate::tgt::Target;

/// What a reload's live changes did.
#[derive(Debug, Default)]
pub struct ReloadOutcome {
    /// Each change made: (the subsystem, "subsystem 'NQN'" or "the
    /// discovery subsystem"; the change).
    pub applied: Vec<(String, String)>,
    /// Each change refused by the target, with why.
    pub failed: Vec<String>,
}

impl Target {
    /// The target's subsystems, listeners, hosts and ANA states now.
    pub fn running(&self) -> Running {
        let (sockets, discovery) = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            (live.sockets.clone(), live.discovery.clone())
        };
        let asked = |bound: SocketAddr| {
            let a = sockets
                .iter()
                .find(|(_, r)| *r == bound)
                .map_or(bound, |(a, _)| *a);
            (a, bound)
        };
        let shared = self.shared();
        let subsystems = shared
            .subsystems()
            .iter()
            .map(|e| RunningSubsystem {
                nqn: e.model.nqn().to_string(),
                allow_any_host: e.allow_any_host,
                hosts: e.hosts.clone(),
                listeners: e.listeners.iter().map(|&l| asked(l)).collect(),
                ana: e
                    .ana_ports
                    .iter()
                    .map(|(l, p)| {
                        let (d, g) = p.snapshot();
                        (*l, d, g)
                    })
                    .collect(),
            })
            .collect();
        Running {
            subsystems,
            discovery: discovery.into_iter().map(asked).collect(),
            sock_impl: shared.opts.sock_impl,
        }
    }

    /// Makes `plan`'s live changes, subsystem by subsystem. A listener
    /// that cannot be added leaves its subsystem as it was (the listeners
    /// added before it are removed again, nothing else is changed);
    /// another refusal is noted and the rest goes on. Not from a runtime
    /// thread.
    pub fn apply_reload(&self, plan: &ReloadPlan) -> ReloadOutcome {
        let mut out = ReloadOutcome::default();
        for s in &plan.subsystems {
            self.apply_subsystem(s, &mut out);
        }
        out
    }

    fn apply_subsystem(&self, s: &SubsystemPlan, out: &mut ReloadOutcome) {
        let nqn = s.nqn.as_str();
        let name = if nqn == DISCOVERY_NQN {
            "the discovery subsystem".to_string()
        } else {
            format!("subsystem '{nqn}'")
        };
        // The file's addresses of listeners added now, and where bound.
        let mut added: Vec<(SocketAddr, SocketAddr)> = Vec::new();
        for c in &s.changes {
            let r = match c {
                LiveChange::AddListener(a) => match self.add_listener(nqn, *a) {
                    Ok(real) => {
                        added.push((*a, real));
                        Ok(())
                    }
                    Err(e) => {
                        for (_, real) in added.drain(..) {
                            if let Err(e) = self.remove_listener(nqn, real) {
                                tracing::error!(nqn, listen = %real, "reload: undoing a listener added: {e}");
                            }
                        }
                        out.failed
                            .push(format!("{name}: {c}: {e} (none of its changes made)"));
                        out.applied.retain(|(w, _)| *w != name);
                        return;
                    }
                },
                LiveChange::SetAnaState {
                    listener,
                    anagrpid,
                    state,
                } => {
                    let l = added
                        .iter()
                        .find(|(f, _)| f == listener)
                        .map_or(*listener, |(_, r)| *r);
                    self.set_ana_state(nqn, l, *state, *anagrpid)
                }
                LiveChange::AddHost {
                    host,
                    key,
                    ctrlr_key,
                } => self.add_host_with_keys(nqn, host, key.as_deref(), ctrlr_key.as_deref()),
                LiveChange::AllowAnyHost(a) => self.allow_any_host(nqn, *a),
                LiveChange::RemoveHost(h) => self.remove_host(nqn, h),
                LiveChange::RemoveListener(a) => self.remove_listener(nqn, *a),
            };
            match r {
                Ok(()) => out.applied.push((name.clone(), c.to_string())),
                Err(e) => out.failed.push(format!("{name}: {c}: {e}")),
            }
        }
    }
}
