//! A channel: its rings (set up here), slots and known regions; dropping
//! it waits for the kernel.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use io_uring::{squeue, IoUring};

use super::open::{os, UringShared};
use super::options::MAX_ENTRIES;
use super::pool::MAX_REGIONS;
use super::slot::Slot;
use crate::error::{Error, Result};
use crate::options::ChannelOptions;

/// A region a channel knows about.
pub(super) struct Known {
    pub(super) start: u64,
    pub(super) end: u64,
    /// Its index in the ring's buffer table (NO_BUF: not registered).
    pub(super) index: u16,
}

pub(crate) struct UringChan {
    pub(super) ring: IoUring,
    /// With iopoll: an interrupt-driven ring for fsync and fallocate,
    /// which a polled ring refuses.
    pub(super) side: Option<IoUring>,
    pub(super) slots: Vec<Slot>,
    pub(super) free: Vec<u32>,
    pub(super) inflight: u32,
    pub(super) depth: u32,
    /// SQEs pushed since the last submit, per ring.
    pub(super) queued: bool,
    pub(super) side_queued: bool,
    pub(super) sqpoll: bool,
    /// COOP_TASKRUN: completions wait for the next enter (flagged).
    pub(super) coop: bool,
    pub(super) iopoll: bool,
    pub(super) fixed_file: bool,
    pub(super) raw_fd: RawFd,
    pub(super) align_mask: u64,
    pub(super) fixed_bufs: bool,
    pub(super) known: Vec<Known>,
    /// The file system still seems to take PUNCH_HOLE / ZERO_RANGE.
    pub(super) punch: bool,
    pub(super) zero_range: bool,
    pub(super) eventfd: Option<OwnedFd>,
    pub(super) shared: Arc<UringShared>,
    /// Polls in a row that found nothing while requests were in flight.
    pub(super) empty_polls: u32,
    /// `UringOptions::yield_after`.
    pub(super) yield_after: u32,
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
}

#[cold]
pub(super) fn submit_failed(e: std::io::Error) {
    match e.raw_os_error() {
        // Transient: what is queued goes with the next submit.
        Some(libc::EAGAIN | libc::EBUSY | libc::EINTR) => {}
        _ => tracing::error!(error = %e, "io_uring_enter failed"),
    }
}

/// Pushes one SQE, submitting first if the ring is full.
#[inline(always)]
pub(super) fn push(ring: &mut IoUring, e: &squeue::Entry) -> bool {
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
