//! Queue pairs: read, write, flush and raw commands on ranges of DMA
//! buffers, completions delivered to C callbacks by `pollux_qpair_poll`.
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;

use pollux_host::{DmaSlice, IoError, Namespace, QpairOptions, QueuePair, SubmitError};
use pollux_spec::Sqe;
use zerocopy::FromBytes;

use crate::buf::pollux_buf;
use crate::ctrl::pollux_ctrl;
use crate::error::{guard, guard_ptr, Fail};

/// A completion, as a callback gets it.
#[repr(C)]
pub struct pollux_cpl {
    /// 0 on success, else a negative errno: -EIO for an NVMe error status
    /// (see `sct`/`sc`), -ETIMEDOUT (aborted after the timeout or the
    /// controller unreachable too long), -ECANCELED (controller reset),
    /// -ENODEV (controller failed), or the backend's errno (bdevs).
    pub status: c_int,
    /// Completion dword 0 on success (NVMe), else 0.
    pub cdw0: u32,
    /// NVMe Status Code Type and Status Code when `status` is -EIO from
    /// the controller, else 0.
    pub sct: u8,
    pub sc: u8,
}

/// A completion callback: `arg` as given at submission; `cpl` is valid
/// during the call only.
#[allow(non_camel_case_types)]
pub type pollux_cb = Option<unsafe extern "C" fn(arg: *mut c_void, cpl: *const pollux_cpl)>;

pub(crate) fn cpl_of(r: &Result<u32, IoError>) -> pollux_cpl {
    let (status, cdw0, sct, sc) = match r {
        Ok(v) => (0, *v, 0, 0),
        Err(IoError::Nvme(s)) => (-libc::EIO, 0, s.sct(), s.sc()),
        Err(IoError::Timeout | IoError::FastFail) => (-libc::ETIMEDOUT, 0, 0, 0),
        Err(IoError::ControllerReset) => (-libc::ECANCELED, 0, 0, 0),
        Err(IoError::ControllerFailed) => (-libc::ENODEV, 0, 0, 0),
        Err(IoError::Os(e)) => (-c_int::from(*e), 0, 0, 0),
        Err(_) => (-libc::EIO, 0, 0, 0),
    };
    pollux_cpl {
        status,
        cdw0,
        sct,
        sc,
    }
}

pub(crate) fn submit_fail(e: SubmitError) -> Fail {
    let errno = match e {
        SubmitError::QueueFull { .. } => libc::EAGAIN,
        SubmitError::LbaOutOfRange { .. } => libc::ERANGE,
        SubmitError::Resetting => libc::EBUSY,
        SubmitError::ControllerFailed => libc::ENODEV,
        _ => libc::EINVAL,
    };
    Fail::new(errno, e.to_string())
}

/// One request in flight: what its completion calls.
#[derive(Clone, Copy)]
struct Slot {
    cb: pollux_cb,
    arg: *mut c_void,
    buf: *const pollux_buf,
}

/// An I/O queue pair (opaque): used by one thread at a time.
#[allow(non_camel_case_types)]
pub struct pollux_qpair {
    qp: QueuePair,
    ctrl: *const pollux_ctrl,
    /// The controller's namespaces (a request names one by NSID).
    ns: Vec<Namespace>,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Completions of the current poll, before their callbacks run.
    done: Vec<(u64, Result<u32, IoError>)>,
    /// Inside `pollux_qpair_poll` (its callbacks included).
    polling: bool,
}

impl pollux_qpair {
    fn outstanding(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

/// Allocates an I/O queue pair of `depth` commands (0: the default, 128)
/// on `ctrl`. NULL on error.
///
/// # Safety
/// `ctrl` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_alloc(
    ctrl: *mut pollux_ctrl,
    depth: u32,
) -> *mut pollux_qpair {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        let mut o = QpairOptions::default();
        if depth != 0 {
            o.depth = u16::try_from(depth)
                .map_err(|_| Fail::new(libc::EINVAL, format!("depth {depth} is over 65535")))?;
        }
        let qp = c
            .ctrl
            .alloc_qpair(o)
            .map_err(|e| Fail::new(libc::ENODEV, format!("queue pair: {e}")))?;
        c.live.fetch_add(1, Ordering::AcqRel);
        Ok(Box::into_raw(Box::new(pollux_qpair {
            qp,
            ctrl,
            ns: c.ctrl.namespaces().to_vec(),
            slots: Vec::new(),
            free: Vec::new(),
            done: Vec::new(),
            polling: false,
        })))
    })
}

