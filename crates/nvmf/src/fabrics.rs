//! Fabrics commands: Connect (admin and I/O queues, host allow lists,
//! SQSIZE/QID checks, dynamic controller IDs), Property Get/Set and
//! Disconnect.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{
    fabrics_sc, fabrics_status, read_nqn, ConnectCmd, ConnectData, ConnectResponse, ConnectStatus,
    DisconnectCmd, FcType, ParamIn, PropertyGetCmd, PropertySetCmd, Sgl, AUTHREQ_ATR,
    CATTR_DISABLE_SQ_FLOW, CNTLID_DYNAMIC, CONNECT_DATA_LEN,
};
use pollux_spec::status::generic;
use pollux_spec::{Sqe, Status};
use zerocopy::FromBytes;

use crate::auth::state::QueueAuth;
use crate::model::Ctrl;
use crate::qpair::{gen, Bound, Qpair, QueueTransport, DISCOVERY_KATO_MS};
use crate::shared::{listener_of, lock, ConnRef, CtrlEntry, SubsysId};

/// A refused Connect: its status, DW0 and why (for the target's log).
type Refusal = (Status, u32, String);

/// The NQNs of the Connect data in `scratch`, for the log of a refused
/// Connect (as far as they can be read).
fn connect_names(scratch: &[u8]) -> (String, String) {
    let Some(d) = scratch
        .get(..CONNECT_DATA_LEN as usize)
        .and_then(|b| ConnectData::read_from_bytes(b).ok())
    else {
        return ("?".into(), "?".into());
    };
    let name = |f: &[u8]| match read_nqn(f) {
        Ok(n) => n.to_string(),
        Err(e) => format!("? ({e})"),
    };
    (name(&d.subnqn), name(&d.hostnqn))
}

