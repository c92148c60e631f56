//! Where a namespace's data lives: a `pollux_bdev` block device, served
//! through a channel the controller owns: null, RAM, a file or block
//! device through io_uring, or any bdev the caller hands over.
//!
//! Reads and writes lend the command's host segments to the bdev
//! (`readv_raw`/`writev_raw`: no copy) and poll the channel until the
//! request completes, all under the controller lock that keeps the IOMMU
//! mapping of those segments alive. Null and RAM finish within the call
//! (`readv_raw_now`); io_uring completes asynchronously and is polled for
//! (one command at a time: a slow file stalls the controller's queues, as
//! its synchronous `pread` did before). The bdev takes only segments of
//! whole blocks (and aligned to its buffer alignment): a command whose PRP1 offset is not a multiple of the
//! LBA size has such segments, and only such a command goes through a
//! block-aligned bounce buffer, [`BOUNCE`] bytes at a time.
use pollux_bdev::UringOptions;
use pollux_bdev::{Bdev, Channel, ChannelOptions, Completion, Io, IoBuf, IoError, SubmitError};

use crate::config::{BackendConfig, NamespaceConfig};
use crate::dma::Seg;
use crate::SoftError;

/// Bytes of the bounce buffer of a namespace (a multiple of every LBA
/// size the emulator offers).
pub(crate) const BOUNCE: usize = 64 << 10;

/// The `user_data` of the emulator's requests: one is outstanding at a
/// time, so it needs no identity.
const UD: u64 = 0;

// The controller (and so every channel) moves to whichever thread steps
// it; `Controller`'s `unsafe impl Send` must not hide a channel that is
// not `Send`.
const _: () = {
    const fn send<T: Send>() {}
    send::<Channel>();
};

