//! In-band authentication (DH-HMAC-CHAP) right after a queue's Connect:
//! the host's side of the exchange (`pollux_auth::HostAuth`) carried by
//! Authentication Send/Receive on the queue's own connection, before any
//! other command. It runs when the controller asks for it (AUTHREQ.ATR in
//! the Connect response) or when the host has a key (then a controller
//! that does not authenticate is not used); a host without a key that is
//! asked to authenticate stops with an error saying so.
use std::fmt;
use std::sync::Arc;

use pollux_auth::msg::{message_id, RECV_ALLOC_LEN};
use pollux_auth::{AuthError, DhGroupId, HashId, HostAuth, HostConfig};
use pollux_spec::fabrics::{AuthCmd, SglDescriptor, AUTHREQ_ASCR, AUTHREQ_ATR};
use pollux_spec::Status;

use crate::error::{Error, Result};
use crate::fabrics::auth_failed::{AuthFailed, AuthFailure};
use crate::fabrics::options::FabricsOptions;
use crate::fabrics::wire::{CapsuleData, Connection};

/// Authenticates queue `qid` on `conn` after its Connect answered
/// `authreq` (DW0 bits 31:16), if needed (module docs).
pub(crate) fn authenticate<C: Connection>(
    conn: &mut C,
    addr: &dyn fmt::Display,
    opts: &FabricsOptions,
    qid: u16,
    cntlid: u16,
    authreq: u16,
) -> Result<()> {
    let asked = authreq & (AUTHREQ_ATR | AUTHREQ_ASCR) != 0;
    if !asked && opts.auth.key.is_none() {
        return Ok(());
    }
    let failed = |failure| {
        Error::Auth(Box::new(AuthFailed {
            addr: addr.to_string(),
            subnqn: opts.subnqn.clone(),
            cntlid,
            qid,
            failure,
        }))
    };
    if authreq & AUTHREQ_ASCR != 0 {
        return Err(failed(AuthFailure::SecureChannelRequired));
    }
    let Some(key) = opts.auth.key.clone() else {
        return Err(failed(AuthFailure::KeyMissing));
    };
    let mut cfg = HostConfig::new(&opts.hostnqn, &opts.subnqn, key);
    cfg.ctrl_key = opts.auth.ctrl_key.clone();
    if !opts.auth.digests.is_empty() {
        cfg.hashes = opts.auth.digests.clone();
    }
    if !opts.auth.dhgroups.is_empty() {
        cfg.dhgroups = opts.auth.dhgroups.clone();
    }
    // The transaction ID: the queue's, unique within the controller.
    let mut host = HostAuth::new(Arc::new(cfg), qid);
    let mut x = Exchange { conn, opts };
    match run(&mut host, &mut x) {
        Ok(()) => {
            let (h, g) = host
                .negotiated()
                .unwrap_or((HashId::Sha256, DhGroupId::Null));
            tracing::debug!(
                %addr,
                qid,
                cntlid,
                hash = h.name(),
                dhgroup = g.name(),
                bidirectional = host.is_bidirectional(),
                "authenticated"
            );
            Ok(())
        }
        Err(Step::Transport(e)) => Err(e),
        Err(Step::Command(cmd, status)) => Err(failed(AuthFailure::Command { cmd, status })),
        Err(Step::Auth(e)) => {
            // Tell the controller why, as Linux does; it ends the
            // transaction (and the queue) either way.
            if let Some(f2) = host.failure2(&e) {
                let _ = x.send(&f2);
            }
            Err(failed(AuthFailure::Protocol(e)))
        }
    }
}

enum Step {
    Transport(Error),
    Command(&'static str, Status),
    Auth(AuthError),
}

impl From<AuthError> for Step {
    fn from(e: AuthError) -> Step {
        Step::Auth(e)
    }
}

struct Exchange<'a, C> {
    conn: &'a mut C,
    opts: &'a FabricsOptions,
}

impl<C: Connection> Exchange<'_, C> {
    fn send(&mut self, m: &[u8]) -> Result<(), Step> {
        const WHAT: &str = "Authentication Send";
        let cmd = AuthCmd::send(m.len() as u32);
        let (cqe, _) = self
            .conn
            .exchange(
                0,
                cmd.to_sqe(),
                CapsuleData::Bytes(m),
                self.opts.admin_timeout,
                WHAT,
            )
            .map_err(Step::Transport)?;
        let st = cqe.status();
        if !st.is_success() {
            return Err(Step::Command(WHAT, st));
        }
        Ok(())
    }

    fn receive(&mut self) -> Result<Vec<u8>, Step> {
        const WHAT: &str = "Authentication Receive";
        let cmd = AuthCmd::receive(RECV_ALLOC_LEN, SglDescriptor::tcp_transport(RECV_ALLOC_LEN));
        let (cqe, data) = self
            .conn
            .exchange(
                0,
                cmd.to_sqe(),
                CapsuleData::Bounce(RECV_ALLOC_LEN),
                self.opts.admin_timeout,
                WHAT,
            )
            .map_err(Step::Transport)?;
        let st = cqe.status();
        if !st.is_success() {
            return Err(Step::Command(WHAT, st));
        }
        tracing::trace!(id = ?message_id(&data), "AUTH message received");
        Ok(data)
    }
}

fn run<C: Connection>(host: &mut HostAuth, x: &mut Exchange<'_, C>) -> Result<(), Step> {
    let neg = host.negotiate()?;
    x.send(&neg)?;
    let chal = x.receive()?;
    let reply = host.challenge(&chal)?;
    x.send(&reply)?;
    let s1 = x.receive()?;
    if let Some(s2) = host.success1(&s1)? {
        x.send(&s2)?;
    }
    Ok(())
}
