//! Submission and completion queue entries (NVMe 2.0 base spec §4.2, §4.6)
//! and the admin and NVM opcodes, with constructors for the commands pollux
//! issues. Constructors take the command's *semantic* values; the bit
//! packing lives here, once.
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::{assert_offset, assert_size};

/// A 64-byte submission queue entry.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C, align(64))]
pub struct Sqe {
    /// Opcode.
    pub opc: u8,
    /// Bits 1:0 FUSE, bits 7:6 PSDT (0 = PRPs).
    pub flags: u8,
    /// Command identifier.
    pub cid: u16,
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    pub prp1: u64,
    pub prp2: u64,
    pub cdw10: u32,
    pub cdw11: u32,
    pub cdw12: u32,
    pub cdw13: u32,
    pub cdw14: u32,
    pub cdw15: u32,
}

assert_size!(Sqe, 64);
assert_offset!(Sqe, opc, 0);
assert_offset!(Sqe, flags, 1);
assert_offset!(Sqe, cid, 2);
assert_offset!(Sqe, nsid, 4);
assert_offset!(Sqe, cdw2, 8);
assert_offset!(Sqe, cdw3, 12);
assert_offset!(Sqe, mptr, 16);
assert_offset!(Sqe, prp1, 24);
assert_offset!(Sqe, prp2, 32);
assert_offset!(Sqe, cdw10, 40);
assert_offset!(Sqe, cdw11, 44);
assert_offset!(Sqe, cdw12, 48);
assert_offset!(Sqe, cdw13, 52);
assert_offset!(Sqe, cdw14, 56);
assert_offset!(Sqe, cdw15, 60);

/// A 16-byte completion queue entry.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct Cqe {
    /// Command specific (DW0).
    pub dw0: u32,
    /// Command specific (DW1).
    pub dw1: u32,
    /// SQ head pointer at the time the completion was posted.
    pub sqhd: u16,
    /// SQ identifier the command came from.
    pub sqid: u16,
    /// Command identifier.
    pub cid: u16,
    /// Bit 0 phase tag, bits 15:1 status field (see [`crate::Status`]).
    pub status: u16,
}

assert_size!(Cqe, 16);
assert_offset!(Cqe, dw0, 0);
assert_offset!(Cqe, dw1, 4);
assert_offset!(Cqe, sqhd, 8);
assert_offset!(Cqe, sqid, 10);
assert_offset!(Cqe, cid, 12);
assert_offset!(Cqe, status, 14);

impl Cqe {
    /// The phase tag.
    #[inline]
    pub const fn phase(&self) -> bool {
        self.status & 1 != 0
    }
    /// The status field without the phase tag.
    #[inline]
    pub const fn status(&self) -> crate::Status {
        crate::Status(self.status >> 1)
    }
}

/// Admin command opcodes (NVMe 2.0 base spec Figure 84).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum AdminOpcode {
    DeleteIoSq = 0x00,
    CreateIoSq = 0x01,
    GetLogPage = 0x02,
    DeleteIoCq = 0x04,
    CreateIoCq = 0x05,
    Identify = 0x06,
    Abort = 0x08,
    SetFeatures = 0x09,
    GetFeatures = 0x0A,
    AsyncEventRequest = 0x0C,
    NamespaceManagement = 0x0D,
    FirmwareCommit = 0x10,
    FirmwareImageDownload = 0x11,
    DeviceSelfTest = 0x14,
    NamespaceAttachment = 0x15,
    KeepAlive = 0x18,
    DirectiveSend = 0x19,
    DirectiveReceive = 0x1A,
    VirtualizationManagement = 0x1C,
    NvmeMiSend = 0x1D,
    NvmeMiReceive = 0x1E,
    DoorbellBufferConfig = 0x7C,
    FabricsCommand = 0x7F,
    FormatNvm = 0x80,
    SecuritySend = 0x81,
    SecurityReceive = 0x82,
    Sanitize = 0x84,
    GetLbaStatus = 0x86,
}

