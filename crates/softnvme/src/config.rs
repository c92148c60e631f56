//! Controller configuration (`SoftConfig`) and its validation.
//!
//! Every field is bounded here, once, so the rest of the emulator can rely on
//! the limits (queue counts, doorbell stride, MDTS, namespace count, string
//! lengths) without re-checking them.
use std::path::PathBuf;
use std::sync::Arc;

use pollux_bdev::Bdev;
use pollux_controller::{Identity, Limits, Namespace, PcieTraits, Personality, Subsystem};

use crate::irq::MAX_IRQ_VECTORS;
use crate::SoftError;

/// PCI vendor ID reported (Red Hat / QEMU's, as emulated devices use).
pub const VID: u16 = 0x1b36;
/// PCI subsystem vendor ID reported.
pub const SSVID: u16 = 0x1af4;
/// Controller ID reported.
pub const CNTLID: u16 = 1;

/// Most namespaces a controller may have.
pub const MAX_NAMESPACES: usize = 32;
/// Most I/O queue pairs a controller may grant.
pub const MAX_IO_QUEUES: u16 = 1024;
/// Largest CAP.DSTRD accepted (1 KiB doorbell stride); bounds the BAR size.
pub const MAX_DSTRD: u8 = 8;
/// Largest MDTS accepted (4 KiB << 16 = 256 MiB).
pub const MAX_MDTS: u8 = 16;
/// Most commands deferred (delayed or dropped) at once per controller.
pub const DEFERRED_LIMIT: usize = 4096;

/// Configuration of one emulated controller.
#[derive(Clone, Debug)]
pub struct SoftConfig {
    /// Namespaces, NSIDs 1..=n, at most 32.
    pub namespaces: Vec<NamespaceConfig>,
    /// CAP.MQES (0's based).
    pub mqes: u16,
    /// I/O SQ/CQ pairs granted at most by Set Features Number of Queues.
    pub max_io_queues: u16,
    /// Identify MDTS: max transfer is `4 KiB << mdts`; 0 = unlimited.
    pub mdts: u8,
    /// Interrupt vectors offered (MSI-X table size), `1..=2048`. Create I/O
    /// CQ fails with Invalid Interrupt Vector for an IV at or above it.
    /// Vector 0 is the admin vector.
    pub irq_vectors: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.TO (500 ms units).
    pub cap_to: u8,
    /// Advertise and implement Doorbell Buffer Config (OACS bit 8).
    pub shadow_doorbells: bool,
    /// Identify ACL (0's based).
    pub abort_limit: u8,
    /// Identify AERL (0's based).
    pub aer_limit: u8,
    /// Identify SN (at most 20 ASCII characters).
    pub serial: String,
    /// Identify MN (at most 40 ASCII characters).
    pub model: String,
    /// Identify FR and firmware slot 1 (at most 8 ASCII characters).
    pub firmware: String,
}

impl Default for SoftConfig {
    fn default() -> Self {
        SoftConfig {
            namespaces: Vec::new(),
            mqes: 4095,
            max_io_queues: 64,
            mdts: 5,
            // Admin plus one per default I/O queue.
            irq_vectors: 65,
            dstrd: 0,
            cap_to: 20,
            shadow_doorbells: true,
            abort_limit: 3,
            aer_limit: 3,
            serial: "SOFT0001".into(),
            model: "pollux softnvme".into(),
            firmware: "0.1".into(),
        }
    }
}

/// One namespace.
#[derive(Clone, Debug)]
pub struct NamespaceConfig {
    pub backend: BackendConfig,
    /// log2 of the LBA size: 9 (512 B) or 12 (4 KiB). For a bdev, its
    /// block size.
    pub lba_shift: u8,
    /// Namespace size in bytes, a multiple of the LBA size. For a file
    /// backend, 0 means "the file's size" (rounded down to whole LBAs);
    /// for a bdev, 0 means the whole bdev, else at most its size (the
    /// namespace is its first `size_bytes`).
    pub size_bytes: u64,
}

