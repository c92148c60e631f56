//! pollux-host — the host library every caller uses: transport IDs
//! ([`trid`]), [`connect`], and one [`Controller`] and [`QueuePair`] over
//! any transport (PCIe — real devices and the emulated controller — and
//! NVMe/TCP).
//!
//! Dispatch is static: the handles are enums over the transports' own
//! (`pollux_pcie`, `pollux_tcp`, both monomorphisations of the core in
//! `pollux-nvme`), so a request costs at most one `match` on the
//! transport and no `dyn` call; a completion [`Handler`] gets a
//! [`Submitter`] whose transport is known inside the poll, so what it
//! submits there costs no `match` once inlined. Callers never name a
//! transport type.
//!
//! ```no_run
//! use pollux_host::{connect, ControllerOptions, IoBuf, QpairOptions, Trid};
//! let t: Trid = "trtype:tcp traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2016-06.io.pollux:cnode1"
//!     .parse()
//!     .unwrap();
//! let ctrl = connect(&t, &ControllerOptions::default()).unwrap();
//! let ns = ctrl.namespaces()[0];
//! let mut qp = ctrl.alloc_qpair(QpairOptions::default()).unwrap();
//! let buf = IoBuf::new(ctrl.alloc_dma(4096).unwrap());
//! qp.read(&ns, 0, 4096 >> ns.lba_shift(), buf, 7).unwrap();
//! let mut got = None;
//! while got.is_none() {
//!     qp.poll(u32::MAX, |_, c| got = Some(c));
//! }
//! ```
//!
//! The emulated controller (`trtype:soft`) is PCIe over a platform its
//! emulator supplies, through [`connect_with`] and an [`Emulator`]: this
//! library does not depend on the emulator.
mod ctrl;
mod discovery;
pub mod multipath;
mod qpair;
pub mod trid;

pub use ctrl::{
    connect, connect_with, ConnectError, Controller, DmaMemory, Emulator, EmulatorError,
};
pub use discovery::discover;
pub use multipath::{MpQueuePair, Multipath, MultipathError, Policy, Selector};
pub use pollux_nvme::{
    wait_readable, Completion, ControllerOptions, DmaBuffer, DmaSlice, Error, IoBuf, IoError,
    Namespace, QpairOptions, QpairStats, Refused, RwFlags, SubmitError,
};
pub use qpair::{Handler, QueuePair, Submitter};
pub use trid::{SoftTrid, TcpTrid, Trid, TridError};
