//! Admin command set: dispatch ([`Controller::exec_admin`]), Asynchronous
//! Event Request and Keep Alive. Identify, Get Log Page and Get/Set
//! Features live in their own files.
//!
//! Every field of an admin SQE comes from the untrusted host: each path
//! below ends in a spec status, never a panic. What belongs to the
//! transport (queue creation and deletion, Abort of the commands it
//! holds, Doorbell Buffer Config, Fabrics commands) comes back as
//! [`AdminOutcome::NotMine`] after the checks common to every command.
use pollux_spec::status::{generic, specific};
use pollux_spec::{AdminOpcode, Sqe, Status};

use crate::ctrl::Controller;
use crate::subsystem::Personality;

pub(crate) mod features;
pub(crate) mod identify;
pub(crate) mod log;

/// Largest admin data transfer, even with MDTS 0 (unlimited).
pub const ADMIN_XFER_LIMIT: usize = 16 << 20;

/// What the transport knows that an admin command needs.
#[derive(Clone, Copy, Debug, Default)]
pub struct AdminEnv {
    /// Some I/O queue exists (Number of Queues may no longer change).
    pub io_queues_exist: bool,
}

/// What the controller does with the data of a command once the
/// transport has delivered it to the host (pass it to
/// [`Controller::data_sent`]; drop it if the transfer failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct AfterSend(After);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum After {
    Nothing,
    /// A log page was read with RAE clear: unmask its event type.
    LogRead(u8),
}

/// The result of an admin command.
#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Complete now with this DW0 and status.
    Complete { dw0: u32, status: Status },
    /// Transfer `data` to the host buffer of `xfer_len` bytes the command
    /// describes (`data.len() == xfer_len`: a log page shorter than the
    /// length asked for is zero-filled, as Linux's nvmet does), then
    /// complete with success, DW0 0, and hand `then` to
    /// [`Controller::data_sent`]. If the transfer fails, complete with
    /// the transfer's status instead.
    Data {
        data: Vec<u8>,
        xfer_len: usize,
        then: AfterSend,
    },
    /// No completion now: an Asynchronous Event Request, completed later
    /// through [`Controller::next_event`].
    Held,
    /// The transport's command: it executes it.
    NotMine,
}

pub(crate) type AdminResult = AdminOutcome;

#[inline]
pub(crate) fn ok(dw0: u32) -> AdminResult {
    AdminOutcome::Complete {
        dw0,
        status: Status::SUCCESS,
    }
}
#[inline]
pub(crate) fn gen(sc: u8) -> AdminResult {
    AdminOutcome::Complete {
        dw0: 0,
        status: Status::generic(sc),
    }
}
#[inline]
pub(crate) fn spec(sc: u8) -> AdminResult {
    AdminOutcome::Complete {
        dw0: 0,
        status: Status::specific(sc),
    }
}

impl Controller {
    /// Executes one admin command.
    ///
    /// PCIe: PSDT must be 0 (PRPs; SGLs are Invalid Field). Fabrics: the
    /// transport has checked the command's SGL, PSDT is not looked at.
    pub fn exec_admin(&mut self, sqe: &Sqe, env: AdminEnv) -> AdminOutcome {
        let fabrics = self.subsys.personality().is_fabrics();
        if sqe.fuse() != 0 || (!fabrics && sqe.psdt() != 0) {
            return gen(generic::INVALID_FIELD);
        }
        use AdminOpcode::*;
        match AdminOpcode::from_u8(sqe.opc) {
            Some(Identify) => self.identify(sqe),
            Some(GetLogPage) => {
                self.drain_io_errors();
                self.get_log_page(sqe)
            }
            Some(SetFeatures) => self.set_features(sqe, env),
            Some(GetFeatures) => self.get_features(sqe),
            Some(AsyncEventRequest) => self.async_event_request(sqe),
            Some(KeepAlive) if self.keep_alive_supported() => {
                self.keep_alives += 1;
                ok(0)
            }
            Some(CreateIoCq | CreateIoSq | DeleteIoSq | DeleteIoCq | Abort) => {
                AdminOutcome::NotMine
            }
            Some(DoorbellBufferConfig) if self.dbbc_supported() => AdminOutcome::NotMine,
            Some(FabricsCommand) if fabrics => AdminOutcome::NotMine,
            _ => gen(generic::INVALID_OPCODE),
        }
    }

    /// Applies what follows a successful data transfer.
    pub fn data_sent(&mut self, then: AfterSend) {
        match then.0 {
            After::Nothing => {}
            After::LogRead(lid) => self.aer.log_read(lid),
        }
    }

    fn keep_alive_supported(&self) -> bool {
        matches!(self.subsys.personality(), Personality::Fabrics(f) if f.kas != 0)
    }

    fn dbbc_supported(&self) -> bool {
        matches!(self.subsys.personality(), Personality::Pcie(p) if p.shadow_doorbells)
    }

    /// Data for the host: checks the transfer length against MDTS (and
    /// the admin limit) first, then zero-fills `data` to it.
    pub(crate) fn send(&self, mut data: Vec<u8>, xfer_len: usize, then: After) -> AdminResult {
        debug_assert!(data.len() <= xfer_len);
        if xfer_len > self.max_xfer.min(ADMIN_XFER_LIMIT) {
            return gen(generic::INVALID_FIELD);
        }
        data.resize(xfer_len, 0);
        AdminOutcome::Data {
            data,
            xfer_len,
            then: AfterSend(then),
        }
    }

    fn async_event_request(&mut self, sqe: &Sqe) -> AdminResult {
        if self.aer.outstanding.len() > self.subsys.limits().aer_limit as usize {
            return spec(specific::AER_LIMIT_EXCEEDED);
        }
        self.aer.outstanding.push_back(sqe.cid);
        AdminOutcome::Held
    }
}

pub(crate) use After as AfterKind;
