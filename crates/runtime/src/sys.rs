//! The syscall boundary: epoll, eventfd, timerfd and CPU affinity via libc.
//! Every `unsafe` block of the crate lives here.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: libc::c_int) -> io::Result<OwnedFd> {
    let fd = cvt(fd)?;
    // SAFETY: `fd` was just returned by the kernel and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// An eventfd (non-blocking, close-on-exec): becomes readable once
/// `signal`led until `drain`ed. The runtime uses one per thread to wake it
/// from epoll; users may use it to wake a thread through
/// [`ThreadCtx::register_wake_fd`](crate::ThreadCtx::register_wake_fd).
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// Creates an eventfd with a zero counter.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall without pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        owned(fd).map(Self)
    }

    /// Adds one to the counter, making the descriptor readable.
    pub fn signal(&self) -> io::Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64.
        let n = unsafe {
            libc::write(
                self.0.as_raw_fd(),
                (&one as *const u64).cast::<libc::c_void>(),
                8,
            )
        };
        match n {
            8 => Ok(()),
            // A saturated counter is still readable: the wake-up is not lost.
            _ if io::Error::last_os_error().kind() == io::ErrorKind::WouldBlock => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Resets the counter; returns its value (0 if it was not signalled).
    pub fn drain(&self) -> io::Result<u64> {
        read_u64(self.0.as_fd())
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Reads the 8-byte counter of an eventfd/timerfd; 0 if it would block.
fn read_u64(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: reads at most 8 bytes into a live u64.
    let n = unsafe {
        libc::read(
            fd.as_raw_fd(),
            (&mut v as *mut u64).cast::<libc::c_void>(),
            8,
        )
    };
    if n == 8 {
        return Ok(v);
    }
    let e = io::Error::last_os_error();
    if e.kind() == io::ErrorKind::WouldBlock {
        Ok(0)
    } else {
        Err(e)
    }
}

/// A relative CLOCK_MONOTONIC timerfd (non-blocking).
#[derive(Debug)]
pub(crate) struct TimerFd(OwnedFd);

impl TimerFd {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: plain syscall without pointers.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        owned(fd).map(Self)
    }

    /// Arms the timer to expire once after `after` (None: disarms it).
    pub(crate) fn set(&self, after: Option<Duration>) -> io::Result<()> {
        let value = match after {
            // A zero it_value would disarm: round up to 1 ns.
            Some(d) => libc::timespec {
                tv_sec: d.as_secs().min(i64::MAX as u64 / 2) as libc::time_t,
                tv_nsec: if d.is_zero() {
                    1
                } else {
                    d.subsec_nanos() as libc::c_long
                },
            },
            None => libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
        };
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: value,
        };
        // SAFETY: `spec` is a live itimerspec; the old value is not wanted.
        let r =
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        cvt(r).map(drop)
    }

    pub(crate) fn drain(&self) -> io::Result<u64> {
        read_u64(self.0.as_fd())
    }
}

impl AsFd for TimerFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// An epoll instance watching descriptors for readability
/// (level-triggered), each tagged with a u64 token. The runtime sleeps in
/// one per thread; users may keep their own to learn which of their
/// descriptors are readable without touching them.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    /// A new, empty epoll instance (close-on-exec).
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall without pointers.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        owned(fd).map(Self)
    }

    /// Watches `fd` for readability; its events carry `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `ev` is a live epoll_event; the kernel validates `fd`.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        cvt(r).map(drop)
    }

    /// Stops watching `fd` (closing it does too).
    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: `ev` is a live epoll_event (ignored by DEL on new kernels,
        // required non-null by old ones); the kernel validates `fd`.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
        cvt(r).map(drop)
    }

    /// Waits until a descriptor is readable (forever if `timeout_ms` < 0);
    /// returns how many events were stored. An interrupted wait returns 0.
    pub fn wait(&self, events: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        let max = events.len().min(libc::c_int::MAX as usize) as libc::c_int;
        // SAFETY: `events` is a live, writable buffer of at least `max`
        // entries for the duration of the call.
        let r =
            unsafe { libc::epoll_wait(self.0.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        match cvt(r) {
            Ok(n) => Ok(n as usize),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Why [`pin_to_core`] could not pin the calling thread.
#[derive(Debug, thiserror::Error)]
pub enum PinError {
    /// The core number does not fit in a CPU set.
    #[error("core {core} is beyond CPU_SETSIZE ({max})")]
    OutOfRange { core: usize, max: usize },
    /// The kernel refused (e.g. EINVAL: the core is offline or outside
    /// this process's cgroup or affinity).
    #[error("sched_setaffinity to core {core}: {source}")]
    Affinity {
        core: usize,
        #[source]
        source: io::Error,
    },
}

impl From<PinError> for io::Error {
    fn from(e: PinError) -> io::Error {
        let kind = match &e {
            PinError::OutOfRange { .. } => io::ErrorKind::InvalidInput,
            PinError::Affinity { source, .. } => source.kind(),
        };
        io::Error::new(kind, e)
    }
}

/// Pins the calling thread to `core` (`sched_setaffinity`): every pinned
/// thread of pollux (runtime threads, the emulated controllers' device
/// thread, perf's workers) is pinned by this function.
pub fn pin_to_core(core: usize) -> Result<(), PinError> {
    let max = libc::CPU_SETSIZE as usize;
    if core >= max {
        return Err(PinError::OutOfRange { core, max });
    }
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `core` < CPU_SETSIZE was checked above.
    unsafe { libc::CPU_SET(core, &mut set) };
    // SAFETY: `set` is a live cpu_set_t of the size passed; pid 0 is the
    // calling thread.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    cvt(r)
        .map(drop)
        .map_err(|source| PinError::Affinity { core, source })
}
