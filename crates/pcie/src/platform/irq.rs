//! Completion interrupts as file descriptors, so a queue pair can block
//! (poll/epoll) on its interrupt instead of spinning.
//!
//! An [`IrqFd`] is one of two kinds:
//! - **eventfd**: VFIO MSI-X vectors (the kernel signals the eventfd from
//!   its interrupt handler) and the emulated controller. The counter is the
//!   number of interrupts since the last read; reading resets it.
//! - **UIO** (`/dev/uioN` of uio_pci_generic): pin-based INTx. A read
//!   returns the device's total interrupt count (u32, wrapping) once it has
//!   changed since this file's last read; `ack` reports the difference.
//!   uio_pci_generic's handler masks INTx (sets Interrupt Disable, bit 10 of
//!   the PCI command register) after every interrupt and has no
//!   `irqcontrol` hook (writing to `/dev/uioN` fails with ENOSYS), so `ack`
//!   re-enables INTx by clearing that bit through sysfs `config`. INTx is
//!   level triggered: while the controller still has unacknowledged
//!   completions (the CQ head doorbell behind the tail) the pin stays
//!   asserted and the next interrupt follows right after the re-enable.
//!   NVMe's INTMS register (BAR0 0x0C) masks pin-based and MSI interrupts
//!   (not MSI-X) per vector; it is 0 after a controller reset, and a
//!   driver that set a bit must clear it through INTMC (0x10) before
//!   waiting on that vector.
//!
//! Both kinds are non-blocking: `ack` never waits, `wait` blocks in poll(2).
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// PCI command register, high byte (config offset 5): bit 10 of the
/// register, Interrupt Disable, is bit 2 here. Only this byte is written,
/// so a concurrent change of the low byte (memory decoding, bus mastering)
/// is never undone.
const PCI_COMMAND_HI: u64 = super::pci::PCI_COMMAND + 1;
const INTX_DISABLE_HI: u8 = 1 << (10 - 8);

enum Kind {
    EventFd,
    Uio {
        /// The device's interrupt count at the last ack (or at enable),
        /// shared by every `IrqFd` of one platform: they share one open
        /// `/dev/uioN` file, whose reads consume the same notifications.
        last: Arc<AtomicU32>,
        /// sysfs `config` of the device, to re-enable INTx.
        config: File,
    },
}

/// An interrupt (vector) delivered through a file descriptor; see the
/// module docs. Obtained from [`Platform::enable_irq`](super::Platform::enable_irq)
/// or wrapped around an eventfd with [`IrqFd::from_eventfd`].
pub struct IrqFd {
    fd: OwnedFd,
    kind: Kind,
}

impl std::fmt::Debug for IrqFd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            Kind::EventFd => "eventfd",
            Kind::Uio { .. } => "uio",
        };
        f.debug_struct("IrqFd")
            .field("fd", &self.fd.as_raw_fd())
            .field("kind", &kind)
            .finish()
    }
}

fn set_nonblocking(fd: &OwnedFd) -> std::io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory involved.
    unsafe {
        let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if fl < 0 {
            return Err(std::io::Error::last_os_error());
        }
        if fl & libc::O_NONBLOCK == 0
            && libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) < 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A new non-blocking, close-on-exec eventfd with counter 0.
#[cfg(target_os = "linux")]
pub(crate) fn new_eventfd() -> Result<OwnedFd> {
    // SAFETY: eventfd(2) with constant flags; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Error::Platform(format!(
            "eventfd: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor that we own from here on.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) })
}

/// Non-blocking read into `buf`: bytes read, or None if nothing is pending.
fn read_nonblocking(fd: &OwnedFd, buf: &mut [u8]) -> std::io::Result<Option<usize>> {
    loop {
        // SAFETY: reads at most buf.len() bytes into buf, which we borrow
        // mutably for the call.
        let r = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if r >= 0 {
            return Ok(Some(r as usize));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(e),
        }
    }
}

impl IrqFd {
    /// A new eventfd (non-blocking, close-on-exec, counter 0).
    #[cfg(target_os = "linux")]
    pub fn eventfd() -> Result<IrqFd> {
        Ok(IrqFd {
            fd: new_eventfd()?,
            kind: Kind::EventFd,
        })
    }

    /// Wraps an eventfd that someone else signals (the emulated controller,
    /// or a VFIO vector). Makes it non-blocking (that flag is shared with
    /// every duplicate of the descriptor; writers are not affected unless
    /// the counter is about to overflow). Refuses descriptors that
    /// `/proc/self/fd` shows are not an eventfd.
    pub fn from_eventfd(fd: OwnedFd) -> Result<IrqFd> {
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        if let Ok(target) = std::fs::read_link(&link) {
            let t = target.to_string_lossy();
            if t != "anon_inode:[eventfd]" {
                return Err(Error::InvalidArgument(format!(
                    "file descriptor {} is not an eventfd (it is {t})",
                    fd.as_raw_fd()
                )));
            }
        }
        set_nonblocking(&fd).map_err(|e| {
            Error::Platform(format!(
                "making eventfd {} non-blocking: {e}",
                fd.as_raw_fd()
            ))
        })?;
        Ok(IrqFd {
            fd,
            kind: Kind::EventFd,
        })
    }

