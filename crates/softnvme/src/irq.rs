//! Interrupts: one eventfd per (MSI-X style) interrupt vector, with
//! Interrupt Coalescing (FID 08h) and per-vector Coalescing Disable
//! (Interrupt Vector Configuration, FID 09h).
//!
//! A CQ created with IEN counts the entries it writes (one predictable
//! branch per completion; CQs without IEN pay only that branch). At the end
//! of a `step()` the controller hands those counts to their vectors here,
//! which decides how many interrupts they raise, and signals each vector's
//! eventfd once (adding the number of interrupts) — one syscall per
//! signalled vector per step, none for a vector with nothing to signal.
//!
//! Coalescing (NVMe 2.0 §5.27.1.8/9): an interrupt is raised when the
//! entries posted since the vector's last interrupt reach the aggregation
//! threshold (THR + 1), or when the aggregation time (TIME x 100 µs) has
//! passed since the first of them; TIME 0 means no delay (the remainder is
//! signalled at the end of the step). Vector 0 (the admin vector) and
//! vectors with CD set are never coalesced: one interrupt per entry. The
//! clock is read at most once per step, and only when a vector starts
//! waiting for its aggregation time or some vector is waiting already.
//!
//! Eventfds are created on first use (a CQ created with IEN on the vector,
//! or the host asking for the vector's fd) and live as long as the device:
//! a controller reset clears the coalescing state but keeps them, so the
//! host's copies stay valid.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use pollux_spec::features::InterruptCoalescing;

/// Most interrupt vectors a controller may offer (the MSI-X table limit).
pub const MAX_IRQ_VECTORS: u16 = 2048;
/// Unit of the aggregation time.
const TIME_UNIT: Duration = Duration::from_micros(100);

#[derive(Default)]
struct Vector {
    fd: Option<OwnedFd>,
    /// Entries posted since the last interrupt, not yet signalled.
    pending: u32,
    /// When the aggregation time of `pending` runs out.
    deadline: Option<Instant>,
    /// Interrupts to signal at the end of this step.
    fire: u64,
    /// Listed in `Irqs::touched`.
    touched: bool,
}

/// Interrupt state of one controller.
pub(crate) struct Irqs {
    vectors: Vec<Vector>,
    /// Vectors with something to signal or a changed state this step.
    touched: Vec<u16>,
    /// Vectors waiting for their aggregation time.
    timed: Vec<u16>,
    /// Earliest deadline among `timed` (as of the last step).
    next_deadline: Option<Instant>,
}

/// Coalescing parameters of one vector: (entries per interrupt, time).
#[inline]
fn params(v: u16, coalescing: InterruptCoalescing, no_coalesce: &[bool]) -> (u32, u8) {
    if v == 0 || no_coalesce.get(v as usize).copied().unwrap_or(true) {
        (1, 0)
    } else {
        (coalescing.thr as u32 + 1, coalescing.time)
    }
}

impl Irqs {
    pub fn new(vectors: u16) -> Irqs {
        Irqs {
            vectors: (0..vectors).map(|_| Vector::default()).collect(),
            touched: Vec::new(),
            timed: Vec::new(),
            next_deadline: None,
        }
    }

    /// Number of vectors offered.
    pub fn len(&self) -> u16 {
        self.vectors.len() as u16
    }

    /// Something to do at the end of a step even if no IEN CQ exists:
    /// interrupts raised outside the CQ scan, or vectors waiting for their
    /// aggregation time (a step must read the clock).
    #[inline(always)]
    pub fn active(&self) -> bool {
        !self.timed.is_empty() || !self.touched.is_empty()
    }

