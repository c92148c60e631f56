//! NVMe/TCP transport PDUs (NVMe/TCP Transport Specification 1.0, §3.3 and
//! §3.6): the common header, every PDU-specific header, a validating parser
//! for received headers, PDU layout, CRC32C digests and builders.
//!
//! Every PDU starts with the 8-byte [`CommonHeader`] (§3.6.1): type, flags,
//! HLEN (header length, without digest), PDO (PDU data offset) and PLEN
//! (total length, digests and padding included). Its layout on the wire is
//!
//! ```text
//! | header (HLEN) | HDGST (4, opt.) | pad to PDO | data | DDGST (4, opt.) |
//! ```
//!
//! A receiver reads the first 8 bytes, calls [`CommonHeader::check`] with
//! its [`RxConfig`] and gets a [`PduLayout`] telling where the header digest,
//! data and data digest lie, or a [`PduError`] that names the offending field
//! and maps to the Fatal Error Status / Information a Termination Request
//! must carry ([`PduError::fes`], [`PduError::fei`], [`PduError::term_req`]).
//! It then reads the rest of the header and calls [`PduHeader::parse`],
//! which verifies the header digest and the type-specific fields.
//!
//! Senders use the builders ([`IcReq::new`], [`CapsuleCmd::new`],
//! [`C2HData::new`], ...) which compute HLEN, PDO and PLEN.
//!
//! Digests are CRC32C (§3.6.2.2) over the header (HLEN bytes) and over the
//! data (without padding), stored little-endian.
use core::fmt;
use core::ops::Range;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size, Cqe, Sqe};

/// Length of a header or data digest.
pub const DIGEST_LEN: u32 = 4;
/// PDU Format Version 1.0 (ICReq/ICResp PFV).
pub const PFV_1_0: u16 = 0;
/// Largest HPDA/CPDA value (alignment of 128 bytes).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA a controller may announce (§3.6.2.3).
pub const MIN_MAXH2CDATA: u32 = 4096;
/// Most bytes of the offending PDU header a Termination Request carries.
pub const TERM_REQ_MAX_DATA: u32 = 128;
/// Largest PLEN of a Termination Request (header + 128 bytes).
pub const TERM_REQ_MAX_PLEN: u32 = TermReq::HLEN as u32 + TERM_REQ_MAX_DATA;
/// IANA port for NVMe/TCP I/O controllers.
pub const DEFAULT_PORT: u16 = 4420;
/// IANA port for NVMe/TCP discovery controllers.
pub const DISCOVERY_PORT: u16 = 8009;

/// Byte alignment a PDA value (HPDA/CPDA, 0's based dwords) requires.
#[inline]
pub const fn pda_alignment(pda: u8) -> u32 {
    (pda as u32 + 1) * 4
}

/// Which end of the connection a PDU comes from or is checked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Host,
    Controller,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Host => "host",
            Role::Controller => "controller",
        })
    }
}

/// PDU types (§3.6.1, Figure 13).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl PduType {
    /// The type for a PDU-Type byte, if it is defined.
    pub const fn from_u8(v: u8) -> Option<Self> {
        use PduType::*;
        Some(match v {
            0x00 => IcReq,
            0x01 => IcResp,
            0x02 => H2CTermReq,
            0x03 => C2HTermReq,
            0x04 => CapsuleCmd,
            0x05 => CapsuleResp,
            0x06 => H2CData,
            0x07 => C2HData,
            0x09 => R2T,
            _ => return None,
        })
    }

    /// The side that sends PDUs of this type (bit 0 of the type: 0 = host).
    pub const fn sender(self) -> Role {
        if self as u8 & 1 == 0 {
            Role::Host
        } else {
            Role::Controller
        }
    }

    /// The HLEN every PDU of this type has.
    pub const fn hlen(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            _ => 24,
        }
    }

    /// The flags (§3.6.1) a PDU of this type may carry.
    pub const fn allowed_flags(self) -> u8 {
        match self {
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq => 0,
            PduType::CapsuleCmd => flags::HDGSTF | flags::DDGSTF,
            PduType::CapsuleResp | PduType::R2T => flags::HDGSTF,
            PduType::H2CData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU,
            PduType::C2HData => flags::HDGSTF | flags::DDGSTF | flags::LAST_PDU | flags::SUCCESS,
        }
    }

    /// Whether PDUs of this type carry data located by PDO.
    pub const fn carries_data(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }

    /// Whether this is a connection initialization PDU (ICReq, ICResp).
    pub const fn is_init(self) -> bool {
        matches!(self, PduType::IcReq | PduType::IcResp)
    }

    /// Whether this is a Termination Request (H2C or C2H).
    pub const fn is_term(self) -> bool {
        matches!(self, PduType::H2CTermReq | PduType::C2HTermReq)
    }

    /// The Termination Request type `role` sends.
    pub const fn term_req_from(role: Role) -> Self {
        match role {
            Role::Host => PduType::H2CTermReq,
            Role::Controller => PduType::C2HTermReq,
        }
    }
}

impl fmt::Display for PduType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PduType::IcReq => "ICReq",
            PduType::IcResp => "ICResp",
            PduType::H2CTermReq => "H2CTermReq",
            PduType::C2HTermReq => "C2HTermReq",
            PduType::CapsuleCmd => "CapsuleCmd",
            PduType::CapsuleResp => "CapsuleResp",
            PduType::H2CData => "H2CData",
            PduType::C2HData => "C2HData",
            PduType::R2T => "R2T",
        })
    }
}

/// Common header FLAGS bits (§3.6.1, §3.6.2).
pub mod flags {
    /// A header digest follows the PDU header.
    pub const HDGSTF: u8 = 1 << 0;
    /// A data digest follows the PDU data.
    pub const DDGSTF: u8 = 1 << 1;
    /// H2CData/C2HData: last data PDU of the transfer.
    pub const LAST_PDU: u8 = 1 << 2;
    /// C2HData: the command completed successfully, no CapsuleResp follows
    /// (only with LAST_PDU).
    pub const SUCCESS: u8 = 1 << 3;
}

/// Which digests a connection negotiated (ICReq/ICResp DGST).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Digests {
    /// Header digests (HDGST_ENABLE).
    pub header: bool,
    /// Data digests (DDGST_ENABLE).
    pub data: bool,
}

impl Digests {
    pub const NONE: Digests = Digests {
        header: false,
        data: false,
    };
    pub const BOTH: Digests = Digests {
        header: true,
        data: true,
    };

    /// The ICReq/ICResp DGST byte.
    pub const fn to_dgst(self) -> u8 {
        self.header as u8 | (self.data as u8) << 1
    }

    /// Digests from a DGST byte (reserved bits ignored).
    pub const fn from_dgst(v: u8) -> Self {
        Digests {
            header: v & 1 != 0,
            data: v & 2 != 0,
        }
    }
}

