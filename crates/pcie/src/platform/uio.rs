//! UIO platform (uio_pci_generic): no IOMMU, physical addresses.
//!
//! BAR0 is mapped through sysfs (`/sys/bus/pci/devices/BDF/resource0`), bus
//! mastering is enabled by writing the PCI command register through sysfs
//! `config`, and DMA buffers are given to the controller by *physical*
//! address, read from `/proc/self/pagemap` (root only: without
//! CAP_SYS_ADMIN the kernel hides frame numbers). Prefer vfio-pci; UIO is
//! for machines without a usable IOMMU.
//!
//! Memory: buffers up to 2 MiB are carved out of 2 MiB hugepages (each one
//! physically contiguous, never swapped or migrated by compaction), so
//! every buffer has one contiguous bus range. Larger buffers get their own
//! hugepages and a contiguous range if the pages happen to be physically
//! adjacent, else a per-page table (`Iova::Pages`, fine for I/O data; the
//! driver's rings and PRP pool stay far below 2 MiB). Without hugepages only
//! single 4 KiB pages can be handed out (ordinary pages are physically
//! scattered and nothing would make them contiguous on the bus); bigger
//! requests fail with an error that says to reserve hugepages.
//!
//! **Quarantine.** Without an IOMMU nothing stops the controller from
//! writing to a physical page after we freed it and the kernel gave it to
//! someone else — silent memory corruption in another process. A buffer
//! dropped while a command using it is outstanding (the `DmaBuffer`
//! contract allows that) would be exactly that. So `release` never frees:
//! released buffers are quarantined, and all DMA memory is freed only once
//! the platform is dropped — after the controller is shut down and bus
//! mastering is switched off here — and every buffer is gone. Memory is
//! therefore not reused within one platform's lifetime; allocate I/O
//! buffers once and reuse them.
//!
//! **One driver per controller.** `open` takes an exclusive `flock` on the
//! device's sysfs `resource0` before touching the device and holds it for
//! the platform's life, so a second `open` of the same device, from this
//! process or another, is refused (naming the holder from `/proc/locks`):
//! its bring-up would disable the controller and point its queues at its
//! own memory under the first, and its drop would switch bus mastering
//! off under it. The kernel gives uio_pci_generic no such exclusion.
//!
//! **A previous driver's controller.** A controller left enabled (a
//! process killed, a controller that never answered a disable) may still
//! run the queues of its last driver, whose memory is long freed. So
//! `open` switches bus mastering off first, disables the controller
//! (CC.EN=0, waiting for CSTS.RDY=0 up to CAP.TO), and only then switches
//! bus mastering on; a controller that does not stop is refused.
//!
//! **Interrupts.** One: the pin-based INTx line, through `/dev/uioN`
//! (see `irq` for how it is acknowledged and re-enabled). The platform
//! opens `/dev/uioN` on the first `enable_irq` and keeps it open until it
//! is dropped; every `IrqFd` gets a duplicate of that descriptor. This
//! matters: uio_pci_generic switches bus mastering off when an open
//! `/dev/uioN` file is closed, so closing an `IrqFd` of its own file would
//! stop the controller's DMA under the driver's feet.
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pollux_spec::regs::{self, Cap, Cc, Csts};