impl NamespaceConfig {
    /// A namespace serving all of `bdev`, with its block size as LBA size.
    pub fn bdev(bdev: Bdev) -> NamespaceConfig {
        NamespaceConfig {
            lba_shift: bdev.info().block_shift() as u8,
            size_bytes: 0,
            backend: BackendConfig::Bdev(bdev),
        }
    }
}

/// Where a namespace's data lives. Null and RAM are conveniences that
/// create a `pollux_bdev` null or RAM bdev of the namespace's geometry
/// (named `<serial>n<nsid>`); every namespace except a file one is served
/// by a bdev channel owned by the controller.
#[derive(Clone)]
pub enum BackendConfig {
    /// Discards writes, reads leave host memory untouched (`Bdev::null`).
    Null,
    /// Anonymous memory; unwritten blocks read as zeroes (`Bdev::ram`).
    Ram,
    /// A regular file (extended to `size_bytes` if shorter) or block device.
    File { path: PathBuf },
    /// A bdev the caller made and may keep using: the namespace's data is
    /// the bdev's (the controller opens it for writing and takes its own
    /// channel).
    Bdev(Bdev),
}

impl std::fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BackendConfig::Null => f.write_str("Null"),
            BackendConfig::Ram => f.write_str("Ram"),
            BackendConfig::File { path } => f.debug_struct("File").field("path", path).finish(),
            BackendConfig::Bdev(b) => {
                let i = b.info();
                f.debug_struct("Bdev")
                    .field("name", &i.name)
                    .field("backend", &i.backend)
                    .field("block_size", &i.block_size)
                    .field("num_blocks", &i.num_blocks)
                    .finish()
            }
        }
    }
}

fn ascii_ok(s: &str, max: usize) -> bool {
    s.len() <= max && s.bytes().all(|b| (0x20..0x7f).contains(&b))
}

impl SoftConfig {
    /// Checks every bound the emulator relies on.
    pub(crate) fn validate(&self) -> Result<(), SoftError> {
        let bad = |m: String| Err(SoftError::InvalidConfig(m));
        if self.namespaces.len() > MAX_NAMESPACES {
            return bad(format!(
                "{} namespaces (max {MAX_NAMESPACES})",
                self.namespaces.len()
            ));
        }
        if self.mqes < 1 {
            return bad("mqes must be at least 1 (2 entries)".into());
        }
        if self.max_io_queues == 0 || self.max_io_queues > MAX_IO_QUEUES {
            return bad(format!(
                "max_io_queues {} not in 1..={MAX_IO_QUEUES}",
                self.max_io_queues
            ));
        }
        if self.irq_vectors == 0 || self.irq_vectors > MAX_IRQ_VECTORS {
            return bad(format!(
                "irq_vectors {} not in 1..={MAX_IRQ_VECTORS}",
                self.irq_vectors
            ));
        }
        if self.mdts > MAX_MDTS {
            return bad(format!("mdts {} > {MAX_MDTS}", self.mdts));
        }
        if self.dstrd > MAX_DSTRD {
            return bad(format!("dstrd {} > {MAX_DSTRD}", self.dstrd));
        }
        if self.cap_to == 0 {
            return bad("cap_to must be at least 1".into());
        }
        if self.abort_limit > 15 || self.aer_limit > 15 {
            return bad("abort_limit and aer_limit must be at most 15".into());
        }
        if self.serial.is_empty() || !ascii_ok(&self.serial, 20) {
            return bad("serial must be 1..=20 printable ASCII characters".into());
        }
        if !ascii_ok(&self.model, 40) {
            return bad("model must be at most 40 printable ASCII characters".into());
        }
        if !ascii_ok(&self.firmware, 8) {
            return bad("firmware must be at most 8 printable ASCII characters".into());
        }
        for (i, ns) in self.namespaces.iter().enumerate() {
            let nsid = i + 1;
            if ns.lba_shift != 9 && ns.lba_shift != 12 {
                let of = match &ns.backend {
                    BackendConfig::Bdev(b) => format!(" (the block size of bdev {})", b.name()),
                    _ => String::new(),
                };
                return bad(format!(
                    "namespace {nsid}: lba_shift {}{of} is not 9 or 12",
                    ns.lba_shift
                ));
            }
            let zero_ok = matches!(
                ns.backend,
                BackendConfig::File { .. } | BackendConfig::Bdev(_)
            );
            if ns.size_bytes == 0 && !zero_ok {
                return bad(format!("namespace {nsid}: size_bytes 0"));
            }
            if ns.size_bytes % (1u64 << ns.lba_shift) != 0 {
                return bad(format!(
                    "namespace {nsid}: size_bytes {} not a multiple of the LBA size",
                    ns.size_bytes
                ));
            }
            if let BackendConfig::Bdev(b) = &ns.backend {
                let i = b.info();
                if i.block_size != 1u32 << ns.lba_shift {
                    return bad(format!(
                        "namespace {nsid}: lba_shift {} ({} bytes) but bdev {} has {}-byte blocks",
                        ns.lba_shift,
                        1u32 << ns.lba_shift,
                        i.name,
                        i.block_size
                    ));
                }
                if ns.size_bytes > i.size_bytes() {
                    return bad(format!(
                        "namespace {nsid}: size_bytes {} exceeds bdev {} ({} bytes)",
                        ns.size_bytes,
                        i.name,
                        i.size_bytes()
                    ));
                }
            }
        }
        Ok(())
    }

