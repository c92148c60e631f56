//! Identify data structures: Identify Controller (NVMe 2.0c base spec
//! Figure 275) with its Power State Descriptors (Figure 276), Identify
//! Namespace for the NVM command set (NVM Command Set spec 1.0 Figure 97)
//! with its LBA Format descriptors, namespace ID lists and the Namespace
//! Identification Descriptor list (CNS 03h).
//!
//! Multi-byte integers are little-endian on the wire; the crate refuses to
//! build on a big-endian host, so native integers are used wherever the
//! specification places a field on its natural alignment. 128-bit values and
//! unaligned fields are byte arrays with accessors.
use std::borrow::Cow;
use std::fmt;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

/// Size of every Identify data structure returned by the Identify command.
pub const IDENTIFY_DATA_SIZE: usize = 4096;

// ---------------------------------------------------------------------------
// ASCII helpers
// ---------------------------------------------------------------------------

/// Fills `dst` with `s`, left-justified and padded with ASCII spaces (0x20),
/// the encoding the specification uses for SN, MN, FR and similar fields.
///
/// `s` is truncated to `dst.len()` bytes. Characters outside printable ASCII
/// (0x20..=0x7E) are replaced by `?` so that the field is always ASCII.
pub fn set_ascii(dst: &mut [u8], s: &str) {
    dst.fill(b' ');
    for (d, c) in dst.iter_mut().zip(s.chars()) {
        *d = if (' '..='~').contains(&c) {
            c as u8
        } else {
            b'?'
        };
    }
}

/// Reads a space-padded (or NUL-padded) ASCII/UTF-8 field, trimming leading
/// and trailing spaces and NULs. Invalid UTF-8 is replaced with U+FFFD; this
/// never panics.
pub fn ascii_str(src: &[u8]) -> Cow<'_, str> {
    // A NUL-terminated field (e.g. SUBNQN) ends at the first NUL.
    let end = src.iter().position(|&b| b == 0).unwrap_or(src.len());
    let trim = |c: char| c == ' ' || c == '\0';
    match String::from_utf8_lossy(&src[..end]) {
        Cow::Borrowed(s) => Cow::Borrowed(s.trim_matches(trim)),
        Cow::Owned(s) => Cow::Owned(s.trim_matches(trim).to_owned()),
    }
}

/// Writes a NUL-terminated UTF-8 string (e.g. an NQN) into `dst`, zero-filling
/// the rest. At most `dst.len() - 1` bytes of `s` are copied, cut at a
/// character boundary, so the field is always NUL-terminated.
pub fn set_nul_terminated(dst: &mut [u8], s: &str) {
    dst.fill(0);
    let Some(max) = dst.len().checked_sub(1) else {
        return;
    };
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    dst[..n].copy_from_slice(&s.as_bytes()[..n]);
}

// ---------------------------------------------------------------------------
// Identify Controller
// ---------------------------------------------------------------------------

/// OACS bit 0: Security Send and Security Receive commands.
pub const OACS_SECURITY: u16 = 1 << 0;
/// OACS bit 1: Format NVM command.
pub const OACS_FORMAT_NVM: u16 = 1 << 1;
/// OACS bit 2: Firmware Commit and Firmware Image Download commands.
pub const OACS_FIRMWARE: u16 = 1 << 2;
/// OACS bit 3: Namespace Management capability.
pub const OACS_NS_MANAGEMENT: u16 = 1 << 3;
/// OACS bit 4: Device Self-test command.
pub const OACS_SELF_TEST: u16 = 1 << 4;
/// OACS bit 5: Directives.
pub const OACS_DIRECTIVES: u16 = 1 << 5;
/// OACS bit 6: NVMe-MI Send and NVMe-MI Receive commands.
pub const OACS_NVME_MI: u16 = 1 << 6;
/// OACS bit 7: Virtualization Management command.
pub const OACS_VIRTUALIZATION: u16 = 1 << 7;
/// OACS bit 8: Doorbell Buffer Config command.
pub const OACS_DBBUF_CONFIG: u16 = 1 << 8;
/// OACS bit 9: Get LBA Status capability.
pub const OACS_GET_LBA_STATUS: u16 = 1 << 9;
/// OACS bit 10: Command and Feature Lockdown capability.
pub const OACS_LOCKDOWN: u16 = 1 << 10;

/// ONCS bit 0: Compare command.
pub const ONCS_COMPARE: u16 = 1 << 0;
/// ONCS bit 1: Write Uncorrectable command.
pub const ONCS_WRITE_UNCORRECTABLE: u16 = 1 << 1;
/// ONCS bit 2: Dataset Management command.
pub const ONCS_DSM: u16 = 1 << 2;
/// ONCS bit 3: Write Zeroes command.
pub const ONCS_WRITE_ZEROES: u16 = 1 << 3;
/// ONCS bit 4: non-zero Save field in Set Features and Select field in Get
/// Features.
pub const ONCS_SAVE_SELECT: u16 = 1 << 4;
/// ONCS bit 5: reservations.
pub const ONCS_RESERVATIONS: u16 = 1 << 5;
/// ONCS bit 6: Timestamp feature.
pub const ONCS_TIMESTAMP: u16 = 1 << 6;
/// ONCS bit 7: Verify command.
pub const ONCS_VERIFY: u16 = 1 << 7;
/// ONCS bit 8: Copy command.
pub const ONCS_COPY: u16 = 1 << 8;

/// VWC bit 0: a volatile write cache is present.
pub const VWC_PRESENT: u8 = 1 << 0;
/// VWC bits 2:1: Flush behaviour for NSID FFFFFFFFh.
pub const VWC_FLUSH_BROADCAST_MASK: u8 = 0b11 << 1;
/// VWC bits 2:1 = 10b: Flush with NSID FFFFFFFFh is not supported.
pub const VWC_FLUSH_BROADCAST_UNSUPPORTED: u8 = 0b10 << 1;
/// VWC bits 2:1 = 11b: Flush with NSID FFFFFFFFh is supported.
pub const VWC_FLUSH_BROADCAST_SUPPORTED: u8 = 0b11 << 1;

/// LPA bit 0: SMART / Health log page on a per-namespace basis.
pub const LPA_SMART_PER_NS: u8 = 1 << 0;
/// LPA bit 1: Commands Supported and Effects log page.
pub const LPA_COMMANDS_EFFECTS: u8 = 1 << 1;
/// LPA bit 2: extended data for Get Log Page (NUMDU, LPOL/LPOU).
pub const LPA_EXTENDED_DATA: u8 = 1 << 2;
/// LPA bit 3: Telemetry Host-Initiated and Controller-Initiated log pages.
pub const LPA_TELEMETRY: u8 = 1 << 3;
/// LPA bit 4: Persistent Event log page.
pub const LPA_PERSISTENT_EVENT: u8 = 1 << 4;
/// LPA bit 5: Supported Log Pages, Commands Supported and Effects, Feature
/// Identifiers Supported and Effects and NVMe-MI Commands Supported and
/// Effects log pages (LIDs 00h, 05h, 12h, 13h).
pub const LPA_SUPPORTED_EFFECTS: u8 = 1 << 5;
/// LPA bit 6: Telemetry Data Area 4.
pub const LPA_TELEMETRY_DA4: u8 = 1 << 6;

/// CMIC bit 0: the NVM subsystem may have more than one port.
pub const CMIC_MULTI_PORT: u8 = 1 << 0;
/// CMIC bit 1: the NVM subsystem may have more than one controller.
pub const CMIC_MULTI_CONTROLLER: u8 = 1 << 1;
/// CMIC bit 2: the controller is an SR-IOV virtual function.
pub const CMIC_SRIOV: u8 = 1 << 2;
/// CMIC bit 3: Asymmetric Namespace Access reporting.
pub const CMIC_ANA: u8 = 1 << 3;