    /// The earliest time a waiting vector must be signalled.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.next_deadline
    }

    pub fn has_fd(&self, v: u16) -> bool {
        self.vectors.get(v as usize).is_some_and(|x| x.fd.is_some())
    }

    /// Vector `v`'s eventfd, created if needed. `v` must be in range.
    pub fn fd(&mut self, v: u16) -> io::Result<&OwnedFd> {
        let Some(x) = self.vectors.get_mut(v as usize) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("interrupt vector {v} out of range"),
            ));
        };
        let fd = match x.fd.take() {
            Some(fd) => fd,
            None => {
                // SAFETY: plain syscall; no pointers.
                let raw = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
                if raw < 0 {
                    return Err(io::Error::last_os_error());
                }
                tracing::debug!(vector = v, fd = raw, "interrupt eventfd created");
                // SAFETY: `raw` is a new descriptor that nothing else owns.
                unsafe { OwnedFd::from_raw_fd(raw) }
            }
        };
        Ok(x.fd.insert(fd))
    }

    /// Accounts `n` entries posted on vector `v`. `now` is read (once per
    /// step, shared by the caller) only if the vector starts waiting for
    /// its aggregation time.
    pub fn add(
        &mut self,
        v: u16,
        n: u32,
        coalescing: InterruptCoalescing,
        no_coalesce: &[bool],
        now: &mut Option<Instant>,
    ) {
        let (per_irq, time) = params(v, coalescing, no_coalesce);
        let Some(x) = self.vectors.get_mut(v as usize) else {
            debug_assert!(false, "CQ with an out-of-range vector");
            return;
        };
        if !x.touched {
            x.touched = true;
            self.touched.push(v);
        }
        let was_waiting = x.deadline.is_some();
        x.pending = x.pending.saturating_add(n);
        let k = x.pending / per_irq;
        if k > 0 {
            // Threshold reached: interrupt; the remainder starts afresh.
            x.fire += k as u64;
            x.pending %= per_irq;
            x.deadline = None;
        }
        if x.pending > 0 {
            if time == 0 {
                x.fire += 1;
                x.pending = 0;
            } else if x.deadline.is_none() {
                let t = *now.get_or_insert_with(Instant::now);
                x.deadline = Some(t + TIME_UNIT * time as u32);
            }
        }
        match (was_waiting, x.deadline.is_some()) {
            (false, true) => self.timed.push(v),
            (true, false) => self.timed.retain(|&t| t != v),
            _ => {}
        }
    }

    /// Raises the interrupts whose aggregation time has passed and
    /// refreshes `next_deadline`. Reads the clock only if some vector
    /// waits (and only if `now` was not read this step yet).
    pub fn expire(&mut self, now: &mut Option<Instant>) {
        if self.timed.is_empty() {
            self.next_deadline = None;
            return;
        }
        let now = *now.get_or_insert_with(Instant::now);
        let mut next: Option<Instant> = None;
        let Irqs {
            vectors,
            touched,
            timed,
            ..
        } = self;
        timed.retain(|&v| {
            let Some(x) = vectors.get_mut(v as usize) else {
                return false;
            };
            match x.deadline {
                Some(d) if d <= now => {
                    x.fire += 1;
                    x.pending = 0;
                    x.deadline = None;
                    if !x.touched {
                        x.touched = true;
                        touched.push(v);
                    }
                    false
                }
                Some(d) => {
                    next = Some(next.map_or(d, |n| n.min(d)));
                    true
                }
                None => false,
            }
        });
        self.next_deadline = next;
    }

    /// Signals every vector with interrupts raised this step. Returns the
    /// number of interrupts signalled.
    pub fn signal(&mut self) -> u64 {
        let mut total = 0;
        for v in self.touched.drain(..) {
            let Some(x) = self.vectors.get_mut(v as usize) else {
                continue;
            };
            x.touched = false;
            let fire = std::mem::take(&mut x.fire);
            if fire == 0 {
                continue;
            }
            total += fire;
            match &x.fd {
                Some(fd) => {
                    // SAFETY: `fd` is an eventfd this device owns; the call
                    // writes 8 bytes from a value, no pointers involved.
                    let r = unsafe { libc::eventfd_write(fd.as_raw_fd(), fire) };
                    if r != 0 {
                        // Only EAGAIN (counter saturated by a host that
                        // never reads) is possible.
                        tracing::warn!(
                            vector = v,
                            error = %io::Error::last_os_error(),
                            "interrupt eventfd write failed"
                        );
                    }
                }
                None => debug_assert!(false, "vector {v} signalled without an eventfd"),
            }
        }
        total
    }

    /// Controller reset: forgets pending interrupts, keeps the eventfds.
    pub fn reset(&mut self) {
        for x in &mut self.vectors {
            x.pending = 0;
            x.deadline = None;
            x.fire = 0;
            x.touched = false;
        }
        self.touched.clear();
        self.timed.clear();
        self.next_deadline = None;
    }
}
