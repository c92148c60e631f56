//! The io_uring backend: a regular file or a block device through the
//! kernel's io_uring, one ring per channel.
//!
//! # Submission and completion
//!
//! A request takes a slot of the channel's slot table (its index is the
//! SQE's user data) that keeps the caller's user data, the request's
//! buffers, its iovec array (vectors, borrowed segments) and what is
//! left to transfer; each slot has at most one SQE in the kernel at a
//! time, so the submission ring (depth rounded up to a power of two)
//! never fills and the completion ring (twice that) never overflows.
//! Submitting only writes the SQE; [`Channel::poll`](crate::Channel::poll)
//! makes one `io_uring_enter` for everything queued since the last poll
//! (none with SQPOLL while the kernel thread is awake), then copies CQEs
//! out in batches and delivers each, so a handler may submit at once.
//!
//! # Results
//!
//! A negative result is `IoError::Os(errno)`. A short read or write
//! (Linux returns one for a regular file at its end, or a write that hit
//! ENOSPC after some bytes) is resubmitted for the remainder; a transfer
//! of zero bytes ends the request with `IoError::Os(ENODATA)`, the byte
//! counts logged (with O_DIRECT a
//! remainder that is no longer aligned fails with `Os(EINVAL)`). The
//! bdev's size is fixed at creation, so a short transfer only happens if
//! something else shrinks the file.
//!
//! # Other operations
//!
//! Flush is `fdatasync` (IORING_OP_FSYNC with DATASYNC). A write with
//! Force Unit Access carries `RWF_DSYNC` (the kernel completes it once
//! the data is durable: a buffered write is written back and synced; a
//! direct one goes down with REQ_FUA where the device has it, else is
//! followed by a cache flush); a read with FUA is an `fdatasync`, then
//! the read (the slot's two steps, one SQE at a time). Write zeroes is
//! `fallocate(ZERO_RANGE | KEEP_SIZE)`; where the file system refuses it
//! (EOPNOTSUPP: tmpfs) the channel switches to writes of a shared zero
//! buffer (1 MiB at a time). Unmap is `fallocate(PUNCH_HOLE | KEEP_SIZE)`
//! (a block device discards with zeroing); where that is refused it falls
//! back to write zeroes, so unmapped blocks always read back as zeroes.
//! Reset is a NOP with IOSQE_IO_DRAIN: it completes once every request
//! submitted before it on the channel has finished; it touches nothing.
//! An IOPOLL ring refuses fsync and fallocate, so with `iopoll` a second,
//! interrupt-driven ring per channel carries them (reset drains only the
//! polled ring).
//!
//! # Buffers
//!
//! With `register_buffers`, [`Bdev::alloc_buf`](crate::Bdev::alloc_buf)
//! carves buffers out of large regions the bdev owns (4 MiB, then
//! growing with the total, up to 64 regions); every channel registers a
//! region with its ring the first time it sees a buffer in it, and reads
//! or writes of one buffer inside a registered region use READ_FIXED /
//! WRITE_FIXED (no page pinning per I/O). Any other buffer, and vectors,
//! use plain READ(V) / WRITE(V). With O_DIRECT every buffer address must
//! be aligned to `buf_align` (refused at submission otherwise).
//!
//! # Defaults, measured
//!
//! Measured on a 2-vCPU VM (4 KiB random reads at QD 32, the kernel's
//! CPU time per I/O in the submitting thread, interleaved runs):
//! registered buffers save 150-430 ns of the 1.1-4 us an I/O costs
//! (no page pinning), so `register_buffers` is on; registering the file
//! and the eventfd cost or save nothing measurable single-threaded (a
//! registered file also skips the file reference count that threads of
//! one process share), so both are on.
//!
//! # Dropping a channel
//!
//! The kernel may still be writing into a request's buffers until its CQE
//! arrives, so a channel dropped with requests in flight asks the kernel
//! to cancel them and waits for every CQE before any buffer is freed.
mod chan;
pub(crate) mod config;
mod open;
mod options;
mod pool;
mod reap;
mod slot;
mod submit;
#[cfg(test)]
mod tests;

pub(crate) use chan::UringChan;
pub(crate) use open::{describe, open, UringShared};
pub use options::UringOptions;
pub(crate) use options::REAP_BATCH;
pub(crate) use slot::Op;
