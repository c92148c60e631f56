//! pollux-nvme — the transport-neutral NVMe host core.
//!
//! Everything about commands that does not depend on how they travel:
//! controller bring-up over any register access (`ctrl`), the admin queue
//! (`admin`), and I/O queue pairs — trackers and CIDs, request splitting,
//! the software backlog, timeouts, abort and reset recovery (`qpair`), with
//! the submit path in `submit` and the poll path in `poll`. A transport
//! (`transport::Transport`: PCIe in `pollux-pcie`, TCP in `pollux-tcp`) supplies the
//! wire: rings and doorbells, or a connection. The queue pair is generic
//! over it and monomorphised: no `dyn` call per I/O.
//!
//! # Buffers that outlive their DMA
//!
//! One model, tokio-uring's: an I/O buffer is an owned [`IoBuf`] handed to
//! the queue pair with the request and handed back in its [`Completion`]
//! (or with the [`Refused`] error). While the device may read or write it,
//! only the queue pair holds it, so no safe `&`/`&mut` slice of it exists;
//! holding an `IoBuf` means nothing is pending on it. Underneath, for
//! callers that manage memory themselves (a C API, an fio engine), the
//! same requests take a borrowed [`DmaSlice`] through `unsafe fn`s
//! (`read_dma`, `write_dma`, `raw_dma`) whose `# Safety` contract is what
//! the owned layer guarantees: the memory stays allocated and untouched
//! until the completion. Why owned rather than only `unsafe`: the common
//! caller gets soundness from the types at the cost of one pointer stored
//! in the tracker and handed back per I/O, and the block-device layer and
//! the C API can carry the same handle.
//!
//! Passthrough (`raw`, `Controller::admin`) is checked the same way: the
//! transport owns the data pointer fields and the buffer must match the
//! transfer the command states; what the driver cannot check is an
//! `unsafe fn` (`raw_unchecked`, `admin_unchecked`). See `passthru`.
#[cfg(target_endian = "big")]
compile_error!("pollux assumes a little-endian host");

mod admin;
mod completion;
pub mod ctrl;
pub mod dma;
pub mod error;
pub mod fabrics;
mod namespace;
mod passthru;
mod poll;
pub mod qpair;
mod submit;
pub mod transport;

pub use completion::{Completion, QpairStats};
pub use ctrl::{Controller, ControllerOptions, MAX_TRANSFER_CAP};
pub use dma::{DmaBuffer, DmaSlice, IoBuf};
pub use error::{Error, IoError, SubmitError};
pub use namespace::Namespace;
pub use pollux_spec::cmd::RwFlags;
pub use qpair::{wait_readable, QpairOptions, QueuePair};
pub use submit::{Handler, Refused, Submitter};
pub use transport::{
    AdminExec, CompletionQueue, CqeSink, QueueSpec, Registers, SubmissionQueue, Transport, Tuning,
    WireCounters,
};
