//! pollux-spec — NVMe wire formats, exact to the NVMe 2.0 base and NVM
//! command set specifications.
//!
//! Every structure is `#[repr(C)]` with `zerocopy` derives and compile-time
//! size and offset asserts for each field the specification fixes. Nothing in
//! this crate touches hardware: it only describes bytes.
#![forbid(unsafe_code)]

#[cfg(target_endian = "big")]
compile_error!("pollux assumes a little-endian host");

pub mod cmd;
pub mod fabrics;
pub mod features;
pub mod identify;
pub mod log;
pub mod regs;
pub mod status;
pub mod tcp;

pub use cmd::{AdminOpcode, Cqe, NvmOpcode, RwFlags, Sqe};
pub use status::Status;

/// Compile-time assertion that field `$f` of `$t` sits at byte `$off`.
#[macro_export]
macro_rules! assert_offset {
    ($t:ty, $f:ident, $off:expr) => {
        const _: () = assert!(::core::mem::offset_of!($t, $f) == $off);
    };
}

/// Compile-time assertion that `$t` is exactly `$size` bytes.
#[macro_export]
macro_rules! assert_size {
    ($t:ty, $size:expr) => {
        const _: () = assert!(::core::mem::size_of::<$t>() == $size);
    };
}
