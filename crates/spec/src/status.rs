//! Completion status field (NVMe 2.0 base spec §4.6.1): the 15 bits above
//! the phase tag, with named generic, command-specific, media and path codes.
use core::fmt;

/// The CQE status field without the phase tag: bits 7:0 SC, 10:8 SCT,
/// 12:11 CRD, 13 More, 14 DNR.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u16);

/// Status Code Type values.
pub mod sct {
    pub const GENERIC: u8 = 0;
    pub const COMMAND_SPECIFIC: u8 = 1;
    pub const MEDIA: u8 = 2;
    pub const PATH: u8 = 3;
    pub const VENDOR: u8 = 7;
}

/// Generic command status codes (SCT 0), Figure 102.
pub mod generic {
    pub const SUCCESS: u8 = 0x00;
    pub const INVALID_OPCODE: u8 = 0x01;
    pub const INVALID_FIELD: u8 = 0x02;
    pub const CID_CONFLICT: u8 = 0x03;
    pub const DATA_TRANSFER_ERROR: u8 = 0x04;
    pub const ABORTED_POWER_LOSS: u8 = 0x05;
    pub const INTERNAL_ERROR: u8 = 0x06;
    pub const ABORT_REQUESTED: u8 = 0x07;
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    pub const ABORTED_FAILED_FUSED: u8 = 0x09;
    pub const ABORTED_MISSING_FUSED: u8 = 0x0A;
    pub const INVALID_NAMESPACE: u8 = 0x0B;
    pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0C;
    pub const INVALID_SGL_DESCRIPTOR: u8 = 0x0D;
    pub const INVALID_SGL_COUNT: u8 = 0x0E;
    pub const DATA_SGL_LENGTH_INVALID: u8 = 0x0F;
    pub const METADATA_SGL_LENGTH_INVALID: u8 = 0x10;
    pub const SGL_TYPE_INVALID: u8 = 0x11;
    pub const INVALID_CMB_USE: u8 = 0x12;
    pub const PRP_OFFSET_INVALID: u8 = 0x13;
    pub const ATOMIC_WRITE_UNIT_EXCEEDED: u8 = 0x14;
    pub const OPERATION_DENIED: u8 = 0x15;
    pub const SGL_OFFSET_INVALID: u8 = 0x16;
    pub const HOST_ID_INCONSISTENT_FORMAT: u8 = 0x18;
    pub const KEEP_ALIVE_EXPIRED: u8 = 0x19;
    pub const KEEP_ALIVE_INVALID: u8 = 0x1A;
    pub const ABORTED_PREEMPT: u8 = 0x1B;
    pub const SANITIZE_FAILED: u8 = 0x1C;
    pub const SANITIZE_IN_PROGRESS: u8 = 0x1D;
    pub const SGL_GRANULARITY_INVALID: u8 = 0x1E;
    pub const NOT_SUPPORTED_IN_CMB: u8 = 0x1F;
    pub const NAMESPACE_WRITE_PROTECTED: u8 = 0x20;
    pub const COMMAND_INTERRUPTED: u8 = 0x21;
    pub const TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
    pub const PROHIBITED_BY_LOCKDOWN: u8 = 0x23;
    pub const ADMIN_MEDIA_NOT_READY: u8 = 0x24;
    // NVM command set specific generic codes.
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    pub const NAMESPACE_NOT_READY: u8 = 0x82;
    pub const RESERVATION_CONFLICT: u8 = 0x83;
    pub const FORMAT_IN_PROGRESS: u8 = 0x84;
}

