//! DMA memory: host memory the controller can address, with its bus address
//! (IOVA).
//!
//! A `DmaBuffer` is allocated by a platform, which also registers it with the
//! device side (IOMMU mapping, or physical addresses for UIO). Its IOVA is
//! either contiguous (`iova + offset`) or, where the platform could only get
//! scattered 4 KiB pages, a per-page table. Dropping the buffer hands it back
//! to the platform, which unmaps it from the device before freeing it.
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

/// Page granularity of per-page IOVA tables (and of the NVMe memory page
/// size pollux configures, CC.MPS = 0).
pub const PAGE_SIZE: usize = 4096;
pub const PAGE_SHIFT: u32 = 12;

/// How a platform takes a buffer back.
///
/// Release must be safe while the device may still transfer to or from
/// the memory: the core drops the buffers of commands a controller may
/// still run (a queue pair dropped after its deletion failed; a controller
/// that failed without confirming it stopped), and so may any owner of a
/// `DmaBuffer`. With an IOMMU: unmap it from the device first, then free
/// it (VFIO, the emulated controller); if the unmap fails, leak it.
/// Without one (UIO): keep it, handed out to nobody, until the device can
/// no longer reach it (bus mastering switched off), then free it.
pub trait DmaRelease: Send + Sync {
    /// Unmap from the device, then free (or keep: see above). Called once,
    /// from `DmaBuffer::drop`.
    fn release(&self, ptr: NonNull<u8>, len: usize, iova: u64);
}

/// Bus addresses of a buffer.
#[derive(Clone, Debug)]
pub enum Iova {
    /// `base + offset` for every byte.
    Contiguous(u64),
    /// One bus address per 4 KiB page of the buffer.
    Pages(Arc<[u64]>),
}

/// A DMA-capable buffer. Send, and Sync for reads; writes need `&mut`.
///
/// Contract with the device: while a command that transfers into or out of
/// this buffer is outstanding, its contents are unspecified to the host. If
/// the buffer is dropped while such a command is outstanding, the platform
/// unmaps it first, so the device can no longer reach the memory (with an
/// IOMMU) and the command fails; without an IOMMU it keeps the memory
/// until the device can no longer reach it (see `DmaRelease`).
pub struct DmaBuffer {
    ptr: NonNull<u8>,
    len: usize,
    iova: Iova,
    owner: Arc<dyn DmaRelease>,
}

// SAFETY: the buffer owns its memory; shared access only reads.
unsafe impl Send for DmaBuffer {}
// SAFETY: &DmaBuffer only gives read access.
unsafe impl Sync for DmaBuffer {}

impl DmaBuffer {
    /// # Safety
    /// `ptr..ptr+len` must be valid, exclusively owned memory, `iova` its
    /// correct bus addresses (a `Pages` table must cover every 4 KiB page),
    /// and `owner.release` must be the right way to give it back, safe
    /// even while the device still transfers (see `DmaRelease`).
    pub unsafe fn from_raw(
        ptr: NonNull<u8>,
        len: usize,
        iova: Iova,
        owner: Arc<dyn DmaRelease>,
    ) -> Self {
        if let Iova::Pages(p) = &iova {
            assert!(p.len() * PAGE_SIZE >= len, "IOVA page table too short");
            // PRP entries after the first must be page aligned; with aligned
            // pages that holds for any slice of the buffer.
            assert!(
                p.iter().all(|a| a % PAGE_SIZE as u64 == 0),
                "IOVA pages must be 4 KiB aligned"
            );
        }
        DmaBuffer {
            ptr,
            len,
            iova,
            owner,
        }
    }

    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn iova(&self) -> &Iova {
        &self.iova
    }

    /// True if the whole buffer is one range of bus addresses (always for
    /// `Iova::Contiguous`; for a page table, when its pages follow each other).
    pub fn is_iova_contiguous(&self) -> bool {
        match &self.iova {
            Iova::Contiguous(_) => true,
            Iova::Pages(p) => p.windows(2).all(|w| w[1] == w[0] + PAGE_SIZE as u64),
        }
    }

