//! pollux-pcie — NVMe over PCIe: the transport under `pollux-nvme`'s host
//! core.
//!
//! Layers, bottom up: `mmio` (BAR0 register access) → `platform` (how
//! BAR0 is mapped and DMA memory gets bus addresses: vfio-pci or
//! uio_pci_generic here; the emulated controller brings its own,
//! `pollux_softnvme::SoftPlatform`) → `doorbell` (a queue's doorbell
//! register, holding its platform, and its shadow doorbell slots) → `prp`
//! (data pointers) → `sq` (the submission ring: the submit path's wire
//! side) and `cq` (the completion ring: the poll path's wire side) →
//! `transport` (`Pcie`, the `pollux_nvme::Transport`: admin queue
//! registers, queue creation, shadow doorbells). Trackers, splitting, the
//! backlog, timeouts and recovery live in `pollux-nvme`, written once for
//! every transport.
//!
//! ```no_run
//! use pollux_pcie::{ControllerOptions, QpairOptions};
//! // A controller bound to vfio-pci or uio_pci_generic (`pollux setup bind`).
//! let platform = pollux_pcie::platform::open_pcie("0000:01:00.0").unwrap();
//! let ctrl = pollux_pcie::open(platform, ControllerOptions::default()).unwrap();
//! let ns = ctrl.namespaces()[0];
//! let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
//! let buf = pollux_pcie::IoBuf::new(ctrl.alloc_dma(4096).unwrap());
//! qp.read(&ns, 0, 4096 >> ns.lba_shift(), buf, 7).unwrap();
//! let mut got = None;
//! while got.is_none() {
//!     qp.poll(u32::MAX, |_, c| got = Some(c));
//!     ctrl.relax();
//! }
//! let c = got.unwrap();
//! assert_eq!(c.result, Ok(0));
//! let data = c.buf.unwrap(); // the buffer comes back with the completion
//! assert_eq!(data.len(), 4096);
//! ```
pub mod cq;
pub mod doorbell;
pub mod mmio;
pub mod platform;
pub mod prp;
pub mod sq;
pub mod transport;

pub use pollux_nvme::{dma, error};
pub use pollux_nvme::{
    Completion, ControllerOptions, DmaBuffer, DmaSlice, Error, Handler, IoBuf, IoError, Namespace,
    QpairOptions, QpairStats, Refused, SubmitError,
};
pub use transport::{open, Controller, Pcie, QueuePair, Submitter};
