//! NVMe over Fabrics wire formats (NVMe 2.0 base spec §6 "Fabrics Command
//! Set", §5.27.1.x Discovery Log Page, §4.1.2 SGL descriptors; NVMe/TCP
//! Transport spec 1.0 §3.5 for the TCP SGL usage): the Fabrics command
//! (opcode 7Fh) and its Connect, Property Get/Set and Disconnect forms, the
//! Connect data and response, NQN helpers, SGL descriptors and the
//! Discovery Log Page.
//!
//! Command views ([`ConnectCmd`], [`PropertyGetCmd`], ...) are 64-byte
//! overlays of an [`Sqe`]: convert with `from_sqe`/`to_sqe`.
use core::fmt;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::identify::ascii_str;
use crate::status::{sct, Status};
use crate::{assert_offset, assert_size, Cqe, Sqe};

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

// ---------------------------------------------------------------------------
// SGL descriptors
// ---------------------------------------------------------------------------

/// SGL descriptor types (bits 7:4 of the identifier byte).
pub mod sgl_type {
    pub const DATA_BLOCK: u8 = 0x0;
    pub const BIT_BUCKET: u8 = 0x1;
    pub const SEGMENT: u8 = 0x2;
    pub const LAST_SEGMENT: u8 = 0x3;
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5;
    pub const VENDOR_SPECIFIC: u8 = 0xF;
}

/// SGL descriptor subtypes (bits 3:0 of the identifier byte).
pub mod sgl_subtype {
    /// The address field is a host address.
    pub const ADDRESS: u8 = 0x0;
    /// The address field is an offset into in-capsule data.
    pub const OFFSET: u8 = 0x1;
    /// Transport specific (NVMe/TCP: data moves in data PDUs).
    pub const TRANSPORT_SPECIFIC: u8 = 0xA;
}

/// Identifier of a Data Block descriptor with Offset subtype: in-capsule
/// data (what Linux sends for writes that fit the capsule).
pub const SGL_ID_IN_CAPSULE: u8 = sgl_type::DATA_BLOCK << 4 | sgl_subtype::OFFSET;
/// Identifier of a Transport SGL Data Block, transport-specific subtype:
/// NVMe/TCP data sent via R2T/H2CData or C2HData.
pub const SGL_ID_TCP_TRANSPORT: u8 =
    sgl_type::TRANSPORT_DATA_BLOCK << 4 | sgl_subtype::TRANSPORT_SPECIFIC;

/// SGLS bits of Identify Controller (besides bits 1:0, see
/// [`crate::identify::SGLS_SUPPORTED`]).
pub mod sgls {
    /// Keyed SGL Data Block descriptor supported.
    pub const KEYED_DATA_BLOCK: u32 = 1 << 2;
    /// SGL Bit Bucket descriptor supported.
    pub const BIT_BUCKET: u32 = 1 << 16;
    /// Byte aligned contiguous physical buffer of metadata supported.
    pub const BYTE_ALIGNED_METADATA: u32 = 1 << 17;
    /// SGL length may exceed the data transferred.
    pub const LENGTH_LARGER_THAN_DATA: u32 = 1 << 18;
    /// MPTR may hold an SGL descriptor.
    pub const MPTR_SGL: u32 = 1 << 19;
    /// The address field may be an offset (in-capsule data; fabrics).
    pub const ADDRESS_AS_OFFSET: u32 = 1 << 20;
    /// Transport SGL Data Block descriptor supported.
    pub const TRANSPORT_DATA_BLOCK: u32 = 1 << 21;
}

/// A raw 16-byte SGL descriptor (NVMe 2.0 base spec §4.1.2, Figure 113).
/// Keyed descriptors use bytes 8..11 as a 3-byte length and 11..15 as the
/// key; see [`Sgl::parse`].
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct SglDescriptor {
    /// Address or offset.
    pub addr: u64,
    /// Length in bytes.
    pub len: u32,
    pub rsvd12: [u8; 3],
    /// SGL identifier: type in bits 7:4, subtype in bits 3:0.
    pub id: u8,
}
assert_size!(SglDescriptor, 16);
assert_offset!(SglDescriptor, addr, 0);
assert_offset!(SglDescriptor, len, 8);
assert_offset!(SglDescriptor, id, 15);

