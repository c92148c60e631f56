//! The target's DH worker pool: the modular exponentiations of
//! DH-HMAC-CHAP (an ffdhe group's key pair and shared secret; up to
//! about 50 ms each at ffdhe8192) run on a few threads of their own, not
//! on the reactor threads that serve every connection's I/O.
//!
//! Fair share: jobs wait per host ([`HostKey`]: the peer's address and
//! the host NQN it claims) and the workers take them round robin between
//! hosts, so a host with many exchanges waiting delays another host's by
//! at most one job per host ahead of it. At most `per_host` jobs of one
//! host are in the pool (waiting or running) and `max` in all; beyond
//! that a job is refused (the caller fails the exchange), with one WARN
//! per [`WARN_EVERY`].
//!
//! A job is two closures: the work (run on a worker, unless the job was
//! cancelled meanwhile: its connection went away) and what it returns,
//! the delivery (run on the worker once the job left the pool's counts,
//! so the host's next message finds its place free). Whatever a job holds
//! is dropped with it (the exchange's secrets zeroise themselves).
use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use pollux_runtime::Remote;

use crate::config::AuthOptions;

/// Least time between two warnings about refused jobs.
pub(crate) const WARN_EVERY: Duration = Duration::from_secs(10);

/// Whose share a job counts against: the peer's address (which a peer
/// cannot choose) and the host NQN it claims (which it can, before it
/// proved anything: with the address beside it, a peer claiming another
/// host's NQN gets a share of its own, not the other host's).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub(crate) struct HostKey {
    pub addr: IpAddr,
    pub hostnqn: String,
}

/// The delivery of a job's result (run on the worker, after the job left
/// the pool).
pub(crate) type Deliver = Box<dyn FnOnce() + Send>;
/// A job's work; it returns its delivery.
pub(crate) type Work = Box<dyn FnOnce() -> Deliver + Send>;

struct Job {
    work: Work,
    cancel: Arc<AtomicBool>,
}

/// Why a job was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refused {
    #[error("this host has {0} DH jobs in the pool already (dhchap_dh_queue_per_host)")]
    PerHost(usize),
    #[error("the DH pool holds {0} jobs already (dhchap_dh_queue_max)")]
    Full(usize),
    #[error("the DH pool is stopped")]
    Stopped,
}

#[derive(Default)]
struct State {
    /// Hosts with jobs waiting, in round-robin order (each once).
    ring: VecDeque<HostKey>,
    waiting: HashMap<HostKey, VecDeque<Job>>,
    /// Jobs in the pool (waiting or running) per host.
    held: HashMap<HostKey, usize>,
    queued: usize,
    running: usize,
    /// Tests: workers hold each job they take until released.
    gate: bool,
    stop: bool,
    refused: u64,
    warned: Option<Instant>,
}

