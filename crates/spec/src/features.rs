//! Set Features / Get Features (NVMe 2.0c base spec and the
//! NVM Command Set spec): feature identifiers, the select field, typed
//! encodings of the CDW11 / completion DW0 values pollux uses, and the
//! Asynchronous Event Request completion DW0.
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

/// Feature Identifiers.
pub mod fid {
    pub const ARBITRATION: u8 = 0x01;
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// LBA Range Type (NVM command set).
    pub const LBA_RANGE_TYPE: u8 = 0x03;
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery (NVM command set: TLER, DULBE).
    pub const ERROR_RECOVERY: u8 = 0x05;
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    pub const INTERRUPT_VECTOR_CONFIG: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    pub const AUTONOMOUS_POWER_STATE: u8 = 0x0C;
    pub const HOST_MEMORY_BUFFER: u8 = 0x0D;
    pub const TIMESTAMP: u8 = 0x0E;
    pub const KEEP_ALIVE: u8 = 0x0F;
    pub const HOST_CONTROLLED_THERMAL: u8 = 0x10;
    pub const NON_OPERATIONAL_POWER_STATE: u8 = 0x11;
    pub const READ_RECOVERY_LEVEL: u8 = 0x12;
    pub const PREDICTABLE_LATENCY_CONFIG: u8 = 0x13;
    pub const PREDICTABLE_LATENCY_WINDOW: u8 = 0x14;
    /// LBA Status Information attributes (NVM command set).
    pub const LBA_STATUS_INFO: u8 = 0x15;
    pub const HOST_BEHAVIOR_SUPPORT: u8 = 0x16;
    pub const SANITIZE_CONFIG: u8 = 0x17;
    pub const ENDURANCE_GROUP_EVENT_CONFIG: u8 = 0x18;
    pub const IO_COMMAND_SET_PROFILE: u8 = 0x19;
    pub const SPINUP_CONTROL: u8 = 0x1A;
    pub const ENHANCED_CONTROLLER_METADATA: u8 = 0x7D;
    pub const CONTROLLER_METADATA: u8 = 0x7E;
    pub const NAMESPACE_METADATA: u8 = 0x7F;
    pub const SOFTWARE_PROGRESS_MARKER: u8 = 0x80;
    pub const HOST_IDENTIFIER: u8 = 0x81;
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
    pub const NAMESPACE_WRITE_PROTECTION: u8 = 0x84;
}

/// Get Features Select field (CDW10 bits 10:8).
pub mod sel {
    pub const CURRENT: u8 = 0b000;
    pub const DEFAULT: u8 = 0b001;
    pub const SAVED: u8 = 0b010;
    /// Returns the feature's capabilities (`CAP_*` bits) in DW0.
    pub const SUPPORTED: u8 = 0b011;
}

/// Supported-capabilities DW0 bit 0: the feature is saveable.
pub const CAP_SAVEABLE: u32 = 1 << 0;
/// Supported-capabilities DW0 bit 1: the feature is namespace specific.
pub const CAP_NS_SPECIFIC: u32 = 1 << 1;
/// Supported-capabilities DW0 bit 2: the feature is changeable.
pub const CAP_CHANGEABLE: u32 = 1 << 2;

/// Set Features CDW10 bit 31: Save.
pub const SET_FEATURES_SAVE: u32 = 1 << 31;

/// Get Features CDW10: FID in bits 7:0, SEL in bits 10:8.
pub const fn get_features_cdw10(fid: u8, sel: u8) -> u32 {
    fid as u32 | ((sel as u32 & 0x7) << 8)
}

/// Set Features CDW10: FID in bits 7:0, SV in bit 31.
pub const fn set_features_cdw10(fid: u8, save: bool) -> u32 {
    fid as u32 | if save { SET_FEATURES_SAVE } else { 0 }
}

/// Feature Identifier from a Get/Set Features CDW10.
pub const fn cdw10_fid(cdw10: u32) -> u8 {
    cdw10 as u8
}

