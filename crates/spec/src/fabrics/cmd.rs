//! The Fabrics command (opcode 7Fh) and its Connect, Property Get/Set and
//! Disconnect forms, with the Connect data and response.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::nqn::{read_nqn, write_nqn, NqnError};
use super::sgl::SglDescriptor;
use super::{FcType, FABRICS_OPCODE, SQE_FLAGS_SGL};
use crate::status::{sct, Status};
use crate::{assert_offset, assert_size, Cqe, Sqe};

macro_rules! sqe_view {
    ($t:ty) => {
        impl $t {
            /// The view of a 64-byte SQE.
            pub fn from_sqe(sqe: &Sqe) -> Self {
                zerocopy::transmute!(*sqe)
            }
            /// The SQE these bytes make.
            pub fn to_sqe(&self) -> Sqe {
                zerocopy::transmute!(*self)
            }
        }
    };
}

/// Any Fabrics command (Figure 369): opcode 7Fh, FCTYPE at byte 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct FabricsCmd {
    pub opc: u8,
    /// SQE flags (PSDT in bits 7:6).
    pub flags: u8,
    pub cid: u16,
    pub fctype: u8,
    pub rsvd5: [u8; 19],
    /// SGL Descriptor 1.
    pub sgl1: SglDescriptor,
    /// Fabrics command type specific.
    pub fcts: [u8; 24],
}
assert_size!(FabricsCmd, 64);
assert_offset!(FabricsCmd, cid, 2);
assert_offset!(FabricsCmd, fctype, 4);
assert_offset!(FabricsCmd, sgl1, 24);
assert_offset!(FabricsCmd, fcts, 40);
sqe_view!(FabricsCmd);

/// Connect Attributes bit 2: disable SQ flow control (SQHD not reported).
pub const CATTR_DISABLE_SQ_FLOW: u8 = 1 << 2;
/// Connect data CNTLID requesting any controller (dynamic model).
pub const CNTLID_DYNAMIC: u16 = 0xFFFF;
/// Connect data CNTLID for the static model, any controller.
pub const CNTLID_STATIC_ANY: u16 = 0xFFFE;
/// Size of the Connect command's data.
pub const CONNECT_DATA_LEN: u32 = 1024;

/// Connect command (Figure 377).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ConnectCmd {
    pub opc: u8,
    pub flags: u8,
    pub cid: u16,
    pub fctype: u8,
    pub rsvd5: [u8; 19],
    /// Locates the 1024-byte [`ConnectData`].
    pub sgl1: SglDescriptor,
    /// Record Format (0).
    pub recfmt: u16,
    /// Queue ID: 0 admin, else I/O.
    pub qid: u16,
    /// Submission queue size, 0's based.
    pub sqsize: u16,
    /// Connect Attributes ([`CATTR_DISABLE_SQ_FLOW`], bits 1:0 priority).
    pub cattr: u8,
    pub rsvd47: u8,
    /// Keep Alive Timeout in milliseconds (admin queue only).
    pub kato: u32,
    pub rsvd52: [u8; 12],
}
assert_size!(ConnectCmd, 64);
assert_offset!(ConnectCmd, sgl1, 24);
assert_offset!(ConnectCmd, recfmt, 40);
assert_offset!(ConnectCmd, qid, 42);
assert_offset!(ConnectCmd, sqsize, 44);
assert_offset!(ConnectCmd, cattr, 46);
assert_offset!(ConnectCmd, kato, 48);
sqe_view!(ConnectCmd);

impl ConnectCmd {
    /// A Connect for queue `qid` with `sqsize` (0's based: entries - 1),
    /// `cattr` and `kato_ms`; the Connect data goes in the capsule (SGL
    /// Data Block, offset 0, 1024 bytes).
    pub const fn new(qid: u16, sqsize: u16, cattr: u8, kato_ms: u32) -> Self {
        ConnectCmd {
            opc: FABRICS_OPCODE,
            flags: SQE_FLAGS_SGL,
            cid: 0,
            fctype: FcType::Connect as u8,
            rsvd5: [0; 19],
            sgl1: SglDescriptor::in_capsule(0, CONNECT_DATA_LEN),
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            rsvd47: 0,
            kato: kato_ms,
            rsvd52: [0; 12],
        }
    }

    /// Queue entries (SQSIZE + 1).
    pub const fn queue_entries(&self) -> u32 {
        self.sqsize as u32 + 1
    }
}

/// Field offsets in the Connect command and data, for the IPO of a
/// Connect Invalid Parameters response.
pub mod connect_ipo {
    pub const RECFMT: u16 = 40;
    pub const QID: u16 = 42;
    pub const SQSIZE: u16 = 44;
    pub const CATTR: u16 = 46;
    pub const KATO: u16 = 48;
    /// Offsets in the Connect data.
    pub const DATA_HOSTID: u16 = 0;
    pub const DATA_CNTLID: u16 = 16;
    pub const DATA_SUBNQN: u16 = 256;
    pub const DATA_HOSTNQN: u16 = 512;
}

