//! Every call into the controller model (`pollux-controller`) goes
//! through here, so its API changes stay in this file.
//!
//! The target adds nothing to the command set: Identify, log pages,
//! features, Keep Alive, asynchronous events, the CC/CSTS state machine
//! and NVM I/O are the model's. What a fabrics transport owns stays
//! outside: Connect, Property Get/Set framing, Disconnect, and the
//! Discovery Log Page (the target's configuration is what it lists).
//!
//! The model has no discovery personality yet; a discovery controller is
//! an I/O-personality controller without namespaces whose Identify
//! Controller data this adapter marks as a discovery controller
//! (CNTRLTYPE 2, no namespaces, no NVM command support).
use std::sync::Arc;

use pollux_bdev::{Bdev, RawSeg};
use pollux_controller::{
    AdminEnv, AdminOutcome, AfterSend, AnaPort, Controller, FabricsTraits, Identity, IoOp, IoQueue,
    IoQueueOptions, Limits, Namespace, NsIds, Personality, Subsystem,
};
use pollux_spec::cmd::{cns, RwFlags};
use pollux_spec::fabrics::PropertySize;
use pollux_spec::identify::{IdentifyController, CNTRLTYPE_DISCOVERY};
use pollux_spec::regs::{off, shst, Csts};
use pollux_spec::status::generic;
use pollux_spec::{AdminOpcode, Sqe, Status};
use zerocopy::IntoBytes;

pub(crate) use pollux_controller::IoCmd;

/// Errors building a subsystem.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(#[from] pollux_controller::ControllerError);

/// What the target configures of a subsystem's controllers.
#[derive(Clone, Debug)]
pub(crate) struct SubsysParams {
    pub nqn: String,
    pub serial: String,
    pub model: String,
    /// I/O queue entries at most (CAP.MQES + 1).
    pub queue_entries: u16,
    pub max_io_queues: u16,
    /// Largest transfer (a power of two times 4 KiB; MDTS).
    pub max_io_size: u32,
    /// In-capsule data of I/O queues (IOCCSZ).
    pub in_capsule_data: u32,
    /// Keep Alive granularity in 100 ms units (KAS).
    pub kas: u16,
    /// Asymmetric Namespace Access reporting.
    pub ana_reporting: bool,
    /// Reported multi-port, multi-controller, namespaces shared (ANA
    /// reporting, or a controller ID range of its own).
    pub multipath: bool,
}

/// A namespace as `nvmf_get_subsystems` and `save_config` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NsInfo {
    pub nsid: u32,
    pub bdev_name: String,
    /// Its UUID, when it has one of its own (SPDK lists it then).
    pub uuid: Option<String>,
    /// Its NGUID and EUI-64 when given (hexadecimal).
    pub nguid: Option<String>,
    pub eui64: Option<String>,
    /// Its ANA group.
    pub anagrpid: u32,
}

/// MDTS for a transfer size: `4 KiB << mdts >= size`, at most 16.
fn mdts_for(max_io_size: u32) -> u8 {
    let pages = (max_io_size.max(4096) / 4096).next_power_of_two();
    pages.trailing_zeros().min(16) as u8
}

/// A subsystem of the model: NVM (with namespaces on bdevs) or discovery.
pub(crate) struct Subsys {
    inner: Arc<Subsystem>,
    discovery: bool,
}

impl Clone for Subsys {
    fn clone(&self) -> Self {
        Subsys {
            inner: self.inner.clone(),
            discovery: self.discovery,
        }
    }
}

impl std::fmt::Debug for Subsys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subsys")
            .field("inner", &self.inner)
            .field("discovery", &self.discovery)
            .finish()
    }
}

impl Subsys {
    /// An NVM subsystem with `namespaces` at their NSIDs (any order, gaps
    /// allowed: as a live-made subsystem that save_config wrote).
    pub fn with_namespaces(
        p: &SubsysParams,
        namespaces: Vec<(u32, Bdev, NsIds, u32)>,
    ) -> Result<Subsys, ModelError> {
        let s = Subsys::new(p, Vec::new(), false)?;
        for (nsid, b, ids, anagrpid) in namespaces {
            let ns = Namespace::new(b, 0)?.with_ids(ids).with_anagrpid(anagrpid);
            s.inner.add_namespace(ns, Some(nsid))?;
        }
        Ok(s)
    }