impl Qpair {
    /// A command on a queue not yet connected: only Connect.
    /// (`ok`: the Connect data's digest matched, or there was none; the
    /// data is in `scratch`.)
    pub(crate) fn unbound_command<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        sqe: &Sqe,
        ok: bool,
    ) {
        if FcType::of(sqe) != Some(FcType::Connect) {
            return self.answer(x, sqe.cid, gen(generic::COMMAND_SEQUENCE_ERROR), 0);
        }
        if !ok {
            let (subnqn, hostnqn) = connect_names(&self.scratch);
            tracing::warn!(peer = %self.peer, subnqn, hostnqn, "Connect refused: its data's digest does not match");
            return self.answer(x, sqe.cid, gen(generic::TRANSIENT_TRANSPORT_ERROR), 0);
        }
        match self.connect::<X>(ctx, sqe) {
            Ok(cntlid) => {
                // AUTHREQ.ATR: the host authenticates before anything else.
                let authreq = if self.auth.is_some() { AUTHREQ_ATR } else { 0 };
                let dw0 = ConnectResponse::Success { cntlid, authreq }.dw0();
                self.advance_sqhd();
                self.answer(x, sqe.cid, Status::SUCCESS, dw0);
            }
            Err((status, dw0, why)) => {
                // Every refusal at WARN (the default level): the peer,
                // the NQNs, the reason and the status sent.
                let (subnqn, hostnqn) = connect_names(&self.scratch);
                let qid = ConnectCmd::from_sqe(sqe).qid;
                tracing::warn!(
                    peer = %self.peer,
                    local = %self.local,
                    qid,
                    subnqn,
                    hostnqn,
                    "Connect refused: {why} [{}]",
                    ConnectStatus { status, dw0 }
                );
                self.answer(x, sqe.cid, status, dw0)
            }
        }
    }

    /// Connect: binds the queue to a new controller (admin queue) or to
    /// the host's controller (I/O queue), with its slots.
    fn connect<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        sqe: &Sqe,
    ) -> Result<u16, Refusal> {
        let cmd = ConnectCmd::from_sqe(sqe);
        let invalid = |iattr, ipo, why: String| {
            (
                fabrics_status(fabrics_sc::CONNECT_INVALID_PARAMETERS),
                ConnectResponse::InvalidParam { iattr, ipo }.dw0(),
                why,
            )
        };
        let refuse = |status, why: String| (status, 0, why);
        let sgl_why =
            || "the Connect data is not 1024 bytes in the capsule at offset 0".to_string();
        use pollux_spec::fabrics::connect_ipo as ipo;
        match Sgl::from_sqe(sqe) {
            Ok(Sgl::InCapsule { offset: 0, len }) if len == CONNECT_DATA_LEN => {}
            Ok(Sgl::InCapsule { offset: 0, .. }) => {
                return Err(refuse(gen(generic::DATA_SGL_LENGTH_INVALID), sgl_why()))
            }
            Ok(Sgl::InCapsule { .. }) => {
                return Err(refuse(gen(generic::SGL_OFFSET_INVALID), sgl_why()))
            }
            Ok(_) => return Err(refuse(gen(generic::SGL_TYPE_INVALID), sgl_why())),
            Err(e) => return Err(refuse(e.status(), format!("its SGL: {e}"))),
        }
        if self.scratch.len() < CONNECT_DATA_LEN as usize {
            return Err(refuse(gen(generic::DATA_SGL_LENGTH_INVALID), sgl_why()));
        }
        if cmd.recfmt != 0 {
            return Err(refuse(
                fabrics_status(fabrics_sc::INCOMPATIBLE_FORMAT),
                format!("record format {} (only 0 is known)", cmd.recfmt),
            ));
        }
        let Ok(data) = ConnectData::read_from_bytes(&self.scratch[..CONNECT_DATA_LEN as usize])
        else {
            return Err(refuse(gen(generic::DATA_SGL_LENGTH_INVALID), sgl_why()));
        };
        let subnqn = match data.subnqn() {
            Ok(s) => s,
            Err(e) => {
                return Err(invalid(
                    ParamIn::Data,
                    ipo::DATA_SUBNQN,
                    format!("invalid subsystem NQN: {e}"),
                ))
            }
        };
        // An empty HOSTNQN (SPDK's host sends one unless told a host NQN)
        // is a host without a name: accepted where any host may connect,
        // as SPDK's nvmf_tgt and Linux's nvmet do, refused by allow lists.
        let hostnqn = match data.hostnqn() {
            Ok(h) => h,
            Err(pollux_spec::fabrics::NqnError::Empty) => "",
            Err(e) => {
                return Err(invalid(
                    ParamIn::Data,
                    ipo::DATA_HOSTNQN,
                    format!("invalid host NQN: {e}"),
                ))
            }
        };
        let shared = self.shared.clone();
        // Held until the controller table has the queue, so a live change
        // (`live`) either comes before and is seen here, or after and
        // finds the queue to close.
        let subs = shared.subsystems();
        let Some((sid, entry)) = shared.find(&subs, subnqn) else {
            return Err(invalid(
                ParamIn::Data,
                ipo::DATA_SUBNQN,
                "unknown subsystem (this target serves no such NQN)".into(),
            ));
        };
        // The listener the connection came through (a wildcard one
        // takes any address on its port).
        let listener = match &entry {
            Some(e) => listener_of(&e.listeners, self.local),
            None => Some(listener_of(&shared.listeners(), self.local).unwrap_or(self.local)),
        };
        if entry.is_some() && listener.is_none() {
            return Err(invalid(
                ParamIn::Data,
                ipo::DATA_SUBNQN,
                format!("the subsystem does not listen on {}", self.local),
            ));
        }
        if let Some(e) = &entry {
            // (DW0 reserved for Connect Invalid Host: 0.)
            if hostnqn.is_empty() && !e.allow_any_host {
                return Err(refuse(
                    fabrics_status(fabrics_sc::CONNECT_INVALID_HOST),
                    "empty host NQN: the subsystem allows only listed hosts".into(),
                ));
            }
            if !e.allows(hostnqn) {
                return Err(refuse(
                    fabrics_status(fabrics_sc::CONNECT_INVALID_HOST),
                    "host not allowed by the subsystem".into(),
                ));
            }
        }
        // DH-HMAC-CHAP: a host with a key authenticates on every queue.
        let mut auth = entry
            .as_ref()
            .and_then(|e| e.host_keys.iter().find(|k| k.host == hostnqn))
            .map(|k| Box::new(QueueAuth::new(k, shared.auth, subnqn, self.now)));
        let model = match &entry {
            Some(e) => &e.model,
            None => &shared.discovery,
        };
        if cmd.sqsize == 0 {
            return Err(invalid(ParamIn::Command, ipo::SQSIZE, "SQSIZE 0".into()));
        }
        // A queue of an NVM subsystem takes a place among the data hosts'
        // connections (discovery and handshakes have their own budget).
        let data_slot = match sid {
            SubsysId::Discovery => None,
            SubsysId::Nvm(_) => {
                let max = shared.opts.max_connections;
                match crate::shared::DataSlot::take(&shared.data_conns, max) {
                    Some(d) => Some(d),
                    None => {
                        return Err(refuse(
                            fabrics_status(fabrics_sc::CONTROLLER_BUSY),
                            format!(
                                "max_connections ({max}) queues of NVM subsystems are connected"
                            ),
                        ));
                    }
                }
            }
        };
        let entries = cmd.queue_entries();
        let me = ConnRef {
            thread: self.thread,
            conn: self.id,
            close: X::close_queue,
            listener: listener.unwrap_or(self.local),
            peer: self.peer,
            events: X::queue_events,
        };
        let cntlid;
        if cmd.qid == 0 {
            if entries > shared.opts.max_aq_depth as u32 {
                return Err(invalid(
                    ParamIn::Command,
                    ipo::SQSIZE,
                    format!(
                        "admin queue of {entries} entries, more than max_aq_depth {}",
                        shared.opts.max_aq_depth
                    ),
                ));
            }
            if data.cntlid != CNTLID_DYNAMIC {
                return Err(invalid(
                    ParamIn::Data,
                    ipo::DATA_CNTLID,
                    format!(
                        "admin queue asks controller ID {:#06x}: only 0xffff (dynamic controllers)",
                        data.cntlid
                    ),
                ));
            }
            let host = hostnqn.to_string();
            let mut slot_ctrl = None;
            let kato = if sid == SubsysId::Discovery && cmd.kato == 0 {
                DISCOVERY_KATO_MS
            } else {
                cmd.kato
            };
            let cntlids = entry.as_ref().map_or(
                (crate::config::CNTLID_MIN, crate::config::CNTLID_MAX),
                |e| e.cntlids,
            );
            let ana_port = entry
                .as_ref()
                .and_then(|e| e.ana_port(listener.unwrap_or(self.local)).cloned());
            let id = shared.table().insert(cntlids, |id| {
                let mut c = Ctrl::new(model, id);
                c.set_kato(kato);
                if let Some(p) = ana_port {
                    c.set_ana_port(p);
                }
                let c = Arc::new(Mutex::new(c));
                slot_ctrl = Some(c.clone());
                CtrlEntry {
                    subsys: sid,
                    hostnqn: host,
                    hostid: data.hostid,
                    ctrl: c,
                    admin: me,
                    io: Vec::new(),
                }
            });
            let (Some(id), Some(ctrl)) = (id, slot_ctrl) else {
                return Err(refuse(
                    fabrics_status(fabrics_sc::CONTROLLER_BUSY),
                    format!(
                        "no controller ID left in the subsystem's range {}-{}",
                        cntlids.0, cntlids.1
                    ),
                ));
            };
            cntlid = id;
            self.kato = Duration::from_millis(kato as u64);
            self.last_admin = self.now;
            self.icd_max = shared.opts.admin_in_capsule_data_size;
            self.bound = Bound::Admin {
                cntlid,
                ctrl,
                subsys: sid,
            };
            tracing::info!(peer = %self.peer, subnqn, hostnqn, cntlid, kato_ms = kato, "admin queue connected");
        } else {
            if sid == SubsysId::Discovery {
                return Err(refuse(
                    fabrics_status(fabrics_sc::INVALID_QUEUE_TYPE),
                    "an I/O queue for the discovery subsystem".into(),
                ));
            }
            let mut t = shared.table();
            let Some(e) = t
                .map
                .get_mut(&data.cntlid)
                .filter(|e| e.subsys == sid && e.hostnqn == hostnqn)
            else {
                return Err(invalid(
                    ParamIn::Data,
                    ipo::DATA_CNTLID,
                    format!(
                        "I/O queue for controller {}, which this host does not have (any more)",
                        data.cntlid
                    ),
                ));
            };
            let ctrl = lock(&e.ctrl);
            if !ctrl.is_running() {
                return Err(refuse(
                    gen(generic::COMMAND_SEQUENCE_ERROR),
                    format!("I/O queue before controller {} is enabled", data.cntlid),
                ));
            }
            let granted = ctrl.io_queues_granted();
            if cmd.qid > granted || e.io.iter().any(|(q, _)| *q == cmd.qid) {
                return Err(invalid(
                    ParamIn::Command,
                    ipo::QID,
                    format!(
                        "queue ID {} beyond the {granted} I/O queues granted, or already connected",
                        cmd.qid
                    ),
                ));
            }
            let max = model.mqes() as u32 + 1;
            if entries > max {
                return Err(invalid(
                    ParamIn::Command,
                    ipo::SQSIZE,
                    format!("I/O queue of {entries} entries, more than {max}"),
                ));
            }
            let q = match ctrl.new_io_queue(cmd.qid, entries) {
                Ok(q) => q,
                Err(err) => {
                    tracing::error!(error = %err, "I/O queue not created");
                    return Err(refuse(
                        gen(generic::INTERNAL_ERROR),
                        format!("I/O queue not created: {err}"),
                    ));
                }
            };
            drop(ctrl);
            e.io.push((cmd.qid, me));
            cntlid = data.cntlid;
            // Not authenticated yet: the I/O queue waits aside.
            match auth.as_mut() {
                Some(a) => a.parked_io = Some(q),
                None => self.io = Some(q),
            }
            self.icd_max = shared.opts.in_capsule_data_size;
            self.bound = Bound::Io {
                cntlid,
                qid: cmd.qid,
            };
            tracing::debug!(peer = %self.peer, cntlid, qid = cmd.qid, entries, "I/O queue connected");
        }
        drop(subs);
        let _ = ctx;
        if let Some(d) = data_slot {
            d.keep();
            self.data_slot = true;
        }
        self.qid = cmd.qid;
        self.entries = entries as u16;
        self.flow_off = cmd.cattr & CATTR_DISABLE_SQ_FLOW != 0;
        self.make_slots(entries);
        self.sqhd = 0;
        self.auth = auth;
        Ok(cntlid)
    }

    /// A Fabrics command on a connected queue: Property Get/Set,
    /// Disconnect, Authentication Send/Receive (`icd`: bytes of
    /// in-capsule data).
    pub(crate) fn fabrics<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        sqe: &Sqe,
        icd: u32,
    ) {
        match FcType::of(sqe) {
            Some(FcType::AuthenticationSend) => {
                return self.auth_command(ctx, x, i, sqe, icd, true)
            }
            Some(FcType::AuthenticationReceive) => {
                return self.auth_command(ctx, x, i, sqe, icd, false)
            }
            _ if self.auth_gated() => {
                let st = fabrics_status(fabrics_sc::AUTHENTICATION_REQUIRED);
                return self.finish(x, i, st, 0, 0);
            }
            _ => {}
        }
        let Bound::Admin { ctrl, .. } = &self.bound else {
            // Only Connect goes on an I/O queue, and only once.
            let st = match FcType::of(sqe) {
                Some(FcType::Disconnect) => {
                    let _ = DisconnectCmd::from_sqe(sqe);
                    self.finish(x, i, Status::SUCCESS, 0, 0);
                    return x.close(ctx, self, "Disconnect");
                }
                Some(FcType::Connect) => gen(generic::COMMAND_SEQUENCE_ERROR),
                _ => gen(generic::INVALID_OPCODE),
            };
            return self.finish(x, i, st, 0, 0);
        };
        let ctrl = ctrl.clone();
        self.last_admin = self.now;
        // The controller's I/O queues still connected (a reset or shutdown
        // waits for them to close).
        let io_queues = |c: &Self| match c.bound {
            Bound::Admin { cntlid, .. } => {
                c.shared.table().map.get(&cntlid).map_or(0, |e| e.io.len())
            }
            _ => 0,
        };
        match FcType::of(sqe) {
            Some(FcType::PropertyGet) => {
                let c = PropertyGetCmd::from_sqe(sqe);
                let r = match c.size() {
                    Some(sz) => {
                        let n = io_queues(self);
                        lock(&ctrl).property_get(c.ofst, sz, n)
                    }
                    None => Err(gen(generic::INVALID_FIELD)),
                };
                match r {
                    Ok(v) => self.finish(x, i, Status::SUCCESS, v as u32, (v >> 32) as u32),
                    Err(st) => self.finish(x, i, st, 0, 0),
                }
            }
            Some(FcType::PropertySet) => {
                let c = PropertySetCmd::from_sqe(sqe);
                let r = match c.size() {
                    Some(sz) => {
                        let n = io_queues(self);
                        lock(&ctrl).property_set(c.ofst, sz, c.value, n)
                    }
                    None => Err(gen(generic::INVALID_FIELD)),
                };
                if let (Ok(true), Bound::Admin { cntlid, .. }) = (r, &self.bound) {
                    self.shared.stop_io_queues(ctx, *cntlid);
                }
                self.finish(x, i, r.err().unwrap_or(Status::SUCCESS), 0, 0);
            }
            Some(FcType::Disconnect) => {
                self.finish(x, i, Status::SUCCESS, 0, 0);
                x.close(ctx, self, "Disconnect");
            }
            Some(FcType::Connect) => self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0),
            _ => self.finish(x, i, gen(generic::INVALID_OPCODE), 0, 0),
        }
    }
}
