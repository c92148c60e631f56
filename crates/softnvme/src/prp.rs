//! PRP walking (NVMe 2.0 base spec §4.1.1): turns PRP1/PRP2 and a transfer
//! length into a sequence of contiguous `(iova, len)` segments.
//!
//! The walker is pure: it never touches memory itself. PRP list entries are
//! obtained through a caller-supplied `read_list` callback (which does the
//! IOMMU-checked read) and segments are handed to `emit`. Physically adjacent
//! pages are merged into one segment. Work is bounded by `len / page_size`
//! list entries: a hostile list (cycles, bogus chain pointers) cannot make it
//! loop, because every list page after the first holds `page_size / 8 - 1`
//! data entries and the number of data entries is fixed by `len`.
//!
//! Rules enforced (PRP Offset Invalid otherwise):
//! * PRP1 may carry a page offset but must be dword aligned;
//! * PRP2, when it is the second data page, must have a zero offset;
//! * PRP2, when it is a list pointer, may carry an offset but must be qword
//!   aligned (caveat: the spec only says dword; list entries are qwords);
//! * every list entry — data page or chain pointer — must have a zero offset.
use pollux_spec::status::{generic, Status};

/// Why a PRP walk failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrpError {
    /// An entry has an offset where the spec forbids one.
    OffsetInvalid,
    /// A list page or data page is not reachable through the IOMMU.
    Unmapped,
}

impl PrpError {
    /// The completion status this error maps to.
    pub const fn status(self) -> Status {
        match self {
            PrpError::OffsetInvalid => Status::generic(generic::PRP_OFFSET_INVALID),
            PrpError::Unmapped => Status::generic(generic::DATA_TRANSFER_ERROR),
        }
    }
}

/// List entries read per `read_list` call.
const CHUNK: usize = 64;

/// Accumulates adjacent pages into one segment before emitting it.
struct Merger<E> {
    cur: Option<(u64, usize)>,
    emit: E,
}

impl<E: FnMut(u64, usize) -> Result<(), PrpError>> Merger<E> {
    #[inline]
    fn push(&mut self, iova: u64, len: usize) -> Result<(), PrpError> {
        debug_assert!(len > 0);
        match &mut self.cur {
            Some((start, l)) if start.checked_add(*l as u64) == Some(iova) => {
                *l += len;
                Ok(())
            }
            Some(prev) => {
                let (s, l) = *prev;
                *prev = (iova, len);
                (self.emit)(s, l)
            }
            None => {
                self.cur = Some((iova, len));
                Ok(())
            }
        }
    }

    #[inline]
    fn finish(mut self) -> Result<(), PrpError> {
        match self.cur.take() {
            Some((s, l)) => (self.emit)(s, l),
            None => Ok(()),
        }
    }
}