impl AdminOpcode {
    pub fn from_u8(v: u8) -> Option<Self> {
        use AdminOpcode::*;
        Some(match v {
            0x00 => DeleteIoSq,
            0x01 => CreateIoSq,
            0x02 => GetLogPage,
            0x04 => DeleteIoCq,
            0x05 => CreateIoCq,
            0x06 => Identify,
            0x08 => Abort,
            0x09 => SetFeatures,
            0x0A => GetFeatures,
            0x0C => AsyncEventRequest,
            0x0D => NamespaceManagement,
            0x10 => FirmwareCommit,
            0x11 => FirmwareImageDownload,
            0x14 => DeviceSelfTest,
            0x15 => NamespaceAttachment,
            0x18 => KeepAlive,
            0x19 => DirectiveSend,
            0x1A => DirectiveReceive,
            0x1C => VirtualizationManagement,
            0x1D => NvmeMiSend,
            0x1E => NvmeMiReceive,
            0x7C => DoorbellBufferConfig,
            0x7F => FabricsCommand,
            0x80 => FormatNvm,
            0x81 => SecuritySend,
            0x82 => SecurityReceive,
            0x84 => Sanitize,
            0x86 => GetLbaStatus,
            _ => return None,
        })
    }
}

/// NVM command set I/O opcodes (NVM command set spec Figure 16).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum NvmOpcode {
    Flush = 0x00,
    Write = 0x01,
    Read = 0x02,
    WriteUncorrectable = 0x04,
    Compare = 0x05,
    WriteZeroes = 0x08,
    DatasetManagement = 0x09,
    Verify = 0x0C,
    ReservationRegister = 0x0D,
    ReservationReport = 0x0E,
    ReservationAcquire = 0x11,
    ReservationRelease = 0x15,
    Copy = 0x19,
}

impl NvmOpcode {
    pub fn from_u8(v: u8) -> Option<Self> {
        use NvmOpcode::*;
        Some(match v {
            0x00 => Flush,
            0x01 => Write,
            0x02 => Read,
            0x04 => WriteUncorrectable,
            0x05 => Compare,
            0x08 => WriteZeroes,
            0x09 => DatasetManagement,
            0x0C => Verify,
            0x0D => ReservationRegister,
            0x0E => ReservationReport,
            0x11 => ReservationAcquire,
            0x15 => ReservationRelease,
            0x19 => Copy,
            _ => return None,
        })
    }
}

/// Dataset Management range (NVM command set spec Figure 40), 16 bytes.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct DsmRange {
    /// Context attributes.
    pub cattr: u32,
    /// Length in logical blocks (1's based).
    pub nlb: u32,
    /// Starting LBA.
    pub slba: u64,
}
assert_size!(DsmRange, 16);
assert_offset!(DsmRange, cattr, 0);
assert_offset!(DsmRange, nlb, 4);
assert_offset!(DsmRange, slba, 8);

/// Dataset Management CDW11 attribute: deallocate.
pub const DSM_ATTR_DEALLOCATE: u32 = 1 << 2;
/// Maximum number of ranges in one Dataset Management command.
pub const DSM_MAX_RANGES: usize = 256;

/// Read/Write CDW12 bit 30: Force Unit Access.
pub const RW_FUA: u32 = 1 << 30;

/// Flags of a Read or Write command: bits of its CDW12 (the positions are
/// the wire's, as SPDK's `io_flags`). Only the flags pollux implements can
/// be made, so every value is a valid command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RwFlags(u32);

impl RwFlags {
    /// No flag: a plain read or write.
    pub const NONE: RwFlags = RwFlags(0);
    /// Force Unit Access (FUA): a write completes only once its data is
    /// on non-volatile media; a read returns data committed to
    /// non-volatile media (committing cached writes of its blocks first).
    pub const FUA: RwFlags = RwFlags(RW_FUA);
    /// Every flag this type can hold.
    const KNOWN: u32 = RW_FUA;

