//! The server: a Unix socket, owner-only, and one thread that accepts
//! connections and answers their requests in order (as SPDK's RPC
//! server, the handlers run one at a time on that thread).

use std::io::{ErrorKind, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use serde_json::Value;

use crate::conn::{error_response, Closed, Conn};
use crate::error::{RpcError, ServeError};
use crate::limits::Limits;
use crate::methods::Methods;

/// A running JSON-RPC server. Dropping it stops the server thread, closes
/// the connections and removes the socket file.
#[derive(Debug)]
pub struct Server {
    path: PathBuf,
    /// The socket file's (device, inode), so that drop removes only ours.
    file_id: (u64, u64),
    stop: Arc<AtomicBool>,
    wake: UnixStream,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `path` (mode 0600 whatever the umask) and answers
    /// `methods` on a thread of its own.
    ///
    /// If `path` exists: a socket a live server answers on is an error
    /// ([`ServeError::InUse`]); a stale socket (nothing listening) is
    /// replaced; anything else is refused and left alone
    /// ([`ServeError::NotASocket`]).
    pub fn start(path: &Path, methods: Methods, limits: Limits) -> Result<Server, ServeError> {
        clear_stale(path)?;
        let listener = listen(path)?;
        let meta = std::fs::symlink_metadata(path).map_err(|source| ServeError::Io {
            path: path.to_owned(),
            what: "stat",
            source,
        })?;
        let io = |what| {
            let path = path.to_owned();
            move |source| ServeError::Io { path, what, source }
        };
        let (wake, wake_rx) = UnixStream::pair().map_err(io("socketpair"))?;
        wake_rx.set_nonblocking(true).map_err(io("socketpair"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("rpc".into())
            .spawn(move || serve(listener, wake_rx, &stop2, &methods, &limits))
            .map_err(io("spawn thread"))?;
        tracing::info!(path = %path.display(), "JSON-RPC server listening");
        Ok(Server {
            path: path.to_owned(),
            file_id: (meta.dev(), meta.ino()),
            stop,
            wake,
            thread: Some(thread),
        })
    }

    /// Checks `path` as [`Server::start`] would, changing nothing: `Ok`
    /// if it is free or a stale socket; [`ServeError::InUse`] if a live
    /// server answers there; [`ServeError::NotASocket`] if it is something
    /// else. (An app checks before its slow start-up.)
    pub fn check(path: &Path) -> Result<(), ServeError> {
        probe(path).map(|_| ())
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // A full socket buffer means a wake-up is pending already.
        let _ = (&self.wake).write(&[1]);
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("JSON-RPC server thread panicked");
            }
        }
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.file_id => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(path = %self.path.display(), error = %e, "could not remove the RPC socket");
                }
            }
            _ => {}
        }
    }
}

/// Removes a stale socket at `path`; refuses a live one or a non-socket.
fn clear_stale(path: &Path) -> Result<(), ServeError> {
    if !probe(path)? {
        return Ok(());
    }
    tracing::info!(path = %path.display(), "replacing a stale RPC socket");
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(source) => Err(ServeError::Io {
            path: path.to_owned(),
            what: "remove stale socket",
            source,
        }),
    }
}

/// What is at `path`: `Ok(false)` nothing, `Ok(true)` a stale socket;
/// a live socket or a non-socket is an error.
fn probe(path: &Path) -> Result<bool, ServeError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(ServeError::Io {
                path: path.to_owned(),
                what: "stat",
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(ServeError::NotASocket {
            path: path.to_owned(),
        });
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(ServeError::InUse {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(true),
        Err(source) => Err(ServeError::Io {
            path: path.to_owned(),
            what: "probe existing socket",
            source,
        }),
    }
}

/// socket, bind, chmod 0600, listen: the file is owner-only before anyone
/// can connect, whatever the umask.
fn listen(path: &Path) -> Result<UnixListener, ServeError> {
    let io = |what: &'static str| {
        let path = path.to_owned();
        move |source| ServeError::Io { path, what, source }
    };
    // SAFETY: zeroed `sockaddr_un` is a valid value (plain integers and
    // bytes).
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let bytes = path.as_os_str().as_encoded_bytes();
    let max = addr.sun_path.len() - 1;
    if bytes.len() > max || bytes.is_empty() {
        return Err(ServeError::PathTooLong {
            path: path.to_owned(),
            len: bytes.len(),
            max,
        });
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: plain socket(2) call with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io("socket")(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by no one
    // else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    // SAFETY: `addr` is an initialised `sockaddr_un` that lives across the
    // call, and `len` (at most its size) covers the family and the
    // NUL-terminated path.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(addr).cast(),
            len as libc::socklen_t,
        )
    };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        if e.kind() == ErrorKind::AddrInUse {
            return Err(ServeError::InUse {
                path: path.to_owned(),
            });
        }
        return Err(io("bind")(e));
    }
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(io("chmod 0600")(e));
    }
    // SAFETY: listen(2) on the socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        let e = std::io::Error::last_os_error();
        let _ = std::fs::remove_file(path);
        return Err(io("listen")(e));
    }
    Ok(UnixListener::from(fd))
}

