//! The socket system calls the connections use beyond `std::net`: a
//! vectored send, a receive into two pieces (a command's buffer, then the
//! connection's receive buffer); and the `posix`
//! wire, a `TcpStream` whose receives the thread's epoll may gate
//! ([`RecvGates`]).
use std::cell::{Cell, RefCell};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::rc::Rc;

use pollux_runtime::Epoll;

/// What a connection needs of its socket. The target's sockets are
/// `TcpStream`s; the connection tests drive the same machine over
/// memory.
pub trait Wire {
    /// Receives into `first` then `second`: bytes read, `Ok(None)` when
    /// nothing is there now, `Ok(Some(0))` at end of stream (a socket's
    /// is this module's `recv2`).
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>>;

    /// Sends what the iovecs describe, in order: bytes taken, `Ok(0)`
    /// when nothing can be taken now (a socket's is this module's
    /// `send_iov`).
    ///
    /// # Safety
    /// Each iovec describes readable memory that stays valid for the
    /// call.
    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize>;

    /// `shutdown(2)`.
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;

    /// The bytes a send that completed after [`send_iov`](Self::send_iov)
    /// returned took (a wire whose sends complete later: `uring`), not yet
    /// reported; the connection advances its send queue by them before it
    /// receives. Sockets whose sends complete in the call have none.
    #[inline(always)]
    fn sent(&mut self) -> Option<io::Result<usize>> {
        None
    }
}

/// Epoll events taken per `epoll_wait` of [`RecvGates::poll`] (more
/// readable sockets are reported by the next one: the set is
/// level-triggered).
const GATE_EVENTS: usize = 64;

/// One thread's receive gates (`TransportOptions::epoll_receive`): a
/// socket whose receive came up empty is not read again until this
/// thread's own epoll set reports it readable.
///
/// An empty `recv` takes the socket's lock, which the peer's transmit
/// (on loopback, its softirq delivering into this socket) needs too;
/// `epoll_wait` reads the ready list without it. One `epoll_wait` per
/// poll, and only while a socket waits, answers for all the thread's
/// connections.
pub(crate) struct RecvGates {
    ep: Epoll,
    /// By slot: may be read now (its last receive got data, or epoll
    /// reported it since).
    ready: RefCell<Vec<bool>>,
    /// Slots not in use.
    free: RefCell<Vec<u32>>,
    /// Sockets waiting for epoll.
    waiting: Cell<u32>,
    events: RefCell<Vec<libc::epoll_event>>,
}

impl RecvGates {
    pub(crate) fn new() -> io::Result<Rc<RecvGates>> {
        Ok(Rc::new(RecvGates {
            ep: Epoll::new()?,
            ready: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            waiting: Cell::new(0),
            events: RefCell::new(vec![libc::epoll_event { events: 0, u64: 0 }; GATE_EVENTS]),
        }))
    }

    /// Opens the gates epoll reports readable (one `epoll_wait`, none
    /// while no socket waits); true if any opened.
    #[inline]
    pub(crate) fn poll(&self) -> bool {
        if self.waiting.get() == 0 {
            return false;
        }
        self.poll_slow()
    }

    #[cold]
    fn poll_slow(&self) -> bool {
        let (Ok(mut ev), Ok(mut ready)) =
            (self.events.try_borrow_mut(), self.ready.try_borrow_mut())
        else {
            return false;
        };
        let n = match self.ep.wait(&mut ev, 0) {
            Ok(n) => n,
            Err(e) => {
                // (Not expected: the set and the buffer are ours.) Every
                // socket is read again, as without gates.
                tracing::warn!("receive gates: epoll_wait: {e}; opening all");
                ready.iter_mut().for_each(|r| *r = true);
                self.waiting.set(0);
                return true;
            }
        };
        let mut opened = false;
        for e in &ev[..n] {
            if let Some(r) = ready.get_mut(e.u64 as usize) {
                if !*r {
                    *r = true;
                    self.waiting.set(self.waiting.get() - 1);
                    opened = true;
                }
            }
        }
        opened
    }

    /// A gate for `fd` (open), watched by this set.
    fn add(self: &Rc<Self>, fd: RawFd) -> io::Result<Gate> {
        let mut ready = self.ready.borrow_mut();
        let slot = match self.free.borrow_mut().pop() {
            Some(s) => s,
            None => {
                ready.push(true);
                u32::try_from(ready.len() - 1).map_err(|_| io::Error::other("too many sockets"))?
            }
        };
        ready[slot as usize] = true;
        if let Err(e) = self.ep.add(fd, u64::from(slot)) {
            self.free.borrow_mut().push(slot);
            return Err(e);
        }
        Ok(Gate {
            set: self.clone(),
            slot,
        })
    }

    #[inline(always)]
    fn is_open(&self, slot: u32) -> bool {
        self.ready
            .try_borrow()
            .map_or(true, |r| r.get(slot as usize).copied().unwrap_or(true))
    }

