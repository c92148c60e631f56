//! pollux-target — an NVMe over TCP target (NVMe/TCP Transport 1.0,
//! NVMe over Fabrics of the NVMe 2.0 base specification) on pollux's
//! thread-per-core runtime.
//!
//! - **Transport** (`conn`): ICReq/ICResp (PFV 0, digests as the host
//!   asks, CPDA 0, MAXH2CDATA), command capsules with in-capsule data,
//!   R2T + H2CData for larger writes, C2HData (with SUCCESS and no
//!   response capsule when the host disabled SQ flow control), header and
//!   data digests (CRC32C), C2HTermReq on protocol errors then close;
//!   handshake timeouts (ICReq after accept, Connect after ICResp; 10 s
//!   each by default) so an idle peer cannot hold a connection slot.
//! - **Fabrics**: Connect (admin and I/O queues, dynamic controller IDs,
//!   host allow lists, SQSIZE/QID checks), Property Get/Set (CAP, VS, CC,
//!   CSTS), Disconnect, Keep Alive expiry (controller torn down, its
//!   queues' connections closed), SGL data block descriptors (in-capsule
//!   offset 01h, transport 5Ah).
//! - **Discovery** (`discovery`): the well-known discovery NQN, Get Log
//!   Page 70h listing the subsystems the connecting host may reach.
//! - **Command set**: `pollux-controller`, through `model` only.
//! - **Configuration** ([`TargetConfig`]): SPDK's JSON shape, or built in
//!   code.
//! - **NVMe namespaces**: bdevs of NVMe namespaces on any host transport
//!   (PCIe, the emulated controller, TCP), side by side; an NVMe
//!   namespace's data is staged through its controller's DMA memory
//!   (`pollux-controller`'s `store`), synchronously.
//!
//! Data buffers come from one pool for the whole target (`pool`: SPDK's
//! `num_shared_buffers`, cached per thread), and commands whose buffer is
//! not there wait for it.
//!
//! Each connection is owned by one runtime thread; nothing is locked on
//! the I/O path (the controller table's mutex is taken at Connect,
//! Disconnect and close). Techniques, each switchable in
//! [`TransportOptions`]: batched sends (one `sendmsg` per poll), large
//! receives straight into command buffers, `SO_INCOMING_CPU` placement,
//! epoll idle sleep.
mod buf;
pub mod config;
mod conn;
mod discovery;
#[cfg(test)]
mod fuzz;
mod model;
mod pool;
mod server;
mod shared;
mod sock;

pub use config::{
    ConfigError, NamespaceConfig, SubsystemConfig, TargetConfig, TransportOptions, MAX_SEND_IOV,
};
pub use model::ModelError;
pub use pollux_runtime::RuntimeOptions;
pub use server::{Target, TargetError};
