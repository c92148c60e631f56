//! The host's side of a DH-HMAC-CHAP transaction, free of I/O: it makes
//! the messages to send with Authentication Send and checks those an
//! Authentication Receive brings back.

use std::sync::Arc;

use pollux_spec::fabrics::{AuthId, DhGroupId, HashId};

use crate::bytes::Secret;
use crate::compute::{augmented_challenge, response, Role};
use crate::dh::DhKeyPair;
use crate::digest::ct_eq;
use crate::error::AuthError;
use crate::msg;
use crate::random;
use crate::secret::DhchapKey;

/// What a host authenticates with.
#[derive(Clone, Debug)]
pub struct HostConfig {
    pub hostnqn: String,
    pub subnqn: String,
    /// The host's secret (DH-HMAC-CHAP key).
    pub key: DhchapKey,
    /// The controller's secret: when set, the controller must
    /// authenticate too (bidirectional).
    pub ctrl_key: Option<DhchapKey>,
    /// Hashes offered, in the order sent.
    pub hashes: Vec<HashId>,
    /// DH groups offered, in the order sent.
    pub dhgroups: Vec<DhGroupId>,
}

impl HostConfig {
    /// Every hash and group offered (Linux's order: SHA-256.., null..).
    pub fn new(hostnqn: impl Into<String>, subnqn: impl Into<String>, key: DhchapKey) -> Self {
        HostConfig {
            hostnqn: hostnqn.into(),
            subnqn: subnqn.into(),
            key,
            ctrl_key: None,
            hashes: HashId::ALL.to_vec(),
            dhgroups: DhGroupId::ALL.to_vec(),
        }
    }
}

enum State {
    Start,
    AwaitChallenge,
    AwaitSuccess1 {
        hash: HashId,
        /// The controller's expected response R2 when bidirectional.
        expect_r2: Option<Secret>,
    },
    Done,
    Failed,
}

impl State {
    const fn name(&self) -> &'static str {
        match self {
            State::Start => "start",
            State::AwaitChallenge => "awaiting the challenge",
            State::AwaitSuccess1 { .. } => "awaiting success1",
            State::Done => "done",
            State::Failed => "failed",
        }
    }
}

/// One host authentication transaction on one queue.
pub struct HostAuth {
    cfg: Arc<HostConfig>,
    t_id: u16,
    state: State,
    negotiated: Option<(HashId, DhGroupId)>,
}

impl HostAuth {
    /// A transaction with identifier `t_id`.
    pub fn new(cfg: Arc<HostConfig>, t_id: u16) -> Self {
        HostAuth {
            cfg,
            t_id,
            state: State::Start,
            negotiated: None,
        }
    }

    pub fn t_id(&self) -> u16 {
        self.t_id
    }

    /// The hash and DH group the controller chose, once challenged.
    pub fn negotiated(&self) -> Option<(HashId, DhGroupId)> {
        self.negotiated
    }

