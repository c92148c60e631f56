//! PCI devices in sysfs: addresses, class, IDs, driver, IOMMU group and
//! the driver binding files, read in one place for the VFIO and UIO
//! platforms and for `pollux setup`.
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// PCI command register (config space offset 4) bits.
pub const PCI_COMMAND: u64 = 0x04;
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;

/// Full `DDDD:BB:DD.F` form of a PCI address (`01:00.0` gets domain 0000),
/// validated for shape.
pub fn normalize_bdf(bdf: &str) -> Result<String> {
    let bdf = bdf.trim().to_ascii_lowercase();
    let full = if bdf.matches(':').count() == 1 {
        format!("0000:{bdf}")
    } else {
        bdf
    };
    let ok = {
        let b = full.as_bytes();
        b.len() == 12
            && b[4] == b':'
            && b[7] == b':'
            && b[10] == b'.'
            && full
                .char_indices()
                .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
            && (b'0'..=b'7').contains(&b[11])
    };
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "'{full}' is not a PCI address (want DDDD:BB:DD.F, e.g. 0000:01:00.0)"
        )));
    }
    Ok(full)
}

/// PCI class code of an NVMe controller (mass storage, NVM, NVMe).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// What reading the PCI part of sysfs can fail with. Converts into
/// [`Error::Platform`] for the platforms; `pollux setup` shows it as is.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    #[error(
        "no PCI device {bdf} ({} does not exist); `pollux setup list` shows the NVMe controllers",
        path.display()
    )]
    NoDevice { bdf: String, path: PathBuf },
    #[error("{bdf} is not an NVMe controller (PCI class {class:#08x}, want {NVME_CLASS:#08x})")]
    NotNvme { bdf: String, class: u32 },
    #[error("{}: {err}", path.display())]
    Io { path: PathBuf, err: std::io::Error },
    #[error("{}: unexpected content {content:?}", path.display())]
    Content { path: PathBuf, content: String },
}

impl From<SysfsError> for Error {
    fn from(e: SysfsError) -> Error {
        Error::Platform(e.to_string())
    }
}

/// The PCI devices and drivers sysfs shows under `root` (`/sys`, or a
/// fake tree in tests): every sysfs read about a PCI device, for the
/// platforms and for `pollux setup`. Reads only; the writes that bind a
/// driver are `pollux setup`'s, to the paths given here.
#[derive(Clone, Debug)]
pub struct Sysfs {
    root: PathBuf,
}

impl Default for Sysfs {
    /// The real one, at `/sys`.
    fn default() -> Sysfs {
        Sysfs::at("/sys")
    }
}

