//! Identify Namespace for the NVM command set (CNS 00h) and its LBA
//! Formats.

use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

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
