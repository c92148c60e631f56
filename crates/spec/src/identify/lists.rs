//! Namespace ID lists (CNS 02h) and Namespace Identification Descriptor
//! lists (CNS 03h).

use std::fmt;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

/// Namespace ID list (CNS 02h Active Namespace ID list, also the layout of
/// the Changed Namespace List log page): up to 1024 NSIDs in increasing
/// order, zero filled after the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NsIdList {
    pub ids: [u32; 1024],
}

assert_size!(NsIdList, 4096);
assert_offset!(NsIdList, ids, 0);

impl Default for NsIdList {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl NsIdList {
    /// Maximum number of entries.
    pub const CAPACITY: usize = 1024;

    /// Builds a list from `ids` (taken in order; anything after the 1024th
    /// entry is dropped). Zero entries are skipped since zero terminates the
    /// list.
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Self {
        let mut l = Self::default();
        for (slot, id) in l.ids.iter_mut().zip(ids.into_iter().filter(|&id| id != 0)) {
            *slot = id;
        }
        l
    }

    /// The NSIDs in the list: entries up to the first zero.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied().take_while(|&id| id != 0)
    }

    /// Number of entries before the first zero.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.ids[0] == 0
    }
}

/// Namespace Identifier Type: IEEE Extended Unique Identifier (8 bytes).
pub const NIDT_EUI64: u8 = 1;
/// Namespace Identifier Type: Namespace Globally Unique Identifier (16 bytes).
pub const NIDT_NGUID: u8 = 2;
/// Namespace Identifier Type: Namespace UUID (16 bytes).
pub const NIDT_UUID: u8 = 3;
/// Namespace Identifier Type: Command Set Identifier (1 byte).
pub const NIDT_CSI: u8 = 4;

/// NIDL for [`NIDT_EUI64`].
pub const NIDL_EUI64: u8 = 8;
/// NIDL for [`NIDT_NGUID`].
pub const NIDL_NGUID: u8 = 16;
/// NIDL for [`NIDT_UUID`].
pub const NIDL_UUID: u8 = 16;
/// NIDL for [`NIDT_CSI`].
pub const NIDL_CSI: u8 = 1;

/// Command Set Identifier: NVM command set.
pub const CSI_NVM: u8 = 0;
/// Command Set Identifier: Key Value command set.
pub const CSI_KV: u8 = 1;
/// Command Set Identifier: Zoned Namespace command set.
pub const CSI_ZNS: u8 = 2;

/// Header of a Namespace Identification Descriptor (NVMe 2.0c, Identify
/// CNS 03h); NIDL bytes of identifier follow.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct NsDescriptorHeader {
    /// Namespace Identifier Type (`NIDT_*`).
    pub nidt: u8,
    /// Namespace Identifier Length, bytes.
    pub nidl: u8,
    pub rsvd2: [u8; 2],
}

assert_size!(NsDescriptorHeader, 4);
assert_offset!(NsDescriptorHeader, nidt, 0);
assert_offset!(NsDescriptorHeader, nidl, 1);
assert_offset!(NsDescriptorHeader, rsvd2, 2);

/// One decoded Namespace Identification Descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NsDescriptor {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    /// Command Set Identifier (`CSI_*`).
    Csi(u8),
    /// A descriptor with a reserved NIDT, kept verbatim.
    Unknown {
        nidt: u8,
        data: Vec<u8>,
    },
}

impl NsDescriptor {
    /// The descriptor's NIDT.
    pub fn nidt(&self) -> u8 {
        match self {
            NsDescriptor::Eui64(_) => NIDT_EUI64,
            NsDescriptor::Nguid(_) => NIDT_NGUID,
            NsDescriptor::Uuid(_) => NIDT_UUID,
            NsDescriptor::Csi(_) => NIDT_CSI,
            NsDescriptor::Unknown { nidt, .. } => *nidt,
        }
    }

    /// The identifier bytes (NIDL of them).
    pub fn data(&self) -> &[u8] {
        match self {
            NsDescriptor::Eui64(d) => d,
            NsDescriptor::Nguid(d) | NsDescriptor::Uuid(d) => d,
            NsDescriptor::Csi(c) => core::slice::from_ref(c),
            NsDescriptor::Unknown { data, .. } => data,
        }
    }

