//! Opening and probing the file or block device, and what the channels
//! of an io_uring bdev share.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pollux_nvme::IoBuf;

use super::options::{UringOptions, ZCHUNK};
use super::pool::Pool;
use crate::error::{Error, Result};
use crate::info::{random_uuid, BdevInfo, Caps};

const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

/// What `Bdev::uring` needs to describe the bdev.
pub(crate) struct Opened {
    pub block_size: u32,
    pub num_blocks: u64,
    pub buf_align: u32,
    pub max_transfer: u32,
    pub shared: UringShared,
}

/// The description of an opened file or block device as a bdev.
pub(crate) fn describe(name: &str, o: &Opened) -> BdevInfo {
    BdevInfo {
        name: name.to_string(),
        uuid: random_uuid(),
        block_size: o.block_size,
        num_blocks: o.num_blocks,
        buf_align: o.buf_align,
        max_transfer: o.max_transfer,
        backend: "uring",
        caps: Caps {
            flush: true,
            write_zeroes: true,
            unmap: true,
            reset: true,
            nvme_passthru: false,
            host_memory: true,
        },
    }
}

/// What the channels of an io_uring bdev share.
pub(crate) struct UringShared {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) opts: UringOptions,
    pub(super) buf_align: u32,
    pub(super) pool: Option<Arc<Pool>>,
    /// ZCHUNK zero bytes, only ever read (by the kernel).
    pub(super) zeroes: IoBuf,
    /// Set by `Bdev::inject_failure`.
    pub failed: AtomicBool,
}

pub(super) fn os(path: &Path, what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
}

/// The major and minor numbers of `dev`.
fn dev_numbers(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// A queue attribute of the block device `dev` (or of the disk of a
/// partition).
fn sysfs_queue(dev: u64, attr: &str) -> Option<String> {
    let (ma, mi) = dev_numbers(dev);
    [
        format!("/sys/dev/block/{ma}:{mi}/queue/{attr}"),
        format!("/sys/dev/block/{ma}:{mi}/../queue/{attr}"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .map(|s| s.trim().to_string())
}

/// The direct I/O memory and offset alignments statx reports, if it does.
fn dio_align(file: &File) -> Option<(u32, u32)> {
    // SAFETY: statx only writes into `st`, a plain C struct for which all
    // zeroes is a valid value; the empty path with AT_EMPTY_PATH names the
    // open descriptor.
    let (r, st) = unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut st,
        );
        (r, st)
    };
    (r == 0 && st.stx_mask & libc::STATX_DIOALIGN != 0 && st.stx_dio_mem_align != 0)
        .then_some((st.stx_dio_mem_align, st.stx_dio_offset_align))
}

/// A block device's logical block size and size in bytes.
fn blockdev_geometry(file: &File) -> std::io::Result<(u32, u64)> {
    let mut lbs: libc::c_int = 0;
    let mut size: u64 = 0;
    // SAFETY: BLKSSZGET writes one int and BLKGETSIZE64 one u64 through
    // the pointers, which point at such values.
    let (a, b) = unsafe {
        (
            libc::ioctl(
                file.as_raw_fd(),
                BLKSSZGET as _,
                &mut lbs as *mut libc::c_int,
            ),
            libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64),
        )
    };
    if a != 0 || b != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((u32::try_from(lbs).unwrap_or(512).max(512), size))
}