/// OAES bit 8: Namespace Attribute Notices.
pub const OAES_NS_ATTR: u32 = 1 << 8;
/// OAES bit 9: Firmware Activation Notices.
pub const OAES_FW_ACTIVATION: u32 = 1 << 9;
/// OAES bit 11: Asymmetric Namespace Access Change Notices.
pub const OAES_ANA_CHANGE: u32 = 1 << 11;
/// OAES bit 12: Predictable Latency Event Aggregate Log Change Notices.
pub const OAES_PLEA: u32 = 1 << 12;
/// OAES bit 13: LBA Status Information Alert Notices.
pub const OAES_LBA_STATUS: u32 = 1 << 13;
/// OAES bit 14: Endurance Group Event Aggregate Log Page Change Notices.
pub const OAES_EG_EVENT: u32 = 1 << 14;
/// OAES bit 31: Discovery Log Page Change Notification.
pub const OAES_DISCOVERY_LOG_CHANGE: u32 = 1 << 31;

/// FUSES bit 0: Compare and Write fused operation.
pub const FUSES_COMPARE_AND_WRITE: u16 = 1 << 0;

/// SGLS bits 1:0 = 01b: SGLs supported, no alignment requirement.
pub const SGLS_SUPPORTED: u32 = 0b01;
/// SGLS bits 1:0 = 10b: SGLs supported, dword alignment required.
pub const SGLS_SUPPORTED_DWORD_ALIGNED: u32 = 0b10;

/// CNTRLTYPE: I/O controller.
pub const CNTRLTYPE_IO: u8 = 1;
/// CNTRLTYPE: Discovery controller.
pub const CNTRLTYPE_DISCOVERY: u8 = 2;
/// CNTRLTYPE: Administrative controller.
pub const CNTRLTYPE_ADMIN: u8 = 3;

/// Identify Controller data structure (CNS 01h), NVMe 2.0c Figure 275.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyController {
    /// PCI Vendor ID.
    pub vid: u16,
    /// PCI Subsystem Vendor ID.
    pub ssvid: u16,
    /// Serial Number (ASCII, space padded).
    pub sn: [u8; 20],
    /// Model Number (ASCII, space padded).
    pub mn: [u8; 40],
    /// Firmware Revision (ASCII, space padded).
    pub fr: [u8; 8],
    /// Recommended Arbitration Burst (power of two).
    pub rab: u8,
    /// IEEE OUI Identifier, least significant byte first.
    pub ieee: [u8; 3],
    /// Controller Multi-Path I/O and Namespace Sharing Capabilities
    /// (`CMIC_*`).
    pub cmic: u8,
    /// Maximum Data Transfer Size: `2 ^ mdts` units of CAP.MPSMIN; 0 = no
    /// limit.
    pub mdts: u8,
    /// Controller ID.
    pub cntlid: u16,
    /// Version (same encoding as the VS register).
    pub ver: u32,
    /// RTD3 Resume Latency, microseconds.
    pub rtd3r: u32,
    /// RTD3 Entry Latency, microseconds.
    pub rtd3e: u32,
    /// Optional Asynchronous Events Supported (`OAES_*`).
    pub oaes: u32,
    /// Controller Attributes.
    pub ctratt: u32,
    /// Read Recovery Levels Supported.
    pub rrls: u16,
    pub rsvd102: [u8; 9],
    /// Controller Type (`CNTRLTYPE_*`).
    pub cntrltype: u8,
    /// FRU Globally Unique Identifier.
    pub fguid: [u8; 16],
    /// Command Retry Delay Time 1, 100 ms units.
    pub crdt1: u16,
    /// Command Retry Delay Time 2, 100 ms units.
    pub crdt2: u16,
    /// Command Retry Delay Time 3, 100 ms units.
    pub crdt3: u16,
    pub rsvd134: [u8; 106],
    /// Bytes 252:240, reserved by the NVMe-MI specification.
    pub rsvd240: [u8; 13],
    /// NVM Subsystem Report (NVMe-MI).
    pub nvmsr: u8,
    /// VPD Write Cycle Information (NVMe-MI).
    pub vwci: u8,
    /// Management Endpoint Capabilities (NVMe-MI).
    pub mec: u8,
    /// Optional Admin Command Support (`OACS_*`).
    pub oacs: u16,
    /// Abort Command Limit, 0's based.
    pub acl: u8,
    /// Asynchronous Event Request Limit, 0's based.
    pub aerl: u8,
    /// Firmware Updates.
    pub frmw: u8,
    /// Log Page Attributes (`LPA_*`).
    pub lpa: u8,
    /// Error Log Page Entries, 0's based.
    pub elpe: u8,
    /// Number of Power States Support, 0's based.
    pub npss: u8,
    /// Admin Vendor Specific Command Configuration.
    pub avscc: u8,
    /// Autonomous Power State Transition Attributes.
    pub apsta: u8,
    /// Warning Composite Temperature Threshold, Kelvin.
    pub wctemp: u16,
    /// Critical Composite Temperature Threshold, Kelvin.
    pub cctemp: u16,
    /// Maximum Time for Firmware Activation, 100 ms units.
    pub mtfa: u16,
    /// Host Memory Buffer Preferred Size, 4 KiB units.
    pub hmpre: u32,
    /// Host Memory Buffer Minimum Size, 4 KiB units.
    pub hmmin: u32,
    /// Total NVM Capacity, bytes (see [`IdentifyController::tnvmcap`]).
    pub tnvmcap: [u8; 16],
    /// Unallocated NVM Capacity, bytes.
    pub unvmcap: [u8; 16],
    /// Replay Protected Memory Block Support.
    pub rpmbs: u32,
    /// Extended Device Self-test Time, minutes.
    pub edstt: u16,
    /// Device Self-test Options.
    pub dsto: u8,
    /// Firmware Update Granularity, 4 KiB units.
    pub fwug: u8,
    /// Keep Alive Support, 100 ms granularity.
    pub kas: u16,
    /// Host Controlled Thermal Management Attributes.
    pub hctma: u16,
    /// Minimum Thermal Management Temperature, Kelvin.
    pub mntmt: u16,
    /// Maximum Thermal Management Temperature, Kelvin.
    pub mxtmt: u16,
    /// Sanitize Capabilities.
    pub sanicap: u32,
    /// Host Memory Buffer Minimum Descriptor Entry Size, 4 KiB units.
    pub hmminds: u32,
    /// Host Memory Maximum Descriptors Entries.
    pub hmmaxd: u16,
    /// NVM Set Identifier Maximum.
    pub nsetidmax: u16,
    /// Endurance Group Identifier Maximum.
    pub endgidmax: u16,
    /// ANA Transition Time, seconds.
    pub anatt: u8,
    /// Asymmetric Namespace Access Capabilities.
    pub anacap: u8,
    /// ANA Group Identifier Maximum.
    pub anagrpmax: u32,
    /// Number of ANA Group Identifiers.
    pub nanagrpid: u32,
    /// Persistent Event Log Size, 64 KiB units.
    pub pels: u32,
    /// Domain Identifier.
    pub domainid: u16,
    pub rsvd358: [u8; 10],
    /// Max Endurance Group Capacity, bytes.
    pub megcap: [u8; 16],
    pub rsvd384: [u8; 128],
    /// Submission Queue Entry Size: bits 3:0 required, 7:4 maximum (log2).
    pub sqes: u8,
    /// Completion Queue Entry Size: bits 3:0 required, 7:4 maximum (log2).
    pub cqes: u8,
    /// Maximum Outstanding Commands (fabrics).
    pub maxcmd: u16,
    /// Number of Namespaces (maximum valid NSID).
    pub nn: u32,
    /// Optional NVM Command Support (`ONCS_*`).
    pub oncs: u16,
    /// Fused Operation Support (`FUSES_*`).
    pub fuses: u16,
    /// Format NVM Attributes.
    pub fna: u8,
    /// Volatile Write Cache (`VWC_*`).
    pub vwc: u8,
    /// Atomic Write Unit Normal, logical blocks, 0's based.
    pub awun: u16,
    /// Atomic Write Unit Power Fail, logical blocks, 0's based.
    pub awupf: u16,
    /// I/O Command Set Vendor Specific Command Configuration.
    pub icsvscc: u8,
    /// Namespace Write Protection Capabilities.
    pub nwpc: u8,
    /// Atomic Compare & Write Unit, logical blocks, 0's based.
    pub acwu: u16,
    /// Copy Formats Supported.
    pub ocfs: u16,
    /// SGL Support.
    pub sgls: u32,
    /// Maximum Number of Allowed Namespaces.
    pub mnan: u32,
    /// Maximum Domain Namespace Attachments.
    pub maxdna: [u8; 16],
    /// Maximum I/O Controller Namespace Attachments.
    pub maxcna: u32,
    pub rsvd564: [u8; 204],
    /// NVM Subsystem NVMe Qualified Name (UTF-8, NUL terminated).
    pub subnqn: [u8; 256],
    pub rsvd1024: [u8; 768],
    /// I/O Queue Command Capsule Supported Size, 16-byte units (fabrics).
    pub ioccsz: u32,
    /// I/O Queue Response Capsule Supported Size, 16-byte units (fabrics).
    pub iorcsz: u32,
    /// In Capsule Data Offset, 16-byte units (fabrics).
    pub icdoff: u16,
    /// Fabrics Controller Attributes.
    pub fcatt: u8,
    /// Maximum SGL Data Block Descriptors (fabrics).
    pub msdbd: u8,
    /// Optional Fabric Commands Support.
    pub ofcs: u16,
    pub rsvd1806: [u8; 242],
    /// Power State Descriptors 0..=31.
    pub psd: [PowerStateDescriptor; 32],
    /// Vendor Specific.
    pub vs: [u8; 1024],
}

