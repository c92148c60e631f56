//! Errors of the controller API (building a subsystem, an I/O queue).
//!
//! Errors caused by the host through commands are never Rust errors: they
//! are NVMe statuses.

/// An error from the pollux-controller API.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// A subsystem setting is outside what the controller supports.
    #[error("invalid subsystem configuration: {0}")]
    InvalidConfig(String),
    /// A namespace's bdev cannot serve as a namespace.
    #[error("bdev {bdev}: {why}")]
    InvalidNamespace { bdev: String, why: String },
    /// A bdev channel (or its bounce buffer) could not be created.
    #[error("namespace {nsid}: {source}")]
    Bdev {
        nsid: u32,
        #[source]
        source: pollux_bdev::Error,
    },
    /// Adding a namespace: the NSID cannot be one (0, FFFFFFFFh, beyond
    /// the most namespaces, or none is free).
    #[error("namespace ID {nsid} {why}")]
    Nsid { nsid: u32, why: &'static str },
    /// Adding a namespace: the NSID is taken.
    #[error("namespace ID {nsid} is taken")]
    NsidTaken { nsid: u32 },
    /// Removing a namespace: there is none of that NSID.
    #[error("no namespace of ID {nsid}")]
    NoNamespace { nsid: u32 },
    /// `IoQueue::submit` beyond the queue's depth.
    #[error("I/O queue full: {depth} commands outstanding")]
    QueueFull { depth: u32 },
}
