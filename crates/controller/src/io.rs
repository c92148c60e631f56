//! NVM command set I/O commands — Read, Write, Flush, Write Zeroes and
//! Dataset Management (deallocate) — on one I/O queue ([`IoQueue`]): an
//! object living on the queue's thread, owning one bdev channel per
//! namespace.
//!
//! A command is first checked ([`IoQueue::check`]), which needs nothing
//! but the SQE, then executed on its data segments, which the transport
//! made (PCIe: PRPs through the IOMMU; TCP: capsule or C2H/H2C buffers):
//! synchronously ([`IoQueue::exec`], what the emulator does) or
//! asynchronously ([`IoQueue::submit`] with a tag, completions from
//! [`IoQueue::poll`]).
//!
//! Checks, in order: FUSE (fused commands are not supported) and, on
//! PCIe, PSDT (SGLs are not: Invalid Field), opcode, NSID (Invalid
//! Namespace or Format), transfer size vs MDTS (Invalid Field), LBA range
//! (LBA Out of Range); the transport then checks its data pointers (PCIe:
//! PRP Offset Invalid / Data Transfer Error). Nothing is transferred
//! unless every check passed. Failures of the namespace's storage (a bdev
//! request refused or completed with an error) become media errors
//! (Unrecovered Read Error for reads, Write Fault for writes, flushes and
//! write zeroes) or Internal Error (deallocate).
//!
//! Force Unit Access (Read/Write CDW12 bit 30) goes with the request to
//! the namespace's bdev ([`IoCmd::flags`]), which completes a FUA write
//! only once its data is durable (io_uring: `RWF_DSYNC`; NVMe: the bit;
//! RAM with a simulated cache: committed) and commits cached writes of a
//! FUA read's blocks before reading them; so a FUA write's completion
//! never precedes its durability, on every path (lent, bounced, staged).
//! A Write Zeroes with FUA is followed by a flush of its namespace before
//! it completes (the bdev layer has no FUA for zeroing).
//!
//! While the controller's volatile write cache is disabled (Set Features
//! Volatile Write Cache, WCE = 0), every Write and Write Zeroes is FUA:
//! `check` adds the bit, read with one relaxed load from the controller's
//! registry (`stats`), so a write completes only once durable. Reads are
//! unchanged; so is Dataset Management (a deallocation is no write).
//!
//! The Read/Write path allocates nothing and takes no lock: the segments
//! are lent to the namespace's bdev as they are (see `store`; an NVMe
//! bdev's data is copied through DMA pieces instead: asynchronously
//! through the queue's staging pool, `stage`), and the SMART counts go
//! into plain integers published by [`IoQueue::publish`].
use std::collections::VecDeque;
use std::sync::Arc;

use pollux_bdev::{Completion, Io, IoError, RawSeg as Seg};
use pollux_spec::cmd::{DsmRange, RwFlags, DSM_ATTR_DEALLOCATE};
use pollux_spec::log::ERROR_LOG_NOT_SPECIFIC;
use pollux_spec::status::{generic, media};
use pollux_spec::{NvmOpcode, Sqe, Status};
use zerocopy::FromBytes;

use crate::ctrl::Controller;
use crate::stage::{self, Staged};
use crate::stats::{IoErrorRecord, IoStats, Registry, StatsHandle};
use crate::store::{NsChan, StoreError};
use crate::subsystem::Subsystem;
use crate::ControllerError;

mod multi;

const NSID_ALL: u32 = 0xFFFF_FFFF;
/// SQE flags bits 1:0, FUSE.
const FLAGS_FUSE: u8 = 0x03;
/// SQE flags bits 7:6, PSDT.
const FLAGS_PSDT: u8 = 0xC0;
/// Write Zeroes CDW12 bit 25: deallocate.
const WZ_DEAC: u32 = 1 << 25;

#[inline(always)]
fn gen(sc: u8) -> Status {
    Status::generic(sc)
}

/// What a checked command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    /// Flush one namespace.
    Flush,
    /// Flush every namespace (NSID FFFFFFFFh).
    FlushAll,
    /// Write Zeroes; `dealloc`: DEAC set.
    WriteZeroes {
        dealloc: bool,
    },
    /// Dataset Management with `nr` ranges (the data);
    /// `deallocate`: AD set (else hints only).
    Dsm {
        nr: usize,
        deallocate: bool,
    },
}

