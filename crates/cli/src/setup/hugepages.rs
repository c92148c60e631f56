//! Reserving 2 MiB hugepages.
use std::fmt::Write as _;

use super::sysfs::read_trim;
use super::{msg, Host, SetupError};

impl Host {
    pub fn hugepages(&self, count: u32, out: &mut String) -> Result<(), SetupError> {
        let dir = self.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        if !dir.exists() {
            return Err(msg("this kernel has no 2 MiB hugepage support"));
        }
        self.write(&dir.join("nr_hugepages"), &count.to_string())?;
        let got: u64 = read_trim(&dir.join("nr_hugepages"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let free: u64 = read_trim(&dir.join("free_hugepages"))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let _ = writeln!(
            out,
            "2 MiB hugepages: {got} reserved ({} MiB), {free} free",
            got * 2
        );
        if got < count as u64 {
            let _ = writeln!(
                out,
                "warning: asked for {count}, the kernel found only {got} (memory is fragmented; \
                 reserve early after boot or with hugepages=N on the kernel command line)"
            );
        }
        Ok(())
    }
}