// ---------------------------------------------------------------------------
// Structures
// ---------------------------------------------------------------------------

/// The 8-byte common header of every PDU (§3.6.1, Figure 12).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU type ([`PduType`]).
    pub pdu_type: u8,
    /// Type-specific flags ([`flags`]).
    pub flags: u8,
    /// Header length in bytes, without header digest.
    pub hlen: u8,
    /// PDU data offset from the start of the PDU (0 when no data).
    pub pdo: u8,
    /// Total PDU length in bytes, header, digests, padding and data.
    pub plen: u32,
}
assert_size!(CommonHeader, 8);
assert_offset!(CommonHeader, pdu_type, 0);
assert_offset!(CommonHeader, flags, 1);
assert_offset!(CommonHeader, hlen, 2);
assert_offset!(CommonHeader, pdo, 3);
assert_offset!(CommonHeader, plen, 4);

/// Initialize Connection Request, host to controller (§3.6.2.2, Figure 20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IcReq {
    pub ch: CommonHeader,
    /// PDU Format Version ([`PFV_1_0`]).
    pub pfv: u16,
    /// Host PDU Data Alignment: 0's based dwords for data the host receives.
    pub hpda: u8,
    /// Bit 0 HDGST_ENABLE, bit 1 DDGST_ENABLE.
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
    pub rsvd16: [u8; 112],
}
assert_size!(IcReq, 128);
assert_offset!(IcReq, pfv, 8);
assert_offset!(IcReq, hpda, 10);
assert_offset!(IcReq, dgst, 11);
assert_offset!(IcReq, maxr2t, 12);

/// Initialize Connection Response, controller to host (§3.6.2.3, Figure 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IcResp {
    pub ch: CommonHeader,
    /// PDU Format Version ([`PFV_1_0`]).
    pub pfv: u16,
    /// Controller PDU Data Alignment: 0's based dwords for data the
    /// controller receives.
    pub cpda: u8,
    /// Bit 0 HDGST_ENABLE, bit 1 DDGST_ENABLE.
    pub dgst: u8,
    /// Most data bytes in one H2CData PDU (≥ 4096, a multiple of 4).
    pub maxh2cdata: u32,
    pub rsvd16: [u8; 112],
}
assert_size!(IcResp, 128);
assert_offset!(IcResp, pfv, 8);
assert_offset!(IcResp, cpda, 10);
assert_offset!(IcResp, dgst, 11);
assert_offset!(IcResp, maxh2cdata, 12);

/// Termination Request header, H2CTermReq or C2HTermReq (§3.6.2.4-5,
/// Figures 22-23). Its data is up to [`TERM_REQ_MAX_DATA`] bytes of the
/// offending PDU header, right after this header (PDO is 0, no digests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct TermReq {
    pub ch: CommonHeader,
    /// Fatal Error Status ([`Fes`]).
    pub fes: u16,
    /// Fatal Error Information, little-endian (unaligned on the wire).
    pub fei: [u8; 4],
    pub rsvd14: [u8; 10],
}
assert_size!(TermReq, 24);
assert_offset!(TermReq, fes, 8);
assert_offset!(TermReq, fei, 10);

/// Command Capsule PDU header (§3.6.2.6, Figure 24): the 64-byte SQE. In
/// capsule data, if any, starts at PDO.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CapsuleCmd {
    pub ch: CommonHeader,
    /// The submission queue entry as bytes (an [`Sqe`] is 64-byte aligned
    /// in memory, so it cannot sit at offset 8 itself); see [`Self::sqe`].
    pub sqe: [u8; 64],
}
assert_size!(CapsuleCmd, 72);
assert_offset!(CapsuleCmd, sqe, 8);

/// Response Capsule PDU (§3.6.2.7, Figure 25): the 16-byte CQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CapsuleResp {
    pub ch: CommonHeader,
    pub cqe: Cqe,
}
assert_size!(CapsuleResp, 24);
assert_offset!(CapsuleResp, cqe, 8);

/// Host to Controller Data PDU header (§3.6.2.8, Figure 26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct H2CData {
    pub ch: CommonHeader,
    /// Command Capsule CID the data belongs to.
    pub cccid: u16,
    /// Transfer Tag from the R2T this PDU answers.
    pub ttag: u16,
    /// Offset of this PDU's data in the command's data.
    pub datao: u32,
    /// Bytes of data in this PDU.
    pub datal: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(H2CData, 24);
assert_offset!(H2CData, cccid, 8);
assert_offset!(H2CData, ttag, 10);
assert_offset!(H2CData, datao, 12);
assert_offset!(H2CData, datal, 16);

/// Controller to Host Data PDU header (§3.6.2.9, Figure 27).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct C2HData {
    pub ch: CommonHeader,
    /// Command Capsule CID the data belongs to.
    pub cccid: u16,
    pub rsvd10: u16,
    /// Offset of this PDU's data in the command's data.
    pub datao: u32,
    /// Bytes of data in this PDU.
    pub datal: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(C2HData, 24);
assert_offset!(C2HData, cccid, 8);
assert_offset!(C2HData, datao, 12);
assert_offset!(C2HData, datal, 16);

/// Ready to Transfer PDU (§3.6.2.10, Figure 28).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct R2T {
    pub ch: CommonHeader,
    /// Command Capsule CID the transfer is for.
    pub cccid: u16,
    /// Transfer Tag the host echoes in its H2CData PDUs.
    pub ttag: u16,
    /// Offset of the requested data.
    pub r2to: u32,
    /// Length of the requested data.
    pub r2tl: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(R2T, 24);
assert_offset!(R2T, cccid, 8);
assert_offset!(R2T, ttag, 10);
assert_offset!(R2T, r2to, 12);
assert_offset!(R2T, r2tl, 16);

// ---------------------------------------------------------------------------
// Fatal errors
// ---------------------------------------------------------------------------

/// Fatal Error Status of a Termination Request (§3.6.2.4, Figure 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fes(pub u16);

impl Fes {
    /// FEI: byte offset of the invalid field in the PDU header.
    pub const INVALID_HEADER_FIELD: Fes = Fes(0x01);
    /// A PDU arrived that is not allowed in the current state.
    pub const PDU_SEQUENCE_ERROR: Fes = Fes(0x02);
    /// FEI: the header digest received.
    pub const HEADER_DIGEST_ERROR: Fes = Fes(0x03);
    /// Data of an H2CData/C2HData PDU outside the command's data.
    pub const DATA_TRANSFER_OUT_OF_RANGE: Fes = Fes(0x04);
    /// More R2Ts outstanding than MAXR2T allows (same value as
    /// [`Fes::DATA_TRANSFER_LIMIT_EXCEEDED`]).
    pub const R2T_LIMIT_EXCEEDED: Fes = Fes(0x05);
    /// An H2CData PDU carries more than MAXH2CDATA bytes.
    pub const DATA_TRANSFER_LIMIT_EXCEEDED: Fes = Fes(0x05);
    /// FEI: byte offset of the unsupported field.
    pub const UNSUPPORTED_PARAMETER: Fes = Fes(0x06);
}

