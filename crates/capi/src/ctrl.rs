//! Controllers: connect by transport ID, detach, controller and namespace
//! information.
use std::ffi::{c_char, c_int, CStr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use pollux_host::{Controller, ControllerOptions, Namespace, Trid};

use crate::error::{guard, guard_ptr, Fail};

/// A connected controller (opaque). See the header's threading rules.
#[allow(non_camel_case_types)]
pub struct pollux_ctrl {
    pub(crate) ctrl: Arc<Controller>,
    /// Queue pairs and buffers made from it and not yet freed.
    pub(crate) live: AtomicUsize,
    /// Last: the emulated device outlives the controller.
    #[cfg(feature = "emulator")]
    _soft: Option<crate::emulator::Soft>,
}

/// Controller information (`pollux_ctrl_get_info`).
#[repr(C)]
pub struct pollux_ctrl_info {
    /// "pcie" or "tcp" (an emulated controller is PCIe), NUL-terminated.
    pub trtype: [c_char; 8],
    /// Serial number, model, firmware revision: NUL-terminated, trimmed.
    pub serial: [c_char; 21],
    pub model: [c_char; 41],
    pub firmware: [c_char; 9],
    /// PCI vendor ID.
    pub vid: u16,
    /// I/O queue pairs the controller granted.
    pub io_queues: u16,
    /// Largest transfer per command, in bytes.
    pub max_transfer: u32,
    /// Active namespaces.
    pub ns_count: u32,
}

/// Namespace information (`pollux_ns_get`, `pollux_ns_info`).
#[repr(C)]
pub struct pollux_ns_info {
    pub nsid: u32,
    /// Logical block size in bytes.
    pub block_size: u32,
    /// Size in logical blocks.
    pub num_blocks: u64,
}

/// A C string argument as `&str`.
///
/// # Safety
/// `s` is NULL or a NUL-terminated string valid for the call.
pub(crate) unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if s.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-null and NUL-terminated by the caller's contract.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| Fail::new(libc::EINVAL, format!("{what} is not UTF-8")))
}

/// Connects a controller as `t` says: the emulated one too when built in.
pub(crate) fn open(trid: &str) -> Result<pollux_ctrl, Fail> {
    let t: Trid = trid
        .parse()
        .map_err(|e| Fail::new(libc::EINVAL, format!("transport ID '{trid}': {e}")))?;
    let opts = ControllerOptions::default();
    let fail = |e: pollux_host::ConnectError| Fail::new(libc::ENODEV, format!("{trid}: {e}"));
    #[cfg(feature = "emulator")]
    {
        let mut soft = crate::emulator::Soft::default();
        let ctrl = pollux_host::connect_with(&t, &opts, &mut soft).map_err(fail)?;
        Ok(pollux_ctrl {
            ctrl: Arc::new(ctrl),
            live: AtomicUsize::new(0),
            _soft: Some(soft),
        })
    }
    #[cfg(not(feature = "emulator"))]
    {
        let ctrl = pollux_host::connect(&t, &opts).map_err(fail)?;
        Ok(pollux_ctrl {
            ctrl: Arc::new(ctrl),
            live: AtomicUsize::new(0),
        })
    }
}

/// Connects to the controller a transport ID names and brings it up:
/// `trtype:pcie traddr:0000:01:00.0`, `trtype:tcp traddr:IP trsvcid:PORT
/// subnqn:NQN`, `trtype:soft backend:ram size:64MiB` (the emulated
/// controller, when the library is built with it). NULL on error
/// (`pollux_last_errno`, `pollux_last_error`).
///
/// # Safety
/// `trid` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pollux_connect(trid: *const c_char) -> *mut pollux_ctrl {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let s = unsafe { text(trid, "trid") }?;
        Ok(Box::into_raw(Box::new(open(s)?)))
    })
}

/// Shuts the controller down and frees it. -EBUSY (nothing done) while
/// queue pairs or buffers made from it are not freed.
///
/// # Safety
/// `ctrl` is NULL or a live handle from `pollux_connect`, used by no other
/// call meanwhile; after success it is freed.
#[no_mangle]
pub unsafe extern "C" fn pollux_detach(ctrl: *mut pollux_ctrl) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract: live and not used meanwhile.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        let n = c.live.load(Ordering::Acquire);
        if n > 0 {
            return Err(Fail::busy(format!(
                "{n} queue pairs or buffers of this controller are not freed"
            )));
        }
        // SAFETY: from Box::into_raw in pollux_connect, freed once (the
        // caller's contract).
        drop(unsafe { Box::from_raw(ctrl) });
        Ok(0)
    })
}

fn copy(dst: &mut [c_char], s: &str) {
    let n = s.len().min(dst.len() - 1);
    for (d, b) in dst.iter_mut().zip(s.as_bytes()[..n].iter()) {
        *d = *b as c_char;
    }
    dst[n] = 0;
}

/// Fills `*out` with the controller's information.
///
/// # Safety
/// `ctrl` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pollux_ctrl_get_info(
    ctrl: *const pollux_ctrl,
    out: *mut pollux_ctrl_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        // SAFETY: the caller's contract.
        let o = unsafe { out.as_mut() }.ok_or_else(|| Fail::null("out"))?;
        let id = c.ctrl.identify();
        copy(&mut o.trtype, c.ctrl.trtype());
        copy(&mut o.serial, id.serial().trim());
        copy(&mut o.model, id.model().trim());
        copy(&mut o.firmware, id.firmware_rev().trim());
        o.vid = id.vid;
        o.io_queues = c.ctrl.io_queues();
        o.max_transfer = c.ctrl.max_transfer();
        o.ns_count = c.ctrl.namespaces().len() as u32;
        Ok(0)
    })
}

fn ns_out(ns: &Namespace, o: &mut pollux_ns_info) {
    o.nsid = ns.nsid();
    o.block_size = ns.lba_size();
    o.num_blocks = ns.nsze();
}

/// Active namespaces of the controller (>= 0), or a negative errno.
///
/// # Safety
/// `ctrl` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_ns_count(ctrl: *const pollux_ctrl) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        Ok(c.ctrl.namespaces().len().min(c_int::MAX as usize) as c_int)
    })
}

/// Information of the `index`-th active namespace (0-based, in NSID
/// order): -ENOENT past the last.
///
/// # Safety
/// `ctrl` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pollux_ns_get(
    ctrl: *const pollux_ctrl,
    index: u32,
    out: *mut pollux_ns_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        // SAFETY: the caller's contract.
        let o = unsafe { out.as_mut() }.ok_or_else(|| Fail::null("out"))?;
        let all = c.ctrl.namespaces();
        let ns = all.get(index as usize).ok_or_else(|| {
            Fail::new(
                libc::ENOENT,
                format!("namespace index {index}: the controller has {}", all.len()),
            )
        })?;
        ns_out(ns, o);
        Ok(0)
    })
}

/// Information of namespace `nsid`: -ENOENT if it is not active.
///
/// # Safety
/// `ctrl` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pollux_ns_info(
    ctrl: *const pollux_ctrl,
    nsid: u32,
    out: *mut pollux_ns_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ctrl.as_ref() }.ok_or_else(|| Fail::null("ctrl"))?;
        // SAFETY: the caller's contract.
        let o = unsafe { out.as_mut() }.ok_or_else(|| Fail::null("out"))?;
        let ns = c
            .ctrl
            .namespace(nsid)
            .ok_or_else(|| Fail::new(libc::ENOENT, format!("namespace {nsid} is not active")))?;
        ns_out(&ns, o);
        Ok(0)
    })
}