/// Select field from a Get Features CDW10.
pub const fn cdw10_sel(cdw10: u32) -> u8 {
    ((cdw10 >> 8) & 0x7) as u8
}

/// Save bit from a Set Features CDW10.
pub const fn cdw10_save(cdw10: u32) -> bool {
    cdw10 & SET_FEATURES_SAVE != 0
}

// ---------------------------------------------------------------------------
// Number of Queues (FID 07h)
// ---------------------------------------------------------------------------

/// Number of Queues: I/O submission and completion queue counts, 1's based
/// here and 0's based on the wire (NSQR/NSQA bits 15:0, NCQR/NCQA bits
/// 31:16; the same layout in Set Features CDW11 and the completion DW0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NumberOfQueues {
    /// Number of I/O submission queues (1's based).
    pub nsq: u16,
    /// Number of I/O completion queues (1's based).
    pub ncq: u16,
}

impl NumberOfQueues {
    pub const fn new(nsq: u16, ncq: u16) -> Self {
        NumberOfQueues { nsq, ncq }
    }

    /// Set Features CDW11. A count of 0 is encoded as 1 (the minimum).
    pub const fn to_cdw11(self) -> u32 {
        let sq = if self.nsq == 0 { 0 } else { self.nsq - 1 };
        let cq = if self.ncq == 0 { 0 } else { self.ncq - 1 };
        sq as u32 | (cq as u32) << 16
    }

    /// Decodes a Set Features CDW11 (controller side). `None` if either
    /// field is FFFFh (65,536 queues), which the spec makes invalid.
    pub const fn from_cdw11(cdw11: u32) -> Option<Self> {
        let sq = cdw11 as u16;
        let cq = (cdw11 >> 16) as u16;
        if sq == u16::MAX || cq == u16::MAX {
            None
        } else {
            Some(NumberOfQueues {
                nsq: sq + 1,
                ncq: cq + 1,
            })
        }
    }

    /// Completion DW0 (NSQA / NCQA), controller side.
    pub const fn to_dw0(self) -> u32 {
        self.to_cdw11()
    }

    /// Decodes a completion DW0 (host side). A value of FFFFh (not
    /// representable 1's based in 16 bits) saturates to 65,535.
    pub const fn from_dw0(dw0: u32) -> Self {
        NumberOfQueues {
            nsq: (dw0 as u16).saturating_add(1),
            ncq: ((dw0 >> 16) as u16).saturating_add(1),
        }
    }
}

// ---------------------------------------------------------------------------
// Arbitration (FID 01h)
// ---------------------------------------------------------------------------

/// Arbitration: AB bits 2:0, LPW 15:8, MPW 23:16, HPW 31:24. Values are kept
/// as encoded: AB is a power of two (`0b111` = no limit), the weights are
/// 0's based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Arbitration {
    /// Arbitration Burst: `2 ^ ab` commands; 7 = no limit.
    pub ab: u8,
    /// Low Priority Weight, 0's based.
    pub lpw: u8,
    /// Medium Priority Weight, 0's based.
    pub mpw: u8,
    /// High Priority Weight, 0's based.
    pub hpw: u8,
}

impl Arbitration {
    /// AB value meaning "no limit".
    pub const AB_NO_LIMIT: u8 = 0b111;

    pub const fn to_cdw11(self) -> u32 {
        (self.ab & 0x7) as u32
            | (self.lpw as u32) << 8
            | (self.mpw as u32) << 16
            | (self.hpw as u32) << 24
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        Arbitration {
            ab: (cdw11 & 0x7) as u8,
            lpw: (cdw11 >> 8) as u8,
            mpw: (cdw11 >> 16) as u8,
            hpw: (cdw11 >> 24) as u8,
        }
    }
    pub const fn to_dw0(self) -> u32 {
        self.to_cdw11()
    }
    pub const fn from_dw0(dw0: u32) -> Self {
        Self::from_cdw11(dw0)
    }
}