impl SglDescriptor {
    /// In-capsule data of `len` bytes at `offset` from the start of the
    /// capsule's data.
    pub const fn in_capsule(offset: u64, len: u32) -> Self {
        SglDescriptor {
            addr: offset,
            len,
            rsvd12: [0; 3],
            id: SGL_ID_IN_CAPSULE,
        }
    }

    /// `len` bytes moved by NVMe/TCP data PDUs (R2T/H2CData or C2HData).
    pub const fn tcp_transport(len: u32) -> Self {
        SglDescriptor {
            addr: 0,
            len,
            rsvd12: [0; 3],
            id: SGL_ID_TCP_TRANSPORT,
        }
    }

    /// The descriptor in an SQE's DPTR (bytes 24..40).
    pub const fn from_sqe(sqe: &Sqe) -> Self {
        let b = sqe.prp2.to_le_bytes();
        SglDescriptor {
            addr: sqe.prp1,
            len: sqe.prp2 as u32,
            rsvd12: [b[4], b[5], b[6]],
            id: b[7],
        }
    }

    /// Stores the descriptor in `sqe`'s DPTR and sets PSDT to SGL.
    pub const fn write_to_sqe(&self, sqe: &mut Sqe) {
        sqe.prp1 = self.addr;
        sqe.prp2 = u64::from_le_bytes([
            self.len as u8,
            (self.len >> 8) as u8,
            (self.len >> 16) as u8,
            (self.len >> 24) as u8,
            self.rsvd12[0],
            self.rsvd12[1],
            self.rsvd12[2],
            self.id,
        ]);
        sqe.flags = (sqe.flags & 0x3F) | SQE_FLAGS_SGL;
    }

    /// Descriptor type (bits 7:4 of the identifier).
    pub const fn sgl_type(&self) -> u8 {
        self.id >> 4
    }

    /// Descriptor subtype (bits 3:0 of the identifier).
    pub const fn subtype(&self) -> u8 {
        self.id & 0xF
    }
}

/// A parsed data SGL descriptor of the kinds NVMe/TCP uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sgl {
    /// Data Block, Address subtype: a host memory address (not meaningful
    /// over TCP, but well formed).
    Address { addr: u64, len: u32 },
    /// Data Block, Offset subtype: `len` bytes of in-capsule data at
    /// `offset` from the capsule's data.
    InCapsule { offset: u64, len: u32 },
    /// Transport SGL Data Block, transport specific: `len` bytes moved by
    /// data PDUs.
    Transport { len: u32 },
}

/// Why an SGL descriptor is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SglError {
    /// PSDT is not SGL.
    #[error("PSDT is {psdt:#04b}, fabrics commands use SGLs ({PSDT_SGL:#04b})")]
    NotSgl { psdt: u8 },
    /// Keyed SGL descriptors are RDMA's; NVMe/TCP does not support them.
    #[error("keyed SGL data block descriptor (identifier {id:#04x}) is not supported")]
    Keyed { id: u8 },
    /// A type/subtype combination this transport does not accept.
    #[error("SGL descriptor type {sgl_type:#x} subtype {subtype:#x} is not supported")]
    Unsupported { sgl_type: u8, subtype: u8 },
    /// Reserved bytes are non-zero.
    #[error("SGL descriptor (identifier {id:#04x}) has non-zero reserved bytes")]
    Reserved { id: u8 },
}

impl SglError {
    /// The completion status a controller returns for this error.
    pub const fn status(&self) -> Status {
        use crate::status::generic;
        Status::generic(match self {
            SglError::NotSgl { .. } => generic::INVALID_FIELD,
            SglError::Keyed { .. } | SglError::Unsupported { .. } => generic::SGL_TYPE_INVALID,
            SglError::Reserved { .. } => generic::INVALID_SGL_DESCRIPTOR,
        })
    }
}

impl Sgl {
    /// Parses a data SGL descriptor.
    pub const fn parse(d: &SglDescriptor) -> Result<Self, SglError> {
        let reserved_clear = d.rsvd12[0] == 0 && d.rsvd12[1] == 0 && d.rsvd12[2] == 0;
        match (d.sgl_type(), d.subtype()) {
            (sgl_type::KEYED_DATA_BLOCK, _) => Err(SglError::Keyed { id: d.id }),
            (sgl_type::DATA_BLOCK, sgl_subtype::ADDRESS) if reserved_clear => Ok(Sgl::Address {
                addr: d.addr,
                len: d.len,
            }),
            (sgl_type::DATA_BLOCK, sgl_subtype::OFFSET) if reserved_clear => Ok(Sgl::InCapsule {
                offset: d.addr,
                len: d.len,
            }),
            (sgl_type::TRANSPORT_DATA_BLOCK, sgl_subtype::TRANSPORT_SPECIFIC) if reserved_clear => {
                Ok(Sgl::Transport { len: d.len })
            }
            (sgl_type::DATA_BLOCK, sgl_subtype::ADDRESS | sgl_subtype::OFFSET)
            | (sgl_type::TRANSPORT_DATA_BLOCK, sgl_subtype::TRANSPORT_SPECIFIC) => {
                Err(SglError::Reserved { id: d.id })
            }
            (t, s) => Err(SglError::Unsupported {
                sgl_type: t,
                subtype: s,
            }),
        }
    }

