//! VFIO platform (vfio-pci, type1 IOMMU container/group API).
//!
//! Bring-up: open `/dev/vfio/vfio` (the container), check the API version
//! and the type1 IOMMU extension, open the device's group
//! (`/dev/vfio/<iommu_group>`), check it is viable (every device in it bound
//! to vfio-pci or no driver), attach it to the container, select the type1
//! IOMMU, get the device descriptor, map BAR0 and enable memory decoding
//! and bus mastering in the PCI command register through the config region.
//!
//! DMA: host memory (hugepages for large buffers, else 4 KiB pages, see
//! `hugemem`) mapped with `VFIO_IOMMU_MAP_DMA` at IOVAs from a bump
//! allocator inside the IOMMU's usable ranges; the IOMMU makes any pages
//! contiguous on the bus, so every buffer has one contiguous IOVA range.
//! Release unmaps from the IOMMU first, then frees: after the unmap the
//! device cannot reach the memory, whatever it is still doing.
//!
//! Needs no root: read/write access to `/dev/vfio/vfio` and the group node,
//! and a locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) covering the DMA
//! memory: the IOMMU pinning is charged to it. 4 KiB-page buffers are not
//! also mlock'ed (the pinning holds them), which would charge them twice.
//! tests/guest runs `perf --verify` as an unprivileged user.
//! The iommufd / VFIO cdev interface is not implemented.
use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::hugemem::{HostMem, PageKind, HUGE_PAGE_SIZE};
use super::irq::IrqFd;
use super::pci;
use super::{Platform, Quirks};
use crate::dma::{DmaBuffer, Iova, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mmio::Mmio;

mod dma;
mod region;
mod sys;

use dma::{iova_ranges, IovaAlloc, VfioDma, IOVA_BASE};
use region::{map_bar, region_info};
use sys::{ioctl_ptr, ioctl_val};

/// MSI-X vectors enabled at most (and so eventfds opened): plenty for one
/// queue pair per core on the machines pollux targets.
const MAX_MSIX_VECTORS: u16 = 64;

/// Buffers at least this large get hugepages (when the pool has them);
/// smaller ones would waste most of a 2 MiB page, and behind an IOMMU
/// 4 KiB pages work just as well.
const HUGE_THRESHOLD: usize = HUGE_PAGE_SIZE / 2;

/// A controller bound to vfio-pci.
pub struct VfioPlatform {
    bdf: String,
    bar: Mmio,
    bar_map: (NonNull<u8>, usize),
    // Dropped after the BAR is unmapped (Drop below), before `dma`.
    device: Option<OwnedFd>,
    dma: Arc<VfioDma>,
    quirks: Quirks,
    /// MSI-X vectors the device offers (VFIO_DEVICE_GET_IRQ_INFO), capped
    /// at MAX_MSIX_VECTORS; 0 without MSI-X.
    msix_offered: u16,
    /// One eventfd per enabled MSI-X vector (all enabled at once on the
    /// first `enable_irq`); empty while MSI-X is off.
    msix: Mutex<Vec<OwnedFd>>,
}

// SAFETY: the raw BAR pointer is only used through `Mmio` (atomic accesses)
// and for munmap in Drop.
unsafe impl Send for VfioPlatform {}
// SAFETY: as above.
unsafe impl Sync for VfioPlatform {}

fn open_rw(path: &str) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

impl VfioPlatform {
    /// Opens the controller at `bdf` (e.g. `0000:00:01.0`), which must be
    /// bound to vfio-pci (`pollux setup bind BDF`).
    pub fn open(bdf: &str) -> Result<VfioPlatform> {
        let bdf = pci::normalize_bdf(bdf)?;
        let drv = pci::current_driver(&bdf)?;
        if drv.as_deref() != Some("vfio-pci") {
            return Err(Error::Platform(format!(
                "{bdf} is bound to {}, not vfio-pci: run `pollux setup bind {bdf}`",
                drv.as_deref().unwrap_or("no driver")
            )));
        }
        let group_no = pci::iommu_group(&bdf)?.ok_or_else(|| {
            Error::Platform(format!(
                "{bdf} has no IOMMU group: enable the IOMMU (intel_iommu=on / amd_iommu=on) or use uio_pci_generic"
            ))
        })?;

        let container = open_rw("/dev/vfio/vfio").map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    "no permission: run as root or give this user read/write access to it (it is normally mode 0666)"
                }
                _ => "is the vfio module loaded? `modprobe vfio-pci`",
            };
            Error::Platform(format!("/dev/vfio/vfio: {e} ({hint})"))
        })?;
        let v = ioctl_val(&container, sys::GET_API_VERSION, 0, "VFIO_GET_API_VERSION")?;
        if v != sys::API_VERSION {
            return Err(Error::Unsupported(format!(
                "VFIO API version {v}, pollux speaks {}",
                sys::API_VERSION
            )));
        }
        let iommu_type = [sys::TYPE1V2_IOMMU, sys::TYPE1_IOMMU]
            .into_iter()
            .find(|&t| {
                ioctl_val(
                    &container,
                    sys::CHECK_EXTENSION,
                    t as _,
                    "VFIO_CHECK_EXTENSION",
                )
                .is_ok_and(|r| r > 0)
            })
            .ok_or_else(|| {
                Error::Unsupported(
                    "VFIO offers no type1 IOMMU: load it with `modprobe vfio_iommu_type1` \
                     (`pollux setup bind` does)"
                        .into(),
                )
            })?;

        let gpath = format!("/dev/vfio/{group_no}");
        let group = open_rw(&gpath).map_err(|e| {
            let hint = match e.raw_os_error() {
                Some(libc::EBUSY) => {
                    " (the device is in use: another controller of this process, or another \
                     process, has its IOMMU group open, and VFIO allows one user)"
                }
                Some(libc::EACCES) | Some(libc::EPERM) => {
                    " (no permission: run as root or give this user read/write access to the \
                     group node, e.g. `chown USER` it; root-owned mode 0600 is the default)"
                }
                _ => "",
            };
            Error::Platform(format!("{bdf}: {gpath}: {e}{hint}"))
        })?;
        let mut st = sys::GroupStatus {
            argsz: std::mem::size_of::<sys::GroupStatus>() as u32,
            flags: 0,
        };
        ioctl_ptr(
            &group,
            sys::GROUP_GET_STATUS,
            &mut st,
            "VFIO_GROUP_GET_STATUS",
        )?;
        if st.flags & sys::GROUP_FLAGS_VIABLE == 0 {
            return Err(Error::Platform(format!(
                "IOMMU group {group_no} is not viable: every device in /sys/kernel/iommu_groups/{group_no}/devices must be bound to vfio-pci or to no driver"
            )));
        }
        let mut cfd = container.as_raw_fd();
        ioctl_ptr(
            &group,
            sys::GROUP_SET_CONTAINER,
            &mut cfd,
            "VFIO_GROUP_SET_CONTAINER",
        )?;
        ioctl_val(
            &container,
            sys::SET_IOMMU,
            iommu_type as _,
            "VFIO_SET_IOMMU",
        )?;
        let ranges = iova_ranges(&container)?;

        let cbdf = std::ffi::CString::new(bdf.as_str())
            .map_err(|_| Error::InvalidArgument("NUL in BDF".into()))?;
        // SAFETY: GET_DEVICE_FD takes a NUL-terminated device name.
        let dfd = unsafe {
            libc::ioctl(
                group.as_raw_fd(),
                sys::GROUP_GET_DEVICE_FD as _,
                cbdf.as_ptr(),
            )
        };
        if dfd < 0 {
            return Err(Error::Platform(format!(
                "VFIO_GROUP_GET_DEVICE_FD {bdf}: {}",
                std::io::Error::last_os_error()
            )));
        }
        // SAFETY: a fresh descriptor that we own from here on.
        let device = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(dfd) };

        let mut info = sys::DeviceInfo {
            argsz: std::mem::size_of::<sys::DeviceInfo>() as u32,
            ..Default::default()
        };
        ioctl_ptr(
            &device,
            sys::DEVICE_GET_INFO,
            &mut info,
            "VFIO_DEVICE_GET_INFO",
        )?;
        if info.flags & sys::DEVICE_FLAGS_PCI == 0
            || info.num_regions <= sys::PCI_CONFIG_REGION_INDEX
        {
            return Err(Error::Unsupported(format!(
                "{bdf} is not a VFIO PCI device (flags {:#x}, {} regions)",
                info.flags, info.num_regions
            )));
        }
        let bar0 = region_info(&device, sys::PCI_BAR0_REGION_INDEX)?;
        let cfg = region_info(&device, sys::PCI_CONFIG_REGION_INDEX)?;
        if bar0.size < 0x2000 {
            return Err(Error::Unsupported(format!(
                "BAR0 of {bdf} is {} bytes; an NVMe controller has at least 8 KiB",
                bar0.size
            )));
        }
        let (base, len) = map_bar(&device, &bar0)?;

        // Memory decoding + bus mastering, through the config region.
        let dev_file = File::from(device.try_clone().map_err(Error::Io)?);
        let mut cmd = [0u8; 2];
        dev_file
            .read_exact_at(&mut cmd, cfg.offset + pci::PCI_COMMAND)
            .map_err(|e| Error::Platform(format!("reading PCI command register: {e}")))?;
        let c = u16::from_le_bytes(cmd) | pci::PCI_COMMAND_MEMORY | pci::PCI_COMMAND_MASTER;
        dev_file
            .write_all_at(&c.to_le_bytes(), cfg.offset + pci::PCI_COMMAND)
            .map_err(|e| Error::Platform(format!("writing PCI command register: {e}")))?;

        let msix_offered = msix_count(&device).unwrap_or_else(|e| {
            tracing::warn!(%bdf, "{e}; interrupts unavailable");
            0
        });
        let quirks = super::quirks_for(pci::ids(&bdf)?);
        // SAFETY: base..base+len is the BAR0 mapping made above, unmapped
        // only in Drop, after every user (the controller) is gone.
        let bar = unsafe { Mmio::new(base, len) };
        tracing::debug!(%bdf, group = group_no, iommu_type, bar0_len = len, ?ranges, "VFIO device open");
        Ok(VfioPlatform {
            bdf,
            bar,
            bar_map: (base, len),
            device: Some(device),
            dma: Arc::new(VfioDma {
                _group: group,
                container,
                iova: Mutex::new(IovaAlloc {
                    ranges,
                    next: IOVA_BASE,
                }),
                bufs: Mutex::new(HashMap::new()),
            }),
            quirks,
            msix_offered,
            msix: Mutex::new(Vec::new()),
        })
    }

    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    fn device(&self) -> Result<&OwnedFd> {
        self.device
            .as_ref()
            .ok_or_else(|| Error::Platform(format!("vfio {}: device closed", self.bdf)))
    }

    /// VFIO_DEVICE_SET_IRQS (trigger action) on the MSI-X index.
    fn set_msix(&self, flags: u32, count: u32, fds: &[i32]) -> Result<i32> {
        let mut w = sys::irq_set(
            flags | sys::IRQ_SET_ACTION_TRIGGER,
            sys::PCI_MSIX_IRQ_INDEX,
            0,
            count,
            fds,
        );
        ioctl_ptr(
            self.device()?,
            sys::DEVICE_SET_IRQS,
            w.as_mut_ptr(),
            "VFIO_DEVICE_SET_IRQS (MSI-X)",
        )
    }

    /// Enables MSI-X vectors 0..n, each signalling a new eventfd. Kernels
    /// before 6.5 cannot add vectors while MSI-X is on (only by disabling
    /// it, which could lose interrupts), hence all at once. When the
    /// kernel can allocate fewer host vectors it says how many (a positive
    /// return): enable that many instead.
    fn enable_msix(&self, mut n: u16) -> Result<Vec<OwnedFd>> {
        loop {
            let fds = (0..n)
                .map(|_| super::irq::new_eventfd())
                .collect::<Result<Vec<_>>>()?;
            let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
            let r = self.set_msix(sys::IRQ_SET_DATA_EVENTFD, n as u32, &raw)?;
            match r {
                0 => {
                    tracing::debug!(bdf = %self.bdf, vectors = n, "MSI-X enabled");
                    return Ok(fds);
                }
                k if k > 0 && (k as u16) < n => {
                    tracing::info!(bdf = %self.bdf, asked = n, available = k, "fewer MSI-X vectors available");
                    n = k as u16;
                }
                k => {
                    return Err(Error::Platform(format!(
                        "VFIO_DEVICE_SET_IRQS: enabling {n} MSI-X vectors of {} returned {k}",
                        self.bdf
                    )))
                }
            }
        }
    }
}

