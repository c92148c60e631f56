//! [`Controller`]: one handle over a controller on any transport, the
//! control path (a `match` per call), and [`connect`] from a transport ID.
//!
//! The emulated controller (`trtype:soft`) is PCIe over a platform its
//! emulator supplies: this library does not depend on the emulator (it is
//! never a dependency of production code); a program that offers
//! `trtype:soft` passes an [`Emulator`] to [`connect_with`].
use pollux_nvme::{ControllerOptions, DmaBuffer, IoBuf, Namespace, QpairOptions};
use pollux_pcie::platform::Platform;
use pollux_spec::identify::IdentifyController;
use pollux_spec::regs::{Cap, Csts};
use pollux_spec::{Cqe, Sqe};

use crate::qpair::QueuePair;
use crate::trid::{SoftTrid, Trid, TridError};

/// A controller on any transport. PCIe covers real devices (vfio-pci,
/// uio_pci_generic) and the emulated controller.
pub enum Controller {
    Pcie(pollux_pcie::Controller),
    Tcp(pollux_tcp::Controller),
}

/// `$body` with `$x` bound to the transport's controller.
macro_rules! each {
    ($e:expr, $x:ident => $body:expr) => {
        match $e {
            Controller::Pcie($x) => $body,
            Controller::Tcp($x) => $body,
        }
    };
}

/// Makes the platform of an emulated controller (`trtype:soft`): supplied
/// by the program (the emulator is no dependency of this library).
pub trait Emulator {
    /// The platform of a new emulated controller built as `t` says (its
    /// limits included). The device must be running when this returns:
    /// bring-up talks to it at once.
    fn platform(&mut self, t: &SoftTrid) -> Result<Box<dyn Platform>, EmulatorError>;
}

/// Why an emulator could not make a controller.
pub type EmulatorError = Box<dyn std::error::Error + Send + Sync>;

