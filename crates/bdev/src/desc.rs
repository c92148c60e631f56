//! `Desc` (an opened bdev) and the channels taken from it.
use crate::bdev::{Bdev, Shared};
use crate::channel::{ChanBe, Channel};
use crate::common::Common;
use crate::error::{Error, Result};
use crate::local::LocalChan;
use crate::nvme::NvmeChan;
use crate::options::ChannelOptions;
use crate::uring::UringChan;

impl Bdev {
    /// Opens the bdev; `write` allows writes, write zeroes and unmap.
    pub fn open(&self, write: bool) -> Desc {
        Desc {
            bdev: self.clone(),
            write,
        }
    }
}

/// An opened bdev: what channels are taken from.
pub struct Desc {
    bdev: Bdev,
    write: bool,
}

impl Desc {
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    pub fn writable(&self) -> bool {
        self.write
    }

    /// A channel for the calling thread: all I/O on it is lock-free.
    pub fn channel(&self, opts: &ChannelOptions) -> Result<Channel> {
        let inner = &self.bdev.0;
        let name = || inner.info.name.clone();
        if opts.depth == 0 || opts.depth > 65535 {
            return Err(Error::Invalid {
                name: name(),
                msg: format!("channel depth {} is not in 1..=65535", opts.depth),
            });
        }
        let be = match &inner.backend {
            Shared::Local(l) => ChanBe::Local(LocalChan::new(l.clone(), opts.depth)),
            Shared::Nvme(n) => {
                ChanBe::Nvme(NvmeChan::open(n, opts).map_err(|source| Error::Nvme {
                    name: name(),
                    source,
                })?)
            }
            Shared::Uring(u) => ChanBe::Uring(UringChan::open(u, opts, &inner.info.name)?),
            Shared::NvmeMp(m) => ChanBe::NvmeMp(
                crate::nvme::multipath::open(m, opts)
                    .map_err(|msg| Error::Invalid { name: name(), msg })?,
            ),
        };
        let c = Common::new(&inner.info, self.write, inner.stats.clone(), opts.latency);
        Ok(Channel::new(c, be, self.bdev.clone()))
    }
}
