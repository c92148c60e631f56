//! Log pages (NVMe 2.0c base spec, Get Log Page command): identifiers, the Error
//! Information log entry, the SMART / Health Information log, the Firmware
//! Slot Information log, the Commands Supported and Effects log and the
//! Asymmetric Namespace Access log.
//!
//! The Changed Namespace List log page (LID 04h) has the same layout as an
//! Identify namespace ID list: use [`crate::identify::NsIdList`].
use std::borrow::Cow;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::identify::{ascii_str, set_ascii};
use crate::{assert_offset, assert_size};

mod ana;
pub use ana::*;

/// Log Page Identifiers (NVMe 2.0c base spec and NVM Command Set spec).
pub mod lid {
    pub const SUPPORTED_LOG_PAGES: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FIRMWARE_SLOT: u8 = 0x03;
    pub const CHANGED_NS_LIST: u8 = 0x04;
    pub const COMMANDS_SUPPORTED: u8 = 0x05;
    pub const DEVICE_SELF_TEST: u8 = 0x06;
    pub const TELEMETRY_HOST: u8 = 0x07;
    pub const TELEMETRY_CONTROLLER: u8 = 0x08;
    pub const ENDURANCE_GROUP_INFO: u8 = 0x09;
    pub const PREDICTABLE_LATENCY_PER_SET: u8 = 0x0A;
    pub const PREDICTABLE_LATENCY_EVENT_AGGREGATE: u8 = 0x0B;
    pub const ANA: u8 = 0x0C;
    pub const PERSISTENT_EVENT: u8 = 0x0D;
    /// LBA Status Information (NVM command set).
    pub const LBA_STATUS_INFO: u8 = 0x0E;
    pub const ENDURANCE_GROUP_EVENT_AGGREGATE: u8 = 0x0F;
    pub const MEDIA_UNIT_STATUS: u8 = 0x10;
    pub const SUPPORTED_CAPACITY_CONFIG_LIST: u8 = 0x11;
    pub const FEATURE_IDS_SUPPORTED: u8 = 0x12;
    pub const NVME_MI_COMMANDS_SUPPORTED: u8 = 0x13;
    pub const COMMAND_FEATURE_LOCKDOWN: u8 = 0x14;
    pub const BOOT_PARTITION: u8 = 0x15;
    pub const ROTATIONAL_MEDIA_INFO: u8 = 0x16;
    pub const DISCOVERY: u8 = 0x70;
    pub const RESERVATION_NOTIFICATION: u8 = 0x80;
    pub const SANITIZE_STATUS: u8 = 0x81;
}

// ---------------------------------------------------------------------------
// Error Information
// ---------------------------------------------------------------------------

/// Error Information log entry (LID 01h), NVMe 2.0c Figure 205.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct ErrorLogEntry {
    /// Error Count: unique, incrementing identifier of this error (0 = entry
    /// invalid).
    pub error_count: u64,
    /// Submission Queue ID of the failing command (FFFFh if not specific).
    pub sqid: u16,
    /// Command ID of the failing command (FFFFh if not specific).
    pub cid: u16,
    /// Bits 15:1 status field of the completion, bit 0 its phase tag.
    pub status: u16,
    /// Parameter Error Location: bits 7:0 byte, bits 10:8 bit (FFFFh if not
    /// specific).
    pub parameter_error_location: u16,
    /// First LBA that experienced the error.
    pub lba: u64,
    /// Namespace of the error.
    pub nsid: u32,
    /// Vendor Specific Information Available (log page ID, 0 = none).
    pub vs: u8,
    /// Transport Type (0 if the error is not transport related).
    pub trtype: u8,
    pub rsvd30: [u8; 2],
    /// Command Specific Information.
    pub csi: u64,
    /// Transport Type Specific Information.
    pub trtype_specific: u16,
    pub rsvd42: [u8; 22],
}

assert_size!(ErrorLogEntry, 64);
assert_offset!(ErrorLogEntry, error_count, 0);
assert_offset!(ErrorLogEntry, sqid, 8);
assert_offset!(ErrorLogEntry, cid, 10);
assert_offset!(ErrorLogEntry, status, 12);
assert_offset!(ErrorLogEntry, parameter_error_location, 14);
assert_offset!(ErrorLogEntry, lba, 16);
assert_offset!(ErrorLogEntry, nsid, 24);
assert_offset!(ErrorLogEntry, vs, 28);
assert_offset!(ErrorLogEntry, trtype, 29);
assert_offset!(ErrorLogEntry, rsvd30, 30);
assert_offset!(ErrorLogEntry, csi, 32);
assert_offset!(ErrorLogEntry, trtype_specific, 40);
assert_offset!(ErrorLogEntry, rsvd42, 42);