// ---------------------------------------------------------------------------
// Power Management (FID 02h)
// ---------------------------------------------------------------------------

/// Power Management: PS bits 4:0, WH (Workload Hint) bits 7:5.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PowerManagement {
    pub ps: u8,
    pub wh: u8,
}

impl PowerManagement {
    pub const fn to_cdw11(self) -> u32 {
        (self.ps & 0x1F) as u32 | ((self.wh & 0x7) as u32) << 5
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        PowerManagement {
            ps: (cdw11 & 0x1F) as u8,
            wh: ((cdw11 >> 5) & 0x7) as u8,
        }
    }
    pub const fn to_dw0(self) -> u32 {
        self.to_cdw11()
    }
    pub const fn from_dw0(dw0: u32) -> Self {
        Self::from_cdw11(dw0)
    }
}

// ---------------------------------------------------------------------------
// Temperature Threshold (FID 04h)
// ---------------------------------------------------------------------------

/// THSEL: over temperature threshold.
pub const THSEL_OVER: u8 = 0b00;
/// THSEL: under temperature threshold.
pub const THSEL_UNDER: u8 = 0b01;
/// TMPSEL: composite temperature.
pub const TMPSEL_COMPOSITE: u8 = 0;

/// Temperature Threshold: TMPTH bits 15:0 (Kelvin), TMPSEL bits 19:16
/// (0 = composite, 1..=8 = sensor, Fh = all), THSEL bits 21:20.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TemperatureThreshold {
    pub tmpth: u16,
    pub tmpsel: u8,
    pub thsel: u8,
}

impl TemperatureThreshold {
    pub const fn to_cdw11(self) -> u32 {
        self.tmpth as u32 | ((self.tmpsel & 0xF) as u32) << 16 | ((self.thsel & 0x3) as u32) << 20
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        TemperatureThreshold {
            tmpth: cdw11 as u16,
            tmpsel: ((cdw11 >> 16) & 0xF) as u8,
            thsel: ((cdw11 >> 20) & 0x3) as u8,
        }
    }
}

// ---------------------------------------------------------------------------
// Error Recovery (FID 05h)
// ---------------------------------------------------------------------------

/// Error Recovery: TLER bits 15:0 (100 ms units, 0 = no limit), DULBE bit 16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ErrorRecovery {
    pub tler: u16,
    pub dulbe: bool,
}

impl ErrorRecovery {
    pub const fn to_cdw11(self) -> u32 {
        self.tler as u32 | (self.dulbe as u32) << 16
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        ErrorRecovery {
            tler: cdw11 as u16,
            dulbe: cdw11 & (1 << 16) != 0,
        }
    }
    pub const fn to_dw0(self) -> u32 {
        self.to_cdw11()
    }
    pub const fn from_dw0(dw0: u32) -> Self {
        Self::from_cdw11(dw0)
    }
}

// ---------------------------------------------------------------------------
// Volatile Write Cache (FID 06h)
// ---------------------------------------------------------------------------

/// Volatile Write Cache: WCE bit 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VolatileWriteCache {
    /// Volatile Write Cache Enable.
    pub wce: bool,
}

impl VolatileWriteCache {
    /// CDW11 / DW0 bit 0: Volatile Write Cache Enable.
    pub const WCE: u32 = 1 << 0;

    pub const fn to_cdw11(self) -> u32 {
        if self.wce {
            Self::WCE
        } else {
            0
        }
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        VolatileWriteCache {
            wce: cdw11 & Self::WCE != 0,
        }
    }
    pub const fn to_dw0(self) -> u32 {
        self.to_cdw11()
    }
    pub const fn from_dw0(dw0: u32) -> Self {
        Self::from_cdw11(dw0)
    }
}

// ---------------------------------------------------------------------------
// Interrupt Coalescing (FID 08h) and Interrupt Vector Configuration (09h)
// ---------------------------------------------------------------------------

