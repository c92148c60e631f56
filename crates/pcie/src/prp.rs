//! PRP construction (NVMe 2.0 base spec §4.1.1).
//!
//! PRP1 is the bus address of the first byte (any dword-aligned offset).
//! If the transfer ends in the first page, PRP2 is unused; if it ends in the
//! second page, PRP2 is that page; otherwise PRP2 points to a PRP list whose
//! entries are the remaining pages, all page aligned.
//!
//! List memory: each tracker owns a fixed slice of one per-queue-pair DMA
//! allocation, sized for the largest transfer one command may carry
//! (`max_transfer / page + 1` entries, rounded up to a power of two, at most
//! one 4 KiB page so a list never has to chain). With the common 128 KiB
//! MDTS that is 256 B per tracker instead of a 4 KiB page each (SPDK's
//! choice), so 1024 trackers take 256 KiB rather than 4 MiB, and the hot path
//! never allocates: the slice is found by index arithmetic from the CID.

/// Page size used for PRPs (CC.MPS = 0).
pub const PAGE: u64 = 4096;
const MASK: u64 = PAGE - 1;

/// The two PRP fields of a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prps {
    pub prp1: u64,
    pub prp2: u64,
    /// Entries written to the list (0 if no list).
    pub list_entries: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrpError {
    /// PRP1 not dword aligned.
    Unaligned,
    /// A page after the first is not page aligned (the buffer's bus
    /// addresses don't follow its pages).
    NotPageAligned,
    /// The transfer needs more list entries than the list holds.
    ListTooSmall { needed: usize, capacity: usize },
}

/// Number of PRP list entries a transfer of `len` bytes starting at bus
/// offset `first_off` (within its page) needs: 0 when PRP2 suffices.
#[inline]
pub fn list_entries_needed(first_off: u64, len: u64) -> usize {
    let first = PAGE - (first_off & MASK);
    if len <= first {
        return 0;
    }
    let rest = (len - first).div_ceil(PAGE);
    if rest == 1 {
        0
    } else {
        rest as usize
    }
}

