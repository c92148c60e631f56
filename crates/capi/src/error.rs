//! Error codes (negative errno), the calling thread's last error text, and
//! the guard every entry point runs its body in (no panic crosses the FFI
//! boundary).
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Why a call failed: an errno and the text `pollux_last_error` gives.
#[derive(Debug)]
pub struct Fail {
    pub errno: c_int,
    pub msg: String,
}

impl Fail {
    pub fn new(errno: c_int, msg: impl Into<String>) -> Fail {
        Fail {
            errno,
            msg: msg.into(),
        }
    }

    pub fn null(what: &str) -> Fail {
        Fail::new(libc::EINVAL, format!("{what} is NULL"))
    }

    pub fn busy(msg: impl Into<String>) -> Fail {
        Fail::new(libc::EBUSY, msg)
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `f` as this thread's last error and returns `-errno`.
pub fn record(f: Fail) -> c_int {
    let text = CString::new(f.msg.replace('\0', " ")).unwrap_or_default();
    LAST.with(|l| *l.borrow_mut() = text);
    -f.errno
}

/// Runs an entry point's body: its error is recorded and returned as a
/// negative errno, a panic as -EFAULT (never unwinding into C).
pub fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => record(e),
        Err(p) => record(Fail::new(libc::EFAULT, panic_text(p))),
    }
}

/// `guard` for an entry point returning a handle: NULL on error (the
/// errno in `pollux_last_errno`).
pub fn guard_ptr<T>(f: impl FnOnce() -> Result<*mut T, Fail>) -> *mut T {
    let mut out = std::ptr::null_mut();
    let rc = guard(|| {
        out = f()?;
        Ok(0)
    });
    LAST_ERRNO.with(|e| e.set(-rc));
    out
}

thread_local! {
    static LAST_ERRNO: std::cell::Cell<c_int> = const { std::cell::Cell::new(0) };
}

fn panic_text(p: Box<dyn std::any::Any + Send>) -> String {
    let what = p
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    format!("internal error (panic): {what}")
}

/// Text of this thread's last error (empty if none). Valid until this
/// thread's next failing call.
#[no_mangle]
pub extern "C" fn pollux_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// The errno (positive) of this thread's last call that returned a NULL
/// handle; 0 if it succeeded.
#[no_mangle]
pub extern "C" fn pollux_last_errno() -> c_int {
    LAST_ERRNO.with(|e| e.get())
}

/// A static description of an error code this library returns (`rc` < 0,
/// or its absolute value).
#[no_mangle]
pub extern "C" fn pollux_strerror(rc: c_int) -> *const c_char {
    let s: &'static [u8] = match rc.unsigned_abs() as c_int {
        0 => b"success\0",
        libc::EINVAL => b"invalid argument\0",
        libc::ENOMEM => b"out of memory\0",
        libc::EBUSY => b"busy (in use or in flight)\0",
        libc::ENODEV => b"no such device or controller failed\0",
        libc::ENOENT => b"not found\0",
        libc::EIO => b"I/O error\0",
        libc::ENOTSUP => b"not supported\0",
        libc::EAGAIN => b"queue full, try again after polling\0",
        libc::ERANGE => b"out of range\0",
        libc::ETIMEDOUT => b"timed out\0",
        libc::ECANCELED => b"canceled (controller reset)\0",
        libc::ECONNREFUSED => b"connection refused\0",
        libc::EFAULT => b"internal error\0",
        _ => b"unknown error\0",
    };
    s.as_ptr().cast()
}