impl Sysfs {
    /// Sysfs mounted at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Sysfs {
        Sysfs { root: root.into() }
    }

    /// `ROOT/bus/pci/devices/BDF` (whether or not it exists).
    pub fn device_path(&self, bdf: &str) -> PathBuf {
        self.root.join("bus/pci/devices").join(bdf)
    }

    /// `ROOT/bus/pci/devices/BDF`, checked to exist.
    pub fn device_dir(&self, bdf: &str) -> Result<PathBuf, SysfsError> {
        let path = self.device_path(bdf);
        if !path.exists() {
            return Err(SysfsError::NoDevice {
                bdf: bdf.to_string(),
                path,
            });
        }
        Ok(path)
    }

    /// The address of every PCI device, sorted.
    pub fn devices(&self) -> Result<Vec<String>, SysfsError> {
        dir_names(&self.root.join("bus/pci/devices"))
    }

    /// The device's 24-bit PCI class code.
    pub fn class(&self, bdf: &str) -> Result<u32, SysfsError> {
        let path = self.device_dir(bdf)?.join("class");
        let s = read(&path)?;
        u32::from_str_radix(s.trim_start_matches("0x"), 16)
            .map_err(|_| SysfsError::Content { path, content: s })
    }

    /// The device directory of the NVMe controller at `bdf`: an error
    /// names a missing device or one of another class.
    pub fn nvme_controller(&self, bdf: &str) -> Result<PathBuf, SysfsError> {
        let dir = self.device_dir(bdf)?;
        match self.class(bdf)? {
            NVME_CLASS => Ok(dir),
            class => Err(SysfsError::NotNvme {
                bdf: bdf.to_string(),
                class,
            }),
        }
    }

    /// (vendor, device) IDs.
    pub fn ids(&self, bdf: &str) -> Result<(u16, u16), SysfsError> {
        let dir = self.device_dir(bdf)?;
        let hex = |attr: &str| {
            let path = dir.join(attr);
            let s = read(&path)?;
            u16::from_str_radix(s.trim_start_matches("0x"), 16)
                .map_err(|_| SysfsError::Content { path, content: s })
        };
        Ok((hex("vendor")?, hex("device")?))
    }

    /// Name of the kernel driver the device is bound to, if any.
    pub fn driver(&self, bdf: &str) -> Result<Option<String>, SysfsError> {
        link_name(&self.device_dir(bdf)?.join("driver"))
    }

    /// IOMMU group number, if the device is behind an IOMMU.
    pub fn iommu_group(&self, bdf: &str) -> Result<Option<u32>, SysfsError> {
        Ok(link_name(&self.device_dir(bdf)?.join("iommu_group"))?.and_then(|n| n.parse().ok()))
    }

    /// The addresses of the devices in IOMMU group `group`, sorted.
    pub fn iommu_group_devices(&self, group: u32) -> Result<Vec<String>, SysfsError> {
        dir_names(
            &self
                .root
                .join(format!("kernel/iommu_groups/{group}/devices")),
        )
    }

    /// Whether the kernel has PCI driver `name` (loaded and registered).
    pub fn has_driver(&self, name: &str) -> bool {
        self.root.join("bus/pci/drivers").join(name).exists()
    }

    /// Where to write a driver name to make it the only one that may bind
    /// the device (`"\n"` clears it).
    pub fn driver_override_path(&self, bdf: &str) -> PathBuf {
        self.device_path(bdf).join("driver_override")
    }

    /// Where to write a device's address to unbind it from `driver`.
    pub fn unbind_path(&self, driver: &str) -> PathBuf {
        self.root
            .join("bus/pci/drivers")
            .join(driver)
            .join("unbind")
    }

    /// Where to write a device's address to have the kernel bind a driver
    /// to it (honouring its driver override).
    pub fn drivers_probe_path(&self) -> PathBuf {
        self.root.join("bus/pci/drivers_probe")
    }
}

/// A sysfs attribute, trimmed.
fn read(path: &Path) -> Result<String, SysfsError> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_string())
        .map_err(|err| SysfsError::Io {
            path: path.to_owned(),
            err,
        })
}

/// The last component of symbolic link `link`'s target; None if there is
/// no such link.
fn link_name(link: &Path) -> Result<Option<String>, SysfsError> {
    match std::fs::read_link(link) {
        Ok(p) => Ok(p.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(SysfsError::Io {
            path: link.to_owned(),
            err,
        }),
    }
}

/// The names in directory `dir`, sorted.
fn dir_names(dir: &Path) -> Result<Vec<String>, SysfsError> {
    let io = |err| SysfsError::Io {
        path: dir.to_owned(),
        err,
    };
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).map_err(io)? {
        v.push(e.map_err(io)?.file_name().to_string_lossy().into_owned());
    }
    v.sort();
    Ok(v)
}

// The real sysfs (`/sys`), for the platforms.

/// `/sys/bus/pci/devices/BDF`, checked to exist.
pub fn sysfs_dir(bdf: &str) -> Result<PathBuf> {
    Ok(Sysfs::default().device_dir(bdf)?)
}

/// The device's 24-bit PCI class code.
pub fn class(bdf: &str) -> Result<u32> {
    Ok(Sysfs::default().class(bdf)?)
}

/// Name of the kernel driver the device is bound to, if any.
pub fn current_driver(bdf: &str) -> Result<Option<String>> {
    Ok(Sysfs::default().driver(bdf)?)
}

/// IOMMU group number, if the device is behind an IOMMU.
pub fn iommu_group(bdf: &str) -> Result<Option<u32>> {
    Ok(Sysfs::default().iommu_group(bdf)?)
}

