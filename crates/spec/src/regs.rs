//! Controller registers (NVMe 2.0 base spec §3.1.4): offsets in BAR0 and
//! typed views of the 32/64-bit values. Register *access* (MMIO) is the
//! driver's business; this module only encodes and decodes values.

/// Register offsets in BAR0.
pub mod off {
    pub const CAP: usize = 0x00;
    pub const VS: usize = 0x08;
    pub const INTMS: usize = 0x0C;
    pub const INTMC: usize = 0x10;
    pub const CC: usize = 0x14;
    pub const CSTS: usize = 0x1C;
    pub const NSSR: usize = 0x20;
    pub const AQA: usize = 0x24;
    pub const ASQ: usize = 0x28;
    pub const ACQ: usize = 0x30;
    /// Controller Memory Buffer Location: reserved (reads 0) in pollux.
    pub const CMBLOC: usize = 0x38;
    /// Controller Memory Buffer Size: reserved (reads 0) in pollux.
    pub const CMBSZ: usize = 0x3C;
    pub const BPINFO: usize = 0x40;
    pub const CRTO: usize = 0x68;
    /// First doorbell register (SQ 0 tail).
    pub const DOORBELL_BASE: usize = 0x1000;
}

/// Offset in BAR0 of the SQ `qid` tail doorbell for doorbell stride `dstrd`.
#[inline]
pub const fn sq_tail_doorbell(qid: u16, dstrd: u8) -> usize {
    off::DOORBELL_BASE + (2 * qid as usize) * (4usize << dstrd)
}

/// Offset in BAR0 of the CQ `qid` head doorbell for doorbell stride `dstrd`.
#[inline]
pub const fn cq_head_doorbell(qid: u16, dstrd: u8) -> usize {
    off::DOORBELL_BASE + (2 * qid as usize + 1) * (4usize << dstrd)
}

#[inline]
const fn bits64(v: u64, lo: u32, width: u32) -> u64 {
    (v >> lo) & ((1u64 << width) - 1)
}

#[inline]
const fn bits32(v: u32, lo: u32, width: u32) -> u32 {
    (v >> lo) & ((1u32 << width) - 1)
}

/// Controller Capabilities (CAP, 64-bit, offset 0x00).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cap(pub u64);

impl Cap {
    /// Maximum Queue Entries Supported, 0's based.
    pub const fn mqes(self) -> u16 {
        bits64(self.0, 0, 16) as u16
    }
    /// Contiguous Queues Required.
    pub const fn cqr(self) -> bool {
        bits64(self.0, 16, 1) != 0
    }
    /// Arbitration Mechanism Supported.
    pub const fn ams(self) -> u8 {
        bits64(self.0, 17, 2) as u8
    }
    /// Timeout: worst-case time to wait for CSTS.RDY, in 500 ms units.
    pub const fn to(self) -> u8 {
        bits64(self.0, 24, 8) as u8
    }
    /// Timeout in milliseconds.
    pub const fn timeout_ms(self) -> u64 {
        self.to() as u64 * 500
    }
    /// Doorbell Stride: doorbells are `4 << dstrd` bytes apart.
    pub const fn dstrd(self) -> u8 {
        bits64(self.0, 32, 4) as u8
    }
    /// NVM Subsystem Reset Supported.
    pub const fn nssrs(self) -> bool {
        bits64(self.0, 36, 1) != 0
    }
    /// Command Sets Supported (bit 0: NVM command set, bit 6: I/O command
    /// sets, bit 7: no I/O command set).
    pub const fn css(self) -> u8 {
        bits64(self.0, 37, 8) as u8
    }
    /// Boot Partition Support.
    pub const fn bps(self) -> bool {
        bits64(self.0, 45, 1) != 0
    }
    /// Memory Page Size Minimum: `2 ^ (12 + mpsmin)` bytes.
    pub const fn mpsmin(self) -> u8 {
        bits64(self.0, 48, 4) as u8
    }
    /// Memory Page Size Maximum: `2 ^ (12 + mpsmax)` bytes.
    pub const fn mpsmax(self) -> u8 {
        bits64(self.0, 52, 4) as u8
    }
    /// Persistent Memory Region Supported.
    pub const fn pmrs(self) -> bool {
        bits64(self.0, 56, 1) != 0
    }
    /// Controller Memory Buffer Supported.
    pub const fn cmbs(self) -> bool {
        bits64(self.0, 57, 1) != 0
    }

