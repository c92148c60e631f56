//! Building and checking AUTH messages (the variable parts around the
//! fixed headers of `pollux_spec::fabrics`). Parsers never panic: every
//! length and field is checked before use.

use pollux_spec::fabrics::{
    auth_type, AuthFailure, AuthId, AuthNegotiateHdr, AuthProtocolDesc, DhGroupId,
    DhchapChallengeHdr, DhchapReplyHdr, DhchapSuccess1Hdr, DhchapSuccess2, HashId,
    AUTH_FAILURE_REASON_FAILED, AUTH_ID_LIST_LEN, AUTH_PROTOCOL_DHCHAP, SC_C_NONE,
};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::error::AuthError;

/// No AUTH message of DH-HMAC-CHAP is longer (a Reply with SHA-512 and
/// ffdhe8192 is 16 + 2 x 64 + 1024 = 1168 bytes); longer is refused.
pub const MAX_MSG_LEN: usize = 4096;

/// AUTH Receive allocation length a host uses: every message fits.
pub const RECV_ALLOC_LEN: u32 = MAX_MSG_LEN as u32;

/// AUTH id of AUTH_Failure1, for [`encode_failure`].
pub const FAILURE1: AuthId = AuthId::Failure1;
/// AUTH id of AUTH_Failure2, for [`encode_failure`].
pub const FAILURE2: AuthId = AuthId::Failure2;

/// The (AUTH type, AUTH id) of a message, `None` if shorter than 2 bytes.
pub fn message_id(msg: &[u8]) -> Option<(u8, u8)> {
    Some((*msg.first()?, *msg.get(1)?))
}

fn check_len(msg: &[u8], name: &'static str, need: usize) -> Result<(), AuthError> {
    if msg.len() > MAX_MSG_LEN {
        return Err(AuthError::Oversized {
            msg: name,
            len: msg.len(),
            max: MAX_MSG_LEN,
        });
    }
    if msg.len() < need {
        return Err(AuthError::Truncated {
            msg: name,
            len: msg.len(),
            need,
        });
    }
    Ok(())
}

/// Fail unless `msg` is the `want` message; a Failure1/Failure2 from the
/// peer (`peer_failure`) becomes [`AuthError::Failure1`]/`Failure2`.
fn expect(msg: &[u8], want: AuthId, peer_failure: AuthId) -> Result<(), AuthError> {
    let (ty, id) = message_id(msg).ok_or(AuthError::Truncated {
        msg: want.name(),
        len: msg.len(),
        need: 2,
    })?;
    if ty == auth_type::COMMON && id == peer_failure as u8 {
        let f = parse_failure(msg)?;
        return Err(match peer_failure {
            AuthId::Failure1 => AuthError::Failure1 {
                reason: f.rescode,
                explanation: f.rescode_exp,
            },
            _ => AuthError::Failure2 {
                reason: f.rescode,
                explanation: f.rescode_exp,
            },
        });
    }
    if ty != want.auth_type() || id != want as u8 {
        return Err(AuthError::UnexpectedMessage {
            expected: want.name(),
            auth_type: ty,
            auth_id: id,
        });
    }
    Ok(())
}

fn exact(msg: &[u8], name: &'static str, len: usize) -> Result<(), AuthError> {
    if msg.len() < len {
        return Err(AuthError::Truncated {
            msg: name,
            len: msg.len(),
            need: len,
        });
    }
    if msg.len() > len {
        return Err(AuthError::Oversized {
            msg: name,
            len: msg.len(),
            max: len,
        });
    }
    Ok(())
}

fn bad(msg: &'static str, field: &'static str, value: impl Into<u32>) -> AuthError {
    AuthError::BadField {
        msg,
        field,
        value: value.into(),
    }
}

/// AUTH_Failure1/2 fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub t_id: u16,
    pub rescode: u8,
    pub rescode_exp: u8,
}

fn parse_failure(msg: &[u8]) -> Result<Failure, AuthError> {
    check_len(msg, AuthId::Failure1.name(), size_of::<AuthFailure>())?;
    let (h, _) =
        AuthFailure::read_from_prefix(msg).map_err(|_| bad("AUTH_Failure", "length", 0u32))?;
    Ok(Failure {
        t_id: h.t_id,
        rescode: h.rescode,
        rescode_exp: h.rescode_exp,
    })
}