    /// Bus address of the byte at `off` (which must be < len).
    #[inline(always)]
    pub fn iova_at(&self, off: usize) -> u64 {
        debug_assert!(off < self.len.max(1));
        match &self.iova {
            Iova::Contiguous(base) => base + off as u64,
            Iova::Pages(p) => p[off >> PAGE_SHIFT] + (off & (PAGE_SIZE - 1)) as u64,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: valid for len bytes (constructor contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: valid and exclusively owned for len bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The whole buffer as an I/O target.
    #[inline]
    pub fn full(&self) -> DmaSlice<'_> {
        self.slice(0..self.len)
    }

    /// Part of the buffer as an I/O target. Panics if out of bounds.
    #[inline]
    pub fn slice(&self, r: Range<usize>) -> DmaSlice<'_> {
        assert!(
            r.start <= r.end && r.end <= self.len,
            "slice {r:?} out of bounds ({})",
            self.len
        );
        match &self.iova {
            Iova::Contiguous(b) => DmaSlice {
                iova0: b + r.start as u64,
                len: r.end - r.start,
                pages: None,
            },
            Iova::Pages(p) => DmaSlice {
                iova0: if r.start < self.len {
                    self.iova_at(r.start)
                } else {
                    0
                },
                len: r.end - r.start,
                pages: Some((p, r.start)),
            },
        }
    }
}

impl Drop for DmaBuffer {
    fn drop(&mut self) {
        let base = match &self.iova {
            Iova::Contiguous(b) => *b,
            Iova::Pages(p) => p.first().copied().unwrap_or(0),
        };
        self.owner.release(self.ptr, self.len, base);
    }
}

impl std::fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("iova", &self.iova_at(0))
            .finish()
    }
}

/// A byte range of a `DmaBuffer`, the data of one I/O request. Carries the
/// bus address of its first byte, so the common case (one page, contiguous
/// bus addresses) needs no further lookup.
#[derive(Clone, Copy, Debug)]
pub struct DmaSlice<'a> {
    iova0: u64,
    len: usize,
    /// Per-page table and the slice's offset in the buffer, if the buffer's
    /// bus addresses are scattered.
    pages: Option<(&'a Arc<[u64]>, usize)>,
}

impl<'a> DmaSlice<'a> {
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Bus address of the first byte.
    #[inline(always)]
    pub fn iova0(&self) -> u64 {
        self.iova0
    }
    /// Bus address of byte `i` of the slice.
    #[inline(always)]
    pub fn iova_at(&self, i: usize) -> u64 {
        match self.pages {
            None => self.iova0 + i as u64,
            Some((p, off)) => {
                let o = off + i;
                p[o >> PAGE_SHIFT] + (o & (PAGE_SIZE - 1)) as u64
            }
        }
    }
    #[inline(always)]
    pub fn is_contiguous(&self) -> bool {
        self.pages.is_none()
    }
    /// Detaches the slice from the borrow, for requests that wait in the
    /// software queue. The caller keeps the buffer alive until completion
    /// (the same contract as any in-flight DMA).
    pub(crate) fn to_owned_ref(self) -> SliceRef {
        match self.pages {
            None => SliceRef {
                iova: Iova::Contiguous(self.iova0),
                off: 0,
                len: self.len,
            },
            Some((p, off)) => SliceRef {
                iova: Iova::Pages(p.clone()),
                off,
                len: self.len,
            },
        }
    }
}

/// A slice's bus addresses without the borrow (see `DmaSlice::to_owned_ref`).
#[derive(Clone, Debug)]
pub(crate) struct SliceRef {
    iova: Iova,
    off: usize,
    pub(crate) len: usize,
}

impl SliceRef {
    #[inline]
    pub(crate) fn iova_at(&self, i: usize) -> u64 {
        let o = self.off + i;
        match &self.iova {
            Iova::Contiguous(b) => b + o as u64,
            Iova::Pages(p) => p[o >> PAGE_SHIFT] + (o & (PAGE_SIZE - 1)) as u64,
        }
    }
}

