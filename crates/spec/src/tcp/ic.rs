//! Connection initialization: ICReq and ICResp.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use super::common::{fixed_header, CommonHeader};
use super::error::{Field, PduError, Problem};
use super::{Digests, PduType, MAX_PDA, MIN_MAXH2CDATA, PFV_1_0};
use crate::{assert_offset, assert_size};

/// Initialize Connection Request, host to controller (§3.6.2.2, Figure 20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IcReq {
    pub ch: CommonHeader,
    /// PDU Format Version ([`PFV_1_0`]).
    pub pfv: u16,
    /// Host PDU Data Alignment: 0's based dwords for data the host receives.
    pub hpda: u8,
    /// Bit 0 HDGST_ENABLE, bit 1 DDGST_ENABLE.
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0's based.
    pub maxr2t: u32,
    pub rsvd16: [u8; 112],
}
assert_size!(IcReq, 128);
assert_offset!(IcReq, pfv, 8);
assert_offset!(IcReq, hpda, 10);
assert_offset!(IcReq, dgst, 11);
assert_offset!(IcReq, maxr2t, 12);

/// Initialize Connection Response, controller to host (§3.6.2.3, Figure 21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IcResp {
    pub ch: CommonHeader,
    /// PDU Format Version ([`PFV_1_0`]).
    pub pfv: u16,
    /// Controller PDU Data Alignment: 0's based dwords for data the
    /// controller receives.
    pub cpda: u8,
    /// Bit 0 HDGST_ENABLE, bit 1 DDGST_ENABLE.
    pub dgst: u8,
    /// Most data bytes in one H2CData PDU (≥ 4096, a multiple of 4).
    pub maxh2cdata: u32,
    pub rsvd16: [u8; 112],
}
assert_size!(IcResp, 128);
assert_offset!(IcResp, pfv, 8);
assert_offset!(IcResp, cpda, 10);
assert_offset!(IcResp, dgst, 11);
assert_offset!(IcResp, maxh2cdata, 12);

fn check_pda(t: PduType, pda: u8) -> Result<(), PduError> {
    if pda > MAX_PDA {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Pda,
            value: pda as u32,
            problem: Problem::Above {
                max: MAX_PDA as u32,
            },
        });
    }
    Ok(())
}

fn check_pfv_dgst(t: PduType, pfv: u16, dgst: u8) -> Result<(), PduError> {
    if pfv != PFV_1_0 {
        return Err(PduError::Unsupported {
            pdu_type: t,
            field: Field::Pfv,
            value: pfv as u32,
            problem: Problem::NotEqual {
                expected: PFV_1_0 as u32,
            },
        });
    }
    if dgst & !3 != 0 {
        return Err(PduError::InvalidField {
            pdu_type: t as u8,
            field: Field::Dgst,
            value: dgst as u32,
            problem: Problem::ReservedBits {
                mask: (dgst & !3) as u32,
            },
        });
    }
    Ok(())
}

impl IcReq {
    pub const HLEN: u8 = 128;

    /// An ICReq: `hpda` is the alignment the host wants for data it
    /// receives, `digests` the digests it asks for, `maxr2t` the most R2Ts
    /// outstanding per command (0's based).
    pub const fn new(hpda: u8, digests: Digests, maxr2t: u32) -> Self {
        IcReq {
            ch: fixed_header(PduType::IcReq),
            pfv: PFV_1_0,
            hpda,
            dgst: digests.to_dgst(),
            maxr2t,
            rsvd16: [0; 112],
        }
    }

    /// The digests asked for.
    pub const fn digests(&self) -> Digests {
        Digests::from_dgst(self.dgst)
    }

    /// Checks PFV (1.0, else unsupported), HPDA (≤ 31) and DGST reserved bits.
    pub fn check(&self) -> Result<(), PduError> {
        check_pfv_dgst(PduType::IcReq, self.pfv, self.dgst)?;
        check_pda(PduType::IcReq, self.hpda)
    }
}

impl IcResp {
    pub const HLEN: u8 = 128;

    /// An ICResp: `cpda` is the alignment the controller wants for data it
    /// receives, `digests` the digests enabled (a subset of those asked),
    /// `maxh2cdata` the most data bytes in one H2CData PDU.
    pub const fn new(cpda: u8, digests: Digests, maxh2cdata: u32) -> Self {
        IcResp {
            ch: fixed_header(PduType::IcResp),
            pfv: PFV_1_0,
            cpda,
            dgst: digests.to_dgst(),
            maxh2cdata,
            rsvd16: [0; 112],
        }
    }

    /// The digests enabled.
    pub const fn digests(&self) -> Digests {
        Digests::from_dgst(self.dgst)
    }

    /// Checks PFV, CPDA, DGST reserved bits and MAXH2CDATA (≥ 4096, a
    /// multiple of 4).
    pub fn check(&self) -> Result<(), PduError> {
        check_pfv_dgst(PduType::IcResp, self.pfv, self.dgst)?;
        check_pda(PduType::IcResp, self.cpda)?;
        let m = self.maxh2cdata;
        let bad = |problem| PduError::InvalidField {
            pdu_type: PduType::IcResp as u8,
            field: Field::Maxh2cdata,
            value: m,
            problem,
        };
        if m < MIN_MAXH2CDATA {
            return Err(bad(Problem::Below {
                min: MIN_MAXH2CDATA,
            }));
        }
        if !m.is_multiple_of(4) {
            return Err(bad(Problem::Misaligned { align: 4 }));
        }
        Ok(())
    }
}