/// Value of SQID, CID or the parameter error location that is not specific
/// to a command or parameter.
pub const ERROR_LOG_NOT_SPECIFIC: u16 = 0xFFFF;

impl ErrorLogEntry {
    /// The completion status (without the phase tag).
    pub const fn status(&self) -> crate::Status {
        crate::Status(self.status >> 1)
    }
    /// The phase tag recorded with the status.
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }
    /// Sets the status field (bits 15:1) and phase tag (bit 0).
    pub fn set_status(&mut self, status: crate::Status, phase: bool) {
        self.status = (status.0 << 1) | phase as u16;
    }
    /// Encodes a parameter error location: `byte` within the command and
    /// `bit` (0..=7) within that byte.
    pub const fn param_location(byte: u8, bit: u8) -> u16 {
        byte as u16 | ((bit as u16 & 0x7) << 8)
    }
}

// ---------------------------------------------------------------------------
// SMART / Health Information
// ---------------------------------------------------------------------------

/// Critical Warning bits of the SMART / Health Information log.
pub mod critical_warning {
    /// Available spare capacity fell below the threshold.
    pub const SPARE_BELOW_THRESHOLD: u8 = 1 << 0;
    /// A temperature is outside its threshold.
    pub const TEMPERATURE: u8 = 1 << 1;
    /// NVM subsystem reliability degraded by media or internal errors.
    pub const RELIABILITY_DEGRADED: u8 = 1 << 2;
    /// All media placed in read-only mode.
    pub const READ_ONLY: u8 = 1 << 3;
    /// The volatile memory backup device failed.
    pub const VOLATILE_BACKUP_FAILED: u8 = 1 << 4;
    /// The Persistent Memory Region became read-only or unreliable.
    pub const PMR_READ_ONLY: u8 = 1 << 5;
}

/// SMART / Health Information log page (LID 02h), NVMe 2.0c Figure 207.
///
/// All 16-byte counters are little-endian and have `u128` accessors named
/// after the field with `set_` setters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct SmartLog {
    /// Critical Warning (`critical_warning::*`).
    pub critical_warning: u8,
    /// Composite Temperature, Kelvin (see [`SmartLog::temperature`]).
    pub temperature: [u8; 2],
    /// Available Spare, percent.
    pub avail_spare: u8,
    /// Available Spare Threshold, percent.
    pub spare_thresh: u8,
    /// Percentage Used (may exceed 100).
    pub percent_used: u8,
    /// Endurance Group Critical Warning Summary.
    pub endurance_group_critical_warning: u8,
    pub rsvd7: [u8; 25],
    /// Data Units Read, thousands of 512-byte units, rounded up.
    pub data_units_read: [u8; 16],
    /// Data Units Written, thousands of 512-byte units, rounded up.
    pub data_units_written: [u8; 16],
    /// Host Read Commands.
    pub host_read_commands: [u8; 16],
    /// Host Write Commands.
    pub host_write_commands: [u8; 16],
    /// Controller Busy Time, minutes.
    pub controller_busy_time: [u8; 16],
    /// Power Cycles.
    pub power_cycles: [u8; 16],
    /// Power On Hours.
    pub power_on_hours: [u8; 16],
    /// Unsafe Shutdowns.
    pub unsafe_shutdowns: [u8; 16],
    /// Media and Data Integrity Errors.
    pub media_errors: [u8; 16],
    /// Number of Error Information Log Entries over the controller's life.
    pub num_err_log_entries: [u8; 16],
    /// Warning Composite Temperature Time, minutes.
    pub warning_temp_time: u32,
    /// Critical Composite Temperature Time, minutes.
    pub critical_comp_time: u32,
    /// Temperature Sensors 1..=8, Kelvin (0 = not implemented).
    pub temp_sensor: [u16; 8],
    /// Thermal Management Temperature 1 Transition Count.
    pub thm_temp1_trans_count: u32,
    /// Thermal Management Temperature 2 Transition Count.
    pub thm_temp2_trans_count: u32,
    /// Total Time For Thermal Management Temperature 1, seconds.
    pub thm_temp1_total_time: u32,
    /// Total Time For Thermal Management Temperature 2, seconds.
    pub thm_temp2_total_time: u32,
    pub rsvd232: [u8; 280],
}

