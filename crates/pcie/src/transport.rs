//! NVMe over PCIe as a `pollux_nvme::Transport`: registers through BAR0
//! MMIO, queues as rings in DMA memory, the admin queue through AQA, ASQ
//! and ACQ, and shadow doorbells (Doorbell Buffer Config) when the
//! controller offers them.
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use pollux_nvme::dma::DmaBuffer;
use pollux_nvme::error::{Error, Result};
use pollux_nvme::{AdminExec, QueueSpec, Transport};
use pollux_spec::identify::{IdentifyController, OACS_DBBUF_CONFIG};
use pollux_spec::regs::{self, Aqa};
use pollux_spec::Sqe;

use crate::cq::{CqConfig, PcieCq};
use crate::doorbell::{DbBuf, Doorbell, Shadow};
use crate::mmio::Mmio;
use crate::platform::Platform;
use crate::sq::{PcieSq, SqConfig};

/// A PCIe NVMe controller reached through a `Platform` (vfio-pci,
/// uio_pci_generic, or the emulated controller).
pub struct Pcie {
    platform: Arc<dyn Platform>,
    dstrd: u8,
    mqes: u16,
    /// Ask for shadow doorbells when the controller offers them.
    want_shadow: bool,
    /// Set once Doorbell Buffer Config succeeded (then for good: some
    /// controllers, QEMU's, read doorbell values only from the shadow
    /// buffer once it is configured, so every queue must use it).
    dbbuf: Mutex<Option<Arc<DbBuf>>>,
}

/// The controller handle over PCIe.
pub type Controller = pollux_nvme::Controller<Pcie>;
/// An I/O queue pair over PCIe.
pub type QueuePair = pollux_nvme::QueuePair<Pcie>;
/// The submission half of a PCIe queue pair, borrowed.
pub type Submitter<'a> = pollux_nvme::Submitter<'a, Pcie>;

/// Brings up the controller behind `platform`.
pub fn open(
    platform: Box<dyn Platform>,
    opts: pollux_nvme::ControllerOptions,
) -> Result<Controller> {
    let t = Pcie::new(platform, opts.shadow_doorbells)?;
    Controller::new(t, opts)
}

impl Pcie {
    /// `shadow_doorbells`: use Doorbell Buffer Config when offered.
    pub fn new(platform: Box<dyn Platform>, shadow_doorbells: bool) -> Result<Pcie> {
        let platform: Arc<dyn Platform> = Arc::from(platform);
        platform.claim()?;
        let cap = regs::Cap(platform.bar0().read64(regs::off::CAP)?);
        Ok(Pcie {
            dstrd: cap.dstrd(),
            mqes: cap.mqes(),
            platform,
            want_shadow: shadow_doorbells,
            dbbuf: Mutex::new(None),
        })
    }

    pub fn platform(&self) -> &Arc<dyn Platform> {
        &self.platform
    }

    /// True once shadow doorbells are in use.
    pub fn shadow_doorbells(&self) -> bool {
        self.dbbuf().is_some()
    }

