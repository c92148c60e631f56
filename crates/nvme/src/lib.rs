//! pollux-nvme — the transport-neutral NVMe host core.
//!
//! Everything about commands that does not depend on how they travel:
//! controller bring-up over any register access (`ctrl`), the admin queue
//! (`admin`), and I/O queue pairs — trackers and CIDs, request splitting,
//! the software backlog, timeouts, abort and reset recovery (`qpair`), with
//! the submit path in `submit` and the poll path in `poll`. A transport
//! (`transport::Transport`: PCIe in `pollux-pcie`, TCP next) supplies the
//! wire: rings and doorbells, or a connection. The queue pair is generic
//! over it and monomorphised: no `dyn` call per I/O.
#[cfg(target_endian = "big")]
compile_error!("pollux assumes a little-endian host");

mod admin;
pub mod ctrl;
pub mod dma;
pub mod error;
mod poll;
pub mod qpair;
mod submit;
pub mod transport;

pub use ctrl::{Controller, ControllerOptions, Namespace, MAX_TRANSFER_CAP};
pub use dma::{DmaBuffer, DmaSlice};
pub use error::{Error, IoError, SubmitError};
pub use qpair::{Completion, Handler, QpairOptions, QpairStats, QueuePair};
pub use submit::Submitter;
pub use transport::{
    AdminExec, CompletionQueue, CqeSink, QueueSpec, Registers, SubmissionQueue, Transport, Tuning,
    WireCounters,
};
