//! Why a received PDU is refused: [`PduError`], the field it names and what
//! is wrong with it, and the Termination Request it calls for.

use core::fmt;

use super::term::{Fes, TermReq, TERM_REQ_MAX_PLEN};
use super::{PduType, Role};

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