    /// Largest data transfer in bytes (`None` = unlimited).
    pub(crate) fn max_transfer(&self) -> Option<usize> {
        (self.mdts != 0).then(|| 4096usize << self.mdts)
    }

    /// The controller model's subsystem for this (validated)
    /// configuration, PCIe personality, serving `namespaces`.
    pub(crate) fn subsystem(
        &self,
        namespaces: Vec<Namespace>,
    ) -> Result<Arc<Subsystem>, SoftError> {
        let identity = Identity {
            serial: self.serial.clone(),
            model: self.model.clone(),
            firmware: self.firmware.clone(),
            vid: VID,
            ssvid: SSVID,
            ieee: [0x00, 0x54, 0x52],
            subnqn: format!("nqn.2024-01.io.pollux:softnvme:{}", self.serial),
        };
        let limits = Limits {
            mqes: self.mqes,
            max_io_queues: self.max_io_queues,
            mdts: self.mdts,
            abort_limit: self.abort_limit,
            aer_limit: self.aer_limit,
            cap_to: self.cap_to,
        };
        let personality = Personality::Pcie(PcieTraits {
            dstrd: self.dstrd,
            irq_vectors: self.irq_vectors,
            shadow_doorbells: self.shadow_doorbells,
        });
        Subsystem::new(identity, limits, personality, namespaces)
            .map_err(|e| SoftError::InvalidConfig(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(cfg: SoftConfig) -> String {
        match cfg.validate() {
            Err(e) => e.to_string(),
            Ok(()) => panic!("accepted {cfg:?}"),
        }
    }

    #[test]
    fn mdts_and_mqes_bounds() {
        for mdts in [0, 1, MAX_MDTS] {
            let c = SoftConfig {
                mdts,
                ..Default::default()
            };
            assert!(c.validate().is_ok(), "mdts {mdts}");
        }
        let e = err(SoftConfig {
            mdts: MAX_MDTS + 1,
            ..Default::default()
        });
        assert!(e.contains("mdts"), "{e}");
        for mqes in [1, 3, u16::MAX] {
            let c = SoftConfig {
                mqes,
                ..Default::default()
            };
            assert!(c.validate().is_ok(), "mqes {mqes}");
        }
        let e = err(SoftConfig {
            mqes: 0,
            ..Default::default()
        });
        assert!(e.contains("mqes"), "{e}");
        let c = SoftConfig {
            mdts: 1,
            ..Default::default()
        };
        assert_eq!(c.max_transfer(), Some(8 << 10));
        let c = SoftConfig {
            mdts: 0,
            ..Default::default()
        };
        assert_eq!(c.max_transfer(), None);
    }
}