assert_size!(IdentifyController, 4096);
assert_offset!(IdentifyController, vid, 0);
assert_offset!(IdentifyController, ssvid, 2);
assert_offset!(IdentifyController, sn, 4);
assert_offset!(IdentifyController, mn, 24);
assert_offset!(IdentifyController, fr, 64);
assert_offset!(IdentifyController, rab, 72);
assert_offset!(IdentifyController, ieee, 73);
assert_offset!(IdentifyController, cmic, 76);
assert_offset!(IdentifyController, mdts, 77);
assert_offset!(IdentifyController, cntlid, 78);
assert_offset!(IdentifyController, ver, 80);
assert_offset!(IdentifyController, rtd3r, 84);
assert_offset!(IdentifyController, rtd3e, 88);
assert_offset!(IdentifyController, oaes, 92);
assert_offset!(IdentifyController, ctratt, 96);
assert_offset!(IdentifyController, rrls, 100);
assert_offset!(IdentifyController, rsvd102, 102);
assert_offset!(IdentifyController, cntrltype, 111);
assert_offset!(IdentifyController, fguid, 112);
assert_offset!(IdentifyController, crdt1, 128);
assert_offset!(IdentifyController, crdt2, 130);
assert_offset!(IdentifyController, crdt3, 132);
assert_offset!(IdentifyController, rsvd134, 134);
assert_offset!(IdentifyController, rsvd240, 240);
assert_offset!(IdentifyController, nvmsr, 253);
assert_offset!(IdentifyController, vwci, 254);
assert_offset!(IdentifyController, mec, 255);
assert_offset!(IdentifyController, oacs, 256);
assert_offset!(IdentifyController, acl, 258);
assert_offset!(IdentifyController, aerl, 259);
assert_offset!(IdentifyController, frmw, 260);
assert_offset!(IdentifyController, lpa, 261);
assert_offset!(IdentifyController, elpe, 262);
assert_offset!(IdentifyController, npss, 263);
assert_offset!(IdentifyController, avscc, 264);
assert_offset!(IdentifyController, apsta, 265);
assert_offset!(IdentifyController, wctemp, 266);
assert_offset!(IdentifyController, cctemp, 268);
assert_offset!(IdentifyController, mtfa, 270);
assert_offset!(IdentifyController, hmpre, 272);
assert_offset!(IdentifyController, hmmin, 276);
assert_offset!(IdentifyController, tnvmcap, 280);
assert_offset!(IdentifyController, unvmcap, 296);
assert_offset!(IdentifyController, rpmbs, 312);
assert_offset!(IdentifyController, edstt, 316);
assert_offset!(IdentifyController, dsto, 318);
assert_offset!(IdentifyController, fwug, 319);
assert_offset!(IdentifyController, kas, 320);
assert_offset!(IdentifyController, hctma, 322);
assert_offset!(IdentifyController, mntmt, 324);
assert_offset!(IdentifyController, mxtmt, 326);
assert_offset!(IdentifyController, sanicap, 328);
assert_offset!(IdentifyController, hmminds, 332);
assert_offset!(IdentifyController, hmmaxd, 336);
assert_offset!(IdentifyController, nsetidmax, 338);
assert_offset!(IdentifyController, endgidmax, 340);
assert_offset!(IdentifyController, anatt, 342);
assert_offset!(IdentifyController, anacap, 343);
assert_offset!(IdentifyController, anagrpmax, 344);
assert_offset!(IdentifyController, nanagrpid, 348);
assert_offset!(IdentifyController, pels, 352);
assert_offset!(IdentifyController, domainid, 356);
assert_offset!(IdentifyController, rsvd358, 358);
assert_offset!(IdentifyController, megcap, 368);
assert_offset!(IdentifyController, rsvd384, 384);
assert_offset!(IdentifyController, sqes, 512);
assert_offset!(IdentifyController, cqes, 513);
assert_offset!(IdentifyController, maxcmd, 514);
assert_offset!(IdentifyController, nn, 516);
assert_offset!(IdentifyController, oncs, 520);
assert_offset!(IdentifyController, fuses, 522);
assert_offset!(IdentifyController, fna, 524);
assert_offset!(IdentifyController, vwc, 525);
assert_offset!(IdentifyController, awun, 526);
assert_offset!(IdentifyController, awupf, 528);
assert_offset!(IdentifyController, icsvscc, 530);
assert_offset!(IdentifyController, nwpc, 531);
assert_offset!(IdentifyController, acwu, 532);
assert_offset!(IdentifyController, ocfs, 534);
assert_offset!(IdentifyController, sgls, 536);
assert_offset!(IdentifyController, mnan, 540);
assert_offset!(IdentifyController, maxdna, 544);
assert_offset!(IdentifyController, maxcna, 560);
assert_offset!(IdentifyController, rsvd564, 564);
assert_offset!(IdentifyController, subnqn, 768);
assert_offset!(IdentifyController, rsvd1024, 1024);
assert_offset!(IdentifyController, ioccsz, 1792);
assert_offset!(IdentifyController, iorcsz, 1796);
assert_offset!(IdentifyController, icdoff, 1800);
assert_offset!(IdentifyController, fcatt, 1802);
assert_offset!(IdentifyController, msdbd, 1803);
assert_offset!(IdentifyController, ofcs, 1804);
assert_offset!(IdentifyController, rsvd1806, 1806);
assert_offset!(IdentifyController, psd, 2048);
assert_offset!(IdentifyController, vs, 3072);