assert_size!(SmartLog, 512);
assert_offset!(SmartLog, critical_warning, 0);
assert_offset!(SmartLog, temperature, 1);
assert_offset!(SmartLog, avail_spare, 3);
assert_offset!(SmartLog, spare_thresh, 4);
assert_offset!(SmartLog, percent_used, 5);
assert_offset!(SmartLog, endurance_group_critical_warning, 6);
assert_offset!(SmartLog, rsvd7, 7);
assert_offset!(SmartLog, data_units_read, 32);
assert_offset!(SmartLog, data_units_written, 48);
assert_offset!(SmartLog, host_read_commands, 64);
assert_offset!(SmartLog, host_write_commands, 80);
assert_offset!(SmartLog, controller_busy_time, 96);
assert_offset!(SmartLog, power_cycles, 112);
assert_offset!(SmartLog, power_on_hours, 128);
assert_offset!(SmartLog, unsafe_shutdowns, 144);
assert_offset!(SmartLog, media_errors, 160);
assert_offset!(SmartLog, num_err_log_entries, 176);
assert_offset!(SmartLog, warning_temp_time, 192);
assert_offset!(SmartLog, critical_comp_time, 196);
assert_offset!(SmartLog, temp_sensor, 200);
assert_offset!(SmartLog, thm_temp1_trans_count, 216);
assert_offset!(SmartLog, thm_temp2_trans_count, 220);
assert_offset!(SmartLog, thm_temp1_total_time, 224);
assert_offset!(SmartLog, thm_temp2_total_time, 228);
assert_offset!(SmartLog, rsvd232, 232);

impl Default for SmartLog {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

macro_rules! u128_accessors {
    ($($field:ident, $set:ident;)*) => {
        $(
            #[doc = concat!("`", stringify!($field), "` as a `u128`.")]
            #[inline]
            pub fn $field(&self) -> u128 {
                u128::from_le_bytes(self.$field)
            }
            #[doc = concat!("Sets `", stringify!($field), "`.")]
            #[inline]
            pub fn $set(&mut self, v: u128) {
                self.$field = v.to_le_bytes();
            }
        )*
    };
}

impl SmartLog {
    u128_accessors! {
        data_units_read, set_data_units_read;
        data_units_written, set_data_units_written;
        host_read_commands, set_host_read_commands;
        host_write_commands, set_host_write_commands;
        controller_busy_time, set_controller_busy_time;
        power_cycles, set_power_cycles;
        power_on_hours, set_power_on_hours;
        unsafe_shutdowns, set_unsafe_shutdowns;
        media_errors, set_media_errors;
        num_err_log_entries, set_num_err_log_entries;
    }

    /// Composite Temperature in Kelvin.
    #[inline]
    pub fn temperature(&self) -> u16 {
        u16::from_le_bytes(self.temperature)
    }
    /// Sets the Composite Temperature (Kelvin).
    #[inline]
    pub fn set_temperature(&mut self, kelvin: u16) {
        self.temperature = kelvin.to_le_bytes();
    }
}

/// Data Units Read/Written value for `bytes` bytes transferred: the number of
/// 512-byte units in thousands, rounded up (1 means 1 to 1,000 units; 0 only
/// for 0 bytes). Equals `ceil(bytes / 512 / 1000)`.
pub const fn data_units(bytes: u64) -> u128 {
    bytes.div_ceil(512 * 1000) as u128
}

// ---------------------------------------------------------------------------
// Firmware Slot Information
// ---------------------------------------------------------------------------

/// Firmware Slot Information log page (LID 03h), NVMe 2.0c.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct FirmwareSlotLog {
    /// Active Firmware Info: bits 2:0 active slot, bits 6:4 slot activated
    /// at the next reset (0 = none).
    pub afi: u8,
    pub rsvd1: [u8; 7],
    /// Firmware Revision for slots 1..=7 (ASCII; all zero if empty or the
    /// slot is unsupported).
    pub frs: [[u8; 8]; 7],
    pub rsvd64: [u8; 448],
}

assert_size!(FirmwareSlotLog, 512);
assert_offset!(FirmwareSlotLog, afi, 0);
assert_offset!(FirmwareSlotLog, rsvd1, 1);
assert_offset!(FirmwareSlotLog, frs, 8);
assert_offset!(FirmwareSlotLog, rsvd64, 64);

