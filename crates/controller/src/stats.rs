//! I/O counters for SMART / Health: each I/O queue counts into plain
//! integers it alone writes, and publishes them ([`IoStats`] in a
//! cache line of relaxed atomics, written with plain stores: one writer,
//! no read-modify-write) when its owner asks (`IoQueue::publish`, e.g.
//! once per batch). Get Log Page sums every queue the controller has
//! registered, live and closed.
//!
//! Failed commands of I/O queues that report them (`IoQueue::report_errors`:
//! the target's; the emulator accounts failed completions itself) are
//! rare: such a queue, on another thread than the controller's admin
//! queue, pushes each into the registry under a mutex taken only then;
//! the controller moves them into its Error Information log and SMART's
//! media error count when either log page is read
//! (`Controller::drain_io_errors`). The pending ones are bounded: beyond
//! the log's length only the newest are kept, the older ones counted.
//!
//! The registry also carries the one setting the queues read per command:
//! the Read/Write flags every write gets (Force Unit Access while the
//! controller's volatile write cache is disabled, WCE = 0), a plain
//! relaxed load for the queues, stored by the controller's admin path.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use pollux_spec::cmd::RwFlags;
use pollux_spec::status::sct;
use pollux_spec::Status;

use crate::errlog::ERROR_LOG_ENTRIES;

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

/// A failed command of an I/O queue, for the Error Information log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IoErrorRecord {
    pub sqid: u16,
    pub cid: u16,
    pub status: Status,
    pub nsid: u32,
    pub lba: u64,
}

/// Failed commands not yet in the controller's log.
#[derive(Debug, Default)]
pub(crate) struct PendingErrors {
    /// The newest, oldest first (at most `ERROR_LOG_ENTRIES`).
    pub recent: VecDeque<IoErrorRecord>,
    /// Older ones that no longer fit: how many, and how many of them were
    /// media errors.
    pub older: u64,
    pub older_media: u64,
}

/// Every queue of one controller.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: Mutex<Vec<Arc<Published>>>,
    retired: Mutex<IoStats>,
    errors: Mutex<PendingErrors>,
    /// CDW12 bits every Write and Write Zeroes of the controller's queues
    /// gets: FUA while the volatile write cache is disabled, else 0.
    write_flags: AtomicU32,
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

    /// Records a failed command (any thread; the error path only).
    #[cold]
    pub fn push_error(&self, e: IoErrorRecord) {
        let mut p = lock(&self.errors);
        if p.recent.len() >= ERROR_LOG_ENTRIES {
            if let Some(old) = p.recent.pop_front() {
                p.older += 1;
                p.older_media += u64::from(old.status.sct() == sct::MEDIA);
            }
        }
        p.recent.push_back(e);
    }

    /// Takes the failed commands recorded so far.
    pub fn take_errors(&self) -> PendingErrors {
        std::mem::take(&mut *lock(&self.errors))
    }

    /// Failed commands recorded and not taken yet: (all, media errors).
    pub fn pending_errors(&self) -> (u64, u64) {
        let p = lock(&self.errors);
        let media = p
            .recent
            .iter()
            .filter(|e| e.status.sct() == sct::MEDIA)
            .count() as u64;
        (p.older + p.recent.len() as u64, p.older_media + media)
    }

    /// The volatile write cache is enabled (WCE = 1, the default) or not
    /// (WCE = 0: every write the queues check from now on is FUA).
    ///
    /// A relaxed store is enough: the writes that must honour it are
    /// those the host sends after it saw the Set Features complete, so
    /// the store precedes that completion's posting and the queues' loads
    /// follow those writes' arrival, ordered by what carries them (the
    /// kernel's socket locks, the emulator's mutex).
    pub fn set_write_cache(&self, wce: bool) {
        let flags = if wce { 0 } else { RwFlags::FUA.bits() };
        self.write_flags.store(flags, Relaxed);
    }

    /// The CDW12 bits to add to every write's (see `set_write_cache`).
    #[inline(always)]
    pub fn write_flags(&self) -> u32 {
        self.write_flags.load(Relaxed)
    }

    pub fn total(&self) -> IoStats {
        let mut s = *lock(&self.retired);
        for p in lock(&self.live).iter() {
            s.add(&p.load());
        }
        s
    }
}

/// What an I/O queue needs from its controller to count for it (and to
/// see its volatile write cache setting): made by
/// `Controller::io_stats_handle`, `Send`, handed to the queue's thread.
#[derive(Debug)]
pub struct StatsHandle {
    pub(crate) registry: Arc<Registry>,
    pub(crate) published: Arc<Published>,
}
