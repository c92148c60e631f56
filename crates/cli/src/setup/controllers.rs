//! Finding NVMe controllers and their namespace devices in sysfs.
use std::path::Path;

use super::sysfs::{dir_names, link_name, read_trim};
use super::{Controller, Host, SetupError};
use pollux_pcie::platform::pci::NVME_CLASS;

/// `(X, Y)` of a namespace disk name `nvmeXnY` (not partitions `nvmeXnYpZ`).
fn disk_numbers(name: &str) -> Option<(&str, &str)> {
    let (x, y) = name.strip_prefix("nvme")?.split_once('n')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(x) && digits(y)).then_some((x, y))
}

/// Character devices of controller `kname`: its own (/dev/nvme0) and the
/// generic namespace devices: ngXnY for each namespace disk nvmeXnY (the
/// same numbers, with native multipath too) and any ng* the controller
/// lists in sysfs.
fn char_devs(ctrl_dir: &Path, kname: &str, block_devs: &[String]) -> Vec<String> {
    let mut ng: Vec<String> = block_devs
        .iter()
        .filter_map(|d| disk_numbers(d))
        .map(|(x, y)| format!("ng{x}n{y}"))
        .chain(
            dir_names(ctrl_dir)
                .into_iter()
                .filter(|n| n.starts_with("ng")),
        )
        .collect();
    ng.sort();
    ng.dedup();
    let mut out = vec![kname.to_string()];
    out.extend(ng);
    out
}

impl Host {
    /// Every NVMe controller, sorted by address.
    pub fn controllers(&self) -> Result<Vec<Controller>, SetupError> {
        let pci = self.pci();
        let mut out = Vec::new();
        for bdf in pci.devices().unwrap_or_default() {
            if pci.class(&bdf).ok() == Some(NVME_CLASS) {
                out.push(self.controller(&bdf)?);
            }
        }
        Ok(out)
    }

    pub fn controller(&self, bdf: &str) -> Result<Controller, SetupError> {
        let pci = self.pci();
        let d = pci.nvme_controller(bdf)?;
        let ids = pci
            .ids(bdf)
            .map_or_else(|_| "-".into(), |(v, dev)| format!("{v:04x}:{dev:04x}"));
        let driver = pci.driver(bdf).ok().flatten();
        let iommu_group = pci.iommu_group(bdf).ok().flatten();
        let kname = dir_names(&d.join("nvme")).into_iter().next();
        let ctrl_dir = kname.as_ref().map(|k| d.join("nvme").join(k));
        let model = ctrl_dir.as_ref().and_then(|c| read_trim(&c.join("model")));
        let (block_devs, char_devs) = match (&ctrl_dir, &kname) {
            (Some(c), Some(k)) => {
                let b = self.block_devs(c, k);
                let ch = char_devs(c, k, &b);
                (b, ch)
            }
            _ => Default::default(),
        };
        let in_use = self.usage(ctrl_dir.as_deref(), &block_devs, &char_devs);
        Ok(Controller {
            bdf: bdf.to_string(),
            ids,
            driver,
            iommu_group,
            kname,
            model,
            block_devs,
            char_devs,
            in_use,
        })
    }

    /// Namespace block devices of controller `kname` (e.g. nvme0) and their
    /// partitions. With native multipath the controller lists hidden paths
    /// (nvme0c0n1) whose visible disk is nvme<subsystem>n<nsid>.
    fn block_devs(&self, ctrl_dir: &Path, kname: &str) -> Vec<String> {
        let mut disks = Vec::new();
        let subsys_no = link_name(&ctrl_dir.join("subsystem"))
            .and_then(|s| s.strip_prefix("nvme-subsys").map(str::to_string));
        for name in dir_names(ctrl_dir) {
            let Some(rest) = name.strip_prefix(kname) else {
                continue;
            };
            if let Some(ns) = rest.strip_prefix('n') {
                if ns.chars().all(|c| c.is_ascii_digit()) && !ns.is_empty() {
                    disks.push(name.clone());
                }
            } else if let Some(path) = rest.strip_prefix('c') {
                // c<ctrl>n<nsid>
                if let (Some((_, ns)), Some(sub)) = (path.split_once('n'), subsys_no.as_ref()) {
                    disks.push(format!("nvme{sub}n{ns}"));
                }
            }
        }
        disks.sort();
        disks.dedup();
        let mut out = Vec::new();
        for disk in disks {
            let parts: Vec<String> = dir_names(&self.sys.join("block").join(&disk))
                .into_iter()
                .filter(|p| {
                    p.strip_prefix(disk.as_str())
                        .is_some_and(|r| r.starts_with('p'))
                })
                .collect();
            out.push(disk);
            out.extend(parts);
        }
        out
    }
}
