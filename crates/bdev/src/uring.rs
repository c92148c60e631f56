//! The io_uring backend: a regular file or a block device through the
//! kernel's io_uring, one ring per channel.
//!
//! # Submission and completion
//!
//! A request takes a slot of the channel's slot table (its index is the
//! SQE's user data) that keeps the caller's user data, the request's
//! buffers, its iovec array (vectors, borrowed segments) and what is
//! left to transfer; each slot has at most one SQE in the kernel at a
//! time, so the submission ring (depth rounded up to a power of two)
//! never fills and the completion ring (twice that) never overflows.
//! Submitting only writes the SQE; [`Channel::poll`](crate::Channel::poll)
//! makes one `io_uring_enter` for everything queued since the last poll
//! (none with SQPOLL while the kernel thread is awake), then copies CQEs
//! out in batches and delivers each, so a handler may submit at once.
//!
//! # Results
//!
//! A negative result is `IoError::Os(errno)`. A short read or write
//! (Linux returns one for a regular file at its end, or a write that hit
//! ENOSPC after some bytes) is resubmitted for the remainder; a transfer
//! of zero bytes ends the request with `IoError::Os(ENODATA)`, the byte
//! counts logged (with O_DIRECT a
//! remainder that is no longer aligned fails with `Os(EINVAL)`). The
//! bdev's size is fixed at creation, so a short transfer only happens if
//! something else shrinks the file.
//!
//! # Other operations
//!
//! Flush is `fdatasync` (IORING_OP_FSYNC with DATASYNC). A write with
//! Force Unit Access carries `RWF_DSYNC` (the kernel completes it once
//! the data is durable: a buffered write is written back and synced; a
//! direct one goes down with REQ_FUA where the device has it, else is
//! followed by a cache flush); a read with FUA is an `fdatasync`, then
//! the read (the slot's two steps, one SQE at a time). Write zeroes is
//! `fallocate(ZERO_RANGE | KEEP_SIZE)`; where the file system refuses it
//! (EOPNOTSUPP: tmpfs) the channel switches to writes of a shared zero
//! buffer (1 MiB at a time). Unmap is `fallocate(PUNCH_HOLE | KEEP_SIZE)`
//! (a block device discards with zeroing); where that is refused it falls
//! back to write zeroes, so unmapped blocks always read back as zeroes.
//! Reset is a NOP with IOSQE_IO_DRAIN: it completes once every request
//! submitted before it on the channel has finished; it touches nothing.
//! An IOPOLL ring refuses fsync and fallocate, so with `iopoll` a second,
//! interrupt-driven ring per channel carries them (reset drains only the
//! polled ring).
//!
//! # Buffers
//!
//! With `register_buffers`, [`Bdev::alloc_buf`](crate::Bdev::alloc_buf)
//! carves buffers out of large regions the bdev owns (4 MiB, then
//! growing with the total, up to 64 regions); every channel registers a
//! region with its ring the first time it sees a buffer in it, and reads
//! or writes of one buffer inside a registered region use READ_FIXED /
//! WRITE_FIXED (no page pinning per I/O). Any other buffer, and vectors,
//! use plain READ(V) / WRITE(V). With O_DIRECT every buffer address must
//! be aligned to `buf_align` (refused at submission otherwise).
//!
//! # Defaults, measured
//!
//! Measured on a 2-vCPU VM (4 KiB random reads at QD 32, the kernel's
//! CPU time per I/O in the submitting thread, interleaved runs):
//! registered buffers save 150-430 ns of the 1.1-4 us an I/O costs
//! (no page pinning), so `register_buffers` is on; registering the file
//! and the eventfd cost or save nothing measurable single-threaded (a
//! registered file also skips the file reference count that threads of
//! one process share), so both are on.
//!
//! # Dropping a channel
//!
//! The kernel may still be writing into a request's buffers until its CQE
//! arrives, so a channel dropped with requests in flight asks the kernel
//! to cancel them and waits for every CQE before any buffer is freed.
use std::fs::File;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use pollux_nvme::dma::{DmaRelease, Iova};
use pollux_nvme::{DmaBuffer, IoBuf};
use pollux_spec::cmd::RwFlags;

use crate::data::{Completion, Data, RawSeg};
use crate::error::{Error, IoError, Refused, Result, SubmitError};
use crate::options::ChannelOptions;

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
const MAX_ENTRIES: u32 = 32768;
/// The zero buffer of write zeroes done by writes.
const ZCHUNK: usize = 1 << 20;
/// CQEs copied out of the ring at once.
pub(crate) const REAP_BATCH: usize = 32;
/// The user data of cancellation requests (never a slot index).
const CANCEL_UD: u64 = u64::MAX;
/// Not a registered buffer.
const NO_BUF: u16 = u16::MAX;

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// What `Bdev::uring` needs to describe the bdev.
pub(crate) struct Opened {
    pub block_size: u32,
    pub num_blocks: u64,
    pub buf_align: u32,
    pub max_transfer: u32,
    pub shared: UringShared,
}

/// What the channels of an io_uring bdev share.
pub(crate) struct UringShared {
    file: File,
    path: PathBuf,
    opts: UringOptions,
    buf_align: u32,
    pool: Option<Arc<Pool>>,
    /// ZCHUNK zero bytes, only ever read (by the kernel).
    zeroes: IoBuf,
    /// Set by `Bdev::inject_failure`.
    pub failed: AtomicBool,
}

fn os(path: &Path, what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}