    fn dbbuf(&self) -> Option<Arc<DbBuf>> {
        self.dbbuf.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn doorbell(&self, off: usize) -> Result<Doorbell> {
        Doorbell::new(&self.platform, off).map_err(|e| {
            Error::Unsupported(format!(
                "doorbell at {off:#x} (CAP.DSTRD {}): {e}",
                self.dstrd
            ))
        })
    }

    /// The shadow slots for doorbell register offset `off`.
    fn shadow_slot(db: &Arc<DbBuf>, off: usize) -> Result<Shadow> {
        let rel = off - regs::off::DOORBELL_BASE;
        if rel + 4 > db.shadow.len().min(db.eventidx.len()) {
            return Err(Error::Unsupported(format!(
                "doorbell {off:#x} lies outside the shadow doorbell page"
            )));
        }
        // SAFETY: rel + 4 <= the length of both buffers, which `_pages`
        // keeps alive.
        let (v, e) = unsafe { (db.shadow.as_ptr().add(rel), db.eventidx.as_ptr().add(rel)) };
        Ok(Shadow {
            value: NonNull::new(v.cast())
                .ok_or_else(|| Error::Platform("null shadow page".into()))?,
            event: NonNull::new(e.cast())
                .ok_or_else(|| Error::Platform("null event page".into()))?,
            _pages: db.clone(),
        })
    }

    /// Ring memory, contiguous in bus address space.
    fn ring_mem(&self, what: &str, len: usize) -> Result<DmaBuffer> {
        let m = self.platform.alloc_dma(len)?;
        if !m.is_iova_contiguous() {
            return Err(Error::Dma(format!(
                "{what} memory ({} bytes) is not contiguous in bus address space; reserve hugepages",
                m.len()
            )));
        }
        Ok(m)
    }

    /// Rings for queue `qid`: SQ (with its PRP list pool) and CQ.
    fn queues(
        &self,
        qid: u16,
        depth: u16,
        sq_entries: u16,
        cq_entries: u16,
        max_transfer: u32,
        tuning: &pollux_nvme::Tuning,
    ) -> Result<(PcieSq, PcieCq)> {
        // PRP list slice: entries for the largest transfer (+1 for an
        // unaligned start), a power of two, at least 2 (a DSM range), at
        // most one page.
        let list_entries = ((max_transfer as usize).div_ceil(4096) + 1)
            .next_power_of_two()
            .clamp(2, 512);
        let prp_shift = list_entries.trailing_zeros();
        let sq_mem = self.ring_mem("SQ", sq_entries as usize * 64)?;
        let cq_mem = self.ring_mem("CQ", cq_entries as usize * 16)?;
        let prp_mem = self.ring_mem("PRP list pool", (depth.max(1) as usize) << (prp_shift + 3))?;
        let sq_off = regs::sq_tail_doorbell(qid, self.dstrd);
        let cq_off = regs::cq_head_doorbell(qid, self.dstrd);
        let (sq_shadow, cq_shadow) = match self.dbbuf() {
            Some(db) if qid != 0 => (
                Some(Self::shadow_slot(&db, sq_off)?),
                Some(Self::shadow_slot(&db, cq_off)?),
            ),
            _ => (None, None),
        };
        // A reused queue id's shadow slots still hold the previous queue's
        // values; a new queue starts at 0 (else the host's event-index rule
        // compares against stale values and may never ring).
        for s in [&sq_shadow, &cq_shadow].into_iter().flatten() {
            s.clear();
        }
        // Lazy CQ doorbell: the controller may post at most `depth` entries
        // we have not consumed yet (one per outstanding command). Keeping
        // unacked + depth <= cq_entries - 1 after every poll means it always
        // has room. Without the lazy doorbell, ring whenever anything was
        // consumed.
        let unacked_limit = if tuning.lazy_cq_doorbell {
            cq_entries as u32 - 1 - depth as u32
        } else {
            0
        };
        let sq = PcieSq::new(
            SqConfig {
                entries: sq_entries,
                nt: tuning.nt_sqe_copy,
                delayed: tuning.delayed_sq_doorbell,
                batch: tuning.sq_doorbell_batch,
                prp_shift,
            },
            sq_mem,
            prp_mem,
            self.doorbell(sq_off)?,
            sq_shadow,
        );
        let cq = PcieCq::new(
            CqConfig {
                entries: cq_entries,
                unacked_limit,
                prefetch: tuning.prefetch,
                line_batch: tuning.cq_line_batch,
            },
            cq_mem,
            self.doorbell(cq_off)?,
            cq_shadow,
        );
        Ok((sq, cq))
    }

    /// The interrupt vector for queue `qid`: vector 0 is the admin
    /// queue's, so I/O queues share the others round robin (all of them
    /// vector 0 where that is the only one, as with INTx under UIO).
    fn vector_for(&self, qid: u16) -> Result<u16> {
        match self.platform.irq_vectors() {
            0 => Err(Error::Unsupported(format!(
                "{} delivers no interrupts",
                self.platform.describe()
            ))),
            1 => Ok(0),
            n => Ok(1 + (qid - 1) % (n - 1)),
        }
    }

    fn create(admin: &mut AdminExec<'_>, qid: u16, sq: &PcieSq, cq: &PcieCq) -> Result<()> {
        let mut create_cq = Sqe::create_io_cq(qid, cq_entries(cq), cq.ring_iova());
        if let Some(v) = cq.irq_vector() {
            create_cq.cdw11 |= pollux_spec::cmd::CQ_IEN | (v as u32) << 16;
        }
        admin(create_cq, "Create I/O Completion Queue")?;
        if let Err(e) = admin(
            Sqe::create_io_sq(qid, sq.entries(), qid, sq.ring_iova()),
            "Create I/O Submission Queue",
        ) {
            let _ = admin(Sqe::delete_io_cq(qid), "Delete I/O Completion Queue");
            return Err(e);
        }
        Ok(())
    }
}

fn cq_entries(cq: &PcieCq) -> u16 {
    pollux_nvme::CompletionQueue::entries(cq)
}

impl Transport for Pcie {
    type Sq = PcieSq;
    type Cq = PcieCq;
    type Regs = Mmio;

