//! The PCIe submission queue: the SQ ring, its tail doorbell (delayed,
//! batched, or behind a shadow doorbell) and the PRP list slices.
//!
//! Per command: the SQE is written once, into its ring slot (or with
//! non-temporal stores); PRPs beyond the second page go into the tracker's
//! own slice of one per-queue list pool, found by index from the CID.
use std::ptr::{self, NonNull};

use pollux_nvme::dma::DmaBuffer;
use pollux_nvme::{SubmissionQueue, SubmitError, WireCounters};
use pollux_spec::cmd::{DsmRange, DSM_ATTR_DEALLOCATE};
use pollux_spec::{NvmOpcode, RwFlags, Sqe};

use crate::doorbell::{Doorbell, Shadow};
use crate::prp;

/// Copies one SQE into its ring slot with non-temporal stores.
#[inline(always)]
fn nt_copy(dst: *mut Sqe, src: &Sqe) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_load_si128, _mm_stream_si128};
        let s = (src as *const Sqe).cast::<__m128i>();
        let d = dst.cast::<__m128i>();
        // SAFETY: both are 64-byte aligned Sqe locations (Sqe is
        // align(64)); four 16-byte loads/stores cover it exactly. SSE2 is
        // part of the x86-64 baseline.
        unsafe {
            _mm_stream_si128(d, _mm_load_si128(s));
            _mm_stream_si128(d.add(1), _mm_load_si128(s.add(1)));
            _mm_stream_si128(d.add(2), _mm_load_si128(s.add(2)));
            _mm_stream_si128(d.add(3), _mm_load_si128(s.add(3)));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: dst is a valid, aligned SQ slot.
    unsafe {
        ptr::write(dst, *src)
    }
}

/// The submission half of a PCIe queue pair.
pub struct PcieSq {
    // --- hot: touched per command ---
    ring: NonNull<Sqe>,
    tail: u16,
    entries: u16,
    nt: bool,
    delayed: bool,
    /// Neither `nt` nor a doorbell per command (the defaults): Reads and
    /// Writes are stored field by field (`push_rw`).
    plain: bool,
    batch: u16,
    prp_pool: NonNull<u64>,
    prp_pool_iova: u64,
    /// log2 of the PRP list slice entries per tracker.
    prp_shift: u32,
    // --- colder ---
    bell: Doorbell,
    shadow: Option<Shadow>,
    /// SQ tail the controller was last told about.
    rung: u16,
    counters: WireCounters,
    // Memory the controller reads: kept as long as the ring is in use.
    ring_mem: DmaBuffer,
    _prp_mem: DmaBuffer,
}

// SAFETY: the raw pointers point into `ring_mem` / `_prp_mem` (owned) and
// the shadow pages (kept alive by `Shadow::_pages`); all access goes
// through `&mut self`.
unsafe impl Send for PcieSq {}

/// Settings of one submission queue.
pub(crate) struct SqConfig {
    pub(crate) entries: u16,
    pub(crate) nt: bool,
    pub(crate) delayed: bool,
    pub(crate) batch: u16,
    pub(crate) prp_shift: u32,
}

impl PcieSq {
    /// `ring_mem` holds `cfg.entries` SQEs; `prp_mem` holds the PRP list
    /// slices (`1 << prp_shift` entries per tracker), both contiguous in
    /// bus address space (checked by the caller).
    pub(crate) fn new(
        cfg: SqConfig,
        ring_mem: DmaBuffer,
        prp_mem: DmaBuffer,
        bell: Doorbell,
        shadow: Option<Shadow>,
    ) -> PcieSq {
        assert!(ring_mem.len() >= cfg.entries as usize * 64);
        let ring = NonNull::new(ring_mem.as_ptr().cast::<Sqe>()).expect("DmaBuffer is non-null");
        let prp_pool = NonNull::new(prp_mem.as_ptr().cast::<u64>()).expect("DmaBuffer is non-null");
        PcieSq {
            ring,
            tail: 0,
            entries: cfg.entries,
            nt: cfg.nt && cfg!(target_arch = "x86_64"),
            delayed: cfg.delayed,
            plain: cfg.delayed && !(cfg.nt && cfg!(target_arch = "x86_64")),
            batch: cfg.batch,
            prp_pool,
            prp_pool_iova: prp_mem.iova_at(0),
            prp_shift: cfg.prp_shift,
            bell,
            shadow,
            rung: 0,
            counters: WireCounters::default(),
            ring_mem,
            _prp_mem: prp_mem,
        }
    }

