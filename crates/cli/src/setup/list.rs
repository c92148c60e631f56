//! `pollux setup list`: the controllers table.
use std::fmt::Write as _;

use super::sysfs::read_trim;
use super::{Host, SetupError, USER_DRIVERS};
use pollux_pcie::platform::pci::NVME_CLASS;

impl Host {
    pub fn list(&self, out: &mut String) -> Result<(), SetupError> {
        let ctrls = self.controllers()?;
        if ctrls.is_empty() {
            let _ = writeln!(
                out,
                "no NVMe controllers (PCI class {NVME_CLASS:#08x}) found"
            );
            return Ok(());
        }
        let _ = writeln!(
            out,
            "{:<13} {:<10} {:<16} {:<6} {:<24} USE",
            "BDF", "ID", "DRIVER", "IOMMU", "NAMESPACES"
        );
        for c in &ctrls {
            let ns = if c.block_devs.is_empty() {
                "-".to_string()
            } else {
                c.block_devs.join(",")
            };
            let usage = if c.in_use.is_empty() {
                match c.driver.as_deref() {
                    Some(d) if USER_DRIVERS.contains(&d) => "user space".to_string(),
                    _ => "free".to_string(),
                }
            } else {
                format!("IN USE: {}", c.in_use.join("; "))
            };
            let _ = writeln!(
                out,
                "{:<13} {:<10} {:<16} {:<6} {:<24} {usage}",
                c.bdf,
                c.ids,
                c.driver.as_deref().unwrap_or("-"),
                c.iommu_group.map_or("-".into(), |g| g.to_string()),
                ns,
            );
            if let Some(m) = &c.model {
                let _ = writeln!(out, "{:<13} model: {m}", "");
            }
        }
        let hp = self.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        if let (Some(n), Some(f)) = (
            read_trim(&hp.join("nr_hugepages")),
            read_trim(&hp.join("free_hugepages")),
        ) {
            let _ = writeln!(out, "2 MiB hugepages: {n} reserved, {f} free");
        }
        Ok(())
    }
}
