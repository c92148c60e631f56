//! Termination Requests (H2CTermReq, C2HTermReq) and their Fatal Error
//! Status.

use core::fmt;

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::common::{fixed_header, CommonHeader};
use super::{PduType, Role};
use crate::{assert_offset, assert_size};

/// Most bytes of the offending PDU header a Termination Request carries.
pub const TERM_REQ_MAX_DATA: u32 = 128;
/// Largest PLEN of a Termination Request (header + 128 bytes).
pub const TERM_REQ_MAX_PLEN: u32 = TermReq::HLEN as u32 + TERM_REQ_MAX_DATA;

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