/// An owned I/O buffer: a byte range of a `DmaBuffer`, handed to the queue
/// pair with a request and handed back in its `Completion` (tokio-uring's
/// model). While the request is in flight the queue pair owns it, so its
/// bytes are unreachable from safe code while the device may write them;
/// holding an `IoBuf` means no device access is pending on it.
///
/// One allocation can be cut into several `IoBuf`s (`split_at`, `chunks`),
/// each reaching only its own, disjoint range: several requests can be in
/// flight on one allocation. The allocation is freed (and unmapped from the
/// device) when the last piece is dropped.
///
/// A thin handle (one pointer): moving it into the queue pair and back
/// costs a store and a load per I/O.
pub struct IoBuf(Box<IoBufInner>);

struct IoBufInner {
    mem: Arc<DmaBuffer>,
    off: usize,
    len: usize,
    /// Bus address of the first byte (0 for an empty buffer).
    iova0: u64,
    /// The allocation's bus addresses are one range (no page table).
    contiguous: bool,
}

impl IoBuf {
    /// The whole buffer.
    pub fn new(buf: DmaBuffer) -> IoBuf {
        let len = buf.len();
        IoBuf::piece(Arc::new(buf), 0, len)
    }

    fn piece(mem: Arc<DmaBuffer>, off: usize, len: usize) -> IoBuf {
        let iova0 = if len > 0 { mem.iova_at(off) } else { 0 };
        let contiguous = matches!(mem.iova, Iova::Contiguous(_));
        IoBuf(Box::new(IoBufInner {
            mem,
            off,
            len,
            iova0,
            contiguous,
        }))
    }

    #[inline(always)]
    pub fn len(&self) -> usize {
        self.0.len
    }

    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The bytes of this range.
    pub fn as_slice(&self) -> &[u8] {
        let i = &*self.0;
        // SAFETY: off + len <= the allocation's length (kept by every
        // constructor); no other IoBuf reaches this range (pieces are
        // disjoint by construction) and the DmaBuffer itself is private, so
        // nothing writes it while this shared borrow lives; no device
        // access is pending (the queue pair owns an IoBuf while it is).
        unsafe { std::slice::from_raw_parts(i.mem.as_ptr().add(i.off), i.len) }
    }

    /// The bytes of this range, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let i = &*self.0;
        // SAFETY: as in `as_slice`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(i.mem.as_ptr().add(i.off), i.len) }
    }

    /// Cuts the range in two at `mid` (panics if `mid > len`).
    pub fn split_at(self, mid: usize) -> (IoBuf, IoBuf) {
        let i = *self.0;
        assert!(mid <= i.len, "split at {mid} past the end ({})", i.len);
        let tail = IoBuf::piece(i.mem.clone(), i.off + mid, i.len - mid);
        (IoBuf::piece(i.mem, i.off, mid), tail)
    }

    /// Cuts the range into pieces of `size` bytes (the last may be shorter).
    pub fn chunks(self, size: usize) -> Vec<IoBuf> {
        assert!(size > 0, "chunk size 0");
        let i = *self.0;
        (0..i.len)
            .step_by(size)
            .map(|o| IoBuf::piece(i.mem.clone(), i.off + o, size.min(i.len - o)))
            .collect()
    }

    /// The first `len` bytes only (the rest stays unreachable through this
    /// handle; panics if `len` exceeds the current length).
    pub fn truncate(self, len: usize) -> IoBuf {
        self.split_at(len).0
    }

    /// The bus addresses of the range, for a submission.
    #[inline(always)]
    pub fn dma_slice(&self) -> DmaSlice<'_> {
        self.0.dma_slice()
    }

    /// Bus address of the first byte (0 for an empty buffer).
    #[inline(always)]
    pub(crate) fn iova0(&self) -> u64 {
        self.0.iova0
    }

    /// The bus addresses of the range, looked up only when asked for: a
    /// submission that fits in the first page asks for none (where
    /// `dma_slice` tests which kind of buffer this is for every one).
    #[inline(always)]
    pub(crate) fn iova(&self) -> BufIova<'_> {
        BufIova(&self.0)
    }

    /// True if both handles are the same piece.
    pub fn same(&self, other: &IoBuf) -> bool {
        std::ptr::eq(&*self.0, &*other.0)
    }
}

