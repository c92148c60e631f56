//! Moving controllers between the kernel nvme driver and a user-space driver.
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use super::{msg, normalize_bdf, Host, SetupError, USER_DRIVERS};

/// Drops repeated entries, keeping the first of each (`bind A A` moves A once).
fn dedup_in_order(v: &mut Vec<String>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|x| seen.insert(x.clone()));
}

impl Host {
    fn ensure_driver(&self, driver: &str) -> Result<(), SetupError> {
        let modules: &[&str] = match driver {
            // The type1 IOMMU backend is a soft dependency that busybox
            // modprobe (and some minimal systems) do not load.
            "vfio-pci" => &["vfio-pci", "vfio_iommu_type1"],
            other => &[other],
        };
        let mut errs = Vec::new();
        for m in modules {
            if let Err(e) = (self.modprobe)(m) {
                errs.push(format!("modprobe {m}: {e}"));
            }
        }
        if !self.pci().has_driver(driver) {
            return Err(msg(format!(
                "kernel driver {driver} is not available ({})",
                errs.join("; ")
            )));
        }
        Ok(())
    }

    fn wait_driver(&self, bdf: &str, want: Option<&str>) -> Option<String> {
        let start = Instant::now();
        loop {
            let cur = self.pci().driver(bdf).ok().flatten();
            if cur.as_deref() == want || start.elapsed() >= self.bind_timeout {
                return cur;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Moves `bdf` to `driver` (None: the kernel's default, i.e. nvme).
    fn rebind(&self, bdf: &str, driver: Option<&str>) -> Result<Option<String>, SetupError> {
        let pci = self.pci();
        self.write(&pci.driver_override_path(bdf), driver.unwrap_or("\n"))?;
        if let Some(cur) = pci.driver(bdf).ok().flatten() {
            self.write(&pci.unbind_path(&cur), bdf)?;
        }
        self.write(&pci.drivers_probe_path(), bdf)?;
        Ok(self.wait_driver(bdf, Some(driver.unwrap_or("nvme"))))
    }

    pub fn bind(&self, bdfs: &[String], driver: &str, out: &mut String) -> Result<(), SetupError> {
        if !USER_DRIVERS.contains(&driver) {
            return Err(msg(format!(
                "--driver {driver}: want vfio-pci or uio_pci_generic"
            )));
        }
        // Check everything first: nothing is moved if any controller is busy.
        let mut targets = bdfs
            .iter()
            .map(|b| normalize_bdf(b))
            .collect::<Result<Vec<_>, _>>()?;
        dedup_in_order(&mut targets);
        let mut ctrls = Vec::new();
        for bdf in &targets {
            let c = self.controller(bdf)?;
            if !c.in_use.is_empty() {
                return Err(msg(format!(
                    "refusing to take {} from the kernel: {}. Unmount / release it first.",
                    c.bdf,
                    c.in_use.join("; ")
                )));
            }
            if driver == "vfio-pci" && c.iommu_group.is_none() {
                return Err(msg(format!(
                    "{} has no IOMMU group, so vfio-pci cannot use it: enable the IOMMU \
                     (intel_iommu=on or amd_iommu=on on the kernel command line) or use \
                     --driver uio_pci_generic",
                    c.bdf
                )));
            }
            ctrls.push(c);
        }
        self.ensure_driver(driver)?;
        for c in ctrls {
            if c.driver.as_deref() == Some(driver) {
                let _ = writeln!(out, "{}: already bound to {driver}", c.bdf);
                continue;
            }
            let got = self.rebind(&c.bdf, Some(driver))?;
            if got.as_deref() != Some(driver) {
                return Err(msg(format!(
                    "{}: bound to {} instead of {driver} after drivers_probe (see dmesg)",
                    c.bdf,
                    got.as_deref().unwrap_or("no driver")
                )));
            }
            let from = c.driver.as_deref().unwrap_or("no driver");
            let _ = write!(out, "{}: {from} -> {driver}", c.bdf);
            if driver == "vfio-pci" {
                if let Some(g) = c.iommu_group {
                    let _ = write!(out, " (/dev/vfio/{g})");
                    let pci = self.pci();
                    let others: Vec<String> = pci
                        .iommu_group_devices(g)
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|o| *o != c.bdf)
                        .filter(|o| {
                            let dr = pci.driver(o).ok().flatten();
                            !matches!(dr.as_deref(), None | Some("vfio-pci") | Some("pcieport"))
                        })
                        .collect();
                    if !others.is_empty() {
                        let _ = write!(
                            out,
                            "\n  warning: IOMMU group {g} also holds {} bound to kernel drivers; \
                             VFIO needs the whole group (bind them too)",
                            others.join(", ")
                        );
                    }
                }
            }
            let _ = writeln!(out);
        }
        Ok(())
    }

    pub fn reset(&self, bdfs: &[String], out: &mut String) -> Result<(), SetupError> {
        let targets: Vec<String> = if bdfs.is_empty() {
            self.controllers()?
                .into_iter()
                .filter(|c| {
                    c.driver
                        .as_deref()
                        .is_some_and(|d| USER_DRIVERS.contains(&d))
                })
                .map(|c| c.bdf)
                .collect()
        } else {
            bdfs.iter()
                .map(|b| normalize_bdf(b))
                .collect::<Result<_, _>>()?
        };
        if targets.is_empty() {
            let _ = writeln!(out, "no controller is bound to vfio-pci or uio_pci_generic");
            return Ok(());
        }
        // Check every target first (exists, is NVMe): a typo must be named
        // before modprobe runs or any controller is moved.
        let mut targets = targets;
        dedup_in_order(&mut targets);
        let ctrls = targets
            .iter()
            .map(|bdf| self.controller(bdf))
            .collect::<Result<Vec<_>, _>>()?;
        if let Err(e) = (self.modprobe)("nvme") {
            if !self.pci().has_driver("nvme") {
                return Err(msg(format!("kernel nvme driver not available: {e}")));
            }
        }
        for c in ctrls {
            let bdf = c.bdf.as_str();
            if c.driver.as_deref() == Some("nvme") {
                let _ = writeln!(out, "{bdf}: already bound to nvme");
                continue;
            }
            let got = self.rebind(bdf, None)?;
            let from = c.driver.as_deref().unwrap_or("no driver");
            match got.as_deref() {
                Some("nvme") => {
                    let _ = writeln!(out, "{bdf}: {from} -> nvme");
                }
                other => {
                    return Err(msg(format!(
                        "{bdf}: not picked up by the nvme driver (now: {}); see dmesg",
                        other.unwrap_or("no driver")
                    )))
                }
            }
        }
        Ok(())
    }
}
