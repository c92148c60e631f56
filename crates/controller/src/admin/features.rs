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
use crate::features::Features;
use crate::subsystem::Personality;

/// TMPSEL value meaning "all sensors".
const TMPSEL_ALL: u8 = 0xF;

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