/// A command that passed [`IoQueue::check`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCmd {
    pub op: IoOp,
    /// The namespace (1-based; 0xFFFFFFFF for `FlushAll`).
    pub nsid: u32,
    pub slba: u64,
    /// Logical blocks (1's based).
    pub nlb: u64,
    /// Bytes of data the command moves (0: none).
    pub xfer_len: usize,
    /// A Read's, Write's or Write Zeroes' flags (Force Unit Access, which
    /// every write has while the volatile write cache is disabled); none
    /// for the others.
    pub flags: RwFlags,
    /// The command identifier, for the Error Information log: the SQE's
    /// from [`IoQueue::check_reported`], FFFFh ("not available") from
    /// [`IoQueue::check`].
    pub cid: u16,
}

impl IoCmd {
    /// The data goes to the host (a read); else, when `xfer_len` is not
    /// 0, it comes from the host.
    #[inline(always)]
    pub fn to_host(&self) -> bool {
        self.op == IoOp::Read
    }
}

/// Options of an I/O queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoQueueOptions {
    /// Asynchronous commands outstanding at most (0: synchronous use
    /// only, `submit` refuses).
    pub depth: u32,
}

/// The `user_data` of an asynchronous request: the tag (bits 0..32), the
/// kind (bits 32..34: [`K_READ`], [`K_WRITE`], [`K_OTHER`]) and, for
/// reads and writes, the blocks (bits 34..52), for the counts.
/// (Kind 3 is a staged piece's: `stage::K_PART`.)
pub(crate) const K_READ: u64 = 0;
pub(crate) const K_WRITE: u64 = 1;
const K_OTHER: u64 = 2;

#[inline(always)]
pub(crate) fn ud(tag: u32, kind: u64, nlb: u64) -> u64 {
    tag as u64 | kind << 32 | nlb << 34
}

/// One I/O queue's execution context (see the module doc). Used from one
/// thread at a time.
pub struct IoQueue {
    ns: Vec<NsChan>,
    scratch: Vec<u8>,
    max_xfer: usize,
    /// SQE flags that must be 0: FUSE, and on PCIe PSDT.
    flags_mask: u8,
    stats: IoStats,
    handle: StatsHandle,
    depth: u32,
    /// Asynchronous commands submitted and not yet delivered by `poll`.
    inflight: u32,
    /// Results of asynchronous commands known at submission (refused, or
    /// run synchronously), for the next `poll`. Capacity `depth`.
    done: VecDeque<(u32, Status)>,
    /// The SQID failed commands are reported with (`report_errors`);
    /// None: not reported.
    report: Option<u16>,
    /// When reporting: the CID and starting LBA of the asynchronous
    /// command of each tag below `depth` (else empty).
    info: Vec<(u16, u64)>,
    /// Asynchronous commands made of several bdev requests (`multi`).
    multi: multi::Multis,
}

impl std::fmt::Debug for IoQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoQueue")
            .field("namespaces", &self.ns.len())
            .field("depth", &self.depth)
            .field("inflight", &self.inflight)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Drop for IoQueue {
    fn drop(&mut self) {
        self.publish();
        self.handle.registry.retire(&self.handle.published);
    }
}

impl IoQueue {
    /// A queue of a controller of `subsys` counting through `handle`
    /// (`Controller::io_stats_handle`): one channel per namespace.
    pub fn new(
        subsys: &Arc<Subsystem>,
        handle: StatsHandle,
        opts: IoQueueOptions,
    ) -> Result<IoQueue, ControllerError> {
        let max_xfer = subsys.limits().max_transfer().unwrap_or(usize::MAX);
        let mut ns = Vec::with_capacity(subsys.namespaces().len());
        for (i, n) in subsys.namespaces().iter().enumerate() {
            let nsid = i as u32 + 1;
            let ch = NsChan::new(n.bdev(), n.nsze(), opts.depth, max_xfer)
                .map_err(|source| ControllerError::Bdev { nsid, source })?;
            ns.push(ch);
        }
        Ok(IoQueue {
            ns,
            scratch: Vec::with_capacity(4096),
            max_xfer,
            flags_mask: if subsys.personality().is_fabrics() {
                FLAGS_FUSE
            } else {
                FLAGS_FUSE | FLAGS_PSDT
            },
            stats: IoStats::default(),
            handle,
            depth: opts.depth,
            inflight: 0,
            done: VecDeque::with_capacity(opts.depth as usize),
            report: None,
            info: Vec::new(),
            multi: multi::Multis::default(),
        })
    }

