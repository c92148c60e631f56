//! DMA: the container's IOMMU mappings and the IOVA allocator.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::Mutex;

use super::region::{caps, read_u32};
use super::sys::{self, ioctl_ptr};
use crate::dma::{DmaRelease, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::platform::hugemem::HostMem;

/// First IOVA handed out: 4 GiB, above the x86 interrupt window
/// (0xfee00000) and any 32-bit quirks, and well inside the 39-bit address
/// width of common (and QEMU's default) IOMMUs.
pub(super) const IOVA_BASE: u64 = 1 << 32;

/// Bump allocator over the IOMMU's usable IOVA ranges. IOVAs are never
/// reused, so a stale bus address can never reach a newer buffer.
pub(super) struct IovaAlloc {
    /// Usable ranges, inclusive ends, sorted.
    pub(super) ranges: Vec<(u64, u64)>,
    pub(super) next: u64,
}

impl IovaAlloc {
    pub(super) fn alloc(&mut self, len: u64, align: u64) -> Option<u64> {
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
pub(super) struct VfioDma {
    // Field order is drop order: the group detaches from the container
    // before the container closes (closing either tears down all mappings).
    pub(super) _group: File,
    pub(super) container: File,
    pub(super) iova: Mutex<IovaAlloc>,
    /// IOVA -> the memory mapped there.
    pub(super) bufs: Mutex<HashMap<u64, HostMem>>,
}

impl VfioDma {
    pub(super) fn map(&self, mem: &HostMem, iova: u64) -> Result<()> {
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
                    crate::platform::hugemem::memlock_limit()
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

/// The IOMMU's usable IOVA ranges (the type1 IOVA-range capability), or
/// everything from IOVA_BASE up to 2^39 (the smallest common IOMMU address
/// width) when the kernel does not report them.
pub(super) fn iova_ranges(container: &File) -> Result<Vec<(u64, u64)>> {
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