impl fmt::Display for Fes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            0x01 => "Invalid PDU Header Field",
            0x02 => "PDU Sequence Error",
            0x03 => "Header Digest Error",
            0x04 => "Data Transfer Out of Range",
            0x05 => "R2T Limit Exceeded / Data Transfer Limit Exceeded",
            0x06 => "Unsupported Parameter",
            _ => "reserved",
        };
        write!(f, "{name} ({:#04x})", self.0)
    }
}

/// A header field a [`PduError`] names; [`Field::offset`] is its byte offset
/// in the PDU, the FEI of an invalid-field Termination Request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    PduType,
    Flags,
    Hlen,
    Pdo,
    Plen,
    Pfv,
    /// HPDA (ICReq) or CPDA (ICResp).
    Pda,
    Dgst,
    Maxr2t,
    Maxh2cdata,
    Cccid,
    Ttag,
    Datao,
    Datal,
    R2to,
    R2tl,
}

impl Field {
    /// Byte offset of the field from the start of the PDU.
    pub const fn offset(self) -> u32 {
        match self {
            Field::PduType => 0,
            Field::Flags => 1,
            Field::Hlen => 2,
            Field::Pdo => 3,
            Field::Plen => 4,
            Field::Pfv | Field::Cccid => 8,
            Field::Pda | Field::Ttag => 10,
            Field::Dgst => 11,
            Field::Maxr2t | Field::Maxh2cdata | Field::Datao | Field::R2to => 12,
            Field::Datal | Field::R2tl => 16,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::PduType => "PDU-Type",
            Field::Flags => "FLAGS",
            Field::Hlen => "HLEN",
            Field::Pdo => "PDO",
            Field::Plen => "PLEN",
            Field::Pfv => "PFV",
            Field::Pda => "PDA",
            Field::Dgst => "DGST",
            Field::Maxr2t => "MAXR2T",
            Field::Maxh2cdata => "MAXH2CDATA",
            Field::Cccid => "CCCID",
            Field::Ttag => "TTAG",
            Field::Datao => "DATAO",
            Field::Datal => "DATAL",
            Field::R2to => "R2TO",
            Field::R2tl => "R2TL",
        })
    }
}

/// What is wrong with a field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    /// The PDU type is not defined.
    UnknownType,
    /// The PDU type is sent by the other side, not by the peer.
    WrongDirection { receiver: Role },
    /// Bits set that this PDU type may not carry.
    FlagsNotAllowed { allowed: u8 },
    /// HDGSTF does not match the negotiated header digest setting.
    HeaderDigestFlag { negotiated: bool },
    /// DDGSTF set without data digests negotiated, or without data, or
    /// missing on a PDU with data while data digests are on.
    DataDigestFlag { negotiated: bool, has_data: bool },
    /// C2HData SUCCESS without LAST_PDU.
    SuccessWithoutLast,
    /// The value must be exactly this.
    NotEqual { expected: u32 },
    /// The value is below the minimum.
    Below { min: u32 },
    /// The value is above the maximum.
    Above { max: u32 },
    /// The value is not a multiple of this alignment.
    Misaligned { align: u32 },
    /// Reserved bits are set.
    ReservedBits { mask: u32 },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Problem::UnknownType => f.write_str("is not a defined PDU type"),
            Problem::WrongDirection { receiver } => {
                write!(f, "is not a PDU type a {receiver} receives")
            }
            Problem::FlagsNotAllowed { allowed } => {
                write!(f, "has bits outside the allowed {allowed:#04x}")
            }
            Problem::HeaderDigestFlag { negotiated } => write!(
                f,
                "HDGSTF must be {} (header digests {}negotiated)",
                negotiated as u8,
                if negotiated { "" } else { "not " }
            ),
            Problem::DataDigestFlag {
                negotiated,
                has_data,
            } => write!(
                f,
                "DDGSTF must be {} (data digests {}negotiated, PDU has {}data)",
                (negotiated && has_data) as u8,
                if negotiated { "" } else { "not " },
                if has_data { "" } else { "no " }
            ),
            Problem::SuccessWithoutLast => f.write_str("has SUCCESS without LAST_PDU"),
            Problem::NotEqual { expected } => write!(f, "must be {expected}"),
            Problem::Below { min } => write!(f, "is below the minimum {min}"),
            Problem::Above { max } => write!(f, "is above the maximum {max}"),
            Problem::Misaligned { align } => write!(f, "is not a multiple of {align}"),
            Problem::ReservedBits { mask } => write!(f, "has reserved bits {mask:#x} set"),
        }
    }
}

/// Why a received PDU is refused. [`PduError::fes`] and [`PduError::fei`]
/// give the Termination Request the receiver should send, if any.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PduError {
    /// A header field is invalid (FES 01h, FEI = field offset).
    #[error("{} PDU: {field} = {value:#x} {problem}", type_name(*.pdu_type))]
    InvalidField {
        /// The raw PDU-Type byte.
        pdu_type: u8,
        field: Field,
        value: u32,
        problem: Problem,
    },
    /// A header field holds a value the receiver does not support (FES 06h,
    /// FEI = field offset).
    #[error("{pdu_type} PDU: {field} = {value:#x} is not supported: {problem}")]
    Unsupported {
        pdu_type: PduType,
        field: Field,
        value: u32,
        problem: Problem,
    },
    /// A PDU that is not allowed now, e.g. a CapsuleCmd before ICReq
    /// (FES 02h).
    #[error("{pdu_type} PDU not allowed {state}")]
    Sequence {
        pdu_type: PduType,
        state: &'static str,
    },
    /// Header digest mismatch (FES 03h, FEI = the digest received).
    #[error("header digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    HeaderDigest { received: u32, computed: u32 },
    /// Data digest mismatch: not fatal; the command completes with status
    /// Transient Transport Error (§3.6.2.2), so there is no FES.
    #[error("data digest mismatch: received {received:#010x}, computed {computed:#010x}")]
    DataDigest { received: u32, computed: u32 },
    /// Data outside the command's buffer or out of order (FES 04h).
    #[error("{pdu_type} PDU: {field} = {value} {problem}")]
    DataOutOfRange {
        pdu_type: PduType,
        field: Field,
        value: u32,
        problem: Problem,
    },
    /// An H2CData PDU with more than MAXH2CDATA bytes (FES 05h).
    #[error("H2CData PDU: DATAL = {datal} exceeds MAXH2CDATA {maxh2cdata}")]
    DataLimitExceeded { datal: u32, maxh2cdata: u32 },
    /// More R2Ts outstanding for a command than MAXR2T allows (FES 05h).
    #[error("R2T limit exceeded: {outstanding} outstanding, MAXR2T allows {allowed}")]
    R2tLimitExceeded { outstanding: u32, allowed: u32 },
    /// A Termination Request whose PLEN is outside 24..=152: the receiver
    /// closes the connection without a Termination Request of its own.
    #[error("{pdu_type} PDU: PLEN = {plen} outside 24..={TERM_REQ_MAX_PLEN}")]
    TermReqLength { pdu_type: PduType, plen: u32 },
    /// The caller's buffer is shorter than the header it must hold; a
    /// programming error of the caller, no FES.
    #[error("buffer of {got} bytes too short for the {need}-byte PDU header")]
    ShortBuffer { need: u32, got: u32 },
}