    pub fn new(p: &SubsysParams, bdevs: Vec<Bdev>, discovery: bool) -> Result<Subsys, ModelError> {
        let namespaces = bdevs
            .into_iter()
            .map(|b| Namespace::new(b, 0))
            .collect::<Result<Vec<_>, _>>()?;
        let inner = Subsystem::new(
            Identity {
                serial: p.serial.clone(),
                model: p.model.clone(),
                firmware: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
                vid: 0,
                ssvid: 0,
                ieee: [0; 3],
                subnqn: p.nqn.clone(),
            },
            Limits {
                mqes: p.queue_entries.saturating_sub(1).max(1),
                max_io_queues: p.max_io_queues.max(1),
                mdts: mdts_for(p.max_io_size),
                abort_limit: 3,
                aer_limit: 3,
                cap_to: 15,
            },
            Personality::Fabrics(FabricsTraits {
                in_capsule_data: p.in_capsule_data,
                kas: p.kas,
            }),
            namespaces,
        )?;
        inner.set_ana_reporting(p.ana_reporting && !discovery);
        inner.set_multipath(p.multipath && !discovery);
        Ok(Subsys { inner, discovery })
    }

    /// ANA reporting is on.
    pub fn ana_reporting(&self) -> bool {
        self.inner.ana_reporting()
    }

    /// An ANA state of one of its ports changed: the I/O queues
    /// recompute which namespaces they refuse.
    pub fn ana_changed(&self) {
        self.inner.ana_changed();
    }

    pub fn nqn(&self) -> &str {
        &self.inner.identity().subnqn
    }

    /// Serial number (SN).
    pub fn serial(&self) -> &str {
        &self.inner.identity().serial
    }

    /// Model number (MN).
    pub fn model_number(&self) -> &str {
        &self.inner.identity().model
    }

    /// The namespaces as the listings and `save_config` show them, by
    /// NSID.
    pub fn namespaces(&self) -> Vec<NsInfo> {
        self.inner
            .namespaces()
            .into_iter()
            .map(|(nsid, n)| {
                let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
                let ids = n.ids();
                NsInfo {
                    nsid,
                    bdev_name: n.bdev().name().to_string(),
                    uuid: ids.uuid.map(|u| crate::config::uuid_string(&u)),
                    nguid: ids.nguid.map(|b| hex(&b)),
                    eui64: ids.eui64.map(|b| hex(&b)),
                    anagrpid: n.anagrpid(nsid),
                }
            })
            .collect()
    }

    /// CAP.MQES (0's based).
    pub fn mqes(&self) -> u16 {
        self.inner.limits().mqes
    }

    /// Adds `bdev` (all of it) as namespace `nsid` (None: the lowest free
    /// NSID) while controllers run; its NSID.
    pub fn add_namespace(
        &self,
        bdev: Bdev,
        nsid: Option<u32>,
        ids: NsIds,
        anagrpid: u32,
    ) -> Result<u32, NsError> {
        let ns = Namespace::new(bdev, 0)
            .map_err(NsError::from)?
            .with_ids(ids)
            .with_anagrpid(anagrpid);
        self.inner.add_namespace(ns, nsid).map_err(NsError::from)
    }

    /// Removes namespace `nsid` while controllers run; its bdev.
    pub fn remove_namespace(&self, nsid: u32) -> Result<Bdev, NsError> {
        self.inner
            .remove_namespace(nsid)
            .map(|n| n.bdev().clone())
            .map_err(NsError::from)
    }

    /// The active namespaces: (NSID, bdev).
    pub fn namespace_bdevs(&self) -> Vec<(u32, Bdev)> {
        self.inner
            .namespaces()
            .into_iter()
            .map(|(id, n)| (id, n.bdev().clone()))
            .collect()
    }
}

/// Why a namespace could not be added or removed.
#[derive(Debug)]
pub(crate) enum NsError {
    /// The NSID is taken.
    Taken(u32),
    /// No namespace of that NSID.
    Absent(u32),
    /// The NSID cannot be one: (NSID, why).
    Invalid(u32, &'static str),
    /// The bdev cannot be a namespace: (bdev, why).
    Bdev(String, String),
    /// Anything else the model refuses.
    Other(String),
}

impl From<pollux_controller::ControllerError> for NsError {
    fn from(e: pollux_controller::ControllerError) -> NsError {
        use pollux_controller::ControllerError as E;
        match e {
            E::NsidTaken { nsid } => NsError::Taken(nsid),
            E::NoNamespace { nsid } => NsError::Absent(nsid),
            E::Nsid { nsid, why } => NsError::Invalid(nsid, why),
            E::InvalidNamespace { bdev, why } => NsError::Bdev(bdev, why),
            e => NsError::Other(e.to_string()),
        }
    }
}

/// What an admin command comes to.
pub(crate) enum Admin {
    Complete {
        dw0: u32,
        status: Status,
    },
    /// Data for the host (then a success completion): `xfer_len` bytes,
    /// `data` then zeros.
    Data {
        data: Vec<u8>,
        xfer_len: usize,
        then: Option<AfterSend>,
    },
    /// An Asynchronous Event Request held for later.
    Held,
    /// Abort: never aborts anything (DW0 bit 0 set: not aborted).
    NotAborted,
    /// A command the fabrics transport does not support (queue creation,
    /// deletion): Invalid Opcode.
    Unsupported,
}

/// A CC change waiting for the controller's I/O queues to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    None,
    /// CC.EN 1 → 0: CSTS.RDY clears once no I/O queue is left.
    Reset,
    /// CC.SHN: once no I/O queue is left, every namespace is flushed
    /// (`flushing`: the flush is out), then CSTS.SHST is complete.
    Shutdown {
        flushing: bool,
    },
}

