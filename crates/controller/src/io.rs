//! NVM command set I/O commands — Read, Write, Flush, Write Zeroes and
//! Dataset Management (deallocate) — on one I/O queue ([`IoQueue`]): an
//! object living on the queue's thread, owning one bdev channel per
//! namespace.
//!
//! A command is first checked ([`IoQueue::check`]), which needs nothing
//! but the SQE, then executed on its data segments, which the transport
//! made (PCIe: PRPs through the IOMMU; TCP: capsule or C2H/H2C buffers):
//! asynchronously ([`IoQueue::submit`] with a tag, completions from
//! [`IoQueue::poll`]) or synchronously ([`IoQueue::exec`], what the
//! emulator does: the same start under a tag of its own, then polls until
//! that command is over). Each command is dispatched in one place,
//! `IoQueue::start`, for both.
//!
//! Namespaces added or removed live (`Subsystem::add_namespace`,
//! `remove_namespace`) reach a queue at [`IoQueue::sync_namespaces`],
//! which the transport calls once per batch of commands: one relaxed load
//! of the subsystem's generation; on a change, channels to new namespaces
//! open and a removed namespace's channel leaves the table (its commands
//! get Invalid Namespace) but is polled until its requests are over.
//!
//! Asymmetric Namespace Access: a queue of a controller with a port
//! (`Controller::set_ana_port`) refuses commands to a namespace whose ANA
//! group is inaccessible (or in persistent loss, or changing) through
//! that port, with the path status of the state (Asymmetric Access
//! Inaccessible etc., DNR clear: a multipath host retries on another
//! path). Which namespaces are refused is recomputed with the namespace
//! table (the subsystem's generation moves on at each ANA change); the
//! I/O path pays one predictable test of a flag that is set only while
//! some namespace is refused.
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

use pollux_bdev::{Completion, Io, RawSeg as Seg};
use pollux_spec::cmd::{DsmRange, RwFlags, DSM_ATTR_DEALLOCATE};
use pollux_spec::log::ERROR_LOG_NOT_SPECIFIC;
use pollux_spec::status::{generic, media};
use pollux_spec::{NvmOpcode, Sqe, Status};

use crate::ana::AnaPort;
use crate::command::{lba_ok, IoCmd, IoOp};
use crate::completion::{count, finish, poll_staged, rw_failed, Report};
use crate::ctrl::Controller;
use crate::stage::Staged;
use crate::stats::{IoErrorRecord, IoStats, StatsHandle};
use crate::store::{NsChan, StoreError};
use crate::subsystem::{NsTable, Subsystem};
use crate::user_data::{Kind, UserData, KID};
use crate::ControllerError;

mod multi;

const NSID_ALL: u32 = 0xFFFF_FFFF;
/// The tag of `exec`'s command (`submit`'s are below it).
const SYNC_TAG: u32 = KID - 1;
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

/// Options of an I/O queue.
#[derive(Clone, Copy, Debug, Default)]
pub struct IoQueueOptions {
    /// Asynchronous commands outstanding at most (0: synchronous use
    /// only, `submit` refuses).
    pub depth: u32,
}