    /// `slot`'s socket had nothing: wait for epoll.
    #[inline]
    fn close(&self, slot: u32) {
        if let Ok(mut r) = self.ready.try_borrow_mut() {
            if let Some(g) = r.get_mut(slot as usize) {
                if *g {
                    *g = false;
                    self.waiting.set(self.waiting.get() + 1);
                }
            }
        }
    }

    fn release(&self, slot: u32, fd: RawFd) {
        let _ = self.ep.delete(fd);
        let (Ok(mut r), Ok(mut free)) = (self.ready.try_borrow_mut(), self.free.try_borrow_mut())
        else {
            return;
        };
        if let Some(g) = r.get_mut(slot as usize) {
            if !*g {
                self.waiting.set(self.waiting.get() - 1);
            }
            *g = true;
            free.push(slot);
        }
    }
}

/// A socket's place in its thread's [`RecvGates`].
struct Gate {
    set: Rc<RecvGates>,
    slot: u32,
}

/// The `posix` wire: a connected `TcpStream`, its receives gated by the
/// thread's epoll when `TransportOptions::epoll_receive` is on.
pub(crate) struct PosixSock {
    s: TcpStream,
    gate: Option<Gate>,
}

impl PosixSock {
    /// `s`, its receives gated by `gates` if given.
    pub(crate) fn new(s: TcpStream, gates: Option<&Rc<RecvGates>>) -> io::Result<PosixSock> {
        let gate = match gates {
            Some(g) => Some(g.add(s.as_raw_fd())?),
            None => None,
        };
        Ok(PosixSock { s, gate })
    }
}

impl Drop for PosixSock {
    fn drop(&mut self) {
        if let Some(g) = &self.gate {
            g.set.release(g.slot, self.s.as_raw_fd());
        }
    }
}

impl AsFd for PosixSock {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.s.as_fd()
    }
}

impl Wire for PosixSock {
    #[inline]
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
        let Some(g) = &self.gate else {
            return recv2(self.s.as_raw_fd(), first, second);
        };
        if !g.set.is_open(g.slot) {
            return Ok(None);
        }
        let r = recv2(self.s.as_raw_fd(), first, second);
        if matches!(r, Ok(None)) {
            g.set.close(g.slot);
        }
        r
    }

    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: the caller's contract is `send_iov`'s.
        unsafe { send_iov(self.s.as_raw_fd(), iov) }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        self.s.shutdown(how)
    }
}

