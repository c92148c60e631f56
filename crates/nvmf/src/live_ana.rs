//! ANA states of a running target's listeners ([`Target::set_ana_state`],
//! SPDK's `nvmf_subsystem_listener_set_ana_state`).
//!
//! Each listener of a subsystem has its ANA states (`AnaPort`, every
//! group optimized unless set otherwise), shared by the controllers whose
//! admin queue connected through it. A change is made there, then the
//! subsystem's I/O queues are told (its namespace generation moves on:
//! they recompute which namespaces they refuse at their next pass) and
//! every controller of the subsystem's admin queue is sent a message on
//! its thread, where those of that listener raise the ANA Change notice
//! (if their host enabled it). Nothing here is on the I/O path.
use std::net::SocketAddr;

use pollux_spec::log::AnaState;

use crate::live::LiveError;
use crate::shared::SubsysId;
use crate::tgt::Target;

impl Target {
    /// Sets the ANA state of group `anagrpid` (None: every group) through
    /// listener `addr` of subsystem `nqn`, which must report ANA. Each
    /// controller connected through that listener gets the ANA Change
    /// notice; its I/O to an inaccessible group's namespaces is refused
    /// with Asymmetric Access Inaccessible. Not from a runtime thread.
    pub fn set_ana_state(
        &self,
        nqn: &str,
        addr: SocketAddr,
        state: AnaState,
        anagrpid: Option<u32>,
    ) -> Result<(), LiveError> {
        let shared = self.shared();
        let e = {
            let subs = shared.subsystems();
            subs.iter()
                .find(|s| s.model.nqn() == nqn)
                .cloned()
                .ok_or_else(|| LiveError::NoSubsystem { nqn: nqn.into() })?
        };
        let invalid = |why: String| LiveError::InvalidSubsystem {
            nqn: nqn.into(),
            why,
        };
        if !e.model.ana_reporting() {
            return Err(invalid(
                "ANA reporting is off (nvmf_create_subsystem ana_reporting true)".into(),
            ));
        }
        if anagrpid.is_some_and(|g| g == 0 || g as usize > pollux_controller::MAX_NAMESPACES) {
            return Err(invalid(format!(
                "anagrpid {}: must be 1..={}",
                anagrpid.unwrap_or(0),
                pollux_controller::MAX_NAMESPACES
            )));
        }
        let real = self
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .bound(addr)
            .unwrap_or(addr);
        let Some(port) = e.ana_port(real).or_else(|| e.ana_port(addr)) else {
            return Err(LiveError::NoListener {
                nqn: nqn.into(),
                addr,
            });
        };
        if port.set(anagrpid, state) {
            e.model.ana_changed();
            tracing::info!(nqn, listen = %addr, ?anagrpid, state = %state, "ANA state changed");
            self.announce(SubsysId::Nvm(e.id));
        }
        Ok(())
    }
}
