//! What a runtime thread shares with senders on other threads.

use std::collections::VecDeque;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::sys::EventFd;
use crate::Msg;

/// What a runtime thread shares with senders on other threads.
pub(crate) struct ThreadShared {
    pub(crate) index: usize,
    pub(crate) core: usize,
    /// Set while the thread sleeps (or is about to) in epoll: senders
    /// signal `wake` only then.
    pub(crate) asleep: AtomicBool,
    pub(crate) wake: EventFd,
    /// Messages from non-runtime threads.
    pub(crate) external: Mutex<External>,
    /// Set (under the lock) when `external` has messages: the loop takes
    /// the lock only then.
    pub(crate) external_pending: AtomicBool,
}

#[derive(Default)]
pub(crate) struct External {
    pub(crate) queue: VecDeque<Msg>,
    /// The thread has exited: nothing will run what is pushed.
    pub(crate) closed: bool,
}

impl ThreadShared {
    /// Wakes the thread if it sleeps. Call after making a message visible.
    pub(crate) fn notify(&self) {
        // Pairs with the fence in `Reactor::sleep`: either the thread sees
        // the message before sleeping, or this sees `asleep` set.
        fence(Ordering::SeqCst);
        self.wake_if_asleep();
    }

    pub(super) fn wake_if_asleep(&self) {
        if self.asleep.load(Ordering::Relaxed) {
            if let Err(e) = self.wake.signal() {
                tracing::error!(thread = self.index, "waking runtime thread failed: {e}");
            }
        }
    }
}

/// The whole runtime's shared state.
pub(crate) struct Shared {
    pub(crate) threads: Vec<Arc<ThreadShared>>,
    /// Shutdown requested: external senders are refused, threads drain.
    pub(crate) stop: AtomicBool,
}

/// Locks, ignoring poisoning (the data are queues that stay consistent).
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