    /// Reports the commands of this queue that fail to the controller's
    /// Error Information log and SMART's media error count (see `stats`),
    /// with `sqid` (FFFFh: not known): the statuses `submit`/`poll`
    /// deliver, and those [`IoQueue::check_reported`] returns (which also
    /// gives commands their CID: `check` leaves it FFFFh). For transports that do not account
    /// failed completions themselves (the emulator does, and does not
    /// call this). Costs the success path one store per asynchronous
    /// command: its CID and LBA, by tag, for tags below `depth` (the
    /// target's slot indices); a command of a larger tag that fails
    /// after `submit` returned is reported with CID FFFFh and LBA 0.
    pub fn report_errors(&mut self, sqid: u16) {
        self.report = Some(sqid);
        self.info = vec![(ERROR_LOG_NOT_SPECIFIC, 0); self.depth as usize];
    }

    /// `check` for a queue that reports its failed commands (see
    /// `report_errors`): the command keeps its CID, for the Error
    /// Information log should it fail later, and a refusal is reported
    /// now. (`check` does neither, so the emulator's path, which accounts
    /// errors itself, carries none of it.)
    #[inline(always)]
    pub fn check_reported(&self, sqe: &Sqe) -> Result<IoCmd, Status> {
        match self.check(sqe) {
            Ok(mut cmd) => {
                cmd.cid = sqe.cid;
                Ok(cmd)
            }
            Err(st) => Err(self.refused(sqe, st)),
        }
    }

    /// Reports `check`'s refusal `st` of `sqe`; returns it.
    #[cold]
    #[inline(never)]
    fn refused(&self, sqe: &Sqe, st: Status) -> Status {
        let rw = [NvmOpcode::Read, NvmOpcode::Write, NvmOpcode::WriteZeroes];
        let lba = if rw.iter().any(|&o| o as u8 == sqe.opc) {
            sqe.slba()
        } else {
            0
        };
        self.report_failure(sqe.cid, st, sqe.nsid, lba);
        st
    }

    /// Records a failed command for the controller, when reporting.
    #[cold]
    #[inline(never)]
    fn report_failure(&self, cid: u16, status: Status, nsid: u32, lba: u64) {
        if let Some(sqid) = self.report {
            self.handle.registry.push_error(IoErrorRecord {
                sqid,
                cid,
                status,
                nsid,
                lba,
            });
        }
    }

    /// A queue for `ctrl` (`IoQueue::new` with its subsystem and a new
    /// stats handle).
    pub fn for_controller(
        ctrl: &Controller,
        opts: IoQueueOptions,
    ) -> Result<IoQueue, ControllerError> {
        IoQueue::new(ctrl.subsystem(), ctrl.io_stats_handle(), opts)
    }

    /// This queue's counts (successful reads and writes), up to date.
    pub fn stats(&self) -> IoStats {
        self.stats
    }

    /// Makes the counts visible to the controller's SMART log (four
    /// plain stores; call it once per batch).
    #[inline]
    pub fn publish(&self) {
        self.handle.published.store(&self.stats);
    }

    /// The namespace channel for `nsid` (1-based), if it exists.
    #[inline(always)]
    fn ns_of(&self, nsid: u32) -> Option<&NsChan> {
        self.ns.get((nsid as usize).wrapping_sub(1))
    }

    /// The Read/Write flags every write gets: FUA while the controller's
    /// volatile write cache is disabled (one relaxed load).
    #[inline(always)]
    fn write_flags(&self) -> u32 {
        self.handle.registry.write_flags()
    }