    /// The CDW12 bits.
    #[inline(always)]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The flags of CDW12 bits `bits`; None if it has any bit that is not
    /// a flag pollux implements (a C caller's bad value).
    pub const fn from_bits(bits: u32) -> Option<RwFlags> {
        if bits & !Self::KNOWN != 0 {
            None
        } else {
            Some(RwFlags(bits))
        }
    }

    /// The flags a received command's CDW12 carries (other bits ignored).
    #[inline(always)]
    pub const fn from_cdw12(cdw12: u32) -> RwFlags {
        RwFlags(cdw12 & Self::KNOWN)
    }

    /// Force Unit Access is set.
    #[inline(always)]
    pub const fn fua(self) -> bool {
        self.0 & RW_FUA != 0
    }

    /// Both sets of flags.
    #[inline(always)]
    pub const fn union(self, other: RwFlags) -> RwFlags {
        RwFlags(self.0 | other.0)
    }
}

impl core::ops::BitOr for RwFlags {
    type Output = RwFlags;
    #[inline(always)]
    fn bitor(self, other: RwFlags) -> RwFlags {
        self.union(other)
    }
}

/// Create I/O CQ CDW11 flag: physically contiguous.
pub const QUEUE_PC: u32 = 1 << 0;
/// Create I/O CQ CDW11 flag: interrupts enabled.
pub const CQ_IEN: u32 = 1 << 1;

/// Identify CNS values (NVMe 2.0 base spec Figure 273).
pub mod cns {
    /// Identify Namespace data structure for the NSID.
    pub const NAMESPACE: u8 = 0x00;
    /// Identify Controller data structure.
    pub const CONTROLLER: u8 = 0x01;
    /// Active Namespace ID list.
    pub const ACTIVE_NS_LIST: u8 = 0x02;
    /// Namespace Identification Descriptor list.
    pub const NS_DESCRIPTORS: u8 = 0x03;
}

impl Sqe {
    /// An empty command with the given opcode and namespace.
    #[inline(always)]
    pub const fn new(opc: u8, nsid: u32) -> Self {
        Sqe {
            opc,
            flags: 0,
            cid: 0,
            nsid,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            prp1: 0,
            prp2: 0,
            cdw10: 0,
            cdw11: 0,
            cdw12: 0,
            cdw13: 0,
            cdw14: 0,
            cdw15: 0,
        }
    }

    /// FUSE field.
    #[inline]
    pub const fn fuse(&self) -> u8 {
        self.flags & 3
    }

    /// PRP or SGL for data transfer (0 = PRPs).
    #[inline]
    pub const fn psdt(&self) -> u8 {
        self.flags >> 6
    }

    /// Read or Write: `nlb` is the number of logical blocks, 1's based.
    #[inline(always)]
    pub const fn rw(opc: NvmOpcode, nsid: u32, slba: u64, nlb: u32) -> Self {
        let mut s = Sqe::new(opc as u8, nsid);
        s.cdw10 = slba as u32;
        s.cdw11 = (slba >> 32) as u32;
        s.cdw12 = Sqe::rw_cdw12(nlb, RwFlags::NONE);
        s
    }

    /// CDW12 of a Read or Write of `nlb` blocks (1's based) with `flags`.
    #[inline(always)]
    pub const fn rw_cdw12(nlb: u32, flags: RwFlags) -> u32 {
        ((nlb - 1) & 0xFFFF) | flags.bits()
    }

    /// This Read or Write with `flags` set in CDW12 as well.
    #[inline(always)]
    pub const fn with_rw_flags(mut self, flags: RwFlags) -> Self {
        self.cdw12 |= flags.bits();
        self
    }

    /// Starting LBA of an NVM read/write/write-zeroes command.
    #[inline]
    pub const fn slba(&self) -> u64 {
        self.cdw10 as u64 | (self.cdw11 as u64) << 32
    }

