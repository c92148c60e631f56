//! Identify Controller (CNS 01h) and its Power State Descriptors.

use std::borrow::Cow;

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use super::{ascii_str, set_ascii, set_nul_terminated};
use crate::{assert_offset, assert_size};

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

/// ANACAP bit 0: reports the ANA Optimized state.
pub const ANACAP_OPTIMIZED: u8 = 1 << 0;
/// ANACAP bit 1: reports the ANA Non-Optimized state.
pub const ANACAP_NON_OPTIMIZED: u8 = 1 << 1;
/// ANACAP bit 2: reports the ANA Inaccessible state.
pub const ANACAP_INACCESSIBLE: u8 = 1 << 2;
/// ANACAP bit 3: reports the ANA Persistent Loss state.
pub const ANACAP_PERSISTENT_LOSS: u8 = 1 << 3;
/// ANACAP bit 4: reports the ANA Change state.
pub const ANACAP_CHANGE: u8 = 1 << 4;
/// ANACAP bit 6: a namespace's ANAGRPID does not change while attached.
pub const ANACAP_GRPID_STATIC: u8 = 1 << 6;
/// ANACAP bit 7: a non-zero ANAGRPID is accepted in Namespace Management.
pub const ANACAP_GRPID_MGMT: u8 = 1 << 7;

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
