//! In-band authentication wire formats (NVMe Base 2.x §8.13 "Authentication
//! over Fabrics", Fabrics Authentication Send/Receive): the two fabrics
//! commands that carry AUTH messages (FCTYPE 05h/06h, SECP E9h, SPSP0/1 =
//! 01h), the AUTH message headers of the DH-HMAC-CHAP protocol (fixed
//! parts; the variable parts follow them in the same buffer), the hash
//! function and Diffie-Hellman group identifiers, the AUTH_Failure reason
//! codes, and the AUTHREQ bits of a Connect response. Layouts and values
//! follow Linux `include/linux/nvme.h` (and SPDK `nvmf_spec.h`).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::sgl::SglDescriptor;
use super::{FcType, FABRICS_OPCODE, SQE_FLAGS_SGL};
use crate::{assert_offset, assert_size, Sqe};

/// Security Protocol (SECP) assigned to NVMe in-band authentication.
pub const AUTH_SECP_NVME: u8 = 0xE9;
/// SP Specific 0 and 1 for DH-HMAC-CHAP (both 01h).
pub const AUTH_SPSP: u8 = 0x01;

/// AUTHREQ (Connect response DW0 bits 31:16) bit 1: Authentication
/// Transaction Required.
pub const AUTHREQ_ATR: u16 = 1 << 1;
/// AUTHREQ bit 2: Authentication-initiated Secure Channel Required.
pub const AUTHREQ_ASCR: u16 = 1 << 2;

/// Authentication Send / Authentication Receive command (NVMe Base 2.x
/// Figure "Authentication Send/Receive Command"): SECP, SPSP0/1 and the
/// transfer length (TL for Send, AL for Receive) at bytes 40..48.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AuthCmd {
    pub opc: u8,
    pub flags: u8,
    pub cid: u16,
    /// [`FcType::AuthenticationSend`] or [`FcType::AuthenticationReceive`].
    pub fctype: u8,
    pub rsvd5: [u8; 19],
    /// SGL Descriptor 1: the AUTH message (Send: host to controller,
    /// Receive: controller to host).
    pub sgl1: SglDescriptor,
    pub rsvd40: u8,
    pub spsp0: u8,
    pub spsp1: u8,
    /// Security Protocol: [`AUTH_SECP_NVME`].
    pub secp: u8,
    /// Transfer Length (Send) or Allocation Length (Receive), bytes.
    pub len: u32,
    pub rsvd48: [u8; 16],
}
assert_size!(AuthCmd, 64);
assert_offset!(AuthCmd, fctype, 4);
assert_offset!(AuthCmd, sgl1, 24);
assert_offset!(AuthCmd, spsp0, 41);
assert_offset!(AuthCmd, spsp1, 42);
assert_offset!(AuthCmd, secp, 43);
assert_offset!(AuthCmd, len, 44);

impl AuthCmd {
    /// An Authentication Send carrying a `tl`-byte message in the
    /// capsule (SGL Data Block, offset 0).
    pub const fn send(tl: u32) -> Self {
        Self::new(
            FcType::AuthenticationSend,
            SglDescriptor::in_capsule(0, tl),
            tl,
        )
    }

    /// An Authentication Receive of at most `al` bytes; `sgl1` locates
    /// the host buffer (the transport fills it in).
    pub const fn receive(al: u32, sgl1: SglDescriptor) -> Self {
        Self::new(FcType::AuthenticationReceive, sgl1, al)
    }

    const fn new(fctype: FcType, sgl1: SglDescriptor, len: u32) -> Self {
        AuthCmd {
            opc: FABRICS_OPCODE,
            flags: SQE_FLAGS_SGL,
            cid: 0,
            fctype: fctype as u8,
            rsvd5: [0; 19],
            sgl1,
            rsvd40: 0,
            spsp0: AUTH_SPSP,
            spsp1: AUTH_SPSP,
            secp: AUTH_SECP_NVME,
            len,
            rsvd48: [0; 16],
        }
    }

    /// The view of a 64-byte SQE.
    pub fn from_sqe(sqe: &Sqe) -> Self {
        zerocopy::transmute!(*sqe)
    }

    /// The SQE these bytes make.
    pub fn to_sqe(&self) -> Sqe {
        zerocopy::transmute!(*self)
    }

    /// Whether SECP/SPSP0/SPSP1 name NVMe DH-HMAC-CHAP (E9h/01h/01h).
    pub const fn is_dhchap_protocol(&self) -> bool {
        self.secp == AUTH_SECP_NVME && self.spsp0 == AUTH_SPSP && self.spsp1 == AUTH_SPSP
    }
}