    /// An eventfd already known to be one and non-blocking (created by
    /// the platform).
    pub(crate) fn from_own_eventfd(fd: OwnedFd) -> IrqFd {
        IrqFd {
            fd,
            kind: Kind::EventFd,
        }
    }

    /// A `/dev/uioN` descriptor opened O_NONBLOCK; `last` holds the
    /// interrupt count at enable, `config` is the device's sysfs config.
    pub(crate) fn uio(fd: OwnedFd, last: Arc<AtomicU32>, config: File) -> IrqFd {
        IrqFd {
            fd,
            kind: Kind::Uio { last, config },
        }
    }

    /// Consumes pending signals without blocking; returns how many
    /// interrupts arrived since the last ack (0: none). UIO: also
    /// re-enables INTx when any arrived (see the module docs).
    pub fn ack(&self) -> Result<u64> {
        match &self.kind {
            Kind::EventFd => {
                let mut b = [0u8; 8];
                match read_nonblocking(&self.fd, &mut b) {
                    Ok(None) => Ok(0),
                    Ok(Some(8)) => Ok(u64::from_ne_bytes(b)),
                    Ok(Some(n)) => Err(Error::Platform(format!(
                        "eventfd {} read {n} bytes, want 8",
                        self.fd.as_raw_fd()
                    ))),
                    Err(e) => Err(Error::Platform(format!(
                        "reading eventfd {}: {e}",
                        self.fd.as_raw_fd()
                    ))),
                }
            }
            Kind::Uio { last, config } => {
                let mut b = [0u8; 4];
                let count = match read_nonblocking(&self.fd, &mut b) {
                    Ok(None) => return Ok(0),
                    Ok(Some(4)) => u32::from_ne_bytes(b),
                    Ok(Some(n)) => {
                        return Err(Error::Platform(format!(
                            "UIO interrupt count: read {n} bytes, want 4"
                        )))
                    }
                    Err(e) => {
                        return Err(Error::Platform(format!(
                            "reading the UIO interrupt count: {e}"
                        )))
                    }
                };
                let prev = last.swap(count, Ordering::AcqRel);
                intx_enable(config)?;
                Ok(count.wrapping_sub(prev) as u64)
            }
        }
    }

    /// Blocks until the interrupt is signalled or `timeout` passes (None:
    /// forever); true if it was signalled. Then acks (see [`IrqFd::ack`]).
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let ms: libc::c_int = match deadline {
                None => -1,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    // Round up: a sub-millisecond rest must not busy-loop.
                    let ms = left.as_nanos().div_ceil(1_000_000);
                    ms.min(libc::c_int::MAX as u128) as libc::c_int
                }
            };
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd that lives across the call.
            let r = unsafe { libc::poll(&mut p, 1, ms) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(Error::Platform(format!("poll on interrupt fd: {e}")));
            }
            if r == 0 {
                if ms == 0 {
                    return Ok(false);
                }
                continue; // re-checks the deadline (computes 0 when passed)
            }
            if p.revents & (libc::POLLERR | libc::POLLHUP | libc::POLLNVAL) != 0
                && p.revents & libc::POLLIN == 0
            {
                return Err(Error::Platform(format!(
                    "interrupt fd {} reports an error (poll revents {:#x}; device gone?)",
                    self.fd.as_raw_fd(),
                    p.revents
                )));
            }
            self.ack()?;
            return Ok(true);
        }
    }
}

