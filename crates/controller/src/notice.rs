//! Changed namespaces, per controller: the Changed Namespace List log
//! page (04h) and the flag that raises the Namespace Attribute Changed
//! event on the controller's thread.
//!
//! A subsystem keeps one [`NsNotice`] per live controller (weakly: a
//! dropped controller's goes at the next change). A namespace change
//! (any thread) adds its NSID to each list and sets each flag; the
//! controller's transport, on the controller's thread, calls
//! `Controller::namespace_events`, which takes the flag and raises the
//! event if the host enabled it. Never on the I/O path.
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::AcqRel;
use std::sync::{Arc, Mutex, Weak};

/// Most NSIDs the Changed Namespace List holds (more: FFFFFFFFh first).
pub const CHANGED_NS_LIST_ENTRIES: usize = 1024;

#[derive(Default)]
struct ChangedList {
    /// Changed NSIDs, ascending, no duplicate.
    nsids: Vec<u32>,
    /// More than `CHANGED_NS_LIST_ENTRIES` changed.
    overflow: bool,
}

/// One controller's changed namespaces.
#[derive(Default)]
pub(crate) struct NsNotice {
    list: Mutex<ChangedList>,
    /// A change the controller has not raised an event for yet.
    pending: AtomicBool,
}

impl NsNotice {
    fn note(&self, nsid: u32) {
        {
            let mut l = self.list.lock().unwrap_or_else(|p| p.into_inner());
            if !l.overflow {
                if let Err(i) = l.nsids.binary_search(&nsid) {
                    if l.nsids.len() >= CHANGED_NS_LIST_ENTRIES {
                        l.overflow = true;
                        l.nsids.clear();
                    } else {
                        l.nsids.insert(i, nsid);
                    }
                }
            }
        }
        self.pending
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// True once per batch of changes.
    pub fn take_pending(&self) -> bool {
        self.pending.swap(false, AcqRel)
    }

    /// The log page (4096 bytes) and clears the list.
    pub fn take_page(&self) -> Vec<u8> {
        let mut l = self.list.lock().unwrap_or_else(|p| p.into_inner());
        let mut page = vec![0u8; CHANGED_NS_LIST_ENTRIES * 4];
        if l.overflow {
            page[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        } else {
            for (d, n) in page.chunks_exact_mut(4).zip(&l.nsids) {
                d.copy_from_slice(&n.to_le_bytes());
            }
        }
        *l = ChangedList::default();
        page
    }
}

/// Every live controller's notice of a subsystem.
#[derive(Default)]
pub(crate) struct Notices {
    ctrls: Mutex<Vec<Weak<NsNotice>>>,
}

impl Notices {
    /// A new controller's notice.
    pub fn register(&self) -> Arc<NsNotice> {
        let n = Arc::new(NsNotice::default());
        let mut c = self.ctrls.lock().unwrap_or_else(|p| p.into_inner());
        c.retain(|w| w.strong_count() > 0);
        c.push(Arc::downgrade(&n));
        n
    }

    /// Namespace `nsid` changed: noted for every live controller.
    pub fn changed(&self, nsid: u32) {
        let mut c = self.ctrls.lock().unwrap_or_else(|p| p.into_inner());
        c.retain(|w| match w.upgrade() {
            Some(n) => {
                n.note(nsid);
                true
            }
            None => false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_sorted_cleared_and_overflows() {
        let ns = Notices::default();
        let a = ns.register();
        ns.changed(5);
        ns.changed(2);
        ns.changed(5);
        assert!(a.take_pending());
        assert!(!a.take_pending());
        let p = a.take_page();
        assert_eq!(&p[..12], &[2, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0]);
        assert!(a.take_page().iter().all(|&b| b == 0));
        for n in 1..=1025 {
            ns.changed(n);
        }
        let p = a.take_page();
        assert_eq!(&p[..8], &[0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
        drop(a);
        ns.changed(1);
        assert!(ns.ctrls.lock().unwrap().is_empty());
    }
}