/// The bus addresses of an [`IoBuf`] (see [`IoBuf::iova`]): a reference to
/// the buffer's description, so it can be moved into a closure without
/// putting the `IoBuf` handle itself in memory.
#[derive(Clone, Copy)]
pub(crate) struct BufIova<'a>(&'a IoBufInner);

impl BufIova<'_> {
    /// Bus address of byte `i` of the range.
    #[inline(always)]
    pub(crate) fn at(self, i: usize) -> u64 {
        self.0.dma_slice().iova_at(i)
    }
}

impl IoBufInner {
    #[inline(always)]
    fn dma_slice(&self) -> DmaSlice<'_> {
        let i = self;
        if i.contiguous {
            return DmaSlice {
                iova0: i.iova0,
                len: i.len,
                pages: None,
            };
        }
        match &i.mem.iova {
            Iova::Pages(p) => DmaSlice {
                iova0: i.iova0,
                len: i.len,
                pages: Some((p, i.off)),
            },
            Iova::Contiguous(_) => DmaSlice {
                iova0: i.iova0,
                len: i.len,
                pages: None,
            },
        }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("off", &self.0.off)
            .field("len", &self.0.len)
            .field("iova0", &self.0.iova0)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Frees what `scattered` allocated.
    struct Freed;

    impl DmaRelease for Freed {
        fn release(&self, ptr: NonNull<u8>, len: usize, _iova: u64) {
            let mem = std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len);
            // SAFETY: `scattered` made it with `Box::into_raw` of a boxed
            // slice of `len` bytes; released once.
            drop(unsafe { Box::from_raw(mem) });
        }
    }

    /// A buffer of `pages.len()` pages at those (made-up) bus addresses.
    fn scattered(pages: &[u64]) -> DmaBuffer {
        let len = pages.len() * PAGE_SIZE;
        let mem = Box::into_raw(vec![0u8; len].into_boxed_slice());
        let ptr = NonNull::new(mem.cast::<u8>()).expect("boxed slice is non-null");
        // SAFETY: `len` bytes owned by this buffer alone, freed by `Freed`;
        // no device ever sees the addresses.
        unsafe { DmaBuffer::from_raw(ptr, len, Iova::Pages(pages.into()), Arc::new(Freed)) }
    }

    /// The addresses an owned buffer's submission looks up past the first
    /// page (`IoBuf::iova`, only then) are its `dma_slice`'s: scattered
    /// pages, pieces at offsets inside a page, and a contiguous buffer.
    #[test]
    fn iobuf_iova_is_its_dma_slice() {
        let pages = [0x7000u64, 0x2000, 0x9000];
        let pieces = IoBuf::new(scattered(&pages)).chunks(3000);
        assert_eq!(pieces.len(), 5);
        for b in &pieces {
            let d = b.dma_slice();
            assert_eq!(b.iova0(), d.iova0());
            for i in [0, 1, b.len() / 2, b.len() - 1] {
                assert_eq!(b.iova().at(i), d.iova_at(i), "byte {i} of {b:?}");
            }
        }
        // The second piece starts at 3000: its byte 1096 is the first of
        // the second page.
        assert_eq!(pieces[1].iova0(), 0x7000 + 3000);
        assert_eq!(pieces[1].iova().at(1095), 0x7000 + 4095);
        assert_eq!(pieces[1].iova().at(1096), 0x2000);
        assert_eq!(pieces[3].iova().at(100), 0x9000 + 9000 + 100 - 2 * 4096);

        let len = 2 * PAGE_SIZE;
        let mem = Box::into_raw(vec![0u8; len].into_boxed_slice());
        let ptr = NonNull::new(mem.cast::<u8>()).expect("boxed slice is non-null");
        // SAFETY: as in `scattered`.
        let flat =
            unsafe { DmaBuffer::from_raw(ptr, len, Iova::Contiguous(0x40000), Arc::new(Freed)) };
        let (_, b) = IoBuf::new(flat).split_at(10);
        assert_eq!(b.iova0(), 0x4000a);
        assert_eq!(b.iova().at(5000), 0x4000a + 5000);
        assert_eq!(b.iova().at(5000), b.dma_slice().iova_at(5000));
    }
}
