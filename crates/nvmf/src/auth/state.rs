//! One queue's DH-HMAC-CHAP state (what `Qpair` holds) and a host's
//! keys (what a subsystem's entry holds). The messages and their checks
//! are `pollux-auth`'s [`CtrlAuth`]; this picks the step each message
//! is and keeps what the next Authentication Receive returns.
use std::sync::Arc;
use std::time::Instant;

use pollux_auth::msg::{encode_failure, message_id};
use pollux_auth::{AuthError, CtrlAuth, CtrlConfig};
use pollux_spec::fabrics::{AuthId, FailureExplanation};
use serde_json::{json, Value};

use crate::config::{AuthOptions, KeyFile};
use crate::model::IoQ;

/// A host's keys (the subsystem's entry for it).
#[derive(Clone)]
pub(crate) struct HostSecrets {
    pub host: String,
    pub key: KeyFile,
    pub ctrlr_key: Option<KeyFile>,
}

/// A host of a subsystem's listing (`nvmf_get_subsystems`, `save_config`'s
/// `nvmf_subsystem_add_host` params without `nqn`): its key names.
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
    /// Failed; the AUTH_Failure1 waits for the host's Authentication
    /// Receive, then the queue closes.
    Failing,
    /// Failed: the queue closes (at once if a context is at hand, else
    /// at the transport's next tick).
    Failed,
    /// Failed, and the queue is closing.
    Closed,
}

/// What a message did to the exchange.
pub(crate) enum Step {
    Continue,
    /// The host is authenticated (one-way: its Reply verified;
    /// bidirectional: its Success2 came).
    Authenticated,
    /// Failed, and why (never any key material).
    Failed(String),
}

/// One queue's DH-HMAC-CHAP state.
pub(crate) struct QueueAuth {
    cfg: Arc<CtrlConfig>,
    machine: CtrlAuth,
    /// What the next Authentication Receive returns.
    pending: Option<Vec<u8>>,
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
    pub fn new(keys: &HostSecrets, opts: AuthOptions, subnqn: &str, now: Instant) -> Self {
        let mut cfg = CtrlConfig::new(subnqn, keys.host.as_str(), (*keys.key.secret).clone());
        cfg.ctrl_key = keys.ctrlr_key.as_ref().map(|k| (*k.secret).clone());
        cfg.hashes.retain(|h| opts.digests & (1 << *h as u8) != 0);
        cfg.dhgroups
            .retain(|g| opts.dhgroups & (1 << *g as u8) != 0);
        let cfg = Arc::new(cfg);
        QueueAuth {
            machine: CtrlAuth::new(cfg.clone()),
            cfg,
            pending: None,
            authenticated: false,
            phase: Phase::Running,
            since: now,
            parked_io: None,
        }
    }

    /// The host NQN (for the log).
    pub fn host(&self) -> &str {
        &self.cfg.hostnqn
    }

    pub fn subnqn(&self) -> &str {
        &self.cfg.subnqn
    }

    /// The gate is closed: only Authentication Send/Receive pass.
    pub fn gated(&self) -> bool {
        !self.authenticated
    }

    /// `msg` is an AUTH_Negotiate (which starts an exchange over).
    pub fn is_negotiate(msg: &[u8]) -> bool {
        message_id(msg) == Some((AuthId::Negotiate.auth_type(), AuthId::Negotiate as u8))
    }

    /// Starts a new exchange (a Negotiate on a queue past its first
    /// message, or authenticated: re-authentication).
    pub fn restart(&mut self) {
        self.machine = CtrlAuth::new(self.cfg.clone());
        self.pending = None;
        self.phase = Phase::Running;
    }

    /// An Authentication Send's message.
    pub fn on_send(&mut self, msg: &[u8]) -> Step {
        if self.phase != Phase::Running {
            let e = AuthError::WrongState {
                op: "a message",
                state: "after the transaction ended",
            };
            return self.fail(e);
        }
        let Some((ty, id)) = message_id(msg) else {
            return self.fail(AuthError::Truncated {
                msg: "AUTH message",
                len: msg.len(),
                need: 2,
            });
        };
        let is = |a: AuthId| (ty, id) == (a.auth_type(), a as u8);
        let r = if is(AuthId::Negotiate) {
            self.machine.negotiate(msg).map(Some)
        } else if is(AuthId::Reply) {
            self.machine.reply(msg).map(Some)
        } else if is(AuthId::Success2) || is(AuthId::Failure2) {
            self.machine.success2(msg).map(|()| None)
        } else {
            Err(AuthError::UnexpectedMessage {
                expected: "AUTH_Negotiate, DH-HMAC-CHAP_Reply or DH-HMAC-CHAP_Success2",
                auth_type: ty,
                auth_id: id,
            })
        };
        match r {
            Ok(out) => {
                self.pending = out;
                if self.machine.is_done() {
                    self.authenticated = true;
                    self.phase = Phase::Done;
                    Step::Authenticated
                } else {
                    Step::Continue
                }
            }
            Err(e) => self.fail(e),
        }
    }

    /// An Authentication Receive: the message waiting (a Challenge,
    /// Success1 or Failure1); with none, an AUTH_Failure1 (incorrect
    /// message), which fails the exchange. True with it: the exchange
    /// failed and this was its last message.
    pub fn on_receive(&mut self) -> (Vec<u8>, Option<String>) {
        if let Some(m) = self.pending.take() {
            let failed = self.phase == Phase::Failing;
            if failed {
                self.phase = Phase::Failed;
            }
            return (m, failed.then(String::new));
        }
        let why = "an Authentication Receive with no message to return".to_string();
        let m = encode_failure(
            AuthId::Failure1,
            self.machine.t_id(),
            FailureExplanation::IncorrectMessage as u8,
        );
        self.phase = Phase::Failed;
        (m, Some(why))
    }

    /// The exchange failed with `e`: the AUTH_Failure1 to return (Linux
    /// answers a message out of turn with "incorrect message"), or none
    /// when the host ended it (AUTH_Failure2): then the queue closes.
    fn fail(&mut self, e: AuthError) -> Step {
        let f1 = match &e {
            AuthError::Failure2 { .. } => None,
            e => Some(self.machine.failure1(e).unwrap_or_else(|| {
                encode_failure(
                    AuthId::Failure1,
                    self.machine.t_id(),
                    FailureExplanation::IncorrectMessage as u8,
                )
            })),
        };
        self.phase = if f1.is_some() {
            Phase::Failing
        } else {
            Phase::Failed
        };
        self.pending = f1;
        Step::Failed(e.to_string())
    }
}
