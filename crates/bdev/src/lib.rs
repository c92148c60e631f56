//! pollux-bdev — block devices: one I/O API over NVMe namespaces, io_uring
//! files, RAM and null.
//!
//! A [`Bdev`] (name, UUID, block size and count, buffer alignment, limits,
//! capabilities: [`BdevInfo`]) is shared by every thread; a thread opens
//! it ([`Bdev::open`] → [`Desc`]) and takes its own [`Channel`]. All I/O
//! on a channel is lock-free and atomic-free (its statistics are a cache
//! line of counters only it writes): read and write of one buffer or a
//! vector (with Force Unit Access: [`RwFlags`]), flush, write zeroes, unmap, reset, and NVMe passthrough where
//! the backend is NVMe.
//!
//! # Buffers
//!
//! The driver's model: a request takes owned [`IoBuf`]s and hands them
//! back in its [`Completion`] (or in [`Refused`] when it is refused at
//! submission); while a request is in flight only the channel holds its
//! buffers, so no safe slice of memory under DMA or kernel I/O exists.
//! [`Bdev::alloc_buf`] gives memory every backend can use.
//!
//! # Completions
//!
//! [`Channel::poll`] hands finished requests to a [`Handler`] with the
//! channel's submission view [`Io`], as the driver's queue pair does: the
//! completion carries the caller's `user_data` (bit 63 is reserved), so
//! the handler finds its state with one indexed load.
//!
//! # Backends
//!
//! One `enum`, one `match` per request: no `dyn` call. `nvme` (a
//! namespace of a `pollux-host` controller on any transport, one queue
//! pair per channel), `uring` (a regular file or a block
//! device through io_uring, one ring per channel: [`UringOptions`]),
//! `ram` and `null`.
//!
//! # Errors and splitting
//!
//! Misaligned, partial-block, out-of-range or oversized requests are
//! refused with a [`SubmitError`] naming the culprit. Requests beyond an
//! NVMe command's reach are split (by the queue pair for transfers beyond
//! MDTS; by the layer for vectors and large write zeroes/unmap) and
//! complete once. A failed backend completes every outstanding request
//! with an error.
mod bdev;
mod channel;
mod common;
pub mod config;
mod data;
mod desc;
pub mod error;
pub mod info;
mod latency;
mod local;
pub mod mem;
mod nvme;
mod options;
pub mod params;
mod poll;
mod registry;
mod split;
pub mod stats;
mod uring;

pub use bdev::Bdev;
pub use channel::{Channel, Io};
pub use data::{Completion, Data, RawSeg};
pub use desc::Desc;
pub use error::{Error, IoError, Refused, SubmitError};
pub use info::{BdevInfo, Caps};
pub use options::ChannelOptions;
pub use poll::Handler;
pub use pollux_nvme::IoBuf;
pub use pollux_spec::cmd::RwFlags;
pub use registry::{Registry, RegistryError};
pub use split::USER_DATA_RESERVED;
pub use stats::{BdevStats, LatencySummary};
pub use uring::UringOptions;