fn type_name(v: u8) -> String {
    match PduType::from_u8(v) {
        Some(t) => t.to_string(),
        None => format!("type {v:#04x}"),
    }
}

impl PduError {
    /// The Fatal Error Status to send, or `None` when the error calls for
    /// no Termination Request (data digest error, malformed TermReq, caller
    /// bug).
    pub const fn fes(&self) -> Option<Fes> {
        Some(match self {
            PduError::InvalidField { .. } => Fes::INVALID_HEADER_FIELD,
            PduError::Unsupported { .. } => Fes::UNSUPPORTED_PARAMETER,
            PduError::Sequence { .. } => Fes::PDU_SEQUENCE_ERROR,
            PduError::HeaderDigest { .. } => Fes::HEADER_DIGEST_ERROR,
            PduError::DataOutOfRange { .. } => Fes::DATA_TRANSFER_OUT_OF_RANGE,
            PduError::DataLimitExceeded { .. } => Fes::DATA_TRANSFER_LIMIT_EXCEEDED,
            PduError::R2tLimitExceeded { .. } => Fes::R2T_LIMIT_EXCEEDED,
            PduError::DataDigest { .. }
            | PduError::TermReqLength { .. }
            | PduError::ShortBuffer { .. } => return None,
        })
    }

    /// The Fatal Error Information: the field offset for invalid or
    /// unsupported fields, the received digest for a header digest error,
    /// 0 (reserved) otherwise.
    pub const fn fei(&self) -> u32 {
        match self {
            PduError::InvalidField { field, .. } | PduError::Unsupported { field, .. } => {
                field.offset()
            }
            PduError::HeaderDigest { received, .. } => *received,
            _ => 0,
        }
    }

    /// The header field at fault, if the error names one.
    pub const fn field(&self) -> Option<Field> {
        match self {
            PduError::InvalidField { field, .. }
            | PduError::Unsupported { field, .. }
            | PduError::DataOutOfRange { field, .. } => Some(*field),
            PduError::DataLimitExceeded { .. } => Some(Field::Datal),
            PduError::TermReqLength { .. } => Some(Field::Plen),
            _ => None,
        }
    }

    /// The Termination Request `sender` should send for this error, to be
    /// followed by the first [`TermReq::data_len`] bytes of the offending
    /// PDU header (`offending_len` is how many of them the caller has).
    pub fn term_req(&self, sender: Role, offending_len: usize) -> Option<TermReq> {
        let fes = self.fes()?;
        Some(TermReq::new(sender, fes, self.fei(), offending_len))
    }
}

// ---------------------------------------------------------------------------
// Layout and checking
// ---------------------------------------------------------------------------

/// Where the parts of a PDU lie, in bytes from its start. Built by
/// [`CommonHeader::check`] for received PDUs and by [`PduLayout::new`] for
/// PDUs to send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PduLayout {
    pub pdu_type: PduType,
    /// Header length (HLEN).
    pub hlen: u32,
    /// A header digest follows the header.
    pub hdgst: bool,
    /// Offset of the data; equals HLEN (+ digest) for a Termination
    /// Request, whose PDO field is 0; 0 when there is no data.
    pub data_offset: u32,
    /// Bytes of data, without padding and digest.
    pub data_len: u32,
    /// A data digest follows the data.
    pub ddgst: bool,
    /// Total length (PLEN).
    pub plen: u32,
}

impl PduLayout {
    /// The layout of a PDU to send: `pda` is the receiver's PDA (0's based
    /// dwords), used only when there is data. Digests apply to types that
    /// carry them (a data digest only with data).
    ///
    /// Returns `None` if PDO would not fit its byte or PLEN its 32 bits.
    pub const fn new(pdu_type: PduType, digests: Digests, pda: u8, data_len: u32) -> Option<Self> {
        let hlen = pdu_type.hlen() as u32;
        let hdgst = digests.header && pdu_type.allowed_flags() & flags::HDGSTF != 0;
        let ddgst = digests.data && data_len > 0 && pdu_type.carries_data();
        let full = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let data_offset = if data_len == 0 {
            0
        } else if pdu_type.carries_data() {
            let a = pda_alignment(if pda > MAX_PDA { MAX_PDA } else { pda });
            let o = full.div_ceil(a) * a;
            if o > 255 {
                return None;
            }
            o
        } else {
            full
        };
        let end = if data_len == 0 { full } else { data_offset };
        let plen = match end.checked_add(data_len) {
            Some(v) => v,
            None => return None,
        };
        let plen = match plen.checked_add(if ddgst { DIGEST_LEN } else { 0 }) {
            Some(v) => v,
            None => return None,
        };
        Some(PduLayout {
            pdu_type,
            hlen,
            hdgst,
            data_offset,
            data_len,
            ddgst,
            plen,
        })
    }

    /// Header length plus header digest.
    #[inline]
    pub const fn header_len(&self) -> u32 {
        self.hlen + if self.hdgst { DIGEST_LEN } else { 0 }
    }

    /// Range of the header digest, if present.
    pub fn header_digest_range(&self) -> Option<Range<usize>> {
        self.hdgst
            .then(|| self.hlen as usize..(self.hlen + DIGEST_LEN) as usize)
    }

    /// Range of the data (empty at the header's end when there is none).
    pub fn data_range(&self) -> Range<usize> {
        if self.data_len == 0 {
            let e = self.header_len() as usize;
            return e..e;
        }
        let o = self.data_offset as usize;
        o..o + self.data_len as usize
    }

    /// Range of the data digest, if present.
    pub fn data_digest_range(&self) -> Option<Range<usize>> {
        self.ddgst.then(|| {
            let e = self.data_range().end;
            e..e + DIGEST_LEN as usize
        })
    }

