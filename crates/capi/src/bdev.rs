//! Block devices: a bdev from a transport ID (an NVMe namespace) or an
//! SPDK JSON bdev method (`bdev_null_create`, `bdev_malloc_create`,
//! `bdev_uring_create`), per-thread channels, read/write/flush with
//! callbacks, polling.
use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use ::pollux_bdev as bd;
use bd::{Bdev, Channel, ChannelOptions, Completion, Data, Io, IoBuf, Refused};

use crate::buf::{pollux_buf, Mem};
use crate::ctrl::{open, text};
use crate::error::{guard, guard_ptr, Fail};
use crate::qpair::{cpl_of, pollux_cb, submit_fail};

fn bdev_fail(e: bd::SubmitError) -> Fail {
    use bd::SubmitError as E;
    let errno = match e {
        E::Nvme(n) => return submit_fail(n),
        E::QueueFull { .. } => libc::EAGAIN,
        E::OutOfRange { .. } => libc::ERANGE,
        E::Unsupported { .. } => libc::ENOTSUP,
        E::Failed => libc::ENODEV,
        _ => libc::EINVAL,
    };
    Fail::new(errno, e.to_string())
}

/// A block device (opaque). May be used from several threads at once
/// (channels are per thread).
#[allow(non_camel_case_types)]
pub struct pollux_bdev {
    bdev: Bdev,
    /// Channels and buffers made from it and not yet freed.
    live: AtomicUsize,
    /// The controller of an NVMe bdev: dropped after the bdev.
    _ctrl: Option<crate::ctrl::pollux_ctrl>,
}

/// Bdev information (`pollux_bdev_get_info`).
#[repr(C)]
pub struct pollux_bdev_info {
    /// NUL-terminated (cut at 63 bytes).
    pub name: [c_char; 64],
    pub block_size: u32,
    pub num_blocks: u64,
}

fn new_bdev(bdev: Bdev, ctrl: Option<crate::ctrl::pollux_ctrl>) -> *mut pollux_bdev {
    Box::into_raw(Box::new(pollux_bdev {
        bdev,
        live: AtomicUsize::new(0),
        _ctrl: ctrl,
    }))
}

/// A bdev over namespace `nsid` of the controller a transport ID names
/// (connected for this bdev; each channel is one queue pair), named
/// `name`. NULL on error.
///
/// # Safety
/// `trid`, `name` are NULL or NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_open(
    trid: *const c_char,
    nsid: u32,
    name: *const c_char,
) -> *mut pollux_bdev {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let (t, n) = unsafe { (text(trid, "trid")?, text(name, "name")?) };
        let c = open(t)?;
        let b = Bdev::nvme(n, c.ctrl.clone(), nsid, Default::default())
            .map_err(|e| Fail::new(libc::EINVAL, format!("bdev {n}: {e}")))?;
        Ok(new_bdev(b, Some(c)))
    })
}

/// A bdev made by one SPDK JSON bdev method, `{"method":
/// "bdev_null_create", "params": {"name": "Null0", "num_blocks": 1024,
/// "block_size": 512}}` (`bdev_malloc_create`, `bdev_uring_create` too;
/// NVMe: `pollux_bdev_open`). NULL on error.
///
/// # Safety
/// `json` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_create(json: *const c_char) -> *mut pollux_bdev {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let j = unsafe { text(json, "json") }?;
        let entry: serde_json::Value =
            serde_json::from_str(j).map_err(|e| Fail::new(libc::EINVAL, format!("json: {e}")))?;
        let doc = serde_json::json!({"subsystems": [{"subsystem": "bdev", "config": [entry]}]});
        let mut made = bd::config::load(&doc.to_string(), &mut |a| {
            Err(format!(
                "{}: bdev_nvme_attach_controller: use pollux_bdev_open",
                a.name
            ))
        })
        .map_err(|e| Fail::new(libc::EINVAL, e.to_string()))?;
        match made.pop() {
            Some(b) if made.is_empty() => Ok(new_bdev(b, None)),
            _ => Err(Fail::new(libc::EINVAL, "json: one bdev method expected")),
        }
    })
}

/// Frees a bdev (and its controller). -EBUSY while its channels or
/// buffers are not freed.
///
/// # Safety
/// `bdev` is NULL or a live handle used by no other call meanwhile.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_close(bdev: *mut pollux_bdev) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { bdev.as_ref() }.ok_or_else(|| Fail::null("bdev"))?;
        let n = b.live.load(Ordering::Acquire);
        if n > 0 {
            return Err(Fail::busy(format!(
                "{n} channels or buffers of this bdev are not freed"
            )));
        }
        // SAFETY: from Box::into_raw, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(bdev) });
        Ok(0)
    })
}