impl Default for IdentifyController {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl IdentifyController {
    /// Serial number, trimmed.
    pub fn serial(&self) -> Cow<'_, str> {
        ascii_str(&self.sn)
    }
    /// Sets the serial number (space padded, truncated to 20 bytes).
    pub fn set_serial(&mut self, s: &str) {
        set_ascii(&mut self.sn, s);
    }
    /// Model number, trimmed.
    pub fn model(&self) -> Cow<'_, str> {
        ascii_str(&self.mn)
    }
    /// Sets the model number (space padded, truncated to 40 bytes).
    pub fn set_model(&mut self, s: &str) {
        set_ascii(&mut self.mn, s);
    }
    /// Firmware revision, trimmed.
    pub fn firmware_rev(&self) -> Cow<'_, str> {
        ascii_str(&self.fr)
    }
    /// Sets the firmware revision (space padded, truncated to 8 bytes).
    pub fn set_firmware_rev(&mut self, s: &str) {
        set_ascii(&mut self.fr, s);
    }
    /// Subsystem NQN, up to its NUL terminator.
    pub fn subnqn_str(&self) -> Cow<'_, str> {
        ascii_str(&self.subnqn)
    }
    /// Sets the subsystem NQN (NUL terminated, at most 255 bytes).
    pub fn set_subnqn(&mut self, s: &str) {
        set_nul_terminated(&mut self.subnqn, s);
    }

    /// Total NVM Capacity in bytes.
    pub fn tnvmcap(&self) -> u128 {
        u128::from_le_bytes(self.tnvmcap)
    }
    pub fn set_tnvmcap(&mut self, v: u128) {
        self.tnvmcap = v.to_le_bytes();
    }
    /// Unallocated NVM Capacity in bytes.
    pub fn unvmcap(&self) -> u128 {
        u128::from_le_bytes(self.unvmcap)
    }
    pub fn set_unvmcap(&mut self, v: u128) {
        self.unvmcap = v.to_le_bytes();
    }
    /// Max Endurance Group Capacity in bytes.
    pub fn megcap(&self) -> u128 {
        u128::from_le_bytes(self.megcap)
    }
    pub fn set_megcap(&mut self, v: u128) {
        self.megcap = v.to_le_bytes();
    }
    /// Maximum Domain Namespace Attachments.
    pub fn maxdna(&self) -> u128 {
        u128::from_le_bytes(self.maxdna)
    }
    pub fn set_maxdna(&mut self, v: u128) {
        self.maxdna = v.to_le_bytes();
    }

    /// Maximum data transfer size in bytes given the controller's minimum
    /// memory page size (`2 ^ (12 + CAP.MPSMIN)`); `None` means no limit.
    pub fn max_transfer_bytes(&self, mpsmin_bytes: u64) -> Option<u64> {
        if self.mdts == 0 {
            None
        } else {
            Some(
                mpsmin_bytes
                    .checked_shl(self.mdts as u32)
                    .unwrap_or(u64::MAX),
            )
        }
    }

    /// Required (minimum) SQ entry size in bytes (`2 ^ SQES[3:0]`).
    pub fn sqe_size_required(&self) -> usize {
        1usize << (self.sqes & 0xF)
    }
    /// Required (minimum) CQ entry size in bytes (`2 ^ CQES[3:0]`).
    pub fn cqe_size_required(&self) -> usize {
        1usize << (self.cqes & 0xF)
    }
}

/// Power State Descriptor, NVMe 2.0c Figure 276.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct PowerStateDescriptor {
    /// Maximum Power, in 0.01 W (MXPS = 0) or 0.0001 W (MXPS = 1) units.
    pub mp: u16,
    pub rsvd2: u8,
    /// Bit 0 MXPS (Max Power Scale), bit 1 NOPS (Non-Operational State).
    pub flags: u8,
    /// Entry Latency, microseconds.
    pub enlat: u32,
    /// Exit Latency, microseconds.
    pub exlat: u32,
    /// Bits 4:0 Relative Read Throughput.
    pub rrt: u8,
    /// Bits 4:0 Relative Read Latency.
    pub rrl: u8,
    /// Bits 4:0 Relative Write Throughput.
    pub rwt: u8,
    /// Bits 4:0 Relative Write Latency.
    pub rwl: u8,
    /// Idle Power.
    pub idlp: u16,
    /// Bits 7:6 Idle Power Scale.
    pub ips: u8,
    pub rsvd19: u8,
    /// Active Power.
    pub actp: u16,
    /// Bits 2:0 Active Power Workload, bits 7:6 Active Power Scale.
    pub apw_aps: u8,
    pub rsvd23: [u8; 9],
}

assert_size!(PowerStateDescriptor, 32);
assert_offset!(PowerStateDescriptor, mp, 0);
assert_offset!(PowerStateDescriptor, rsvd2, 2);
assert_offset!(PowerStateDescriptor, flags, 3);
assert_offset!(PowerStateDescriptor, enlat, 4);
assert_offset!(PowerStateDescriptor, exlat, 8);
assert_offset!(PowerStateDescriptor, rrt, 12);
assert_offset!(PowerStateDescriptor, rrl, 13);
assert_offset!(PowerStateDescriptor, rwt, 14);
assert_offset!(PowerStateDescriptor, rwl, 15);
assert_offset!(PowerStateDescriptor, idlp, 16);
assert_offset!(PowerStateDescriptor, ips, 18);
assert_offset!(PowerStateDescriptor, rsvd19, 19);
assert_offset!(PowerStateDescriptor, actp, 20);
assert_offset!(PowerStateDescriptor, apw_aps, 22);
assert_offset!(PowerStateDescriptor, rsvd23, 23);

/// Power state descriptor flag: Max Power Scale (0.0001 W units).
pub const PSD_MXPS: u8 = 1 << 0;
/// Power state descriptor flag: Non-Operational State.
pub const PSD_NOPS: u8 = 1 << 1;

impl PowerStateDescriptor {
    /// Max Power Scale: `true` means MP is in 0.0001 W units.
    pub const fn mxps(&self) -> bool {
        self.flags & PSD_MXPS != 0
    }
    /// Non-Operational State.
    pub const fn nops(&self) -> bool {
        self.flags & PSD_NOPS != 0
    }
    /// Idle Power Scale (bits 7:6 of byte 18).
    pub const fn idle_power_scale(&self) -> u8 {
        self.ips >> 6
    }
    /// Active Power Workload (bits 2:0 of byte 22).
    pub const fn active_power_workload(&self) -> u8 {
        self.apw_aps & 0x7
    }
    /// Active Power Scale (bits 7:6 of byte 22).
    pub const fn active_power_scale(&self) -> u8 {
        self.apw_aps >> 6
    }
}

// ---------------------------------------------------------------------------
// Identify Namespace (NVM command set)
// ---------------------------------------------------------------------------

/// LBA Format data structure (NVM Command Set spec 1.0, referenced from the
/// LBAF fields of the Identify Namespace data structure).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct LbaFormat {
    /// Metadata Size per logical block, bytes.
    pub ms: u16,
    /// LBA Data Size as a power of two (0 = format not supported).
    pub lbads: u8,
    /// Bits 1:0 Relative Performance; bits 7:2 reserved.
    pub rp: u8,
}