    /// Bytes before the data: header, header digest and padding (what
    /// [`write_header`] writes).
    #[inline]
    pub const fn prefix_len(&self) -> u32 {
        if self.data_len == 0 {
            self.header_len()
        } else {
            self.data_offset
        }
    }

    /// Padding bytes between header (digest) and data.
    #[inline]
    pub const fn pad_len(&self) -> u32 {
        self.prefix_len() - self.header_len()
    }

    /// The common header describing this layout, with `extra_flags`
    /// (LAST_PDU, SUCCESS) added to the digest flags.
    pub const fn common_header(&self, extra_flags: u8) -> CommonHeader {
        let mut f = extra_flags;
        if self.hdgst {
            f |= flags::HDGSTF;
        }
        if self.ddgst {
            f |= flags::DDGSTF;
        }
        CommonHeader {
            pdu_type: self.pdu_type as u8,
            flags: f,
            hlen: self.hlen as u8,
            pdo: if self.pdu_type.carries_data() {
                self.data_offset as u8
            } else {
                0
            },
            plen: self.plen,
        }
    }
}

/// What a receiver checks a PDU header against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxConfig {
    /// The receiving side: a controller accepts host PDUs and vice versa.
    pub receiver: Role,
    /// Whether ICReq/ICResp has been exchanged. Before, only the IC PDU and
    /// Termination Requests are accepted; after, IC PDUs are a sequence
    /// error.
    pub established: bool,
    /// Negotiated digests (ignored before `established`).
    pub digests: Digests,
    /// The receiver's own PDA (CPDA for a controller, HPDA for a host).
    pub pda: u8,
    /// Largest PLEN accepted for CapsuleCmd, CapsuleResp, H2CData, C2HData
    /// and R2T (a controller derives it from IOCCSZ and MAXH2CDATA).
    pub max_plen: u32,
    /// MAXH2CDATA the controller announced (checked on H2CData).
    pub maxh2cdata: u32,
}

impl RxConfig {
    /// The configuration before connection initialization.
    pub const fn initial(receiver: Role) -> Self {
        RxConfig {
            receiver,
            established: false,
            digests: Digests::NONE,
            pda: 0,
            max_plen: 128,
            maxh2cdata: MIN_MAXH2CDATA,
        }
    }

    /// The largest PLEN of a PDU of `pdu_type` carrying `max_data` bytes
    /// under this configuration (for [`RxConfig::max_plen`]).
    pub const fn plen_for(&self, pdu_type: PduType, max_data: u32) -> u32 {
        match PduLayout::new(pdu_type, self.digests, self.pda, max_data) {
            Some(l) => l.plen,
            None => u32::MAX,
        }
    }
}

impl CommonHeader {
    /// Reads a common header from the first 8 bytes of `bytes`.
    pub fn read(bytes: &[u8]) -> Option<Self> {
        CommonHeader::read_from_prefix(bytes).ok().map(|(h, _)| h)
    }

    /// Checks a received header against `cfg` and returns the PDU's layout.
    ///
    /// Fields are checked in order of their offsets where the rules allow,
    /// so the FEI names the first bad one: PDU type (defined, from the
    /// peer, allowed in this phase), flags (allowed for the type, HDGSTF as
    /// negotiated, DDGSTF only when negotiated and data present, SUCCESS
    /// only with LAST_PDU), HLEN (exact), PDO (0 without data; otherwise at
    /// least HLEN + header digest, a multiple of the receiver's PDA and
    /// within PLEN), PLEN (exact for IC PDUs, 24..=152 for Termination
    /// Requests, else at least the header, data and digests and at most
    /// `cfg.max_plen`).
    pub fn check(&self, cfg: &RxConfig) -> Result<PduLayout, PduError> {
        let raw = self.pdu_type;
        let invalid = |field, value: u32, problem| PduError::InvalidField {
            pdu_type: raw,
            field,
            value,
            problem,
        };
        let Some(ty) = PduType::from_u8(raw) else {
            return Err(invalid(Field::PduType, raw as u32, Problem::UnknownType));
        };
        if ty.sender() == cfg.receiver {
            return Err(invalid(
                Field::PduType,
                raw as u32,
                Problem::WrongDirection {
                    receiver: cfg.receiver,
                },
            ));
        }
        if ty.is_init() && cfg.established {
            return Err(PduError::Sequence {
                pdu_type: ty,
                state: "after connection initialization",
            });
        }
        if !ty.is_init() && !ty.is_term() && !cfg.established {
            return Err(PduError::Sequence {
                pdu_type: ty,
                state: "before connection initialization",
            });
        }

        // Flags.
        let fl = self.flags;
        let allowed = ty.allowed_flags();
        if fl & !allowed != 0 {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::FlagsNotAllowed { allowed },
            ));
        }
        let hdgst = fl & flags::HDGSTF != 0;
        let ddgst = fl & flags::DDGSTF != 0;
        if allowed & flags::HDGSTF != 0 && hdgst != cfg.digests.header {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::HeaderDigestFlag {
                    negotiated: cfg.digests.header,
                },
            ));
        }
        if ddgst && !cfg.digests.data {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::DataDigestFlag {
                    negotiated: false,
                    has_data: self.pdo != 0,
                },
            ));
        }
        if fl & (flags::SUCCESS | flags::LAST_PDU) == flags::SUCCESS {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::SuccessWithoutLast,
            ));
        }

        // HLEN.
        let hlen = ty.hlen();
        if self.hlen != hlen {
            return Err(invalid(
                Field::Hlen,
                self.hlen as u32,
                Problem::NotEqual {
                    expected: hlen as u32,
                },
            ));
        }
        let hlen = hlen as u32;
        let full = hlen + if hdgst { DIGEST_LEN } else { 0 };
        let plen = self.plen;
        let pdo = self.pdo as u32;

        // IC and Termination PDUs: PDO 0, fixed or bounded PLEN.
        if !ty.carries_data() && !matches!(ty, PduType::CapsuleResp | PduType::R2T) {
            if pdo != 0 {
                return Err(invalid(Field::Pdo, pdo, Problem::NotEqual { expected: 0 }));
            }
            if ty.is_init() {
                if plen != hlen {
                    return Err(invalid(
                        Field::Plen,
                        plen,
                        Problem::NotEqual { expected: hlen },
                    ));
                }
                return Ok(PduLayout {
                    pdu_type: ty,
                    hlen,
                    hdgst: false,
                    data_offset: 0,
                    data_len: 0,
                    ddgst: false,
                    plen,
                });
            }
            if !(hlen..=TERM_REQ_MAX_PLEN).contains(&plen) {
                return Err(PduError::TermReqLength { pdu_type: ty, plen });
            }
            let data_len = plen - hlen;
            return Ok(PduLayout {
                pdu_type: ty,
                hlen,
                hdgst: false,
                data_offset: if data_len == 0 { 0 } else { hlen },
                data_len,
                ddgst: false,
                plen,
            });
        }

        // PDO.
        let has_data = pdo != 0;
        if !ty.carries_data() {
            if pdo != 0 {
                return Err(invalid(Field::Pdo, pdo, Problem::NotEqual { expected: 0 }));
            }
        } else if pdo == 0 {
            if ty != PduType::CapsuleCmd {
                // H2CData and C2HData always carry data.
                return Err(invalid(Field::Pdo, pdo, Problem::Below { min: full }));
            }
        } else {
            if pdo < full {
                return Err(invalid(Field::Pdo, pdo, Problem::Below { min: full }));
            }
            let align = pda_alignment(cfg.pda.min(MAX_PDA));
            if !pdo.is_multiple_of(align) {
                return Err(invalid(Field::Pdo, pdo, Problem::Misaligned { align }));
            }
            if pdo > plen {
                return Err(invalid(Field::Pdo, pdo, Problem::Above { max: plen }));
            }
        }
        if ddgst != (cfg.digests.data && has_data) {
            return Err(invalid(
                Field::Flags,
                fl as u32,
                Problem::DataDigestFlag {
                    negotiated: cfg.digests.data,
                    has_data,
                },
            ));
        }

        // PLEN.
        let dd = if ddgst { DIGEST_LEN } else { 0 };
        let data_len = if has_data {
            // At least one byte of data after PDO.
            let min = pdo + 1 + dd;
            if plen < min {
                return Err(invalid(Field::Plen, plen, Problem::Below { min }));
            }
            plen - pdo - dd
        } else {
            if plen != full {
                return Err(invalid(
                    Field::Plen,
                    plen,
                    Problem::NotEqual { expected: full },
                ));
            }
            0
        };
        if plen > cfg.max_plen {
            return Err(invalid(
                Field::Plen,
                plen,
                Problem::Above { max: cfg.max_plen },
            ));
        }
        Ok(PduLayout {
            pdu_type: ty,
            hlen,
            hdgst,
            data_offset: if has_data { pdo } else { 0 },
            data_len,
            ddgst,
            plen,
        })
    }
}

