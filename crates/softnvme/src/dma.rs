//! Data movement between the device and host memory: PRPs translated
//! through the IOMMU into host segments, and copies into/out of them.
//!
//! A command's whole transfer is walked and translated *before* any data
//! moves, so a bad PRP anywhere fails the command with nothing transferred.
//! The segment vector is preallocated per controller (no allocation on the
//! I/O path unless a transfer needs more segments than ever before).
//!
//! Segments are `pollux_bdev::RawSeg`s, so a namespace's bdev reads and
//! writes them in place (no copy).
//!
//! Caveat (the DMA contract): host buffers are lent to the namespace's bdev
//! (or turned into byte slices for one file call) for the duration of one
//! command, under the controller lock. A host that touches a buffer while a
//! command using it is outstanding gets unspecified data — exactly as with
//! a real device — and the device never derives anything from such data
//! except through copies it validates.
use std::ptr;

pub(crate) use pollux_bdev::RawSeg as Seg;

use crate::iommu::Iommu;
use crate::prp::{self, PrpError};

/// Reads `out.len()` little-endian qwords at `iova` (one PRP list chunk).
fn read_qwords(iommu: &Iommu, iova: u64, out: &mut [u64]) -> Result<(), PrpError> {
    let p = iommu
        .translate(iova, out.len() * 8)
        .ok_or(PrpError::Unmapped)?
        .cast::<u64>();
    if !(p.as_ptr() as usize).is_multiple_of(8) {
        // The walker keeps list reads qword aligned and mappings are page
        // aligned, so this cannot happen; refuse rather than misalign.
        return Err(PrpError::OffsetInvalid);
    }
    for (i, o) in out.iter_mut().enumerate() {
        // SAFETY: `translate` vouched for `out.len() * 8` mapped bytes;
        // aligned (checked); a volatile copy of host-owned memory.
        *o = u64::from_le(unsafe { ptr::read_volatile(p.as_ptr().add(i)) });
    }
    Ok(())
}

/// Walks the PRPs of a `len`-byte transfer and translates every segment
/// into `out` (cleared first). On error nothing has been transferred.
///
/// The one-page case (the common 4 KiB I/O: PRP1 alone, one translation,
/// no walk) is inlined into the caller; the walk is out of line (its
/// frame holds a PRP list chunk).
#[inline(always)]
pub(crate) fn map_prps(
    iommu: &Iommu,
    prp1: u64,
    prp2: u64,
    len: usize,
    page_size: usize,
    out: &mut Vec<Seg>,
) -> Result<(), PrpError> {
    out.clear();
    // The same checks the walker makes: PRP1 dword aligned, mapped.
    if len > 0 && len <= page_size - (prp1 as usize & (page_size - 1)) {
        if prp1 & 3 != 0 {
            return Err(PrpError::OffsetInvalid);
        }
        let ptr = iommu.translate(prp1, len).ok_or(PrpError::Unmapped)?;
        out.push(Seg {
            ptr: ptr.as_ptr(),
            len,
        });
        return Ok(());
    }
    map_prps_walk(iommu, prp1, prp2, len, page_size, out)
}

/// `map_prps` past one page: the PRP walk (`out` is empty).
#[inline(never)]
fn map_prps_walk(
    iommu: &Iommu,
    prp1: u64,
    prp2: u64,
    len: usize,
    page_size: usize,
    out: &mut Vec<Seg>,
) -> Result<(), PrpError> {
    prp::walk(
        prp1,
        prp2,
        len,
        page_size,
        |iova, buf| read_qwords(iommu, iova, buf),
        |mut iova, mut l| {
            while l > 0 {
                let (ptr, n) = iommu.translate_prefix(iova, l).ok_or(PrpError::Unmapped)?;
                debug_assert!(n > 0 && n <= l);
                out.push(Seg {
                    ptr: ptr.as_ptr(),
                    len: n,
                });
                iova = iova.checked_add(n as u64).ok_or(PrpError::Unmapped)?;
                l -= n;
            }
            Ok(())
        },
    )
}

/// Copies `src` into the segments (which must total at least `src.len()`).
pub(crate) fn copy_to_host(segs: &[Seg], mut src: &[u8]) {
    for s in segs {
        if src.is_empty() {
            break;
        }
        let n = s.len.min(src.len());
        // SAFETY: the segment is mapped (translated under the held lock) and
        // at least `n` bytes long; `src` is device memory, disjoint from it.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), s.ptr, n) };
        src = &src[n..];
    }
}