/// Fills `*out` with the bdev's name and geometry.
///
/// # Safety
/// `bdev` is NULL or a live handle; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_get_info(
    bdev: *const pollux_bdev,
    out: *mut pollux_bdev_info,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { bdev.as_ref() }.ok_or_else(|| Fail::null("bdev"))?;
        // SAFETY: the caller's contract.
        let o = unsafe { out.as_mut() }.ok_or_else(|| Fail::null("out"))?;
        let i = b.bdev.info();
        let name = i.name.as_bytes();
        let n = name.len().min(o.name.len() - 1);
        for (d, s) in o.name.iter_mut().zip(&name[..n]) {
            *d = *s as c_char;
        }
        o.name[n] = 0;
        o.block_size = i.block_size;
        o.num_blocks = i.num_blocks;
        Ok(0)
    })
}

/// A buffer of `len` bytes (a whole number of blocks) for this bdev's
/// channels, lent whole to each request. Freed with `pollux_buf_free`,
/// before the bdev is closed. NULL on error.
///
/// # Safety
/// `bdev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_buf_alloc(
    bdev: *mut pollux_bdev,
    len: usize,
) -> *mut pollux_buf {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { bdev.as_ref() }.ok_or_else(|| Fail::null("bdev"))?;
        let io = b
            .bdev
            .alloc_buf(len)
            .map_err(|e| Fail::new(libc::ENOMEM, format!("{len}-byte buffer: {e}")))?;
        b.live.fetch_add(1, Ordering::AcqRel);
        Ok(Box::into_raw(Box::new(pollux_buf::from_io(io, &b.live))))
    })
}

/// One request in flight on a channel.
#[derive(Clone, Copy)]
struct Slot {
    cb: pollux_cb,
    arg: *mut c_void,
    buf: *mut pollux_buf,
}

/// A bdev's I/O channel (opaque): used by one thread at a time.
#[allow(non_camel_case_types)]
pub struct pollux_channel {
    ch: Channel,
    bdev: *const pollux_bdev,
    slots: Vec<Slot>,
    free: Vec<u32>,
    done: Vec<Completion>,
    polling: bool,
}

/// A channel of `depth` requests (0: 128) on `bdev`, for the calling
/// thread. NULL on error.
///
/// # Safety
/// `bdev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn pollux_bdev_channel(
    bdev: *mut pollux_bdev,
    depth: u32,
) -> *mut pollux_channel {
    guard_ptr(|| {
        // SAFETY: the caller's contract.
        let b = unsafe { bdev.as_ref() }.ok_or_else(|| Fail::null("bdev"))?;
        let opts = ChannelOptions {
            depth: if depth == 0 { 128 } else { depth },
            ..ChannelOptions::default()
        };
        let ch = b
            .bdev
            .open(true)
            .channel(&opts)
            .map_err(|e| Fail::new(libc::EINVAL, format!("channel: {e}")))?;
        b.live.fetch_add(1, Ordering::AcqRel);
        Ok(Box::into_raw(Box::new(pollux_channel {
            ch,
            bdev,
            slots: Vec::new(),
            free: Vec::new(),
            done: Vec::new(),
            polling: false,
        })))
    })
}

/// Frees a channel. -EBUSY while requests are outstanding or from a
/// callback.
///
/// # Safety
/// `ch` is NULL or a live handle used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn pollux_channel_free(ch: *mut pollux_channel) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { ch.as_ref() }.ok_or_else(|| Fail::null("ch"))?;
        if c.polling {
            return Err(Fail::busy("pollux_channel_free from a completion callback"));
        }
        let n = c.slots.len() - c.free.len();
        if n > 0 {
            return Err(Fail::busy(format!("{n} requests outstanding")));
        }
        // SAFETY: a channel's bdev is live (not closed while the channel
        // is counted in `live`).
        if let Some(b) = unsafe { c.bdev.as_ref() } {
            b.live.fetch_sub(1, Ordering::AcqRel);
        }
        // SAFETY: from Box::into_raw, freed once (the caller's contract).
        drop(unsafe { Box::from_raw(ch) });
        Ok(0)
    })
}

