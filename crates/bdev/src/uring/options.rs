//! io_uring bdev options and the limits of its rings and requests.

/// How an io_uring bdev opens its file and sets up its rings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// Block size (None: a block device's logical block size, a file's
    /// direct I/O offset alignment from statx; at least 512). With
    /// `direct` it must be a multiple of that.
    pub block_size: Option<u32>,
    /// Size in bytes, a multiple of the block size (None: the block
    /// device's or the file's size, rounded down to whole blocks). A
    /// regular file shorter than this is extended (sparse) to it; a block
    /// device must be at least this large.
    pub size: Option<u64>,
    /// Open with O_DIRECT (bypass the page cache). Buffer addresses must
    /// then be aligned to `BdevInfo::buf_align`.
    pub direct: bool,
    /// A kernel thread polls each channel's submission ring
    /// (IORING_SETUP_SQPOLL), sleeping after this many idle milliseconds:
    /// no system call to submit while it is awake, at the cost of a core.
    pub sqpoll: Option<u32>,
    /// Completions are polled from the device (IORING_SETUP_IOPOLL): only
    /// with `direct` on a block device that has poll queues
    /// (`queue/io_poll` is 1); refused otherwise.
    pub iopoll: bool,
    /// Register the file with each ring (IOSQE_FIXED_FILE): saves the
    /// kernel a file table lookup per request.
    pub register_files: bool,
    /// `Bdev::alloc_buf` hands out memory of regions each channel
    /// registers with its ring (READ_FIXED / WRITE_FIXED).
    pub register_buffers: bool,
    /// Each channel registers an eventfd with its ring, signalled on every
    /// completion (`Channel::wake_fd`), so an idle thread can sleep. Off,
    /// the rings use COOP_TASKRUN: the kernel does not interrupt a
    /// polling thread to post completions, the next poll does (better for
    /// a thread that only ever polls).
    pub wake_fd: bool,
    /// After this many polls in a row that found no completion while
    /// requests were in flight, a poll yields the core (`sched_yield`);
    /// 0: never. A request the kernel cannot start at once (a file system
    /// without non-blocking reads, such as tmpfs) runs on an io-wq worker
    /// that inherits the polling thread's affinity, and a softirq may be
    /// pushed to ksoftirqd on that core: both wait for a spinning poller's
    /// time slice to end unless it yields.
    pub yield_after: u32,
}

impl Default for UringOptions {
    fn default() -> Self {
        UringOptions {
            block_size: None,
            size: None,
            direct: true,
            sqpoll: None,
            iopoll: false,
            register_files: true,
            register_buffers: true,
            wake_fd: true,
            yield_after: 16,
        }
    }
}

/// Most bytes of one read or write (below the kernel's MAX_RW_COUNT, so a
/// request is never cut by that limit).
pub(crate) const MAX_IO: u64 = 1 << 30;
/// Most buffers of one vector (the kernel's UIO_MAXIOV).
pub(crate) const IOV_MAX: usize = 1024;
/// Most entries of one ring (IORING_MAX_ENTRIES).
pub(super) const MAX_ENTRIES: u32 = 32768;
/// The zero buffer of write zeroes done by writes.
pub(super) const ZCHUNK: usize = 1 << 20;
/// CQEs copied out of the ring at once.
pub(crate) const REAP_BATCH: usize = 32;
/// The user data of cancellation requests (never a slot index).
pub(super) const CANCEL_UD: u64 = u64::MAX;
/// Not a registered buffer.
pub(super) const NO_BUF: u16 = u16::MAX;
