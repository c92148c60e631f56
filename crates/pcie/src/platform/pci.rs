//! PCI device lookup in sysfs, shared by the VFIO and UIO platforms.
use std::path::PathBuf;

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

/// `/sys/bus/pci/devices/BDF`, checked to exist.
pub fn sysfs_dir(bdf: &str) -> Result<PathBuf> {
    let d = PathBuf::from("/sys/bus/pci/devices").join(bdf);
    if !d.exists() {
        return Err(Error::Platform(format!(
            "no PCI device {bdf} (not in /sys/bus/pci/devices; `pollux setup list` shows NVMe controllers)"
        )));
    }
    Ok(d)
}

/// Name of the kernel driver the device is bound to, if any.
/// PCI class code of an NVMe controller (mass storage, NVM, NVMe).
pub const NVME_CLASS: u32 = 0x01_08_02;

/// The device's 24-bit PCI class code.
pub fn class(bdf: &str) -> Result<u32> {
    let path = sysfs_dir(bdf)?.join("class");
    let s = std::fs::read_to_string(&path)
        .map_err(|e| Error::Platform(format!("{}: {e}", path.display())))?;
    u32::from_str_radix(s.trim().trim_start_matches("0x"), 16).map_err(|_| {
        Error::Platform(format!(
            "{}: unexpected content {:?}",
            path.display(),
            s.trim()
        ))
    })
}

pub fn current_driver(bdf: &str) -> Result<Option<String>> {
    let link = sysfs_dir(bdf)?.join("driver");
    match std::fs::read_link(&link) {
        Ok(p) => Ok(p.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Platform(format!("{}: {e}", link.display()))),
    }
}

/// IOMMU group number, if the device is behind an IOMMU.
pub fn iommu_group(bdf: &str) -> Result<Option<u32>> {
    let link = sysfs_dir(bdf)?.join("iommu_group");
    match std::fs::read_link(&link) {
        Ok(p) => Ok(p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::Platform(format!("{}: {e}", link.display()))),
    }
}

fn read_hex_u16(bdf: &str, attr: &str) -> Result<u16> {
    let p = sysfs_dir(bdf)?.join(attr);
    let s = std::fs::read_to_string(&p)
        .map_err(|e| Error::Platform(format!("{}: {e}", p.display())))?;
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16)
        .map_err(|e| Error::Platform(format!("{}: {e}", p.display())))
}

/// (vendor, device) IDs.
pub fn ids(bdf: &str) -> Result<(u16, u16)> {
    Ok((read_hex_u16(bdf, "vendor")?, read_hex_u16(bdf, "device")?))
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
}