use super::hugemem::{self, HostMem, PageKind, HUGE_PAGE_SIZE};
use super::irq::{self, IrqFd};
use super::pci;
use super::{Platform, Quirks};
use crate::dma::{DmaBuffer, DmaRelease, Iova, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::mmio::Mmio;

const NEED_HUGEPAGES: &str = "uio_pci_generic has no IOMMU, so a DMA buffer larger than 4 KiB \
    must be physically contiguous, which needs 2 MiB hugepages: reserve some with \
    `pollux setup hugepages 64` (or `echo 64 > /proc/sys/vm/nr_hugepages`), or use vfio-pci";

/// All DMA memory of one UIO platform. Freed when the last reference goes:
/// the platform's and every buffer's (see the module docs).
struct UioDma {
    inner: Mutex<Arena>,
    quarantined: AtomicUsize,
    warned_small: AtomicBool,
}

struct Arena {
    /// Every region ever allocated; never freed before UioDma drops.
    regions: Vec<HostMem>,
    /// The hugepage small buffers are currently carved from:
    /// (region index, physical base, bytes used).
    current: Option<(usize, u64, usize)>,
}

impl DmaRelease for UioDma {
    fn release(&self, _ptr: NonNull<u8>, len: usize, _iova: u64) {
        // Quarantine: see the module docs. The memory stays in `regions`.
        self.quarantined.fetch_add(len, Ordering::Relaxed);
    }
}

impl Drop for UioDma {
    fn drop(&mut self) {
        let q = self.quarantined.load(Ordering::Relaxed);
        if q > 0 {
            tracing::debug!(bytes = q, "freeing quarantined UIO DMA memory");
        }
        // `regions` drop here: munmap.
    }
}

impl UioDma {
    fn alloc(&self, len: usize) -> Result<(NonNull<u8>, Iova)> {
        let mut a = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if len <= HUGE_PAGE_SIZE {
            // Carve from the current hugepage, or start a new one.
            if let Some((idx, pa, used)) = a.current {
                if used + len <= HUGE_PAGE_SIZE {
                    a.current = Some((idx, pa, used + len));
                    // SAFETY: used + len <= 2 MiB, inside region idx.
                    let p = unsafe { a.regions[idx].ptr().add(used) };
                    return Ok((p, Iova::Contiguous(pa + used as u64)));
                }
            }
            match HostMem::huge(HUGE_PAGE_SIZE) {
                Ok(m) => {
                    let pa = phys_contiguous(&m)?.ok_or_else(|| {
                        Error::Dma("a 2 MiB hugepage is not physically contiguous".into())
                    })?;
                    let p = m.ptr();
                    a.regions.push(m);
                    a.current = Some((a.regions.len() - 1, pa, len));
                    return Ok((p, Iova::Contiguous(pa)));
                }
                Err(e) if len <= PAGE_SIZE => {
                    if !self.warned_small.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "no hugepages ({e}); using locked 4 KiB pages for UIO DMA. \
                             They can still be migrated by memory compaction \
                             (vm.compact_unevictable_allowed=1); reserve hugepages \
                             (`pollux setup hugepages 64`) for anything but a quick test"
                        );
                    }
                    let m = HostMem::small(PAGE_SIZE).map_err(|e| Error::Dma(e.to_string()))?;
                    let pa = hugemem::phys_addrs(m.ptr(), PAGE_SIZE)
                        .map_err(|e| Error::Dma(e.to_string()))?[0];
                    let p = m.ptr();
                    a.regions.push(m);
                    return Ok((p, Iova::Contiguous(pa)));
                }
                Err(e) => return Err(Error::Dma(format!("{NEED_HUGEPAGES} ({e})"))),
            }
        }
        // Large: dedicated hugepages.
        let m = HostMem::huge(len).map_err(|e| {
            Error::Dma(format!(
                "{NEED_HUGEPAGES} ({len} bytes = {} hugepages: {e})",
                len.div_ceil(HUGE_PAGE_SIZE)
            ))
        })?;
        debug_assert_eq!(m.kind(), PageKind::Huge2M);
        let iova = match phys_contiguous(&m)? {
            Some(pa) => Iova::Contiguous(pa),
            None => Iova::Pages(
                hugemem::phys_addrs(m.ptr(), len)
                    .map_err(|e| Error::Dma(e.to_string()))?
                    .into(),
            ),
        };
        let p = m.ptr();
        a.regions.push(m);
        Ok((p, iova))
    }
}