    /// Checks a command against the namespaces and limits (see the
    /// module doc for the order).
    #[inline(always)]
    pub fn check(&self, sqe: &Sqe) -> Result<IoCmd, Status> {
        if sqe.flags & self.flags_mask != 0 {
            return Err(gen(generic::INVALID_FIELD));
        }
        let nsid = sqe.nsid;
        let mut cmd = IoCmd {
            op: IoOp::Flush,
            nsid,
            slba: 0,
            nlb: 0,
            xfer_len: 0,
            flags: RwFlags::NONE,
            cid: ERROR_LOG_NOT_SPECIFIC,
        };
        match sqe.opc {
            x if x == NvmOpcode::Read as u8 => {
                cmd.op = IoOp::Read;
                self.check_rw(&mut cmd, sqe, sqe.cdw12)?;
            }
            x if x == NvmOpcode::Write as u8 => {
                cmd.op = IoOp::Write;
                // FUA while the volatile write cache is off.
                self.check_rw(&mut cmd, sqe, sqe.cdw12 | self.write_flags())?;
            }
            x if x == NvmOpcode::Flush as u8 => {
                if nsid == NSID_ALL {
                    cmd.op = IoOp::FlushAll;
                } else if self.ns_of(nsid).is_none() {
                    return Err(gen(generic::INVALID_NAMESPACE));
                }
            }
            x if x == NvmOpcode::WriteZeroes as u8 => {
                let Some(ns) = self.ns_of(nsid) else {
                    return Err(gen(generic::INVALID_NAMESPACE));
                };
                cmd.slba = sqe.slba();
                cmd.nlb = sqe.nlb() as u64;
                if !lba_ok(cmd.slba, cmd.nlb, ns.nsze) {
                    return Err(gen(generic::LBA_OUT_OF_RANGE));
                }
                cmd.op = IoOp::WriteZeroes {
                    dealloc: sqe.cdw12 & WZ_DEAC != 0,
                };
                cmd.flags = RwFlags::from_cdw12(sqe.cdw12 | self.write_flags());
            }
            x if x == NvmOpcode::DatasetManagement as u8 => {
                if self.ns_of(nsid).is_none() {
                    return Err(gen(generic::INVALID_NAMESPACE));
                }
                // NR is 8 bits, 0's based: at most 256 ranges.
                let nr = (sqe.cdw10 & 0xFF) as usize + 1;
                cmd.xfer_len = nr * core::mem::size_of::<DsmRange>();
                cmd.op = IoOp::Dsm {
                    nr,
                    deallocate: sqe.cdw11 & DSM_ATTR_DEALLOCATE != 0,
                };
            }
            _ => return Err(gen(generic::INVALID_OPCODE)),
        }
        Ok(cmd)
    }

    /// `check` of a Read or Write (`cmd.op` set), with `cdw12` for its
    /// flags.
    #[inline(always)]
    fn check_rw(&self, cmd: &mut IoCmd, sqe: &Sqe, cdw12: u32) -> Result<(), Status> {
        let Some(ns) = self.ns_of(cmd.nsid) else {
            return Err(gen(generic::INVALID_NAMESPACE));
        };
        cmd.slba = sqe.slba();
        cmd.nlb = sqe.nlb() as u64;
        cmd.flags = RwFlags::from_cdw12(cdw12);
        cmd.xfer_len = (cmd.nlb << ns.shift) as usize;
        if cmd.xfer_len > self.max_xfer {
            return Err(gen(generic::INVALID_FIELD));
        }
        if !lba_ok(cmd.slba, cmd.nlb, ns.nsze) {
            return Err(gen(generic::LBA_OUT_OF_RANGE));
        }
        Ok(())
    }

    /// Executes a checked command synchronously on its data segments
    /// (`cmd.xfer_len` bytes in total; none for commands without data)
    /// and returns its status.
    ///
    /// # Safety
    /// The segments are valid memory for their lengths (writable for a
    /// read), touched by nothing else until this returns.
    #[inline(always)]
    pub unsafe fn exec(&mut self, cmd: &IoCmd, segs: &[Seg]) -> Status {
        match cmd.op {
            IoOp::Read | IoOp::Write => {
                // SAFETY: forwarded contract.
                unsafe { self.read_write(cmd, segs) }
            }
            IoOp::Flush | IoOp::FlushAll => self.flush(cmd.nsid),
            IoOp::WriteZeroes { dealloc } => self.write_zeroes(cmd, dealloc),
            IoOp::Dsm { nr, deallocate } => {
                // SAFETY: forwarded contract.
                unsafe { self.dsm(cmd.nsid, nr, deallocate, segs) }
            }
        }
    }