/// One controller (one host association).
///
/// A reset (CC.EN 1 → 0) or shutdown (CC.SHN) stops the controller's I/O
/// queues, as SPDK's target does: the transport closes their connections
/// (`Ctrl::property_set` says when), and the reset completes (CSTS 0) or
/// the shutdown flushes and completes (CSTS.SHST 10b, 01b meanwhile) only
/// once none is left, so a host that waits for CSTS as the spec says
/// finds them gone. Until then commands and I/O queue Connects are
/// refused (Command Sequence Error, as Linux's nvmet does while CC.EN is
/// 0). Neither waits on the thread: the transport reports how many I/O
/// queues are left at each Property Get of CSTS and Property Set, which
/// move the change on; the shutdown's flush is asynchronous (one queue
/// per controller, kept once made, polled there too). A shutdown
/// notified while one is under way or done is ignored until a reset.
pub(crate) struct Ctrl {
    inner: Controller,
    discovery: bool,
    pending: Pending,
    /// The queue shutdown flushes go through (made at the first; kept,
    /// since dropping it waits for a flush in flight).
    flushq: Option<IoQueue>,
    /// The tag of the latest shutdown's flush.
    flush_tag: u32,
}

impl std::fmt::Debug for Ctrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl Ctrl {
    pub fn new(s: &Subsys, cntlid: u16) -> Ctrl {
        Ctrl {
            inner: Controller::new(s.inner.clone(), cntlid),
            discovery: s.discovery,
            pending: Pending::None,
            flushq: None,
            flush_tag: 0,
        }
    }

    pub fn set_kato(&mut self, ms: u32) {
        self.inner.set_kato(ms);
    }

    /// Reports and enforces the ANA states of the listener the admin
    /// queue connected through.
    pub fn set_ana_port(&mut self, port: std::sync::Arc<AnaPort>) {
        self.inner.set_ana_port(port);
    }

    pub fn kato_ms(&self) -> u32 {
        self.inner.kato_ms()
    }

    /// Enabled and ready, and no reset or shutdown under way.
    pub fn is_running(&self) -> bool {
        self.inner.is_running() && self.pending == Pending::None
    }

    /// I/O queues granted (Number of Queues, the smaller of NSQ and NCQ).
    pub fn io_queues_granted(&self) -> u16 {
        let q = self.inner.queues_granted();
        q.nsq.min(q.ncq)
    }

    /// Property Get: CAP (8 bytes), VS, CC, CSTS (4 bytes). A read of
    /// CSTS first moves a reset or shutdown on (`io_queues`: this
    /// controller's I/O queues still connected).
    pub fn property_get(
        &mut self,
        ofst: u32,
        size: PropertySize,
        io_queues: usize,
    ) -> Result<u64, Status> {
        if ofst as usize == off::CSTS {
            self.advance(io_queues);
        }
        let r = self.inner.registers();
        let bad = Err(Status::generic(generic::INVALID_FIELD));
        match (ofst as usize, size) {
            (off::CAP, PropertySize::Eight) => Ok(r.cap().0),
            (off::VS, PropertySize::Four) => Ok(r.vs().0 as u64),
            (off::CC, PropertySize::Four) => Ok(r.cc() as u64),
            (off::CSTS, PropertySize::Four) => Ok(r.csts() as u64),
            _ => bad,
        }
    }

