//! `Bdev` (a block device, shared by every thread that uses it) and the
//! backends' shared state.
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use pollux_host::{Controller, QpairOptions};
use pollux_nvme::IoBuf;

use crate::error::{Error, Result};
use crate::info::{check_geometry, BdevInfo};
use crate::local::{LocalShared, RamStore, VolatileCache};
use crate::nvme::multipath::MpShared;
use crate::nvme::NvmeShared;
use crate::stats::{BdevStats, Registry};
use crate::uring::{UringOptions, UringShared};

/// A block device. Cheap to clone (shared); every thread that does I/O
/// opens it and takes its own [`Channel`].
pub struct Bdev(pub(crate) Arc<Inner>);

impl Clone for Bdev {
    fn clone(&self) -> Self {
        Bdev(self.0.clone())
    }
}

pub(crate) struct Inner {
    pub info: BdevInfo,
    pub backend: Shared,
    pub stats: Arc<Registry>,
}

pub(crate) enum Shared {
    Local(Arc<LocalShared>),
    Nvme(NvmeShared),
    NvmeMp(MpShared),
    Uring(Arc<UringShared>),
}

impl Bdev {
    fn local(
        name: &str,
        block_size: u32,
        num_blocks: u64,
        ram: Option<RamStore>,
        cache: Option<VolatileCache>,
    ) -> Bdev {
        let is_ram = ram.is_some();
        Bdev(Arc::new(Inner {
            info: crate::local::describe(name, block_size, num_blocks, is_ram),
            backend: Shared::Local(Arc::new(LocalShared {
                failed: Default::default(),
                ram,
                cache,
            })),
            stats: Default::default(),
        }))
    }

    /// A bdev that stores nothing: writes are dropped, reads return the
    /// buffer untouched (SPDK's `bdev_null_create`).
    pub fn null(name: &str, block_size: u32, num_blocks: u64) -> Result<Bdev> {
        check_geometry(name, block_size, num_blocks)?;
        Ok(Bdev::local(name, block_size, num_blocks, None, None))
    }

    /// A RAM disk, zeroed (SPDK's `bdev_malloc_create`).
    pub fn ram(name: &str, block_size: u32, num_blocks: u64) -> Result<Bdev> {
        check_geometry(name, block_size, num_blocks)?;
        let store = RamStore::new(num_blocks * block_size as u64).map_err(|source| Error::Os {
            name: name.to_string(),
            source,
        })?;
        Ok(Bdev::local(name, block_size, num_blocks, Some(store), None))
    }

    /// A RAM disk with a simulated volatile write cache, a testing aid
    /// for durability: a write stays in the cache until a flush, a write
    /// with Force Unit Access, or a FUA read of its blocks commits it to
    /// the simulated media, and [`Bdev::lose_volatile_cache`] drops what
    /// was not committed, as a power loss would. Costs a bit per block
    /// and a second copy of what is written.
    pub fn ram_with_volatile_cache(name: &str, block_size: u32, num_blocks: u64) -> Result<Bdev> {
        check_geometry(name, block_size, num_blocks)?;
        let os = |source| Error::Os {
            name: name.to_string(),
            source,
        };
        let len = num_blocks * block_size as u64;
        let store = RamStore::new(len).map_err(os)?;
        let cache = VolatileCache::new(len, block_size).map_err(os)?;
        Ok(Bdev::local(
            name,
            block_size,
            num_blocks,
            Some(store),
            Some(cache),
        ))
    }

    /// Namespace `nsid` of an NVMe controller; each channel gets its own
    /// I/O queue pair (`qopts`, with the channel's depth).
    pub fn nvme(name: &str, ctrl: Arc<Controller>, nsid: u32, qopts: QpairOptions) -> Result<Bdev> {
        let ns = ctrl.namespace(nsid).ok_or_else(|| Error::Invalid {
            name: name.to_string(),
            msg: format!(
                "controller {} has no active namespace {nsid}",
                ctrl.describe()
            ),
        })?;
        check_geometry(name, ns.lba_size(), ns.nsze())?;
        let info = crate::nvme::describe(name, &ctrl, &ns);
        Ok(Bdev(Arc::new(Inner {
            info,
            backend: Shared::Nvme(NvmeShared { ctrl, ns, qopts }),
            stats: Default::default(),
        })))
    }

    /// One namespace over several controllers (paths, see
    /// [`pollux_host::multipath`]); each channel gets an
    /// [`pollux_host::MpQueuePair`] (`qopts`, with the channel's depth).
    /// Reads and writes of one buffer only (no vectors, flags, flush,
    /// zeroing, reset or passthrough: `Caps` says so).
    pub fn nvme_multipath(
        name: &str,
        mp: Arc<pollux_host::Multipath>,
        qopts: QpairOptions,
    ) -> Result<Bdev> {
        let info = crate::nvme::multipath::describe(name, &mp).ok_or_else(|| Error::Invalid {
            name: name.to_string(),
            msg: "a multipath namespace without paths".to_string(),
        })?;
        check_geometry(name, info.block_size, info.num_blocks)?;
        Ok(Bdev(Arc::new(Inner {
            info,
            backend: Shared::NvmeMp(MpShared { mp, qopts }),
            stats: Default::default(),
        })))
    }

