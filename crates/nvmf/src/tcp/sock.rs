//! The socket system calls the connections use beyond `std::net`: a
//! vectored send, a receive into two pieces (a command's buffer, then the
//! connection's receive buffer), and `SO_INCOMING_CPU`.
use std::io;
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};

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

impl Wire for TcpStream {
    fn recv2(&mut self, first: &mut [u8], second: &mut [u8]) -> io::Result<Option<usize>> {
        recv2(self.as_raw_fd(), first, second)
    }

    unsafe fn send_iov(&mut self, iov: &[libc::iovec]) -> io::Result<usize> {
        // SAFETY: the caller's contract is `send_iov`'s.
        unsafe { send_iov(self.as_raw_fd(), iov) }
    }

    fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        TcpStream::shutdown(self, how)
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

fn getsockopt_int(fd: RawFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes for the call's duration.
    let r = unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
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

/// The CPU whose receive processing last handled this socket's packets
/// (`SO_INCOMING_CPU`), if the kernel knows one.
pub(crate) fn incoming_cpu(fd: RawFd) -> Option<usize> {
    match getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_INCOMING_CPU) {
        Ok(c) if c >= 0 => Some(c as usize),
        _ => None,
    }
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