/// Walks the PRPs of a `len`-byte transfer with memory page size
/// `page_size` (a power of two, at least 4 KiB).
///
/// `read_list(iova, out)` must fill `out` with the little-endian qwords at
/// `iova` (never crossing a page: the walker guarantees it). `emit(iova, len)`
/// receives the segments in transfer order; their lengths sum to `len`.
/// A zero `len` emits nothing and ignores both PRPs.
pub fn walk<R, E>(
    prp1: u64,
    prp2: u64,
    len: usize,
    page_size: usize,
    mut read_list: R,
    emit: E,
) -> Result<(), PrpError>
where
    R: FnMut(u64, &mut [u64]) -> Result<(), PrpError>,
    E: FnMut(u64, usize) -> Result<(), PrpError>,
{
    debug_assert!(page_size.is_power_of_two() && page_size >= 4096);
    if len == 0 {
        return Ok(());
    }
    let mask = page_size as u64 - 1;
    if prp1 & 3 != 0 {
        return Err(PrpError::OffsetInvalid);
    }
    let mut m = Merger { cur: None, emit };
    let first = len.min(page_size - (prp1 & mask) as usize);
    m.push(prp1, first)?;
    let mut remaining = len - first;
    if remaining == 0 {
        return m.finish();
    }
    if remaining <= page_size {
        if prp2 & mask != 0 {
            return Err(PrpError::OffsetInvalid);
        }
        m.push(prp2, remaining)?;
        return m.finish();
    }
    // PRP2 is a list pointer.
    if prp2 & 7 != 0 {
        return Err(PrpError::OffsetInvalid);
    }
    let mut list = prp2;
    let mut needed = remaining.div_ceil(page_size);
    let mut buf = [0u64; CHUNK];
    loop {
        let in_page = (page_size - (list & mask) as usize) / 8;
        debug_assert!(in_page >= 1);
        // When more entries are needed than fit, the last one chains.
        let data_here = if needed > in_page {
            in_page - 1
        } else {
            needed
        };
        let mut i = 0;
        while i < data_here {
            let n = (data_here - i).min(CHUNK);
            let at = list.checked_add(i as u64 * 8).ok_or(PrpError::Unmapped)?;
            read_list(at, &mut buf[..n])?;
            for &e in &buf[..n] {
                if e & mask != 0 {
                    return Err(PrpError::OffsetInvalid);
                }
                let l = remaining.min(page_size);
                m.push(e, l)?;
                remaining -= l;
            }
            i += n;
        }
        needed -= data_here;
        if needed == 0 {
            break;
        }
        let at = list
            .checked_add(data_here as u64 * 8)
            .ok_or(PrpError::Unmapped)?;
        read_list(at, &mut buf[..1])?;
        if buf[0] & mask != 0 {
            return Err(PrpError::OffsetInvalid);
        }
        list = buf[0];
    }
    debug_assert_eq!(remaining, 0);
    m.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    type Mem = HashMap<u64, u64>;

    fn run(
        prp1: u64,
        prp2: u64,
        len: usize,
        ps: usize,
        mem: &Mem,
    ) -> Result<Vec<(u64, usize)>, PrpError> {
        let mut out = Vec::new();
        walk(
            prp1,
            prp2,
            len,
            ps,
            |iova, buf| {
                for (i, b) in buf.iter_mut().enumerate() {
                    let a = iova + i as u64 * 8;
                    // The walker must never read across a page.
                    assert_eq!(a / ps as u64, iova / ps as u64, "list read crosses a page");
                    *b = *mem.get(&a).ok_or(PrpError::Unmapped)?;
                }
                Ok(())
            },
            |iova, l| {
                out.push((iova, l));
                Ok(())
            },
        )?;
        Ok(out)
    }

    fn merge(v: &[(u64, usize)]) -> Vec<(u64, usize)> {
        let mut out: Vec<(u64, usize)> = Vec::new();
        for &(a, l) in v {
            if let Some(last) = out.last_mut() {
                if last.0 + last.1 as u64 == a {
                    last.1 += l;
                    continue;
                }
            }
            out.push((a, l));
        }
        out
    }

    /// Builds the PRPs the way a host driver does. `pages[0]` carries
    /// `off`; list pages come from `lists`, the first at `list_off`.
    fn build(
        pages: &[u64],
        off: u64,
        len: usize,
        ps: usize,
        lists: &[u64],
        list_off: u64,
    ) -> (u64, u64, Mem, Vec<(u64, usize)>) {
        let prp1 = pages[0] + off;
        let first = len.min(ps - off as usize);
        let mut expect = vec![(prp1, first)];
        let mut rem = len - first;
        let mut data = Vec::new();
        let mut i = 1;
        while rem > 0 {
            let l = rem.min(ps);
            expect.push((pages[i], l));
            data.push(pages[i]);
            rem -= l;
            i += 1;
        }
        let mut mem = Mem::new();
        let prp2 = match data.len() {
            0 => 0,
            1 => data[0],
            _ => {
                let mut li = 0;
                let mut at = lists[0] + list_off;
                let mut k = 0;
                while k < data.len() {
                    let last_slot = (at + 8).is_multiple_of(ps as u64);
                    if last_slot && data.len() - k > 1 {
                        li += 1;
                        mem.insert(at, lists[li]);
                        at = lists[li];
                        continue;
                    }
                    mem.insert(at, data[k]);
                    at += 8;
                    k += 1;
                }
                lists[0] + list_off
            }
        };
        (prp1, prp2, mem, merge(&expect))
    }

    #[test]
    fn single_page_with_offset() {
        let m = Mem::new();
        assert_eq!(
            run(0x1_0200, 0xdead, 512, 4096, &m),
            Ok(vec![(0x1_0200, 512)])
        );
    }

    #[test]
    fn zero_length_ignores_prps() {
        assert_eq!(run(3, 5, 0, 4096, &Mem::new()), Ok(vec![]));
    }

    #[test]
    fn two_pages_use_prp2_directly() {
        let m = Mem::new();
        assert_eq!(
            run(0x1000, 0x9000, 8192, 4096, &m),
            Ok(vec![(0x1000, 4096), (0x9000, 4096)])
        );
        // Adjacent pages merge.
        assert_eq!(
            run(0x1800, 0x2000, 4096, 4096, &m),
            Ok(vec![(0x1800, 4096)])
        );
    }

    #[test]
    fn offsets_are_checked() {
        let m = Mem::new();
        assert_eq!(run(0x1002, 0, 512, 4096, &m), Err(PrpError::OffsetInvalid));
        assert_eq!(
            run(0x1000, 0x9200, 8192, 4096, &m),
            Err(PrpError::OffsetInvalid)
        );
        assert_eq!(
            run(0x1000, 0x9004, 16384, 4096, &m),
            Err(PrpError::OffsetInvalid)
        );
        let mut m = Mem::new();
        m.insert(0x9000, 0x3000);
        m.insert(0x9008, 0x4010);
        m.insert(0x9010, 0x5000);
        assert_eq!(
            run(0x1000, 0x9000, 16384, 4096, &m),
            Err(PrpError::OffsetInvalid)
        );
    }

    #[test]
    fn unreadable_list_is_unmapped() {
        assert_eq!(
            run(0x1000, 0x9000, 16384, 4096, &Mem::new()),
            Err(PrpError::Unmapped)
        );
    }

    #[test]
    fn chained_list_one_mib() {
        // 256 scattered pages; the list starts 16 bytes before the end of
        // its page, so it chains almost at once, then again after 511.
        let pages: Vec<u64> = (0..257).map(|i| 0x100_0000 + i * 0x2000).collect();
        let lists = [0x10_0000, 0x20_0000, 0x30_0000];
        let (p1, p2, mem, expect) = build(&pages, 0, 1 << 20, 4096, &lists, 4096 - 16);
        let got = run(p1, p2, 1 << 20, 4096, &mem).unwrap();
        assert_eq!(got, expect);
        assert_eq!(got.iter().map(|s| s.1).sum::<usize>(), 1 << 20);
    }

    proptest! {
        #[test]
        fn walk_matches_host_layout(
            ps_shift in 0u32..3,
            len_dw in 1usize..(300 * 1024),
            off_dw in 0u64..1024,
            contiguous in proptest::bool::ANY,
            list_off_q in 0u64..512,
            seed in 0u64..1_000_000,
        ) {
            let ps = 4096usize << (ps_shift * 2); // 4K, 16K, 64K
            let len = len_dw * 4;
            let off = (off_dw * 4) % ps as u64;
            let npages = (len + off as usize).div_ceil(ps) + 1;
            let pages: Vec<u64> = (0..npages as u64)
                .map(|i| if contiguous {
                    (1u64 << 40) + i * ps as u64
                } else {
                    (1u64 << 40) + ((i * 7919 + seed) % 100_003) * 2 * ps as u64 + i * ps as u64 * 300_000
                })
                .collect();
            let lists: Vec<u64> = (0..8).map(|i| (1u64 << 50) + i * ps as u64 * 3).collect();
            let list_off = (list_off_q * 8) % ps as u64;
            let (p1, p2, mem, expect) = build(&pages, off, len, ps, &lists, list_off);
            let got = run(p1, p2, len, ps, &mem).unwrap();
            prop_assert_eq!(got.iter().map(|s| s.1).sum::<usize>(), len);
            prop_assert_eq!(got, expect);
        }

        #[test]
        fn garbage_never_panics(
            prp1 in proptest::num::u64::ANY,
            prp2 in proptest::num::u64::ANY,
            len in 0usize..(2 << 20),
            fill in proptest::num::u64::ANY,
        ) {
            let mut n = 0usize;
            let r = walk(prp1, prp2, len, 4096, |_, buf| {
                n += buf.len();
                for b in buf.iter_mut() { *b = fill; }
                Ok(())
            }, |_, _| Ok(()));
            // Entries read are bounded by the page count of the transfer
            // (plus one chain pointer per list page).
            prop_assert!(n <= len / 4096 * 2 + 4);
            let _ = r;
        }
    }
}