    /// Bus address of the ring (for Create I/O SQ / ASQ).
    pub(crate) fn ring_iova(&self) -> u64 {
        self.ring_mem.iova_at(0)
    }

    pub(crate) fn entries(&self) -> u16 {
        self.entries
    }

    pub(crate) fn shadow(&self) -> Option<&Shadow> {
        self.shadow.as_ref()
    }

    /// The PRP list slice of tracker `cid` and its bus address.
    #[inline(always)]
    fn prp_list(&mut self, cid: u16) -> (&mut [u64], u64) {
        let n = 1usize << self.prp_shift;
        let off = (cid as usize) << self.prp_shift;
        // SAFETY: the pool holds depth << prp_shift entries and cid < depth
        // (the core hands out CIDs below its depth, which is the SQ's
        // entries - 1); a tracker's slice is used only by its command.
        let list = unsafe { std::slice::from_raw_parts_mut(self.prp_pool.as_ptr().add(off), n) };
        (list, self.prp_pool_iova + (off as u64) * 8)
    }

    /// Writes `sqe` (CID set) into the next SQ slot.
    #[inline(always)]
    fn push_sqe(&mut self, sqe: &Sqe) {
        // SAFETY: tail < entries, the ring holds `entries` slots, and the
        // slot is free: at most entries - 1 commands are outstanding, so the
        // controller has consumed it.
        let slot = unsafe { self.ring.as_ptr().add(self.tail as usize) };
        if self.nt {
            nt_copy(slot, sqe);
        } else {
            // SAFETY: as above.
            unsafe { ptr::write(slot, *sqe) };
        }
        self.advance_tail();
        if !self.delayed {
            self.ring();
        }
    }

    #[inline(always)]
    fn advance_tail(&mut self) {
        self.tail = if self.tail + 1 == self.entries {
            0
        } else {
            self.tail + 1
        };
    }

