//! Emulated-controller platform: BAR0 and an IOMMU served by an in-process
//! [`SoftDevice`], for `pollux_pcie`'s driver (this crate implements its
//! [`Platform`] trait; `pollux_pcie` knows nothing of the emulator).
//!
//! DMA memory is anonymous mmap'd memory registered in the device's IOMMU
//! table at IOVAs from a bump allocator that starts far from any host
//! address, so a host pointer passed by mistake as a bus address fails
//! translation instead of working by accident. IOVAs are never reused.
//!
//! Modes: `Threaded` — the device runs on a `DeviceThread` (the realistic
//! mode); `Inline` — nobody else steps the device: `relax()` steps it, and
//! the caller steps it between polls (deterministic; used by tests and for
//! instruction counts).
//!
//! One driver per device: the platform claims the `SoftDevice`
//! (`SoftDevice::claim`) when a controller is opened on it, and a second
//! platform's controller on the same device is refused until the first
//! platform is gone.
//!
//! Without an IOMMU (`new_without_iommu`, for tests of what UIO does):
//! released memory stays mapped at the device and allocated, handed out
//! to nobody (quarantined, as UIO quarantines it), until the platform and
//! every buffer are gone; then it is unmapped from the device (this
//! platform's "bus mastering off") and freed.
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pollux_pcie::dma::{DmaBuffer, DmaRelease, Iova, PAGE_SIZE};
use pollux_pcie::error::{Error, Result};
use pollux_pcie::mmio::Mmio;
use pollux_pcie::platform::{hugemem, irq, Platform};

use crate::{SoftClaim, SoftDevice};

/// First IOVA handed out (1 TiB): far above user-space addresses of small
/// test programs and distinct from any pointer value we allocate.
const IOVA_BASE: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SoftMode {
    Threaded,
    Inline,
}

/// The emulated controller's platform: open `pollux_pcie`'s driver on it.
///
/// ```
/// use pollux_pcie::{ControllerOptions, QpairOptions};
/// use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice, SoftMode, SoftPlatform};
/// let ns = NamespaceConfig { backend: BackendConfig::Ram, lba_shift: 9, size_bytes: 1 << 20 };
/// let cfg = SoftConfig { namespaces: vec![ns], ..SoftConfig::default() };
/// let dev = SoftDevice::new(cfg).unwrap();
/// let platform = Box::new(SoftPlatform::new(dev, SoftMode::Inline));
/// let ctrl = pollux_pcie::open(platform, ControllerOptions::default()).unwrap();
/// let ns = ctrl.namespaces()[0];
/// let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
/// let buf = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap());
/// qp.read(&ns, 0, 4096 >> ns.lba_shift(), buf, 7).unwrap();
/// let mut got = None;
/// while got.is_none() {
///     qp.poll(u32::MAX, |_, c| got = Some(c));
///     ctrl.relax();
/// }
/// let c = got.unwrap();
/// assert_eq!(c.result, Ok(0));
/// let data = c.buf.unwrap(); // the buffer comes back with the completion
/// assert_eq!(data.len(), 4096);
/// ```
pub struct SoftPlatform {
    dev: Arc<SoftDevice>,
    bar: Mmio,
    mode: SoftMode,
    mem: Arc<SoftDma>,
    /// Held from `claim` (a controller's bring-up) on.
    claim: Mutex<Option<SoftClaim>>,
}

struct SoftDma {
    dev: Arc<SoftDevice>,
    next_iova: AtomicU64,
    /// False: no IOMMU (see the module docs): `quarantine` keeps released
    /// memory (address as usize, length, IOVA).
    iommu: bool,
    quarantine: Mutex<Vec<(usize, usize, u64)>>,
    quarantined: AtomicUsize,
}

impl SoftPlatform {
    pub fn new(dev: Arc<SoftDevice>, mode: SoftMode) -> Self {
        Self::build(dev, mode, true)
    }

    /// A platform that behaves as if the device had no IOMMU (UIO): see
    /// the module docs.
    pub fn new_without_iommu(dev: Arc<SoftDevice>, mode: SoftMode) -> Self {
        Self::build(dev, mode, false)
    }

