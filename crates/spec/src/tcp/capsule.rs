//! Command and response capsules.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::common::{fixed_header, CommonHeader};
use super::layout::PduLayout;
use super::{flags, Digests, PduType, DIGEST_LEN};
use crate::{assert_offset, assert_size, Cqe, Sqe};

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
