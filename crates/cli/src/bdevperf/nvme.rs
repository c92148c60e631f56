//! NVMe controllers for bdevperf: `--nvme TRID` and
//! `bdev_nvme_attach_controller` in `-c`, through the shared opener
//! (`crate::nvme_open`), with bdevperf's queue pair options: its queue
//! depth and command timeout, one queue pair per job on each namespace,
//! emulated controllers stepped inline with `--inline`.
use pollux_host::QpairOptions;

use super::args::BdevperfArgs;
use crate::nvme_open::NvmeOpener;

/// The opener of a bdevperf run on `cores` (`online`: the machine's cores,
/// for the emulated controllers' thread when `--device-core` is not given).
pub fn opener(a: &BdevperfArgs, cores: &[usize], online: &[usize]) -> NvmeOpener {
    let device_core = a.run.device.core(cores, online);
    let per_ns = if a.every_core { cores.len() } else { 1 };
    NvmeOpener::new(
        a.run.inline,
        device_core,
        per_ns,
        QpairOptions {
            depth: a.run.queue_depth,
            timeout: a.run.timeout(),
            ..QpairOptions::default()
        },
    )
}