impl AsFd for IrqFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Clears the PCI command register's Interrupt Disable bit (INTx
/// unmasked), through sysfs `config`; see the module docs.
pub(crate) fn intx_enable(config: &File) -> Result<()> {
    let mut b = [0u8; 1];
    config
        .read_exact_at(&mut b, PCI_COMMAND_HI)
        .map_err(|e| Error::Platform(format!("reading the PCI command register: {e}")))?;
    if b[0] & INTX_DISABLE_HI != 0 {
        config
            .write_all_at(&[b[0] & !INTX_DISABLE_HI], PCI_COMMAND_HI)
            .map_err(|e| {
                Error::Platform(format!(
                    "re-enabling INTx (PCI command register bit 10): {e}"
                ))
            })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// An IrqFd over a fresh eventfd and a writer for the same eventfd.
    fn pair() -> (IrqFd, File) {
        let irq = IrqFd::eventfd().unwrap();
        let w = File::from(irq.as_fd().try_clone_to_owned().unwrap());
        (irq, w)
    }

    fn signal(w: &mut File, n: u64) {
        w.write_all(&n.to_ne_bytes()).unwrap();
    }

    #[test]
    fn eventfd_ack_counts_and_resets() {
        let (irq, mut w) = pair();
        assert_eq!(irq.ack().unwrap(), 0);
        signal(&mut w, 3);
        assert_eq!(irq.ack().unwrap(), 3);
        assert_eq!(irq.ack().unwrap(), 0);
        signal(&mut w, 1);
        signal(&mut w, 1);
        assert_eq!(irq.ack().unwrap(), 2);
    }

    #[test]
    fn eventfd_wait_times_out_or_wakes() {
        let (irq, mut w) = pair();
        assert!(!irq.wait(Some(Duration::from_millis(10))).unwrap());
        assert!(!irq.wait(Some(Duration::ZERO)).unwrap());
        // Signalled from another thread while blocked (or before: either
        // way it is seen); wait acks, so nothing is left.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            signal(&mut w, 1);
        });
        assert!(irq.wait(Some(Duration::from_secs(30))).unwrap());
        t.join().unwrap();
        assert_eq!(irq.ack().unwrap(), 0);
    }

    #[test]
    fn wait_forever_returns_once_signalled() {
        let (irq, mut w) = pair();
        signal(&mut w, 5);
        assert!(irq.wait(None).unwrap());
        assert_eq!(irq.ack().unwrap(), 0);
    }

    #[test]
    fn from_eventfd_makes_it_nonblocking_and_refuses_other_fds() {
        // A blocking eventfd: ack must still not block.
        // SAFETY: eventfd(2) with constant flags, checked below.
        let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        let mut w = File::from(fd.try_clone().unwrap());
        let irq = IrqFd::from_eventfd(fd).unwrap();
        assert_eq!(irq.ack().unwrap(), 0);
        signal(&mut w, 7);
        assert_eq!(irq.ack().unwrap(), 7);

        let f = File::open("/proc/self/status").unwrap();
        let e = IrqFd::from_eventfd(f.into()).unwrap_err();
        assert!(e.to_string().contains("is not an eventfd"), "{e}");
    }

    /// The UIO kind over a pipe standing in for `/dev/uioN` (which returns
    /// the total interrupt count once it changed) and a temp file for the
    /// config space: ack reports differences and re-enables INTx.
    #[test]
    fn uio_ack_reports_count_differences_and_unmasks() {
        let mut fds = [0; 2];
        // SAFETY: pipe2 fills the two-element array.
        let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(rc, 0);
        // SAFETY: fresh descriptors we own.
        let (r, w) = unsafe {
            (
                <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[0]),
                <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fds[1]),
            )
        };
        let mut w = File::from(w);
        let cfg = temp_config([0x86, 0x80, 0x10, 0x00, 0x06, 0x04, 0x10, 0x00]);
        let irq = IrqFd::uio(
            r,
            Arc::new(AtomicU32::new(u32::MAX - 1)),
            cfg.try_clone().unwrap(),
        );
        assert_eq!(irq.ack().unwrap(), 0);
        assert_eq!(command(&cfg), 0x0406, "no interrupt: left masked");
        // The counter wraps: MAX-1 -> 2 is 4 interrupts.
        w.write_all(&2u32.to_ne_bytes()).unwrap();
        assert_eq!(irq.ack().unwrap(), 4);
        assert_eq!(command(&cfg), 0x0006, "INTx re-enabled");
        w.write_all(&3u32.to_ne_bytes()).unwrap();
        assert!(irq.wait(Some(Duration::from_secs(30))).unwrap());
        assert_eq!(irq.ack().unwrap(), 0);
    }

    fn temp_config(bytes: [u8; 8]) -> File {
        let path = std::env::temp_dir().join(format!(
            "pollux-irq-cfg-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f.write_all_at(&bytes, 0).unwrap();
        f
    }

    fn command(cfg: &File) -> u16 {
        let mut b = [0u8; 2];
        cfg.read_exact_at(&mut b, 4).unwrap();
        u16::from_le_bytes(b)
    }

    #[test]
    fn intx_enable_clears_only_the_interrupt_disable_bit() {
        // A stand-in for sysfs config: command register 0x0406 (INTx
        // disabled, bus master, memory), status 0x0010.
        let f = temp_config([0x86, 0x80, 0x10, 0x00, 0x06, 0x04, 0x10, 0x00]);
        intx_enable(&f).unwrap();
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b, [0x86, 0x80, 0x10, 0x00, 0x06, 0x00, 0x10, 0x00]);
        // Already enabled: unchanged.
        intx_enable(&f).unwrap();
        f.read_exact_at(&mut b, 0).unwrap();
        assert_eq!(b[4..6], [0x06, 0x00]);
    }
}