    /// # Safety
    /// As `exec`.
    #[inline(always)]
    unsafe fn read_write(&mut self, cmd: &IoCmd, segs: &[Seg]) -> Status {
        let write = cmd.op == IoOp::Write;
        let Some(ns) = self.ns.get_mut((cmd.nsid as usize).wrapping_sub(1)) else {
            return gen(generic::INVALID_NAMESPACE);
        };
        // SAFETY: forwarded contract.
        if let Err(e) = unsafe { ns.rw(write, cmd.slba, segs, cmd.flags) } {
            return rw_failed(cmd, write, &e);
        }
        let s = &mut self.stats;
        if write {
            s.writes += 1;
            s.bytes_written += cmd.xfer_len as u64;
        } else {
            s.reads += 1;
            s.bytes_read += cmd.xfer_len as u64;
        }
        Status::SUCCESS
    }

    /// Flushes namespace `nsid`, or all of them (NSID FFFFFFFFh).
    fn flush(&mut self, nsid: u32) -> Status {
        let result = if nsid == NSID_ALL {
            self.ns.iter_mut().try_for_each(NsChan::flush)
        } else {
            match self.ns.get_mut((nsid as usize).wrapping_sub(1)) {
                Some(ns) => ns.flush(),
                None => return gen(generic::INVALID_NAMESPACE),
            }
        };
        match result {
            Ok(()) => Status::SUCCESS,
            Err(e) => {
                tracing::error!(nsid, error = %e, "flush failed");
                Status::media(media::WRITE_FAULT)
            }
        }
    }

    /// Flushes every namespace, logging failures (a shutdown).
    pub fn flush_all(&mut self) {
        for (i, ns) in self.ns.iter_mut().enumerate() {
            if let Err(e) = ns.flush() {
                tracing::error!(nsid = i + 1, error = %e, "flush at shutdown failed");
            }
        }
    }

    fn write_zeroes(&mut self, cmd: &IoCmd, dealloc: bool) -> Status {
        let Some(ns) = self.ns.get_mut((cmd.nsid as usize).wrapping_sub(1)) else {
            return gen(generic::INVALID_NAMESPACE);
        };
        let mut r = ns.zero(cmd.slba, cmd.nlb, dealloc);
        if r.is_ok() && cmd.flags.fua() {
            r = flush_for_fua(ns);
        }
        match r {
            Ok(()) => Status::SUCCESS,
            Err(e) => {
                tracing::error!(nsid = cmd.nsid, slba = cmd.slba, nlb = cmd.nlb, error = %e, "write zeroes failed");
                Status::media(media::WRITE_FAULT)
            }
        }
    }

    /// # Safety
    /// As `exec`.
    unsafe fn dsm(&mut self, nsid: u32, nr: usize, deallocate: bool, segs: &[Seg]) -> Status {
        let Some(ns) = self.ns.get_mut((nsid as usize).wrapping_sub(1)) else {
            return gen(generic::INVALID_NAMESPACE);
        };
        let len = nr * core::mem::size_of::<DsmRange>();
        self.scratch.clear();
        self.scratch.resize(len, 0);
        // SAFETY: forwarded contract.
        unsafe { copy_from_segs(segs, &mut self.scratch) };
        let ranges = self
            .scratch
            .chunks_exact(16)
            .filter_map(|b| DsmRange::read_from_bytes(b).ok());
        // Validate every range before touching any.
        for r in ranges.clone() {
            if !lba_ok(r.slba, r.nlb as u64, ns.nsze) {
                return gen(generic::LBA_OUT_OF_RANGE);
            }
        }
        if !deallocate {
            return Status::SUCCESS; // hints only
        }
        for r in ranges {
            if r.nlb == 0 {
                continue;
            }
            if let Err(e) = ns.zero(r.slba, r.nlb as u64, true) {
                tracing::error!(nsid, slba = r.slba, error = %e, "deallocate failed");
                return gen(generic::INTERNAL_ERROR);
            }
        }
        Status::SUCCESS
    }

    // ------------------------------------------------------------------
    // Asynchronous form
    // ------------------------------------------------------------------

    /// Asynchronous commands submitted and not yet delivered.
    pub fn outstanding(&self) -> u32 {
        self.inflight
    }