    fn build(dev: Arc<SoftDevice>, mode: SoftMode, iommu: bool) -> Self {
        let (base, len) = dev.bar0();
        // SAFETY: SoftDevice::bar0 is page aligned and lives as long as the
        // device, which we keep alive in `dev`.
        let bar = unsafe { Mmio::new(base, len) };
        let mem = Arc::new(SoftDma {
            dev: dev.clone(),
            next_iova: AtomicU64::new(IOVA_BASE),
            iommu,
            quarantine: Mutex::new(Vec::new()),
            quarantined: AtomicUsize::new(0),
        });
        SoftPlatform {
            dev,
            bar,
            mode,
            mem,
            claim: Mutex::new(None),
        }
    }

    pub fn device(&self) -> &Arc<SoftDevice> {
        &self.dev
    }

    pub fn mode(&self) -> SoftMode {
        self.mode
    }
}

impl Platform for SoftPlatform {
    fn describe(&self) -> String {
        format!("soft ({:?})", self.mode)
    }

    fn claim(&self) -> Result<()> {
        let mut c = self.claim.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_none() {
            *c = Some(
                self.dev
                    .claim()
                    .map_err(|e| Error::Platform(e.to_string()))?,
            );
        }
        Ok(())
    }

    fn quarantined_bytes(&self) -> usize {
        self.mem.quarantined.load(Ordering::Relaxed)
    }

    fn bar0(&self) -> &Mmio {
        &self.bar
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let ptr = hugemem::mmap_anon(len)
            .map_err(|e| Error::Dma(format!("mmap of {len} bytes failed: {e}")))?;
        let p = ptr.as_ptr().cast::<libc::c_void>();
        // Leave a one-page hole between buffers so an overrun fails translation.
        let iova = self
            .mem
            .next_iova
            .fetch_add((len + PAGE_SIZE) as u64, Ordering::Relaxed);
        // SAFETY: the mapping stays valid until SoftDma::release unmaps it
        // from the device (first) and then munmaps it.
        if let Err(e) = unsafe { self.dev.dma_map(iova, ptr, len) } {
            // SAFETY: we own the mapping and nothing else references it.
            unsafe { libc::munmap(p, len) };
            return Err(Error::Dma(format!("IOMMU map failed: {e}")));
        }
        // SAFETY: fresh exclusive mapping of len bytes at a contiguous IOVA.
        Ok(unsafe { DmaBuffer::from_raw(ptr, len, Iova::Contiguous(iova), self.mem.clone()) })
    }

    fn irq_vectors(&self) -> u16 {
        self.dev.irq_vectors()
    }

    fn enable_irq(&self, vector: u16) -> Result<irq::IrqFd> {
        let fd = self
            .dev
            .irq_eventfd(vector)
            .map_err(|e| Error::Platform(format!("interrupt vector {vector}: {e}")))?;
        irq::IrqFd::from_eventfd(fd)
    }

    fn relax(&self) {
        match self.mode {
            SoftMode::Inline => {
                self.dev.step();
            }
            SoftMode::Threaded => std::hint::spin_loop(),
        }
    }
}

impl SoftDma {
    /// Unmaps from the device, then frees (or leaks, if the unmap fails).
    fn unmap_and_free(&self, ptr: *mut u8, len: usize, iova: u64) {
        // Unmap first: after dma_unmap returns the device never touches the
        // memory again, so freeing it cannot race with device DMA.
        if let Err(e) = self.dev.dma_unmap(iova) {
            tracing::error!(iova, "IOMMU unmap failed: {e}; leaking {len} bytes rather than freeing memory the device may still use");
            return;
        }
        // SAFETY: we mapped exactly this range in alloc_dma and nothing else
        // references it any more (its DmaBuffer is gone).
        unsafe { libc::munmap(ptr.cast(), len) };
    }
}

impl DmaRelease for SoftDma {
    fn release(&self, ptr: NonNull<u8>, len: usize, iova: u64) {
        if self.iommu {
            return self.unmap_and_free(ptr.as_ptr(), len, iova);
        }
        // No IOMMU: the device may still reach it; kept until `drop`.
        self.quarantine
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((ptr.as_ptr() as usize, len, iova));
        self.quarantined.fetch_add(len, Ordering::Relaxed);
    }
}

impl Drop for SoftDma {
    /// The platform and every buffer are gone: the quarantined memory
    /// leaves the device (it can no longer reach it), then is freed.
    fn drop(&mut self) {
        let q = std::mem::take(self.quarantine.get_mut().unwrap_or_else(|p| p.into_inner()));
        for (ptr, len, iova) in q {
            self.unmap_and_free(ptr as *mut u8, len, iova);
        }
    }
}
