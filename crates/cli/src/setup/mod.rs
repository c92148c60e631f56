//! `pollux setup`: hand NVMe controllers to user space and back.
//!
//! `list` shows every NVMe controller (PCI class 0x010802) with its driver,
//! IOMMU group and what uses its namespaces; `bind` moves controllers to
//! vfio-pci (default) or uio_pci_generic with driver_override, refusing any
//! whose namespaces are mounted, used as swap, held by device-mapper/md,
//! claimed exclusively by the kernel (O_EXCL open fails with EBUSY: a mount
//! in another mount namespace), open in a process (/proc/PID/fd, also the
//! controller's and the generic char devices), ZFS vdevs, or btrfs members
//! mounted or spanning other devices; `reset` gives them back to the kernel nvme driver; `hugepages N`
//! reserves 2 MiB hugepages (needed for uio_pci_generic, optional for
//! vfio-pci).
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use pollux_pcie::platform::pci::{Sysfs, SysfsError};

mod bind;
mod content;
mod controllers;
mod hugepages;
mod list;
mod sysfs;
mod usage;

const USER_DRIVERS: [&str; 2] = ["vfio-pci", "uio_pci_generic"];

#[derive(clap::Subcommand, Debug)]
pub enum SetupCommand {
    /// List NVMe controllers: driver, IOMMU group, namespaces and their use.
    List,
    /// Detach controllers from the kernel and bind them to a user-space
    /// driver (refuses controllers in use: mounted, swap, dm/md, open in a
    /// process, ZFS, btrfs).
    Bind {
        /// PCI addresses, e.g. 0000:01:00.0 (see `pollux setup list`).
        #[arg(required = true)]
        bdf: Vec<String>,
        /// vfio-pci (needs an IOMMU; recommended) or uio_pci_generic (no
        /// IOMMU; root only; needs hugepages).
        #[arg(long, default_value = "vfio-pci", value_parser = ["vfio-pci", "uio_pci_generic"])]
        driver: String,
    },
    /// Give controllers back to the kernel nvme driver (default: every
    /// controller bound to vfio-pci or uio_pci_generic).
    Reset { bdf: Vec<String> },
    /// Reserve COUNT 2 MiB hugepages (0 releases them).
    Hugepages { count: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    #[error("{0}")]
    Msg(String),
    #[error(transparent)]
    Pci(#[from] SysfsError),
    #[error("{path}: {err}{hint}")]
    Io {
        path: PathBuf,
        err: std::io::Error,
        hint: &'static str,
    },
}

fn msg(s: impl Into<String>) -> SetupError {
    SetupError::Msg(s.into())
}

fn io_err(path: &Path, err: std::io::Error) -> SetupError {
    let hint = if err.kind() == std::io::ErrorKind::PermissionDenied {
        " (pollux setup needs root)"
    } else {
        ""
    };
    SetupError::Io {
        path: path.to_owned(),
        err,
        hint,
    }
}

/// Where the kernel's views live (a fake tree in tests).
pub struct Host {
    pub sys: PathBuf,
    pub proc_: PathBuf,
    /// Where the device nodes are (/dev): matched against /proc/PID/fd
    /// links and read for file-system signatures.
    pub dev: PathBuf,
    /// Runs `modprobe NAME`; Err = could not.
    pub modprobe: fn(&str) -> Result<(), String>,
    /// How long to wait for a driver to bind.
    pub bind_timeout: Duration,
}

fn real_modprobe(name: &str) -> Result<(), String> {
    match std::process::Command::new("modprobe").arg(name).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_string()),
        Err(e) => Err(format!("cannot run modprobe: {e}")),
    }
}

impl Default for Host {
    fn default() -> Self {
        Host {
            sys: "/sys".into(),
            proc_: "/proc".into(),
            dev: "/dev".into(),
            modprobe: real_modprobe,
            bind_timeout: Duration::from_secs(10),
        }
    }
}

/// One NVMe controller as `list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controller {
    pub bdf: String,
    pub ids: String,
    pub driver: Option<String>,
    pub iommu_group: Option<u32>,
    /// Kernel name (nvme0) when bound to nvme.
    pub kname: Option<String>,
    pub model: Option<String>,
    /// Block devices of its namespaces (disks and partitions).
    pub block_devs: Vec<String>,
    /// Character devices: the controller's (nvme0) and its namespaces'
    /// generic ones (ng0n1).
    pub char_devs: Vec<String>,
    /// Why it must not be taken away from the kernel ("nvme0n1p1 is
    /// mounted on /home", ...). Empty: free.
    pub in_use: Vec<String>,
}

/// `0000:01:00.0` form (adds the domain), validated.
pub fn normalize_bdf(s: &str) -> Result<String, SetupError> {
    pollux_pcie::platform::pci::normalize_bdf(s).map_err(|e| msg(e.to_string()))
}

impl Host {
    /// The PCI devices and drivers of this host's sysfs.
    fn pci(&self) -> Sysfs {
        Sysfs::at(&self.sys)
    }

    fn write(&self, p: &Path, v: &str) -> Result<(), SetupError> {
        fs::write(p, v).map_err(|e| io_err(p, e))
    }
}

pub fn run(cmd: SetupCommand) -> Result<(), SetupError> {
    let host = Host::default();
    let mut out = String::new();
    let r = match cmd {
        SetupCommand::List => host.list(&mut out),
        SetupCommand::Bind { bdf, driver } => host.bind(&bdf, &driver, &mut out),
        SetupCommand::Reset { bdf } => host.reset(&bdf, &mut out),
        SetupCommand::Hugepages { count } => host.hugepages(count, &mut out),
    };
    print!("{out}");
    r
}

#[cfg(test)]
mod tests;