/// Physical base of `m` if all of it is physically contiguous.
fn phys_contiguous(m: &HostMem) -> Result<Option<u64>> {
    let pas = hugemem::phys_addrs(m.ptr(), m.len()).map_err(|e| Error::Dma(e.to_string()))?;
    let base = pas[0];
    Ok(pas
        .iter()
        .enumerate()
        .all(|(i, &pa)| pa == base + (i * PAGE_SIZE) as u64)
        .then_some(base))
}

/// Takes the exclusive lock on `res` (the device's `resource0`) that makes
/// a platform the device's only driver (see the module docs). `flock`
/// locks belong to the open file, so a second open in this process
/// conflicts as one in another process does.
fn lock_device(bdf: &str, res: &File) -> Result<()> {
    // SAFETY: flock on a descriptor we own; no memory is involved.
    if unsafe { libc::flock(res.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
        return Err(Error::Platform(format!(
            "{bdf}: locking resource0 (one driver per controller): {e}"
        )));
    }
    let who = match lock_holder(res) {
        Some(pid) if pid == std::process::id() => {
            "another controller of this process drives it".to_string()
        }
        Some(pid) => {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("process {pid} ({}) drives it", comm.trim())
        }
        None => "another process or controller drives it".to_string(),
    };
    Err(Error::Platform(format!(
        "{bdf} is in use: {who} through uio_pci_generic (it holds the lock on \
         /sys/bus/pci/devices/{bdf}/resource0). One driver per controller: a second one's \
         bring-up would reset it and reprogram its queues under the first"
    )))
}

/// The process holding the `flock` on `f`, from `/proc/locks` (lines like
/// `1: FLOCK  ADVISORY  WRITE 1234 00:15:5678 0 EOF`: pid, then the
/// file's device as hex major:minor and its inode).
fn lock_holder(f: &File) -> Option<u32> {
    let m = f.metadata().ok()?;
    let dev = m.dev();
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    let want = format!("{major:02x}:{minor:02x}:{}", m.ino());
    std::fs::read_to_string("/proc/locks")
        .ok()?
        .lines()
        .filter(|l| !l.contains("->")) // waiters
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(1) == Some(&"FLOCK") && w.get(5) == Some(&want.as_str()))
                .then(|| w.get(4)?.parse().ok())
                .flatten()
        })
}