/// The server thread's loop: poll the wake-up socket, the listener and
/// every connection; answer requests; close connections past their time.
fn serve(
    listener: UnixListener,
    wake: UnixStream,
    stop: &AtomicBool,
    methods: &Methods,
    limits: &Limits,
) {
    let mut conns: Vec<Conn> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        fds.clear();
        let pfd = |fd: i32, events: i16| libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        fds.push(pfd(wake.as_raw_fd(), libc::POLLIN));
        fds.push(pfd(listener.as_raw_fd(), libc::POLLIN));
        for c in &conns {
            let mut ev = 0;
            if c.wants_read() {
                ev |= libc::POLLIN;
            }
            if c.wants_write() {
                ev |= libc::POLLOUT;
            }
            fds.push(pfd(c.stream.as_raw_fd(), ev));
        }
        let now = Instant::now();
        let timeout = conns
            .iter()
            .filter_map(Conn::pending_since)
            .map(|t| (t + limits.request_timeout).saturating_duration_since(now))
            .min()
            .map_or(-1, |d| i32::try_from(d.as_millis() + 1).unwrap_or(i32::MAX));
        // SAFETY: `fds` is a live, initialised array of `fds.len()`
        // pollfds, each naming an fd this thread owns.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                tracing::error!(error = %e, "JSON-RPC server poll failed; stopping it");
                return;
            }
            continue;
        }
        let now = Instant::now();
        let mut keep = Vec::with_capacity(conns.len());
        for (c, fd) in conns.drain(..).zip(&fds[2..]) {
            let mut c = c;
            let r = if fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                c.on_readable(methods, limits, now)
            } else if fd.revents & libc::POLLOUT != 0 {
                c.on_writable(now)
            } else {
                Ok(())
            };
            let r = r.and_then(|()| match c.pending_since() {
                Some(t) if now.duration_since(t) >= limits.request_timeout => {
                    tracing::warn!(
                        timeout_s = limits.request_timeout.as_secs_f64(),
                        "RPC client held a partial request (or did not read its response) too long; closing the connection"
                    );
                    Err(Closed::Error)
                }
                _ => Ok(()),
            });
            match r {
                Ok(()) => keep.push(c),
                Err(why) => tracing::debug!(?why, "RPC connection closed"),
            }
        }
        conns = keep;
        if fds[1].revents & libc::POLLIN != 0 {
            accept(&listener, &mut conns, limits);
        }
        if fds[0].revents & libc::POLLIN != 0 {
            let mut b = [0u8; 16];
            while matches!((&wake).read_some(&mut b), Ok(n) if n > 0) {}
        }
    }
}

/// Accepts every pending connection; those past the limit get an error
/// and are closed.
fn accept(listener: &UnixListener, conns: &mut Vec<Conn>, limits: &Limits) {
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                if conns.len() >= limits.max_connections {
                    tracing::warn!(
                        limit = limits.max_connections,
                        "too many RPC connections; refusing one"
                    );
                    let e = RpcError::internal(format!(
                        "Too many RPC connections (limit {})",
                        limits.max_connections
                    ));
                    let mut msg = error_response(&Value::Null, &e).to_string();
                    msg.push('\n');
                    let _ = s.set_nonblocking(true);
                    let _ = (&s).write(msg.as_bytes());
                    continue;
                }
                if let Err(e) = s.set_nonblocking(true) {
                    tracing::warn!(error = %e, "RPC connection: set_nonblocking failed");
                    continue;
                }
                conns.push(Conn::new(s));
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                tracing::warn!(error = %e, "RPC accept failed");
                return;
            }
        }
    }
}

/// `Read::read` on a shared reference, named to keep the loop readable.
trait ReadSome {
    fn read_some(self, b: &mut [u8]) -> std::io::Result<usize>;
}

impl ReadSome for &UnixStream {
    fn read_some(mut self, b: &mut [u8]) -> std::io::Result<usize> {
        std::io::Read::read(&mut self, b)
    }
}
