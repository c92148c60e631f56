//! VFIO ioctl numbers and structures (linux/vfio.h). `_IO(';', 100 + n)`:
//! VFIO ioctls carry their size in `argsz`, not in the ioctl number.

use std::os::fd::AsRawFd;

use crate::error::{Error, Result};

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

pub fn ioctl_ptr<T>(fd: &impl AsRawFd, req: u64, arg: *mut T, what: &str) -> Result<i32> {
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

pub fn ioctl_val(fd: &impl AsRawFd, req: u64, arg: libc::c_ulong, what: &str) -> Result<i32> {
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
