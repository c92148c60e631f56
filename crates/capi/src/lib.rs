//! libpollux — the pollux host library and bdevs for C: `libpollux.so`,
//! `libpollux.a` and the header `include/pollux.h` (made by cbindgen from
//! these sources by `build.rs`; the rules below are its preamble, in
//! `cbindgen.toml`).
//!
//! Every entry point returns an `int` (0 or more on success, a negative
//! errno on failure) or a handle (NULL on failure); the calling thread's
//! last error text is `pollux_last_error()`. No panic crosses the
//! boundary: each entry point runs in `error::guard` (a panic becomes
//! -EFAULT; with the release profile's `panic = "abort"` it aborts).
//! Pointers are checked for NULL.
//!
//! Handles are boxes handed to C as raw pointers; the threading rules
//! follow the Rust types: a controller and a bdev are `Send + Sync` (used
//! from any thread at once, for everything but freeing them); a queue
//! pair, a channel and a buffer are used by one thread at a time (their
//! Rust types are `Send`, not `Sync`; the C handles' bookkeeping is not
//! atomic).
//!
//! Requests borrow ranges of DMA buffers (queue pairs) or take a bdev
//! buffer whole (channels); a buffer's requests in flight are counted, so
//! freeing a buffer in flight is refused (-EBUSY), and a bdev buffer in
//! flight cannot be submitted again. Callbacks run from the poll, after it
//! has let go of the queue pair, so they may submit more (not poll).
mod bdev;
mod buf;
mod ctrl;
#[cfg(feature = "emulator")]
mod emulator;
mod error;
mod qpair;

pub use bdev::*;
pub use buf::*;
pub use ctrl::*;
pub use error::*;
pub use qpair::*;

/// The header's threading rules, checked: controllers and bdevs are shared
/// between threads (Send + Sync), queue pairs and channels move between
/// them (Send).
const _: () = {
    fn shared<T: Send + Sync>() {}
    fn moved<T: Send>() {}
    let _ = shared::<ctrl::pollux_ctrl>;
    let _ = shared::<bdev::pollux_bdev>;
    let _ = moved::<pollux_host::QueuePair>;
    let _ = moved::<::pollux_bdev::Channel>;
};