    /// Builds a CAP value from its fields (used by the emulated controller).
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        mqes: u16,
        cqr: bool,
        to: u8,
        dstrd: u8,
        css: u8,
        mpsmin: u8,
        mpsmax: u8,
    ) -> Self {
        Cap(mqes as u64
            | (cqr as u64) << 16
            | (to as u64) << 24
            | ((dstrd & 0xF) as u64) << 32
            | (css as u64) << 37
            | ((mpsmin & 0xF) as u64) << 48
            | ((mpsmax & 0xF) as u64) << 52)
    }
}

/// CAP.CSS bit for the NVM command set.
pub const CAP_CSS_NVM: u8 = 1 << 0;

/// Version (VS, offset 0x08).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Vs(pub u32);

impl Vs {
    pub const NVME_1_4: Vs = Vs::new(1, 4, 0);
    pub const NVME_2_0: Vs = Vs::new(2, 0, 0);
    pub const fn new(major: u16, minor: u8, tertiary: u8) -> Self {
        Vs((major as u32) << 16 | (minor as u32) << 8 | tertiary as u32)
    }
    pub const fn major(self) -> u16 {
        (self.0 >> 16) as u16
    }
    pub const fn minor(self) -> u8 {
        (self.0 >> 8) as u8
    }
    pub const fn tertiary(self) -> u8 {
        self.0 as u8
    }
}

/// Shutdown Notification values (CC.SHN).
pub mod shn {
    pub const NONE: u8 = 0;
    pub const NORMAL: u8 = 1;
    pub const ABRUPT: u8 = 2;
}

/// Shutdown Status values (CSTS.SHST).
pub mod shst {
    pub const NORMAL: u8 = 0;
    pub const OCCURRING: u8 = 1;
    pub const COMPLETE: u8 = 2;
}

/// Controller Configuration (CC, offset 0x14).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cc(pub u32);

impl Cc {
    pub const fn en(self) -> bool {
        self.0 & 1 != 0
    }
    /// I/O Command Set Selected.
    pub const fn css(self) -> u8 {
        bits32(self.0, 4, 3) as u8
    }
    /// Memory Page Size: `2 ^ (12 + mps)`.
    pub const fn mps(self) -> u8 {
        bits32(self.0, 7, 4) as u8
    }
    /// Arbitration Mechanism Selected.
    pub const fn ams(self) -> u8 {
        bits32(self.0, 11, 3) as u8
    }
    /// Shutdown Notification.
    pub const fn shn(self) -> u8 {
        bits32(self.0, 14, 2) as u8
    }
    /// I/O SQ entry size, log2 (6 for 64 bytes).
    pub const fn iosqes(self) -> u8 {
        bits32(self.0, 16, 4) as u8
    }
    /// I/O CQ entry size, log2 (4 for 16 bytes).
    pub const fn iocqes(self) -> u8 {
        bits32(self.0, 20, 4) as u8
    }
    pub const fn with_en(self, en: bool) -> Self {
        Cc((self.0 & !1) | en as u32)
    }
    pub const fn with_shn(self, shn: u8) -> Self {
        Cc((self.0 & !(3 << 14)) | ((shn as u32 & 3) << 14))
    }
    /// The configuration pollux uses: NVM command set, round robin,
    /// 64-byte SQEs, 16-byte CQEs, page size `2 ^ (12 + mps)`, not enabled.
    pub const fn standard(mps: u8) -> Self {
        Cc(((mps as u32 & 0xF) << 7) | (6 << 16) | (4 << 20))
    }
}

/// Controller Status (CSTS, offset 0x1C).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Csts(pub u32);

