//! `SoftDevice`: the public face of one emulated controller — BAR0 memory,
//! the IOMMU API, `step()`, fault rules and statistics.
//!
//! The controller state lives behind one Mutex, taken by `step()`,
//! `dma_map`/`dma_unmap` and the fault API; in normal operation only the
//! stepping thread takes it, so it is uncontended. Statistics are read
//! without the lock. A poisoned lock (a panic inside the emulator, which
//! would be a bug) is recovered rather than propagated.
use std::os::fd::OwnedFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use pollux_bdev::Bdev;

use crate::backend;
use crate::bar::BarMem;
use crate::config::SoftConfig;
use crate::ctrl::Controller;
use crate::fault::FaultRule;
use crate::stats::DeviceStats;
use crate::SoftError;

/// One emulated NVMe controller. `Send + Sync`; share it with `Arc`.
pub struct SoftDevice {
    // Field order matters: the controller (which holds pointers into the
    // BAR) is dropped before the BAR memory.
    ctrl: Mutex<Controller>,
    bar: BarMem,
    irq_vectors: u16,
    /// A host driver holds the device (`claim`).
    claimed: AtomicBool,
}

/// A driver's hold on a `SoftDevice` (`SoftDevice::claim`); released on
/// drop.
#[derive(Debug)]
pub struct SoftClaim(Arc<SoftDevice>);

impl Drop for SoftClaim {
    fn drop(&mut self) {
        self.0.claimed.store(false, Ordering::Release);
    }
}

// SAFETY: `BarMem` is a private mapping accessed only through atomics (by
// the host and by the controller); `Controller` is `Send` and behind a Mutex.
unsafe impl Send for SoftDevice {}
// SAFETY: as above; all shared access goes through atomics or the Mutex.
unsafe impl Sync for SoftDevice {}

impl std::fmt::Debug for SoftDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SoftDevice")
            .field("bar0", &self.bar.view().ptr())
            .field("stats", &self.stats())
            .finish()
    }
}

impl SoftDevice {
    /// Creates a controller (disabled: CC = 0, CSTS = 0).
    pub fn new(cfg: SoftConfig) -> Result<Arc<SoftDevice>, SoftError> {
        cfg.validate()?;
        let bar = BarMem::new(cfg.max_io_queues as usize + 1, cfg.dstrd).map_err(SoftError::Bar)?;
        let mut ns = Vec::with_capacity(cfg.namespaces.len());
        for (i, n) in cfg.namespaces.iter().enumerate() {
            ns.push(backend::open(&cfg.serial, i as u32 + 1, n)?);
        }
        let subsys = cfg.subsystem(ns)?;
        let irq_vectors = cfg.irq_vectors;
        let ctrl = Controller::new(cfg, bar.view(), subsys)?;
        Ok(Arc::new(SoftDevice {
            ctrl: Mutex::new(ctrl),
            bar,
            irq_vectors,
            claimed: AtomicBool::new(false),
        }))
    }

    /// Claims the device for one host driver, as a kernel driver binds a
    /// PCI function: until the returned guard drops, a second claim fails
    /// (`SoftError::Claimed`). Two drivers on one controller would each
    /// disable it and point its admin queue at their own memory under the
    /// other. The device itself does not check who writes its registers:
    /// drivers claim it before touching them.
    pub fn claim(self: &Arc<Self>) -> Result<SoftClaim, SoftError> {
        if self.claimed.swap(true, Ordering::AcqRel) {
            return Err(SoftError::Claimed);
        }
        Ok(SoftClaim(self.clone()))
    }

    /// Interrupt vectors the device offers (`SoftConfig::irq_vectors`).
    pub fn irq_vectors(&self) -> u16 {
        self.irq_vectors
    }

    fn lock(&self) -> MutexGuard<'_, Controller> {
        self.ctrl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// BAR0: page-aligned, zero-initialised register and doorbell memory,
    /// valid while the device lives. Access it only with 32-bit aligned
    /// atomic loads and stores.
    pub fn bar0(&self) -> (NonNull<u8>, usize) {
        let v = self.bar.view();
        (v.ptr(), v.len())
    }

    /// Makes host memory `[host, host + len)` visible to the device at
    /// `[iova, iova + len)`. `iova`, `len` and `host` must be 4 KiB aligned
    /// and the range must not overlap an existing mapping.
    ///
    /// # Safety
    /// The memory must stay valid (and not be freed or unmapped) until
    /// `dma_unmap(iova)` returns or the device is dropped.
    pub unsafe fn dma_map(
        &self,
        iova: u64,
        host: NonNull<u8>,
        len: usize,
    ) -> Result<(), SoftError> {
        self.lock().iommu.map(iova, host, len)
    }