/// Command specific status codes (SCT 1), Figure 103 and NVM Figure 19.
pub mod specific {
    pub const INVALID_CQ: u8 = 0x00;
    pub const INVALID_QID: u8 = 0x01;
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    pub const ABORT_LIMIT_EXCEEDED: u8 = 0x03;
    pub const AER_LIMIT_EXCEEDED: u8 = 0x05;
    pub const INVALID_FIRMWARE_SLOT: u8 = 0x06;
    pub const INVALID_FIRMWARE_IMAGE: u8 = 0x07;
    pub const INVALID_INTERRUPT_VECTOR: u8 = 0x08;
    pub const INVALID_LOG_PAGE: u8 = 0x09;
    pub const INVALID_FORMAT: u8 = 0x0A;
    pub const FW_NEEDS_CONVENTIONAL_RESET: u8 = 0x0B;
    pub const INVALID_QUEUE_DELETION: u8 = 0x0C;
    pub const FEATURE_NOT_SAVEABLE: u8 = 0x0D;
    pub const FEATURE_NOT_CHANGEABLE: u8 = 0x0E;
    pub const FEATURE_NOT_NS_SPECIFIC: u8 = 0x0F;
    pub const FW_NEEDS_SUBSYSTEM_RESET: u8 = 0x10;
    pub const FW_NEEDS_RESET: u8 = 0x11;
    pub const FW_NEEDS_MAX_TIME_VIOLATION: u8 = 0x12;
    pub const FW_ACTIVATION_PROHIBITED: u8 = 0x13;
    pub const OVERLAPPING_RANGE: u8 = 0x14;
    pub const NS_INSUFFICIENT_CAPACITY: u8 = 0x15;
    pub const NS_ID_UNAVAILABLE: u8 = 0x16;
    pub const NS_ALREADY_ATTACHED: u8 = 0x18;
    pub const NS_IS_PRIVATE: u8 = 0x19;
    pub const NS_NOT_ATTACHED: u8 = 0x1A;
    pub const THIN_PROVISIONING_UNSUPPORTED: u8 = 0x1B;
    pub const CONTROLLER_LIST_INVALID: u8 = 0x1C;
    pub const SELF_TEST_IN_PROGRESS: u8 = 0x1D;
    pub const BOOT_PARTITION_WRITE_PROHIBITED: u8 = 0x1E;
    pub const INVALID_CONTROLLER_ID: u8 = 0x1F;
    pub const INVALID_SECONDARY_STATE: u8 = 0x20;
    pub const INVALID_RESOURCE_COUNT: u8 = 0x21;
    pub const INVALID_RESOURCE_ID: u8 = 0x22;
    // NVM command set specific.
    pub const CONFLICTING_ATTRIBUTES: u8 = 0x80;
    pub const INVALID_PROTECTION_INFO: u8 = 0x81;
    pub const WRITE_TO_READ_ONLY_RANGE: u8 = 0x82;
    pub const COMMAND_SIZE_LIMIT_EXCEEDED: u8 = 0x83;
}

/// Media and data integrity errors (SCT 2), NVM Figure 20.
pub mod media {
    pub const WRITE_FAULT: u8 = 0x80;
    pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
    pub const GUARD_CHECK_ERROR: u8 = 0x82;
    pub const APP_TAG_CHECK_ERROR: u8 = 0x83;
    pub const REF_TAG_CHECK_ERROR: u8 = 0x84;
    pub const COMPARE_FAILURE: u8 = 0x85;
    pub const ACCESS_DENIED: u8 = 0x86;
    pub const DEALLOCATED_OR_UNWRITTEN: u8 = 0x87;
}

/// Path related status (SCT 3), Figure 105.
pub mod path {
    pub const INTERNAL_PATH_ERROR: u8 = 0x00;
    pub const ANA_PERSISTENT_LOSS: u8 = 0x01;
    pub const ANA_INACCESSIBLE: u8 = 0x02;
    pub const ANA_TRANSITION: u8 = 0x03;
    pub const CONTROLLER_PATHING_ERROR: u8 = 0x60;
    pub const HOST_PATHING_ERROR: u8 = 0x70;
    pub const ABORTED_BY_HOST: u8 = 0x71;
}

impl Status {
    pub const SUCCESS: Status = Status(0);