    /// Number of logical blocks of an NVM read/write/write-zeroes command, 1's based.
    #[inline]
    pub const fn nlb(&self) -> u32 {
        (self.cdw12 & 0xFFFF) + 1
    }

    pub const fn flush(nsid: u32) -> Self {
        Sqe::new(NvmOpcode::Flush as u8, nsid)
    }

    /// Write Zeroes of `nlb` blocks (1's based); `deallocate` sets DEAC.
    pub const fn write_zeroes(nsid: u32, slba: u64, nlb: u32, deallocate: bool) -> Self {
        let mut s = Sqe::rw(NvmOpcode::WriteZeroes, nsid, slba, nlb);
        if deallocate {
            s.cdw12 |= 1 << 25;
        }
        s
    }

    /// Dataset Management with `nr` ranges (1's based) in the buffer at `prp1`.
    pub const fn dsm(nsid: u32, nr: u32, attributes: u32, prp1: u64) -> Self {
        let mut s = Sqe::new(NvmOpcode::DatasetManagement as u8, nsid);
        s.cdw10 = (nr - 1) & 0xFF;
        s.cdw11 = attributes;
        s.prp1 = prp1;
        s
    }

    /// Identify with the given CNS and controller identifier.
    pub const fn identify(cns: u8, nsid: u32, prp1: u64) -> Self {
        let mut s = Sqe::new(AdminOpcode::Identify as u8, nsid);
        s.cdw10 = cns as u32;
        s.prp1 = prp1;
        s
    }

    /// Create I/O Completion Queue: `qsize` entries (1's based), physically
    /// contiguous, interrupts disabled (pollux polls).
    pub const fn create_io_cq(qid: u16, qsize: u16, prp1: u64) -> Self {
        let mut s = Sqe::new(AdminOpcode::CreateIoCq as u8, 0);
        s.cdw10 = (qid as u32) | ((qsize as u32 - 1) << 16);
        s.cdw11 = QUEUE_PC;
        s.prp1 = prp1;
        s
    }

    /// Create I/O Submission Queue: `qsize` entries (1's based), bound to CQ `cqid`.
    pub const fn create_io_sq(qid: u16, qsize: u16, cqid: u16, prp1: u64) -> Self {
        let mut s = Sqe::new(AdminOpcode::CreateIoSq as u8, 0);
        s.cdw10 = (qid as u32) | ((qsize as u32 - 1) << 16);
        s.cdw11 = QUEUE_PC | ((cqid as u32) << 16);
        s.prp1 = prp1;
        s
    }

    pub const fn delete_io_sq(qid: u16) -> Self {
        let mut s = Sqe::new(AdminOpcode::DeleteIoSq as u8, 0);
        s.cdw10 = qid as u32;
        s
    }

    pub const fn delete_io_cq(qid: u16) -> Self {
        let mut s = Sqe::new(AdminOpcode::DeleteIoCq as u8, 0);
        s.cdw10 = qid as u32;
        s
    }

    /// Abort command `cid` on submission queue `sqid`.
    pub const fn abort(sqid: u16, cid: u16) -> Self {
        let mut s = Sqe::new(AdminOpcode::Abort as u8, 0);
        s.cdw10 = (sqid as u32) | ((cid as u32) << 16);
        s
    }

    pub const fn set_features(fid: u8, nsid: u32, cdw11: u32) -> Self {
        let mut s = Sqe::new(AdminOpcode::SetFeatures as u8, nsid);
        s.cdw10 = fid as u32;
        s.cdw11 = cdw11;
        s
    }

    /// Get Features, current value (SEL = 0).
    pub const fn get_features(fid: u8, nsid: u32) -> Self {
        let mut s = Sqe::new(AdminOpcode::GetFeatures as u8, nsid);
        s.cdw10 = fid as u32;
        s
    }