/// A one-entry memo of [`CommonHeader::check`]: the last header that
/// passed, the configuration it passed under and its layout. A stream of
/// like PDUs (command capsules without data, 4 KiB C2HData) is checked by
/// one comparison each; any other header goes through the full check.
///
/// The check is a function of the header and the configuration alone, so
/// a hit returns exactly what the check would.
#[derive(Clone, Copy, Debug, Default)]
pub struct CheckMemo {
    last: Option<(CommonHeader, RxConfig, PduLayout)>,
}

impl CheckMemo {
    /// [`CommonHeader::check`] of `ch` under `cfg`, remembered when it
    /// passes.
    #[inline]
    pub fn check(&mut self, ch: &CommonHeader, cfg: &RxConfig) -> Result<PduLayout, PduError> {
        if let Some((h, c, l)) = &self.last {
            if h == ch && c == cfg {
                return Ok(*l);
            }
        }
        let l = ch.check(cfg)?;
        self.last = Some((*ch, *cfg, l));
        Ok(l)
    }
}

// ---------------------------------------------------------------------------
// Digests
// ---------------------------------------------------------------------------

/// CRC32C (Castagnoli) of `bytes`, hardware accelerated where available.
#[inline]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The header digest of a PDU header (its first HLEN bytes).
#[inline]
pub fn header_digest(header: &[u8]) -> u32 {
    crc32c::crc32c(header)
}

/// An incremental data digest over data given in pieces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DataDigest(u32);

impl DataDigest {
    pub const fn new() -> Self {
        DataDigest(0)
    }
    /// Adds the next piece of data.
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0 = crc32c::crc32c_append(self.0, bytes);
    }
    /// The digest of all data so far.
    #[inline]
    pub const fn value(&self) -> u32 {
        self.0
    }
}

/// The data digest of data in one or more pieces.
pub fn data_digest<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> u32 {
    let mut d = DataDigest::new();
    for p in pieces {
        d.update(p);
    }
    d.value()
}

/// A digest as stored on the wire (little-endian).
#[inline]
pub const fn digest_bytes(digest: u32) -> [u8; 4] {
    digest.to_le_bytes()
}

/// A digest read from its wire bytes; `None` if `bytes` is not 4 long.
#[inline]
pub fn digest_from_bytes(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Checks the header digest `received` (4 wire bytes) against `header`.
pub fn verify_header_digest(header: &[u8], received: [u8; 4]) -> Result<(), PduError> {
    let computed = header_digest(header);
    let received = u32::from_le_bytes(received);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::HeaderDigest { received, computed })
    }
}

/// Checks a data digest: `computed` (from [`DataDigest`] or
/// [`data_digest`]) against the 4 bytes received.
pub fn verify_data_digest(computed: u32, received: [u8; 4]) -> Result<(), PduError> {
    let received = u32::from_le_bytes(received);
    if computed == received {
        Ok(())
    } else {
        Err(PduError::DataDigest { received, computed })
    }
}

// ---------------------------------------------------------------------------
// Builders and type-specific checks
// ---------------------------------------------------------------------------

const fn fixed_header(t: PduType) -> CommonHeader {
    CommonHeader {
        pdu_type: t as u8,
        flags: 0,
        hlen: t.hlen(),
        pdo: 0,
        plen: t.hlen() as u32,
    }
}

fn check_pda(t: PduType, pda: u8) -> Result<(), PduError> {
    if pda > MAX_PDA {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Pda,
            value: pda as u32,
            problem: Problem::Above {
                max: MAX_PDA as u32,
            },
        });
    }
    Ok(())
}

fn check_pfv_dgst(t: PduType, pfv: u16, dgst: u8) -> Result<(), PduError> {
    if pfv != PFV_1_0 {
        return Err(PduError::Unsupported {
            pdu_type: t,
            field: Field::Pfv,
            value: pfv as u32,
            problem: Problem::NotEqual {
                expected: PFV_1_0 as u32,
            },
        });
    }
    if dgst & !3 != 0 {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Dgst,
            value: dgst as u32,
            problem: Problem::ReservedBits {
                mask: (dgst & !3) as u32,
            },
        });
    }
    Ok(())
}

impl IcReq {
    pub const HLEN: u8 = 128;

    /// An ICReq: `hpda` is the alignment the host wants for data it
    /// receives, `digests` the digests it asks for, `maxr2t` the most R2Ts
    /// outstanding per command (0's based).
    pub const fn new(hpda: u8, digests: Digests, maxr2t: u32) -> Self {
        IcReq {
            ch: fixed_header(PduType::IcReq),
            pfv: PFV_1_0,
            hpda,
            dgst: digests.to_dgst(),
            maxr2t,
            rsvd16: [0; 112],
        }
    }