/// AUTH message type (byte 0 of every AUTH message).
pub mod auth_type {
    /// Common messages: AUTH_Negotiate, AUTH_Failure1/2.
    pub const COMMON: u8 = 0x00;
    /// DH-HMAC-CHAP messages.
    pub const DHCHAP: u8 = 0x01;
}

/// AUTH message identifier (byte 1 of every AUTH message).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AuthId {
    /// AUTH_Negotiate (common message).
    Negotiate = 0x00,
    /// DH-HMAC-CHAP_Challenge.
    Challenge = 0x01,
    /// DH-HMAC-CHAP_Reply.
    Reply = 0x02,
    /// DH-HMAC-CHAP_Success1.
    Success1 = 0x03,
    /// DH-HMAC-CHAP_Success2.
    Success2 = 0x04,
    /// AUTH_Failure2 (common message, host to controller).
    Failure2 = 0xF0,
    /// AUTH_Failure1 (common message, controller to host).
    Failure1 = 0xF1,
}

impl AuthId {
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => AuthId::Negotiate,
            0x01 => AuthId::Challenge,
            0x02 => AuthId::Reply,
            0x03 => AuthId::Success1,
            0x04 => AuthId::Success2,
            0xF0 => AuthId::Failure2,
            0xF1 => AuthId::Failure1,
            _ => return None,
        })
    }

    /// The AUTH type byte that goes with this identifier.
    pub const fn auth_type(self) -> u8 {
        match self {
            AuthId::Negotiate | AuthId::Failure1 | AuthId::Failure2 => auth_type::COMMON,
            _ => auth_type::DHCHAP,
        }
    }

    pub const fn name(self) -> &'static str {
        match self {
            AuthId::Negotiate => "AUTH_Negotiate",
            AuthId::Challenge => "DH-HMAC-CHAP_Challenge",
            AuthId::Reply => "DH-HMAC-CHAP_Reply",
            AuthId::Success1 => "DH-HMAC-CHAP_Success1",
            AuthId::Success2 => "DH-HMAC-CHAP_Success2",
            AuthId::Failure2 => "AUTH_Failure2",
            AuthId::Failure1 => "AUTH_Failure1",
        }
    }
}

/// Hash function identifiers (DH-HMAC-CHAP HashID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum HashId {
    Sha256 = 0x01,
    Sha384 = 0x02,
    Sha512 = 0x03,
}

impl HashId {
    /// Every hash, weakest first.
    pub const ALL: [HashId; 3] = [HashId::Sha256, HashId::Sha384, HashId::Sha512];

    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => HashId::Sha256,
            0x02 => HashId::Sha384,
            0x03 => HashId::Sha512,
            _ => return None,
        })
    }

    /// Digest length in bytes (HL).
    pub const fn hash_len(self) -> usize {
        match self {
            HashId::Sha256 => 32,
            HashId::Sha384 => 48,
            HashId::Sha512 => 64,
        }
    }

    /// SPDK's (and Linux's digest) name: `sha256`, `sha384`, `sha512`.
    pub const fn name(self) -> &'static str {
        match self {
            HashId::Sha256 => "sha256",
            HashId::Sha384 => "sha384",
            HashId::Sha512 => "sha512",
        }
    }

    /// The hash a name given by [`HashId::name`] (or Linux's `hmac(shaN)`)
    /// stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        let name = name
            .strip_prefix("hmac(")
            .and_then(|n| n.strip_suffix(')'))
            .unwrap_or(name);
        HashId::ALL
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(name))
    }
}

/// Diffie-Hellman group identifiers (DH-HMAC-CHAP DHgroupID); the ffdhe
/// groups are RFC 7919's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DhGroupId {
    /// No Diffie-Hellman exchange.
    Null = 0x00,
    Ffdhe2048 = 0x01,
    Ffdhe3072 = 0x02,
    Ffdhe4096 = 0x03,
    Ffdhe6144 = 0x04,
    Ffdhe8192 = 0x05,
}

