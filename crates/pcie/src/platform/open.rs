//! Opening a real controller by its PCI address through the user-space
//! driver it is bound to.
use super::{pci, uio, vfio, Platform};
use crate::error::Result;

/// Opens the PCIe controller at `bdf` (e.g. `0000:01:00.0`) through the
/// user-space driver it is bound to: vfio-pci or uio_pci_generic.
pub fn open_pcie(bdf: &str) -> Result<Box<dyn Platform>> {
    use crate::error::Error;
    let bdf = pci::normalize_bdf(bdf)?;
    pci::Sysfs::default().nvme_controller(&bdf)?;
    match pci::current_driver(&bdf)?.as_deref() {
        Some("vfio-pci") => Ok(Box::new(vfio::VfioPlatform::open(&bdf)?)),
        Some("uio_pci_generic") => Ok(Box::new(uio::UioPlatform::open(&bdf)?)),
        Some(other) => Err(Error::Platform(format!(
            "{bdf} is bound to the kernel driver {other}, not to vfio-pci or uio_pci_generic: \
             run `pollux setup bind {bdf}` (it refuses controllers with mounted file systems)"
        ))),
        None => Err(Error::Platform(format!(
            "{bdf} is not bound to any driver: run `pollux setup bind {bdf}`"
        ))),
    }
}