/// Interrupt Coalescing: THR bits 7:0 (aggregation threshold, 0's based),
/// TIME bits 15:8 (100 µs units).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterruptCoalescing {
    pub thr: u8,
    pub time: u8,
}

impl InterruptCoalescing {
    pub const fn to_cdw11(self) -> u32 {
        self.thr as u32 | (self.time as u32) << 8
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        InterruptCoalescing {
            thr: cdw11 as u8,
            time: (cdw11 >> 8) as u8,
        }
    }
}

/// Interrupt Vector Configuration: IV bits 15:0, CD (Coalescing Disable)
/// bit 16.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterruptVectorConfig {
    pub iv: u16,
    pub cd: bool,
}

impl InterruptVectorConfig {
    pub const fn to_cdw11(self) -> u32 {
        self.iv as u32 | (self.cd as u32) << 16
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        InterruptVectorConfig {
            iv: cdw11 as u16,
            cd: cdw11 & (1 << 16) != 0,
        }
    }
}

/// Write Atomicity Normal CDW11 bit 0: Disable Normal.
pub const WRITE_ATOMICITY_DN: u32 = 1 << 0;
/// Autonomous Power State Transition CDW11 bit 0: enable.
pub const APST_ENABLE: u32 = 1 << 0;
/// Host Memory Buffer CDW11 bit 0: Enable Host Memory.
pub const HMB_ENABLE: u32 = 1 << 0;
/// Host Memory Buffer CDW11 bit 1: Memory Return.
pub const HMB_MEMORY_RETURN: u32 = 1 << 1;

// ---------------------------------------------------------------------------
// Asynchronous Event Configuration (FID 0Bh)
// ---------------------------------------------------------------------------

/// Asynchronous Event Configuration (CDW11 / DW0). The associated constants
/// are the CDW11 bits; a set bit enables the corresponding event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AsyncEventConfig(pub u32);

impl AsyncEventConfig {
    /// Bits 7:0: SMART / Health critical warnings (same bit positions as the
    /// SMART log Critical Warning field).
    pub const SMART_CRITICAL_WARNINGS: u32 = 0xFF;
    /// Bit 8: Namespace Attribute Notices.
    pub const NS_ATTR_NOTICES: u32 = 1 << 8;
    /// Bit 9: Firmware Activation Notices.
    pub const FW_ACTIVATION: u32 = 1 << 9;
    /// Bit 10: Telemetry Log Notices.
    pub const TELEMETRY_LOG: u32 = 1 << 10;
    /// Bit 11: Asymmetric Namespace Access Change Notices.
    pub const ANA_CHANGE: u32 = 1 << 11;
    /// Bit 12: Predictable Latency Event Aggregate Log Change Notices.
    pub const PLEA_LOG_CHANGE: u32 = 1 << 12;
    /// Bit 13: LBA Status Information Notices.
    pub const LBA_STATUS_INFO: u32 = 1 << 13;
    /// Bit 14: Endurance Group Event Aggregate Log Change Notices.
    pub const EG_EVENT_AGGREGATE: u32 = 1 << 14;
    /// Bit 31: Discovery Log Page Change Notification.
    pub const DISCOVERY_LOG_CHANGE: u32 = 1 << 31;

    pub const fn contains(self, bits: u32) -> bool {
        self.0 & bits == bits
    }
    /// The SMART / Health critical warning enable mask (bits 7:0).
    pub const fn smart_warnings(self) -> u8 {
        self.0 as u8
    }
    pub const fn to_cdw11(self) -> u32 {
        self.0
    }
    pub const fn from_cdw11(cdw11: u32) -> Self {
        AsyncEventConfig(cdw11)
    }
}

// ---------------------------------------------------------------------------
// Timestamp (FID 0Eh)
// ---------------------------------------------------------------------------

