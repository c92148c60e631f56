//! Get Features / Set Features: the features an I/O controller must
//! support — Arbitration, Power Management (power state 0 only: NPSS 0),
//! Temperature Threshold, Error Recovery (TLER kept, DULBE unsupported),
//! Volatile Write Cache (VWC is present), Number of Queues, Write
//! Atomicity Normal, Asynchronous Event Configuration; PCIe: Interrupt
//! Coalescing and Interrupt Vector Configuration; Fabrics (with KAS):
//! Keep Alive Timer (KATO in ms; the transport runs the timer). Every
//! other feature is Invalid Field.
//!
//! Error Recovery is namespace specific: NSID 0, FFFFFFFFh or an active
//! namespace (one value for all of them); another NSID is Invalid
//! Namespace.
//!
//! Interrupt Vector Configuration selects the vector with CDW11 IV (Get and
//! Set; out of range: Invalid Field). Vector 0, the admin vector, is never
//! coalesced: it reports CD = 1 and refuses CD = 0 (Invalid Field).
//!
//! Volatile Write Cache Enable is real: while WCE is 0, every Write and
//! Write Zeroes the controller's I/O queues check is Force Unit Access
//! (it completes only once durable; see `io`). Disabling the cache does
//! not write back what it holds already: a Flush does.
//!
//! Nothing is saveable (SV set → Feature Identifier Not Saveable; SEL
//! "saved" returns the default). Features return to their defaults on a
//! controller reset. Number of Queues grants `min(request, max_io_queues)`
//! and may only be set before any I/O queue exists (Command Sequence Error).
use pollux_spec::features::{
    cdw10_fid, cdw10_save, cdw10_sel, fid, sel, ErrorRecovery, InterruptCoalescing,
    InterruptVectorConfig, NumberOfQueues, PowerManagement, TemperatureThreshold,
    VolatileWriteCache, CAP_CHANGEABLE, CAP_NS_SPECIFIC, THSEL_OVER, THSEL_UNDER,
};
use pollux_spec::status::{generic, specific};
use pollux_spec::Sqe;

use super::{gen, ok, spec, AdminEnv, AdminResult};
use crate::ctrl::Controller;
use crate::subsystem::{Personality, Subsystem};

/// Default over-temperature threshold, Kelvin (70 °C).
pub const DEFAULT_TEMP_OVER: u16 = 343;
/// Composite temperature reported in SMART, Kelvin (40 °C).
pub const COMPOSITE_TEMP: u16 = 313;
/// TMPSEL value meaning "all sensors".
const TMPSEL_ALL: u8 = 0xF;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Features {
    /// Granted I/O queue counts (1's based).
    pub queues: NumberOfQueues,
    pub wce: bool,
    pub arbitration: u32,
    pub aec: u32,
    pub temp_over: u16,
    pub temp_under: u16,
    /// Interrupt Coalescing (THR, TIME).
    pub coalescing: InterruptCoalescing,
    /// Interrupt Vector Configuration CD per vector (`irq_vectors` long;
    /// always set for vector 0).
    pub no_coalesce: Vec<bool>,
    /// Keep Alive Timeout, ms (fabrics).
    pub kato: u32,
    /// Power Management (PS is always 0: one power state).
    pub power: PowerManagement,
    /// Error Recovery (TLER; DULBE is never set).
    pub error_recovery: ErrorRecovery,
    /// Write Atomicity Normal: Disable Normal (bit 0).
    pub write_atomicity_dn: bool,
}

impl Features {
    pub fn defaults(subsys: &Subsystem) -> Features {
        let max = subsys.limits().max_io_queues;
        Features {
            queues: NumberOfQueues::new(max, max),
            wce: true,
            arbitration: 0,
            aec: 0,
            temp_over: DEFAULT_TEMP_OVER,
            temp_under: 0,
            coalescing: InterruptCoalescing::default(),
            no_coalesce: (0..subsys.personality().irq_vectors())
                .map(|v| v == 0)
                .collect(),
            kato: 0,
            power: PowerManagement::default(),
            error_recovery: ErrorRecovery::default(),
            write_atomicity_dn: false,
        }
    }