/// MSI-X vectors the device offers (capped), from VFIO_DEVICE_GET_IRQ_INFO.
fn msix_count(device: &OwnedFd) -> Result<u16> {
    let mut info = sys::IrqInfo {
        argsz: std::mem::size_of::<sys::IrqInfo>() as u32,
        index: sys::PCI_MSIX_IRQ_INDEX,
        ..Default::default()
    };
    ioctl_ptr(
        device,
        sys::DEVICE_GET_IRQ_INFO,
        &mut info,
        "VFIO_DEVICE_GET_IRQ_INFO (MSI-X)",
    )?;
    if info.flags & sys::IRQ_INFO_EVENTFD == 0 {
        return Ok(0);
    }
    Ok(info.count.min(MAX_MSIX_VECTORS as u32) as u16)
}

impl Platform for VfioPlatform {
    fn describe(&self) -> String {
        format!("vfio {}", self.bdf)
    }

    fn bar0(&self) -> &Mmio {
        &self.bar
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        // Not mlock'ed: the IOMMU mapping below pins the pages.
        let mem = HostMem::alloc(len, len >= HUGE_THRESHOLD, false)
            .map_err(|e| Error::Dma(format!("allocating {len} bytes: {e}")))?;
        let align = match mem.kind() {
            PageKind::Huge2M => HUGE_PAGE_SIZE as u64,
            PageKind::Small4K => PAGE_SIZE as u64,
        };
        let iova = self
            .dma
            .iova
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .alloc(mem.len() as u64, align)
            .ok_or_else(|| Error::Dma("IOVA space exhausted".into()))?;
        self.dma.map(&mem, iova)?;
        let ptr = mem.ptr();
        self.dma
            .bufs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(iova, mem);
        // SAFETY: ptr..ptr+len lies in the HostMem now owned by the map,
        // mapped at iova..iova+len; VfioDma::release unmaps and frees it.
        Ok(unsafe { DmaBuffer::from_raw(ptr, len, Iova::Contiguous(iova), self.dma.clone()) })
    }

