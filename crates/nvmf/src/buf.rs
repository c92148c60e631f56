//! Data buffers of commands: page-aligned memory a command's data lives
//! in while it moves between the socket and the bdev.
//!
//! A buffer is either owned ([`AlignedBuf`], readable and writable
//! through safe slices) or lent ([`Lent`]) to something that touches it
//! behind the compiler's back — the bdev (a read or write in flight) or
//! the socket's send queue (until `sendmsg` copied it). A lent buffer has no accessor: it
//! can only be taken back with [`Lent::reclaim`], whose caller states
//! that the borrower is done. So no safe slice of memory under I/O exists.
use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use pollux_bdev::RawSeg;
use pollux_tcp::mapping::Mapping;

/// Alignment of every buffer: a page, which every bdev accepts (O_DIRECT
/// included).
pub(crate) const ALIGN: usize = 4096;

/// Page-aligned memory of a fixed length: zero-initialised heap memory,
/// or a part of an [`Arena`] (zeroed when first carved, then whatever its
/// last user left, as a buffer reused from a cache).
pub(crate) struct AlignedBuf {
    ptr: NonNull<u8>,
    // (32 bits each, so the buffer stays three words with its arena:
    // slots move it per I/O.)
    len: u32,
    cap: u32,
    /// The arena the memory belongs to (kept alive by it), or `None`: the
    /// heap.
    arena: Option<Arc<Arena>>,
}

// SAFETY: the buffer owns its memory exclusively (like a `Vec<u8>`); its
// arena is `Sync`.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (at least one page is allocated).
    /// `None` if the allocation fails or the length overflows (a buffer
    /// is less than 4 GiB).
    pub fn new(len: usize) -> Option<AlignedBuf> {
        let cap = len.max(1).checked_next_multiple_of(ALIGN)?;
        let (len, cap32) = (u32::try_from(len).ok()?, u32::try_from(cap).ok()?);
        let layout = Layout::from_size_align(cap, ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        Some(AlignedBuf {
            ptr: NonNull::new(p)?,
            len,
            cap: cap32,
            arena: None,
        })
    }

    /// Whether the memory is part of an arena.
    #[cfg(test)]
    pub fn in_arena(&self) -> bool {
        self.arena.is_some()
    }

    /// Bytes allocated (the length rounded up to pages).
    pub fn capacity(&self) -> usize {
        self.cap as usize
    }

    /// Changes the length within the capacity (the bytes keep their
    /// contents). False if `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len > self.cap as usize {
            return false;
        }
        self.len = len as u32;
        true
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` is valid for `cap >= len` initialised bytes,
        // owned by `self` and not lent (a lent buffer is a `Lent`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len as usize) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as `as_slice`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len as usize) }
    }

    /// Lends the first `len` bytes (clamped to the length) out; the
    /// segment stays valid until the `Lent` is reclaimed or dropped.
    pub fn lend(self, len: usize) -> (Lent, RawSeg) {
        let seg = RawSeg {
            ptr: self.ptr.as_ptr(),
            len: len.min(self.len as usize),
        };
        (Lent(self), seg)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(a) = self.arena.take() {
            return a.put(self.ptr, self.cap as usize);
        }
        // The layout was valid at allocation with these values.
        if let Ok(layout) = Layout::from_size_align(self.cap as usize, ALIGN) {
            // SAFETY: allocated by `alloc_zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// A region data buffers are carved from, registered with a thread's
/// io_uring (`uring_registered_buffers`): a zero-copy send of a buffer in
/// it names the registered buffer instead of having the kernel pin the
/// pages per send. The first [`Arena::staging`] bytes are not carved: the
/// ring copies there the headers it sends with the data, so that every
/// piece of a send lies in the one registered buffer.
///
/// Buffers are carved by power-of-two size classes, in order, and a
/// buffer dropped goes back to its class's free list (the region is
/// never given back to the system while a buffer of it lives: each holds
/// the arena). When the region is used up, [`Cache`](crate::pool::Cache)
/// falls back to the heap.
pub(crate) struct Arena {
    map: Mapping,
    staging: usize,
    carve: Mutex<Carve>,
}

/// What of an arena is carved, and the free buffers by class.
struct Carve {
    next: usize,
    free: Vec<Vec<usize>>,
}