    /// Submits a checked command; its status comes out of
    /// [`IoQueue::poll`] with `tag` (below 2^31). Reads, writes, flushes
    /// of one namespace and write zeroes go to the bdev and return at once
    /// (an NVMe namespace's reads and writes through the queue's DMA
    /// staging pool, `stage`: they may wait there for pieces, and `poll`
    /// starts them); flushes of every namespace, Dataset Management and
    /// write zeroes larger than one bdev request of their namespace (or
    /// with FUA: a flush follows) go out a piece at a time, each piece
    /// when `poll` has the previous one back (`multi`); reads or writes
    /// whose segments the bdev cannot take (see `store`) and the pool
    /// does not cover run to completion within the call (their status is
    /// still delivered by `poll`). A refusal by
    /// the bdev is delivered as the command's media error. Fails only
    /// when `depth` commands are outstanding already.
    ///
    /// # Safety
    /// The segments are valid memory for their lengths (writable for a
    /// read), touched by nothing else until `poll` has delivered `tag`
    /// or the queue has been dropped.
    pub unsafe fn submit(
        &mut self,
        tag: u32,
        cmd: &IoCmd,
        segs: &[Seg],
    ) -> Result<(), ControllerError> {
        if self.inflight >= self.depth {
            return Err(ControllerError::QueueFull { depth: self.depth });
        }
        self.inflight += 1;
        if let Some(i) = self.info.get_mut(tag as usize) {
            *i = (cmd.cid, cmd.slba);
        }
        let idx = (cmd.nsid as usize).wrapping_sub(1);
        let sync = match cmd.op {
            IoOp::Read | IoOp::Write => {
                let write = cmd.op == IoOp::Write;
                match self.ns.get_mut(idx) {
                    Some(ns) if !ns.misaligned(segs) => {
                        let u = ud(tag, if write { K_WRITE } else { K_READ }, cmd.nlb);
                        let mut io = ns.ch.io();
                        // SAFETY: forwarded contract (until delivered).
                        let r = unsafe {
                            if write {
                                io.writev_raw_with(cmd.slba, segs, cmd.flags, u)
                            } else {
                                io.readv_raw_with(cmd.slba, segs, cmd.flags, u)
                            }
                        };
                        match r {
                            Ok(()) => return Ok(()),
                            Err(e) => rw_failed(cmd, write, &StoreError::Refused(e)),
                        }
                    }
                    // SAFETY: forwarded contract.
                    _ => match unsafe { self.submit_unlent(tag, cmd, segs) } {
                        Some(st) => st,
                        None => return Ok(()),
                    },
                }
            }
            IoOp::Flush => match self.ns.get_mut(idx) {
                Some(ns) => match ns.ch.flush_cache(ud(tag, K_OTHER, 0)) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::error!(nsid = cmd.nsid, error = %e, "flush failed");
                        Status::media(media::WRITE_FAULT)
                    }
                },
                None => gen(generic::INVALID_NAMESPACE),
            },
            IoOp::WriteZeroes { .. }
                if cmd.flags.fua()
                    || self.ns.get(idx).is_some_and(|ns| cmd.nlb > ns.zero_piece) =>
            {
                // SAFETY: forwarded contract.
                match unsafe { self.submit_multi(tag, cmd, segs) } {
                    Some(st) => st,
                    None => return Ok(()),
                }
            }
            IoOp::WriteZeroes { dealloc } => match self.ns.get_mut(idx) {
                Some(ns) => {
                    let u = ud(tag, K_OTHER, 0);
                    let r = if dealloc {
                        ns.ch.unmap(cmd.slba, cmd.nlb, u)
                    } else {
                        ns.ch.write_zeroes(cmd.slba, cmd.nlb, u)
                    };
                    match r {
                        Ok(()) => return Ok(()),
                        Err(e) => {
                            tracing::error!(nsid = cmd.nsid, slba = cmd.slba, nlb = cmd.nlb, error = %e, "write zeroes failed");
                            Status::media(media::WRITE_FAULT)
                        }
                    }
                }
                None => gen(generic::INVALID_NAMESPACE),
            },
            IoOp::FlushAll | IoOp::Dsm { .. } => {
                // SAFETY: forwarded contract (the ranges are read within
                // the call).
                match unsafe { self.submit_multi(tag, cmd, segs) } {
                    Some(st) => st,
                    None => return Ok(()),
                }
            }
        };
        if !sync.is_success() {
            self.report_failure(cmd.cid, sync, cmd.nsid, cmd.slba);
        }
        // At most `depth` are in flight, so this never grows the ring.
        self.done.push_back((tag, sync));
        Ok(())
    }

    /// `submit` of a read or write whose segments the bdev cannot take:
    /// staged when the namespace is an NVMe one and its pool covers the
    /// command (`stage`; `None`: the status comes from `poll`), else run
    /// within the call (its status).
    ///
    /// # Safety
    /// As `submit`.
    #[cold]
    #[inline(never)]
    unsafe fn submit_unlent(&mut self, tag: u32, cmd: &IoCmd, segs: &[Seg]) -> Option<Status> {
        let write = cmd.op == IoOp::Write;
        if let Some(ns) = self.ns.get_mut((cmd.nsid as usize).wrapping_sub(1)) {
            let NsChan { ch, staging, .. } = ns;
            if let Some(st) = staging.as_mut().filter(|st| st.fits(cmd.nlb, segs.len())) {
                let mut io = ch.io();
                // SAFETY: forwarded contract (until delivered); the
                // segments total `xfer_len`, `nlb` blocks.
                let r =
                    unsafe { st.submit(&mut io, tag, write, cmd.slba, cmd.nlb, cmd.flags, segs) };
                return match r {
                    Staged::Queued => None,
                    Staged::Failed(e) => Some(rw_failed(cmd, write, &StoreError::Refused(e))),
                };
            }
        }
        // SAFETY: forwarded contract (within the call).
        Some(unsafe { self.exec(cmd, segs) })
    }

    /// Commands of NVMe namespaces that waited for DMA staging pieces
    /// since the queue was made (see `stage`): a pool too small for the
    /// load shows here.
    pub fn staged_waits(&self) -> u64 {
        self.ns
            .iter()
            .filter_map(|n| n.staging.as_ref())
            .map(|s| s.waits())
            .sum()
    }

    /// Requests of this queue the namespaces' bdevs hold (submitted, not
    /// yet polled back), staged pieces included.
    pub fn bdev_requests(&self) -> usize {
        self.ns.iter().map(|n| n.ch.outstanding()).sum()
    }

    /// Delivers the statuses of finished asynchronous commands to
    /// `f(tag, status)`; returns how many. Every submitted command is
    /// delivered exactly once (a failed bdev completes all of them with
    /// media errors).
    pub fn poll(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        let n = if self.multi.idle() {
            self.poll_requests(f)
        } else {
            self.poll_multi(f)
        };
        self.inflight -= n as u32;
        n
    }

    /// `poll` of the bdev requests: their statuses (and the results known
    /// at submission) to `f`; returns how many.
    #[inline(always)]
    fn poll_requests(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        let mut n = 0;
        while let Some((tag, st)) = self.done.pop_front() {
            f(tag, st);
            n += 1;
        }
        let IoQueue {
            ns,
            stats,
            handle,
            report,
            info,
            ..
        } = self;
        let rep = Report {
            registry: &handle.registry,
            sqid: *report,
            info,
        };
        for (i, ch) in ns.iter_mut().enumerate() {
            let nsid = i as u32 + 1;
            let shift = ch.shift;
            while let Some((u, r)) = ch.stash.pop_front() {
                f(u as u32, finish(stats, &rep, nsid, shift, u, r));
                n += 1;
            }
            if ch.staging.is_some() {
                n += poll_staged(ch, stats, &rep, nsid, f);
                continue;
            }
            if ch.ch.outstanding() == 0 {
                continue;
            }
            ch.ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
                f(
                    c.user_data as u32,
                    finish(stats, &rep, nsid, shift, c.user_data, c.result),
                );
                n += 1;
            });
        }
        n
    }
}

