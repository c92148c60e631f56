//! The controller registers a transport publishes (PCIe: BAR0) or serves
//! through Property Get/Set (fabrics): CAP, VS, CC and CSTS, as a pure
//! state machine.
//!
//! A CC write ([`Registers::write_cc`]) reports what changed: EN 1 → 0 (a
//! reset), EN 0 → 1 (an enable, which the controller checks and the
//! transport completes with its own set-up, e.g. the PCIe admin queue),
//! and a new shutdown notification. The reactions (`Controller::reset`,
//! `Controller::enable_done`, `Controller::shutdown_complete`) then set CSTS.
use pollux_spec::regs::{self, shst, Cap, Cc, Csts, Vs};

/// What a CC write changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CcChange {
    /// EN went 1 → 0: controller reset.
    pub reset: bool,
    /// EN went 0 → 1: enable.
    pub enable: bool,
    /// SHN went to a new non-zero value: a shutdown notification.
    pub shutdown: Option<u8>,
}

/// CAP, VS, CC, CSTS.
#[derive(Clone, Copy, Debug)]
pub struct Registers {
    cap: Cap,
    cc: u32,
    csts: u32,
}

impl Registers {
    pub fn new(cap: Cap) -> Registers {
        Registers {
            cap,
            cc: 0,
            csts: 0,
        }
    }

    pub fn cap(&self) -> Cap {
        self.cap
    }

    pub fn vs(&self) -> Vs {
        Vs::NVME_2_0
    }

    /// CC as last written.
    pub fn cc(&self) -> u32 {
        self.cc
    }

    pub fn csts(&self) -> u32 {
        self.csts
    }

    /// Records a CC write and reports the transitions it asks for (none
    /// when the value did not change).
    pub fn write_cc(&mut self, cc: u32) -> CcChange {
        let mut ch = CcChange::default();
        if cc == self.cc {
            return ch;
        }
        let (old, new) = (Cc(self.cc), Cc(cc));
        self.cc = cc;
        if old.en() && !new.en() {
            ch.reset = true;
        } else if !old.en() && new.en() {
            ch.enable = true;
        }
        if new.shn() != regs::shn::NONE && new.shn() != old.shn() {
            ch.shutdown = Some(new.shn());
        }
        ch
    }

    /// The transport-neutral checks of CC at enable: command set, memory
    /// page size within CAP, arbitration. Returns the memory page size.
    pub fn check_enable(&self) -> Result<usize, String> {
        let cc = Cc(self.cc);
        if cc.css() != 0 {
            return Err(format!("CC.CSS {} not supported (NVM only)", cc.css()));
        }
        if cc.mps() < self.cap.mpsmin() || cc.mps() > self.cap.mpsmax() {
            return Err(format!("CC.MPS {} outside CAP range", cc.mps()));
        }
        if cc.ams() != 0 {
            return Err(format!(
                "CC.AMS {} not supported (round robin only)",
                cc.ams()
            ));
        }
        Ok(4096usize << cc.mps())
    }

    pub(crate) fn set_csts(&mut self, v: u32) {
        self.csts = v;
    }

    pub(crate) fn set_ready(&mut self) {
        self.csts = Csts::RDY;
    }

    pub(crate) fn set_fatal(&mut self) {
        self.csts |= Csts::CFS;
    }

    pub(crate) fn set_shutdown_occurring(&mut self) {
        self.csts = Csts(self.csts).with_shst(shst::OCCURRING).0;
    }

    pub(crate) fn set_shutdown_complete(&mut self) {
        self.csts = Csts(self.csts).with_shst(shst::COMPLETE).0;
    }
}