/// Timestamp feature data (8 bytes, transferred in the data buffer).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct TimestampData {
    /// Milliseconds since 1970-01-01 00:00 UTC, 48-bit little-endian.
    pub timestamp: [u8; 6],
    /// Bit 0 Synch (timestamp may have stopped), bits 3:1 Timestamp Origin
    /// (000b = reset, 001b = set by Set Features).
    pub attr: u8,
    pub rsvd7: u8,
}

assert_size!(TimestampData, 8);
assert_offset!(TimestampData, timestamp, 0);
assert_offset!(TimestampData, attr, 6);
assert_offset!(TimestampData, rsvd7, 7);

impl TimestampData {
    /// Timestamp in milliseconds (48 bits).
    pub fn millis(&self) -> u64 {
        let mut b = [0u8; 8];
        b[..6].copy_from_slice(&self.timestamp);
        u64::from_le_bytes(b)
    }
    /// Sets the timestamp (bits above 47 are dropped).
    pub fn set_millis(&mut self, ms: u64) {
        self.timestamp.copy_from_slice(&ms.to_le_bytes()[..6]);
    }
    /// Timestamp Origin (attr bits 3:1).
    pub const fn origin(&self) -> u8 {
        (self.attr >> 1) & 0x7
    }
    /// Synch bit.
    pub const fn synch(&self) -> bool {
        self.attr & 1 != 0
    }
}

// ---------------------------------------------------------------------------
// Asynchronous Event Request completion
// ---------------------------------------------------------------------------

/// Asynchronous Event Request completion DW0: event type bits 2:0, event
/// information bits 15:8, log page identifier bits 23:16.
pub mod aer {
    /// Asynchronous Event Type: error status.
    pub const ERROR: u8 = 0;
    /// Asynchronous Event Type: SMART / Health status.
    pub const SMART: u8 = 1;
    /// Asynchronous Event Type: notice.
    pub const NOTICE: u8 = 2;
    /// Asynchronous Event Type: I/O command set specific status.
    pub const IO_CMD_SET: u8 = 6;
    /// Asynchronous Event Type: vendor specific.
    pub const VENDOR: u8 = 7;

    // Error status information (type 0).
    pub const ERROR_INVALID_DOORBELL_REGISTER: u8 = 0x00;
    pub const ERROR_INVALID_DOORBELL_WRITE: u8 = 0x01;
    pub const ERROR_DIAGNOSTIC_FAILURE: u8 = 0x02;
    pub const ERROR_PERSISTENT_INTERNAL: u8 = 0x03;
    pub const ERROR_TRANSIENT_INTERNAL: u8 = 0x04;
    pub const ERROR_FIRMWARE_IMAGE_LOAD: u8 = 0x05;

    // SMART / Health status information (type 1).
    pub const SMART_RELIABILITY: u8 = 0x00;
    pub const SMART_TEMPERATURE_THRESHOLD: u8 = 0x01;
    pub const SMART_SPARE_BELOW_THRESHOLD: u8 = 0x02;

    // Notice information (type 2).
    pub const NOTICE_NS_ATTR_CHANGED: u8 = 0x00;
    pub const NOTICE_FW_ACTIVATION_STARTING: u8 = 0x01;
    pub const NOTICE_TELEMETRY_LOG_CHANGED: u8 = 0x02;
    pub const NOTICE_ANA_CHANGE: u8 = 0x03;
    pub const NOTICE_PLEA_LOG_CHANGED: u8 = 0x04;
    pub const NOTICE_LBA_STATUS_ALERT: u8 = 0x05;
    pub const NOTICE_EG_EVENT_AGGREGATE_LOG_CHANGED: u8 = 0x06;
    pub const NOTICE_DISCOVERY_LOG_CHANGED: u8 = 0xF0;

    // NVM command set specific status information (type 6).
    pub const IO_RESERVATION_LOG_AVAILABLE: u8 = 0x00;
    pub const IO_SANITIZE_COMPLETED: u8 = 0x01;
    pub const IO_SANITIZE_COMPLETED_UNEXPECTED_DEALLOC: u8 = 0x02;

