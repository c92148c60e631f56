//! Controller bring-up, namespaces, queue pair allocation, reset and
//! shutdown (NVMe 2.0 base spec §3.5.1 "Memory-based Controller
//! Initialization"), for any transport. The control path: every step
//! bounded by CAP.TO or the admin timeout, every failure a typed error.
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pollux_spec::features::{fid, NumberOfQueues};
use pollux_spec::identify::{IdentifyController, IdentifyNamespace, NsIdList};
use pollux_spec::regs::{self, Cap, Cc, Csts};
use pollux_spec::{cmd::cns, Cqe, Sqe};
use zerocopy::FromBytes;

use crate::admin::AdminQueue;
use crate::dma::{DmaBuffer, IoBuf};
use crate::error::{Error, Result};
use crate::namespace::Namespace;
use crate::transport::{Registers, SubmissionQueue, Transport};

/// Largest transfer pollux puts in one command: one PRP list page (512
/// entries) always suffices, so lists never chain.
pub const MAX_TRANSFER_CAP: u32 = 2 << 20;

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (2..=4096).
    pub admin_queue_size: u16,
    /// Bound on each admin command.
    pub admin_timeout: Duration,
    /// I/O queue pairs to ask for (Set Features Number of Queues).
    pub io_queues: u16,
    /// Use Doorbell Buffer Config (shadow doorbells) when offered (PCIe).
    pub shadow_doorbells: bool,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_size: 32,
            admin_timeout: Duration::from_secs(5),
            io_queues: 64,
            shadow_doorbells: true,
        }
    }
}

/// Identifies a controller for the life of the process (`Namespace::ctrl`):
/// never reused, so a namespace of a controller that was dropped matches
/// no later one.
static NEXT_CTRL_ID: AtomicU64 = AtomicU64::new(1);

pub(crate) struct AdminState<T: Transport> {
    pub(crate) q: AdminQueue<T>,
}

/// State shared by the controller handle and its queue pairs.
pub(crate) struct Shared<T: Transport> {
    pub(crate) transport: T,
    pub(crate) cap: Cap,
    pub(crate) opts: ControllerOptions,
    admin: Mutex<AdminState<T>>,
    /// I/O queue IDs in use (apart from the admin lock, which a reset
    /// holds for as long as it runs: dropping a queue pair never waits).
    qid_used: Mutex<Vec<bool>>,
    /// A reset runs on a thread of its own (`reset_in_background`).
    bg_reset: AtomicBool,
    /// Even: controller ready. Odd: a reset is in progress. Queue pairs
    /// compare it with the value they were created under once per poll.
    pub(crate) generation: AtomicU32,
    pub(crate) failed: AtomicBool,
    /// Set with `failed` when the reset failed before the controller
    /// confirmed it had stopped (CSTS.RDY=0 after CC.EN=0), on a transport
    /// whose queue restarts do not stop transfers by themselves (PCIe): it
    /// may still transfer into the memory of the commands it had, so their
    /// buffers are not handed back (`QueuePair::fail_for_good`).
    pub(crate) unstopped: AtomicBool,
    pub(crate) nr_io_queues: u16,
    pub(crate) max_transfer: u32,
    ident: Box<IdentifyController>,
    pub(crate) namespaces: Vec<Namespace>,
    /// This controller's ID (see `NEXT_CTRL_ID`), in each of its
    /// namespaces.
    pub(crate) id: u64,
}

/// An NVMe controller driven through a `Transport`.
///
/// `Sync`: admin operations take an internal lock. The I/O path lives in
/// `QueuePair`s, which are `Send` but not `Sync` and take no lock.
pub struct Controller<T: Transport> {
    pub(crate) shared: Arc<Shared<T>>,
}

fn wait_csts<T: Transport>(
    t: &T,
    timeout_ms: u64,
    what: &'static str,
    done: impl Fn(Csts) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let csts = Csts(t.regs().read32(regs::off::CSTS)?);
        if csts.is_dead() {
            return Err(Error::ControllerGone);
        }
        if done(csts) {
            return Ok(());
        }
        if csts.cfs() && what != "CSTS.RDY=0" {
            return Err(Error::ControllerFatal);
        }
        if start.elapsed().as_millis() as u64 >= timeout_ms {
            return Err(Error::Timeout {
                what,
                ms: timeout_ms,
            });
        }
        for _ in 0..64 {
            t.relax();
        }
    }
}