    /// A regular file or a block device through io_uring (see
    /// [`UringOptions`]): each channel gets its own ring. A regular file
    /// shorter than `opts.size` is extended (sparse) to it.
    pub fn uring(
        name: &str,
        path: impl AsRef<std::path::Path>,
        opts: UringOptions,
    ) -> Result<Bdev> {
        let o = crate::uring::open(name, path.as_ref(), opts)?;
        Ok(Bdev(Arc::new(Inner {
            info: crate::uring::describe(name, &o),
            backend: Shared::Uring(Arc::new(o.shared)),
            stats: Default::default(),
        })))
    }

    /// The same bdev with another UUID (before it is shared or opened).
    pub fn with_uuid(mut self, uuid: [u8; 16]) -> Result<Bdev> {
        match Arc::get_mut(&mut self.0) {
            Some(i) => {
                i.info.uuid = uuid;
                Ok(self)
            }
            None => Err(Error::Invalid {
                name: self.0.info.name.clone(),
                msg: "the UUID can only be set before the bdev is shared".into(),
            }),
        }
    }

    pub fn info(&self) -> &BdevInfo {
        &self.0.info
    }

    pub fn name(&self) -> &str {
        &self.0.info.name
    }

    /// Statistics of every channel, live and closed.
    pub fn stats(&self) -> BdevStats {
        self.0.stats.snapshot()
    }

    /// Forgets the latency recorded so far.
    pub fn reset_latency(&self) {
        self.0.stats.reset_latency()
    }

    /// A buffer of `len` bytes this bdev can transfer to and from (DMA
    /// memory of the controller for NVMe; for io_uring, memory of regions
    /// the channels register with their rings when `register_buffers` is
    /// on; page-aligned host memory else), zeroed.
    pub fn alloc_buf(&self, len: usize) -> Result<IoBuf> {
        match &self.0.backend {
            Shared::Local(_) => crate::mem::alloc_host_buf(len).map_err(|source| Error::Os {
                name: self.name().to_string(),
                source,
            }),
            Shared::Nvme(n) => n
                .ctrl
                .alloc_dma(len)
                .map(|d| exact(IoBuf::new(d), len))
                .map_err(|source| Error::Nvme {
                    name: self.name().to_string(),
                    source,
                }),
            Shared::Uring(u) => u.alloc_buf(len).map_err(|source| Error::Os {
                name: self.name().to_string(),
                source,
            }),
            // The first path's memory: every path takes it (as
            // `pollux perf --multipath` does).
            Shared::NvmeMp(m) => match m.mp.controller(0) {
                Some(c) => c
                    .alloc_dma(len)
                    .map(|d| exact(IoBuf::new(d), len))
                    .map_err(|source| Error::Nvme {
                        name: self.name().to_string(),
                        source,
                    }),
                None => Err(Error::Invalid {
                    name: self.name().to_string(),
                    msg: "a multipath namespace without paths".to_string(),
                }),
            },
        }
    }

    /// The path policy and selector of a namespace over several paths
    /// ([`Bdev::nvme_multipath`]); None for any other bdev.
    pub fn multipath_policy(&self) -> Option<(pollux_host::Policy, pollux_host::Selector)> {
        match &self.0.backend {
            Shared::NvmeMp(m) => Some((m.mp.policy(), m.mp.selector())),
            Shared::Local(_) | Shared::Nvme(_) | Shared::Uring(_) => None,
        }
    }

    /// Testing aid: a power loss of a RAM disk made by
    /// [`Bdev::ram_with_volatile_cache`]: every block written and not yet
    /// committed (by a flush or Force Unit Access) reads back as it was
    /// when last committed. Returns how many blocks lost their writes;
    /// None for any other bdev. Requests in flight meanwhile race with it
    /// as with a real power loss: call it with none.
    pub fn lose_volatile_cache(&self) -> Option<u64> {
        match &self.0.backend {
            Shared::Local(l) => match (&l.ram, &l.cache) {
                (Some(ram), Some(c)) => Some(c.lose(ram)),
                _ => None,
            },
            Shared::Uring(_) | Shared::Nvme(_) | Shared::NvmeMp(_) => None,
        }
    }

    /// Testing aid (SPDK's error bdev): a null, RAM or io_uring bdev fails
    /// from now on: every request outstanding on any channel completes
    /// with `IoError::Failed` (io_uring: once the kernel is done with it),
    /// later ones are refused. False for NVMe.
    pub fn inject_failure(&self) -> bool {
        match &self.0.backend {
            Shared::Local(l) => {
                l.failed.store(true, Relaxed);
                true
            }
            Shared::Uring(u) => {
                u.failed.store(true, Relaxed);
                true
            }
            Shared::Nvme(_) | Shared::NvmeMp(_) => false,
        }
    }
}

/// `b` cut to `len` bytes (platforms round DMA memory up to pages).
fn exact(b: IoBuf, len: usize) -> IoBuf {
    if b.len() == len {
        b
    } else {
        b.truncate(len)
    }
}
