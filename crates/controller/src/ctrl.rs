//! One controller: a PCIe device, or one fabrics host association. Used
//! from one thread at a time (the transport's admin queue).
//!
//! It holds the register state machine, the features, the Error
//! Information log, the asynchronous event state, the SMART counters that
//! are not I/O counts (media errors, error log entries) and the registry
//! the I/O queues publish their counts to.
use std::sync::Arc;
use std::time::Instant;

use pollux_spec::regs::{Cap, Csts, CAP_CSS_NVM};
use pollux_spec::status::sct;
use pollux_spec::Status;

use crate::aer::AerState;
use crate::ana::AnaPort;
use crate::errlog::ErrorLog;
use crate::features::Features;
use crate::notice::NsNotice;
use crate::regs::{CcChange, Registers};
use crate::stats::{IoStats, Registry, StatsHandle};
use crate::subsystem::{Personality, Subsystem};

/// Asynchronous Event Configuration bit 8: Namespace Attribute Notices.
const AEC_NS_ATTR: u32 = 1 << 8;
/// Asynchronous Event Configuration bit 11: ANA Change Notices.
const AEC_ANA_CHANGE: u32 = 1 << 11;

/// The controller state shared by the admin commands and the registers.
pub struct Controller {
    pub(crate) subsys: Arc<Subsystem>,
    pub(crate) cntlid: u16,
    pub(crate) regs: Registers,
    /// A shutdown was notified (processing stops until a reset).
    pub(crate) shut: bool,
    pub(crate) feat: Features,
    pub(crate) aer: AerState,
    /// Namespaces changed since the host last read the list.
    pub(crate) ns_notice: Arc<NsNotice>,
    pub(crate) errlog: ErrorLog,
    pub(crate) media_errors: u64,
    pub(crate) io_stats: Arc<Registry>,
    pub(crate) created: Instant,
    pub(crate) keep_alives: u64,
    /// Largest data transfer in bytes.
    pub(crate) max_xfer: usize,
    /// The port (listener) the admin queue connected through, whose ANA
    /// states this controller reports and enforces (None: every group
    /// optimized).
    pub(crate) ana_port: Option<Arc<AnaPort>>,
    /// The port's change count as last announced (ANA Change notice).
    pub(crate) ana_seen: u64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("cntlid", &self.cntlid)
            .field("cc", &self.regs.cc())
            .field("csts", &self.regs.csts())
            .finish()
    }
}

impl Controller {
    /// A disabled controller (CC = 0, CSTS = 0) with ID `cntlid`.
    pub fn new(subsys: Arc<Subsystem>, cntlid: u16) -> Controller {
        let l = *subsys.limits();
        let dstrd = match subsys.personality() {
            Personality::Pcie(p) => p.dstrd,
            Personality::Fabrics(_) => 0,
        };
        let cap = Cap::new(l.mqes, true, l.cap_to, dstrd, CAP_CSS_NVM, 0, 4);
        let feat = Features::defaults(&subsys);
        let io_stats = Arc::<Registry>::default();
        io_stats.set_write_cache(feat.wce);
        Controller {
            regs: Registers::new(cap),
            shut: false,
            feat,
            aer: AerState::default(),
            ns_notice: subsys.notices.register(),
            errlog: ErrorLog::default(),
            media_errors: 0,
            io_stats,
            created: Instant::now(),
            keep_alives: 0,
            max_xfer: l.max_transfer().unwrap_or(usize::MAX),
            ana_port: None,
            ana_seen: 0,
            cntlid,
            subsys,
        }
    }

    /// Reports and enforces the ANA states of `port` (the listener the
    /// admin queue connected through); before any I/O queue is made.
    pub fn set_ana_port(&mut self, port: Arc<AnaPort>) {
        self.ana_seen = port.change_count();
        self.ana_port = Some(port);
    }

    /// The port whose ANA states this controller reports.
    pub fn ana_port(&self) -> Option<&Arc<AnaPort>> {
        self.ana_port.as_ref()
    }