pub(crate) fn check(cqe: Cqe, cmd: &'static str) -> Result<Cqe> {
    let st = cqe.status();
    if st.is_success() {
        Ok(cqe)
    } else {
        Err(Error::Nvme { cmd, status: st })
    }
}

impl<T: Transport> Shared<T> {
    fn cap_timeout_ms(&self) -> u64 {
        self.cap.timeout_ms().max(500)
    }

    fn admin_mut(&mut self) -> &mut AdminState<T> {
        self.admin.get_mut().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn lock_admin(&self) -> MutexGuard<'_, AdminState<T>> {
        // A panic while holding the admin lock leaves only indices behind,
        // which a reset rebuilds: recover the guard rather than propagate.
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The admin lock if nobody holds it (a queue pair's poll never waits
    /// for it: a reset may hold it for as long as a reconnect takes).
    pub(crate) fn try_lock_admin(&self) -> Option<MutexGuard<'_, AdminState<T>>> {
        match self.admin.try_lock() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Runs `f` with an admin command executor, under the admin lock.
    pub(crate) fn with_admin<R>(
        &self,
        st: &mut AdminState<T>,
        f: impl FnOnce(&mut crate::transport::AdminExec<'_>) -> Result<R>,
    ) -> Result<R> {
        let t = &self.transport;
        let to = self.opts.admin_timeout;
        let q = &mut st.q;
        let mut exec = |sqe: Sqe, what: &'static str| check(q.exec(t, sqe, None, to)?.0, what);
        f(&mut exec)
    }

    pub(crate) fn exec(&self, st: &mut AdminState<T>, sqe: Sqe, cmd: &'static str) -> Result<Cqe> {
        let (cqe, _) =
            st.q.exec(&self.transport, sqe, None, self.opts.admin_timeout)?;
        check(cqe, cmd)
    }

    /// Disables the controller (CC.EN=0) and waits for CSTS.RDY=0.
    fn disable(t: &T, cap: Cap) -> Result<()> {
        let r = t.regs();
        let cc = Cc(r.read32(regs::off::CC)?);
        let csts = Csts(r.read32(regs::off::CSTS)?);
        let to = cap.timeout_ms().max(500);
        if cc.en() && !csts.rdy() && !csts.cfs() {
            // Spec: don't clear EN while an enable is still in progress.
            wait_csts(t, to, "CSTS.RDY=1", |c| c.rdy())?;
        }
        if cc.en() {
            // SAFETY: clearing CC.EN stops the controller: once CSTS.RDY=0
            // it transfers nothing and has forgotten its queues. The memory
            // of the commands it had stays with their owners (trackers,
            // parked admin buffers), handed back only by the queue
            // restarts that follow a completed disable.
            unsafe { r.write32(regs::off::CC, cc.with_en(false).0) }?;
        }
        wait_csts(t, to, "CSTS.RDY=0", |c| !c.rdy())
    }

    /// Attaches the admin queue and enables the controller.
    ///
    /// # Safety
    /// `q` must be this controller's admin queue, new or restarted, and
    /// the controller disabled (`disable` succeeded) since.
    unsafe fn enable(t: &T, cap: Cap, q: &AdminQueue<T>) -> Result<()> {
        let r = t.regs();
        // SAFETY: `q` is this transport's admin pair, empty, and the
        // controller is disabled (the caller's promise); enabling it then
        // makes it run the admin queue the core drives, and no other.
        unsafe {
            t.attach_admin(&q.sq, &q.cq)?;
            r.write32(regs::off::CC, Cc::standard(0).0)?;
            r.write32(regs::off::CC, Cc::standard(0).with_en(true).0)?;
        }
        let d = t.ready_delay_us();
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d as u64));
        }
        wait_csts(t, cap.timeout_ms().max(500), "CSTS.RDY=1", |c| c.rdy())
    }