    /// Encoded size: 4-byte header plus NIDL.
    pub fn encoded_len(&self) -> usize {
        4 + self.data().len()
    }
}

/// The NIDL that a given NIDT requires, if the type is defined.
pub const fn nidl_for(nidt: u8) -> Option<u8> {
    match nidt {
        NIDT_EUI64 => Some(NIDL_EUI64),
        NIDT_NGUID => Some(NIDL_NGUID),
        NIDT_UUID => Some(NIDL_UUID),
        NIDT_CSI => Some(NIDL_CSI),
        _ => None,
    }
}

/// Error parsing a Namespace Identification Descriptor list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DescriptorError {
    /// NIDL does not match the length the (defined) NIDT requires.
    BadLength {
        offset: usize,
        nidt: u8,
        nidl: u8,
        expected: u8,
    },
    /// The descriptor (header or identifier) runs past the end of the buffer.
    Truncated { offset: usize, nidt: u8 },
}

impl fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DescriptorError::BadLength {
                offset,
                nidt,
                nidl,
                expected,
            } => write!(
                f,
                "namespace descriptor at byte {offset}: NIDT {nidt:#x} has NIDL {nidl}, expected {expected}"
            ),
            DescriptorError::Truncated { offset, nidt } => write!(
                f,
                "namespace descriptor at byte {offset} (NIDT {nidt:#x}) runs past the end of the buffer"
            ),
        }
    }
}

impl std::error::Error for DescriptorError {}

/// Parses a Namespace Identification Descriptor list (CNS 03h). Parsing
/// stops at the first descriptor with NIDT 0 or at the end of `buf`.
/// Descriptors of a defined type with the wrong NIDL, and descriptors that
/// run past the buffer, are errors. Never panics.
pub fn parse_ns_descriptors(buf: &[u8]) -> Result<Vec<NsDescriptor>, DescriptorError> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < buf.len() {
        let nidt = buf[off];
        if nidt == 0 {
            break;
        }
        let rest = &buf[off..];
        if rest.len() < 4 {
            return Err(DescriptorError::Truncated { offset: off, nidt });
        }
        let nidl = rest[1];
        let Some(data) = rest.get(4..4 + nidl as usize) else {
            return Err(DescriptorError::Truncated { offset: off, nidt });
        };
        if let Some(expected) = nidl_for(nidt) {
            if nidl != expected {
                return Err(DescriptorError::BadLength {
                    offset: off,
                    nidt,
                    nidl,
                    expected,
                });
            }
        }
        let d = match nidt {
            NIDT_EUI64 => NsDescriptor::Eui64(data.try_into().expect("length checked")),
            NIDT_NGUID => NsDescriptor::Nguid(data.try_into().expect("length checked")),
            NIDT_UUID => NsDescriptor::Uuid(data.try_into().expect("length checked")),
            NIDT_CSI => NsDescriptor::Csi(data[0]),
            _ => NsDescriptor::Unknown {
                nidt,
                data: data.to_vec(),
            },
        };
        out.push(d);
        off += 4 + nidl as usize;
    }
    Ok(out)
}

/// Writes a Namespace Identification Descriptor list into `buf`
/// (controller side), zero-filling everything after the last descriptor.
///
/// Descriptors are packed back to back. A descriptor that does not fit
/// entirely in the remaining space ends the list; `Unknown` descriptors with
/// NIDT 0 or more than 255 data bytes cannot be encoded and are skipped.
/// Returns the number of bytes of descriptors written.
pub fn write_ns_descriptors(list: &[NsDescriptor], buf: &mut [u8]) -> usize {
    buf.fill(0);
    let mut off = 0usize;
    for d in list {
        let data = d.data();
        let nidt = d.nidt();
        if nidt == 0 || data.len() > u8::MAX as usize {
            continue;
        }
        let len = 4 + data.len();
        let Some(dst) = buf.get_mut(off..off + len) else {
            break;
        };
        let hdr = NsDescriptorHeader {
            nidt,
            nidl: data.len() as u8,
            rsvd2: [0; 2],
        };
        dst[..4].copy_from_slice(hdr.as_bytes());
        dst[4..].copy_from_slice(data);
        off += len;
    }
    off
}
