//! Ready to Transfer (R2T).

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::common::{fixed_header, CommonHeader};
use super::error::{Field, PduError, Problem};
use super::{flags, PduType, DIGEST_LEN};
use crate::{assert_offset, assert_size};

/// Ready to Transfer PDU (§3.6.2.10, Figure 28).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct R2T {
    pub ch: CommonHeader,
    /// Command Capsule CID the transfer is for.
    pub cccid: u16,
    /// Transfer Tag the host echoes in its H2CData PDUs.
    pub ttag: u16,
    /// Offset of the requested data.
    pub r2to: u32,
    /// Length of the requested data.
    pub r2tl: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(R2T, 24);
assert_offset!(R2T, cccid, 8);
assert_offset!(R2T, ttag, 10);
assert_offset!(R2T, r2to, 12);
assert_offset!(R2T, r2tl, 16);

impl R2T {
    pub const HLEN: u8 = 24;

    /// An R2T asking for `r2tl` bytes at `r2to` of command `cccid`.
    pub const fn new(cccid: u16, ttag: u16, r2to: u32, r2tl: u32, hdgst: bool) -> Self {
        let mut ch = fixed_header(PduType::R2T);
        if hdgst {
            ch.flags = flags::HDGSTF;
            ch.plen += DIGEST_LEN;
        }
        R2T {
            ch,
            cccid,
            ttag,
            r2to,
            r2tl,
            rsvd20: [0; 4],
        }
    }

    /// R2TL is not 0.
    pub fn check(&self) -> Result<(), PduError> {
        if self.r2tl == 0 {
            return Err(PduError::InvalidField {
                pdu_type: PduType::R2T as u8,
                field: Field::R2tl,
                value: 0,
                problem: Problem::Below { min: 1 },
            });
        }
        Ok(())
    }
}