assert_size!(LbaFormat, 4);
assert_offset!(LbaFormat, ms, 0);
assert_offset!(LbaFormat, lbads, 2);
assert_offset!(LbaFormat, rp, 3);

impl LbaFormat {
    pub const fn new(ms: u16, lbads: u8, rp: u8) -> Self {
        LbaFormat {
            ms,
            lbads,
            rp: rp & 0x3,
        }
    }
    /// Relative Performance (0 = best, 3 = degraded).
    pub const fn relative_performance(&self) -> u8 {
        self.rp & 0x3
    }
    /// Logical block data size in bytes (0 if LBADS is 0 or too large).
    pub const fn data_size(&self) -> u64 {
        if self.lbads == 0 || self.lbads >= 64 {
            0
        } else {
            1u64 << self.lbads
        }
    }
}

/// NSFEAT bit 0: Thin provisioning.
pub const NSFEAT_THIN_PROVISIONING: u8 = 1 << 0;
/// NSFEAT bit 1: NAWUN, NAWUPF and NACWU are defined.
pub const NSFEAT_NSABP: u8 = 1 << 1;
/// NSFEAT bit 2: Deallocated or Unwritten Logical Block error.
pub const NSFEAT_DAE: u8 = 1 << 2;
/// NSFEAT bit 3: NGUID and EUI64 are never reused.
pub const NSFEAT_UIDREUSE: u8 = 1 << 3;
/// NSFEAT bit 4: NPWG, NPWA, NPDG, NPDA and NOWS are defined.
pub const NSFEAT_OPTPERF: u8 = 1 << 4;

/// FLBAS bit 4: metadata transferred at the end of the data LBA (extended).
pub const FLBAS_EXTENDED_METADATA: u8 = 1 << 4;

/// DLFEAT bits 2:0 = 001b: deallocated blocks read as all zeroes.
pub const DLFEAT_READ_ZEROES: u8 = 0b001;
/// DLFEAT bit 3: Write Zeroes supports the Deallocate bit.
pub const DLFEAT_WRITE_ZEROES_DEALLOC: u8 = 1 << 3;

/// Identify Namespace data structure for the NVM command set (CNS 00h),
/// NVM Command Set spec 1.0 Figure 97.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct IdentifyNamespace {
    /// Namespace Size, logical blocks.
    pub nsze: u64,
    /// Namespace Capacity, logical blocks.
    pub ncap: u64,
    /// Namespace Utilization, logical blocks.
    pub nuse: u64,
    /// Namespace Features (`NSFEAT_*`).
    pub nsfeat: u8,
    /// Number of LBA Formats, 0's based.
    pub nlbaf: u8,
    /// Formatted LBA Size: bits 3:0 format index (low), bit 4 extended
    /// metadata, bits 6:5 format index (high).
    pub flbas: u8,
    /// Metadata Capabilities.
    pub mc: u8,
    /// End-to-end Data Protection Capabilities.
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings.
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities.
    pub nmic: u8,
    /// Reservation Capabilities.
    pub rescap: u8,
    /// Format Progress Indicator.
    pub fpi: u8,
    /// Deallocate Logical Block Features (`DLFEAT_*`).
    pub dlfeat: u8,
    /// Namespace Atomic Write Unit Normal, 0's based.
    pub nawun: u16,
    /// Namespace Atomic Write Unit Power Fail, 0's based.
    pub nawupf: u16,
    /// Namespace Atomic Compare & Write Unit, 0's based.
    pub nacwu: u16,
    /// Namespace Atomic Boundary Size Normal, 0's based.
    pub nabsn: u16,
    /// Namespace Atomic Boundary Offset.
    pub nabo: u16,
    /// Namespace Atomic Boundary Size Power Fail, 0's based.
    pub nabspf: u16,
    /// Namespace Optimal I/O Boundary, logical blocks.
    pub noiob: u16,
    /// NVM Capacity, bytes.
    pub nvmcap: [u8; 16],
    /// Namespace Preferred Write Granularity, 0's based.
    pub npwg: u16,
    /// Namespace Preferred Write Alignment, 0's based.
    pub npwa: u16,
    /// Namespace Preferred Deallocate Granularity, 0's based.
    pub npdg: u16,
    /// Namespace Preferred Deallocate Alignment, 0's based.
    pub npda: u16,
    /// Namespace Optimal Write Size, 0's based.
    pub nows: u16,
    /// Maximum Single Source Range Length (Copy).
    pub mssrl: u16,
    /// Maximum Copy Length.
    pub mcl: u32,
    /// Maximum Source Range Count, 0's based.
    pub msrc: u8,
    pub rsvd81: [u8; 1],
    /// Number of Unique Capability LBA Formats.
    pub nulbaf: u8,
    pub rsvd83: [u8; 9],
    /// ANA Group Identifier.
    pub anagrpid: u32,
    pub rsvd96: [u8; 3],
    /// Namespace Attributes (bit 0: write protected).
    pub nsattr: u8,
    /// NVM Set Identifier.
    pub nvmsetid: u16,
    /// Endurance Group Identifier.
    pub endgid: u16,
    /// Namespace Globally Unique Identifier.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier.
    pub eui64: [u8; 8],
    /// LBA Format 0..=63 Support.
    pub lbaf: [LbaFormat; 64],
    /// Vendor Specific.
    pub vs: [u8; 3712],
}

assert_size!(IdentifyNamespace, 4096);
assert_offset!(IdentifyNamespace, nsze, 0);
assert_offset!(IdentifyNamespace, ncap, 8);
assert_offset!(IdentifyNamespace, nuse, 16);
assert_offset!(IdentifyNamespace, nsfeat, 24);
assert_offset!(IdentifyNamespace, nlbaf, 25);
assert_offset!(IdentifyNamespace, flbas, 26);
assert_offset!(IdentifyNamespace, mc, 27);
assert_offset!(IdentifyNamespace, dpc, 28);
assert_offset!(IdentifyNamespace, dps, 29);
assert_offset!(IdentifyNamespace, nmic, 30);
assert_offset!(IdentifyNamespace, rescap, 31);
assert_offset!(IdentifyNamespace, fpi, 32);
assert_offset!(IdentifyNamespace, dlfeat, 33);
assert_offset!(IdentifyNamespace, nawun, 34);
assert_offset!(IdentifyNamespace, nawupf, 36);
assert_offset!(IdentifyNamespace, nacwu, 38);
assert_offset!(IdentifyNamespace, nabsn, 40);
assert_offset!(IdentifyNamespace, nabo, 42);
assert_offset!(IdentifyNamespace, nabspf, 44);
assert_offset!(IdentifyNamespace, noiob, 46);
assert_offset!(IdentifyNamespace, nvmcap, 48);
assert_offset!(IdentifyNamespace, npwg, 64);
assert_offset!(IdentifyNamespace, npwa, 66);
assert_offset!(IdentifyNamespace, npdg, 68);
assert_offset!(IdentifyNamespace, npda, 70);
assert_offset!(IdentifyNamespace, nows, 72);
assert_offset!(IdentifyNamespace, mssrl, 74);
assert_offset!(IdentifyNamespace, mcl, 76);
assert_offset!(IdentifyNamespace, msrc, 80);
assert_offset!(IdentifyNamespace, rsvd81, 81);
assert_offset!(IdentifyNamespace, nulbaf, 82);
assert_offset!(IdentifyNamespace, rsvd83, 83);
assert_offset!(IdentifyNamespace, anagrpid, 92);
assert_offset!(IdentifyNamespace, rsvd96, 96);
assert_offset!(IdentifyNamespace, nsattr, 99);
assert_offset!(IdentifyNamespace, nvmsetid, 100);
assert_offset!(IdentifyNamespace, endgid, 102);
assert_offset!(IdentifyNamespace, nguid, 104);
assert_offset!(IdentifyNamespace, eui64, 120);
assert_offset!(IdentifyNamespace, lbaf, 128);
assert_offset!(IdentifyNamespace, vs, 384);