    /// The DW0 value of `fid` in this feature set (Get Features).
    fn value(&self, f: u8, cdw11: u32) -> Option<u32> {
        Some(match f {
            fid::ARBITRATION => self.arbitration,
            fid::TEMPERATURE_THRESHOLD => {
                let t = TemperatureThreshold::from_cdw11(cdw11);
                match t.thsel {
                    THSEL_OVER => self.temp_over as u32,
                    THSEL_UNDER => self.temp_under as u32,
                    _ => return None,
                }
            }
            fid::VOLATILE_WRITE_CACHE => VolatileWriteCache { wce: self.wce }.to_dw0(),
            fid::NUMBER_OF_QUEUES => self.queues.to_dw0(),
            fid::ASYNC_EVENT_CONFIG => self.aec,
            fid::INTERRUPT_COALESCING => self.coalescing.to_cdw11(),
            fid::INTERRUPT_VECTOR_CONFIG => {
                let iv = InterruptVectorConfig::from_cdw11(cdw11).iv;
                let cd = *self.no_coalesce.get(iv as usize)?;
                InterruptVectorConfig { iv, cd }.to_cdw11()
            }
            fid::KEEP_ALIVE => self.kato,
            fid::POWER_MANAGEMENT => self.power.to_dw0(),
            fid::ERROR_RECOVERY => self.error_recovery.to_dw0(),
            fid::WRITE_ATOMICITY => self.write_atomicity_dn as u32,
            _ => return None,
        })
    }
}

fn supported(f: u8, p: &Personality) -> bool {
    match f {
        fid::ARBITRATION
        | fid::POWER_MANAGEMENT
        | fid::ERROR_RECOVERY
        | fid::WRITE_ATOMICITY
        | fid::TEMPERATURE_THRESHOLD
        | fid::VOLATILE_WRITE_CACHE
        | fid::NUMBER_OF_QUEUES
        | fid::ASYNC_EVENT_CONFIG => true,
        fid::INTERRUPT_COALESCING | fid::INTERRUPT_VECTOR_CONFIG => {
            matches!(p, Personality::Pcie(_))
        }
        fid::KEEP_ALIVE => matches!(p, Personality::Fabrics(f) if f.kas != 0),
        _ => false,
    }
}

impl Controller {
    pub(crate) fn get_features(&mut self, sqe: &Sqe) -> AdminResult {
        let f = cdw10_fid(sqe.cdw10);
        if !supported(f, self.subsys.personality()) {
            return gen(generic::INVALID_FIELD);
        }
        if f == fid::TEMPERATURE_THRESHOLD {
            let t = TemperatureThreshold::from_cdw11(sqe.cdw11);
            if t.tmpsel != 0 && t.tmpsel != TMPSEL_ALL {
                return gen(generic::INVALID_FIELD);
            }
        }
        if f == fid::ERROR_RECOVERY && !self.feature_nsid_ok(sqe.nsid) {
            return gen(generic::INVALID_NAMESPACE);
        }
        let v = match cdw10_sel(sqe.cdw10) {
            sel::CURRENT => self.feat.value(f, sqe.cdw11),
            sel::DEFAULT | sel::SAVED => Features::defaults(&self.subsys).value(f, sqe.cdw11),
            sel::SUPPORTED if f == fid::ERROR_RECOVERY => Some(CAP_CHANGEABLE | CAP_NS_SPECIFIC),
            sel::SUPPORTED => Some(CAP_CHANGEABLE),
            _ => None,
        };
        match v {
            Some(v) => ok(v),
            None => gen(generic::INVALID_FIELD),
        }
    }

