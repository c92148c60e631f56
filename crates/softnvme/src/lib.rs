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
//! Interrupts: polling needs none, but a host may sleep instead. Each
//! interrupt vector (`SoftConfig::irq_vectors` of them, 0 = admin) has an
//! eventfd, which [`SoftDevice::irq_eventfd`] hands out (a duplicate,
//! non-blocking, close-on-exec; poll it and read it to clear). A CQ created
//! with IEN signals its vector as it posts completions, honouring Interrupt
//! Coalescing (FID 08h) and Interrupt Vector Configuration (FID 09h); the
//! admin CQ signals vector 0 once the host has asked for that vector's fd.
//! A CQ without IEN costs one predictable branch per completion.
//!
//! The NVMe controller itself — admin command set, Identify, log pages,
//! features, asynchronous events, the CC/CSTS state machine, NVM I/O on
//! the namespaces' bdevs — is `pollux_controller`'s (PCIe personality),
//! shared with the NVMe-oF target; this crate is the PCIe shell around it.
//!
//! Module map: `bar` (register memory), `iommu`, `prp` (pure PRP walker),
//! `dma` (PRP → host segments), `queue` (SQ/CQ and doorbells), `ctrl`
//! (register publication and reactions, `step`, I/O through the
//! controller model's `IoQueue`), `admin` (queue creation and deletion,
//! Abort, Doorbell Buffer Config; the rest goes to the controller model),
//! `backend` (a namespace's bdev: null, RAM, a file through io_uring, or
//! one handed over), `fault` (injection), `irq` (interrupt vectors,
//! coalescing), `stats`, `thread`, `device` (the public `SoftDevice`),
//! `platform` (`SoftPlatform`: `pollux_pcie`'s driver on this device).

mod admin;
mod backend;
mod bar;
mod config;
mod ctrl;
mod device;
mod dma;
mod error;
mod fault;
mod iommu;
mod irq;
mod platform;
pub mod prp;
mod queue;
mod stats;
mod thread;

pub use config::{
    BackendConfig, NamespaceConfig, SoftConfig, DEFERRED_LIMIT, MAX_DSTRD, MAX_IO_QUEUES, MAX_MDTS,
    MAX_NAMESPACES,
};
pub use device::{SoftClaim, SoftDevice};
pub use error::SoftError;
pub use fault::{FaultAction, FaultRule, QueueSel, MAX_FAULT_RULES};
pub use iommu::MAX_MAPPINGS;
pub use irq::MAX_IRQ_VECTORS;
pub use platform::{SoftMode, SoftPlatform};
pub use pollux_controller::ERROR_LOG_ENTRIES;
pub use stats::DeviceStats;
pub use thread::DeviceThread;

/// Limits and identities a test or driver may want to check against.
pub mod consts {
    pub use crate::config::{CNTLID, SSVID, VID};
    pub use crate::ctrl::BUDGET;
}
