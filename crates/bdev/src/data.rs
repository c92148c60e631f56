//! The buffers a request carries, and what a finished request hands back.
use pollux_nvme::IoBuf;

use crate::error::IoError;

/// The memory of one request, owned by the channel while it is in flight
/// and handed back in its [`Completion`] (or with [`Refused`](crate::Refused)).
#[derive(Debug, Default)]
pub enum Data {
    #[default]
    None,
    /// One buffer.
    One(IoBuf),
    /// A vector of buffers, transferred in order (each a whole number of
    /// blocks).
    Vec(Box<Vec<IoBuf>>),
}

impl Data {
    /// Total bytes.
    pub fn len(&self) -> usize {
        match self {
            Data::None => 0,
            Data::One(b) => b.len(),
            Data::Vec(v) => v.iter().map(IoBuf::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The single buffer, if that is what it holds.
    #[inline(always)]
    pub fn into_one(self) -> Option<IoBuf> {
        match self {
            Data::One(b) => Some(b),
            _ => None,
        }
    }

    /// Every buffer, in order.
    #[inline]
    pub fn into_vec(self) -> Vec<IoBuf> {
        match self {
            Data::None => Vec::new(),
            Data::One(b) => vec![b],
            Data::Vec(v) => *v,
        }
    }
}

impl From<Option<IoBuf>> for Data {
    #[inline(always)]
    fn from(b: Option<IoBuf>) -> Data {
        match b {
            Some(b) => Data::One(b),
            None => Data::None,
        }
    }
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The value given at submission.
    pub user_data: u64,
    /// Success (with NVMe completion dword 0 where the backend is NVMe,
    /// else 0), or why not.
    pub result: Result<u32, IoError>,
    /// The buffers the request was submitted with.
    pub data: Data,
}

/// A piece of memory the caller lends to a request (`Io::readv_raw`,
/// `Io::writev_raw`): host memory only, not DMA memory of a controller.
#[derive(Clone, Copy, Debug)]
pub struct RawSeg {
    pub ptr: *mut u8,
    pub len: usize,
}