/// Disables the controller behind `bar` (CC.EN=0) and waits for
/// CSTS.RDY=0, up to CAP.TO: a controller a previous driver left enabled
/// may run its queues. Called with bus mastering off (see the module docs).
fn quiesce(bdf: &str, bar: &Mmio) -> Result<()> {
    let cap = Cap(bar.read64(regs::off::CAP)?);
    let to = Duration::from_millis(cap.timeout_ms().max(500));
    let wait = |done: &dyn Fn(Csts) -> bool, what: &str| -> Result<()> {
        let start = Instant::now();
        loop {
            let c = Csts(bar.read32(regs::off::CSTS)?);
            if c.0 == u32::MAX {
                return Err(Error::ControllerGone);
            }
            if done(c) {
                return Ok(());
            }
            if start.elapsed() >= to {
                return Err(Error::Platform(format!(
                    "{bdf}: the controller did not {what} within CAP.TO ({} ms); a previous driver \
                     left it enabled and it may still run that driver's queues, so bus mastering \
                     stays off: reset it (`echo 1 > /sys/bus/pci/devices/{bdf}/reset`) or rebind it",
                    to.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    let cc = Cc(bar.read32(regs::off::CC)?);
    let csts = Csts(bar.read32(regs::off::CSTS)?);
    if !cc.en() && !csts.rdy() {
        return Ok(());
    }
    tracing::info!(%bdf, cc = cc.0, csts = csts.0, "controller left enabled by a previous driver: disabling it");
    if cc.en() {
        if !csts.rdy() && !csts.cfs() {
            // The spec: don't clear EN while an enable is in progress.
            wait(&|c: Csts| c.rdy() || c.cfs(), "finish enabling")?;
        }
        // Nothing of this platform runs on the controller yet, and with
        // bus mastering off it cannot reach memory meanwhile.
        bar.write32(regs::off::CC, cc.with_en(false).0)?;
    }
    wait(&|c: Csts| !c.rdy(), "stop (CSTS.RDY=0 after CC.EN=0)")
}

/// A controller bound to uio_pci_generic.
pub struct UioPlatform {
    bdf: String,
    bar: Mmio,
    bar_map: (NonNull<u8>, usize),
    /// `resource0`, locked (`lock_device`) for the platform's life.
    _lock: File,
    config: File,
    dma: Arc<UioDma>,
    quirks: Quirks,
    /// The device has an INTx line (sysfs `irq`).
    has_irq: bool,
    /// `/dev/uioN` once an interrupt was enabled, with the interrupt count
    /// last seen (shared by every `IrqFd`).
    uio: Mutex<Option<(OwnedFd, Arc<AtomicU32>)>>,
}

// SAFETY: the raw BAR pointer is only used through `Mmio` (atomic accesses)
// and for munmap in Drop.
unsafe impl Send for UioPlatform {}
// SAFETY: as above.
unsafe impl Sync for UioPlatform {}

impl UioPlatform {
    /// Opens the controller at `bdf`, which must be bound to
    /// uio_pci_generic (`pollux setup bind --driver uio_pci_generic BDF`).
    /// Needs root (sysfs resource files, physical addresses).
    pub fn open(bdf: &str) -> Result<UioPlatform> {
        let bdf = pci::normalize_bdf(bdf)?;
        let dir = pci::sysfs_dir(&bdf)?;
        let drv = pci::current_driver(&bdf)?;
        if drv.as_deref() != Some("uio_pci_generic") {
            return Err(Error::Platform(format!(
                "{bdf} is bound to {}, not uio_pci_generic: run `pollux setup bind --driver uio_pci_generic {bdf}`",
                drv.as_deref().unwrap_or("no driver")
            )));
        }
        // With the IOMMU translating this device's DMA (a "DMA" domain),
        // physical addresses are not bus addresses: every DMA would fault.
        if let Some(g) = pci::iommu_group(&bdf)? {
            let t = std::fs::read_to_string(format!("/sys/kernel/iommu_groups/{g}/type"))
                .unwrap_or_default();
            let t = t.trim();
            if t.starts_with("DMA") {
                return Err(Error::Platform(format!(
                    "{bdf} is behind an IOMMU that translates its DMA (group {g}, type {t}), so physical \
                     addresses are not bus addresses: use vfio-pci (`pollux setup bind {bdf}`), or boot with \
                     iommu=pt to use uio_pci_generic"
                )));
            }
        }
        let need_root = |what: &str, e: std::io::Error| {
            let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (uio_pci_generic needs root)"
            } else {
                ""
            };
            Error::Platform(format!("{what}: {e}{hint}"))
        };
        let open = |name: &str| {
            let p = dir.join(name);
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .map_err(|e| need_root(&p.display().to_string(), e))
        };
        // Fail early, before touching the device, if physical addresses are hidden.
        let probe = HostMem::small(PAGE_SIZE).map_err(|e| Error::Dma(e.to_string()))?;
        hugemem::phys_addrs(probe.ptr(), PAGE_SIZE).map_err(|e| need_root("pagemap", e))?;
        drop(probe);

        let quirks = super::quirks_for(pci::ids(&bdf)?);
        let res = open("resource0")?;
        lock_device(&bdf, &res)?;
        let len = res.metadata().map_err(Error::Io)?.len() as usize;
        if len < 0x2000 {
            return Err(Error::Unsupported(format!(
                "BAR0 of {bdf} is {len} bytes; an NVMe controller has at least 8 KiB"
            )));
        }
        // SAFETY: shared mapping of the BAR0 resource file, checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                res.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::Platform(format!(
                "mmap of {}/resource0: {}",
                dir.display(),
                std::io::Error::last_os_error()
            )));
        }
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| Error::Platform("mmap returned null".into()))?;

        // SAFETY: the BAR0 mapping made above, unmapped only in Drop (or
        // below, if `open` fails).
        let bar = unsafe { Mmio::new(base, len) };
        let unmap = |e: Error| {
            // SAFETY: the mapping made above; `bar` is not used after this.
            unsafe { libc::munmap(base.as_ptr().cast(), len) };
            e
        };
        let config = open("config").map_err(unmap)?;
        // Memory decoding on, bus mastering off until the controller is
        // known to be stopped (see the module docs).
        let set_command = |on: u16, off: u16| -> Result<()> {
            let mut cmd = [0u8; 2];
            config
                .read_exact_at(&mut cmd, pci::PCI_COMMAND)
                .map_err(|e| Error::Platform(format!("reading PCI command register: {e}")))?;
            let c = (u16::from_le_bytes(cmd) | on) & !off;
            config
                .write_all_at(&c.to_le_bytes(), pci::PCI_COMMAND)
                .map_err(|e| Error::Platform(format!("writing PCI command register: {e}")))
        };
        set_command(pci::PCI_COMMAND_MEMORY, pci::PCI_COMMAND_MASTER).map_err(unmap)?;
        quiesce(&bdf, &bar).map_err(unmap)?;
        set_command(pci::PCI_COMMAND_MASTER, 0).map_err(unmap)?;

        let has_irq = std::fs::read_to_string(dir.join("irq"))
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            // 0: no line; 0x80000000: IRQ_NOTCONNECTED.
            .is_some_and(|irq| irq != 0 && irq != 0x8000_0000);
        Ok(UioPlatform {
            bdf,
            bar,
            bar_map: (base, len),
            _lock: res,
            config,
            dma: Arc::new(UioDma {
                inner: Mutex::new(Arena {
                    regions: Vec::new(),
                    current: None,
                }),
                quarantined: AtomicUsize::new(0),
                warned_small: AtomicBool::new(false),
            }),
            quirks,
            has_irq,
            uio: Mutex::new(None),
        })
    }

    pub fn bdf(&self) -> &str {
        &self.bdf
    }

    /// Opens `/dev/uioN` for the device: the interrupt count first (sysfs
    /// `event`, so `ack` reports only newer interrupts; one arriving
    /// between the two steps does not wake a waiter but is counted with
    /// the next), then the node, non-blocking. Leaves INTx enabled.
    fn open_uio(&self) -> Result<(OwnedFd, Arc<AtomicU32>)> {
        let name = uio_name(&pci::sysfs_dir(&self.bdf)?)?;
        let ev_path = format!("/sys/class/uio/{name}/event");
        let event = std::fs::read_to_string(&ev_path)
            .map_err(|e| Error::Platform(format!("{ev_path}: {e}")))?;
        let event: u32 = event.trim().parse().map_err(|_| {
            Error::Platform(format!("{ev_path}: unexpected content {:?}", event.trim()))
        })?;
        let dev = format!("/dev/{name}");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&dev)
            .map_err(|e| {
                let hint = if e.kind() == std::io::ErrorKind::PermissionDenied {
                    " (uio_pci_generic needs root)"
                } else {
                    ""
                };
                Error::Platform(format!("{dev}: {e}{hint}"))
            })?;
        // An interrupt before anyone listened left INTx masked.
        irq::intx_enable(&self.config)?;
        tracing::debug!(bdf = %self.bdf, %dev, event, "UIO interrupt enabled");
        Ok((f.into(), Arc::new(AtomicU32::new(event))))
    }
}