/// Why a namespace operation failed (logged, then turned into an NVMe
/// status by the caller).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    #[error("bdev refused the request: {0}")]
    Refused(#[from] SubmitError),
    #[error("bdev request failed: {0}")]
    Failed(#[from] IoError),
}

/// A namespace's storage: its bdev, through the controller's channel.
pub(crate) struct Store(BdevNs);

/// Creates the storage of namespace `nsid` (1-based) of a controller with
/// serial `serial`; returns it with the namespace size in blocks.
pub(crate) fn open(
    serial: &str,
    nsid: u32,
    cfg: &NamespaceConfig,
) -> Result<(Store, u64), SoftError> {
    let bs = 1u32 << cfg.lba_shift;
    let blocks = cfg.size_bytes >> cfg.lba_shift;
    let name = || format!("{serial}n{nsid}");
    let bdev_err = |source| SoftError::Bdev { nsid, source };
    let bdev = match &cfg.backend {
        BackendConfig::Null => Bdev::null(&name(), bs, blocks).map_err(bdev_err)?,
        BackendConfig::Ram => Bdev::ram(&name(), bs, blocks).map_err(bdev_err)?,
        BackendConfig::Bdev(b) => b.clone(),
        BackendConfig::File { path } => {
            // The emulator's file namespaces keep their old behaviour:
            // created when a size is given, through the page cache (the
            // host's PRP segments need no O_DIRECT alignment).
            if cfg.size_bytes != 0 {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(path)
                    .map_err(|e| {
                        bdev_err(pollux_bdev::Error::Os {
                            name: name(),
                            source: std::io::Error::new(
                                e.kind(),
                                format!("{}: {e}", path.display()),
                            ),
                        })
                    })?;
            }
            let opts = UringOptions {
                block_size: Some(bs),
                size: (cfg.size_bytes != 0).then_some(cfg.size_bytes),
                direct: false,
                register_buffers: false,
                wake_fd: false,
                ..UringOptions::default()
            };
            Bdev::uring(&name(), path, opts).map_err(bdev_err)?
        }
    };
    // `SoftConfig::validate` checked a given bdev's block size and size.
    let nsze = if blocks == 0 {
        bdev.info().num_blocks
    } else {
        blocks
    };
    Ok((Store(BdevNs::new(bdev).map_err(bdev_err)?), nsze))
}

impl Store {
    /// Reads (`write` false) or writes whole blocks at `lba` from or to
    /// the host segments, which total a whole number of blocks.
    ///
    /// # Safety
    /// The segments were translated by the IOMMU under the controller lock,
    /// which is held until this returns (their memory stays mapped).
    #[inline(always)]
    pub unsafe fn rw(&mut self, write: bool, lba: u64, segs: &[Seg]) -> Result<(), StoreError> {
        // SAFETY: forwarded contract.
        unsafe { self.0.rw(write, lba, segs) }
    }

    /// Makes written data durable.
    pub fn flush(&mut self) -> Result<(), StoreError> {
        self.0.flush()
    }

    /// Zeroes `nlb` blocks at `lba`; `dealloc`: deallocates them instead
    /// (they read back as zeroes either way).
    pub fn zero(&mut self, lba: u64, nlb: u64, dealloc: bool) -> Result<(), StoreError> {
        self.0.zero(lba, nlb, dealloc)
    }

    /// The namespace's bdev.
    pub fn bdev(&self) -> &Bdev {
        self.0.ch.bdev()
    }
}

/// A namespace served by a bdev: the controller's channel to it.
pub(crate) struct BdevNs {
    ch: Channel,
    shift: u32,
    /// A segment is usable in place iff `len & len_mask` and
    /// `ptr & addr_mask` are zero (whole blocks, the bdev's alignment).
    len_mask: usize,
    addr_mask: usize,
    /// For commands whose segments are not (see the module doc).
    bounce: IoBuf,
}

impl BdevNs {
    fn new(bdev: Bdev) -> Result<BdevNs, pollux_bdev::Error> {
        let info = bdev.info();
        let (shift, len_mask, addr_mask) = (
            info.block_shift(),
            info.block_size as usize - 1,
            info.buf_align.max(1) as usize - 1,
        );
        let bounce = bdev.alloc_buf(BOUNCE)?;
        // One request at a time: each is polled to completion.
        let ch = bdev.open(true).channel(&ChannelOptions {
            depth: 1,
            latency: false,
            nvme: None,
        })?;
        Ok(BdevNs {
            ch,
            shift,
            len_mask,
            addr_mask,
            bounce,
        })
    }

    /// Polls until the one outstanding request completes.
    #[inline(always)]
    fn wait(&mut self) -> Result<(), IoError> {
        let mut res = None;
        loop {
            self.ch
                .poll(1, &mut |_: &mut Io<'_>, c: Completion| res = Some(c.result));
            if let Some(r) = res {
                return r.map(drop);
            }
            std::hint::spin_loop();
        }
    }

    /// # Safety
    /// As `Store::rw`.
    #[inline(always)]
    unsafe fn rw(&mut self, write: bool, lba: u64, segs: &[Seg]) -> Result<(), StoreError> {
        // One segment (a transfer within a page) is whole blocks already.
        let odd = match segs {
            [s] => s.ptr as usize & self.addr_mask,
            _ => segs.iter().fold(0, |a, s| {
                a | (s.len & self.len_mask) | (s.ptr as usize & self.addr_mask)
            }),
        };
        if odd != 0 {
            // SAFETY: forwarded contract.
            return unsafe { self.rw_bounce(write, lba, segs) };
        }
        // Null and RAM finish within the call (no queued completion).
        // SAFETY: the segments are mapped host memory for the call (the
        // caller's contract).
        let now = unsafe {
            if write {
                self.ch.writev_raw_now(lba, segs)
            } else {
                self.ch.readv_raw_now(lba, segs)
            }
        };
        if let Some(r) = now {
            return Ok(r?);
        }
        let mut io = self.ch.io();
        // SAFETY: the segments are mapped host memory (the caller's
        // contract) and stay so until `wait` has delivered the completion:
        // the controller lock is held throughout, and nothing in the
        // emulator touches them meanwhile.
        unsafe {
            if write {
                io.writev_raw(lba, segs, UD)?
            } else {
                io.readv_raw(lba, segs, UD)?
            }
        }
        Ok(self.wait()?)
    }

    /// `rw` through the bounce buffer, `BOUNCE` bytes per request.
    ///
    /// # Safety
    /// As `Store::rw`.
    #[cold]
    #[inline(never)]
    unsafe fn rw_bounce(&mut self, write: bool, lba: u64, segs: &[Seg]) -> Result<(), StoreError> {
        let total: usize = segs.iter().map(|s| s.len).sum();
        let mut cur = Cursor { segs, i: 0, off: 0 };
        let mut done = 0;
        while done < total {
            let n = (total - done).min(BOUNCE);
            let at = lba + (done >> self.shift) as u64;
            let buf = &mut self.bounce.as_mut_slice()[..n];
            if write {
                // SAFETY: forwarded contract.
                unsafe { cur.gather(buf) };
            }
            let seg = [Seg {
                ptr: buf.as_mut_ptr(),
                len: n,
            }];
            let mut io = self.ch.io();
            // SAFETY: the bounce buffer is ours, `n` bytes long, and only
            // the bdev touches it until `wait` returns (`buf` is not used
            // again: it is re-borrowed below).
            unsafe {
                if write {
                    io.writev_raw(at, &seg, UD)?
                } else {
                    io.readv_raw(at, &seg, UD)?
                }
            }
            self.wait()?;
            if !write {
                // SAFETY: forwarded contract.
                unsafe { cur.scatter(&self.bounce.as_slice()[..n]) };
            }
            done += n;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StoreError> {
        self.ch.flush_cache(UD)?;
        Ok(self.wait()?)
    }

    fn zero(&mut self, lba: u64, nlb: u64, dealloc: bool) -> Result<(), StoreError> {
        if dealloc {
            self.ch.unmap(lba, nlb, UD)?
        } else {
            self.ch.write_zeroes(lba, nlb, UD)?
        }
        Ok(self.wait()?)
    }
}

/// A position in a segment list, for copies in pieces.
struct Cursor<'a> {
    segs: &'a [Seg],
    i: usize,
    off: usize,
}

impl Cursor<'_> {
    /// Copies the next `len` bytes of the segments to `dev`, or
    /// (`to_host`) `len` bytes at `dev` into them.
    ///
    /// # Safety
    /// As `Store::rw`; the segments total at least what is left to copy;
    /// `dev` is valid for `len` bytes (for writes unless `to_host`) and
    /// disjoint from host memory.
    unsafe fn copy(&mut self, dev: *mut u8, len: usize, to_host: bool) {
        let mut done = 0;
        while done < len {
            let Some(s) = self.segs.get(self.i) else {
                debug_assert!(false, "segments shorter than the transfer");
                return;
            };
            let n = (s.len - self.off).min(len - done);
            // SAFETY: `off + n <= s.len` bytes of a mapped segment and
            // `done + n <= len` bytes at `dev` (the caller's contract).
            unsafe {
                let host = s.ptr.add(self.off);
                let dev = dev.add(done);
                if to_host {
                    std::ptr::copy_nonoverlapping(dev, host, n)
                } else {
                    std::ptr::copy_nonoverlapping(host, dev, n)
                }
            }
            done += n;
            self.off += n;
            if self.off == s.len {
                self.i += 1;
                self.off = 0;
            }
        }
    }

    /// # Safety
    /// As `copy`.
    unsafe fn gather(&mut self, dst: &mut [u8]) {
        // SAFETY: forwarded contract; `dst` is writable for its length.
        unsafe { self.copy(dst.as_mut_ptr(), dst.len(), false) }
    }

    /// # Safety
    /// As `copy`.
    unsafe fn scatter(&mut self, src: &[u8]) {
        // SAFETY: forwarded contract; `src` is only read (`to_host`).
        unsafe { self.copy(src.as_ptr().cast_mut(), src.len(), true) }
    }
}
