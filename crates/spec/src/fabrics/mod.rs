//! NVMe over Fabrics wire formats (NVMe 2.0 base spec §6 "Fabrics Command
//! Set", §5.27.1.x Discovery Log Page, §4.1.2 SGL descriptors; NVMe/TCP
//! Transport spec 1.0 §3.5 for the TCP SGL usage): the Fabrics command
//! (opcode 7Fh) and its Connect, Property Get/Set and Disconnect forms, the
//! Connect data and response, NQN helpers, SGL descriptors, the
//! Discovery Log Page, and the in-band authentication (DH-HMAC-CHAP)
//! commands and messages.
//!
//! Command views ([`ConnectCmd`], [`PropertyGetCmd`], ...) are 64-byte
//! overlays of an [`Sqe`]: convert with `from_sqe`/`to_sqe`.

use crate::Sqe;

mod auth;
mod cmd;
mod discovery;
mod nqn;
mod refusal;
mod sgl;

// Each part's public items are `fabrics`'s: the paths stay
// `crate::fabrics::X`.
pub use auth::*;
pub use cmd::*;
pub use discovery::*;
pub use nqn::*;
pub use refusal::*;
pub use sgl::*;

/// Opcode of every Fabrics command.
pub const FABRICS_OPCODE: u8 = 0x7F;

/// PSDT value fabrics commands use: SGLs for data (MPTR holds an address).
pub const PSDT_SGL: u8 = 0b01;
/// The SQE flags byte with PSDT = [`PSDT_SGL`].
pub const SQE_FLAGS_SGL: u8 = PSDT_SGL << 6;

/// Fabrics command types (FCTYPE, byte 4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FcType {
    PropertySet = 0x00,
    Connect = 0x01,
    PropertyGet = 0x04,
    AuthenticationSend = 0x05,
    AuthenticationReceive = 0x06,
    Disconnect = 0x08,
}

impl FcType {
    pub const fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0x00 => FcType::PropertySet,
            0x01 => FcType::Connect,
            0x04 => FcType::PropertyGet,
            0x05 => FcType::AuthenticationSend,
            0x06 => FcType::AuthenticationReceive,
            0x08 => FcType::Disconnect,
            _ => return None,
        })
    }

    /// The FCTYPE of a fabrics command SQE (byte 4), or `None` if `sqe` is
    /// not a fabrics command or the type is unknown.
    pub const fn of(sqe: &Sqe) -> Option<Self> {
        if sqe.opc != FABRICS_OPCODE {
            return None;
        }
        FcType::from_u8(sqe.nsid as u8)
    }
}