    /// Builds a status from type and code, with the Do Not Retry bit.
    #[inline]
    pub const fn new(sct: u8, sc: u8, dnr: bool) -> Self {
        Status((sc as u16) | ((sct as u16 & 7) << 8) | ((dnr as u16) << 14))
    }
    #[inline]
    pub const fn generic(sc: u8) -> Self {
        Status::new(sct::GENERIC, sc, true)
    }
    #[inline]
    pub const fn specific(sc: u8) -> Self {
        Status::new(sct::COMMAND_SPECIFIC, sc, true)
    }
    #[inline]
    pub const fn media(sc: u8) -> Self {
        Status::new(sct::MEDIA, sc, true)
    }
    /// Status Code.
    #[inline]
    pub const fn sc(self) -> u8 {
        self.0 as u8
    }
    /// Status Code Type.
    #[inline]
    pub const fn sct(self) -> u8 {
        ((self.0 >> 8) & 7) as u8
    }
    /// Command Retry Delay index.
    #[inline]
    pub const fn crd(self) -> u8 {
        ((self.0 >> 11) & 3) as u8
    }
    /// More information in the Error Information log.
    #[inline]
    pub const fn more(self) -> bool {
        self.0 & (1 << 13) != 0
    }
    /// Do Not Retry.
    #[inline]
    pub const fn dnr(self) -> bool {
        self.0 & (1 << 14) != 0
    }
    /// SCT and SC are both zero.
    #[inline]
    pub const fn is_success(self) -> bool {
        self.0 & 0x7FF == 0
    }
    /// Same type and code, ignoring CRD/More/DNR.
    #[inline]
    pub const fn is(self, sct: u8, sc: u8) -> bool {
        self.sct() == sct && self.sc() == sc
    }

