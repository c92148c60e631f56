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
use crate::dma::{DmaBuffer, DmaRelease, Iova, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mmio::Mmio;

/// VFIO ioctl numbers and structures (linux/vfio.h). `_IO(';', 100 + n)`:
/// VFIO ioctls carry their size in `argsz`, not in the ioctl number.
mod sys {
    const fn io(nr: u64) -> u64 {
        ((b';' as u64) << 8) | (100 + nr)
    }
    pub const GET_API_VERSION: u64 = io(0);
    pub const CHECK_EXTENSION: u64 = io(1);
    pub const SET_IOMMU: u64 = io(2);
    pub const GROUP_GET_STATUS: u64 = io(3);
    pub const GROUP_SET_CONTAINER: u64 = io(4);
    pub const GROUP_GET_DEVICE_FD: u64 = io(6);
    pub const DEVICE_GET_INFO: u64 = io(7);
    pub const DEVICE_GET_REGION_INFO: u64 = io(8);
    pub const DEVICE_GET_IRQ_INFO: u64 = io(9);
    pub const DEVICE_SET_IRQS: u64 = io(10);
    pub const IOMMU_GET_INFO: u64 = io(12);
    pub const IOMMU_MAP_DMA: u64 = io(13);
    pub const IOMMU_UNMAP_DMA: u64 = io(14);

    pub const API_VERSION: i32 = 0;
    pub const TYPE1_IOMMU: u64 = 1;
    pub const TYPE1V2_IOMMU: u64 = 3;
    pub const GROUP_FLAGS_VIABLE: u32 = 1;
    pub const DEVICE_FLAGS_PCI: u32 = 1 << 1;
    pub const PCI_BAR0_REGION_INDEX: u32 = 0;
    pub const PCI_CONFIG_REGION_INDEX: u32 = 7;
    pub const REGION_INFO_FLAG_MMAP: u32 = 1 << 2;
    pub const REGION_INFO_FLAG_CAPS: u32 = 1 << 3;
    pub const REGION_INFO_CAP_SPARSE_MMAP: u16 = 1;
    pub const IOMMU_INFO_CAPS: u32 = 1 << 1;
    pub const IOMMU_TYPE1_INFO_CAP_IOVA_RANGE: u16 = 1;
    pub const DMA_MAP_FLAG_READ: u32 = 1;
    pub const DMA_MAP_FLAG_WRITE: u32 = 2;
    pub const PCI_MSIX_IRQ_INDEX: u32 = 2;
    pub const IRQ_INFO_EVENTFD: u32 = 1;
    pub const IRQ_SET_DATA_NONE: u32 = 1;
    pub const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
    pub const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

    #[repr(C)]
    #[derive(Default)]
    pub struct GroupStatus {
        pub argsz: u32,
        pub flags: u32,
    }

    #[repr(C)]
    #[derive(Default)]
    pub struct DeviceInfo {
        pub argsz: u32,
        pub flags: u32,
        pub num_regions: u32,
        pub num_irqs: u32,
    }

    #[repr(C)]
    #[derive(Default, Clone, Copy, Debug)]
    pub struct RegionInfo {
        pub argsz: u32,
        pub flags: u32,
        pub index: u32,
        pub cap_offset: u32,
        pub size: u64,
        pub offset: u64,
    }

    #[repr(C)]
    #[derive(Default)]
    pub struct IommuInfo {
        pub argsz: u32,
        pub flags: u32,
        pub iova_pgsizes: u64,
        pub cap_offset: u32,
        pub pad: u32,
    }

    #[repr(C)]
    pub struct DmaMap {
        pub argsz: u32,
        pub flags: u32,
        pub vaddr: u64,
        pub iova: u64,
        pub size: u64,
    }

    #[repr(C)]
    pub struct DmaUnmap {
        pub argsz: u32,
        pub flags: u32,
        pub iova: u64,
        pub size: u64,
    }

    #[repr(C)]
    #[derive(Default)]
    pub struct IrqInfo {
        pub argsz: u32,
        pub flags: u32,
        pub index: u32,
        pub count: u32,
    }

    /// `struct vfio_irq_set`: the header; `data` (here eventfds, one i32
    /// per vector from `start`) follows it, `argsz` covers both.
    #[repr(C)]
    pub struct IrqSet {
        pub argsz: u32,
        pub flags: u32,
        pub index: u32,
        pub start: u32,
        pub count: u32,
        pub data: [i32; 0],
    }

    /// An `IrqSet` for vectors `start..start + count` with `fds` as data
    /// (empty for DATA_NONE), as u32 words: header, then the fds.
    pub fn irq_set(flags: u32, index: u32, start: u32, count: u32, fds: &[i32]) -> Vec<u32> {
        let argsz = std::mem::size_of::<IrqSet>() + std::mem::size_of_val(fds);
        let mut w = vec![argsz as u32, flags, index, start, count];
        w.extend(fds.iter().map(|&fd| fd as u32));
        w
    }
}

/// MSI-X vectors enabled at most (and so eventfds opened): plenty for one
/// queue pair per core on the machines pollux targets.
const MAX_MSIX_VECTORS: u16 = 64;

/// First IOVA handed out: 4 GiB, above the x86 interrupt window
/// (0xfee00000) and any 32-bit quirks, and well inside the 39-bit address
/// width of common (and QEMU's default) IOMMUs.
const IOVA_BASE: u64 = 1 << 32;

/// Buffers at least this large get hugepages (when the pool has them);
/// smaller ones would waste most of a 2 MiB page, and behind an IOMMU
/// 4 KiB pages work just as well.
const HUGE_THRESHOLD: usize = HUGE_PAGE_SIZE / 2;

fn ioctl_ptr<T>(fd: &impl AsRawFd, req: u64, arg: *mut T, what: &str) -> Result<i32> {
    // SAFETY: every caller passes a VFIO request number together with a
    // pointer to the matching, initialised repr(C) structure (with argsz
    // set), which lives across the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        return Err(Error::Platform(format!(
            "{what}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(r)
}

fn ioctl_val(fd: &impl AsRawFd, req: u64, arg: libc::c_ulong, what: &str) -> Result<i32> {
    // SAFETY: VFIO requests that take an integer argument (or none).
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, arg) };
    if r < 0 {
        return Err(Error::Platform(format!(
            "{what}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(r)
}

/// Bump allocator over the IOMMU's usable IOVA ranges. IOVAs are never
/// reused, so a stale bus address can never reach a newer buffer.
struct IovaAlloc {
    /// Usable ranges, inclusive ends, sorted.
    ranges: Vec<(u64, u64)>,
    next: u64,
}

impl IovaAlloc {
    fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
        for &(start, end) in &self.ranges {
            let cand = self.next.max(start).next_multiple_of(align);
            if cand >= start && cand.checked_add(len - 1)? <= end {
                // One unmapped page after each buffer: an overrun faults.
                self.next = cand + len + PAGE_SIZE as u64;
                return Some(cand);
            }
        }
        None
    }
}

/// The container (and the group attached to it): owns the IOMMU mappings.
struct VfioDma {
    // Field order is drop order: the group detaches from the container
    // before the container closes (closing either tears down all mappings).
    _group: File,
    container: File,
    iova: Mutex<IovaAlloc>,
    /// IOVA -> the memory mapped there.
    bufs: Mutex<HashMap<u64, HostMem>>,
}

impl VfioDma {
    fn map(&self, mem: &HostMem, iova: u64) -> Result<()> {
        let mut m = sys::DmaMap {
            argsz: std::mem::size_of::<sys::DmaMap>() as u32,
            flags: sys::DMA_MAP_FLAG_READ | sys::DMA_MAP_FLAG_WRITE,
            vaddr: mem.ptr().as_ptr() as u64,
            iova,
            size: mem.len() as u64,
        };
        // SAFETY: MAP_DMA with its initialised repr(C) argument, which
        // lives across the call.
        if unsafe { libc::ioctl(self.container.as_raw_fd(), sys::IOMMU_MAP_DMA as _, &mut m) } < 0 {
            let e = std::io::Error::last_os_error();
            // Pinning is charged to RLIMIT_MEMLOCK (unless CAP_IPC_LOCK):
            // over it, type1 fails with ENOMEM (EPERM for some setups).
            let hint = match e.raw_os_error() {
                Some(libc::ENOMEM) | Some(libc::EPERM) => format!(
                    ": pinning it for DMA probably exceeds the locked-memory limit, RLIMIT_MEMLOCK \
                     (now {}): raise it with `ulimit -l` or run as root",
                    super::hugemem::memlock_limit()
                ),
                _ => String::new(),
            };
            return Err(Error::Dma(format!(
                "VFIO_IOMMU_MAP_DMA of {} bytes at IOVA {iova:#x}: {e}{hint}",
                mem.len()
            )));
        }
        Ok(())
    }

    fn unmap(&self, iova: u64, len: usize) -> Result<()> {
        let mut u = sys::DmaUnmap {
            argsz: std::mem::size_of::<sys::DmaUnmap>() as u32,
            flags: 0,
            iova,
            size: len as u64,
        };
        ioctl_ptr(
            &self.container,
            sys::IOMMU_UNMAP_DMA,
            &mut u,
            "VFIO_IOMMU_UNMAP_DMA",
        )?;
        if u.size != len as u64 {
            return Err(Error::Dma(format!(
                "VFIO_IOMMU_UNMAP_DMA unmapped {} of {len} bytes at {iova:#x}",
                u.size
            )));
        }
        Ok(())
    }
}

impl DmaRelease for VfioDma {
    fn release(&self, _ptr: NonNull<u8>, len: usize, iova: u64) {
        let mut bufs = self.bufs.lock().unwrap_or_else(|p| p.into_inner());
        let Some(mem) = bufs.get(&iova) else {
            tracing::error!(iova, "release of an unknown VFIO DMA buffer");
            return;
        };
        // Unmap first: afterwards the device cannot reach the memory, so
        // freeing it cannot race with DMA.
        if let Err(e) = self.unmap(iova, mem.len()) {
            tracing::error!(
                iova,
                len,
                "{e}; leaking the buffer rather than freeing memory the device may still use"
            );
            if let Some(m) = bufs.remove(&iova) {
                std::mem::forget(m);
            }
            return;
        }
        bufs.remove(&iova); // drops (munmaps) it
    }
}

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

fn region_info(device: &OwnedFd, index: u32) -> Result<sys::RegionInfo> {
    let mut r = sys::RegionInfo {
        argsz: std::mem::size_of::<sys::RegionInfo>() as u32,
        index,
        ..Default::default()
    };
    ioctl_ptr(
        device,
        sys::DEVICE_GET_REGION_INFO,
        &mut r,
        "VFIO_DEVICE_GET_REGION_INFO",
    )?;
    Ok(r)
}

/// Region info with its capability chain (argsz grown as the kernel asks).
fn region_info_caps(device: &OwnedFd, index: u32) -> Result<Vec<u64>> {
    let mut buf = vec![0u64; 4];
    loop {
        let argsz = (buf.len() * 8) as u32;
        // SAFETY: buf is at least as large as RegionInfo and u64-aligned.
        let r = unsafe { &mut *(buf.as_mut_ptr() as *mut sys::RegionInfo) };
        r.argsz = argsz;
        r.index = index;
        ioctl_ptr(
            device,
            sys::DEVICE_GET_REGION_INFO,
            r,
            "VFIO_DEVICE_GET_REGION_INFO",
        )?;
        if r.argsz <= argsz {
            return Ok(buf);
        }
        buf = vec![0u64; (r.argsz as usize).div_ceil(8)];
    }
}

/// Walks a VFIO capability chain in `buf` (u64 words of an info struct)
/// starting at byte offset `off`; returns (id, byte offset) pairs.
fn caps(buf: &[u64], mut off: u32) -> Vec<(u16, usize)> {
    let bytes: &[u8] =
        // SAFETY: reinterpreting initialised u64s as bytes.
        unsafe { std::slice::from_raw_parts(buf.as_ptr().cast(), buf.len() * 8) };
    let mut out = Vec::new();
    while off != 0 && (off as usize) + 8 <= bytes.len() && out.len() < 64 {
        let o = off as usize;
        let id = u16::from_le_bytes([bytes[o], bytes[o + 1]]);
        let next = u32::from_le_bytes(bytes[o + 4..o + 8].try_into().expect("4 bytes"));
        out.push((id, o));
        off = next;
    }
    out
}

fn read_u32(buf: &[u64], byte: usize) -> u32 {
    let w = buf[byte / 8];
    (w >> ((byte % 8) * 8)) as u32
}

/// Maps BAR0. Where the kernel forbids mapping part of it (the MSI-X table
/// on kernels/platforms without interrupt remapping: a sparse-mmap
/// capability), reserves the whole window inaccessible and maps the
/// allowed areas into it; the NVMe registers and doorbells are in them.
fn map_bar(device: &OwnedFd, bar0: &sys::RegionInfo) -> Result<(NonNull<u8>, usize)> {
    if bar0.flags & sys::REGION_INFO_FLAG_MMAP == 0 {
        return Err(Error::Unsupported(
            "BAR0 cannot be mmap'd through VFIO".into(),
        ));
    }
    let len = bar0.size as usize;
    let mut areas = vec![(0u64, bar0.size)];
    if bar0.flags & sys::REGION_INFO_FLAG_CAPS != 0 {
        let buf = region_info_caps(device, sys::PCI_BAR0_REGION_INDEX)?;
        let cap_off = read_u32(&buf, 12);
        for (id, o) in caps(&buf, cap_off) {
            if id == sys::REGION_INFO_CAP_SPARSE_MMAP {
                // struct { header(8); u32 nr_areas; u32 reserved; {u64 offset; u64 size}[] }
                let n = read_u32(&buf, o + 8) as usize;
                areas = (0..n)
                    .filter_map(|i| {
                        let w = (o + 16) / 8 + 2 * i;
                        Some((*buf.get(w)?, *buf.get(w + 1)?))
                    })
                    .filter(|&(_, s)| s > 0)
                    .collect();
            }
        }
    }
    // Reserve the window, then map the allowed areas over it.
    // SAFETY: a fresh inaccessible anonymous mapping, checked below.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(Error::Platform(format!(
            "reserving {len} bytes for BAR0: {}",
            std::io::Error::last_os_error()
        )));
    }
    for &(off, size) in &areas {
        if off + size > bar0.size || off % PAGE_SIZE as u64 != 0 {
            continue;
        }
        // SAFETY: MAP_FIXED inside our own reservation (checked bounds),
        // backed by the device's BAR0 region at its region offset.
        let p = unsafe {
            libc::mmap(
                base.cast::<u8>().add(off as usize).cast(),
                size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                device.as_raw_fd(),
                (bar0.offset + off) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            let e = std::io::Error::last_os_error();
            // SAFETY: our reservation.
            unsafe { libc::munmap(base, len) };
            return Err(Error::Platform(format!(
                "mmap of BAR0 [{off:#x}, +{size:#x}): {e}"
            )));
        }
    }
    // The registers and the first doorbells must be reachable.
    if !areas.iter().any(|&(o, s)| o == 0 && s >= 0x2000) {
        // SAFETY: our reservation.
        unsafe { libc::munmap(base, len) };
        return Err(Error::Unsupported(format!(
            "VFIO does not let BAR0's registers be mapped (mappable areas {areas:x?})"
        )));
    }
    let base = NonNull::new(base.cast::<u8>())
        .ok_or_else(|| Error::Platform("mmap returned null".into()))?;
    Ok((base, len))
}

