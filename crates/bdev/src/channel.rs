//! The submit path: a thread's [`Channel`] and its borrowed submission
//! view [`Io`], which completion handlers get too.
//!
//! Every request is checked here the same way for every backend (user
//! data, write permission, whole blocks, range), counted in the channel's
//! statistics, and handed to its backend by one `match`: no `dyn` call.
//! For NVMe the range and length checks are the queue pair's own (it makes
//! them anyway), so the layer adds no second copy of them.

use pollux_nvme::IoBuf;
use pollux_spec::cmd::RwFlags;
use pollux_spec::Sqe;

use crate::bdev::Bdev;
use crate::common::Common;
use crate::data::{Completion, Data, RawSeg};
use crate::error::{IoError, Refused, SubmitError};
use crate::local::{LocalChan, LocalOp};
use crate::nvme::{self, from_nvme, nvme_refused, NvmeChan, NvmeSide};
use crate::split::MAX_CHILDREN;
use crate::uring::{Op as UringOp, UringChan};

// Boxing the queue pair would add a dependent load to every request.
#[allow(clippy::large_enum_variant)]
pub(crate) enum ChanBe {
    Local(LocalChan),
    Nvme(NvmeChan),
    Uring(UringChan),
    NvmeMp(pollux_host::MpQueuePair),
}

/// A thread's channel to a bdev. All I/O on it is lock-free and
/// atomic-free; it is `Send` (it may be built on one thread and moved to
/// the one that uses it) but not shared: every call takes `&mut self`.
pub struct Channel {
    pub(crate) c: Common,
    pub(crate) be: ChanBe,
    bdev: Bdev,
}

impl Channel {
    pub(crate) fn new(c: Common, be: ChanBe, bdev: Bdev) -> Channel {
        Channel { c, be, bdev }
    }

    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// The submission view (what handlers get).
    #[inline(always)]
    pub fn io(&mut self) -> Io<'_> {
        let be = match &mut self.be {
            ChanBe::Local(l) => IoBe::Local(l),
            ChanBe::Nvme(n) => IoBe::Nvme(n.qp.submitter(), &mut n.side),
            ChanBe::Uring(u) => IoBe::Uring(u),
            ChanBe::NvmeMp(m) => IoBe::NvmeMp(m),
        };
        Io { c: &mut self.c, be }
    }

    /// Requests submitted and not yet completed to the handler.
    pub fn outstanding(&self) -> usize {
        match &self.be {
            ChanBe::Local(l) => l.outstanding() + self.c.parents.open_count(),
            ChanBe::Nvme(n) => n.qp.outstanding() as usize + n.side.deferred.len(),
            ChanBe::Uring(u) => u.outstanding(),
            ChanBe::NvmeMp(m) => m.in_flight(),
        }
    }

    /// A descriptor that becomes readable when a completion arrives, so an
    /// idle thread can sleep on it (epoll): io_uring's eventfd (with
    /// `UringOptions::wake_fd`; read it to clear it, then poll once more
    /// before sleeping), an NVMe queue pair's interrupt (when it was
    /// created with interrupts; `nvme_qpair().arm()` before sleeping).
    /// None for null and RAM, whose completions are ready at submission.
    pub fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.be {
            ChanBe::Local(_) => None,
            ChanBe::Nvme(n) => n.qp.interrupt_fd(),
            ChanBe::Uring(u) => u.wake_fd(),
            ChanBe::NvmeMp(_) => None,
        }
    }

    /// The NVMe queue pair behind this channel (stats, interrupts), if any.
    pub fn nvme_qpair(&mut self) -> Option<&mut pollux_host::QueuePair> {
        match &mut self.be {
            ChanBe::Nvme(n) => Some(&mut n.qp),
            ChanBe::Local(_) | ChanBe::Uring(_) | ChanBe::NvmeMp(_) => None,
        }
    }

    /// Tells the backend about requests submitted since the last poll now
    /// (a poll does it anyway).
    pub fn flush(&mut self) {
        match &mut self.be {
            ChanBe::Nvme(n) => n.qp.flush(),
            ChanBe::Uring(u) => u.kick(),
            ChanBe::NvmeMp(m) => m.flush(),
            ChanBe::Local(_) => {}
        }
    }

    #[inline(always)]
    pub fn read(&mut self, lba: u64, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.io().read(lba, buf, user_data)
    }

    #[inline(always)]
    pub fn write(&mut self, lba: u64, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.io().write(lba, buf, user_data)
    }

    /// `Io::read_with`.
    pub fn read_with(
        &mut self,
        lba: u64,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.io().read_with(lba, buf, flags, user_data)
    }

    /// `Io::write_with`.
    pub fn write_with(
        &mut self,
        lba: u64,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.io().write_with(lba, buf, flags, user_data)
    }

    pub fn readv(&mut self, lba: u64, bufs: Vec<IoBuf>, user_data: u64) -> Result<(), Refused> {
        self.io().readv(lba, bufs, user_data)
    }

    pub fn writev(&mut self, lba: u64, bufs: Vec<IoBuf>, user_data: u64) -> Result<(), Refused> {
        self.io().writev(lba, bufs, user_data)
    }

    /// `Io::readv_with`.
    pub fn readv_with(
        &mut self,
        lba: u64,
        bufs: Vec<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.io().readv_with(lba, bufs, flags, user_data)
    }

    /// `Io::writev_with`.
    pub fn writev_with(
        &mut self,
        lba: u64,
        bufs: Vec<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.io().writev_with(lba, bufs, flags, user_data)
    }

    pub fn flush_cache(&mut self, user_data: u64) -> Result<(), SubmitError> {
        self.io().flush_cache(user_data)
    }

    pub fn write_zeroes(&mut self, lba: u64, nlb: u64, user_data: u64) -> Result<(), SubmitError> {
        self.io().write_zeroes(lba, nlb, user_data)
    }

    pub fn unmap(&mut self, lba: u64, nlb: u64, user_data: u64) -> Result<(), SubmitError> {
        self.io().unmap(lba, nlb, user_data)
    }

    pub fn reset(&mut self, user_data: u64) -> Result<(), SubmitError> {
        self.io().reset(user_data)
    }

    pub fn nvme_passthru(
        &mut self,
        sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.io().nvme_passthru(sqe, data, user_data)
    }
}