    /// A decoded Asynchronous Event Request completion DW0.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub struct AsyncEvent {
        /// Asynchronous Event Type (3 bits).
        pub event_type: u8,
        /// Asynchronous Event Information.
        pub info: u8,
        /// Log page to read to clear the event.
        pub log_page: u8,
    }

    /// Builds the completion DW0 for an asynchronous event.
    pub const fn encode(event_type: u8, info: u8, log_page: u8) -> u32 {
        (event_type & 0x7) as u32 | (info as u32) << 8 | (log_page as u32) << 16
    }

    /// Decodes an Asynchronous Event Request completion DW0.
    pub const fn decode(dw0: u32) -> AsyncEvent {
        AsyncEvent {
            event_type: (dw0 & 0x7) as u8,
            info: (dw0 >> 8) as u8,
            log_page: (dw0 >> 16) as u8,
        }
    }

    impl AsyncEvent {
        pub const fn encode(self) -> u32 {
            encode(self.event_type, self.info, self.log_page)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::lid;

    #[test]
    fn number_of_queues_encoding() {
        let q = NumberOfQueues::new(8, 4);
        assert_eq!(q.to_cdw11(), 7 | 3 << 16);
        assert_eq!(NumberOfQueues::from_dw0(7 | 3 << 16), q);
        assert_eq!(NumberOfQueues::from_cdw11(q.to_cdw11()), Some(q));
        assert_eq!(NumberOfQueues::from_cdw11(0xFFFF), None);
        assert_eq!(NumberOfQueues::from_cdw11(0xFFFF_0000), None);
        assert_eq!(
            NumberOfQueues::from_cdw11(0xFFFE_FFFE),
            Some(NumberOfQueues::new(0xFFFF, 0xFFFF))
        );
        assert_eq!(NumberOfQueues::new(0xFFFF, 1).to_cdw11(), 0xFFFE);
        assert_eq!(NumberOfQueues::from_dw0(0), NumberOfQueues::new(1, 1));
        assert_eq!(
            NumberOfQueues::from_dw0(u32::MAX),
            NumberOfQueues::new(u16::MAX, u16::MAX)
        );
        for v in [0u32, 1, 0x1234_5678, 0xFFFE_0000] {
            assert_eq!(NumberOfQueues::from_cdw11(v).unwrap().to_dw0(), v);
        }
    }

    #[test]
    fn arbitration_round_trip() {
        let a = Arbitration {
            ab: Arbitration::AB_NO_LIMIT,
            lpw: 1,
            mpw: 2,
            hpw: 3,
        };
        assert_eq!(a.to_cdw11(), 0x0302_0107);
        assert_eq!(Arbitration::from_dw0(0x0302_0107), a);
        // Reserved bits 7:3 are ignored.
        assert_eq!(Arbitration::from_cdw11(0x0302_01FF), a);
    }

    #[test]
    fn small_features_round_trip() {
        let pm = PowerManagement { ps: 3, wh: 2 };
        assert_eq!(pm.to_cdw11(), 3 | 2 << 5);
        assert_eq!(PowerManagement::from_dw0(pm.to_dw0()), pm);

        let tt = TemperatureThreshold {
            tmpth: 350,
            tmpsel: 0xF,
            thsel: THSEL_UNDER,
        };
        assert_eq!(tt.to_cdw11(), 350 | 0xF << 16 | 1 << 20);
        assert_eq!(TemperatureThreshold::from_cdw11(tt.to_cdw11()), tt);

        let er = ErrorRecovery {
            tler: 20,
            dulbe: true,
        };
        assert_eq!(er.to_cdw11(), 20 | 1 << 16);
        assert_eq!(ErrorRecovery::from_dw0(er.to_dw0()), er);

        let vwc = VolatileWriteCache { wce: true };
        assert_eq!(vwc.to_cdw11(), 1);
        assert!(!VolatileWriteCache::from_dw0(0xFFFF_FFFE).wce);
        assert_eq!(VolatileWriteCache::from_dw0(1), vwc);

        let ic = InterruptCoalescing { thr: 7, time: 10 };
        assert_eq!(ic.to_cdw11(), 0x0A07);
        assert_eq!(InterruptCoalescing::from_cdw11(0x0A07), ic);

        let iv = InterruptVectorConfig { iv: 5, cd: true };
        assert_eq!(InterruptVectorConfig::from_cdw11(iv.to_cdw11()), iv);
    }

    #[test]
    fn async_event_config_bits() {
        let c = AsyncEventConfig(
            AsyncEventConfig::SMART_CRITICAL_WARNINGS
                | AsyncEventConfig::NS_ATTR_NOTICES
                | AsyncEventConfig::FW_ACTIVATION,
        );
        assert_eq!(c.to_cdw11(), 0x3FF);
        assert!(c.contains(AsyncEventConfig::NS_ATTR_NOTICES));
        assert!(!c.contains(AsyncEventConfig::ANA_CHANGE));
        assert_eq!(c.smart_warnings(), 0xFF);
        assert_eq!(AsyncEventConfig::from_cdw11(0x3FF), c);
    }

    #[test]
    fn cdw10_helpers() {
        let g = get_features_cdw10(fid::NUMBER_OF_QUEUES, sel::SUPPORTED);
        assert_eq!(g, 0x0307);
        assert_eq!(cdw10_fid(g), fid::NUMBER_OF_QUEUES);
        assert_eq!(cdw10_sel(g), sel::SUPPORTED);
        let s = set_features_cdw10(fid::VOLATILE_WRITE_CACHE, true);
        assert_eq!(s, 0x8000_0006);
        assert!(cdw10_save(s));
        assert!(!cdw10_save(set_features_cdw10(fid::ARBITRATION, false)));
    }

    #[test]
    fn timestamp_layout() {
        let mut t = TimestampData {
            attr: 0b0010,
            ..Default::default()
        };
        t.set_millis(0x0000_1234_5678_9ABC);
        assert_eq!(t.millis(), 0x1234_5678_9ABC);
        assert_eq!(t.origin(), 1);
        assert!(!t.synch());
        assert_eq!(t.as_bytes(), &[0xBC, 0x9A, 0x78, 0x56, 0x34, 0x12, 0x02, 0]);
        t.set_millis(u64::MAX);
        assert_eq!(t.millis(), (1 << 48) - 1);
    }

    #[test]
    fn aer_encode_decode() {
        let dw0 = aer::encode(
            aer::NOTICE,
            aer::NOTICE_NS_ATTR_CHANGED,
            lid::CHANGED_NS_LIST,
        );
        assert_eq!(dw0, 0x0004_0002);
        let e = aer::decode(dw0);
        assert_eq!(e.event_type, aer::NOTICE);
        assert_eq!(e.info, aer::NOTICE_NS_ATTR_CHANGED);
        assert_eq!(e.log_page, lid::CHANGED_NS_LIST);
        assert_eq!(e.encode(), dw0);

        let dw0 = aer::encode(aer::ERROR, aer::ERROR_INVALID_DOORBELL_WRITE, lid::ERROR);
        assert_eq!(dw0, 0x0001_0100);
        let dw0 = aer::encode(aer::SMART, aer::SMART_TEMPERATURE_THRESHOLD, lid::SMART);
        assert_eq!(dw0, 0x0002_0101);
        // Reserved bits 7:3 and 31:24 are ignored by decode.
        assert_eq!(aer::decode(0xFF02_01F9), aer::decode(0x0002_0101));
        for t in 0..8u8 {
            let e = aer::decode(aer::encode(t, 0xAB, 0xCD));
            assert_eq!((e.event_type, e.info, e.log_page), (t, 0xAB, 0xCD));
        }
    }
}