    /// Property Set: CC only (4 bytes). Runs the state machine's
    /// reactions: reset, enable (checks; RDY or CFS), shutdown (see
    /// [`Ctrl`]). `io_queues`: this controller's I/O queues connected.
    /// Ok(true): the transport must now close them.
    pub fn property_set(
        &mut self,
        ofst: u32,
        size: PropertySize,
        value: u64,
        io_queues: usize,
    ) -> Result<bool, Status> {
        if ofst as usize != off::CC || size != PropertySize::Four {
            return Err(Status::generic(generic::INVALID_FIELD));
        }
        let ch = self.inner.write_cc(value as u32);
        let mut stop = false;
        if ch.reset {
            // A shutdown under way is abandoned (its flush, if out, is
            // still polled back).
            self.pending = Pending::Reset;
            stop = true;
        }
        if ch.enable {
            if self.pending == Pending::Reset {
                // Enabled again before CSTS.RDY cleared: the reset is over.
                self.inner.reset();
                self.pending = Pending::None;
            }
            let r = self.inner.registers().check_enable().map(drop);
            self.inner.enable_done(r);
        }
        if let Some(shn) = ch.shutdown {
            let shst = Csts(self.inner.registers().csts()).shst();
            if self.pending == Pending::None && shst == shst::NORMAL {
                tracing::debug!(
                    cntlid = self.inner.cntlid(),
                    shn,
                    io_queues,
                    "shutdown notified"
                );
                self.inner.shutdown_started();
                self.pending = Pending::Shutdown { flushing: false };
                stop = true;
            } else {
                tracing::debug!(cntlid = self.inner.cntlid(), shn, pending = ?self.pending, shst, "shutdown notification ignored: one is under way or done, or a reset is");
            }
        }
        self.advance(io_queues);
        Ok(stop && io_queues > 0)
    }

    /// Moves a pending reset or shutdown on, `io_queues` of the
    /// controller's I/O queues being still connected; polls the shutdown
    /// flush queue.
    fn advance(&mut self, io_queues: usize) {
        match self.pending {
            Pending::Reset if io_queues == 0 => {
                self.inner.reset();
                self.pending = Pending::None;
            }
            Pending::Shutdown { flushing: false } if io_queues == 0 => self.start_flush(),
            _ => {}
        }
        let Some(q) = self.flushq.as_mut().filter(|q| q.outstanding() > 0) else {
            return;
        };
        let (tag, mut flushed) = (self.flush_tag, None);
        q.poll(&mut |t, st| {
            if t == tag {
                flushed = Some(st);
            }
        });
        if let (Some(st), Pending::Shutdown { flushing: true }) = (flushed, self.pending) {
            tracing::debug!(cntlid = self.inner.cntlid(), status = ?st, "shutdown flush done");
            self.inner.shutdown_complete();
            self.pending = Pending::None;
        }
    }

    /// Sends the shutdown's flush of every namespace (once an earlier
    /// one, from a shutdown a reset abandoned, is back).
    fn start_flush(&mut self) {
        if self.flushq.as_ref().is_some_and(|q| q.outstanding() > 0) {
            return;
        }
        let q = match &mut self.flushq {
            Some(q) => q,
            None => match IoQueue::for_controller(&self.inner, IoQueueOptions { depth: 1 }) {
                Ok(q) => self.flushq.insert(q),
                Err(e) => {
                    tracing::error!(error = %e, "flush at shutdown: no queue; shutdown completes unflushed");
                    self.inner.shutdown_complete();
                    self.pending = Pending::None;
                    return;
                }
            },
        };
        let cmd = IoCmd {
            op: IoOp::FlushAll,
            nsid: u32::MAX,
            slba: 0,
            nlb: 0,
            xfer_len: 0,
            flags: RwFlags::NONE,
            cid: u16::MAX,
        };
        self.flush_tag = (self.flush_tag + 1) & 0xFFFF;
        // SAFETY: the command has no data segment.
        match unsafe { q.submit(self.flush_tag, &cmd, &[]) } {
            Ok(()) => self.pending = Pending::Shutdown { flushing: true },
            Err(e) => {
                tracing::error!(error = %e, "flush at shutdown refused; shutdown completes unflushed");
                self.inner.shutdown_complete();
                self.pending = Pending::None;
            }
        }
    }

