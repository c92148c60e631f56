//! Typed errors. `SubmitError`: a request refused at submission (nothing
//! was started, its buffers come back in [`Refused`]). `IoError`: an
//! accepted request that did not succeed, delivered with its completion.
//! `Error`: creating bdevs and channels.
use crate::Data;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bdev {name}: {msg}")]
    Invalid { name: String, msg: String },
    #[error("bdev {name}: {source}")]
    Os {
        name: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bdev {name}: {source}")]
    Nvme {
        name: String,
        #[source]
        source: pollux_nvme::Error,
    },
    #[error("bdev {0} is opened read-only")]
    ReadOnly(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a request was refused at submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error("blocks {lba}+{nlb} are outside the bdev ({num_blocks} blocks)")]
    OutOfRange { lba: u64, nlb: u64, num_blocks: u64 },
    #[error("zero-length request")]
    ZeroLength,
    #[error("buffer of {len} bytes is not a whole number of {block_size}-byte blocks")]
    NotBlockMultiple { len: usize, block_size: u32 },
    #[error("buffer at {addr:#x} is not aligned to {align} bytes")]
    Unaligned { addr: u64, align: u32 },
    #[error("request of {len} bytes exceeds the backend's limit of {max}")]
    TooLarge { len: u64, max: u64 },
    #[error("vector of {n} buffers exceeds the limit of {max}")]
    TooManySegments { n: usize, max: usize },
    #[error("channel is full ({depth} requests outstanding)")]
    QueueFull { depth: u32 },
    #[error("{op} is not supported by the {backend} backend")]
    Unsupported {
        op: &'static str,
        backend: &'static str,
    },
    #[error("descriptor is read-only")]
    ReadOnly,
    #[error("user_data {0:#x} has bit 63 set (reserved for the layer)")]
    ReservedUserData(u64),
    #[error("backend has failed")]
    Failed,
    #[error("nvme: {0}")]
    Nvme(pollux_nvme::SubmitError),
}

/// Why an accepted request did not succeed: the driver's type, so an NVMe
/// completion passes through the layer unconverted.
pub use pollux_nvme::IoError;

/// A request refused at submission, with the buffers it came with.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Refused {
    pub error: SubmitError,
    pub data: Data,
}

impl Refused {
    #[cold]
    pub(crate) fn new(error: SubmitError, data: Data) -> Refused {
        Refused { error, data }
    }
}