/// The major and minor numbers of `dev`.
fn dev_numbers(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// A queue attribute of the block device `dev` (or of the disk of a
/// partition).
fn sysfs_queue(dev: u64, attr: &str) -> Option<String> {
    let (ma, mi) = dev_numbers(dev);
    [
        format!("/sys/dev/block/{ma}:{mi}/queue/{attr}"),
        format!("/sys/dev/block/{ma}:{mi}/../queue/{attr}"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .map(|s| s.trim().to_string())
}

/// The direct I/O memory and offset alignments statx reports, if it does.
fn dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx only writes into `st`, a plain C struct for which all
    // zeroes is a valid value; the empty path with AT_EMPTY_PATH names the
    // open descriptor.
    let (r, st) = unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut st,
        );
        (r, st)
    };
    (r == 0 && st.stx_mask & libc::STATX_DIOALIGN != 0 && st.stx_dio_mem_align != 0)
        .then_some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}

/// A block device's logical block size and size in bytes.
fn blockdev_geometry(file: &File) -> std::io::Result<(u32, u64)> {
    let mut lbs: libc::c_int = 0;
    let mut size: u64 = 0;
    // SAFETY: BLKSSZGET writes one int and BLKGETSIZE64 one u64 through
    // the pointers, which point at such values.
    let (a, b) = unsafe {
        (
            libc::ioctl(
                file.as_raw_fd(),
                BLKSSZGET as _,
                &mut lbs as *mut libc::c_int,
            ),
            libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64),
        )
    };
    if a != 0 || b != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(lbs).unwrap_or(512).max(512), size))
}

/// Opens and describes `path` (see `Bdev::uring`).
pub(crate) fn open(name: &str, path: &Path, opts: UringOptions) -> Result<Opened> {
    let invalid = |msg: String| Error::Invalid {
        name: name.to_string(),
        msg: format!("{}: {msg}", path.display()),
    };
    let oserr = |what: &str, e: std::io::Error| Error::Os {
        name: name.to_string(),
        source: os(path, what, e),
    };
    let flags = libc::O_CLOEXEC | if opts.direct { libc::O_DIRECT } else { 0 };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if opts.direct && e.raw_os_error() == Some(libc::EINVAL) {
                invalid(
                    "the file system refuses O_DIRECT (EINVAL): set UringOptions::direct to false"
                        .into(),
                )
            } else {
                oserr("open read-write", e)
            }
        })?;
    let md = file.metadata().map_err(|e| oserr("stat", e))?;
    let ft = md.file_type();
    let blockdev = ft.is_block_device();
    if !blockdev && !ft.is_file() {
        return Err(invalid(
            "is neither a regular file nor a block device".into(),
        ));
    }
    let dio = if opts.direct { dio_align(&file) } else { None };
    let (dev_lbs, dev_size) = if blockdev {
        blockdev_geometry(&file).map_err(|e| oserr("block device geometry", e))?
    } else {
        (512, md.len())
    };
    // The smallest block direct I/O allows.
    let min_block = if !opts.direct {
        512
    } else if blockdev {
        dev_lbs.max(dio.map_or(0, |d| d.1))
    } else {
        dio.map_or(512, |d| d.1).max(512)
    };
    let block_size = opts.block_size.unwrap_or(min_block.max(512));
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(invalid(format!(
            "block_size {block_size} is not a power of two between 512 and 65536"
        )));
    }
    if !block_size.is_multiple_of(min_block) {
        return Err(invalid(format!(
            "block_size {block_size} is not a multiple of the direct I/O granularity {min_block}"
        )));
    }
    let buf_align = if !opts.direct {
        1
    } else {
        match dio {
            Some((mem, _)) if mem.is_power_of_two() => mem,
            _ if blockdev => dev_lbs,
            _ => 512,
        }
    };
    if opts.iopoll {
        if !blockdev {
            return Err(invalid(
                "iopoll needs a block device with poll queues; this is a regular file".into(),
            ));
        }
        if !opts.direct {
            return Err(invalid("iopoll needs direct I/O (direct: true)".into()));
        }
        let poll = sysfs_queue(md.rdev(), "io_poll");
        if poll.as_deref() != Some("1") {
            return Err(invalid(format!(
                "iopoll needs poll queues, and the device's queue/io_poll is {} \
                 (for NVMe: load the driver with poll_queues=N)",
                poll.as_deref().unwrap_or("unreadable")
            )));
        }
    }
    let bs = block_size as u64;
    let size = match opts.size {
        Some(s) if s == 0 || s % bs != 0 => {
            return Err(invalid(format!(
                "size {s} is not a positive multiple of the block size {block_size}"
            )))
        }
        Some(s) if blockdev && s > dev_size => {
            return Err(invalid(format!(
                "size {s} exceeds the block device's {dev_size} bytes"
            )))
        }
        Some(s) => s,
        None if dev_size < bs => {
            return Err(invalid(format!(
                "holds {dev_size} bytes, less than one {block_size}-byte block: give UringOptions::size"
            )))
        }
        None => dev_size - dev_size % bs,
    };
    crate::info::check_geometry(name, block_size, size / bs)?;
    if !blockdev && size > dev_size {
        file.set_len(size)
            .map_err(|e| oserr("extend to the size", e))?;
    }
    let dev = if blockdev { md.rdev() } else { md.dev() };
    let max_transfer = sysfs_queue(dev, "max_sectors_kb")
        .and_then(|s| s.parse::<u32>().ok())
        .and_then(|kb| kb.checked_mul(1024))
        .filter(|&b| b >= block_size)
        .unwrap_or(1 << 20);
    let pool = opts
        .register_buffers
        .then(|| Arc::new(Pool::new(buf_align as usize)));
    let zeroes = alloc_aligned(ZCHUNK, buf_align as usize).map_err(|e| oserr("zero buffer", e))?;
    Ok(Opened {
        block_size,
        num_blocks: size / bs,
        buf_align,
        max_transfer,
        shared: UringShared {
            file,
            path: path.to_path_buf(),
            opts,
            buf_align,
            pool,
            zeroes,
            failed: AtomicBool::new(false),
        },
    })
}

