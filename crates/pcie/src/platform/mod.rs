//! The platform layer: how the driver reaches a controller.
//!
//! A platform maps BAR0 and allocates DMA memory whose bus addresses (IOVAs)
//! the controller can use, registering it with the device side (an IOMMU via
//! VFIO, physical addresses via UIO, or the emulated controller's IOMMU
//! table). Everything above this trait is transport independent.
use crate::dma::DmaBuffer;
use crate::error::Result;
use crate::mmio::Mmio;

#[cfg(target_os = "linux")]
pub mod hugemem;
pub mod irq;
#[cfg(target_os = "linux")]
mod open;
#[cfg(target_os = "linux")]
pub mod pci;
#[cfg(target_os = "linux")]
pub mod uio;
#[cfg(target_os = "linux")]
pub mod vfio;
#[cfg(target_os = "linux")]
pub use open::open_pcie;

/// Controller quirks, handled in one place. Each flag says why it exists.
///
/// Quirks that need no flag because pollux always does the safe thing:
/// - QEMU's `-device nvme` (1b36:0010) wants 4-byte register accesses:
///   `Mmio` always splits 64-bit registers (CAP, ASQ, ACQ) into two
///   naturally aligned 32-bit accesses, low half first, which the NVMe spec
///   allows for every controller (works with QEMU 7.2 in tests/guest; 8-byte
///   accesses were not tried).
/// - QEMU (7.2) takes SQ tails and CQ heads from the shadow doorbell buffer
///   once Doorbell Buffer Config is set, whatever was written to the MMIO
///   doorbell: shadow slots must be kept current (and zeroed when a queue
///   ID is reused) for every queue, see tests/guest.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quirks {
    /// Wait this long after CC.EN 0→1 before polling CSTS.RDY (some devices
    /// misreport RDY immediately after enabling). 0 = none.
    pub delay_before_ready_poll_us: u32,
}

pub trait Platform: Send + Sync {
    /// Short human-readable description (e.g. "soft:null" or "vfio 0000:00:01.0").
    fn describe(&self) -> String;
    /// BAR0 register window.
    fn bar0(&self) -> &Mmio;
    /// Allocates `len` bytes (rounded up to 4 KiB) of zeroed DMA memory.
    /// Its release (dropping the buffer) must be safe while the device may
    /// still transfer to or from it (see `DmaRelease`).
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer>;
    /// Makes this platform the device's only driver, or fails with an
    /// error naming the device and, where known, who else drives it. Called
    /// once by `Pcie::new`, before any register access: a second driver's
    /// bring-up would disable the controller and reprogram its queues
    /// under the first. UIO and VFIO claim the device when they open it
    /// (a lock held for the platform's life; the kernel's one open of a
    /// VFIO group), so for them this does nothing.
    fn claim(&self) -> Result<()> {
        Ok(())
    }
    /// Bytes of released DMA memory kept (never handed out again) until
    /// the device can no longer reach it: platforms without an IOMMU.
    fn quarantined_bytes(&self) -> usize {
        0
    }
    /// Called in every busy-wait loop of the control path. Real hardware:
    /// a pause. The emulated controller in inline mode: step the device.
    fn relax(&self) {
        std::hint::spin_loop();
    }
    fn quirks(&self) -> Quirks {
        Quirks::default()
    }
    /// How many interrupt vectors the platform can deliver (0: none; the
    /// driver polls). Vector 0 is the admin CQ's.
    fn irq_vectors(&self) -> u16 {
        0
    }
    /// Delivers interrupt `vector` (< `irq_vectors()`) through the returned
    /// fd. Real PCIe controllers: enable vector 0 (the admin CQ's) before
    /// `Controller::new`: QEMU (7.2) drops MSI-X messages of a vector that
    /// was not yet enabled when the CQ using it was created.
    fn enable_irq(&self, vector: u16) -> Result<irq::IrqFd> {
        Err(crate::error::Error::Unsupported(format!(
            "interrupts (vector {vector}) not supported by {}",
            self.describe()
        )))
    }
}

/// PCI IDs of QEMU's emulated NVMe controller.
pub const QEMU_NVME: (u16, u16) = (0x1b36, 0x0010);

/// The quirk table for real PCIe controllers, by (vendor, device) ID.
pub fn quirks_for(ids: (u16, u16)) -> Quirks {
    match ids {
        // QEMU: nothing beyond 4-byte register access (see `Quirks`).
        QEMU_NVME => Quirks::default(),
        _ => Quirks::default(),
    }
}