impl DhGroupId {
    /// Every group, weakest first.
    pub const ALL: [DhGroupId; 6] = [
        DhGroupId::Null,
        DhGroupId::Ffdhe2048,
        DhGroupId::Ffdhe3072,
        DhGroupId::Ffdhe4096,
        DhGroupId::Ffdhe6144,
        DhGroupId::Ffdhe8192,
    ];

    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => DhGroupId::Null,
            0x01 => DhGroupId::Ffdhe2048,
            0x02 => DhGroupId::Ffdhe3072,
            0x03 => DhGroupId::Ffdhe4096,
            0x04 => DhGroupId::Ffdhe6144,
            0x05 => DhGroupId::Ffdhe8192,
            _ => return None,
        })
    }

    /// Length in bytes of the group's prime, and so of a DH value (DHVLEN)
    /// and of the shared secret; 0 for [`DhGroupId::Null`].
    pub const fn value_len(self) -> usize {
        match self {
            DhGroupId::Null => 0,
            DhGroupId::Ffdhe2048 => 256,
            DhGroupId::Ffdhe3072 => 384,
            DhGroupId::Ffdhe4096 => 512,
            DhGroupId::Ffdhe6144 => 768,
            DhGroupId::Ffdhe8192 => 1024,
        }
    }

    /// SPDK's and Linux's name: `null`, `ffdhe2048`, ... `ffdhe8192`.
    pub const fn name(self) -> &'static str {
        match self {
            DhGroupId::Null => "null",
            DhGroupId::Ffdhe2048 => "ffdhe2048",
            DhGroupId::Ffdhe3072 => "ffdhe3072",
            DhGroupId::Ffdhe4096 => "ffdhe4096",
            DhGroupId::Ffdhe6144 => "ffdhe6144",
            DhGroupId::Ffdhe8192 => "ffdhe8192",
        }
    }

    /// The group a name given by [`DhGroupId::name`] stands for.
    pub fn from_name(name: &str) -> Option<Self> {
        let name = name.trim();
        DhGroupId::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(name))
    }
}

/// Secure channel concatenation (SC_C of AUTH_Negotiate): none.
pub const SC_C_NONE: u8 = 0x00;

/// Authentication protocol identifier of DH-HMAC-CHAP in a protocol
/// descriptor.
pub const AUTH_PROTOCOL_DHCHAP: u8 = 0x01;

/// Size of the hash list and of the DH group list in a descriptor.
pub const AUTH_ID_LIST_LEN: usize = 30;

/// AUTH_Negotiate protocol descriptor (64 bytes): HALEN hash IDs in
/// `idlist[0..30]`, DHLEN DH group IDs in `idlist[30..60]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AuthProtocolDesc {
    /// [`AUTH_PROTOCOL_DHCHAP`].
    pub authid: u8,
    pub rsvd1: u8,
    /// Number of hash IDs.
    pub halen: u8,
    /// Number of DH group IDs.
    pub dhlen: u8,
    pub idlist: [u8; 60],
}
assert_size!(AuthProtocolDesc, 64);

/// AUTH_Negotiate header (8 bytes), followed by NAPD
/// [`AuthProtocolDesc`]s.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AuthNegotiateHdr {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    /// Transaction identifier.
    pub t_id: u16,
    /// Secure channel concatenation ([`SC_C_NONE`]).
    pub sc_c: u8,
    /// Number of authentication protocol descriptors.
    pub napd: u8,
}
assert_size!(AuthNegotiateHdr, 8);

/// DH-HMAC-CHAP_Challenge header (16 bytes), followed by the challenge
/// C1 (HL bytes) and the controller's DH value (DHVLEN bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DhchapChallengeHdr {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: u16,
    /// Hash length.
    pub hl: u8,
    pub rsvd7: u8,
    /// [`HashId`].
    pub hashid: u8,
    /// [`DhGroupId`].
    pub dhgid: u8,
    /// DH value length.
    pub dhvlen: u16,
    /// Sequence number S1 (non-zero).
    pub seqnum: u32,
}
assert_size!(DhchapChallengeHdr, 16);
assert_offset!(DhchapChallengeHdr, hashid, 8);
assert_offset!(DhchapChallengeHdr, dhvlen, 10);
assert_offset!(DhchapChallengeHdr, seqnum, 12);

/// DH-HMAC-CHAP_Reply header (16 bytes), followed by the response R1 (HL
/// bytes), the challenge C2 (HL bytes, zero when CVALID is 0) and the
/// host's DH value (DHVLEN bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DhchapReplyHdr {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: u16,
    pub hl: u8,
    pub rsvd7: u8,
    /// Challenge valid: the host asks the controller to authenticate.
    pub cvalid: u8,
    pub rsvd9: u8,
    pub dhvlen: u16,
    /// Sequence number S2 (0 when CVALID is 0).
    pub seqnum: u32,
}
assert_size!(DhchapReplyHdr, 16);
assert_offset!(DhchapReplyHdr, cvalid, 8);
assert_offset!(DhchapReplyHdr, dhvlen, 10);
assert_offset!(DhchapReplyHdr, seqnum, 12);

