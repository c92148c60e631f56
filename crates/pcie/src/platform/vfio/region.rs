//! Device regions: region info, capability chains, and mapping BAR0.

use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;

use super::sys::{self, ioctl_ptr};
use crate::dma::PAGE_SIZE;
use crate::error::{Error, Result};

pub(super) fn region_info(device: &OwnedFd, index: u32) -> Result<sys::RegionInfo> {
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
pub(super) fn caps(buf: &[u64], mut off: u32) -> Vec<(u16, usize)> {
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

pub(super) fn read_u32(buf: &[u64], byte: usize) -> u32 {
    let w = buf[byte / 8];
    (w >> ((byte % 8) * 8)) as u32
}

/// Maps BAR0. Where the kernel forbids mapping part of it (the MSI-X table
/// on kernels/platforms without interrupt remapping: a sparse-mmap
/// capability), reserves the whole window inaccessible and maps the
/// allowed areas into it; the NVMe registers and doorbells are in them.
pub(super) fn map_bar(device: &OwnedFd, bar0: &sys::RegionInfo) -> Result<(NonNull<u8>, usize)> {
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