impl Default for IdentifyNamespace {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl IdentifyNamespace {
    /// Index of the current LBA format: FLBAS bits 3:0, with bits 6:5 as
    /// bits 5:4 of the index.
    pub const fn lba_format_index(&self) -> u8 {
        (self.flbas & 0xF) | ((self.flbas >> 5) & 0x3) << 4
    }

    /// Sets the current LBA format index, preserving FLBAS bit 4 (extended
    /// metadata). Indices above 63 are masked to 6 bits.
    pub fn set_lba_format_index(&mut self, idx: u8) {
        let idx = idx & 0x3F;
        self.flbas = (self.flbas & FLBAS_EXTENDED_METADATA) | (idx & 0xF) | ((idx >> 4) << 5);
    }

    /// The LBA format the namespace is currently formatted with.
    pub const fn lba_format(&self) -> LbaFormat {
        self.lbaf[self.lba_format_index() as usize]
    }

    /// Logical block size in bytes of the current format (`1 << lbads`;
    /// 0 if the format's LBADS is 0 or out of range).
    pub const fn lba_size(&self) -> u64 {
        self.lba_format().data_size()
    }

    /// Whether metadata is transferred at the end of each data LBA.
    pub const fn extended_metadata(&self) -> bool {
        self.flbas & FLBAS_EXTENDED_METADATA != 0
    }

    /// NVM Capacity in bytes.
    pub fn nvmcap(&self) -> u128 {
        u128::from_le_bytes(self.nvmcap)
    }
    pub fn set_nvmcap(&mut self, v: u128) {
        self.nvmcap = v.to_le_bytes();
    }
}

// ---------------------------------------------------------------------------
// Namespace ID list
// ---------------------------------------------------------------------------

/// Namespace ID list (CNS 02h Active Namespace ID list, also the layout of
/// the Changed Namespace List log page): up to 1024 NSIDs in increasing
/// order, zero filled after the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
#[repr(C)]
pub struct NsIdList {
    pub ids: [u32; 1024],
}

assert_size!(NsIdList, 4096);
assert_offset!(NsIdList, ids, 0);

impl Default for NsIdList {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl NsIdList {
    /// Maximum number of entries.
    pub const CAPACITY: usize = 1024;

    /// Builds a list from `ids` (taken in order; anything after the 1024th
    /// entry is dropped). Zero entries are skipped since zero terminates the
    /// list.
    pub fn from_ids<I: IntoIterator<Item = u32>>(ids: I) -> Self {
        let mut l = Self::default();
        for (slot, id) in l.ids.iter_mut().zip(ids.into_iter().filter(|&id| id != 0)) {
            *slot = id;
        }
        l
    }

    /// The NSIDs in the list: entries up to the first zero.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied().take_while(|&id| id != 0)
    }

    /// Number of entries before the first zero.
    pub fn len(&self) -> usize {
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.ids[0] == 0
    }
}

// ---------------------------------------------------------------------------
// Namespace Identification Descriptors
// ---------------------------------------------------------------------------

/// Namespace Identifier Type: IEEE Extended Unique Identifier (8 bytes).
pub const NIDT_EUI64: u8 = 1;
/// Namespace Identifier Type: Namespace Globally Unique Identifier (16 bytes).
pub const NIDT_NGUID: u8 = 2;
/// Namespace Identifier Type: Namespace UUID (16 bytes).
pub const NIDT_UUID: u8 = 3;
/// Namespace Identifier Type: Command Set Identifier (1 byte).
pub const NIDT_CSI: u8 = 4;

/// NIDL for [`NIDT_EUI64`].
pub const NIDL_EUI64: u8 = 8;
/// NIDL for [`NIDT_NGUID`].
pub const NIDL_NGUID: u8 = 16;
/// NIDL for [`NIDT_UUID`].
pub const NIDL_UUID: u8 = 16;
/// NIDL for [`NIDT_CSI`].
pub const NIDL_CSI: u8 = 1;

/// Command Set Identifier: NVM command set.
pub const CSI_NVM: u8 = 0;
/// Command Set Identifier: Key Value command set.
pub const CSI_KV: u8 = 1;
/// Command Set Identifier: Zoned Namespace command set.
pub const CSI_ZNS: u8 = 2;

/// Header of a Namespace Identification Descriptor (NVMe 2.0c, Identify
/// CNS 03h); NIDL bytes of identifier follow.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct NsDescriptorHeader {
    /// Namespace Identifier Type (`NIDT_*`).
    pub nidt: u8,
    /// Namespace Identifier Length, bytes.
    pub nidl: u8,
    pub rsvd2: [u8; 2],
}

assert_size!(NsDescriptorHeader, 4);
assert_offset!(NsDescriptorHeader, nidt, 0);
assert_offset!(NsDescriptorHeader, nidl, 1);
assert_offset!(NsDescriptorHeader, rsvd2, 2);

/// One decoded Namespace Identification Descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum NsDescriptor {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    /// Command Set Identifier (`CSI_*`).
    Csi(u8),
    /// A descriptor with a reserved NIDT, kept verbatim.
    Unknown {
        nidt: u8,
        data: Vec<u8>,
    },
}

impl NsDescriptor {
    /// The descriptor's NIDT.
    pub fn nidt(&self) -> u8 {
        match self {
            NsDescriptor::Eui64(_) => NIDT_EUI64,
            NsDescriptor::Nguid(_) => NIDT_NGUID,
            NsDescriptor::Uuid(_) => NIDT_UUID,
            NsDescriptor::Csi(_) => NIDT_CSI,
            NsDescriptor::Unknown { nidt, .. } => *nidt,
        }
    }

    /// The identifier bytes (NIDL of them).
    pub fn data(&self) -> &[u8] {
        match self {
            NsDescriptor::Eui64(d) => d,
            NsDescriptor::Nguid(d) | NsDescriptor::Uuid(d) => d,
            NsDescriptor::Csi(c) => core::slice::from_ref(c),
            NsDescriptor::Unknown { data, .. } => data,
        }
    }

    /// Encoded size: 4-byte header plus NIDL.
    pub fn encoded_len(&self) -> usize {
        4 + self.data().len()
    }
}

/// The NIDL that a given NIDT requires, if the type is defined.
pub const fn nidl_for(nidt: u8) -> Option<u8> {
    match nidt {
        NIDT_EUI64 => Some(NIDL_EUI64),
        NIDT_NGUID => Some(NIDL_NGUID),
        NIDT_UUID => Some(NIDL_UUID),
        NIDT_CSI => Some(NIDL_CSI),
        _ => None,
    }
}

/// Error parsing a Namespace Identification Descriptor list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DescriptorError {
    /// NIDL does not match the length the (defined) NIDT requires.
    BadLength {
        offset: usize,
        nidt: u8,
        nidl: u8,
        expected: u8,
    },
    /// The descriptor (header or identifier) runs past the end of the buffer.
    Truncated { offset: usize, nidt: u8 },
}

impl fmt::Display for DescriptorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DescriptorError::BadLength {
                offset,
                nidt,
                nidl,
                expected,
            } => write!(
                f,
                "namespace descriptor at byte {offset}: NIDT {nidt:#x} has NIDL {nidl}, expected {expected}"
            ),
            DescriptorError::Truncated { offset, nidt } => write!(
                f,
                "namespace descriptor at byte {offset} (NIDT {nidt:#x}) runs past the end of the buffer"
            ),
        }
    }
}