    /// Executes an admin command (not a Fabrics one, not Get Log Page of
    /// the discovery log: the caller owns those).
    pub fn exec_admin(&mut self, sqe: &Sqe, io_queues_exist: bool) -> Admin {
        if self.discovery {
            // Only what a discovery controller supports (NVMe 2.0 §3.1.3.3).
            use AdminOpcode::*;
            match AdminOpcode::from_u8(sqe.opc) {
                Some(Identify) if sqe.cdw10 as u8 == cns::CONTROLLER => {
                    let id = self.discovery_identify();
                    let data = id.as_bytes().to_vec();
                    return Admin::Data {
                        xfer_len: data.len(),
                        data,
                        then: None,
                    };
                }
                Some(GetLogPage | SetFeatures | GetFeatures | AsyncEventRequest | KeepAlive) => {}
                _ => {
                    return Admin::Complete {
                        dw0: 0,
                        status: Status::generic(generic::INVALID_OPCODE),
                    }
                }
            }
        }
        let env = AdminEnv { io_queues_exist };
        match self.inner.exec_admin(sqe, env) {
            AdminOutcome::Complete { dw0, status } => Admin::Complete { dw0, status },
            AdminOutcome::Data {
                data,
                xfer_len,
                then,
            } => Admin::Data {
                data,
                xfer_len,
                then: Some(then),
            },
            AdminOutcome::Held => Admin::Held,
            AdminOutcome::NotMine => {
                if sqe.opc == AdminOpcode::Abort as u8 {
                    Admin::NotAborted
                } else {
                    Admin::Unsupported
                }
            }
        }
    }

    /// The data of a command was handed to the socket.
    pub fn data_sent(&mut self, then: AfterSend) {
        self.inner.data_sent(then);
    }

    /// A held Asynchronous Event Request to complete now: (CID, DW0).
    /// Raises the Namespace Attribute Changed event if a namespace
    /// changed since the last call (and the host enabled it); then
    /// `next_event` gives what to complete.
    pub fn namespace_events(&mut self) {
        if !self.discovery {
            self.inner.namespace_events();
        }
    }

    pub fn next_event(&mut self) -> Option<(u16, u32)> {
        self.inner.next_event()
    }

    fn discovery_identify(&self) -> IdentifyController {
        let mut id = self.inner.identify_controller();
        id.cntrltype = CNTRLTYPE_DISCOVERY;
        id.nn = 0;
        id.oaes = 0;
        id.oncs = 0;
        id.vwc = 0;
        id.ioccsz = 0;
        id.iorcsz = 0;
        id.sqes = 0;
        id.cqes = 0;
        id.mdts = 0;
        id
    }

    /// A new I/O queue of this controller, `depth` commands deep, with
    /// QID `qid`. Call it on the thread that will use the queue (its bdev
    /// channels).
    ///
    /// Its failed commands reach the controller's Error Information log
    /// and SMART's media error count, with their SQID and CID.
    pub fn new_io_queue(&self, qid: u16, depth: u32) -> Result<IoQ, ModelError> {
        let mut q = IoQueue::for_controller(&self.inner, IoQueueOptions { depth })?;
        q.report_errors(qid);
        Ok(IoQ(q))
    }
}

/// One I/O queue's execution context.
pub(crate) struct IoQ(IoQueue);

impl IoQ {
    /// Checks a command (a refusal reaches the controller's Error
    /// Information log; the command keeps its CID for it).
    #[inline]
    pub fn check(&self, sqe: &Sqe) -> Result<IoCmd, Status> {
        self.0.check_reported(sqe)
    }

    /// Submits a checked command on its data (`seg`, none for commands
    /// without data); its status comes out of [`IoQ::poll`] with `tag`.
    ///
    /// # Safety
    /// The segment is valid (writable for a read) and untouched by
    /// anything else until `poll` delivered `tag` or the queue is dropped.
    #[inline]
    pub unsafe fn submit(&mut self, tag: u32, cmd: &IoCmd, seg: Option<RawSeg>) -> Result<(), ()> {
        let segs = match &seg {
            Some(s) => std::slice::from_ref(s),
            None => &[],
        };
        // SAFETY: forwarded contract.
        unsafe { self.0.submit(tag, cmd, segs) }.map_err(|e| {
            tracing::error!(error = %e, "I/O queue refused a command");
        })
    }

    /// Follows namespaces added or removed live (one relaxed load; see
    /// `IoQueue::sync_namespaces`). Once per connection pass, before its
    /// commands are received.
    #[inline(always)]
    pub fn sync_namespaces(&mut self) {
        self.0.sync_namespaces();
    }

    #[inline]
    pub fn outstanding(&self) -> u32 {
        self.0.outstanding()
    }

    #[inline]
    pub fn poll(&mut self, f: &mut impl FnMut(u32, Status)) -> usize {
        self.0.poll(f)
    }

    #[inline]
    pub fn publish(&self) {
        self.0.publish();
    }
}

pub(crate) fn io_to_host(cmd: &IoCmd) -> bool {
    cmd.to_host()
}

pub(crate) fn io_xfer_len(cmd: &IoCmd) -> usize {
    cmd.xfer_len
}