    /// The digests asked for.
    pub const fn digests(&self) -> Digests {
        Digests::from_dgst(self.dgst)
    }

    /// Checks PFV (1.0, else unsupported), HPDA (≤ 31) and DGST reserved bits.
    pub fn check(&self) -> Result<(), PduError> {
        check_pfv_dgst(PduType::IcReq, self.pfv, self.dgst)?;
        check_pda(PduType::IcReq, self.hpda)
    }
}

impl IcResp {
    pub const HLEN: u8 = 128;

    /// An ICResp: `cpda` is the alignment the controller wants for data it
    /// receives, `digests` the digests enabled (a subset of those asked),
    /// `maxh2cdata` the most data bytes in one H2CData PDU.
    pub const fn new(cpda: u8, digests: Digests, maxh2cdata: u32) -> Self {
        IcResp {
            ch: fixed_header(PduType::IcResp),
            pfv: PFV_1_0,
            cpda,
            dgst: digests.to_dgst(),
            maxh2cdata,
            rsvd16: [0; 112],
        }
    }

    /// The digests enabled.
    pub const fn digests(&self) -> Digests {
        Digests::from_dgst(self.dgst)
    }

    /// Checks PFV, CPDA, DGST reserved bits and MAXH2CDATA (≥ 4096, a
    /// multiple of 4).
    pub fn check(&self) -> Result<(), PduError> {
        check_pfv_dgst(PduType::IcResp, self.pfv, self.dgst)?;
        check_pda(PduType::IcResp, self.cpda)?;
        let m = self.maxh2cdata;
        let bad = |problem| PduError::InvalidField {
            pdu_type: PduType::IcResp as u8,
            field: Field::Maxh2cdata,
            value: m,
            problem,
        };
        if m < MIN_MAXH2CDATA {
            return Err(bad(Problem::Below {
                min: MIN_MAXH2CDATA,
            }));
        }
        if !m.is_multiple_of(4) {
            return Err(bad(Problem::Misaligned { align: 4 }));
        }
        Ok(())
    }
}

impl TermReq {
    pub const HLEN: u8 = 24;

    /// A Termination Request from `sender` (H2CTermReq from a host,
    /// C2HTermReq from a controller) to be followed by `offending_len`
    /// bytes of the offending PDU header, clamped to 128.
    pub const fn new(sender: Role, fes: Fes, fei: u32, offending_len: usize) -> Self {
        let t = PduType::term_req_from(sender);
        let n = if offending_len > TERM_REQ_MAX_DATA as usize {
            TERM_REQ_MAX_DATA
        } else {
            offending_len as u32
        };
        let mut ch = fixed_header(t);
        ch.plen += n;
        TermReq {
            ch,
            fes: fes.0,
            fei: fei.to_le_bytes(),
            rsvd14: [0; 10],
        }
    }

    /// Fatal Error Status.
    pub const fn fes(&self) -> Fes {
        Fes(self.fes)
    }

    /// Fatal Error Information.
    pub const fn fei(&self) -> u32 {
        u32::from_le_bytes(self.fei)
    }

    /// Bytes of the offending header that follow this header.
    pub const fn data_len(&self) -> u32 {
        self.ch.plen.saturating_sub(Self::HLEN as u32)
    }
}

impl CapsuleCmd {
    pub const HLEN: u8 = 72;

    /// A command capsule for `sqe` with `icd_len` bytes of in-capsule data;
    /// `cpda` is the controller's PDA. Returns the header and its layout
    /// (the data goes at `layout.data_offset`, after
    /// [`PduLayout::pad_len`] zero bytes).
    ///
    /// `None` if the lengths overflow (see [`PduLayout::new`]).
    pub fn new(sqe: &Sqe, icd_len: u32, digests: Digests, cpda: u8) -> Option<(Self, PduLayout)> {
        let l = PduLayout::new(PduType::CapsuleCmd, digests, cpda, icd_len)?;
        Some((
            CapsuleCmd {
                ch: l.common_header(0),
                sqe: zerocopy::transmute!(*sqe),
            },
            l,
        ))
    }

    /// The submission queue entry.
    pub fn sqe(&self) -> Sqe {
        zerocopy::transmute!(self.sqe)
    }
}

impl CapsuleResp {
    pub const HLEN: u8 = 24;

    /// A response capsule carrying `cqe`.
    pub const fn new(cqe: Cqe, hdgst: bool) -> Self {
        let mut ch = fixed_header(PduType::CapsuleResp);
        if hdgst {
            ch.flags = flags::HDGSTF;
            ch.plen += DIGEST_LEN;
        }
        CapsuleResp { ch, cqe }
    }
}

fn check_datal(t: PduType, datal: u32, layout: &PduLayout) -> Result<(), PduError> {
    if datal != layout.data_len {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Datal,
            value: datal,
            problem: Problem::NotEqual {
                expected: layout.data_len,
            },
        });
    }
    Ok(())
}

/// Checks that a data PDU's `[datao, datao + datal)` starts where the
/// receiver expects (`expected_datao`: data PDUs of a command arrive in
/// order) and ends within the command's `total` bytes (FES 04h).
pub fn check_data_range(
    pdu_type: PduType,
    datao: u32,
    datal: u32,
    expected_datao: u32,
    total: u32,
) -> Result<(), PduError> {
    if datao != expected_datao {
        return Err(PduError::DataOutOfRange {
            pdu_type,
            field: Field::Datao,
            value: datao,
            problem: Problem::NotEqual {
                expected: expected_datao,
            },
        });
    }
    let room = total.saturating_sub(datao);
    if datal > room {
        return Err(PduError::DataOutOfRange {
            pdu_type,
            field: Field::Datal,
            value: datal,
            problem: Problem::Above { max: room },
        });
    }
    Ok(())
}

impl H2CData {
    pub const HLEN: u8 = 24;

    /// An H2CData header answering R2T `ttag` of command `cccid`, carrying
    /// `datal` bytes at `datao`; `cpda` is the controller's PDA.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cccid: u16,
        ttag: u16,
        datao: u32,
        datal: u32,
        last: bool,
        digests: Digests,
        cpda: u8,
    ) -> Option<(Self, PduLayout)> {
        if datal == 0 {
            return None;
        }
        let l = PduLayout::new(PduType::H2CData, digests, cpda, datal)?;
        let extra = if last { flags::LAST_PDU } else { 0 };
        Some((
            H2CData {
                ch: l.common_header(extra),
                cccid,
                ttag,
                datao,
                datal,
                rsvd20: [0; 4],
            },
            l,
        ))
    }

    /// Whether LAST_PDU is set.
    pub const fn last(&self) -> bool {
        self.ch.flags & flags::LAST_PDU != 0
    }

    /// DATAL equals the layout's data length and is within MAXH2CDATA.
    pub fn check(&self, layout: &PduLayout, maxh2cdata: u32) -> Result<(), PduError> {
        check_datal(PduType::H2CData, self.datal, layout)?;
        if self.datal > maxh2cdata {
            return Err(PduError::DataLimitExceeded {
                datal: self.datal,
                maxh2cdata,
            });
        }
        Ok(())
    }
}