/// Connect command data (Figure 379), 1024 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct ConnectData {
    /// Host Identifier (a UUID).
    pub hostid: [u8; 16],
    /// Controller ID asked for ([`CNTLID_DYNAMIC`] for any).
    pub cntlid: u16,
    pub rsvd18: [u8; 238],
    /// NVM Subsystem NQN, NUL-terminated.
    pub subnqn: [u8; 256],
    /// Host NQN, NUL-terminated.
    pub hostnqn: [u8; 256],
    pub rsvd768: [u8; 256],
}
assert_size!(ConnectData, 1024);
assert_offset!(ConnectData, hostid, 0);
assert_offset!(ConnectData, cntlid, 16);
assert_offset!(ConnectData, subnqn, 256);
assert_offset!(ConnectData, hostnqn, 512);

impl ConnectData {
    /// Connect data for host `hostid`/`hostnqn` to `subnqn`.
    pub fn new(
        hostid: [u8; 16],
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
    ) -> Result<Self, NqnError> {
        let mut d = ConnectData::new_zeroed();
        d.hostid = hostid;
        d.cntlid = cntlid;
        write_nqn(&mut d.subnqn, subnqn)?;
        write_nqn(&mut d.hostnqn, hostnqn)?;
        Ok(d)
    }

    /// The subsystem NQN, validated.
    pub fn subnqn(&self) -> Result<&str, NqnError> {
        read_nqn(&self.subnqn)
    }

    /// The host NQN, validated.
    pub fn hostnqn(&self) -> Result<&str, NqnError> {
        read_nqn(&self.hostnqn)
    }
}

/// Fabrics status codes (SCT 1, command specific), Figure 106 / 380.
pub mod fabrics_sc {
    /// Connect: RECFMT not supported.
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    /// Connect: the controller is busy.
    pub const CONTROLLER_BUSY: u8 = 0x81;
    /// Connect: invalid parameter, located by IATTR/IPO in DW0.
    pub const CONNECT_INVALID_PARAMETERS: u8 = 0x82;
    /// Connect: restart discovery.
    pub const CONNECT_RESTART_DISCOVERY: u8 = 0x83;
    /// Connect: the host may not connect.
    pub const CONNECT_INVALID_HOST: u8 = 0x84;
    /// Connect: the queue type is not supported.
    pub const INVALID_QUEUE_TYPE: u8 = 0x85;
    /// Discovery: restart discovery.
    pub const DISCOVER_RESTART: u8 = 0x90;
    /// Authentication required.
    pub const AUTHENTICATION_REQUIRED: u8 = 0x91;
}

/// A fabrics command-specific status (SCT 1) with DNR set.
pub const fn fabrics_status(sc: u8) -> Status {
    Status::new(sct::COMMAND_SPECIFIC, sc, true)
}

/// Where an invalid Connect parameter lies (IATTR).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamIn {
    /// In the Connect command (SQE).
    Command,
    /// In the Connect data.
    Data,
}

/// The DW0 of a Connect response.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnectResponse {
    /// Success: the controller ID, and AUTHREQ (bits 31:16).
    Success { cntlid: u16, authreq: u16 },
    /// Connect Invalid Parameters: IATTR (bits 23:16) and IPO (15:0).
    InvalidParam { iattr: ParamIn, ipo: u16 },
}

impl ConnectResponse {
    /// DW0 for this response.
    pub const fn dw0(&self) -> u32 {
        match *self {
            ConnectResponse::Success { cntlid, authreq } => cntlid as u32 | (authreq as u32) << 16,
            ConnectResponse::InvalidParam { iattr, ipo } => {
                ipo as u32
                    | (match iattr {
                        ParamIn::Command => 0,
                        ParamIn::Data => 1,
                    }) << 16
            }
        }
    }

    /// The response in `cqe`: success, Connect Invalid Parameters, or
    /// `None` for another status (or a reserved IATTR).
    pub const fn from_cqe(cqe: &Cqe) -> Option<Self> {
        let st = cqe.status();
        if st.0 & 0x7FF == 0 {
            return Some(ConnectResponse::Success {
                cntlid: cqe.dw0 as u16,
                authreq: (cqe.dw0 >> 16) as u16,
            });
        }
        if st.sct() == sct::COMMAND_SPECIFIC && st.sc() == fabrics_sc::CONNECT_INVALID_PARAMETERS {
            let iattr = match (cqe.dw0 >> 16) as u8 {
                0 => ParamIn::Command,
                1 => ParamIn::Data,
                _ => return None,
            };
            return Some(ConnectResponse::InvalidParam {
                iattr,
                ipo: cqe.dw0 as u16,
            });
        }
        None
    }

    /// The status a controller completes the Connect with.
    pub const fn status(&self) -> Status {
        match self {
            ConnectResponse::Success { .. } => Status::SUCCESS,
            ConnectResponse::InvalidParam { .. } => {
                fabrics_status(fabrics_sc::CONNECT_INVALID_PARAMETERS)
            }
        }
    }
}