    /// Parses the data SGL of `sqe`, checking PSDT first.
    pub const fn from_sqe(sqe: &Sqe) -> Result<Self, SglError> {
        if sqe.psdt() != PSDT_SGL {
            return Err(SglError::NotSgl { psdt: sqe.psdt() });
        }
        Sgl::parse(&SglDescriptor::from_sqe(sqe))
    }

    /// The descriptor for this SGL.
    pub const fn descriptor(&self) -> SglDescriptor {
        match *self {
            Sgl::Address { addr, len } => SglDescriptor {
                addr,
                len,
                rsvd12: [0; 3],
                id: sgl_type::DATA_BLOCK << 4 | sgl_subtype::ADDRESS,
            },
            Sgl::InCapsule { offset, len } => SglDescriptor::in_capsule(offset, len),
            Sgl::Transport { len } => SglDescriptor::tcp_transport(len),
        }
    }

    /// Bytes of data described.
    pub const fn len(&self) -> u32 {
        match *self {
            Sgl::Address { len, .. } | Sgl::InCapsule { len, .. } | Sgl::Transport { len } => len,
        }
    }

    /// Whether no data is described.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

// ---------------------------------------------------------------------------
// NQNs
// ---------------------------------------------------------------------------

/// Size of an NQN field in Connect data, Identify and the Discovery Log.
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN in bytes, without the terminating NUL.
pub const NQN_MAX_LEN: usize = 223;
/// The well-known NQN of discovery subsystems.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";
/// Prefix of NQNs derived from a UUID.
pub const NQN_UUID_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// Why an NQN is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NqnError {
    #[error("NQN is empty")]
    Empty,
    #[error("NQN is {len} bytes, longer than {NQN_MAX_LEN}")]
    TooLong { len: usize },
    #[error("NQN field has no terminating NUL within {NQN_FIELD_LEN} bytes")]
    NotTerminated,
    #[error("NQN is not valid UTF-8 (at byte {at})")]
    NotUtf8 { at: usize },
    #[error("NQN has control character {byte:#04x} at byte {at}")]
    ControlChar { at: usize, byte: u8 },
}

/// Checks an NQN: 1 to 223 bytes of UTF-8 (the specification's encoding;
/// in practice ASCII) without control characters or NUL.
pub fn validate_nqn(nqn: &str) -> Result<(), NqnError> {
    if nqn.is_empty() {
        return Err(NqnError::Empty);
    }
    if nqn.len() > NQN_MAX_LEN {
        return Err(NqnError::TooLong { len: nqn.len() });
    }
    if let Some(at) = nqn.bytes().position(|b| b < 0x20 || b == 0x7F) {
        return Err(NqnError::ControlChar {
            at,
            byte: nqn.as_bytes()[at],
        });
    }
    Ok(())
}

/// Writes a validated NQN, NUL-terminated and zero-filled, into `field`.
pub fn write_nqn(field: &mut [u8; NQN_FIELD_LEN], nqn: &str) -> Result<(), NqnError> {
    validate_nqn(nqn)?;
    field.fill(0);
    field[..nqn.len()].copy_from_slice(nqn.as_bytes());
    Ok(())
}

/// Reads and validates the NUL-terminated NQN in `field`.
pub fn read_nqn(field: &[u8]) -> Result<&str, NqnError> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(NqnError::NotTerminated)?;
    let s = core::str::from_utf8(&field[..end]).map_err(|e| NqnError::NotUtf8 {
        at: e.valid_up_to(),
    })?;
    validate_nqn(s)?;
    Ok(s)
}

// ---------------------------------------------------------------------------
// Fabrics commands
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Discovery
// ---------------------------------------------------------------------------