/// Most iovecs handed to one `sendmsg` (`TransportOptions::send_iov` may
/// lower it).
pub(crate) const MAX_IOV: usize = crate::config::MAX_SEND_IOV;
/// `sendmsg(fd, iov, MSG_DONTWAIT | MSG_NOSIGNAL)`: bytes sent, `Ok(0)`
/// when the socket cannot take more now.
///
/// # Safety
/// Each iovec describes readable memory that stays valid for the call.
pub(crate) unsafe fn send_iov(fd: RawFd, iov: &[libc::iovec]) -> io::Result<usize> {
    if iov.is_empty() {
        return Ok(0);
    }
    // SAFETY: a zeroed msghdr is valid (no name, no control).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
    msg.msg_iovlen = iov.len().min(MAX_IOV) as _;
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    loop {
        // SAFETY: `msg` points at `iov`, valid per the caller's contract.
        let r = unsafe { libc::sendmsg(fd, &msg, flags) };
        if r >= 0 {
            return Ok(r as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(0),
            _ => return Err(e),
        }
    }
}

/// Receives into `first` then `second`: bytes read, `Ok(None)` when
/// nothing is there now, `Ok(Some(0))` at end of stream. With `second`
/// empty it is one `recv`, which skips the VFS layers `readv` goes
/// through (`loopback_bound --empty-poll` measures both); with both
/// pieces, one `readv`.
pub(crate) fn recv2(fd: RawFd, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
    loop {
        let r = if second.is_empty() {
            // SAFETY: `first` is writable memory borrowed mutably for the
            // duration of the call.
            unsafe {
                libc::recv(
                    fd,
                    first.as_mut_ptr().cast(),
                    first.len(),
                    libc::MSG_DONTWAIT,
                )
            }
        } else {
            let iov = [
                libc::iovec {
                    iov_base: first.as_mut_ptr().cast(),
                    iov_len: first.len(),
                },
                libc::iovec {
                    iov_base: second.as_mut_ptr().cast(),
                    iov_len: second.len(),
                },
            ];
            // SAFETY: both iovecs describe writable memory borrowed
            // mutably for the duration of the call.
            unsafe { libc::readv(fd, iov.as_ptr(), 2) }
        };
        if r >= 0 {
            return Ok(Some(r as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return Ok(None),
            _ => return Err(e),
        }
    }
}

/// Raises the soft limit on open descriptors (`RLIMIT_NOFILE`) to the
/// hard limit: returns the soft limit before and after.
pub(crate) fn raise_nofile() -> io::Result<(u64, u64)> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let before = r.rlim_cur;
    if r.rlim_cur < r.rlim_max {
        r.rlim_cur = r.rlim_max;
        // SAFETY: `r` is a valid rlimit, read just above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok((before, r.rlim_cur))
}

/// Whether an `accept` error means the process or the system is out of
/// descriptors or memory (retrying at once would fail again).
pub(crate) fn is_resource_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::TcpListener;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (b, _) = l.accept().unwrap();
        b.set_nonblocking(true).unwrap();
        (a, b)
    }

    /// Reads until `want` bytes arrived through `f` (the sender already
    /// wrote them; loopback delivers them at once, but be patient).
    fn read_until(want: usize, mut f: impl FnMut() -> io::Result<Option<usize>>) -> usize {
        let mut got = 0;
        for _ in 0..100_000 {
            if let Some(n) = f().unwrap() {
                got += n;
                if got >= want {
                    break;
                }
            }
            std::thread::yield_now();
        }
        got
    }

    /// Polls `g` until it opens a gate (loopback delivers at once, but
    /// be patient).
    fn open_soon(g: &RecvGates) -> bool {
        (0..100_000).any(|_| {
            let o = g.poll();
            if !o {
                std::thread::yield_now();
            }
            o
        })
    }

    #[test]
    fn a_gated_socket_is_read_again_only_once_epoll_reports_it() {
        let g = RecvGates::new().unwrap();
        let (mut a, b) = pair();
        let (mut a2, b2) = pair();
        let mut s = PosixSock::new(b, Some(&g)).unwrap();
        let mut s2 = PosixSock::new(b2, Some(&g)).unwrap();
        let mut x = [0u8; 8];
        // Nothing waits: no epoll_wait, nothing opened.
        assert!(!g.poll());
        // Empty: the gate closes.
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), None);
        assert_eq!(g.waiting.get(), 1);
        // Data arrives, but the gate stays shut until the set is polled:
        // no receive is tried (the bytes stay in the socket).
        a.write_all(b"hello").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), None);
        assert!(open_soon(&g));
        assert_eq!(g.waiting.get(), 0);
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), Some(5));
        assert_eq!(&x[..5], b"hello");
        // The other socket is gated on its own.
        assert_eq!(s2.recv2(&mut x, &mut []).unwrap(), None);
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), None);
        assert_eq!(g.waiting.get(), 2);
        a2.write_all(b"two").unwrap();
        assert!(open_soon(&g));
        assert_eq!(g.waiting.get(), 1);
        assert_eq!(s2.recv2(&mut x, &mut []).unwrap(), Some(3));
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), None);
        // The peer's close opens the gate: end of stream is seen.
        drop(a);
        assert!(open_soon(&g));
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), Some(0));
        // A socket dropped while gated no longer counts, and its slot is
        // taken by the next one.
        assert_eq!(s2.recv2(&mut x, &mut []).unwrap(), None);
        assert_eq!(g.waiting.get(), 1);
        drop(s2);
        assert_eq!(g.waiting.get(), 0);
        assert!(!g.poll());
        let (_a3, b3) = pair();
        let s3 = PosixSock::new(b3, Some(&g)).unwrap();
        assert_eq!(s3.gate.as_ref().map(|g| g.slot), Some(1));
        assert_eq!(g.ready.borrow().len(), 2);
    }

    #[test]
    fn an_ungated_socket_reads_every_time() {
        let (mut a, b) = pair();
        let mut s = PosixSock::new(b, None).unwrap();
        let mut x = [0u8; 8];
        assert_eq!(s.recv2(&mut x, &mut []).unwrap(), None);
        a.write_all(b"abc").unwrap();
        assert_eq!(read_until(3, || s.recv2(&mut x, &mut [])), 3);
    }

    #[test]
    fn recv2_one_piece_and_two_pieces_empty_and_end_of_stream() {
        let (mut a, b) = pair();
        let fd = b.as_raw_fd();
        let (mut x, mut y) = ([0u8; 8], [0u8; 16]);
        // Nothing sent yet: None, with one piece and with two.
        assert_eq!(recv2(fd, &mut x, &mut []).unwrap(), None);
        assert_eq!(recv2(fd, &mut x, &mut y).unwrap(), None);
        // One piece (the `recv` route) takes at most its length.
        a.write_all(b"0123456789").unwrap();
        assert_eq!(read_until(8, || recv2(fd, &mut x, &mut [])), 8);
        assert_eq!(&x, b"01234567");
        // Two pieces (the `readv` route) fill the first, then the second.
        a.write_all(b"abcdefghij").unwrap();
        assert_eq!(read_until(12, || recv2(fd, &mut x, &mut y)), 12);
        assert_eq!(&x, b"89abcdef");
        assert_eq!(&y[..4], b"ghij");
        // The peer closed: end of stream is Some(0), on both routes.
        drop(a);
        let mut end = None;
        for _ in 0..100_000 {
            end = recv2(fd, &mut x, &mut []).unwrap();
            if end.is_some() {
                break;
            }
            std::thread::yield_now();
        }
        assert_eq!(end, Some(0));
        assert_eq!(recv2(fd, &mut x, &mut y).unwrap(), Some(0));
    }
}