/// Size of a property (ATTRIB bits 2:0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PropertySize {
    /// 4 bytes (ATTRIB 0).
    Four,
    /// 8 bytes (ATTRIB 1).
    Eight,
}

impl PropertySize {
    pub const fn attrib(self) -> u8 {
        match self {
            PropertySize::Four => 0,
            PropertySize::Eight => 1,
        }
    }
    /// The size in ATTRIB, `None` if reserved.
    pub const fn from_attrib(attrib: u8) -> Option<Self> {
        match attrib & 7 {
            0 => Some(PropertySize::Four),
            1 => Some(PropertySize::Eight),
            _ => None,
        }
    }
    pub const fn bytes(self) -> u32 {
        match self {
            PropertySize::Four => 4,
            PropertySize::Eight => 8,
        }
    }
}

/// Property Get command (Figure 383); the value returns in CQE DW0 (and
/// DW1 for 8 bytes), see [`property_value`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct PropertyGetCmd {
    pub opc: u8,
    pub flags: u8,
    pub cid: u16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    /// Attributes: bits 2:0 size ([`PropertySize`]).
    pub attrib: u8,
    pub rsvd41: [u8; 3],
    /// Offset of the property (a controller register offset).
    pub ofst: u32,
    pub rsvd48: [u8; 16],
}
assert_size!(PropertyGetCmd, 64);
assert_offset!(PropertyGetCmd, attrib, 40);
assert_offset!(PropertyGetCmd, ofst, 44);
sqe_view!(PropertyGetCmd);

impl PropertyGetCmd {
    pub const fn new(ofst: u32, size: PropertySize) -> Self {
        PropertyGetCmd {
            opc: FABRICS_OPCODE,
            flags: 0,
            cid: 0,
            fctype: FcType::PropertyGet as u8,
            rsvd5: [0; 35],
            attrib: size.attrib(),
            rsvd41: [0; 3],
            ofst,
            rsvd48: [0; 16],
        }
    }
    /// The requested size, `None` if ATTRIB is reserved.
    pub const fn size(&self) -> Option<PropertySize> {
        PropertySize::from_attrib(self.attrib)
    }
}

/// Property Set command (Figure 385).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct PropertySetCmd {
    pub opc: u8,
    pub flags: u8,
    pub cid: u16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    /// Attributes: bits 2:0 size ([`PropertySize`]).
    pub attrib: u8,
    pub rsvd41: [u8; 3],
    /// Offset of the property.
    pub ofst: u32,
    /// Value (low 4 bytes only for a 4-byte property).
    pub value: u64,
    pub rsvd56: [u8; 8],
}
assert_size!(PropertySetCmd, 64);
assert_offset!(PropertySetCmd, attrib, 40);
assert_offset!(PropertySetCmd, ofst, 44);
assert_offset!(PropertySetCmd, value, 48);
sqe_view!(PropertySetCmd);

impl PropertySetCmd {
    pub const fn new(ofst: u32, size: PropertySize, value: u64) -> Self {
        PropertySetCmd {
            opc: FABRICS_OPCODE,
            flags: 0,
            cid: 0,
            fctype: FcType::PropertySet as u8,
            rsvd5: [0; 35],
            attrib: size.attrib(),
            rsvd41: [0; 3],
            ofst,
            value: match size {
                PropertySize::Four => value & 0xFFFF_FFFF,
                PropertySize::Eight => value,
            },
            rsvd56: [0; 8],
        }
    }
    /// The size, `None` if ATTRIB is reserved.
    pub const fn size(&self) -> Option<PropertySize> {
        PropertySize::from_attrib(self.attrib)
    }
}

/// The value of a Property Get response.
pub const fn property_value(cqe: &Cqe, size: PropertySize) -> u64 {
    match size {
        PropertySize::Four => cqe.dw0 as u64,
        PropertySize::Eight => cqe.dw0 as u64 | (cqe.dw1 as u64) << 32,
    }
}

/// Sets the value of a Property Get response in `cqe` (DW0, DW1).
pub const fn set_property_value(cqe: &mut Cqe, value: u64) {
    cqe.dw0 = value as u32;
    cqe.dw1 = (value >> 32) as u32;
}

/// Disconnect command (Figure 381): deletes the I/O queue it arrives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DisconnectCmd {
    pub opc: u8,
    pub flags: u8,
    pub cid: u16,
    pub fctype: u8,
    pub rsvd5: [u8; 35],
    /// Record Format (0).
    pub recfmt: u16,
    pub rsvd42: [u8; 22],
}
assert_size!(DisconnectCmd, 64);
assert_offset!(DisconnectCmd, recfmt, 40);
sqe_view!(DisconnectCmd);

impl DisconnectCmd {
    pub const fn new() -> Self {
        DisconnectCmd {
            opc: FABRICS_OPCODE,
            flags: 0,
            cid: 0,
            fctype: FcType::Disconnect as u8,
            rsvd5: [0; 35],
            recfmt: 0,
            rsvd42: [0; 22],
        }
    }
}

impl Default for DisconnectCmd {
    fn default() -> Self {
        DisconnectCmd::new()
    }
}