/// Log page identifier of the Discovery Log Page.
pub const LID_DISCOVERY: u8 = 0x70;

/// Transport types (TRTYPE).
pub mod trtype {
    pub const RDMA: u8 = 1;
    pub const FC: u8 = 2;
    pub const TCP: u8 = 3;
    pub const INTRA_HOST: u8 = 0xFE;
}

/// Address families (ADRFAM).
pub mod adrfam {
    pub const IPV4: u8 = 1;
    pub const IPV6: u8 = 2;
    pub const IB: u8 = 3;
    pub const FC: u8 = 4;
    pub const INTRA_HOST: u8 = 0xFE;
}

/// Subsystem types (SUBTYPE).
pub mod subtype {
    /// A referral to another discovery service.
    pub const DISCOVERY_REFERRAL: u8 = 1;
    /// An NVM subsystem.
    pub const NVM: u8 = 2;
    /// The discovery subsystem that returned the log.
    pub const CURRENT_DISCOVERY: u8 = 3;
}

/// Transport requirements (TREQ) bits.
pub mod treq {
    /// Bits 1:0 secure channel: not specified.
    pub const SECURE_CHANNEL_NOT_SPECIFIED: u8 = 0;
    /// Bits 1:0 secure channel: required.
    pub const SECURE_CHANNEL_REQUIRED: u8 = 1;
    /// Bits 1:0 secure channel: not required.
    pub const SECURE_CHANNEL_NOT_REQUIRED: u8 = 2;
    /// Bit 2: SQ flow control disable supported.
    pub const SQ_FLOW_DISABLE: u8 = 1 << 2;
}

/// Entry flags (EFLAGS).
pub mod eflags {
    /// Duplicate Returned Information.
    pub const DUPRETINFO: u16 = 1 << 0;
    /// Explicit Persistent Connection Support for Discovery.
    pub const EPCSD: u16 = 1 << 1;
    /// No CDC Connectivity.
    pub const NCC: u16 = 1 << 2;
}

/// NVMe/TCP TSAS SECTYPE (byte 0 of TSAS).
pub mod tcp_sectype {
    pub const NONE: u8 = 0;
    pub const TLS12: u8 = 1;
    pub const TLS13: u8 = 2;
}

/// Discovery Log Page header (Figure 292), 1024 bytes; entries follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DiscoveryLogHeader {
    /// Generation Counter: changes whenever the log changes.
    pub genctr: u64,
    /// Number of records.
    pub numrec: u64,
    /// Record Format (0).
    pub recfmt: u16,
    pub rsvd18: [u8; 1006],
}
assert_size!(DiscoveryLogHeader, 1024);
assert_offset!(DiscoveryLogHeader, genctr, 0);
assert_offset!(DiscoveryLogHeader, numrec, 8);
assert_offset!(DiscoveryLogHeader, recfmt, 16);

impl DiscoveryLogHeader {
    pub fn new(genctr: u64, numrec: u64) -> Self {
        let mut h = DiscoveryLogHeader::new_zeroed();
        h.genctr = genctr;
        h.numrec = numrec;
        h
    }
}

/// Size of a TRSVCID field.
pub const TRSVCID_LEN: usize = 32;
/// Size of a TRADDR field.
pub const TRADDR_LEN: usize = 256;