struct Inner {
    st: Mutex<State>,
    cv: Condvar,
    per_host: usize,
    max: usize,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The pool (the target's; its threads stop when it is dropped).
pub(crate) struct DhPool {
    inner: Arc<Inner>,
    /// How results reach the reactor threads (set by the first thread
    /// that starts).
    remote: OnceLock<Remote>,
}

impl DhPool {
    /// A pool of `opts.dh_threads` threads (named `pollux-dh-N`).
    pub fn new(opts: &AuthOptions) -> DhPool {
        let inner = Arc::new(Inner {
            st: Mutex::default(),
            cv: Condvar::new(),
            per_host: opts.dh_queue_per_host.max(1) as usize,
            max: opts.dh_queue_max.max(1) as usize,
        });
        for n in 0..opts.dh_threads.max(1) {
            let i = inner.clone();
            let r = std::thread::Builder::new()
                .name(format!("pollux-dh-{n}"))
                .spawn(move || worker(&i));
            if let Err(e) = r {
                tracing::error!("DH worker thread {n}: {e}");
            }
        }
        DhPool {
            inner,
            remote: OnceLock::new(),
        }
    }

    /// How results reach the reactor threads.
    pub fn set_remote(&self, r: Remote) {
        let _ = self.remote.set(r);
    }

    pub fn remote(&self) -> Option<&Remote> {
        self.remote.get()
    }

    /// Queues `work` for `host` (from `peer`); `cancel` set: it is
    /// dropped unrun. Refused beyond the bounds (logged at WARN, once per
    /// [`WARN_EVERY`]).
    pub fn submit(
        &self,
        host: HostKey,
        peer: SocketAddr,
        cancel: Arc<AtomicBool>,
        work: Work,
    ) -> Result<(), Refused> {
        let mut st = self.inner.lock();
        let mine = st.held.get(&host).copied().unwrap_or(0);
        let total = st.queued + st.running;
        let refused = if st.stop {
            Some(Refused::Stopped)
        } else if mine >= self.inner.per_host {
            Some(Refused::PerHost(mine))
        } else if total >= self.inner.max {
            Some(Refused::Full(total))
        } else {
            None
        };
        if let Some(why) = refused {
            st.refused += 1;
            let now = Instant::now();
            if st
                .warned
                .is_none_or(|at| now.saturating_duration_since(at) >= WARN_EVERY)
            {
                tracing::warn!(
                    %peer,
                    hostnqn = %host.hostnqn,
                    refused = st.refused,
                    per_host = self.inner.per_host,
                    max = self.inner.max,
                    "DH-HMAC-CHAP exchange refused: {why}; AUTH_Failure1 sent (further refusals within {} s are not logged)",
                    WARN_EVERY.as_secs()
                );
                st.refused = 0;
                st.warned = Some(now);
            }
            return Err(why);
        }
        *st.held.entry(host.clone()).or_insert(0) += 1;
        st.queued += 1;
        let q = st.waiting.entry(host.clone()).or_default();
        q.push_back(Job { work, cancel });
        if q.len() == 1 {
            st.ring.push_back(host);
        }
        drop(st);
        self.inner.cv.notify_one();
        Ok(())
    }

    /// (waiting, running) jobs.
    pub fn counts(&self) -> (usize, usize) {
        let st = self.inner.lock();
        (st.queued, st.running)
    }

    /// Tests: workers hold each job they take (counted as running) until
    /// `hold(false)`.
    pub fn hold(&self, on: bool) {
        self.inner.lock().gate = on;
        self.inner.cv.notify_all();
    }
}

impl Drop for DhPool {
    fn drop(&mut self) {
        // Waiting jobs are dropped; the workers end after the job they run.
        let dropped = {
            let mut st = self.inner.lock();
            st.stop = true;
            st.ring.clear();
            st.queued = 0;
            std::mem::take(&mut st.waiting)
        };
        self.inner.cv.notify_all();
        drop(dropped);
    }
}

/// The next job, round robin between hosts (`None`: stopped).
fn next(inner: &Inner) -> Option<(HostKey, Job)> {
    let mut st = inner.lock();
    loop {
        if st.stop {
            return None;
        }
        if let Some(host) = st.ring.pop_front() {
            let (job, more) = match st.waiting.get_mut(&host) {
                Some(q) => (q.pop_front(), !q.is_empty()),
                None => (None, false),
            };
            if more {
                st.ring.push_back(host.clone());
            } else {
                st.waiting.remove(&host);
            }
            let Some(job) = job else { continue };
            st.queued -= 1;
            st.running += 1;
            while st.gate && !st.stop {
                st = inner.cv.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            return Some((host, job));
        }
        st = inner.cv.wait(st).unwrap_or_else(|p| p.into_inner());
    }
}

fn worker(inner: &Inner) {
    while let Some((host, job)) = next(inner) {
        let deliver = if job.cancel.load(Relaxed) {
            None
        } else {
            Some((job.work)())
        };
        {
            let mut st = inner.lock();
            st.running -= 1;
            if let Some(n) = st.held.get_mut(&host) {
                *n -= 1;
                if *n == 0 {
                    st.held.remove(&host);
                }
            }
        }
        if let Some(d) = deliver {
            d();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn host(n: u8) -> HostKey {
        HostKey {
            addr: IpAddr::from([127, 0, 0, 1]),
            hostnqn: format!("nqn.test:host{n}"),
        }
    }

    fn opts(per_host: u32, max: u32) -> AuthOptions {
        AuthOptions {
            dh_threads: 1,
            dh_queue_per_host: per_host,
            dh_queue_max: max,
            ..Default::default()
        }
    }

    fn peer() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    /// Jobs of a host with many waiting alternate with another host's.
    #[test]
    fn round_robin_between_hosts_and_bounds() {
        let p = DhPool::new(&opts(3, 5));
        p.hold(true);
        let (tx, rx) = mpsc::channel();
        let submit = |h: u8, k: u32| {
            let tx = tx.clone();
            p.submit(
                host(h),
                peer(),
                Arc::default(),
                Box::new(move || {
                    Box::new(move || {
                        let _ = tx.send((h, k));
                    })
                }),
            )
        };
        // The first job is taken (held at the gate); then A waits with
        // two more, B with two.
        submit(1, 0).unwrap();
        while p.counts() != (0, 1) {
            std::thread::yield_now();
        }
        submit(1, 1).unwrap();
        submit(1, 2).unwrap();
        assert_eq!(submit(1, 3), Err(Refused::PerHost(3)));
        submit(2, 0).unwrap();
        submit(2, 1).unwrap();
        assert_eq!(submit(3, 0), Err(Refused::Full(5)));
        p.hold(false);
        let order: Vec<(u8, u32)> = (0..5).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(order, [(1, 0), (1, 1), (2, 0), (1, 2), (2, 1)]);
        while p.counts() != (0, 0) {
            std::thread::yield_now();
        }
        // Room again.
        submit(3, 0).unwrap();
        assert_eq!(rx.recv().unwrap(), (3, 0));
    }

    /// A cancelled job is dropped unrun, and its place is given back.
    #[test]
    fn cancelled_jobs_are_dropped() {
        let p = DhPool::new(&opts(1, 4));
        p.hold(true);
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel::<u8>();
        let tx2 = tx.clone();
        p.submit(
            host(1),
            peer(),
            cancel.clone(),
            Box::new(move || {
                Box::new(move || {
                    let _ = tx2.send(1);
                })
            }),
        )
        .unwrap();
        while p.counts() != (0, 1) {
            std::thread::yield_now();
        }
        cancel.store(true, Relaxed);
        p.hold(false);
        while p.counts() != (0, 0) {
            std::thread::yield_now();
        }
        drop(tx);
        assert!(rx.recv().is_err(), "a cancelled job ran");
        // Its host's place is free again.
        p.submit(
            host(1),
            peer(),
            Arc::default(),
            Box::new(|| Box::new(|| {})),
        )
        .unwrap();
    }
}
