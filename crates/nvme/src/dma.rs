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
        let i = &*self.0;
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

    /// True if both handles are the same piece.
    pub fn same(&self, other: &IoBuf) -> bool {
        std::ptr::eq(&*self.0, &*other.0)
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
