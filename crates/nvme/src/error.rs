//! Typed errors. `Error` is for control-path operations (bring-up, admin
//! commands, queue creation); `SubmitError` is returned synchronously by the
//! I/O submit path (nothing was queued); `IoError` is delivered with a
//! completion (the command was accepted but did not succeed).
use pollux_spec::Status;

use crate::fabrics::auth_failed::AuthFailed;
use crate::fabrics::refused::ConnectRefused;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("platform: {0}")]
    Platform(String),
    #[error("DMA memory: {0}")]
    Dma(String),
    #[error("{what} timed out after {ms} ms")]
    Timeout { what: &'static str, ms: u64 },
    #[error("controller reports fatal status (CSTS.CFS)")]
    ControllerFatal,
    #[error("controller is not responding (registers read all ones)")]
    ControllerGone,
    #[error("{cmd} failed: {status}")]
    Nvme { cmd: &'static str, status: Status },
    /// A fabrics controller refused a Connect (the status decoded by the
    /// command: an unknown subsystem, a host not allowed, ...).
    #[error("{0}")]
    ConnectRefused(Box<ConnectRefused>),
    /// In-band authentication (DH-HMAC-CHAP) of a queue failed: the
    /// controller refused the host, or (bidirectional) the host refused the
    /// controller, or the host has no key for a controller that asks.
    #[error("{0}")]
    Auth(Box<AuthFailed>),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("controller granted no I/O queues (or all are in use)")]
    NoQueues,
    #[error("unsupported controller: {0}")]
    Unsupported(String),
    #[error("controller is being reset")]
    Resetting,
    #[error("admin passthrough: {0}")]
    Passthrough(SubmitError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a request was refused at submission. Nothing was queued or sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("LBA range {lba}+{nlb} is outside the namespace ({nsze} blocks)")]
    LbaOutOfRange { lba: u64, nlb: u32, nsze: u64 },
    #[error("zero-length request")]
    ZeroLength,
    #[error("buffer is {got} bytes but the request needs {expected}")]
    BufferLength { expected: usize, got: usize },
    #[error("buffer bus address {iova:#x} is not 4-byte aligned")]
    Unaligned { iova: u64 },
    #[error("buffer is not usable for PRPs (a page in the middle is not page aligned)")]
    BadBuffer,
    #[error("request needs {needed} commands but the queue pair only has {depth} slots")]
    TooLarge { needed: u32, depth: u32 },
    #[error("software queue is full ({limit} requests waiting)")]
    QueueFull { limit: usize },
    #[error("controller is resetting")]
    Resetting,
    #[error("controller has failed and could not be reset")]
    ControllerFailed,
    /// The namespace was not made by this queue pair's controller (its
    /// block size, by which the transfer length is computed, is another
    /// controller's).
    #[error("namespace {nsid} is not a namespace of this queue pair's controller")]
    ForeignNamespace { nsid: u32 },
    /// A passthrough command whose transfer length the driver reads from
    /// the command, with a buffer of another length.
    #[error(
        "{} (opcode {opc:#04x}) transfers {expected} bytes but the buffer is {got} bytes",
        pollux_spec::cmd::command_name(*.opc, *.admin)
    )]
    PassthroughLength {
        opc: u8,
        /// An admin command (else an I/O command).
        admin: bool,
        expected: u64,
        got: usize,
    },
    /// A passthrough command the driver cannot check (see `passthru`).
    #[error(
        "{} (opcode {opc:#04x}) refused: {why}; only the unsafe unchecked passthrough sends it",
        pollux_spec::cmd::command_name(*.opc, *.admin)
    )]
    PassthroughUnchecked {
        opc: u8,
        admin: bool,
        why: &'static str,
    },
}

/// Why an accepted request did not succeed. Delivered with its completion:
/// the driver's, and every block device's (`pollux-bdev` uses this type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IoError {
    #[error("{0}")]
    Nvme(Status),
    #[error("command timed out and was aborted")]
    Timeout,
    #[error("controller was reset while the command was outstanding")]
    ControllerReset,
    #[error("controller failed while the command was outstanding")]
    ControllerFailed,
    /// The controller was unreachable for longer than the transport's
    /// fast-fail time (NVMe/TCP: `fast_io_fail_tmo`): the request, held
    /// while the transport reconnects, failed without waiting for it.
    #[error("controller unreachable for longer than fast_io_fail_tmo: I/O failed without waiting for the reconnect")]
    FastFail,
    /// A backend that is not NVMe (a file through io_uring) failed with
    /// this errno (every Linux errno fits in 16 bits; keeping the error
    /// four bytes keeps a completion three words).
    #[error("{}", std::io::Error::from_raw_os_error(*.0 as i32))]
    Os(u16),
    /// The backend has failed (a block device layer's verdict).
    #[error("backend has failed")]
    Failed,
}

impl IoError {
    /// An errno as an `Os` error (EIO for values that do not fit).
    pub fn os(errno: i32) -> IoError {
        IoError::Os(u16::try_from(errno).unwrap_or(libc::EIO as u16))
    }
}
