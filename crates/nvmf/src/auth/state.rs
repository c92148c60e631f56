//! One queue's DH-HMAC-CHAP state (what `Qpair` holds) and a host's
//! keys (what a subsystem's entry holds).
use std::sync::Arc;
use std::time::Instant;

use crate::auth_shim::CtrlAuth;

use crate::config::{AuthOptions, KeyFile};
use crate::model::IoQ;
use serde_json::{json, Value};

/// A host's keys (the subsystem's entry for it).
#[derive(Clone)]
pub(crate) struct HostSecrets {
    pub host: String,
    pub key: KeyFile,
    pub ctrlr_key: Option<KeyFile>,
}

/// A host of a subsystem's listing (`nvmf_get_subsystems`, `save_config`'s
/// `nvmf_subsystem_add_host` params without `nqn`): its NQN and key names.
pub(crate) fn host_json(h: &str, keys: &[HostSecrets]) -> Value {
    let mut j = json!({});
    if let Some(k) = keys.iter().find(|k| k.host == h) {
        j["dhchap_key"] = k.key.name.clone().into();
        if let Some(c) = &k.ctrlr_key {
            j["dhchap_ctrlr_key"] = c.name.clone().into();
        }
    }
    j
}

/// Where the queue's exchange stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// An exchange in progress (first, or a re-authentication).
    Running,
    /// The host is authenticated (the gate is open).
    Done,
    /// Failed: the queue closes (at once if a context is at hand, else
    /// at the transport's next tick).
    Failed,
    /// Failed, and the queue is closing.
    Closed,
}

/// One queue's DH-HMAC-CHAP state.
pub(crate) struct QueueAuth {
    pub(super) keys: HostSecrets,
    pub(super) opts: AuthOptions,
    pub(super) subnqn: String,
    pub(super) machine: CtrlAuth,
    /// The queue passed once: the gate is open (a re-authentication keeps
    /// it open).
    pub authenticated: bool,
    pub phase: Phase,
    /// When the current exchange began (Connect, or a re-authentication's
    /// Negotiate).
    pub since: Instant,
    /// An I/O queue's submission side, waiting for the gate to open.
    pub parked_io: Option<IoQ>,
}

impl QueueAuth {
    pub fn new(keys: HostSecrets, opts: AuthOptions, subnqn: &str, qid: u16, now: Instant) -> Self {
        let machine = Self::machine(&keys, opts, subnqn, qid);
        QueueAuth {
            keys,
            opts,
            subnqn: subnqn.to_string(),
            machine,
            authenticated: false,
            phase: Phase::Running,
            since: now,
            parked_io: None,
        }
    }

    pub(super) fn machine(
        keys: &HostSecrets,
        opts: AuthOptions,
        subnqn: &str,
        qid: u16,
    ) -> CtrlAuth {
        CtrlAuth::new(
            &keys.host,
            subnqn,
            qid,
            Arc::clone(&keys.key.secret),
            keys.ctrlr_key.as_ref().map(|k| Arc::clone(&k.secret)),
            opts.digests,
            opts.dhgroups,
        )
    }

    /// The host NQN (for the log).
    pub fn host(&self) -> &str {
        &self.keys.host
    }

    /// The gate is closed: only Authentication Send/Receive pass.
    pub fn gated(&self) -> bool {
        !self.authenticated
    }
}