    fn set_num_queues(&self, st: &mut AdminState<T>, want: u16) -> Result<u16> {
        let nq = NumberOfQueues {
            nsq: want,
            ncq: want,
        };
        let cqe = self.exec(
            st,
            Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, nq.to_cdw11()),
            "Set Features (Number of Queues)",
        )?;
        let got = NumberOfQueues::from_dw0(cqe.dw0);
        Ok(got.nsq.min(got.ncq).min(want))
    }

    /// Controller-level reset: disable, re-enable with the same admin queue,
    /// restore the queue count and the transport's setup. Queue pairs notice
    /// the new generation on their next poll and recover (see
    /// `QueuePair::recover`).
    ///
    /// `seen` is the generation the caller observed when it decided to
    /// reset: if someone else has reset since, nothing is done.
    pub(crate) fn reset(&self, seen: u32) -> Result<()> {
        let mut st = self.lock_admin();
        if self.generation.load(Ordering::Acquire) != seen {
            return Ok(());
        }
        if self.failed.load(Ordering::Acquire) {
            return Err(Error::ControllerFatal);
        }
        self.generation.fetch_add(1, Ordering::AcqRel); // odd: resetting
        tracing::warn!(transport = %self.transport.describe(), "resetting controller");
        let mut stopped = false;
        let r = (|| {
            Self::disable(&self.transport, self.cap)?;
            stopped = true;
            // SAFETY: the controller was disabled just now; `st.q` is its
            // admin queue, restarted empty.
            unsafe {
                st.q.restart();
                Self::enable(&self.transport, self.cap, &st.q)?;
            }
            let n = self.set_num_queues(&mut st, self.opts.io_queues)?;
            if n < self.nr_io_queues {
                return Err(Error::Unsupported(format!(
                    "after reset the controller grants {n} I/O queues, had {}",
                    self.nr_io_queues
                )));
            }
            let ident = &*self.ident;
            // SAFETY: `exec` runs admin commands on this controller, which
            // was re-enabled just now: no I/O queue of it runs until the
            // queue pairs re-create theirs (after this reset).
            self.with_admin(&mut st, |exec| unsafe {
                self.transport.configure(exec, ident)
            })
        })();
        if let Err(e) = &r {
            tracing::error!("controller reset failed: {e}");
            if !stopped && !self.transport.restart_stops_transfers() {
                tracing::error!(
                    transport = %self.transport.describe(),
                    "the controller did not confirm it stopped (CSTS.RDY=0 after CC.EN=0): it \
                     may still transfer into the memory of the commands it had, which is \
                     therefore not handed back to its owners"
                );
                // Before `failed`: a queue pair that sees `failed` sees this.
                self.unstopped.store(true, Ordering::Release);
            }
            self.failed.store(true, Ordering::Release);
        }
        self.generation.fetch_add(1, Ordering::AcqRel); // even: done (check `failed`)
        r
    }

    /// Starts `reset(seen)` on a thread of its own, unless one is running
    /// already (false then), for transports whose reset `reconnects`: the
    /// caller, a queue pair's poll, goes on; its recovery waits for the
    /// new generation.
    pub(crate) fn reset_in_background(self: &Arc<Self>, seen: u32) -> bool {
        if self.bg_reset.swap(true, Ordering::AcqRel) {
            return false;
        }
        let s = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nvme-reset".into())
            .spawn(move || {
                // A failure is logged by `reset` and seen by every queue
                // pair as the `failed` flag.
                let _ = s.reset(seen);
                s.bg_reset.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            self.bg_reset.store(false, Ordering::Release);
            tracing::error!("could not start a reset thread ({e}): resetting on this one");
            let _ = self.reset(seen);
        }
        true
    }

    fn lock_qids(&self) -> MutexGuard<'_, Vec<bool>> {
        self.qid_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Claims a free I/O queue ID.
    pub(crate) fn claim_qid(&self) -> Result<u16> {
        let mut used = self.lock_qids();
        let qid = used
            .iter()
            .skip(1)
            .position(|u| !u)
            .map(|i| i + 1)
            .ok_or(Error::NoQueues)?;
        used[qid] = true;
        Ok(qid as u16)
    }

    pub(crate) fn release_qid(&self, qid: u16) {
        if let Some(u) = self.lock_qids().get_mut(qid as usize) {
            *u = false;
        }
    }

    /// Aborts command `cid` on SQ `sqid`. `Ok(true)` if the controller says
    /// it aborted it (its completion follows with Command Abort Requested).
    pub(crate) fn abort(&self, sqid: u16, cid: u16) -> Result<bool> {
        let mut st = self.lock_admin();
        let cqe = self.exec(&mut st, Sqe::abort(sqid, cid), "Abort")?;
        Ok(cqe.dw0 & 1 == 0)
    }

    pub(crate) fn csts(&self) -> Result<Csts> {
        Ok(Csts(self.transport.regs().read32(regs::off::CSTS)?))
    }
}