/// The UIO device name (`uioN`) of the PCI device in `dir`.
fn uio_name(dir: &Path) -> Result<String> {
    let udir = dir.join("uio");
    let mut names: Vec<String> = std::fs::read_dir(&udir)
        .map_err(|e| Error::Platform(format!("{}: {e}", udir.display())))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.strip_prefix("uio")
                .is_some_and(|k| k.parse::<u32>().is_ok())
        })
        .collect();
    names.sort();
    names.into_iter().next().ok_or_else(|| {
        Error::Platform(format!(
            "{}: no uioN device (is uio_pci_generic bound?)",
            udir.display()
        ))
    })
}

impl Platform for UioPlatform {
    fn describe(&self) -> String {
        format!("uio {}", self.bdf)
    }

    fn bar0(&self) -> &Mmio {
        &self.bar
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        let len = len.max(1).div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let (ptr, iova) = self.dma.alloc(len)?;
        // Recycled arena space is never handed out (quarantine), but zero it
        // anyway: the DmaBuffer contract is zeroed memory.
        // SAFETY: ptr..ptr+len lies inside one of our regions and is not
        // handed out to anyone else.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, len) };
        // SAFETY: exclusive memory with the right bus addresses; UioDma
        // keeps it alive (quarantine) until the platform and every buffer
        // are gone.
        Ok(unsafe { DmaBuffer::from_raw(ptr, len, iova, self.dma.clone()) })
    }

