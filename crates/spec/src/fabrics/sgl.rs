//! SGL descriptors (§4.1.2; NVMe/TCP §3.5 for the TCP usage).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::{PSDT_SGL, SQE_FLAGS_SGL};
use crate::status::Status;
use crate::{assert_offset, assert_size, Sqe};

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
    ///
    /// A Transport SGL Data Block with its reserved bytes clear (what
    /// every NVMe/TCP command with data to move carries) is recognised
    /// from DPTR's upper word at once: identifier and reserved bytes are
    /// its top 32 bits. Anything else goes through [`Sgl::parse`].
    #[inline]
    pub const fn from_sqe(sqe: &Sqe) -> Result<Self, SglError> {
        if sqe.psdt() != PSDT_SGL {
            return Err(SglError::NotSgl { psdt: sqe.psdt() });
        }
        if sqe.prp2 >> 32 == (SGL_ID_TCP_TRANSPORT as u64) << 24 {
            return Ok(Sgl::Transport {
                len: sqe.prp2 as u32,
            });
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