/// The 4 KiB buffer of the Identify commands at bring-up. Owned: if a
/// command times out, the admin queue keeps it (the controller may still
/// write it) and the next command fails.
struct IdentBuf(Option<IoBuf>);

impl IdentBuf {
    fn exec<T: Transport>(
        &mut self,
        q: &mut AdminQueue<T>,
        t: &T,
        sqe: Sqe,
        to: Duration,
    ) -> Result<Cqe> {
        let b = self.0.take().ok_or_else(|| {
            Error::Platform("identify buffer held by a command that timed out".into())
        })?;
        let (cqe, b) = q.exec(t, sqe, Some(b), to)?;
        self.0 = b;
        Ok(cqe)
    }

    /// The 4 KiB an Identify command returned.
    fn page(&self) -> Result<&[u8]> {
        self.0
            .as_ref()
            .and_then(|b| b.as_slice().get(..4096))
            .ok_or_else(|| Error::Platform("identify buffer too small".into()))
    }
}

/// Identify Namespace for `nsid`, as the I/O path needs it.
fn identify_ns<T: Transport>(
    q: &mut AdminQueue<T>,
    t: &T,
    to: Duration,
    buf: &mut IdentBuf,
    nsid: u32,
    max_transfer: u32,
    ctrl: u64,
) -> Result<Option<Namespace>> {
    check(
        buf.exec(q, t, Sqe::identify(cns::NAMESPACE, nsid, 0), to)?,
        "Identify Namespace",
    )?;
    let id = IdentifyNamespace::read_from_bytes(buf.page()?)
        .map_err(|_| Error::Platform("identify buffer too small".into()))?;
    if id.nsze == 0 {
        return Ok(None); // inactive
    }
    let lbads = id.lba_format().lbads;
    if !(9..=16).contains(&lbads) {
        tracing::warn!(nsid, lbads, "namespace with unsupported LBA size skipped");
        return Ok(None);
    }
    // With metadata, a command moves more than NLB << LBADS bytes (an
    // extended LBA format interleaves it with the data) or writes it to
    // MPTR (a separate buffer, which pollux never gives): the buffers the
    // I/O path checks would be overrun.
    let ms = id.lba_format().ms;
    if ms != 0 {
        tracing::warn!(
            nsid,
            ms,
            "namespace formatted with {ms} bytes of metadata per block skipped (pollux supports \
             none; reformat it with an LBA format without metadata)"
        );
        return Ok(None);
    }
    let max_lbas = (max_transfer >> lbads).max(1);
    Ok(Some(Namespace {
        nsid,
        lba_shift: lbads,
        nsze: id.nsze,
        max_lbas,
        ctrl,
    }))
}