impl Csts {
    pub const RDY: u32 = 1 << 0;
    pub const CFS: u32 = 1 << 1;
    pub const fn rdy(self) -> bool {
        self.0 & Self::RDY != 0
    }
    /// Controller Fatal Status.
    pub const fn cfs(self) -> bool {
        self.0 & Self::CFS != 0
    }
    /// Shutdown Status.
    pub const fn shst(self) -> u8 {
        bits32(self.0, 2, 2) as u8
    }
    /// NVM Subsystem Reset Occurred.
    pub const fn nssro(self) -> bool {
        bits32(self.0, 4, 1) != 0
    }
    /// Processing Paused.
    pub const fn pp(self) -> bool {
        bits32(self.0, 5, 1) != 0
    }
    pub const fn with_shst(self, shst: u8) -> Self {
        Csts((self.0 & !(3 << 2)) | ((shst as u32 & 3) << 2))
    }
    /// All-ones is what a read returns from a device that fell off the bus.
    pub const fn is_dead(self) -> bool {
        self.0 == u32::MAX
    }
}

/// Admin Queue Attributes (AQA, offset 0x24). Sizes are 0's based.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Aqa(pub u32);

impl Aqa {
    /// Builds AQA from entry counts (1's based, as a user thinks of them).
    pub const fn new(sq_entries: u16, cq_entries: u16) -> Self {
        Aqa(((sq_entries as u32 - 1) & 0xFFF) | (((cq_entries as u32 - 1) & 0xFFF) << 16))
    }
    /// Admin SQ size, 0's based.
    pub const fn asqs(self) -> u16 {
        bits32(self.0, 0, 12) as u16
    }
    /// Admin CQ size, 0's based.
    pub const fn acqs(self) -> u16 {
        bits32(self.0, 16, 12) as u16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_round_trip() {
        let cap = Cap::new(1023, true, 20, 0, CAP_CSS_NVM, 0, 4);
        assert_eq!(cap.mqes(), 1023);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 20);
        assert_eq!(cap.timeout_ms(), 10_000);
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.css(), 1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
    }

    #[test]
    fn cap_decodes_raw_bits() {
        // MQES 2047 | CQR | TO 15 | DSTRD 0 | CSS.NVM (bit 37) | MPSMAX 4 (bits 55:52) | CMBS (bit 57)
        let raw: u64 = 2047 | 1 << 16 | 15 << 24 | 1 << 37 | 4 << 52 | 1 << 57;
        let cap = Cap(raw);
        assert_eq!(cap.mqes(), 2047);
        assert!(cap.cqr());
        assert_eq!(cap.to(), 15);
        assert_eq!(cap.dstrd(), 0);
        assert_eq!(cap.css() & CAP_CSS_NVM, 1);
        assert_eq!(cap.mpsmin(), 0);
        assert_eq!(cap.mpsmax(), 4);
        assert!(cap.cmbs());
        assert!(!cap.pmrs());
    }

    #[test]
    fn doorbell_offsets() {
        assert_eq!(sq_tail_doorbell(0, 0), 0x1000);
        assert_eq!(cq_head_doorbell(0, 0), 0x1004);
        assert_eq!(sq_tail_doorbell(1, 0), 0x1008);
        assert_eq!(cq_head_doorbell(1, 0), 0x100C);
        assert_eq!(sq_tail_doorbell(1, 1), 0x1010);
        assert_eq!(cq_head_doorbell(3, 2), 0x1000 + 7 * 16);
    }

    #[test]
    fn cc_fields() {
        let cc = Cc::standard(0).with_en(true);
        assert!(cc.en());
        assert_eq!(cc.iosqes(), 6);
        assert_eq!(cc.iocqes(), 4);
        assert_eq!(cc.mps(), 0);
        assert_eq!(cc.css(), 0);
        assert_eq!(cc.with_shn(shn::NORMAL).shn(), 1);
        assert!(!cc.with_en(false).en());
        assert_eq!(cc.0, 0x0046_0001);
    }

    #[test]
    fn csts_and_aqa() {
        let c = Csts(Csts::RDY).with_shst(shst::COMPLETE);
        assert!(c.rdy() && !c.cfs());
        assert_eq!(c.shst(), 2);
        assert!(Csts(u32::MAX).is_dead());
        let a = Aqa::new(32, 64);
        assert_eq!(a.asqs(), 31);
        assert_eq!(a.acqs(), 63);
        assert_eq!(a.0, 0x003F_001F);
    }

    #[test]
    fn version() {
        assert_eq!(Vs::NVME_1_4.0, 0x0001_0400);
        assert_eq!(Vs::NVME_2_0.major(), 2);
    }
}
