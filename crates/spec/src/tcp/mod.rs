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

mod capsule;
mod common;
mod data;
mod digest;
mod error;
mod ic;
mod layout;
mod pdu;
mod r2t;
mod term;

pub use capsule::{CapsuleCmd, CapsuleResp};
pub use common::CommonHeader;
pub use data::{check_data_range, C2HData, H2CData};
pub use digest::{
    crc32c, data_digest, digest_bytes, digest_from_bytes, header_digest, verify_data_digest,
    verify_header_digest, DataDigest,
};
pub use error::{Field, PduError, Problem};
pub use ic::{IcReq, IcResp};
pub use layout::{CheckMemo, PduLayout, RxConfig};
pub use pdu::{append_header, write_header, PduHeader};
pub use r2t::R2T;
pub use term::{Fes, TermReq, TERM_REQ_MAX_DATA, TERM_REQ_MAX_PLEN};

/// Length of a header or data digest.
pub const DIGEST_LEN: u32 = 4;
/// PDU Format Version 1.0 (ICReq/ICResp PFV).
pub const PFV_1_0: u16 = 0;
/// Largest HPDA/CPDA value (alignment of 128 bytes).
pub const MAX_PDA: u8 = 31;
/// Smallest MAXH2CDATA a controller may announce (§3.6.2.3).
pub const MIN_MAXH2CDATA: u32 = 4096;
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