/// Why a discovery entry field is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{field} {value:?} is {len} bytes, longer than the {max}-byte field")]
    TooLong {
        field: &'static str,
        value: String,
        len: usize,
        max: usize,
    },
    #[error("{field} {value:?} is not printable ASCII")]
    NotAscii { field: &'static str, value: String },
    #[error("SUBNQN: {0}")]
    Nqn(#[from] NqnError),
}

/// Discovery Log Page entry (Figure 293), 1024 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct DiscoveryLogEntry {
    /// Transport type ([`trtype`]).
    pub trtype: u8,
    /// Address family ([`adrfam`]).
    pub adrfam: u8,
    /// Subsystem type ([`subtype`]).
    pub subtype: u8,
    /// Transport requirements ([`treq`]).
    pub treq: u8,
    /// Port ID.
    pub portid: u16,
    /// Controller ID ([`CNTLID_DYNAMIC`] for the dynamic model).
    pub cntlid: u16,
    /// Admin max SQ size.
    pub asqsz: u16,
    /// Entry flags ([`eflags`]).
    pub eflags: u16,
    pub rsvd12: [u8; 20],
    /// Transport service ID (the TCP port), ASCII, space padded.
    pub trsvcid: [u8; TRSVCID_LEN],
    pub rsvd64: [u8; 192],
    /// Subsystem NQN, NUL-terminated.
    pub subnqn: [u8; NQN_FIELD_LEN],
    /// Transport address (IP address text), ASCII, space padded.
    pub traddr: [u8; TRADDR_LEN],
    /// Transport specific address subtype (TCP: byte 0 SECTYPE).
    pub tsas: [u8; 256],
}
assert_size!(DiscoveryLogEntry, 1024);
assert_offset!(DiscoveryLogEntry, trtype, 0);
assert_offset!(DiscoveryLogEntry, adrfam, 1);
assert_offset!(DiscoveryLogEntry, subtype, 2);
assert_offset!(DiscoveryLogEntry, treq, 3);
assert_offset!(DiscoveryLogEntry, portid, 4);
assert_offset!(DiscoveryLogEntry, cntlid, 6);
assert_offset!(DiscoveryLogEntry, asqsz, 8);
assert_offset!(DiscoveryLogEntry, eflags, 10);
assert_offset!(DiscoveryLogEntry, trsvcid, 32);
assert_offset!(DiscoveryLogEntry, subnqn, 256);
assert_offset!(DiscoveryLogEntry, traddr, 512);
assert_offset!(DiscoveryLogEntry, tsas, 768);

fn write_padded(dst: &mut [u8], field: &'static str, s: &str) -> Result<(), DiscoveryError> {
    if !s.bytes().all(|b| (0x20..0x7F).contains(&b)) {
        return Err(DiscoveryError::NotAscii {
            field,
            value: s.to_owned(),
        });
    }
    if s.len() > dst.len() {
        return Err(DiscoveryError::TooLong {
            field,
            value: s.to_owned(),
            len: s.len(),
            max: dst.len(),
        });
    }
    dst.fill(b' ');
    dst[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
}

/// An NVMe/TCP listener a discovery entry describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpEndpoint<'a> {
    /// [`adrfam::IPV4`] or [`adrfam::IPV6`].
    pub adrfam: u8,
    /// Address text, e.g. `"127.0.0.1"`.
    pub traddr: &'a str,
    /// Port text, e.g. `"4420"`.
    pub trsvcid: &'a str,
}

impl DiscoveryLogEntry {
    /// An NVMe/TCP entry for subsystem `subnqn` of `subtype` at `ep`, port
    /// `portid`, dynamic controller model, no TLS, secure channel not
    /// required.
    pub fn tcp(
        subtype: u8,
        portid: u16,
        ep: TcpEndpoint<'_>,
        subnqn: &str,
        asqsz: u16,
    ) -> Result<Self, DiscoveryError> {
        let mut e = DiscoveryLogEntry::new_zeroed();
        e.trtype = trtype::TCP;
        e.adrfam = ep.adrfam;
        e.subtype = subtype;
        e.treq = treq::SECURE_CHANNEL_NOT_REQUIRED;
        e.portid = portid;
        e.cntlid = CNTLID_DYNAMIC;
        e.asqsz = asqsz;
        write_padded(&mut e.trsvcid, "TRSVCID", ep.trsvcid)?;
        write_padded(&mut e.traddr, "TRADDR", ep.traddr)?;
        write_nqn(&mut e.subnqn, subnqn)?;
        e.tsas[0] = tcp_sectype::NONE;
        Ok(e)
    }

    /// TRSVCID without padding (spaces or NULs).
    pub fn trsvcid_str(&self) -> std::borrow::Cow<'_, str> {
        ascii_str(&self.trsvcid)
    }

    /// TRADDR without padding (spaces or NULs).
    pub fn traddr_str(&self) -> std::borrow::Cow<'_, str> {
        ascii_str(&self.traddr)
    }

    /// SUBNQN, validated.
    pub fn subnqn(&self) -> Result<&str, NqnError> {
        read_nqn(&self.subnqn)
    }

    /// TCP security type (TSAS byte 0).
    pub const fn tcp_sectype(&self) -> u8 {
        self.tsas[0]
    }
}

impl fmt::Display for DiscoveryLogEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trtype {} adrfam {} subtype {} portid {} traddr {} trsvcid {} subnqn {}",
            self.trtype,
            self.adrfam,
            self.subtype,
            self.portid,
            self.traddr_str(),
            self.trsvcid_str(),
            ascii_str(&self.subnqn)
        )
    }
}
