//! Admin commands on an admin queue: the controller model's, and the
//! Discovery Log Page of a discovery controller.
use std::sync::Mutex;

use pollux_runtime::ThreadCtx;
use pollux_spec::fabrics::{Sgl, LID_DISCOVERY};
use pollux_spec::status::generic;
use pollux_spec::{AdminOpcode, Sqe, Status};

use crate::model::{Admin, Ctrl};
use crate::qpair::{gen, Bound, Qpair, QueueTransport, St};
use crate::shared::{lock, SubsysId};

impl Qpair {
    pub(crate) fn admin<X: QueueTransport>(
        &mut self,
        ctx: &mut ThreadCtx,
        x: &mut X,
        i: u16,
        sqe: &Sqe,
        icd: u32,
    ) {
        let Bound::Admin { ctrl, subsys, .. } = &self.bound else {
            return;
        };
        let (ctrl, subsys) = (ctrl.clone(), *subsys);
        if self.auth_gated() {
            let st = self.refusal_before_auth();
            return self.finish(x, i, st, 0, 0);
        }
        self.last_admin = self.now;
        // Data direction from the opcode's low bits (01b: to the
        // controller, 10b: to the host).
        let dir = sqe.opc & 3;
        if dir == 1 {
            // No admin command of the model takes data from the host; the
            // capsule's data (if any) is ignored, data that would need an
            // R2T is refused.
            if let Ok(Sgl::Transport { len }) = Sgl::from_sqe(sqe) {
                if len > 0 {
                    return self.finish(x, i, gen(generic::INVALID_FIELD), 0, 0);
                }
            }
            let _ = icd;
        }
        // The table before the controller (the order Connect takes them).
        let (io_exist, hostnqn) = {
            let Bound::Admin { cntlid, .. } = &self.bound else {
                return;
            };
            let t = self.shared.table();
            let e = t.map.get(cntlid);
            (
                e.is_some_and(|e| !e.io.is_empty()),
                e.map(|e| e.hostnqn.clone()).unwrap_or_default(),
            )
        };
        let mut c = lock(&ctrl);
        if !c.is_running() {
            drop(c);
            return self.finish(x, i, gen(generic::COMMAND_SEQUENCE_ERROR), 0, 0);
        }
        let outcome =
            if sqe.opc == AdminOpcode::GetLogPage as u8 && sqe.cdw10 as u8 == LID_DISCOVERY {
                if subsys == SubsysId::Discovery {
                    crate::discovery::log_page(&self.shared, &hostnqn, sqe)
                } else {
                    Admin::Complete {
                        dw0: 0,
                        status: Status::specific(pollux_spec::status::specific::INVALID_LOG_PAGE),
                    }
                }
            } else {
                c.exec_admin(sqe, io_exist)
            };
        match outcome {
            Admin::Complete { dw0, status } => {
                // Set Features may have changed the Keep Alive Timeout.
                self.kato = self.kato_for(c.kato_ms());
                drop(c);
                self.finish(x, i, status, dw0, 0);
            }
            Admin::Data {
                data,
                xfer_len,
                then,
            } => {
                // The whole length the command asks for: what the log
                // (or structure) has, then zeros. Sending less made a
                // host see a short transfer (pollux's failed the command).
                let len = xfer_len as u32;
                let sgl = match Self::data_sgl(sqe, len, true, 0) {
                    Ok(s) => s,
                    Err(st) => {
                        drop(c);
                        return self.finish(x, i, st, 0, 0);
                    }
                };
                let _ = sgl;
                if let Some(t) = then {
                    c.data_sent(t);
                }
                drop(c);
                if len == 0 {
                    return self.finish(x, i, Status::SUCCESS, 0, 0);
                }
                if !self.slot_buf(i, xfer_len, false) {
                    return self.finish(x, i, gen(generic::INTERNAL_ERROR), 0, 0);
                }
                if let Some(b) = self.slots[i as usize].buf.as_mut() {
                    let n = data.len().min(xfer_len);
                    let (head, tail) = b.as_mut_slice().split_at_mut(n);
                    head.copy_from_slice(&data[..n]);
                    tail.fill(0);
                }
                x.send_data(self, i, len);
            }
            Admin::Held => {
                drop(c);
                self.slots[i as usize].st = St::Held;
            }
            Admin::NotAborted => {
                drop(c);
                self.finish(x, i, Status::SUCCESS, 1, 0);
            }
            Admin::Unsupported => {
                drop(c);
                self.finish(x, i, gen(generic::INVALID_OPCODE), 0, 0);
            }
        }
        // Events the command may have released (e.g. a log page read).
        self.complete_events(x, &ctrl);
        let _ = ctx;
    }

    /// An admin queue told that a namespace of its subsystem changed
    /// (on its thread, by a message from `Target::add_namespace` or
    /// `remove_namespace`): raises the Namespace Attribute Changed event
    /// if the host enabled it and completes a held Asynchronous Event
    /// Request with it.
    pub(crate) fn deliver_events<X: QueueTransport>(&mut self, x: &mut X) {
        let Bound::Admin { ctrl, .. } = &self.bound else {
            return;
        };
        let ctrl = ctrl.clone();
        lock(&ctrl).namespace_events();
        self.complete_events(x, &ctrl);
    }

    /// Completes held Asynchronous Event Requests with the events `ctrl`
    /// has for them.
    fn complete_events<X: QueueTransport>(&mut self, x: &mut X, ctrl: &Mutex<Ctrl>) {
        while let Some((cid, dw0)) = lock(ctrl).next_event() {
            if let Some(k) = self
                .slots
                .iter()
                .position(|s| s.st == St::Held && s.cid == cid)
            {
                self.finish(x, k as u16, Status::SUCCESS, dw0, 0);
            }
        }
    }
}