    /// PRP1 and PRP2 of `len` bytes at `addr0` (PRP2 a list in `cid`'s
    /// slice of the pool when they span more than two pages).
    #[inline(always)]
    fn prps(
        &mut self,
        cid: u16,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(u64, u64), SubmitError> {
        if len == 0 {
            return Ok((0, 0));
        }
        if len as u64 > prp::PAGE - (addr0 & (prp::PAGE - 1)) {
            let (list, list_iova) = self.prp_list(cid);
            return match prp::build(len, addr0, addr_at, list, list_iova) {
                Ok(p) => Ok((addr0, p.prp2)),
                Err(e) => Err(prp_error(e, addr0)),
            };
        }
        Ok((addr0, 0))
    }

    /// Tells the controller about new SQ entries.
    #[inline]
    fn ring(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if self.nt {
            // Non-temporal stores are not ordered by the Release store below.
            // SAFETY: sfence has no memory-safety preconditions.
            unsafe { std::arch::x86_64::_mm_sfence() };
        }
        let tail = self.tail as u32;
        let mmio = match &self.shadow {
            None => true,
            Some(s) => {
                self.counters.shadow_updates += 1;
                s.publish(tail, self.rung as u32)
            }
        };
        if mmio {
            self.bell.write(tail);
            self.counters.doorbells += 1;
        }
        self.rung = self.tail;
    }

    /// With SQ doorbell batching: at least `batch` new commands are waiting,
    /// or the controller holds fewer than `batch` (so it never starves).
    #[cold]
    fn batch_ready(&self, batch: u32, outstanding: u32) -> bool {
        let (tail, rung) = (self.tail as u32, self.rung as u32);
        let pending = if tail >= rung {
            tail - rung
        } else {
            tail + self.entries as u32 - rung
        };
        pending >= batch || outstanding - pending < batch
    }
}

impl SubmissionQueue for PcieSq {
    #[inline(always)]
    unsafe fn push(
        &mut self,
        cid: u16,
        mut sqe: Sqe,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError> {
        // The core has checked that a data address is dword aligned.
        if len > 0 {
            sqe.prp1 = addr0;
            if len as u64 > prp::PAGE - (addr0 & (prp::PAGE - 1)) {
                // Beyond the first page: PRP2 or a list in this tracker's slice.
                let (list, list_iova) = self.prp_list(cid);
                match prp::build(len, addr0, addr_at, list, list_iova) {
                    Ok(p) => sqe.prp2 = p.prp2,
                    Err(e) => return Err(prp_error(e, addr0)),
                }
            }
        }
        sqe.cid = cid;
        self.push_sqe(&sqe);
        Ok(())
    }

    #[inline(always)]
    unsafe fn push_rw(
        &mut self,
        cid: u16,
        opc: NvmOpcode,
        nsid: u32,
        slba: u64,
        nlb: u32,
        flags: RwFlags,
        len: usize,
        addr0: u64,
        addr_at: impl Fn(usize) -> u64,
    ) -> Result<(), SubmitError> {
        if !self.plain {
            let sqe = Sqe::rw(opc, nsid, slba, nlb).with_rw_flags(flags);
            // SAFETY: the caller's contract.
            return unsafe { self.push(cid, sqe, len, addr0, addr_at) };
        }
        let (prp1, prp2) = self.prps(cid, len, addr0, addr_at)?;
        // Eight 64-bit stores from registers (little endian: the entry's
        // byte layout): dword 0 (opcode, FUSE/PSDT 0, CID) and NSID;
        // CDW2-3; MPTR; PRP1; PRP2; SLBA (CDW10-11); CDW12-13; CDW14-15.
        let words = [
            opc as u8 as u64 | (cid as u64) << 16 | (nsid as u64) << 32,
            0,
            0,
            prp1,
            prp2,
            slba,
            Sqe::rw_cdw12(nlb, flags) as u64,
            0,
        ];
        // SAFETY: tail < entries, the ring holds `entries` 64-byte slots
        // and this one is free (see `push_sqe`); word `i` < 8 lies in it.
        let d = unsafe { self.ring.as_ptr().add(self.tail as usize) }.cast::<u64>();
        for (i, w) in words.into_iter().enumerate() {
            // SAFETY: as above.
            unsafe { ptr::write(d.add(i), w.to_le()) };
        }
        self.advance_tail();
        Ok(())
    }

    unsafe fn push_dealloc(&mut self, cid: u16, nsid: u32, lba: u64, nlb: u32) {
        let (list, iova) = self.prp_list(cid);
        let r = DsmRange {
            cattr: 0,
            nlb,
            slba: lba,
        };
        // One 16-byte range in the (≥ 16-byte, 8-byte aligned) list slice.
        list[0] = (r.cattr as u64) | ((r.nlb as u64) << 32);
        list[1] = r.slba;
        let mut sqe = Sqe::dsm(nsid, 1, DSM_ATTR_DEALLOCATE, iova);
        sqe.cid = cid;
        self.push_sqe(&sqe);
    }

    #[inline(always)]
    fn publish(&mut self, outstanding: u32) {
        if self.tail != self.rung {
            // New commands since the last doorbell.
            let batch = self.batch as u32;
            if batch == 1 || self.batch_ready(batch, outstanding) {
                self.ring();
            }
        }
    }

    fn flush(&mut self) {
        if self.tail != self.rung {
            self.ring();
        }
    }

    unsafe fn restart(&mut self) {
        self.tail = 0;
        self.rung = 0;
        // A queue re-created after a reset starts at index 0; the old
        // values in its shadow slots (perhaps written after the controller
        // cleared them) must not survive.
        if let Some(s) = &self.shadow {
            s.clear();
        }
    }

    fn max_data(&self) -> usize {
        // PRP1 may start anywhere in its page; the list covers the rest.
        ((1usize << self.prp_shift).saturating_sub(1)) * prp::PAGE as usize
    }

    fn counters(&self) -> WireCounters {
        self.counters
    }

    fn reset_counters(&mut self) {
        self.counters = WireCounters::default();
    }
}

#[cold]
fn prp_error(e: prp::PrpError, iova: u64) -> SubmitError {
    match e {
        prp::PrpError::Unaligned => SubmitError::Unaligned { iova },
        prp::PrpError::NotPageAligned | prp::PrpError::ListTooSmall { .. } => {
            SubmitError::BadBuffer
        }
    }
}