impl Default for FirmwareSlotLog {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl FirmwareSlotLog {
    /// The slot (1..=7) the running firmware was loaded from.
    pub const fn active_slot(&self) -> u8 {
        self.afi & 0x7
    }
    /// The slot to be activated at the next controller reset, if any.
    pub const fn next_slot(&self) -> Option<u8> {
        match (self.afi >> 4) & 0x7 {
            0 => None,
            s => Some(s),
        }
    }
    /// Sets AFI from the active slot and the optional next-reset slot.
    pub fn set_afi(&mut self, active: u8, next: Option<u8>) {
        self.afi = (active & 0x7) | ((next.unwrap_or(0) & 0x7) << 4);
    }
    /// Firmware revision in `slot` (1..=7); `None` for an invalid slot number.
    pub fn revision(&self, slot: u8) -> Option<Cow<'_, str>> {
        let i = (slot as usize).checked_sub(1)?;
        self.frs.get(i).map(|r| ascii_str(r))
    }
    /// Stores `rev` (space padded) as the revision of `slot` (1..=7).
    /// Returns `false` for an invalid slot number.
    pub fn set_revision(&mut self, slot: u8, rev: &str) -> bool {
        match (slot as usize)
            .checked_sub(1)
            .and_then(|i| self.frs.get_mut(i))
        {
            Some(r) => {
                set_ascii(r, rev);
                true
            }
            None => false,
        }
    }
}

// ---------------------------------------------------------------------------
// Commands Supported and Effects
// ---------------------------------------------------------------------------

/// Commands Supported and Effects log page (LID 05h), NVMe 2.0c:
/// one effects dword per admin opcode and per I/O opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct CommandEffectsLog {
    /// Admin Command Supported, indexed by opcode.
    pub acs: [u32; 256],
    /// I/O Command Supported, indexed by opcode.
    pub iocs: [u32; 256],
    pub rsvd2048: [u8; 2048],
}

assert_size!(CommandEffectsLog, 4096);
assert_offset!(CommandEffectsLog, acs, 0);
assert_offset!(CommandEffectsLog, iocs, 1024);
assert_offset!(CommandEffectsLog, rsvd2048, 2048);

impl Default for CommandEffectsLog {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Commands Supported and Effects data structure bits.
pub mod effects {
    /// Command Supported.
    pub const CSUPP: u32 = 1 << 0;
    /// Logical Block Content Change.
    pub const LBCC: u32 = 1 << 1;
    /// Namespace Capability Change.
    pub const NCC: u32 = 1 << 2;
    /// Namespace Inventory Change.
    pub const NIC: u32 = 1 << 3;
    /// Controller Capability Change.
    pub const CCC: u32 = 1 << 4;
    /// Command Submission and Execution, bits 18:16.
    pub const CSE_SHIFT: u32 = 16;
    pub const CSE_MASK: u32 = 0x7 << CSE_SHIFT;
    /// CSE: may be submitted only when no other command to the same
    /// namespace is outstanding.
    pub const CSE_NS_EXCLUSIVE: u32 = 1 << CSE_SHIFT;
    /// CSE: may be submitted only when no other command to any namespace is
    /// outstanding.
    pub const CSE_SUBSYSTEM_EXCLUSIVE: u32 = 2 << CSE_SHIFT;
    /// UUID Selection Supported.
    pub const UUID_SELECTION: u32 = 1 << 19;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{generic, sct};

    #[test]
    fn error_log_entry_layout() {
        let mut e = ErrorLogEntry {
            error_count: 0x0102_0304_0506_0708,
            sqid: 3,
            cid: 0xABCD,
            parameter_error_location: ErrorLogEntry::param_location(44, 3),
            lba: 0x1000,
            nsid: 1,
            trtype: 0,
            csi: 0xDEAD_BEEF,
            trtype_specific: 0x77,
            ..Default::default()
        };
        let st = crate::Status::new(sct::GENERIC, generic::LBA_OUT_OF_RANGE, true);
        e.set_status(st, true);
        assert_eq!(e.status(), st);
        assert!(e.phase());

        let b = e.as_bytes();
        assert_eq!(b.len(), 64);
        assert_eq!(&b[0..8], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&b[8..10], &3u16.to_le_bytes());
        assert_eq!(&b[10..12], &0xABCDu16.to_le_bytes());
        assert_eq!(&b[12..14], &((st.0 << 1) | 1).to_le_bytes());
        assert_eq!(&b[14..16], &[44, 3]);
        assert_eq!(&b[16..24], &0x1000u64.to_le_bytes());
        assert_eq!(&b[24..28], &1u32.to_le_bytes());
        assert_eq!(&b[32..40], &0xDEAD_BEEFu64.to_le_bytes());
        assert_eq!(&b[40..42], &0x77u16.to_le_bytes());
        assert_eq!(ErrorLogEntry::read_from_bytes(b).unwrap(), e);
    }

