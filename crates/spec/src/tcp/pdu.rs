//! A received PDU header of any type, and writing a header out.

use zerocopy::FromBytes;

use super::capsule::{CapsuleCmd, CapsuleResp};
use super::data::{C2HData, H2CData};
use super::digest::{digest_bytes, header_digest, verify_header_digest};
use super::error::PduError;
use super::ic::{IcReq, IcResp};
use super::layout::{PduLayout, RxConfig};
use super::r2t::R2T;
use super::term::TermReq;
use super::PduType;

/// A received, checked PDU header of any type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduHeader {
    IcReq(IcReq),
    IcResp(IcResp),
    TermReq(TermReq),
    CapsuleCmd(CapsuleCmd),
    CapsuleResp(CapsuleResp),
    H2CData(H2CData),
    C2HData(C2HData),
    R2T(R2T),
}

impl PduHeader {
    /// Parses the header of a PDU whose common header passed
    /// [`CommonHeader::check`](super::CommonHeader::check) with `cfg`,
    /// giving `layout`. `bytes` holds the PDU from its start through at
    /// least the header digest
    /// ([`PduLayout::header_len`] bytes). Verifies the header digest and the
    /// type-specific fields (ICReq/ICResp parameters, DATAL, MAXH2CDATA,
    /// R2TL).
    pub fn parse(bytes: &[u8], layout: &PduLayout, cfg: &RxConfig) -> Result<Self, PduError> {
        let need = layout.header_len();
        if bytes.len() < need as usize {
            return Err(PduError::ShortBuffer {
                need,
                got: bytes.len().min(u32::MAX as usize) as u32,
            });
        }
        let hlen = layout.hlen as usize;
        let header = &bytes[..hlen];
        if let Some(r) = layout.header_digest_range() {
            let mut d = [0u8; 4];
            d.copy_from_slice(&bytes[r]);
            verify_header_digest(header, d)?;
        }
        let short = || PduError::ShortBuffer {
            need,
            got: hlen as u32,
        };
        Ok(match layout.pdu_type {
            PduType::IcReq => {
                let h = IcReq::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::IcReq(h)
            }
            PduType::IcResp => {
                let h = IcResp::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::IcResp(h)
            }
            PduType::H2CTermReq | PduType::C2HTermReq => {
                PduHeader::TermReq(TermReq::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::CapsuleCmd => {
                PduHeader::CapsuleCmd(CapsuleCmd::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::CapsuleResp => {
                PduHeader::CapsuleResp(CapsuleResp::read_from_bytes(header).map_err(|_| short())?)
            }
            PduType::H2CData => {
                let h = H2CData::read_from_bytes(header).map_err(|_| short())?;
                h.check(layout, cfg.maxh2cdata)?;
                PduHeader::H2CData(h)
            }
            PduType::C2HData => {
                let h = C2HData::read_from_bytes(header).map_err(|_| short())?;
                h.check(layout)?;
                PduHeader::C2HData(h)
            }
            PduType::R2T => {
                let h = R2T::read_from_bytes(header).map_err(|_| short())?;
                h.check()?;
                PduHeader::R2T(h)
            }
        })
    }
}

/// Writes `header` followed by its digest (if `layout.hdgst`) and the
/// zero padding up to the data into `out`, returning the bytes written
/// (`layout.data_offset`, or the header length without data).
///
/// `None` if `out` is shorter than that.
pub fn write_header(header: &[u8], layout: &PduLayout, out: &mut [u8]) -> Option<usize> {
    let hlen = layout.hlen as usize;
    let end = layout.prefix_len() as usize;
    if header.len() != hlen || out.len() < end {
        return None;
    }
    out[..hlen].copy_from_slice(header);
    let mut at = hlen;
    if layout.hdgst {
        out[at..at + 4].copy_from_slice(&digest_bytes(header_digest(header)));
        at += 4;
    }
    if at < end {
        out[at..end].fill(0);
    }
    Some(end)
}

/// Appends what [`write_header`] writes (the header, its digest, the
/// padding up to the data) to `out`, returning the bytes appended; `None`
/// (nothing appended) if `header` is not `layout.hlen` bytes long.
#[inline]
pub fn append_header(header: &[u8], layout: &PduLayout, out: &mut Vec<u8>) -> Option<usize> {
    let hlen = layout.hlen as usize;
    if header.len() != hlen {
        return None;
    }
    if layout.hdgst || layout.prefix_len() as usize != hlen {
        return Some(append_with_digest_or_padding(header, layout, out));
    }
    // The header alone (no digest, data right after it, or none): small
    // enough to inline, so a header of known size is copied in place.
    out.extend_from_slice(header);
    Some(hlen)
}

/// [`append_header`] of a header followed by its digest or by padding.
#[inline(never)]
fn append_with_digest_or_padding(header: &[u8], layout: &PduLayout, out: &mut Vec<u8>) -> usize {
    let end = layout.prefix_len() as usize;
    let start = out.len();
    out.extend_from_slice(header);
    if layout.hdgst {
        out.extend_from_slice(&digest_bytes(header_digest(header)));
    }
    out.resize(start + end, 0);
    end
}