/// AUTH_Failure1 (`id` = Failure1, controller) or AUTH_Failure2 (host).
pub fn encode_failure(id: AuthId, t_id: u16, explanation: u8) -> Vec<u8> {
    AuthFailure {
        auth_type: auth_type::COMMON,
        auth_id: id as u8,
        rsvd2: [0; 2],
        t_id,
        rescode: AUTH_FAILURE_REASON_FAILED,
        rescode_exp: explanation,
    }
    .as_bytes()
    .to_vec()
}

/// A checked AUTH_Negotiate: the DH-HMAC-CHAP descriptor's lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiate {
    pub t_id: u16,
    pub sc_c: u8,
    /// Hash ids offered (as sent, unknown ids included).
    pub hashes: Vec<u8>,
    /// DH group ids offered (as sent).
    pub dhgroups: Vec<u8>,
}

/// AUTH_Negotiate with one DH-HMAC-CHAP descriptor (as Linux and SPDK).
pub fn encode_negotiate(t_id: u16, hashes: &[HashId], dhgroups: &[DhGroupId]) -> Vec<u8> {
    let hdr = AuthNegotiateHdr {
        auth_type: auth_type::COMMON,
        auth_id: AuthId::Negotiate as u8,
        rsvd2: [0; 2],
        t_id,
        sc_c: SC_C_NONE,
        napd: 1,
    };
    let mut d = AuthProtocolDesc::new_zeroed();
    d.authid = AUTH_PROTOCOL_DHCHAP;
    for (i, h) in hashes.iter().take(AUTH_ID_LIST_LEN).enumerate() {
        d.idlist[i] = *h as u8;
        d.halen += 1;
    }
    for (i, g) in dhgroups.iter().take(AUTH_ID_LIST_LEN).enumerate() {
        d.idlist[AUTH_ID_LIST_LEN + i] = *g as u8;
        d.dhlen += 1;
    }
    let mut v = hdr.as_bytes().to_vec();
    v.extend_from_slice(d.as_bytes());
    v
}

/// Check an AUTH_Negotiate (exactly 8 + NAPD x 64 bytes) and pick its
/// DH-HMAC-CHAP descriptor.
pub fn parse_negotiate(msg: &[u8]) -> Result<Negotiate, AuthError> {
    const NAME: &str = "AUTH_Negotiate";
    check_len(msg, NAME, 2)?;
    expect(msg, AuthId::Negotiate, AuthId::Failure2)?;
    check_len(msg, NAME, size_of::<AuthNegotiateHdr>())?;
    let (h, rest) =
        AuthNegotiateHdr::read_from_prefix(msg).map_err(|_| bad(NAME, "length", 0u32))?;
    if h.napd == 0 {
        return Err(AuthError::ProtocolUnusable);
    }
    exact(
        msg,
        NAME,
        size_of::<AuthNegotiateHdr>() + h.napd as usize * 64,
    )?;
    for chunk in rest.chunks_exact(size_of::<AuthProtocolDesc>()) {
        let d =
            AuthProtocolDesc::read_from_bytes(chunk).map_err(|_| bad(NAME, "descriptor", 0u32))?;
        if d.authid != AUTH_PROTOCOL_DHCHAP {
            continue;
        }
        if d.halen as usize > AUTH_ID_LIST_LEN {
            return Err(bad(NAME, "HALEN", d.halen));
        }
        if d.dhlen as usize > AUTH_ID_LIST_LEN {
            return Err(bad(NAME, "DHLEN", d.dhlen));
        }
        return Ok(Negotiate {
            t_id: h.t_id,
            sc_c: h.sc_c,
            hashes: d.idlist[..d.halen as usize].to_vec(),
            dhgroups: d.idlist[AUTH_ID_LIST_LEN..AUTH_ID_LIST_LEN + d.dhlen as usize].to_vec(),
        });
    }
    Err(AuthError::ProtocolUnusable)
}

/// A checked DH-HMAC-CHAP_Challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge<'a> {
    pub t_id: u16,
    pub hash: HashId,
    pub dhgroup: DhGroupId,
    pub seqnum: u32,
    /// C1, `hash.hash_len()` bytes.
    pub c1: &'a [u8],
    /// The controller's DH value (empty for the null group).
    pub dhv: &'a [u8],
}

