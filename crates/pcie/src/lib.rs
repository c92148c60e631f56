//! pollux-pcie — NVMe over PCIe: the host driver's PCIe transport.
//!
//! Layers, bottom up: `mmio` (register access) → `platform` (BAR mapping,
//! DMA memory with bus addresses; the emulated controller now, VFIO and UIO
//! next) → `dma` → `prp` → `admin` (the admin queue) → `ctrl` (bring-up,
//! namespaces, reset, shutdown) → `qpair` (the lock-free per-thread I/O
//! path).
//!
//! ```no_run
//! # #[cfg(feature = "soft")] {
//! use pollux_pcie::{platform::soft::{SoftMode, SoftPlatform}, Controller, ControllerOptions, QpairOptions};
//! use pollux_softnvme::{SoftConfig, SoftDevice};
//! let dev = SoftDevice::new(SoftConfig::default()).unwrap();
//! let ctrl = Controller::new(Box::new(SoftPlatform::new(dev, SoftMode::Inline)), ControllerOptions::default()).unwrap();
//! let ns = ctrl.namespaces()[0];
//! let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
//! let buf = ctrl.alloc_dma(4096).unwrap();
//! qp.read(&ns, 0, 4096 >> ns.lba_shift, buf.full(), 7).unwrap();
//! # }
//! ```
#[cfg(target_endian = "big")]
compile_error!("pollux assumes a little-endian host");

mod admin;
pub mod ctrl;
pub use pollux_nvme::{dma, error};
pub mod mmio;
pub mod platform;
pub mod prp;
pub mod qpair;

pub use ctrl::{Controller, ControllerOptions, Namespace};
pub use dma::{DmaBuffer, DmaSlice};
pub use error::{Error, IoError, SubmitError};
pub use qpair::{Completion, Handler, QpairOptions, QpairStats, QueuePair, Submitter};