    /// The specification's name for this status, or `None` if reserved or
    /// vendor specific.
    pub fn name(self) -> Option<&'static str> {
        Some(match (self.sct(), self.sc()) {
            (0, 0x00) => "Successful Completion",
            (0, 0x01) => "Invalid Command Opcode",
            (0, 0x02) => "Invalid Field in Command",
            (0, 0x03) => "Command ID Conflict",
            (0, 0x04) => "Data Transfer Error",
            (0, 0x05) => "Commands Aborted due to Power Loss Notification",
            (0, 0x06) => "Internal Error",
            (0, 0x07) => "Command Abort Requested",
            (0, 0x08) => "Command Aborted due to SQ Deletion",
            (0, 0x09) => "Command Aborted due to Failed Fused Command",
            (0, 0x0A) => "Command Aborted due to Missing Fused Command",
            (0, 0x0B) => "Invalid Namespace or Format",
            (0, 0x0C) => "Command Sequence Error",
            (0, 0x0D) => "Invalid SGL Segment Descriptor",
            (0, 0x0E) => "Invalid Number of SGL Descriptors",
            (0, 0x0F) => "Data SGL Length Invalid",
            (0, 0x10) => "Metadata SGL Length Invalid",
            (0, 0x11) => "SGL Descriptor Type Invalid",
            (0, 0x12) => "Invalid Use of Controller Memory Buffer",
            (0, 0x13) => "PRP Offset Invalid",
            (0, 0x14) => "Atomic Write Unit Exceeded",
            (0, 0x15) => "Operation Denied",
            (0, 0x16) => "SGL Offset Invalid",
            (0, 0x18) => "Host Identifier Inconsistent Format",
            (0, 0x19) => "Keep Alive Timer Expired",
            (0, 0x1A) => "Keep Alive Timeout Invalid",
            (0, 0x1B) => "Command Aborted due to Preempt and Abort",
            (0, 0x1C) => "Sanitize Failed",
            (0, 0x1D) => "Sanitize In Progress",
            (0, 0x1E) => "SGL Data Block Granularity Invalid",
            (0, 0x1F) => "Command Not Supported for Queue in CMB",
            (0, 0x20) => "Namespace is Write Protected",
            (0, 0x21) => "Command Interrupted",
            (0, 0x22) => "Transient Transport Error",
            (0, 0x23) => "Command Prohibited by Command and Feature Lockdown",
            (0, 0x24) => "Admin Command Media Not Ready",
            (0, 0x80) => "LBA Out of Range",
            (0, 0x81) => "Capacity Exceeded",
            (0, 0x82) => "Namespace Not Ready",
            (0, 0x83) => "Reservation Conflict",
            (0, 0x84) => "Format In Progress",
            (1, 0x00) => "Completion Queue Invalid",
            (1, 0x01) => "Invalid Queue Identifier",
            (1, 0x02) => "Invalid Queue Size",
            (1, 0x03) => "Abort Command Limit Exceeded",
            (1, 0x05) => "Asynchronous Event Request Limit Exceeded",
            (1, 0x06) => "Invalid Firmware Slot",
            (1, 0x07) => "Invalid Firmware Image",
            (1, 0x08) => "Invalid Interrupt Vector",
            (1, 0x09) => "Invalid Log Page",
            (1, 0x0A) => "Invalid Format",
            (1, 0x0B) => "Firmware Activation Requires Conventional Reset",
            (1, 0x0C) => "Invalid Queue Deletion",
            (1, 0x0D) => "Feature Identifier Not Saveable",
            (1, 0x0E) => "Feature Not Changeable",
            (1, 0x0F) => "Feature Not Namespace Specific",
            (1, 0x10) => "Firmware Activation Requires NVM Subsystem Reset",
            (1, 0x11) => "Firmware Activation Requires Controller Level Reset",
            (1, 0x12) => "Firmware Activation Requires Maximum Time Violation",
            (1, 0x13) => "Firmware Activation Prohibited",
            (1, 0x14) => "Overlapping Range",
            (1, 0x15) => "Namespace Insufficient Capacity",
            (1, 0x16) => "Namespace Identifier Unavailable",
            (1, 0x18) => "Namespace Already Attached",
            (1, 0x19) => "Namespace Is Private",
            (1, 0x1A) => "Namespace Not Attached",
            (1, 0x1B) => "Thin Provisioning Not Supported",
            (1, 0x1C) => "Controller List Invalid",
            (1, 0x1D) => "Device Self-test In Progress",
            (1, 0x1E) => "Boot Partition Write Prohibited",
            (1, 0x1F) => "Invalid Controller Identifier",
            (1, 0x20) => "Invalid Secondary Controller State",
            (1, 0x21) => "Invalid Number of Controller Resources",
            (1, 0x22) => "Invalid Resource Identifier",
            (1, 0x80) => "Conflicting Attributes",
            (1, 0x81) => "Invalid Protection Information",
            (1, 0x82) => "Attempted Write to Read Only Range",
            (1, 0x83) => "Command Size Limit Exceeded",
            (2, 0x80) => "Write Fault",
            (2, 0x81) => "Unrecovered Read Error",
            (2, 0x82) => "End-to-end Guard Check Error",
            (2, 0x83) => "End-to-end Application Tag Check Error",
            (2, 0x84) => "End-to-end Reference Tag Check Error",
            (2, 0x85) => "Compare Failure",
            (2, 0x86) => "Access Denied",
            (2, 0x87) => "Deallocated or Unwritten Logical Block",
            (3, 0x00) => "Internal Path Error",
            (3, 0x01) => "Asymmetric Access Persistent Loss",
            (3, 0x02) => "Asymmetric Access Inaccessible",
            (3, 0x03) => "Asymmetric Access Transition",
            (3, 0x60) => "Controller Pathing Error",
            (3, 0x70) => "Host Pathing Error",
            (3, 0x71) => "Command Aborted By Host",
            _ => return None,
        })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n} (sct {:#x}, sc {:#04x}", self.sct(), self.sc())?,
            None => write!(f, "status (sct {:#x}, sc {:#04x}", self.sct(), self.sc())?,
        }
        if self.dnr() {
            f.write_str(", dnr")?;
        }
        f.write_str(")")
    }
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let s = Status::new(sct::MEDIA, media::UNRECOVERED_READ_ERROR, true);
        assert_eq!(s.sct(), 2);
        assert_eq!(s.sc(), 0x81);
        assert!(s.dnr());
        assert!(!s.more());
        assert!(!s.is_success());
        assert_eq!(s.name(), Some("Unrecovered Read Error"));
        // CQE status field is (status << 1) | phase.
        assert_eq!((s.0 << 1) | 1, 0b1000_0101_0000_0011);
    }

    #[test]
    fn success_ignores_dnr() {
        assert!(Status::SUCCESS.is_success());
        assert!(Status(1 << 14).is_success());
        assert!(!Status::generic(generic::LBA_OUT_OF_RANGE).is_success());
    }

    #[test]
    fn display_names() {
        assert_eq!(
            Status::generic(generic::LBA_OUT_OF_RANGE).to_string(),
            "LBA Out of Range (sct 0x0, sc 0x80, dnr)"
        );
        assert_eq!(
            Status::new(7, 0xC0, false).to_string(),
            "status (sct 0x7, sc 0xc0)"
        );
    }

    #[test]
    fn every_named_code_has_distinct_name_within_type() {
        for sct in 0..8u8 {
            let mut seen = std::collections::HashSet::new();
            for sc in 0..=255u8 {
                if let Some(n) = Status::new(sct, sc, false).name() {
                    assert!(seen.insert(n), "duplicate name {n}");
                }
            }
        }
    }
}
