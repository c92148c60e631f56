//! Errors returned by the softnvme *API* (construction, IOMMU mapping).
//!
//! Errors caused by the host through the emulated hardware interface
//! (registers, doorbells, SQEs, PRPs) are never Rust errors: they become NVMe
//! statuses, CSTS.CFS, asynchronous events, counters and `tracing` logs.
use std::io;

/// An error from the softnvme API.
#[derive(Debug, thiserror::Error)]
pub enum SoftError {
    /// The [`crate::SoftConfig`] is outside what the emulator supports.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// A namespace's bdev (or its channel) could not be created.
    #[error("namespace {nsid}: {source}")]
    Bdev {
        nsid: u32,
        #[source]
        source: pollux_bdev::Error,
    },
    /// Allocating the BAR page(s) failed.
    #[error("allocating BAR0: {0}")]
    Bar(#[source] io::Error),
    /// `dma_map` arguments are not 4 KiB aligned, empty, or wrap around.
    #[error("dma_map: iova {iova:#x} len {len:#x}: {why}")]
    BadMapping {
        iova: u64,
        len: usize,
        why: &'static str,
    },
    /// `dma_map` range intersects an existing mapping.
    #[error("dma_map: iova {iova:#x} len {len:#x} overlaps an existing mapping")]
    Overlap { iova: u64, len: usize },
    /// The IOMMU table is full.
    #[error("dma_map: too many mappings (limit {0})")]
    TooManyMappings(usize),
    /// `irq_eventfd` for a vector the device does not offer.
    #[error("interrupt vector {vector} out of range (the device offers {vectors})")]
    InvalidVector { vector: u16, vectors: u16 },
    /// Creating or duplicating a vector's eventfd failed.
    #[error("interrupt vector {vector} eventfd: {source}")]
    Eventfd {
        vector: u16,
        #[source]
        source: io::Error,
    },
    /// `dma_unmap` of an IOVA that starts no mapping.
    #[error("dma_unmap: no mapping starts at iova {0:#x}")]
    NotMapped(u64),
    /// `claim` of a device another driver holds.
    #[error(
        "the emulated controller is already driven by another host controller (one driver per \
         device: a second one's bring-up would disable it and reprogram its queues under the first)"
    )]
    Claimed,
}
