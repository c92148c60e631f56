//! The request mapping: a request into a slot, and a slot's next step
//! into an SQE.

use std::sync::atomic::Ordering;

use io_uring::{opcode, squeue, types};
use pollux_nvme::IoBuf;
use pollux_spec::cmd::RwFlags;

use super::chan::{push, Known, UringChan};
use super::options::{IOV_MAX, MAX_IO, NO_BUF, ZCHUNK};
use super::slot::{Iov, Op};
use crate::data::{Data, RawSeg};
use crate::error::{Refused, Result, SubmitError};

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
    /// A free slot, or why there is none.
    #[inline(always)]
    pub(super) fn take_slot(&mut self) -> Result<usize, SubmitError> {
        if self.shared.failed.load(Ordering::Relaxed) {
            return Err(SubmitError::Failed);
        }
        match self.free.pop() {
            Some(i) => Ok(i as usize),
            None => Err(SubmitError::QueueFull { depth: self.depth }),
        }
    }

    #[inline(always)]
    pub(super) fn check_addr(&self, addr: u64) -> Result<(), SubmitError> {
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
    pub(super) fn buf_index(&mut self, addr: u64, len: u64) -> u16 {
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
    pub(super) fn learn(&mut self, addr: u64, len: u64) -> u16 {
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
    pub(super) fn admit_rw(&mut self, addr: u64, len: u64) -> Result<usize, SubmitError> {
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

    pub(super) fn start_vec(
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

    pub(super) fn zero_op(&self) -> Op {
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
    pub(super) fn start(&mut self, i: usize) -> Result<(), (SubmitError, Data)> {
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
    pub(super) fn issue(&mut self, i: usize) -> bool {
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
}