/// DH-HMAC-CHAP_Success1 header (16 bytes), followed by the response R2
/// (HL bytes) when RVALID is 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DhchapSuccess1Hdr {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: u16,
    pub hl: u8,
    pub rsvd7: u8,
    /// Response valid.
    pub rvalid: u8,
    pub rsvd9: [u8; 7],
}
assert_size!(DhchapSuccess1Hdr, 16);
assert_offset!(DhchapSuccess1Hdr, rvalid, 8);

/// DH-HMAC-CHAP_Success2 (16 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DhchapSuccess2 {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: u16,
    pub rsvd6: [u8; 10],
}
assert_size!(DhchapSuccess2, 16);

/// AUTH_Failure1 / AUTH_Failure2 (8 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct AuthFailure {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: u16,
    /// Reason code: [`AUTH_FAILURE_REASON_FAILED`].
    pub rescode: u8,
    /// Reason code explanation: [`FailureExplanation`].
    pub rescode_exp: u8,
}
assert_size!(AuthFailure, 8);

/// AUTH_Failure reason code: authentication failure.
pub const AUTH_FAILURE_REASON_FAILED: u8 = 0x01;

/// AUTH_Failure reason code explanations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FailureExplanation {
    /// 01h: authentication failed (a response did not verify).
    Failed = 0x01,
    /// 02h: no usable authentication protocol.
    ProtocolUnusable = 0x02,
    /// 03h: secure channel concatenation mismatch.
    ConcatMismatch = 0x03,
    /// 04h: no usable hash function.
    HashUnusable = 0x04,
    /// 05h: no usable DH group.
    DhGroupUnusable = 0x05,
    /// 06h: incorrect payload.
    IncorrectPayload = 0x06,
    /// 07h: incorrect protocol message.
    IncorrectMessage = 0x07,
}

impl FailureExplanation {
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x01 => FailureExplanation::Failed,
            0x02 => FailureExplanation::ProtocolUnusable,
            0x03 => FailureExplanation::ConcatMismatch,
            0x04 => FailureExplanation::HashUnusable,
            0x05 => FailureExplanation::DhGroupUnusable,
            0x06 => FailureExplanation::IncorrectPayload,
            0x07 => FailureExplanation::IncorrectMessage,
            _ => return None,
        })
    }

    pub const fn describe(self) -> &'static str {
        match self {
            FailureExplanation::Failed => "authentication failed",
            FailureExplanation::ProtocolUnusable => "authentication protocol not usable",
            FailureExplanation::ConcatMismatch => "secure channel concatenation mismatch",
            FailureExplanation::HashUnusable => "hash function not usable",
            FailureExplanation::DhGroupUnusable => "DH group not usable",
            FailureExplanation::IncorrectPayload => "incorrect payload",
            FailureExplanation::IncorrectMessage => "incorrect protocol message",
        }
    }
}

impl core::fmt::Display for FailureExplanation {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_cmd_fields() {
        let c = AuthCmd::send(72);
        let sqe = c.to_sqe();
        assert_eq!(FcType::of(&sqe), Some(FcType::AuthenticationSend));
        let b = c.as_bytes();
        assert_eq!(b[41], 1);
        assert_eq!(b[42], 1);
        assert_eq!(b[43], 0xE9);
        assert_eq!(u32::from_le_bytes([b[44], b[45], b[46], b[47]]), 72);
        assert!(AuthCmd::from_sqe(&sqe).is_dhchap_protocol());
    }

    #[test]
    fn ids_round_trip() {
        for h in HashId::ALL {
            assert_eq!(HashId::from_u8(h as u8), Some(h));
            assert_eq!(HashId::from_name(h.name()), Some(h));
        }
        assert_eq!(HashId::from_name("hmac(sha384)"), Some(HashId::Sha384));
        assert_eq!(HashId::from_u8(0), None);
        for g in DhGroupId::ALL {
            assert_eq!(DhGroupId::from_u8(g as u8), Some(g));
            assert_eq!(DhGroupId::from_name(g.name()), Some(g));
        }
        assert_eq!(DhGroupId::from_u8(6), None);
        for v in [0x00u8, 0x01, 0x02, 0x03, 0x04, 0xF0, 0xF1] {
            assert_eq!(AuthId::from_u8(v).map(|a| a as u8), Some(v));
        }
        assert_eq!(AuthId::Failure1.auth_type(), auth_type::COMMON);
        assert_eq!(AuthId::Reply.auth_type(), auth_type::DHCHAP);
        assert_eq!(
            FailureExplanation::from_u8(7),
            Some(FailureExplanation::IncorrectMessage)
        );
        assert_eq!(FailureExplanation::from_u8(8), None);
    }
}