pub fn encode_challenge(
    t_id: u16,
    hash: HashId,
    dhgroup: DhGroupId,
    seqnum: u32,
    c1: &[u8],
    dhv: &[u8],
) -> Vec<u8> {
    let hdr = DhchapChallengeHdr {
        auth_type: auth_type::DHCHAP,
        auth_id: AuthId::Challenge as u8,
        rsvd2: [0; 2],
        t_id,
        hl: hash.hash_len() as u8,
        rsvd7: 0,
        hashid: hash as u8,
        dhgid: dhgroup as u8,
        dhvlen: dhv.len() as u16,
        seqnum,
    };
    let mut v = hdr.as_bytes().to_vec();
    v.extend_from_slice(c1);
    v.extend_from_slice(dhv);
    v
}

/// Check a DH-HMAC-CHAP_Challenge (bytes past its end, the rest of the
/// AUTH Receive buffer, are ignored). Hash and group must be known; the
/// caller checks they are allowed.
pub fn parse_challenge(msg: &[u8]) -> Result<Challenge<'_>, AuthError> {
    const NAME: &str = "DH-HMAC-CHAP_Challenge";
    check_len(msg, NAME, 2)?;
    expect(msg, AuthId::Challenge, AuthId::Failure1)?;
    check_len(msg, NAME, size_of::<DhchapChallengeHdr>())?;
    let (h, rest) =
        DhchapChallengeHdr::read_from_prefix(msg).map_err(|_| bad(NAME, "length", 0u32))?;
    let hash = HashId::from_u8(h.hashid).ok_or(AuthError::HashUnusable(h.hashid))?;
    let dhgroup = DhGroupId::from_u8(h.dhgid).ok_or(AuthError::DhGroupUnusable(h.dhgid))?;
    if h.hl as usize != hash.hash_len() {
        return Err(bad(NAME, "HL", h.hl));
    }
    if h.seqnum == 0 {
        return Err(bad(NAME, "sequence number", 0u32));
    }
    let dhvlen = h.dhvlen as usize;
    if dhgroup == DhGroupId::Null && dhvlen != 0 {
        return Err(bad(NAME, "DHVLEN (null group)", h.dhvlen));
    }
    if dhgroup != DhGroupId::Null && (dhvlen == 0 || dhvlen > dhgroup.value_len()) {
        return Err(bad(NAME, "DHVLEN", h.dhvlen));
    }
    let hl = hash.hash_len();
    if rest.len() < hl + dhvlen {
        return Err(AuthError::Truncated {
            msg: NAME,
            len: msg.len(),
            need: size_of::<DhchapChallengeHdr>() + hl + dhvlen,
        });
    }
    Ok(Challenge {
        t_id: h.t_id,
        hash,
        dhgroup,
        seqnum: h.seqnum,
        c1: &rest[..hl],
        dhv: &rest[hl..hl + dhvlen],
    })
}

/// A checked DH-HMAC-CHAP_Reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply<'a> {
    pub t_id: u16,
    pub cvalid: bool,
    pub seqnum: u32,
    /// R1, HL bytes.
    pub r1: &'a [u8],
    /// C2, HL bytes (meaningful when `cvalid`).
    pub c2: &'a [u8],
    /// The host's DH value.
    pub dhv: &'a [u8],
}

pub fn encode_reply(t_id: u16, r1: &[u8], c2: Option<(&[u8], u32)>, dhv: &[u8]) -> Vec<u8> {
    let hl = r1.len();
    let hdr = DhchapReplyHdr {
        auth_type: auth_type::DHCHAP,
        auth_id: AuthId::Reply as u8,
        rsvd2: [0; 2],
        t_id,
        hl: hl as u8,
        rsvd7: 0,
        cvalid: c2.is_some() as u8,
        rsvd9: 0,
        dhvlen: dhv.len() as u16,
        seqnum: c2.map_or(0, |(_, s)| s),
    };
    let mut v = hdr.as_bytes().to_vec();
    v.extend_from_slice(r1);
    match c2 {
        Some((c, _)) => v.extend_from_slice(c),
        None => v.resize(v.len() + hl, 0),
    }
    v.extend_from_slice(dhv);
    v
}

