//! The controller's side of a DH-HMAC-CHAP transaction, free of I/O: it
//! checks the messages an Authentication Send brings and makes those an
//! Authentication Receive returns.

use std::sync::Arc;

use pollux_spec::fabrics::{AuthId, DhGroupId, HashId, SC_C_NONE};

use crate::bytes::Secret;
use crate::compute::{augmented_challenge, response, Role};
use crate::dh::DhKeyPair;
use crate::digest::ct_eq;
use crate::error::AuthError;
use crate::msg;
use crate::random;
use crate::secret::DhchapKey;

/// What a controller authenticates one host with.
#[derive(Clone, Debug)]
pub struct CtrlConfig {
    pub subnqn: String,
    pub hostnqn: String,
    /// The host's secret.
    pub host_key: DhchapKey,
    /// The controller's secret, for bidirectional authentication.
    pub ctrl_key: Option<DhchapKey>,
    /// Hashes allowed, most preferred first: the first the host offers
    /// is chosen.
    pub hashes: Vec<HashId>,
    /// DH groups allowed, most preferred first.
    pub dhgroups: Vec<DhGroupId>,
}

impl CtrlConfig {
    /// Every hash and group allowed, strongest hash first and
    /// ffdhe2048 first among the groups (the cheapest DH), then the
    /// bigger groups, then null.
    pub fn new(subnqn: impl Into<String>, hostnqn: impl Into<String>, host_key: DhchapKey) -> Self {
        CtrlConfig {
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
            host_key,
            ctrl_key: None,
            hashes: vec![HashId::Sha512, HashId::Sha384, HashId::Sha256],
            dhgroups: vec![
                DhGroupId::Ffdhe2048,
                DhGroupId::Ffdhe3072,
                DhGroupId::Ffdhe4096,
                DhGroupId::Ffdhe6144,
                DhGroupId::Ffdhe8192,
                DhGroupId::Null,
            ],
        }
    }
}

enum State {
    AwaitNegotiate,
    AwaitReply {
        hash: HashId,
        seqnum: u32,
        c1: Secret,
        kp: Option<DhKeyPair>,
    },
    AwaitSuccess2,
    Done,
    Failed,
}

impl State {
    const fn name(&self) -> &'static str {
        match self {
            State::AwaitNegotiate => "awaiting negotiate",
            State::AwaitReply { .. } => "awaiting the reply",
            State::AwaitSuccess2 => "awaiting success2",
            State::Done => "done",
            State::Failed => "failed",
        }
    }
}

/// One controller authentication transaction on one queue.
pub struct CtrlAuth {
    cfg: Arc<CtrlConfig>,
    t_id: u16,
    state: State,
    negotiated: Option<(HashId, DhGroupId)>,
}

impl CtrlAuth {
    pub fn new(cfg: Arc<CtrlConfig>) -> Self {
        CtrlAuth {
            cfg,
            t_id: 0,
            state: State::AwaitNegotiate,
            negotiated: None,
        }
    }

    /// The transaction id (the host's, from its AUTH_Negotiate).
    pub fn t_id(&self) -> u16 {
        self.t_id
    }

    pub fn negotiated(&self) -> Option<(HashId, DhGroupId)> {
        self.negotiated
    }

    /// Whether the host is authenticated: after Success1 without
    /// bidirectional authentication, or after Success2.
    pub fn is_authenticated(&self) -> bool {
        matches!(self.state, State::Done | State::AwaitSuccess2)
    }

    /// Whether the transaction is over (nothing more to receive).
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the host asked for bidirectional authentication and the
    /// transaction awaits its Success2 (or Failure2).
    pub fn awaits_success2(&self) -> bool {
        matches!(self.state, State::AwaitSuccess2)
    }

    /// Whether taking message `m` now costs a modular exponentiation: an
    /// AUTH_Negotiate that would choose an ffdhe group (the key pair), or
    /// the DH-HMAC-CHAP_Reply of a transaction that chose one (the shared
    /// secret). What a caller may want off its thread; cheap (parses
    /// the Negotiate, nothing else).
    pub fn needs_dh(&self, m: &[u8]) -> bool {
        match &self.state {
            State::AwaitNegotiate => msg::parse_negotiate(m).is_ok_and(|n| {
                self.cfg
                    .dhgroups
                    .iter()
                    .find(|g| n.dhgroups.contains(&(**g as u8)))
                    .is_some_and(|g| *g != DhGroupId::Null)
            }),
            State::AwaitReply { kp: Some(_), .. } => {
                msg::message_id(m) == Some((AuthId::Reply.auth_type(), AuthId::Reply as u8))
            }
            _ => false,
        }
    }

    fn wrong_state(&self, op: &'static str) -> AuthError {
        AuthError::WrongState {
            op,
            state: self.state.name(),
        }
    }

    fn fail<T>(&mut self, e: AuthError) -> Result<T, AuthError> {
        self.state = State::Failed;
        Err(e)
    }