/// Builds PRPs for `len` bytes (> 0) whose byte `i` is at bus address
/// `iova_at(i)`; `prp1` is `iova_at(0)`, passed in so the one-page case needs
/// no lookup. `list` receives the list entries; `list_iova` is its bus
/// address.
#[inline(always)]
pub fn build(
    len: usize,
    prp1: u64,
    iova_at: impl Fn(usize) -> u64,
    list: &mut [u64],
    list_iova: u64,
) -> Result<Prps, PrpError> {
    debug_assert!(len > 0);
    debug_assert_eq!(prp1, iova_at(0));
    if prp1 & 3 != 0 {
        return Err(PrpError::Unaligned);
    }
    let first = (PAGE - (prp1 & MASK)) as usize;
    if len <= first {
        return Ok(Prps {
            prp1,
            prp2: 0,
            list_entries: 0,
        });
    }
    let rest = (len - first).div_ceil(PAGE as usize);
    if rest == 1 {
        let p2 = iova_at(first);
        if p2 & MASK != 0 {
            return Err(PrpError::NotPageAligned);
        }
        return Ok(Prps {
            prp1,
            prp2: p2,
            list_entries: 0,
        });
    }
    if rest > list.len() {
        return Err(PrpError::ListTooSmall {
            needed: rest,
            capacity: list.len(),
        });
    }
    for (k, e) in list[..rest].iter_mut().enumerate() {
        let a = iova_at(first + k * PAGE as usize);
        if a & MASK != 0 {
            return Err(PrpError::NotPageAligned);
        }
        *e = a;
    }
    Ok(Prps {
        prp1,
        prp2: list_iova,
        list_entries: rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Walks PRPs the way a controller does and returns the bus byte ranges.
    fn walk(p: &Prps, len: usize, list: &[u64]) -> Vec<(u64, u64)> {
        let mut out = vec![];
        let first = (PAGE - (p.prp1 & MASK)).min(len as u64);
        out.push((p.prp1, first));
        let mut left = len as u64 - first;
        if left == 0 {
            return out;
        }
        if left <= PAGE {
            out.push((p.prp2, left));
            return out;
        }
        for &e in &list[..p.list_entries] {
            let n = left.min(PAGE);
            out.push((e, n));
            left -= n;
        }
        assert_eq!(left, 0);
        out
    }

    #[test]
    fn one_page() {
        let mut l = [0u64; 4];
        let p = build(4096, 0x10000, |i| 0x10000 + i as u64, &mut l, 0x9000).unwrap();
        assert_eq!(
            p,
            Prps {
                prp1: 0x10000,
                prp2: 0,
                list_entries: 0
            }
        );
    }

    #[test]
    fn two_pages_and_offset() {
        let mut l = [0u64; 4];
        let p = build(8192, 0x10000, |i| 0x10000 + i as u64, &mut l, 0x9000).unwrap();
        assert_eq!(
            p,
            Prps {
                prp1: 0x10000,
                prp2: 0x11000,
                list_entries: 0
            }
        );
        // 4 KiB starting 512 bytes into a page spans two pages.
        let p = build(4096, 0x10200, |i| 0x10200 + i as u64, &mut l, 0x9000).unwrap();
        assert_eq!(
            p,
            Prps {
                prp1: 0x10200,
                prp2: 0x11000,
                list_entries: 0
            }
        );
    }

    #[test]
    fn list_for_three_pages() {
        let mut l = [0u64; 4];
        let p = build(12288, 0x10000, |i| 0x10000 + i as u64, &mut l, 0x9000).unwrap();
        assert_eq!(p.prp2, 0x9000);
        assert_eq!(&l[..2], &[0x11000, 0x12000]);
    }

    #[test]
    fn errors() {
        let mut l = [0u64; 2];
        assert_eq!(
            build(512, 0x10002, |i| 0x10002 + i as u64, &mut l, 0),
            Err(PrpError::Unaligned)
        );
        assert_eq!(
            build(5 * 4096, 0x10000, |i| 0x10000 + i as u64, &mut l, 0),
            Err(PrpError::ListTooSmall {
                needed: 4,
                capacity: 2
            })
        );
        // Second page not page aligned: bus addresses that don't follow pages.
        assert_eq!(
            build(
                8192,
                0x10000,
                |i| if i < 4096 {
                    0x10000 + i as u64
                } else {
                    0x20010
                },
                &mut l,
                0
            ),
            Err(PrpError::NotPageAligned)
        );
    }

    proptest! {
        /// Any dword-aligned start and any length up to 2 MiB: the PRPs a
        /// controller would walk cover exactly the buffer's bus bytes, in
        /// order, and list_entries_needed agrees with build.
        #[test]
        fn prps_cover_exactly(start in 0u64..(1 << 20), len in 1usize..(2 << 20), scattered in any::<bool>()) {
            let start = start & !3;
            let base = 0x1_0000_0000u64 + start;
            // Scattered: every page lands somewhere else (as with UIO 4K pages).
            let iova_at = |i: usize| {
                let o = (base & MASK) + i as u64;
                let page = o / PAGE;
                let pbase = if scattered { 0x7_0000_0000 + (page * 7919 % 4093) * PAGE * 3 } else { (base & !MASK) + page * PAGE };
                pbase + (o & MASK)
            };
            let mut list = vec![0u64; 513];
            let p = build(len, iova_at(0), iova_at, &mut list, 0xABC000).unwrap();
            prop_assert_eq!(p.list_entries, list_entries_needed(start, len as u64));
            let segs = walk(&p, len, &list);
            let mut off = 0usize;
            for (a, n) in segs {
                prop_assert_eq!(a, iova_at(off));
                // Within a segment bytes are contiguous on the bus.
                prop_assert_eq!(a + n - 1, iova_at(off + n as usize - 1));
                off += n as usize;
            }
            prop_assert_eq!(off, len);
        }
    }
}
