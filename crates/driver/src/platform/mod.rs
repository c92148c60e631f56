//! The platform layer: how the driver reaches a controller.
//!
//! A platform maps BAR0 and allocates DMA memory whose bus addresses (IOVAs)
//! the controller can use, registering it with the device side (an IOMMU via
//! VFIO, physical addresses via UIO, or the emulated controller's IOMMU
//! table). Everything above this trait is transport independent.
use crate::dma::DmaBuffer;
use crate::error::Result;
use crate::mmio::Mmio;

#[cfg(feature = "soft")]
pub mod soft;

/// Controller quirks, handled in one place. Each flag says why it exists.
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
    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer>;
    /// Called in every busy-wait loop of the control path. Real hardware:
    /// a pause. The emulated controller in inline mode: step the device.
    fn relax(&self) {
        std::hint::spin_loop();
    }
    fn quirks(&self) -> Quirks {
        Quirks::default()
    }
}