/// The IOMMU's usable IOVA ranges (the type1 IOVA-range capability), or
/// everything from IOVA_BASE up to 2^39 (the smallest common IOMMU address
/// width) when the kernel does not report them.
fn iova_ranges(container: &File) -> Result<Vec<(u64, u64)>> {
    let mut buf = vec![0u64; 3];
    loop {
        let argsz = (buf.len() * 8) as u32;
        // SAFETY: buf is at least as large as IommuInfo and u64-aligned.
        let info = unsafe { &mut *(buf.as_mut_ptr() as *mut sys::IommuInfo) };
        info.argsz = argsz;
        ioctl_ptr(container, sys::IOMMU_GET_INFO, info, "VFIO_IOMMU_GET_INFO")?;
        if info.argsz <= argsz {
            break;
        }
        buf = vec![0u64; (info.argsz as usize).div_ceil(8)];
    }
    let flags = read_u32(&buf, 4);
    let mut ranges = Vec::new();
    if flags & sys::IOMMU_INFO_CAPS != 0 {
        for (id, o) in caps(&buf, read_u32(&buf, 16)) {
            if id == sys::IOMMU_TYPE1_INFO_CAP_IOVA_RANGE {
                // struct { header(8); u32 nr_iovas; u32 reserved; {u64 start; u64 end}[] }
                let n = read_u32(&buf, o + 8) as usize;
                for i in 0..n {
                    let w = (o + 16) / 8 + 2 * i;
                    if let (Some(&s), Some(&e)) = (buf.get(w), buf.get(w + 1)) {
                        ranges.push((s, e));
                    }
                }
            }
        }
    }
    if ranges.is_empty() {
        ranges.push((IOVA_BASE, (1 << 39) - 1));
    }
    ranges.sort_unstable();
    Ok(ranges)
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
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_linux() {
        // linux/vfio.h: VFIO_GET_API_VERSION = _IO(';', 100) = 0x3b64 ...
        assert_eq!(sys::GET_API_VERSION, 0x3b64);
        assert_eq!(sys::GROUP_GET_DEVICE_FD, 0x3b6a);
        assert_eq!(sys::IOMMU_MAP_DMA, 0x3b71);
        assert_eq!(sys::IOMMU_UNMAP_DMA, 0x3b72);
        assert_eq!(std::mem::size_of::<sys::RegionInfo>(), 32);
        assert_eq!(std::mem::size_of::<sys::DmaMap>(), 32);
        assert_eq!(std::mem::size_of::<sys::DmaUnmap>(), 24);
        assert_eq!(std::mem::size_of::<sys::IommuInfo>(), 24);
        // VFIO_DEVICE_GET_IRQ_INFO = _IO(';', 100 + 9), SET_IRQS = + 10.
        assert_eq!(sys::DEVICE_GET_IRQ_INFO, 0x3b6d);
        assert_eq!(sys::DEVICE_SET_IRQS, 0x3b6e);
        assert_eq!(std::mem::size_of::<sys::IrqInfo>(), 16);
        assert_eq!(std::mem::size_of::<sys::IrqSet>(), 20);
        assert_eq!(std::mem::offset_of!(sys::IrqSet, data), 20);
        assert_eq!(std::mem::align_of::<sys::IrqSet>(), 4);
    }

    #[test]
    fn irq_set_layout() {
        // Enable vectors 0..3 with fds 7, 8, 9: header then the fds.
        let w = sys::irq_set(
            sys::IRQ_SET_DATA_EVENTFD | sys::IRQ_SET_ACTION_TRIGGER,
            sys::PCI_MSIX_IRQ_INDEX,
            0,
            3,
            &[7, 8, 9],
        );
        assert_eq!(w, [32, 0x24, 2, 0, 3, 7, 8, 9]);
        // Disable: DATA_NONE, count 0, no data.
        let w = sys::irq_set(
            sys::IRQ_SET_DATA_NONE | sys::IRQ_SET_ACTION_TRIGGER,
            sys::PCI_MSIX_IRQ_INDEX,
            0,
            0,
            &[],
        );
        assert_eq!(w, [20, 0x21, 2, 0, 0]);
    }

    #[test]
    fn iova_alloc_respects_ranges_and_alignment() {
        let mut a = IovaAlloc {
            ranges: vec![(0, 0xfedf_ffff), (0xfef0_0000, (1 << 39) - 1)],
            next: 0xfed0_0000,
        };
        // Does not fit below the hole: goes above it, 2 MiB aligned.
        let x = a.alloc(0x20_0000, 0x20_0000).unwrap();
        assert_eq!(x, 0xff00_0000);
        let y = a.alloc(0x1000, 0x1000).unwrap();
        assert_eq!(y, x + 0x20_0000 + 0x1000);
        assert!(a.alloc(1 << 40, 0x1000).is_none());
    }
}