/// Opens and describes `path` (see `Bdev::uring`).
pub(crate) fn open(name: &str, path: &Path, opts: UringOptions) -> Result<Opened> {
    let invalid = |msg: String| Error::Invalid {
        name: name.to_string(),
        msg: format!("{}: {msg}", path.display()),
    };
    let oserr = |what: &str, e: std::io::Error| Error::Os {
        name: name.to_string(),
        source: os(path, what, e),
    };
    let flags = libc::O_CLOEXEC | if opts.direct { libc::O_DIRECT } else { 0 };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| {
            if opts.direct && e.raw_os_error() == Some(libc::EINVAL) {
                invalid(
                    "the file system refuses O_DIRECT (EINVAL): set UringOptions::direct to false"
                        .into(),
                )
            } else {
                oserr("open read-write", e)
            }
        })?;
    let md = file.metadata().map_err(|e| oserr("stat", e))?;
    let ft = md.file_type();
    let blockdev = ft.is_block_device();
    if !blockdev && !ft.is_file() {
        return Err(invalid(
            "is neither a regular file nor a block device".into(),
        ));
    }
    let dio = if opts.direct { dio_align(&file) } else { None };
    let (dev_lbs, dev_size) = if blockdev {
        blockdev_geometry(&file).map_err(|e| oserr("block device geometry", e))?
    } else {
        (512, md.len())
    };
    // The smallest block direct I/O allows.
    let min_block = if !opts.direct {
        512
    } else if blockdev {
        dev_lbs.max(dio.map_or(0, |d| d.1))
    } else {
        dio.map_or(512, |d| d.1).max(512)
    };
    let block_size = opts.block_size.unwrap_or(min_block.max(512));
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(invalid(format!(
            "block_size {block_size} is not a power of two between 512 and 65536"
        )));
    }
    if !block_size.is_multiple_of(min_block) {
        return Err(invalid(format!(
            "block_size {block_size} is not a multiple of the direct I/O granularity {min_block}"
        )));
    }
    let buf_align = if !opts.direct {
        1
    } else {
        match dio {
            Some((mem, _)) if mem.is_power_of_two() => mem,
            _ if blockdev => dev_lbs,
            _ => 512,
        }
    };
    if opts.iopoll {
        if !blockdev {
            return Err(invalid(
                "iopoll needs a block device with poll queues; this is a regular file".into(),
            ));
        }
        if !opts.direct {
            return Err(invalid("iopoll needs direct I/O (direct: true)".into()));
        }
        let poll = sysfs_queue(md.rdev(), "io_poll");
        if poll.as_deref() != Some("1") {
            return Err(invalid(format!(
                "iopoll needs poll queues, and the device's queue/io_poll is {} \
                 (for NVMe: load the driver with poll_queues=N)",
                poll.as_deref().unwrap_or("unreadable")
            )));
        }
    }
    let bs = block_size as u64;
    let size = match opts.size {
        Some(s) if s == 0 || s % bs != 0 => {
            return Err(invalid(format!(
                "size {s} is not a positive multiple of the block size {block_size}"
            )))
        }
        Some(s) if blockdev && s > dev_size => {
            return Err(invalid(format!(
                "size {s} exceeds the block device's {dev_size} bytes"
            )))
        }
        Some(s) => s,
        None if dev_size < bs => {
            return Err(invalid(format!(
                "holds {dev_size} bytes, less than one {block_size}-byte block: give UringOptions::size"
            )))
        }
        None => dev_size - dev_size % bs,
    };
    crate::info::check_geometry(name, block_size, size / bs)?;
    if !blockdev && size > dev_size {
        file.set_len(size)
            .map_err(|e| oserr("extend to the size", e))?;
    }
    let dev = if blockdev { md.rdev() } else { md.dev() };
    let max_transfer = sysfs_queue(dev, "max_sectors_kb")
        .and_then(|s| s.parse::<u32>().ok())
        .and_then(|kb| kb.checked_mul(1024))
        .filter(|&b| b >= block_size)
        .unwrap_or(1 << 20);
    let pool = opts
        .register_buffers
        .then(|| Arc::new(Pool::new(buf_align as usize)));
    let zeroes = alloc_aligned(ZCHUNK, buf_align as usize).map_err(|e| oserr("zero buffer", e))?;
    Ok(Opened {
        block_size,
        num_blocks: size / bs,
        buf_align,
        max_transfer,
        shared: UringShared {
            file,
            path: path.to_path_buf(),
            opts,
            buf_align,
            pool,
            zeroes,
            failed: AtomicBool::new(false),
        },
    })
}

/// `len` bytes of zeroed host memory aligned to `align`.
fn alloc_aligned(len: usize, align: usize) -> std::io::Result<IoBuf> {
    if align <= 4096 {
        return crate::mem::alloc_host_buf(len);
    }
    let mut b = crate::mem::alloc_host_buf(len + align)?;
    let base = b.as_mut_slice().as_mut_ptr() as usize;
    let pad = base.next_multiple_of(align) - base;
    Ok(b.split_at(pad).1.truncate(len))
}

impl UringShared {
    /// A buffer for this bdev: from a registered region when it can be.
    pub fn alloc_buf(&self, len: usize) -> std::io::Result<IoBuf> {
        if let Some(p) = &self.pool {
            if let Some(b) = p.alloc(len)? {
                return Ok(b);
            }
        }
        alloc_aligned(len, self.buf_align as usize)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}
