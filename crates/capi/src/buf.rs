//! DMA buffers: memory a controller (or a bdev) can transfer to and from.
use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use pollux_host::{DmaBuffer, DmaSlice, IoBuf};

use crate::ctrl::pollux_ctrl;
use crate::error::{guard, guard_ptr, Fail};

/// A DMA buffer (opaque): from `pollux_buf_alloc` (a controller's, lent
/// by range to queue-pair requests) or `pollux_bdev_buf_alloc` (a bdev's,
/// lent whole to channel requests).
#[allow(non_camel_case_types)]
pub struct pollux_buf {
    pub(crate) mem: Mem,
    ptr: *mut u8,
    len: usize,
    /// Queue-pair requests in flight on it (a buffer is used by one
    /// thread at a time).
    pub(crate) inflight: Cell<u32>,
    /// The `live` count of the controller or bdev it came from (which
    /// cannot be freed while the count includes this buffer).
    live: *const AtomicUsize,
}

pub(crate) enum Mem {
    /// A controller's memory: requests borrow ranges of it.
    Dma(DmaBuffer),
    /// A bdev's: lent whole to a request (None while it is in flight).
    Io(Option<IoBuf>),
}

impl pollux_buf {
    pub(crate) fn from_io(mut io: IoBuf, live: &AtomicUsize) -> pollux_buf {
        let ptr = io.as_mut_slice().as_mut_ptr();
        pollux_buf {
            len: io.len(),
            mem: Mem::Io(Some(io)),
            ptr,
            inflight: Cell::new(0),
            live,
        }
    }

    /// The bus addresses of `off..off + len` of a controller's buffer.
    pub(crate) fn range(&self, off: usize, len: usize) -> Result<DmaSlice<'_>, Fail> {
        let Mem::Dma(m) = &self.mem else {
            return Err(Fail::new(
                libc::EINVAL,
                "a bdev's buffer (pollux_bdev_buf_alloc) used on a queue pair",
            ));
        };
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(m.slice(off..end)),
            _ => Err(Fail::new(
                libc::ERANGE,
                format!("range {off}+{len} is outside the {}-byte buffer", self.len),
            )),
        }
    }

    fn busy(&self) -> bool {
        self.inflight.get() > 0 || matches!(self.mem, Mem::Io(None))
    }
}

/// A DMA buffer of `len` bytes for the queue pairs of `ctrl` (zeroed). NULL
/// on error.
///
/// # Safety
/// `ctrl` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_buf_alloc(ctrl: *mut pollux_ctrl, len: usize) -> *mut pollux_buf {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        if len == 0 {
            return Err(Fail::new(libc::EINVAL, "len is 0"));
        }
        let mut m = c
            .ctrl
            .alloc_dma(len)
            .map_err(|e| Fail::new(libc::ENOMEM, format!("{len}-byte DMA buffer: {e}")))?;
        m.as_mut_slice().fill(0);
        let ptr = m.as_ptr();
        c.live.fetch_add(1, Ordering::AcqRel);
        Ok(Box::into_raw(Box::new(pollux_buf {
            len: m.len(),
            mem: Mem::Dma(m),
            ptr,
            inflight: Cell::new(0),
            live: &c.live,
        })))
    })
}

/// Frees a buffer. -EBUSY (nothing done) while a request on it is in
/// flight (its callback has not run).
///
/// # Safety
/// `buf` is NULL or a live handle, used by no other call meanwhile; after
/// success it and its memory are freed.
#[no_mangle]
pub unsafe extern "C" fn pollux_buf_free(buf: *mut pollux_buf) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { buf.as_ref() }.ok_or_else(|| Fail::null("buf"))?;
        if b.busy() {
            return Err(Fail::busy(
                "the buffer is in flight: poll until its callbacks ran",
            ));
        }
        // SAFETY: a live buffer's controller or bdev is live (it cannot be
        // freed while its `live` count includes the buffer).
        if let Some(l) = unsafe { b.live.as_ref() } {
            l.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: from Box::into_raw, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(buf) });
        Ok(0)
    })
}

/// The buffer's memory (NULL if `buf` is NULL). Touching it while a
/// request using it is in flight is undefined (see the header).
///
/// # Safety
/// `buf` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_buf_ptr(buf: *const pollux_buf) -> *mut c_void {
    // SAFETY: the caller's contract.
    unsafe { buf.as_ref() }.map_or(std::ptr::null_mut(), |b| b.ptr.cast())
}

/// The buffer's length in bytes (0 if `buf` is NULL).
///
/// # Safety
/// `buf` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_buf_len(buf: *const pollux_buf) -> usize {
    // SAFETY: the caller's contract.
    unsafe { buf.as_ref() }.map_or(0, |b| b.len)
}
