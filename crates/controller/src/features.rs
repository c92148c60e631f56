//! The values of a controller's features (what Get Features reads and
//! Set Features changes: `admin::features`), and their defaults.
use pollux_spec::features::{
    fid, ErrorRecovery, InterruptCoalescing, InterruptVectorConfig, NumberOfQueues,
    PowerManagement, TemperatureThreshold, VolatileWriteCache, THSEL_OVER, THSEL_UNDER,
};

use crate::subsystem::Subsystem;

/// Default over-temperature threshold, Kelvin (70 °C).
pub const DEFAULT_TEMP_OVER: u16 = 343;
/// Composite temperature reported in SMART, Kelvin (40 °C).
pub const COMPOSITE_TEMP: u16 = 313;

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
    pub(crate) fn value(&self, f: u8, cdw11: u32) -> Option<u32> {
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