    fn describe(&self) -> String {
        self.platform.describe()
    }

    fn regs(&self) -> &Mmio {
        self.platform.bar0()
    }

    fn alloc_dma(&self, len: usize) -> Result<DmaBuffer> {
        self.platform.alloc_dma(len)
    }

    fn relax(&self) {
        self.platform.relax()
    }

    fn ready_delay_us(&self) -> u32 {
        self.platform.quirks().delay_before_ready_poll_us
    }

    fn max_queue_entries(&self) -> u32 {
        self.mqes as u32 + 1
    }

    unsafe fn admin_queues(&self, entries: u16) -> Result<(PcieSq, PcieCq)> {
        let tuning = pollux_nvme::Tuning {
            delayed_sq_doorbell: false,
            sq_doorbell_batch: 1,
            lazy_cq_doorbell: false,
            prefetch: false,
            nt_sqe_copy: false,
            cq_line_batch: false,
        };
        // Admin data is at most two pages.
        self.queues(0, entries - 1, entries, entries, 8192, &tuning)
    }

    unsafe fn attach_admin(&self, sq: &PcieSq, cq: &PcieCq) -> Result<()> {
        let bar = self.platform.bar0();
        bar.write32(regs::off::AQA, Aqa::new(sq.entries(), cq_entries(cq)).0)?;
        bar.write64(regs::off::ASQ, sq.ring_iova())?;
        bar.write64(regs::off::ACQ, cq.ring_iova())
    }

    unsafe fn configure(
        &self,
        admin: &mut AdminExec<'_>,
        ident: &IdentifyController,
    ) -> Result<()> {
        let mut slot = self.dbbuf.lock().unwrap_or_else(|p| p.into_inner());
        let db = match &*slot {
            // After a reset: new queues start at index 0.
            Some(db) => db.clone(),
            None => {
                if !self.want_shadow || ident.oacs & OACS_DBBUF_CONFIG == 0 {
                    return Ok(());
                }
                Arc::new(DbBuf {
                    shadow: self.platform.alloc_dma(4096)?,
                    eventidx: self.platform.alloc_dma(4096)?,
                })
            }
        };
        db.clear();
        let sqe = Sqe::doorbell_buffer_config(db.shadow.iova_at(0), db.eventidx.iova_at(0));
        match admin(sqe, "Doorbell Buffer Config") {
            Ok(_) => {
                *slot = Some(db);
                Ok(())
            }
            Err(e) if slot.is_none() => {
                tracing::warn!("shadow doorbells offered but not configured: {e}");
                Ok(())
            }
            // Queues in use rely on it: a reset that cannot restore it fails.
            Err(e) => Err(e),
        }
    }

    unsafe fn create_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        spec: &QueueSpec,
    ) -> Result<(PcieSq, PcieCq)> {
        let (sq, mut cq) = self.queues(
            spec.qid,
            spec.depth,
            spec.sq_entries,
            spec.cq_entries,
            spec.max_transfer,
            &spec.tuning,
        )?;
        if spec.interrupts {
            // Enabled before the CQ exists: QEMU drops the messages of a
            // vector that was not enabled when its CQ was created.
            let v = self.vector_for(spec.qid)?;
            cq.set_irq(v, self.platform.enable_irq(v)?);
        }
        Self::create(admin, spec.qid, &sq, &cq)?;
        Ok((sq, cq))
    }

    unsafe fn recreate_io_queues(
        &self,
        admin: &mut AdminExec<'_>,
        qid: u16,
        sq: &mut PcieSq,
        cq: &mut PcieCq,
    ) -> Result<()> {
        if let Some(s) = sq.shadow() {
            s.clear();
        }
        if let Some(s) = cq.shadow() {
            s.clear();
        }
        Self::create(admin, qid, sq, cq)
    }

    unsafe fn delete_io_queues(&self, admin: &mut AdminExec<'_>, qid: u16) -> Result<()> {
        let a = admin(Sqe::delete_io_sq(qid), "Delete I/O Submission Queue");
        let b = admin(Sqe::delete_io_cq(qid), "Delete I/O Completion Queue");
        a.and(b).map(|_| ())
    }
}