    /// Removes the mapping starting at `iova`. After this returns the device
    /// never touches that memory again (it waits for a running `step()`).
    /// Unmapping memory the device is using (queues, shadow doorbells) is an
    /// IOMMU fault: the controller goes fatal (CSTS.CFS).
    pub fn dma_unmap(&self, iova: u64) -> Result<(), SoftError> {
        let mut c = self.lock();
        let m = c.iommu.unmap(iova)?;
        c.on_unmap(&m);
        Ok(())
    }

    /// Runs the controller once; returns the number of commands completed
    /// or otherwise handled (0 = idle).
    pub fn step(&self) -> usize {
        self.lock().step()
    }

    /// Up to `rounds` steps under one lock, until one finds work (one
    /// step for `rounds` <= 1); returns the last step's count and the
    /// earliest moment the device has something to do on its own (a
    /// coalesced interrupt or a delayed completion is due), which a
    /// stepping thread must not sleep past. A device thread with one device steps in
    /// bursts: the lock's two atomic read-modify-writes per round were
    /// the larger part of an idle round's time, which is the delay before
    /// the device sees a doorbell (half a round on average, at QD 1).
    pub(crate) fn step_burst(&self, rounds: u32) -> (usize, Option<Instant>) {
        let mut c = self.lock();
        let mut n = c.step();
        for _ in 1..rounds {
            if n != 0 {
                break;
            }
            n = c.step();
        }
        (n, c.next_deadline())
    }

    /// The eventfd of interrupt vector `vector`, duplicated for the host.
    ///
    /// The device signals it (adds the number of interrupts raised) when a
    /// CQ created with IEN on that vector posts completions, honouring
    /// Interrupt Coalescing and Interrupt Vector Configuration. Vector 0
    /// serves the admin CQ, which signals only once vector 0's eventfd
    /// exists (this was called for vector 0, or an I/O CQ uses vector 0 with
    /// IEN): a polled admin queue costs nothing. The fd is
    /// non-blocking and close-on-exec: poll it, then `read` 8 bytes to
    /// clear it. Every call returns a new descriptor for the same eventfd,
    /// which lives as long as the device (controller resets keep it).
    pub fn irq_eventfd(&self, vector: u16) -> Result<OwnedFd, SoftError> {
        let mut c = self.lock();
        let vectors = c.irqs.len();
        if vector >= vectors {
            return Err(SoftError::InvalidVector { vector, vectors });
        }
        let eventfd = |source| SoftError::Eventfd { vector, source };
        c.ensure_vector(vector).map_err(eventfd)?;
        c.irqs
            .fd(vector)
            .and_then(|fd| fd.try_clone())
            .map_err(eventfd)
    }

    /// The bdev serving namespace `nsid` (1-based): the one given in
    /// `BackendConfig::Bdev`, or the null, RAM or io_uring bdev the device
    /// made. None for an NSID that does not exist.
    pub fn namespace_bdev(&self, nsid: u32) -> Option<Bdev> {
        let c = self.lock();
        Some(c.core.subsystem().namespace(nsid)?.bdev().clone())
    }

    /// Installs a fault injection rule (evaluated in insertion order).
    pub fn add_fault(&self, rule: FaultRule) {
        self.lock().faults.add(rule);
    }

    /// Hangs the controller: it processes nothing and ignores CC (a
    /// CC.EN=0 is not honoured: CSTS.RDY stays 1, so a host's disable
    /// times out) until [`resume`](Self::resume). Models a controller
    /// that fails without stopping, which may still transfer into the
    /// memory of the commands it had once it comes back.
    pub fn hang(&self) {
        self.lock().hang();
    }

    /// Ends a hang (or a `Freeze` fault): the controller runs the queues
    /// it had again, from where it stopped, and forgets a CC value written
    /// meanwhile. If queue memory was unmapped from its IOMMU meanwhile it
    /// goes fatal (CSTS.CFS) instead, touching none of it.
    pub fn resume(&self) {
        self.lock().resume();
    }

    /// Removes every fault rule (already deferred commands stay deferred).
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// A snapshot of the counters, as of the end of the last `step()`.
    /// Takes the controller lock (briefly stalling a device thread): meant
    /// for tests and reports, not for a polling loop.
    pub fn stats(&self) -> DeviceStats {
        let c = self.lock();
        let mut s = c.counters.s.clone();
        let io = c.io.stats();
        s.reads = io.reads;
        s.writes = io.writes;
        s.bytes_read = io.bytes_read;
        s.bytes_written = io.bytes_written;
        s.steps = c.ticks;
        s
    }
}
