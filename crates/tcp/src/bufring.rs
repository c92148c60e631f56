//! An io_uring provided-buffer ring, for multishot receives: the ring of
//! entries the kernel picks buffers from, and the buffers, each in an
//! anonymous mapping. Shared by the host's (`crate::uring`) and the
//! target's (`pollux_nvmf`) io_uring socket paths.
//!
//! A buffer is either in the ring (the kernel may write it) or handed to
//! its owner by a receive's completion, until given back
//! ([`BufRing::give`]): only then are its bytes read
//! ([`BufRing::bytes`]). The owner registers the ring with its io_uring
//! ([`BufRing::ring_addr`]) and must not drop it while the kernel may
//! still use it: [`BufRing::leak`] forgets the memory instead.
use std::io;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;

use crate::mapping::Mapping;

/// A provided-buffer ring of `count` buffers (a power of two) of `size`
/// bytes. See the module docs.
pub struct BufRing {
    ring: Mapping,
    bufs: Mapping,
    count: u16,
    size: u32,
    /// Our tail (entries given to the kernel), published by `publish`.
    tail: u16,
    published: u16,
    /// Buffers handed to the owner and not given back (the owner counts:
    /// [`hold`](Self::hold) and [`give`](Self::give)).
    held: u32,
}

impl BufRing {
    /// `count` buffers (a power of two) of `size` bytes, all in the ring
    /// and published.
    pub fn new(count: u16, size: u32) -> io::Result<BufRing> {
        if !count.is_power_of_two() || size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{count} receive buffers of {size} bytes: a power of two of them, of at least a byte"),
            ));
        }
        let ring = Mapping::new((count as usize * 16).max(4096))?;
        let bufs = Mapping::new(count as usize * size as usize)?;
        let mut b = BufRing {
            ring,
            bufs,
            count,
            size,
            tail: 0,
            published: 0,
            held: 0,
        };
        for bid in 0..count {
            b.put(bid);
        }
        b.publish();
        Ok(b)
    }

    /// The ring's address, to register with an io_uring.
    pub fn ring_addr(&self) -> u64 {
        self.ring.ptr() as u64
    }

    /// Buffers in all.
    #[inline(always)]
    pub fn count(&self) -> u32 {
        self.count as u32
    }

    /// Bytes of each buffer.
    #[inline(always)]
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Buffers handed to the owner and not given back.
    #[inline(always)]
    pub fn held(&self) -> u32 {
        self.held
    }

    /// A receive's completion handed buffer `bid` to the owner.
    #[inline(always)]
    pub fn hold(&mut self) {
        self.held += 1;
    }

    /// Gives back buffer `bid`, which a completion handed to the owner
    /// ([`hold`](Self::hold)): it goes back in the ring, seen by the
    /// kernel at the next [`publish`](Self::publish).
    #[inline]
    pub fn give(&mut self, bid: u16) {
        debug_assert!(self.held > 0);
        self.held -= 1;
        self.put(bid);
    }

    #[inline]
    fn put(&mut self, bid: u16) {
        debug_assert!(bid < self.count);
        let e = self.ring.ptr().cast::<BufRingEntry>();
        // SAFETY: the entry is within the ring mapping (masked by the
        // count, a power of two), which only we write between
        // publications (the kernel reads entries below the published
        // tail, and this one is not).
        unsafe {
            let e = &mut *e.add((self.tail & (self.count - 1)) as usize);
            e.set_addr(self.bufs.ptr() as u64 + bid as u64 * self.size as u64);
            e.set_len(self.size);
            e.set_bid(bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Tells the kernel of the buffers given back.
    #[inline]
    pub fn publish(&mut self) {
        if self.published != self.tail {
            // SAFETY: the tail field of the ring mapping's first entry, a
            // u16 the kernel reads atomically.
            let t = unsafe { &*BufRingEntry::tail(self.ring.ptr().cast()).cast::<AtomicU16>() };
            t.store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
    }

    /// Bytes `at..end` of buffer `bid`.
    ///
    /// # Safety
    /// Buffer `bid` was handed to the owner by a receive's completion and
    /// not given back since (the kernel does not write it), and `at <=
    /// end <= size()`.
    #[inline(always)]
    pub unsafe fn bytes(&self, bid: u16, at: u32, end: u32) -> &[u8] {
        debug_assert!(at <= end && end <= self.size && bid < self.count);
        // SAFETY: within the buffers' mapping (bid < count, end <= size);
        // not written by the kernel per the caller's contract, nor by us
        // (nothing writes a handed buffer).
        unsafe {
            std::slice::from_raw_parts(
                self.bufs
                    .ptr()
                    .add(bid as usize * self.size as usize + at as usize),
                (end - at) as usize,
            )
        }
    }

    /// The kernel may still use the ring or the buffers (a receive that
    /// did not end, or a ring that could not be unregistered): their
    /// memory is forgotten, never unmapped. Returns the bytes leaked.
    pub fn leak(&mut self) -> usize {
        let mut n = 0;
        for m in [&mut self.ring, &mut self.bufs] {
            n += m.len();
            std::mem::forget(std::mem::replace(m, Mapping::empty()));
        }
        n
    }
}

// SAFETY: the mappings are owned by the ring and only reached through
// `&mut self` or `&self` (reads of handed buffers); moving them to
// another thread moves their only owner.
unsafe impl Send for BufRing {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_go_round_and_counts_hold() {
        assert!(BufRing::new(3, 512).is_err(), "not a power of two");
        assert!(BufRing::new(4, 0).is_err(), "empty buffers");
        let mut b = BufRing::new(4, 512).unwrap();
        assert_eq!((b.count(), b.size(), b.held()), (4, 512, 0));
        // All four published, at the addresses of their buffers.
        // SAFETY: reading the ring's own mapping (4 entries and the tail).
        let tail = unsafe { *BufRingEntry::tail(b.ring.ptr().cast()) };
        assert_eq!(tail, 4);
        for bid in 0..4u16 {
            // SAFETY: entry `bid` of the ring mapping.
            let e = unsafe { &*b.ring.ptr().cast::<BufRingEntry>().add(bid as usize) };
            assert_eq!(e.addr(), b.bufs.ptr() as u64 + bid as u64 * 512);
            assert_eq!((e.len(), e.bid()), (512, bid));
        }
        b.hold();
        b.hold();
        assert_eq!(b.held(), 2);
        // SAFETY: nothing but us writes this mapping (no kernel here).
        unsafe { b.bufs.ptr().add(512 + 3).write(0xAB) };
        // SAFETY: buffer 1 counts as handed to us; 3..5 lies within it.
        assert_eq!(unsafe { b.bytes(1, 3, 5) }, &[0xAB, 0]);
        b.give(1);
        assert_eq!(b.held(), 1);
        b.publish();
        // SAFETY: as above.
        assert_eq!(unsafe { *BufRingEntry::tail(b.ring.ptr().cast()) }, 5);
        assert_eq!(b.leak(), 4096 + 2048);
    }
}