    fn quirks(&self) -> Quirks {
        self.quirks
    }

    fn quarantined_bytes(&self) -> usize {
        self.dma.quarantined.load(Ordering::Relaxed)
    }

    fn irq_vectors(&self) -> u16 {
        self.has_irq as u16
    }

    /// The INTx interrupt (vector 0 only); see the module docs. For NVMe
    /// the controller's INTMS must not mask vector 0: it does not after a
    /// reset, and a driver that set it must clear it through INTMC.
    fn enable_irq(&self, vector: u16) -> Result<IrqFd> {
        if !self.has_irq {
            return Err(Error::Unsupported(format!(
                "interrupts not supported by uio {}: the device has no interrupt line (sysfs irq is 0)",
                self.bdf
            )));
        }
        if vector != 0 {
            return Err(Error::InvalidArgument(format!(
                "interrupt vector {vector} out of range: uio {} has 1 (vector 0, pin-based INTx)",
                self.bdf
            )));
        }
        let mut uio = self.uio.lock().unwrap_or_else(|p| p.into_inner());
        if uio.is_none() {
            *uio = Some(self.open_uio()?);
        }
        let Some((fd, last)) = uio.as_ref() else {
            return Err(Error::Platform("UIO interrupt state missing".into()));
        };
        let dup = fd
            .try_clone()
            .map_err(|e| Error::Platform(format!("duplicating the /dev/uio descriptor: {e}")))?;
        let config = self.config.try_clone().map_err(|e| {
            Error::Platform(format!("duplicating the sysfs config descriptor: {e}"))
        })?;
        Ok(IrqFd::uio(dup, last.clone(), config))
    }
}

impl Drop for UioPlatform {
    fn drop(&mut self) {
        // Bus mastering off: from here on the controller cannot DMA at all,
        // so the memory can be freed once the last buffer is gone.
        let mut cmd = [0u8; 2];
        let r = self
            .config
            .read_exact_at(&mut cmd, pci::PCI_COMMAND)
            .and_then(|_| {
                let c = u16::from_le_bytes(cmd) & !pci::PCI_COMMAND_MASTER;
                self.config.write_all_at(&c.to_le_bytes(), pci::PCI_COMMAND)
            });
        if let Err(e) = r {
            tracing::error!(bdf = %self.bdf, "could not disable bus mastering: {e}; leaking DMA memory");
            std::mem::forget(self.dma.clone());
        }
        // SAFETY: the BAR0 mapping made in open; nothing uses it any more.
        unsafe { libc::munmap(self.bar_map.0.as_ptr().cast(), self.bar_map.1) };
    }
}