impl<T: Transport> Controller<T> {
    /// Brings the controller up: disable, admin queue, enable, Identify,
    /// Number of Queues, namespaces, the transport's own setup.
    pub fn new(transport: T, opts: ControllerOptions) -> Result<Controller<T>> {
        if !(2..=4096).contains(&opts.admin_queue_size) {
            return Err(Error::InvalidArgument(format!(
                "admin queue size {} not in 2..=4096",
                opts.admin_queue_size
            )));
        }
        if opts.io_queues == 0 || opts.io_queues == u16::MAX {
            return Err(Error::InvalidArgument(
                "io_queues must be in 1..=65534".into(),
            ));
        }
        let t = &transport;
        let r = t.regs();
        let cap = Cap(r.read64(regs::off::CAP)?);
        if cap.0 == u64::MAX {
            return Err(Error::ControllerGone);
        }
        if cap.css() & regs::CAP_CSS_NVM == 0 {
            return Err(Error::Unsupported(
                "controller does not support the NVM command set".into(),
            ));
        }
        if cap.mpsmin() != 0 {
            return Err(Error::Unsupported(format!(
                "minimum memory page size is {} KiB; pollux uses 4 KiB",
                4u32 << cap.mpsmin()
            )));
        }
        let vs = regs::Vs(r.read32(regs::off::VS)?);
        tracing::debug!(
            cap = format_args!("{:#x}", cap.0),
            vs = format_args!("{}.{}", vs.major(), vs.minor()),
            "controller registers"
        );

        Shared::disable(t, cap)?;
        let aq_size = opts
            .admin_queue_size
            .min(cap.mqes().saturating_add(1))
            .max(2);
        // SAFETY: the one admin queue of this controller, new.
        let mut q = unsafe { AdminQueue::new(t, aq_size) }?;
        // SAFETY: `q` is its admin queue, new; the controller was disabled
        // just now.
        unsafe { Shared::enable(t, cap, &q) }?;
        let to = opts.admin_timeout;

        let mut buf = IdentBuf(Some(IoBuf::new(t.alloc_dma(4096)?)));
        check(
            buf.exec(&mut q, t, Sqe::identify(cns::CONTROLLER, 0, 0), to)?,
            "Identify Controller",
        )?;
        let ident = Box::new(
            IdentifyController::read_from_bytes(buf.page()?)
                .map_err(|_| Error::Platform("identify buffer too small".into()))?,
        );
        // SQES/CQES: bits 3:0 required (minimum) size, 7:4 maximum, log2.
        let entry_ok = |field: u8, want: u8| field & 0xF <= want && want <= field >> 4;
        if !entry_ok(ident.sqes, 6) || !entry_ok(ident.cqes, 4) {
            return Err(Error::Unsupported(format!(
                "SQES {:#x} / CQES {:#x} exclude 64/16-byte entries",
                ident.sqes, ident.cqes
            )));
        }
        let mdts_bytes = if ident.mdts == 0 {
            MAX_TRANSFER_CAP
        } else {
            (4096u64 << ident.mdts.min(20)).min(MAX_TRANSFER_CAP as u64) as u32
        };
        let max_transfer = mdts_bytes.min(t.max_transfer());

        let nq = NumberOfQueues {
            nsq: opts.io_queues,
            ncq: opts.io_queues,
        };
        let cqe = check(
            q.exec(
                t,
                Sqe::set_features(fid::NUMBER_OF_QUEUES, 0, nq.to_cdw11()),
                None,
                to,
            )?
            .0,
            "Set Features (Number of Queues)",
        )?;
        let got = NumberOfQueues::from_dw0(cqe.dw0);
        let nr_io_queues = got.nsq.min(got.ncq).min(opts.io_queues);

        // Namespaces: the active list (CNS 2); controllers before NVMe 1.1
        // lack it, then probe 1..=NN.
        let id = NEXT_CTRL_ID.fetch_add(1, Ordering::Relaxed);
        let mut namespaces = Vec::new();
        let list = buf.exec(&mut q, t, Sqe::identify(cns::ACTIVE_NS_LIST, 0, 0), to)?;
        let ids: Vec<u32> = if list.status().is_success() {
            let l = NsIdList::read_from_bytes(buf.page()?)
                .map_err(|_| Error::Platform("identify buffer too small".into()))?;
            l.ids.iter().copied().take_while(|&id| id != 0).collect()
        } else {
            (1..=ident.nn.min(1024)).collect()
        };
        for nsid in ids {
            if let Some(ns) = identify_ns(&mut q, t, to, &mut buf, nsid, max_transfer, id)? {
                namespaces.push(ns);
            }
        }
        drop(buf);

        let shared = Shared {
            transport,
            cap,
            opts,
            admin: Mutex::new(AdminState { q }),
            qid_used: Mutex::new(vec![false; nr_io_queues as usize + 1]),
            bg_reset: AtomicBool::new(false),
            generation: AtomicU32::new(0),
            failed: AtomicBool::new(false),
            unstopped: AtomicBool::new(false),
            nr_io_queues,
            max_transfer,
            ident,
            namespaces,
            id,
        };
        {
            let mut st = shared.lock_admin();
            let ident = &*shared.ident;
            // SAFETY: `exec` runs admin commands on this controller, which
            // has no I/O queue yet.
            shared.with_admin(&mut st, |exec| unsafe {
                shared.transport.configure(exec, ident)
            })?;
        }
        tracing::info!(
            transport = %shared.transport.describe(),
            model = %pollux_spec::identify::ascii_str(&shared.ident.mn),
            io_queues = nr_io_queues,
            namespaces = shared.namespaces.len(),
            max_transfer,
            "controller ready"
        );
        Ok(Controller {
            shared: Arc::new(shared),
        })
    }