/// `IoQueue::poll` of an NVMe namespace's channel: staged pieces come
/// back (a command's status once its last piece is in), then waiting
/// commands start if pieces allow.
fn poll_staged(
    ns: &mut NsChan,
    stats: &mut IoStats,
    rep: &Report<'_>,
    nsid: u32,
    f: &mut impl FnMut(u32, Status),
) -> usize {
    let shift = ns.shift;
    let NsChan { ch, staging, .. } = ns;
    let Some(st) = staging else {
        return 0;
    };
    let mut n = 0;
    if ch.outstanding() > 0 {
        ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
            let (u, r) = if stage::is_part(c.user_data) {
                // SAFETY: `IoQueue::submit`'s contract holds for the
                // command until this delivers it.
                match unsafe { st.complete(c) } {
                    Some(done) => done,
                    None => return,
                }
            } else {
                (c.user_data, c.result)
            };
            f(u as u32, finish(stats, rep, nsid, shift, u, r));
            n += 1;
        });
    }
    if st.waiting() > 0 {
        let mut io = ch.io();
        // SAFETY: as above, for the waiting commands.
        unsafe {
            st.resume(&mut io, &mut |(u, r)| {
                f(u as u32, finish(stats, rep, nsid, shift, u, r));
                n += 1;
            })
        };
        ch.flush();
    }
    n
}

