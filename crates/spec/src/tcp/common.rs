//! The common header every PDU starts with (§3.6.1).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::PduType;
use crate::{assert_offset, assert_size};

/// The 8-byte common header of every PDU (§3.6.1, Figure 12).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct CommonHeader {
    /// PDU type ([`PduType`]).
    pub pdu_type: u8,
    /// Type-specific flags ([`flags`](super::flags)).
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

pub(super) const fn fixed_header(t: PduType) -> CommonHeader {
    CommonHeader {
        pdu_type: t as u8,
        flags: 0,
        hlen: t.hlen(),
        pdo: 0,
        plen: t.hlen() as u32,
    }
}