    /// Step 1: check the AUTH_Negotiate received, choose a hash and a
    /// group, and return the DH-HMAC-CHAP_Challenge to send.
    pub fn negotiate(&mut self, m: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::AwaitNegotiate) {
            return Err(self.wrong_state("negotiate"));
        }
        match self.challenge_for(m) {
            Ok(v) => Ok(v),
            Err(e) => self.fail(e),
        }
    }

    fn challenge_for(&mut self, m: &[u8]) -> Result<Vec<u8>, AuthError> {
        let n = msg::parse_negotiate(m)?;
        self.t_id = n.t_id;
        if n.sc_c != SC_C_NONE {
            return Err(AuthError::ConcatUnsupported(n.sc_c));
        }
        let hash = self
            .cfg
            .hashes
            .iter()
            .copied()
            .find(|h| n.hashes.contains(&(*h as u8)))
            .ok_or_else(|| AuthError::NoCommonHash {
                offered: n.hashes.clone(),
            })?;
        let group = self
            .cfg
            .dhgroups
            .iter()
            .copied()
            .find(|g| n.dhgroups.contains(&(*g as u8)))
            .ok_or_else(|| AuthError::NoCommonDhGroup {
                offered: n.dhgroups.clone(),
            })?;
        let mut c1 = vec![0u8; hash.hash_len()];
        random::fill(&mut c1)?;
        let seqnum = random::nonzero_u32()?;
        let kp = match group {
            DhGroupId::Null => None,
            g => Some(DhKeyPair::generate(g)?),
        };
        let out = msg::encode_challenge(
            self.t_id,
            hash,
            group,
            seqnum,
            &c1,
            kp.as_ref().map_or(&[][..], |k| k.public()),
        );
        self.negotiated = Some((hash, group));
        self.state = State::AwaitReply {
            hash,
            seqnum,
            c1: Secret::new(c1),
            kp,
        };
        Ok(out)
    }

    /// Step 2: check the DH-HMAC-CHAP_Reply received (the host's
    /// response) and return the DH-HMAC-CHAP_Success1 to send, with the
    /// controller's response when the host asked for it.
    pub fn reply(&mut self, m: &[u8]) -> Result<Vec<u8>, AuthError> {
        let State::AwaitReply {
            hash,
            seqnum,
            c1,
            kp,
        } = std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(self.wrong_state("reply"));
        };
        match self.success1_for(m, hash, seqnum, &c1, kp.as_ref()) {
            Ok(v) => Ok(v),
            Err(e) => self.fail(e),
        }
    }

    fn success1_for(
        &mut self,
        m: &[u8],
        hash: HashId,
        seqnum: u32,
        c1: &Secret,
        kp: Option<&DhKeyPair>,
    ) -> Result<Vec<u8>, AuthError> {
        const NAME: &str = "DH-HMAC-CHAP_Reply";
        let r = msg::parse_reply(m, hash)?;
        if r.t_id != self.t_id {
            return Err(AuthError::TransactionId {
                msg: NAME,
                expected: self.t_id,
                got: r.t_id,
            });
        }
        let ks = match kp {
            None if r.dhv.is_empty() => None,
            None => {
                return Err(AuthError::BadField {
                    msg: NAME,
                    field: "DHVLEN (null group)",
                    value: r.dhv.len() as u32,
                })
            }
            Some(kp) => Some(kp.shared(r.dhv)?),
        };
        let cfg = &*self.cfg;
        let key = cfg.host_key.transform(&cfg.hostnqn);
        let ca = augmented_challenge(hash, ks.as_ref(), c1.expose());
        let want = response(
            hash,
            &key,
            &ca,
            seqnum,
            self.t_id,
            Role::Host,
            &cfg.hostnqn,
            &cfg.subnqn,
        );
        if !ct_eq(want.expose(), r.r1) {
            return Err(AuthError::HostResponseMismatch);
        }
        let r2 = if r.cvalid {
            let ck = cfg.ctrl_key.as_ref().ok_or(AuthError::NoControllerKey)?;
            let ckey = ck.transform(&cfg.subnqn);
            let ca2 = augmented_challenge(hash, ks.as_ref(), r.c2);
            Some(response(
                hash,
                &ckey,
                &ca2,
                r.seqnum,
                self.t_id,
                Role::Controller,
                &cfg.subnqn,
                &cfg.hostnqn,
            ))
        } else {
            None
        };
        let out = msg::encode_success1(self.t_id, hash.hash_len(), r2.as_ref().map(|s| s.expose()));
        self.state = if r2.is_some() {
            State::AwaitSuccess2
        } else {
            State::Done
        };
        Ok(out)
    }

    /// Step 3 (bidirectional only): check the DH-HMAC-CHAP_Success2 (or
    /// the AUTH_Failure2 of a host that refused the controller's
    /// response: [`AuthError::Failure2`]).
    pub fn success2(&mut self, m: &[u8]) -> Result<(), AuthError> {
        if !matches!(self.state, State::AwaitSuccess2) {
            return Err(self.wrong_state("success2"));
        }
        let t_id = match msg::parse_success2(m) {
            Ok(t) => t,
            Err(e) => return self.fail(e),
        };
        if t_id != self.t_id {
            return self.fail(AuthError::TransactionId {
                msg: AuthId::Success2.name(),
                expected: self.t_id,
                got: t_id,
            });
        }
        self.state = State::Done;
        Ok(())
    }

    /// The AUTH_Failure1 to return to the host after `e`, if any (none
    /// when the host ended the transaction with AUTH_Failure2).
    pub fn failure1(&self, e: &AuthError) -> Option<Vec<u8>> {
        e.explanation()
            .map(|x| msg::encode_failure(AuthId::Failure1, self.t_id, x as u8))
    }
}