/// Submits one request, its buffer (if any) lent whole.
///
/// # Safety
/// `ch`, `buf` are NULL or live handles used by this thread only.
unsafe fn submit(
    ch: *mut pollux_channel,
    buf: *mut pollux_buf,
    need_buf: bool,
    cb: pollux_cb,
    arg: *mut c_void,
    go: impl FnOnce(&mut Io<'_>, Option<IoBuf>, u64) -> Result<(), Refused>,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract; no other reference lives
        // (callbacks run with none held).
        let c = unsafe { ch.as_mut() }.ok_or_else(|| Fail::null("ch"))?;
        // SAFETY: the caller's contract.
        let b = unsafe { buf.as_mut() };
        let io = match (need_buf, b) {
            (false, _) => None,
            (true, None) => return Err(Fail::null("buf")),
            (true, Some(b)) => match &mut b.mem {
                Mem::Io(io) => Some(io.take().ok_or_else(|| {
                    Fail::busy("the buffer is in flight: wait for its callback")
                })?),
                Mem::Dma(_) => {
                    return Err(Fail::new(
                        libc::EINVAL,
                        "a controller's buffer (pollux_buf_alloc) used on a bdev channel: use pollux_bdev_buf_alloc",
                    ))
                }
            },
        };
        let slot = match c.free.pop() {
            Some(i) => i,
            None => {
                c.slots.push(Slot {
                    cb: None,
                    arg: std::ptr::null_mut(),
                    buf: std::ptr::null_mut(),
                });
                (c.slots.len() - 1) as u32
            }
        };
        match go(&mut c.ch.io(), io, u64::from(slot)) {
            Ok(()) => {
                let buf = if need_buf { buf } else { std::ptr::null_mut() };
                c.slots[slot as usize] = Slot { cb, arg, buf };
                Ok(0)
            }
            Err(r) => {
                c.free.push(slot);
                if let (Some(io), false) = (r.data.into_one(), buf.is_null()) {
                    // SAFETY: as above (the reference `b` was moved into
                    // the match; this is the same live handle).
                    if let Mem::Io(slot) = unsafe { &mut (*buf).mem } {
                        *slot = Some(io);
                    }
                }
                Err(bdev_fail(r.error))
            }
        }
    })
}

/// Reads `buf`'s length (a whole number of blocks) at block `lba` into
/// `buf`, lent whole until `cb` runs from `pollux_channel_poll`. -EBUSY if
/// `buf` is in flight already; -EAGAIN when the channel is full.
///
/// # Safety
/// `ch`, `buf` are NULL or live handles used by this thread only; `buf`'s
/// memory is not touched until the callback.
#[no_mangle]
pub unsafe extern "C" fn pollux_channel_read(
    ch: *mut pollux_channel,
    lba: u64,
    buf: *mut pollux_buf,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        submit(ch, buf, true, cb, arg, |io, b, ud| match b {
            Some(b) => io.read(lba, b, ud),
            None => Ok(()),
        })
    }
}

/// Writes `buf` at block `lba`: as `pollux_channel_read`.
///
/// # Safety
/// As `pollux_channel_read`.
#[no_mangle]
pub unsafe extern "C" fn pollux_channel_write(
    ch: *mut pollux_channel,
    lba: u64,
    buf: *mut pollux_buf,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        submit(ch, buf, true, cb, arg, |io, b, ud| match b {
            Some(b) => io.write(lba, b, ud),
            None => Ok(()),
        })
    }
}

/// Flushes the bdev's volatile cache.
///
/// # Safety
/// `ch` is NULL or a live handle used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn pollux_channel_flush(
    ch: *mut pollux_channel,
    cb: pollux_cb,
    arg: *mut c_void,
) -> c_int {
    // SAFETY: the caller's contract.
    unsafe {
        submit(ch, std::ptr::null_mut(), false, cb, arg, |io, _, ud| {
            io.flush_cache(ud).map_err(|error| Refused {
                error,
                data: Data::None,
            })
        })
    }
}

/// Processes up to `max` completions (0: all there are), running their
/// callbacks (each request's buffer is back before its callback runs).
/// Returns the completions processed or a negative errno (-EBUSY from a
/// callback).
///
/// # Safety
/// `ch` is NULL or a live handle used by this thread only.
#[no_mangle]
pub unsafe extern "C" fn pollux_channel_poll(ch: *mut pollux_channel, max: u32) -> c_int {
    guard(|| {
        let mut done = {
            // SAFETY: the caller's contract; this reference ends before
            // any callback runs.
            let c = unsafe { ch.as_mut() }.ok_or_else(|| Fail::null("ch"))?;
            if c.polling {
                return Err(Fail::busy("pollux_channel_poll from a completion callback"));
            }
            let mut done = std::mem::take(&mut c.done);
            let max = if max == 0 { u32::MAX } else { max };
            c.ch.poll(max, &mut |_: &mut Io<'_>, cpl: Completion| done.push(cpl));
            c.polling = true;
            done
        };
        let n = done.len();
        for cpl in done.drain(..) {
            let s = {
                // SAFETY: no other reference to the channel lives here.
                let c = unsafe { &mut *ch };
                let s = c.slots[cpl.user_data as usize];
                c.free.push(cpl.user_data as u32);
                s
            };
            if let Some(io) = cpl.data.into_one() {
                // SAFETY: a buffer in flight is live (pollux_buf_free
                // refuses it) and used by this thread only.
                if let Some(Mem::Io(back)) = unsafe { s.buf.as_mut() }.map(|b| &mut b.mem) {
                    *back = Some(io);
                }
            }
            if let Some(cb) = s.cb {
                let r = cpl_of(&cpl.result);
                // SAFETY: the C caller's callback, with its argument.
                unsafe { cb(s.arg, &r) };
            }
        }
        // SAFETY: as above.
        let c = unsafe { &mut *ch };
        c.polling = false;
        c.done = done;
        Ok(n.min(c_int::MAX as usize) as c_int)
    })
}