    /// Get Log Page of `len` bytes (a multiple of 4) at byte offset `offset`.
    pub const fn get_log_page(
        lid: u8,
        nsid: u32,
        len: u32,
        offset: u64,
        prp1: u64,
        prp2: u64,
    ) -> Self {
        let mut s = Sqe::new(AdminOpcode::GetLogPage as u8, nsid);
        let numd = len / 4 - 1;
        s.cdw10 = (lid as u32) | ((numd & 0xFFFF) << 16);
        s.cdw11 = numd >> 16;
        s.cdw12 = offset as u32;
        s.cdw13 = (offset >> 32) as u32;
        s.prp1 = prp1;
        s.prp2 = prp2;
        s
    }

    pub const fn async_event_request() -> Self {
        Sqe::new(AdminOpcode::AsyncEventRequest as u8, 0)
    }

    /// Doorbell Buffer Config: `shadow` is the shadow doorbell page, `eventidx`
    /// the event index page (both page-aligned).
    pub const fn doorbell_buffer_config(shadow: u64, eventidx: u64) -> Self {
        let mut s = Sqe::new(AdminOpcode::DoorbellBufferConfig as u8, 0);
        s.prp1 = shadow;
        s.prp2 = eventidx;
        s
    }
}

/// The name of a command (for errors and logs): `admin` picks the admin
/// or the NVM opcode table; an unknown opcode is named generically.
pub fn command_name(opc: u8, admin: bool) -> &'static str {
    if admin {
        let Some(op) = AdminOpcode::from_u8(opc) else {
            return "admin command";
        };
        use AdminOpcode as A;
        match op {
            A::DeleteIoSq => "Delete I/O Submission Queue",
            A::CreateIoSq => "Create I/O Submission Queue",
            A::GetLogPage => "Get Log Page",
            A::DeleteIoCq => "Delete I/O Completion Queue",
            A::CreateIoCq => "Create I/O Completion Queue",
            A::Identify => "Identify",
            A::Abort => "Abort",
            A::SetFeatures => "Set Features",
            A::GetFeatures => "Get Features",
            A::AsyncEventRequest => "Asynchronous Event Request",
            A::NamespaceManagement => "Namespace Management",
            A::FirmwareCommit => "Firmware Commit",
            A::FirmwareImageDownload => "Firmware Image Download",
            A::DeviceSelfTest => "Device Self-test",
            A::NamespaceAttachment => "Namespace Attachment",
            A::KeepAlive => "Keep Alive",
            A::DirectiveSend => "Directive Send",
            A::DirectiveReceive => "Directive Receive",
            A::VirtualizationManagement => "Virtualization Management",
            A::NvmeMiSend => "NVMe-MI Send",
            A::NvmeMiReceive => "NVMe-MI Receive",
            A::DoorbellBufferConfig => "Doorbell Buffer Config",
            A::FabricsCommand => "Fabrics command",
            A::FormatNvm => "Format NVM",
            A::SecuritySend => "Security Send",
            A::SecurityReceive => "Security Receive",
            A::Sanitize => "Sanitize",
            A::GetLbaStatus => "Get LBA Status",
        }
    } else {
        let Some(op) = NvmOpcode::from_u8(opc) else {
            return "I/O command";
        };
        match op {
            NvmOpcode::Flush => "Flush",
            NvmOpcode::Write => "Write",
            NvmOpcode::Read => "Read",
            NvmOpcode::WriteUncorrectable => "Write Uncorrectable",
            NvmOpcode::Compare => "Compare",
            NvmOpcode::WriteZeroes => "Write Zeroes",
            NvmOpcode::DatasetManagement => "Dataset Management",
            NvmOpcode::Verify => "Verify",
            NvmOpcode::ReservationRegister => "Reservation Register",
            NvmOpcode::ReservationReport => "Reservation Report",
            NvmOpcode::ReservationAcquire => "Reservation Acquire",
            NvmOpcode::ReservationRelease => "Reservation Release",
            NvmOpcode::Copy => "Copy",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    #[test]
    fn read_command_bytes() {
        let mut s = Sqe::rw(NvmOpcode::Read, 1, 0x1_2345_6789, 8);
        s.cid = 0xBEEF;
        s.prp1 = 0x1000;
        let b = s.as_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(&b[2..4], &0xBEEFu16.to_le_bytes());
        assert_eq!(&b[4..8], &1u32.to_le_bytes());
        assert_eq!(&b[24..32], &0x1000u64.to_le_bytes());
        assert_eq!(&b[40..44], &0x2345_6789u32.to_le_bytes());
        assert_eq!(&b[44..48], &1u32.to_le_bytes());
        assert_eq!(&b[48..52], &7u32.to_le_bytes());
        assert_eq!(s.slba(), 0x1_2345_6789);
        assert_eq!(s.nlb(), 8);
    }

    #[test]
    fn fua_is_cdw12_bit_30() {
        let s = Sqe::rw(NvmOpcode::Write, 1, 8, 16).with_rw_flags(RwFlags::FUA);
        assert_eq!(s.cdw12, 15 | 1 << 30);
        assert_eq!(&s.as_bytes()[48..52], &(15u32 | 1 << 30).to_le_bytes());
        assert_eq!(s.nlb(), 16, "NLB untouched");
        assert!(RwFlags::from_cdw12(s.cdw12).fua());
        assert_eq!(
            Sqe::rw(NvmOpcode::Read, 1, 8, 16)
                .with_rw_flags(RwFlags::NONE)
                .cdw12,
            15
        );
        // Limited Retry (bit 31) and PRINFO are not flags pollux makes.
        assert!(!RwFlags::from_cdw12(1 << 31 | 0xF << 26 | 0xFFFF).fua());
        assert_eq!(RwFlags::from_bits(1 << 30), Some(RwFlags::FUA));
        assert_eq!(RwFlags::from_bits(1 << 31), None);
        assert_eq!(RwFlags::from_bits(0), Some(RwFlags::NONE));
        assert_eq!(RwFlags::NONE | RwFlags::FUA, RwFlags::FUA);
    }

    #[test]
    fn queue_creation_fields() {
        let cq = Sqe::create_io_cq(3, 1024, 0x2000);
        assert_eq!(cq.opc, 0x05);
        assert_eq!(cq.cdw10, 3 | (1023 << 16));
        assert_eq!(cq.cdw11, 1);
        let sq = Sqe::create_io_sq(3, 256, 3, 0x3000);
        assert_eq!(sq.opc, 0x01);
        assert_eq!(sq.cdw10, 3 | (255 << 16));
        assert_eq!(sq.cdw11, 1 | (3 << 16));
    }

    #[test]
    fn log_page_numd_split() {
        // 512 KiB log: NUMD = 131071, split into NUMDL (16 bits) and NUMDU.
        let s = Sqe::get_log_page(2, 0xFFFF_FFFF, 512 * 1024, 0x10, 0, 0);
        assert_eq!(s.cdw10 & 0xFF, 2);
        assert_eq!(s.cdw10 >> 16, 0xFFFF);
        assert_eq!(s.cdw11, 1);
        assert_eq!(s.cdw12, 0x10);
    }

    #[test]
    fn cqe_phase_and_status() {
        let c = Cqe {
            status: (0x0280 << 1) | 1,
            ..Default::default()
        };
        assert!(c.phase());
        assert_eq!(c.status().sct(), 2);
        assert_eq!(c.status().sc(), 0x80);
    }

    #[test]
    fn opcodes_round_trip() {
        for v in 0..=255u8 {
            if let Some(op) = AdminOpcode::from_u8(v) {
                assert_eq!(op as u8, v);
            }
            if let Some(op) = NvmOpcode::from_u8(v) {
                assert_eq!(op as u8, v);
            }
        }
        assert_eq!(NvmOpcode::from_u8(0x03), None);
    }

    #[test]
    fn write_zeroes_deac() {
        let s = Sqe::write_zeroes(1, 10, 4, true);
        assert_eq!(s.opc, 0x08);
        assert_eq!(s.cdw12, 3 | 1 << 25);
    }
}
