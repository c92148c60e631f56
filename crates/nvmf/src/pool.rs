//! The target's data buffers, bounded globally (SPDK's shared buffer pool:
//! `num_shared_buffers` of `io_unit_size` bytes, `buf_cache_size` of them
//! cached per thread).
//!
//! [`Pool`] is the budget, shared by every thread: the bytes of every
//! data buffer alive (in a command, or cached) are charged to it. Each
//! runtime thread keeps a [`Cache`] of free buffers by size class (powers
//! of two from 4 KiB), so a command takes a buffer and gives it back when
//! it ends without touching the shared counter: only a cache miss (an
//! allocation) or a buffer that does not fit the cache (a free) charges
//! or credits it. A command slot keeps a page-sized buffer (still charged
//! to its connection) for its next command, so the 4 KiB I/O path does
//! not go through the cache; those pages go back while anyone waits.
//!
//! Strict takes (data the target asks for with R2T, or reads from the
//! bdev) stay within the budget; when it is spent the command waits (no
//! R2T yet) and the connection tries again on its next polls. While any
//! connection waits, the budget is shared fairly: a connection that
//! already holds buffers may not hold more than `limit / (active + 1)`
//! (`active`: connections that held buffers lately), buffers given back
//! skip the caches, and the threads empty theirs on their next tick, so
//! a few connections (say, hosts that never send the data they announce)
//! cannot keep the others waiting beyond the data timeout that frees
//! their buffers. In-capsule data and admin data do not wait (the bytes
//! are arriving, or the controller made them): they are charged too but
//! may pass the budget, bounded per connection by its queue's entries.
use std::cell::{Cell, RefCell};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;

use crate::buf::{AlignedBuf, Arena, ALIGN};

/// Size classes: 4 KiB << k.
const CLASSES: usize = 32;

/// The budget of data buffer bytes, across threads.
pub(crate) struct Pool {
    limit: usize,
    used: AtomicUsize,
    /// Connections with commands waiting for a buffer.
    waiting: AtomicUsize,
    /// Connections that held buffers lately (fair share).
    active: AtomicUsize,
}

impl Pool {
    pub fn new(limit: usize) -> Pool {
        Pool {
            limit,
            used: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            active: AtomicUsize::new(0),
        }
    }

