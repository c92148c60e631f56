//! A tiny test-only NVMe host: it writes registers, SQEs and doorbells
//! itself, in its own mmap'd memory registered with `dma_map`, and steps the
//! device synchronously. Deliberately independent of the driver crate.
#![allow(dead_code)]

use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use pollux_softnvme::{BackendConfig, NamespaceConfig, SoftConfig, SoftDevice};
use pollux_spec::regs::{self, off, Aqa, Cc, Csts};
use pollux_spec::{Cqe, Sqe, Status};

/// IOVA of the start of host memory.
pub const IOVA_BASE: u64 = 0x10_0000;
pub const PAGE: usize = 4096;

pub struct SqRing {
    pub qid: u16,
    pub iova: u64,
    pub ptr: *mut Sqe,
    pub size: u32,
    pub tail: u32,
}

pub struct CqRing {
    pub qid: u16,
    pub iova: u64,
    pub ptr: *mut Cqe,
    pub size: u32,
    pub head: u32,
    pub phase: bool,
}

/// An I/O queue pair.
pub struct IoQ {
    pub sq: SqRing,
    pub cq: CqRing,
}

pub struct Shadow {
    pub db: *mut u8,
    pub ei: *mut u8,
    pub db_iova: u64,
    pub ei_iova: u64,
}

pub struct Host {
    pub dev: Arc<SoftDevice>,
    pub bar: *mut u8,
    pub bar_len: usize,
    pub mem: *mut u8,
    pub mem_len: usize,
    next: usize,
    pub asq: SqRing,
    pub acq: CqRing,
    next_cid: u16,
    pub dstrd: u8,
    pub shadow: Option<Shadow>,
    /// MMIO doorbell writes made for I/O queues.
    pub mmio_io_doorbells: u64,
}

pub fn ram_ns(lba_shift: u8, size: u64) -> NamespaceConfig {
    NamespaceConfig {
        backend: BackendConfig::Ram,
        lba_shift,
        size_bytes: size,
    }
}

pub fn cfg_ram() -> SoftConfig {
    SoftConfig {
        namespaces: vec![ram_ns(9, 64 << 20), ram_ns(12, 64 << 20)],
        ..Default::default()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        // SAFETY (test): the mapping made in `new`; the device keeps it
        // mapped in its IOMMU, but it is dropped with the host (tests hold
        // no other reference that steps it afterwards)... except an Arc
        // clone; unmap first so the device can never touch it.
        let _ = self.dev.dma_unmap(IOVA_BASE);
        // SAFETY: (test) the device no longer maps this memory (unmapped above); we own the mapping.
        unsafe {
            libc::munmap(self.mem.cast(), self.mem_len);
        }
    }
}

impl Host {
    pub fn new(cfg: SoftConfig) -> Host {
        Self::with_mem(cfg, 64 << 20)
    }

