//! Data PDUs: H2CData and C2HData, and the checks of their data range.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::common::CommonHeader;
use super::error::{Field, PduError, Problem};
use super::layout::PduLayout;
use super::{flags, Digests, PduType};
use crate::{assert_offset, assert_size};

/// Host to Controller Data PDU header (§3.6.2.8, Figure 26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct H2CData {
    pub ch: CommonHeader,
    /// Command Capsule CID the data belongs to.
    pub cccid: u16,
    /// Transfer Tag from the R2T this PDU answers.
    pub ttag: u16,
    /// Offset of this PDU's data in the command's data.
    pub datao: u32,
    /// Bytes of data in this PDU.
    pub datal: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(H2CData, 24);
assert_offset!(H2CData, cccid, 8);
assert_offset!(H2CData, ttag, 10);
assert_offset!(H2CData, datao, 12);
assert_offset!(H2CData, datal, 16);

/// Controller to Host Data PDU header (§3.6.2.9, Figure 27).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct C2HData {
    pub ch: CommonHeader,
    /// Command Capsule CID the data belongs to.
    pub cccid: u16,
    pub rsvd10: u16,
    /// Offset of this PDU's data in the command's data.
    pub datao: u32,
    /// Bytes of data in this PDU.
    pub datal: u32,
    pub rsvd20: [u8; 4],
}
assert_size!(C2HData, 24);
assert_offset!(C2HData, cccid, 8);
assert_offset!(C2HData, datao, 12);
assert_offset!(C2HData, datal, 16);

fn check_datal(t: PduType, datal: u32, layout: &PduLayout) -> Result<(), PduError> {
    if datal != layout.data_len {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Datal,
            value: datal,
            problem: Problem::NotEqual {
                expected: layout.data_len,
            },
        });
    }
    Ok(())
}

/// Checks that a data PDU's `[datao, datao + datal)` starts where the
/// receiver expects (`expected_datao`: data PDUs of a command arrive in
/// order) and ends within the command's `total` bytes (FES 04h).
pub fn check_data_range(
    pdu_type: PduType,
    datao: u32,
    datal: u32,
    expected_datao: u32,
    total: u32,
) -> Result<(), PduError> {
    if datao != expected_datao {
        return Err(PduError::DataOutOfRange {
            pdu_type,
            field: Field::Datao,
            value: datao,
            problem: Problem::NotEqual {
                expected: expected_datao,
            },
        });
    }
    let room = total.saturating_sub(datao);
    if datal > room {
        return Err(PduError::DataOutOfRange {
            pdu_type,
            field: Field::Datal,
            value: datal,
            problem: Problem::Above { max: room },
        });
    }
    Ok(())
}

impl H2CData {
    pub const HLEN: u8 = 24;

    /// An H2CData header answering R2T `ttag` of command `cccid`, carrying
    /// `datal` bytes at `datao`; `cpda` is the controller's PDA.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cccid: u16,
        ttag: u16,
        datao: u32,
        datal: u32,
        last: bool,
        digests: Digests,
        cpda: u8,
    ) -> Option<(Self, PduLayout)> {
        if datal == 0 {
            return None;
        }
        let l = PduLayout::new(PduType::H2CData, digests, cpda, datal)?;
        let extra = if last { flags::LAST_PDU } else { 0 };
        Some((
            H2CData {
                ch: l.common_header(extra),
                cccid,
                ttag,
                datao,
                datal,
                rsvd20: [0; 4],
            },
            l,
        ))
    }

    /// Whether LAST_PDU is set.
    pub const fn last(&self) -> bool {
        self.ch.flags & flags::LAST_PDU != 0
    }

    /// DATAL equals the layout's data length and is within MAXH2CDATA.
    pub fn check(&self, layout: &PduLayout, maxh2cdata: u32) -> Result<(), PduError> {
        check_datal(PduType::H2CData, self.datal, layout)?;
        if self.datal > maxh2cdata {
            return Err(PduError::DataLimitExceeded {
                datal: self.datal,
                maxh2cdata,
            });
        }
        Ok(())
    }
}

impl C2HData {
    pub const HLEN: u8 = 24;

    /// A C2HData header for command `cccid` carrying `datal` bytes at
    /// `datao`; `success` (only with `last`) tells the host no CapsuleResp
    /// follows. `hpda` is the host's PDA.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cccid: u16,
        datao: u32,
        datal: u32,
        last: bool,
        success: bool,
        digests: Digests,
        hpda: u8,
    ) -> Option<(Self, PduLayout)> {
        if datal == 0 || (success && !last) {
            return None;
        }
        let l = PduLayout::new(PduType::C2HData, digests, hpda, datal)?;
        let mut extra = if last { flags::LAST_PDU } else { 0 };
        if success {
            extra |= flags::SUCCESS;
        }
        Some((
            C2HData {
                ch: l.common_header(extra),
                cccid,
                rsvd10: 0,
                datao,
                datal,
                rsvd20: [0; 4],
            },
            l,
        ))
    }

    /// Whether LAST_PDU is set.
    pub const fn last(&self) -> bool {
        self.ch.flags & flags::LAST_PDU != 0
    }

    /// Whether SUCCESS is set (the command completed, no CapsuleResp).
    pub const fn success(&self) -> bool {
        self.ch.flags & flags::SUCCESS != 0
    }

    /// DATAL equals the layout's data length.
    pub fn check(&self, layout: &PduLayout) -> Result<(), PduError> {
        check_datal(PduType::C2HData, self.datal, layout)
    }
}
