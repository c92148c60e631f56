//! File namespaces: a regular file or a block device, accessed with
//! `pread`/`pwrite` (`FileExt`), flushed with `fdatasync`. Temporary: a
//! file namespace becomes a `pollux_bdev` io_uring bdev (and this module
//! goes) once that backend exists.
//!
//! Callers (the I/O command layer) have already checked that every range
//! lies inside the namespace; this checks again and fails with an I/O
//! error rather than touching the file out of bounds.
//!
//! A regular file shorter than the namespace is extended (sparse); a size of
//! 0 means "use the file's size" rounded down to whole LBAs. Deallocate
//! punches a hole and write-zeroes uses `FALLOC_FL_ZERO_RANGE` when the
//! filesystem supports it, else zeroes are written.
//!
//! Caveat: I/O is synchronous inside `step()`; a slow file stalls every queue
//! of the controller (fine for functional tests, not for benchmarks).
use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;

static ZEROES: [u8; 64 * 1024] = [0; 64 * 1024];

pub struct FileBackend {
    file: File,
    size: u64,
    regular: bool,
}

impl FileBackend {
    pub fn open(path: &Path, size: u64, lba: u64) -> io::Result<FileBackend> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(size != 0)
            .truncate(false)
            .open(path)?;
        let meta = file.metadata()?;
        let regular = meta.file_type().is_file();
        let cur = if meta.file_type().is_block_device() {
            file.seek(SeekFrom::End(0))?
        } else if regular {
            meta.len()
        } else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file or block device",
            ));
        };
        let size = if size == 0 { cur / lba * lba } else { size };
        if size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty file namespace",
            ));
        }
        if cur < size {
            if !regular {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("block device has {cur} bytes, namespace wants {size}"),
                ));
            }
            file.set_len(size)?;
        }
        Ok(FileBackend {
            file,
            size,
            regular,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    fn fallocate(&self, mode: libc::c_int, off: u64, len: u64) -> bool {
        if !self.regular || len == 0 {
            return len == 0;
        }
        // SAFETY: plain syscall on an owned descriptor; range checked by caller.
        let r = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                mode,
                off as libc::off_t,
                len as libc::off_t,
            )
        };
        r == 0
    }

    fn write_zero_bytes(&self, mut off: u64, len: u64) -> io::Result<()> {
        let end = off + len;
        while off < end {
            let n = (end - off).min(ZEROES.len() as u64) as usize;
            self.file.write_all_at(&ZEROES[..n], off)?;
            off += n as u64;
        }
        Ok(())
    }
}

impl FileBackend {
    pub fn read(&mut self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        in_bounds(off, buf.len() as u64, self.size)?;
        self.file.read_exact_at(buf, off)
    }

    pub fn write(&mut self, off: u64, buf: &[u8]) -> io::Result<()> {
        in_bounds(off, buf.len() as u64, self.size)?;
        self.file.write_all_at(buf, off)
    }

    pub fn flush(&mut self) -> io::Result<()> {
        self.file.sync_data()
    }

    pub fn deallocate(&mut self, off: u64, len: u64) -> io::Result<()> {
        in_bounds(off, len, self.size)?;
        if self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        ) {
            return Ok(());
        }
        self.write_zero_bytes(off, len)
    }

    pub fn write_zeroes(&mut self, off: u64, len: u64) -> io::Result<()> {
        in_bounds(off, len, self.size)?;
        if self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        ) {
            return Ok(());
        }
        self.write_zero_bytes(off, len)
    }
}

/// `[off, off + len)` lies inside `[0, size)`.
#[inline]
fn in_bounds(off: u64, len: u64, size: u64) -> io::Result<()> {
    match off.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {off:#x}+{len:#x} outside a file namespace of {size:#x} bytes"),
        )),
    }
}
