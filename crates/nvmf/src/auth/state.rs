//! One queue's DH-HMAC-CHAP state (what `Qpair` holds) and a host's
//! keys (what a subsystem's entry holds). The messages and their checks
//! are `pollux-auth`'s [`CtrlAuth`]; this picks the step each message
//! is and keeps what the next Authentication Receive returns.
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
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

/// A job of the queue's at the DH pool: the Authentication Send (slot)
/// it completes, and its cancellation (set when the queue goes away).
pub(crate) struct JobRef {
    pub ticket: u64,
    pub slot: u16,
    cancel: Arc<AtomicBool>,
}

/// The step of an exchange that a DH group makes expensive, moved to a
/// DH worker: the transaction (its keys zeroise themselves when dropped)
/// and the message. No `Debug`: it holds the keys.
pub(crate) struct DhWork {
    ticket: u64,
    machine: CtrlAuth,
    msg: Vec<u8>,
}

impl DhWork {
    /// Runs the step (on the worker).
    pub fn run(mut self) -> DhDone {
        let r = QueueAuth::dispatch(&mut self.machine, &self.msg);
        DhDone {
            ticket: self.ticket,
            machine: self.machine,
            r,
        }
    }
}

/// What a DH worker did: the transaction back, and the step's result.
pub(crate) struct DhDone {
    pub ticket: u64,
    machine: CtrlAuth,
    r: Result<Option<Vec<u8>>, AuthError>,
}

/// The time the reactor thread spent on the exchange so far (its
/// Authentication Send/Receive commands and the DH pool's results).
#[derive(Default)]
pub(crate) struct ReactorTime {
    total: std::time::Duration,
    /// The start of the command (or result) being handled.
    current: Option<Instant>,
}

impl ReactorTime {
    pub fn begin(&mut self) {
        self.current = Some(Instant::now());
    }

    pub fn end(&mut self) {
        if let Some(t) = self.current.take() {
            self.total += t.elapsed();
        }
    }

    /// Microseconds so far (the current command's included).
    pub fn micros(&self) -> u64 {
        let now = self
            .current
            .map_or(std::time::Duration::ZERO, |t| t.elapsed());
        (self.total + now).as_micros() as u64
    }

    pub fn reset(&mut self) {
        self.total = std::time::Duration::ZERO;
    }
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
    /// A step of the exchange at the DH pool (its Authentication Send
    /// completes when it is back).
    pub job: Option<JobRef>,
    tickets: u64,
    /// The reactor thread's time on the exchange (logged with its end).
    pub reactor: ReactorTime,
}

impl Drop for QueueAuth {
    fn drop(&mut self) {
        // The queue is gone: its job, if still waiting, is not run.
        if let Some(j) = &self.job {
            j.cancel.store(true, Relaxed);
        }
    }
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
            job: None,
            tickets: 0,
            reactor: Default::default(),
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
        self.reactor.reset();
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
        let r = Self::dispatch(&mut self.machine, msg);
        self.apply(r)
    }

    /// Taking `msg` costs a modular exponentiation (an ffdhe group's key
    /// pair or shared secret): it goes to the DH pool ([`lend`](Self::lend)).
    pub fn needs_worker(&self, msg: &[u8]) -> bool {
        self.phase == Phase::Running && self.job.is_none() && self.machine.needs_dh(msg)
    }

    /// The step of `msg`, an Authentication Send in slot `slot`, as a job
    /// for the DH pool (the transaction moves with it), and its
    /// cancellation.
    pub fn lend(&mut self, msg: &[u8], slot: u16) -> (DhWork, Arc<AtomicBool>) {
        self.tickets += 1;
        let cancel = Arc::new(AtomicBool::new(false));
        self.job = Some(JobRef {
            ticket: self.tickets,
            slot,
            cancel: cancel.clone(),
        });
        let machine = std::mem::replace(&mut self.machine, CtrlAuth::new(self.cfg.clone()));
        let work = DhWork {
            ticket: self.tickets,
            machine,
            msg: msg.to_vec(),
        };
        (work, cancel)
    }

    /// The job's result is back (its ticket is the queue's `job`'s, which
    /// the caller took): the transaction returns, and the step is taken
    /// unless the exchange ended meanwhile (a re-authentication out of
    /// time): `None` then.
    pub fn on_done(&mut self, d: DhDone) -> Option<Step> {
        self.machine = d.machine;
        if self.phase != Phase::Running {
            self.machine = CtrlAuth::new(self.cfg.clone());
            return None;
        }
        Some(self.apply(d.r))
    }

    /// The DH pool refused the job for `msg` (its bounds): the exchange
    /// fails with AUTH_Failure1, "authentication failed" (the host may
    /// try again later).
    pub fn refuse(&mut self, msg: &[u8]) {
        self.job = None;
        // (Every DH-HMAC-CHAP message has its T_ID at bytes 4..6.)
        let t_id = msg
            .get(4..6)
            .map_or(self.machine.t_id(), |b| u16::from_le_bytes([b[0], b[1]]));
        self.machine = CtrlAuth::new(self.cfg.clone());
        self.pending = Some(encode_failure(
            AuthId::Failure1,
            t_id,
            FailureExplanation::Failed as u8,
        ));
        self.phase = Phase::Failing;
    }

    /// Takes `msg` into the transaction `machine`: the message to return
    /// next, if any.
    fn dispatch(machine: &mut CtrlAuth, msg: &[u8]) -> Result<Option<Vec<u8>>, AuthError> {
        let Some((ty, id)) = message_id(msg) else {
            return Err(AuthError::Truncated {
                msg: "AUTH message",
                len: msg.len(),
                need: 2,
            });
        };
        let is = |a: AuthId| (ty, id) == (a.auth_type(), a as u8);
        if is(AuthId::Negotiate) {
            machine.negotiate(msg).map(Some)
        } else if is(AuthId::Reply) {
            machine.reply(msg).map(Some)
        } else if is(AuthId::Success2) || is(AuthId::Failure2) {
            machine.success2(msg).map(|()| None)
        } else {
            Err(AuthError::UnexpectedMessage {
                expected: "AUTH_Negotiate, DH-HMAC-CHAP_Reply or DH-HMAC-CHAP_Success2",
                auth_type: ty,
                auth_id: id,
            })
        }
    }

    /// What a step's result does to the exchange.
    fn apply(&mut self, r: Result<Option<Vec<u8>>, AuthError>) -> Step {
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
