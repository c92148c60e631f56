//! `pollux perf`'s arguments: the shared run options (`common::opts`) and
//! perf's own.
use clap::{Args, ValueEnum};

use crate::common::opts::{trid_help, RunArgs};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Workload {
    Read,
    Write,
    Randread,
    Randwrite,
    Rw,
    Randrw,
}

/// How a worker waits for its completions (`--poll-mode`).
/// (No doc comments on the values: they would switch `--help` to clap's
/// long layout; the option's help describes them.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PollMode {
    // Spin on the completion queues.
    Polled,
    // Sleep on the queue pairs' interrupts when a poll finds nothing.
    Interrupts,
    // Sleep about half the mean time between completions, then spin.
    Hybrid,
}

impl PollMode {
    pub fn name(self) -> &'static str {
        match self {
            PollMode::Polled => "polled",
            PollMode::Interrupts => "interrupts",
            PollMode::Hybrid => "hybrid",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct PerfArgs {
    #[command(flatten)]
    pub run: RunArgs<Workload>,
    /// Worker cores: a hex mask (0x3), a list ([0,1] or 0,2-3) or a range (0-1). Default: core 0.
    #[arg(short = 'c', long = "cores", default_value = "0")]
    pub cores: String,
    /// Queue pairs per namespace.
    #[arg(short = 'P', long = "qpairs", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub qpairs: u16,
    /// A controller to drive, repeatable (default: an emulated one, null
    /// backend).
    #[arg(short = 'r', long = "transport", value_name = "TRID", help = concat!(
        "A controller to drive, repeatable (default: 'trtype:soft', an emulated one, null backend). ",
        trid_help!()
    ))]
    pub transport: Vec<String>,
    /// Ring the SQ doorbell per command instead of once per poll.
    #[arg(long = "no-delayed-doorbell")]
    pub no_delayed_doorbell: bool,
    /// SQ doorbell batching: ring once this many commands wait (or the controller holds fewer).
    #[arg(long = "sq-batch", default_value_t = 1,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub sq_batch: u16,
    /// Ring the CQ doorbell every poll instead of only when the controller needs room.
    #[arg(long = "no-lazy-cq")]
    pub no_lazy_cq: bool,
    /// Prefetch the next completion's tracker (off by default: measured a
    /// loss, the trackers stay in L1; see README).
    #[arg(long = "prefetch")]
    pub prefetch: bool,
    /// Copy SQEs into the ring with non-temporal stores (off by default).
    #[arg(long = "nt-copy")]
    pub nt_copy: bool,
    /// How the worker waits for completions: polled (spin), interrupts
    /// (sleep on the queue pairs' interrupts when a poll finds nothing;
    /// emulated controllers and vfio/uio devices) or hybrid (after a poll
    /// that finds nothing, sleep once for about half the mean time between
    /// completions, then spin; skipped when that is shorter than a sleep
    /// costs here).
    #[arg(long = "poll-mode", value_enum, default_value_t = PollMode::Polled)]
    pub poll_mode: PollMode,
    /// The same as --poll-mode interrupts.
    #[arg(long = "interrupts", conflicts_with = "poll_mode")]
    pub interrupts: bool,
    /// Read the CQ a cache line (four entries) at a time onto the stack
    /// before handling them (off by default; see README).
    #[arg(long = "cq-line-batch")]
    pub cq_line_batch: bool,
    /// Don't use shadow doorbells even if the controller offers them.
    #[arg(long = "no-shadow-doorbell")]
    pub no_shadow_doorbell: bool,
    /// The -r transport IDs are paths to one namespace (the first namespace
    /// of the first path), driven as one: each job has a queue pair on
    /// every path, I/O goes by ANA state then --multipath-policy, and
    /// moves to another path when one fails (NVMe/TCP paths get
    /// fast_io_fail_tmo:0 unless given).
    #[arg(long = "multipath")]
    pub multipath: bool,
    /// With --multipath: active_passive (the first usable path until it
    /// fails) or active_active (spread by --multipath-selector). SPDK's
    /// bdev_nvme_set_multipath_policy names.
    #[arg(long = "multipath-policy", value_name = "POLICY", default_value = "active_active",
          value_parser = ["active_passive", "active_active"], requires = "multipath")]
    pub multipath_policy: String,
    /// With --multipath active_active: round_robin or queue_depth (the
    /// path with the fewest I/Os outstanding).
    #[arg(long = "multipath-selector", value_name = "SELECTOR", default_value = "round_robin",
          value_parser = ["round_robin", "queue_depth"], requires = "multipath")]
    pub multipath_selector: String,
}

impl PerfArgs {
    /// The wait mode: `--poll-mode`, or interrupts with `--interrupts`.
    pub fn mode(&self) -> PollMode {
        if self.interrupts {
            PollMode::Interrupts
        } else {
            self.poll_mode
        }
    }
}
