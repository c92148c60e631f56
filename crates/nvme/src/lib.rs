//! pollux-nvme — the transport-neutral NVMe host core.
#[cfg(target_endian = "big")]
compile_error!("pollux assumes a little-endian host");

pub mod dma;
pub mod error;

pub use dma::{DmaBuffer, DmaSlice};
pub use error::{Error, IoError, SubmitError};