    /// Whether the transaction succeeded.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// Whether the controller must prove it knows its secret.
    pub fn is_bidirectional(&self) -> bool {
        self.cfg.ctrl_key.is_some()
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

    /// Step 1: the AUTH_Negotiate to send.
    pub fn negotiate(&mut self) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::Start) {
            return Err(self.wrong_state("negotiate"));
        }
        self.state = State::AwaitChallenge;
        Ok(msg::encode_negotiate(
            self.t_id,
            &self.cfg.hashes,
            &self.cfg.dhgroups,
        ))
    }

    /// Step 2: check the DH-HMAC-CHAP_Challenge received and return the
    /// DH-HMAC-CHAP_Reply to send.
    pub fn challenge(&mut self, m: &[u8]) -> Result<Vec<u8>, AuthError> {
        if !matches!(self.state, State::AwaitChallenge) {
            return Err(self.wrong_state("challenge"));
        }
        match self.reply_to(m) {
            Ok(v) => Ok(v),
            Err(e) => self.fail(e),
        }
    }

    fn reply_to(&mut self, m: &[u8]) -> Result<Vec<u8>, AuthError> {
        let c = msg::parse_challenge(m)?;
        if c.t_id != self.t_id {
            return Err(AuthError::TransactionId {
                msg: AuthId::Challenge.name(),
                expected: self.t_id,
                got: c.t_id,
            });
        }
        if !self.cfg.hashes.contains(&c.hash) {
            return Err(AuthError::HashUnusable(c.hash as u8));
        }
        if !self.cfg.dhgroups.contains(&c.dhgroup) {
            return Err(AuthError::DhGroupUnusable(c.dhgroup as u8));
        }
        let h = c.hash;
        let (public, ks) = if c.dhgroup == DhGroupId::Null {
            (Vec::new(), None)
        } else {
            let kp = DhKeyPair::generate(c.dhgroup)?;
            let ks = kp.shared(c.dhv)?;
            (kp.public().to_vec(), Some(ks))
        };
        let cfg = &*self.cfg;
        let key = cfg.key.transform(&cfg.hostnqn);
        let ca = augmented_challenge(h, ks.as_ref(), c.c1);
        let r1 = response(
            h,
            &key,
            &ca,
            c.seqnum,
            self.t_id,
            Role::Host,
            &cfg.hostnqn,
            &cfg.subnqn,
        );
        let (c2, expect_r2) = match &cfg.ctrl_key {
            None => (None, None),
            Some(ck) => {
                let mut c2 = vec![0u8; h.hash_len()];
                random::fill(&mut c2)?;
                let s2 = random::nonzero_u32()?;
                let ckey = ck.transform(&cfg.subnqn);
                let ca2 = augmented_challenge(h, ks.as_ref(), &c2);
                let r2 = response(
                    h,
                    &ckey,
                    &ca2,
                    s2,
                    self.t_id,
                    Role::Controller,
                    &cfg.subnqn,
                    &cfg.hostnqn,
                );
                (Some((c2, s2)), Some(r2))
            }
        };
        let out = msg::encode_reply(
            self.t_id,
            r1.expose(),
            c2.as_ref().map(|(c, s)| (c.as_slice(), *s)),
            &public,
        );
        self.negotiated = Some((h, c.dhgroup));
        self.state = State::AwaitSuccess1 { hash: h, expect_r2 };
        Ok(out)
    }

    /// Step 3: check the DH-HMAC-CHAP_Success1 received. When
    /// bidirectional, verify the controller's response and return the
    /// DH-HMAC-CHAP_Success2 to send; `None` ends the transaction here.
    pub fn success1(&mut self, m: &[u8]) -> Result<Option<Vec<u8>>, AuthError> {
        let State::AwaitSuccess1 { hash, expect_r2 } =
            std::mem::replace(&mut self.state, State::Failed)
        else {
            return Err(self.wrong_state("success1"));
        };
        let s = match msg::parse_success1(m, hash) {
            Ok(s) => s,
            Err(e) => return self.fail(e),
        };
        if s.t_id != self.t_id {
            return self.fail(AuthError::TransactionId {
                msg: AuthId::Success1.name(),
                expected: self.t_id,
                got: s.t_id,
            });
        }
        match (expect_r2, s.r2) {
            (None, _) => {
                self.state = State::Done;
                Ok(None)
            }
            (Some(_), None) => self.fail(AuthError::MissingControllerResponse),
            (Some(want), Some(got)) => {
                if !ct_eq(want.expose(), got) {
                    return self.fail(AuthError::ControllerResponseMismatch);
                }
                self.state = State::Done;
                Ok(Some(msg::encode_success2(self.t_id)))
            }
        }
    }

    /// The AUTH_Failure2 to send the controller after `e`, if any (none
    /// when the controller ended the transaction with AUTH_Failure1).
    pub fn failure2(&self, e: &AuthError) -> Option<Vec<u8>> {
        // Before a challenge arrives there is no transaction to abort.
        if matches!(self.state, State::Start) {
            return None;
        }
        e.explanation()
            .map(|x| msg::encode_failure(AuthId::Failure2, self.t_id, x as u8))
    }
}
