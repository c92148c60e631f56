//! Registered buffer regions: large host-memory regions buffers are
//! carved from, so that channels can register them with their rings.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pollux_nvme::dma::{DmaRelease, Iova};
use pollux_nvme::{DmaBuffer, IoBuf};

/// Most regions (the size of each ring's sparse buffer table).
pub(super) const MAX_REGIONS: usize = 64;
pub(super) const REGION_MIN: usize = 4 << 20;
/// The kernel's limit for one registered buffer.
pub(super) const REGION_MAX: usize = 1 << 30;

/// A published region, readable by channels without the lock.
#[derive(Default)]
pub(super) struct Span {
    pub(super) start: AtomicU64,
    pub(super) end: AtomicU64,
}

/// Large host-memory regions buffers are carved from, so that channels
/// can register them with their rings.
pub(crate) struct Pool {
    pub(super) spans: [Span; MAX_REGIONS],
    /// Regions published (their spans are written before this is raised).
    pub(super) count: AtomicUsize,
    /// Allocation granularity and alignment.
    pub(super) gran: usize,
    pub(super) inner: Mutex<PoolInner>,
}

pub(super) struct PoolInner {
    /// The mappings, kept until the pool is dropped.
    pub(super) maps: Vec<DmaBuffer>,
    /// Free ranges of each region, (offset, len), sorted by offset.
    pub(super) free: Vec<Vec<(usize, usize)>>,
    pub(super) total: usize,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// First fit in a sorted free list.
pub(super) fn take(free: &mut Vec<(usize, usize)>, need: usize) -> Option<usize> {
    let i = free.iter().position(|&(_, l)| l >= need)?;
    let (off, l) = free[i];
    if l == need {
        free.remove(i);
    } else {
        free[i] = (off + need, l - need);
    }
    Some(off)
}

/// Gives `[off, off + len)` back, merging with its neighbours.
pub(super) fn give(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
    let i = free.partition_point(|&(o, _)| o < off);
    free.insert(i, (off, len));
    if i + 1 < free.len() && free[i].0 + free[i].1 == free[i + 1].0 {
        free[i].1 += free[i + 1].1;
        free.remove(i + 1);
    }
    if i > 0 && free[i - 1].0 + free[i - 1].1 == free[i].0 {
        free[i - 1].1 += free[i].1;
        free.remove(i);
    }
}

impl Pool {
    pub(super) fn new(align: usize) -> Pool {
        Pool {
            spans: std::array::from_fn(|_| Span::default()),
            count: AtomicUsize::new(0),
            gran: align.max(4096),
            inner: Mutex::new(PoolInner {
                maps: Vec::new(),
                free: Vec::new(),
                total: 0,
            }),
        }
    }

    /// The published region `i`, `[start, end)`.
    pub(super) fn span(&self, i: usize) -> (u64, u64) {
        let s = &self.spans[i];
        (
            s.start.load(Ordering::Relaxed),
            s.end.load(Ordering::Relaxed),
        )
    }

    /// Regions published so far.
    pub(super) fn published(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// A buffer of `len` bytes from a region; None when it cannot come
    /// from one (empty, larger than a region, no region left).
    pub(super) fn alloc(self: &Arc<Self>, len: usize) -> std::io::Result<Option<IoBuf>> {
        if len == 0 || len > REGION_MAX {
            return Ok(None);
        }
        let need = len.next_multiple_of(self.gran);
        let mut g = lock(&self.inner);
        let mut hit = None;
        for r in 0..g.free.len() {
            if let Some(off) = take(&mut g.free[r], need) {
                hit = Some((r, off));
                break;
            }
        }
        if hit.is_none() {
            let r = g.maps.len();
            if r == MAX_REGIONS {
                return Ok(None);
            }
            let size = need
                .max(REGION_MIN)
                .max(g.total)
                .next_multiple_of(2 << 20)
                .min(REGION_MAX);
            let extra = if self.gran > 4096 { self.gran } else { 0 };
            let map = crate::mem::alloc_host(size + extra)?;
            let start = (map.as_ptr() as usize).next_multiple_of(self.gran);
            let s = &self.spans[r];
            s.start.store(start as u64, Ordering::Relaxed);
            s.end.store((start + size) as u64, Ordering::Relaxed);
            self.count.store(r + 1, Ordering::Release);
            g.maps.push(map);
            g.free.push(vec![(0, size)]);
            g.total += size;
            hit = take(&mut g.free[r], need).map(|off| (r, off));
        }
        let Some((r, off)) = hit else {
            return Ok(None);
        };
        let (start, _) = self.span(r);
        let p = (start as usize + off) as *mut u8;
        // SAFETY: [off, off + need) of region r was free: inside the
        // mapping (kept until the pool drops), reached by no other buffer.
        unsafe { std::ptr::write_bytes(p, 0, len) };
        let Some(ptr) = NonNull::new(p) else {
            return Ok(None);
        };
        let owner: Arc<dyn DmaRelease> = self.clone();
        // SAFETY: the range is exclusively this buffer's until `release`
        // gives it back to the free list; the pool (which keeps the
        // mapping) lives as long as `owner`; host memory's bus address is
        // its virtual address.
        let buf = unsafe { DmaBuffer::from_raw(ptr, len, Iova::Contiguous(p as u64), owner) };
        Ok(Some(IoBuf::new(buf)))
    }
}

impl DmaRelease for Pool {
    fn release(&self, ptr: NonNull<u8>, len: usize, _iova: u64) {
        let a = ptr.as_ptr() as usize as u64;
        let need = len.next_multiple_of(self.gran);
        let mut g = lock(&self.inner);
        for r in 0..g.maps.len() {
            let (start, end) = self.span(r);
            if (start..end).contains(&a) {
                give(&mut g.free[r], (a - start) as usize, need);
                return;
            }
        }
        tracing::error!(
            addr = a,
            len,
            "buffer returned to a pool that never made it"
        );
    }
}