/// A controller could not be reached or brought up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("{0}")]
    Trid(#[from] TridError),
    #[error("{0}")]
    Driver(#[from] pollux_nvme::Error),
    #[error("emulated controller: {0}")]
    Emulator(#[source] EmulatorError),
    #[error("trtype:soft: no emulated controller in this program")]
    NoEmulator,
}

/// Connects to the controller `t` names and brings it up: a PCIe device
/// bound to vfio-pci or uio_pci_generic, or an NVMe/TCP controller
/// (`subnqn:` needed). `trtype:soft` needs [`connect_with`].
pub fn connect(t: &Trid, opts: &ControllerOptions) -> Result<Controller, ConnectError> {
    open(t, opts, None)
}

/// [`connect`], with the emulator that makes `trtype:soft` controllers.
pub fn connect_with(
    t: &Trid,
    opts: &ControllerOptions,
    emulator: &mut dyn Emulator,
) -> Result<Controller, ConnectError> {
    open(t, opts, Some(emulator))
}

fn open(
    t: &Trid,
    opts: &ControllerOptions,
    emulator: Option<&mut dyn Emulator>,
) -> Result<Controller, ConnectError> {
    match t {
        Trid::Soft(s) => {
            let e = emulator.ok_or(ConnectError::NoEmulator)?;
            let platform = e.platform(s).map_err(ConnectError::Emulator)?;
            Ok(Controller::Pcie(pollux_pcie::open(platform, opts.clone())?))
        }
        Trid::Pcie { traddr } => {
            let platform = pollux_pcie::platform::open_pcie(traddr)?;
            Ok(Controller::Pcie(pollux_pcie::open(platform, opts.clone())?))
        }
        Trid::Tcp(t) => Ok(Controller::Tcp(pollux_tcp::open(
            t.options(None)?,
            opts.clone(),
        )?)),
    }
}

/// Where a controller's DMA memory comes from (what a caller checks
/// before allocating much of it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaMemory {
    /// Anonymous 4 KiB pages (the emulated controller, TCP).
    Anon,
    /// 2 MiB hugepages while free ones last, then 4 KiB pages (VFIO).
    HugeThenAnon,
    /// 2 MiB hugepages only (UIO: buffers over 4 KiB must be physically
    /// contiguous).
    Huge,
}

impl DmaMemory {
    /// Bytes of free 2 MiB hugepages on this machine (0 if unknown).
    pub fn free_huge_bytes() -> u64 {
        pollux_pcie::platform::hugemem::free_hugepages()
            .unwrap_or(0)
            .saturating_mul(pollux_pcie::platform::hugemem::HUGE_PAGE_SIZE as u64)
    }
}

impl Trid {
    /// The memory DMA buffers of this controller take: for PCIe, by the
    /// driver the device is bound to now.
    pub fn dma_memory(&self) -> DmaMemory {
        match self {
            Trid::Soft(_) | Trid::Tcp(_) => DmaMemory::Anon,
            Trid::Pcie { traddr } => {
                let uio = pollux_pcie::platform::pci::normalize_bdf(traddr)
                    .and_then(|b| pollux_pcie::platform::pci::current_driver(&b))
                    .is_ok_and(|d| d.as_deref() == Some("uio_pci_generic"));
                if uio {
                    DmaMemory::Huge
                } else {
                    DmaMemory::HugeThenAnon
                }
            }
        }
    }
}

impl From<pollux_pcie::Controller> for Controller {
    fn from(c: pollux_pcie::Controller) -> Controller {
        Controller::Pcie(c)
    }
}

impl From<pollux_tcp::Controller> for Controller {
    fn from(c: pollux_tcp::Controller) -> Controller {
        Controller::Tcp(c)
    }
}

impl Controller {
    /// A queue pair (see `pollux_nvme::Controller::alloc_qpair`).
    pub fn alloc_qpair(&self, o: QpairOptions) -> pollux_nvme::error::Result<QueuePair> {
        Ok(match self {
            Controller::Pcie(c) => QueuePair::Pcie(c.alloc_qpair(o)?),
            Controller::Tcp(c) => QueuePair::Tcp(c.alloc_qpair(o)?),
        })
    }

    /// `pcie` or `tcp` (an emulated controller is PCIe).
    pub fn trtype(&self) -> &'static str {
        match self {
            Controller::Pcie(_) => "pcie",
            Controller::Tcp(_) => "tcp",
        }
    }

    pub fn identify(&self) -> &IdentifyController {
        each!(self, c => c.identify())
    }

    pub fn cap(&self) -> Cap {
        each!(self, c => c.cap())
    }

    pub fn namespaces(&self) -> &[Namespace] {
        each!(self, c => c.namespaces())
    }

    pub fn namespace(&self, nsid: u32) -> Option<Namespace> {
        each!(self, c => c.namespace(nsid))
    }

    /// I/O queue pairs the controller granted.
    pub fn io_queues(&self) -> u16 {
        each!(self, c => c.io_queues())
    }

    /// Largest transfer per command, in bytes.
    pub fn max_transfer(&self) -> u32 {
        each!(self, c => c.max_transfer())
    }

    pub fn describe(&self) -> String {
        each!(self, c => c.describe())
    }

    /// DMA memory usable for I/O on this controller.
    pub fn alloc_dma(&self, len: usize) -> pollux_nvme::error::Result<DmaBuffer> {
        each!(self, c => c.alloc_dma(len))
    }

    /// The transport's wait hook (steps an inline emulated controller).
    pub fn relax(&self) {
        each!(self, c => c.relax())
    }

    /// Raw admin command, checked (see `pollux_nvme::Controller::admin`).
    pub fn admin(
        &self,
        sqe: Sqe,
        data: Option<IoBuf>,
    ) -> pollux_nvme::error::Result<(Cqe, Option<IoBuf>)> {
        each!(self, c => c.admin(sqe, data))
    }

    /// `admin` without the transfer length check.
    ///
    /// # Safety
    /// As `pollux_nvme::Controller::admin_unchecked`.
    pub unsafe fn admin_unchecked(
        &self,
        sqe: Sqe,
        data: Option<IoBuf>,
    ) -> pollux_nvme::error::Result<(Cqe, Option<IoBuf>)> {
        // SAFETY: the caller's contract is the core's.
        each!(self, c => unsafe { c.admin_unchecked(sqe, data) })
    }

    /// Get Log Page into a new vector.
    pub fn get_log_page(
        &self,
        lid: u8,
        nsid: u32,
        len: usize,
    ) -> pollux_nvme::error::Result<Vec<u8>> {
        each!(self, c => c.get_log_page(lid, nsid, len))
    }

    /// Get Features (current value): completion dword 0.
    pub fn get_features(&self, fid: u8, nsid: u32) -> pollux_nvme::error::Result<u32> {
        each!(self, c => c.get_features(fid, nsid))
    }

    /// Set Features: completion dword 0.
    pub fn set_features(&self, fid: u8, nsid: u32, cdw11: u32) -> pollux_nvme::error::Result<u32> {
        each!(self, c => c.set_features(fid, nsid, cdw11))
    }

    /// Resets the controller now (queue pairs recover on their next poll).
    pub fn reset(&self) -> pollux_nvme::error::Result<()> {
        each!(self, c => c.reset())
    }

    /// True once a reset has failed: the controller is unusable.
    pub fn is_failed(&self) -> bool {
        each!(self, c => c.is_failed())
    }

    /// See `pollux_nvme::Controller::may_still_transfer`.
    pub fn may_still_transfer(&self) -> bool {
        each!(self, c => c.may_still_transfer())
    }

    /// Completed resets.
    pub fn resets(&self) -> u32 {
        each!(self, c => c.resets())
    }

    /// Current controller status register.
    pub fn csts(&self) -> pollux_nvme::error::Result<Csts> {
        each!(self, c => c.csts())
    }
}