    pub fn identify(&self) -> &IdentifyController {
        &self.shared.ident
    }

    pub fn cap(&self) -> Cap {
        self.shared.cap
    }

    /// The transport this controller is reached through.
    pub fn transport(&self) -> &T {
        &self.shared.transport
    }

    pub fn namespaces(&self) -> &[Namespace] {
        &self.shared.namespaces
    }

    pub fn namespace(&self, nsid: u32) -> Option<Namespace> {
        self.shared
            .namespaces
            .iter()
            .copied()
            .find(|n| n.nsid == nsid)
    }

    /// I/O queue pairs the controller granted.
    pub fn io_queues(&self) -> u16 {
        self.shared.nr_io_queues
    }

    /// Largest transfer per command, in bytes.
    pub fn max_transfer(&self) -> u32 {
        self.shared.max_transfer
    }

    pub fn describe(&self) -> String {
        self.shared.transport.describe()
    }

    /// Allocates DMA memory usable for I/O on this controller.
    pub fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        self.shared.transport.alloc_dma(len)
    }

    /// Calls the transport's wait hook (steps an inline emulated controller).
    pub fn relax(&self) {
        self.shared.transport.relax()
    }

    /// Raw admin command, checked. The controller never writes memory the
    /// caller still reaches: `data` is owned, and comes back with the
    /// completion entry (a command that times out keeps it until it
    /// completes or the controller has been disabled). The data pointer
    /// fields are the transport's: the caller's PRP1/PRP2 (or SGL), MPTR
    /// and PSDT are cleared and the transport describes `data` there
    /// (nothing without data). The command must be one whose transfer
    /// length the driver reads from the command (Identify, Get Log Page,
    /// Get/Set Features of the features it knows, ...: see `passthru`),
    /// with `data` exactly that long (none for a command that moves no
    /// data); anything else is refused (`Error::Passthrough`) and needs
    /// [`admin_unchecked`](Self::admin_unchecked).
    ///
    /// ```compile_fail
    /// # fn f<T: pollux_nvme::Transport>(ctrl: &pollux_nvme::Controller<T>) {
    /// let buf = ctrl.alloc_dma(4096).unwrap();
    /// // A shared reference the device would write behind: refused.
    /// ctrl.admin(pollux_spec::Sqe::identify(1, 0, 0), Some(&buf));
    /// # }
    /// ```
    pub fn admin(&self, mut sqe: Sqe, data: Option<IoBuf>) -> Result<(Cqe, Option<IoBuf>)> {
        crate::passthru::clear_pointers(&mut sqe);
        let got = data.as_ref().map_or(0, |b| b.len());
        crate::passthru::check_admin(&sqe, got).map_err(Error::Passthrough)?;
        self.admin_owned(sqe, data)
    }

    /// `admin` for any command: the transfer length is not checked. The
    /// data pointer fields are still the transport's (cleared, then
    /// filled from `data`).
    ///
    /// # Safety
    /// The command must make the controller transfer no more than
    /// `data.len()` bytes (nothing without data), and must not hand it any
    /// other host memory (addresses in command dwords, as Create I/O
    /// Queue, Doorbell Buffer Config or Set Features Host Memory Buffer
    /// carry) or change what the I/O path relies on: the namespaces'
    /// block size and size (Format NVM, Namespace Management and
    /// Attachment), the driver's queues.
    pub unsafe fn admin_unchecked(
        &self,
        mut sqe: Sqe,
        data: Option<IoBuf>,
    ) -> Result<(Cqe, Option<IoBuf>)> {
        crate::passthru::clear_pointers(&mut sqe);
        self.admin_owned(sqe, data)
    }

    fn admin_owned(&self, sqe: Sqe, data: Option<IoBuf>) -> Result<(Cqe, Option<IoBuf>)> {
        let mut st = self.shared.lock_admin();
        if let Some(d) = &data {
            let max = st.q.sq.max_data();
            if d.len() > max {
                return Err(Error::InvalidArgument(format!(
                    "admin data buffers are limited to {max} bytes (got {})",
                    d.len()
                )));
            }
        }
        st.q.exec(
            &self.shared.transport,
            sqe,
            data,
            self.shared.opts.admin_timeout,
        )
    }

    /// Get Log Page into a new vector (`len` a multiple of 4, ≤ 8 KiB).
    pub fn get_log_page(&self, lid: u8, nsid: u32, len: usize) -> Result<Vec<u8>> {
        if len == 0 || !len.is_multiple_of(4) || len > 8192 {
            return Err(Error::InvalidArgument(format!(
                "log page length {len} must be a non-zero multiple of 4, at most 8192"
            )));
        }
        let buf = IoBuf::new(self.alloc_dma(len)?).truncate(len);
        let sqe = Sqe::get_log_page(lid, nsid, len as u32, 0, 0, 0);
        let (cqe, buf) = self.admin(sqe, Some(buf))?;
        check(cqe, "Get Log Page")?;
        Ok(buf.map(|b| b.as_slice().to_vec()).unwrap_or_default())
    }

    /// Get Features (current value): returns completion dword 0.
    pub fn get_features(&self, fid: u8, nsid: u32) -> Result<u32> {
        Ok(check(
            self.admin(Sqe::get_features(fid, nsid), None)?.0,
            "Get Features",
        )?
        .dw0)
    }

    /// Set Features: returns completion dword 0.
    pub fn set_features(&self, fid: u8, nsid: u32, cdw11: u32) -> Result<u32> {
        Ok(check(
            self.admin(Sqe::set_features(fid, nsid, cdw11), None)?.0,
            "Set Features",
        )?
        .dw0)
    }

    /// Resets the controller now (queue pairs recover on their next poll).
    pub fn reset(&self) -> Result<()> {
        let g = self.shared.generation.load(Ordering::Acquire);
        self.shared.reset(g & !1)
    }

    /// True once a reset has failed: the controller is unusable.
    pub fn is_failed(&self) -> bool {
        self.shared.failed.load(Ordering::Acquire)
    }

    /// True once the controller has failed (`is_failed`) without
    /// confirming it had stopped (a reset's CC.EN=0 was not answered by
    /// CSTS.RDY=0; PCIe): it may still transfer into the memory of the
    /// commands outstanding at the failure. Their owned buffers are not
    /// handed back (their completions, `IoError::ControllerFailed`, carry
    /// none; the platform unmaps the memory from the device's IOMMU, or
    /// keeps it until the device can no longer reach it). The memory of
    /// such commands submitted with borrowed slices (`read_dma`, ...) must
    /// not be read or written again; dropping its `DmaBuffer` is fine, for
    /// the same reason.
    pub fn may_still_transfer(&self) -> bool {
        self.shared.unstopped.load(Ordering::Acquire)
    }

    /// Number of completed resets.
    pub fn resets(&self) -> u32 {
        self.shared.generation.load(Ordering::Acquire) / 2
    }

    /// Current controller status register.
    pub fn csts(&self) -> Result<Csts> {
        self.shared.csts()
    }
}