/// Check a DH-HMAC-CHAP_Reply for `hash` (exactly 16 + 2 HL + DHVLEN
/// bytes, as its Authentication Send carries it).
pub fn parse_reply(msg: &[u8], hash: HashId) -> Result<Reply<'_>, AuthError> {
    const NAME: &str = "DH-HMAC-CHAP_Reply";
    check_len(msg, NAME, 2)?;
    expect(msg, AuthId::Reply, AuthId::Failure2)?;
    check_len(msg, NAME, size_of::<DhchapReplyHdr>())?;
    let (h, rest) = DhchapReplyHdr::read_from_prefix(msg).map_err(|_| bad(NAME, "length", 0u32))?;
    let hl = hash.hash_len();
    if h.hl as usize != hl {
        return Err(bad(NAME, "HL", h.hl));
    }
    if h.cvalid > 1 {
        return Err(bad(NAME, "CVALID", h.cvalid));
    }
    if h.cvalid == 1 && h.seqnum == 0 {
        return Err(bad(NAME, "sequence number", 0u32));
    }
    let dhvlen = h.dhvlen as usize;
    exact(msg, NAME, size_of::<DhchapReplyHdr>() + 2 * hl + dhvlen)?;
    Ok(Reply {
        t_id: h.t_id,
        cvalid: h.cvalid == 1,
        seqnum: h.seqnum,
        r1: &rest[..hl],
        c2: &rest[hl..2 * hl],
        dhv: &rest[2 * hl..],
    })
}

/// A checked DH-HMAC-CHAP_Success1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Success1<'a> {
    pub t_id: u16,
    /// R2 when RVALID is set.
    pub r2: Option<&'a [u8]>,
}

pub fn encode_success1(t_id: u16, hl: usize, r2: Option<&[u8]>) -> Vec<u8> {
    let hdr = DhchapSuccess1Hdr {
        auth_type: auth_type::DHCHAP,
        auth_id: AuthId::Success1 as u8,
        rsvd2: [0; 2],
        t_id,
        hl: hl as u8,
        rsvd7: 0,
        rvalid: r2.is_some() as u8,
        rsvd9: [0; 7],
    };
    let mut v = hdr.as_bytes().to_vec();
    match r2 {
        Some(r) => v.extend_from_slice(r),
        None => v.resize(v.len() + hl, 0),
    }
    v
}

/// Check a DH-HMAC-CHAP_Success1 for `hash` (trailing bytes ignored).
pub fn parse_success1(msg: &[u8], hash: HashId) -> Result<Success1<'_>, AuthError> {
    const NAME: &str = "DH-HMAC-CHAP_Success1";
    check_len(msg, NAME, 2)?;
    expect(msg, AuthId::Success1, AuthId::Failure1)?;
    check_len(msg, NAME, size_of::<DhchapSuccess1Hdr>())?;
    let (h, rest) =
        DhchapSuccess1Hdr::read_from_prefix(msg).map_err(|_| bad(NAME, "length", 0u32))?;
    if h.rvalid > 1 {
        return Err(bad(NAME, "RVALID", h.rvalid));
    }
    if h.rvalid == 0 {
        return Ok(Success1 {
            t_id: h.t_id,
            r2: None,
        });
    }
    let hl = hash.hash_len();
    if h.hl as usize != hl {
        return Err(bad(NAME, "HL", h.hl));
    }
    if rest.len() < hl {
        return Err(AuthError::Truncated {
            msg: NAME,
            len: msg.len(),
            need: size_of::<DhchapSuccess1Hdr>() + hl,
        });
    }
    Ok(Success1 {
        t_id: h.t_id,
        r2: Some(&rest[..hl]),
    })
}

pub fn encode_success2(t_id: u16) -> Vec<u8> {
    DhchapSuccess2 {
        auth_type: auth_type::DHCHAP,
        auth_id: AuthId::Success2 as u8,
        rsvd2: [0; 2],
        t_id,
        rsvd6: [0; 10],
    }
    .as_bytes()
    .to_vec()
}

/// Check a DH-HMAC-CHAP_Success2 and return its transaction id (an
/// AUTH_Failure2 in its place becomes [`AuthError::Failure2`]).
pub fn parse_success2(msg: &[u8]) -> Result<u16, AuthError> {
    const NAME: &str = "DH-HMAC-CHAP_Success2";
    check_len(msg, NAME, 2)?;
    expect(msg, AuthId::Success2, AuthId::Failure2)?;
    check_len(msg, NAME, size_of::<AuthFailure>())?;
    exact(msg, NAME, size_of::<DhchapSuccess2>())?;
    let h = DhchapSuccess2::read_from_bytes(msg).map_err(|_| bad(NAME, "length", 0u32))?;
    Ok(h.t_id)
}