/// One I/O queue's execution context (see the module doc). Used from one
/// thread at a time. `T`: the NVMe transport of the namespaces' bdevs
/// (the subsystem's).
pub struct IoQueue {
    /// Slot `nsid - 1`: the channel to namespace `nsid` (None: inactive).
    ns: Vec<Option<NsChan>>,
    /// The namespace of each slot of `ns` (`Namespace::id`, 0: none).
    ns_ids: Vec<u64>,
    /// Channels of removed namespaces with requests in flight, polled
    /// until those are over: (NSID, channel).
    retiring: Vec<(u32, NsChan)>,
    subsys: Arc<Subsystem>,
    /// The subsystem's namespace generation `ns` was opened at.
    ns_gen: u64,
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
    /// The port whose ANA states the queue enforces (its controller's).
    ana: Option<Arc<AnaPort>>,
    /// Some namespace is refused for its ANA state (see `ana_refused`).
    ana_block: bool,
    /// Slot `nsid - 1`: the path status a command to the namespace gets
    /// for its ANA state (None: accessible).
    ana_refused: Vec<Option<Status>>,
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
        let (ns_gen, table) = subsys.table_at();
        let mut ns = Vec::with_capacity(table.len());
        let mut ns_ids = Vec::with_capacity(table.len());
        for (i, n) in table.iter().enumerate() {
            let nsid = i as u32 + 1;
            let ch = match n {
                Some(n) => Some(
                    NsChan::new(n.bdev(), n.nsze(), opts.depth, max_xfer)
                        .map_err(|source| ControllerError::Bdev { nsid, source })?,
                ),
                None => None,
            };
            ns.push(ch);
            ns_ids.push(n.as_ref().map_or(0, |n| n.id()));
        }
        Ok(IoQueue {
            ns,
            ns_ids,
            retiring: Vec::new(),
            subsys: subsys.clone(),
            ns_gen,
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
            ana: None,
            ana_block: false,
            ana_refused: Vec::new(),
        })
    }

    /// Recomputes which namespaces of `table` are refused for their ANA
    /// state through `self.ana`.
    #[cold]
    fn ana_refresh(&mut self, table: &NsTable) {
        self.ana_refused.clear();
        if let Some(port) = self.ana.as_ref().filter(|_| self.subsys.ana_reporting()) {
            self.ana_refused
                .extend(table.iter().enumerate().map(|(i, n)| {
                    let nsid = i as u32 + 1;
                    n.as_ref()
                        .and_then(|n| port.state(n.anagrpid(nsid)).io_status())
                }));
        }
        self.ana_block = self.ana_refused.iter().any(Option::is_some);
    }

    /// The ANA refusal of a command to `nsid`, if any.
    #[cold]
    #[inline(never)]
    fn ana_status(&self, nsid: u32) -> Option<Status> {
        *self.ana_refused.get((nsid as usize).wrapping_sub(1))?
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
        let mut q = IoQueue::new(ctrl.subsystem(), ctrl.io_stats_handle(), opts)?;
        if let Some(port) = &ctrl.ana_port {
            q.ana = Some(port.clone());
            let (_, table) = ctrl.subsystem().table_at();
            q.ana_refresh(&table);
        }
        Ok(q)
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
        self.ns.get((nsid as usize).wrapping_sub(1))?.as_ref()
    }

    /// Follows the subsystem's namespace changes: one relaxed load, and
    /// when the set changed (and no command of several requests is
    /// running, whose pieces name channels by slot), opens channels to
    /// new namespaces and closes those of removed ones (kept in
    /// `retiring` while requests are in flight, which `poll` still
    /// polls). The transport calls it once per batch of commands, before
    /// checking them (the target: once per connection pass); a queue
    /// that never calls it keeps the namespaces it was made with.
    #[inline(always)]
    pub fn sync_namespaces(&mut self) {
        if self.subsys.generation() != self.ns_gen && self.multi.idle() {
            self.reopen();
        }
    }

    #[cold]
    #[inline(never)]
    fn reopen(&mut self) {
        let (gen, table) = self.subsys.table_at();
        let n = table.len().max(self.ns.len());
        self.ns.resize_with(n, || None);
        self.ns_ids.resize(n, 0);
        for i in 0..n {
            let nsid = i as u32 + 1;
            let want = table.get(i).and_then(Option::as_ref);
            if want.map_or(0, |w| w.id()) == self.ns_ids[i] {
                continue;
            }
            if let Some(old) = self.ns[i].take() {
                if old.busy() {
                    self.retiring.push((nsid, old));
                }
            }
            self.ns_ids[i] = 0;
            if let Some(w) = want {
                match NsChan::new(w.bdev(), w.nsze(), self.depth, self.max_xfer) {
                    Ok(ch) => {
                        self.ns[i] = Some(ch);
                        self.ns_ids[i] = w.id();
                    }
                    // Its commands get Invalid Namespace; the next change
                    // tries again.
                    Err(e) => {
                        tracing::error!(nsid, error = %e, "opening a channel to an added namespace")
                    }
                }
            }
        }
        while self.ns.last().is_some_and(Option::is_none) && self.ns.len() > table.len() {
            self.ns.pop();
            self.ns_ids.pop();
        }
        if self.ana.is_some() {
            self.ana_refresh(&table);
        }
        self.ns_gen = gen;
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
        if self.ana_block {
            if let Some(st) = self.ana_status(nsid) {
                return Err(st);
            }
        }
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
    /// and returns its status: it is started as `submit` starts it (one
    /// dispatch for both), then polled for until it is over. Reads and
    /// writes of null and RAM namespaces finish within the call (the
    /// bdev's `readv_raw_now`); the others' requests are polled for, one
    /// command at a time (a slow file stalls the queue). Never staged
    /// (an NVMe namespace's data goes through its DMA bounce pieces,
    /// `store`). Asynchronous commands that complete meanwhile are
    /// delivered by the next `poll`. A failure is reported as
    /// `submit`'s are, when the queue reports errors.
    ///
    /// # Safety
    /// The segments are valid memory for their lengths (writable for a
    /// read), touched by nothing else until this returns.
    #[inline(always)]
    pub unsafe fn exec(&mut self, cmd: &IoCmd, segs: &[Seg]) -> Status {
        // SAFETY: forwarded contract (the command is over when `wait`
        // returns).
        match unsafe { self.start::<Waited>(SYNC_TAG, cmd, segs) } {
            Some(st) => st,
            None => self.wait(),
        }
    }

    /// Polls until the synchronous command (`SYNC_TAG`) is over; returns
    /// its status. The asynchronous commands that finish meanwhile go to
    /// `done`, for the next `poll`.
    #[inline(never)]
    fn wait(&mut self) -> Status {
        let mut done = std::mem::take(&mut self.done);
        let mut sync = None;
        loop {
            self.poll_any(&mut |tag, st| {
                if tag == SYNC_TAG {
                    sync = Some(st);
                } else {
                    // At most `depth` are in flight: never grows the ring.
                    done.push_back((tag, st));
                }
            });
            if let Some(st) = sync {
                self.done = done;
                return st;
            }
            std::hint::spin_loop();
        }
    }

    /// Flushes every namespace, logging failures (a shutdown).
    pub fn flush_all(&mut self) {
        for nsid in 1..=self.ns.len() as u32 {
            if self.ns_of(nsid).is_none() {
                continue;
            }
            let cmd = IoCmd {
                op: IoOp::Flush,
                nsid,
                slba: 0,
                nlb: 0,
                xfer_len: 0,
                flags: RwFlags::NONE,
                cid: ERROR_LOG_NOT_SPECIFIC,
            };
            // SAFETY: no data.
            let st = unsafe { self.exec(&cmd, &[]) };
            if !st.is_success() {
                tracing::error!(nsid, status = ?st, "flush at shutdown failed");
            }
        }
    }

    // ------------------------------------------------------------------
    // Asynchronous form
    // ------------------------------------------------------------------

    /// Asynchronous commands submitted and not yet delivered.
    pub fn outstanding(&self) -> u32 {
        self.inflight
    }

    /// Submits a checked command; its status comes out of
    /// [`IoQueue::poll`] with `tag` (below 2^31 - 1). Reads, writes, flushes
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
    #[inline(always)]
    pub unsafe fn submit(
        &mut self,
        tag: u32,
        cmd: &IoCmd,
        segs: &[Seg],
    ) -> Result<(), ControllerError> {
        if self.inflight >= self.depth {
            return Err(ControllerError::QueueFull { depth: self.depth });
        }
        debug_assert!(tag < SYNC_TAG, "tag {tag:#x} is not below {SYNC_TAG:#x}");
        self.inflight += 1;
        if let Some(i) = self.info.get_mut(tag as usize) {
            *i = (cmd.cid, cmd.slba);
        }
        // SAFETY: forwarded contract.
        unsafe { self.start::<Queued>(tag, cmd, segs) };
        Ok(())
    }

    /// The status of a command known when it starts, reported if it
    /// failed.
    #[inline(always)]
    fn at_once(&self, cmd: &IoCmd, st: Status) -> Status {
        if !st.is_success() {
            self.report_failure(cmd.cid, st, cmd.nsid, cmd.slba);
        }
        st
    }

    /// Starts a checked command under `tag`: the one dispatch of every
    /// command, for `submit` (`F` = [`Queued`]) and `exec` ([`Waited`]).
    /// A status known within the call (refused, nothing to do, run to
    /// completion) goes to `F::known`; a command in flight is
    /// `F::PENDING` (its status comes from a poll, under `tag`).
    /// Synchronously, reads and writes try the bdev's within-the-call path
    /// first and are never staged.
    ///
    /// # Safety
    /// As `submit` (`exec`: until the poll delivered `tag`).
    #[inline(always)]
    unsafe fn start<F: Form>(&mut self, tag: u32, cmd: &IoCmd, segs: &[Seg]) -> F::Out {
        let idx = (cmd.nsid as usize).wrapping_sub(1);
        let st = match cmd.op {
            IoOp::Read | IoOp::Write => {
                let write = cmd.op == IoOp::Write;
                match self.ns.get_mut(idx).and_then(Option::as_mut) {
                    Some(ns) if !ns.misaligned(segs) => {
                        // Null and RAM finish within the call.
                        let now = if F::SYNC {
                            // SAFETY: forwarded contract.
                            unsafe {
                                if write {
                                    ns.ch.writev_raw_now_with(cmd.slba, segs, cmd.flags)
                                } else {
                                    ns.ch.readv_raw_now_with(cmd.slba, segs, cmd.flags)
                                }
                            }
                        } else {
                            None
                        };
                        match now {
                            Some(Ok(())) => {
                                count(&mut self.stats, write, cmd.xfer_len);
                                Status::SUCCESS
                            }
                            Some(Err(e)) => rw_failed(cmd, write, &StoreError::Refused(e)),
                            None => {
                                let kind = if write { Kind::Write } else { Kind::Read };
                                let u = UserData::new(tag, kind, cmd.nlb).raw();
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
                                    Ok(()) => return F::PENDING,
                                    Err(e) => rw_failed(cmd, write, &StoreError::Refused(e)),
                                }
                            }
                        }
                    }
                    // SAFETY: forwarded contract.
                    _ => match unsafe { self.start_unlent::<F>(tag, cmd, segs) } {
                        Some(st) => st,
                        None => return F::PENDING,
                    },
                }
            }
            IoOp::Flush => match self.ns.get_mut(idx).and_then(Option::as_mut) {
                Some(ns) => match ns.ch.flush_cache(UserData::new(tag, Kind::Other, 0).raw()) {
                    Ok(()) => return F::PENDING,
                    Err(e) => {
                        tracing::error!(nsid = cmd.nsid, error = %e, "flush failed");
                        Status::media(media::WRITE_FAULT)
                    }
                },
                None => gen(generic::INVALID_NAMESPACE),
            },
            IoOp::WriteZeroes { .. }
                if cmd.flags.fua()
                    || self
                        .ns
                        .get(idx)
                        .and_then(Option::as_ref)
                        .is_some_and(|ns| cmd.nlb > ns.zero_piece) =>
            {
                // SAFETY: forwarded contract.
                match unsafe {
                    self.multi
                        .start(&mut self.ns, &mut self.scratch, tag, cmd, segs)
                } {
                    Some(st) => st,
                    None => return F::PENDING,
                }
            }
            IoOp::WriteZeroes { dealloc } => match self.ns.get_mut(idx).and_then(Option::as_mut) {
                Some(ns) => {
                    let u = UserData::new(tag, Kind::Other, 0).raw();
                    let r = if dealloc {
                        ns.ch.unmap(cmd.slba, cmd.nlb, u)
                    } else {
                        ns.ch.write_zeroes(cmd.slba, cmd.nlb, u)
                    };
                    match r {
                        Ok(()) => return F::PENDING,
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
                match unsafe {
                    self.multi
                        .start(&mut self.ns, &mut self.scratch, tag, cmd, segs)
                } {
                    Some(st) => st,
                    None => return F::PENDING,
                }
            }
        };
        F::known(self, tag, cmd, st)
    }

    /// `start` of a read or write whose segments the bdev cannot take:
    /// staged when the namespace is an NVMe one, its pool covers the
    /// command and it is not synchronous (`stage`; `None`: the status comes
    /// from `poll`), else run within the call through the namespace's
    /// bounce buffer (its status).
    ///
    /// # Safety
    /// As `start`.
    #[cold]
    #[inline(never)]
    unsafe fn start_unlent<F: Form>(
        &mut self,
        tag: u32,
        cmd: &IoCmd,
        segs: &[Seg],
    ) -> Option<Status> {
        let write = cmd.op == IoOp::Write;
        let Some(ns) = self
            .ns
            .get_mut((cmd.nsid as usize).wrapping_sub(1))
            .and_then(Option::as_mut)
        else {
            return Some(gen(generic::INVALID_NAMESPACE));
        };
        let NsChan { ch, staging, .. } = ns;
        if let Some(st) = staging
            .as_mut()
            .filter(|st| !F::SYNC && st.fits(cmd.nlb, segs.len()))
        {
            let mut io = ch.io();
            // SAFETY: forwarded contract (until delivered); the
            // segments total `xfer_len`, `nlb` blocks.
            let r = unsafe { st.submit(&mut io, tag, write, cmd.slba, cmd.nlb, cmd.flags, segs) };
            return match r {
                Staged::Queued => None,
                Staged::Failed(e) => Some(rw_failed(cmd, write, &StoreError::Refused(e))),
            };
        }
        // SAFETY: forwarded contract (within the call).
        Some(
            match unsafe { ns.rw_bounce(write, cmd.slba, segs, cmd.flags) } {
                Ok(()) => {
                    count(&mut self.stats, write, cmd.xfer_len);
                    Status::SUCCESS
                }
                Err(e) => rw_failed(cmd, write, &e),
            },
        )
    }

    /// Commands of NVMe namespaces that waited for DMA staging pieces
    /// since the queue was made (see `stage`): a pool too small for the
    /// load shows here.
    pub fn staged_waits(&self) -> u64 {
        self.ns
            .iter()
            .flatten()
            .filter_map(|n| n.staging.as_ref())
            .map(|s| s.waits())
            .sum()
    }

    /// Requests of this queue the namespaces' bdevs hold (submitted, not
    /// yet polled back), staged pieces included.
    pub fn bdev_requests(&self) -> usize {
        self.ns
            .iter()
            .flatten()
            .chain(self.retiring.iter().map(|(_, c)| c))
            .map(|n| n.ch.outstanding())
            .sum()
    }

    /// Delivers the statuses of finished asynchronous commands to
    /// `f(tag, status)`; returns how many. Every submitted command is
    /// delivered exactly once (a failed bdev completes all of them with
    /// media errors).
    pub fn poll(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        let n = self.poll_any(f);
        self.inflight -= n as u32;
        n
    }

    /// `poll` without the count of outstanding commands (`wait` uses it
    /// too).
    #[inline(always)]
    fn poll_any(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        if self.multi.idle() {
            self.poll_requests(f)
        } else {
            self.poll_multi(f)
        }
    }

    /// `poll` while commands of several requests (`multi`) are
    /// outstanding: their requests' completions go to them (the next
    /// pieces out), the others to `f`, and so do the commands that are
    /// over.
    #[cold]
    #[inline(never)]
    fn poll_multi(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        let mut kids = std::mem::take(&mut self.multi.kids);
        let mut n = self.poll_requests(&mut |tag, st| {
            if tag & KID != 0 {
                kids.push((tag, st));
            } else {
                f(tag, st);
            }
        });
        n -= kids.len();
        for (tag, st) in kids.drain(..) {
            if let Some(m) = self.multi.kid_done(&mut self.ns, tag, st) {
                if !m.status.is_success() {
                    self.report_failure(m.cid, m.status, m.nsid, m.slba);
                }
                f(m.tag, m.status);
                n += 1;
            }
        }
        self.multi.kids = kids;
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
        if !self.retiring.is_empty() {
            n += self.poll_retiring(f);
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
            let Some(ch) = ch else {
                continue;
            };
            let nsid = i as u32 + 1;
            n += poll_chan(ch, stats, &rep, nsid, f);
        }
        n
    }

    /// `poll_requests` of the channels of removed namespaces; drops
    /// those with nothing left in flight.
    #[cold]
    #[inline(never)]
    fn poll_retiring(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        let IoQueue {
            retiring,
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
        let mut n = 0;
        for (nsid, ch) in retiring.iter_mut() {
            n += poll_chan(ch, stats, &rep, *nsid, f);
        }
        retiring.retain(|(nsid, ch)| {
            let keep = ch.busy();
            if !keep {
                tracing::debug!(nsid, "channel of a removed namespace closed");
            }
            keep
        });
        n
    }
}

/// Delivers the finished requests of one channel (namespace `nsid`).
#[inline(always)]
fn poll_chan(
    ch: &mut NsChan,
    stats: &mut IoStats,
    rep: &Report<'_>,
    nsid: u32,
    f: &mut impl FnMut(u32, Status),
) -> usize {
    let mut n = 0;
    let shift = ch.shift;
    while let Some((u, r)) = ch.stash.pop_front() {
        f(u.tag(), finish(stats, rep, nsid, shift, u, r));
        n += 1;
    }
    if ch.staging.is_some() {
        return n + poll_staged(ch, stats, rep, nsid, f);
    }
    if ch.ch.outstanding() == 0 {
        return n;
    }
    ch.ch.poll(u32::MAX, &mut |_: &mut Io<'_>, c: Completion| {
        let u = UserData::from_raw(c.user_data);
        f(u.tag(), finish(stats, rep, nsid, shift, u, c.result));
        n += 1;
    });
    n
}

/// The two forms of `IoQueue::start`: what becomes of a status known
/// within the call.
trait Form {
    /// Synchronous (`exec`).
    const SYNC: bool;
    type Out;
    /// The command is in flight: its status comes from a poll.
    const PENDING: Self::Out;
    /// The command is over with `st`.
    fn known(q: &mut IoQueue, tag: u32, cmd: &IoCmd, st: Status) -> Self::Out;
}

/// `submit`'s: the status waits in `done` for the next `poll`.
struct Queued;

impl Form for Queued {
    const SYNC: bool = false;
    type Out = ();
    const PENDING: () = ();

    #[inline(always)]
    fn known(q: &mut IoQueue, tag: u32, cmd: &IoCmd, st: Status) {
        let st = q.at_once(cmd, st);
        // At most `depth` are in flight, so this never grows the ring.
        q.done.push_back((tag, st));
    }
}

/// `exec`'s: the status is returned (None: `exec` polls for it).
struct Waited;

impl Form for Waited {
    const SYNC: bool = true;
    type Out = Option<Status>;
    const PENDING: Option<Status> = None;

    #[inline(always)]
    fn known(q: &mut IoQueue, _: u32, cmd: &IoCmd, st: Status) -> Option<Status> {
        Some(q.at_once(cmd, st))
    }
}