/// Frees a queue pair. -EBUSY (nothing done) while requests are
/// outstanding (poll until their callbacks ran) or from a callback.
///
/// # Safety
/// `qp` is NULL or a live handle, used by no other thread; after success
/// it is freed.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_free(qp: *mut pollux_qpair) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { qp.as_ref() }.ok_or_else(|| Fail::null("qp"))?;
        if q.polling {
            return Err(Fail::busy("pollux_qpair_free from a completion callback"));
        }
        let n = q.outstanding();
        if n > 0 {
            return Err(Fail::busy(format!("{n} requests outstanding")));
        }
        // SAFETY: the queue pair's controller is live (it cannot be
        // detached while its `live` count includes the queue pair).
        if let Some(c) = unsafe { q.ctrl.as_ref() } {
            c.live.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: from Box::into_raw, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(qp) });
        Ok(0)
    })
}

/// Requests submitted on the queue pair whose callbacks have not run.
///
/// # Safety
/// `qp` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_outstanding(qp: *const pollux_qpair) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { qp.as_ref() }.ok_or_else(|| Fail::null("qp"))?;
        Ok(q.outstanding().min(c_int::MAX as usize) as c_int)
    })
}

/// What a request is.
enum Op {
    Read,
    Write,
}

/// Submits one request: a slot for its callback, the buffer's range
/// counted in flight, `go` sends it with the slot's index as user data.
///
/// # Safety
/// `qp` and `buf` are NULL or live handles used by this thread only.
unsafe fn submit(
    qp: *mut pollux_qpair,
    buf: *const pollux_buf,
    cb: pollux_cb,
    arg: *mut c_void,
    go: impl FnOnce(&mut QueuePair, &[Namespace], Option<&pollux_buf>, u64) -> Result<(), Fail>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract; no other reference to it lives
        // (callbacks run with none held: see pollux_qpair_poll).
        let q = unsafe { qp.as_mut() }.ok_or_else(|| Fail::null("qp"))?;
        // SAFETY: the caller's contract.
        let b = unsafe { buf.as_ref() };
        let slot = match q.free.pop() {
            Some(i) => i,
            None => {
                q.slots.push(Slot {
                    cb: None,
                    arg: std::ptr::null_mut(),
                    buf: std::ptr::null(),
                });
                (q.slots.len() - 1) as u32
            }
        };
        if let Err(e) = go(&mut q.qp, &q.ns, b, u64::from(slot)) {
            q.free.push(slot);
            return Err(e);
        }
        q.slots[slot as usize] = Slot { cb, arg, buf };
        if let Some(b) = b {
            b.inflight.set(b.inflight.get() + 1);
        }
        Ok(0)
    })
}

fn find(ns: &[Namespace], nsid: u32) -> Result<&Namespace, Fail> {
    ns.iter()
        .find(|n| n.nsid() == nsid)
        .ok_or_else(|| Fail::new(libc::ENOENT, format!("namespace {nsid} is not active")))
}

/// Read or write of `nlb` blocks at `lba` of namespace `nsid`, the data in
/// `buf` from byte `off` (nlb * block size bytes).
///
/// # Safety
/// As `pollux_qpair_read`.
#[allow(clippy::too_many_arguments)] // the C call's, and which one
unsafe fn rw(
    op: Op,
    qp: *mut pollux_qpair,
    nsid: u32,
    lba: u64,
    nlb: u32,
    buf: *mut pollux_buf,
    off: usize,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    let go = |qp: &mut QueuePair, ns: &[Namespace], b: Option<&pollux_buf>, ud| {
        let b = b.ok_or_else(|| Fail::null("buf"))?;
        let ns = find(ns, nsid)?;
        let len = (nlb as usize) << ns.lba_shift();
        let r: DmaSlice<'_> = b.range(off, len)?;
        match op {
            // SAFETY: the buffer stays allocated until the completion (its
            // in-flight count refuses pollux_buf_free meanwhile); the host
            // leaves the range alone meanwhile: the caller's contract.
            Op::Read => unsafe { qp.read_dma(ns, lba, nlb, r, ud) },
            // SAFETY: as for the read.
            Op::Write => unsafe { qp.write_dma(ns, lba, nlb, r, ud) },
        }
        .map_err(submit_fail)
    };
    // SAFETY: the caller's contract.
    unsafe { submit(qp, buf, cb, arg, go) }
}

/// Reads `nlb` blocks at `lba` of namespace `nsid` into `buf` from byte
/// `off`; `cb(arg, cpl)` runs from a later `pollux_qpair_poll`. 0 or a
/// negative errno (nothing submitted, no callback): -EAGAIN when the
/// queue is full, -ERANGE outside the namespace or the buffer.
///
/// # Safety
/// `qp`, `buf` are NULL or live handles, used by this thread only. The
/// range of `buf` is lent until the callback runs: reading or writing it
/// meanwhile is undefined (the controller writes it).
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_read(
    qp: *mut pollux_qpair,
    nsid: u32,
    lba: u64,
    nlb: u32,
    buf: *mut pollux_buf,
    off: usize,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { rw(Op::Read, qp, nsid, lba, nlb, buf, off, cb, arg) }
}