    #[test]
    fn smart_log_layout() {
        let mut s = SmartLog {
            critical_warning: critical_warning::TEMPERATURE,
            avail_spare: 100,
            spare_thresh: 10,
            percent_used: 3,
            warning_temp_time: 7,
            critical_comp_time: 8,
            thm_temp2_total_time: 0x1234,
            ..Default::default()
        };
        s.set_temperature(310);
        s.set_data_units_read(0x11);
        s.set_data_units_written(0x22);
        s.set_host_read_commands(u128::MAX - 1);
        s.set_host_write_commands(0x44);
        s.set_power_on_hours(0x55);
        s.set_num_err_log_entries(0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10);
        s.temp_sensor[0] = 300;
        s.temp_sensor[7] = 301;

        let b = s.as_bytes();
        assert_eq!(b.len(), 512);
        assert_eq!(b[0], 0x02);
        assert_eq!(&b[1..3], &310u16.to_le_bytes());
        assert_eq!(&b[3..6], &[100, 10, 3]);
        assert_eq!(b[32], 0x11);
        assert_eq!(b[48], 0x22);
        assert_eq!(&b[64..80], &(u128::MAX - 1).to_le_bytes());
        assert_eq!(b[80], 0x44);
        assert_eq!(b[128], 0x55);
        assert_eq!(b[176], 0x10);
        assert_eq!(b[191], 0x01);
        assert_eq!(&b[192..196], &7u32.to_le_bytes());
        assert_eq!(&b[196..200], &8u32.to_le_bytes());
        assert_eq!(&b[200..202], &300u16.to_le_bytes());
        assert_eq!(&b[214..216], &301u16.to_le_bytes());
        assert_eq!(&b[228..232], &0x1234u32.to_le_bytes());

        let back = SmartLog::read_from_bytes(b).unwrap();
        assert_eq!(back.temperature(), 310);
        assert_eq!(back.host_read_commands(), u128::MAX - 1);
        assert_eq!(
            back.num_err_log_entries(),
            0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10
        );
        assert_eq!(back, s);
    }

    #[test]
    fn data_units_round_up() {
        assert_eq!(data_units(0), 0);
        assert_eq!(data_units(1), 1);
        assert_eq!(data_units(512), 1);
        assert_eq!(data_units(512_000), 1);
        assert_eq!(data_units(512_001), 2);
        assert_eq!(data_units(1_024_000), 2);
        assert_eq!(data_units(u64::MAX), (u64::MAX as u128).div_ceil(512_000));
    }

    #[test]
    fn firmware_slot_log_layout() {
        let mut f = FirmwareSlotLog::default();
        f.set_afi(1, Some(2));
        assert!(f.set_revision(1, "1.0.0"));
        assert!(f.set_revision(7, "LASTSLOT9"));
        assert!(!f.set_revision(0, "x"));
        assert!(!f.set_revision(8, "x"));
        let b = f.as_bytes();
        assert_eq!(b.len(), 512);
        assert_eq!(b[0], 0x21);
        assert_eq!(&b[8..16], b"1.0.0   ");
        assert_eq!(&b[56..64], b"LASTSLOT");
        assert_eq!(f.active_slot(), 1);
        assert_eq!(f.next_slot(), Some(2));
        assert_eq!(f.revision(1).as_deref(), Some("1.0.0"));
        assert_eq!(f.revision(2).as_deref(), Some(""));
        assert_eq!(f.revision(0), None);
        assert_eq!(f.revision(8), None);
        f.set_afi(3, None);
        assert_eq!(f.next_slot(), None);
    }

    #[test]
    fn command_effects_layout() {
        let mut l = CommandEffectsLog::default();
        l.acs[0x06] = effects::CSUPP;
        l.iocs[0x01] = effects::CSUPP | effects::LBCC;
        let b = l.as_bytes();
        assert_eq!(&b[0x06 * 4..0x06 * 4 + 4], &1u32.to_le_bytes());
        assert_eq!(&b[1024 + 4..1024 + 8], &3u32.to_le_bytes());
    }
}