/// Where `poll` reports failed commands (see `IoQueue::report_errors`).
struct Report<'a> {
    registry: &'a Registry,
    sqid: Option<u16>,
    info: &'a [(u16, u64)],
}

/// The status of a finished asynchronous request, counted.
#[inline]
fn finish(
    stats: &mut IoStats,
    rep: &Report<'_>,
    nsid: u32,
    shift: u32,
    u: u64,
    r: Result<u32, IoError>,
) -> Status {
    let kind = (u >> 32) & 3;
    let nlb = (u >> 34) & 0x3_FFFF;
    match r {
        Ok(_) => {
            if kind == K_READ {
                stats.reads += 1;
                stats.bytes_read += nlb << shift;
            } else if kind == K_WRITE {
                stats.writes += 1;
                stats.bytes_written += nlb << shift;
            }
            Status::SUCCESS
        }
        Err(e) => failed(rep, nsid, u, &e),
    }
}

/// The status of a failed asynchronous request, logged and reported.
#[cold]
#[inline(never)]
fn failed(rep: &Report<'_>, nsid: u32, u: u64, e: &IoError) -> Status {
    let tag = u as u32;
    tracing::error!(nsid, tag, error = %e, "namespace I/O failed");
    let st = Status::media(if (u >> 32) & 3 == K_READ {
        media::UNRECOVERED_READ_ERROR
    } else {
        media::WRITE_FAULT
    });
    // A piece of a multi-request command: the command is reported once
    // it is over (`multi`).
    if let Some(sqid) = rep.sqid.filter(|_| tag & multi::KID == 0) {
        let (cid, lba) = rep
            .info
            .get(tag as usize)
            .copied()
            .unwrap_or((ERROR_LOG_NOT_SPECIFIC, 0));
        rep.registry.push_error(IoErrorRecord {
            sqid,
            cid,
            status: st,
            nsid,
            lba,
        });
    }
    st
}

/// Makes a Write Zeroes with FUA durable before it completes (the bdev
/// layer has no FUA for zeroing): a flush of its namespace.
#[cold]
#[inline(never)]
fn flush_for_fua(ns: &mut NsChan) -> Result<(), StoreError> {
    ns.flush()
}

/// `[slba, slba + nlb)` inside a namespace of `nsze` blocks.
#[inline(always)]
fn lba_ok(slba: u64, nlb: u64, nsze: u64) -> bool {
    slba.checked_add(nlb).is_some_and(|end| end <= nsze)
}

/// The status of a failed read or write, logged. (Reported to the
/// controller by `submit` when the queue reports errors; the emulator
/// accounts it at completion: `Controller::note_error`.)
#[cold]
#[inline(never)]
fn rw_failed(cmd: &IoCmd, write: bool, e: &StoreError) -> Status {
    let (slba, nlb) = (cmd.slba, cmd.nlb);
    tracing::error!(nsid = cmd.nsid, slba, nlb, write, error = %e, "namespace I/O failed");
    Status::media(if write {
        media::WRITE_FAULT
    } else {
        media::UNRECOVERED_READ_ERROR
    })
}

/// Copies the segments' bytes into `dst` (up to `dst.len()`).
///
/// # Safety
/// As `IoQueue::exec`.
unsafe fn copy_from_segs(segs: &[Seg], mut dst: &mut [u8]) {
    for s in segs {
        if dst.is_empty() {
            break;
        }
        let n = s.len.min(dst.len());
        // SAFETY: the segment is valid for `s.len >= n` bytes (the
        // caller's contract); `dst` is ours, disjoint from it.
        unsafe { std::ptr::copy_nonoverlapping(s.ptr, dst.as_mut_ptr(), n) };
        dst = &mut dst[n..];
    }
}
