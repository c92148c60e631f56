//! I/O counters for SMART / Health: each I/O queue counts into plain
//! integers it alone writes, and publishes them ([`IoStats`] in a
//! cache line of relaxed atomics, written with plain stores: one writer,
//! no read-modify-write) when its owner asks (`IoQueue::publish`, e.g.
//! once per batch). Get Log Page sums every queue the controller has
//! registered, live and closed.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

/// A queue's I/O counts: successful reads and writes and their bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoStats {
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

impl IoStats {
    fn add(&mut self, o: &IoStats) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
    }
}

/// The published copy of one queue's counts.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct Published {
    reads: AtomicU64,
    writes: AtomicU64,
    bytes_read: AtomicU64,
    bytes_written: AtomicU64,
}

impl Published {
    /// Only the owning queue calls this (one writer).
    pub fn store(&self, s: &IoStats) {
        self.reads.store(s.reads, Relaxed);
        self.writes.store(s.writes, Relaxed);
        self.bytes_read.store(s.bytes_read, Relaxed);
        self.bytes_written.store(s.bytes_written, Relaxed);
    }

    fn load(&self) -> IoStats {
        IoStats {
            reads: self.reads.load(Relaxed),
            writes: self.writes.load(Relaxed),
            bytes_read: self.bytes_read.load(Relaxed),
            bytes_written: self.bytes_written.load(Relaxed),
        }
    }
}

/// Every queue of one controller.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: Mutex<Vec<Arc<Published>>>,
    retired: Mutex<IoStats>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Registry {
    pub fn register(&self) -> Arc<Published> {
        let p = Arc::new(Published::default());
        lock(&self.live).push(p.clone());
        p
    }

    /// A queue closes: its last published counts move to the totals.
    pub fn retire(&self, p: &Arc<Published>) {
        lock(&self.live).retain(|x| !Arc::ptr_eq(x, p));
        lock(&self.retired).add(&p.load());
    }

    pub fn total(&self) -> IoStats {
        let mut s = *lock(&self.retired);
        for p in lock(&self.live).iter() {
            s.add(&p.load());
        }
        s
    }
}

/// What an I/O queue needs from its controller to count for it: made by
/// `Controller::io_stats_handle`, `Send`, handed to the queue's thread.
#[derive(Debug)]
pub struct StatsHandle {
    pub(crate) registry: Arc<Registry>,
    pub(crate) published: Arc<Published>,
}