/// `len` bytes of zeroed host memory aligned to `align`.
fn alloc_aligned(len: usize, align: usize) -> std::io::Result<IoBuf> {
    if align <= 4096 {
        return crate::mem::alloc_host_buf(len);
    }
    let mut b = crate::mem::alloc_host_buf(len + align)?;
    let base = b.as_mut_slice().as_mut_ptr() as usize;
    let pad = base.next_multiple_of(align) - base;
    Ok(b.split_at(pad).1.truncate(len))
}

impl UringShared {
    /// A buffer for this bdev: from a registered region when it can be.
    pub fn alloc_buf(&self, len: usize) -> std::io::Result<IoBuf> {
        if let Some(p) = &self.pool {
            if let Some(b) = p.alloc(len)? {
                return Ok(b);
            }
        }
        alloc_aligned(len, self.buf_align as usize)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

// ---------------------------------------------------------------------
// Registered buffer regions.

/// Most regions (the size of each ring's sparse buffer table).
const MAX_REGIONS: usize = 64;
const REGION_MIN: usize = 4 << 20;
/// The kernel's limit for one registered buffer.
const REGION_MAX: usize = 1 << 30;

/// A published region, readable by channels without the lock.
#[derive(Default)]
struct Span {
    start: AtomicU64,
    end: AtomicU64,
}

/// Large host-memory regions buffers are carved from, so that channels
/// can register them with their rings.
pub(crate) struct Pool {
    spans: [Span; MAX_REGIONS],
    /// Regions published (their spans are written before this is raised).
    count: AtomicUsize,
    /// Allocation granularity and alignment.
    gran: usize,
    inner: Mutex<PoolInner>,
}

struct PoolInner {
    /// The mappings, kept until the pool is dropped.
    maps: Vec<DmaBuffer>,
    /// Free ranges of each region, (offset, len), sorted by offset.
    free: Vec<Vec<(usize, usize)>>,
    total: usize,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// First fit in a sorted free list.
fn take(free: &mut Vec<(usize, usize)>, need: usize) -> Option<usize> {
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
fn give(free: &mut Vec<(usize, usize)>, off: usize, len: usize) {
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
    fn new(align: usize) -> Pool {
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
    fn span(&self, i: usize) -> (u64, u64) {
        let s = &self.spans[i];
        (
            s.start.load(Ordering::Relaxed),
            s.end.load(Ordering::Relaxed),
        )
    }

    /// Regions published so far.
    fn published(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// A buffer of `len` bytes from a region; None when it cannot come
    /// from one (empty, larger than a region, no region left).
    fn alloc(self: &Arc<Self>, len: usize) -> std::io::Result<Option<IoBuf>> {
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

// ---------------------------------------------------------------------
// Channels.

/// What a slot's request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Op {
    Read,
    Write,
    Flush,
    /// fallocate(ZERO_RANGE).
    Zero,
    /// fallocate(PUNCH_HOLE).
    Punch,
    /// Zeroing by writes of the zero buffer.
    ZeroWrite,
    /// Reset: NOP with IO_DRAIN.
    Drain,
}

/// One iovec, laid out as `struct iovec` (but `Send`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Iov {
    base: usize,
    len: usize,
}

const _: () = assert!(
    std::mem::size_of::<Iov>() == std::mem::size_of::<libc::iovec>()
        && std::mem::align_of::<Iov>() == std::mem::align_of::<libc::iovec>()
);

struct Slot {
    busy: bool,
    op: Op,
    /// The fixed buffer index of `addr` (NO_BUF: plain).
    buf_index: u16,
    /// The transfer is the iovec array (else `addr`, `left`).
    vec: bool,
    /// A write with RWF_DSYNC (Force Unit Access).
    dsync: bool,
    /// A FUA read's first step: `fdatasync` before the read.
    sync_first: bool,
    ud: u64,
    /// File offset of the next SQE.
    off: u64,
    /// Bytes still to transfer or zero.
    left: u64,
    /// Bytes the request carries.
    total: u64,
    /// Next byte of a one-buffer transfer.
    addr: u64,
    /// First iovec not yet transferred.
    iov_at: usize,
    iov: Vec<Iov>,
    data: Data,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            busy: false,
            op: Op::Drain,
            buf_index: NO_BUF,
            vec: false,
            dsync: false,
            sync_first: false,
            ud: 0,
            off: 0,
            left: 0,
            total: 0,
            addr: 0,
            iov_at: 0,
            iov: Vec::new(),
            data: Data::None,
        }
    }

    /// Force Unit Access as `flags` say, for a read or a write.
    #[inline(always)]
    fn set_fua(&mut self, write: bool, flags: RwFlags) {
        let fua = flags.fua();
        self.dsync = fua && write;
        self.sync_first = fua && !write;
    }

    /// `n` more bytes went through.
    fn advance(&mut self, n: u64) {
        self.off += n;
        self.left -= n;
        if !self.vec {
            self.addr += n;
            return;
        }
        let mut n = n as usize;
        while n > 0 && self.iov_at < self.iov.len() {
            let v = &mut self.iov[self.iov_at];
            if n >= v.len {
                n -= v.len;
                self.iov_at += 1;
            } else {
                v.base += n;
                v.len -= n;
                n = 0;
            }
        }
    }
}

/// A region a channel knows about.
struct Known {
    start: u64,
    end: u64,
    /// Its index in the ring's buffer table (NO_BUF: not registered).
    index: u16,
}

#[cold]
#[inline(never)]
fn yield_core() {
    // SAFETY: sched_yield takes no arguments and cannot fail in a way
    // that matters here.
    unsafe { libc::sched_yield() };
}

pub(crate) struct UringChan {
    ring: IoUring,
    /// With iopoll: an interrupt-driven ring for fsync and fallocate,
    /// which a polled ring refuses.
    side: Option<IoUring>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    inflight: u32,
    depth: u32,
    /// SQEs pushed since the last submit, per ring.
    queued: bool,
    side_queued: bool,
    sqpoll: bool,
    /// COOP_TASKRUN: completions wait for the next enter (flagged).
    coop: bool,
    iopoll: bool,
    fixed_file: bool,
    raw_fd: RawFd,
    align_mask: u64,
    fixed_bufs: bool,
    known: Vec<Known>,
    /// The file system still seems to take PUNCH_HOLE / ZERO_RANGE.
    punch: bool,
    zero_range: bool,
    eventfd: Option<OwnedFd>,
    shared: Arc<UringShared>,
    /// Polls in a row that found nothing while requests were in flight.
    empty_polls: u32,
    /// `UringOptions::yield_after`.
    yield_after: u32,
}

/// The SQE built by `$e` with `$f` the channel's file (registered or not).
macro_rules! with_fd {
    ($ch:expr, $f:ident => $e:expr) => {
        if $ch.fixed_file {
            let $f = types::Fixed(0);
            $e
        } else {
            let $f = types::Fd($ch.raw_fd);
            $e
        }
    };
}

impl UringChan {
    pub fn open(sh: &Arc<UringShared>, opts: &ChannelOptions, name: &str) -> Result<UringChan> {
        let o = &sh.opts;
        let path = sh.path();
        if opts.depth > MAX_ENTRIES {
            return Err(Error::Invalid {
                name: name.to_string(),
                msg: format!(
                    "channel depth {} exceeds io_uring's {MAX_ENTRIES} ring entries",
                    opts.depth
                ),
            });
        }
        let oserr = |what: &str, e: std::io::Error| Error::Os {
            name: name.to_string(),
            source: os(path, what, e),
        };
        let entries = opts.depth.next_power_of_two().max(2);
        let mut b = IoUring::builder();
        if let Some(idle) = o.sqpoll {
            b.setup_sqpoll(idle);
        }
        if o.iopoll {
            b.setup_iopoll();
        }
        // Without an eventfd to wake a sleeper, the kernel need not
        // interrupt the thread to post completions (COOP_TASKRUN): it
        // flags them and the next poll enters the kernel to post them. An
        // eventfd is only signalled once they are posted, so a thread
        // sleeping on it needs the interruption.
        let mut coop = !o.wake_fd;
        if coop {
            b.setup_coop_taskrun();
            b.setup_taskrun_flag();
        }
        let ring = match b.build(entries) {
            // COOP_TASKRUN is Linux 5.19+: without it the kernel
            // interrupts the thread instead.
            Err(e) if coop && e.raw_os_error() == Some(libc::EINVAL) => {
                let mut b = IoUring::builder();
                if let Some(idle) = o.sqpoll {
                    b.setup_sqpoll(idle);
                }
                if o.iopoll {
                    b.setup_iopoll();
                }
                coop = false;
                b.build(entries)
            }
            r => r,
        }
        .map_err(|e| oserr(&format!("io_uring setup ({entries} entries)"), e))?;
        let side = if o.iopoll {
            Some(
                IoUring::new(entries)
                    .map_err(|e| oserr(&format!("io_uring setup ({entries} entries)"), e))?,
            )
        } else {
            None
        };
        let raw_fd = sh.file.as_raw_fd();
        let mut fixed_file = false;
        if o.register_files {
            let reg = |r: &IoUring| r.submitter().register_files(&[raw_fd]);
            match reg(&ring).and_then(|()| side.as_ref().map_or(Ok(()), reg)) {
                Ok(()) => fixed_file = true,
                Err(e) => {
                    tracing::warn!(bdev = name, error = %e, "cannot register the file with io_uring; using its descriptor")
                }
            }
        }
        let mut fixed_bufs = false;
        if sh.pool.is_some() {
            match ring.submitter().register_buffers_sparse(MAX_REGIONS as u32) {
                Ok(()) => fixed_bufs = true,
                Err(e) => {
                    tracing::warn!(bdev = name, error = %e, "cannot register a buffer table with io_uring; using plain reads and writes")
                }
            }
        }
        let eventfd = if o.wake_fd {
            // SAFETY: eventfd takes no pointers; a non-negative result is
            // a new descriptor only we own.
            let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
            if fd < 0 {
                return Err(oserr("eventfd", std::io::Error::last_os_error()));
            }
            // SAFETY: fd is a fresh descriptor owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            ring.submitter()
                .register_eventfd(fd.as_raw_fd())
                .map_err(|e| oserr("register eventfd", e))?;
            Some(fd)
        } else {
            None
        };
        Ok(UringChan {
            ring,
            side,
            slots: (0..opts.depth).map(|_| Slot::new()).collect(),
            free: (0..opts.depth).rev().collect(),
            inflight: 0,
            depth: opts.depth,
            queued: false,
            side_queued: false,
            sqpoll: o.sqpoll.is_some(),
            coop,
            iopoll: o.iopoll,
            fixed_file,
            raw_fd,
            align_mask: sh.buf_align as u64 - 1,
            fixed_bufs,
            known: Vec::new(),
            punch: true,
            zero_range: true,
            eventfd,
            shared: sh.clone(),
            empty_polls: 0,
            yield_after: o.yield_after,
        })
    }

    pub fn outstanding(&self) -> usize {
        self.inflight as usize
    }

    pub fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.eventfd.as_ref().map(|f| f.as_fd())
    }

    /// A free slot, or why there is none.
    #[inline(always)]
    fn take_slot(&mut self) -> Result<usize, SubmitError> {
        if self.shared.failed.load(Ordering::Relaxed) {
            return Err(SubmitError::Failed);
        }
        match self.free.pop() {
            Some(i) => Ok(i as usize),
            None => Err(SubmitError::QueueFull { depth: self.depth }),
        }
    }

    #[inline(always)]
    fn check_addr(&self, addr: u64) -> Result<(), SubmitError> {
        if addr & self.align_mask != 0 {
            return Err(SubmitError::Unaligned {
                addr,
                align: self.align_mask as u32 + 1,
            });
        }
        Ok(())
    }

    /// The registered buffer holding `[addr, addr + len)`, if any.
    #[inline(always)]
    fn buf_index(&mut self, addr: u64, len: u64) -> u16 {
        if !self.fixed_bufs {
            return NO_BUF;
        }
        for k in &self.known {
            if addr >= k.start && addr + len <= k.end {
                return k.index;
            }
        }
        self.learn(addr, len)
    }

    /// Registers the regions published since the channel last looked.
    #[cold]
    #[inline(never)]
    fn learn(&mut self, addr: u64, len: u64) -> u16 {
        let Some(pool) = &self.shared.pool else {
            return NO_BUF;
        };
        let mut found = NO_BUF;
        for r in self.known.len()..pool.published() {
            let (start, end) = pool.span(r);
            let iov = libc::iovec {
                iov_base: start as usize as *mut libc::c_void,
                iov_len: (end - start) as usize,
            };
            // SAFETY: the region stays mapped until the pool is dropped;
            // this channel holds the pool (through `shared`) and its rings
            // are closed before it lets go of it.
            let r2 = unsafe {
                self.ring
                    .submitter()
                    .register_buffers_update(r as u32, &[iov], None)
            };
            let index = match r2 {
                Ok(()) => r as u16,
                Err(e) => {
                    tracing::warn!(region = r, error = %e, "cannot register a buffer region with io_uring; plain reads and writes for it");
                    NO_BUF
                }
            };
            self.known.push(Known { start, end, index });
            if addr >= start && addr + len <= end {
                found = index;
            }
        }
        found
    }

    /// Reads or writes one buffer at byte `off` (checked by the layer).
    #[inline(always)]
    pub fn rw(
        &mut self,
        write: bool,
        off: u64,
        mut buf: IoBuf,
        flags: RwFlags,
        ud: u64,
    ) -> Result<(), Refused> {
        let len = buf.len() as u64;
        let addr = buf.as_mut_slice().as_mut_ptr() as u64;
        let i = match self.admit_rw(addr, len) {
            Ok(i) => i,
            Err(e) => return Err(Refused::new(e, Data::One(buf))),
        };
        let bi = self.buf_index(addr, len);
        let s = &mut self.slots[i];
        s.op = if write { Op::Write } else { Op::Read };
        s.buf_index = bi;
        s.vec = false;
        s.set_fua(write, flags);
        s.ud = ud;
        s.off = off;
        s.left = len;
        s.total = len;
        s.addr = addr;
        s.data = Data::One(buf);
        self.start(i).map_err(|(e, d)| Refused::new(e, d))
    }

    #[inline(always)]
    fn admit_rw(&mut self, addr: u64, len: u64) -> Result<usize, SubmitError> {
        if len > MAX_IO {
            return Err(SubmitError::TooLarge { len, max: MAX_IO });
        }
        self.check_addr(addr)?;
        self.take_slot()
    }

    /// Reads or writes a vector (`len` bytes in all) at byte `off`.
    pub fn rwv(
        &mut self,
        write: bool,
        off: u64,
        len: u64,
        mut bufs: Vec<IoBuf>,
        flags: RwFlags,
        ud: u64,
    ) -> Result<(), Refused> {
        let mut check = || {
            if bufs.len() > IOV_MAX {
                return Err(SubmitError::TooManySegments {
                    n: bufs.len(),
                    max: IOV_MAX,
                });
            }
            if len > MAX_IO {
                return Err(SubmitError::TooLarge { len, max: MAX_IO });
            }
            for b in bufs.iter_mut() {
                self.check_addr(b.as_mut_slice().as_mut_ptr() as u64)?;
            }
            self.take_slot()
        };
        let i = match check() {
            Ok(i) => i,
            Err(e) => return Err(Refused::new(e, Data::Vec(Box::new(bufs)))),
        };
        let s = &mut self.slots[i];
        s.iov.clear();
        for b in bufs.iter_mut() {
            let sl = b.as_mut_slice();
            s.iov.push(Iov {
                base: sl.as_mut_ptr() as usize,
                len: sl.len(),
            });
        }
        s.data = Data::Vec(Box::new(bufs));
        self.start_vec(i, write, off, len, flags, ud)
            .map_err(|(e, d)| Refused::new(e, d))
    }

    /// `rwv` on borrowed memory.
    ///
    /// # Safety
    /// As `Io::readv_raw` / `Io::writev_raw`: every segment stays valid
    /// (and untouched by others) until its completion is delivered or the
    /// channel is dropped (which waits for the kernel).
    pub unsafe fn rwv_raw(
        &mut self,
        write: bool,
        off: u64,
        len: u64,
        segs: &[RawSeg],
        flags: RwFlags,
        ud: u64,
    ) -> Result<(), SubmitError> {
        if segs.len() > IOV_MAX {
            return Err(SubmitError::TooManySegments {
                n: segs.len(),
                max: IOV_MAX,
            });
        }
        if len > MAX_IO {
            return Err(SubmitError::TooLarge { len, max: MAX_IO });
        }
        for s in segs {
            self.check_addr(s.ptr as u64)?;
        }
        let i = self.take_slot()?;
        let s = &mut self.slots[i];
        s.iov.clear();
        s.iov.extend(segs.iter().map(|g| Iov {
            base: g.ptr as usize,
            len: g.len,
        }));
        s.data = Data::None;
        self.start_vec(i, write, off, len, flags, ud)
            .map_err(|(e, _)| e)
    }

    fn start_vec(
        &mut self,
        i: usize,
        write: bool,
        off: u64,
        len: u64,
        flags: RwFlags,
        ud: u64,
    ) -> Result<(), (SubmitError, Data)> {
        let s = &mut self.slots[i];
        s.op = if write { Op::Write } else { Op::Read };
        s.buf_index = NO_BUF;
        s.vec = true;
        s.set_fua(write, flags);
        s.iov_at = 0;
        s.ud = ud;
        s.off = off;
        s.left = len;
        s.total = len;
        self.start(i)
    }

    /// Flush, write zeroes, unmap or reset (`off`, `len` in bytes, checked
    /// by the layer).
    pub fn other(&mut self, op: Op, off: u64, len: u64, ud: u64) -> Result<(), SubmitError> {
        let i = self.take_slot()?;
        let op = match op {
            Op::Punch if !self.punch => self.zero_op(),
            Op::Zero => self.zero_op(),
            o => o,
        };
        let s = &mut self.slots[i];
        s.op = op;
        s.buf_index = NO_BUF;
        s.vec = false;
        s.dsync = false;
        s.sync_first = false;
        s.ud = ud;
        s.off = off;
        s.left = len;
        s.total = len;
        s.data = Data::None;
        self.start(i).map_err(|(e, _)| e)
    }

    fn zero_op(&self) -> Op {
        if self.zero_range {
            Op::Zero
        } else {
            Op::ZeroWrite
        }
    }

    /// Marks slot `i` in flight and queues its first SQE. If the ring has
    /// no room (it cannot happen: every slot has at most one SQE and the
    /// ring holds them all) the slot is freed and its data handed back.
    #[inline(always)]
    fn start(&mut self, i: usize) -> Result<(), (SubmitError, Data)> {
        if self.issue(i) {
            self.slots[i].busy = true;
            self.inflight += 1;
            return Ok(());
        }
        tracing::error!(slot = i, "io_uring submission ring full");
        self.free.push(i as u32);
        let data = std::mem::take(&mut self.slots[i].data);
        Err((SubmitError::QueueFull { depth: self.depth }, data))
    }

    /// Queues the SQE of slot `i`'s next step; false if the ring had no
    /// room even after a submit.
    #[inline(always)]
    fn issue(&mut self, i: usize) -> bool {
        let s = &self.slots[i];
        let mut side = false;
        // RWF_DSYNC for a write with FUA.
        let wf = if s.dsync { libc::RWF_DSYNC } else { 0 };
        let e = match s.op {
            _ if s.sync_first => {
                side = true;
                with_fd!(self, f => opcode::Fsync::new(f).flags(types::FsyncFlags::DATASYNC).build())
            }
            Op::Read | Op::Write if s.vec => {
                let iov = s.iov[s.iov_at..].as_ptr().cast::<libc::iovec>();
                let n = (s.iov.len() - s.iov_at) as u32;
                if s.op == Op::Read {
                    with_fd!(self, f => opcode::Readv::new(f, iov, n).offset(s.off).build())
                } else {
                    with_fd!(self, f => opcode::Writev::new(f, iov, n).offset(s.off).rw_flags(wf).build())
                }
            }
            Op::Read => {
                let (p, n) = (s.addr as usize as *mut u8, s.left as u32);
                if s.buf_index != NO_BUF {
                    with_fd!(self, f => opcode::ReadFixed::new(f, p, n, s.buf_index).offset(s.off).build())
                } else {
                    with_fd!(self, f => opcode::Read::new(f, p, n).offset(s.off).build())
                }
            }
            Op::Write => {
                let (p, n) = (s.addr as usize as *const u8, s.left as u32);
                if s.buf_index != NO_BUF {
                    with_fd!(self, f => opcode::WriteFixed::new(f, p, n, s.buf_index).offset(s.off).rw_flags(wf).build())
                } else {
                    with_fd!(self, f => opcode::Write::new(f, p, n).offset(s.off).rw_flags(wf).build())
                }
            }
            Op::ZeroWrite => {
                let p = self.shared.zeroes.as_slice().as_ptr();
                let n = s.left.min(ZCHUNK as u64) as u32;
                with_fd!(self, f => opcode::Write::new(f, p, n).offset(s.off).build())
            }
            Op::Flush => {
                side = true;
                with_fd!(self, f => opcode::Fsync::new(f).flags(types::FsyncFlags::DATASYNC).build())
            }
            Op::Zero | Op::Punch => {
                side = true;
                let mode = libc::FALLOC_FL_KEEP_SIZE
                    | if s.op == Op::Zero {
                        libc::FALLOC_FL_ZERO_RANGE
                    } else {
                        libc::FALLOC_FL_PUNCH_HOLE
                    };
                with_fd!(self, f => opcode::Fallocate::new(f, s.left).offset(s.off).mode(mode).build())
            }
            Op::Drain => opcode::Nop::new().build().flags(squeue::Flags::IO_DRAIN),
        };
        let e = e.user_data(i as u64);
        let (ring, queued) = match (&mut self.side, side) {
            (Some(r), true) => (r, &mut self.side_queued),
            _ => (&mut self.ring, &mut self.queued),
        };
        *queued = true;
        push(ring, &e)
    }

    /// Submits what was queued: one `io_uring_enter` (none with SQPOLL
    /// while its thread is awake); with IOPOLL it also polls the device
    /// for completions while requests are in flight.
    #[inline(always)]
    pub fn kick(&mut self) {
        if self.queued
            || (self.iopoll && self.inflight > 0)
            || (self.coop && self.inflight > 0 && self.ring.submission().taskrun())
        {
            self.queued = false;
            if let Err(e) = self.ring.submit() {
                self.queued = true;
                submit_failed(e);
            } else if !self.sqpoll && !self.ring.submission().is_empty() {
                self.queued = true;
            }
        }
        if self.side_queued {
            if let Some(r) = &mut self.side {
                self.side_queued = false;
                if let Err(e) = r.submit() {
                    self.side_queued = true;
                    submit_failed(e);
                }
            }
        }
    }

    /// Copies up to `out.len()` CQEs of the polled ring (`side`: of the
    /// iopoll side ring) out, freeing their ring space.
    #[inline(always)]
    pub fn reap<'a>(
        &mut self,
        side: bool,
        out: &'a mut [MaybeUninit<cqueue::Entry>],
    ) -> &'a [cqueue::Entry] {
        let ring = if side {
            match &mut self.side {
                Some(r) => r,
                None => return &[],
            }
        } else {
            &mut self.ring
        };
        ring.completion().fill(out)
    }

    /// A poll found `n` completions. After `yield_after` empty polls in a
    /// row with requests in flight, yields the core (see
    /// `UringOptions::yield_after`).
    #[inline(always)]
    pub fn polled(&mut self, n: u32) {
        if n > 0 || self.inflight == 0 || self.yield_after == 0 {
            self.empty_polls = 0;
            return;
        }
        self.empty_polls += 1;
        if self.empty_polls == self.yield_after {
            self.empty_polls = 0;
            yield_core();
        }
    }

    pub fn has_side(&self) -> bool {
        self.side.is_some()
    }

    /// A CQE: the completion to deliver, or None (not a request's, or its
    /// request goes on with another SQE).
    #[inline(always)]
    pub fn on_cqe(&mut self, e: &cqueue::Entry) -> Option<Completion> {
        let i = e.user_data() as usize;
        let res = e.result();
        let s = self.slots.get(i)?;
        if !s.busy {
            return None;
        }
        let result = if res >= 0 && res as u64 == s.left && matches!(s.op, Op::Read | Op::Write) {
            Ok(0)
        } else {
            self.step(i, res)?
        };
        Some(self.finish(i, result))
    }

    /// Frees slot `i` and makes its completion.
    #[inline(always)]
    fn finish(&mut self, i: usize, mut result: Result<u32, IoError>) -> Completion {
        let s = &mut self.slots[i];
        s.busy = false;
        let data = std::mem::take(&mut s.data);
        let user_data = s.ud;
        self.free.push(i as u32);
        self.inflight -= 1;
        if self.shared.failed.load(Ordering::Relaxed) {
            result = Err(IoError::Failed);
        }
        Completion {
            user_data,
            result,
            data,
        }
    }

    /// Anything but a full transfer: the request's result, or None if it
    /// goes on (remainder of a short transfer, a zeroing fallback).
    #[cold]
    #[inline(never)]
    fn step(&mut self, i: usize, res: i32) -> Option<Result<u32, IoError>> {
        let s = &mut self.slots[i];
        if s.sync_first {
            // A FUA read's fdatasync is done: now the read.
            if res < 0 {
                return Some(Err(IoError::os(-res)));
            }
            s.sync_first = false;
            return self.reissue(i);
        }
        let short = |s: &Slot| {
            tracing::warn!(
                expected = s.total,
                got = s.total - s.left,
                "transfer ended early (the file shrank?): failing it with ENODATA"
            );
            IoError::os(libc::ENODATA)
        };
        match s.op {
            Op::Zero | Op::Punch if res == -libc::EOPNOTSUPP => {
                if s.op == Op::Punch {
                    tracing::debug!(path = %self.shared.path.display(), "PUNCH_HOLE refused; unmap zeroes instead");
                    self.punch = false;
                } else {
                    tracing::debug!(path = %self.shared.path.display(), "ZERO_RANGE refused; writing zeroes instead");
                    self.zero_range = false;
                }
                let op = self.zero_op();
                self.slots[i].op = op;
                return self.reissue(i);
            }
            _ if res < 0 => return Some(Err(IoError::os(-res))),
            Op::Flush | Op::Drain | Op::Zero | Op::Punch => return Some(Ok(0)),
            Op::Read | Op::Write | Op::ZeroWrite => {}
        }
        let n = res as u64;
        if n == 0 {
            return Some(Err(short(s)));
        }
        if n >= s.left {
            return Some(Ok(0));
        }
        if s.op == Op::ZeroWrite {
            s.off += n;
            s.left -= n;
        } else {
            s.advance(n);
        }
        self.reissue(i)
    }

    fn reissue(&mut self, i: usize) -> Option<Result<u32, IoError>> {
        if self.issue(i) {
            None
        } else {
            Some(Err(IoError::os(libc::EBUSY)))
        }
    }

    /// Waits up to `timeout` for a completion (submitting what is queued).
    pub fn wait(&mut self, timeout: Duration) {
        if self.inflight == 0 {
            return;
        }
        if self.side_queued || self.side.is_some() {
            self.kick();
        }
        self.queued = false;
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new().timespec(&ts);
        let r = if self.ring.params().is_feature_ext_arg() {
            self.ring.submitter().submit_with_args(1, &args)
        } else {
            // Before Linux 5.11: no timeout; some request is in flight,
            // so a completion comes.
            self.ring.submit_and_wait(1)
        };
        match r {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => {}
            Err(e) => {
                self.queued = true;
                submit_failed(e);
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Drop: the request of a CQE is over; free its slot.
    fn forget(&mut self, e: &cqueue::Entry) {
        let i = e.user_data() as usize;
        if let Some(s) = self.slots.get_mut(i) {
            if s.busy {
                s.busy = false;
                drop(std::mem::take(&mut s.data));
                self.free.push(i as u32);
                self.inflight -= 1;
            }
        }
    }
}

/// Pushes one SQE, submitting first if the ring is full.
#[inline(always)]
fn push(ring: &mut IoUring, e: &squeue::Entry) -> bool {
    // SAFETY: what the SQE points at (buffers, the iovec array, the zero
    // buffer) stays valid until its CQE: the slot keeps the buffers and
    // iovecs until then, the zero buffer lives as long as the channel
    // (through `shared`), and dropping the channel waits for every CQE.
    if unsafe { ring.submission().push(e) }.is_ok() {
        return true;
    }
    if let Err(err) = ring.submit() {
        submit_failed(err);
    }
    // SAFETY: as above.
    unsafe { ring.submission().push(e) }.is_ok()
}

#[cold]
fn submit_failed(e: std::io::Error) {
    match e.raw_os_error() {
        // Transient: what is queued goes with the next submit.
        Some(libc::EAGAIN | libc::EBUSY | libc::EINTR) => {}
        _ => tracing::error!(error = %e, "io_uring_enter failed"),
    }
}

impl Drop for UringChan {
    fn drop(&mut self) {
        if self.inflight == 0 {
            return;
        }
        tracing::debug!(
            n = self.inflight,
            "io_uring channel dropped with requests in flight: cancelling and waiting for the kernel"
        );
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any())
            .build()
            .user_data(CANCEL_UD);
        push(&mut self.ring, &cancel);
        self.queued = true;
        if let Some(r) = &mut self.side {
            push(r, &cancel);
            self.side_queued = true;
        }
        let t0 = Instant::now();
        let mut warned = t0;
        let mut buf = [const { MaybeUninit::<cqueue::Entry>::uninit() }; REAP_BATCH];
        while self.inflight > 0 {
            self.kick();
            self.wait(Duration::from_millis(10));
            for side in [false, true] {
                loop {
                    let got = self.reap(side, &mut buf);
                    if got.is_empty() {
                        break;
                    }
                    for e in got.iter() {
                        self.forget(e);
                    }
                }
            }
            if warned.elapsed() >= Duration::from_secs(5) {
                warned = Instant::now();
                tracing::warn!(
                    n = self.inflight,
                    waited_s = t0.elapsed().as_secs(),
                    "still waiting for the kernel to finish requests of a dropped io_uring channel"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::channel::ChanBe;
    use crate::{Bdev, ChannelOptions};

    struct Temp(PathBuf);
    impl Drop for Temp {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn bdev(tag: &str, register_buffers: bool) -> (Temp, Bdev) {
        let p =
            std::env::temp_dir().join(format!("pollux-uring-unit-{}-{tag}", std::process::id()));
        std::fs::File::create(&p).unwrap();
        let o = UringOptions {
            direct: false,
            size: Some(1 << 20),
            register_buffers,
            ..Default::default()
        };
        let b = Bdev::uring("t", &p, o).unwrap();
        (Temp(p), b)
    }

    fn addr(b: &mut IoBuf) -> u64 {
        b.as_mut_slice().as_mut_ptr() as u64
    }

    #[test]
    fn pool_buffers_are_found_in_registered_regions() {
        let (_t, b) = bdev("fixed", true);
        let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
        let ChanBe::Uring(u) = &mut ch.be else {
            panic!("not a uring channel")
        };
        let mut x = b.alloc_buf(8192).unwrap();
        assert_eq!(u.buf_index(addr(&mut x), 8192), 0, "first region");
        // A piece of it too.
        let (_, mut tail) = x.split_at(4096);
        assert_eq!(u.buf_index(addr(&mut tail), 4096), 0);
        // Beyond the first region's 4 MiB: a second region, registered
        // when first seen.
        let mut big = b.alloc_buf(5 << 20).unwrap();
        assert_eq!(u.buf_index(addr(&mut big), 5 << 20), 1);
        assert_eq!(u.known.len(), 2);
        // Memory of no region goes plain.
        let mut plain = crate::mem::alloc_host_buf(4096).unwrap();
        assert_eq!(u.buf_index(addr(&mut plain), 4096), NO_BUF);
        // A range running past its region's end is not in it.
        let (start, end) = b_pool(&b).span(0);
        assert!(u.buf_index(end - 4096, 8192) == NO_BUF && end - start == REGION_MIN as u64);
    }

    fn b_pool(b: &Bdev) -> Arc<Pool> {
        match &b.0.backend {
            crate::bdev::Shared::Uring(u) => u.pool.clone().unwrap(),
            _ => panic!("not uring"),
        }
    }

    #[test]
    fn without_registration_nothing_is_fixed() {
        let (_t, b) = bdev("plain", false);
        let mut ch = b.open(true).channel(&ChannelOptions::default()).unwrap();
        let ChanBe::Uring(u) = &mut ch.be else {
            panic!("not a uring channel")
        };
        let mut x = b.alloc_buf(8192).unwrap();
        assert_eq!(u.buf_index(addr(&mut x), 8192), NO_BUF);
    }

    #[test]
    fn pool_memory_is_reused_zeroed_and_coalesced() {
        let (_t, b) = bdev("pool", true);
        let mut x = b.alloc_buf(4096).unwrap();
        let a = addr(&mut x);
        x.as_mut_slice().fill(7);
        drop(x);
        let mut y = b.alloc_buf(4096).unwrap();
        assert_eq!(addr(&mut y), a, "the freed range is reused");
        assert!(y.as_slice().iter().all(|&v| v == 0), "and zeroed");
        drop(y);
        // Three neighbours freed out of order merge back into one range:
        // the whole region is then one free range again.
        let bufs: Vec<IoBuf> = (0..3).map(|_| b.alloc_buf(4096).unwrap()).collect();
        let mut it = bufs.into_iter();
        let (p, q, r) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        drop(q);
        drop(p);
        drop(r);
        let pool = b_pool(&b);
        let g = lock(&pool.inner);
        assert_eq!(g.free[0], vec![(0, REGION_MIN)]);
    }

    #[test]
    fn free_list_first_fit_and_merge() {
        let mut f = vec![(0, 100)];
        assert_eq!(take(&mut f, 30), Some(0));
        assert_eq!(take(&mut f, 30), Some(30));
        assert_eq!(take(&mut f, 50), None);
        give(&mut f, 0, 30);
        assert_eq!(f, vec![(0, 30), (60, 40)]);
        give(&mut f, 30, 30);
        assert_eq!(f, vec![(0, 100)]);
    }
}
