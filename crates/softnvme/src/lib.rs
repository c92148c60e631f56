//! pollux-softnvme — an emulated NVMe PCIe controller.
//!
//! A software device serving exactly the interface a real controller does:
//! a BAR0 register page with doorbells at 0x1000, and DMA into host memory
//! addressed by IOVA through an emulated IOMMU. It never trusts the host:
//! every register, doorbell, SQE and PRP value ends in an NVMe status, a
//! fatal controller status, an asynchronous event or a logged error — never
//! a panic or an access outside the mapped memory.
//!
//! The device is passive: someone calls [`SoftDevice::step`] (directly, or a
//! [`DeviceThread`]) and it polls CC and the doorbells like hardware would.
//! The I/O path (null backend, 4 KiB read) does no allocation, no hashing,
//! no clock read, one IOMMU range check, one SQE copy and one CQE write.
//!
//! Module map: `bar` (register memory), `iommu`, `prp` (pure PRP walker),
//! `dma` (PRP → host segments), `queue` (SQ/CQ and doorbells), `ctrl`
//! (state machine and `step`), `admin` (+ identify, log pages, features),
//! `io` (NVM commands), `backend` (null, ram, file), `fault` (injection),
//! `aer`, `errlog`, `stats`, `thread`, `device` (the public `SoftDevice`).

mod admin;
mod aer;
pub mod backend;
mod bar;
mod config;
mod ctrl;
mod device;
mod dma;
mod errlog;
mod error;
mod fault;
mod io;
mod iommu;
pub mod prp;
mod queue;
mod stats;
mod thread;

pub use config::{
    BackendConfig, NamespaceConfig, SoftConfig, MAX_DSTRD, MAX_IO_QUEUES, MAX_MDTS, MAX_NAMESPACES,
};
pub use device::SoftDevice;
pub use errlog::ERROR_LOG_ENTRIES;
pub use error::SoftError;
pub use fault::{FaultAction, FaultRule, QueueSel, DEFERRED_LIMIT, MAX_FAULT_RULES};
pub use iommu::MAX_MAPPINGS;
pub use stats::DeviceStats;
pub use thread::DeviceThread;

/// Limits and identities a test or driver may want to check against.
pub mod consts {
    pub use crate::admin::identify::{CNTLID, SSVID, VID};
    pub use crate::ctrl::BUDGET;
}