    fn quirks(&self) -> Quirks {
        self.quirks
    }

    fn irq_vectors(&self) -> u16 {
        let on = self.msix.lock().unwrap_or_else(|p| p.into_inner()).len();
        if on > 0 {
            on as u16
        } else {
            self.msix_offered
        }
    }

    /// MSI-X vector `vector`: on the first call every vector is enabled,
    /// each with its own eventfd (see `enable_msix`); returns a duplicate
    /// of that vector's eventfd. The platform keeps the originals and
    /// disables MSI-X when dropped.
    fn enable_irq(&self, vector: u16) -> Result<IrqFd> {
        if self.msix_offered == 0 {
            return Err(Error::Unsupported(format!(
                "interrupts not supported by vfio {}: it offers no MSI-X vectors",
                self.bdf
            )));
        }
        let mut msix = self.msix.lock().unwrap_or_else(|p| p.into_inner());
        if msix.is_empty() {
            if vector >= self.msix_offered {
                return Err(out_of_range(vector, self.msix_offered, &self.bdf));
            }
            *msix = self.enable_msix(self.msix_offered)?;
        }
        let fd = msix
            .get(vector as usize)
            .ok_or_else(|| out_of_range(vector, msix.len() as u16, &self.bdf))?;
        let dup = fd.try_clone().map_err(|e| {
            Error::Platform(format!(
                "duplicating the eventfd of MSI-X vector {vector}: {e}"
            ))
        })?;
        Ok(IrqFd::from_own_eventfd(dup))
    }
}

fn out_of_range(vector: u16, n: u16, bdf: &str) -> Error {
    Error::InvalidArgument(format!(
        "interrupt vector {vector} out of range: vfio {bdf} has {n} MSI-X vectors (0..={})",
        n.saturating_sub(1)
    ))
}

impl Drop for VfioPlatform {
    fn drop(&mut self) {
        let msix = self.msix.get_mut().unwrap_or_else(|p| p.into_inner());
        if !msix.is_empty() {
            // Closing the device would disable MSI-X too; say so explicitly
            // (and log if the kernel objects).
            if let Err(e) = self.set_msix(sys::IRQ_SET_DATA_NONE, 0, &[]) {
                tracing::warn!(bdf = %self.bdf, "disabling MSI-X: {e}");
            }
        }
        // SAFETY: the BAR reservation made in map_bar; the controller using
        // it has been shut down (the platform is dropped last).
        unsafe { libc::munmap(self.bar_map.0.as_ptr().cast(), self.bar_map.1) };
        // Closing the device descriptor makes vfio-pci disable the device
        // (bus mastering off). DMA buffers still alive keep the container
        // (and so their IOMMU mappings) until they are dropped.
        self.device.take();
    }
}

#[cfg(test)]
mod tests;