    pub(crate) fn set_features(&mut self, sqe: &Sqe, env: AdminEnv) -> AdminResult {
        let f = cdw10_fid(sqe.cdw10);
        if !supported(f, self.subsys.personality()) {
            return gen(generic::INVALID_FIELD);
        }
        if cdw10_save(sqe.cdw10) {
            return spec(specific::FEATURE_NOT_SAVEABLE);
        }
        match f {
            fid::ARBITRATION => {
                self.feat.arbitration = sqe.cdw11;
                ok(0)
            }
            fid::TEMPERATURE_THRESHOLD => {
                let t = TemperatureThreshold::from_cdw11(sqe.cdw11);
                if t.tmpsel != 0 && t.tmpsel != TMPSEL_ALL {
                    return gen(generic::INVALID_FIELD);
                }
                match t.thsel {
                    THSEL_OVER => self.feat.temp_over = t.tmpth,
                    THSEL_UNDER => self.feat.temp_under = t.tmpth,
                    _ => return gen(generic::INVALID_FIELD),
                }
                ok(0)
            }
            fid::VOLATILE_WRITE_CACHE => {
                let wce = VolatileWriteCache::from_cdw11(sqe.cdw11).wce;
                if wce != self.feat.wce {
                    tracing::debug!(wce, "volatile write cache");
                }
                self.set_write_cache(wce);
                ok(0)
            }
            fid::NUMBER_OF_QUEUES => {
                let Some(req) = NumberOfQueues::from_cdw11(sqe.cdw11) else {
                    return gen(generic::INVALID_FIELD);
                };
                if env.io_queues_exist {
                    return gen(generic::COMMAND_SEQUENCE_ERROR);
                }
                let max = self.subsys.limits().max_io_queues;
                self.feat.queues = NumberOfQueues::new(req.nsq.min(max), req.ncq.min(max));
                tracing::debug!(?req, granted = ?self.feat.queues, "number of queues");
                ok(self.feat.queues.to_dw0())
            }
            fid::ASYNC_EVENT_CONFIG => {
                self.feat.aec = sqe.cdw11;
                ok(0)
            }
            fid::INTERRUPT_COALESCING => {
                self.feat.coalescing = InterruptCoalescing::from_cdw11(sqe.cdw11);
                tracing::debug!(coalescing = ?self.feat.coalescing, "interrupt coalescing");
                ok(0)
            }
            fid::INTERRUPT_VECTOR_CONFIG => {
                let c = InterruptVectorConfig::from_cdw11(sqe.cdw11);
                if c.iv == 0 && !c.cd {
                    tracing::warn!("Set Features: coalescing cannot be enabled on vector 0");
                    return gen(generic::INVALID_FIELD);
                }
                let Some(cd) = self.feat.no_coalesce.get_mut(c.iv as usize) else {
                    tracing::warn!(iv = c.iv, "Set Features: interrupt vector out of range");
                    return gen(generic::INVALID_FIELD);
                };
                *cd = c.cd;
                ok(0)
            }
            fid::KEEP_ALIVE => {
                self.feat.kato = sqe.cdw11;
                tracing::debug!(kato_ms = sqe.cdw11, "keep alive timeout");
                ok(0)
            }
            fid::POWER_MANAGEMENT => {
                let pm = PowerManagement::from_cdw11(sqe.cdw11);
                // One power state (NPSS 0).
                if pm.ps != 0 {
                    return gen(generic::INVALID_FIELD);
                }
                self.feat.power = pm;
                ok(0)
            }
            fid::ERROR_RECOVERY => {
                if !self.feature_nsid_ok(sqe.nsid) {
                    return gen(generic::INVALID_NAMESPACE);
                }
                let er = ErrorRecovery::from_cdw11(sqe.cdw11);
                // DULBE needs NSFEAT bit 2, which no namespace reports.
                if er.dulbe {
                    return gen(generic::INVALID_FIELD);
                }
                self.feat.error_recovery = er;
                ok(0)
            }
            fid::WRITE_ATOMICITY => {
                self.feat.write_atomicity_dn = sqe.cdw11 & 1 != 0;
                ok(0)
            }
            _ => gen(generic::INVALID_FIELD),
        }
    }

    /// The NSID of a namespace-specific feature: 0 or FFFFFFFFh (every
    /// namespace), or an active namespace.
    fn feature_nsid_ok(&self, nsid: u32) -> bool {
        nsid == 0 || nsid == 0xFFFF_FFFF || self.subsys.namespace(nsid).is_some()
    }
}