impl Channel {
    /// `Io::readv_raw` finished within the call where the backend completes
    /// at submission (null, RAM): `Some(result)`, and no completion
    /// follows; `None` (nothing done) where it does not (NVMe, io_uring:
    /// use `readv_raw` and poll). What a synchronous caller (an emulated
    /// controller) uses to skip the queued completion.
    ///
    /// # Safety
    /// Every segment must be valid for writes of its length and untouched
    /// by anything else during the call.
    #[inline(always)]
    pub unsafe fn readv_raw_now(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
    ) -> Option<Result<(), SubmitError>> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw_now(false, lba, segs, RwFlags::NONE) }
    }

    /// `writev_raw` finished within the call where the backend can.
    ///
    /// # Safety
    /// Every segment must be valid for reads of its length and not written
    /// by anything else during the call.
    #[inline(always)]
    pub unsafe fn writev_raw_now(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
    ) -> Option<Result<(), SubmitError>> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw_now(true, lba, segs, RwFlags::NONE) }
    }

    /// `readv_raw_now` with read flags (see `Io::read_with`).
    ///
    /// # Safety
    /// As `readv_raw_now`.
    #[inline(always)]
    pub unsafe fn readv_raw_now_with(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
    ) -> Option<Result<(), SubmitError>> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw_now(false, lba, segs, flags) }
    }

    /// `writev_raw_now` with write flags (see `Io::write_with`).
    ///
    /// # Safety
    /// As `writev_raw_now`.
    #[inline(always)]
    pub unsafe fn writev_raw_now_with(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
    ) -> Option<Result<(), SubmitError>> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw_now(true, lba, segs, flags) }
    }

    /// # Safety
    /// As `readv_raw_now` / `writev_raw_now`.
    #[inline(always)]
    unsafe fn rwv_raw_now(
        &mut self,
        write: bool,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
    ) -> Option<Result<(), SubmitError>> {
        let ChanBe::Local(l) = &mut self.be else {
            return None;
        };
        if write && !self.c.writable {
            return Some(Err(SubmitError::ReadOnly));
        }
        let mut nlb = 0u64;
        for s in segs {
            match self.c.blocks(s.len) {
                Ok(n) => nlb += n,
                Err(e) => return Some(Err(e)),
            }
        }
        if let Err(e) = self.c.range(lba, nlb) {
            return Some(Err(e));
        }
        // SAFETY: the caller's contract covers the call.
        let r = unsafe { l.run_raw(write, flags, lba << self.c.shift, segs) };
        // No poll follows to publish the counts: publish the ones touched.
        match r {
            Ok(()) => {
                self.c.count(write, (nlb << self.c.shift) as usize);
                self.c.publish_rw(write);
            }
            Err(_) => {
                self.c.n.errors += 1;
                self.c.publish();
            }
        }
        Some(r)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        if let Some(l) = &self.c.lat {
            self.c.reg.merge_latency(&l.hist);
        }
        self.c.publish();
        self.c.reg.retire(&self.c.ctr);
    }
}