/// (vendor, device) IDs.
pub fn ids(bdf: &str) -> Result<(u16, u16)> {
    Ok(Sysfs::default().ids(bdf)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_forms() {
        assert_eq!(normalize_bdf("00:01.0").unwrap(), "0000:00:01.0");
        assert_eq!(normalize_bdf("0000:AF:00.1").unwrap(), "0000:af:00.1");
        assert!(normalize_bdf("0000:00:01").is_err());
        assert!(normalize_bdf("0000:00:01.8").is_err());
        assert!(normalize_bdf("../../etc").is_err());
    }

    /// A fake sysfs: an NVMe controller bound to vfio-pci in IOMMU group
    /// 3, one with no driver and no group, and a network card.
    fn fake(tag: &str) -> (PathBuf, Sysfs) {
        use std::os::unix::fs::symlink;
        let root = std::env::temp_dir().join(format!("pollux-pci-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let mk = |p: &Path| std::fs::create_dir_all(p).unwrap();
        let w = |p: PathBuf, s: &str| std::fs::write(p, s).unwrap();
        mk(&root.join("bus/pci/drivers/vfio-pci"));
        mk(&root.join("kernel/iommu_groups/3/devices/0000:02:00.0"));
        for (bdf, class, dev) in [
            ("0000:02:00.0", "0x010802", "0x0010"),
            ("0000:01:00.0", "0x010802", "0x0011"),
            ("0000:03:00.0", "0x020000", "0x1000"),
        ] {
            let d = root.join("bus/pci/devices").join(bdf);
            mk(&d);
            w(d.join("class"), &format!("{class}\n"));
            w(d.join("vendor"), "0x1b36\n");
            w(d.join("device"), &format!("{dev}\n"));
        }
        let d = root.join("bus/pci/devices/0000:02:00.0");
        symlink(root.join("bus/pci/drivers/vfio-pci"), d.join("driver")).unwrap();
        symlink(root.join("kernel/iommu_groups/3"), d.join("iommu_group")).unwrap();
        let sysfs = Sysfs::at(&root);
        (root, sysfs)
    }

    #[test]
    fn reads_devices_class_ids_driver_and_group() {
        let (root, s) = fake("reads");
        assert_eq!(
            s.devices().unwrap(),
            ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]
        );
        assert_eq!(s.class("0000:03:00.0").unwrap(), 0x020000);
        assert_eq!(s.ids("0000:01:00.0").unwrap(), (0x1b36, 0x0011));
        assert_eq!(
            s.driver("0000:02:00.0").unwrap().as_deref(),
            Some("vfio-pci")
        );
        assert_eq!(s.driver("0000:01:00.0").unwrap(), None);
        assert_eq!(s.iommu_group("0000:02:00.0").unwrap(), Some(3));
        assert_eq!(s.iommu_group("0000:01:00.0").unwrap(), None);
        assert_eq!(s.iommu_group_devices(3).unwrap(), ["0000:02:00.0"]);
        assert!(s.iommu_group_devices(4).is_err());
        assert!(s.has_driver("vfio-pci") && !s.has_driver("uio_pci_generic"));
        assert_eq!(
            s.driver_override_path("0000:01:00.0"),
            root.join("bus/pci/devices/0000:01:00.0/driver_override")
        );
        assert_eq!(
            s.unbind_path("nvme"),
            root.join("bus/pci/drivers/nvme/unbind")
        );
        assert_eq!(s.drivers_probe_path(), root.join("bus/pci/drivers_probe"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn nvme_controller_names_what_is_wrong() {
        let (root, s) = fake("nvme");
        assert_eq!(
            s.nvme_controller("0000:01:00.0").unwrap(),
            root.join("bus/pci/devices/0000:01:00.0")
        );
        let e = s.nvme_controller("0000:03:00.0").unwrap_err().to_string();
        assert_eq!(
            e,
            "0000:03:00.0 is not an NVMe controller (PCI class 0x020000, want 0x010802)"
        );
        let e = s.nvme_controller("0000:00:99.0").unwrap_err().to_string();
        let path = root.join("bus/pci/devices/0000:00:99.0");
        assert!(
            e.starts_with(&format!(
                "no PCI device 0000:00:99.0 ({} does not exist)",
                path.display()
            )),
            "{e}"
        );
        // Unreadable content is an error naming the file, not a guess.
        std::fs::write(root.join("bus/pci/devices/0000:01:00.0/class"), "nvme\n").unwrap();
        let e = s.class("0000:01:00.0").unwrap_err().to_string();
        assert!(
            e.contains("0000:01:00.0/class: unexpected content \"nvme\""),
            "{e}"
        );
        // As a platform error (what `open_pcie` returns).
        let e = Error::from(s.ids("0000:00:99.0").unwrap_err()).to_string();
        assert!(e.starts_with("platform: no PCI device 0000:00:99.0"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