// SAFETY: the mapping is only reached through buffers carved from it
// (each owned exclusively, like a `Vec<u8>`), the staging bytes through
// their one user (the thread's ring: `Arena::staging`'s contract), and
// the carving state through its mutex.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// A region of `len` bytes (rounded up to pages), the first
    /// `staging` (rounded up to pages) kept for headers.
    pub fn new(len: usize, staging: usize) -> std::io::Result<Arc<Arena>> {
        let len = len.next_multiple_of(ALIGN);
        let staging = staging.next_multiple_of(ALIGN);
        if staging >= len {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("a buffer region of {len} bytes has no room beside its {staging} bytes of headers"),
            ));
        }
        Ok(Arc::new(Arena {
            map: Mapping::new(len)?,
            staging,
            carve: Mutex::new(Carve {
                next: staging,
                free: Vec::new(),
            }),
        }))
    }

    /// The whole region: what is registered.
    pub fn region(&self) -> (*mut u8, usize) {
        (self.map.ptr(), self.map.len())
    }

    /// The staging bytes at the start of the region.
    ///
    /// Their one user is the ring the region is registered with: it
    /// writes them only while no send of its names them.
    pub fn staging(&self) -> (*mut u8, usize) {
        (self.map.ptr(), self.staging)
    }

    /// Whether `len` bytes at `p` lie within the region.
    #[inline]
    pub fn contains(&self, p: usize, len: usize) -> bool {
        let base = self.map.ptr() as usize;
        p >= base && p - base <= self.map.len() && len <= self.map.len() - (p - base)
    }

    /// A buffer of `cap` bytes (a power of two, at least a page): one
    /// freed before, or carved; `None` when the region is used up.
    pub fn take(self: &Arc<Self>, cap: usize) -> Option<AlignedBuf> {
        debug_assert!(cap.is_power_of_two() && cap >= ALIGN);
        let cap32 = u32::try_from(cap).ok()?;
        let k = (cap / ALIGN).trailing_zeros() as usize;
        let at = {
            let mut c = self.carve.lock().ok()?;
            match c.free.get_mut(k).and_then(Vec::pop) {
                Some(at) => at,
                None => {
                    if self.map.len() - c.next < cap {
                        return None;
                    }
                    c.next += cap;
                    c.next - cap
                }
            }
        };
        // SAFETY: `at + cap` lies within the mapping (carved above, or
        // freed after being carved with this class's size).
        let p = unsafe { self.map.ptr().add(at) };
        Some(AlignedBuf {
            ptr: NonNull::new(p)?,
            len: cap32,
            cap: cap32,
            arena: Some(self.clone()),
        })
    }

    /// A buffer of the arena is dropped: its memory goes back to its
    /// class.
    fn put(&self, p: NonNull<u8>, cap: usize) {
        let k = (cap / ALIGN).trailing_zeros() as usize;
        let at = p.as_ptr() as usize - self.map.ptr() as usize;
        if let Ok(mut c) = self.carve.lock() {
            if c.free.len() <= k {
                c.free.resize_with(k + 1, Vec::new);
            }
            c.free[k].push(at);
        }
    }
}

/// A buffer lent to the bdev or the kernel: no access until reclaimed.
pub(crate) struct Lent(AlignedBuf);

impl Lent {
    /// Takes the buffer back.
    ///
    /// # Safety
    /// Whatever it was lent to no longer reads or writes it (the bdev
    /// delivered the request's completion, the kernel notified the send).
    pub unsafe fn reclaim(self) -> AlignedBuf {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_resizable_within_capacity() {
        let mut b = AlignedBuf::new(100).unwrap();
        assert_eq!(b.as_slice().as_ptr() as usize % ALIGN, 0);
        assert_eq!(b.as_slice().len(), 100);
        assert_eq!(b.capacity(), 4096);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        b.as_mut_slice()[99] = 7;
        assert!(b.set_len(4096));
        assert_eq!(b.as_slice()[99], 7);
        assert!(!b.set_len(4097));
        let (lent, seg) = b.lend(10_000);
        assert_eq!(seg.len, 4096);
        // SAFETY: nothing borrowed it.
        let b = unsafe { lent.reclaim() };
        assert_eq!(b.as_slice()[99], 7);
    }

    #[test]
    fn a_buffer_is_three_words_with_its_arena() {
        // Slots move buffers per I/O: a fourth word cost the 4 KiB read
        // path about 15 instructions per I/O (bench/tcp_sock_instr.py).
        assert_eq!(std::mem::size_of::<AlignedBuf>(), 24);
        assert_eq!(std::mem::size_of::<Option<AlignedBuf>>(), 24);
        assert!(AlignedBuf::new(1 << 32).is_none(), "4 GiB and more refused");
    }

    #[test]
    fn arena_carves_by_class_reuses_what_is_dropped_and_runs_out() {
        let a = Arena::new(64 << 10, 1).unwrap();
        let (base, len) = a.region();
        assert_eq!((len, a.staging().1), (64 << 10, 4096));
        let b = a.take(16 << 10).unwrap();
        let p = b.as_slice().as_ptr() as usize;
        assert_eq!(p, base as usize + 4096, "carved after the staging bytes");
        assert!(a.contains(p, 16 << 10) && b.in_arena());
        assert!(!a.contains(p, (60 << 10) + 1), "past the region's end");
        assert!(!a.contains(base as usize - 1, 1));
        let c = a.take(32 << 10).unwrap();
        assert_eq!(c.as_slice().as_ptr() as usize, p + (16 << 10));
        assert!(a.take(16 << 10).is_none(), "12 KiB left: used up");
        drop(b);
        let d = a.take(16 << 10).unwrap();
        assert_eq!(d.as_slice().as_ptr() as usize, p, "the dropped one again");
        let e = a.take(4096).unwrap();
        assert_eq!(e.as_slice().as_ptr() as usize, p + (48 << 10));
        // The buffers keep the region: dropping the arena first is fine.
        drop(a);
        let mut c = c;
        c.as_mut_slice()[0] = 1;
        assert!(
            Arena::new(4096, 4096).is_err(),
            "no room beside the staging"
        );
    }
}