impl std::error::Error for DescriptorError {}

/// Parses a Namespace Identification Descriptor list (CNS 03h). Parsing
/// stops at the first descriptor with NIDT 0 or at the end of `buf`.
/// Descriptors of a defined type with the wrong NIDL, and descriptors that
/// run past the buffer, are errors. Never panics.
pub fn parse_ns_descriptors(buf: &[u8]) -> Result<Vec<NsDescriptor>, DescriptorError> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < buf.len() {
        let nidt = buf[off];
        if nidt == 0 {
            break;
        }
        let rest = &buf[off..];
        if rest.len() < 4 {
            return Err(DescriptorError::Truncated { offset: off, nidt });
        }
        let nidl = rest[1];
        let Some(data) = rest.get(4..4 + nidl as usize) else {
            return Err(DescriptorError::Truncated { offset: off, nidt });
        };
        if let Some(expected) = nidl_for(nidt) {
            if nidl != expected {
                return Err(DescriptorError::BadLength {
                    offset: off,
                    nidt,
                    nidl,
                    expected,
                });
            }
        }
        let d = match nidt {
            NIDT_EUI64 => NsDescriptor::Eui64(data.try_into().expect("length checked")),
            NIDT_NGUID => NsDescriptor::Nguid(data.try_into().expect("length checked")),
            NIDT_UUID => NsDescriptor::Uuid(data.try_into().expect("length checked")),
            NIDT_CSI => NsDescriptor::Csi(data[0]),
            _ => NsDescriptor::Unknown {
                nidt,
                data: data.to_vec(),
            },
        };
        out.push(d);
        off += 4 + nidl as usize;
    }
    Ok(out)
}