impl C2HData {
    pub const HLEN: u8 = 24;

    /// A C2HData header for command `cccid` carrying `datal` bytes at
    /// `datao`; `success` (only with `last`) tells the host no CapsuleResp
    /// follows. `hpda` is the host's PDA.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cccid: u16,
        datao: u32,
        datal: u32,
        last: bool,
        success: bool,
        digests: Digests,
        hpda: u8,
    ) -> Option<(Self, PduLayout)> {
        if datal == 0 || (success && !last) {
            return None;
        }
        let l = PduLayout::new(PduType::C2HData, digests, hpda, datal)?;
        let mut extra = if last { flags::LAST_PDU } else { 0 };
        if success {
            extra |= flags::SUCCESS;
        }
        Some((
            C2HData {
                ch: l.common_header(extra),
                cccid,
                rsvd10: 0,
                datao,
                datal,
                rsvd20: [0; 4],
            },
            l,
        ))
    }

    /// Whether LAST_PDU is set.
    pub const fn last(&self) -> bool {
        self.ch.flags & flags::LAST_PDU != 0
    }

    /// Whether SUCCESS is set (the command completed, no CapsuleResp).
    pub const fn success(&self) -> bool {
        self.ch.flags & flags::SUCCESS != 0
    }

    /// DATAL equals the layout's data length.
    pub fn check(&self, layout: &PduLayout) -> Result<(), PduError> {
        check_datal(PduType::C2HData, self.datal, layout)
    }
}

impl R2T {
    pub const HLEN: u8 = 24;

    /// An R2T asking for `r2tl` bytes at `r2to` of command `cccid`.
    pub const fn new(cccid: u16, ttag: u16, r2to: u32, r2tl: u32, hdgst: bool) -> Self {
        let mut ch = fixed_header(PduType::R2T);
        if hdgst {
            ch.flags = flags::HDGSTF;
            ch.plen += DIGEST_LEN;
        }
        R2T {
            ch,
            cccid,
            ttag,
            r2to,
            r2tl,
            rsvd20: [0; 4],
        }
    }

    /// R2TL is not 0.
    pub fn check(&self) -> Result<(), PduError> {
        if self.r2tl == 0 {
            return Err(PduError::InvalidField {
                pdu_type: PduType::R2T as u8,
                field: Field::R2tl,
                value: 0,
                problem: Problem::Below { min: 1 },
            });
        }
        Ok(())
    }
}

/// A received, checked PDU header of any type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduHeader {
    IcReq(IcReq),
    IcResp(IcResp),
    TermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(CapsuleResp),
    H2CData(H2CData),
    C2HData(C2HData),
    R2T(R2T),
}

impl PduHeader {
    /// Parses the header of a PDU whose common header passed
    /// [`CommonHeader::check`] with `cfg`, giving `layout`. `bytes` holds
    /// the PDU from its start through at least the header digest
    /// ([`PduLayout::header_len`] bytes). Verifies the header digest and the
    /// type-specific fields (ICReq/ICResp parameters, DATAL, MAXH2CDATA,
    /// R2TL).
    pub fn parse(bytes: &[u8], layout: &PduLayout, cfg: &RxConfig) -> Result<Self, PduError> {
        let need = layout.header_len();
        if bytes.len() < need as usize {
            return Err(PduError::ShortBuffer {
                need,
                got: bytes.len().min(u32::MAX as usize) as u32,
            });
        }
        let hlen = layout.hlen as usize;
        let header = &bytes[..hlen];
        if let Some(r) = layout.header_digest_range() {
            let mut d = [0u8; 4];
            d.copy_from_slice(&bytes[r]);
            verify_header_digest(header, d)?;
        }
        let short = || PduError::ShortBuffer {
            need,
            got: hlen as u32,
        };
        Ok(match layout.pdu_type {
            PduType::IcReq => {
                let h = IcReq::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::IcReq(h)
            }
            PduType::IcResp => {
                let h = IcResp::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::IcResp(h)
            }
            PduType::H2CTermReq | PduType::C2HTermReq => {
                PduHeader::TermReq(TermReq::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::CapsuleCmd => {
                PduHeader::CapsuleCmd(CapsuleCmd::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::CapsuleResp => {
                PduHeader::CapsuleResp(CapsuleResp::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::H2CData => {
                let h = H2CData::read_from_bytes(header).map_err(|_| short())?;
                h.check(layout, cfg.maxh2cdata)?;
                PduHeader::H2CData(h)
            }
            PduType::C2HData => {
                let h = C2HData::read_from_bytes(header).map_err(|_| short())?;
                h.check(layout)?;
                PduHeader::C2HData(h)
            }
            PduType::R2T => {
                let h = R2T::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::R2T(h)
            }
        })
    }
}

/// Writes `header` followed by its digest (if `layout.hdgst`) and the
/// zero padding up to the data into `out`, returning the bytes written
/// (`layout.data_offset`, or the header length without data).
///
/// `None` if `out` is shorter than that.
pub fn write_header(header: &[u8], layout: &PduLayout, out: &mut [u8]) -> Option<usize> {
    let hlen = layout.hlen as usize;
    let end = layout.prefix_len() as usize;
    if header.len() != hlen || out.len() < end {
        return None;
    }
    out[..hlen].copy_from_slice(header);
    let mut at = hlen;
    if layout.hdgst {
        out[at..at + 4].copy_from_slice(&digest_bytes(header_digest(header)));
        at += 4;
    }
    if at < end {
        out[at..end].fill(0);
    }
    Some(end)
}

/// Appends what [`write_header`] writes (the header, its digest, the
/// padding up to the data) to `out`, returning the bytes appended; `None`
/// (nothing appended) if `header` is not `layout.hlen` bytes long.
#[inline]
pub fn append_header(header: &[u8], layout: &PduLayout, out: &mut Vec<u8>) -> Option<usize> {
    let hlen = layout.hlen as usize;
    if header.len() != hlen {
        return None;
    }
    let end = layout.prefix_len() as usize;
    let start = out.len();
    out.extend_from_slice(header);
    if layout.hdgst {
        out.extend_from_slice(&digest_bytes(header_digest(header)));
    }
    out.resize(start + end, 0);
    Some(end)
}
