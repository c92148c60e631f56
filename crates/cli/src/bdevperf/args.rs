//! `pollux bdevperf`'s arguments: the shared run options (`common::opts`)
//! and bdevperf's own.
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use pollux_bdev::UringOptions;
use pollux_host::trid::parse_size;

use crate::common::opts::{trid_help, CpumaskArgs, RunArgs};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Read,
    Write,
    Randread,
    Randwrite,
    Rw,
    Randrw,
    // Documented in `RunArgs::workload`'s help: a help text here would
    // switch `--help` to clap's long layout, unlike the other tools.
    Verify,
}

#[derive(Args, Debug, Clone)]
pub struct BdevperfArgs {
    #[command(flatten)]
    pub run: RunArgs<Workload>,
    #[command(flatten)]
    pub cpumask: CpumaskArgs,
    #[command(flatten)]
    pub rpc: crate::rpc::RpcArgs,
    #[command(flatten)]
    pub metrics: crate::metrics::MetricsArgs,
    /// SPDK JSON configuration of bdevs (bdev_null_create, bdev_malloc_create,
    /// bdev_uring_create, bdev_nvme_attach_controller).
    #[arg(short = 'c', long = "config")]
    pub config: Option<PathBuf>,
    /// Every core runs a job on every bdev (each on a slice of it).
    #[arg(short = 'C')]
    pub every_core: bool,
    /// Only run on this bdev.
    #[arg(short = 'T', long = "bdev")]
    pub bdev: Option<String>,
    /// A null bdev (Null0, 1 TiB): stores nothing.
    #[arg(long)]
    pub null: bool,
    /// A RAM bdev of this size (Malloc<k>), repeatable.
    #[arg(long, value_parser = parse_size)]
    pub ram: Vec<u64>,
    /// An io_uring bdev on this file or block device (Uring<k>), repeatable.
    #[arg(long)]
    pub uring: Vec<PathBuf>,
    /// The --uring bdevs poll completions from the device
    /// (IORING_SETUP_IOPOLL: O_DIRECT on a block device with poll queues,
    /// e.g. nvme.poll_queues=N).
    #[arg(long)]
    pub iopoll: bool,
    /// The --uring bdevs' pollers yield the core after this many empty
    /// polls in a row with requests in flight (0: never), so an io-wq
    /// worker or softirq on the same core can run.
    #[arg(long, value_name = "POLLS", default_value_t = UringOptions::default().yield_after)]
    pub uring_yield: u32,
    /// An NVMe controller (Nvme<k>, bdevs Nvme<k>n<nsid>), repeatable.
    #[arg(long, value_name = "TRID", help = concat!(
        "An NVMe controller (Nvme<k>, bdevs Nvme<k>n<nsid>), repeatable. ",
        trid_help!()
    ))]
    pub nvme: Vec<String>,
    /// Every --nvme is a path to one namespace (its first, on every
    /// path): one bdev Nvme0n<nsid> over all of them, I/O by ANA state,
    /// round robin among the best paths, failed over between them (as
    /// `pollux perf --multipath`). Reads and writes only.
    #[arg(long = "multipath", requires = "nvme")]
    pub multipath: bool,
    /// Block size of the --null and --ram bdevs.
    #[arg(long = "block-size", default_value_t = 512)]
    pub block_size: u32,
    /// Testing aid: fail each job's bdev (null/RAM) once the job completed
    /// this many I/Os.
    #[arg(long = "inject-failure-after", hide = true)]
    pub inject_failure_after: Option<u64>,
}