/// Writes a Namespace Identification Descriptor list into `buf`
/// (controller side), zero-filling everything after the last descriptor.
///
/// Descriptors are packed back to back. A descriptor that does not fit
/// entirely in the remaining space ends the list; `Unknown` descriptors with
/// NIDT 0 or more than 255 data bytes cannot be encoded and are skipped.
/// Returns the number of bytes of descriptors written.
pub fn write_ns_descriptors(list: &[NsDescriptor], buf: &mut [u8]) -> usize {
    buf.fill(0);
    let mut off = 0usize;
    for d in list {
        let data = d.data();
        let nidt = d.nidt();
        if nidt == 0 || data.len() > u8::MAX as usize {
            continue;
        }
        let len = 4 + data.len();
        let Some(dst) = buf.get_mut(off..off + len) else {
            break;
        };
        let hdr = NsDescriptorHeader {
            nidt,
            nidl: data.len() as u8,
            rsvd2: [0; 2],
        };
        dst[..4].copy_from_slice(hdr.as_bytes());
        dst[4..].copy_from_slice(data);
        off += len;
    }
    off
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controller_field_offsets_in_bytes() {
        let mut c = IdentifyController::new_zeroed();
        c.vid = 0x1B36;
        c.mdts = 5;
        c.cntlid = 0x0102;
        c.ver = 0x0002_0000;
        c.oacs = OACS_DBBUF_CONFIG | OACS_FORMAT_NVM;
        c.lpa = LPA_SMART_PER_NS;
        c.wctemp = 343;
        c.sqes = 0x66;
        c.cqes = 0x44;
        c.nn = 0xA1B2_C3D4;
        c.oncs = ONCS_DSM | ONCS_WRITE_ZEROES;
        c.vwc = VWC_PRESENT;
        c.sgls = 0x0010_0001;
        c.ioccsz = 0x1122_3344;
        c.ofcs = 0xBEEF;
        c.set_tnvmcap(0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10);
        c.set_serial("SN123");
        c.set_model("pollux softnvme");
        c.set_firmware_rev("0.1");
        c.set_subnqn("nqn.2024-01.io.pollux:soft");
        c.psd[0].mp = 0x09C4;
        c.psd[1].enlat = 0x55;
        c.vs[0] = 0xAB;

        let b = c.as_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..2], &0x1B36u16.to_le_bytes());
        assert_eq!(&b[4..9], b"SN123");
        assert_eq!(&b[9..24], &[b' '; 15]);
        assert_eq!(&b[24..39], b"pollux softnvme");
        assert_eq!(&b[64..72], b"0.1     ");
        assert_eq!(b[77], 5);
        assert_eq!(&b[78..80], &[0x02, 0x01]);
        assert_eq!(&b[80..84], &0x0002_0000u32.to_le_bytes());
        assert_eq!(&b[256..258], &0x0102u16.to_le_bytes());
        assert_eq!(b[261], 1);
        assert_eq!(&b[266..268], &343u16.to_le_bytes());
        assert_eq!(b[280], 0x10);
        assert_eq!(b[295], 0x01);
        assert_eq!(b[512], 0x66);
        assert_eq!(b[513], 0x44);
        assert_eq!(&b[516..520], &[0xD4, 0xC3, 0xB2, 0xA1]);
        assert_eq!(&b[520..522], &[0x0C, 0x00]);
        assert_eq!(b[525], 1);
        assert_eq!(&b[536..540], &0x0010_0001u32.to_le_bytes());
        assert_eq!(&b[768..794], b"nqn.2024-01.io.pollux:soft");
        assert_eq!(b[794], 0);
        assert_eq!(&b[1792..1796], &0x1122_3344u32.to_le_bytes());
        assert_eq!(&b[1804..1806], &0xBEEFu16.to_le_bytes());
        assert_eq!(&b[2048..2050], &0x09C4u16.to_le_bytes());
        assert_eq!(&b[2048 + 32 + 4..2048 + 32 + 8], &0x55u32.to_le_bytes());
        assert_eq!(b[3072], 0xAB);

        let back = IdentifyController::read_from_bytes(b).unwrap();
        assert_eq!(back, c);
        assert_eq!(back.serial(), "SN123");
        assert_eq!(back.model(), "pollux softnvme");
        assert_eq!(back.firmware_rev(), "0.1");
        assert_eq!(back.subnqn_str(), "nqn.2024-01.io.pollux:soft");
        assert_eq!(back.tnvmcap(), 0x0102_0304_0506_0708_090A_0B0C_0D0E_0F10);
        assert_eq!(back.max_transfer_bytes(4096), Some(128 * 1024));
        assert_eq!(back.sqe_size_required(), 64);
        assert_eq!(back.cqe_size_required(), 16);
    }

    #[test]
    fn mdts_zero_is_unlimited() {
        let c = IdentifyController::default();
        assert_eq!(c.max_transfer_bytes(4096), None);
    }

    #[test]
    fn ascii_helpers() {
        let mut f = [0u8; 8];
        set_ascii(&mut f, "abcdefghijk");
        assert_eq!(&f, b"abcdefgh");
        set_ascii(&mut f, "x\u{e9}y");
        assert_eq!(&f, b"x?y     ");
        assert_eq!(ascii_str(b"  ab cd   "), "ab cd");
        assert_eq!(ascii_str(b"ab\0\0\0"), "ab");
        assert_eq!(ascii_str(b""), "");
        // Invalid UTF-8 never panics.
        assert_eq!(ascii_str(&[0xFF, b'a', b' ']), "\u{FFFD}a");

        let mut n = [0xAAu8; 4];
        set_nul_terminated(&mut n, "abcdef");
        assert_eq!(&n, b"abc\0");
        // Multi-byte characters are not split.
        set_nul_terminated(&mut n, "a\u{e9}\u{e9}");
        assert_eq!(&n, &[b'a', 0xC3, 0xA9, 0]);
        set_nul_terminated(&mut [], "abc");
    }

    #[test]
    fn power_state_descriptor_bits() {
        let p = PowerStateDescriptor {
            flags: PSD_NOPS,
            ips: 0b10 << 6,
            apw_aps: 0b01 << 6 | 0b010,
            ..Default::default()
        };
        assert!(p.nops());
        assert!(!p.mxps());
        assert_eq!(p.idle_power_scale(), 2);
        assert_eq!(p.active_power_scale(), 1);
        assert_eq!(p.active_power_workload(), 2);
    }

    #[test]
    fn namespace_offsets_and_format() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.nsze = 0x1122_3344_5566_7788;
        ns.ncap = 2;
        ns.nuse = 3;
        ns.nlbaf = 1;
        ns.lbaf[0] = LbaFormat::new(0, 9, 2);
        ns.lbaf[1] = LbaFormat::new(8, 12, 0);
        ns.set_lba_format_index(1);
        ns.anagrpid = 0xCAFE_F00D;
        ns.nsattr = 1;
        ns.nulbaf = 7;
        ns.nguid = [0x11; 16];
        ns.eui64 = [0x22; 8];
        ns.set_nvmcap(1 << 40);

        let b = ns.as_bytes();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(b[8], 2);
        assert_eq!(b[16], 3);
        assert_eq!(b[25], 1);
        assert_eq!(b[26], 1);
        assert_eq!(&b[48..64], &(1u128 << 40).to_le_bytes());
        assert_eq!(b[82], 7);
        assert_eq!(&b[92..96], &0xCAFE_F00Du32.to_le_bytes());
        assert_eq!(b[99], 1);
        assert_eq!(&b[104..120], &[0x11; 16]);
        assert_eq!(&b[120..128], &[0x22; 8]);
        assert_eq!(b[128 + 2], 9);
        assert_eq!(b[128 + 3], 2);
        assert_eq!(&b[128 + 4..128 + 6], &8u16.to_le_bytes());
        assert_eq!(b[128 + 4 + 2], 12);

        assert_eq!(ns.lba_format(), LbaFormat::new(8, 12, 0));
        assert_eq!(ns.lba_size(), 4096);
        assert_eq!(ns.nvmcap(), 1 << 40);
    }

    #[test]
    fn flbas_high_index_bits() {
        let mut ns = IdentifyNamespace::new_zeroed();
        ns.lbaf[37] = LbaFormat::new(0, 13, 0);
        ns.flbas = FLBAS_EXTENDED_METADATA;
        ns.set_lba_format_index(37);
        // 37 = 0b10_0101: low nibble 5 in bits 3:0, high bits 10b in 6:5.
        assert_eq!(ns.flbas, 0b0101_0101);
        assert!(ns.extended_metadata());
        assert_eq!(ns.lba_format_index(), 37);
        assert_eq!(ns.lba_size(), 8192);
        ns.flbas = 0xFF;
        assert_eq!(ns.lba_format_index(), 63);
        assert_eq!(ns.lba_size(), 0);
    }

    #[test]
    fn ns_id_list() {
        let l = NsIdList::from_ids([1, 2, 0, 5]);
        assert_eq!(l.iter().collect::<Vec<_>>(), vec![1, 2, 5]);
        assert_eq!(l.len(), 3);
        assert!(!l.is_empty());
        assert_eq!(&l.as_bytes()[8..12], &5u32.to_le_bytes());
        assert!(NsIdList::default().is_empty());
        let full = NsIdList::from_ids(1..=5000);
        assert_eq!(full.len(), 1024);
        assert_eq!(full.ids[1023], 1024);
    }

    #[test]
    fn ns_descriptors_round_trip() {
        let list = vec![
            NsDescriptor::Eui64([1, 2, 3, 4, 5, 6, 7, 8]),
            NsDescriptor::Nguid([0xAA; 16]),
            NsDescriptor::Uuid([0x55; 16]),
            NsDescriptor::Csi(CSI_NVM),
            NsDescriptor::Unknown {
                nidt: 0x7F,
                data: vec![9, 9, 9],
            },
        ];
        let mut buf = [0xEEu8; 4096];
        let n = write_ns_descriptors(&list, &mut buf);
        assert_eq!(n, 12 + 20 + 20 + 5 + 7);
        assert_eq!(&buf[0..4], &[NIDT_EUI64, 8, 0, 0]);
        assert_eq!(&buf[4..12], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&buf[12..14], &[NIDT_NGUID, 16]);
        assert_eq!(&buf[52..57], &[NIDT_CSI, 1, 0, 0, 0]);
        assert!(buf[n..].iter().all(|&b| b == 0));
        assert_eq!(parse_ns_descriptors(&buf).unwrap(), list);
        // Exactly-filled buffer with no terminator.
        assert_eq!(parse_ns_descriptors(&buf[..n]).unwrap(), list);
    }

    #[test]
    fn ns_descriptors_errors() {
        assert_eq!(parse_ns_descriptors(&[]).unwrap(), vec![]);
        assert_eq!(parse_ns_descriptors(&[0; 16]).unwrap(), vec![]);
        assert_eq!(
            parse_ns_descriptors(&[NIDT_EUI64, 16, 0, 0]),
            Err(DescriptorError::Truncated {
                offset: 0,
                nidt: NIDT_EUI64
            })
        );
        let mut b = [0u8; 32];
        b[0] = NIDT_NGUID;
        b[1] = 8;
        let e = parse_ns_descriptors(&b).unwrap_err();
        assert_eq!(
            e,
            DescriptorError::BadLength {
                offset: 0,
                nidt: NIDT_NGUID,
                nidl: 8,
                expected: 16
            }
        );
        assert!(e.to_string().contains("expected 16"));
        assert!(matches!(
            parse_ns_descriptors(&[NIDT_CSI, 1]),
            Err(DescriptorError::Truncated { offset: 0, .. })
        ));
    }

    #[test]
    fn ns_descriptor_writer_limits() {
        // Does not fit: list ends, buffer zeroed.
        let mut small = [0xFFu8; 10];
        assert_eq!(
            write_ns_descriptors(&[NsDescriptor::Eui64([1; 8])], &mut small),
            0
        );
        assert_eq!(small, [0; 10]);
        // Unencodable descriptors are skipped.
        let mut buf = [0u8; 64];
        let list = [
            NsDescriptor::Unknown {
                nidt: 0,
                data: vec![1],
            },
            NsDescriptor::Unknown {
                nidt: 9,
                data: vec![0; 300],
            },
            NsDescriptor::Csi(2),
        ];
        assert_eq!(write_ns_descriptors(&list, &mut buf), 5);
        assert_eq!(
            parse_ns_descriptors(&buf).unwrap(),
            vec![NsDescriptor::Csi(2)]
        );
    }

    #[test]
    fn ns_descriptor_parser_never_panics() {
        // Deterministic xorshift fuzzing over short buffers biased towards
        // small NIDT/NIDL values.
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let buf: Vec<u8> = (0..len)
                .map(|_| {
                    let r = next();
                    if r % 3 == 0 {
                        (r >> 8) as u8
                    } else {
                        ((r >> 8) % 20) as u8
                    }
                })
                .collect();
            if let Ok(list) = parse_ns_descriptors(&buf) {
                let mut out = vec![0u8; buf.len()];
                write_ns_descriptors(&list, &mut out);
                assert_eq!(parse_ns_descriptors(&out).unwrap(), list);
            }
        }
    }
}
