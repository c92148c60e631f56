//! The emulated IOMMU: which host memory the device may touch, and where.
//!
//! A sorted table of non-overlapping `(iova, len, host)` mappings, like
//! VFIO's type-1 IOMMU. The device translates every address the host hands
//! it (queue bases, PRPs, shadow doorbell pages) through this table and never
//! dereferences anything outside it. A translation succeeds only if the whole
//! `[iova, iova + len)` lies inside one mapping; the last hit is cached, so a
//! 4 KiB I/O into the same buffer region costs a single range check.
//!
//! Caveat: the table lives inside the controller lock, so mapping and
//! unmapping serialise with `step()` — which is exactly what makes
//! `dma_unmap` a barrier.
use std::cell::Cell;
use std::ptr::NonNull;

use crate::SoftError;

/// Most mappings one device accepts.
pub const MAX_MAPPINGS: usize = 1 << 16;
/// Mapping granularity.
pub const IOMMU_PAGE: u64 = 4096;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Mapping {
    pub iova: u64,
    pub len: u64,
    pub host: NonNull<u8>,
}

impl Mapping {
    /// `[iova, iova + len)` lies inside this mapping (`len` > 0).
    #[inline(always)]
    fn contains(&self, iova: u64, len: u64) -> bool {
        let off = iova.wrapping_sub(self.iova);
        iova >= self.iova && off < self.len && len <= self.len - off
    }

    /// `[iova, iova + len)` intersects this mapping.
    pub fn intersects(&self, iova: u64, len: u64) -> bool {
        iova < self.iova.saturating_add(self.len) && self.iova < iova.saturating_add(len)
    }
}

#[derive(Debug, Default)]
pub(crate) struct Iommu {
    maps: Vec<Mapping>,
    last: Cell<usize>,
}

impl Iommu {
    /// Adds a mapping (the caller vouches for the host memory).
    pub fn map(&mut self, iova: u64, host: NonNull<u8>, len: usize) -> Result<(), SoftError> {
        let bad = |why| Err(SoftError::BadMapping { iova, len, why });
        if len == 0 {
            return bad("empty");
        }
        if !iova.is_multiple_of(IOMMU_PAGE) || !(len as u64).is_multiple_of(IOMMU_PAGE) {
            return bad("iova and len must be 4 KiB aligned");
        }
        if !(host.as_ptr() as usize).is_multiple_of(IOMMU_PAGE as usize) {
            return bad("host address must be 4 KiB aligned");
        }
        if iova.checked_add(len as u64).is_none()
            || (host.as_ptr() as usize).checked_add(len).is_none()
        {
            return bad("range wraps around");
        }
        if self.maps.len() >= MAX_MAPPINGS {
            return Err(SoftError::TooManyMappings(MAX_MAPPINGS));
        }
        let idx = self.maps.partition_point(|m| m.iova < iova);
        let len64 = len as u64;
        let clash = |i: usize| self.maps.get(i).is_some_and(|m| m.intersects(iova, len64));
        if clash(idx) || (idx > 0 && clash(idx - 1)) {
            return Err(SoftError::Overlap { iova, len });
        }
        self.maps.insert(
            idx,
            Mapping {
                iova,
                len: len64,
                host,
            },
        );
        self.last.set(idx);
        debug_assert!(self
            .maps
            .windows(2)
            .all(|w| w[0].iova + w[0].len <= w[1].iova));
        Ok(())
    }

    /// Removes the mapping that starts at `iova`.
    pub fn unmap(&mut self, iova: u64) -> Result<Mapping, SoftError> {
        let idx = self
            .maps
            .binary_search_by_key(&iova, |m| m.iova)
            .map_err(|_| SoftError::NotMapped(iova))?;
        self.last.set(0);
        Ok(self.maps.remove(idx))
    }

    /// Host address of `[iova, iova + len)`, if it lies in one mapping.
    /// `len` 0 is treated as 1.
    #[inline]
    pub fn translate(&self, iova: u64, len: usize) -> Option<NonNull<u8>> {
        let len = (len as u64).max(1);
        let i = self.last.get();
        if let Some(m) = self.maps.get(i) {
            if m.contains(iova, len) {
                return Some(Self::host(m, iova));
            }
        }
        self.translate_slow(iova, len)
    }

    #[cold]
    fn translate_slow(&self, iova: u64, len: u64) -> Option<NonNull<u8>> {
        let idx = self
            .maps
            .partition_point(|m| m.iova <= iova)
            .checked_sub(1)?;
        let m = &self.maps[idx];
        if !m.contains(iova, len) {
            return None;
        }
        self.last.set(idx);
        Some(Self::host(m, iova))
    }

    /// Host address of `iova` and how many bytes (at most `len`) follow it
    /// inside the same mapping.
    #[inline]
    pub fn translate_prefix(&self, iova: u64, len: usize) -> Option<(NonNull<u8>, usize)> {
        if let Some(p) = self.translate(iova, len) {
            return Some((p, len));
        }
        let idx = self
            .maps
            .partition_point(|m| m.iova <= iova)
            .checked_sub(1)?;
        let m = &self.maps[idx];
        if !m.contains(iova, 1) {
            return None;
        }
        let avail = m.len - (iova - m.iova);
        Some((Self::host(m, iova), (len as u64).min(avail) as usize))
    }

    #[inline(always)]
    fn host(m: &Mapping, iova: u64) -> NonNull<u8> {
        // `contains` guarantees `iova - m.iova < m.len`, and `map` checked
        // that host + len does not wrap, so this stays inside the mapping.
        let off = (iova - m.iova) as usize;
        // SAFETY: in-bounds offset of a non-null pointer (see above); no
        // dereference happens here.
        unsafe { NonNull::new_unchecked(m.host.as_ptr().add(off)) }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.maps.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(addr: usize) -> NonNull<u8> {
        NonNull::new(addr as *mut u8).unwrap()
    }

    #[test]
    fn map_translate_unmap() {
        let mut io = Iommu::default();
        io.map(0x10000, fake(0x7000_0000), 0x4000).unwrap();
        io.map(0x1000, fake(0x8000_0000), 0x1000).unwrap();
        assert_eq!(
            io.translate(0x10010, 16).unwrap().as_ptr() as usize,
            0x7000_0010
        );
        assert_eq!(
            io.translate(0x1ff0, 16).unwrap().as_ptr() as usize,
            0x8000_0ff0
        );
        assert!(io.translate(0x1ff0, 17).is_none());
        assert!(io.translate(0x13ff0, 0x20).is_none());
        assert!(io.translate(0x0, 1).is_none());
        assert!(io.translate(u64::MAX, 2).is_none());
        assert_eq!(io.translate_prefix(0x13ff0, 0x20).unwrap().1, 0x10);
        assert!(matches!(
            io.map(0x13000, fake(0x9000_0000), 0x2000),
            Err(SoftError::Overlap { .. })
        ));
        assert!(matches!(
            io.map(0x0, fake(0x9000_0000), 0x2000),
            Err(SoftError::Overlap { .. })
        ));
        assert!(matches!(
            io.map(0x20001, fake(0x9000_0000), 0x2000),
            Err(SoftError::BadMapping { .. })
        ));
        io.unmap(0x10000).unwrap();
        assert!(io.translate(0x10010, 16).is_none());
        assert!(matches!(io.unmap(0x10000), Err(SoftError::NotMapped(_))));
        assert_eq!(io.len(), 1);
    }
}
