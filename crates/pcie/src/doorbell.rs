//! Doorbells, for the hot path: the doorbell register of one queue (a
//! `Doorbell` holds the platform that maps BAR0, so it cannot outlive the
//! mapping) and its shadow doorbell slots (`Shadow`, in the pages of
//! Doorbell Buffer Config, `DbBuf`). Only this crate makes and rings
//! doorbells:
//!
//! ```compile_fail
//! # fn f(ctrl: &pollux_pcie::Controller) {
//! let bell = pollux_pcie::doorbell::Doorbell::new(ctrl.transport().platform(), 0x1008).unwrap(); // error[E0624]: private
//! bell.write(5);
//! # }
//! ```
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;

use pollux_nvme::dma::DmaBuffer;
use pollux_nvme::error::Result;

use crate::platform::Platform;

/// One doorbell register, for the hot path. It holds the platform that
/// maps the BAR, so it can never outlive the mapping; bounds are checked
/// once, when it is made. Only this crate makes and rings them (each
/// queue its own).
pub struct Doorbell {
    reg: NonNull<AtomicU32>,
    _platform: Arc<dyn Platform>,
}

// SAFETY: a doorbell is an atomic register in a mapping kept alive by
// `_platform` (itself Send + Sync); writing it from any thread is fine.
unsafe impl Send for Doorbell {}

impl Doorbell {
    /// The register at `off` of `platform`'s BAR0.
    pub(crate) fn new(platform: &Arc<dyn Platform>, off: usize) -> Result<Doorbell> {
        let reg = NonNull::from(platform.bar0().reg(off)?);
        Ok(Doorbell {
            reg,
            _platform: platform.clone(),
        })
    }

    #[inline(always)]
    pub(crate) fn write(&self, v: u32) {
        // SAFETY: points into BAR0 of `_platform`, which this doorbell keeps
        // alive (and so mapped); bounds were checked in `new`.
        unsafe { self.reg.as_ref() }.store(v, Ordering::Release)
    }
}

impl std::fmt::Debug for Doorbell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Doorbell").field("reg", &self.reg).finish()
    }
}

/// Shadow doorbell and event index slots of one queue (in host memory
/// shared with the controller, see `DbBuf`).
pub(crate) struct Shadow {
    pub(crate) value: NonNull<AtomicU32>,
    pub(crate) event: NonNull<AtomicU32>,
    /// Keeps the shadow pages alive.
    pub(crate) _pages: Arc<DbBuf>,
}

/// NVMe's (and Linux's `nvme_dbbuf_need_event`) rule: an MMIO write is
/// needed iff the event index lies in [old, new).
#[inline(always)]
pub(crate) fn need_event(event: u16, new: u16, old: u16) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

impl Shadow {
    /// Zeroes the shadow value and event index (before the queue exists).
    pub(crate) fn clear(&self) {
        // SAFETY: see `publish`.
        let (v, e) = unsafe { (self.value.as_ref(), self.event.as_ref()) };
        v.store(0, Ordering::Release);
        e.store(0, Ordering::Release);
    }

    /// Publishes `new` (the previous value was `old`); true if the MMIO
    /// doorbell must be written too.
    #[inline(always)]
    pub(crate) fn publish(&self, new: u32, old: u32) -> bool {
        // SAFETY: both point into the shadow/event pages that `_pages` keeps
        // alive; they are 4-byte aligned slots inside one 4 KiB page.
        let (v, e) = unsafe { (self.value.as_ref(), self.event.as_ref()) };
        v.store(new, Ordering::Release);
        // The device must see the new value before we read its event index
        // (Linux: mb() in nvme_dbbuf_update_and_check_event).
        fence(Ordering::SeqCst);
        need_event(e.load(Ordering::Acquire) as u16, new as u16, old as u16)
    }
}

/// Shadow doorbell and event index pages (Doorbell Buffer Config).
pub(crate) struct DbBuf {
    pub(crate) shadow: DmaBuffer,
    pub(crate) eventidx: DmaBuffer,
}

impl DbBuf {
    /// Zeroes both pages with atomic stores: queue pairs of other threads
    /// may be publishing to their slots at the same time.
    pub(crate) fn clear(&self) {
        for buf in [&self.shadow, &self.eventidx] {
            for i in 0..buf.len() / 4 {
                // SAFETY: each buffer is at least one 4 KiB page, 4-byte
                // aligned; every access to these pages is atomic.
                unsafe {
                    std::sync::atomic::AtomicU32::from_ptr(buf.as_ptr().cast::<u32>().add(i))
                }
                .store(0, std::sync::atomic::Ordering::Release);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mmio::Mmio;
    use pollux_nvme::error::Error;

    /// A doorbell keeps the platform that maps BAR0 alive: writing it after
    /// every other handle is gone still hits mapped memory. Before,
    /// `Doorbell` was `Copy` with no lifetime, so this was a use after
    /// unmap.
    #[test]
    fn doorbell_outlives_every_other_handle() {
        /// Stands in for a platform: its BAR0 is memory it owns, and it
        /// tells when it is dropped (so the BAR with it).
        struct Bar {
            bar: Mmio,
            regs: NonNull<u32>,
            _alive: Arc<()>,
        }
        // SAFETY: `regs` is owned by `Bar` (freed in its drop) and only
        // accessed atomically through `bar`.
        unsafe impl Send for Bar {}
        // SAFETY: as above.
        unsafe impl Sync for Bar {}
        impl Drop for Bar {
            fn drop(&mut self) {
                // SAFETY: made by `Box::into_raw` of a 2048-word slice below,
                // freed once, here.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(self.regs.as_ptr(), 2048))
                });
            }
        }
        impl Platform for Bar {
            fn describe(&self) -> String {
                "test BAR".into()
            }
            fn bar0(&self) -> &Mmio {
                &self.bar
            }
            fn alloc_dma(&self, _: usize) -> Result<pollux_nvme::DmaBuffer> {
                Err(Error::Unsupported("no DMA".into()))
            }
        }
        let regs = Box::into_raw(vec![0u32; 2048].into_boxed_slice()).cast::<u32>();
        let regs = NonNull::new(regs).unwrap();
        let alive = Arc::new(());
        let weak = Arc::downgrade(&alive);
        // SAFETY: 8 KiB, 4-byte aligned, freed only when `Bar` drops (after
        // `bar`, which it owns, is gone).
        let bar = unsafe { Mmio::new(regs.cast(), 8192) };
        let p: Arc<dyn Platform> = Arc::new(Bar {
            bar,
            regs,
            _alive: alive,
        });
        let db = Doorbell::new(&p, pollux_spec::regs::off::DOORBELL_BASE).unwrap();
        drop(p);
        assert!(
            weak.upgrade().is_some(),
            "the doorbell keeps the platform (and its BAR) alive"
        );
        db.write(1);
        drop(db);
        assert!(weak.upgrade().is_none(), "and releases it when dropped");
    }

    #[test]
    fn need_event_matches_linux() {
        // Event index inside [old, new): MMIO needed.
        assert!(need_event(5, 6, 5));
        assert!(need_event(5, 10, 3));
        // Event index behind old (device polls): not needed.
        assert!(!need_event(4, 10, 5));
        assert!(!need_event(u16::MAX, 3, 0));
        // Event index at or past new: not needed.
        assert!(!need_event(10, 10, 5));
    }
}