    pub fn with_mem(cfg: SoftConfig, mem_len: usize) -> Host {
        let dstrd = cfg.dstrd;
        let dev = SoftDevice::new(cfg).expect("device");
        let (bar, bar_len) = dev.bar0();
        // SAFETY: (test) fresh anonymous mapping.
        let mem = unsafe {
            libc::mmap(
                ptr::null_mut(),
                mem_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(mem, libc::MAP_FAILED);
        let mem = mem.cast::<u8>();
        // SAFETY: (test) the memory lives until Drop, which unmaps first.
        unsafe {
            dev.dma_map(IOVA_BASE, NonNull::new(mem).unwrap(), mem_len)
                .unwrap()
        };
        Host {
            dev,
            bar: bar.as_ptr(),
            bar_len,
            mem,
            mem_len,
            next: 0,
            asq: SqRing {
                qid: 0,
                iova: 0,
                ptr: ptr::null_mut(),
                size: 0,
                tail: 0,
            },
            acq: CqRing {
                qid: 0,
                iova: 0,
                ptr: ptr::null_mut(),
                size: 0,
                head: 0,
                phase: true,
            },
            next_cid: 1,
            dstrd,
            shadow: None,
            mmio_io_doorbells: 0,
        }
    }

    // ---------------- memory ----------------

    /// Allocates zeroed, page-aligned host memory: (iova, pointer).
    pub fn alloc(&mut self, bytes: usize) -> (u64, *mut u8) {
        let bytes = bytes.max(1).div_ceil(PAGE) * PAGE;
        assert!(self.next + bytes <= self.mem_len, "test host out of memory");
        let off = self.next;
        self.next += bytes;
        // SAFETY: (test) inside our mapping.
        let p = unsafe { self.mem.add(off) };
        // SAFETY: (test) `bytes` bytes from `p` lie inside our mapping (the allocator checks).
        unsafe { ptr::write_bytes(p, 0, bytes) };
        (IOVA_BASE + off as u64, p)
    }

    pub fn ptr(&self, iova: u64) -> *mut u8 {
        let off = (iova - IOVA_BASE) as usize;
        assert!(off < self.mem_len);
        // SAFETY: (test) off < mem_len, asserted above.
        unsafe { self.mem.add(off) }
    }

    pub fn write_mem(&self, iova: u64, data: &[u8]) {
        // SAFETY: (test) `ptr` checks the start lies in our mapping; tests pass ranges inside it.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), self.ptr(iova), data.len()) };
    }

    pub fn read_mem(&self, iova: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: (test) as in write_mem.
        unsafe { ptr::copy_nonoverlapping(self.ptr(iova), v.as_mut_ptr(), len) };
        v
    }

    // ---------------- registers ----------------

    fn reg(&self, o: usize) -> &AtomicU32 {
        assert!(o.is_multiple_of(4) && o + 4 <= self.bar_len);
        // SAFETY: (test) bounds and alignment asserted above; the BAR lives as long as the device.
        unsafe { &*self.bar.add(o).cast::<AtomicU32>() }
    }
    pub fn r32(&self, o: usize) -> u32 {
        self.reg(o).load(Ordering::Acquire)
    }
    pub fn w32(&self, o: usize, v: u32) {
        self.reg(o).store(v, Ordering::Release)
    }
    pub fn r64(&self, o: usize) -> u64 {
        self.r32(o) as u64 | (self.r32(o + 4) as u64) << 32
    }
    pub fn w64(&self, o: usize, v: u64) {
        self.w32(o, v as u32);
        self.w32(o + 4, (v >> 32) as u32);
    }
    pub fn csts(&self) -> Csts {
        Csts(self.r32(off::CSTS))
    }

    pub fn step(&self) -> usize {
        self.dev.step()
    }
    pub fn steps(&self, n: usize) {
        for _ in 0..n {
            self.dev.step();
        }
    }

    /// Allocates admin queues and programs AQA/ASQ/ACQ (not enabling).
    pub fn setup_admin(&mut self, sq_entries: u32, cq_entries: u32) {
        let (sq_iova, sq_ptr) = self.alloc(sq_entries as usize * 64);
        let (cq_iova, cq_ptr) = self.alloc(cq_entries as usize * 16);
        self.asq = SqRing {
            qid: 0,
            iova: sq_iova,
            ptr: sq_ptr.cast(),
            size: sq_entries,
            tail: 0,
        };
        self.acq = CqRing {
            qid: 0,
            iova: cq_iova,
            ptr: cq_ptr.cast(),
            size: cq_entries,
            head: 0,
            phase: true,
        };
        self.w32(off::AQA, Aqa::new(sq_entries as u16, cq_entries as u16).0);
        self.w64(off::ASQ, sq_iova);
        self.w64(off::ACQ, cq_iova);
    }

    /// Sets CC (standard, 4 KiB pages, EN) and steps until RDY or CFS.
    pub fn set_enable(&mut self, en: bool) -> Csts {
        let cc = Cc::standard(0).with_en(en);
        self.w32(off::CC, cc.0);
        for _ in 0..10 {
            self.step();
            let c = self.csts();
            if c.rdy() == en || c.cfs() {
                break;
            }
        }
        if !en {
            self.asq.tail = 0;
            self.acq.head = 0;
            self.acq.phase = true;
            // The admin CQ memory keeps old entries; clear it.
            if !self.acq.ptr.is_null() {
                // SAFETY: (test) the admin CQ lies in our mapping; the controller is disabled while it is cleared.
                unsafe {
                    ptr::write_bytes(self.acq.ptr.cast::<u8>(), 0, self.acq.size as usize * 16)
                };
            }
        }
        self.csts()
    }

    /// A host with admin queues set up and the controller enabled.
    pub fn enabled(cfg: SoftConfig) -> Host {
        let mut h = Host::new(cfg);
        h.setup_admin(32, 32);
        let c = h.set_enable(true);
        assert!(c.rdy() && !c.cfs(), "enable failed: {c:?}");
        h
    }

    // ---------------- queues ----------------

    pub fn cid(&mut self) -> u16 {
        let c = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1).max(1);
        c
    }

    /// Writes `sqe` at the SQ tail (no doorbell).
    pub fn push(sq: &mut SqRing, sqe: Sqe) {
        // SAFETY: (test) tail < entries and the ring lies in our mapping.
        unsafe { ptr::write_volatile(sq.ptr.add(sq.tail as usize), sqe) };
        sq.tail = (sq.tail + 1) % sq.size;
    }

    fn sq_db_off(&self, qid: u16) -> usize {
        regs::sq_tail_doorbell(qid, self.dstrd)
    }
    fn cq_db_off(&self, qid: u16) -> usize {
        regs::cq_head_doorbell(qid, self.dstrd)
    }

    /// Linux's `nvme_dbbuf_need_event`.
    fn need_event(event_idx: u16, new: u16, old: u16) -> bool {
        new.wrapping_sub(event_idx).wrapping_sub(1) < new.wrapping_sub(old)
    }

    /// Publishes a doorbell value (shadow buffer for I/O queues if set up).
    fn doorbell(&mut self, qid: u16, off: usize, old: u32, new: u32) {
        if qid != 0 {
            if let Some(s) = &self.shadow {
                let rel = off - off::DOORBELL_BASE;
                // SAFETY: (test) rel < 4096 inside the shadow page in our mapping; accessed atomically.
                let db = unsafe { &*s.db.add(rel).cast::<AtomicU32>() };
                // SAFETY: (test) as above for the event index page.
                let ei = unsafe { &*s.ei.add(rel).cast::<AtomicU32>() };
                db.store(new, Ordering::Release);
                std::sync::atomic::fence(Ordering::SeqCst);
                let e = ei.load(Ordering::Acquire);
                if Self::need_event(e as u16, new as u16, old as u16) {
                    self.mmio_io_doorbells += 1;
                    self.w32(off, new);
                }
                return;
            }
            self.mmio_io_doorbells += 1;
        }
        self.w32(off, new);
    }

    pub fn ring_sq(&mut self, sq: &SqRing, old_tail: u32) {
        let o = self.sq_db_off(sq.qid);
        self.doorbell(sq.qid, o, old_tail, sq.tail);
    }

    pub fn ring_cq(&mut self, cq: &CqRing, old_head: u32) {
        let o = self.cq_db_off(cq.qid);
        self.doorbell(cq.qid, o, old_head, cq.head);
    }

    /// Takes the next CQE if its phase matches (no doorbell).
    pub fn take(cq: &mut CqRing) -> Option<Cqe> {
        // SAFETY: (test) head < entries and the ring lies in our mapping.
        let slot = unsafe { cq.ptr.add(cq.head as usize) };
        let dw3 =
            // SAFETY: (test) dword 3 of an entry in the ring; accessed atomically.
            unsafe { &*slot.cast::<u8>().add(12).cast::<AtomicU32>() }.load(Ordering::Acquire);
        if ((dw3 >> 16) & 1 != 0) != cq.phase {
            return None;
        }
        // SAFETY: (test) the entry was published (phase checked with Acquire above).
        let cqe = unsafe { ptr::read_volatile(slot) };
        cq.head += 1;
        if cq.head == cq.size {
            cq.head = 0;
            cq.phase = !cq.phase;
        }
        Some(cqe)
    }

    /// Peeks whether a CQE is available without consuming it.
    pub fn peek(cq: &CqRing) -> bool {
        // SAFETY: (test) as in `take`.
        let slot = unsafe { cq.ptr.add(cq.head as usize) };
        let dw3 =
            // SAFETY: (test) as in `take`.
            unsafe { &*slot.cast::<u8>().add(12).cast::<AtomicU32>() }.load(Ordering::Acquire);
        ((dw3 >> 16) & 1 != 0) == cq.phase
    }

    /// Submits an admin command and waits for its completion.
    pub fn admin(&mut self, mut sqe: Sqe) -> Cqe {
        sqe.cid = self.cid();
        let old = self.asq.tail;
        let mut sq = std::mem::replace(
            &mut self.asq,
            SqRing {
                qid: 0,
                iova: 0,
                ptr: ptr::null_mut(),
                size: 0,
                tail: 0,
            },
        );
        Host::push(&mut sq, sqe);
        self.ring_sq(&sq, old);
        self.asq = sq;
        let c = self.wait_admin(100).expect("admin completion");
        assert_eq!(c.cid, sqe.cid, "unexpected admin completion {c:?}");
        c
    }

    /// Submits an admin command, returns its CID, does not wait.
    pub fn admin_submit(&mut self, mut sqe: Sqe) -> u16 {
        sqe.cid = self.cid();
        let old = self.asq.tail;
        let mut sq = std::mem::replace(
            &mut self.asq,
            SqRing {
                qid: 0,
                iova: 0,
                ptr: ptr::null_mut(),
                size: 0,
                tail: 0,
            },
        );
        Host::push(&mut sq, sqe);
        self.ring_sq(&sq, old);
        self.asq = sq;
        sqe.cid
    }

    /// Steps until an admin CQE arrives (consumes it, rings the head).
    pub fn wait_admin(&mut self, max_steps: usize) -> Option<Cqe> {
        for _ in 0..max_steps {
            self.step();
            let old = self.acq.head;
            if let Some(c) = Host::take(&mut self.acq) {
                let cq = std::mem::replace(
                    &mut self.acq,
                    CqRing {
                        qid: 0,
                        iova: 0,
                        ptr: ptr::null_mut(),
                        size: 0,
                        head: 0,
                        phase: true,
                    },
                );
                self.ring_cq(&cq, old);
                self.acq = cq;
                return Some(c);
            }
        }
        None
    }

    pub fn admin_status(&mut self, sqe: Sqe) -> Status {
        self.admin(sqe).status()
    }

    /// Creates I/O CQ+SQ `qid` with `entries` entries each.
    pub fn create_ioq(&mut self, qid: u16, entries: u32) -> IoQ {
        self.create_ioq_irq(qid, entries, None)
    }

    /// Creates I/O CQ+SQ `qid`; `irq: Some(iv)` sets IEN with vector `iv`.
    pub fn create_ioq_irq(&mut self, qid: u16, entries: u32, irq: Option<u16>) -> IoQ {
        let (cq_iova, cq_ptr) = self.alloc(entries as usize * 16);
        let (sq_iova, sq_ptr) = self.alloc(entries as usize * 64);
        let mut create_cq = Sqe::create_io_cq(qid, entries as u16, cq_iova);
        if let Some(iv) = irq {
            create_cq.cdw11 |= pollux_spec::cmd::CQ_IEN | (iv as u32) << 16;
        }
        let s = self.admin_status(create_cq);
        assert!(s.is_success(), "create cq: {s}");
        let s = self.admin_status(Sqe::create_io_sq(qid, entries as u16, qid, sq_iova));
        assert!(s.is_success(), "create sq: {s}");
        IoQ {
            sq: SqRing {
                qid,
                iova: sq_iova,
                ptr: sq_ptr.cast(),
                size: entries,
                tail: 0,
            },
            cq: CqRing {
                qid,
                iova: cq_iova,
                ptr: cq_ptr.cast(),
                size: entries,
                head: 0,
                phase: true,
            },
        }
    }

    /// Submits one I/O command (rings the doorbell), returns its CID.
    pub fn submit(&mut self, q: &mut IoQ, mut sqe: Sqe) -> u16 {
        sqe.cid = self.cid();
        let old = q.sq.tail;
        Host::push(&mut q.sq, sqe);
        self.ring_sq(&q.sq, old);
        sqe.cid
    }

    /// Steps until a CQE arrives on `q` (consumes it and rings the head).
    pub fn wait_io(&mut self, q: &mut IoQ, max_steps: usize) -> Option<Cqe> {
        for _ in 0..max_steps {
            let old = q.cq.head;
            if let Some(c) = Host::take(&mut q.cq) {
                self.ring_cq(&q.cq, old);
                return Some(c);
            }
            self.step();
        }
        None
    }

    /// Submits and waits for one I/O command.
    pub fn io(&mut self, q: &mut IoQ, sqe: Sqe) -> Cqe {
        let cid = self.submit(q, sqe);
        let c = self.wait_io(q, 100).expect("I/O completion");
        assert_eq!(c.cid, cid);
        c
    }

    pub fn io_status(&mut self, q: &mut IoQ, sqe: Sqe) -> Status {
        self.io(q, sqe).status()
    }
}

/// A read/write SQE with PRP1/PRP2 filled.
pub fn rw(op: pollux_spec::NvmOpcode, nsid: u32, slba: u64, nlb: u32, prp1: u64, prp2: u64) -> Sqe {
    let mut s = Sqe::rw(op, nsid, slba, nlb);
    s.prp1 = prp1;
    s.prp2 = prp2;
    s
}

pub fn is(s: Status, sct: u8, sc: u8) -> bool {
    s.is(sct, sc)
}
