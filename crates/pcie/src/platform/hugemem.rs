//! Host memory for DMA on real hardware (the VFIO and UIO platforms).
//!
//! Two kinds of backing:
//!
//! * **2 MiB hugepages** — a `memfd_create(MFD_HUGETLB | MFD_HUGE_2MB)` file,
//!   mapped shared and populated at once. Hugetlb pages are never swapped or
//!   moved by compaction, and each 2 MiB page is physically contiguous, which
//!   is what UIO (no IOMMU) needs. They come from the pool reserved in
//!   `/proc/sys/vm/nr_hugepages` (`pollux setup hugepages N`).
//! * **4 KiB pages** — anonymous memory, populated and `mlock`ed. Physically
//!   scattered: fine behind an IOMMU (VFIO maps any pages to one contiguous
//!   IOVA range), usable without an IOMMU only one page at a time.
//!
//! Both are zero-filled (fresh anonymous / hugetlb memory) and unmapped on
//! drop. Nothing here registers memory with a device: that is the platform's
//! job, and the platform must unregister (or quarantine) before dropping.
use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;

use crate::dma::PAGE_SIZE;

/// Size of the hugepages pollux uses.
pub const HUGE_PAGE_SIZE: usize = 2 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageKind {
    Huge2M,
    Small4K,
}

impl PageKind {
    pub fn size(self) -> usize {
        match self {
            PageKind::Huge2M => HUGE_PAGE_SIZE,
            PageKind::Small4K => PAGE_SIZE,
        }
    }
}

/// A mapped, populated, zeroed host memory region. Unmapped on drop.
#[derive(Debug)]
pub struct HostMem {
    ptr: NonNull<u8>,
    len: usize,
    kind: PageKind,
}

// SAFETY: HostMem owns its mapping; it is only a pointer and a length.
unsafe impl Send for HostMem {}
// SAFETY: &HostMem hands out no references into the memory.
unsafe impl Sync for HostMem {}

impl HostMem {
    /// `len` bytes (rounded up to 2 MiB) of hugepage memory.
    pub fn huge(len: usize) -> io::Result<HostMem> {
        let len = len.max(1).div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
        let name: &CStr = c"pollux-dma";
        // SAFETY: valid NUL-terminated name; flags are plain integers.
        let fd = unsafe {
            libc::memfd_create(
                name.as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_HUGETLB | libc::MFD_HUGE_2MB,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own; OwnedFd closes it.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // A shared hugetlb mapping reserves its pages at mmap time, so an
        // exhausted pool fails here (ENOMEM) rather than with SIGBUS later.
        // SAFETY: new mapping of our memfd, checked for MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // The mapping keeps the memory; the descriptor is no longer needed.
        drop(fd);
        let m = HostMem {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))?,
            len,
            kind: PageKind::Huge2M,
        };
        m.lock()?;
        Ok(m)
    }

    /// `len` bytes (rounded up to 4 KiB) of ordinary, locked memory.
    pub fn small(len: usize) -> io::Result<HostMem> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let m = HostMem {
            ptr: mmap_anon(len)?,
            len,
            kind: PageKind::Small4K,
        };
        m.lock()?;
        Ok(m)
    }

    /// `len` bytes (rounded up to 4 KiB) of ordinary memory, populated but
    /// not mlock'ed: for VFIO, whose VFIO_IOMMU_MAP_DMA pins the pages itself
    /// and charges them to RLIMIT_MEMLOCK; locking them as well would count
    /// them twice (measured in the guest: a 4 KiB buffer needed 8 KiB of
    /// limit).
    pub fn small_unlocked(len: usize) -> io::Result<HostMem> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        Ok(HostMem {
            ptr: mmap_anon(len)?,
            len,
            kind: PageKind::Small4K,
        })
    }

    /// Hugepages if `prefer_huge` and the pool has them, else 4 KiB pages,
    /// mlock'ed only if `lock_small` (see `small_unlocked`).
    pub fn alloc(len: usize, prefer_huge: bool, lock_small: bool) -> io::Result<HostMem> {
        if prefer_huge {
            match HostMem::huge(len) {
                Ok(m) => return Ok(m),
                Err(e) => tracing::debug!(len, "no hugepage memory ({e}); using 4 KiB pages"),
            }
        }
        if lock_small {
            HostMem::small(len)
        } else {
            HostMem::small_unlocked(len)
        }
    }

    fn lock(&self) -> io::Result<()> {
        // Locked: never swapped out (its bus address must not change under
        // the device), and faulted in now rather than on the first DMA.
        // SAFETY: our own mapping.
        if unsafe { libc::mlock(self.ptr.as_ptr().cast(), self.len) } != 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "mlock of {} bytes failed: {e} (the locked-memory limit, RLIMIT_MEMLOCK, is {}: \
                     raise it with `ulimit -l` or run as root)",
                    self.len,
                    memlock_limit()
                ),
            ));
        }
        Ok(())
    }

    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn kind(&self) -> PageKind {
        self.kind
    }
}

