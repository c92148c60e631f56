//! Keep Alive: a thread per controller runs a keep-alive round on the
//! admin link every KATO/2 (the admin path is a mutex-protected control
//! path, so the thread needs no cooperation from the I/O threads, and a
//! controller whose I/O threads are idle stays alive). A round checks the
//! answer to the last Keep Alive (none within KATO: the association is
//! lost) and sends the next (`AdminLink::keep_alive`).
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::fabrics::link::AdminLink;
use crate::fabrics::wire::Fabric;

/// The keep-alive thread of one controller; dropping it stops the thread.
pub struct KeepAlive {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KeepAlive {
    /// Starts the keep-alive thread of `link`, unless its KATO is 0.
    pub fn start<F: Fabric>(link: &Arc<AdminLink<F>>) -> Option<KeepAlive> {
        let kato_ms = link.opts.kato_ms;
        (kato_ms > 0).then(|| {
            let stop = Arc::new(AtomicBool::new(false));
            let (l, s) = (link.clone(), stop.clone());
            let period = Duration::from_millis((kato_ms / 2).max(1) as u64);
            let thread = std::thread::Builder::new()
                .name(format!("nvme-{}-ka", F::NAME))
                .spawn(move || {
                    while !s.load(Ordering::Acquire) {
                        std::thread::park_timeout(period);
                        if s.load(Ordering::Acquire) {
                            break;
                        }
                        l.keep_alive();
                    }
                })
                .ok();
            KeepAlive { stop, thread }
        })
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