    pub fn subsystem(&self) -> &Arc<Subsystem> {
        &self.subsys
    }

    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }

    /// Largest data transfer in bytes (MDTS; `usize::MAX` if unlimited).
    pub fn max_transfer(&self) -> usize {
        self.max_xfer
    }

    // ------------------------------------------------------------------
    // Registers
    // ------------------------------------------------------------------

    pub fn registers(&self) -> &Registers {
        &self.regs
    }

    /// Records a CC write; the caller then reacts to the returned change:
    /// `reset` → [`Controller::reset`] (after dropping its queues),
    /// `enable` → [`Registers::check_enable`], the transport's set-up, then
    /// [`Controller::enable_done`], `shutdown` → flush, then
    /// [`Controller::shutdown_complete`] (a transport whose queues stop or
    /// flushes finish later first calls [`Controller::shutdown_started`]).
    pub fn write_cc(&mut self, cc: u32) -> CcChange {
        self.regs.write_cc(cc)
    }

    /// CC.EN 0 → 1, once the transport has run the neutral checks
    /// (`registers().check_enable()`, which gives the memory page size)
    /// and its own set-up (PCIe: the admin queue): RDY if `r` is Ok, else
    /// CFS (logged with why).
    pub fn enable_done(&mut self, r: Result<(), String>) {
        match r {
            Ok(()) => {
                self.shut = false;
                self.regs.set_ready();
            }
            Err(why) => {
                tracing::error!(
                    why,
                    cc = self.regs.cc(),
                    "invalid controller configuration at enable"
                );
                self.regs.set_fatal();
            }
        }
    }

    /// CC.EN 1 → 0: features back to their defaults (the volatile write
    /// cache enabled again), asynchronous events forgotten, CSTS 0.
    /// (Lifetime counters and logs survive.)
    pub fn reset(&mut self) {
        self.aer.reset();
        self.feat = Features::defaults(&self.subsys);
        self.io_stats.set_write_cache(self.feat.wce);
        self.shut = false;
        self.regs.set_csts(0);
    }

    /// Volatile Write Cache Enable (Set Features, reset): the feature's
    /// value, and what the I/O queues make of writes (WCE = 0: each is
    /// Force Unit Access, so it completes only once durable).
    pub(crate) fn set_write_cache(&mut self, wce: bool) {
        self.feat.wce = wce;
        self.io_stats.set_write_cache(wce);
    }

    /// A shutdown notified by CC.SHN begins, for a transport that
    /// completes it later ([`Controller::shutdown_complete`]): CSTS.SHST
    /// "occurring", processing stops until a reset.
    pub fn shutdown_started(&mut self) {
        self.shut = true;
        self.regs.set_shutdown_occurring();
    }

    /// The shutdown notified by CC.SHN is done (the caller flushed):
    /// CSTS.SHST complete, processing stops until a reset.
    pub fn shutdown_complete(&mut self) {
        self.shut = true;
        self.regs.set_shutdown_complete();
    }

    /// CSTS.CFS: processing stops until a reset.
    pub fn fatal(&mut self, why: &str) {
        tracing::error!(why, "controller fatal status");
        self.regs.set_fatal();
    }

    /// RDY, not fatal, not shut down: commands are processed.
    pub fn is_running(&self) -> bool {
        let c = Csts(self.regs.csts());
        c.rdy() && !c.cfs() && !self.shut
    }

    // ------------------------------------------------------------------
    // State the transport reads
    // ------------------------------------------------------------------

    /// Interrupt Coalescing (THR, TIME) and per-vector coalescing disable
    /// (Interrupt Vector Configuration CD), PCIe only.
    pub fn coalescing(&self) -> (pollux_spec::features::InterruptCoalescing, &[bool]) {
        (self.feat.coalescing, &self.feat.no_coalesce)
    }

    /// Granted I/O queues (Number of Queues; 1's based counts).
    pub fn queues_granted(&self) -> pollux_spec::features::NumberOfQueues {
        self.feat.queues
    }

    /// Keep Alive Timeout in ms (0: none): set by Set Features KATO or
    /// by the transport at connection ([`Controller::set_kato`]).
    pub fn kato_ms(&self) -> u32 {
        self.feat.kato
    }

    /// The KATO a fabrics Connect command carried.
    pub fn set_kato(&mut self, ms: u32) {
        self.feat.kato = ms;
    }

    /// Keep Alive commands received so far (the transport owns the timer:
    /// it notes when this changes).
    pub fn keep_alives(&self) -> u64 {
        self.keep_alives
    }

    // ------------------------------------------------------------------
    // Errors and events
    // ------------------------------------------------------------------

    /// Accounts a failed command: the Error Information log and, for a
    /// media error, SMART's count. `lba` 0 when not applicable.
    #[cold]
    pub fn note_error(&mut self, sqid: u16, cid: u16, status: Status, nsid: u32, lba: u64) {
        if status.sct() == sct::MEDIA {
            self.media_errors += 1;
        }
        self.errlog.record(sqid, cid, status, nsid, lba);
    }

    /// Moves the failed commands the I/O queues reported (see `stats`)
    /// into the Error Information log and SMART's media error count, in
    /// the order they happened. Get Log Page of either log does it first.
    pub fn drain_io_errors(&mut self) {
        let p = self.io_stats.take_errors();
        self.errlog.skip(p.older);
        self.media_errors += p.older_media;
        for e in p.recent {
            self.note_error(e.sqid, e.cid, e.status, e.nsid, e.lba);
        }
    }

    /// Records an error tied to no command and raises an asynchronous
    /// error event of `info` (e.g. an invalid doorbell write).
    pub fn error_event(&mut self, info: u8) {
        use pollux_spec::features::aer;
        use pollux_spec::log::{lid, ERROR_LOG_NOT_SPECIFIC};
        self.errlog.record(
            ERROR_LOG_NOT_SPECIFIC,
            ERROR_LOG_NOT_SPECIFIC,
            Status::SUCCESS,
            0,
            0,
        );
        self.aer.raise(aer::ERROR, info, lid::ERROR);
    }

    /// Raises an asynchronous event (masked per type until its log page
    /// is read with RAE clear).
    pub fn raise_event(&mut self, event_type: u8, info: u8, log_page: u8) {
        self.aer.raise(event_type, info, log_page);
    }

    /// Raises the Namespace Attribute Changed notice (log page 04h) if a
    /// namespace of the subsystem changed since the last call and the
    /// host enabled it (Asynchronous Event Configuration bit 8), and the
    /// ANA Change notice (log page 0Ch) if the ANA states of its port
    /// changed since the last call (with ANA reporting on and AEC bit
    /// 11 set); the transport calls it on the controller's thread when
    /// told of a change, then completes what [`Controller::next_event`]
    /// gives.
    pub fn namespace_events(&mut self) {
        use pollux_spec::features::aer;
        use pollux_spec::log::lid;
        if self.ns_notice.take_pending() && self.feat.aec & AEC_NS_ATTR != 0 {
            self.aer.raise(
                aer::NOTICE,
                aer::NOTICE_NS_ATTR_CHANGED,
                lid::CHANGED_NS_LIST,
            );
        }
        let Some(port) = &self.ana_port else {
            return;
        };
        let now = port.change_count();
        if now != self.ana_seen {
            self.ana_seen = now;
            if self.subsys.ana_reporting() && self.feat.aec & AEC_ANA_CHANGE != 0 {
                tracing::info!(cntlid = self.cntlid, chgcnt = now, "ANA change notice");
                self.aer
                    .raise(aer::NOTICE, aer::NOTICE_ANA_CHANGE, lid::ANA);
            }
        }
    }

    /// The next held Asynchronous Event Request to complete: (its CID,
    /// completion DW0), when a request and an event are both waiting.
    pub fn next_event(&mut self) -> Option<(u16, u32)> {
        self.aer.next()
    }

    /// Removes the held Asynchronous Event Request `cid` (for Abort);
    /// true if there was one. The transport completes it with Abort
    /// Requested.
    pub fn abort_aer(&mut self, cid: u16) -> bool {
        match self.aer.outstanding.iter().position(|&c| c == cid) {
            Some(pos) => {
                self.aer.outstanding.remove(pos);
                true
            }
            None => false,
        }
    }

    /// Identify ACL (0's based): most Abort commands outstanding at once.
    pub fn abort_limit(&self) -> u8 {
        self.subsys.limits().abort_limit
    }

    // ------------------------------------------------------------------
    // I/O statistics
    // ------------------------------------------------------------------

    /// A handle for a new I/O queue to count through (see `stats`).
    pub fn io_stats_handle(&self) -> StatsHandle {
        StatsHandle {
            published: self.io_stats.register(),
            registry: self.io_stats.clone(),
        }
    }

    /// The I/O counts of every queue as last published.
    pub fn io_stats(&self) -> IoStats {
        self.io_stats.total()
    }
}