impl<T: Transport> Drop for Shared<T> {
    /// Orderly shutdown: CC.SHN = normal, wait for CSTS.SHST = complete
    /// (bounded by CAP.TO), then disable.
    fn drop(&mut self) {
        let t = &self.transport;
        let r = t.regs();
        let Ok(csts) = r.read32(regs::off::CSTS).map(Csts) else {
            return;
        };
        if csts.is_dead() || !csts.rdy() {
            return;
        }
        let Ok(cc) = r.read32(regs::off::CC).map(Cc) else {
            return;
        };
        // SAFETY: the controller is being dropped: no queue pair is left
        // (each holds it), so only parked admin commands may be
        // outstanding, and their buffers stay parked unless the disable
        // below succeeds.
        if let Err(e) = unsafe { r.write32(regs::off::CC, cc.with_shn(regs::shn::NORMAL).0) } {
            tracing::warn!("orderly shutdown: {e}");
            return;
        }
        if let Err(e) = wait_csts(
            t,
            self.cap_timeout_ms(),
            "shutdown (CSTS.SHST=complete)",
            |c| c.shst() == regs::shst::COMPLETE,
        ) {
            tracing::warn!("orderly shutdown did not complete: {e}");
        }
        match Self::disable(t, self.cap) {
            // Disabled: nothing transfers into the buffers of admin
            // commands that timed out any more.
            Ok(()) => self.admin_mut().q.release_parked(),
            Err(e) => tracing::warn!("disable after shutdown failed: {e}"),
        }
    }
}
