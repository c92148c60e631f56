//! Socket options both ends of NVMe/TCP may set beyond `std::net`:
//! busy polling (`SO_BUSY_POLL`, `SO_PREFER_BUSY_POLL`), a fixed send
//! buffer (`SO_SNDBUF`), and the CPU that receives a socket's packets
//! (`SO_INCOMING_CPU`).
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `SO_BUSY_POLL` (asm-generic/socket.h; the value on x86-64 and arm64).
const SO_BUSY_POLL: libc::c_int = 46;
/// `SO_PREFER_BUSY_POLL` (Linux 5.11).
const SO_PREFER_BUSY_POLL: libc::c_int = 69;

fn setsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32, v: i32) -> io::Result<()> {
    // SAFETY: `v` is a valid int for the call to read; `fd` is open.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to busy-poll the socket's device queue for up to `us`
/// microseconds on a receive that finds nothing (`SO_BUSY_POLL`), and to
/// prefer busy polling over its interrupts (`SO_PREFER_BUSY_POLL`, where
/// the kernel has it: its absence is not an error). Raising `SO_BUSY_POLL`
/// above `net.core.busy_read` needs `CAP_NET_ADMIN`. The kernel busy-polls
/// only sockets whose packets came through a NAPI context with an id
/// (a network card's queue): loopback's have none, so there it changes
/// nothing.
pub fn set_busy_poll(fd: BorrowedFd<'_>, us: u32) -> io::Result<()> {
    let us = i32::try_from(us).unwrap_or(i32::MAX);
    setsockopt_int(fd, libc::SOL_SOCKET, SO_BUSY_POLL, us)?;
    match setsockopt_int(fd, libc::SOL_SOCKET, SO_PREFER_BUSY_POLL, i32::from(us > 0)) {
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(()),
        r => r,
    }
}

/// Fixes the socket's send buffer at `bytes` (`SO_SNDBUF`: the kernel
/// doubles it for its bookkeeping, and stops tuning it itself).
pub fn set_send_buffer(fd: BorrowedFd<'_>, bytes: u32) -> io::Result<()> {
    let b = i32::try_from(bytes).unwrap_or(i32::MAX);
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF, b)
}

/// The socket's send buffer (`SO_SNDBUF`: twice what was asked for, or
/// what the kernel chose).
pub fn send_buffer(fd: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUF).map(|v| v.max(0) as u32)
}

/// The socket's `SO_BUSY_POLL` (microseconds).
pub fn busy_poll(fd: BorrowedFd<'_>) -> io::Result<u32> {
    getsockopt_int(fd, libc::SOL_SOCKET, SO_BUSY_POLL).map(|v| v.max(0) as u32)
}

/// The CPU whose receive processing last handled this socket's packets
/// (`SO_INCOMING_CPU`), if the kernel knows one.
pub fn incoming_cpu(fd: BorrowedFd<'_>) -> Option<usize> {
    match getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_INCOMING_CPU) {
        Ok(c) if c >= 0 => Some(c as usize),
        _ => None,
    }
}

fn getsockopt_int(fd: BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut v: i32 = 0;
    let mut len = std::mem::size_of::<i32>() as libc::socklen_t;
    // SAFETY: `v` and `len` are valid for writes for the call's duration;
    // `fd` is open.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut v as *mut i32).cast(),
            &mut len,
        )
    };
    if r == 0 {
        Ok(v)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsFd;

    #[test]
    fn a_fixed_send_buffer_is_granted_doubled() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        // (64 KiB is under every kernel's default net.core.wmem_max.)
        set_send_buffer(s.as_fd(), 64 << 10).unwrap();
        assert_eq!(send_buffer(s.as_fd()).unwrap(), 128 << 10);
    }

    #[test]
    fn the_incoming_cpu_is_known_once_packets_arrived() {
        use std::io::{Read, Write};
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        a.write_all(b"x").unwrap();
        let mut x = [0u8; 1];
        b.read_exact(&mut x).unwrap();
        let cpu = incoming_cpu(b.as_fd()).expect("a CPU after a packet");
        // (The CPU numbers of this process's set may be sparse.)
        assert!(cpu < 4096, "{cpu}");
    }

    #[test]
    fn busy_poll_is_set_and_cleared() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let s = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(busy_poll(s.as_fd()).unwrap(), 0);
        // Raising it may need CAP_NET_ADMIN: only check when allowed.
        match set_busy_poll(s.as_fd(), 50) {
            Ok(()) => {
                assert_eq!(busy_poll(s.as_fd()).unwrap(), 50);
                set_busy_poll(s.as_fd(), 0).unwrap();
                assert_eq!(busy_poll(s.as_fd()).unwrap(), 0);
            }
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPERM)),
        }
    }
}
