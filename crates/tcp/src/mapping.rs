//! An anonymous private mapping, unmapped when dropped: memory handed to
//! the kernel by address (io_uring's provided-buffer rings here, the
//! target's registered data buffers in `pollux_nvmf`).
use std::io;

/// An anonymous private mapping of `len` bytes (page aligned, populated
/// and zeroed), unmapped when dropped.
///
/// Its owner must not drop it while the kernel may still use the memory
/// (forget it instead: [`Mapping::empty`] to swap in).
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> io::Result<Mapping> {
        // SAFETY: a new anonymous private mapping; no existing memory is
        // touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping { ptr: p.cast(), len })
    }

    /// No memory (to swap in for a mapping to forget).
    pub fn empty() -> Mapping {
        Mapping {
            ptr: std::ptr::null_mut(),
            len: 0,
        }
    }

    /// The first byte (null if empty).
    #[inline(always)]
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Bytes mapped.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: the mapping made in `new`, dropped only once the kernel
        // no longer uses it (the owner's rule, see the type's docs).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