    /// Bytes charged: buffers alive, cached ones included.
    pub fn used(&self) -> usize {
        self.used.load(Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Some connection waits for a buffer.
    #[inline]
    pub fn pressed(&self) -> bool {
        self.waiting.load(Relaxed) > 0
    }

    /// What a connection holding buffers may hold while others wait.
    pub fn fair_share(&self) -> usize {
        self.limit / (self.active.load(Relaxed) + 1)
    }

    /// Charges `n` bytes: within the limit (`strict`), or in any case.
    fn charge(&self, n: usize, strict: bool) -> bool {
        if !strict {
            self.used.fetch_add(n, Relaxed);
            return true;
        }
        let mut cur = self.used.load(Relaxed);
        loop {
            if cur + n > self.limit {
                return false;
            }
            match self
                .used
                .compare_exchange_weak(cur, cur + n, Relaxed, Relaxed)
            {
                Ok(_) => return true,
                Err(v) => cur = v,
            }
        }
    }

    fn credit(&self, n: usize) {
        self.used.fetch_sub(n, Relaxed);
    }

    pub fn set_waiting(&self, on: bool) {
        if on {
            self.waiting.fetch_add(1, Relaxed);
        } else {
            self.waiting.fetch_sub(1, Relaxed);
        }
    }

    pub fn set_active(&self, on: bool) {
        if on {
            self.active.fetch_add(1, Relaxed);
        } else {
            self.active.fetch_sub(1, Relaxed);
        }
    }
}

/// The size class of a buffer of `len` bytes: (index, capacity).
#[inline]
pub(crate) fn class(len: usize) -> (usize, usize) {
    let cap = len.max(ALIGN).next_power_of_two();
    ((cap / ALIGN).trailing_zeros() as usize, cap)
}

/// One thread's free buffers (charged to the pool), by size class.
pub(crate) struct Cache {
    pool: std::sync::Arc<Pool>,
    free: RefCell<Vec<Vec<AlignedBuf>>>,
    bytes: Cell<usize>,
    cap: usize,
    /// New buffers come from here while it has room (a region registered
    /// with the thread's io_uring), else from the heap.
    arena: Option<std::sync::Arc<Arena>>,
}

impl Cache {
    /// A cache of at most `cap` bytes of free buffers.
    pub fn new(pool: std::sync::Arc<Pool>, cap: usize) -> Cache {
        Cache {
            pool,
            free: RefCell::new((0..CLASSES).map(|_| Vec::new()).collect()),
            bytes: Cell::new(0),
            cap,
            arena: None,
        }
    }

    /// New buffers from `arena` while it has room.
    pub fn with_arena(mut self, arena: Option<std::sync::Arc<Arena>>) -> Cache {
        self.arena = arena;
        self
    }

    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Bytes of free buffers cached.
    pub fn bytes(&self) -> usize {
        self.bytes.get()
    }

    /// A buffer of class `k` (capacity `cap`): cached, or allocated and
    /// charged (`strict`: within the budget, making room by freeing this
    /// thread's cached buffers of other sizes). `None` when the budget is
    /// spent (strict) or the allocation failed.
    #[inline]
    pub fn take(&self, k: usize, cap: usize, strict: bool) -> Option<AlignedBuf> {
        if let Some(b) = self.free.borrow_mut().get_mut(k).and_then(Vec::pop) {
            self.bytes.set(self.bytes.get() - cap);
            return Some(b);
        }
        self.take_new(cap, strict)
    }

    /// A new buffer, charged (see `take`).
    #[cold]
    #[inline(never)]
    fn take_new(&self, cap: usize, strict: bool) -> Option<AlignedBuf> {
        if !self.pool.charge(cap, strict) {
            if !strict || self.bytes.get() == 0 {
                return None;
            }
            self.trim();
            if !self.pool.charge(cap, strict) {
                return None;
            }
        }
        let b = match self.arena.as_ref().and_then(|a| a.take(cap)) {
            Some(b) => Some(b),
            None => AlignedBuf::new(cap),
        };
        if b.is_none() {
            self.pool.credit(cap);
        }
        b
    }

    /// Takes back a buffer: cached if there is room and nobody waits,
    /// else freed.
    #[inline]
    pub fn give(&self, b: AlignedBuf) {
        let cap = b.capacity();
        let room = self.bytes.get() + cap <= self.cap;
        if room && !self.pool.pressed() && cap.is_power_of_two() {
            let k = (cap / ALIGN).trailing_zeros() as usize;
            if let Some(v) = self.free.borrow_mut().get_mut(k) {
                v.push(b);
                self.bytes.set(self.bytes.get() + cap);
                return;
            }
        }
        self.free_one(b);
    }

    #[cold]
    #[inline(never)]
    fn free_one(&self, b: AlignedBuf) {
        let cap = b.capacity();
        drop(b);
        self.pool.credit(cap);
    }

    /// Frees every cached buffer (others wait for the budget).
    pub fn trim(&self) {
        let mut n = 0;
        for v in self.free.borrow_mut().iter_mut() {
            n += v.iter().map(AlignedBuf::capacity).sum::<usize>();
            v.clear();
        }
        self.bytes.set(0);
        if n > 0 {
            self.pool.credit(n);
        }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.trim();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn classes_are_powers_of_two_from_a_page() {
        assert_eq!(class(0), (0, 4096));
        assert_eq!(class(4096), (0, 4096));
        assert_eq!(class(4097), (1, 8192));
        assert_eq!(class(128 << 10), (5, 128 << 10));
        assert_eq!(class((128 << 10) + 1), (6, 256 << 10));
    }

    #[test]
    fn strict_takes_stay_within_the_budget_and_buffers_come_back() {
        let pool = Arc::new(Pool::new(64 << 10));
        let c = Cache::new(pool.clone(), 32 << 10);
        let (k, cap) = class(16 << 10);
        let bufs: Vec<_> = (0..4).map(|_| c.take(k, cap, true).unwrap()).collect();
        assert_eq!(pool.used(), 64 << 10);
        assert!(c.take(k, cap, true).is_none(), "past the budget");
        // Not strict: charged beyond it.
        let extra = c.take(0, 4096, false).unwrap();
        assert_eq!(pool.used(), (64 << 10) + 4096);
        c.give(extra);
        for b in bufs {
            c.give(b);
        }
        // 32 KiB + 4 KiB cached (room for two 16 KiB and the page...).
        assert!(c.bytes() <= 32 << 10);
        assert_eq!(pool.used(), c.bytes());
        // A cached buffer is taken without a charge.
        let before = pool.used();
        let b = c.take(k, cap, true).unwrap();
        assert_eq!(pool.used(), before);
        c.give(b);
        // A larger class makes room by freeing cached ones.
        let (k2, cap2) = class(64 << 10);
        let big = c.take(k2, cap2, true).unwrap();
        assert_eq!(pool.used(), 64 << 10);
        c.give(big);
        // Under pressure, given buffers are freed, not cached.
        c.trim();
        pool.set_waiting(true);
        let b = c.take(k, cap, true).unwrap();
        c.give(b);
        assert_eq!((c.bytes(), pool.used()), (0, 0));
        pool.set_waiting(false);
    }

    #[test]
    fn an_arena_serves_new_buffers_while_it_has_room_then_the_heap() {
        let pool = Arc::new(Pool::new(1 << 20));
        let arena = Arena::new(4096 + (32 << 10), 4096).unwrap();
        let c = Cache::new(pool.clone(), 0).with_arena(Some(arena.clone()));
        let (k, cap) = class(32 << 10);
        let a = c.take(k, cap, true).unwrap();
        assert!(a.in_arena());
        let b = c.take(k, cap, true).unwrap();
        assert!(!b.in_arena(), "the region is used up: the heap");
        assert_eq!(pool.used(), 64 << 10, "both charged alike");
        // No room in the cache: freed, the arena's one back to it.
        c.give(a);
        c.give(b);
        assert_eq!(pool.used(), 0);
        assert!(c.take(k, cap, true).unwrap().in_arena());
    }
}