impl Drop for HostMem {
    fn drop(&mut self) {
        // SAFETY: we mapped exactly this range; the owner guarantees that no
        // device can reach it any more (unmapped from the IOMMU, or the
        // device's bus mastering is off).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The soft locked-memory limit (RLIMIT_MEMLOCK, `ulimit -l`) for error
/// messages: "8192 KiB", "unlimited". mlock'ed memory and memory pinned for
/// VFIO DMA both count against it unless the process has CAP_IPC_LOCK.
pub fn memlock_limit() -> String {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } != 0 {
        return "unknown".into();
    }
    if r.rlim_cur == libc::RLIM_INFINITY {
        "unlimited".into()
    } else {
        format!("{} KiB", r.rlim_cur / 1024)
    }
}

/// Free 2 MiB hugepages in the system pool (`None` if the kernel has no
/// hugetlb support).
pub fn free_hugepages() -> Option<u64> {
    std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Physical addresses of the 4 KiB pages of `ptr..ptr+len` (each page must
/// be resident: locked memory), from `/proc/self/pagemap`. Needs
/// CAP_SYS_ADMIN: without it the kernel reports every frame number as 0.
pub fn phys_addrs(ptr: NonNull<u8>, len: usize) -> io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open("/proc/self/pagemap")?;
    let first = ptr.as_ptr() as usize / PAGE_SIZE;
    let n = len.div_ceil(PAGE_SIZE);
    let mut raw = vec![0u8; n * 8];
    f.read_exact_at(&mut raw, (first * 8) as u64)?;
    let mut out = Vec::with_capacity(n);
    for (i, e) in raw.chunks_exact(8).enumerate() {
        let e = u64::from_le_bytes(e.try_into().expect("8-byte chunk"));
        let present = e >> 63 & 1 == 1;
        let pfn = e & ((1 << 55) - 1);
        if !present {
            return Err(io::Error::other(format!(
                "page {i} of a locked DMA buffer is not present in /proc/self/pagemap"
            )));
        }
        if pfn == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "/proc/self/pagemap hides physical addresses: uio_pci_generic needs root \
                 (CAP_SYS_ADMIN) to learn them; run as root or use vfio-pci",
            ));
        }
        out.push(pfn * PAGE_SIZE as u64);
    }
    Ok(out)
}

/// `len` bytes (a multiple of 4 KiB) of zeroed, populated, private anonymous
/// memory; the caller unmaps it with `munmap`. Not locked: the soft platform
/// must not need RLIMIT_MEMLOCK, the real-hardware platforms lock it.
pub fn mmap_anon(len: usize) -> io::Result<NonNull<u8>> {
    debug_assert!(len > 0 && len.is_multiple_of(PAGE_SIZE));
    // SAFETY: anonymous private mapping, checked for MAP_FAILED.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_is_zeroed_locked_and_rounded() {
        let m = HostMem::small(5000).unwrap();
        assert_eq!(m.len(), 8192);
        assert_eq!(m.kind(), PageKind::Small4K);
        // SAFETY: we own the mapping, len bytes.
        let s = unsafe { std::slice::from_raw_parts_mut(m.ptr().as_ptr(), m.len()) };
        assert!(s.iter().all(|&b| b == 0));
        s[8191] = 1;
    }

    #[test]
    fn alloc_falls_back_without_hugepages() {
        // Whether or not the host has hugepages reserved, alloc succeeds.
        let none_free = free_hugepages().unwrap_or(0) == 0;
        let m = HostMem::alloc(3 << 20, true, true).unwrap();
        assert!(m.len() >= 3 << 20);
        if none_free {
            assert_eq!(m.kind(), PageKind::Small4K);
        }
    }
}