/// Writes `nlb` blocks at `lba` of namespace `nsid` from `buf` at byte
/// `off`: as `pollux_qpair_read`.
///
/// # Safety
/// As `pollux_qpair_read`; writing the range meanwhile is undefined (the
/// controller reads it).
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_write(
    qp: *mut pollux_qpair,
    nsid: u32,
    lba: u64,
    nlb: u32,
    buf: *mut pollux_buf,
    off: usize,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe { rw(Op::Write, qp, nsid, lba, nlb, buf, off, cb, arg) }
}

/// Flush (the volatile write cache of namespace `nsid`).
///
/// # Safety
/// `qp` is NULL or a live handle used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_flush(
    qp: *mut pollux_qpair,
    nsid: u32,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        submit(qp, std::ptr::null(), cb, arg, |qp, ns, _, ud| {
            qp.flush_cache(find(ns, nsid)?, ud).map_err(submit_fail)
        })
    }
}

/// Submits a raw NVMe I/O command: `sqe` points to 64 bytes (the command
/// identifier and data pointer fields are the library's); the data, if
/// any, is `len` bytes of `buf` from `off` (`buf` NULL: none).
///
/// # Safety
/// `qp`, `buf` as for `pollux_qpair_read`; `sqe` is NULL or 64 readable
/// bytes. The command must transfer at most `len` bytes, touch no other
/// memory, and leave the namespaces and queues as they are (no Format,
/// no queue deletion: admin commands are not I/O commands); `buf`'s range
/// is lent as for a read.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_submit_raw(
    qp: *mut pollux_qpair,
    sqe: *const c_void,
    buf: *mut pollux_buf,
    off: usize,
    len: usize,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    if sqe.is_null() {
        return crate::error::record(Fail::null("sqe"));
    }
    // SAFETY: 64 readable bytes by the caller's contract.
    let bytes = unsafe { std::slice::from_raw_parts(sqe.cast::<u8>(), 64) };
    let Ok(cmd) = Sqe::read_from_bytes(bytes) else {
        return crate::error::record(Fail::new(libc::EINVAL, "sqe"));
    };
    let go = |qp: &mut QueuePair, _: &[Namespace], b: Option<&pollux_buf>, ud| {
        let data = match b {
            Some(b) => Some(b.range(off, len)?),
            None => None,
        };
        // SAFETY: the caller's contract (see above); the buffer stays
        // allocated until the completion (its in-flight count).
        unsafe { qp.raw_dma(cmd, data, ud) }.map_err(submit_fail)
    };
    // SAFETY: the caller's contract.
    unsafe { submit(qp, buf, cb, arg, go) }
}

/// Tells the controller about the requests submitted since the last poll
/// now (a poll does it too).
///
/// # Safety
/// `qp` is NULL or a live handle used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_kick(qp: *mut pollux_qpair) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let q = unsafe { qp.as_mut() }.ok_or_else(|| Fail::null("qp"))?;
        q.qp.flush();
        Ok(0)
    })
}

/// Processes up to `max` completions (0: all there are), running each
/// one's callback, and sends what was submitted. Returns the completions
/// processed (>= 0) or a negative errno: -EBUSY from a callback (a
/// callback may submit, but not poll).
///
/// # Safety
/// `qp` is NULL or a live handle used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn pollux_qpair_poll(qp: *mut pollux_qpair, max: u32) -> c_int {
    guard(|| {
        let mut done = {
            // SAFETY: the caller's contract; this reference ends before
            // any callback runs.
            let q = unsafe { qp.as_mut() }.ok_or_else(|| Fail::null("qp"))?;
            if q.polling {
                return Err(Fail::busy("pollux_qpair_poll from a completion callback"));
            }
            let mut done = std::mem::take(&mut q.done);
            let max = if max == 0 { u32::MAX } else { max };
            q.qp.poll(max, |_, c| done.push((c.user_data, c.result)));
            q.polling = true;
            done
        };
        let n = done.len();
        for (ud, r) in done.drain(..) {
            let s = {
                // SAFETY: as above: no other reference to the queue pair
                // lives here (callbacks made theirs and ended them).
                let q = unsafe { &mut *qp };
                let s = q.slots[ud as usize];
                q.free.push(ud as u32);
                s
            };
            // SAFETY: a buffer in flight is live (pollux_buf_free refuses
            // it) and used by this thread only.
            if let Some(b) = unsafe { s.buf.as_ref() } {
                b.inflight.set(b.inflight.get() - 1);
            }
            if let Some(cb) = s.cb {
                let cpl = cpl_of(&r);
                // SAFETY: the C caller's callback, with its argument.
                unsafe { cb(s.arg, &cpl) };
            }
        }
        // SAFETY: as above.
        let q = unsafe { &mut *qp };
        q.polling = false;
        q.done = done;
        Ok(n.min(c_int::MAX as usize) as c_int)
    })
}