pub(crate) enum IoBe<'a> {
    Local(&'a mut LocalChan),
    Nvme(pollux_host::Submitter<'a>, &'a mut NvmeSide),
    Uring(&'a mut UringChan),
    NvmeMp(&'a mut pollux_host::MpQueuePair),
}

/// A channel's submission half, borrowed: from [`Channel::io`], and in
/// every completion handler.
pub struct Io<'a> {
    pub(crate) c: &'a mut Common,
    pub(crate) be: IoBe<'a>,
}

impl<'a> Io<'a> {
    /// Reads `buf.len()` bytes (whole blocks) at block `lba` into `buf`,
    /// which comes back in the completion.
    #[inline(always)]
    pub fn read(&mut self, lba: u64, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.rw(false, lba, buf, RwFlags::NONE, user_data)
    }

    /// Writes `buf` (whole blocks) at block `lba`.
    #[inline(always)]
    pub fn write(&mut self, lba: u64, buf: IoBuf, user_data: u64) -> Result<(), Refused> {
        self.rw(true, lba, buf, RwFlags::NONE, user_data)
    }

    /// `read` with flags: [`RwFlags::FUA`] returns data committed to
    /// non-volatile media (cached writes of its blocks are committed
    /// first: io_uring makes an `fdatasync` before the read; NVMe sets
    /// FUA in each command; RAM with a simulated cache commits its blocks;
    /// null ignores it).
    #[inline(always)]
    pub fn read_with(
        &mut self,
        lba: u64,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw(false, lba, buf, flags, user_data)
    }

    /// `write` with flags: with [`RwFlags::FUA`] the request completes only
    /// once its data is durable (io_uring writes with `RWF_DSYNC`; NVMe
    /// sets FUA in each command; RAM with a simulated cache commits it;
    /// null and plain RAM, which have no cache, ignore it).
    #[inline(always)]
    pub fn write_with(
        &mut self,
        lba: u64,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rw(true, lba, buf, flags, user_data)
    }

    #[inline(always)]
    fn rw(
        &mut self,
        write: bool,
        lba: u64,
        buf: IoBuf,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        let ud = match self.c.admit(user_data, write) {
            Ok(ud) => ud,
            Err(e) => return Err(Refused::new(e, Data::One(buf))),
        };
        let len = buf.len();
        let r = match &mut self.be {
            IoBe::Nvme(sub, side) => {
                let nlb = (len >> self.c.shift) as u32;
                let r = if write {
                    sub.write_with(&side.ns, lba, nlb, buf, flags, ud)
                } else {
                    sub.read_with(&side.ns, lba, nlb, buf, flags, ud)
                };
                let shift = self.c.shift;
                r.map_err(|r| nvme_refused(r, shift))
            }
            IoBe::Local(l) => match self.c.blocks(len).and_then(|n| self.c.range(lba, n)) {
                Ok(()) => {
                    let op = LocalOp::rw(write, flags);
                    l.submit(op, lba << self.c.shift, len as u64, Data::One(buf), ud)
                }
                Err(e) => Err(Refused::new(e, Data::One(buf))),
            },
            IoBe::Uring(u) => match self.c.blocks(len).and_then(|n| self.c.range(lba, n)) {
                Ok(()) => u.rw(write, lba << self.c.shift, buf, flags, ud),
                Err(e) => Err(Refused::new(e, Data::One(buf))),
            },
            IoBe::NvmeMp(m) => nvme::multipath::rw(self.c, m, write, lba, buf, flags, ud),
        };
        match r {
            Ok(()) => {
                self.c.count(write, len);
                Ok(())
            }
            Err(e) => {
                self.c.unadmit(ud);
                Err(e)
            }
        }
    }

    /// Reads into a vector of buffers (each whole blocks), in order, from
    /// block `lba`; they come back in the completion as `Data::Vec`.
    pub fn readv(&mut self, lba: u64, bufs: Vec<IoBuf>, user_data: u64) -> Result<(), Refused> {
        self.rwv(false, lba, bufs, RwFlags::NONE, user_data)
    }

    /// Writes a vector of buffers (each whole blocks), in order, at `lba`.
    pub fn writev(&mut self, lba: u64, bufs: Vec<IoBuf>, user_data: u64) -> Result<(), Refused> {
        self.rwv(true, lba, bufs, RwFlags::NONE, user_data)
    }

    /// `readv` with flags (see `read_with`).
    pub fn readv_with(
        &mut self,
        lba: u64,
        bufs: Vec<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rwv(false, lba, bufs, flags, user_data)
    }

    /// `writev` with flags (see `write_with`): with FUA the request
    /// completes once every buffer of it is durable.
    pub fn writev_with(
        &mut self,
        lba: u64,
        bufs: Vec<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        self.rwv(true, lba, bufs, flags, user_data)
    }

    fn rwv(
        &mut self,
        write: bool,
        lba: u64,
        bufs: Vec<IoBuf>,
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), Refused> {
        let checked = self.c.admit(user_data, write).and_then(|ud| {
            let mut nlb = 0u64;
            for b in &bufs {
                match self.c.blocks(b.len()) {
                    Ok(n) => nlb += n,
                    Err(e) => {
                        self.c.unadmit(ud);
                        return Err(e);
                    }
                }
            }
            if bufs.len() > MAX_CHILDREN {
                self.c.unadmit(ud);
                return Err(SubmitError::TooManySegments {
                    n: bufs.len(),
                    max: MAX_CHILDREN,
                });
            }
            match self.c.range(lba, nlb) {
                Ok(()) => Ok((ud, nlb)),
                Err(e) => {
                    self.c.unadmit(ud);
                    Err(e)
                }
            }
        });
        let (ud, nlb) = match checked {
            Ok(x) => x,
            Err(e) => return Err(Refused::new(e, Data::Vec(Box::new(bufs)))),
        };
        let len = (nlb << self.c.shift) as usize;
        let op = LocalOp::rw(write, flags);
        let r = match &mut self.be {
            IoBe::Local(l) => l.submit(
                op,
                lba << self.c.shift,
                len as u64,
                Data::Vec(Box::new(bufs)),
                ud,
            ),
            IoBe::Nvme(sub, side) => {
                nvme::submit_vec(self.c, sub, side, write, lba, bufs, flags, ud)
            }
            IoBe::Uring(u) => u.rwv(write, lba << self.c.shift, len as u64, bufs, flags, ud),
            IoBe::NvmeMp(_) => Err(Refused::new(
                nvme::multipath::unsupported(self.c, "vectors on a multipath namespace"),
                Data::Vec(Box::new(bufs)),
            )),
        };
        match r {
            Ok(()) => {
                self.c.count(write, len);
                Ok(())
            }
            Err(e) => {
                self.c.unadmit(ud);
                Err(e)
            }
        }
    }

    /// `readv` into memory the caller lends instead of owned buffers (a C
    /// API, an emulated controller reading guest pages). Host-memory
    /// backends only (`Caps::host_memory`: null, RAM, io_uring); NVMe
    /// refuses it (it needs DMA memory: use owned buffers). The completion
    /// carries `Data::None`.
    ///
    /// # Safety
    /// Every segment must be valid for writes of its length and must not
    /// be read or written by anything else until the completion for
    /// `user_data` has been delivered or the channel has been dropped.
    pub unsafe fn readv_raw(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw(false, lba, segs, RwFlags::NONE, user_data) }
    }

    /// `writev` from memory the caller lends.
    ///
    /// # Safety
    /// Every segment must be valid for reads of its length and must not be
    /// written by anything else until the completion for `user_data` has
    /// been delivered or the channel has been dropped.
    pub unsafe fn writev_raw(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw(true, lba, segs, RwFlags::NONE, user_data) }
    }

    /// `readv_raw` with flags (see `read_with`).
    ///
    /// # Safety
    /// As `readv_raw`.
    #[inline]
    pub unsafe fn readv_raw_with(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw(false, lba, segs, flags, user_data) }
    }

    /// `writev_raw` with flags (see `write_with`).
    ///
    /// # Safety
    /// As `writev_raw`.
    #[inline]
    pub unsafe fn writev_raw_with(
        &mut self,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        // SAFETY: forwarded contract.
        unsafe { self.rwv_raw(true, lba, segs, flags, user_data) }
    }

    /// # Safety
    /// As `readv_raw` (reads) or `writev_raw` (writes).
    #[inline(always)]
    unsafe fn rwv_raw(
        &mut self,
        write: bool,
        lba: u64,
        segs: &[RawSeg],
        flags: RwFlags,
        user_data: u64,
    ) -> Result<(), SubmitError> {
        let ud = self.c.admit(user_data, write)?;
        let mut nlb = 0u64;
        let mut check = || {
            for s in segs {
                nlb += self.c.blocks(s.len)?;
            }
            self.c.range(lba, nlb)
        };
        if let Err(e) = check() {
            self.c.unadmit(ud);
            return Err(e);
        }
        let len = nlb << self.c.shift;
        let r = match &mut self.be {
            // SAFETY: the caller's contract covers the call.
            IoBe::Local(l) => unsafe { l.submit_raw(write, flags, lba << self.c.shift, segs, ud) },
            // SAFETY: the caller's contract covers the request's lifetime
            // (the channel's drop waits for the kernel).
            IoBe::Uring(u) => unsafe {
                u.rwv_raw(write, lba << self.c.shift, len, segs, flags, ud)
            },
            IoBe::Nvme(..) | IoBe::NvmeMp(_) => Err(SubmitError::Unsupported {
                op: "borrowed host memory",
                backend: self.c.backend,
            }),
        };
        match r {
            Ok(()) => {
                self.c.count(write, len as usize);
                Ok(())
            }
            Err(e) => {
                self.c.unadmit(ud);
                Err(e)
            }
        }
    }

    /// Makes written data durable.
    pub fn flush_cache(&mut self, user_data: u64) -> Result<(), SubmitError> {
        let ud = self.c.admit(user_data, false)?;
        let r = match &mut self.be {
            IoBe::Local(l) => l
                .submit(LocalOp::Flush, 0, 0, Data::None, ud)
                .map_err(|r| r.error),
            IoBe::Nvme(sub, side) => sub
                .flush_cache(&side.ns, ud)
                .map_err(|e| from_nvme(e, 1 << self.c.shift)),
            IoBe::Uring(u) => u.other(UringOp::Flush, 0, 0, ud),
            IoBe::NvmeMp(_) => Err(nvme::multipath::unsupported(
                self.c,
                "flush on a multipath namespace",
            )),
        };
        self.other_done(r, ud)
    }

    /// Writes zeroes to `nlb` blocks at `lba`.
    pub fn write_zeroes(&mut self, lba: u64, nlb: u64, user_data: u64) -> Result<(), SubmitError> {
        self.zero(lba, nlb, user_data, false)
    }

    /// Deallocates `nlb` blocks at `lba` (they read back as zeroes on RAM;
    /// on NVMe as the controller's DLFEAT says).
    pub fn unmap(&mut self, lba: u64, nlb: u64, user_data: u64) -> Result<(), SubmitError> {
        self.zero(lba, nlb, user_data, true)
    }

    fn zero(&mut self, lba: u64, nlb: u64, user_data: u64, unmap: bool) -> Result<(), SubmitError> {
        let ud = self.c.admit(user_data, true)?;
        if let Err(e) = self.c.range(lba, nlb) {
            self.c.unadmit(ud);
            return Err(e);
        }
        let shift = self.c.shift;
        let r = match &mut self.be {
            IoBe::Local(l) => l
                .submit(LocalOp::Zero, lba << shift, nlb << shift, Data::None, ud)
                .map_err(|r| r.error),
            IoBe::Uring(u) => {
                let op = if unmap { UringOp::Punch } else { UringOp::Zero };
                u.other(op, lba << shift, nlb << shift, ud)
            }
            IoBe::Nvme(sub, side) => nvme::zero(self.c, sub, side, lba, nlb, ud, unmap),
            IoBe::NvmeMp(_) => Err(nvme::multipath::unsupported(
                self.c,
                "zeroing on a multipath namespace",
            )),
        };
        self.other_done(r, ud)
    }

    /// Resets the backend: NVMe resets the controller (outstanding
    /// commands on every queue pair complete with an error or are
    /// retried, by the driver's recovery); null and RAM finish what they
    /// hold; io_uring touches nothing and completes once every request
    /// submitted before it on this channel has finished (IOSQE_IO_DRAIN).
    /// Completes once the reset is done.
    pub fn reset(&mut self, user_data: u64) -> Result<(), SubmitError> {
        let ud = self.c.admit(user_data, false)?;
        let r = match &mut self.be {
            IoBe::Local(l) => l
                .submit(LocalOp::None, 0, 0, Data::None, ud)
                .map_err(|r| r.error),
            IoBe::Nvme(_, side) => {
                let result = side.ctrl.reset().map(|()| 0).map_err(|e| {
                    tracing::error!(error = %e, "controller reset failed");
                    IoError::ControllerFailed
                });
                side.deferred.push(Completion {
                    user_data: ud,
                    result,
                    data: Data::None,
                });
                Ok(())
            }
            IoBe::Uring(u) => u.other(UringOp::Drain, 0, 0, ud),
            IoBe::NvmeMp(_) => Err(nvme::multipath::unsupported(
                self.c,
                "reset of a multipath namespace",
            )),
        };
        self.other_done(r, ud)
    }

    /// An NVMe command passed through (NVMe backend only), as the driver's
    /// checked `Submitter::raw`: its data pointer is the transport's, its
    /// transfer must match `data`. The namespace ID is the caller's to set.
    pub fn nvme_passthru(
        &mut self,
        sqe: Sqe,
        data: Option<IoBuf>,
        user_data: u64,
    ) -> Result<(), Refused> {
        let ud = match self.c.admit(user_data, true) {
            Ok(ud) => ud,
            Err(e) => return Err(Refused::new(e, data.into())),
        };
        let r = match &mut self.be {
            IoBe::Nvme(sub, _) => sub
                .raw(sqe, data, ud)
                .map_err(|r| Refused::new(SubmitError::Nvme(r.error), r.buf.into())),
            IoBe::Local(_) | IoBe::Uring(_) | IoBe::NvmeMp(_) => Err(Refused::new(
                SubmitError::Unsupported {
                    op: "NVMe passthrough",
                    backend: self.c.backend,
                },
                data.into(),
            )),
        };
        match r {
            Ok(()) => {
                self.c.count_other();
                Ok(())
            }
            Err(e) => {
                self.c.unadmit(ud);
                Err(e)
            }
        }
    }

    fn other_done(&mut self, r: Result<(), SubmitError>, ud: u64) -> Result<(), SubmitError> {
        match r {
            Ok(()) => {
                self.c.count_other();
                Ok(())
            }
            Err(e) => {
                self.c.unadmit(ud);
                Err(e)
            }
        }
    }
}
